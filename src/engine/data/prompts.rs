//! GRPO prompts as token ids, the way TRL's `GRPOTrainer._tokenize_prompts` makes them: [`tokenize_prompt`]
//! turns a [`PromptRow`] into an [`Example`] whose ids are the prompt the model continues and whose target mask
//! is all false (GRPO's targets are the completions it samples).
//!
//! - Conversational prompts (messages; a gsm8k question is one user turn): the chat template with the generation
//!   prompt (`apply_chat_template(..., add_generation_prompt=True)`), tokenized as chat rows are
//!   ([`super::tokenize`]: no special tokens unless the fallback format is used). Tools pass to the template.
//! - Standard prompts (a `prompt` string): the text tokenized as it is, with special tokens (BOS where the
//!   tokenizer adds one), as TRL tokenizes a standard prompt.
//! - A prompt is never cut (its end is where the answer starts): one longer than `max_seq_len` is dropped, and the
//!   dataset's notes name where such prompts are ([`keep_prompt`]).

use super::formats::{Conversation, PreferenceTurns, PromptRow, RowKind};
use super::summary::SplitSummary;
use super::tokenize::{encode_rendered, Example, TokenizeSpec};
use super::PreparedDataset;
use crate::engine::Result;

/// The prompt's ids with no targets; `truncated` marks a prompt longer than `spec.max_seq_len` (whole, not cut).
pub fn tokenize_prompt(row: &PromptRow, spec: &TokenizeSpec<'_>) -> Result<Example> {
    let input_ids = match &row.prompt {
        PreferenceTurns::Messages(messages) => {
            let conversation = Conversation { messages: messages.clone(), tools: row.tools.clone() };
            super::tool_support::check_tool_support(&conversation, spec.chat_template)?;
            let text = spec.render(messages, row.tools.as_deref(), true)?;
            encode_rendered(&text, spec)?.get_ids().to_vec()
        }
        PreferenceTurns::Text(text) => spec.tokenizer.encode(text, true)?,
    };
    let truncated = input_ids.len() > spec.max_seq_len;
    Ok(Example { target_mask: vec![false; input_ids.len()], input_ids, truncated })
}

/// Whether a tokenized prompt fits `max_seq_len` (the one rule for training and the dataset report).
pub fn prompt_fits(example: &Example, max_seq_len: usize) -> bool {
    !example.is_empty() && example.len() <= max_seq_len
}

/// Add a tokenized prompt to a split's summary: counted (tokens, length) when it fits, else counted as dropped
/// with its location noted. Returns whether it is kept.
pub(super) fn keep_prompt(
    example: &Example,
    max_seq_len: usize,
    location: impl FnOnce() -> String,
    summary: &mut SplitSummary,
    too_long: &mut Vec<String>,
) -> bool {
    if !prompt_fits(example, max_seq_len) {
        summary.dropped += 1;
        too_long.push(format!("{} ({} tokens)", location(), example.len()));
        return false;
    }
    summary.tokens += example.len();
    summary.lengths.push(example.len());
    true
}

/// "3 prompts longer than max_seq_len 64 were dropped (leaving no room to generate): d/train.jsonl:4 (70 tokens),
/// ...": the rows, so the user can shorten them or raise the sequence length.
pub(super) fn too_long_note(too_long: &[String], max_seq_len: usize) -> Option<String> {
    let listed = 5;
    (!too_long.is_empty()).then(|| {
        format!(
            "{} prompt{} longer than max_seq_len {max_seq_len} {} dropped: {}{}; raise --seq-len or shorten them",
            too_long.len(),
            if too_long.len() == 1 { "" } else { "s" },
            if too_long.len() == 1 { "was" } else { "were" },
            too_long.iter().take(listed).cloned().collect::<Vec<_>>().join(", "),
            if too_long.len() > listed { ", ..." } else { "" }
        )
    })
}

/// "400 prompts for training (400 with an answer), 48 for validation".
pub(super) fn prompts_note(dataset: &PreparedDataset) -> String {
    let with_answer = |rows: &[PromptRow]| rows.iter().filter(|r| r.answer.is_some()).count();
    let train = dataset.train.prompts.as_deref().unwrap_or_default();
    let mut note = format!("{} prompts for training ({} with an answer)", train.len(), with_answer(train));
    if let Some(valid) = dataset.valid.as_ref().and_then(|v| v.prompts.as_deref()) {
        note.push_str(&format!(", {} for validation", valid.len()));
    }
    note
}

impl PreparedDataset {
    /// Whether the dataset holds GRPO prompts rather than SFT examples or preference pairs.
    pub fn is_prompts(&self) -> bool {
        self.train.prompts.is_some()
    }

    /// What the training split's rows train (supervised targets, pairs or prompts).
    pub fn row_kind(&self) -> RowKind {
        self.summary.format.kind()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::data::tokenize::tests::{byte_tokenizer, CHATML};
    use crate::engine::model::chat_template::{ChatMessage, ChatTemplate};

    fn spec<'a>(
        tok: &'a crate::engine::model::tokenizer::TextTokenizer,
        t: Option<&'a ChatTemplate>,
    ) -> TokenizeSpec<'a> {
        TokenizeSpec { tokenizer: tok, chat_template: t, eos_token_id: None, max_seq_len: 64, train_on_prompt: false }
    }

    #[test]
    fn messages_end_with_the_generation_prompt_and_text_stays_text() {
        let tok = byte_tokenizer();
        let template = ChatTemplate::new(CHATML.into(), None, None).unwrap();
        let row = PromptRow {
            prompt: PreferenceTurns::Messages(vec![ChatMessage::new("user", "2+2?")]),
            answer: Some("4".into()),
            tools: None,
        };
        let example = tokenize_prompt(&row, &spec(&tok, Some(&template))).unwrap();
        let text = tok.decode(&example.input_ids, false).unwrap();
        assert_eq!(text, "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n");
        assert!(example.target_mask.iter().all(|t| !t) && !example.truncated);

        let text_row = PromptRow { prompt: PreferenceTurns::Text("2+2=".into()), ..row.clone() };
        let example = tokenize_prompt(&text_row, &spec(&tok, Some(&template))).unwrap();
        assert_eq!(tok.decode(&example.input_ids, false).unwrap(), "2+2=", "no template for a standard prompt");

        let fallback = tokenize_prompt(&row, &spec(&tok, None)).unwrap();
        assert!(tok.decode(&fallback.input_ids, false).unwrap().ends_with("### Assistant\n"));

        let short = TokenizeSpec { max_seq_len: 5, ..spec(&tok, Some(&template)) };
        let long = tokenize_prompt(&row, &short).unwrap();
        assert!(long.truncated && long.len() > 5 && !prompt_fits(&long, 5), "kept whole, marked too long");
    }

    #[test]
    fn too_long_prompts_are_listed() {
        let rows: Vec<String> = (1..=7).map(|i| format!("d.jsonl:{i} (90 tokens)")).collect();
        let note = too_long_note(&rows, 64).unwrap();
        assert!(note.starts_with("7 prompts longer than max_seq_len 64 were dropped: d.jsonl:1 (90 tokens)"), "{note}");
        assert!(note.contains("d.jsonl:5 (90 tokens), ...; raise --seq-len"), "{note}");
        assert_eq!(too_long_note(&[], 64), None);
    }
}
