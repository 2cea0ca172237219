//! A GRPO batch through the model: the per-token log-probabilities of the completions (at the sampling
//! temperature; the policy's before an update, the reference's), and the forward and backward passes of one
//! optimizer step with the clipped objective.
//!
//! The reference is the base with the adapter switched off: a clone that shares every weight tensor (no second
//! copy of the weights), used only with beta > 0.

use super::batch::Rollout;
use super::objective::{token_term, token_weights, Clip};
use super::settings::GrpoSettings;
use crate::engine::lora;
use crate::engine::model::transformer::Transformer;
use crate::engine::train::backprop::{self, BatchGradients, Pass, TokenWeights};
use crate::engine::train::loss;
use crate::engine::Result;

/// What a GRPO optimizer step measured over its completion tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct GrpoStepMetrics {
    /// The step's loss (the objective as normalised by the loss type).
    pub loss: f64,
    /// Mean KL to the reference per completion token (None with beta = 0).
    pub kl: Option<f64>,
    pub clip_low: f64,
    pub clip_high: f64,
    pub clip_region: f64,
}

/// GRPO's objective for a policy trained on `base`.
#[derive(Debug, Clone)]
pub struct GrpoObjective {
    pub settings: GrpoSettings,
    reference: Option<Transformer>,
    pub pad_id: u32,
}

impl GrpoObjective {
    /// The objective; with beta > 0 the reference is `base` without its adapters.
    pub fn new(settings: GrpoSettings, base: &Transformer, pad_id: u32) -> Self {
        let reference = (settings.beta > 0.0).then(|| {
            let mut reference = base.clone();
            lora::detach_adapters(&mut reference);
            reference
        });
        Self { settings, reference, pad_id }
    }

    fn clip(&self) -> Clip {
        Clip {
            epsilon_low: self.settings.epsilon,
            epsilon_high: self.settings.epsilon_high(),
            beta: self.settings.beta,
        }
    }

    /// Per-token log-probabilities of every completion of `rollout` under `model` (no gradient).
    pub fn token_logps(&self, model: &Transformer, rollout: &Rollout) -> Result<Vec<Vec<f64>>> {
        let mut out: Vec<Vec<f64>> = rollout.completions.iter().map(|c| vec![0.0; c.ids.len()]).collect();
        for range in rollout.micro_ranges() {
            let scored = rollout.collate(range, self.pad_id)?;
            let nll = loss::token_nll_tempered(
                model,
                &scored.batch,
                scored.sources,
                &scored.targets,
                self.settings.temperature,
            )?;
            for ((c, t), v) in scored.owners.into_iter().zip(nll) {
                out[c][t] = -v;
            }
        }
        Ok(out)
    }

    /// The reference's per-token log-probabilities (None with beta = 0).
    pub fn reference_logps(&self, rollout: &Rollout) -> Result<Option<Vec<Vec<f64>>>> {
        self.reference.as_ref().map(|reference| self.token_logps(reference, rollout)).transpose()
    }

    /// Forward and backward over every micro-batch of `rollout`: the step's metrics and the gradients of its loss.
    pub fn loss_and_gradients(
        &self,
        model: &Transformer,
        rollout: &Rollout,
        pass: Pass,
    ) -> Result<(GrpoStepMetrics, crate::engine::model::Gradients)> {
        let weights = token_weights(self.settings.loss, &rollout.micro_lengths(), self.settings.max_new_tokens);
        let clip = self.clip();
        let mut grads = crate::engine::model::Gradients::default();
        let (mut loss, mut kl_sum, mut tokens) = (0.0, 0.0, 0usize);
        let (mut low, mut high) = (0usize, 0usize);
        for (m, range) in rollout.micro_ranges().into_iter().enumerate() {
            let start = range.start;
            let scored = rollout.collate(range, self.pad_id)?;
            let owners = scored.owners.clone();
            let mut weigh = |token_nll: &[f64]| -> Result<Vec<f64>> {
                let mut out = Vec::with_capacity(token_nll.len());
                for (&(c, t), &nll) in owners.iter().zip(token_nll) {
                    let logp = -nll;
                    let old = rollout.old_logps.as_ref().map_or(logp, |o| o[c][t]);
                    let reference = rollout.ref_logps.as_ref().map(|r| r[c][t]);
                    let term = token_term(logp, old, reference, rollout.advantages[c], clip);
                    let w = weights[m][c - start];
                    loss += w * term.loss;
                    kl_sum += term.kl;
                    tokens += 1;
                    low += term.clipped_low as usize;
                    high += term.clipped_high as usize;
                    // d loss / d nll = -w * d term / d logp.
                    out.push(-w * term.d_logp);
                }
                Ok(out)
            };
            let positions = (scored.sources, scored.targets);
            let temperature = self.settings.temperature;
            let weights = TokenWeights::PerToken { weigh: &mut weigh, temperature };
            let BatchGradients { grads: part, .. } =
                backprop::loss_and_gradients_at(model, &scored.batch, positions, weights, pass)?;
            grads.merge(part)?;
        }
        let n = tokens.max(1) as f64;
        let metrics = GrpoStepMetrics {
            loss,
            kl: self.reference.as_ref().map(|_| kl_sum / n),
            clip_low: low as f64 / n,
            clip_high: high as f64 / n,
            clip_region: (low + high) as f64 / n,
        };
        Ok((metrics, grads))
    }
}
