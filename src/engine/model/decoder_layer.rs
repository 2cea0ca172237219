//! One pre-norm decoder layer: RMS norm, self-attention ([`super::attention`]), residual, RMS norm, MLP
//! ([`super::mlp`]), residual; each block's output is multiplied by granite's `residual_multiplier` (1
//! elsewhere) before its residual add. This file owns the layer's math around its two blocks: the inference forward,
//! the training forward that records what the backward needs, the backward, and the single-token decode step
//! (fused kernels where [`ops::cuda_decode::available`] says the device has them).

use super::attention::{Attention, AttentionTape};
use super::gradients::Gradients;
use super::kv_cache::LayerCache;
use super::mlp::{Mlp, MlpTape};
use super::rotary::RotaryTables;
use super::sequence::SequenceContext;
use super::weight_loader::WeightLoader;
use super::ModelConfig;
use crate::engine::ops;
use crate::engine::Result;
use candle_core::Tensor;

/// One pre-norm decoder layer.
#[derive(Debug, Clone)]
pub struct DecoderLayer {
    pub self_attn: Attention,
    pub mlp: Mlp,
    pub input_layernorm: Tensor,
    pub post_attention_layernorm: Tensor,
    pub rms_norm_eps: f64,
    /// Multiplies each block's output before its residual add (granite; 1.0 elsewhere).
    pub residual_multiplier: f64,
}

/// Activations of one layer saved by the training forward. Rows are `batch * seq_len`.
pub struct LayerTape {
    x: Tensor,
    x_mid: Tensor,
    attention: AttentionTape,
    mlp: MlpTape,
}

impl DecoderLayer {
    pub(super) fn new(cfg: &ModelConfig, w: &WeightLoader, index: usize) -> Result<Self> {
        let prefix = format!("model.layers.{index}");
        Ok(Self {
            self_attn: Attention::new(cfg, w, &format!("{prefix}.self_attn"), index)?,
            mlp: Mlp::new(cfg, w, &format!("{prefix}.mlp"))?,
            input_layernorm: w.get(&format!("{prefix}.input_layernorm.weight"), &[cfg.hidden_size])?,
            post_attention_layernorm: w
                .get(&format!("{prefix}.post_attention_layernorm.weight"), &[cfg.hidden_size])?,
            rms_norm_eps: cfg.rms_norm_eps,
            residual_multiplier: cfg.residual_multiplier,
        })
    }

    /// Inference: `x` (b, t, hidden) at positions `start_pos..`, reading and extending `cache` when given.
    pub(super) fn forward(
        &self,
        x: &Tensor,
        rotary: &RotaryTables,
        start_pos: usize,
        cache: Option<&mut LayerCache>,
    ) -> Result<Tensor> {
        match (cache, &rotary.decode_table) {
            (Some(cache), Some(table)) if self.decodes_fused(x, start_pos, cache)? => {
                self.decode_fused(x, table, cache)
            }
            (cache, _) => {
                let normed = ops::rms_norm(x, &self.input_layernorm, self.rms_norm_eps)?;
                let x = (x + self.residual(self.self_attn.forward(&normed, rotary, start_pos, cache)?)?)?;
                let normed = ops::rms_norm(&x, &self.post_attention_layernorm, self.rms_norm_eps)?;
                Ok((&x + self.residual(self.mlp.forward(&normed)?)?)?)
            }
        }
    }

    /// Training forward: `x` (rows, hidden) -> the layer's output (rows, hidden) and its tape.
    pub fn forward_train(&self, x: &Tensor, ctx: &SequenceContext) -> Result<(Tensor, LayerTape)> {
        let normed_in = ops::rms_norm(x, &self.input_layernorm, self.rms_norm_eps)?;
        let (attn_out, attention) = self.self_attn.forward_train(&normed_in, ctx)?;
        let x_mid = ops::add(x, &self.residual(attn_out)?)?;
        let normed_mid = ops::rms_norm(&x_mid, &self.post_attention_layernorm, self.rms_norm_eps)?;
        let (down, mlp) = self.mlp.forward_train(&normed_mid, ctx)?;
        let out = ops::add(&x_mid, &self.residual(down)?)?;
        Ok((out, LayerTape { x: x.clone(), x_mid, attention, mlp }))
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
        let d_normed_mid = self.mlp.backward(&tape.mlp, &self.residual(d_out.clone())?, grads)?;
        let d_mid = ops::add(
            d_out,
            &ops::rms_norm_backward(&tape.x_mid, &self.post_attention_layernorm, self.rms_norm_eps, &d_normed_mid)?,
        )?;
        let d_attn_out = self.residual(d_mid.clone())?;
        let Some(d_normed_in) = self.self_attn.backward(&tape.attention, &d_attn_out, ctx, grads, need_input_grad)?
        else {
            return Ok(None);
        };
        let d_in = ops::rms_norm_backward(&tape.x, &self.input_layernorm, self.rms_norm_eps, &d_normed_in)?;
        Ok(Some(ops::add(&d_mid, &d_in)?))
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
        Ok(x.dim(1)? == 1
            && start_pos == cache.len()
            && ops::cuda_decode::enabled(x.device(), x.dtype())
            && self.residual_multiplier == 1.0
            && self.self_attn.decodes_fused()
            && self.mlp.decodes_fused())
    }

    /// Ten launches per layer: norm, qkv product, cache write, attention, o_proj, add + norm, gate|up product,
    /// SwiGLU, down_proj, residual add (plus any adapter on o_proj or down_proj).
    fn decode_fused(&self, x: &Tensor, table: &Tensor, cache: &mut LayerCache) -> Result<Tensor> {
        let normed = ops::rms_norm(x, &self.input_layernorm, self.rms_norm_eps)?;
        let attn = self.self_attn.decode_fused(&normed, table, cache)?;
        let (x, normed) = ops::cuda_decode::add_rms_norm(x, &attn, &self.post_attention_layernorm, self.rms_norm_eps)?;
        Ok((x + self.mlp.decode_fused(&normed)?)?)
    }
}
