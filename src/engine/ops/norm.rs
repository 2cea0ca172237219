//! RMS norm and the residual add fused with it: our CUDA kernels (cuda/residual.rs), Candle's fused RMS-norm kernel
//! elsewhere (CPU, CUDA, Metal), composed in f64.

use candle_core::{Result, Tensor, D};

use super::cuda::{availability::available as cuda_available, residual as cuda_residual};
use super::elementwise::add;
use super::kernel_choice::metal_dtypes;
use super::precision::composed_in_f64;

/// RMS norm over the last dimension, scaled by `weight`. On CUDA the kernel of [`add_rms_norm`] without the add, so
/// a sum that one returned norms again to the same bits.
pub fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64) -> Result<Tensor> {
    metal_dtypes("rms_norm", &[x, weight])?;
    if cuda_available(x.device(), x.dtype()) && weight.dtype() == x.dtype() {
        return cuda_residual::rms_norm(x, weight, eps);
    }
    if !composed_in_f64(x.dtype()) {
        return candle_nn::ops::rms_norm(&x.contiguous()?, weight, eps as f32);
    }
    let mean_sq = x.sqr()?.mean_keepdim(D::Minus1)?;
    x.broadcast_div(&(mean_sq + eps)?.sqrt()?)?.broadcast_mul(weight)
}

/// `(x + delta, rms_norm(x + delta, weight))`: a residual add and the norm that reads its sum, in one pass on
/// CUDA (`cuda_residual.rs`), composed elsewhere.
pub fn add_rms_norm(x: &Tensor, delta: &Tensor, weight: &Tensor, eps: f64) -> Result<(Tensor, Tensor)> {
    if cuda_available(x.device(), x.dtype()) && delta.dtype() == x.dtype() && weight.dtype() == x.dtype() {
        return cuda_residual::add_rms_norm(x, delta, weight, eps);
    }
    let sum = add(x, delta)?;
    let normed = rms_norm(&sum, weight, eps)?;
    Ok((sum, normed))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::ops::{rope, scaled_masked_softmax};
    use candle_core::{DType, Device};

    fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
        let d = (a.to_dtype(DType::F64).unwrap() - b.to_dtype(DType::F64).unwrap()).unwrap();
        d.abs().unwrap().max_all().unwrap().to_scalar().unwrap()
    }

    /// The f32 kernels (ours and Candle's) compute what the f64 composed versions compute.
    #[test]
    fn f32_kernels_match_f64_forward() {
        let dev = Device::Cpu;
        let x = Tensor::randn(0f64, 1.0, (2, 3, 4, 8), &dev).unwrap();
        let w = Tensor::randn(1f64, 0.1, 8, &dev).unwrap();
        let (cos, sin) =
            (Tensor::randn(0f64, 1.0, (4, 4), &dev).unwrap(), Tensor::randn(0f64, 1.0, (4, 4), &dev).unwrap());
        let mask = Tensor::new(&[[0f32, -1e9, -1e9, -1e9, 0.0, 0.0, 0.0, 0.0]; 4], &dev).unwrap();
        let f32 = |t: &Tensor| t.to_dtype(DType::F32).unwrap();
        assert!(max_diff(&rms_norm(&f32(&x), &f32(&w), 1e-6).unwrap(), &rms_norm(&x, &w, 1e-6).unwrap()) < 1e-5);
        assert!(max_diff(&rope(&f32(&x), &f32(&cos), &f32(&sin)).unwrap(), &rope(&x, &cos, &sin).unwrap()) < 1e-5);
        let fast = scaled_masked_softmax(&f32(&x), 0.5, Some(&mask)).unwrap();
        let composed = scaled_masked_softmax(&x, 0.5, Some(&mask.to_dtype(DType::F64).unwrap())).unwrap();
        assert!(max_diff(&fast, &composed) < 1e-6);
    }
}
