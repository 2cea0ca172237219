//! The one seam for device-specific kernels. Callers (the model's blocks, the training pass) ask for an
//! operation; this module picks the implementation from the tensor's device and dtype:
//!
//! - CPU f32: our own parallel kernels (cpu_kernels.rs, gemv.rs, BLAS through frozen_matmul.rs / matmul.rs);
//! - CUDA f32/bf16: our fused kernels (cuda_training.rs, cuda_decode.rs, compiled from cuda/fused.cu), and
//!   single-row products (cuda_gemv.rs) and graph capture of a decode step (cuda_graph.rs);
//! - everywhere else (Metal; CPU f16/bf16): Candle's fused kernels where Candle has them (RMS norm, rotary,
//!   softmax: CPU, CUDA and Metal), composed Candle ops otherwise;
//! - f64 (the finite-difference tests): composed ops whose arithmetic stays in f64 (Candle's CPU RMS norm
//!   accumulates in f32).
//!
//! No op here records an autograd graph: the training backward is written by hand from the `*_backward`
//! functions, and nothing on a GPU path creates an f64 tensor (Metal has none).

mod backward;
mod blocked_attention;
mod cpu_kernels;
mod cross_entropy;
mod cuda_attention;
mod cuda_cast;
pub mod cuda_decode;
mod cuda_gemm;
#[cfg(feature = "cuda")]
mod cuda_gemv;
pub mod cuda_graph;
mod cuda_kernels;
pub mod cuda_optimizer;
mod cuda_residual;
mod cuda_training;
mod dropout;
mod frozen_matmul;
mod frozen_matmul_half;
mod gemv;
mod head_loss;
mod heads;
mod matmul;
mod metal_attention;
mod qgemv;
mod quantized;
mod quantized_head_loss;
mod scalar;

pub use backward::{
    gelu_tanh_mul_backward, rms_norm_backward, rms_norm_backward_add, rope_backward, silu_mul_backward,
    softmax_backward,
};
pub use blocked_attention::{
    block_size as attention_block_size, blocked_attention, blocked_attention_backward, BlockedStats,
};
pub use cuda_attention::Logsumexp;
pub use cuda_cast::cast_many;
pub use dropout::Dropout;
pub use frozen_matmul::{frozen_matmul, frozen_matmul_add, frozen_matmul_t, swiglu_matmul_t};
pub use head_loss::{head_nll, head_nll_rows, head_token_nll, logits_chunk_rows, HeadLoss};
pub use heads::{merge_heads_backward, split_heads};
pub use matmul::matmul;
pub use metal_attention::sdpa;
pub use quantized::{dequantize, qtensor_to_device, quantize_rows, quantized_matmul, quantized_matmul_t};
pub use scalar::{sum_to_host, Scalar};

/// Values of a frozen weight made dense in f32 at once for a CPU product: 2^24 (64 MB). An 8B model's MLP weight
/// (14336 x 4096, 235 MB in f32) would otherwise add itself whole to the step's peak, several times per layer.
const CPU_PIECE_VALUES: usize = 1 << 24;

/// The (first row, rows) pieces of at most [`CPU_PIECE_VALUES`] values (and at least one row) in which a CPU
/// product turns a (rows, row_len) frozen weight dense: one piece when the whole weight fits.
fn cpu_row_pieces(rows: usize, row_len: usize) -> Vec<(usize, usize)> {
    if rows * row_len <= CPU_PIECE_VALUES {
        return vec![(0, rows)];
    }
    let per_piece = (CPU_PIECE_VALUES / row_len.max(1)).max(1);
    (0..rows).step_by(per_piece).map(|first| (first, per_piece.min(rows - first))).collect()
}
pub use quantized_head_loss::{quantized_head_nll, QuantizedHead};

use candle_core::{DType, Result, Tensor, D};

pub use crate::engine::runtime::Kernels;

/// The kernels in use (the runtime options').
pub fn kernels() -> Kernels {
    crate::engine::runtime::options().kernels
}

/// In the portable graph, an error for a tensor whose dtype Candle's Metal backend lacks (f64: Metal has no
/// f64 at all), naming the op; nothing otherwise.
fn metal_dtypes(op: &str, tensors: &[&Tensor]) -> Result<()> {
    if kernels() == Kernels::Native {
        return Ok(());
    }
    match tensors.iter().find(|t| matches!(t.dtype(), DType::F64)) {
        Some(t) => candle_core::bail!("{op}: a {:?} tensor on the portable (Metal) path; Metal has no f64", t.dtype()),
        None => Ok(()),
    }
}

/// f64 (CPU-only test models) is normed by composed ops: Candle's CPU kernel accumulates in f32.
fn composed_in_f64(dtype: DType) -> bool {
    dtype == DType::F64
}

/// RMS norm over the last dimension, scaled by `weight`. On CUDA the kernel of [`add_rms_norm`] without the add, so
/// a sum that one returned norms again to the same bits.
pub fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64) -> Result<Tensor> {
    metal_dtypes("rms_norm", &[x, weight])?;
    if cuda_kernels::available(x.device(), x.dtype()) && weight.dtype() == x.dtype() {
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
    if cuda_kernels::available(x.device(), x.dtype()) && delta.dtype() == x.dtype() && weight.dtype() == x.dtype() {
        return cuda_residual::add_rms_norm(x, delta, weight, eps);
    }
    let sum = add(x, delta)?;
    let normed = rms_norm(&sum, weight, eps)?;
    Ok((sum, normed))
}

/// Rotary embedding, "rotate half" layout as in Hugging Face Llama. `x`: (b, heads, t, head_dim);
/// `cos`/`sin`: (t, rotary_dim / 2). Partial rotary (phi3): only the leading `rotary_dim` dimensions of each
/// head turn, the rest pass through.
pub fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    metal_dtypes("rope", &[x, cos, sin])?;
    on_rotary_dims(x, cos, |x| candle_nn::rotary_emb::rope(&x.contiguous()?, cos, sin))
}

/// `f` applied to the leading `2 * cos.dim(1)` dimensions of `x`'s last axis, the rest passed through: the
/// partial rotary of the rope forward and backward.
pub(crate) fn on_rotary_dims(x: &Tensor, cos: &Tensor, f: impl FnOnce(&Tensor) -> Result<Tensor>) -> Result<Tensor> {
    let (dim, rotary) = (x.dim(D::Minus1)?, 2 * cos.dim(D::Minus1)?);
    if rotary >= dim {
        return f(x);
    }
    let turned = f(&x.narrow(D::Minus1, 0, rotary)?.contiguous()?)?;
    Tensor::cat(&[&turned, &x.narrow(D::Minus1, rotary, dim - rotary)?], D::Minus1)?.contiguous()
}

/// Attention probabilities `softmax(scale * scores + mask)` for scores (..., rows, total) whose rows are
/// query positions modulo `mask`'s height (t, total); one fused pass on the CPU in f32 and on CUDA.
pub fn scaled_masked_softmax(scores: &Tensor, scale: f64, mask: Option<&Tensor>) -> Result<Tensor> {
    metal_dtypes("scaled_masked_softmax", &[scores])?;
    let total = scores.dim(D::Minus1)?;
    if cuda_kernels::available(scores.device(), scores.dtype()) {
        return cuda_training::masked_softmax(scores, scale, mask);
    }
    if is_cpu_f32(scores) {
        let mask_data = mask.map(f32_of).transpose()?;
        let t = mask.map(|m| m.dim(0)).transpose()?.unwrap_or(1);
        let out =
            cpu_kernels::scaled_masked_softmax_f32(&f32_of(scores)?, scale as f32, mask_data.as_deref(), t, total);
        return Tensor::from_vec(out, scores.shape(), scores.device());
    }
    let mut x = (upcast(scores)? * scale)?;
    if let Some(mask) = mask {
        let (t, dims) = (mask.dim(0)?, x.dims().to_vec());
        let rows = dims[dims.len() - 2];
        let lead: usize = dims[..dims.len() - 2].iter().product();
        x = x.reshape((lead, rows / t, t, total))?.broadcast_add(&mask.to_dtype(x.dtype())?)?.reshape(dims)?;
    }
    candle_nn::ops::softmax_last_dim(&x.contiguous()?)
}

/// Whether attention over queries of `dtype` with `head_dim` on `device` takes the fused kernels
/// ([`fused_attention`]): then no (T x T) scores and no additive mask are built.
pub fn fused_attention_applies(device: &candle_core::Device, dtype: DType, head_dim: usize) -> bool {
    cuda_attention::applies(device, dtype, head_dim)
}

/// Fused (flash-style) causal attention where [`fused_attention_applies`] (CUDA): `q` (b, heads, tq, d) at
/// positions `q_offset..` against `k`/`v` (b, kv_heads, tk, d), no older than `window` keys back: the output
/// (b, tq, heads * d) and what [`fused_attention_backward`] needs. None elsewhere: the caller composes.
pub fn fused_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    scale: f64,
    q_offset: usize,
    window: Option<usize>,
) -> Result<Option<(Tensor, Logsumexp)>> {
    let (_, _, _, d) = q.dims4()?;
    if !fused_attention_applies(q.device(), q.dtype(), d) {
        return Ok(None);
    }
    cuda_attention::forward(q, k, v, scale, q_offset, window.unwrap_or(0)).map(Some)
}

/// Gradients `(dq (b, heads, t, d), dk, dv (b, kv_heads, t, d))` of a training [`fused_attention`] (from
/// position 0, tq == tk) for the output gradient `d_out` (b * t, heads * d); `out` is its output.
#[allow(clippy::too_many_arguments)]
pub fn fused_attention_backward(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    out: &Tensor,
    lse: &Logsumexp,
    d_out: &Tensor,
    scale: f64,
    window: Option<usize>,
) -> Result<(Tensor, Tensor, Tensor)> {
    cuda_attention::backward(q, k, v, out, lse, d_out, scale, window.unwrap_or(0))
}

/// Whether attention of more than one query against `keys` keys in `dtype` on `device` runs in blocks
/// ([`blocked_attention`]): wherever the fused kernels do not ([`fused_attention_applies`]), but for our CPU f32
/// kernels below [`NATIVE_CPU_BLOCKED_KEYS`]. Then no (T x T) scores and no additive mask are built;
/// single-query decode keeps its one row of scores.
pub fn blocked_attention_applies(device: &candle_core::Device, dtype: DType, head_dim: usize, keys: usize) -> bool {
    let composed_is_faster = our_cpu_kernels(device, dtype) && keys < NATIVE_CPU_BLOCKED_KEYS;
    !fused_attention_applies(device, dtype, head_dim) && !composed_is_faster
}

/// From this many keys on, our native CPU f32 path attends in blocks too. Training step of a 4-layer d=64 model
/// (2 cores, batch 1): the composed attention (BLAS products, our fused softmax) took 0.64 s against 0.98 s
/// blocked at T = 1024 and 2.3 s against 2.7 s at 2048, but 8.0 s against 6.5 s at 4096 (2.0 GB against
/// 0.35 GB peak RSS).
pub const NATIVE_CPU_BLOCKED_KEYS: usize = 4096;

/// Whether our CPU f32 kernels take this tensor (never in the portable graph).
fn is_cpu_f32(x: &Tensor) -> bool {
    our_cpu_kernels(x.device(), x.dtype())
}

fn our_cpu_kernels(device: &candle_core::Device, dtype: DType) -> bool {
    device.is_cpu() && dtype == DType::F32 && kernels() == Kernels::Native
}

/// Which implementation each operation takes on `device` in `dtype`, from the same predicates the ops use:
/// what `metal-candle doctor` reports.
pub fn implementations(device: &candle_core::Device, dtype: DType) -> Vec<(&'static str, String)> {
    let ours_cpu = our_cpu_kernels(device, dtype);
    let ours_cuda = cuda_kernels::available(device, dtype);
    let blas = crate::engine::blas::library_name().filter(|_| ours_cpu);
    let options = crate::engine::runtime::options();
    let candle = |what: &str| format!("Candle's {what}");
    let products = match blas {
        Some(lib) if options.gemv => format!("{lib}, split over our CPU team; single rows: our matrix-vector kernel"),
        Some(lib) => format!("{lib}, split over our CPU team"),
        None => candle("matmul"),
    };
    let element_wise = if ours_cpu {
        "our CPU f32 kernels".to_string()
    } else if ours_cuda {
        "our fused CUDA kernels".into()
    } else {
        candle("composed ops")
    };
    let batched = blas.map(|lib| format!("{lib}, split over our CPU team")).unwrap_or_else(|| candle("matmul"));
    let attention = if cuda_attention::applies(device, dtype, 64) {
        "our fused CUDA flash attention (training forward/backward, prefill; head_dim 16/32/64/128)".to_string()
    } else if device.is_metal() && options.metal_sdpa {
        format!(
            "{} (prefill from position 0, decode); training and other prefills in blocks",
            candle("fused sdpa kernel")
        )
    } else if blocked_attention_applies(device, dtype, 64, 2) {
        format!("in blocks of queries and keys, online softmax, no T x T scores (products: {batched})")
    } else {
        format!(
            "scores and values: {batched}; scaled masked softmax: {element_wise}; from {NATIVE_CPU_BLOCKED_KEYS} keys \
             in blocks (no T x T scores)"
        )
    };
    let decode_layer = if cuda_decode::enabled(device, dtype) {
        "fused CUDA decoder layer (10 launches; layers with adapters on q/k/v/gate/up or q/k norms: composed)"
    } else {
        "composed from the ops above"
    };
    let norm = if composed_in_f64(dtype) { "composed in f64".to_string() } else { candle("fused RMS-norm kernel") };
    vec![
        ("kernel set", format!("{:?}", kernels()).to_lowercase()),
        ("frozen and adapter products", products),
        ("RMS norm", norm),
        ("rotary embedding", candle("fused rope kernel")),
        ("attention", attention),
        ("SwiGLU, residual adds", element_wise.clone()),
        (
            "GeGLU (gemma3) and its backward",
            if ours_cpu { "our CPU f32 kernels".into() } else { candle("gelu kernel and composed ops") },
        ),
        ("training backward (norm, rope, softmax, SwiGLU)", element_wise.clone()),
        (
            "head + loss",
            if ours_cpu && blas.is_some() { "chunked, through BLAS".into() } else { candle("ops, chunked") },
        ),
        ("decode step", decode_layer.to_string()),
    ]
}

fn f32_of(t: &Tensor) -> Result<F32Elems<'_>> {
    if t.device().is_cpu() && t.dtype() == DType::F32 {
        let (storage, layout) = t.storage_and_layout();
        if let Some((start, end)) = layout.contiguous_offsets() {
            return Ok(F32Elems::Borrowed(Box::new(storage), start, end));
        }
    }
    Ok(F32Elems::Owned(t.flatten_all()?.to_vec1::<f32>()?))
}

/// A tensor's f32 elements in order: borrowed from a contiguous CPU storage (no copy), else copied.
enum F32Elems<'a> {
    Borrowed(Box<dyn std::ops::Deref<Target = candle_core::Storage> + 'a>, usize, usize),
    Owned(Vec<f32>),
}

impl std::ops::Deref for F32Elems<'_> {
    type Target = [f32];

    fn deref(&self) -> &[f32] {
        match self {
            F32Elems::Borrowed(storage, start, end) => match &***storage {
                candle_core::Storage::Cpu(candle_core::CpuStorage::F32(v)) => &v[*start..*end],
                _ => unreachable!("borrowed only from CPU f32 storage"),
            },
            F32Elems::Owned(v) => v,
        }
    }
}

/// Half-precision tensors converted to f32 for numerically sensitive steps (softmax, loss); f32 and f64 stay.
pub fn upcast(x: &Tensor) -> Result<Tensor> {
    match x.dtype() {
        DType::F16 | DType::BF16 => x.to_dtype(DType::F32),
        _ => Ok(x.clone()),
    }
}

/// SwiGLU gate: silu(gate) * up (one parallel pass on the CPU in f32).
pub fn silu_mul(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    metal_dtypes("silu_mul", &[gate, up])?;
    if let Some(out) = gated_product_cpu(gate, up, |g| g / (1.0 + (-g).exp()))? {
        return Ok(out);
    }
    if cuda_kernels::available(gate.device(), gate.dtype()) && up.dtype() == gate.dtype() && up.shape() == gate.shape()
    {
        return cuda_training::silu_mul(gate, up);
    }
    candle_nn::ops::silu(gate)? * up
}

/// Row `index[i]` of `src` (rows, cols) as row i of the result: `src.index_select(index, 0)`, on CUDA (u32 index, a
/// dtype of the fused kernels) with 16-byte copies.
pub fn gather_rows(src: &Tensor, index: &Tensor) -> Result<Tensor> {
    if cuda_kernels::available(src.device(), src.dtype()) && index.dtype() == DType::U32 && src.rank() == 2 {
        return cuda_training::gather_rows(src, index);
    }
    src.index_select(index, 0)
}

/// A (rows, cols) tensor of zeros but for row `index[i]`, which is row i of `src` (n, cols): the head's
/// gradient for the positions that have a target, put back among all positions. `index` (n) u32, distinct.
/// One kernel on CUDA (Candle's index_add took 2 ms for the 1B step's 4,096 rows); zeros plus index_add
/// elsewhere.
pub fn scatter_rows(src: &Tensor, index: &Tensor, rows: usize) -> Result<Tensor> {
    if cuda_kernels::available(src.device(), src.dtype()) {
        return cuda_training::scatter_rows(src, index, rows);
    }
    Tensor::zeros((rows, src.dim(1)?), src.dtype(), src.device())?.index_add(index, src, 0)
}

/// GeGLU gate with the tanh approximation of gelu (PyTorch's `gelu(approximate="tanh")`): gelu(gate) * up.
/// One parallel pass on the CPU in f32; elsewhere Candle's gelu (the same tanh approximation; CPU, CUDA and
/// Metal kernels) and a product.
pub fn gelu_tanh_mul(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    metal_dtypes("gelu_tanh_mul", &[gate, up])?;
    if let Some(out) = gated_product_cpu(gate, up, |g| backward::gelu_tanh(g).0)? {
        return Ok(out);
    }
    gate.gelu()? * up
}

/// `act(gate) * up` in one parallel pass when both are CPU f32 tensors of one shape; None otherwise.
fn gated_product_cpu(gate: &Tensor, up: &Tensor, act: impl Fn(f32) -> f32 + Sync) -> Result<Option<Tensor>> {
    if !(is_cpu_f32(gate) && is_cpu_f32(up) && gate.shape() == up.shape()) {
        return Ok(None);
    }
    let (g, u) = (f32_of(gate)?, f32_of(up)?);
    let (g, u): (&[f32], &[f32]) = (&g, &u);
    let chunk = crate::engine::cpu_pool::ELEMENTS_PER_TASK;
    let out = crate::engine::cpu_pool::new_f32(g.len(), chunk, |i, dst| {
        let (g, u) = (&g[i * chunk..], &u[i * chunk..]);
        for (j, o) in dst.iter_mut().enumerate() {
            *o = act(g[j]) * u[j];
        }
    });
    Ok(Some(Tensor::from_vec(out, gate.shape(), gate.device())?))
}

/// `a + scale * b` for tensors of one shape: one parallel pass on the CPU in f32 (the training pass's
/// residuals, adapter outputs and gradient sums), Candle's ops otherwise.
pub fn add_scaled(a: &Tensor, b: &Tensor, scale: f64) -> Result<Tensor> {
    metal_dtypes("add", &[a, b])?;
    if is_cpu_f32(a) && is_cpu_f32(b) && a.shape() == b.shape() {
        let (x, y) = (f32_of(a)?, f32_of(b)?);
        let (x, y): (&[f32], &[f32]) = (&x, &y);
        let (s, chunk) = (scale as f32, crate::engine::cpu_pool::ELEMENTS_PER_TASK);
        let out = crate::engine::cpu_pool::new_f32(x.len(), chunk, |i, dst| {
            let (x, y) = (&x[i * chunk..], &y[i * chunk..]);
            for (j, o) in dst.iter_mut().enumerate() {
                *o = x[j] + s * y[j];
            }
        });
        return Tensor::from_vec(out, a.shape(), a.device());
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

/// `acc + alpha * a b` (or `alpha * a b` without `acc`) for 2-D `a` (m, k) and `b` (k, n), which may be
/// transposed views. On CUDA one cuBLAS call that writes into `acc` in place (`ops/cuda_gemm.rs`), so the
/// caller must own `acc` alone (a fresh product, never a tensor kept elsewhere); elsewhere [`matmul`] then
/// [`add_scaled`] (or a scale), as composed before.
pub fn matmul_add(acc: Option<Tensor>, a: &Tensor, b: &Tensor, alpha: f64) -> Result<Tensor> {
    if cuda_gemm::takes(acc.as_ref(), a, b) {
        return cuda_gemm::matmul_add(acc, a, b, alpha);
    }
    let product = matmul(a, b)?;
    match acc {
        Some(acc) => add_scaled(&acc, &product, alpha),
        None if alpha == 1.0 => Ok(product),
        None => product * alpha,
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
        let d = (a.to_dtype(DType::F64).unwrap() - b.to_dtype(DType::F64).unwrap()).unwrap();
        d.abs().unwrap().max_all().unwrap().to_scalar().unwrap()
    }

    /// Each hand-written input gradient (CPU f32 kernel) against Candle's autograd through the same block
    /// composed from differentiable ops in f64, with a non-trivial upstream gradient.
    #[test]
    fn backward_kernels_match_autograd_of_composed_blocks() {
        let dev = Device::Cpu;
        let x64 = Tensor::randn(0f64, 1.0, (2, 3, 5, 8), &dev).unwrap();
        let other64 = Tensor::randn(0f64, 1.0, (2, 3, 5, 8), &dev).unwrap();
        let w64 = Tensor::randn(1f64, 0.2, 8, &dev).unwrap();
        let cos64 = Tensor::randn(0f64, 1.0, (5, 4), &dev).unwrap();
        let sin64 = Tensor::randn(0f64, 1.0, (5, 4), &dev).unwrap();
        let up64 = Tensor::randn(0f64, 1.0, (2, 3, 5, 8), &dev).unwrap();
        let f32 = |t: &Tensor| t.to_dtype(DType::F32).unwrap();
        // d/dx of sum(block(x) * up) by autograd.
        let autograd = |block: &dyn Fn(&Tensor) -> Tensor| -> Tensor {
            let x = Var::from_tensor(&x64).unwrap();
            let loss = (block(x.as_tensor()) * &up64).unwrap().sum_all().unwrap();
            loss.backward().unwrap().get(x.as_tensor()).unwrap().clone()
        };

        let expected = autograd(&|x| {
            let inv = (x.sqr().unwrap().mean_keepdim(D::Minus1).unwrap() + 1e-6).unwrap().sqrt().unwrap();
            x.broadcast_div(&inv).unwrap().broadcast_mul(&w64).unwrap()
        });
        let got = rms_norm_backward(&f32(&x64), &f32(&w64), 1e-6, &f32(&up64)).unwrap();
        assert!(max_diff(&got, &expected) < 1e-4, "rms norm");

        let expected = autograd(&|x| {
            let (x1, x2) = (x.narrow(D::Minus1, 0, 4).unwrap(), x.narrow(D::Minus1, 4, 4).unwrap());
            let (c, s) =
                (cos64.unsqueeze(0).unwrap().unsqueeze(0).unwrap(), sin64.unsqueeze(0).unwrap().unsqueeze(0).unwrap());
            let o1 = (x1.broadcast_mul(&c).unwrap() - x2.broadcast_mul(&s).unwrap()).unwrap();
            let o2 = (x2.broadcast_mul(&c).unwrap() + x1.broadcast_mul(&s).unwrap()).unwrap();
            Tensor::cat(&[o1, o2], D::Minus1).unwrap()
        });
        let got = rope_backward(&f32(&up64), &f32(&cos64), &f32(&sin64)).unwrap();
        assert!(max_diff(&got, &expected) < 1e-4, "rope");

        let scale = 0.35;
        let expected = autograd(&|x| candle_nn::ops::softmax(&(x * scale).unwrap(), D::Minus1).unwrap());
        let p = scaled_masked_softmax(&f32(&x64), scale, None).unwrap();
        let got = softmax_backward(&p, &f32(&up64), scale).unwrap();
        assert!(max_diff(&got, &expected) < 1e-4, "softmax");

        let expected = autograd(&|g| (candle_nn::ops::silu(g).unwrap() * &other64).unwrap());
        let (got, _) = silu_mul_backward(&f32(&x64), &f32(&other64), &f32(&up64)).unwrap();
        assert!(max_diff(&got, &expected) < 1e-4, "silu gate");

        // Candle's gelu is the tanh approximation (GeGLU, gemma3); its autograd rounds the constants, so the
        // f64 reference here is a central difference of the exact f64 forward.
        let h = 1e-6;
        let slope = ((((&x64 + h).unwrap().gelu().unwrap() - (&x64 - h).unwrap().gelu().unwrap()).unwrap())
            / (2.0 * h))
            .unwrap();
        let expected = ((slope * &other64).unwrap() * &up64).unwrap();
        let (got, got_up) = gelu_tanh_mul_backward(&f32(&x64), &f32(&other64), &f32(&up64)).unwrap();
        assert!(max_diff(&got, &expected) < 1e-4, "gelu gate (CPU f32 kernel)");
        assert!(max_diff(&got_up, &(x64.gelu().unwrap() * &up64).unwrap()) < 1e-4, "gelu up");
        let (composed, _) = gelu_tanh_mul_backward(&x64, &other64, &up64).unwrap();
        assert!(max_diff(&composed, &expected) < 1e-8, "gelu gate (composed f64)");
        let fast = gelu_tanh_mul(&f32(&x64), &f32(&other64)).unwrap();
        assert!(max_diff(&fast, &(x64.gelu().unwrap() * &other64).unwrap()) < 1e-5, "gelu forward");
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

    #[test]
    fn frozen_matmul_matches_a_plain_product_both_ways() {
        let dev = Device::Cpu;
        let x = Tensor::randn(0f32, 1.0, (2, 3, 8), &dev).unwrap();
        let w = Tensor::randn(0f32, 1.0, (5, 8), &dev).unwrap();
        let y = frozen_matmul_t(&x, &w).unwrap();
        assert!(max_diff(&y, &x.broadcast_matmul(&w.t().unwrap()).unwrap()) < 1e-5);
        let back = frozen_matmul(&y, &w).unwrap();
        assert!(max_diff(&back, &y.broadcast_matmul(&w).unwrap()) < 1e-4);
    }
}
