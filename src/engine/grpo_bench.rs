//! The GRPO step benchmark (`bench grpo`): each step samples `prompts x num_generations` completions of exactly
//! `max_new_tokens` tokens with the policy (the GRPO engine's own group sampling through the KV cache), scores
//! them with a cheap synthetic reward, and takes one optimizer step with GRPO's objective (DAPO loss, beta 0,
//! one iteration per batch): the loop a `train --method grpo` step runs, without the dataset, so that
//! scripts/bench_trl_grpo.py can time TRL's GRPOTrainer on the same work.

use crate::engine::model::LoadedModel;
use crate::engine::train::grpo::batch::Rollout;
use crate::engine::train::grpo::objective::advantages;
use crate::engine::train::grpo::rollout::{completion_seed, sample_prompts, PromptDraw, SamplingContext};
use crate::engine::train::grpo::step::GrpoObjective;
use crate::engine::train::grpo::{GrpoLoss, GrpoSettings, ScaleRewards};
use crate::engine::{Error, Result};
use std::time::Instant;

/// What `bench grpo` measures: the adapter, the step's shape and how many steps.
#[derive(Debug, Clone)]
pub struct GrpoBenchSpec {
    pub lora: crate::engine::train::LoraSettings,
    /// Prompts per step (TRL: per_device_train_batch_size / num_generations).
    pub prompts: usize,
    /// Tokens of every (random) prompt.
    pub prompt_len: usize,
    pub num_generations: usize,
    /// Tokens of every completion: the eos never ends one early, so every step does the same work.
    pub max_new_tokens: usize,
    pub steps: usize,
    pub warmup_steps: usize,
}

/// Results of a GRPO step benchmark (means over the timed steps).
#[derive(Debug, Clone, serde::Serialize)]
pub struct GrpoBench {
    pub prompts: usize,
    pub prompt_len: usize,
    pub num_generations: usize,
    pub max_new_tokens: usize,
    pub rank: usize,
    pub targets: Vec<String>,
    pub steps: usize,
    /// Sampling the step's completions (prefill and decode, host sampling included).
    pub mean_generation_secs: f64,
    /// The optimizer step on them: forward, backward and AdamW, read back.
    pub mean_training_secs: f64,
    /// Generation, reward and training, end to end.
    pub mean_step_secs: f64,
    pub median_step_secs: f64,
    pub steps_per_sec: f64,
    /// Completion tokens of a step over the mean step time.
    pub completion_tokens_per_sec: f64,
    /// Completion tokens of a step over the mean generation time.
    pub generation_tokens_per_sec: f64,
    pub trainable_params: usize,
    /// The last timed step's loss.
    pub last_loss: f64,
    /// Peak process RSS during the timed steps (CPU), when the OS reports it.
    pub peak_rss_bytes: Option<u64>,
}

/// The synthetic reward both benchmarks use: a position-weighted sum of the completion's ids modulo 997, over
/// 997 (scripts/bench_trl_grpo.py computes the same), so a group's rewards differ and its advantages are not 0.
pub fn synthetic_reward(ids: &[u32]) -> f64 {
    let sum = ids.iter().enumerate().fold(0u64, |acc, (i, &id)| (acc + (i as u64 + 1) * id as u64) % 997);
    sum as f64 / 997.0
}

/// Deterministic random prompts: `count` rows of `len` ids below `vocab`.
fn random_prompts(vocab: usize, count: usize, len: usize) -> Vec<Vec<u32>> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    (0..count).map(|_| (0..len).map(|_| rng.random_range(0..vocab as u32)).collect()).collect()
}

/// Time full GRPO steps (generation, synthetic reward, one optimizer step) after `warmup_steps` untimed ones.
pub fn bench_grpo(model: &LoadedModel, spec: &GrpoBenchSpec) -> Result<GrpoBench> {
    if spec.prompts == 0 || spec.prompt_len == 0 {
        return Err(Error::InvalidSetting("--prompts and --prompt-len must be at least 1".into()));
    }
    let settings = GrpoSettings {
        num_generations: spec.num_generations,
        max_new_tokens: spec.max_new_tokens,
        num_iterations: 1,
        beta: 0.0,
        loss: GrpoLoss::Dapo,
        scale_rewards: ScaleRewards::Group,
        ..Default::default()
    };
    settings.validate()?;
    let context = model.config.max_position_embeddings;
    if spec.prompt_len + spec.max_new_tokens > context {
        return Err(Error::PromptTooLong {
            prompt_tokens: spec.prompt_len + spec.max_new_tokens,
            context_len: context,
        });
    }
    let mut m = model.model.clone();
    crate::engine::lora::detach_adapters(&mut m);
    let params = crate::engine::lora::attach_new_adapters(&mut m, &spec.lora, 0)?;
    let trainable_params = params.iter().map(|p| p.elem_count()).sum();
    let mut runner = crate::engine::train::StepRunner::new(m, &params, 0.0, None, 0)?;
    let pad_id = model.eos_token_ids.first().copied().unwrap_or(0);
    let objective = GrpoObjective::new(settings.clone(), &runner.model, pad_id);
    let prompts = random_prompts(model.config.vocab_size, spec.prompts, spec.prompt_len);
    let (mut gen_secs, mut train_secs, mut step_secs, mut last_loss) = (vec![], vec![], vec![], f64::NAN);
    for step in 0..spec.warmup_steps + spec.steps.max(1) {
        if step == spec.warmup_steps {
            crate::engine::device::reset_peak_rss();
        }
        let started = Instant::now();
        // No eos ids: every completion runs to max_new_tokens, as TRL's side does with min_new_tokens.
        let ctx = SamplingContext {
            model: &runner.model,
            tokenizer: &model.tokenizer,
            eos_token_ids: &[],
            settings: &settings,
        };
        let g = settings.num_generations;
        // Every prompt's group decodes in one batch, as a training step's micro-batch does.
        let draws: Vec<PromptDraw<'_>> = prompts
            .iter()
            .enumerate()
            .map(|(p, ids)| PromptDraw {
                prompt: p,
                ids,
                seeds: (0..g).map(|k| completion_seed(0, step, p * g + k)).collect(),
            })
            .collect();
        let completions = sample_prompts(&ctx, &draws, &|| false)?;
        let generation_secs = started.elapsed().as_secs_f64();
        let totals: Vec<f64> = completions.iter().map(|c| synthetic_reward(&c.ids)).collect();
        let adv = advantages(&totals, g, settings.scale_rewards);
        let rollout = Rollout {
            group: g,
            micro_sizes: vec![completions.len()],
            rewards: totals.iter().map(|&r| vec![r]).collect(),
            reward_totals: totals,
            advantages: adv.values,
            zero_std_groups: adv.zero_std_groups,
            completions,
            old_logps: None,
            ref_logps: None,
            generation_secs,
            reward_secs: 0.0,
        };
        let training = Instant::now();
        let begun = runner.begin_grpo(&objective, &rollout)?;
        let queued = runner.queue_update(begun, 1e-4)?;
        (last_loss, _) = runner.finish(queued)?;
        runner.model.device().synchronize()?;
        if !last_loss.is_finite() {
            return Err(Error::Training(format!("bench GRPO step {}: the loss is {last_loss}", step + 1)));
        }
        if step >= spec.warmup_steps {
            gen_secs.push(generation_secs);
            train_secs.push(training.elapsed().as_secs_f64());
            step_secs.push(started.elapsed().as_secs_f64());
        }
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let (mean_step_secs, mean_generation_secs) = (mean(&step_secs), mean(&gen_secs));
    step_secs.sort_by(f64::total_cmp);
    let tokens = (spec.prompts * spec.num_generations * spec.max_new_tokens) as f64;
    Ok(GrpoBench {
        prompts: spec.prompts,
        prompt_len: spec.prompt_len,
        num_generations: spec.num_generations,
        max_new_tokens: spec.max_new_tokens,
        rank: spec.lora.rank,
        targets: spec.lora.targets.names(),
        steps: step_secs.len(),
        mean_generation_secs,
        mean_training_secs: mean(&train_secs),
        mean_step_secs,
        median_step_secs: step_secs[step_secs.len() / 2],
        steps_per_sec: 1.0 / mean_step_secs,
        completion_tokens_per_sec: tokens / mean_step_secs,
        generation_tokens_per_sec: tokens / mean_generation_secs,
        trainable_params,
        last_loss,
        peak_rss_bytes: crate::engine::device::peak_rss_bytes(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn synthetic_reward_matches_the_python_formula_and_varies() {
        // sum((i + 1) * id) % 997 / 997, as scripts/bench_trl_grpo.py computes it.
        assert_eq!(synthetic_reward(&[5, 7, 1000]), ((5 + 14 + 3000) % 997) as f64 / 997.0);
        assert_ne!(synthetic_reward(&[1, 2]), synthetic_reward(&[2, 1]));
        let prompts = random_prompts(100, 2, 3);
        assert_eq!(prompts.len(), 2);
        assert!(prompts.iter().all(|p| p.len() == 3 && p.iter().all(|&id| id < 100)));
    }
}
