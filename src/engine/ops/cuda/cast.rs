//! Many f32 tensors cast to one half-precision dtype at once: the adapters' A and B matrices, cast for a training
//! step's products (`lora::ComputeCopies`). On CUDA with the native kernels, one launch per 24 tensors into one
//! buffer (fused.cu, `cast_many_*`), where a cast per matrix cost a launch each: two per adapter, 64 a step at the
//! 1B shape with adapters on q and v, 224 on every linear. Elsewhere each tensor is cast on its own.

use candle_core::{DType, Result, Tensor};

/// `tensors` cast to `dtype`, in order (each tensor as is when it already has that dtype).
pub fn cast_many(tensors: &[&Tensor], dtype: DType) -> Result<Vec<Tensor>> {
    let batched = matches!(dtype, DType::BF16 | DType::F16)
        && tensors.len() > 1
        && tensors.iter().all(|t| {
            t.dtype() == DType::F32 && t.is_contiguous() && super::availability::available(t.device(), DType::F32)
        });
    if batched {
        return imp::cast_many(tensors, dtype);
    }
    tensors.iter().map(|t| t.to_dtype(dtype)).collect()
}

#[cfg(feature = "cuda")]
mod imp {
    use crate::engine::ops::cuda::launch::{device_address, load, on_cuda, output, wrap, MULTI_TENSORS as TENSORS};
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::driver::{DevicePtr, DeviceRepr, LaunchConfig, PushKernelArg};
    use candle_core::cuda_backend::{CudaDType, WrapErr};
    use candle_core::{bail, DType, Result, Tensor};

    /// Blocks of 256 threads per tensor (an adapter matrix is a few thousand to a few hundred thousand elements).
    const BLOCKS: u32 = 16;

    /// fused.cu's CastChunk.
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct CastChunk {
        src: [u64; TENSORS],
        dst: [u64; TENSORS],
        n: [i32; TENSORS],
    }

    // SAFETY: a plain-old-data struct laid out as the kernel's C struct.
    unsafe impl DeviceRepr for CastChunk {}

    pub fn cast_many(tensors: &[&Tensor], dtype: DType) -> Result<Vec<Tensor>> {
        match dtype {
            DType::BF16 => cast_into::<half::bf16>(tensors, "cast_many_f32_bf16"),
            DType::F16 => cast_into::<half::f16>(tensors, "cast_many_f32_f16"),
            other => bail!("cast_many: f32 to bf16 or f16, not {other:?}"),
        }
    }

    /// The tensors cast into one new buffer of `T` by the kernel `name`, then cut into their shapes.
    fn cast_into<T: CudaDType + DeviceRepr>(tensors: &[&Tensor], name: &str) -> Result<Vec<Tensor>> {
        let Some(first) = tensors.first() else { return Ok(Vec::new()) };
        let dev = {
            let (storage, _) = first.storage_and_layout();
            on_cuda(&storage, "cast source")?.device().clone()
        };
        let f = load!(&dev, name)?;
        let stream = dev.cuda_stream();
        let mut offsets = Vec::with_capacity(tensors.len());
        let mut total = 0usize;
        for t in tensors {
            offsets.push(total);
            total += t.elem_count();
        }
        let out = output::<T>(&dev, total.max(1))?;
        {
            let (out_ptr, _out_sync) = out.device_ptr(&stream);
            for (group, group_offsets) in tensors.chunks(TENSORS).zip(offsets.chunks(TENSORS)) {
                let mut c = CastChunk { src: [0; TENSORS], dst: [0; TENSORS], n: [0; TENSORS] };
                for (i, (t, &at)) in group.iter().zip(group_offsets).enumerate() {
                    c.src[i] = device_address::<f32>(t, "cast source")?;
                    c.dst[i] = out_ptr + (at * std::mem::size_of::<T>()) as u64;
                    c.n[i] = i32::try_from(t.elem_count())
                        .map_err(|_| candle_core::Error::Msg("cast_many: a tensor over 2^31 elements".into()))?;
                }
                let grid = (BLOCKS, group.len() as u32, 1);
                let cfg = LaunchConfig { grid_dim: grid, block_dim: (256, 1, 1), shared_mem_bytes: 0 };
                let mut b = f.builder();
                b.arg(&c);
                // SAFETY: arguments match the kernel's signature; each source is a live contiguous f32 buffer of
                // its length, each destination a disjoint range of `out`, sized above.
                unsafe { b.launch(cfg) }.w()?;
            }
        }
        let flat = wrap(out, &dev, total.max(1));
        tensors.iter().zip(offsets).map(|(t, at)| flat.narrow(0, at, t.elem_count())?.reshape(t.shape())).collect()
    }
}

/// Without CUDA, [`cast_many`] never batches.
#[cfg(not(feature = "cuda"))]
mod imp {
    use candle_core::{bail, DType, Result, Tensor};

    pub fn cast_many(_: &[&Tensor], _: DType) -> Result<Vec<Tensor>> {
        bail!("the batched cast runs on CUDA only")
    }
}
