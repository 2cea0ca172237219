//! `--task generate`: answers to each row's prompt, scored against the row's reference answer.
//!
//! A row's prompt and reference: for chat rows (ShareGPT and Alpaca rows are chat rows once read) every message
//! before the last assistant turn is the prompt, rendered with the model's chat template and its generation
//! prompt exactly as the chat pane and `generate --chat` render it ([`chat_prompt`]), and that assistant turn is
//! the reference; a prompt/completion row is a user turn and its completion. Text rows have no reference. Every
//! row is checked (a reference, a prompt that fits) before anything is generated; a bad row is an error naming
//! its file and line. Scores are in `metrics.rs`, the optional judge in `judge.rs`.

use super::judge::Judge;
use super::metrics::Scorer;
use super::split::read_rows;
use super::{EvalSpec, GenerateSettings, Metric, PreparedTask};
use crate::engine::data::{chat_prompt, splits::problem_error, Row};
use crate::engine::generate::{generate, GenerateRequest};
use crate::engine::model::chat_template::ChatMessage;
use crate::engine::model::transformer::Transformer;
use crate::engine::model::LoadedModel;
use crate::engine::{Error, Result};
use serde_json::{json, Map, Value};

/// One row, ready to generate from.
struct PromptRow {
    line: usize,
    /// "file:line" (or "file: row N").
    source: String,
    prompt_ids: Vec<u32>,
    /// The last user message (the whole prompt when there is none): what the per-row JSON and the judge show.
    question: String,
    reference: String,
}

struct GenerateTask {
    rows: Vec<PromptRow>,
    settings: GenerateSettings,
    scorer: Scorer,
    judge: Option<Judge>,
    notes: Vec<String>,
}

/// The prompt messages and the reference of a row; an error message when it has no reference.
pub fn prompt_and_reference(row: &Row) -> std::result::Result<(Vec<ChatMessage>, String), String> {
    match row {
        Row::Completion { prompt, completion } => {
            Ok((vec![ChatMessage::new("user", prompt.clone())], completion.clone()))
        }
        Row::Chat(conversation) => {
            let messages = &conversation.messages;
            let last = messages.iter().rposition(|m| m.role == "assistant").ok_or_else(|| {
                "the row has no assistant message to use as the reference answer; end each row with the expected \
                 assistant reply"
                    .to_string()
            })?;
            if messages[last].content.trim().is_empty() {
                return Err(format!(
                    "the last assistant message (message {}) is empty: there is no reference answer to score against",
                    last + 1
                ));
            }
            if last == 0 {
                return Err("the row's first message is the assistant's: there is no prompt before it".into());
            }
            Ok((messages[..last].to_vec(), messages[last].content.clone()))
        }
        Row::Text(_) => Err("a text row has no reference answer; use chat rows (the last assistant message is the \
                              reference), prompt/completion rows or Alpaca rows"
            .into()),
        Row::Preference(_) => Err("a preference pair (`chosen`/`rejected`) is scored with --task preference, not by \
                                   generation against a reference answer"
            .into()),
        // A GRPO prompt is asked as messages (a text prompt as the user's turn) and scored against its answer.
        Row::Prompt(row) => {
            let answer = row.answer.clone().ok_or("the prompt has no `answer` to score the generation against")?;
            let messages = match &row.prompt {
                crate::engine::data::PreferenceTurns::Messages(messages) => messages.clone(),
                crate::engine::data::PreferenceTurns::Text(text) => vec![ChatMessage::new("user", text.clone())],
            };
            Ok((messages, answer))
        }
    }
}

/// Read and check the split's prompts and references, compile the regex, then load the judge: all before any
/// generation.
pub fn prepare(spec: &EvalSpec, settings: &GenerateSettings, base: &LoadedModel) -> Result<Box<dyn PreparedTask>> {
    settings.sampling.validate(settings.max_tokens)?;
    let scorer = Scorer::new(settings.regex.as_deref())?;
    let (split, mut notes) = read_rows(spec)?;
    let fits = spec.seq_len.min(base.config.max_position_embeddings);
    let mut rows = Vec::with_capacity(split.rows.len());
    for row in &split.rows {
        let fail = |message: String| problem_error(&split.problem(row, message));
        let (messages, reference) = prompt_and_reference(&row.row).map_err(fail)?;
        let prompt = chat_prompt(base, &messages).map_err(|e| fail(e.to_string()))?;
        if let Some(warning) = prompt.warning.filter(|w| !notes.contains(w)) {
            notes.push(warning);
        }
        if prompt.ids.len() >= fits {
            return Err(fail(format!(
                "the prompt is {} tokens; it must be shorter than the sequence length {fits} to leave room for an \
                 answer (raise --seq-len up to the model's context of {}, or shorten the row)",
                prompt.ids.len(),
                base.config.max_position_embeddings
            )));
        }
        let question = messages.iter().rev().find(|m| m.role == "user").unwrap_or(&messages[messages.len() - 1]);
        rows.push(PromptRow {
            line: row.line,
            source: split.file_of(row).locate(row.line),
            prompt_ids: prompt.ids,
            question: question.content.clone(),
            reference,
        });
    }
    if rows.is_empty() {
        return Err(Error::Data(format!("{}: the {} split has no rows to answer", split.path.display(), spec.split)));
    }
    let judge = match &settings.judge {
        Some(path) => {
            let judge = Judge::load(path, base)?;
            for row in &rows {
                judge.check_fits(&row.source, &row.question, &row.reference, settings.max_tokens)?;
            }
            notes.push(format!("judge: {}", path.display()));
            Some(judge)
        }
        None => None,
    };
    Ok(Box::new(GenerateTask { rows, settings: settings.clone(), scorer, judge, notes }))
}

impl PreparedTask for GenerateTask {
    fn rows(&self) -> usize {
        self.rows.len()
    }

    fn notes(&self) -> Vec<String> {
        self.notes.clone()
    }

    fn run(
        &self,
        base: &LoadedModel,
        model: &Transformer,
        progress: &mut dyn FnMut(usize) -> Result<()>,
    ) -> Result<(Vec<Metric>, Value)> {
        let names = self.scorer.names();
        let mut sums = vec![0.0; names.len()];
        let (mut judged, mut judge_sum, mut unparsed) = (0usize, 0.0, 0usize);
        let mut out = Vec::with_capacity(self.rows.len());
        for (i, row) in self.rows.iter().enumerate() {
            let request = GenerateRequest {
                prompt_ids: row.prompt_ids.clone(),
                max_new_tokens: self.settings.max_tokens,
                sampling: self.settings.sampling.clone(),
                eos_token_ids: base.eos_token_ids.clone(),
                ignore_eos: false,
                stop_strings: Vec::new(),
            };
            let answer = generate(model, &base.tokenizer, &request, &mut |_| true)?;
            let mut scores = Map::new();
            for (k, (name, value)) in self.scorer.score(&answer.text, &row.reference).into_iter().enumerate() {
                sums[k] += value;
                scores.insert(name.into(), json!(value));
            }
            let mut record = json!({
                "line": row.line,
                "source": row.source,
                "prompt": row.question,
                "reference": row.reference,
                "answer": answer.text,
                "stop_reason": answer.stop_reason.as_str(),
                "answer_tokens": answer.generated_ids.len(),
                "scores": scores,
            });
            if let Some(judge) = &self.judge {
                let verdict = judge.grade(&row.question, &row.reference, &answer.text)?;
                match verdict.score {
                    Some(score) => {
                        judged += 1;
                        judge_sum += f64::from(score);
                    }
                    None => unparsed += 1,
                }
                record["judge_score"] = json!(verdict.score);
                record["judge_reply"] = json!(verdict.reply);
            }
            out.push(record);
            progress(i + 1)?;
        }
        let n = self.rows.len().max(1) as f64;
        let mut metrics: Vec<Metric> = names.iter().zip(&sums).map(|(name, sum)| Metric::new(name, sum / n)).collect();
        if self.judge.is_some() {
            // A mean over the replies that held a score; NaN when none did (shown as such, never as 0).
            metrics.push(Metric::new("judge_score", if judged > 0 { judge_sum / judged as f64 } else { f64::NAN }));
            metrics.push(Metric::new("judge_unparsed", unparsed as f64));
        }
        metrics.push(Metric::new("rows", self.rows.len() as f64));
        Ok((metrics, Value::Array(out)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::data::Conversation;

    fn chat(pairs: &[(&str, &str)]) -> Row {
        Row::Chat(Conversation::from(
            pairs.iter().map(|(r, c)| ChatMessage::new(*r, c.to_string())).collect::<Vec<_>>(),
        ))
    }

    #[test]
    fn the_last_assistant_turn_is_the_reference() {
        let row =
            chat(&[("system", "terse"), ("user", "1+1?"), ("assistant", "2"), ("user", "2+2?"), ("assistant", "4")]);
        let (prompt, reference) = prompt_and_reference(&row).unwrap();
        assert_eq!(reference, "4");
        assert_eq!(prompt.len(), 4);
        assert_eq!(prompt[3].content, "2+2?");
        let completion = Row::Completion { prompt: "q".into(), completion: "a".into() };
        assert_eq!(prompt_and_reference(&completion).unwrap().1, "a");
    }

    #[test]
    fn rows_without_a_reference_are_refused() {
        assert!(prompt_and_reference(&chat(&[("user", "hi")])).unwrap_err().contains("no assistant message"));
        assert!(prompt_and_reference(&chat(&[("user", "hi"), ("assistant", " ")])).unwrap_err().contains("empty"));
        assert!(prompt_and_reference(&Row::Text("t".into())).unwrap_err().contains("text row"));
    }
}
