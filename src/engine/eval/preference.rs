//! `--task preference`: how a model (an adapter against its base) ranks the chosen answer over the rejected one
//! on held-out pairs, as DPO or ORPO measures it: the metrics a preference run reports under TRL's names
//! (`rewards/accuracies`, `rewards/margins`, `logps/chosen`, ...), and the per-pair log-probabilities and rewards.
//! The pairs are templated, masked and cut exactly as training does ([`tokenize_pair`]) and scored by training's
//! own objective ([`PreferenceObjective`]); DPO's reference is the base (the target's adapter switched off).

use super::split::read_rows;
use super::{EvalSpec, Metric, PreparedTask};
use crate::engine::data::{self, preference::tokenize_pair, PreparedSplit, Row, TokenizeSpec};
use crate::engine::model::transformer::Transformer;
use crate::engine::model::LoadedModel;
use crate::engine::train::method::{Method, PreferenceSettings};
use crate::engine::train::preference::objective::pair_rewards;
use crate::engine::train::preference::{PreferenceMetrics, PreferenceObjective};
use crate::engine::{Error, Result};
use serde_json::json;

/// Which preference method scores the pairs, with its parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PreferenceTask {
    pub method: Method,
    pub settings: PreferenceSettings,
}

/// The split's pairs, tokenized.
struct PairsTask {
    task: PreferenceTask,
    pairs: PreparedSplit,
    /// "file:line" of each pair.
    sources: Vec<String>,
    batch_size: usize,
    pad_id: u32,
    notes: Vec<String>,
}

/// Read and tokenize the split's pairs; a row that is not a preference pair, or that the template cannot render,
/// fails here by file and line.
pub fn prepare(spec: &EvalSpec, task: PreferenceTask, base: &LoadedModel) -> Result<Box<dyn PreparedTask>> {
    if !task.method.is_preference() {
        return Err(Error::InvalidSetting("the preference task scores pairs with --method dpo or orpo".into()));
    }
    task.settings.validate(task.method)?;
    let (split, mut notes) = read_rows(spec)?;
    let tokenize = TokenizeSpec::for_model(base, spec.seq_len, false);
    let mut pairs =
        PreparedSplit { examples: Vec::new(), rejected: Some(Vec::new()), source_lines: Vec::new(), prompts: None };
    let mut sources = Vec::new();
    let (mut truncated, mut dropped) = (0, 0);
    for sourced in &split.rows {
        let problem = |message: String| data::splits::problem_error(&split.problem(sourced, message));
        let Row::Preference(row) = &sourced.row else {
            return Err(problem(
                "this row is not a preference pair: the preference task needs `chosen` and `rejected` (and \
                 `prompt`) fields"
                    .into(),
            ));
        };
        let (chosen, rejected) = tokenize_pair(row, &tokenize).map_err(|e| problem(e.to_string()))?;
        let (chosen_cut, rejected_cut) = (chosen.cut(spec.seq_len), rejected.cut(spec.seq_len));
        truncated += usize::from(chosen_cut.truncated || rejected_cut.truncated);
        if chosen_cut.dropped() || rejected_cut.dropped() {
            dropped += 1;
            continue;
        }
        pairs.examples.push(chosen);
        pairs.rejected.get_or_insert_with(Vec::new).push(rejected);
        pairs.source_lines.push(sourced.line);
        sources.push(split.file_of(sourced).locate(sourced.line));
    }
    if truncated > 0 {
        notes.push(format!("{truncated} pairs were longer than the sequence length {} and were cut", spec.seq_len));
    }
    if dropped > 0 {
        notes.push(format!("{dropped} pairs had no answer tokens left after the cut and were not scored"));
    }
    if pairs.examples.is_empty() {
        return Err(Error::Data(format!(
            "{}: no pairs of the {} split have answer tokens to score ({} read); raise --seq-len or check the rows",
            split.path.display(),
            spec.split,
            split.rows.len()
        )));
    }
    let pad_id = base.eos_token_ids.first().copied().unwrap_or(0);
    Ok(Box::new(PairsTask { task, pairs, sources, batch_size: spec.batch_size, pad_id, notes }))
}

impl PreparedTask for PairsTask {
    fn rows(&self) -> usize {
        self.pairs.examples.len()
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
        let PreferenceTask { method, settings } = self.task;
        let objective = PreferenceObjective::new(method, settings, model);
        let mut parts = Vec::new();
        let mut per_pair = vec![None; self.rows()];
        let mut done = 0;
        for indices in data::eval_batches(&self.pairs.lengths(), self.batch_size) {
            let batch = data::collate_pairs(&self.pairs, &indices, self.pad_id)?;
            let (metrics, pairs) = objective.scored(model, &batch)?;
            parts.push(metrics);
            for (&i, pair) in indices.iter().zip(pairs) {
                per_pair[i] = Some(pair);
            }
            done += indices.len();
            progress(done)?;
        }
        let total = PreferenceMetrics::combine(&parts)
            .ok_or_else(|| Error::Data("the preference task scored no pairs".into()))?;
        let mut metrics: Vec<Metric> = total.named().into_iter().map(|(name, v)| Metric::new(name, v)).collect();
        metrics.push(Metric::new("rows", total.pairs as f64));
        let rows = per_pair
            .iter()
            .enumerate()
            .filter_map(|(i, pair)| pair.map(|p| (i, p)))
            .map(|(i, p)| {
                let (chosen_reward, rejected_reward) = pair_rewards(method, settings.beta, &p);
                // Log-probabilities as the method defines them (TRL's `logps/*`): DPO sums, ORPO averages per token.
                let per_token = |sum: f64, tokens: usize| match method {
                    Method::Orpo => sum / tokens.max(1) as f64,
                    _ => sum,
                };
                json!({
                    "line": self.pairs.source_lines[i],
                    "source": self.sources[i],
                    "chosen_logps": per_token(p.chosen, p.chosen_tokens),
                    "rejected_logps": per_token(p.rejected, p.rejected_tokens),
                    "ref_chosen_logps": (method == Method::Dpo).then_some(p.ref_chosen),
                    "ref_rejected_logps": (method == Method::Dpo).then_some(p.ref_rejected),
                    "chosen_tokens": p.chosen_tokens,
                    "rejected_tokens": p.rejected_tokens,
                    "chosen_reward": chosen_reward,
                    "rejected_reward": rejected_reward,
                    "preferred": chosen_reward > rejected_reward,
                })
            })
            .collect();
        Ok((metrics, serde_json::Value::Array(rows)))
    }
}
