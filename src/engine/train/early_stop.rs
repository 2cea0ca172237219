//! Early stopping and the best checkpoint, as pure bookkeeping over evaluations: each validation loss either sets a
//! new best (the lowest so far) or not, and counts as an improvement only when it is below the best before it by
//! more than `early_stopping_min_delta`. After `early_stopping_patience` evaluations in a row without improvement the
//! run stops. Both the best and the counter live in [`TrainerState`], so a resumed run continues them exactly.

use super::config::TrainConfig;
use crate::engine::checkpoint::{BestCheckpoint, TrainerState};
use crate::engine::{Error, Result};
use std::path::Path;

/// What one evaluation means for the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    /// This evaluation's loss is the lowest so far: it is the new best checkpoint (save it if not saved yet).
    pub new_best: bool,
    /// Early stopping's patience ran out: the run stops after this evaluation.
    pub stop: bool,
}

/// Why a run stopped early, as its `Finished` event and metrics.jsonl record it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct EarlyStop {
    /// The best checkpoint when the run stopped.
    pub best: Option<BestCheckpoint>,
    /// Evaluations in a row without improvement (at least the patience).
    pub evals_without_improvement: usize,
    pub patience: usize,
    pub min_delta: f64,
}

impl EarlyStop {
    /// One sentence for the CLI and the studio.
    pub fn reason(&self) -> String {
        let n = self.evals_without_improvement;
        let evals = if n == 1 { "1 evaluation".to_string() } else { format!("{n} evaluations in a row") };
        let gain = match self.min_delta > 0.0 {
            true => format!("did not lower it by more than {}", self.min_delta),
            false => "did not lower it".into(),
        };
        let best = self.best.map(|b| format!("; best {:.4} at step {}", b.val_loss, b.step)).unwrap_or_default();
        format!("stopped early: validation loss stopped improving ({evals} {gain}{best}; patience {})", self.patience)
    }
}

/// Fold the validation loss of the evaluation after `step` into `state` (its best and patience counter).
pub fn observe(state: &mut TrainerState, config: &TrainConfig, step: usize, val_loss: f64) -> Verdict {
    let previous = state.best.map(|b| b.val_loss);
    let new_best = previous.is_none_or(|best| val_loss < best);
    let improved = previous.is_none_or(|best| val_loss < best - config.early_stopping_min_delta);
    if new_best {
        state.best = Some(BestCheckpoint { step, val_loss });
    }
    if improved {
        state.evals_without_improvement = 0;
    } else {
        state.evals_without_improvement += 1;
    }
    Verdict { new_best, stop: patience_ran_out(state, config) }
}

/// Whether early stopping is on and `state` has waited its patience out (also true when a run that stopped early is
/// resumed with the same patience: it ends again at once instead of training on).
pub fn patience_ran_out(state: &TrainerState, config: &TrainConfig) -> bool {
    config.early_stopping_patience > 0 && state.evals_without_improvement >= config.early_stopping_patience
}

/// The record of an early stop at `state`.
pub fn early_stop(state: &TrainerState, config: &TrainConfig) -> EarlyStop {
    EarlyStop {
        best: state.best,
        evals_without_improvement: state.evals_without_improvement,
        patience: config.early_stopping_patience,
        min_delta: config.early_stopping_min_delta,
    }
}

/// Early stopping watches the validation loss: refuse it, before any work starts, on a dataset without a validation
/// split (`valid_rows` 0).
pub fn require_validation(config: &TrainConfig, valid_rows: usize, data: &Path) -> Result<()> {
    if config.early_stopping_patience == 0 || valid_rows > 0 {
        return Ok(());
    }
    Err(Error::InvalidSetting(format!(
        "early stopping (`early_stopping_patience` {}, --early-stopping-patience) watches the validation loss, but {} \
         gives no validation rows; add a valid.jsonl beside train.jsonl (or more training rows, a share of which is \
         held out), or set the patience to 0 to train without early stopping",
        config.early_stopping_patience,
        data.display()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::data::DataCursor;

    fn state() -> TrainerState {
        TrainerState::fresh(10, DataCursor { epoch: 0, batch_index: 0, seed: 0 }, 0)
    }

    #[test]
    fn patience_counts_evaluations_that_do_not_beat_the_best_by_min_delta() {
        let config = TrainConfig { early_stopping_patience: 2, early_stopping_min_delta: 0.1, ..Default::default() };
        let mut s = state();
        let v = |s: &mut TrainerState, step, loss| observe(s, &config, step, loss);
        assert_eq!(v(&mut s, 1, 2.0), Verdict { new_best: true, stop: false });
        // Lower, so the new best, but not by more than 0.1: no improvement for patience.
        assert_eq!(v(&mut s, 2, 1.95), Verdict { new_best: true, stop: false });
        assert_eq!((s.best, s.evals_without_improvement), (Some(BestCheckpoint { step: 2, val_loss: 1.95 }), 1));
        assert_eq!(v(&mut s, 3, 1.5), Verdict { new_best: true, stop: false });
        assert_eq!(s.evals_without_improvement, 0);
        assert_eq!(v(&mut s, 4, 1.6), Verdict { new_best: false, stop: false });
        assert_eq!(v(&mut s, 5, 1.5), Verdict { new_best: false, stop: true }, "equal to the best is no gain");
        let reason = early_stop(&s, &config).reason();
        assert_eq!(
            reason,
            "stopped early: validation loss stopped improving (2 evaluations in a row did not lower it by more than \
             0.1; best 1.5000 at step 3; patience 2)"
        );
    }

    #[test]
    fn without_patience_the_best_is_still_kept_and_nothing_stops() {
        let config = TrainConfig::default();
        let mut s = state();
        for (step, loss) in [(1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0)] {
            assert!(!observe(&mut s, &config, step, loss).stop);
        }
        assert_eq!(s.best, Some(BestCheckpoint { step: 1, val_loss: 1.0 }));
        assert!(!patience_ran_out(&s, &config));
    }

    #[test]
    fn patience_needs_validation_rows() {
        let config = TrainConfig { early_stopping_patience: 3, ..Default::default() };
        let err = require_validation(&config, 0, Path::new("data/one.jsonl")).unwrap_err().to_string();
        assert!(err.contains("data/one.jsonl") && err.contains("--early-stopping-patience"), "{err}");
        assert!(require_validation(&config, 5, Path::new("d")).is_ok());
        assert!(require_validation(&TrainConfig::default(), 0, Path::new("d")).is_ok());
    }
}
