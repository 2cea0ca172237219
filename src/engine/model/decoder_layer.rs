//! One decoder layer: self-attention ([`super::attention`]) and the MLP ([`super::mlp`]), each with its
//! residual add and the RMS norms the family puts around it ([`super::config::NormLayout`]: llama's
//! pre-norms, gemma3's pre- and post-norms, olmo2's post-norms only); each block's output is multiplied by
//! granite's `residual_multiplier` (1 elsewhere) before its residual add. This file owns the layer's math
//! around its two blocks: the inference forward, the training forward that records what the backward needs,
//! the backward, and the single-token decode step (fused kernels where [`ops::cuda::decode::available`] says the
//! device has them, for pre-norm SwiGLU layers; gemma3's and olmo2's layers decode through the composed ops
//! on every device, CUDA included).

use super::attention::{Attention, AttentionResult, AttentionTape};
use super::config::NormSite;
use super::gradients::Gradients;
use super::kv_cache::LayerCache;
use super::mlp::{Mlp, MlpTape};
use super::norm::RmsNorm;
use super::rotary::RotaryTables;
use super::sequence::SequenceContext;
use super::weight_loader::WeightLoader;
use super::ModelConfig;
use crate::engine::ops;
use crate::engine::Result;
use candle_core::Tensor;

/// The RMS norms of one decoder layer, by where they apply (see [`super::config::NormLayout`]); absent ones
/// are skipped.
#[derive(Debug, Clone, Default)]
pub struct LayerNorms {
    pub attention_input: Option<RmsNorm>,
    pub attention_output: Option<RmsNorm>,
    pub mlp_input: Option<RmsNorm>,
    pub mlp_output: Option<RmsNorm>,
}

impl LayerNorms {
    fn load(cfg: &ModelConfig, w: &WeightLoader, prefix: &str) -> Result<Self> {
        let mut norms = Self::default();
        for &(site, name) in cfg.norm_layout.norms() {
            let weight = w.get(&format!("{prefix}.{name}.weight"), &[cfg.hidden_size])?;
            let norm = Some(RmsNorm::new(name, weight, cfg.norm_weight_offset, cfg.rms_norm_eps)?);
            match site {
                NormSite::AttentionInput => norms.attention_input = norm,
                NormSite::AttentionOutput => norms.attention_output = norm,
                NormSite::MlpInput => norms.mlp_input = norm,
                NormSite::MlpOutput => norms.mlp_output = norm,
            }
        }
        Ok(norms)
    }

    /// Every norm present, in the order the layer applies them.
    pub fn iter(&self) -> impl Iterator<Item = &RmsNorm> {
        [&self.attention_input, &self.attention_output, &self.mlp_input, &self.mlp_output].into_iter().flatten()
    }

    /// No norm after the MLP, which would need its output in the backward: a checkpointed recompute may defer the
    /// MLP ([`Mlp::defer`]).
    pub fn defers_mlp(&self) -> bool {
        self.mlp_output.is_none()
    }

    /// Only the pre-norms (llama's layout): what the fused decode kernels model.
    fn pre_norms_only(&self) -> bool {
        self.attention_input.is_some()
            && self.mlp_input.is_some()
            && self.attention_output.is_none()
            && self.mlp_output.is_none()
    }
}

/// `norm(x)`, or `x` itself when the norm is absent.
fn apply(norm: &Option<RmsNorm>, x: &Tensor) -> Result<Tensor> {
    match norm {
        Some(n) => n.forward(x),
        None => Ok(x.clone()),
    }
}

/// The input gradient through an optional norm whose input was `x`.
fn apply_backward(norm: &Option<RmsNorm>, x: Option<&Tensor>, dy: Tensor) -> Result<Tensor> {
    match (norm, x) {
        (Some(n), Some(x)) => n.backward(x, &dy),
        (Some(_), None) => Err(candle_core::Error::Msg("norm input missing from the tape".into()).into()),
        (None, _) => Ok(dy),
    }
}

/// `(x + delta, norm(x + delta))` (the sum twice without a norm): the residual add and the norm after it, in one
/// pass where a kernel does both.
fn add_then_apply(norm: &Option<RmsNorm>, x: &Tensor, delta: &Tensor) -> Result<(Tensor, Tensor)> {
    match norm {
        Some(n) => n.add_forward(x, delta),
        None => {
            let sum = ops::add(x, delta)?;
            Ok((sum.clone(), sum))
        }
    }
}

/// `addend + apply_backward(norm, x, dy)`: a residual branch's gradient joined by the one through the norm, in
/// one pass where a kernel does both.
fn apply_backward_add(norm: &Option<RmsNorm>, x: Option<&Tensor>, dy: Tensor, addend: &Tensor) -> Result<Tensor> {
    match (norm, x) {
        (Some(n), Some(x)) => n.backward_add(x, &dy, addend),
        _ => Ok(ops::add(addend, &apply_backward(norm, x, dy)?)?),
    }
}

/// One decoder layer: `x + post(attention(pre(x)))`, then `x + post(mlp(pre(x)))`, with the norms the
/// family has ([`LayerNorms`]).
#[derive(Debug, Clone)]
pub struct DecoderLayer {
    pub self_attn: Attention,
    pub mlp: Mlp,
    pub norms: LayerNorms,
    /// Multiplies each block's output before its residual add (granite; 1.0 elsewhere).
    pub residual_multiplier: f64,
}

/// Activations of one layer saved by the training forward. Rows are `batch * seq_len`.
pub struct LayerTape {
    x: Tensor,
    x_mid: Tensor,
    /// The attention and MLP outputs before their post-norms (only when the layer has them).
    attn_raw: Option<Tensor>,
    mlp_raw: Option<Tensor>,
    attention: AttentionTape,
    mlp: MlpTape,
}

impl LayerTape {
    /// The layer's input (the sum, when it came as a pair): what gradient checkpointing keeps to run the layer
    /// again.
    pub fn input(&self) -> &Tensor {
        &self.x
    }

    /// Whether the backward makes the blocks' normed inputs again from the residuals (a training forward's tape with
    /// adapters on both blocks' input projections; a recompute's tape keeps them, it is read at once).
    pub fn remakes_normed_inputs(&self) -> bool {
        self.attention.needs_input() && self.mlp.needs_input()
    }

    /// The fused attention's output and logsumexp, which a checkpointed layer may keep so that [`DecoderLayer::recompute`]
    /// skips the attention (None where the fused kernels did not run).
    pub fn attention_result(&self) -> Option<AttentionResult> {
        self.attention.fused_result()
    }
}

impl DecoderLayer {
    pub(super) fn new(cfg: &ModelConfig, w: &WeightLoader, index: usize) -> Result<Self> {
        let prefix = format!("model.layers.{index}");
        Ok(Self {
            self_attn: Attention::new(cfg, w, &format!("{prefix}.self_attn"), index)?,
            mlp: Mlp::new(cfg, w, &format!("{prefix}.mlp"))?,
            norms: LayerNorms::load(cfg, w, &prefix)?,
            residual_multiplier: cfg.residual_multiplier,
        })
    }

    /// Inference: `x` (b, t, hidden) at positions `start_pos..`, reading and extending `cache` when given.
    /// `rotary`: the tables of this layer's kind ([`Attention::local`]).
    pub(super) fn forward(
        &self,
        x: &Tensor,
        rotary: &RotaryTables,
        start_pos: usize,
        cache: Option<&mut LayerCache>,
    ) -> Result<Tensor> {
        let (x, pending) = self.forward_pending(x, None, rotary, start_pos, cache)?;
        Ok(match pending {
            Some(delta) => (x + delta)?,
            None => x,
        })
    }

    /// [`Self::forward`] over a residual stream whose last add may be pending: the layer's input is `x +
    /// pending` (just `x` without one), and its output is the returned pair summed likewise. The fused
    /// single-token decode leaves its MLP's residual add pending, for the next layer's input norm (or the
    /// final norm) to do in the same pass (`cuda_decode::add_rms_norm`): one launch per layer fewer.
    pub(super) fn forward_pending(
        &self,
        x: &Tensor,
        pending: Option<Tensor>,
        rotary: &RotaryTables,
        start_pos: usize,
        cache: Option<&mut LayerCache>,
    ) -> Result<(Tensor, Option<Tensor>)> {
        match (cache, &rotary.decode_table) {
            (Some(cache), Some(table)) if self.decodes_fused(x, start_pos, cache)? => {
                self.decode_fused(x, pending, table, cache)
            }
            (cache, _) => {
                let x = match pending {
                    Some(delta) => (x + delta)?,
                    None => x.clone(),
                };
                let normed = apply(&self.norms.attention_input, &x)?;
                let attn =
                    apply(&self.norms.attention_output, &self.self_attn.forward(&normed, rotary, start_pos, cache)?)?;
                let x = (x + self.residual(attn)?)?;
                let normed = apply(&self.norms.mlp_input, &x)?;
                Ok(((&x + self.residual(apply(&self.norms.mlp_output, &self.mlp.forward(&normed)?)?)?)?, None))
            }
        }
    }

    /// Training forward of the input `x + pending` (just `x` without `pending`), rows of hidden: the layer's
    /// output as a pair `(x_mid, delta)` whose sum it is, and its tape. The last residual add is left to the next
    /// layer (or the final norm), which does it in one pass with its input norm ([`add_then_apply`]), as the
    /// fused decode does.
    pub fn forward_train(
        &self,
        x: &Tensor,
        pending: Option<&Tensor>,
        ctx: &SequenceContext,
    ) -> Result<(Tensor, Tensor, LayerTape)> {
        let (x_mid, delta, tape) = self.train(x, pending, ctx, None, false)?;
        let delta = delta.ok_or_else(|| candle_core::Error::Msg("layer forward without its output".into()))?;
        Ok((x_mid, delta, tape))
    }

    /// Gradient checkpointing's recompute of the layer from its kept input `x`: the tape its backward needs,
    /// taking the attention's result from `known` when the forward kept it ([`LayerTape::attention_result`]). The
    /// layer's output is not made again: the MLP block is deferred to its backward ([`Mlp::defer`]) unless a
    /// post-norm needs its output (gemma3, olmo2).
    pub fn recompute(&self, x: &Tensor, known: Option<AttentionResult>, ctx: &SequenceContext) -> Result<LayerTape> {
        Ok(self.train(x, None, ctx, known, true)?.2)
    }

    /// The training forward; with `recompute`, the MLP's output only where the backward needs it.
    fn train(
        &self,
        x: &Tensor,
        pending: Option<&Tensor>,
        ctx: &SequenceContext,
        known: Option<AttentionResult>,
        recompute: bool,
    ) -> Result<(Tensor, Option<Tensor>, LayerTape)> {
        let (x, normed_in) = match pending {
            Some(delta) => add_then_apply(&self.norms.attention_input, x, delta)?,
            None => (x.clone(), apply(&self.norms.attention_input, x)?),
        };
        let (attn_out, mut attention) = self.self_attn.forward_train(&normed_in, ctx, known)?;
        let attn_raw = self.norms.attention_output.as_ref().map(|_| attn_out.clone());
        let attn_delta = self.residual(apply(&self.norms.attention_output, &attn_out)?)?;
        let (x_mid, normed_mid) = add_then_apply(&self.norms.mlp_input, &x, &attn_delta)?;
        if recompute && self.norms.defers_mlp() {
            let mlp = self.mlp.defer(&normed_mid, ctx);
            return Ok((x_mid.clone(), None, LayerTape { x, x_mid, attn_raw, mlp_raw: None, attention, mlp }));
        }
        let (down, mut mlp) = self.mlp.forward_train(&normed_mid, ctx)?;
        // The blocks' normed inputs are made again in the backward from the layer's input and mid residual, which
        // the tape keeps for the norms' backward anyway (a recompute's tape is read at once: it keeps them).
        if !recompute {
            if self.norms.attention_input.is_some() {
                attention.forget_input();
            }
            if self.norms.mlp_input.is_some() {
                mlp.forget_input();
            }
        }
        let mlp_raw = self.norms.mlp_output.as_ref().map(|_| down.clone());
        let mlp_delta = self.residual(apply(&self.norms.mlp_output, &down)?)?;
        Ok((x_mid.clone(), Some(mlp_delta), LayerTape { x, x_mid, attn_raw, mlp_raw, attention, mlp }))
    }

    /// Given the gradient of the layer's output, accumulate its adapters' gradients and return the gradient
    /// of its input (None when `need_input_grad` is false: nothing below needs it).
    pub fn backward(
        &self,
        tape: &LayerTape,
        d_out: &Tensor,
        ctx: &SequenceContext,
        grads: &mut Gradients,
        need_input_grad: bool,
    ) -> Result<Option<Tensor>> {
        let d_down = apply_backward(&self.norms.mlp_output, tape.mlp_raw.as_ref(), self.residual(d_out.clone())?)?;
        let normed_mid = tape.mlp.needs_input().then(|| apply(&self.norms.mlp_input, &tape.x_mid)).transpose()?;
        let d_normed_mid = self.mlp.backward_with_input(&tape.mlp, normed_mid.as_ref(), &d_down, grads)?;
        drop(normed_mid);
        let d_mid = apply_backward_add(&self.norms.mlp_input, Some(&tape.x_mid), d_normed_mid, d_out)?;
        let d_attn =
            apply_backward(&self.norms.attention_output, tape.attn_raw.as_ref(), self.residual(d_mid.clone())?)?;
        let normed_in =
            tape.attention.needs_input().then(|| apply(&self.norms.attention_input, &tape.x)).transpose()?;
        let backward =
            self.self_attn.backward(&tape.attention, normed_in.as_ref(), &d_attn, ctx, grads, need_input_grad);
        drop(normed_in);
        let Some(d_normed_in) = backward? else {
            return Ok(None);
        };
        Ok(Some(apply_backward_add(&self.norms.attention_input, Some(&tape.x), d_normed_in, &d_mid)?))
    }

    /// A block's output scaled by the residual multiplier (the same factor scales its gradient backward).
    fn residual(&self, y: Tensor) -> Result<Tensor> {
        if self.residual_multiplier == 1.0 {
            return Ok(y);
        }
        Ok((y * self.residual_multiplier)?)
    }

    /// One new token appended at the end of the cache, on a device with the fused decode kernels, and blocks
    /// the kernels model (see `Attention::decodes_fused`, `Mlp::decodes_fused`).
    fn decodes_fused(&self, x: &Tensor, start_pos: usize, cache: &LayerCache) -> Result<bool> {
        Ok(x.dim(1)? == 1 && start_pos == cache.len() && self.fused_decode_ready(x.device(), x.dtype()))
    }

    /// Whether the fused decode kernels model this layer on `device` in `dtype` (given a rotary decode table).
    pub(super) fn fused_decode_ready(&self, device: &candle_core::Device, dtype: candle_core::DType) -> bool {
        self.norms.pre_norms_only()
            && ops::cuda::decode::enabled(device, dtype)
            && self.residual_multiplier == 1.0
            && self.self_attn.decodes_fused()
            && self.mlp.decodes_fused()
    }

    /// Ten launches per layer: (pending residual add +) norm, qkv product, cache write, attention (two: key
    /// shares and their merge), o_proj, add + norm, gate|up product, SwiGLU, down_proj (plus any adapter on
    /// o_proj or down_proj); the MLP's residual add is left pending (see [`Self::forward_pending`]). Pre-norm
    /// layers only (`LayerNorms::pre_norms_only`): gemma3's and olmo2's post-norms take the composed path.
    fn decode_fused(
        &self,
        x: &Tensor,
        pending: Option<Tensor>,
        table: &Tensor,
        cache: &mut LayerCache,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let (Some(attn_norm), Some(mlp_norm)) = (&self.norms.attention_input, &self.norms.mlp_input) else {
            return Err(candle_core::Error::Msg("fused decode of a layer without pre-norms".into()).into());
        };
        let (x, normed) = match pending {
            Some(delta) => ops::cuda::decode::add_rms_norm(x, &delta, attn_norm.factor(), attn_norm.eps)?,
            None => (x.clone(), attn_norm.forward(x)?),
        };
        let attn = self.self_attn.decode_fused(&normed, table, cache)?;
        let (x, normed) = ops::cuda::decode::add_rms_norm(&x, &attn, mlp_norm.factor(), mlp_norm.eps)?;
        Ok((x, Some(self.mlp.decode_fused(&normed)?)))
    }
}
