//! When our fused CUDA kernels run: built with the `cuda` feature, on a CUDA device, in f32 or bf16, and not in the
//! portable graph. Every dispatcher in ops/ asks this before it takes a CUDA path.

use candle_core::{DType, Device};

/// Whether the fused kernels run for tensors of `dtype` on `device`.
pub fn available(device: &Device, dtype: DType) -> bool {
    cfg!(feature = "cuda")
        && device.is_cuda()
        && matches!(dtype, DType::F32 | DType::BF16)
        && crate::engine::ops::kernel_choice::native()
}
