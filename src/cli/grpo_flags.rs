//! GRPO's flags on `train`: sampling (`--num-generations`, `--max-new-tokens`, `--temperature`, `--top-p`,
//! `--top-k`), the objective (`--num-iterations`, `--epsilon`, `--epsilon-high`, `--loss-type`, `--scale-rewards`),
//! the rewards (`--reward`, `--reward-program`, `--reward-timeout`, `--reward-program-weight`) and
//! `--sample-every`, each laid over settings from elsewhere (defaults, a `--config` file, a resumed run).
//! `--beta` is the preference flags' own (the lead routes it to GRPO's KL weight).

use crate::engine::train::grpo::rewards::program::split_command;
use crate::engine::train::grpo::{GrpoLoss, GrpoSettings, RewardKind, RewardSpec, ScaleRewards};
use crate::engine::train::Method;
use clap::Args;

/// A reward program's command line, split into words with shell-like quoting (never run through a shell).
#[derive(Debug, Clone, PartialEq)]
pub struct ProgramCommand(pub Vec<String>);

impl std::str::FromStr for ProgramCommand {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        split_command(s).map(Self)
    }
}

#[derive(Debug, Clone, Default, Args)]
pub struct GrpoFlags {
    /// GRPO: completions sampled per prompt (the group; default 8).
    #[arg(long, value_name = "G", allow_negative_numbers = true)]
    pub num_generations: Option<usize>,
    /// GRPO: most tokens per sampled completion (default 128).
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub max_new_tokens: Option<usize>,
    /// GRPO: sampling temperature (default 1).
    #[arg(long, allow_negative_numbers = true)]
    pub temperature: Option<f64>,
    /// GRPO: nucleus sampling (default 1 = off).
    #[arg(long, allow_negative_numbers = true)]
    pub top_p: Option<f64>,
    /// GRPO: top-k sampling (default 0 = off).
    #[arg(long, allow_negative_numbers = true)]
    pub top_k: Option<usize>,
    /// GRPO: optimizer steps on each batch of completions (default 1).
    #[arg(long, allow_negative_numbers = true)]
    pub num_iterations: Option<usize>,
    /// GRPO: clipping of the probability ratio (default 0.2).
    #[arg(long, allow_negative_numbers = true)]
    pub epsilon: Option<f64>,
    /// GRPO: clipping above 1, when it differs from --epsilon (DAPO's clip-higher, 0.28 say).
    #[arg(long, allow_negative_numbers = true)]
    pub epsilon_high: Option<f64>,
    /// GRPO: how the per-token objective is averaged (default dapo).
    #[arg(long, value_name = "grpo|bnpo|dr_grpo|dapo")]
    pub loss_type: Option<GrpoLoss>,
    /// GRPO: advantages divided by the group's or the batch's reward std, or not scaled (default group).
    #[arg(long, value_name = "group|batch|none")]
    pub scale_rewards: Option<ScaleRewards>,
    /// GRPO: a built-in reward, repeatable; replaces the default (exact-answer): exact-answer, regex=PATTERN,
    /// format=think-answer, format=REGEX or length=BUDGET, each optionally @WEIGHT (length=200@0.5).
    #[arg(long = "reward", value_name = "SPEC")]
    pub rewards: Vec<RewardSpec>,
    /// GRPO: a reward program, "CMD ARGS" (quoted like a shell, run without one): reads a JSON line (prompt,
    /// prompt_text, completion, answer) on stdin and prints a number. Added to the --reward rewards; alone, it
    /// replaces the default (exact-answer).
    #[arg(long, value_name = "\"CMD ARGS\"")]
    pub reward_program: Option<ProgramCommand>,
    /// GRPO: seconds one reward program call may take before it is killed (default 10).
    #[arg(long, value_name = "SECS", allow_negative_numbers = true)]
    pub reward_timeout: Option<f64>,
    /// GRPO: the reward program's weight in the total (default 1).
    #[arg(long, value_name = "W", allow_negative_numbers = true)]
    pub reward_program_weight: Option<f64>,
    /// GRPO: show a few sampled completions with their rewards every N steps (0: never; default 10).
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub sample_every: Option<usize>,
}

impl GrpoFlags {
    /// The flags that were given, by name (for the message refusing them with another method).
    fn given(&self) -> Vec<&'static str> {
        [
            (self.num_generations.is_some(), "--num-generations"),
            (self.max_new_tokens.is_some(), "--max-new-tokens"),
            (self.temperature.is_some(), "--temperature"),
            (self.top_p.is_some(), "--top-p"),
            (self.top_k.is_some(), "--top-k"),
            (self.num_iterations.is_some(), "--num-iterations"),
            (self.epsilon.is_some(), "--epsilon"),
            (self.epsilon_high.is_some(), "--epsilon-high"),
            (self.loss_type.is_some(), "--loss-type"),
            (self.scale_rewards.is_some(), "--scale-rewards"),
            (!self.rewards.is_empty(), "--reward"),
            (self.reward_program.is_some(), "--reward-program"),
            (self.reward_timeout.is_some(), "--reward-timeout"),
            (self.reward_program_weight.is_some(), "--reward-program-weight"),
            (self.sample_every.is_some(), "--sample-every"),
        ]
        .into_iter()
        .filter_map(|(given, name)| given.then_some(name))
        .collect()
    }

    /// Lay the given flags over `s`. `--reward` and `--reward-program` together replace the reward list when
    /// either is given; `--reward-timeout` and `--reward-program-weight` alone change the program rewards already
    /// in `s` (from a config file or a resumed run).
    pub fn apply(&self, s: &mut GrpoSettings) {
        macro_rules! set {
            ($($field:ident <- $flag:ident),* $(,)?) => {$(
                if let Some(v) = self.$flag.clone() {
                    s.$field = v;
                }
            )*};
        }
        set!(num_generations <- num_generations, max_new_tokens <- max_new_tokens, temperature <- temperature,
             top_p <- top_p, top_k <- top_k, num_iterations <- num_iterations, epsilon <- epsilon,
             loss <- loss_type, scale_rewards <- scale_rewards, sample_every <- sample_every);
        if self.epsilon_high.is_some() {
            s.epsilon_high = self.epsilon_high;
        }
        if !self.rewards.is_empty() || self.reward_program.is_some() {
            s.rewards = self.rewards.clone();
            if let Some(ProgramCommand(command)) = &self.reward_program {
                s.rewards.push(RewardSpec {
                    kind: RewardKind::Program {
                        command: command.clone(),
                        timeout_secs: crate::engine::train::grpo::settings::DEFAULT_REWARD_TIMEOUT_SECS,
                    },
                    weight: 1.0,
                });
            }
        }
        for reward in &mut s.rewards {
            if let RewardKind::Program { timeout_secs, .. } = &mut reward.kind {
                *timeout_secs = self.reward_timeout.unwrap_or(*timeout_secs);
                reward.weight = self.reward_program_weight.unwrap_or(reward.weight);
            }
        }
    }

    /// Refuse GRPO flags with another method, and the program's timeout or weight without a program.
    pub fn check(&self, method: Method, s: &GrpoSettings) -> anyhow::Result<()> {
        let given = self.given();
        if method != Method::Grpo && !given.is_empty() {
            anyhow::bail!("{} only apply to --method grpo; this run trains with {}", given.join(", "), method.name());
        }
        let has_program = s.rewards.iter().any(|r| matches!(r.kind, RewardKind::Program { .. }));
        if !has_program && (self.reward_timeout.is_some() || self.reward_program_weight.is_some()) {
            anyhow::bail!(
                "--reward-timeout and --reward-program-weight set a reward program's limits, but there is none; add \
                 --reward-program \"CMD ARGS\""
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn parse(args: &[&str]) -> Result<crate::cli::Cli, clap::Error> {
        let mut argv = vec!["metal-candle", "train", "--model", "m.gguf", "--data", "d.jsonl"];
        argv.extend_from_slice(args);
        crate::cli::Cli::try_parse_from(argv)
    }

    fn flags(args: &[&str]) -> GrpoFlags {
        match parse(args).unwrap().command {
            Some(crate::cli::Command::Train(t)) => t.grpo.clone(),
            other => panic!("not train: {other:?}"),
        }
    }

    #[test]
    fn reward_specs_parse_on_the_command_line_and_bad_ones_are_refused() {
        let f = flags(&["--method", "grpo", "--reward", "length=10@0.5", "--reward", "exact-answer"]);
        assert_eq!(f.rewards[0], RewardSpec { kind: RewardKind::Length { budget: 10 }, weight: 0.5 });
        let err = parse(&["--reward", "lenght=10"]).unwrap_err().to_string();
        assert!(err.contains("unknown reward `lenght=10`") && err.contains("--reward"), "{err}");
        let err = parse(&["--reward-program", "python3 'score.py"]).unwrap_err().to_string();
        assert!(err.contains("unclosed"), "{err}");
        let err = parse(&["--loss-type", "ppo"]).unwrap_err().to_string();
        assert!(err.contains("dr_grpo"), "{err}");
    }

    #[test]
    fn flags_lay_over_settings_and_rewards_are_replaced_only_when_given() {
        let mut s = GrpoSettings::default();
        flags(&["--num-generations", "4", "--temperature", "0.7", "--loss-type", "dr_grpo", "--epsilon-high", "0.28"])
            .apply(&mut s);
        assert_eq!((s.num_generations, s.temperature, s.loss), (4, 0.7, GrpoLoss::DrGrpo));
        assert_eq!(s.epsilon_high, Some(0.28));
        assert_eq!(s.rewards, GrpoSettings::default().rewards, "no reward flag keeps the list");
        assert_eq!(s.max_new_tokens, GrpoSettings::default().max_new_tokens);

        let f = flags(&["--reward", "format=think-answer", "--reward-program", "sh 'my score.sh' -v"]);
        f.apply(&mut s);
        assert_eq!(s.rewards.len(), 2);
        assert_eq!(s.rewards[0].kind, RewardKind::Format { structure: "think-answer".into() });
        let RewardKind::Program { command, timeout_secs } = &s.rewards[1].kind else { panic!("{:?}", s.rewards) };
        assert_eq!(command, &["sh", "my score.sh", "-v"]);
        assert_eq!(*timeout_secs, 10.0);

        // A resumed run's program keeps its command; the timeout and weight flags change it in place.
        flags(&["--reward-timeout", "2.5", "--reward-program-weight", "0.25"]).apply(&mut s);
        assert_eq!(s.rewards.len(), 2);
        assert!(matches!(s.rewards[1].kind, RewardKind::Program { timeout_secs, .. } if timeout_secs == 2.5));
        assert_eq!((s.rewards[0].weight, s.rewards[1].weight), (1.0, 0.25));
    }

    #[test]
    fn grpo_flags_are_refused_with_other_methods() {
        let s = GrpoSettings::default();
        let err = flags(&["--num-generations", "4", "--reward", "exact-answer"]).check(Method::Sft, &s).unwrap_err();
        assert!(err.to_string().contains("--num-generations, --reward only apply to --method grpo"), "{err}");
        assert!(flags(&[]).check(Method::Dpo, &s).is_ok());
        assert!(flags(&["--top-k", "5"]).check(Method::Grpo, &s).is_ok());
        let err = flags(&["--reward-timeout", "3"]).check(Method::Grpo, &s).unwrap_err();
        assert!(err.to_string().contains("--reward-program"), "{err}");
    }
}
