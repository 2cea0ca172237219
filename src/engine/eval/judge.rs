//! `--judge MODEL`: a second local model grades each generated answer from 1 to 10 against the reference, by
//! the rubric in [`JUDGE_RUBRIC`], answering greedily. Its score is read from the reply ([`parse_score`]); a reply
//! with no score is kept (the row shows `judge_reply`) and counted in `judge_unparsed`, never silently dropped.

use crate::engine::data::chat_prompt_ids;
use crate::engine::generate::{generate, GenerateRequest};
use crate::engine::model::chat_template::ChatMessage;
use crate::engine::model::{load_model, LoadedModel};
use crate::engine::sampler::SamplingParams;
use crate::engine::{Error, Result};
use std::path::{Path, PathBuf};

/// The judge's prompt, sent as one user message through the judge's chat template; `{question}`, `{reference}`
/// and `{answer}` are filled in per row.
pub const JUDGE_RUBRIC: &str = "You are grading an answer to a question against a reference answer.
Score the answer from 1 to 10:
10: says the same as the reference answer (fully correct and complete).
7-9: correct, with some detail missing, added or worded differently.
4-6: partly correct.
2-3: mostly wrong, but on the topic.
1: wrong, empty or unrelated.
Reply with \"Score: N\" on the first line, then one sentence saying why.

Question:
{question}

Reference answer:
{reference}

Answer to grade:
{answer}";

/// Tokens the judge may write: the score line and a short reason.
pub const JUDGE_MAX_TOKENS: usize = 48;

/// A loaded judge model.
pub struct Judge {
    model: LoadedModel,
    path: PathBuf,
}

/// What the judge said about one answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    /// 1-10, or None when the reply holds no score.
    pub score: Option<u32>,
    pub reply: String,
}

impl Judge {
    /// Load the judge (a model folder or GGUF file) on the device and dtype of the model it judges.
    pub fn load(path: &Path, like: &LoadedModel) -> Result<Self> {
        Ok(Self { model: load_model(path, like.model.device(), like.model.dtype())?, path: path.to_path_buf() })
    }

    /// Refuse, before anything is generated, a row whose rubric prompt (with an answer of up to `answer_tokens`
    /// tokens and the judge's reply) cannot fit the judge's context; `source` names the row.
    pub fn check_fits(&self, source: &str, question: &str, reference: &str, answer_tokens: usize) -> Result<()> {
        let prompt = rubric_prompt(question, reference, "");
        let ids = chat_prompt_ids(&self.model, &[ChatMessage::new("user", prompt)])?;
        let context = self.model.config.max_position_embeddings;
        if ids.len() + answer_tokens + JUDGE_MAX_TOKENS > context {
            return Err(Error::InvalidSetting(format!(
                "{source}: the judge {} has a context of {context} tokens, and its rubric prompt for this row takes \
                 {} before the answer (up to {answer_tokens} tokens, --max-tokens) and its {JUDGE_MAX_TOKENS}-token \
                 reply; use a judge with a longer context or lower --max-tokens",
                self.path.display(),
                ids.len()
            )));
        }
        Ok(())
    }

    /// Grade `answer` to `question` against `reference`.
    pub fn grade(&self, question: &str, reference: &str, answer: &str) -> Result<Verdict> {
        let prompt = rubric_prompt(question, reference, answer);
        let prompt_ids = match chat_prompt_ids(&self.model, &[ChatMessage::new("user", prompt)]) {
            Ok(ids) if ids.len() + JUDGE_MAX_TOKENS <= self.model.config.max_position_embeddings => ids,
            // An answer longer in the judge's tokens than `check_fits` allowed for: not judged, and shown so.
            Ok(_) | Err(Error::PromptTooLongText { .. }) => {
                return Ok(Verdict {
                    score: None,
                    reply: "(not judged: the answer does not fit the judge's context)".into(),
                })
            }
            Err(e) => return Err(e),
        };
        let request = GenerateRequest {
            prompt_ids,
            max_new_tokens: JUDGE_MAX_TOKENS,
            sampling: SamplingParams::greedy(),
            eos_token_ids: self.model.eos_token_ids.clone(),
            ignore_eos: false,
            stop_strings: Vec::new(),
        };
        let reply = generate(&self.model.model, &self.model.tokenizer, &request, &mut |_| true)?.text;
        Ok(Verdict { score: parse_score(&reply), reply })
    }
}

/// [`JUDGE_RUBRIC`] filled in for one row.
pub fn rubric_prompt(question: &str, reference: &str, answer: &str) -> String {
    // The answer goes in last, so text in it that looks like a placeholder is never replaced.
    JUDGE_RUBRIC
        .replace("{question}", question.trim())
        .replace("{reference}", reference.trim())
        .replace("{answer}", if answer.trim().is_empty() { "(empty)" } else { answer.trim() })
}

/// The score in a judge's reply: the number after the first "score" (any case, then optional `:`, `=`, `*` or
/// spaces) when it is 1-10, else the first whole number in the reply that is 1-10; None when there is none.
pub fn parse_score(reply: &str) -> Option<u32> {
    let lower = reply.to_lowercase();
    if let Some(at) = lower.find("score") {
        let rest = lower[at + "score".len()..]
            .trim_start_matches(|c: char| c == ':' || c == '=' || c == '*' || c.is_whitespace());
        if let Some(n) = leading_number(rest).filter(|n| (1..=10).contains(n)) {
            return Some(n);
        }
    }
    numbers(&lower).into_iter().find(|n| (1..=10).contains(n))
}

/// The whole number `text` starts with.
fn leading_number(text: &str) -> Option<u32> {
    let digits: String = text.chars().take_while(char::is_ascii_digit).collect();
    // A decimal such as 7.5 is no whole score.
    let after = text[digits.len()..].chars().collect::<Vec<_>>();
    if matches!(after.as_slice(), ['.', d, ..] if d.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Every maximal run of digits that is a whole number (not part of a decimal), in order.
fn numbers(text: &str) -> Vec<u32> {
    let mut out = Vec::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i].is_ascii_digit() && (i == 0 || bytes[i - 1] != b'.') {
            if let Some(n) = leading_number(&text[i..]) {
                out.push(n);
            }
        }
        while i < bytes.len() && bytes[i].is_ascii_digit() {
            i += 1;
        }
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scores_are_read_from_the_score_line_or_the_first_number_in_range() {
        assert_eq!(parse_score("Score: 8\nThe answer is right."), Some(8));
        assert_eq!(parse_score("**Score:** 10"), Some(10));
        assert_eq!(parse_score("score=3 because 42 is wrong"), Some(3));
        assert_eq!(parse_score("I would give it 7/10."), Some(7));
        assert_eq!(parse_score("Score: 11. Really a 9."), Some(9), "11 is no score; 9 is the first in range");
        assert_eq!(parse_score("The sum 42 is right: 10"), Some(10));
        assert_eq!(parse_score("Score: 7.5"), None);
        assert_eq!(parse_score("Excellent answer!"), None);
        assert_eq!(parse_score("0 points"), None);
        assert_eq!(parse_score(""), None);
    }

    #[test]
    fn the_rubric_is_filled_in_and_an_empty_answer_says_so() {
        let p = rubric_prompt(" What is 2+2? ", "4", "  ");
        assert!(p.contains("Question:\nWhat is 2+2?\n") && p.contains("Reference answer:\n4\n"), "{p}");
        assert!(p.ends_with("Answer to grade:\n(empty)"), "{p}");
        assert!(rubric_prompt("q", "r", "{question}").ends_with("{question}"));
    }
}
