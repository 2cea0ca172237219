//! The gated feed-forward block, `down(act(gate(x)) * up(x))`: SwiGLU (silu) for most families, GeGLU with the
//! tanh approximation of gelu for gemma3; separate `gate_proj`/`up_proj` or phi3's fused `gate_up_proj` (gate
//! rows first; see [`super::projection_group`]). This file owns all of the block's math: the
//! inference forward, the training forward that records what the backward needs, the backward, and the fused
//! single-token decode step.
//!
//! The training forward's tape keeps gate and up but not their product `act(gate) * up`, which down_proj's adapter
//! reads in the backward: one element-wise pass makes it again there (a third of the block's activations: 1 GiB
//! of the 1B shape's step at 4,096 tokens).
//!
//! A checkpointed layer's recompute does not run the block forward at all ([`Mlp::defer`]): its tape is the input and
//! the adapters' dropout masks, and the backward runs the block forward and back over blocks of rows at a time
//! (`MLP_BLOCK_ELEMENTS` of the intermediate width each). The output, which only the next layer read, is never made
//! again, and at long context the (tokens x intermediate) activations and their gradients, six of them, exist for one
//! block of rows instead of all (at 8B x 32k tokens, 5 GiB).

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
pub enum MlpTape {
    /// Every activation (the training forward ran).
    Kept(MlpActivations),
    /// The input and the masks only: the backward recomputes the rest block by block ([`Mlp::defer`]).
    Deferred(DeferredMlp),
}

impl MlpTape {
    /// Lets go of the block's input (the normed mid residual) where gate|up's adapters kept it: the layer makes it
    /// again for the backward from the residual it keeps anyway. A deferred tape keeps its input.
    pub(super) fn forget_input(&mut self) {
        if let MlpTape::Kept(a) = self {
            a.gate_up_tapes.iter_mut().for_each(LinearTape::forget_input);
        }
    }

    /// Whether the backward needs the block's input handed to it ([`Self::forget_input`]).
    pub(super) fn needs_input(&self) -> bool {
        matches!(self, MlpTape::Kept(a) if a.gate_up_tapes.iter().any(LinearTape::needs_input))
    }

    /// The bytes of the (rows x intermediate) activations the tape keeps: gate, up and down_proj's input when kept
    /// (a deferred tape keeps none).
    pub fn intermediate_bytes(&self) -> usize {
        let bytes = |t: &Tensor| t.elem_count() * t.dtype().size_in_bytes();
        match self {
            MlpTape::Kept(a) => bytes(&a.gate) + bytes(&a.up) + a.down.input_bytes(),
            MlpTape::Deferred(_) => 0,
        }
    }
}

/// The activations of a training forward.
pub struct MlpActivations {
    gate: Tensor,
    up: Tensor,
    /// The gate|up group's tapes.
    gate_up_tapes: Vec<LinearTape>,
    down: LinearTape,
}

/// A deferred block's input (rows, hidden) and the dropout masks its adapters draw: gate|up's, then down's.
pub struct DeferredMlp {
    input: Tensor,
    gate_up_masks: Vec<Option<ops::Dropout>>,
    down_mask: Option<ops::Dropout>,
}

/// Rows of a deferred block's backward run together: this many elements of the intermediate width.
const MLP_BLOCK_ELEMENTS: usize = 1 << 27;

/// The rows a deferred block's backward runs together for an `intermediate` width (the memory estimate counts them).
pub fn deferred_block_rows(intermediate: usize) -> usize {
    (MLP_BLOCK_ELEMENTS / intermediate.max(1)).max(1)
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
    pub fn forward_train(&self, normed_in: &Tensor, ctx: &SequenceContext) -> Result<(Tensor, MlpTape)> {
        let masks = self.gate_up.draw_masks(ctx.dropout);
        let (mut activations, down) = self.run(normed_in, &masks, self.down_proj.draw_mask(ctx.dropout), true)?;
        let down = down.ok_or_else(|| candle_core::Error::Msg("MLP forward without its output".into()))?;
        // down_proj's input, `act(gate) * up`, is made again in the backward from the gate and up the tape keeps.
        activations.down.forget_input();
        Ok((down, MlpTape::Kept(activations)))
    }

    /// The tape of a training forward whose output is not needed (a checkpointed layer's recompute): the input and
    /// the masks the forward would draw, drawn now in its order (see the module notes).
    pub fn defer(&self, normed_in: &Tensor, ctx: &SequenceContext) -> MlpTape {
        let gate_up_masks = self.gate_up.draw_masks(ctx.dropout);
        let down_mask = self.down_proj.draw_mask(ctx.dropout);
        MlpTape::Deferred(DeferredMlp { input: normed_in.clone(), gate_up_masks, down_mask })
    }

    /// The forward over `x` with the adapters' masks given: the activations, and the output when `output` is set.
    fn run(
        &self,
        x: &Tensor,
        gate_up_masks: &[Option<ops::Dropout>],
        down_mask: Option<ops::Dropout>,
        output: bool,
    ) -> Result<(MlpActivations, Option<Tensor>)> {
        let (gate_up, gate_up_tapes) = self.gate_up.forward_train_masked(x, gate_up_masks)?;
        let [gate, up] = two(gate_up)?;
        let gated = self.gate(&gate, &up)?;
        let (down, down_tape) = match output {
            true => {
                let (y, tape) = self.down_proj.forward_train_masked(&gated, down_mask)?;
                (Some(y), tape)
            }
            false => (None, self.down_proj.tape_only(&gated, down_mask)?),
        };
        Ok((MlpActivations { gate, up, gate_up_tapes, down: down_tape }, down))
    }

    /// Given the gradient of the block's output, accumulate its adapters' gradients and return the gradient
    /// of its input.
    pub fn backward(&self, tape: &MlpTape, d_out: &Tensor, grads: &mut Gradients) -> Result<Tensor> {
        self.backward_with_input(tape, None, d_out, grads)
    }

    /// [`Self::backward`] with the block's input given, for a tape that let it go ([`MlpTape::forget_input`]).
    pub(super) fn backward_with_input(
        &self,
        tape: &MlpTape,
        input: Option<&Tensor>,
        d_out: &Tensor,
        grads: &mut Gradients,
    ) -> Result<Tensor> {
        let intermediate = self.down_proj.weight.dims2()?.1;
        match tape {
            MlpTape::Kept(activations) => self.backward_of(activations, input, d_out, grads),
            MlpTape::Deferred(_) => self.backward_in_blocks(tape, d_out, grads, deferred_block_rows(intermediate)),
        }
    }

    /// [`Self::backward`], a deferred tape's rows taken `block_rows` at a time (`backward` takes
    /// `MLP_BLOCK_ELEMENTS` of the intermediate width).
    pub fn backward_in_blocks(
        &self,
        tape: &MlpTape,
        d_out: &Tensor,
        grads: &mut Gradients,
        block_rows: usize,
    ) -> Result<Tensor> {
        match tape {
            MlpTape::Kept(activations) => self.backward_of(activations, None, d_out, grads),
            MlpTape::Deferred(deferred) => self.backward_deferred(deferred, d_out, grads, block_rows.max(1)),
        }
    }

    /// The backward over kept activations, `input` the block's input where gate|up's tapes let it go.
    fn backward_of(
        &self,
        tape: &MlpActivations,
        input: Option<&Tensor>,
        d_out: &Tensor,
        grads: &mut Gradients,
    ) -> Result<Tensor> {
        // A remade SwiGLU product leaves the gate's sigmoid and silu for its gradient below (composed Candle ops).
        let (gated, silu_parts) = match (tape.down.needs_input(), self.activation) {
            (true, MlpActivation::Silu) => {
                let (gated, parts) = ops::silu_mul_remade(&tape.gate, &tape.up)?;
                (Some(gated), parts)
            }
            (true, _) => (Some(self.gate(&tape.gate, &tape.up)?), None),
            (false, _) => (None, None),
        };
        let d_gated = self.down_proj.backward_with_input(&tape.down, gated.as_ref(), d_out, grads, InputGrad::New)?;
        drop(gated);
        let d_gated = Linear::input_grad(d_gated)?;
        let (d_gate, d_up) = match self.activation {
            MlpActivation::Silu => ops::silu_mul_backward_with(&tape.gate, &tape.up, &d_gated, silu_parts)?,
            MlpActivation::GeluTanh => ops::gelu_tanh_mul_backward(&tape.gate, &tape.up, &d_gated)?,
        };
        let d_in = self.gate_up.backward(&tape.gate_up_tapes, input, &[d_gate, d_up], grads, true)?;
        Ok(Linear::input_grad(d_in)?)
    }

    /// The backward of a deferred block: forward and back over blocks of rows, each block's masks the rows of the
    /// whole masks, the adapters' gradients summed over the blocks.
    fn backward_deferred(
        &self,
        tape: &DeferredMlp,
        d_out: &Tensor,
        grads: &mut Gradients,
        block: usize,
    ) -> Result<Tensor> {
        let DeferredMlp { input, gate_up_masks, down_mask } = tape;
        let (rows, hidden) = input.dims2()?;
        let intermediate = self.down_proj.weight.dims2()?.1;
        let mut d_in = Vec::with_capacity(rows.div_ceil(block));
        for start in (0..rows).step_by(block) {
            let n = block.min(rows - start);
            let masks: Vec<_> = gate_up_masks.iter().map(|m| m.map(|m| m.rows_from(start, hidden))).collect();
            let down_mask = down_mask.map(|m| m.rows_from(start, intermediate));
            let (activations, _) = self.run(&input.narrow(0, start, n)?, &masks, down_mask, false)?;
            d_in.push(self.backward_of(&activations, None, &d_out.narrow(0, start, n)?, grads)?);
        }
        Ok(match d_in.len() {
            1 => d_in.remove(0),
            _ => Tensor::cat(&d_in, 0)?,
        })
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
