//! The training step's forward and backward pass, written out by hand for a Llama-family decoder with LoRA
//! adapters.
//!
//! Candle's autograd is general but costly for this job: every node's gradient starts as a zero tensor that
//! the first contribution is added to (two extra passes and two allocations per node), and it keeps every
//! intermediate of the graph alive. Here the forward pass keeps just what the backward needs (layer.rs), the
//! backward computes input gradients and adapter gradients only (linear.rs: nothing for frozen weights), the
//! vocabulary projection and loss run chunked without materialising the logits (ops::head_nll), layers below
//! the lowest adapter run as plain inference, and the backward stops at the lowest adapter. All of it is
//! Candle tensor ops, so it runs on every device; CPU f32 takes fused kernels.
//!
//! The autograd path (`Transformer::forward_hidden` with `train: true` and `loss::batch_nll_sum`) stays as the
//! reference: tests/training.rs checks these gradients against it and against finite differences.

mod layer;
mod linear;

use crate::engine::data::Batch;
use crate::engine::model::transformer::{attention_mask, Transformer};
use crate::engine::train::loss;
use crate::engine::Result;
use candle_core::{Tensor, TensorId};
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

    fn add(&mut self, param: &Tensor, grad: &Tensor) -> candle_core::Result<()> {
        self.accumulate(param.id(), grad.to_dtype(candle_core::DType::F32)?)
    }

    /// Add another batch's gradients (gradient accumulation).
    pub fn merge(&mut self, other: Gradients) -> candle_core::Result<()> {
        other.by_id.into_iter().try_for_each(|(id, grad)| self.accumulate(id, grad))
    }

    fn accumulate(&mut self, id: TensorId, grad: Tensor) -> candle_core::Result<()> {
        let sum = match self.by_id.remove(&id) {
            Some(previous) => (previous + grad)?,
            None => grad,
        };
        self.by_id.insert(id, sum);
        Ok(())
    }
}

/// Forward and backward of one projection exactly as a training step runs them, with an upstream gradient
/// of ones: (output, input gradient, adapter gradients). For benchmarks.
pub fn linear_forward_backward(
    projection: &crate::engine::model::linear::Linear,
    x: &Tensor,
) -> candle_core::Result<(Tensor, Tensor, Gradients)> {
    let (y, tape) = linear::forward(projection, x, true)?;
    let mut grads = Gradients::default();
    let dx = linear::backward(projection, x, &tape, &y.ones_like()?, &mut grads, true)?;
    let dx = dx.ok_or_else(|| candle_core::Error::Msg("missing input gradient".into()))?;
    Ok((y, dx, grads))
}

/// The runtime option `step_phases` (`--step-phases`) prints each phase of the pass (device synchronised) to stderr: a profile
/// for devices where no profiler runs (the lent GPUs).
struct PhaseTimer {
    device: candle_core::Device,
    last: Option<std::time::Instant>,
    phases: Vec<(&'static str, f64)>,
}

impl PhaseTimer {
    fn new(device: &candle_core::Device) -> Self {
        let enabled = crate::engine::runtime::options().step_phases;
        Self { device: device.clone(), last: enabled.then(std::time::Instant::now), phases: Vec::new() }
    }

    fn mark(&mut self, phase: &'static str) -> candle_core::Result<()> {
        if let Some(last) = self.last {
            self.device.synchronize()?;
            self.phases.push((phase, last.elapsed().as_secs_f64() * 1e3));
            self.last = Some(std::time::Instant::now());
        }
        Ok(())
    }

    fn report(&self) {
        if self.last.is_some() {
            let parts: Vec<String> = self.phases.iter().map(|(name, ms)| format!("{name} {ms:.1} ms")).collect();
            eprintln!("step phases: {}", parts.join(", "));
        }
    }
}

/// One batch's loss and gradients.
pub struct BatchGradients {
    /// Sum over target tokens of their negative log-likelihood.
    pub nll_sum: f64,
    pub target_tokens: usize,
    /// Gradients of `loss_scale * nll_sum`.
    pub grads: Gradients,
}

/// Forward and backward for one batch: the gradients of `loss_scale * nll_sum` for every active adapter.
/// `train` applies adapter dropout.
pub fn loss_and_gradients(model: &Transformer, batch: &Batch, loss_scale: f64, train: bool) -> Result<BatchGradients> {
    let device = model.device();
    let (b, t) = (batch.batch_size, batch.seq_len);
    let (sources, targets) = loss::target_positions(batch);
    let mut grads = Gradients::default();
    if targets.is_empty() {
        return Ok(BatchGradients { nll_sum: 0.0, target_tokens: 0, grads });
    }
    let lowest = model
        .linears()
        .iter()
        .filter(|(_, _, l)| l.adapter.is_some() && l.adapter_enabled)
        .map(|(layer, _, _)| *layer)
        .min()
        .ok_or_else(|| crate::engine::Error::InvalidSetting("the model has no active adapter to train".into()))?;

    let mut timer = PhaseTimer::new(device);
    let hidden_size = model.config.hidden_size;
    let input = Tensor::from_vec(batch.input_ids.clone(), (b, t), device)?;
    let mut x = model.embed(&input, 0)?;
    for index in 0..lowest {
        x = model.layer_forward(index, &x)?;
    }
    let (cos, sin) = model.rotary_slice(0, t)?;
    let first = &model.layers[lowest].self_attn;
    let ctx = layer::SequenceContext {
        batch: b,
        seq_len: t,
        cos,
        sin,
        mask: attention_mask(t, 0, t, first.sliding_window, device)?,
        train,
    };
    let mut x = x.reshape((b * t, hidden_size))?;
    timer.mark("embed + frozen layers")?;
    let mut tapes = Vec::with_capacity(model.layers.len() - lowest);
    for layer in &model.layers[lowest..] {
        let (out, tape) = layer::forward(layer, &x, &ctx)?;
        tapes.push(tape);
        x = out;
    }
    timer.mark("layers forward")?;

    let eps = model.config.rms_norm_eps;
    let norm = model.final_norm_weight();
    let normed = crate::engine::ops::rms_norm(&x, norm, eps, layer::SequenceContext::composed(x.dtype()))?;
    let source_index = Tensor::from_vec(sources, targets.len(), device)?;
    let picked = normed.index_select(&source_index, 0)?;
    let head = crate::engine::ops::head_nll(&picked, model.head_weight(), &targets, Some(loss_scale))?;
    let d_picked = head.grad_hidden.expect("gradient requested");
    let d_normed = normed.zeros_like()?.index_add(&source_index, &d_picked, 0)?;
    let mut d_x = crate::engine::ops::rms_norm_backward(&x, norm, eps, &d_normed)?;
    timer.mark("final norm + head + loss, forward and backward")?;
    // Each layer's tape is dropped as soon as its backward is done.
    while let Some(tape) = tapes.pop() {
        let index = lowest + tapes.len();
        match layer::backward(&model.layers[index], &tape, &d_x, &ctx, &mut grads, index > lowest)? {
            Some(d) => d_x = d,
            None => break,
        }
    }
    timer.mark("layers backward")?;
    timer.report();
    Ok(BatchGradients { nll_sum: head.nll_sum, target_tokens: targets.len(), grads })
}
