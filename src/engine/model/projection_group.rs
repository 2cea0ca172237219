//! Projections that read the same input: attention's q|k|v and the MLP's gate|up. A family either keeps one
//! linear per output part (llama: `q_proj`, `k_proj`, `v_proj`, row views of one concatenated weight) or a
//! single linear whose output holds the parts side by side (phi3: `qkv_proj`, `gate_up_proj`), which is then
//! also a single LoRA adapter over the whole fused output, as PEFT has it. This file owns what differs
//! between the two layouts: loading, splitting the output into parts, the training tapes, and joining the
//! parts' gradients in the backward.

use super::gradients::Gradients;
use super::linear::{InputGrad, Linear, LinearTape};
use super::weight_loader::{FusedWeight, WeightLoader};
use crate::engine::ops;
use crate::engine::Result;
use candle_core::{Tensor, D};

/// Projections sharing one input, producing `parts.len()` outputs.
#[derive(Debug, Clone)]
pub struct ProjectionGroup {
    /// (module name, linear): one per part, or one fused linear for all of them.
    pub linears: Vec<(&'static str, Linear)>,
    /// Output width of each part, in order.
    parts: Vec<usize>,
    /// The parts' weights (and biases) in one tensor, what the fused decode multiplies by; None when quantized.
    pub(super) fused: FusedWeight,
}

impl ProjectionGroup {
    /// Load `{prefix}.{fused_name}` when given (one fused linear), else one linear per name in `names`.
    pub(super) fn load<const N: usize>(
        w: &WeightLoader,
        prefix: &str,
        names: [&'static str; N],
        fused_name: Option<&'static str>,
        in_features: usize,
        parts: [usize; N],
        bias: bool,
    ) -> Result<Self> {
        if let Some(fused_name) = fused_name {
            let linear = w.linear(&format!("{prefix}.{fused_name}"), in_features, parts.iter().sum(), bias)?;
            let fused = match &linear.weight {
                super::linear::BaseWeight::Dense(weight) => Some((weight.clone(), linear.bias.clone())),
                super::linear::BaseWeight::Quantized(_) => None,
            };
            return Ok(Self { linears: vec![(fused_name, linear)], parts: parts.to_vec(), fused });
        }
        let prefixes = names.map(|n| format!("{prefix}.{n}"));
        let (linears, fused) = w.fused_linears(prefixes.each_ref().map(|p| p.as_str()), in_features, parts, bias)?;
        Ok(Self { linears: names.into_iter().zip(linears).collect(), parts: parts.to_vec(), fused })
    }

    /// The fused layout's output split into its parts (contiguous).
    fn split(&self, y: &Tensor) -> Result<Vec<Tensor>> {
        let mut start = 0;
        let mut out = Vec::with_capacity(self.parts.len());
        for &width in &self.parts {
            out.push(y.narrow(D::Minus1, start, width)?.contiguous()?);
            start += width;
        }
        Ok(out)
    }

    /// Inference: one output per part, `x` (..., in) -> (..., part).
    pub(super) fn forward(&self, x: &Tensor) -> Result<Vec<Tensor>> {
        match self.linears.as_slice() {
            [(_, fused)] if self.parts.len() > 1 => self.split(&fused.forward(x)?),
            linears => linears.iter().map(|(_, l)| Ok(l.forward(x)?)).collect(),
        }
    }

    /// Training forward: one output per part and one tape per linear.
    pub(super) fn forward_train(&self, x: &Tensor, dropout: bool) -> Result<(Vec<Tensor>, Vec<LinearTape>)> {
        self.forward_train_masked(x, &self.draw_masks(dropout))
    }

    /// Each linear's adapter dropout mask for a training forward, drawn in the order [`Self::forward_train`] draws
    /// them.
    pub(super) fn draw_masks(&self, dropout: bool) -> Vec<Option<ops::Dropout>> {
        self.linears.iter().map(|(_, linear)| linear.draw_mask(dropout)).collect()
    }

    /// [`Self::forward_train`] with each linear's mask given (see `Linear::forward_train_masked`).
    pub(super) fn forward_train_masked(
        &self,
        x: &Tensor,
        masks: &[Option<ops::Dropout>],
    ) -> Result<(Vec<Tensor>, Vec<LinearTape>)> {
        let mut outputs = Vec::with_capacity(self.linears.len());
        let mut tapes = Vec::with_capacity(self.linears.len());
        for ((_, linear), mask) in self.linears.iter().zip(masks) {
            let (y, tape) = linear.forward_train_masked(x, *mask)?;
            outputs.push(y);
            tapes.push(tape);
        }
        if self.linears.len() == 1 && self.parts.len() > 1 {
            outputs = self.split(&outputs[0])?;
        }
        Ok((outputs, tapes))
    }

    /// Given each part's output gradient, accumulate the adapters' gradients and return the input gradient
    /// (the sum over linears; None when `need_input_grad` is false).
    /// `input`: the group's input, for tapes that let it go ([`LinearTape::forget_input`]); None: the tapes' own.
    pub(super) fn backward(
        &self,
        tapes: &[LinearTape],
        input: Option<&Tensor>,
        d_parts: &[Tensor],
        grads: &mut Gradients,
        need_input_grad: bool,
    ) -> Result<Option<Tensor>> {
        let joined;
        let d_outputs: &[Tensor] = if self.linears.len() == 1 && self.parts.len() > 1 {
            joined = [Tensor::cat(d_parts, D::Minus1)?];
            &joined
        } else {
            d_parts
        };
        if need_input_grad && self.linears.len() > 1 {
            if let Some(dx) = self.widened_backward(tapes, input, d_outputs, grads)? {
                return Ok(Some(dx));
            }
        }
        let mut sum: Option<Tensor> = None;
        for (((_, linear), tape), dy) in self.linears.iter().zip(tapes).zip(d_outputs) {
            // Each linear adds its input gradient to the sum so far (in place on CUDA).
            let input_grad = match (need_input_grad, sum.take()) {
                (false, _) => InputGrad::Skip,
                (true, None) => InputGrad::New,
                (true, Some(so_far)) => InputGrad::AddTo(so_far),
            };
            sum = linear.backward_with_input(tape, input, dy, grads, input_grad)?;
            if need_input_grad {
                sum = Some(Linear::input_grad(sum)?);
            }
        }
        Ok(sum)
    }

    /// The group's backward with its input gradient as one product over every part and adapter,
    /// `[dy_1 | .. | dy_n | dxa_1 | ..] [W_1 ; .. ; W_n ; A_1^T ; ..]` (`ops::widened_input_grad`), where the portable
    /// graph would otherwise add n - 1 products and each adapter's part one by one (`ops::input_widening_pays`:
    /// q|k|v at the 1B shape and 4,096 rows, not gate|up, whose output gradients are four times wider). Every
    /// adapter's gradients are added to `grads` as [`Linear::backward`] adds them. None (nothing done) where some
    /// weight is quantized, an adapter has dropout or DoRA, or the copies would cost more.
    fn widened_backward(
        &self,
        tapes: &[LinearTape],
        input: Option<&Tensor>,
        d_outputs: &[Tensor],
        grads: &mut Gradients,
    ) -> Result<Option<Tensor>> {
        let Some(weights) = self.linears.iter().map(|(_, l)| l.weight.dense()).collect::<Option<Vec<_>>>() else {
            return Ok(None);
        };
        if tapes.iter().any(|t| t.has_dropout_or_dora()) || d_outputs.len() != self.linears.len() {
            return Ok(None);
        }
        let ranks: Vec<usize> = self.linears.iter().map(|(_, l)| l.active_adapter().map_or(0, |a| a.rank())).collect();
        let Some(first) = d_outputs.first() else { return Ok(None) };
        if !ops::input_widening_pays(first, &weights, &ranks) {
            return Ok(None);
        }
        let mut adapter_parts = Vec::new();
        for (((_, linear), tape), dy) in self.linears.iter().zip(tapes).zip(d_outputs) {
            let x = Linear::backward_input(tape, input)?;
            if let Some(part) = linear.adapter_backward(tape, x, dy, grads)? {
                adapter_parts.push((part.dxa, part.a.clone()));
            }
        }
        Ok(Some(ops::widened_input_grad(None, d_outputs, &weights, &adapter_parts)?))
    }

    /// Inference: the parts side by side in one tensor, `x` (..., in) -> (..., sum of parts), what the fused
    /// decode kernels read. Without an active adapter, one product: by the fused dense weight when it exists, or
    /// for a single row, by the quantized weights end to end where our kernel takes them (no biases);
    /// otherwise each linear's own forward (adapters included), joined.
    pub(super) fn forward_joined(&self, x: &Tensor) -> Result<Tensor> {
        if !self.has_active_adapter() {
            if let Some((weight, bias)) = &self.fused {
                let y = ops::frozen_matmul_t(x, weight)?;
                return Ok(match bias {
                    Some(bias) => y.broadcast_add(bias)?,
                    None => y,
                });
            }
            if let Some(y) = self.quantized_joined(x)? {
                return Ok(y);
            }
        }
        match self.linears.as_slice() {
            [(_, linear)] => Ok(linear.forward(x)?),
            linears => {
                let parts = linears.iter().map(|(_, l)| l.forward(x)).collect::<candle_core::Result<Vec<_>>>()?;
                Ok(Tensor::cat(&parts, D::Minus1)?)
            }
        }
    }

    /// One launch over every part's quantized weight for a single row `x`, where the kernel takes them (see
    /// `ops::quantized_gemv_joined`); None when some part is dense or has a bias.
    fn quantized_joined(&self, x: &Tensor) -> Result<Option<Tensor>> {
        let quantized = self.linears.iter().map(|(_, l)| match (&l.weight, &l.bias) {
            (super::linear::BaseWeight::Quantized(q), None) => Some(q.as_ref()),
            _ => None,
        });
        let Some(weights) = quantized.collect::<Option<Vec<_>>>() else { return Ok(None) };
        Ok(ops::quantized_gemv_joined(x, &weights)?)
    }

    /// Whether any linear of the group has an active adapter.
    pub(super) fn has_active_adapter(&self) -> bool {
        self.linears.iter().any(|(_, l)| l.has_active_adapter())
    }
}
