//! What a run trains for: supervised fine-tuning on target tokens, a preference method on (chosen, rejected)
//! pairs (DPO, ORPO) with its parameters, or GRPO on prompts with its own (`grpo/settings.rs`). Recorded in run.json, read from `--config` files, fixed for a run's
//! whole life (a resume keeps it).

use crate::engine::{Error, Result};

/// The training method.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Method {
    /// Supervised fine-tuning: the mean NLL of the target tokens.
    #[default]
    Sft,
    /// Direct preference optimisation (Rafailov et al. 2023) against the base model as the reference (the
    /// adapter switched off): no second copy of the weights.
    Dpo,
    /// Odds-ratio preference optimisation (Hong et al. 2024): the chosen answer's NLL plus an odds-ratio
    /// term, no reference model.
    Orpo,
    /// Group relative policy optimisation (Shao et al. 2024, as TRL's GRPOTrainer): sample several completions of
    /// each prompt with the adapter on, score them with rewards, and push up the ones better than their group.
    Grpo,
}

impl Method {
    pub const ALL: [Method; 4] = [Method::Sft, Method::Dpo, Method::Orpo, Method::Grpo];

    pub fn name(self) -> &'static str {
        match self {
            Self::Sft => "sft",
            Self::Dpo => "dpo",
            Self::Orpo => "orpo",
            Self::Grpo => "grpo",
        }
    }

    /// Whether the method trains on preference pairs.
    pub fn is_preference(self) -> bool {
        matches!(self, Self::Dpo | Self::Orpo)
    }

    /// Whether the method learns from completions it samples itself (GRPO), on prompt rows.
    pub fn is_reinforcement(self) -> bool {
        self == Self::Grpo
    }

    /// One line for a method picker.
    pub fn describe(self) -> &'static str {
        match self {
            Self::Sft => "supervised fine-tuning on the answers",
            Self::Dpo => "prefer the chosen answer over the rejected one, relative to the base model",
            Self::Orpo => "learn the chosen answer and prefer it over the rejected one, no reference model",
            Self::Grpo => "sample answers to each prompt, score them with rewards, and reinforce the better ones",
        }
    }
}

impl std::str::FromStr for Method {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| format!("unknown method `{s}`; use sft, dpo, orpo or grpo"))
    }
}

/// DPO's loss on the reward margin.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PreferenceLoss {
    /// `-log sigmoid(beta * margin)` (with label smoothing: conservative DPO).
    #[default]
    Sigmoid,
    /// IPO (Azar et al. 2023): `(margin / length - 1 / (2 beta))^2`, log-ratios averaged per completion token as
    /// TRL does.
    Ipo,
}

impl PreferenceLoss {
    pub const ALL: [PreferenceLoss; 2] = [PreferenceLoss::Sigmoid, PreferenceLoss::Ipo];

    pub fn name(self) -> &'static str {
        match self {
            Self::Sigmoid => "sigmoid",
            Self::Ipo => "ipo",
        }
    }
}

impl std::str::FromStr for PreferenceLoss {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| format!("unknown preference loss `{s}`; use sigmoid or ipo"))
    }
}

/// The parameters of the preference methods (unused by SFT).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct PreferenceSettings {
    /// DPO: the inverse temperature of the implicit reward (TRL's `beta`); ORPO: the weight of the odds-ratio term
    /// (TRL's `beta`, the paper's lambda).
    pub beta: f64,
    /// DPO only.
    pub loss: PreferenceLoss,
    /// DPO sigmoid only: the assumed probability that a pair's labels are flipped (conservative DPO), in [0, 0.5).
    pub label_smoothing: f64,
}

/// TRL's default beta for DPO and ORPO.
pub const DEFAULT_BETA: f64 = 0.1;

impl Default for PreferenceSettings {
    fn default() -> Self {
        Self { beta: DEFAULT_BETA, loss: PreferenceLoss::Sigmoid, label_smoothing: 0.0 }
    }
}

impl PreferenceSettings {
    /// Refuse settings that make no sense for `method`, naming the setting and its flag.
    pub fn validate(&self, method: Method) -> Result<()> {
        if !method.is_preference() {
            return Ok(());
        }
        if !(self.beta.is_finite() && self.beta > 0.0 && self.beta <= 1e3) {
            return Err(Error::InvalidSetting(format!(
                "beta (--beta) is {}; it must be a positive number (0.1 is usual)",
                self.beta
            )));
        }
        if !(0.0..0.5).contains(&self.label_smoothing) {
            return Err(Error::InvalidSetting(format!(
                "label_smoothing (--label-smoothing) is {}; it must be at least 0 and below 0.5",
                self.label_smoothing
            )));
        }
        if method == Method::Orpo && self.loss != PreferenceLoss::Sigmoid {
            return Err(Error::InvalidSetting(format!(
                "loss (--loss) {} is a DPO loss; ORPO has its own (leave --loss out or train with --method dpo)",
                self.loss.name()
            )));
        }
        if self.label_smoothing > 0.0 && (method != Method::Dpo || self.loss != PreferenceLoss::Sigmoid) {
            return Err(Error::InvalidSetting(
                "label_smoothing (--label-smoothing) applies to DPO's sigmoid loss only".into(),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_settings_are_checked() {
        for m in Method::ALL {
            assert_eq!(m.name().parse::<Method>().unwrap(), m);
        }
        assert!("kto".parse::<Method>().unwrap_err().contains("sft, dpo, orpo or grpo"));
        let ok = PreferenceSettings::default();
        assert!(ok.validate(Method::Dpo).is_ok() && ok.validate(Method::Orpo).is_ok());
        assert!(PreferenceSettings { beta: 0.0, ..ok }.validate(Method::Dpo).is_err());
        assert!(PreferenceSettings { beta: f64::NAN, ..ok }.validate(Method::Orpo).is_err());
        // SFT ignores them.
        assert!(PreferenceSettings { beta: 0.0, ..ok }.validate(Method::Sft).is_ok());
        assert!(PreferenceSettings { label_smoothing: 0.5, ..ok }.validate(Method::Dpo).is_err());
        assert!(PreferenceSettings { label_smoothing: 0.1, ..ok }.validate(Method::Dpo).is_ok());
        assert!(PreferenceSettings { label_smoothing: 0.1, ..ok }.validate(Method::Orpo).is_err());
        let ipo = PreferenceSettings { loss: PreferenceLoss::Ipo, ..ok };
        assert!(ipo.validate(Method::Dpo).is_ok() && ipo.validate(Method::Orpo).is_err());
        assert!(PreferenceSettings { label_smoothing: 0.1, ..ipo }.validate(Method::Dpo).is_err());
    }
}
