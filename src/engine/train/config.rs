//! Training settings: LoRA shape and optimisation, serialisable to `run.json` and readable from a TOML file.

use crate::engine::device::{DTypeChoice, DeviceChoice};
use crate::engine::{Error, Result};
use std::path::PathBuf;

pub use crate::engine::lora::{LoraSettings, Target, Targets};

/// Learning-rate schedule after warmup.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Schedule {
    Constant,
    Linear,
    #[default]
    Cosine,
}

impl std::str::FromStr for Schedule {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "constant" => Ok(Self::Constant),
            "linear" => Ok(Self::Linear),
            "cosine" => Ok(Self::Cosine),
            other => Err(format!("unknown schedule `{other}`; use constant, linear or cosine")),
        }
    }
}

/// Everything a training run needs. Saved verbatim in `run.json`.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct TrainConfig {
    pub model: PathBuf,
    pub data: PathBuf,
    /// Runs folder; the run lives in `out/<run_name>/`.
    pub out: PathBuf,
    pub run_name: Option<String>,
    pub lora: LoraSettings,
    /// Optimizer steps; when None, `epochs` decides.
    pub iters: Option<usize>,
    pub epochs: Option<f64>,
    pub batch_size: usize,
    pub seq_len: usize,
    pub lr: f64,
    pub schedule: Schedule,
    pub warmup: usize,
    pub grad_accum: usize,
    pub max_grad_norm: Option<f64>,
    pub weight_decay: f64,
    /// Evaluate every N steps (0: only at the end).
    pub val_every: usize,
    /// How many validation batches an evaluation uses (0: all).
    pub val_batches: usize,
    /// Save a checkpoint every N steps (0: only at the end).
    pub save_every: usize,
    pub seed: u64,
    pub device: DeviceChoice,
    pub dtype: DTypeChoice,
    /// How the base model's projections are held (QLoRA: `keep`, `q4k`, ...); recorded so a resume loads
    /// the same base.
    pub quantize: crate::engine::model::BaseQuant,
    pub skip_invalid_rows: bool,
    pub train_on_prompt: bool,
    /// Continue from this checkpoint folder.
    pub resume: Option<PathBuf>,
}

impl Default for TrainConfig {
    fn default() -> Self {
        Self {
            model: PathBuf::new(),
            data: PathBuf::new(),
            out: PathBuf::from("runs"),
            run_name: None,
            lora: LoraSettings::default(),
            iters: Some(100),
            epochs: None,
            batch_size: 4,
            seq_len: 512,
            lr: 2e-4,
            schedule: Schedule::Cosine,
            warmup: 10,
            grad_accum: 1,
            max_grad_norm: Some(1.0),
            weight_decay: 0.0,
            val_every: 50,
            val_batches: 0,
            save_every: 100,
            seed: 42,
            device: DeviceChoice::Auto,
            dtype: DTypeChoice::Auto,
            quantize: crate::engine::model::BaseQuant::None,
            skip_invalid_rows: false,
            train_on_prompt: false,
            resume: None,
        }
    }
}

/// What settings are checked against once the model is known (see [`TrainConfig::validate_for_model`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelLimits {
    /// Longest sequence the model was trained for (`max_position_embeddings`).
    pub context_length: usize,
    pub num_layers: usize,
}

impl ModelLimits {
    pub fn of(config: &crate::engine::model::ModelConfig) -> Self {
        Self { context_length: config.max_position_embeddings, num_layers: config.num_layers }
    }
}

/// Most epochs a run may ask for: beyond this a typo, not a plan (a run would never end).
pub const MAX_EPOCHS: f64 = 100_000.0;

impl TrainConfig {
    /// The one settings check every front end runs before any work starts: [`Self::validate`] plus what needs
    /// the model (the sequence length must fit its context; `layers` cannot exceed its layer count).
    pub fn validate_for_model(&self, model: ModelLimits) -> Result<()> {
        self.validate()?;
        if self.seq_len > model.context_length {
            return Err(Error::InvalidSetting(format!(
                "seq_len {} is longer than the model's context of {} tokens; set seq_len to at most {}",
                self.seq_len, model.context_length, model.context_length
            )));
        }
        if let Some(n) = self.lora.layers.filter(|&n| n > model.num_layers) {
            return Err(Error::InvalidSetting(format!(
                "`layers` asks to adapt the last {n} layers but the model has only {}; set it to at most {} (or unset \
                 it for all layers)",
                model.num_layers, model.num_layers
            )));
        }
        Ok(())
    }

    /// Reject combinations that cannot work, with a reason a user can act on.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::InvalidSetting(m));
        if self.lora.rank == 0 {
            return bad("LoRA rank must be at least 1".into());
        }
        if !(self.lora.alpha > 0.0) {
            return bad("LoRA alpha must be positive".into());
        }
        if !(0.0..1.0).contains(&self.lora.dropout) {
            return bad(format!("dropout {} must be in [0, 1)", self.lora.dropout));
        }
        if self.lora.layers == Some(0) {
            return bad("`layers` must be at least 1 (or unset for all layers)".into());
        }
        if self.lora.targets.is_empty() {
            return bad("choose at least one LoRA target module".into());
        }
        if self.batch_size == 0 || self.grad_accum == 0 {
            return bad("batch size and gradient accumulation must be at least 1".into());
        }
        if self.seq_len < 8 {
            return bad(format!("sequence length {} is too short (min 8)", self.seq_len));
        }
        if !(self.lr > 0.0) || !self.lr.is_finite() {
            return bad(format!("learning rate {} must be a positive number", self.lr));
        }
        match (self.iters, self.epochs) {
            (Some(0), _) => return bad("iterations must be at least 1".into()),
            (None, None) => return bad("set either iterations or epochs".into()),
            (None, Some(e)) if !(e > 0.0) => return bad(format!("epochs {e} must be positive")),
            (None, Some(e)) if e > MAX_EPOCHS => return bad(format!("epochs {e} must be at most {MAX_EPOCHS}")),
            _ => {}
        }
        if !self.weight_decay.is_finite() || self.weight_decay < 0.0 {
            return bad(format!("weight decay {} must be a number of at least 0", self.weight_decay));
        }
        if let Some(n) = self.max_grad_norm {
            if !(n > 0.0) {
                return bad("max grad norm must be positive (or unset)".into());
            }
        }
        Ok(())
    }

    /// Read settings from a TOML file (same field names as run.json).
    pub fn from_toml_file(path: &std::path::Path) -> Result<Self> {
        let text = crate::engine::error::read_to_string(path)?;
        toml::from_str(&text).map_err(|e| Error::InvalidSetting(format!("{}: {e}", path.display())))
    }
}

/// Learning rate at `step` (0-based) of `total` with linear warmup.
pub fn lr_at(cfg: &TrainConfig, step: usize, total: usize) -> f64 {
    if cfg.warmup > 0 && step < cfg.warmup {
        return cfg.lr * (step + 1) as f64 / cfg.warmup as f64;
    }
    let decay_steps = total.saturating_sub(cfg.warmup).max(1) as f64;
    let progress = ((step - cfg.warmup.min(step)) as f64 / decay_steps).clamp(0.0, 1.0);
    match cfg.schedule {
        Schedule::Constant => cfg.lr,
        Schedule::Linear => cfg.lr * (1.0 - progress),
        Schedule::Cosine => cfg.lr * 0.5 * (1.0 + (std::f64::consts::PI * progress).cos()),
    }
}
