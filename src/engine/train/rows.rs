//! A run's training rows: its dataset read and tokenized for the model ([`prepare_data`]), and what its batch plan
//! orders, the examples one per row or with `--packing` the packs of them (`data::packing`, filled once per run).
//! One home for turning the plan's indices into a batch, so the trainer, a data-parallel rank's share and the rank
//! explorer collate alike.

use super::config::TrainConfig;
use crate::engine::data::{self, Batch, DataOptions, Example, PreparedDataset, TokenizeSpec};
use crate::engine::model::LoadedModel;
use crate::engine::Result;

/// Load and tokenize the dataset for `config` with `model`'s tokenizer and chat template.
pub fn prepare_data(config: &TrainConfig, model: &LoadedModel) -> Result<PreparedDataset> {
    let options = DataOptions {
        skip_invalid_rows: config.skip_invalid_rows,
        seed: config.seed,
        max_seq_len: config.seq_len,
        train_on_prompt: config.train_on_prompt,
        read: config.read_options(),
        ..Default::default()
    };
    let spec = TokenizeSpec::for_model(model, config.seq_len, config.train_on_prompt);
    let mut prepared = data::prepare_dataset(&config.data, &spec, &options)?;
    let warnings = crate::engine::data::eos_doctor::check_training(model, &prepared.train.examples);
    prepared.summary.notes.extend(warnings.iter().map(|w| format!("warning: {w}")));
    Ok(prepared)
}

/// The units the batch plan shuffles and batches.
pub struct TrainRows {
    /// Example indices of each pack (None: one example per row).
    packs: Option<Vec<Vec<usize>>>,
}

impl TrainRows {
    /// Examples one per row, or packed into rows of up to `config.seq_len` tokens when `config.packing`.
    pub fn new(config: &TrainConfig, examples: &[Example]) -> Self {
        let packs = config.packing.then(|| {
            let lengths: Vec<usize> = examples.iter().map(Example::len).collect();
            data::pack_examples(&lengths, config.seq_len)
        });
        Self { packs }
    }

    /// The token length of each unit the plan orders.
    pub fn lengths(&self, examples: &[Example]) -> Vec<usize> {
        let lengths: Vec<usize> = examples.iter().map(Example::len).collect();
        match &self.packs {
            Some(packs) => data::pack_lengths(packs, &lengths),
            None => lengths,
        }
    }

    /// The batch of the units at `indices` (as the plan numbers them).
    pub fn collate(&self, examples: &[Example], indices: &[usize], pad_id: u32) -> Result<Batch> {
        match &self.packs {
            Some(packs) => data::collate_packs(examples, packs, indices, pad_id),
            None => data::collate(examples, indices, pad_id),
        }
    }

    /// What packing made of the examples, for the run's start notes: rows, examples per row, fill.
    pub fn note(&self, examples: &[Example], seq_len: usize) -> Option<String> {
        let packs = self.packs.as_ref()?;
        let tokens: usize = examples.iter().map(Example::len).sum();
        let fill = 100.0 * tokens as f64 / (packs.len() * seq_len).max(1) as f64;
        Some(format!(
            "packing: {} examples in {} rows of up to {seq_len} tokens ({:.1} examples a row, {fill:.0}% of the \
             tokens real)",
            examples.len(),
            packs.len(),
            examples.len() as f64 / packs.len().max(1) as f64
        ))
    }
}
