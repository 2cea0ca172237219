//! Forward (keeping what the backward needs) and backward of one pre-norm decoder layer: RMS norm,
//! grouped-query self-attention with rotary embeddings (optional q/k norms), residual, RMS norm, SwiGLU MLP,
//! residual. Mirrors `DecoderLayer::forward` in model/transformer.rs for a whole sequence from position 0;
//! tests/training.rs checks both passes against Candle's autograd on the same layer code.

use super::linear::{self, LinearTape};
use super::Gradients;
use crate::engine::model::transformer::DecoderLayer;
use crate::engine::ops;
use candle_core::{DType, Result, Tensor};

/// Per-sequence facts shared by every layer of one batch.
pub(super) struct SequenceContext {
    pub batch: usize,
    pub seq_len: usize,
    /// Rotary tables for positions 0..seq_len.
    pub cos: Tensor,
    pub sin: Tensor,
    /// Additive causal (and sliding-window) mask (t, t).
    pub mask: Option<Tensor>,
    /// Dropout on the adapters' inputs.
    pub train: bool,
}

impl SequenceContext {
    /// f64 models (the gradient tests) use the composed ops, whose arithmetic stays in f64; every other dtype
    /// uses the fused inference kernels forward.
    pub(super) fn composed(dtype: DType) -> bool {
        dtype == DType::F64
    }
}

/// Activations of one layer saved by the forward pass. Rows are `batch * seq_len`.
pub(super) struct LayerTape {
    x: Tensor,
    normed_in: Tensor,
    /// Per-head q/k before their norms (qwen3), (b, heads, t, d).
    q_pre_norm: Option<Tensor>,
    k_pre_norm: Option<Tensor>,
    /// After rotary embedding, grouped as (b, kv_heads, rep * t, d) and (b, kv_heads, t, d).
    q: Tensor,
    k: Tensor,
    v: Tensor,
    /// Attention probabilities (b, kv_heads, rep * t, t).
    probs: Tensor,
    /// Attention output before o_proj, (rows, heads * d).
    attn: Tensor,
    x_mid: Tensor,
    normed_mid: Tensor,
    gate: Tensor,
    up: Tensor,
    gated: Tensor,
    /// q, k, v, o, gate, up, down.
    linears: [LinearTape; 7],
}

/// `x`: (rows, hidden) -> the layer's output (rows, hidden) and its tape.
pub(super) fn forward(layer: &DecoderLayer, x: &Tensor, ctx: &SequenceContext) -> Result<(Tensor, LayerTape)> {
    let att = &layer.self_attn;
    let (b, t, d) = (ctx.batch, ctx.seq_len, att.head_dim);
    let (heads, kv_heads) = (att.num_heads, att.num_kv_heads);
    let composed = SequenceContext::composed(x.dtype());
    let normed_in = ops::rms_norm(x, &layer.input_layernorm, layer.rms_norm_eps, composed)?;
    let (q, q_tape) = linear::forward(&att.q_proj, &normed_in, ctx.train)?;
    let (k, k_tape) = linear::forward(&att.k_proj, &normed_in, ctx.train)?;
    let (v, v_tape) = linear::forward(&att.v_proj, &normed_in, ctx.train)?;
    let split = |y: Tensor, n: usize| -> Result<Tensor> { y.reshape((b, t, n, d))?.transpose(1, 2)?.contiguous() };
    let (mut q, mut k, v) = (split(q, heads)?, split(k, kv_heads)?, split(v, kv_heads)?);
    let (mut q_pre_norm, mut k_pre_norm) = (None, None);
    if let (Some(qn), Some(kn)) = (&att.q_norm, &att.k_norm) {
        q_pre_norm = Some(q.clone());
        k_pre_norm = Some(k.clone());
        q = ops::rms_norm(&q, qn, att.rms_norm_eps, composed)?;
        k = ops::rms_norm(&k, kn, att.rms_norm_eps, composed)?;
    }
    let q = ops::rope(&q, &ctx.cos, &ctx.sin, composed)?;
    let k = ops::rope(&k, &ctx.cos, &ctx.sin, composed)?.contiguous()?;
    let rep = heads / kv_heads;
    let q = q.contiguous()?.reshape((b, kv_heads, rep * t, d))?;
    let scale = 1.0 / (d as f64).sqrt();
    let scores = ops::matmul(&q, &k.t()?)?;
    let probs = ops::scaled_masked_softmax(&scores, scale, ctx.mask.as_ref(), composed)?.to_dtype(v.dtype())?;
    let attn = ops::matmul(&probs, &v)?.reshape((b, heads, t, d))?.transpose(1, 2)?.reshape((b * t, heads * d))?;
    let (attn_out, o_tape) = linear::forward(&att.o_proj, &attn, ctx.train)?;
    let x_mid = ops::add(x, &attn_out)?;
    let normed_mid = ops::rms_norm(&x_mid, &layer.post_attention_layernorm, layer.rms_norm_eps, composed)?;
    let (gate, gate_tape) = linear::forward(&layer.mlp.gate_proj, &normed_mid, ctx.train)?;
    let (up, up_tape) = linear::forward(&layer.mlp.up_proj, &normed_mid, ctx.train)?;
    let gated = ops::silu_mul(&gate, &up)?;
    let (down, down_tape) = linear::forward(&layer.mlp.down_proj, &gated, ctx.train)?;
    let out = ops::add(&x_mid, &down)?;
    let tape = LayerTape {
        x: x.clone(),
        normed_in,
        q_pre_norm,
        k_pre_norm,
        q,
        k,
        v,
        probs,
        attn,
        x_mid,
        normed_mid,
        gate,
        up,
        gated,
        linears: [q_tape, k_tape, v_tape, o_tape, gate_tape, up_tape, down_tape],
    };
    Ok((out, tape))
}

/// Given the gradient of the layer's output, accumulate its adapters' gradients and return the gradient of
/// its input (None when `need_input_grad` is false: nothing below needs it).
pub(super) fn backward(
    layer: &DecoderLayer,
    tape: &LayerTape,
    d_out: &Tensor,
    ctx: &SequenceContext,
    grads: &mut Gradients,
    need_input_grad: bool,
) -> Result<Option<Tensor>> {
    let att = &layer.self_attn;
    let mlp = &layer.mlp;
    let (b, t, d) = (ctx.batch, ctx.seq_len, att.head_dim);
    let (heads, kv_heads) = (att.num_heads, att.num_kv_heads);
    let rep = heads / kv_heads;
    let [q_tape, k_tape, v_tape, o_tape, gate_tape, up_tape, down_tape] = &tape.linears;
    let input_grad = |y: Option<Tensor>| y.ok_or_else(|| candle_core::Error::Msg("missing input gradient".into()));

    // MLP and its residual.
    let d_gated = input_grad(linear::backward(&mlp.down_proj, &tape.gated, down_tape, d_out, grads, true)?)?;
    let (d_gate, d_up) = ops::silu_mul_backward(&tape.gate, &tape.up, &d_gated)?;
    let d_normed_mid = ops::add(
        &input_grad(linear::backward(&mlp.gate_proj, &tape.normed_mid, gate_tape, &d_gate, grads, true)?)?,
        &input_grad(linear::backward(&mlp.up_proj, &tape.normed_mid, up_tape, &d_up, grads, true)?)?,
    )?;
    let d_mid = ops::add(
        d_out,
        &ops::rms_norm_backward(&tape.x_mid, &layer.post_attention_layernorm, layer.rms_norm_eps, &d_normed_mid)?,
    )?;

    // Attention.
    let d_attn = input_grad(linear::backward(&att.o_proj, &tape.attn, o_tape, &d_mid, grads, true)?)?;
    let d_o = d_attn.reshape((b, t, heads, d))?.transpose(1, 2)?.contiguous()?.reshape((b, kv_heads, rep * t, d))?;
    let d_v = ops::matmul(&tape.probs.t()?, &d_o)?; // (b, kv, t, d)
    let d_probs = ops::matmul(&d_o, &tape.v.t()?)?;
    let scale = 1.0 / (d as f64).sqrt();
    let d_scores = ops::softmax_backward(&tape.probs, &d_probs, scale)?.to_dtype(tape.q.dtype())?;
    let d_q = ops::matmul(&d_scores, &tape.k)?.reshape((b, heads, t, d))?;
    let d_k = ops::matmul(&d_scores.t()?, &tape.q)?; // (b, kv, t, d)
    let mut d_q = ops::rope_backward(&d_q, &ctx.cos, &ctx.sin)?;
    let mut d_k = ops::rope_backward(&d_k, &ctx.cos, &ctx.sin)?;
    if let (Some(qn), Some(kn), Some(q_pre), Some(k_pre)) =
        (&att.q_norm, &att.k_norm, &tape.q_pre_norm, &tape.k_pre_norm)
    {
        d_q = ops::rms_norm_backward(q_pre, qn, att.rms_norm_eps, &d_q)?;
        d_k = ops::rms_norm_backward(k_pre, kn, att.rms_norm_eps, &d_k)?;
    }
    let rows = |g: Tensor, n: usize| -> Result<Tensor> { g.transpose(1, 2)?.reshape((b * t, n * d)) };
    let (d_q, d_k, d_v) = (rows(d_q, heads)?, rows(d_k, kv_heads)?, rows(d_v, kv_heads)?);
    let from_q = linear::backward(&att.q_proj, &tape.normed_in, q_tape, &d_q, grads, need_input_grad)?;
    let from_k = linear::backward(&att.k_proj, &tape.normed_in, k_tape, &d_k, grads, need_input_grad)?;
    let from_v = linear::backward(&att.v_proj, &tape.normed_in, v_tape, &d_v, grads, need_input_grad)?;
    if !need_input_grad {
        return Ok(None);
    }
    let d_normed_in = ops::add(&ops::add(&input_grad(from_q)?, &input_grad(from_k)?)?, &input_grad(from_v)?)?;
    let d_x =
        ops::add(&d_mid, &ops::rms_norm_backward(&tape.x, &layer.input_layernorm, layer.rms_norm_eps, &d_normed_in)?)?;
    Ok(Some(d_x))
}
