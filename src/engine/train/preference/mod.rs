//! Preference training (DPO, IPO, ORPO): the losses on (chosen, rejected) pairs, matched against TRL 1.16.
//! `objective.rs` is the math on per-pair log-probabilities, `pair_batch.rs` maps a batch's tokens to pairs and
//! back, `step.rs` runs the model (reference and policy), `metrics.rs` names the results as TRL does.

pub mod metrics;
pub mod objective;
pub mod pair_batch;
mod step;

pub use metrics::PreferenceMetrics;
pub use step::PreferenceObjective;
