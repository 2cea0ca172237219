//! Self-attention with grouped-query heads, optional q/k norms (per head: qwen3, gemma3; over the whole
//! projection: olmo2), biases (qwen2), a sliding window (mistral: every layer; gemma3: the sliding layers,
//! which also rotate with their own rope base), a fused q|k|v projection and partial rotary (phi3, see
//! [`super::projection_group`] and `ops::rope`), layers without rotary embedding (smollm3) and a configured
//! score scale (gemma3, granite). This file owns all of the block's math: the inference forward over a KV
//! cache, the training forward that records what the backward needs, the backward, and the fused single-token
//! decode step.
//! Device-specific kernels are chosen inside `ops`.

use super::gradients::Gradients;
use super::kv_cache::LayerCache;
use super::linear::{InputGrad, Linear, LinearTape};
use super::norm::RmsNorm;
use super::projection_group::ProjectionGroup;
use super::rotary::RotaryTables;
use super::sequence::SequenceContext;
use super::weight_loader::WeightLoader;
use super::ModelConfig;
use crate::engine::ops;
use crate::engine::Result;
use candle_core::{Device, Tensor, D};

/// Self-attention with grouped-query heads.
#[derive(Debug, Clone)]
pub struct Attention {
    /// q, k and v: `q_proj`, `k_proj`, `v_proj` (row views of one concatenated weight when dense), or phi3's
    /// single `qkv_proj`.
    pub qkv: ProjectionGroup,
    pub o_proj: Linear,
    /// RMS norms of queries and keys: per head (qwen3, gemma3; (head_dim)) or over the whole projection
    /// (olmo2, `qk_norm_over_projection`; (heads * head_dim)).
    pub q_norm: Option<RmsNorm>,
    pub k_norm: Option<RmsNorm>,
    /// The q/k norms span the whole projection, before the split into heads (olmo2).
    pub qk_norm_over_projection: bool,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    /// Multiplies the scores before the softmax (`ModelConfig::attention_scale`).
    pub attention_scale: f64,
    pub sliding_window: Option<usize>,
    /// A sliding layer of a model that mixes sliding and global layers (gemma3): it rotates with the local
    /// rope tables (`local_rope_theta`, when the config has one) and, in training, attends through the
    /// sequence context's local mask.
    pub local: bool,
    /// Whether q and k are rotated (false on smollm3's NoPE layers).
    pub use_rope: bool,
}

/// What the attention backward needs from its training forward.
pub struct AttentionTape {
    /// q/k before their norms: per head (b, heads, t, d), or the projections (rows, heads * d) when the norms
    /// span them.
    q_pre_norm: Option<Tensor>,
    k_pre_norm: Option<Tensor>,
    /// After rotary embedding, (b, heads, t, d) contiguous and (b, kv_heads, t, d).
    q: Tensor,
    k: Tensor,
    v: Tensor,
    /// What the attention backward recomputes the probabilities from.
    scores: Scores,
    /// Attention output before o_proj, (rows, heads * d).
    attn: Tensor,
    /// The q|k|v group's tapes.
    qkv: Vec<LinearTape>,
    o: LinearTape,
}

impl AttentionTape {
    /// Lets go of the block's input (the normed layer input) where q|k|v's adapters kept it: the layer makes it again
    /// for the backward from the input it keeps anyway.
    pub(super) fn forget_input(&mut self) {
        self.qkv.iter_mut().for_each(LinearTape::forget_input);
    }

    /// Whether the backward needs the block's input handed to it ([`Self::forget_input`]).
    pub(super) fn needs_input(&self) -> bool {
        self.qkv.iter().any(LinearTape::needs_input)
    }
}

/// The fused attention's results in one layer's training forward: what a checkpointed layer whose input waits in
/// host memory keeps beside it, so that its recompute skips the attention (at 8B x 32k tokens the flash forward is a
/// tenth of the step). The output (rows, heads * d) and each query's logsumexp.
pub struct AttentionResult {
    pub out: Tensor,
    pub lse: Tensor,
}

impl AttentionTape {
    /// This forward's [`AttentionResult`], where the fused kernels ran (None elsewhere: the recompute attends again).
    pub fn fused_result(&self) -> Option<AttentionResult> {
        match &self.scores {
            Scores::Fused(lse) => Some(AttentionResult { out: self.attn.clone(), lse: lse.0.clone() }),
            _ => None,
        }
    }
}

/// The composed path keeps the probabilities (b, kv_heads, rep * t, t); the fused one (CUDA) and the blocked one
/// (everywhere else) only each row's logsumexp, linear in t.
enum Scores {
    Probs(Tensor),
    Fused(ops::Logsumexp),
    Blocked(ops::BlockedStats),
}

/// Queries, keys and values split into heads, normed (qwen3, gemma3, olmo2) and rotated.
struct Heads {
    /// (b, heads, t, d).
    q: Tensor,
    /// (b, kv_heads, t, d).
    k: Tensor,
    v: Tensor,
    q_pre_norm: Option<Tensor>,
    k_pre_norm: Option<Tensor>,
}

impl Attention {
    /// Layer `layer`'s attention, its weights under `prefix`.
    pub(super) fn new(cfg: &ModelConfig, w: &WeightLoader, prefix: &str, layer: usize) -> Result<Self> {
        let (h, q, kv) = (cfg.hidden_size, cfg.num_attention_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim);
        let norm = |name: &'static str, width: usize| -> Result<Option<RmsNorm>> {
            if !cfg.qk_norm {
                return Ok(None);
            }
            let weight = w.get(&format!("{prefix}.{name}.weight"), &[width])?;
            Ok(Some(RmsNorm::new(name, weight, cfg.norm_weight_offset, cfg.rms_norm_eps)?))
        };
        let (q_width, k_width) = cfg.qk_norm_widths();
        let slides = cfg.layer_slides(layer);
        let fused = cfg.fused_projections.then_some("qkv_proj");
        let qkv =
            ProjectionGroup::load(w, prefix, ["q_proj", "k_proj", "v_proj"], fused, h, [q, kv, kv], cfg.qkv_bias)?;
        Ok(Self {
            qkv,
            o_proj: w.linear(&format!("{prefix}.o_proj"), q, h, cfg.o_bias)?,
            q_norm: norm("q_norm", q_width)?,
            k_norm: norm("k_norm", k_width)?,
            qk_norm_over_projection: cfg.qk_norm_over_projection,
            num_heads: cfg.num_attention_heads,
            num_kv_heads: cfg.num_kv_heads,
            head_dim: cfg.head_dim,
            attention_scale: cfg.attention_scale,
            sliding_window: if slides { cfg.sliding_window } else { None },
            local: slides && !cfg.sliding_layers.is_empty(),
            use_rope: cfg.layer_uses_rope(layer),
        })
    }

    /// (b, t, n * d) or (rows, n * d) projections [q, k, v] -> normed, rotated heads. `query_view`: the queries may
    /// come as a strided view ([`ops::split_query_heads`]), for the blocked attention, which gathers them itself.
    fn heads(
        &self,
        qkv: Vec<Tensor>,
        (b, t): (usize, usize),
        (cos, sin): (&Tensor, &Tensor),
        query_view: bool,
    ) -> Result<Heads> {
        let [mut q, mut k, v]: [Tensor; 3] =
            qkv.try_into().map_err(|_| candle_core::Error::Msg("q|k|v projections give 3 parts".into()))?;
        let d = self.head_dim;
        let (mut q_pre_norm, mut k_pre_norm) = (None, None);
        let norms = self.q_norm.as_ref().zip(self.k_norm.as_ref());
        if let Some((qn, kn)) = norms.filter(|_| self.qk_norm_over_projection) {
            q_pre_norm = Some(q.clone());
            k_pre_norm = Some(k.clone());
            q = qn.forward(&q)?;
            k = kn.forward(&k)?;
        }
        let rope = self.use_rope.then_some((cos, sin));
        let split = |y: &Tensor, n: usize, rope| ops::split_heads(y, (b, t, n, d), rope);
        let v = split(&v, self.num_kv_heads, None)?;
        let Some((qn, kn)) = norms.filter(|_| !self.qk_norm_over_projection) else {
            // The split and the rotation in one pass where the fused kernel runs.
            let q = match query_view {
                true => ops::split_query_heads(&q, (b, t, self.num_heads, d), rope)?,
                false => split(&q, self.num_heads, rope)?,
            };
            let k = split(&k, self.num_kv_heads, rope)?;
            return Ok(Heads { q, k, v, q_pre_norm, k_pre_norm });
        };
        // Per-head norms sit between the split and the rotation.
        let (q, k) = (split(&q, self.num_heads, None)?, split(&k, self.num_kv_heads, None)?);
        let (q_normed, k_normed) = (qn.forward(&q)?, kn.forward(&k)?);
        let (q_pre_norm, k_pre_norm) = (Some(q), Some(k));
        let (q, k) = match rope {
            Some((cos, sin)) => (ops::rope(&q_normed, cos, sin)?, ops::rope(&k_normed, cos, sin)?.contiguous()?),
            None => (q_normed, k_normed),
        };
        Ok(Heads { q, k, v, q_pre_norm, k_pre_norm })
    }

    /// Grouped-query attention without repeating K/V: the query heads that share a KV head are folded into
    /// the row dimension. `q`: (b, heads, t, d); `k`/`v`: (b, kv_heads, total, d). Returns the probabilities
    /// (b, kv, rep * t, total) and the output (b, t, heads * d).
    fn attend(&self, q: &Tensor, k: &Tensor, v: &Tensor, mask: Option<&Tensor>) -> Result<(Tensor, Tensor)> {
        let (b, heads, t, d) = q.dims4()?;
        let rep = heads / self.num_kv_heads;
        let q = q.contiguous()?.reshape((b, self.num_kv_heads, rep * t, d))?;
        let scores = ops::matmul(&q, &k.t()?)?;
        let probs = ops::scaled_masked_softmax(&scores, self.scale(), mask)?.to_dtype(v.dtype())?;
        let out = ops::matmul(&probs, v)?.reshape((b, heads, t, d))?.transpose(1, 2)?.reshape((b, t, heads * d))?;
        Ok((probs, out))
    }

    fn scale(&self) -> f64 {
        self.attention_scale
    }

    /// Inference: `x` (b, t, hidden) at positions `start_pos..`, reading and extending `cache` when given.
    pub(super) fn forward(
        &self,
        x: &Tensor,
        rotary: &RotaryTables,
        start_pos: usize,
        cache: Option<&mut LayerCache>,
    ) -> Result<Tensor> {
        let (b, t, _) = x.dims3()?;
        let (cos, sin) = rotary.slice(start_pos, t)?;
        let h = self.heads(self.qkv.forward(x)?, (b, t), (&cos, &sin), false)?;
        let (k, v) = match cache {
            Some(c) => c.append(&h.k, &h.v)?,
            None => (h.k, h.v),
        };
        if t > 1 {
            let offset = k.dim(2)? - t;
            if let Some((out, _)) = ops::fused_attention(&h.q, &k, &v, self.scale(), offset, self.sliding_window, None)?
            {
                return Ok(self.o_proj.forward(&out)?);
            }
        }
        if let Some(out) = ops::sdpa(&h.q, &k, &v, self.scale(), start_pos, self.sliding_window)? {
            let out = out.transpose(1, 2)?.reshape((b, t, self.num_heads * self.head_dim))?;
            return Ok(self.o_proj.forward(&out)?);
        }
        if t > 1 && ops::blocked_attention_applies(x.device(), x.dtype(), self.head_dim, k.dim(2)?) {
            let offset = k.dim(2)? - t;
            let (out, _) = ops::blocked_attention(&h.q, &k, &v, self.scale(), offset, self.sliding_window, None)?;
            return Ok(self.o_proj.forward(&out)?);
        }
        let mask = attention_mask(t, start_pos, k.dim(2)?, self.sliding_window, x.device())?;
        let (_, out) = self.attend(&h.q, &k, &v, mask.as_ref())?;
        Ok(self.o_proj.forward(&out)?)
    }

    /// Training forward: `normed_in` (rows, hidden) -> (rows, hidden) and the tape.
    /// `known`: this input's [`AttentionResult`] from an earlier forward (a checkpointed layer's recompute), taken
    /// instead of attending again.
    pub(super) fn forward_train(
        &self,
        normed_in: &Tensor,
        ctx: &SequenceContext,
        known: Option<AttentionResult>,
    ) -> Result<(Tensor, AttentionTape)> {
        let (b, t) = (ctx.batch, ctx.seq_len);
        let (qkv, qkv_tapes) = self.qkv.forward_train(normed_in, ctx.dropout)?;
        let (cos, sin, mask) = ctx.attention(self.local);
        let starts = ctx.row_starts();
        // Packed rows take the fused or the blocked attention: both mask by the rows' starts.
        let (device, dtype) = (normed_in.device(), normed_in.dtype());
        let blocked = starts.is_some() || (t > 1 && ops::blocked_attention_applies(device, dtype, self.head_dim, t));
        // The blocked attention gathers its query blocks from any layout; a recompute's known result was fused.
        let h = self.heads(qkv, (b, t), (cos, sin), blocked && known.is_none())?;
        let q = match blocked {
            true => h.q.clone(),
            false => h.q.contiguous()?,
        };
        let (window, scale) = (self.sliding_window, self.scale());
        let attended = match known {
            Some(AttentionResult { out, lse }) => Some((out, ops::Logsumexp(lse))),
            None => ops::fused_attention(&q, &h.k, &h.v, scale, 0, window, starts.map(|s| s.0))?,
        };
        let (scores, attn) = match attended {
            Some((out, lse)) => (Scores::Fused(lse), out),
            None if blocked => {
                let (out, stats) = ops::blocked_attention(&q, &h.k, &h.v, scale, 0, window, starts.map(|s| s.1))?;
                (Scores::Blocked(stats), out)
            }
            None => {
                let (probs, out) = self.attend(&q, &h.k, &h.v, mask)?;
                (Scores::Probs(probs), out)
            }
        };
        let attn = attn.reshape((b * t, self.num_heads * self.head_dim))?;
        let (out, o_tape) = self.o_proj.forward_train(&attn, ctx.dropout)?;
        let tape = AttentionTape {
            q_pre_norm: h.q_pre_norm,
            k_pre_norm: h.k_pre_norm,
            q,
            k: h.k,
            v: h.v,
            scores,
            attn,
            qkv: qkv_tapes,
            o: o_tape,
        };
        Ok((out, tape))
    }

    /// Given the gradient of the block's output (rows, hidden), accumulate its adapters' gradients and return
    /// the gradient of its input (None when `need_input_grad` is false).
    /// `input`: the block's input when the tape let it go ([`AttentionTape::forget_input`]).
    pub(super) fn backward(
        &self,
        tape: &AttentionTape,
        input: Option<&Tensor>,
        d_out: &Tensor,
        ctx: &SequenceContext,
        grads: &mut Gradients,
        need_input_grad: bool,
    ) -> Result<Option<Tensor>> {
        let (b, t) = (ctx.batch, ctx.seq_len);
        let d_attn = Linear::input_grad(self.o_proj.backward(&tape.o, d_out, grads, InputGrad::New)?)?;
        let (window, scale, starts) = (self.sliding_window, self.scale(), ctx.row_starts());
        let (q, k, v) = (&tape.q, &tape.k, &tape.v);
        let (d_q, d_k, d_v) = match &tape.scores {
            Scores::Fused(lse) => {
                ops::fused_attention_backward(q, k, v, &tape.attn, lse, &d_attn, scale, window, starts.map(|s| s.0))?
            }
            Scores::Blocked(stats) => ops::blocked_attention_backward(
                q,
                k,
                v,
                &tape.attn,
                stats,
                &d_attn,
                scale,
                window,
                starts.map(|s| s.1),
            )?,
            Scores::Probs(probs) => self.composed_backward(tape, probs, &d_attn, (b, t))?,
        };
        let (cos, sin, _) = ctx.attention(self.local);
        let rope = self.use_rope.then_some((cos, sin));
        // Per-head norms sit after the split into heads, whole-projection norms before it.
        let norms = self.q_norm.as_ref().zip(self.k_norm.as_ref());
        let norm_backward = |d_q: Tensor, d_k: Tensor| -> Result<(Tensor, Tensor)> {
            match (norms, &tape.q_pre_norm, &tape.k_pre_norm) {
                (Some((qn, kn)), Some(q_pre), Some(k_pre)) => {
                    Ok((qn.backward(q_pre, &d_q)?, kn.backward(k_pre, &d_k)?))
                }
                _ => Ok((d_q, d_k)),
            }
        };
        let merge = |g: &Tensor, rope| ops::merge_heads_backward(g, rope);
        let d_v = merge(&d_v, None)?;
        let (d_q, d_k) = if norms.is_some() && !self.qk_norm_over_projection {
            let (d_q, d_k) = match rope {
                Some((cos, sin)) => (ops::rope_backward(&d_q, cos, sin)?, ops::rope_backward(&d_k, cos, sin)?),
                None => (d_q, d_k),
            };
            let (d_q, d_k) = norm_backward(d_q, d_k)?;
            (merge(&d_q, None)?, merge(&d_k, None)?)
        } else {
            // The rotation back and the merge of the heads in one pass where the fused kernel runs.
            norm_backward(merge(&d_q, rope)?, merge(&d_k, rope)?)?
        };
        self.qkv.backward(&tape.qkv, input, &[d_q, d_k, d_v], grads, need_input_grad)
    }

    /// Gradients (dq (b, heads, t, d), dk, dv (b, kv_heads, t, d)) of the composed attention from its saved
    /// probabilities, for `d_attn` (b * t, heads * d).
    fn composed_backward(
        &self,
        tape: &AttentionTape,
        probs: &Tensor,
        d_attn: &Tensor,
        (b, t): (usize, usize),
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let (d, heads, kv_heads) = (self.head_dim, self.num_heads, self.num_kv_heads);
        let grouped = |x: &Tensor| x.reshape((b, kv_heads, heads / kv_heads * t, d));
        let d_o = grouped(&d_attn.reshape((b, t, heads, d))?.transpose(1, 2)?.contiguous()?)?;
        let d_v = ops::matmul(&probs.t()?, &d_o)?; // (b, kv, t, d)
        let d_probs = ops::matmul(&d_o, &tape.v.t()?)?;
        let d_scores = ops::softmax_backward(probs, &d_probs, self.scale())?.to_dtype(tape.q.dtype())?;
        let d_q = ops::matmul(&d_scores, &tape.k)?.reshape((b, heads, t, d))?;
        let d_k = ops::matmul(&d_scores.t()?, &grouped(&tape.q)?)?; // (b, kv, t, d)
        Ok((d_q, d_k, d_v))
    }

    /// Whether the fused decode kernels model this block as it stands: rope on every head dimension (the table
    /// of [`RotaryTables::decode_table`] exists only then) and the standard `1 / sqrt(head_dim)` scale. The
    /// q|k|v product may be quantized or carry adapters ([`ProjectionGroup::forward_joined`]); q/k norms are
    /// applied between the product and the kernels ([`Self::norm_joined_qk`]).
    pub(super) fn decodes_fused(&self) -> bool {
        self.use_rope && self.attention_scale == 1.0 / (self.head_dim as f64).sqrt()
    }

    /// The q/k norms (when the family has them) applied to a joined q|k|v product (b, 1, (heads + 2 kv) * d),
    /// per head or over the whole projection as the family does; v is untouched.
    fn norm_joined_qk(&self, qkv: Tensor) -> Result<Tensor> {
        let Some((qn, kn)) = self.q_norm.as_ref().zip(self.k_norm.as_ref()) else { return Ok(qkv) };
        let (b, t, _) = qkv.dims3()?;
        let (d, q_width, kv_width) = (self.head_dim, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim);
        let norm = |norm: &RmsNorm, start: usize, width: usize| -> Result<Tensor> {
            let part = qkv.narrow(D::Minus1, start, width)?.contiguous()?;
            if self.qk_norm_over_projection {
                return norm.forward(&part);
            }
            Ok(norm.forward(&part.reshape((b, t, width / d, d))?)?.reshape((b, t, width))?)
        };
        let parts =
            [norm(qn, 0, q_width)?, norm(kn, q_width, kv_width)?, qkv.narrow(D::Minus1, q_width + kv_width, kv_width)?];
        Ok(Tensor::cat(&parts, D::Minus1)?)
    }

    /// Fused single-token decode of `normed` (b, 1, hidden): the q|k|v product, the cache write that rotates
    /// the key, single-query attention that rotates the query, then o_proj. `table`: the rotary rows
    /// [cos | sin] of [`RotaryTables::decode_table`].
    pub(super) fn decode_fused(&self, normed: &Tensor, table: &Tensor, cache: &mut LayerCache) -> Result<Tensor> {
        let qkv = self.norm_joined_qk(self.qkv.forward_joined(normed)?)?;
        let pos = cache.len();
        let shape = ops::cuda::decode::DecodeShape {
            heads: self.num_heads,
            kv_heads: self.num_kv_heads,
            head_dim: self.head_dim,
            pos,
            window: self.sliding_window.unwrap_or(0),
        };
        let buf =
            cache.reserve(normed.dim(0)?, self.num_kv_heads, self.head_dim, 1, normed.dtype(), normed.device())?;
        let position = cache.device_position().cloned();
        ops::cuda::decode::kv_write(&buf, &qkv, table, shape, position.as_ref())?;
        cache.advance(1);
        Ok(self.o_proj.forward(&ops::cuda::decode::attention(&qkv, &buf, table, shape, position.as_ref())?)?)
    }
}

/// Additive mask (t, total): query i sits at absolute position start_pos + i and sees keys at or before it
/// (and, with a sliding window, no further back than the window). None when nothing is masked.
pub fn attention_mask(
    t: usize,
    start_pos: usize,
    total: usize,
    window: Option<usize>,
    device: &Device,
) -> Result<Option<Tensor>> {
    let window = window.unwrap_or(usize::MAX);
    if t == 1 && total <= window {
        return Ok(None);
    }
    let mut mask = vec![0f32; t * total];
    for i in 0..t {
        let pos = start_pos + i;
        for j in 0..total {
            if j > pos || pos - j >= window {
                mask[i * total + j] = f32::NEG_INFINITY;
            }
        }
    }
    Ok(Some(Tensor::from_vec(mask, (t, total), device)?))
}
