//! How a run's training examples become micro-batches and optimizer steps: `iters` or `epochs`, gradient
//! accumulation, and GRPO's `num_iterations` steps on each step's worth of prompts.

use super::config::TrainConfig;
use super::validate;
use crate::engine::data::{self, BatchOptions, BatchPlan};
use crate::engine::{Error, Result};

/// The batch plan (micro-batches) for a config over `train_lengths`, and the number of optimizer steps.
pub fn plan_batches(config: &TrainConfig, train_lengths: Vec<usize>) -> Result<(BatchPlan, usize)> {
    let per_epoch = train_lengths.len().div_ceil(config.batch_size).max(1);
    // GRPO trains `num_iterations` steps on each step's worth of prompts.
    let iterations = if config.method.is_reinforcement() { config.grpo.num_iterations.max(1) } else { 1 };
    let micro_batches = match config.iters {
        Some(iters) => iters.div_ceil(iterations) * config.grad_accum,
        // A saturating cast: an absurd epoch count becomes a huge number that the bound below refuses.
        None => ((config.epochs.unwrap_or(1.0) * per_epoch as f64).round() as usize).max(1),
    };
    let steps = match config.iters {
        Some(iters) => iters,
        None => micro_batches.div_ceil(config.grad_accum) * iterations,
    };
    if steps > validate::MAX_STEPS {
        return Err(Error::InvalidSetting(format!(
            "epochs {} over {} training examples make {steps} optimizer steps; at most {} are allowed, so lower \
             `epochs` (--epochs) or set `iters` (--iters)",
            config.epochs.unwrap_or(1.0),
            train_lengths.len(),
            validate::MAX_STEPS
        )));
    }
    let plan = BatchPlan::new(
        train_lengths,
        BatchOptions {
            batch_size: config.batch_size,
            seed: config.seed,
            schedule: data::Schedule::Iterations(micro_batches),
            ..Default::default()
        },
    )?;
    Ok((plan, steps))
}
