//! The trainer's evaluations: the mean validation loss over target tokens (a preference method's loss and metrics;
//! GRPO's mean reward of greedy completions), recorded in the run's state and reported, with what it means for
//! early stopping and the best checkpoint. In a data-parallel run rank 0 evaluates and every rank takes its loss.

use super::early_stop::{self, Verdict};
use super::recorder::Recorder;
use super::{distributed_share, grpo, validation_loss, TrainEvent, Trainer};
use crate::engine::checkpoint::TrainerState;
use crate::engine::data;
use crate::engine::Result;

impl Trainer<'_> {
    /// The mean validation loss over target tokens, into `state` (its val_loss, best and patience counter), and
    /// what it means for the run (nothing without a validation split).
    pub(super) fn evaluate(&mut self, state: &mut TrainerState, rec: &mut Recorder) -> Result<Verdict> {
        let Some(valid) = self.data.valid.as_ref().filter(|v| !v.examples.is_empty()) else {
            return Ok(Verdict { new_best: false, stop: false });
        };
        let (model, batch_size, batches) = (&self.runner.model, self.config.batch_size, self.config.val_batches);
        if let Some(grpo) = &self.grpo {
            return self.evaluate_grpo(grpo, valid, state, rec);
        }
        let (loss, perplexity, preference) = match &self.runner.preference {
            None => {
                // In a data-parallel run the replicas are equal: the leader's loss is every rank's (and decides
                // early stopping for all).
                let mine = match distributed_share::leads(self.group.as_ref()) {
                    true => Some(validation_loss(model, &valid.examples, batch_size, batches, self.pad_id)?),
                    false => None,
                };
                let device = model.device().clone();
                let shared = match self.group.as_mut() {
                    Some(group) => distributed_share::leader_value(group, &device, mine)?,
                    None => mine,
                };
                let Some(loss) = shared else { return Ok(Verdict { new_best: false, stop: false }) };
                (loss, loss.exp(), None)
            }
            Some(objective) => match objective.split_metrics(model, valid, batch_size, batches, self.pad_id)? {
                Some(m) => (m.loss, m.chosen_perplexity(), Some(m)),
                None => return Ok(Verdict { new_best: false, stop: false }),
            },
        };
        state.val_loss = Some(loss);
        let verdict = early_stop::observe(state, self.config, state.step, loss);
        rec.send(TrainEvent::Eval {
            step: state.step,
            val_loss: loss,
            perplexity,
            best: verdict.new_best,
            preference,
            grpo: None,
        })?;
        Ok(verdict)
    }

    /// GRPO's validation: the mean reward of greedy completions of the validation prompts (its loss is minus that
    /// mean, so the best checkpoint is the one with the highest reward).
    fn evaluate_grpo(
        &self,
        grpo: &grpo::run::GrpoRun,
        valid: &data::PreparedSplit,
        state: &mut TrainerState,
        rec: &mut Recorder,
    ) -> Result<Verdict> {
        let max_prompts = self.config.val_batches * self.config.batch_size;
        let locate = |i: usize| format!("{} (validation prompt {})", self.config.data.display(), i + 1);
        let Some(metrics) = grpo.validate(&self.runner.model, valid, max_prompts, &locate)? else {
            return Ok(Verdict { new_best: false, stop: false });
        };
        // `0 - r`, not `-r`: a reward of 0 is a loss of 0, not -0.
        let loss = 0.0 - metrics.reward_mean;
        state.val_loss = Some(loss);
        let verdict = early_stop::observe(state, self.config, state.step, loss);
        rec.send(TrainEvent::Eval {
            step: state.step,
            val_loss: loss,
            perplexity: 0.0,
            best: verdict.new_best,
            preference: None,
            grpo: Some(Box::new(metrics)),
        })?;
        Ok(verdict)
    }
}
