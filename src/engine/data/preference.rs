//! Preference pairs as token sequences, the way TRL's `DPOTrainer._prepare_dataset` and
//! `DataCollatorForPreference` make them: [`tokenize_pair`] turns a [`PreferenceRow`] into a chosen and a
//! rejected [`Example`] (prompt tokens masked, completion tokens trained), and [`collate_pairs`] pads a batch
//! of pairs into one [`Batch`] of chosen rows then rejected rows.
//!
//! - Conversational rows: `prompt_ids` = the template over the prompt with the generation prompt;
//!   `prompt + chosen` (and `prompt + rejected`) rendered without it. Rendered text is tokenized as chat rows
//!   are ([`super::tokenize`]: no special tokens unless the fallback format is used). Tools pass to the template.
//! - Standard rows: the eos token's text is appended to `chosen` and `rejected` unless they end with it, then
//!   `prompt` and `prompt + chosen` are tokenized as plain text with special tokens (BOS where the tokenizer adds
//!   one).
//! - The prompt is the shortest common prefix of `prompt_ids` with both full sequences (TRL's
//!   `common_prefix_length`), so tokens that merge across the boundary go to the completion.
//! - Each sequence is cut to `max_seq_len` keeping its start; a pair whose prompt alone fills `max_seq_len` has
//!   no completion token left and is dropped by the caller ([`Example::cut`]).
//!
//! `train_on_prompt` has no meaning here and is ignored; training refuses it for preference data
//! ([`super::tokenize_dataset`]).

use super::batches::{collate_rows, Batch};
use super::formats::{Conversation, PreferenceRow, PreferenceTurns, Row, RowKind};
use super::summary::SplitSummary;
use super::tokenize::{encode_rendered, Example, TokenizeSpec};
use super::{DatasetFormat, PreparedDataset, PreparedSplit, RawDataset};
use crate::engine::model::chat_template::ChatMessage;
use crate::engine::{Error, Result};

/// The chosen and rejected examples of one pair: `prompt_ids + completion_ids` each, `target_mask` true exactly
/// on the completion tokens (never on position 0), cut to `spec.max_seq_len` keeping the start.
pub fn tokenize_pair(row: &PreferenceRow, spec: &TokenizeSpec<'_>) -> Result<(Example, Example)> {
    if spec.max_seq_len < 2 {
        return Err(Error::InvalidSetting(format!(
            "max_seq_len is {}; it must be at least 2 tokens",
            spec.max_seq_len
        )));
    }
    let (prompt_ids, chosen_ids, rejected_ids) = match (&row.prompt, &row.chosen, &row.rejected) {
        (PreferenceTurns::Messages(prompt), PreferenceTurns::Messages(chosen), PreferenceTurns::Messages(rejected)) => {
            let tools = row.tools.as_deref();
            let full = |completion: &[ChatMessage]| -> Result<Vec<u32>> {
                let messages: Vec<ChatMessage> = prompt.iter().chain(completion).cloned().collect();
                let conversation = Conversation { messages, tools: row.tools.clone() };
                super::tool_support::check_tool_support(&conversation, spec.chat_template)?;
                let text = spec.render(&conversation.messages, tools, false)?;
                Ok(encode_rendered(&text, spec)?.get_ids().to_vec())
            };
            let prompt_text = spec.render(prompt, tools, true)?;
            (encode_rendered(&prompt_text, spec)?.get_ids().to_vec(), full(chosen)?, full(rejected)?)
        }
        (PreferenceTurns::Text(prompt), PreferenceTurns::Text(chosen), PreferenceTurns::Text(rejected)) => {
            let eos = spec.eos_text();
            let with_eos = |text: &str| if text.ends_with(&eos) { text.to_string() } else { format!("{text}{eos}") };
            let encode = |text: &str| spec.tokenizer.encode(text, true);
            (
                encode(prompt)?,
                encode(&format!("{prompt}{}", with_eos(chosen)))?,
                encode(&format!("{prompt}{}", with_eos(rejected)))?,
            )
        }
        _ => {
            return Err(Error::Data(
                "a preference row mixes text and message lists; write all of its fields in one form".into(),
            ))
        }
    };
    let prompt_len =
        common_prefix_length(&prompt_ids, &chosen_ids).min(common_prefix_length(&prompt_ids, &rejected_ids));
    Ok((masked(chosen_ids, prompt_len, spec.max_seq_len), masked(rejected_ids, prompt_len, spec.max_seq_len)))
}

/// A row as the trainer tokenizes it: a preference pair's chosen and rejected examples, or one example (and
/// `None`) for every other row (a GRPO prompt's has no targets: [`super::prompts`]). Training, the dataset report
/// and row browsing all tokenize through here.
pub fn tokenize_sequences(row: &Row, spec: &TokenizeSpec<'_>) -> Result<(Example, Option<Example>)> {
    match row {
        Row::Preference(pair) => tokenize_pair(pair, spec).map(|(chosen, rejected)| (chosen, Some(rejected))),
        Row::Prompt(prompt) => super::prompts::tokenize_prompt(prompt, spec).map(|example| (example, None)),
        row => super::tokenize::tokenize_row(row, spec).map(|example| (example, None)),
    }
}

/// Leading tokens two sequences share (TRL's `common_prefix_length`).
pub fn common_prefix_length(ids: &[u32], other: &[u32]) -> usize {
    ids.iter().zip(other).take_while(|(a, b)| a == b).count()
}

/// `ids` with everything from `prompt_len` on trained, cut to `max_seq_len`.
fn masked(mut ids: Vec<u32>, prompt_len: usize, max_seq_len: usize) -> Example {
    let mut target_mask: Vec<bool> = (0..ids.len()).map(|j| j >= prompt_len && j > 0).collect();
    let truncated = ids.len() > max_seq_len;
    ids.truncate(max_seq_len);
    target_mask.truncate(max_seq_len);
    Example { input_ids: ids, target_mask, truncated }
}

/// Tokens of the prompt an example starts with: those before its first trained token.
pub fn prompt_tokens(example: &Example) -> usize {
    // Position 0 is never trained, so a pair with an empty prompt shows one prompt token.
    example.target_mask.iter().position(|&t| t).unwrap_or(example.len()).max(1).min(example.len())
}

/// One batch of `2 * indices.len()` rows: rows `0..B` the chosen sequences of `indices` in order, rows `B..2B`
/// their rejected ones, all padded with `pad_id` to the longest of the `2B` (TRL's preference collator layout).
pub fn collate_pairs(split: &PreparedSplit, indices: &[usize], pad_id: u32) -> Result<Batch> {
    let rejected = split.rejected.as_ref().ok_or_else(|| {
        Error::Data("this split holds no preference pairs (no rejected sequences) to batch as pairs".into())
    })?;
    fn side<'a>(examples: &'a [Example], indices: &[usize], what: &str) -> Result<Vec<&'a Example>> {
        let row = |&i: &usize| {
            examples
                .get(i)
                .ok_or_else(|| Error::Data(format!("batch refers to {what} {i} but there are only {}", examples.len())))
        };
        indices.iter().map(row).collect()
    }
    let mut rows = side(&split.examples, indices, "chosen sequence")?;
    rows.extend(side(rejected, indices, "rejected sequence")?);
    collate_rows(&rows, pad_id)
}

impl PreparedDataset {
    /// Whether the dataset holds preference pairs (train with DPO or ORPO) rather than SFT examples.
    pub fn is_preference(&self) -> bool {
        self.train.rejected.is_some()
    }
}

/// Refuse what cannot be trained: preference pairs (or GRPO prompts) in some splits and other rows in others,
/// and `train_on_prompt` with pairs or prompts (DPO and ORPO compare completions after the prompt; GRPO trains
/// the completions it samples; the prompt is never trained).
pub(super) fn check_split_kinds(raw: &RawDataset, spec: &TokenizeSpec<'_>) -> Result<()> {
    let kind = |f: Option<DatasetFormat>| f.map(DatasetFormat::kind);
    let train_kind = kind(raw.train.format);
    for split in [raw.valid.as_ref(), raw.test.as_ref()].into_iter().flatten() {
        if split.format.is_some() && kind(split.format) != train_kind {
            let prompts = [kind(split.format), train_kind].contains(&Some(RowKind::Prompts));
            let what = if prompts { "GRPO prompts" } else { "preference pairs" };
            return Err(Error::Data(format!(
                "{}: the {} split holds {} rows but the train split ({}) holds {} rows; every split must hold \
                 {what}, or none",
                split.path.display(),
                split.name,
                split.format.map_or("no", DatasetFormat::name),
                raw.train.path.display(),
                raw.train.format.map_or("no", DatasetFormat::name),
            )));
        }
    }
    if train_kind == Some(RowKind::Prompts) && spec.train_on_prompt {
        return Err(Error::InvalidSetting(format!(
            "{}: train_on_prompt has no meaning for GRPO prompts (GRPO trains the completions it samples, never the \
             prompt); turn it off",
            raw.source.display()
        )));
    }
    if train_kind == Some(RowKind::Pairs) && spec.train_on_prompt {
        return Err(Error::InvalidSetting(format!(
            "{}: train_on_prompt has no meaning for preference pairs (DPO and ORPO compare the chosen and rejected \
             completions after the prompt); turn it off",
            raw.source.display()
        )));
    }
    Ok(())
}

/// "40 preference pairs for training, 10 for validation".
pub(super) fn pairs_note(train: &SplitSummary, valid: Option<&SplitSummary>) -> String {
    let mut note = format!("{} preference pairs for training", train.examples);
    if let Some(valid) = valid {
        note.push_str(&format!(", {} for validation", valid.examples));
    }
    note
}

#[cfg(test)]
#[path = "preference_tests.rs"]
mod tests;
