//! RMS norm and the residual add fused with it: our CUDA kernels (cuda/residual.rs), our WGSL kernel under
//! `--kernels wgsl` (metal/), Candle's fused RMS-norm kernel elsewhere (CPU, CUDA, Metal), composed in f64.

use candle_core::{Result, Tensor, D};

use super::cuda::{availability::available as cuda_available, residual as cuda_residual};
use super::elementwise::add;
use super::kernel_choice::metal_dtypes;
use super::metal;
use super::precision::composed_in_f64;

/// RMS norm over the last dimension, scaled by `weight`. On CUDA the kernel of [`add_rms_norm`] without the add, so
/// a sum that one returned norms again to the same bits.
pub fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64) -> Result<Tensor> {
    metal_dtypes("rms_norm", &[x, weight])?;
    if metal::takes(&[x, weight]) {
        return metal::rms_norm(x, weight, eps);
    }
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
