//! One optimizer step over a list of micro-batches (forward and backward with gradient accumulation, global
//! norm clipping, AdamW), in three parts so that a caller can overlap steps: [`StepRunner::begin`] queues the
//! passes, [`StepRunner::queue_update`] queues the update, [`StepRunner::finish`] reads the step's loss and norm
//! back (on CUDA the one wait of a step). The trainer and the training benchmark begin step N+1 before they
//! finish step N, so the GPU goes from one step's update straight into the next step's forward instead of
//! idling while the host reads a loss, collates the next batch and queues its first layer.
//! [`StepRunner::step`] does the three in a row (the rank explorer, tests).

use super::backprop::{self, Pass};
use super::config::Checkpointing;
use super::grpo::batch::Rollout;
use super::grpo::step::{GrpoObjective, GrpoStepMetrics};
use super::layer_sums::LayerSums;
use super::optimizer::{AdamW, AdamWParams, QueuedStep};
use super::preference::{PreferenceMetrics, PreferenceObjective};
use crate::engine::checkpoint;
use crate::engine::data;
use crate::engine::distributed::Group;
use crate::engine::lora::{self, AdapterParam};
use crate::engine::model::transformer::Transformer;
use crate::engine::ops::Scalar;
use crate::engine::Result;
use candle_core::Tensor;

/// The model being trained and its optimizer. Shared by the trainer, the rank explorer and the training
/// benchmark.
pub struct StepRunner {
    pub model: Transformer,
    pub optimizer: AdamW,
    pub max_grad_norm: Option<f64>,
    /// Base of the per-step dropout seeds, so a resumed run draws the same masks.
    pub seed: u64,
    /// Gradient checkpointing, decided (off unless set: [`StepRunner::set_checkpointing`]; see backprop.rs).
    checkpointing: Checkpointing,
    /// A preference method's loss over batches of pairs (None: SFT, the mean NLL of the target tokens).
    pub preference: Option<PreferenceObjective>,
    /// This process's rank in a data-parallel run (0 otherwise): each rank draws its own dropout masks, and rank 0
    /// draws what a one-device run draws.
    pub rank: usize,
    /// The layer of each optimizer parameter (its order): a data-parallel step sums them layer by layer.
    param_layers: Vec<usize>,
}

/// What a data-parallel rank needs to know of the whole step when it runs only its share of the rows.
#[derive(Debug, Clone, Copy)]
pub struct WholeStep {
    /// The step's target tokens over all ranks (SFT's loss is their mean).
    pub target_tokens: usize,
}

/// A step whose forward and backward passes are queued: its gradients in the optimizer's order and its mean
/// loss, still on the device. Dropping it drops the step (nothing of it is applied).
pub struct BegunStep {
    grads: Vec<Tensor>,
    loss: Scalar,
    measured: Measured,
    /// A data-parallel rank's step: its sums in flight and the gradients they are taken from (`grads` is empty
    /// until [`StepRunner::share_across`]).
    sharing: Option<(LayerSums, crate::engine::model::Gradients)>,
}

/// What a step measured beside its loss.
#[derive(Debug, Clone, Copy, Default)]
struct Measured {
    preference: Option<PreferenceMetrics>,
    grpo: Option<GrpoStepMetrics>,
}

/// A step whose update is queued as well, for [`StepRunner::finish`].
pub struct QueuedUpdate(QueuedStep, Measured);

/// A finished step as read back.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepReport {
    /// The step's loss (SFT: mean per target token); NaN when a finite loss came with a non-finite gradient norm
    /// (the update was skipped).
    pub loss: f64,
    /// The gradient norm before clipping.
    pub grad_norm: f64,
    /// A preference step's metrics over all its pairs.
    pub preference: Option<PreferenceMetrics>,
    /// A GRPO step's objective terms over its completion tokens.
    pub grpo: Option<GrpoStepMetrics>,
}

impl StepRunner {
    /// Wrap a model whose adapters are `params`.
    pub fn new(
        model: Transformer,
        params: &[AdapterParam],
        weight_decay: f64,
        max_grad_norm: Option<f64>,
        seed: u64,
    ) -> Result<Self> {
        let named: Vec<(String, candle_core::Var)> = params
            .iter()
            .flat_map(|p| {
                let prefix = checkpoint::peft_prefix(p.layer, p.module);
                let magnitude = p.magnitude.as_ref().map(|m| (checkpoint::peft_magnitude_name(&prefix), m.clone()));
                [(format!("{prefix}.lora_A"), p.a.clone()), (format!("{prefix}.lora_B"), p.b.clone())]
                    .into_iter()
                    .chain(magnitude)
            })
            .collect();
        let param_layers =
            params.iter().flat_map(|p| [p.layer; 2].into_iter().chain(p.magnitude.as_ref().map(|_| p.layer))).collect();
        let optimizer = AdamW::new(named, AdamWParams { weight_decay, ..Default::default() })?;
        Ok(Self {
            model,
            optimizer,
            max_grad_norm,
            seed,
            checkpointing: Checkpointing::Off,
            preference: None,
            rank: 0,
            param_layers,
        })
    }

    /// Returns (mean loss per target token over all micro-batches, gradient norm before clipping). A
    /// non-finite loss or norm skips the update and is returned as is.
    pub fn step(&mut self, batches: &[data::Batch], lr: f64) -> Result<(f64, f64)> {
        let begun = self.begin(batches)?;
        let queued = self.queue_update(begun, lr)?;
        self.finish(queued)
    }

    /// Queue the forward and backward passes of a step over `batches`, on the weights as the updates queued so
    /// far leave them. Its dropout masks are seeded by the count of updates queued, so a step begun before the
    /// previous one is finished draws what it would have drawn after (that step being applied; a skipped update
    /// ends a run).
    pub fn begin(&mut self, batches: &[data::Batch]) -> Result<BegunStep> {
        self.begin_share(batches, None, None)
    }

    /// [`StepRunner::begin`] on one rank's share of a data-parallel step's rows (`batches`, possibly none): the
    /// loss is normalised by the whole step's target tokens, so the ranks' gradients and losses add up to the whole
    /// step's ([`StepRunner::share_across`]). SFT only. With `group`, the last micro-batch's backward hands each
    /// layer's gradients to the sum over the ranks as soon as they are final (layer_sums.rs).
    pub fn begin_share(
        &mut self,
        batches: &[data::Batch],
        whole: Option<WholeStep>,
        group: Option<&mut Group>,
    ) -> Result<BegunStep> {
        lora::seed_dropout(&self.model, self.dropout_seed(), self.optimizer.step);
        let pass = self.pass();
        let mut losses = Vec::with_capacity(batches.len());
        let mut accumulated = crate::engine::model::Gradients::default();
        let mut preference = Vec::new();
        let loss_scale = match &self.preference {
            None => {
                let target_tokens = match whole {
                    Some(whole) => whole.target_tokens,
                    None => batches.iter().map(|b| b.target_tokens).sum(),
                };
                let scale = 1.0 / target_tokens.max(1) as f64;
                let mut sharing = group.map(|g| (LayerSums::new(g, self.optimizer.params(), &self.param_layers), g));
                for (i, batch) in batches.iter().enumerate() {
                    let out = match sharing.as_mut() {
                        Some((sums, group)) if i + 1 == batches.len() => {
                            let mut after = |layer, grads: &_| sums.after_layer(group, layer, grads);
                            let onto = (std::mem::take(&mut accumulated), &mut after as backprop::AfterLayer<'_>);
                            let out = backprop::sft_loss_and_gradients_onto(&self.model, batch, scale, pass, onto)?;
                            accumulated = out.grads;
                            out.nll_sum
                        }
                        _ => {
                            let out = backprop::sft_loss_and_gradients(&self.model, batch, scale, pass)?;
                            accumulated.merge(out.grads)?;
                            out.nll_sum
                        }
                    };
                    losses.push(out);
                }
                if let Some((sums, _)) = sharing {
                    let loss = Scalar::scaled_sum(&losses, scale)?;
                    let measured = Measured::default();
                    return Ok(BegunStep { grads: Vec::new(), loss, measured, sharing: Some((sums, accumulated)) });
                }
                scale
            }
            // The step's loss is the mean over all its pairs: each micro-batch's mean weighs by its share of them.
            Some(objective) => {
                let pairs: usize = batches.iter().map(|b| b.batch_size / 2).sum();
                for batch in batches {
                    let share = (batch.batch_size / 2) as f64 / pairs.max(1) as f64;
                    let (metrics, out) = objective.loss_and_gradients(&self.model, batch, share, pass)?;
                    losses.push(Scalar::Host(metrics.loss * share));
                    preference.push(metrics);
                    accumulated.merge(out.grads)?;
                }
                1.0
            }
        };
        let grads = self.ordered_grads(&accumulated)?;
        let loss = Scalar::scaled_sum(&losses, loss_scale)?;
        let measured = Measured { preference: PreferenceMetrics::combine(&preference), grpo: None };
        Ok(BegunStep { grads, loss, measured, sharing: None })
    }

    /// Queue the forward and backward passes of a GRPO step on the completions of `rollout` (see
    /// [`StepRunner::begin`] for the dropout seeds).
    pub fn begin_grpo(&mut self, objective: &GrpoObjective, rollout: &Rollout) -> Result<BegunStep> {
        lora::seed_dropout(&self.model, self.dropout_seed(), self.optimizer.step);
        let pass = self.pass();
        let (metrics, accumulated) = objective.loss_and_gradients(&self.model, rollout, pass)?;
        let grads = self.ordered_grads(&accumulated)?;
        Ok(BegunStep {
            grads,
            loss: Scalar::Host(metrics.loss),
            measured: Measured { grpo: Some(metrics), ..Default::default() },
            sharing: None,
        })
    }

    /// Gradient checkpointing as `setting` says (on, off or offload; `auto` must have been decided first).
    pub fn set_checkpointing(&mut self, setting: Checkpointing) -> Result<()> {
        setting.enabled()?;
        self.checkpointing = setting;
        Ok(())
    }

    /// How this runner's training passes run: dropout on, checkpointing as set.
    fn pass(&self) -> Pass {
        Pass { dropout: true, checkpointing: self.checkpointing.recomputes(), offload: self.checkpointing.offloads() }
    }

    /// The seed of this rank's dropout masks (rank 0's is the run's seed).
    fn dropout_seed(&self) -> u64 {
        self.seed.wrapping_add((self.rank as u64).wrapping_mul(0xD1B5_4A32_D192_ED03))
    }

    /// Sum a begun step's gradients and loss over the ranks of a data-parallel run, each of which began its share
    /// of the step's rows ([`StepRunner::begin_share`]): afterwards every rank holds the whole step's gradients and
    /// loss and queues the same update. `votes` are summed with them (the leader's stop), and returned.
    pub fn share_across(&self, group: &mut Group, begun: BegunStep, votes: &[f32]) -> Result<(BegunStep, Tensor)> {
        let BegunStep { loss, measured, sharing, .. } = begun;
        let (sums, accumulated) = sharing.ok_or_else(|| {
            crate::engine::Error::Distributed("a step begun for one device cannot be summed over ranks".into())
        })?;
        let device = self.model.device();
        let tail = [loss.on_device(device)?, Tensor::new(votes, device)?];
        let (grads, mut tail) = sums.finish(group, &accumulated, &tail)?;
        let (Some(votes), Some(loss)) = (tail.pop(), tail.pop()) else {
            return Err(crate::engine::Error::Distributed("the sums came back short".into()));
        };
        Ok((BegunStep { grads, loss: Scalar::Device(loss), measured, sharing: None }, votes))
    }

    /// The gradients in the optimizer's order (zeros for a parameter the passes did not reach).
    fn ordered_grads(&self, accumulated: &crate::engine::model::Gradients) -> Result<Vec<Tensor>> {
        let grads = self.optimizer.params().iter().map(|(_, v)| accumulated.get_or_zeros(v.as_tensor()));
        Ok(grads.collect::<candle_core::Result<_>>()?)
    }

    /// Queue the clipped AdamW update of a begun step at learning rate `lr`. Its gradients go here, while the
    /// GPU still runs the step (stream-ordered frees, behind the update): freed after the read, their ~70
    /// frees were a quarter of a millisecond of idle GPU between steps at 1B. Off CUDA the update is done here.
    pub fn queue_update(&mut self, begun: BegunStep, lr: f64) -> Result<QueuedUpdate> {
        let BegunStep { grads, loss, measured, sharing } = begun;
        if sharing.is_some() {
            return Err(crate::engine::Error::Distributed("a rank's step was updated before its sum".into()));
        }
        // The update changes the DoRA norms that inference keeps.
        lora::forget_dora_factors(&self.model);
        Ok(QueuedUpdate(self.optimizer.queue_guarded_step(&grads, lr, self.max_grad_norm, &loss)?, measured))
    }

    /// Read a queued step back: (mean loss per target token, gradient norm before clipping); the loss is NaN
    /// when a finite loss came with a non-finite norm (the update was skipped).
    pub fn finish(&mut self, queued: QueuedUpdate) -> Result<(f64, f64)> {
        let report = self.finish_report(queued)?;
        Ok((report.loss, report.grad_norm))
    }

    /// [`StepRunner::finish`], with a preference step's metrics.
    pub fn finish_report(&mut self, queued: QueuedUpdate) -> Result<StepReport> {
        let QueuedUpdate(queued, measured) = queued;
        let outcome = self.optimizer.finish_step(queued)?;
        let loss = if outcome.applied || !outcome.loss.is_finite() { outcome.loss } else { f64::NAN };
        Ok(StepReport { loss, grad_norm: outcome.grad_norm, preference: measured.preference, grpo: measured.grpo })
    }
}
