//! What a GRPO training run keeps between steps: the objective, the compiled rewards, what sampling needs, and
//! the batch of completions in use (a round: sampled on its first step, trained on for `num_iterations` steps).
//! A checkpoint inside a round stores the round's completions (`grpo_rollout.json`), so a resume trains on
//! exactly what the uninterrupted run did.

use super::batch::Rollout;
use super::metrics::{GrpoMetrics, GrpoSample};
use super::rewards::Rewards;
use super::rollout::{sample_prompts, PromptDraw, SamplingContext};
use super::round::{reward_metrics, roll_out, samples, score, step_metrics, RoundSource};
use super::settings::{reward_names, GrpoSettings};
use super::step::{GrpoObjective, GrpoStepMetrics};
use crate::engine::data::PreparedSplit;
use crate::engine::model::tokenizer::TextTokenizer;
use crate::engine::model::transformer::Transformer;
use crate::engine::model::LoadedModel;
use crate::engine::{Error, Result};
use std::path::Path;

/// The file a checkpoint inside a round keeps the round's completions in.
pub const ROLLOUT_FILE: &str = "grpo_rollout.json";

/// How many sampled completions a Samples event shows.
const SAMPLES_SHOWN: usize = 4;

/// A GRPO run's state beside the model.
pub struct GrpoRun {
    pub objective: GrpoObjective,
    pub rewards: Rewards,
    pub names: Vec<String>,
    tokenizer: TextTokenizer,
    eos_token_ids: Vec<u32>,
    /// The round in use and the step it was sampled at.
    pub rollout: Option<(usize, Rollout)>,
}

impl GrpoRun {
    /// Compile the rewards and check them against the training prompts before any work: rows an answer-reading
    /// reward cannot score, reward programs that do not run, prompts that leave no room for the completions.
    pub fn prepare(
        settings: &GrpoSettings,
        base: &LoadedModel,
        train: &PreparedSplit,
        locate: &dyn Fn(usize) -> String,
        pad_id: u32,
    ) -> Result<Self> {
        settings.validate()?;
        let rewards = Rewards::new(&settings.rewards)?;
        let prompts = train.prompts.as_deref().unwrap_or_default();
        rewards.check_rows(prompts, locate)?;
        if let Some(first) = prompts.first() {
            rewards.preflight(first, &locate(0))?;
        }
        let context = base.config.max_position_embeddings;
        if let Some((i, longest)) = train.examples.iter().enumerate().max_by_key(|(_, e)| e.len()) {
            if longest.len() + settings.max_new_tokens > context {
                return Err(Error::InvalidSetting(format!(
                    "the longest prompt ({}, {} tokens) plus max_new_tokens (--max-new-tokens) {} is more than the \
                     model's context of {context} tokens; lower --max-new-tokens or shorten the prompts",
                    locate(i),
                    longest.len(),
                    settings.max_new_tokens
                )));
            }
        }
        Ok(Self {
            objective: GrpoObjective::new(settings.clone(), &base.model, pad_id),
            names: reward_names(&settings.rewards),
            rewards,
            tokenizer: base.tokenizer.clone(),
            eos_token_ids: base.eos_token_ids.clone(),
            rollout: None,
        })
    }

    fn context<'a>(&'a self, model: &'a Transformer, settings: &'a GrpoSettings) -> SamplingContext<'a> {
        SamplingContext { model, tokenizer: &self.tokenizer, eos_token_ids: &self.eos_token_ids, settings }
    }

    /// Whether optimizer step `step` (0-based, the count of steps done) starts a new round.
    pub fn starts_round(&self, step: usize) -> bool {
        step.is_multiple_of(self.objective.settings.num_iterations) || self.rollout.is_none()
    }

    /// Sample and score a new round on `model` for step `step` from the prompts `micro_batches`.
    pub fn new_round(
        &mut self,
        model: &Transformer,
        source: (&PreparedSplit, &dyn Fn(usize) -> String),
        micro_batches: &[Vec<usize>],
        (seed, step): (u64, usize),
        cancelled: &dyn Fn() -> bool,
    ) -> Result<()> {
        let settings = self.objective.settings.clone();
        let round = step / settings.num_iterations;
        let source = RoundSource { split: source.0, rewards: &self.rewards, locate: source.1 };
        let ctx = self.context(model, &settings);
        let rollout = roll_out(&self.objective, &ctx, &source, micro_batches, (seed, round), cancelled)?;
        self.rollout = Some((step, rollout));
        Ok(())
    }

    /// The metrics of step `step` (0-based) trained on the current round.
    pub fn metrics(&self, step: usize, measured: &GrpoStepMetrics, training_secs: f64) -> Option<GrpoMetrics> {
        let (start, rollout) = self.rollout.as_ref()?;
        Some(step_metrics(rollout, &self.names, measured, *start == step, training_secs))
    }

    /// A few of the current round's completions.
    pub fn samples(&self, split: &PreparedSplit, locate: &dyn Fn(usize) -> String) -> Vec<GrpoSample> {
        let Some((_, rollout)) = &self.rollout else { return Vec::new() };
        let source = RoundSource { split, rewards: &self.rewards, locate };
        samples(rollout, &source, &self.names, SAMPLES_SHOWN)
    }

    /// The round's completions to store in a checkpoint after step `step` (1-based count of steps done), when
    /// the round goes on after it.
    pub fn checkpoint_files(&self, step: usize) -> Result<Vec<(&'static str, Vec<u8>)>> {
        match &self.rollout {
            Some((start, rollout)) if step < start + self.objective.settings.num_iterations => {
                let bytes = serde_json::to_vec(&(start, rollout))
                    .map_err(|e| Error::Training(format!("could not store the GRPO batch: {e}")))?;
                Ok(vec![(ROLLOUT_FILE, bytes)])
            }
            _ => Ok(Vec::new()),
        }
    }

    /// Restore the round a checkpoint after step `step` was inside of (nothing at a round's end).
    pub fn restore(&mut self, checkpoint: &Path, step: usize) -> Result<()> {
        if step.is_multiple_of(self.objective.settings.num_iterations) {
            return Ok(());
        }
        let path = checkpoint.join(ROLLOUT_FILE);
        let bytes = std::fs::read(&path).map_err(|e| {
            Error::InvalidSetting(format!(
                "{} is inside a GRPO batch (step {step}, {} iterations per batch) but its completions could not be \
                 read from {}: {e}",
                checkpoint.display(),
                self.objective.settings.num_iterations,
                path.display()
            ))
        })?;
        let (start, rollout): (usize, Rollout) = serde_json::from_slice(&bytes)
            .map_err(|e| Error::InvalidSetting(format!("{} is not a GRPO batch: {e}", path.display())))?;
        self.rollout = Some((start, rollout));
        Ok(())
    }

    /// Validation: one greedy completion of each of (up to `max_prompts`, 0 = all) prompts of `split`, decoded
    /// `num_generations` prompts at a time (the batch a group decodes in), scored by the rewards; returns their
    /// metrics (val loss is minus the mean reward).
    pub fn validate(
        &self,
        model: &Transformer,
        split: &PreparedSplit,
        max_prompts: usize,
        locate: &dyn Fn(usize) -> String,
    ) -> Result<Option<GrpoMetrics>> {
        let Some(prompts) = split.prompts.as_ref().filter(|p| !p.is_empty()) else { return Ok(None) };
        let settings = GrpoSettings { temperature: 0.0, top_p: 1.0, top_k: 0, ..self.objective.settings.clone() };
        let ctx = self.context(model, &settings);
        let count = if max_prompts == 0 { prompts.len() } else { max_prompts.min(prompts.len()) };
        let mut completions = Vec::with_capacity(count);
        let prompts_per_batch = self.objective.settings.num_generations.max(1);
        for start in (0..count).step_by(prompts_per_batch) {
            let draws: Vec<PromptDraw<'_>> = (start..(start + prompts_per_batch).min(count))
                .map(|i| PromptDraw { prompt: i, ids: &split.examples[i].input_ids, seeds: vec![0] })
                .collect();
            completions.extend(sample_prompts(&ctx, &draws, &|| false)?);
        }
        let source = RoundSource { split, rewards: &self.rewards, locate };
        let table = score(&source, &completions, &|| false)?;
        Ok(Some(reward_metrics(&table.total, &table.values, &self.names, &completions)))
    }
}
