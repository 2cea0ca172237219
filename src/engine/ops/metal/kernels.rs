//! The WGSL kernels as tensor functions, shaped like their portable counterparts in `ops`
//! (`rms_norm`/`rms_norm_backward`, `rope`/`rope_backward`, `silu_mul`/`silu_mul_backward`) plus the cross-entropy
//! head, the LoRA epilogue (and its training form, the low-rank add) and blocked attention. f32, f16 and bf16
//! tensors on a device with a route (`metal::run`: Metal on a Mac, the CPU through Vulkan with `wgpu-kernels`). The
//! dispatchers take them under `--kernels wgsl` (ops/rotary.rs, ops/attention.rs, ...).

use super::run;
use super::wgsl::{self, AttentionShape, Mask};
use candle_core::{DType, Result, Shape, Tensor, D};

fn rows_cols(x: &Tensor) -> Result<(usize, usize)> {
    let cols = x.dim(D::Minus1)?;
    Ok((x.elem_count() / cols.max(1), cols))
}

/// RMS norm over the last dimension, scaled by `weight`.
pub fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64) -> Result<Tensor> {
    let (rows, cols) = rows_cols(x)?;
    let out = run(&wgsl::rms_norm_fwd(rows, cols, eps as f32), 0, &[x, weight], &[x.shape().clone()])?;
    Ok(out[0].clone())
}

/// Gradient of [`rms_norm`] with respect to `x` (the weight is frozen).
pub fn rms_norm_backward(x: &Tensor, weight: &Tensor, eps: f64, dy: &Tensor) -> Result<Tensor> {
    let (rows, cols) = rows_cols(x)?;
    let launch = wgsl::rms_norm_bwd_dx(rows, cols, eps as f32);
    let out = run(&launch, 0, &[x, weight, dy], &[x.shape().clone(), Shape::from(rows)])?;
    Ok(out[0].clone())
}

/// Rotary embedding, "rotate half" layout, `x` (b, heads, t, head_dim) with `cos`/`sin` (t, head_dim / 2), or
/// (b, t, head_dim / 2) for packed rows: the full head turns (partial rotary stays on the portable path).
pub fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    rotate(x, cos, sin, 1.0)
}

/// Gradient of [`rope`]: the rotation by -theta.
pub fn rope_backward(dy: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    rotate(dy, cos, sin, -1.0)
}

/// (tables, positions, half) of `cos` when the rope kernel turns `x` (b, heads, t, 2 half) by it: one table of t
/// positions, or one for each of x's b batches (packed rows), `sin` of the same shape; None otherwise.
fn rope_tables(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Option<(usize, usize, usize)> {
    let (tables, seq, half) = match *cos.dims() {
        [seq, half] => (1, seq, half),
        [b, seq, half] => (b, seq, half),
        _ => return None,
    };
    let fits = matches!(*x.dims(), [b, _, t, d] if t == seq && d == 2 * half && (cos.rank() == 2 || b == tables));
    (fits && sin.dims() == cos.dims()).then_some((tables, seq, half))
}

/// Whether [`rope`] and [`rope_backward`] take `x` with these tables (see `rope_tables`).
pub fn rope_fits(x: &Tensor, cos: &Tensor, sin: &Tensor) -> bool {
    rope_tables(x, cos, sin).is_some()
}

fn rotate(x: &Tensor, cos: &Tensor, sin: &Tensor, sign: f32) -> Result<Tensor> {
    let (rows, _) = rows_cols(x)?;
    let Some((tables, seq, half)) = rope_tables(x, cos, sin) else {
        candle_core::bail!(
            "rope: x {:?} does not match cos {:?} / sin {:?} (a full rotary of the last axis)",
            x.dims(),
            cos.dims(),
            sin.dims()
        )
    };
    let out = run(&wgsl::rope(rows, seq, half, sign, tables), 0, &[x, cos, sin], &[x.shape().clone()])?;
    Ok(out[0].clone())
}

/// SwiGLU gate: silu(gate) * up.
pub fn silu_mul(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    let out = run(&wgsl::swiglu_fwd(gate.elem_count()), 0, &[gate, up], &[gate.shape().clone()])?;
    Ok(out[0].clone())
}

/// Gradients of [`silu_mul`] with respect to the gate and the up projection.
pub fn silu_mul_backward(gate: &Tensor, up: &Tensor, dm: &Tensor) -> Result<(Tensor, Tensor)> {
    let shape = gate.shape().clone();
    let out = run(&wgsl::swiglu_bwd(gate.elem_count()), 0, &[gate, up, dm], &[shape.clone(), shape])?;
    Ok((out[0].clone(), out[1].clone()))
}

/// `x` times the dropout mask `mask` (ops/dropout.rs), drawn in the kernel: one launch, no mask in memory.
pub fn dropout_apply(x: &Tensor, mask: Mask) -> Result<Tensor> {
    let out = run(&wgsl::dropout(x.elem_count(), mask), 0, &[x], &[x.shape().clone()])?;
    Ok(out[0].clone())
}

/// Cross-entropy of `logits` (rows, vocab) against `targets` (rows, i32; negative = ignored): the per-row loss
/// (f32) and the logits gradient scaled by `grad_scale`, in one launch.
pub fn cross_entropy(logits: &Tensor, targets: &Tensor, grad_scale: f32) -> Result<(Tensor, Tensor)> {
    let (rows, vocab) = logits.dims2()?;
    let targets = targets.to_dtype(DType::I32)?;
    let launch = wgsl::cross_entropy(rows, vocab, grad_scale);
    let out = run(&launch, 0, &[logits, &targets], &[logits.shape().clone(), Shape::from(rows)])?;
    Ok((out[1].clone(), out[0].clone()))
}

/// A LoRA factor as the kernels read it: itself when contiguous, the contiguous matrix it is a transposed view of
/// (the backward's A^T), else a contiguous copy.
fn factor(m: &Tensor) -> Result<(Tensor, wgsl::Factor)> {
    Ok(if m.is_contiguous() {
        (m.clone(), wgsl::Factor::AsKept)
    } else if m.t()?.is_contiguous() {
        (m.t()?, wgsl::Factor::Transposed)
    } else {
        (m.contiguous()?, wgsl::Factor::AsKept)
    })
}

/// `y + scale * (x a) b` for `y` (rows, n_out), `x` (rows, n_in), `a` (n_in, rank), `b` (rank, n_out): an adapter's
/// update at inference in one launch, the factors read where they lie ([`factor`]).
pub fn lora_epilogue(y: &Tensor, x: &Tensor, a: &Tensor, b: &Tensor, scale: f64) -> Result<Tensor> {
    let (n_in, rank) = a.dims2()?;
    let (rows, n_out) = rows_cols(y)?;
    if rank > wgsl::LORA_MAX_RANK as usize {
        candle_core::bail!("lora_epilogue: rank {rank} is above the kernel's {}", wgsl::LORA_MAX_RANK)
    }
    let ((a, a_is), (b, b_is)) = (factor(a)?, factor(b)?);
    let launch = wgsl::lora_epilogue(rows, n_in, n_out, rank, scale as f32, a_is, b_is);
    let out = run(&launch, 0, &[&y.contiguous()?, &x.contiguous()?, &a, &b], &[y.shape().clone()])?;
    Ok(out[0].clone())
}

/// `y + scale * x q` for `y` (rows, n_out), `x` (rows, rank) and `q` (rank, n_out): a training step's LoRA update
/// from the `x A` it keeps, in one launch, `q` read where it lies ([`factor`]); with `mask`, `scale * x q` is
/// multiplied by that dropout mask first.
pub fn lowrank_add(y: &Tensor, x: &Tensor, q: &Tensor, scale: f64, mask: Option<Mask>) -> Result<Tensor> {
    let (rows, rank) = x.dims2()?;
    let (q_rank, n_out) = q.dims2()?;
    if rank > wgsl::LORA_MAX_RANK as usize || q_rank != rank || y.dims2()? != (rows, n_out) {
        candle_core::bail!(
            "lowrank_add: y {:?} + x {:?} q {:?} (rank at most {})",
            y.dims(),
            x.dims(),
            q.dims(),
            wgsl::LORA_MAX_RANK
        )
    }
    let (b, b_is) = factor(q)?;
    let launch = wgsl::lowrank_add(rows, rank, n_out, scale as f32, b_is, mask);
    let out = run(&launch, 0, &[&y.contiguous()?, &x.contiguous()?, &b], &[y.shape().clone()])?;
    Ok(out[0].clone())
}

/// What hides keys from a query besides causality: a sliding window (None or 0: none) and packed rows' example
/// starts (u32 (b, t)).
#[derive(Clone, Copy)]
pub struct AttentionMask<'a> {
    /// A query sees no key `window` or more positions back.
    pub window: Option<usize>,
    /// Where each query's own example starts in its row: it sees no key before that.
    pub row_starts: Option<&'a Tensor>,
}

/// The launches' shape for queries from position `q_offset` and their row-starts input (the starts as u32, or one
/// placeholder element unpacked).
fn attention_shape(
    q: &Tensor,
    k: &Tensor,
    scale: f64,
    q_offset: usize,
    mask: AttentionMask,
) -> Result<(AttentionShape, Tensor)> {
    let (batch, heads, seq, head_dim) = q.dims4()?;
    let kv_heads = k.dim(1)?;
    if !wgsl::ATTENTION_HEAD_DIMS.contains(&(head_dim as u32)) || kv_heads == 0 || heads % kv_heads != 0 {
        candle_core::bail!("attention: head size {head_dim} / {heads} heads over {kv_heads} kv heads has no kernel")
    }
    if k.dim(2)? != q_offset + seq || (q_offset > 0 && mask.row_starts.is_some()) {
        candle_core::bail!(
            "attention: {seq} queries from position {q_offset} against {} keys (packed rows start at 0)",
            k.dim(2)?
        )
    }
    let starts = match mask.row_starts {
        Some(starts) if starts.dims() != [batch, seq] => {
            candle_core::bail!("attention: row starts {:?} for {batch} rows of {seq} queries", starts.dims())
        }
        Some(starts) => starts.to_dtype(DType::U32)?,
        None => Tensor::zeros(1, DType::U32, q.device())?,
    };
    let window = mask.window.unwrap_or(0);
    let packed = mask.row_starts.is_some();
    let scale = scale as f32;
    Ok((AttentionShape { batch, heads, kv_heads, seq, q_offset, head_dim, scale, window, packed }, starts))
}

/// Causal grouped-query attention of `q` (b, heads, t, d) at positions `q_offset..` over `k`/`v` (b, kv_heads,
/// q_offset + t, d) from position 0 (a prefill after a cache; 0 for training), further limited by `mask`, without
/// the T x T scores: the output and the per-row log-sum-exp (b, heads, t; f32) the backward needs.
pub fn attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    scale: f64,
    q_offset: usize,
    mask: AttentionMask,
) -> Result<(Tensor, Tensor)> {
    let (s, starts) = attention_shape(q, k, scale, q_offset, mask)?;
    let lse = Shape::from((s.batch, s.heads, s.seq));
    let out = run(&wgsl::attention_fwd(&s), s.head_dim as u32, &[q, k, v, &starts], &[q.shape().clone(), lse])?;
    Ok((out[0].clone(), out[1].clone()))
}

/// Gradients (dq, dk, dv) of a training [`attention`] (`q_offset` 0) from its output `o`, log-sum-exp `lse`, the
/// output gradient and the forward's `mask`.
#[allow(clippy::too_many_arguments)]
pub fn attention_backward(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    o: &Tensor,
    d_o: &Tensor,
    lse: &Tensor,
    scale: f64,
    mask: AttentionMask,
) -> Result<(Tensor, Tensor, Tensor)> {
    let (s, starts) = attention_shape(q, k, scale, 0, mask)?;
    let hd = s.head_dim as u32;
    let rows = Shape::from((s.batch, s.heads, s.seq));
    let inputs = [q, k, v, o, d_o, lse, &starts];
    let first = run(&wgsl::attention_bwd_dq(&s), hd, &inputs, &[q.shape().clone(), rows])?;
    let kv = k.shape().clone();
    let inputs = [q, k, v, d_o, lse, &first[1], &starts];
    let second = run(&wgsl::attention_bwd_dkdv(&s), hd, &inputs, &[kv.clone(), kv])?;
    Ok((first[0].clone(), second[0].clone(), second[1].clone()))
}
