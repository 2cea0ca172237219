//! The preference method's flags, shared by `train` and `eval --task preference`: `--method`, `--beta`, `--loss`,
//! `--label-smoothing`, each laid over settings that come from elsewhere (defaults, a config file, a run).

use crate::engine::train::{Method, PreferenceLoss, PreferenceSettings};
use clap::Args;

#[derive(Debug, Clone, Default, Args)]
pub struct PreferenceFlags {
    /// What to train for / how pairs are scored: sft (answers; train only), dpo or orpo (preference pairs: prompt,
    /// chosen, rejected), grpo (prompts with answers; completions sampled and rewarded; train only). Default: sft
    /// for train; for eval, the named run's.
    #[arg(long, value_name = "sft|dpo|orpo|grpo")]
    pub method: Option<Method>,
    /// DPO: the implicit reward's inverse temperature; ORPO: the odds-ratio term's weight (default 0.1); GRPO: the
    /// KL term's weight (default 0: no reference pass).
    #[arg(long, allow_negative_numbers = true)]
    pub beta: Option<f64>,
    /// DPO's loss: sigmoid (default) or ipo.
    #[arg(long, value_name = "sigmoid|ipo")]
    pub loss: Option<PreferenceLoss>,
    /// DPO sigmoid: the assumed share of flipped preference labels (conservative DPO), 0 to below 0.5.
    #[arg(long, allow_negative_numbers = true)]
    pub label_smoothing: Option<f64>,
}

impl PreferenceFlags {
    /// Whether any of the flags was given.
    pub fn any(&self) -> bool {
        self.method.is_some() || self.beta.is_some() || self.loss.is_some() || self.label_smoothing.is_some()
    }

    /// `settings` with the parameters the flags give laid over it.
    pub fn over(&self, settings: PreferenceSettings) -> PreferenceSettings {
        PreferenceSettings {
            beta: self.beta.unwrap_or(settings.beta),
            loss: self.loss.unwrap_or(settings.loss),
            label_smoothing: self.label_smoothing.unwrap_or(settings.label_smoothing),
        }
    }
}
