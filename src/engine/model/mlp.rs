//! The gated feed-forward block, `down(act(gate(x)) * up(x))`: SwiGLU (silu) for most families, GeGLU with the
//! tanh approximation of gelu for gemma3; separate `gate_proj`/`up_proj` or phi3's fused `gate_up_proj` (gate
//! rows first; see [`super::projection_group`]). This file owns all of the block's math: the
//! inference forward, the training forward that records what the backward needs, the backward, and the fused
//! single-token decode step.

use super::config::MlpActivation;
use super::gradients::Gradients;
use super::linear::{InputGrad, Linear, LinearTape};
use super::projection_group::ProjectionGroup;
use super::sequence::SequenceContext;
use super::weight_loader::WeightLoader;
use super::ModelConfig;
use crate::engine::ops;
use crate::engine::Result;
use candle_core::Tensor;

/// The gated feed-forward block.
#[derive(Debug, Clone)]
pub struct Mlp {
    /// Gate and up: `gate_proj`, `up_proj` (row views of one concatenated weight when dense), or phi3's
    /// single `gate_up_proj`.
    pub gate_up: ProjectionGroup,
    pub down_proj: Linear,
    pub activation: MlpActivation,
}

/// What the MLP backward needs from its training forward.
pub struct MlpTape {
    gate: Tensor,
    up: Tensor,
    /// The gate|up group's tapes.
    gate_up_tapes: Vec<LinearTape>,
    down: LinearTape,
}

impl Mlp {
    pub(super) fn new(cfg: &ModelConfig, w: &WeightLoader, prefix: &str) -> Result<Self> {
        let (h, i) = (cfg.hidden_size, cfg.intermediate_size);
        let fused = cfg.fused_projections.then_some("gate_up_proj");
        let gate_up = ProjectionGroup::load(w, prefix, ["gate_proj", "up_proj"], fused, h, [i, i], false)?;
        Ok(Self {
            gate_up,
            down_proj: w.linear(&format!("{prefix}.down_proj"), i, h, false)?,
            activation: cfg.mlp_activation,
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
        let [gate, up] = two(self.gate_up.forward(x)?)?;
        Ok(self.down_proj.forward(&self.gate(&gate, &up)?)?)
    }

    /// Training forward: `normed_in` (rows, hidden) -> (rows, hidden) and the tape.
    pub(super) fn forward_train(&self, normed_in: &Tensor, ctx: &SequenceContext) -> Result<(Tensor, MlpTape)> {
        let (gate_up, gate_up_tapes) = self.gate_up.forward_train(normed_in, ctx.dropout)?;
        let [gate, up] = two(gate_up)?;
        let gated = self.gate(&gate, &up)?;
        let (down, down_tape) = self.down_proj.forward_train(&gated, ctx.dropout)?;
        let tape = MlpTape { gate, up, gate_up_tapes, down: down_tape };
        Ok((down, tape))
    }

    /// Given the gradient of the block's output, accumulate its adapters' gradients and return the gradient
    /// of its input.
    pub(super) fn backward(&self, tape: &MlpTape, d_out: &Tensor, grads: &mut Gradients) -> Result<Tensor> {
        let d_gated = Linear::input_grad(self.down_proj.backward(&tape.down, d_out, grads, InputGrad::New)?)?;
        let (d_gate, d_up) = match self.activation {
            MlpActivation::Silu => ops::silu_mul_backward(&tape.gate, &tape.up, &d_gated)?,
            MlpActivation::GeluTanh => ops::gelu_tanh_mul_backward(&tape.gate, &tape.up, &d_gated)?,
        };
        let d_in = self.gate_up.backward(&tape.gate_up_tapes, &[d_gate, d_up], grads, true)?;
        Ok(Linear::input_grad(d_in)?)
    }

    /// Whether the fused decode kernels model this block: SwiGLU only (the kernels have no gelu: gemma3 takes
    /// the composed path). The gate|up product may be quantized or carry adapters.
    pub(super) fn decodes_fused(&self) -> bool {
        self.activation == MlpActivation::Silu
    }

    /// Fused single-token decode: the gate|up product, SwiGLU on its halves, then down_proj; the last two in
    /// one kernel when down_proj is a plain dense product (`ops::swiglu_matmul_t`).
    pub(super) fn decode_fused(&self, normed: &Tensor) -> Result<Tensor> {
        let gate_up = self.gate_up.forward_joined(normed)?;
        if let Some(weight) = self.down_proj.plain_dense_weight() {
            if let Some(y) = ops::swiglu_matmul_t(&gate_up, weight)? {
                return Ok(y);
            }
        }
        Ok(self.down_proj.forward(&ops::cuda::decode::silu_mul_halves(&gate_up)?)?)
    }
}

/// The gate and up parts of the group's output.
fn two(parts: Vec<Tensor>) -> Result<[Tensor; 2]> {
    Ok(parts.try_into().map_err(|_| candle_core::Error::Msg("gate|up projections give 2 parts".into()))?)
}
