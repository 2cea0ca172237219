//! Training settings: LoRA shape and optimisation, serialisable to `run.json` and readable from a TOML file.

use crate::engine::device::{DTypeChoice, DeviceChoice};
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

/// Gradient checkpointing: keep only each decoder layer's input through the forward pass and recompute the
/// layer before its backward (about a third more compute, a fraction of the activation memory).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Checkpointing {
    #[default]
    Off,
    On,
    /// On when the memory estimate says the run would not fit the device's memory otherwise; the front end
    /// resolves it before training (`estimate::resolve_checkpointing`), and run.json records the decision.
    Auto,
    /// On, with the kept layer inputs in pinned host memory on a CUDA GPU, copied out and back on a second stream
    /// while the layers compute (`ops::Offloader`): long contexts whose inputs alone fill the GPU. The same
    /// gradients, bit for bit; elsewhere the same as on (the CPU's memory is the host's; a Mac's GPU shares it).
    Offload,
}

impl Checkpointing {
    pub const ALL: [Checkpointing; 4] =
        [Checkpointing::Off, Checkpointing::On, Checkpointing::Offload, Checkpointing::Auto];

    /// Whether a run checkpoints; `auto` must have been resolved against the memory estimate first
    /// (`estimate::resolve_checkpointing`, which every front end calls before starting a run).
    pub fn enabled(self) -> crate::engine::Result<bool> {
        match self {
            Self::Auto => Err(crate::engine::Error::InvalidSetting(
                "checkpointing `auto` was not resolved against the memory estimate before the run started; set \
                 checkpointing to on or off"
                    .into(),
            )),
            decided => Ok(decided.recomputes()),
        }
    }

    /// Whether the layers are recomputed in the backward: on or offload (auto, not decided yet, counts as off).
    pub fn recomputes(self) -> bool {
        matches!(self, Self::On | Self::Offload)
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Off => "off",
            Self::On => "on",
            Self::Auto => "auto",
            Self::Offload => "offload",
        }
    }

    /// What the setting does, in a line (the studio's hover on each choice).
    pub fn describe(self) -> &'static str {
        match self {
            Self::Off => "keep every layer's activations for the backward: the fastest, the most memory",
            Self::On => {
                "keep only each layer's input and recompute the layer in the backward: less memory, more compute"
            }
            Self::Offload => {
                "as on, with the kept inputs in the computer's memory on an NVIDIA GPU (copied while the layers \
                 compute): long contexts; elsewhere the same as on"
            }
            Self::Auto => {
                "on when the memory estimate says the run would not fit otherwise, offloaded on an NVIDIA \
                           GPU when even that would not fit"
            }
        }
    }

    /// Whether the kept layer inputs wait in host memory (where the device offloads: see [`Checkpointing::Offload`]).
    pub fn offloads(self) -> bool {
        self == Self::Offload
    }
}

impl std::str::FromStr for Checkpointing {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|c| c.name() == s)
            .ok_or_else(|| format!("unknown checkpointing `{s}`; use on, off, offload or auto"))
    }
}

/// Everything a training run needs. Saved verbatim in `run.json`.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct TrainConfig {
    pub model: PathBuf,
    pub data: PathBuf,
    /// The Hub repo `model` was downloaded from (id, revision, commit), when it was: recorded in run.json and
    /// named as the PEFT adapter's `base_model_name_or_path`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model_source: Option<crate::engine::hub::HubOrigin>,
    /// The Hub repo `data` was downloaded from, when it was.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data_source: Option<crate::engine::hub::HubOrigin>,
    /// Runs folder; the run lives in `out/<run_name>/`.
    pub out: PathBuf,
    pub run_name: Option<String>,
    pub lora: LoraSettings,
    /// What the run trains for: sft (the default), or dpo / orpo on preference pairs.
    pub method: super::method::Method,
    /// DPO: the implicit reward's inverse temperature; ORPO: the odds-ratio term's weight (TRL's `beta`).
    pub beta: f64,
    /// DPO's loss: sigmoid (the default) or ipo.
    pub preference_loss: super::method::PreferenceLoss,
    /// DPO sigmoid: conservative DPO's assumed share of flipped labels, in [0, 0.5).
    pub label_smoothing: f64,
    /// GRPO's sampling, objective and rewards (used with `method = "grpo"` only).
    pub grpo: super::grpo::GrpoSettings,
    /// Optimizer steps; when None, `epochs` decides.
    pub iters: Option<usize>,
    pub epochs: Option<f64>,
    pub batch_size: usize,
    pub seq_len: usize,
    /// Padding-free packing (`--packing`, SFT): examples share rows of up to `seq_len` tokens, each attending only
    /// to itself; `batch_size` then counts rows.
    pub packing: bool,
    pub lr: f64,
    pub schedule: Schedule,
    /// Warmup steps (a linear rise to `lr`); None: [`DEFAULT_WARMUP`], cut to a tenth of a run that is not longer
    /// (see [`TrainConfig::warmup_steps`]).
    pub warmup: Option<usize>,
    pub grad_accum: usize,
    pub max_grad_norm: Option<f64>,
    pub weight_decay: f64,
    /// Evaluate every N steps (0: only at the end).
    pub val_every: usize,
    /// How many validation batches an evaluation uses (0: all).
    pub val_batches: usize,
    /// Save a checkpoint every N steps (0: only at the end).
    pub save_every: usize,
    /// Stop after this many evaluations in a row whose validation loss did not improve on the best by more than
    /// `early_stopping_min_delta` (0: off). Needs a validation split and `val_every` > 0.
    pub early_stopping_patience: usize,
    /// How much lower than the best a validation loss must be to count as an improvement for early stopping.
    pub early_stopping_min_delta: f64,
    /// Keep only the newest N checkpoints plus the best one (None: keep all).
    pub save_total_limit: Option<usize>,
    pub seed: u64,
    pub device: DeviceChoice,
    pub dtype: DTypeChoice,
    /// How the base model's projections are held (QLoRA: `keep`, `q4k`, ...); recorded so a resume loads
    /// the same base.
    pub quantize: crate::engine::model::BaseQuant,
    /// Gradient checkpointing (`auto` is resolved against the memory estimate before a run starts).
    pub checkpointing: Checkpointing,
    pub skip_invalid_rows: bool,
    pub train_on_prompt: bool,
    /// How dataset rows are read: `auto` detects each file's format, or one of chat, sharegpt, alpaca,
    /// completions, text (`--format`). Recorded so a resume reads the data the same way.
    pub data_format: crate::engine::data::FormatChoice,
    /// Dataset columns read as a format's fields, `{"prompt": "question"}` (`--columns prompt=question`).
    pub data_columns: crate::engine::data::ColumnMap,
    /// Continue from this checkpoint folder.
    pub resume: Option<PathBuf>,
    /// On resume, continue on a base model other than the one the checkpoint was trained on (its fingerprint
    /// differs). A choice of one invocation: recorded in run.json's resume history, never saved as a setting.
    #[serde(skip_serializing)]
    pub force_base: bool,
    /// This process's place in a data-parallel run (one process per device; `--gpus`, torchrun): a choice of
    /// one invocation, never saved (a run may resume on another number of devices).
    #[serde(skip)]
    pub distributed: Option<crate::engine::distributed::RankSpec>,
}

impl Default for TrainConfig {
    fn default() -> Self {
        Self {
            model: PathBuf::new(),
            data: PathBuf::new(),
            model_source: None,
            data_source: None,
            out: PathBuf::from("runs"),
            run_name: None,
            lora: LoraSettings::default(),
            method: super::method::Method::Sft,
            beta: super::method::DEFAULT_BETA,
            preference_loss: super::method::PreferenceLoss::Sigmoid,
            label_smoothing: 0.0,
            grpo: Default::default(),
            iters: Some(100),
            epochs: None,
            batch_size: 4,
            seq_len: 512,
            packing: false,
            lr: 2e-4,
            schedule: Schedule::Cosine,
            warmup: None,
            grad_accum: 1,
            max_grad_norm: Some(1.0),
            weight_decay: 0.0,
            val_every: 50,
            val_batches: 0,
            save_every: 100,
            early_stopping_patience: 0,
            early_stopping_min_delta: 0.0,
            save_total_limit: None,
            seed: 42,
            device: DeviceChoice::Auto,
            dtype: DTypeChoice::Auto,
            quantize: crate::engine::model::BaseQuant::None,
            checkpointing: Checkpointing::Off,
            skip_invalid_rows: false,
            train_on_prompt: false,
            data_format: crate::engine::data::FormatChoice::Auto,
            data_columns: crate::engine::data::ColumnMap::default(),
            resume: None,
            force_base: false,
            distributed: None,
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

impl TrainConfig {
    /// How the run reads its dataset's rows (`data_format`, `data_columns`).
    pub fn read_options(&self) -> crate::engine::data::ReadOptions {
        crate::engine::data::ReadOptions { format: self.data_format, columns: self.data_columns.clone() }
    }

    /// The preference method's parameters.
    pub fn preference(&self) -> super::method::PreferenceSettings {
        super::method::PreferenceSettings {
            beta: self.beta,
            loss: self.preference_loss,
            label_smoothing: self.label_smoothing,
        }
    }

    /// Sequences in one micro-batch: `batch_size` examples, for a preference method `batch_size` pairs of a
    /// chosen and a rejected sequence, for GRPO `num_generations` completions of each of `batch_size` prompts.
    pub fn rows_per_batch(&self) -> usize {
        if self.method.is_preference() {
            2 * self.batch_size
        } else if self.method.is_reinforcement() {
            self.grpo.num_generations * self.batch_size
        } else {
            self.batch_size
        }
    }

    /// What a PEFT adapter names as its base: the Hub repo id when the model came from the Hub (PEFT and
    /// transformers resolve it), else the local path.
    pub fn base_model_name(&self) -> String {
        match &self.model_source {
            Some(origin) => origin.repo.clone(),
            None => self.model.to_string_lossy().into_owned(),
        }
    }

    /// This configuration for a model of `model`'s family: LoRA targets as the family names its linears
    /// ([`Targets::for_model`]), so run.json and the adapter config record what is really adapted.
    pub fn for_model(&self, model: &crate::engine::model::ModelConfig) -> crate::engine::Result<Self> {
        let targets = self.lora.targets.for_model(model)?;
        Ok(Self { lora: LoraSettings { targets, ..self.lora.clone() }, ..self.clone() })
    }
}

impl ModelLimits {
    pub fn of(config: &crate::engine::model::ModelConfig) -> Self {
        Self { context_length: config.max_position_embeddings, num_layers: config.num_layers }
    }
}

/// Warmup steps when the settings name none: ten, unless the run is not longer than that (see
/// [`TrainConfig::warmup_steps`]).
pub const DEFAULT_WARMUP: usize = 10;

impl TrainConfig {
    /// The warmup of a run of `total_steps`: the one set, or [`DEFAULT_WARMUP`] when that is shorter than the run,
    /// else a tenth of the run (rounded down), so the learning rate reaches `lr` and then decays.
    pub fn warmup_steps(&self, total_steps: usize) -> usize {
        match self.warmup {
            Some(steps) => steps,
            None if DEFAULT_WARMUP < total_steps => DEFAULT_WARMUP,
            None => total_steps / 10,
        }
    }

    /// What a run of `total_steps` should say about its warmup: a note when the default was cut to fit the run,
    /// a warning (starting "warning: ") when a warmup the user set is not shorter than the run, so the learning
    /// rate never reaches `lr` (or only at the last step).
    pub fn warmup_note(&self, total_steps: usize) -> Option<String> {
        let steps = self.warmup_steps(total_steps);
        match self.warmup {
            None if DEFAULT_WARMUP >= total_steps => Some(format!(
                "warmup: the default of {DEFAULT_WARMUP} warmup steps is not shorter than this run's {total_steps} \
                 steps, so the learning rate would never reach lr {}; warming up for {steps} steps instead (a tenth \
                 of the run); set `warmup` (--warmup) to choose",
                self.lr
            )),
            Some(set) if set >= total_steps && set > 0 => {
                let peak = self.lr * total_steps as f64 / set as f64;
                Some(format!(
                    "warning: warmup is {set} steps (`warmup`, --warmup) but the run has only {total_steps}: the \
                     learning rate rises for the whole run and peaks at {peak:.3e} at its last step instead of reaching \
                     lr {} and decaying; set warmup below {total_steps} (a tenth of the run, {}, is usual)",
                    self.lr,
                    total_steps / 10
                ))
            }
            _ => None,
        }
    }
}

/// Learning rate at `step` (0-based) of `total` with linear warmup ([`TrainConfig::warmup_steps`]).
pub fn lr_at(cfg: &TrainConfig, step: usize, total: usize) -> f64 {
    let warmup = cfg.warmup_steps(total);
    if warmup > 0 && step < warmup {
        return cfg.lr * (step + 1) as f64 / warmup as f64;
    }
    let decay_steps = total.saturating_sub(warmup).max(1) as f64;
    let progress = ((step - warmup.min(step)) as f64 / decay_steps).clamp(0.0, 1.0);
    match cfg.schedule {
        Schedule::Constant => cfg.lr,
        Schedule::Linear => cfg.lr * (1.0 - progress),
        Schedule::Cosine => cfg.lr * 0.5 * (1.0 + (std::f64::consts::PI * progress).cos()),
    }
}
