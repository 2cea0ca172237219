//! What a GRPO step reports, under TRL's GRPOTrainer names where it has one (`reward_mean` is TRL's `reward`),
//! and the sampled completions the training page shows.

use std::collections::BTreeMap;

/// One GRPO optimizer step's metrics. The reward and completion statistics describe the batch of completions
/// the step trained on (the same for each of a batch's `num_iterations` steps); the clip ratios and KL are the
/// step's own.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct GrpoMetrics {
    /// Mean of the weighted reward sum over the step's completions (TRL: `reward`).
    pub reward_mean: f64,
    /// Its standard deviation (unbiased, as torch's `std`).
    pub reward_std: f64,
    /// `rewards/<name>/mean` and `rewards/<name>/std` of each reward before weighting (names from
    /// `settings::reward_names`).
    #[serde(flatten)]
    pub rewards: BTreeMap<String, f64>,
    /// Mean per-token KL to the reference over completion tokens (TRL's k3 estimator weighed by the ratio, its default
    /// `use_bias_correction_kl`); only with beta > 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kl: Option<f64>,
    #[serde(rename = "completions/mean_length")]
    pub mean_length: f64,
    #[serde(rename = "completions/min_length")]
    pub min_length: f64,
    #[serde(rename = "completions/max_length")]
    pub max_length: f64,
    /// Share of completions cut at `max_new_tokens` without an eos.
    #[serde(rename = "completions/clipped_ratio")]
    pub clipped_ratio: f64,
    /// Share of completion tokens whose ratio was clipped below (advantage < 0), above (advantage > 0), either.
    #[serde(rename = "clip_ratio/low_mean")]
    pub clip_low: f64,
    #[serde(rename = "clip_ratio/high_mean")]
    pub clip_high: f64,
    #[serde(rename = "clip_ratio/region_mean")]
    pub clip_region: f64,
    /// Share of groups whose rewards were all equal (no learning signal).
    pub frac_reward_zero_std: f64,
    /// Seconds spent sampling the completions, scoring them, and in the forward and backward passes of this
    /// step (generation and reward seconds are the batch's, reported on its first step, 0 on the others).
    #[serde(rename = "time/generation")]
    pub generation_secs: f64,
    #[serde(rename = "time/rewards")]
    pub reward_secs: f64,
    #[serde(rename = "time/training")]
    pub training_secs: f64,
}

impl GrpoMetrics {
    /// `(name, mean)` of each reward, in name order.
    pub fn reward_means(&self) -> Vec<(String, f64)> {
        self.rewards
            .iter()
            .filter_map(|(k, v)| {
                k.strip_prefix("rewards/").and_then(|k| k.strip_suffix("/mean")).map(|name| (name.to_string(), *v))
            })
            .collect()
    }
}

/// One sampled completion as the training page shows it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct GrpoSample {
    /// The prompt as the reward saw it (a text prompt, or the last user message of a conversation).
    pub prompt: String,
    pub completion: String,
    /// The row's reference answer, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer: Option<String>,
    /// The weighted reward sum and each reward's value, in the order of `settings::reward_names`.
    pub reward: f64,
    pub rewards: Vec<(String, f64)>,
    /// The completion's advantage within its group.
    pub advantage: f64,
    pub tokens: usize,
    /// Whether it ended with an eos (false: cut at `max_new_tokens`).
    pub finished: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_use_trl_names_and_round_trip() {
        let mut m = GrpoMetrics { reward_mean: 0.5, kl: Some(0.01), ..Default::default() };
        m.rewards.insert("rewards/exact_answer/mean".into(), 0.5);
        m.rewards.insert("rewards/exact_answer/std".into(), 0.1);
        let json = serde_json::to_value(&m).unwrap();
        for key in
            ["reward_mean", "rewards/exact_answer/mean", "kl", "completions/mean_length", "clip_ratio/region_mean"]
        {
            assert!(json.get(key).is_some(), "{key} missing from {json}");
        }
        assert_eq!(serde_json::from_value::<GrpoMetrics>(json).unwrap(), m);
        assert_eq!(m.reward_means(), [("exact_answer".to_string(), 0.5)]);
    }
}
