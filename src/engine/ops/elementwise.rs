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

/// A (rows, cols) tensor of zeros but for row `sources[i]`, which is row i of `src` (n, cols): the head's
/// gradient for the positions that have a target, put back among all positions. `sources` distinct; `index` is
/// `sources` on the device. One kernel on CUDA; elsewhere `src` itself when every row is its own source, else a
/// gather from `src` with a zero row appended. Not Candle's index_add: its kernels (CUDA and Metal) give each of
/// the `cols` columns one thread that walks all `n` rows, 2 ms for the 1B step's 4,096 rows on an H200 (grid 2).
pub fn scatter_rows(src: &Tensor, index: &Tensor, sources: &[u32], rows: usize) -> Result<Tensor> {
    if cuda_available(src.device(), src.dtype()) {
        return cuda_training::scatter_rows(src, index, rows);
    }
    let (n, cols) = src.dims2()?;
    if sources.len() != n || sources.iter().any(|&r| r as usize >= rows) {
        candle_core::bail!("scatter-rows: {} sources for {n} rows into {rows}", sources.len());
    }
    if n == rows && sources.iter().enumerate().all(|(i, &r)| r as usize == i) {
        return Ok(src.clone());
    }
    // Row r of the result is row `from[r]` of `src` with a zero row appended (row n where nothing lands).
    let mut from = vec![n as u32; rows];
    for (i, &r) in sources.iter().enumerate() {
        from[r as usize] = i as u32;
    }
    let padded = Tensor::cat(&[src, &Tensor::zeros((1, cols), src.dtype(), src.device())?], 0)?;
    padded.index_select(&Tensor::from_vec(from, rows, src.device())?, 0)
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

#[cfg(test)]
mod tests {
    use super::super::kernel_tests::max_diff;
    use super::*;
    use candle_core::Device;

    /// The scatter puts each source row where it belongs and zeros elsewhere, as Candle's index_add does, for some
    /// rows, all rows in another order, and every row in place (the source itself).
    #[test]
    fn scattered_rows_land_where_index_add_puts_them() {
        let dev = Device::Cpu;
        let src = Tensor::randn(0f32, 1.0, (4, 3), &dev).unwrap().to_dtype(DType::BF16).unwrap();
        for (sources, rows) in [(vec![5u32, 0, 2, 6], 8), (vec![3, 1, 0, 2], 4), (vec![0, 1, 2, 3], 4)] {
            let index = Tensor::from_slice(&sources, 4, &dev).unwrap();
            let got = scatter_rows(&src, &index, &sources, rows).unwrap();
            let want = Tensor::zeros((rows, 3), DType::BF16, &dev).unwrap().index_add(&index, &src, 0).unwrap();
            assert_eq!(max_diff(&got, &want), 0.0, "sources {sources:?} into {rows} rows");
        }
        assert!(scatter_rows(&src, &Tensor::zeros(4, DType::U32, &dev).unwrap(), &[0, 1, 9, 2], 4).is_err());
    }
}
