//! The training step's forward and backward pass over the whole model, written by hand.
//!
//! Candle's autograd is general but costly for this job: every node's gradient starts as a zero tensor that
//! the first contribution is added to (two extra passes and two allocations per node), and it keeps every
//! intermediate of the graph alive. Here each block's training forward keeps just what its backward needs
//! and its backward computes input and adapter gradients only (the blocks own that math: model/linear.rs,
//! attention.rs, mlp.rs, decoder_layer.rs). This file orders them: layers below the lowest adapter run as
//! plain inference, the head and loss run chunked without materialising the logits (`ops::head_nll`), the
//! backward stops at the lowest adapter, and each layer's tape is dropped as soon as it is used.
//!
//! Gradient checkpointing keeps only each layer's input through the forward pass and runs the layer's
//! training forward again just before its backward (one more forward per step, a layer's activations instead
//! of all of them). Dropout masks come from a shared seeded counter: the recompute puts the counter back where
//! it stood before the layer's first forward, so it draws the same masks and gives the same gradients. With
//! `offload` the kept inputs wait in pinned host memory on a CUDA GPU (`ops::Offloader`): each is copied out while
//! the layers above run forward and back while the layer above it runs backward.
//!
//! The autograd reference these gradients are checked against lives in the tests (tests/common/reference.rs),
//! with finite differences.

use crate::engine::data::Batch;
use crate::engine::lora;
use crate::engine::model::attention::AttentionResult;
use crate::engine::model::decoder_layer::LayerTape;
use crate::engine::model::linear::{InputGrad, Linear};
use crate::engine::model::transformer::Transformer;
use crate::engine::model::Gradients;
use crate::engine::ops;
use crate::engine::train::loss;
use crate::engine::Result;
use candle_core::Tensor;

/// Forward and backward of one projection exactly as a training step runs them, with an upstream gradient
/// of ones: (output, input gradient, adapter gradients). For benchmarks.
pub fn linear_forward_backward(projection: &Linear, x: &Tensor) -> candle_core::Result<(Tensor, Tensor, Gradients)> {
    let (y, tape) = projection.forward_train(x, true)?;
    let mut grads = Gradients::default();
    let dx = projection.backward(&tape, &y.ones_like()?, &mut grads, InputGrad::New)?;
    let dx = dx.ok_or_else(|| candle_core::Error::Msg("missing input gradient".into()))?;
    Ok((y, dx, grads))
}

/// The runtime option `step_phases` (`--step-phases`) prints each phase of the pass (device synchronised) to
/// stderr: a profile for devices where no profiler runs (the lent GPUs).
struct PhaseTimer {
    device: candle_core::Device,
    last: Option<std::time::Instant>,
    /// (phase, milliseconds until the host had queued its work, milliseconds until the device finished it).
    phases: Vec<(&'static str, f64, f64)>,
}

impl PhaseTimer {
    fn new(device: &candle_core::Device) -> Self {
        let enabled = crate::engine::runtime::options().step_phases;
        Self { device: device.clone(), last: enabled.then(std::time::Instant::now), phases: Vec::new() }
    }

    fn mark(&mut self, phase: &'static str) -> candle_core::Result<()> {
        if let Some(last) = self.last {
            let queued = last.elapsed().as_secs_f64() * 1e3;
            self.device.synchronize()?;
            self.phases.push((phase, queued, last.elapsed().as_secs_f64() * 1e3));
            self.last = Some(std::time::Instant::now());
        }
        Ok(())
    }

    /// Each phase's time, and how much of it the host took to queue the work: a phase whose host time is close
    /// to its whole time is bound by launches and host work, not by the device.
    fn report(&self) {
        if self.last.is_some() {
            let parts: Vec<String> =
                self.phases.iter().map(|(name, host, ms)| format!("{name} {ms:.1} ms (host {host:.1})")).collect();
            eprintln!("step phases: {}", parts.join(", "));
        }
    }
}

/// One batch's loss and gradients.
pub struct BatchGradients {
    /// Sum over target tokens of their negative log-likelihood (on the device on CUDA: see [`ops::Scalar`]).
    pub nll_sum: ops::Scalar,
    pub target_tokens: usize,
    /// Gradients of `loss_scale * nll_sum`.
    pub grads: Gradients,
}

/// The lowest layer holding an active adapter: where the backward pass can stop.
fn lowest_adapted_layer(model: &Transformer) -> Result<usize> {
    model
        .linears()
        .iter()
        .filter(|(_, _, l)| l.has_active_adapter())
        .map(|(layer, _, _)| *layer)
        .min()
        .ok_or_else(|| crate::engine::Error::InvalidSetting("the model has no active adapter to train".into()))
}

/// Forward and backward for one batch: the gradients of `loss_scale * nll_sum` for every active adapter.
/// `dropout` applies adapter dropout. Every activation is kept (no checkpointing).
pub fn loss_and_gradients(
    model: &Transformer,
    batch: &Batch,
    loss_scale: f64,
    dropout: bool,
) -> Result<BatchGradients> {
    loss_and_gradients_with(model, batch, loss_scale, dropout, false)
}

/// What the forward pass keeps of one trained layer for its backward.
enum Saved {
    /// Every activation the backward needs.
    Tape(Box<LayerTape>),
    /// Checkpointing: the layer's input (on the device or in host memory), where the dropout counter stood before
    /// its forward, and, when the input is offloaded, the fused attention's output and logsumexp beside it (the
    /// recompute then skips the attention).
    Input { x: ops::Parked, attention: Option<[ops::Parked; 2]>, dropout_counter: Option<u64> },
}

/// What checkpointing keeps of a layer whose forward recorded `tape`: its input, parked by `offloader`, and where
/// the input leaves the device, the fused attention's result too while the `layers` trained layers' results fit in
/// host memory (the recompute then skips the attention: host memory for device time).
fn keep_input(
    offloader: &mut ops::Offloader,
    tape: &LayerTape,
    dropout_counter: Option<u64>,
    layers: usize,
) -> Result<Saved> {
    let missing = |_| candle_core::Error::Msg("the offloader kept another number of tensors than it was given".into());
    let bytes = |t: &Tensor| (t.elem_count() * t.dtype().size_in_bytes()) as u64;
    let parked_attention = tape
        .attention_result()
        .filter(|r| offloader.parks_attention(bytes(tape.input()), bytes(&r.out) + bytes(&r.lse), layers as u64));
    let (x, attention) = match parked_attention {
        Some(r) => {
            let [x, out, lse]: [ops::Parked; 3] =
                offloader.park(&[tape.input(), &r.out, &r.lse])?.try_into().map_err(missing)?;
            (x, Some([out, lse]))
        }
        None => {
            let [x]: [ops::Parked; 1] = offloader.park(&[tape.input()])?.try_into().map_err(missing)?;
            (x, None)
        }
    };
    Ok(Saved::Input { x, attention, dropout_counter })
}

/// Start bringing back what checkpointing kept of a layer (nothing to do for a tape or a resident input).
fn prefetch(offloader: &mut ops::Offloader, saved: &mut Saved) -> Result<()> {
    if let Saved::Input { x, attention, .. } = saved {
        offloader.prefetch(x)?;
        for parked in attention.iter_mut().flatten() {
            offloader.prefetch(parked)?;
        }
    }
    Ok(())
}

/// [`loss_and_gradients`], with gradient checkpointing when `checkpointing` is set: the same losses and
/// gradients with one layer's activations alive at a time.
pub fn loss_and_gradients_with(
    model: &Transformer,
    batch: &Batch,
    loss_scale: f64,
    dropout: bool,
    checkpointing: bool,
) -> Result<BatchGradients> {
    sft_loss_and_gradients(model, batch, loss_scale, Pass { dropout, checkpointing, offload: false })
}

/// The SFT loss of one batch (every target token weighed `loss_scale`) and its gradients, the pass run as `pass` says.
pub fn sft_loss_and_gradients(
    model: &Transformer,
    batch: &Batch,
    loss_scale: f64,
    pass: Pass,
) -> Result<BatchGradients> {
    let (sources, targets) = loss::target_positions(batch);
    loss_and_gradients_at(model, batch, (sources, targets), TokenWeights::Uniform(loss_scale), pass)
}

/// How the loss weighs the NLL of each scored token.
pub enum TokenWeights<'a> {
    /// Every token counts `scale` times (SFT: the mean NLL when `scale` is one over the target count). The
    /// tokens' NLLs are never read back to the host.
    Uniform(f64),
    /// The loss is some function of the tokens' NLLs (a preference or GRPO loss): given them in the order they
    /// were scored, `weigh` returns d loss / d NLL for each. The NLLs are those of the logits divided by
    /// `temperature` (1 for the preference losses; GRPO scores at its sampling temperature, as TRL does).
    PerToken { weigh: &'a mut dyn FnMut(&[f64]) -> Result<Vec<f64>>, temperature: f64 },
}

/// How a training pass runs: adapter dropout, gradient checkpointing, and where checkpointing keeps the layer inputs.
#[derive(Debug, Clone, Copy, Default)]
pub struct Pass {
    pub dropout: bool,
    pub checkpointing: bool,
    /// With checkpointing: the kept layer inputs wait in host memory where the device offloads (`ops::Offloader`).
    pub offload: bool,
}

/// Forward and backward for one batch, scoring the tokens `targets` from the hidden states at the flat positions
/// `sources` (row * seq_len + j) and weighing their NLLs as `weights` says: the gradients of that loss for every
/// active adapter. `nll_sum` is the scored tokens' NLL sum.
pub fn loss_and_gradients_at(
    model: &Transformer,
    batch: &Batch,
    scored: (Vec<u32>, Vec<u32>),
    weights: TokenWeights<'_>,
    pass: Pass,
) -> Result<BatchGradients> {
    loss_and_gradients_onto(model, batch, scored, weights, pass, (Gradients::default(), &mut |_, _| Ok(())))
}

/// What a layer's backward is followed by: given the layer's index and the gradients so far, in which that layer's
/// adapters have their last contribution of the pass (a data-parallel rank starts summing them there).
pub type AfterLayer<'a> = &'a mut dyn FnMut(usize, &Gradients) -> Result<()>;

/// The SFT pass of [`sft_loss_and_gradients`], its gradients added onto `grads` (the step's earlier micro-batches),
/// with `after_layer` called as each layer's backward is done (see [`AfterLayer`]).
pub fn sft_loss_and_gradients_onto(
    model: &Transformer,
    batch: &Batch,
    loss_scale: f64,
    pass: Pass,
    onto: (Gradients, AfterLayer<'_>),
) -> Result<BatchGradients> {
    let scored = loss::target_positions(batch);
    loss_and_gradients_onto(model, batch, scored, TokenWeights::Uniform(loss_scale), pass, onto)
}

/// [`loss_and_gradients_at`], its gradients added onto `grads`, `after_layer` called after each layer's backward.
fn loss_and_gradients_onto(
    model: &Transformer,
    batch: &Batch,
    (sources, targets): (Vec<u32>, Vec<u32>),
    weights: TokenWeights<'_>,
    pass: Pass,
    (mut grads, after_layer): (Gradients, AfterLayer<'_>),
) -> Result<BatchGradients> {
    let Pass { dropout, checkpointing, offload } = pass;
    let device = model.device();
    let (b, t) = (batch.batch_size, batch.seq_len);
    if targets.is_empty() {
        return Ok(BatchGradients { nll_sum: ops::Scalar::Host(0.0), target_tokens: 0, grads });
    }
    let lowest = lowest_adapted_layer(model)?;
    // The adapters in the compute dtype for this pass, cast together (emptied when it returns).
    let _copies = lora::ComputeCopies::prepare(model, model.dtype())?;
    let mut timer = PhaseTimer::new(device);
    let input = Tensor::from_vec(batch.input_ids.clone(), (b, t), device)?;
    let ctx = model.sequence_context(b, t, dropout, batch.row_starts.as_deref())?;
    let mut x = model.embed(&input, 0)?;
    // Each layer's output is a pair (x, pending) summed by the next layer in one pass with its input norm.
    let mut pending: Option<Tensor> = None;
    if ctx.packed.is_some() {
        // Packed rows need the training forward's attention even where nothing below is trained; the tapes
        // of the frozen layers are dropped at once.
        x = x.reshape((b * t, model.config.hidden_size))?;
        for layer in &model.layers[..lowest] {
            let (mid, delta, _) = layer.forward_train(&x, pending.as_ref(), &ctx)?;
            (x, pending) = (mid, Some(delta));
        }
    } else {
        for index in 0..lowest {
            x = model.layer_forward(index, &x)?;
        }
    }
    let mut x = x.reshape((b * t, model.config.hidden_size))?;
    timer.mark("embed + frozen layers")?;
    let mut tapes = Vec::with_capacity(model.layers.len() - lowest);
    let mut offloader = ops::Offloader::new(device, checkpointing && offload)?;
    for layer in &model.layers[lowest..] {
        let dropout_counter = lora::dropout_counter(model);
        let (mid, delta, tape) = layer.forward_train(&x, pending.as_ref(), &ctx)?;
        tapes.push(if checkpointing {
            keep_input(&mut offloader, &tape, dropout_counter, model.layers.len() - lowest)?
        } else {
            Saved::Tape(Box::new(tape))
        });
        (x, pending) = (mid, Some(delta));
    }
    let counter_after_forward = lora::dropout_counter(model);
    // The top layer's kept tensors come back while the head and the loss run.
    if let Some(top) = tapes.last_mut() {
        prefetch(&mut offloader, top)?;
    }
    timer.mark("layers forward")?;

    let (x, normed) = model.final_norm_after(&x, pending.as_ref())?;
    let source_index = Tensor::from_slice(&sources, targets.len(), device)?;
    let picked = ops::gather_rows(&normed, &source_index)?;
    let (head, d_picked) = head_loss(model, &picked, &targets, weights)?;
    let d_normed = ops::scatter_rows(&d_picked, &source_index, &sources, normed.dim(0)?)?;
    let mut d_x = model.final_norm_backward(&x, &d_normed)?;
    // The last copy out is long done by now.
    offloader.settle()?;
    timer.mark("final norm + head + loss, forward and backward")?;
    // Each layer's tape is dropped as soon as its backward is done.
    while let Some(saved) = tapes.pop() {
        let index = lowest + tapes.len();
        let layer = &model.layers[index];
        let tape = match saved {
            Saved::Tape(tape) => *tape,
            Saved::Input { x, attention, dropout_counter } => {
                let x = offloader.fetch(x)?;
                let known = match attention {
                    Some([out, lse]) => {
                        Some(AttentionResult { out: offloader.fetch(out)?, lse: offloader.fetch(lse)? })
                    }
                    None => None,
                };
                // The layer below comes back while this one is recomputed and differentiated.
                if let Some(below) = tapes.last_mut() {
                    prefetch(&mut offloader, below)?;
                }
                if let Some(counter) = dropout_counter {
                    lora::set_dropout_counter(model, counter);
                }
                layer.recompute(&x, known, &ctx)?
            }
        };
        let below = layer.backward(&tape, &d_x, &ctx, &mut grads, index > lowest)?;
        after_layer(index, &grads)?;
        match below {
            Some(d) => d_x = d,
            None => break,
        }
    }
    // The next micro-batch of the step draws its masks where an uncheckpointed pass would.
    if let Some(counter) = counter_after_forward {
        lora::set_dropout_counter(model, counter);
    }
    timer.mark("layers backward")?;
    timer.report();
    Ok(BatchGradients { nll_sum: head.nll_sum, target_tokens: targets.len(), grads })
}

/// The head's loss over `targets` and its gradient with respect to the scored hidden states, weighed as `weights`
/// says. Per-token weights scale the unweighted gradient's rows: d NLL_i / d hidden_i only touches row i.
fn head_loss(
    model: &Transformer,
    picked: &Tensor,
    targets: &[u32],
    weights: TokenWeights<'_>,
) -> Result<(ops::HeadLoss, Tensor)> {
    let missing = || candle_core::Error::Msg("head loss without gradient".into());
    match weights {
        TokenWeights::Uniform(scale) => {
            let mut head = model.head_nll(picked, targets, Some(scale))?;
            let d_picked = head.grad_hidden.take().ok_or_else(missing)?;
            Ok((head, d_picked))
        }
        TokenWeights::PerToken { weigh, temperature } => {
            // logits / T is the head of hidden / T; the chain rule puts 1 / T on the gradient.
            let tempered = loss::temper(picked, temperature)?;
            let mut token_nll = Vec::with_capacity(targets.len());
            let mut head = model.head().head_nll(&tempered, targets, Some(1.0), Some(&mut token_nll))?;
            let per_token = weigh(&token_nll)?;
            if per_token.len() != targets.len() {
                return Err(crate::engine::Error::Training(format!(
                    "the loss weighed {} tokens but {} were scored",
                    per_token.len(),
                    targets.len()
                )));
            }
            let column: Vec<f32> = per_token.iter().map(|&w| (w / temperature) as f32).collect();
            let column = Tensor::from_vec(column, (targets.len(), 1), picked.device())?.to_dtype(picked.dtype())?;
            let d_picked = head.grad_hidden.take().ok_or_else(missing)?.broadcast_mul(&column)?;
            Ok((head, d_picked))
        }
    }
}
