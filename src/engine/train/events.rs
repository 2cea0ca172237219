//! What a training run reports. The CLI prints these, the studio plots them, `metrics.jsonl` stores them.

use std::path::PathBuf;

/// One event of a training run. Every run ends with exactly one `Finished` or `Failed`.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum TrainEvent {
    Started {
        run_dir: PathBuf,
        config: Box<super::config::TrainConfig>,
        trainable_params: usize,
        total_steps: usize,
        tokens_per_epoch: usize,
        target_tokens_per_epoch: usize,
        train_examples: usize,
        valid_examples: usize,
        truncated_examples: usize,
        /// Step the run starts from (non-zero when resuming).
        start_step: usize,
        /// What a user should know about this start: what preparing the dataset noticed (skipped, cut or
        /// dropped rows, a held-out validation split, a fallback template) and, on resume, a changed dataset or a
        /// forced base model.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        notes: Vec<String>,
    },
    Step {
        step: usize,
        total_steps: usize,
        loss: f64,
        lr: f64,
        grad_norm: f64,
        tokens_per_sec: f64,
        trained_tokens: usize,
        elapsed_secs: f64,
        eta_secs: f64,
        /// A preference step's metrics under TRL's names (absent for SFT).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        preference: Option<super::preference::PreferenceMetrics>,
        /// A GRPO step's metrics under TRL's names (absent for the other methods).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        grpo: Option<Box<super::grpo::GrpoMetrics>>,
    },
    /// A few of the completions a GRPO step sampled, with their rewards (every `grpo.sample_every` steps).
    Samples {
        step: usize,
        samples: Vec<super::grpo::GrpoSample>,
    },
    Eval {
        step: usize,
        val_loss: f64,
        perplexity: f64,
        /// The lowest validation loss of the run so far: this step is the new best checkpoint (saved right
        /// after, and recorded in run.json). Metrics written before this field existed read as false.
        #[serde(default)]
        best: bool,
        /// A preference run's metrics on the validation pairs (its `val_loss` is their loss; `perplexity` that of
        /// the chosen completions).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        preference: Option<super::preference::PreferenceMetrics>,
        /// A GRPO run's validation: the rewards of greedy completions of the validation prompts (its `val_loss` is
        /// minus their mean; `perplexity` is 0).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        grpo: Option<Box<super::grpo::GrpoMetrics>>,
    },
    CheckpointSaved {
        step: usize,
        path: PathBuf,
    },
    /// Checkpoints deleted after the save at `step` to keep `save_total_limit` (the newest N plus the best).
    CheckpointsRemoved {
        step: usize,
        paths: Vec<PathBuf>,
    },
    Paused {
        step: usize,
    },
    Resumed {
        step: usize,
    },
    Finished {
        step: usize,
        final_loss: Option<f64>,
        final_val_loss: Option<f64>,
        /// Stopped by the user (or a signal) before the last step.
        stopped_early: bool,
        elapsed_secs: f64,
        /// The run ended because early stopping's patience ran out (a clean finish, not a user stop).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        early_stop: Option<super::early_stop::EarlyStop>,
    },
    Failed {
        step: usize,
        message: String,
        /// What sort of failure: a write error or a bad setting is not a training problem. Metrics written
        /// before this field existed read as `training`.
        #[serde(default)]
        kind: crate::engine::ErrorKind,
    },
}

impl TrainEvent {
    /// The final event of a run that failed with `error` at `step`.
    pub fn failed(step: usize, error: &crate::engine::Error) -> Self {
        Self::Failed { step, message: error.to_string(), kind: error.kind() }
    }
}

/// Pause / stop requests for a running job, shared between the job and whoever controls it.
#[derive(Debug, Clone, Default)]
pub struct TrainControl {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    pause: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl TrainControl {
    pub fn request_stop(&self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
    }
    pub fn stop_requested(&self) -> bool {
        self.stop.load(std::sync::atomic::Ordering::SeqCst)
    }
    pub fn set_paused(&self, paused: bool) {
        self.pause.store(paused, std::sync::atomic::Ordering::SeqCst);
    }
    pub fn is_paused(&self) -> bool {
        self.pause.load(std::sync::atomic::Ordering::SeqCst)
    }
}
