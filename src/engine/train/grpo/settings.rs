//! GRPO's settings: how completions are sampled, how the clipped policy objective is normalised, and which rewards
//! score the completions. Part of `TrainConfig` (`grpo`), so they are in run.json, `--config` files and resume.
//! Defaults follow TRL's `GRPOConfig` (1.x) except where a desktop run needs smaller numbers
//! (`max_new_tokens`, `num_generations`).

use crate::engine::{Error, Result};

/// How the per-token objective is averaged into the step's loss (TRL's `loss_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GrpoLoss {
    /// Each completion's token mean, averaged over the micro-batch's completions (the GRPO paper).
    Grpo,
    /// The micro-batch's token mean.
    Bnpo,
    /// The micro-batch's token sum over (completions x max_new_tokens) (Dr. GRPO, no length bias).
    DrGrpo,
    /// The token sum over the step's tokens: every token of the step weighs the same (DAPO; TRL's default).
    #[default]
    Dapo,
}

impl GrpoLoss {
    pub const ALL: [GrpoLoss; 4] = [Self::Grpo, Self::Bnpo, Self::DrGrpo, Self::Dapo];

    pub fn name(self) -> &'static str {
        match self {
            Self::Grpo => "grpo",
            Self::Bnpo => "bnpo",
            Self::DrGrpo => "dr_grpo",
            Self::Dapo => "dapo",
        }
    }
}

impl std::str::FromStr for GrpoLoss {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|m| m.name() == s.replace('-', "_"))
            .ok_or_else(|| format!("unknown GRPO loss `{s}`; use grpo, bnpo, dr_grpo or dapo"))
    }
}

/// How advantages are scaled after the group mean is subtracted (TRL's `scale_rewards`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ScaleRewards {
    /// Divided by the group's standard deviation (+ 1e-4).
    #[default]
    Group,
    /// Divided by the whole step's standard deviation (+ 1e-4).
    Batch,
    /// Not scaled (Dr. GRPO).
    None,
}

impl ScaleRewards {
    pub const ALL: [ScaleRewards; 3] = [Self::Group, Self::Batch, Self::None];

    pub fn name(self) -> &'static str {
        match self {
            Self::Group => "group",
            Self::Batch => "batch",
            Self::None => "none",
        }
    }
}

impl std::str::FromStr for ScaleRewards {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| format!("unknown reward scaling `{s}`; use group, batch or none"))
    }
}

/// One reward: what it checks, and its weight in the total.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RewardSpec {
    #[serde(flatten)]
    pub kind: RewardKind,
    /// Weight in the summed reward (TRL's `reward_weights`).
    #[serde(default = "one")]
    pub weight: f64,
}

fn one() -> f64 {
    1.0
}

/// The rewards: built in, or a user's program.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum RewardKind {
    /// 1 when the completion's answer (a `\boxed{}` answer, else the text after `####`, else an
    /// `<answer>...</answer>`, else the first number) equals the row's `answer` (numbers compared as numbers), else
    /// 0 (`rewards/answer.rs`).
    ExactAnswer,
    /// 1 when `pattern` (a Rust regex) matches anywhere in the completion, else 0.
    Regex { pattern: String },
    /// 1 when the whole completion has the required structure, else 0: a preset name (`think-answer`:
    /// `<think>...</think>` then `<answer>...</answer>`) or a regex the whole completion must match.
    Format { structure: String },
    /// 0 up to `budget` completion tokens, then falling linearly to -1 at twice the budget (and staying there).
    Length { budget: usize },
    /// A program run once per completion, without a shell: it reads one JSON line `{"prompt", "prompt_text",
    /// "completion", "answer"}` on stdin and prints one number. A failure, a timeout or anything but a finite number ends the run
    /// with an error naming the row; it is never taken as a score.
    Program {
        /// The program and its arguments (`["python3", "score.py"]`).
        command: Vec<String>,
        /// Seconds one call may take before it is killed.
        #[serde(default = "default_timeout")]
        timeout_secs: f64,
    },
}

fn default_timeout() -> f64 {
    DEFAULT_REWARD_TIMEOUT_SECS
}

/// How long one call of a reward program may take by default.
pub const DEFAULT_REWARD_TIMEOUT_SECS: f64 = 10.0;

impl RewardKind {
    /// The reward's name in metrics (`rewards/<name>/mean`) and messages: `exact_answer`, `regex`, `format`,
    /// `length`, `program`.
    pub fn name(&self) -> &'static str {
        match self {
            Self::ExactAnswer => "exact_answer",
            Self::Regex { .. } => "regex",
            Self::Format { .. } => "format",
            Self::Length { .. } => "length",
            Self::Program { .. } => "program",
        }
    }

    /// Whether the reward reads the row's `answer` (rows without one are refused before training).
    pub fn needs_answer(&self) -> bool {
        matches!(self, Self::ExactAnswer)
    }
}

/// Each reward's name in metrics (`rewards/<name>/mean`), in order: its kind's name, with `_2`, `_3`, ... on a
/// kind's later repeats (two regex rewards are `regex` and `regex_2`).
pub fn reward_names(rewards: &[RewardSpec]) -> Vec<String> {
    let mut seen = std::collections::HashMap::<&str, usize>::new();
    rewards
        .iter()
        .map(|r| {
            let n = seen.entry(r.kind.name()).or_default();
            *n += 1;
            if *n == 1 {
                r.kind.name().to_string()
            } else {
                format!("{}_{n}", r.kind.name())
            }
        })
        .collect()
}

/// GRPO's parameters (unused by the other methods).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct GrpoSettings {
    /// Completions sampled per prompt (the group; TRL's `num_generations`); at least 2.
    pub num_generations: usize,
    /// Most tokens a completion may have (TRL's `max_completion_length`).
    pub max_new_tokens: usize,
    /// Sampling temperature; the policy's log-probabilities are taken at the same temperature, as TRL does.
    pub temperature: f64,
    /// Nucleus sampling (1 = off).
    pub top_p: f64,
    /// Top-k sampling (0 = off).
    pub top_k: usize,
    /// Optimizer steps on each batch of completions (TRL's `num_iterations`, the paper's mu).
    pub num_iterations: usize,
    /// Weight of the KL term to the reference (the base with the adapter off); 0 skips the reference pass.
    pub beta: f64,
    /// Clipping below 1 (and above, unless `epsilon_high` is set).
    pub epsilon: f64,
    /// Clipping above 1 (DAPO's clip-higher); None: `epsilon`.
    pub epsilon_high: Option<f64>,
    pub loss: GrpoLoss,
    pub scale_rewards: ScaleRewards,
    /// The rewards, summed with their weights.
    pub rewards: Vec<RewardSpec>,
    /// Report a few sampled completions with their rewards every N steps (0: never).
    pub sample_every: usize,
}

impl Default for GrpoSettings {
    fn default() -> Self {
        Self {
            num_generations: 8,
            max_new_tokens: 128,
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            num_iterations: 1,
            beta: 0.0,
            epsilon: 0.2,
            epsilon_high: None,
            loss: GrpoLoss::Dapo,
            scale_rewards: ScaleRewards::Group,
            rewards: vec![RewardSpec { kind: RewardKind::ExactAnswer, weight: 1.0 }],
            sample_every: 10,
        }
    }
}

impl GrpoSettings {
    /// The upper clipping bound's epsilon.
    pub fn epsilon_high(&self) -> f64 {
        self.epsilon_high.unwrap_or(self.epsilon)
    }

    /// Refuse settings that cannot work, naming the setting and its flag.
    pub fn validate(&self) -> Result<()> {
        let bad = |what: &str, value: String, want: &str| {
            Err(Error::InvalidSetting(format!("{what} is {value}; it must be {want}")))
        };
        if !(2..=256).contains(&self.num_generations) {
            return bad("num_generations (--num-generations)", self.num_generations.to_string(), "2 to 256");
        }
        if !(1..=32_768).contains(&self.max_new_tokens) {
            return bad("max_new_tokens (--max-new-tokens)", self.max_new_tokens.to_string(), "1 to 32768");
        }
        if !(self.temperature.is_finite() && self.temperature > 0.0 && self.temperature <= 10.0) {
            return bad("temperature (--temperature)", self.temperature.to_string(), "above 0 and at most 10");
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad("top_p (--top-p)", self.top_p.to_string(), "above 0 and at most 1 (1 = off)");
        }
        if !(1..=64).contains(&self.num_iterations) {
            return bad("num_iterations (--num-iterations)", self.num_iterations.to_string(), "1 to 64");
        }
        if !(self.beta.is_finite() && (0.0..=100.0).contains(&self.beta)) {
            return bad("beta (--beta)", self.beta.to_string(), "0 (no KL term, the default) to 100");
        }
        if !(self.epsilon.is_finite() && self.epsilon > 0.0 && self.epsilon < 1.0) {
            return bad("epsilon (--epsilon)", self.epsilon.to_string(), "above 0 and below 1 (0.2 is usual)");
        }
        if let Some(high) = self.epsilon_high {
            if !(high.is_finite() && high > 0.0 && high <= 10.0) {
                return bad(
                    "epsilon_high (--epsilon-high)",
                    high.to_string(),
                    "above 0 and at most 10 (0.28 is usual)",
                );
            }
        }
        if self.rewards.is_empty() {
            return Err(Error::InvalidSetting(
                "GRPO needs at least one reward (--reward exact-answer, say, or a reward program)".into(),
            ));
        }
        for reward in &self.rewards {
            if !reward.weight.is_finite() {
                return bad(
                    &format!("the weight of reward {}", reward.kind.name()),
                    reward.weight.to_string(),
                    "a number",
                );
            }
            match &reward.kind {
                RewardKind::Program { command, .. } if command.first().is_none_or(|p| p.trim().is_empty()) => {
                    return Err(Error::InvalidSetting(
                        "the program reward has no command; give the program and its arguments (`command = \
                         [\"python3\", \"score.py\"]`)"
                            .into(),
                    ));
                }
                RewardKind::Program { timeout_secs, .. } if !(timeout_secs.is_finite() && *timeout_secs > 0.0) => {
                    return bad(
                        "the program reward's timeout_secs",
                        timeout_secs.to_string(),
                        "a positive number of seconds",
                    );
                }
                RewardKind::Regex { pattern: s } | RewardKind::Format { structure: s } if s.trim().is_empty() => {
                    return Err(Error::InvalidSetting(format!(
                        "the {} reward has no pattern; give a regex{}",
                        reward.kind.name(),
                        if reward.kind.name() == "format" { " or the preset think-answer" } else { "" }
                    )));
                }
                _ => {}
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate_and_bad_values_are_named() {
        let ok = GrpoSettings::default();
        assert!(ok.validate().is_ok());
        let err = GrpoSettings { num_generations: 1, ..ok.clone() }.validate().unwrap_err().to_string();
        assert!(err.contains("--num-generations"), "{err}");
        assert!(GrpoSettings { temperature: 0.0, ..ok.clone() }.validate().is_err());
        assert!(GrpoSettings { rewards: vec![], ..ok.clone() }.validate().is_err());
        assert!(GrpoSettings { epsilon_high: Some(0.28), ..ok.clone() }.validate().is_ok());
        assert_eq!(GrpoSettings { epsilon_high: Some(0.28), ..ok }.epsilon_high(), 0.28);
        for loss in GrpoLoss::ALL {
            assert_eq!(loss.name().parse::<GrpoLoss>().unwrap(), loss);
        }
        assert_eq!("dr-grpo".parse::<GrpoLoss>().unwrap(), GrpoLoss::DrGrpo);
    }

    #[test]
    fn program_and_pattern_rewards_need_their_text() {
        let with = |kind| GrpoSettings { rewards: vec![RewardSpec { kind, weight: 1.0 }], ..Default::default() };
        let program = |command: Vec<String>, timeout_secs| RewardKind::Program { command, timeout_secs };
        let err = with(program(vec![], 5.0)).validate().unwrap_err().to_string();
        assert!(err.contains("the program reward has no command"), "{err}");
        assert!(with(program(vec!["python3".into()], 0.0)).validate().is_err());
        assert!(with(program(vec!["python3".into()], 5.0)).validate().is_ok());
        let err = with(RewardKind::Format { structure: " ".into() }).validate().unwrap_err().to_string();
        assert!(err.contains("the format reward has no pattern"), "{err}");
        assert!(with(RewardKind::Regex { pattern: String::new() }).validate().is_err());
        assert!(with(RewardKind::Regex { pattern: "\\d".into() }).validate().is_ok());
    }

    #[test]
    fn rewards_round_trip_through_toml_and_json() {
        let settings = GrpoSettings {
            rewards: vec![
                RewardSpec { kind: RewardKind::ExactAnswer, weight: 1.0 },
                RewardSpec { kind: RewardKind::Format { structure: "think-answer".into() }, weight: 0.5 },
                RewardSpec {
                    kind: RewardKind::Program { command: vec!["python3".into(), "score.py".into()], timeout_secs: 5.0 },
                    weight: 2.0,
                },
            ],
            ..Default::default()
        };
        let json = serde_json::to_string(&settings).unwrap();
        assert!(json.contains(r#""kind":"exact-answer""#), "{json}");
        assert_eq!(serde_json::from_str::<GrpoSettings>(&json).unwrap(), settings);
        let toml = toml::to_string(&settings).unwrap();
        assert_eq!(toml::from_str::<GrpoSettings>(&toml).unwrap(), settings);
        assert_eq!(reward_names(&settings.rewards), ["exact_answer", "format", "program"]);
        let twice = vec![settings.rewards[1].clone(), settings.rewards[1].clone()];
        assert_eq!(reward_names(&twice), ["format", "format_2"]);
        let read: RewardSpec = toml::from_str("kind = \"length\"\nbudget = 64").unwrap();
        assert_eq!(read, RewardSpec { kind: RewardKind::Length { budget: 64 }, weight: 1.0 });
    }
}
