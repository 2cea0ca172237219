//! Element-wise ops of the model and the training pass: the SwiGLU and GeGLU gates, residual adds, and row gathers
//! and scatters. Our CPU f32 kernels (cpu/elementwise.rs) and fused CUDA kernels where they apply, Candle's ops
//! otherwise.

use candle_core::{DType, Result, Tensor};

use super::cpu::elementwise as cpu_elementwise;
use super::cuda::{availability::available as cuda_available, training as cuda_training};
use super::gelu::gelu_tanh;
use super::kernel_choice::metal_dtypes;
use super::metal;

/// SwiGLU gate: silu(gate) * up (one parallel pass on the CPU in f32).
pub fn silu_mul(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    metal_dtypes("silu_mul", &[gate, up])?;
    if let Some(out) = cpu_elementwise::gated_product(gate, up, |g| g / (1.0 + (-g).exp()))? {
        return Ok(out);
    }
    if cuda_available(gate.device(), gate.dtype()) && up.dtype() == gate.dtype() && up.shape() == gate.shape() {
        return cuda_training::silu_mul(gate, up);
    }
    if metal::takes(&[gate, up]) && up.shape() == gate.shape() {
        return metal::silu_mul(gate, up);
    }
    candle_nn::ops::silu(gate)? * up
}

/// Row `index[i]` of `src` (rows, cols) as row i of the result: `src.index_select(index, 0)`, on CUDA (u32 index, a
/// dtype of the fused kernels) with 16-byte copies.
pub fn gather_rows(src: &Tensor, index: &Tensor) -> Result<Tensor> {
    if cuda_available(src.device(), src.dtype()) && index.dtype() == DType::U32 && src.rank() == 2 {
        return cuda_training::gather_rows(src, index);
    }
    src.index_select(index, 0)
}

/// A (rows, cols) tensor of zeros but for row `index[i]`, which is row i of `src` (n, cols): the head's
/// gradient for the positions that have a target, put back among all positions. `index` (n) u32, distinct.
/// One kernel on CUDA (Candle's index_add took 2 ms for the 1B step's 4,096 rows); zeros plus index_add
/// elsewhere.
pub fn scatter_rows(src: &Tensor, index: &Tensor, rows: usize) -> Result<Tensor> {
    if cuda_available(src.device(), src.dtype()) {
        return cuda_training::scatter_rows(src, index, rows);
    }
    Tensor::zeros((rows, src.dim(1)?), src.dtype(), src.device())?.index_add(index, src, 0)
}

/// GeGLU gate with the tanh approximation of gelu (PyTorch's `gelu(approximate="tanh")`): gelu(gate) * up.
/// One parallel pass on the CPU in f32; elsewhere Candle's gelu (the same tanh approximation; CPU, CUDA and
/// Metal kernels) and a product.
pub fn gelu_tanh_mul(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    metal_dtypes("gelu_tanh_mul", &[gate, up])?;
    if let Some(out) = cpu_elementwise::gated_product(gate, up, |g| gelu_tanh(g).0)? {
        return Ok(out);
    }
    gate.gelu()? * up
}

/// `a + scale * b` for tensors of one shape: one parallel pass on the CPU in f32 (the training pass's
/// residuals, adapter outputs and gradient sums), Candle's ops otherwise.
pub fn add_scaled(a: &Tensor, b: &Tensor, scale: f64) -> Result<Tensor> {
    metal_dtypes("add", &[a, b])?;
    if let Some(sum) = cpu_elementwise::add_scaled(a, b, scale)? {
        return Ok(sum);
    }
    if scale == 1.0 {
        a + b
    } else {
        a + (b * scale)?
    }
}

/// `a + b` for tensors of one shape (see [`add_scaled`]).
pub fn add(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    add_scaled(a, b, 1.0)
}
