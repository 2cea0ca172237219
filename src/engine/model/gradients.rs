//! Adapter gradients of a hand-written backward pass, keyed by the adapter variable's tensor id, in f32.

use candle_core::{DType, Result, Tensor, TensorId};
use std::collections::HashMap;

/// Adapter gradients keyed by the adapter variable's tensor id, in f32.
#[derive(Default)]
pub struct Gradients {
    by_id: HashMap<TensorId, Tensor>,
}

impl Gradients {
    /// The gradient of a parameter (a LoRA A or B), if it received one.
    pub fn get(&self, param: &Tensor) -> Option<&Tensor> {
        self.by_id.get(&param.id())
    }

    /// The gradient of a parameter, or zeros of its shape and dtype where it received none (the pass did not reach
    /// it).
    pub fn get_or_zeros(&self, param: &Tensor) -> Result<Tensor> {
        match self.get(param) {
            Some(grad) => Ok(grad.clone()),
            None => param.zeros_like(),
        }
    }

    /// Add `grad` to the parameter's gradient (converted to f32).
    pub fn add(&mut self, param: &Tensor, grad: &Tensor) -> Result<()> {
        self.accumulate(param.id(), grad.to_dtype(DType::F32)?)
    }

    /// Add another batch's gradients (gradient accumulation).
    pub fn merge(&mut self, other: Gradients) -> Result<()> {
        other.by_id.into_iter().try_for_each(|(id, grad)| self.accumulate(id, grad))
    }

    fn accumulate(&mut self, id: TensorId, grad: Tensor) -> Result<()> {
        let sum = match self.by_id.remove(&id) {
            Some(previous) => (previous + grad)?,
            None => grad,
        };
        self.by_id.insert(id, sum);
        Ok(())
    }
}
