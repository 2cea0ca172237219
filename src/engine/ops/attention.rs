//! Attention's dispatch: the scaled, masked softmax of composed attention (our CPU f32 kernel, our CUDA kernel,
//! Candle's softmax elsewhere), and the fused flash attention where it applies (then no T x T scores are built):
//! cuda/attention.rs, or our WGSL kernels under `--kernels wgsl` (metal/kernels.rs). Prefill on Metal goes through
//! Candle's sdpa (metal/sdpa.rs) otherwise.

use candle_core::{DType, Result, Tensor, D};

use super::cpu::{host::f32_of, training as cpu_training};
pub use super::cuda::attention::Logsumexp;
use super::cuda::{attention as cuda_attention, availability::available as cuda_available, training as cuda_training};
use super::kernel_choice::{is_cpu_f32, metal_dtypes, our_cpu_kernels};
use super::metal::AttentionMask;
use super::precision::upcast;

/// Attention probabilities `softmax(scale * scores + mask)` for scores (..., rows, total) whose rows are
/// query positions modulo `mask`'s height (t, total); one fused pass on the CPU in f32 and on CUDA.
pub fn scaled_masked_softmax(scores: &Tensor, scale: f64, mask: Option<&Tensor>) -> Result<Tensor> {
    metal_dtypes("scaled_masked_softmax", &[scores])?;
    let total = scores.dim(D::Minus1)?;
    if cuda_available(scores.device(), scores.dtype()) {
        return cuda_training::masked_softmax(scores, scale, mask);
    }
    if is_cpu_f32(scores) {
        let mask_data = mask.map(f32_of).transpose()?;
        let t = mask.map(|m| m.dim(0)).transpose()?.unwrap_or(1);
        let out =
            cpu_training::scaled_masked_softmax_f32(&f32_of(scores)?, scale as f32, mask_data.as_deref(), t, total);
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

/// Fused (flash-style) causal attention where [`fused_attention_applies`] (CUDA) or `--kernels wgsl` takes it
/// (`wgsl_attention_takes`): `q` (b, heads, tq, d) at positions `q_offset..` against `k`/`v` (b, kv_heads, tk, d),
/// no older than `window` keys back and, for packed rows, none before `row_starts` (u32 (b, t): where each query's
/// own example starts in its row; training only, `q_offset` 0): the output (b, tq, heads * d) and what
/// [`fused_attention_backward`] needs. None elsewhere: the caller composes.
pub fn fused_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    scale: f64,
    q_offset: usize,
    window: Option<usize>,
    row_starts: Option<&Tensor>,
) -> Result<Option<(Tensor, Logsumexp)>> {
    let (b, heads, t, d) = q.dims4()?;
    if wgsl_attention_takes(q, k, q_offset)? {
        let mask = AttentionMask { window, row_starts };
        let (q, k, v) = (q.contiguous()?, k.contiguous()?, v.contiguous()?);
        let (out, lse) = super::metal::attention(&q, &k, &v, scale, q_offset, mask)?;
        return Ok(Some((out.transpose(1, 2)?.reshape((b, t, heads * d))?, Logsumexp(lse))));
    }
    if !fused_attention_applies(q.device(), q.dtype(), d) {
        return Ok(None);
    }
    cuda_attention::forward(q, k, v, scale, q_offset, window.unwrap_or(0), row_starts).map(Some)
}

/// Whether [`fused_attention`] takes our WGSL attention kernels (`--kernels wgsl`, metal/kernels.rs): causal, the
/// queries the last of the keys (training and a first prefill from position 0, a prefill after a cache from
/// `q_offset`), and a head size the kernels are made for; a sliding window (gemma3's sliding layers, mistral's
/// `sliding_window`) and packed rows' example starts (position 0 only) are masked in the kernels.
fn wgsl_attention_takes(q: &Tensor, k: &Tensor, q_offset: usize) -> Result<bool> {
    let (_, _, t, d) = q.dims4()?;
    Ok(super::metal::takes(&[q, k])
        && k.dim(2)? == q_offset + t
        && super::metal::wgsl::ATTENTION_HEAD_DIMS.contains(&(d as u32)))
}

/// Gradients `(dq (b, heads, t, d), dk, dv (b, kv_heads, t, d))` of a training [`fused_attention`] (from
/// position 0, tq == tk) for the output gradient `d_out` (b * t, heads * d); `out` is its output; `row_starts` as
/// the forward had them.
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
    row_starts: Option<&Tensor>,
) -> Result<(Tensor, Tensor, Tensor)> {
    if wgsl_attention_takes(q, k, 0)? {
        let (b, heads, t, d) = q.dims4()?;
        let heads_first = |x: &Tensor| x.reshape((b, t, heads, d))?.transpose(1, 2)?.contiguous();
        let (q, k, v) = (q.contiguous()?, k.contiguous()?, v.contiguous()?);
        let (out, d_out) = (heads_first(out)?, heads_first(d_out)?);
        let mask = AttentionMask { window, row_starts };
        return super::metal::attention_backward(&q, &k, &v, &out, &d_out, &lse.0, scale, mask);
    }
    cuda_attention::backward(q, k, v, out, lse, d_out, scale, window.unwrap_or(0), row_starts)
}

/// Whether attention of more than one query against `keys` keys in `dtype` on `device` runs in blocks
/// (`ops::blocked_attention`, blocked_attention.rs): wherever the fused kernels do not ([`fused_attention_applies`]),
/// but for our CPU f32 kernels below [`NATIVE_CPU_BLOCKED_KEYS`]. Then no (T x T) scores and no additive mask are
/// built; single-query decode keeps its one row of scores.
pub fn blocked_attention_applies(device: &candle_core::Device, dtype: DType, head_dim: usize, keys: usize) -> bool {
    let composed_is_faster = our_cpu_kernels(device, dtype) && keys < NATIVE_CPU_BLOCKED_KEYS;
    !fused_attention_applies(device, dtype, head_dim) && !composed_is_faster
}

/// From this many keys on, our native CPU f32 path attends in blocks too. Training step of a 4-layer d=64 model
/// (2 cores, batch 1): the composed attention (BLAS products, our fused softmax) took 0.64 s against 0.98 s
/// blocked at T = 1024 and 2.3 s against 2.7 s at 2048, but 8.0 s against 6.5 s at 4096 (2.0 GB against
/// 0.35 GB peak RSS).
pub const NATIVE_CPU_BLOCKED_KEYS: usize = 4096;
