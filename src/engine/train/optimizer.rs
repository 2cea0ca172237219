//! AdamW over the adapter parameters, as torch.optim.AdamW computes it, with state that can be saved and
//! restored exactly (first and second moments, step count), plus global gradient-norm clipping and the skip of a
//! step whose loss or norm is not finite. On CUDA with f32 adapters the norm, the clipping, the skip and the update
//! run as fused kernels on the device (`ops::cuda::optimizer`), with the same arithmetic.

use crate::engine::ops::cuda::optimizer::{self as cuda_optimizer, AdamWScalars, ParamSlot};
use crate::engine::ops::Scalar;
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
    moments: Moments,
    /// Completed optimizer steps.
    pub step: usize,
    hp: AdamWParams,
    /// Host memory for the fused step's statistics, kept for the next step once read.
    spare_stats: Option<cuda_optimizer::HostStats>,
}

impl AdamW {
    pub fn new(params: Vec<(String, Var)>, hp: AdamWParams) -> Result<Self> {
        let moments = match params.iter().all(|(_, p)| cuda_optimizer::available(p)) {
            true => {
                // Two allocations, not clones: the fused update writes each moment in place.
                let zeros = || params.iter().map(|(_, p)| p.zeros_like()).collect::<candle_core::Result<Vec<_>>>();
                Moments::Each { m: zeros()?, v: zeros()? }
            }
            false => {
                let zeros = || -> candle_core::Result<Tensor> {
                    match params.first() {
                        Some((_, p)) => Tensor::zeros(total_elements(&params), p.dtype(), p.device()),
                        None => Tensor::zeros(0, candle_core::DType::F32, &candle_core::Device::Cpu),
                    }
                };
                Moments::Joined { m: zeros()?, v: zeros()? }
            }
        };
        Ok(Self { params, moments, step: 0, hp, spare_stats: None })
    }

    pub fn params(&self) -> &[(String, Var)] {
        &self.params
    }

    /// One optimizer step as a training step takes it: the global gradient norm, the gradients clipped to
    /// `max_norm` (torch's clip_grad_norm_), and no update at all when `loss` (the step's mean loss) or the norm is
    /// not finite, in which case the step count stays. On CUDA with f32 adapters all of it is queued on the device
    /// (`ops::cuda::optimizer`) and read back once, at the end; elsewhere the norm is read first and the update
    /// composed. [`AdamW::queue_guarded_step`] and [`AdamW::finish_step`] split it where the read happens.
    pub fn guarded_step(
        &mut self,
        grads: &[Tensor],
        lr: f64,
        max_norm: Option<f64>,
        loss: &Scalar,
    ) -> Result<StepOutcome> {
        let queued = self.queue_guarded_step(grads, lr, max_norm, loss)?;
        self.finish_step(queued)
    }

    /// [`AdamW::guarded_step`] up to its read back: on CUDA the step is queued, with the copy of its statistics
    /// into host memory right behind the update, so the caller can let go of the gradients (their memory is freed
    /// in stream order, behind the update) and queue more work before [`AdamW::finish_step`] waits for that copy;
    /// elsewhere the step is done here.
    pub fn queue_guarded_step(
        &mut self,
        grads: &[Tensor],
        lr: f64,
        max_norm: Option<f64>,
        loss: &Scalar,
    ) -> Result<QueuedStep> {
        // The moments' layout, chosen at construction from where the parameters live, decides the path.
        if !grads.is_empty() && matches!(self.moments, Moments::Each { .. }) {
            let (bias1, bias2) = self.count_step();
            let Moments::Each { m, v } = &self.moments else {
                return Err(crate::engine::Error::Training("the fused AdamW update needs its moments apart".into()));
            };
            let scalars = AdamWScalars {
                lr: lr as f32,
                beta1: self.hp.beta1 as f32,
                beta2: self.hp.beta2 as f32,
                eps: self.hp.eps as f32,
                decay: (1.0 - lr * self.hp.weight_decay) as f32,
                bias1: bias1 as f32,
                bias2: bias2 as f32,
            };
            let device = self.params[0].1.device().clone();
            let grads = grads
                .iter()
                .map(|g| g.to_dtype(candle_core::DType::F32)?.contiguous())
                .collect::<candle_core::Result<Vec<_>>>()?;
            let slots: Vec<ParamSlot> = (0..self.params.len())
                .map(|i| ParamSlot { param: self.params[i].1.as_tensor(), m: &m[i], v: &v[i], grad: &grads[i] })
                .collect();
            let host = match self.spare_stats.take() {
                Some(host) => host,
                None => cuda_optimizer::HostStats::new(&device)?,
            };
            let stats = cuda_optimizer::guarded_adamw(&slots, &loss.on_device(&device)?, max_norm, &scalars, host)?;
            return Ok(QueuedStep::OnDevice(stats));
        }
        let (loss, norm) = (loss.value()?, grad_norm(grads)?);
        if !loss.is_finite() || !norm.is_finite() {
            return Ok(QueuedStep::Done(StepOutcome { loss, grad_norm: norm, applied: false }));
        }
        let bias = self.count_step();
        self.composed_update(grads, lr, clip_coefficient(norm, max_norm), bias)?;
        Ok(QueuedStep::Done(StepOutcome { loss, grad_norm: norm, applied: true }))
    }

    /// The outcome of a queued step: on CUDA its statistics read back (the one wait of a training step), and the
    /// step count taken back when the device skipped the update.
    pub fn finish_step(&mut self, queued: QueuedStep) -> Result<StepOutcome> {
        let stats = match queued {
            QueuedStep::Done(outcome) => return Ok(outcome),
            QueuedStep::OnDevice(stats) => stats,
        };
        let ([loss, sum_squares, _, skipped], host) = stats.read()?;
        self.spare_stats = Some(host);
        let applied = skipped == 0.0;
        if !applied {
            self.step -= 1;
        }
        Ok(StepOutcome { loss, grad_norm: sum_squares.sqrt(), applied })
    }

    /// Count a step and give its bias corrections `(1 - beta1^t, 1 - beta2^t)` for the new count `t`.
    fn count_step(&mut self) -> (f64, f64) {
        self.step += 1;
        let t = self.step as i32;
        (1.0 - self.hp.beta1.powi(t), 1.0 - self.hp.beta2.powi(t))
    }

    /// The update in Candle ops with the step's bias corrections, each gradient multiplied by `grad_scale` first
    /// (the clipping coefficient). All parameters are updated at once, end to end in one vector: the same
    /// arithmetic per element as a parameter at a time, in about a dozen operations over all of them plus a copy in
    /// and out per parameter, where a parameter at a time took about sixteen each (the Mac's Metal dispatches every
    /// operation on its own).
    fn composed_update(
        &mut self,
        grads: &[Tensor],
        lr: f64,
        grad_scale: f64,
        (bias1, bias2): (f64, f64),
    ) -> Result<()> {
        if self.params.is_empty() {
            return Ok(());
        }
        let Moments::Joined { m, v } = &mut self.moments else {
            return Err(crate::engine::Error::Training("the composed AdamW update needs joined moments".into()));
        };
        let (b1, b2) = (self.hp.beta1, self.hp.beta2);
        let g = &joined(grads.iter().map(Tensor::detach))?;
        let g = &if grad_scale != 1.0 { (g * grad_scale)? } else { g.clone() };
        let m_new = ((&*m * b1)? + (g * (1.0 - b1))?)?;
        let v_new = ((&*v * b2)? + (g.sqr()? * (1.0 - b2))?)?;
        let denom = ((v_new.clone() / bias2)?.sqrt()? + self.hp.eps)?;
        let update = ((m_new.clone() / bias1)? / denom)?;
        let p = joined(self.params.iter().map(|(_, p)| p.as_tensor().clone()))?;
        let decayed = if self.hp.weight_decay > 0.0 { (p * (1.0 - lr * self.hp.weight_decay))? } else { p };
        let updated = (decayed - (update * lr)?)?;
        for ((_, p), part) in self.params.iter().zip(split_like(&updated, &self.params)?) {
            p.set(&part)?;
        }
        (*m, *v) = (m_new.detach(), v_new.detach());
        Ok(())
    }

    /// Moments keyed `<name>.exp_avg` / `<name>.exp_avg_sq`, for saving. They share storage with the optimizer's
    /// own (no copy per checkpoint): the fused update writes the moments in place, so use them before the next
    /// [`Self::guarded_step`], as the checkpoint writer does.
    pub fn state_tensors(&self) -> Result<HashMap<String, Tensor>> {
        let (m, v) = match &self.moments {
            Moments::Each { m, v } => (m.clone(), v.clone()),
            Moments::Joined { m, v } => (split_like(m, &self.params)?, split_like(v, &self.params)?),
        };
        let mut out = HashMap::new();
        for (((name, _), m), v) in self.params.iter().zip(m).zip(v) {
            out.insert(format!("{name}.exp_avg"), m);
            out.insert(format!("{name}.exp_avg_sq"), v);
        }
        Ok(out)
    }

    /// Restore moments saved by [`Self::state_tensors`].
    pub fn load_state(&mut self, tensors: &HashMap<String, Tensor>, step: usize) -> Result<()> {
        let (mut m, mut v) = (Vec::new(), Vec::new());
        for (name, p) in &self.params {
            let get = |key: String| -> Result<Tensor> {
                let t = tensors.get(&key).ok_or_else(|| {
                    crate::engine::Error::Training(format!(
                        "optimizer state has no `{key}`; the checkpoint does not match these LoRA settings"
                    ))
                })?;
                if t.shape() != p.shape() {
                    return Err(crate::engine::Error::Training(format!(
                        "optimizer state `{key}` is {:?} but its parameter is {:?}; the checkpoint does not match these \
                         LoRA settings",
                        t.dims(),
                        p.dims()
                    )));
                }
                // A copy of its own: the fused update writes the moments in place.
                Ok(t.to_device(p.device())?.to_dtype(p.dtype())?.contiguous()?.copy()?)
            };
            m.push(get(format!("{name}.exp_avg"))?);
            v.push(get(format!("{name}.exp_avg_sq"))?);
        }
        match &self.moments {
            Moments::Each { .. } => self.moments = Moments::Each { m, v },
            Moments::Joined { .. } if !m.is_empty() => {
                self.moments = Moments::Joined { m: joined(m.into_iter())?, v: joined(v.into_iter())? }
            }
            Moments::Joined { .. } => {}
        }
        self.step = step;
        Ok(())
    }
}

/// The two AdamW moments.
enum Moments {
    /// One tensor per parameter, written in place by the fused CUDA update.
    Each { m: Vec<Tensor>, v: Vec<Tensor> },
    /// All parameters' moments end to end, in the parameters' order, for the composed update.
    Joined { m: Tensor, v: Tensor },
}

fn total_elements(params: &[(String, Var)]) -> usize {
    params.iter().map(|(_, p)| p.elem_count()).sum()
}

/// `tensors` flattened and joined end to end.
fn joined(tensors: impl Iterator<Item = Tensor>) -> candle_core::Result<Tensor> {
    let flat = tensors.map(|t| t.flatten_all()).collect::<candle_core::Result<Vec<_>>>()?;
    Tensor::cat(&flat, 0)
}

/// `all` (the parameters end to end) cut back into tensors shaped as `params` (views, no copies).
fn split_like(all: &Tensor, params: &[(String, Var)]) -> candle_core::Result<Vec<Tensor>> {
    let mut offset = 0;
    params
        .iter()
        .map(|(_, p)| {
            let n = p.elem_count();
            let part = all.narrow(0, offset, n)?.reshape(p.shape())?;
            offset += n;
            Ok(part)
        })
        .collect()
}

/// A step from [`AdamW::queue_guarded_step`], for [`AdamW::finish_step`].
pub enum QueuedStep {
    /// Queued on the device; its guard's statistics not yet read.
    OnDevice(cuda_optimizer::StepStats),
    /// Already done (the composed path reads the norm before it updates).
    Done(StepOutcome),
}

/// What one [`AdamW::guarded_step`] did.
#[derive(Debug, Clone, Copy)]
pub struct StepOutcome {
    /// The loss it was given, as read back.
    pub loss: f64,
    /// The global gradient norm before clipping.
    pub grad_norm: f64,
    /// False when the loss or the norm was not finite and nothing changed.
    pub applied: bool,
}

/// Global L2 norm of all gradients, reduced on the device and read once.
pub fn grad_norm(grads: &[Tensor]) -> Result<f64> {
    let squares = grads.iter().map(|g| g.sqr()?.sum_all()).collect::<candle_core::Result<Vec<_>>>()?;
    Ok(crate::engine::ops::sum_to_host(&squares)?.sqrt())
}

/// The factor that scales gradients of global norm `norm` to at most `max_norm` (as torch's
/// clip_grad_norm_); 1 when they are within it or there is no limit.
pub fn clip_coefficient(norm: f64, max_norm: Option<f64>) -> f64 {
    match max_norm {
        Some(max) if max / (norm + 1e-6) < 1.0 => max / (norm + 1e-6),
        _ => 1.0,
    }
}
