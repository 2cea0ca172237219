//! Products of activations: batched matrix products (BLAS on the CPU, cpu/blas_matmul.rs; Candle's matmul
//! elsewhere) and the accumulating product `acc + alpha * a b` (one cuBLAS call on CUDA, cuda/gemm.rs).
//! Products against frozen weights are frozen_matmul.rs's.

use candle_core::{DType, Result, Tensor};

use super::cuda::gemm as cuda_gemm;
use super::elementwise::{add, add_scaled};
use super::kernel_choice::{is_cpu_f32, metal_dtypes};

/// `a (..., m, k) · b (..., k, n)`, same batch dimensions: through BLAS for CPU f32 operands (our kernels), Candle's
/// matmul off the CPU, for other dtypes, without BLAS, and in the portable graph.
pub fn matmul(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    metal_dtypes("matmul", &[a, b])?;
    match super::cpu::blas_matmul::matmul(a, b)? {
        Some(product) => Ok(product),
        None => a.matmul(b),
    }
}

/// The sums of `a * b` along the last dimension in f32, `(..., n)` -> `(..., 1)`, for same-shaped `a` and `b`:
/// the product in the operands' dtype, then [`row_sums`]. On the portable graph two dispatches where multiplying,
/// casting to f32 and summing took three, each a pass over the rows (the cast at twice the width): the row dots of
/// the norm and attention backward passes.
pub fn row_dots(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    row_sums(&(a * b)?)
}

/// The outer product `column row` of a (m, 1) column and a (1, n) row, (m, n) contiguous, as a matrix product over an
/// inner size of one: how the portable graph scales whole rows and columns at once (one product, then one contiguous
/// multiply), where a broadcast multiply takes Candle's strided kernel at about three times a contiguous one's cost.
pub fn outer(column: &Tensor, row: &Tensor) -> Result<Tensor> {
    matmul(column, row)
}

/// The most blocks [`row_sums`] splits a row into, and the fewest elements it puts in a block.
const ROW_SUM_BLOCKS: (usize, usize) = (256, 64);

/// The sums of `x` along the last dimension in f32, `(..., n)` -> `(..., 1)`: blocks of each row multiplied by a
/// column of ones (one product, summed in its f32 accumulator and rounded once to `x`'s dtype), then the blocks'
/// sums added in f32. The blocks are a power of two dividing n, up to 256 of at least 64 elements: in half
/// precision each block's sum is rounded once, so 256 of them leave a row's sum about 2^-13 of itself off where one
/// rounded sum is 2^-9 off. A product by ones, not Candle's sum: no f32 copy of a half-precision `x` (its sums
/// accumulate in the input's dtype), one read of `x`.
pub fn row_sums(x: &Tensor) -> Result<Tensor> {
    let dims = x.dims().to_vec();
    let n = *dims.last().ok_or_else(|| candle_core::Error::Msg("row sums of a scalar".into()))?;
    let rows = x.elem_count() / n.max(1);
    let (most, least) = ROW_SUM_BLOCKS;
    let blocks = (0..=most.trailing_zeros())
        .rev()
        .map(|p| 1usize << p)
        .find(|&b| n.is_multiple_of(b) && n / b >= least)
        .unwrap_or(1);
    let ones = super::precision::ones_column(n / blocks, x.dtype(), x.device())?;
    let partial = matmul(&x.contiguous()?.reshape((rows * blocks, n / blocks))?, &ones)?;
    let partial = super::precision::upcast(&partial)?.reshape((rows, blocks))?;
    let sums = if blocks == 1 { partial } else { partial.sum_keepdim(candle_core::D::Minus1)? };
    let mut keep = dims;
    *keep.last_mut().expect("a row has a last dimension") = 1;
    sums.reshape(keep)
}

/// `acc + alpha * a b` (or `alpha * a b` without `acc`) for 2-D `a` (m, k) and `b` (k, n), which may be
/// transposed views. On CUDA one cuBLAS call that writes into `acc` in place (`ops/cuda/gemm.rs`), so the
/// caller must own `acc` alone (a fresh product, never a tensor kept elsewhere); under `--kernels wgsl`, with
/// `acc` and a low rank k (a LoRA update: `x A` times B, or `dy B` times A^T), our WGSL low-rank add in one
/// launch; elsewhere [`matmul`] then [`add_scaled`] (or a scale), as composed before.
pub fn matmul_add(acc: Option<Tensor>, a: &Tensor, b: &Tensor, alpha: f64) -> Result<Tensor> {
    if cuda_gemm::takes(acc.as_ref(), a, b) {
        return cuda_gemm::matmul_add(acc, a, b, alpha);
    }
    if let Some(acc) = acc.as_ref().filter(|acc| wgsl_lowrank_takes(acc, a, b)) {
        return super::metal::lowrank_add(acc, a, b, alpha, None);
    }
    if let Some(product) = product_scaled_on_an_operand(a, b, alpha)? {
        return match acc {
            Some(acc) => add(&acc, &product),
            None => Ok(product),
        };
    }
    let product = matmul(a, b)?;
    match acc {
        Some(acc) => add_scaled(&acc, &product, alpha),
        None if alpha == 1.0 => Ok(product),
        None => product * alpha,
    }
}

/// `alpha * a b` with `alpha` applied to an operand smaller than the product (a LoRA update's (rows, rank) side):
/// one pass over rank-sized values instead of one over the product, which on the portable graph is a dispatch
/// over (rows, out). None where no operand is smaller, alpha is 1, on the CPU in f32 (its add takes the scale in
/// the same pass), or in f16 with alpha below 1 (a shrunk f16 operand could lose bits the product keeps).
fn product_scaled_on_an_operand(a: &Tensor, b: &Tensor, alpha: f64) -> Result<Option<Tensor>> {
    let (Ok((m, k)), Ok((_, n))) = (a.dims2(), b.dims2()) else { return Ok(None) };
    if alpha == 1.0 || is_cpu_f32(a) || (a.dtype() == DType::F16 && alpha < 1.0) {
        return Ok(None);
    }
    Ok(match (k < n && m * k <= k * n, k < m && k * n < m * k) {
        (true, _) => Some(matmul(&(a * alpha)?, b)?),
        (_, true) => Some(matmul(a, &(b * alpha)?)?),
        _ => None,
    })
}

/// `acc + mask(a b)` for 2-D `a` (m, k) and `b` (k, n) and the dropout mask `mask` over (m, n): the backward's input
/// gradient through a dropped-out adapter input, `dx + mask((dy B) A^T)`. Under `--kernels wgsl`, with a low rank
/// k, our WGSL low-rank add with the mask drawn in the kernel (one launch); elsewhere the product, the mask and the
/// add.
pub fn matmul_add_dropped(acc: &Tensor, a: &Tensor, b: &Tensor, mask: &super::Dropout) -> Result<Tensor> {
    if wgsl_lowrank_takes(acc, a, b) {
        return super::metal::lowrank_add(acc, a, b, 1.0, Some(mask.for_wgsl()));
    }
    super::elementwise::add(acc, &mask.apply(&matmul(a, b)?)?)
}

/// Whether [`matmul_add`] takes the WGSL low-rank add: `--kernels wgsl` for these tensors, 2-D operands matching
/// `acc`, and an inner size up to `wgsl::LORA_MAX_RANK`.
fn wgsl_lowrank_takes(acc: &Tensor, a: &Tensor, b: &Tensor) -> bool {
    let (Ok((m, k)), Ok((kb, n))) = (a.dims2(), b.dims2()) else { return false };
    super::metal::takes(&[acc, a, b])
        && k == kb
        && k <= super::metal::wgsl::LORA_MAX_RANK as usize
        && acc.dims2().is_ok_and(|d| d == (m, n))
}

/// A LoRA update added to a base output at inference, `y + scale * (x a) b` for `y` (rows, out), `x` (rows, in), `a`
/// (in, rank), `b` (rank, out): under `--kernels wgsl` our WGSL epilogue (one launch, the (rows, rank) product kept
/// in workgroup memory; ranks up to `wgsl::LORA_MAX_RANK`), elsewhere the two products and the add.
pub fn lora_add(y: &Tensor, x: &Tensor, a: &Tensor, b: &Tensor, scale: f64) -> Result<Tensor> {
    if super::metal::takes(&[y, x, a, b]) && a.dim(1)? <= super::metal::wgsl::LORA_MAX_RANK as usize {
        return super::metal::lora_epilogue(y, x, a, b, scale);
    }
    y + (matmul(&matmul(x, a)?, b)? * scale)?
}

/// `alpha * a b` in f32 whatever the operands' dtype: an adapter's gradient (kept in f32). On CUDA one cuBLAS call
/// writes the f32 accumulators as they are (no product rounded to the operands' half precision, no cast pass);
/// elsewhere the product, scaled, then converted.
pub fn matmul_f32(a: &Tensor, b: &Tensor, alpha: f64) -> Result<Tensor> {
    if cuda_gemm::takes(None, a, b) {
        return cuda_gemm::matmul_f32(a, b, alpha);
    }
    matmul_add(None, a, b, alpha)?.to_dtype(DType::F32)
}
