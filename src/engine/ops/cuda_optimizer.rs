//! Fused CUDA kernels for the optimizer step (src/engine/ops/cuda/fused.cu): AdamW on one parameter in place
//! (one launch where the composed update was about fifteen: moments, bias corrections, square root, decay) and
//! the squared sums behind the global gradient norm (one launch per gradient, partial sums per block added on
//! the host in a fixed order, so the norm does not vary between runs). At the 1B shape with adapters on every
//! linear that is 224 parameters: the composed step launched about 3,600 small kernels, 35 ms of host time.
//! f32 tensors on CUDA with the native kernels only ([`available`]); `train/optimizer.rs` composes otherwise.

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
    /// The clipping coefficient the gradient is multiplied by (1 without clipping).
    pub grad_scale: f32,
}

/// Whether the fused optimizer kernels take `t`: f32 on CUDA, native kernels.
pub fn available(t: &Tensor) -> bool {
    t.dtype() == DType::F32 && super::cuda_kernels::available(t.device(), DType::F32)
}

/// The sum of the squares of every element of `parts` (each f32 and contiguous, on one CUDA device).
pub fn sum_squares(parts: &[Tensor]) -> Result<f64> {
    imp::sum_squares(parts)
}

/// One AdamW step in place on `param` and its moments `m`, `v` (f32, contiguous, each with its own storage)
/// for the gradient `grad`.
pub fn adamw(param: &Tensor, m: &Tensor, v: &Tensor, grad: &Tensor, s: &AdamWScalars) -> Result<()> {
    let n = param.elem_count();
    for (t, what) in [(m, "first moment"), (v, "second moment"), (grad, "gradient")] {
        if t.elem_count() != n || !t.is_contiguous() || !available(t) {
            candle_core::bail!(
                "fused AdamW: the {what} {:?} does not match the parameter {:?}",
                t.shape(),
                param.shape()
            );
        }
    }
    imp::adamw(param, m, v, grad, s)
}

#[cfg(feature = "cuda")]
mod imp {
    use super::AdamWScalars;
    use crate::engine::ops::cuda_kernels::launch::{func, grid_stride, int, on_cuda, output, view, wrap};
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
    use candle_core::cuda_backend::WrapErr;
    use candle_core::{Result, Tensor};

    const THREADS: usize = 256;

    /// Blocks (each writing one partial sum) for a gradient of `n` elements: enough to fill the GPU at the sizes
    /// of LoRA factors, few partials to read back.
    fn blocks(n: usize) -> usize {
        n.div_ceil(THREADS).clamp(1, 64)
    }

    fn cfg(blocks: usize) -> LaunchConfig {
        LaunchConfig { grid_dim: (blocks as u32, 1, 1), block_dim: (THREADS as u32, 1, 1), shared_mem_bytes: 0 }
    }

    pub fn sum_squares(parts: &[Tensor]) -> Result<f64> {
        let Some(first) = parts.first() else { return Ok(0.0) };
        let slots: Vec<usize> = parts.iter().map(|t| blocks(t.elem_count())).collect();
        let (first_storage, _) = first.storage_and_layout();
        let first_cuda = on_cuda(&first_storage, "gradient")?;
        let dev = first_cuda.device().clone();
        let f = func!(first_cuda, "sum_squares")?;
        drop(first_storage);
        let mut partial = output::<f32>(&dev, slots.iter().sum())?;
        let mut offset = 0;
        for (t, &nblocks) in parts.iter().zip(&slots) {
            let (storage, layout) = t.storage_and_layout();
            let (s, l) = (on_cuda(&storage, "gradient")?, layout);
            let input = view::<f32>(s, l, "gradient")?;
            let mut out = partial.slice_mut(offset..offset + nblocks);
            let mut b = f.builder();
            b.arg(&input);
            candle_core::builder_arg!(b, int(t.elem_count()));
            b.arg(&mut out);
            // SAFETY: arguments match the kernel's signature; `out` holds one slot per block.
            unsafe { b.launch(cfg(nblocks)) }.w()?;
            offset += nblocks;
        }
        let values = wrap(partial, &dev, offset).to_vec1::<f32>()?;
        Ok(values.iter().map(|&v| v as f64).sum())
    }

    pub fn adamw(param: &Tensor, m: &Tensor, v: &Tensor, grad: &Tensor, s: &AdamWScalars) -> Result<()> {
        let n = param.elem_count();
        let guards = [param, m, v, grad].map(|t| t.storage_and_layout());
        let [p, m, v, g] = [
            (on_cuda(&guards[0].0, "parameter")?, guards[0].1),
            (on_cuda(&guards[1].0, "first moment")?, guards[1].1),
            (on_cuda(&guards[2].0, "second moment")?, guards[2].1),
            (on_cuda(&guards[3].0, "gradient")?, guards[3].1),
        ];
        let f = func!(p.0, "adamw")?;
        let [p, m, v, g] = [(p, "parameter"), (m, "first moment"), (v, "second moment"), (g, "gradient")]
            .map(|((s, l), what)| view::<f32>(s, l, what));
        let (p, m, v, g) = (p?, m?, v?, g?);
        let mut b = f.builder();
        // The kernel writes p, m and v through these views: each is its own allocation (AdamW owns the moments,
        // the parameter is a Var), so nothing else reads the values being replaced.
        b.arg(&p);
        b.arg(&m);
        b.arg(&v);
        b.arg(&g);
        candle_core::builder_arg!(b, int(n), s.lr, s.beta1, s.beta2, s.eps, s.decay, s.bias1, s.bias2, s.grad_scale);
        // SAFETY: arguments match the kernel's signature; all four views hold `n` f32 values.
        unsafe { b.launch(grid_stride(n)) }.w()?;
        Ok(())
    }
}

/// Without CUDA the ops exist but refuse to run; [`available`] is false, so callers never reach them.
#[cfg(not(feature = "cuda"))]
mod imp {
    use super::AdamWScalars;
    use candle_core::{bail, Result, Tensor};

    pub fn sum_squares(_: &[Tensor]) -> Result<f64> {
        bail!("the fused gradient norm runs on CUDA only")
    }

    pub fn adamw(_: &Tensor, _: &Tensor, _: &Tensor, _: &Tensor, _: &AdamWScalars) -> Result<()> {
        bail!("the fused AdamW runs on CUDA only")
    }
}
