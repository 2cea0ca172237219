//! `--task multiple-choice`: the log-likelihood of each choice as lm-evaluation-harness's `multiple_choice`
//! output type computes it with its Hugging Face model (`HFLM`, lm-eval 0.4):
//!
//! - each choice is the continuation `" " + choice` (the target delimiter) of the row's context;
//! - `_encode_pair`: trailing whitespace of the context moves to the continuation; the continuation's tokens
//!   are those of `tokenize(context + continuation)` after as many as `tokenize(context)` has, and the model
//!   reads `tokenize(context) + continuation tokens`; an empty context is the BOS token (else the EOS token)
//!   alone, unless the continuation's first token is that token;
//! - tokenizing adds the tokenizer's own special tokens (HFLM's default: Gemma's and Llama 3's tokenizers
//!   prepend BOS, SmolLM2's and Qwen's add nothing), except to a text that already starts with the BOS token;
//! - the input is cut from the left to the last `max_length + 1` tokens (minus the last), `max_length` being
//!   the model's context or the spec's sequence length if smaller;
//! - `ll` = the sum of the continuation tokens' log-softmax; `is_greedy` = every one of them is the argmax;
//! - `acc` = argmax of `ll` is gold; `acc_norm` = argmax of `ll / len(choice)` in characters (the choice
//!   without the delimiter) is gold; the first maximum wins, as numpy's argmax; `*_stderr` is the sample
//!   standard deviation over the square root of the row count, as lm-eval reports it.
//!
//! The sequences of several rows run in one right-padded forward pass (a causal model's positions never see
//! the padding after them, so the result is the same as one by one).

use super::choice_rows::{read_choice_rows, ChoiceRow, ChoiceRows};
use super::{EvalSpec, Metric, PreparedTask};
use crate::engine::model::tokenizer::TextTokenizer;
use crate::engine::model::transformer::Transformer;
use crate::engine::model::LoadedModel;
use crate::engine::{Error, Result};
use candle_core::{DType, Tensor};
use serde::Serialize;

/// lm-eval's default `target_delimiter`.
pub const TARGET_DELIMITER: &str = " ";

/// How text becomes tokens, as HFLM's `tok_encode` does it.
pub struct PairEncoder<'a> {
    tokenizer: &'a TextTokenizer,
    /// BOS if the tokenizer names one, else EOS: what stands for an empty context.
    prefix_token: Option<u32>,
    /// That token's text: a text starting with it gets no special tokens added.
    prefix_text: Option<String>,
}

impl<'a> PairEncoder<'a> {
    pub fn new(tokenizer: &'a TextTokenizer) -> Self {
        let named = |t: &Option<String>| t.as_deref().and_then(|t| tokenizer.token_to_id(t));
        let prefix_token = named(&tokenizer.bos_token).or_else(|| named(&tokenizer.eos_token));
        let prefix_text = prefix_token.and_then(|id| tokenizer.decode(&[id], false).ok()).filter(|t| !t.is_empty());
        Self { tokenizer, prefix_token, prefix_text }
    }

    /// `tok_encode(text)`: the tokenizer's special tokens added, unless `text` starts with the BOS text.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let has_prefix = self.prefix_text.as_deref().is_some_and(|p| text.starts_with(p));
        self.tokenizer.encode(text, !has_prefix)
    }

    /// The (context, continuation) tokens of one request, as lm-eval's `loglikelihood` + `_encode_pair`.
    pub fn encode_pair(&self, context: &str, continuation: &str) -> Result<(Vec<u32>, Vec<u32>)> {
        if context.is_empty() {
            let continuation = self.tokenizer.encode(continuation, false)?;
            let prefix = self.prefix_token.ok_or_else(|| {
                Error::InvalidSetting(
                    "a row has an empty context and the tokenizer names no BOS or EOS token to stand for it".into(),
                )
            })?;
            return Ok(match continuation.first() {
                Some(&first) if first == prefix => (vec![first], continuation[1..].to_vec()),
                _ => (vec![prefix], continuation),
            });
        }
        let trimmed = context.trim_end();
        let (context, continuation) = if trimmed.len() < context.len() {
            (trimmed, format!("{}{continuation}", &context[trimmed.len()..]))
        } else {
            (context, continuation.to_string())
        };
        let whole = self.encode(&format!("{context}{continuation}"))?;
        let context_ids = self.encode(context)?;
        let continuation_ids = whole.get(context_ids.len()..).unwrap_or_default().to_vec();
        Ok((context_ids, continuation_ids))
    }

    /// Whether the tokenizer adds tokens of its own to a plain text (a BOS, usually).
    pub fn adds_special_tokens(&self) -> Result<bool> {
        Ok(self.tokenizer.encode("a", true)? != self.tokenizer.encode("a", false)?)
    }
}

/// The index of the first largest value (numpy's `argmax`).
pub fn argmax(values: &[f64]) -> usize {
    let mut best = 0;
    for (i, v) in values.iter().enumerate() {
        if *v > values[best] {
            best = i;
        }
    }
    best
}

/// lm-eval's `acc_norm` choice: the first largest `ll / len(choice)`, the length in characters.
pub fn pred_norm(loglikelihoods: &[f64], choices: &[String]) -> usize {
    let normed: Vec<f64> = loglikelihoods.iter().zip(choices).map(|(ll, c)| ll / c.chars().count() as f64).collect();
    argmax(&normed)
}

/// A mean and lm-eval's `mean_stderr` (sample standard deviation / sqrt(n); none below two rows).
fn mean_and_stderr(values: &[f64]) -> (f64, Option<f64>) {
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    if values.len() < 2 {
        return (mean, None);
    }
    let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0);
    (mean, Some(var.sqrt() / n.sqrt()))
}

/// One scored sequence: the model's input and how many of its last positions predict the continuation.
struct Request {
    input: Vec<u32>,
    continuation: Vec<u32>,
}

/// What one row scored, as the per-row JSON has it.
#[derive(Debug, Clone, Serialize)]
struct RowResult<'a> {
    context: &'a str,
    choices: &'a [String],
    gold: usize,
    loglikelihoods: Vec<f64>,
    is_greedy: Vec<bool>,
    pred: usize,
    pred_norm: usize,
    acc: f64,
    acc_norm: f64,
    /// Where the row came from: `file.jsonl:3` or `file.parquet: row 3`.
    source: String,
}

/// The rows read and tokenized.
struct Prepared {
    rows: ChoiceRows,
    /// Per row, per choice.
    requests: Vec<Vec<Request>>,
    batch_size: usize,
    notes: Vec<String>,
}

/// Read the choice rows and tokenize every (context, choice) pair; a continuation longer than the context
/// length is refused here.
pub fn prepare(spec: &EvalSpec, base: &LoadedModel) -> Result<Box<dyn PreparedTask>> {
    let rows = read_choice_rows(&spec.data, spec.split, spec.limit)?;
    let max_length = spec.seq_len.min(base.config.max_position_embeddings);
    let encoder = PairEncoder::new(&base.tokenizer);
    let mut notes = vec![rows.note.clone()];
    notes.push(match encoder.adds_special_tokens()? {
        true => "the tokenizer adds its special tokens (a BOS) to each context, as lm-eval's HF model does".into(),
        false => "no BOS token: the tokenizer adds none, as lm-eval's HF model would not".into(),
    });
    let mut truncated = 0;
    let mut requests = Vec::with_capacity(rows.rows.len());
    for row in &rows.rows {
        let mut per_choice = Vec::with_capacity(row.choices.len());
        for choice in &row.choices {
            let (context, continuation) = encoder
                .encode_pair(&row.context, &format!("{TARGET_DELIMITER}{choice}"))
                .map_err(|e| Error::Data(format!("{}: {e}", rows.files[row.file].locate(row.position))))?;
            if continuation.is_empty() || continuation.len() > max_length {
                return Err(Error::Data(format!(
                    "{}: the choice \"{choice}\" is {} tokens; it must be 1 to {max_length} (the sequence length)",
                    rows.files[row.file].locate(row.position),
                    continuation.len()
                )));
            }
            let mut input = context;
            input.extend_from_slice(&continuation);
            if input.len() > max_length + 1 {
                truncated += 1;
                input.drain(..input.len() - (max_length + 1));
            }
            input.pop();
            per_choice.push(Request { input, continuation });
        }
        requests.push(per_choice);
    }
    if truncated > 0 {
        notes
            .push(format!("{truncated} sequences were cut from the left to {max_length} tokens, as lm-eval cuts them"));
    }
    Ok(Box::new(Prepared { rows, requests, batch_size: spec.batch_size, notes }))
}

impl PreparedTask for Prepared {
    fn rows(&self) -> usize {
        self.rows.rows.len()
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
        let mut scores: Vec<Vec<(f64, bool)>> = Vec::with_capacity(self.requests.len());
        let mut start = 0;
        while start < self.requests.len() {
            // Whole rows per forward pass, at least one, at most `batch_size` sequences when rows allow.
            let mut end = start + 1;
            let mut count = self.requests[start].len();
            while end < self.requests.len() && count + self.requests[end].len() <= self.batch_size {
                count += self.requests[end].len();
                end += 1;
            }
            let batch: Vec<&Request> = self.requests[start..end].iter().flatten().collect();
            let mut scored = score_batch(model, &batch)?.into_iter();
            for row in &self.requests[start..end] {
                scores.push(scored.by_ref().take(row.len()).collect());
            }
            start = end;
            progress(start)?;
        }
        Ok(report(&self.rows, &scores))
    }
}

/// `(ll, is_greedy)` of each request, from one right-padded forward pass.
fn score_batch(model: &Transformer, batch: &[&Request]) -> Result<Vec<(f64, bool)>> {
    let width = batch.iter().map(|r| r.input.len()).max().unwrap_or(0);
    let mut ids = Vec::with_capacity(batch.len() * width);
    for request in batch {
        ids.extend_from_slice(&request.input);
        ids.resize(ids.len() + width - request.input.len(), 0);
    }
    let input = Tensor::from_vec(ids, (batch.len(), width), model.device())?;
    let hidden = model.forward_hidden(&input, 0, None)?;
    // The positions that predict each continuation: the last `len(continuation)` of its input.
    let mut rows = Vec::with_capacity(batch.len());
    for (b, request) in batch.iter().enumerate() {
        let n = request.continuation.len();
        rows.push(hidden.get(b)?.narrow(0, request.input.len() - n, n)?);
    }
    let logits = model.logits(&Tensor::cat(&rows, 0)?)?.to_dtype(DType::F32)?.to_vec2::<f32>()?;
    let mut out = Vec::with_capacity(batch.len());
    let mut at = 0;
    for request in batch {
        let (mut ll, mut greedy) = (0.0f64, true);
        for &target in &request.continuation {
            let row = &logits[at];
            at += 1;
            let best = row.iter().enumerate().fold(0, |best, (i, v)| if *v > row[best] { i } else { best });
            let max = f64::from(row[best]);
            let sum: f64 = row.iter().map(|v| (f64::from(*v) - max).exp()).sum();
            let value = row.get(target as usize).copied().ok_or_else(|| {
                Error::InvalidSetting(format!("token id {target} is beyond the model's vocabulary of {}", row.len()))
            })?;
            ll += f64::from(value) - max - sum.ln();
            greedy &= best == target as usize;
        }
        out.push((ll, greedy));
    }
    Ok(out)
}

/// Metrics and per-row JSON from each row's `(ll, is_greedy)` per choice.
fn report(rows: &ChoiceRows, scores: &[Vec<(f64, bool)>]) -> (Vec<Metric>, serde_json::Value) {
    let mut results = Vec::with_capacity(scores.len());
    for (row, scored) in rows.rows.iter().zip(scores) {
        results.push(row_result(rows, row, scored));
    }
    let acc: Vec<f64> = results.iter().map(|r| r.acc).collect();
    let acc_norm: Vec<f64> = results.iter().map(|r| r.acc_norm).collect();
    let (acc, acc_stderr) = mean_and_stderr(&acc);
    let (acc_norm, acc_norm_stderr) = mean_and_stderr(&acc_norm);
    let mut metrics = vec![Metric::new("acc", acc), Metric::new("acc_norm", acc_norm)];
    metrics.extend(acc_stderr.map(|v| Metric::new("acc_stderr", v)));
    metrics.extend(acc_norm_stderr.map(|v| Metric::new("acc_norm_stderr", v)));
    (metrics, serde_json::to_value(&results).unwrap_or_default())
}

fn row_result<'a>(rows: &ChoiceRows, row: &'a ChoiceRow, scored: &[(f64, bool)]) -> RowResult<'a> {
    let loglikelihoods: Vec<f64> = scored.iter().map(|(ll, _)| *ll).collect();
    let pred = argmax(&loglikelihoods);
    let pred_norm = pred_norm(&loglikelihoods, &row.choices);
    RowResult {
        context: &row.context,
        choices: &row.choices,
        gold: row.gold,
        is_greedy: scored.iter().map(|(_, g)| *g).collect(),
        pred,
        pred_norm,
        acc: f64::from(u8::from(pred == row.gold)),
        acc_norm: f64::from(u8::from(pred_norm == row.gold)),
        source: rows.files.get(row.file).map(|f| f.locate(row.position)).unwrap_or_default(),
        loglikelihoods,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argmax_takes_the_first_maximum_and_acc_norm_divides_by_characters() {
        assert_eq!(argmax(&[-3.0, -1.0, -1.0]), 1);
        // "no" (2 chars) at -2 is -1.0 per char; "yes, surely" (11) at -5.5 is -0.5: the longer one wins.
        let choices = vec!["no".to_string(), "yes, surely".into()];
        assert_eq!(argmax(&[-2.0, -5.5]), 0);
        assert_eq!(pred_norm(&[-2.0, -5.5], &choices), 1);
        // Characters, not bytes: "é" is one.
        assert_eq!(pred_norm(&[-1.0, -1.9], &["é".to_string(), "ab".into()]), 1);
    }

    #[test]
    fn stderr_is_the_sample_standard_error() {
        let (mean, stderr) = mean_and_stderr(&[1.0, 0.0, 1.0, 1.0]);
        assert_eq!(mean, 0.75);
        assert!((stderr.unwrap() - 0.25).abs() < 1e-12, "{stderr:?}");
        assert_eq!(mean_and_stderr(&[1.0]).1, None);
    }
}
