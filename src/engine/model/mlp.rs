//! The gated feed-forward block, `down(act(gate(x)) * up(x))`: SwiGLU (silu) for most families, GeGLU with the
//! tanh approximation of gelu for gemma3. This file owns all of the block's math: the
//! inference forward, the training forward that records what the backward needs, the backward, and the fused
//! single-token decode step.

use super::config::MlpActivation;
use super::gradients::Gradients;
use super::linear::{Linear, LinearTape};
use super::sequence::SequenceContext;
use super::weight_loader::WeightLoader;
use super::ModelConfig;
use crate::engine::ops;
use crate::engine::Result;
use candle_core::Tensor;

/// The gated feed-forward block.
#[derive(Debug, Clone)]
pub struct Mlp {
    pub gate_proj: Linear,
    pub up_proj: Linear,
    pub down_proj: Linear,
    pub activation: MlpActivation,
    /// Gate and up weights in one tensor, of which their weights are row views; the fused decode multiplies
    /// by it once. None for quantized projections (no fused decode then).
    fused_gate_up: Option<Tensor>,
}

/// What the MLP backward needs from its training forward.
pub struct MlpTape {
    normed_in: Tensor,
    gate: Tensor,
    up: Tensor,
    gated: Tensor,
    /// gate, up, down.
    linears: [LinearTape; 3],
}

impl Mlp {
    pub(super) fn new(cfg: &ModelConfig, w: &WeightLoader, prefix: &str) -> Result<Self> {
        let (h, i) = (cfg.hidden_size, cfg.intermediate_size);
        let ([gate_proj, up_proj], fused) =
            w.fused_linears([&format!("{prefix}.gate_proj"), &format!("{prefix}.up_proj")], h, [i, i], false)?;
        Ok(Self {
            gate_proj,
            up_proj,
            down_proj: w.linear(&format!("{prefix}.down_proj"), i, h, false)?,
            activation: cfg.mlp_activation,
            fused_gate_up: fused.map(|(weight, _)| weight),
        })
    }

    /// `act(gate) * up`.
    fn gate(&self, gate: &Tensor, up: &Tensor) -> Result<Tensor> {
        Ok(match self.activation {
            MlpActivation::Silu => ops::silu_mul(gate, up)?,
            MlpActivation::GeluTanh => ops::gelu_tanh_mul(gate, up)?,
        })
    }

    /// Inference: `x` (..., hidden) -> (..., hidden).
    pub(super) fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let gated = self.gate(&self.gate_proj.forward(x)?, &self.up_proj.forward(x)?)?;
        Ok(self.down_proj.forward(&gated)?)
    }

    /// Training forward: `normed_in` (rows, hidden) -> (rows, hidden) and the tape.
    pub(super) fn forward_train(&self, normed_in: &Tensor, ctx: &SequenceContext) -> Result<(Tensor, MlpTape)> {
        let (gate, gate_tape) = self.gate_proj.forward_train(normed_in, ctx.dropout)?;
        let (up, up_tape) = self.up_proj.forward_train(normed_in, ctx.dropout)?;
        let gated = self.gate(&gate, &up)?;
        let (down, down_tape) = self.down_proj.forward_train(&gated, ctx.dropout)?;
        let tape = MlpTape { normed_in: normed_in.clone(), gate, up, gated, linears: [gate_tape, up_tape, down_tape] };
        Ok((down, tape))
    }

    /// Given the gradient of the block's output, accumulate its adapters' gradients and return the gradient
    /// of its input.
    pub(super) fn backward(&self, tape: &MlpTape, d_out: &Tensor, grads: &mut Gradients) -> Result<Tensor> {
        let [gate_tape, up_tape, down_tape] = &tape.linears;
        let d_gated = Linear::input_grad(self.down_proj.backward(&tape.gated, down_tape, d_out, grads, true)?)?;
        let (d_gate, d_up) = match self.activation {
            MlpActivation::Silu => ops::silu_mul_backward(&tape.gate, &tape.up, &d_gated)?,
            MlpActivation::GeluTanh => ops::gelu_tanh_mul_backward(&tape.gate, &tape.up, &d_gated)?,
        };
        let from_gate = self.gate_proj.backward(&tape.normed_in, gate_tape, &d_gate, grads, true)?;
        let from_up = self.up_proj.backward(&tape.normed_in, up_tape, &d_up, grads, true)?;
        Ok(ops::add(&Linear::input_grad(from_gate)?, &Linear::input_grad(from_up)?)?)
    }

    /// Whether the fused decode kernels model this block as it stands: a dense fused gate|up weight and no
    /// active adapter on gate/up; SwiGLU only (the kernels have no gelu: gemma3 takes the composed path).
    pub(super) fn decodes_fused(&self) -> bool {
        self.activation == MlpActivation::Silu
            && self.fused_gate_up.is_some()
            && !self.gate_proj.has_active_adapter()
            && !self.up_proj.has_active_adapter()
    }

    /// Fused single-token decode: one gate|up product, SwiGLU on its halves, then down_proj.
    pub(super) fn decode_fused(&self, normed: &Tensor) -> Result<Tensor> {
        let Some(gate_up) = &self.fused_gate_up else {
            return Err(candle_core::Error::Msg("fused decode of quantized gate/up projections".into()).into());
        };
        let gated = ops::cuda_decode::silu_mul_halves(&ops::frozen_matmul_t(normed, gate_up)?)?;
        Ok(self.down_proj.forward(&gated)?)
    }
}
