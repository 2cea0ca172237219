//! GRPO: reinforcement learning with verifiable rewards, generation inside the training loop.
//!
//! A step's batch is `batch_size` prompts (times `grad_accum`). For each prompt the policy (the model with its
//! adapter on) samples `num_generations` completions through the KV-cache generator (`rollout.rs`); the rewards
//! score them (`rewards/`); each completion's advantage is its reward against its group's (`objective.rs`); and
//! `num_iterations` optimizer steps follow on that batch of completions with TRL's clipped policy objective and,
//! with `beta > 0`, its KL term to the reference (the base with the adapter switched off; `step.rs`).
//!
//! - `settings.rs`: the parameters, in `TrainConfig::grpo`.
//! - `metrics.rs`: what a step reports (TRL's names) and the sampled completions the studio shows.
//! - `objective.rs`: advantages and the per-token clipped objective, its derivative and normalisation.
//! - `rewards/`: the rewards compiled from their specs, checked before training and run on each completion.

pub mod batch;
pub mod metrics;
pub mod objective;
pub mod rewards;
pub mod rollout;
pub mod round;
pub mod run;
pub mod settings;
pub mod step;

pub use metrics::{GrpoMetrics, GrpoSample};
pub use settings::{reward_names, GrpoLoss, GrpoSettings, RewardKind, RewardSpec, ScaleRewards};
