//! A quantized frozen weight made dense on CUDA in one launch (cuda/dequantize.cuh): Q4_K, Q6_K and Q8_0 blocks
//! straight into f32, bf16 or f16, for the many-row products of a quantized base (training, prefill, scoring) that
//! multiply the dense weight through cuBLAS. Candle's path is its f32 dequantize and then a cast; the values are
//! the same bit for bit (the kernel repeats Candle's arithmetic, and the 16-bit ones are its f32 values rounded to
//! nearest once, as its cast does), in one pass over memory instead of three.
//!
//! Taken under the native kernel set; built with the `cuda` feature only.

use crate::engine::ops::cuda::launch::{load, output, wrap};
use crate::engine::ops::cuda::qgemv::type_name;
use candle_core::cuda_backend::cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::{CudaDType, WrapErr};
use candle_core::quantized::QTensor;
use candle_core::{DType, Device, Result, Tensor};

/// Values each thread of the kernel writes (a 16-byte store in 16-bit types).
const CHUNK: usize = 8;

/// `weight` dense in `dtype` on its CUDA device, or None where the kernel does not take it (a block type qgemv.cuh's
/// readers, which it shares, lack; another device or dtype; the portable graph): then Candle's kernels do
/// (`ops::quantized`).
pub fn dense(weight: &QTensor, dtype: DType) -> Result<Option<Tensor>> {
    let Device::Cuda(dev) = weight.device() else { return Ok(None) };
    let Some(kind) = type_name(weight.dtype()) else { return Ok(None) };
    if !crate::engine::ops::kernel_choice::native() {
        return Ok(None);
    }
    let (elements, shape) = (weight.shape().elem_count(), weight.shape().clone());
    Ok(Some(match dtype {
        DType::F32 => dense_as::<f32>(weight, &dev, kind, "f32", elements, shape)?,
        DType::BF16 => dense_as::<half::bf16>(weight, &dev, kind, "bf16", elements, shape)?,
        DType::F16 => dense_as::<half::f16>(weight, &dev, kind, "f16", elements, shape)?,
        _ => return Ok(None),
    }))
}

fn dense_as<T: CudaDType + DeviceRepr>(
    weight: &QTensor,
    dev: &candle_core::CudaDevice,
    kind: &str,
    suffix: &str,
    elements: usize,
    shape: candle_core::Shape,
) -> Result<Tensor> {
    // Whole blocks of 32 or 256 values: always whole chunks of 8.
    debug_assert!(elements.is_multiple_of(CHUNK));
    let f = load!(dev, &format!("dequantize_{kind}_{suffix}"))?;
    let blocks = weight.device_ptr()? as u64;
    let out = output::<T>(dev, elements)?;
    let chunks = (elements / CHUNK) as i64;
    let mut b = f.builder();
    b.arg(&blocks);
    b.arg(&out);
    b.arg(&chunks);
    let cfg = LaunchConfig {
        grid_dim: ((elements / CHUNK).div_ceil(256).clamp(1, 1 << 20) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: arguments match the kernel's signature; `blocks` is the address of the weight's blocks (alive while
    // `weight` is, which outlives the launch on this stream) and the output holds every value the chunks cover.
    unsafe { b.launch(cfg) }.w()?;
    Ok(wrap(out, dev, shape))
}
