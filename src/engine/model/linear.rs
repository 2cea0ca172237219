//! A projection `y = x W^T + b + scale * dropout(x) A B`: a frozen base linear with an optional LoRA adapter
//! ([`super::adapter`]). Every projection in the transformer is one, so any can carry an adapter. This file
//! owns all of the projection's math: the inference forward, the training forward that records what the
//! backward needs, and the backward.
//!
//! Backward, for `dy`: the input gradient `dy W + (scale * dy B^T) A^T` (masked by the dropout where it
//! flows through the adapter), `dB = scale * (x A)^T dy` and `dA = x^T (scale * dy B^T)`. Nothing is spent
//! on the frozen weight.
//!
//! DoRA (an adapter with a magnitude `m`, see `adapter.rs`): with `g = m / ||W + s (AB)^T||_row` (the norm detached)
//! and `xd` the adapter's (dropout-masked) input, PEFT's forward `y = x W^T + b + (g - 1) * xd W^T + g * s * xd A B`
//! is computed as `y = g * zd + (x - xd) W^T + b` with `zd = xd W^T + s xd A B` (without dropout the second term is
//! zero and skipped). Backward: `dzd = g * dy`, `dm = sum_rows(dy * zd) / ||.||`, `dA`/`dB` as LoRA's with `dzd`,
//! and `dx = dy W + mask(dzd W + s dzd B^T A^T - dy W)` (without dropout `dzd W + s dzd B^T A^T`). The norm needs
//! the dense weight: a quantized one is dequantized for it (once per training pass, and once for inference, whose
//! factor is kept: [`super::adapter::Dora`]).
//!
//! The frozen weight is held dense or quantized ([`BaseWeight`], QLoRA); only this file looks at which.
//! A quantized weight multiplies through Candle's quantized matmul forward and is dequantized into a
//! temporary for the input gradient only (`ops::quantized_matmul`). Adapters are always dense.

use super::adapter::{row_norms, Dora, LoraAdapter};
use super::gradients::Gradients;
use crate::engine::ops;
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Result, Tensor};
use std::sync::Arc;

/// How a projection's frozen weight (out_features, in_features) is stored.
#[derive(Debug, Clone)]
pub enum BaseWeight {
    /// A dense tensor in the compute dtype (possibly a row view of a fused q|k|v or gate|up tensor).
    Dense(Tensor),
    /// GGML-quantized blocks (Q4_0, Q4_K, Q8_0, ...) on the model's device.
    Quantized(Arc<QTensor>),
}

impl BaseWeight {
    /// (out_features, in_features).
    pub fn dims2(&self) -> Result<(usize, usize)> {
        match self {
            BaseWeight::Dense(w) => w.dims2(),
            BaseWeight::Quantized(q) => q.shape().dims2(),
        }
    }

    /// The dense weight; None when quantized.
    pub fn dense(&self) -> Option<&Tensor> {
        match self {
            BaseWeight::Dense(w) => Some(w),
            BaseWeight::Quantized(_) => None,
        }
    }

    /// The GGML type of a quantized weight; None when dense.
    pub fn quantized_type(&self) -> Option<GgmlDType> {
        match self {
            BaseWeight::Dense(_) => None,
            BaseWeight::Quantized(q) => Some(q.dtype()),
        }
    }

    /// Bytes this weight holds in memory.
    pub fn size_in_bytes(&self) -> usize {
        match self {
            BaseWeight::Dense(w) => w.elem_count() * w.dtype().size_in_bytes(),
            BaseWeight::Quantized(q) => q.storage_size_in_bytes(),
        }
    }

    /// The weight as a dense tensor in `dtype` (a dequantized copy when quantized): for merging and export.
    pub fn to_dense(&self, dtype: DType) -> Result<Tensor> {
        match self {
            BaseWeight::Dense(w) => w.to_dtype(dtype),
            BaseWeight::Quantized(q) => crate::engine::ops::dequantize(q, &q.device(), dtype),
        }
    }

    /// `x W^T`.
    fn matmul_t(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            BaseWeight::Dense(w) => ops::frozen_matmul_t(x, w),
            BaseWeight::Quantized(q) => ops::quantized_matmul_t(x, q),
        }
    }

    /// `dy W`, the input gradient, added to `acc` when given.
    fn matmul(&self, dy: &Tensor, acc: Option<Tensor>) -> Result<Tensor> {
        match (self, acc) {
            (BaseWeight::Dense(w), acc) => ops::frozen_matmul_add(acc, dy, w),
            (BaseWeight::Quantized(q), None) => ops::quantized_matmul(dy, q),
            (BaseWeight::Quantized(q), Some(acc)) => ops::add(&acc, &ops::quantized_matmul(dy, q)?),
        }
    }
}

/// What a projection's backward does with its input gradient.
pub enum InputGrad {
    /// Not needed (the lowest adapted layer's input).
    Skip,
    /// Returned as a new tensor.
    New,
    /// Added to this tensor, which the caller hands over (the sum over projections sharing the input).
    AddTo(Tensor),
}

/// A frozen base linear plus an optional trainable adapter.
#[derive(Debug, Clone)]
pub struct Linear {
    /// (out_features, in_features), as Hugging Face stores it.
    pub weight: BaseWeight,
    pub bias: Option<Tensor>,
    pub adapter: Option<LoraAdapter>,
    /// Whether the adapter is applied (off: the base model, for side-by-side comparison).
    pub adapter_enabled: bool,
}

/// What the backward pass needs from one projection's training forward: nothing for a frozen projection (its
/// input gradient needs only the weight, so not even its input is held until the backward: with LoRA on q and v
/// only, the MLP's inputs of every layer would otherwise stay alive, over a gigabyte at 1B x 4,096).
pub struct LinearTape {
    /// Present when an adapter trained in the forward.
    adapter: Option<AdapterTape>,
}

impl LinearTape {
    /// Lets go of the projection's input: the caller makes it again and hands it to [`Linear::backward_with_input`]
    /// (the MLP's down_proj, whose input is one element-wise product of what the tape keeps anyway).
    pub fn forget_input(&mut self) {
        if let Some(adapter) = &mut self.adapter {
            adapter.input = None;
        }
    }

    /// Whether the adapter trained with dropout or is a DoRA adapter (its input gradient then takes its own path).
    pub fn has_dropout_or_dora(&self) -> bool {
        matches!(&self.adapter, Some(AdapterTape { mask: Some(_), .. } | AdapterTape { dora: Some(_), .. }))
    }

    /// Whether the backward needs the input handed to it ([`Self::forget_input`]).
    pub fn needs_input(&self) -> bool {
        matches!(&self.adapter, Some(AdapterTape { input: None, .. }))
    }

    /// The bytes of the input the tape keeps (0 for a frozen projection or a forgotten input).
    pub fn input_bytes(&self) -> usize {
        self.adapter.as_ref().and_then(|a| a.input.as_ref()).map_or(0, |x| x.elem_count() * x.dtype().size_in_bytes())
    }
}

/// An active adapter's part of [`LinearTape`].
struct AdapterTape {
    /// The projection's input `x` (the A gradient reads it); None when the caller makes it again for the backward
    /// ([`LinearTape::forget_input`]).
    input: Option<Tensor>,
    /// The dropout mask applied to the adapter's input, by its seed (None without dropout).
    mask: Option<ops::Dropout>,
    /// `dropout(x) A` (rows, r).
    xa: Tensor,
    /// The adapter's A and B in the compute dtype, as the forward used them (the backward needs them again:
    /// in half precision each is a cast).
    a: Tensor,
    b: Tensor,
    /// DoRA's part, for a DoRA adapter.
    dora: Option<DoraTape>,
}

/// What the input gradient takes from a LoRA adapter's backward: `dxa = scale dy B^T` (rows, r), the adapter's A (in,
/// r) as the forward used it, and its dropout mask; the input gradient's adapter part is `mask(dxa A^T)`.
pub(super) struct AdapterInputGrad<'t> {
    pub dxa: Tensor,
    pub a: &'t Tensor,
    pub mask: Option<&'t ops::Dropout>,
}

/// What a DoRA adapter's backward needs besides LoRA's.
struct DoraTape {
    /// `g = m / ||W + s (AB)^T||_row` in the compute dtype, (out,).
    factor: Tensor,
    /// `1 / ||W + s (AB)^T||_row`, f32, (out,): `dm = sum_rows(dy * zd) / ||.||`.
    inv_norm: Tensor,
    /// `zd = xd W^T + s xd A B` (rows, out), before the factor.
    zd: Tensor,
}

impl Linear {
    /// A projection with a dense weight.
    pub fn new(weight: Tensor, bias: Option<Tensor>) -> Self {
        Self::with_base(BaseWeight::Dense(weight), bias)
    }

    /// A projection with a dense or quantized weight.
    pub fn with_base(weight: BaseWeight, bias: Option<Tensor>) -> Self {
        Self { weight, bias, adapter: None, adapter_enabled: true }
    }

    pub fn in_features(&self) -> usize {
        self.weight.dims2().map(|d| d.1).unwrap_or(0)
    }

    pub fn out_features(&self) -> usize {
        self.weight.dims2().map(|d| d.0).unwrap_or(0)
    }

    /// The adapter, when one is attached and switched on.
    pub fn active_adapter(&self) -> Option<&LoraAdapter> {
        self.adapter.as_ref().filter(|_| self.adapter_enabled)
    }

    /// The weight when this projection is just `x W^T`: dense, no bias, no active adapter.
    pub fn plain_dense_weight(&self) -> Option<&Tensor> {
        match (&self.weight, &self.bias, self.active_adapter()) {
            (BaseWeight::Dense(w), None, None) => Some(w),
            _ => None,
        }
    }

    /// Whether an adapter is attached and switched on.
    pub fn has_active_adapter(&self) -> bool {
        self.active_adapter().is_some()
    }

    /// The frozen part `x W^T + b`.
    fn base(&self, x: &Tensor) -> Result<Tensor> {
        self.add_bias(self.weight.matmul_t(x)?)
    }

    /// `y + b`.
    fn add_bias(&self, y: Tensor) -> Result<Tensor> {
        match &self.bias {
            Some(b) => y.broadcast_add(b),
            None => Ok(y),
        }
    }

    /// Inference: `x`: (..., in_features) -> (..., out_features), no dropout.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self.active_adapter() {
            None => self.base(x),
            Some(adapter) => match &adapter.dora {
                None => adapter.add_to(&self.base(x)?, x),
                Some(dora) => {
                    let factor = self.inference_dora_factor(adapter, dora)?.to_dtype(x.dtype())?;
                    let z = adapter.add_to(&self.weight.matmul_t(x)?, x)?;
                    self.add_bias(z.broadcast_mul(&factor)?)
                }
            },
        }
    }

    /// DoRA's `(m / ||W + s (AB)^T||_row, 1 / ||W + s (AB)^T||_row)`, f32 (out,), from the current weights.
    fn dora_factor(&self, adapter: &LoraAdapter, dora: &Dora) -> Result<(Tensor, Tensor)> {
        let w = self.weight.to_dense(DType::F32)?;
        let delta = adapter.delta()?.to_device(w.device())?;
        let inv_norm = row_norms(&(w + delta)?)?.recip()?;
        Ok(((dora.magnitude.as_tensor().detach() * &inv_norm)?, inv_norm))
    }

    /// [`Self::dora_factor`]'s factor for inference, kept in the adapter once computed ([`Dora::factor`]).
    fn inference_dora_factor(&self, adapter: &LoraAdapter, dora: &Dora) -> Result<Tensor> {
        if let Some(factor) = dora.factor.lock().ok().and_then(|slot| slot.clone()) {
            return Ok(factor);
        }
        let (factor, _) = self.dora_factor(adapter, dora)?;
        if let Ok(mut slot) = dora.factor.lock() {
            *slot = Some(factor.clone());
        }
        Ok(factor)
    }

    /// Training forward, `x`: (rows, in) -> (rows, out), with adapter dropout when `dropout` is set.
    pub fn forward_train(&self, x: &Tensor, dropout: bool) -> Result<(Tensor, LinearTape)> {
        self.forward_train_masked(x, self.draw_mask(dropout))
    }

    /// The dropout mask this projection's adapter applies in a training forward, drawn from the shared counter as
    /// [`Self::forward_train`] draws it (None without an active adapter, or without dropout).
    pub fn draw_mask(&self, dropout: bool) -> Option<ops::Dropout> {
        self.active_adapter().filter(|a| dropout && a.dropout > 0.0).map(|a| a.next_dropout())
    }

    /// [`Self::forward_train`] with the adapter's mask given: a block of rows of an input whose mask was drawn whole
    /// (`ops::Dropout::rows_from`).
    pub fn forward_train_masked(&self, x: &Tensor, mask: Option<ops::Dropout>) -> Result<(Tensor, LinearTape)> {
        let (y, tape) = self.train(x, mask, true)?;
        Ok((y.ok_or_else(|| candle_core::Error::Msg("training forward without its output".into()))?, tape))
    }

    /// The tape of a training forward whose output nobody reads (a checkpointed layer's last projection, run again
    /// for its backward): LoRA's tape without the frozen product. DoRA's tape holds that product, so it runs whole.
    pub fn tape_only(&self, x: &Tensor, mask: Option<ops::Dropout>) -> Result<LinearTape> {
        Ok(self.train(x, mask, false)?.1)
    }

    /// The training forward: the output when `output` is set (always for DoRA), and the tape.
    fn train(&self, x: &Tensor, mask: Option<ops::Dropout>, output: bool) -> Result<(Option<Tensor>, LinearTape)> {
        let Some(adapter) = self.active_adapter() else {
            return Ok((output.then(|| self.base(x)).transpose()?, LinearTape { adapter: None }));
        };
        let (a, b) = adapter.matrices(x.dtype())?;
        let xd = match &mask {
            Some(mask) => Some(mask.apply(x)?),
            None => None,
        };
        let xa = ops::matmul(xd.as_ref().unwrap_or(x), &a)?;
        if let Some(dora) = &adapter.dora {
            let (y, tape) = self.forward_train_dora(x, xd, mask, xa, (a, b), adapter, dora)?;
            return Ok((Some(y), tape));
        }
        let y = match (output, &self.weight) {
            (false, _) => None,
            (true, BaseWeight::Dense(w)) if mask.is_none() && ops::forward_widening_pays(x, w, xa.dim(1)?) => {
                Some(self.add_bias(ops::widened_forward(x, w, &xa, &b, adapter.scale)?)?)
            }
            // `y` is the fresh frozen product: the update lands in it.
            (true, _) => Some(ops::matmul_add(Some(self.base(x)?), &xa, &b, adapter.scale)?),
        };
        Ok((y, LinearTape { adapter: Some(AdapterTape { input: Some(x.clone()), mask, xa, a, b, dora: None }) }))
    }

    /// [`Self::forward_train`] for a DoRA adapter (see the module docs), `xd` the masked input (None: no dropout)
    /// and `xa = xd A`.
    #[allow(clippy::too_many_arguments)]
    fn forward_train_dora(
        &self,
        x: &Tensor,
        xd: Option<Tensor>,
        mask: Option<ops::Dropout>,
        xa: Tensor,
        (a, b): (Tensor, Tensor),
        adapter: &LoraAdapter,
        dora: &Dora,
    ) -> Result<(Tensor, LinearTape)> {
        // The weights change after this pass: inference computes its factor again.
        dora.forget_factor();
        let (factor, inv_norm) = self.dora_factor(adapter, dora)?;
        let factor = factor.to_dtype(x.dtype())?;
        let zd = ops::matmul_add(Some(self.weight.matmul_t(xd.as_ref().unwrap_or(x))?), &xa, &b, adapter.scale)?;
        let mut y = zd.broadcast_mul(&factor)?;
        if let Some(xd) = &xd {
            y = ops::add(&y, &self.weight.matmul_t(&(x - xd)?)?)?;
        }
        let dora = Some(DoraTape { factor, inv_norm, zd });
        Ok((
            self.add_bias(y)?,
            LinearTape { adapter: Some(AdapterTape { input: Some(x.clone()), mask, xa, a, b, dora }) },
        ))
    }

    /// Accumulates the adapter's gradients into `grads` and returns the input gradient as `input_grad` asks
    /// (None for [`InputGrad::Skip`]).
    pub fn backward(
        &self,
        tape: &LinearTape,
        dy: &Tensor,
        grads: &mut Gradients,
        input_grad: InputGrad,
    ) -> Result<Option<Tensor>> {
        self.backward_with_input(tape, None, dy, grads, input_grad)
    }

    /// [`Self::backward`] with the projection's input given, for a tape that let it go ([`LinearTape::forget_input`]);
    /// None: the tape's own.
    pub fn backward_with_input(
        &self,
        tape: &LinearTape,
        input: Option<&Tensor>,
        dy: &Tensor,
        grads: &mut Gradients,
        input_grad: InputGrad,
    ) -> Result<Option<Tensor>> {
        let x = Self::backward_input(tape, input)?;
        if let (Some(adapter), Some(tape @ AdapterTape { dora: Some(dora), .. }), Some(x)) =
            (self.active_adapter(), &tape.adapter, x)
        {
            return self.backward_dora(adapter, tape, x, dora, dy, grads, input_grad);
        }
        let Some(AdapterInputGrad { dxa, a, mask }) = self.adapter_backward(tape, x, dy, grads)? else {
            return self.base_input_grad(dy, input_grad);
        };
        if let (BaseWeight::Dense(w), None) = (&self.weight, mask) {
            if !matches!(input_grad, InputGrad::Skip) && ops::input_widening_pays(dy, &[w], &[dxa.dim(1)?]) {
                let acc = match input_grad {
                    InputGrad::AddTo(acc) => Some(acc),
                    _ => None,
                };
                return Ok(Some(ops::widened_input_grad(acc, std::slice::from_ref(dy), &[w], &[(dxa, a.clone())])?));
            }
        }
        Ok(match (self.base_input_grad(dy, input_grad)?, mask) {
            (None, _) => None,
            (Some(dx), Some(mask)) => Some(ops::matmul_add_dropped(&dx, &dxa, &a.t()?, mask)?),
            // `dx` is this pass's own product: the adapter's part is added in place.
            (Some(dx), None) => Some(ops::matmul_add(Some(dx), &dxa, &a.t()?, 1.0)?),
        })
    }

    /// A LoRA adapter's gradients for the output gradient `dy` (dA and dB added to `grads`; `x`: the projection's
    /// input), and what the input gradient takes from the adapter. None without an active LoRA adapter (DoRA's
    /// backward is [`Self::backward_dora`]).
    pub(super) fn adapter_backward<'t>(
        &self,
        tape: &'t LinearTape,
        x: Option<&Tensor>,
        dy: &Tensor,
        grads: &mut Gradients,
    ) -> Result<Option<AdapterInputGrad<'t>>> {
        let (Some(adapter), Some(AdapterTape { mask, xa, a, b, dora: None, .. }), Some(x)) =
            (self.active_adapter(), &tape.adapter, x)
        else {
            return Ok(None);
        };
        let scale = adapter.scale;
        let dxa = ops::matmul_add(None, dy, &b.t()?, scale)?; // (rows, r)
        grads.add(adapter.b.as_tensor(), &ops::matmul_f32(&xa.t()?, dy, scale)?)?;
        let x_in = match mask {
            Some(mask) => mask.apply(x)?,
            None => x.clone(),
        };
        grads.add(adapter.a.as_tensor(), &ops::matmul_f32(&x_in.t()?, &dxa, 1.0)?)?;
        Ok(Some(AdapterInputGrad { dxa, a, mask: mask.as_ref() }))
    }

    /// The input of the projection's backward: `input` when given, else the tape's own; None for a projection
    /// without an adapter (its backward needs no input).
    pub(super) fn backward_input<'a>(tape: &'a LinearTape, input: Option<&'a Tensor>) -> Result<Option<&'a Tensor>> {
        match &tape.adapter {
            Some(adapter) => Ok(Some(input.or(adapter.input.as_ref()).ok_or_else(|| {
                candle_core::Error::Msg("a projection's backward without its input (forgotten, not given)".into())
            })?)),
            None => Ok(None),
        }
    }

    /// The frozen weight's part of the input gradient, `dy W`, as `input_grad` asks for it.
    fn base_input_grad(&self, dy: &Tensor, input_grad: InputGrad) -> Result<Option<Tensor>> {
        Ok(match input_grad {
            InputGrad::Skip => None,
            InputGrad::New => Some(self.weight.matmul(dy, None)?),
            InputGrad::AddTo(acc) => Some(self.weight.matmul(dy, Some(acc))?),
        })
    }

    /// [`Self::backward`] for a DoRA adapter (see the module docs).
    #[allow(clippy::too_many_arguments)]
    fn backward_dora(
        &self,
        adapter: &LoraAdapter,
        tape: &AdapterTape,
        x: &Tensor,
        dora_tape: &DoraTape,
        dy: &Tensor,
        grads: &mut Gradients,
        input_grad: InputGrad,
    ) -> Result<Option<Tensor>> {
        let AdapterTape { mask, xa, a, b, .. } = tape;
        let DoraTape { factor, inv_norm, zd } = dora_tape;
        if let Some(dora) = &adapter.dora {
            let dm = (dy.to_dtype(DType::F32)? * zd.to_dtype(DType::F32)?)?.sum(0)?;
            grads.add(dora.magnitude.as_tensor(), &(dm * inv_norm)?)?;
        }
        let dzd = dy.broadcast_mul(factor)?;
        let dxa = ops::matmul_add(None, &dzd, &b.t()?, adapter.scale)?; // (rows, r)
        grads.add(adapter.b.as_tensor(), &ops::matmul_f32(&xa.t()?, &dzd, adapter.scale)?)?;
        let x_in = match mask {
            Some(mask) => mask.apply(x)?,
            None => x.clone(),
        };
        grads.add(adapter.a.as_tensor(), &ops::matmul_f32(&x_in.t()?, &dxa, 1.0)?)?;
        let acc = match input_grad {
            InputGrad::Skip => return Ok(None),
            InputGrad::New => None,
            InputGrad::AddTo(acc) => Some(acc),
        };
        let a_t = a.t()?;
        Ok(Some(match mask {
            // `dzd W + dxa A^T`, added to `acc` (in place on CUDA, as the LoRA path does).
            None => ops::matmul_add(Some(self.weight.matmul(&dzd, acc)?), &dxa, &a_t, 1.0)?,
            // `dy W + mask(dzd W + dxa A^T - dy W)`: the frozen path sees `x`, the DoRA path `xd`.
            Some(mask) => {
                let dyw = self.weight.matmul(dy, None)?;
                let through_xd = ops::matmul_add(Some((self.weight.matmul(&dzd, None)? - &dyw)?), &dxa, &a_t, 1.0)?;
                let dx = ops::add(&dyw, &mask.apply(&through_xd)?)?;
                match acc {
                    Some(acc) => ops::add(&acc, &dx)?,
                    None => dx,
                }
            }
        }))
    }

    /// A required input gradient, as an error when it is missing.
    pub(super) fn input_grad(dx: Option<Tensor>) -> Result<Tensor> {
        dx.ok_or_else(|| candle_core::Error::Msg("missing input gradient".into()))
    }
}

#[cfg(test)]
#[path = "linear_tests.rs"]
mod tests;
