//! `--task loss`: loss and perplexity on a split, templated, masked and cut to the sequence length exactly as
//! training does ([`tokenize_row`], [`Example::cut`]) and scored by training's own batch loss
//! ([`batch_row_nll`], the per-row form of the validation loss): `loss` is the mean negative log-likelihood per
//! target token over the whole split, `perplexity` its exponential. Rows that keep no target token after the cut
//! are dropped, as training drops them (and counted in a note).

use super::split::read_rows;
use super::{EvalSpec, Metric, PreparedTask};
use crate::engine::data::{self, collate, eval_batches, tokenize_row, Example, TokenizeSpec};
use crate::engine::model::transformer::Transformer;
use crate::engine::model::LoadedModel;
use crate::engine::train::loss::batch_row_nll;
use crate::engine::{Error, Result};
use serde_json::json;

/// The split tokenized, with where each example came from.
struct LossTask {
    examples: Vec<Example>,
    /// "file:line" of each example (or "file: row N").
    sources: Vec<String>,
    lines: Vec<usize>,
    batch_size: usize,
    pad_id: u32,
    notes: Vec<String>,
}

/// Read and tokenize the split for the loss task; a row the template cannot render fails here, by file and line.
pub fn prepare(spec: &EvalSpec, base: &LoadedModel) -> Result<Box<dyn PreparedTask>> {
    let (split, mut notes) = read_rows(spec)?;
    let tokenize = TokenizeSpec::for_model(base, spec.seq_len, spec.train_on_prompt);
    if tokenize.uses_fallback_template() && split.format != Some(data::DatasetFormat::Text) {
        notes.push(data::tokenize::FALLBACK_TEMPLATE_NOTE.into());
    }
    let (mut truncated, mut dropped) = (0, 0);
    let mut task = LossTask {
        examples: Vec::new(),
        sources: Vec::new(),
        lines: Vec::new(),
        batch_size: spec.batch_size,
        pad_id: base.eos_token_ids.first().copied().unwrap_or(0),
        notes: Vec::new(),
    };
    for row in &split.rows {
        let example = tokenize_row(&row.row, &tokenize)
            .map_err(|e| data::splits::problem_error(&split.problem(row, e.to_string())))?;
        let cut = example.cut(spec.seq_len);
        truncated += usize::from(cut.truncated);
        if cut.dropped() {
            dropped += 1;
            continue;
        }
        task.examples.push(example);
        task.sources.push(split.file_of(row).locate(row.line));
        task.lines.push(row.line);
    }
    if truncated > 0 {
        notes.push(format!("{truncated} rows were longer than the sequence length {} and were cut", spec.seq_len));
    }
    if dropped > 0 {
        notes.push(format!("{dropped} rows had no target tokens left after the cut and were not scored"));
    }
    if task.examples.is_empty() {
        return Err(Error::Data(format!(
            "{}: no rows of the {} split have target tokens to score ({} read, {dropped} with none left after the \
             cut to {} tokens); raise --seq-len or check the rows",
            split.path.display(),
            spec.split,
            split.rows.len(),
            spec.seq_len
        )));
    }
    task.notes = notes;
    Ok(Box::new(task))
}

impl PreparedTask for LossTask {
    fn rows(&self) -> usize {
        self.examples.len()
    }

    fn notes(&self) -> Vec<String> {
        self.notes.clone()
    }

    fn run(
        &self,
        _base: &LoadedModel,
        model: &Transformer,
        progress: &mut dyn FnMut(usize) -> Result<()>,
    ) -> Result<(Vec<Metric>, serde_json::Value)> {
        let lengths: Vec<usize> = self.examples.iter().map(Example::len).collect();
        let mut per_row = vec![(0.0, 0usize); self.examples.len()];
        let mut done = 0;
        for indices in eval_batches(&lengths, self.batch_size) {
            let batch = collate(&self.examples, &indices, self.pad_id)?;
            for (&i, row) in indices.iter().zip(batch_row_nll(model, &batch)?) {
                per_row[i] = row;
            }
            done += indices.len();
            progress(done)?;
        }
        let total: f64 = per_row.iter().map(|r| r.0).sum();
        let tokens: usize = per_row.iter().map(|r| r.1).sum();
        let loss = total / tokens.max(1) as f64;
        let metrics = vec![
            Metric::new("loss", loss),
            Metric::new("perplexity", loss.exp()),
            Metric::new("target_tokens", tokens as f64),
            Metric::new("rows", per_row.len() as f64),
        ];
        let rows = per_row
            .iter()
            .enumerate()
            .map(|(i, &(nll, n))| {
                json!({
                    "line": self.lines[i],
                    "source": self.sources[i],
                    "target_tokens": n,
                    "loss": nll / n.max(1) as f64,
                })
            })
            .collect();
        Ok((metrics, serde_json::Value::Array(rows)))
    }
}
