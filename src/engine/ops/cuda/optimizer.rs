//! Fused CUDA kernels for the optimizer step (src/engine/ops/cuda/fused.cu), all queued without a read back: the
//! squared sums behind the global gradient norm, a one-block guard that adds them in a fixed order (the norm does
//! not vary between runs), turns the norm into the clipping coefficient and checks the loss and the norm are
//! finite, then AdamW on every parameter in place, which reads the coefficient and does nothing when the guard
//! said skip. Each kernel takes up to 24 tensors per launch (their addresses passed by value), so the step is a
//! handful of launches whatever the number of adapters: at the 1B shape with adapters on every linear that is 224
//! parameters, where one launch per parameter and a read back of the norm in the middle left the GPU waiting on
//! the host. f32 tensors on CUDA with the native kernels only ([`available`]); `train/optimizer.rs` composes
//! otherwise.

use candle_core::{DType, Result, Tensor};

/// The scalars of one AdamW step (see `train/optimizer.rs` for their meaning).
#[derive(Debug, Clone, Copy)]
pub struct AdamWScalars {
    pub lr: f32,
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    /// `1 - lr * weight_decay`.
    pub decay: f32,
    /// `1 - beta1^t` and `1 - beta2^t`.
    pub bias1: f32,
    pub bias2: f32,
}

/// One parameter of a guarded step: the parameter, its two moments and its gradient (all f32, contiguous, the same
/// length; the first three each with storage of their own, written in place).
pub struct ParamSlot<'a> {
    pub param: &'a Tensor,
    pub m: &'a Tensor,
    pub v: &'a Tensor,
    pub grad: &'a Tensor,
}

/// What the guard decided: `[loss, squared gradient norm, clipping coefficient, skipped (0 or 1)]` as f64, copied
/// into page-locked host memory right behind the update. Reading it waits for that copy only, not for work queued
/// after the step (the next step's passes, begun before this one is read): a read of the device's values would
/// queue behind that work and wait for it.
pub struct StepStats(HostStats);

impl StepStats {
    /// Wait for the step's update and read its statistics; gives the host memory back for the next step.
    pub fn read(self) -> Result<([f64; 4], HostStats)> {
        let values = self.0 .0.read()?;
        Ok((values, self.0))
    }
}

/// Page-locked host memory for one step's [`StepStats`], reused from step to step (allocating it is slow).
pub struct HostStats(imp::Pinned);

impl HostStats {
    pub fn new(device: &candle_core::Device) -> Result<Self> {
        imp::Pinned::new(device).map(Self)
    }
}

/// Whether the fused optimizer kernels take `t`: f32 on CUDA, native kernels.
pub fn available(t: &Tensor) -> bool {
    t.dtype() == DType::F32 && super::availability::available(t.device(), DType::F32)
}

/// Queue one guarded AdamW step over `slots`: the gradient norm, the clipping coefficient for `max_norm` (None: no
/// clipping), the skip when `loss` (an f32 scalar on the same device) or the norm is not finite, the update, and
/// the copy of its statistics into `host`.
pub fn guarded_adamw(
    slots: &[ParamSlot],
    loss: &Tensor,
    max_norm: Option<f64>,
    s: &AdamWScalars,
    mut host: HostStats,
) -> Result<StepStats> {
    for (i, slot) in slots.iter().enumerate() {
        let n = slot.param.elem_count();
        for (t, what) in [(slot.m, "first moment"), (slot.v, "second moment"), (slot.grad, "gradient")] {
            if t.elem_count() != n || !t.is_contiguous() || !available(t) {
                candle_core::bail!(
                    "fused AdamW: the {what} {:?} of parameter {i} does not match the parameter {:?}",
                    t.shape(),
                    slot.param.shape()
                );
            }
        }
        if !slot.param.is_contiguous() || !available(slot.param) {
            candle_core::bail!("fused AdamW: parameter {i} is not a contiguous f32 tensor on the GPU");
        }
    }
    if loss.elem_count() != 1 || !available(loss) {
        candle_core::bail!("fused AdamW: the loss must be one f32 value on the GPU, not {:?}", loss.shape());
    }
    imp::guarded_adamw(slots, loss, max_norm, s, &mut host.0)?;
    Ok(StepStats(host))
}

#[cfg(feature = "cuda")]
mod imp {
    use crate::engine::ops::cuda::launch::{device_address, load, on_cuda, output, view, MULTI_TENSORS as TENSORS};
    use crate::engine::ops::cuda::optimizer::{AdamWScalars, ParamSlot};
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::driver::sys::CUevent_flags;
    use candle_core::cuda_backend::cudarc::driver::{
        CudaEvent, DeviceRepr, LaunchConfig, PinnedHostSlice, PushKernelArg,
    };
    use candle_core::cuda_backend::WrapErr;
    use candle_core::{Result, Tensor};

    /// Four f64 of page-locked host memory and an event recorded behind the copy into them. The event is our own:
    /// cudarc's pinned memory records its event only when it manages stream synchronization, which Candle turns off.
    pub struct Pinned {
        memory: PinnedHostSlice<f64>,
        copied: CudaEvent,
    }

    impl Pinned {
        pub fn new(device: &candle_core::Device) -> Result<Self> {
            let candle_core::Device::Cuda(dev) = device else {
                candle_core::bail!("the fused AdamW's statistics need a CUDA device")
            };
            let context = dev.cuda_stream().context().clone();
            // Flags 0: cached memory the host reads (write-combined memory is slow to read).
            // SAFETY: every value is written by the copy `guarded_adamw` queues before any read.
            let memory = unsafe { context.alloc_pinned_with_flags::<f64>(4, 0) }.w()?;
            // Blocking: the trainer's thread sleeps while it waits instead of spinning a core.
            let copied = context.new_event(Some(CUevent_flags::CU_EVENT_BLOCKING_SYNC)).w()?;
            Ok(Self { memory, copied })
        }

        /// Wait for the last copy into this memory and read it.
        pub fn read(&self) -> Result<[f64; 4]> {
            self.copied.synchronize().w()?;
            let values = self.memory.as_slice().w()?;
            Ok([values[0], values[1], values[2], values[3]])
        }
    }

    /// OPT_BLOCKS of fused.cu.
    const BLOCKS: usize = 64;

    /// fused.cu's OptChunk: the addresses of up to [`TENSORS`] parameters, moments and gradients, and their lengths.
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct OptChunk {
        p: [u64; TENSORS],
        m: [u64; TENSORS],
        v: [u64; TENSORS],
        g: [u64; TENSORS],
        n: [i32; TENSORS],
    }

    // SAFETY: a plain-old-data struct laid out as the kernels' C struct.
    unsafe impl DeviceRepr for OptChunk {}

    fn chunk(slots: &[ParamSlot]) -> Result<OptChunk> {
        let mut c = OptChunk { p: [0; TENSORS], m: [0; TENSORS], v: [0; TENSORS], g: [0; TENSORS], n: [0; TENSORS] };
        for (i, s) in slots.iter().enumerate() {
            c.p[i] = device_address::<f32>(s.param, "parameter")?;
            c.m[i] = device_address::<f32>(s.m, "first moment")?;
            c.v[i] = device_address::<f32>(s.v, "second moment")?;
            c.g[i] = device_address::<f32>(s.grad, "gradient")?;
            c.n[i] = i32::try_from(s.param.elem_count())
                .map_err(|_| candle_core::Error::Msg("fused AdamW: a parameter over 2^31 elements".into()))?;
        }
        Ok(c)
    }

    fn cfg(blocks: usize, tensors: usize) -> LaunchConfig {
        LaunchConfig { grid_dim: (blocks as u32, tensors as u32, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 }
    }

    pub fn guarded_adamw(
        slots: &[ParamSlot],
        loss: &Tensor,
        max_norm: Option<f64>,
        s: &AdamWScalars,
        host: &mut Pinned,
    ) -> Result<()> {
        let (loss_storage, loss_layout) = loss.storage_and_layout();
        let loss_cuda = on_cuda(&loss_storage, "loss")?;
        let dev = loss_cuda.device().clone();
        let loss_view = view::<f32>(loss_cuda, loss_layout, "loss")?;
        let chunks = slots.chunks(TENSORS).map(chunk).collect::<Result<Vec<_>>>()?;
        let count = slots.len() * BLOCKS;
        let mut partial = output::<f32>(&dev, count.max(1))?;
        let squares = load!(&dev, "sum_squares_f32")?;
        for (k, (c, part)) in chunks.iter().zip(slots.chunks(TENSORS)).enumerate() {
            let first = (k * TENSORS) as i32;
            let mut b = squares.builder();
            b.arg(c);
            b.arg(&first);
            b.arg(&mut partial);
            // SAFETY: arguments match the kernel's signature; `partial` holds BLOCKS slots per parameter.
            unsafe { b.launch(cfg(BLOCKS, part.len())) }.w()?;
        }
        let mut stats = output::<f64>(&dev, 4)?;
        let max_norm = max_norm.map_or(0f32, |m| m as f32);
        let count = count as i32;
        let guard = load!(&dev, "optimizer_guard")?;
        let mut b = guard.builder();
        b.arg(&partial);
        b.arg(&count);
        b.arg(&loss_view);
        b.arg(&max_norm);
        b.arg(&mut stats);
        // SAFETY: arguments match the kernel's signature; one block of 256 reads `count` partials, writes 4 stats.
        unsafe { b.launch(cfg(1, 1)) }.w()?;
        let adamw = load!(&dev, "adamw_f32")?;
        for (c, part) in chunks.iter().zip(slots.chunks(TENSORS)) {
            let mut b = adamw.builder();
            b.arg(c);
            candle_core::builder_arg!(b, s.lr, s.beta1, s.beta2, s.eps, s.decay, s.bias1, s.bias2);
            b.arg(&stats);
            // SAFETY: arguments match the kernel's signature; the chunk's addresses point at live f32 buffers of
            // its lengths, and the parameter and moments are each their own allocation (AdamW owns the moments,
            // the parameter is a Var), so nothing else reads the values being replaced.
            unsafe { b.launch(cfg(BLOCKS, part.len())) }.w()?;
        }
        // Queued behind the update; the event marks the copy's end.
        let stream = dev.cuda_stream();
        stream.memcpy_dtoh(&stats, &mut host.memory).w()?;
        host.copied.record(&stream).w()
    }
}

/// Without CUDA the op exists but refuses to run; [`available`] is false, so callers never reach it.
#[cfg(not(feature = "cuda"))]
mod imp {
    use crate::engine::ops::cuda::optimizer::{AdamWScalars, ParamSlot};
    use candle_core::{bail, Result, Tensor};

    pub struct Pinned;

    impl Pinned {
        pub fn new(_: &candle_core::Device) -> Result<Self> {
            bail!("the fused AdamW runs on CUDA only")
        }

        pub fn read(&self) -> Result<[f64; 4]> {
            bail!("the fused AdamW runs on CUDA only")
        }
    }

    pub fn guarded_adamw(_: &[ParamSlot], _: &Tensor, _: Option<f64>, _: &AdamWScalars, _: &mut Pinned) -> Result<()> {
        bail!("the fused AdamW runs on CUDA only")
    }
}
