//! A linear layer `y = x W^T + b` with an optional LoRA adapter. Every projection in the transformer is one
//! of these, so any of them can carry an adapter.

use crate::engine::lora::LoraAdapter;
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

    /// Whether an adapter is attached and switched on.
    pub fn has_active_adapter(&self) -> bool {
        self.adapter.is_some() && self.adapter_enabled
    }

    /// `x`: (..., in_features) -> (..., out_features). `train` enables adapter dropout.
    pub fn forward(&self, x: &Tensor, train: bool) -> Result<Tensor> {
        let mut y = crate::engine::ops::frozen_matmul_t(x, &self.weight)?;
        if let Some(b) = &self.bias {
            y = y.broadcast_add(b)?;
        }
        match &self.adapter {
            Some(adapter) if self.adapter_enabled => adapter.add_to(&y, x, train),
            _ => Ok(y),
        }
    }
}
