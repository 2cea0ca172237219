//! A projection `y = x W^T + b + scale * dropout(x) A B`: a frozen base linear with an optional LoRA adapter
//! ([`super::adapter`]). Every projection in the transformer is one, so any can carry an adapter. This file
//! owns all of the projection's math: the inference forward, the training forward that records what the
//! backward needs, and the backward.
//!
//! Backward, for `dy`: the input gradient `dy W + (scale * dy B^T) A^T` (masked by the dropout where it
//! flows through the adapter), `dB = scale * (x A)^T dy` and `dA = x^T (scale * dy B^T)`. Nothing is spent
//! on the frozen weight.

use super::adapter::LoraAdapter;
use super::gradients::Gradients;
use crate::engine::ops;
use candle_core::{Result, Tensor};

/// A frozen base linear plus an optional trainable adapter.
#[derive(Debug, Clone)]
pub struct Linear {
    /// (out_features, in_features), as Hugging Face stores it.
    pub weight: Tensor,
    pub bias: Option<Tensor>,
    pub adapter: Option<LoraAdapter>,
    /// Whether the adapter is applied (off: the base model, for side-by-side comparison).
    pub adapter_enabled: bool,
}

/// What the backward pass needs from one projection's training forward, beyond its input.
pub struct LinearTape {
    /// Dropout mask applied to the adapter's input (None without dropout).
    mask: Option<Tensor>,
    /// `dropout(x) A` (rows, r), None when the projection has no active adapter.
    xa: Option<Tensor>,
}

impl Linear {
    pub fn new(weight: Tensor, bias: Option<Tensor>) -> Self {
        Self { weight, bias, adapter: None, adapter_enabled: true }
    }

    pub fn in_features(&self) -> usize {
        self.weight.dims()[1]
    }

    pub fn out_features(&self) -> usize {
        self.weight.dims()[0]
    }

    /// The adapter, when one is attached and switched on.
    pub fn active_adapter(&self) -> Option<&LoraAdapter> {
        self.adapter.as_ref().filter(|_| self.adapter_enabled)
    }

    /// Whether an adapter is attached and switched on.
    pub fn has_active_adapter(&self) -> bool {
        self.active_adapter().is_some()
    }

    /// The frozen part `x W^T + b`.
    fn base(&self, x: &Tensor) -> Result<Tensor> {
        let y = ops::frozen_matmul_t(x, &self.weight)?;
        match &self.bias {
            Some(b) => y.broadcast_add(b),
            None => Ok(y),
        }
    }

    /// Inference: `x`: (..., in_features) -> (..., out_features), no dropout.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = self.base(x)?;
        match self.active_adapter() {
            Some(adapter) => adapter.add_to(&y, x),
            None => Ok(y),
        }
    }

    /// Training forward, `x`: (rows, in) -> (rows, out), with adapter dropout when `dropout` is set.
    pub fn forward_train(&self, x: &Tensor, dropout: bool) -> Result<(Tensor, LinearTape)> {
        let y = self.base(x)?;
        let Some(adapter) = self.active_adapter() else {
            return Ok((y, LinearTape { mask: None, xa: None }));
        };
        let (a, b) = adapter.matrices(x.dtype())?;
        let mask = if dropout && adapter.dropout > 0.0 { Some(adapter.dropout_mask(x)?) } else { None };
        let xa = match &mask {
            Some(mask) => ops::matmul(&(x * mask)?, &a)?,
            None => ops::matmul(x, &a)?,
        };
        let y = ops::add_scaled(&y, &ops::matmul(&xa, &b)?, adapter.scale)?;
        Ok((y, LinearTape { mask, xa: Some(xa) }))
    }

    /// Accumulates the adapter's gradients into `grads` and returns the input gradient when `need_input_grad`.
    pub fn backward(
        &self,
        x: &Tensor,
        tape: &LinearTape,
        dy: &Tensor,
        grads: &mut Gradients,
        need_input_grad: bool,
    ) -> Result<Option<Tensor>> {
        let mut dx = if need_input_grad { Some(ops::frozen_matmul(dy, &self.weight)?) } else { None };
        let (Some(adapter), Some(xa)) = (self.active_adapter(), &tape.xa) else { return Ok(dx) };
        let (a, b) = adapter.matrices(x.dtype())?;
        let scale = adapter.scale;
        let dxa = (ops::matmul(dy, &b.t()?)? * scale)?; // (rows, r)
        grads.add(adapter.b.as_tensor(), &(ops::matmul(&xa.t()?, dy)? * scale)?)?;
        let x_in = match &tape.mask {
            Some(mask) => (x * mask)?,
            None => x.clone(),
        };
        grads.add(adapter.a.as_tensor(), &ops::matmul(&x_in.t()?, &dxa)?)?;
        if let Some(dx) = dx.as_mut() {
            let mut through_adapter = ops::matmul(&dxa, &a.t()?)?;
            if let Some(mask) = &tape.mask {
                through_adapter = (through_adapter * mask)?;
            }
            *dx = ops::add(dx, &through_adapter)?;
        }
        Ok(dx)
    }

    /// A required input gradient, as an error when it is missing.
    pub(super) fn input_grad(dx: Option<Tensor>) -> Result<Tensor> {
        dx.ok_or_else(|| candle_core::Error::Msg("missing input gradient".into()))
    }
}
