//! A projection `y = x W^T + b + scale * dropout(x) A B`: a frozen base linear with an optional LoRA adapter
//! ([`super::adapter`]). Every projection in the transformer is one, so any can carry an adapter. This file
//! owns all of the projection's math: the inference forward, the training forward that records what the
//! backward needs, and the backward.
//!
//! Backward, for `dy`: the input gradient `dy W + (scale * dy B^T) A^T` (masked by the dropout where it
//! flows through the adapter), `dB = scale * (x A)^T dy` and `dA = x^T (scale * dy B^T)`. Nothing is spent
//! on the frozen weight.
//!
//! The frozen weight is held dense or quantized ([`BaseWeight`], QLoRA); only this file looks at which.
//! A quantized weight multiplies through Candle's quantized matmul forward and is dequantized into a
//! temporary for the input gradient only (`ops::quantized_matmul`). Adapters are always dense.

use super::adapter::LoraAdapter;
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

/// An active adapter's part of [`LinearTape`].
struct AdapterTape {
    /// The projection's input `x` (the A gradient reads it).
    input: Tensor,
    /// The dropout mask applied to the adapter's input, by its seed (None without dropout).
    mask: Option<ops::Dropout>,
    /// `dropout(x) A` (rows, r).
    xa: Tensor,
    /// The adapter's A and B in the compute dtype, as the forward used them (the backward needs them again:
    /// in half precision each is a cast).
    a: Tensor,
    b: Tensor,
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
        let y = self.weight.matmul_t(x)?;
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
            return Ok((y, LinearTape { adapter: None }));
        };
        let (a, b) = adapter.matrices(x.dtype())?;
        let mask = (dropout && adapter.dropout > 0.0).then(|| adapter.next_dropout());
        let xa = match &mask {
            Some(mask) => ops::matmul(&mask.apply(x)?, &a)?,
            None => ops::matmul(x, &a)?,
        };
        // `y` is the fresh frozen product: the update lands in it.
        let y = ops::matmul_add(Some(y), &xa, &b, adapter.scale)?;
        Ok((y, LinearTape { adapter: Some(AdapterTape { input: x.clone(), mask, xa, a, b }) }))
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
        let dx = match input_grad {
            InputGrad::Skip => None,
            InputGrad::New => Some(self.weight.matmul(dy, None)?),
            InputGrad::AddTo(acc) => Some(self.weight.matmul(dy, Some(acc))?),
        };
        let (Some(adapter), Some(AdapterTape { input: x, mask, xa, a, b })) = (self.active_adapter(), &tape.adapter)
        else {
            return Ok(dx);
        };
        let scale = adapter.scale;
        let dxa = ops::matmul_add(None, dy, &b.t()?, scale)?; // (rows, r)
        grads.add(adapter.b.as_tensor(), &ops::matmul_f32(&xa.t()?, dy, scale)?)?;
        let x_in = match mask {
            Some(mask) => mask.apply(x)?,
            None => x.clone(),
        };
        grads.add(adapter.a.as_tensor(), &ops::matmul_f32(&x_in.t()?, &dxa, 1.0)?)?;
        Ok(match (dx, mask) {
            (None, _) => None,
            (Some(dx), Some(mask)) => Some(ops::add(&dx, &mask.apply(&ops::matmul(&dxa, &a.t()?)?)?)?),
            // `dx` is this pass's own product: the adapter's part is added in place.
            (Some(dx), None) => Some(ops::matmul_add(Some(dx), &dxa, &a.t()?, 1.0)?),
        })
    }

    /// A required input gradient, as an error when it is missing.
    pub(super) fn input_grad(dx: Option<Tensor>) -> Result<Tensor> {
        dx.ok_or_else(|| candle_core::Error::Msg("missing input gradient".into()))
    }
}
