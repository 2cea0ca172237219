//! One GRPO round: sample each prompt's group, score the completions, turn rewards into advantages, and take
//! the log-probabilities the objective compares with (the sampling policy's when the batch is used more than
//! once, the reference's with beta > 0). The result is the [`Rollout`] that `num_iterations` optimizer steps
//! train on, and the metrics and samples those steps report.

use super::batch::{Completion, Rollout};
use super::metrics::{GrpoMetrics, GrpoSample};
use super::objective::{advantages, mean_std};
use super::rewards::{RewardInput, RewardTable, Rewards};
use super::rollout::{completion_seed, sample_prompts, PromptDraw, SamplingContext};
use super::step::{GrpoObjective, GrpoStepMetrics};
use crate::engine::data::PreparedSplit;
use crate::engine::{Error, Result};
use std::time::Instant;

/// Where a round's prompts come from and how their completions are scored.
pub struct RoundSource<'a> {
    pub split: &'a PreparedSplit,
    pub rewards: &'a Rewards,
    /// Where prompt `i` of the split is, for messages ("data/train.jsonl:17").
    pub locate: &'a dyn Fn(usize) -> String,
}

/// Sample, score and prepare the completions of the prompts `micro_batches` (split indices, one list per
/// micro-batch) for round `round` of a run seeded `seed`.
pub fn roll_out(
    objective: &GrpoObjective,
    ctx: &SamplingContext<'_>,
    source: &RoundSource<'_>,
    micro_batches: &[Vec<usize>],
    (seed, round): (u64, usize),
    cancelled: &dyn Fn() -> bool,
) -> Result<Rollout> {
    let settings = ctx.settings;
    let g = settings.num_generations;
    let started = Instant::now();
    let mut completions = Vec::new();
    // A micro-batch's prompts decode together (those of one length as one batch).
    for micro in micro_batches {
        let first = completions.len();
        let draws: Vec<PromptDraw<'_>> = micro
            .iter()
            .enumerate()
            .map(|(i, &index)| PromptDraw {
                prompt: index,
                ids: &source.split.examples[index].input_ids,
                seeds: (0..g).map(|k| completion_seed(seed, round, first + i * g + k)).collect(),
            })
            .collect();
        completions.extend(sample_prompts(ctx, &draws, cancelled)?);
    }
    let generation_secs = started.elapsed().as_secs_f64();
    let started = Instant::now();
    let table = score(source, &completions, cancelled)?;
    let reward_secs = started.elapsed().as_secs_f64();
    let adv = advantages(&table.total, g, settings.scale_rewards);
    let mut rollout = Rollout {
        group: g,
        micro_sizes: micro_batches.iter().map(|m| m.len() * g).collect(),
        completions,
        rewards: table.values,
        reward_totals: table.total,
        advantages: adv.values,
        zero_std_groups: adv.zero_std_groups,
        old_logps: None,
        ref_logps: None,
        generation_secs,
        reward_secs,
    };
    if settings.num_iterations > 1 {
        rollout.old_logps = Some(objective.token_logps(ctx.model, &rollout)?);
    }
    rollout.ref_logps = objective.reference_logps(&rollout)?;
    Ok(rollout)
}

/// Score `completions` (of the source split's prompts) with the source's rewards.
pub fn score(
    source: &RoundSource<'_>,
    completions: &[Completion],
    cancelled: &dyn Fn() -> bool,
) -> Result<RewardTable> {
    let prompts = source
        .split
        .prompts
        .as_ref()
        .ok_or_else(|| Error::Training("GRPO needs prompt rows, and this split has none".into()))?;
    let locations: Vec<String> = completions.iter().map(|c| (source.locate)(c.prompt)).collect();
    let inputs: Vec<RewardInput<'_>> = completions
        .iter()
        .zip(&locations)
        .map(|(c, location)| RewardInput {
            row: &prompts[c.prompt],
            completion: &c.text,
            completion_tokens: c.ids.len(),
            location,
        })
        .collect();
    source.rewards.score(&inputs, cancelled)
}

/// The metrics of an optimizer step on `rollout`: its rewards and completions, and the step's own terms.
/// Generation and reward seconds count on the round's first step only.
pub fn step_metrics(
    rollout: &Rollout,
    names: &[String],
    step: &GrpoStepMetrics,
    first_of_round: bool,
    training_secs: f64,
) -> GrpoMetrics {
    let lengths: Vec<f64> = rollout.completions.iter().map(|c| c.ids.len() as f64).collect();
    GrpoMetrics {
        kl: step.kl,
        min_length: if lengths.is_empty() { 0.0 } else { lengths.iter().copied().fold(f64::INFINITY, f64::min) },
        max_length: lengths.iter().copied().fold(0.0, f64::max),
        clip_low: step.clip_low,
        clip_high: step.clip_high,
        clip_region: step.clip_region,
        frac_reward_zero_std: rollout.zero_std_groups,
        generation_secs: if first_of_round { rollout.generation_secs } else { 0.0 },
        reward_secs: if first_of_round { rollout.reward_secs } else { 0.0 },
        training_secs,
        ..reward_metrics(&rollout.reward_totals, &rollout.rewards, names, &rollout.completions)
    }
}

/// The reward and completion-length statistics of scored completions: the weighted totals, each reward's
/// values (`values[i][k]`: reward k of completion i), the rewards' names.
pub fn reward_metrics(
    totals: &[f64],
    values: &[Vec<f64>],
    names: &[String],
    completions: &[Completion],
) -> GrpoMetrics {
    let (reward_mean, reward_std) = mean_std(totals);
    let mut rewards = std::collections::BTreeMap::new();
    for (k, name) in names.iter().enumerate() {
        let column: Vec<f64> = values.iter().map(|r| r[k]).collect();
        let (mean, std) = mean_std(&column);
        rewards.insert(format!("rewards/{name}/mean"), mean);
        rewards.insert(format!("rewards/{name}/std"), std);
    }
    let n = completions.len().max(1) as f64;
    GrpoMetrics {
        reward_mean,
        reward_std,
        rewards,
        mean_length: completions.iter().map(|c| c.ids.len() as f64).sum::<f64>() / n,
        clipped_ratio: completions.iter().filter(|c| !c.finished).count() as f64 / n,
        ..Default::default()
    }
}

/// Up to `count` completions of `rollout` to show: the first completion of each of the first prompts, then the
/// rest in order.
pub fn samples(rollout: &Rollout, source: &RoundSource<'_>, names: &[String], count: usize) -> Vec<GrpoSample> {
    let Some(prompts) = source.split.prompts.as_ref() else { return Vec::new() };
    let g = rollout.group.max(1);
    let firsts = (0..rollout.completions.len()).step_by(g);
    let rest = (0..rollout.completions.len()).filter(|i| i % g != 0);
    firsts
        .chain(rest)
        .take(count)
        .map(|i| {
            let c = &rollout.completions[i];
            let row = &prompts[c.prompt];
            GrpoSample {
                prompt: row.prompt_text(),
                completion: c.text.clone(),
                answer: row.answer.clone(),
                reward: rollout.reward_totals[i],
                rewards: names.iter().cloned().zip(rollout.rewards[i].iter().copied()).collect(),
                advantage: rollout.advantages[i],
                tokens: c.ids.len(),
                finished: c.finished,
            }
        })
        .collect()
}
