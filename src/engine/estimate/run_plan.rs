//! The memory plan of a run about to start, on the rows it will really see: its dataset's longest training row
//! (templated, tokenized, cut at `seq_len`) sets the padded batch the estimate assumes ([`padded_to_data`]),
//! `checkpointing = auto` is decided on that estimate, and the warning (if the run would not fit) and notes are
//! what the CLI prints and the studio logs. One function, so both front ends say the same.

use super::{memory_warning, padded_to_data, padding_assumption, resolve_checkpointing, training_memory, ModelShape};
use crate::engine::model::LoadedModel;
use crate::engine::train::{prepare_data, TrainConfig, TrainRows};
use crate::engine::Result;

/// Tokens in the longest training row of `config`'s dataset for `model` (at most `config.seq_len`; with
/// packing, the fullest pack); None when the split is empty. Reads and tokenizes the training split (the run
/// reads it again).
pub fn longest_train_row(config: &TrainConfig, model: &LoadedModel) -> Result<Option<usize>> {
    let prepared = prepare_data(config, model)?;
    let rows = TrainRows::new(config, &prepared.train.examples).lengths(&prepared.train.examples);
    Ok(rows.into_iter().map(|n| n.min(config.seq_len)).max())
}

/// What a front end says before a run: the memory warning, if the run would not fit, and notes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MemoryPlan {
    pub warning: Option<String>,
    pub notes: Vec<String>,
}

/// Decide `checkpointing = auto` in `config` for `model` on its device, on the estimate for the dataset's real
/// row lengths. A dataset that cannot be read is left to the run to report; the estimate then assumes rows of
/// the full sequence length.
pub fn plan_run_memory(config: &mut TrainConfig, model: &LoadedModel) -> MemoryPlan {
    let device = model.model.device();
    let (budget, name) =
        (crate::engine::device::memory_budget_bytes(device), crate::engine::device::memory_budget_name(device));
    let shape = ModelShape::of_model(&model.model);
    let longest = longest_train_row(config, model).ok().flatten();
    let mut estimated = padded_to_data(config, longest);
    let mut plan = MemoryPlan { warning: memory_warning(&shape, &estimated, budget, name), notes: Vec::new() };
    if let Some(note) = resolve_checkpointing(&shape, &mut estimated, budget, name) {
        plan.notes.push(note);
    }
    plan.notes.extend(super::offload_host_note(&shape, &estimated));
    let total = training_memory(&shape, &estimated).total_bytes();
    plan.notes.push(format!(
        "memory estimate {:.2} GB ({:.2} GiB); it {}",
        total as f64 / 1e9,
        total as f64 / (1u64 << 30) as f64,
        padding_assumption(config, longest)
    ));
    config.checkpointing = estimated.checkpointing;
    plan
}
