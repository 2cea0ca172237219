//! AdamW over the adapter parameters, as torch.optim.AdamW computes it, with state that can be saved and
//! restored exactly (first and second moments, step count), plus global gradient-norm clipping.

use crate::engine::Result;
use candle_core::{Tensor, Var};
use std::collections::HashMap;

/// AdamW hyper-parameters (torch defaults).
#[derive(Debug, Clone, Copy)]
pub struct AdamWParams {
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
}

impl Default for AdamWParams {
    fn default() -> Self {
        Self { beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.0 }
    }
}

/// Optimizer state for a fixed list of named parameters.
pub struct AdamW {
    params: Vec<(String, Var)>,
    m: Vec<Tensor>,
    v: Vec<Tensor>,
    /// Completed optimizer steps.
    pub step: usize,
    hp: AdamWParams,
}

impl AdamW {
    pub fn new(params: Vec<(String, Var)>, hp: AdamWParams) -> Result<Self> {
        let m = params.iter().map(|(_, p)| p.zeros_like()).collect::<candle_core::Result<Vec<_>>>()?;
        let v = m.clone();
        Ok(Self { params, m, v, step: 0, hp })
    }

    pub fn params(&self) -> &[(String, Var)] {
        &self.params
    }

    /// Apply one update with learning rate `lr` and the given gradients (same order as the params).
    pub fn step(&mut self, grads: &[Tensor], lr: f64) -> Result<()> {
        self.step += 1;
        let t = self.step as i32;
        let (b1, b2) = (self.hp.beta1, self.hp.beta2);
        let bias1 = 1.0 - b1.powi(t);
        let bias2 = 1.0 - b2.powi(t);
        for (i, (_, p)) in self.params.iter().enumerate() {
            let g = &grads[i].detach();
            let m = ((&self.m[i] * b1)? + (g * (1.0 - b1))?)?;
            let v = ((&self.v[i] * b2)? + (g.sqr()? * (1.0 - b2))?)?;
            let denom = ((v.clone() / bias2)?.sqrt()? + self.hp.eps)?;
            let update = ((m.clone() / bias1)? / denom)?;
            let decayed = if self.hp.weight_decay > 0.0 {
                (p.as_tensor() * (1.0 - lr * self.hp.weight_decay))?
            } else {
                p.as_tensor().clone()
            };
            p.set(&(decayed - (update * lr)?)?)?;
            self.m[i] = m.detach();
            self.v[i] = v.detach();
        }
        Ok(())
    }

    /// Moments keyed `<name>.exp_avg` / `<name>.exp_avg_sq`, for saving.
    pub fn state_tensors(&self) -> HashMap<String, Tensor> {
        let mut out = HashMap::new();
        for (i, (name, _)) in self.params.iter().enumerate() {
            out.insert(format!("{name}.exp_avg"), self.m[i].clone());
            out.insert(format!("{name}.exp_avg_sq"), self.v[i].clone());
        }
        out
    }

    /// Restore moments saved by [`Self::state_tensors`].
    pub fn load_state(&mut self, tensors: &HashMap<String, Tensor>, step: usize) -> Result<()> {
        for (i, (name, p)) in self.params.iter().enumerate() {
            let get = |key: String| -> Result<Tensor> {
                let t = tensors.get(&key).ok_or_else(|| {
                    crate::engine::Error::Training(format!(
                        "optimizer state has no `{key}`; the checkpoint does not match these LoRA settings"
                    ))
                })?;
                Ok(t.to_device(p.device())?.to_dtype(p.dtype())?)
            };
            self.m[i] = get(format!("{name}.exp_avg"))?;
            self.v[i] = get(format!("{name}.exp_avg_sq"))?;
        }
        self.step = step;
        Ok(())
    }
}

/// Global L2 norm of all gradients, reduced on the device and read once.
pub fn grad_norm(grads: &[Tensor]) -> Result<f64> {
    let squares = grads.iter().map(|g| g.sqr()?.sum_all()).collect::<candle_core::Result<Vec<_>>>()?;
    Ok(crate::engine::ops::sum_to_host(&squares)?.sqrt())
}

/// Scale gradients so their global norm is at most `max_norm` (as torch's clip_grad_norm_).
pub fn clip_grads(grads: &mut [Tensor], norm: f64, max_norm: f64) -> Result<()> {
    let coef = max_norm / (norm + 1e-6);
    if coef < 1.0 {
        for g in grads.iter_mut() {
            *g = (&*g * coef)?.detach();
        }
    }
    Ok(())
}
