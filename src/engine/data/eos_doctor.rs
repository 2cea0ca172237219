//! The template and end-of-sequence doctor: the checks that catch a fine-tune which never learns to stop, or an
//! export whose runtime does not stop where the model was trained to. One home for the rule; training (CLI and
//! the studio's dataset report) and export (CLI and studio) call [`check_model`], training adds
//! [`check_rows`], export adds [`check_export`]. Each problem is a [`StopWarning`] saying what is wrong and what
//! to fix; none stops the run.
//!
//! - rows: every (untruncated) training row's last trained token is one the model stops on;
//! - template: the chat template renders a small conversation with every message's content, in order, and an
//!   assistant turn followed by a stop token (that token is the model's end-of-turn token);
//! - agreement: the end-of-turn and eos ids of config.json, generation_config.json and the tokenizer agree;
//! - export: the GGUF's `tokenizer.ggml.eos_token_id` / `eot_token_id` / `eom_token_id` and the Ollama
//!   Modelfile's `PARAMETER stop` lines cover the end-of-turn token.

use super::Example;
use crate::engine::model::chat_template::{ChatMessage, ChatTemplate};
use crate::engine::model::tokenizer::TextTokenizer;
use crate::engine::model::{LoadedModel, ModelInfo, ModelSource};
use std::path::Path;

/// Which check found the problem.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StopCheck {
    Rows,
    Template,
    Agreement,
    Export,
}

/// One problem: what is wrong and what to do about it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StopWarning {
    pub check: StopCheck,
    pub message: String,
    pub fix: String,
}

impl std::fmt::Display for StopWarning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (fix: {})", self.message, self.fix)
    }
}

/// What the checks read from a model: tokenizer, template, the ids generation stops on, and each declared
/// source of eos ids by name (`config.json`, `generation_config.json`, `tokenizer eos_token`, GGUF metadata).
pub struct StopFacts<'a> {
    pub tokenizer: &'a TextTokenizer,
    pub chat_template: Option<&'a ChatTemplate>,
    pub stop_ids: &'a [u32],
    pub declared: Vec<(String, Vec<u32>)>,
}

impl<'a> StopFacts<'a> {
    pub fn of_model(m: &'a LoadedModel) -> Self {
        Self::from_parts(&m.source, &m.config.eos_token_ids, &m.tokenizer, m.chat_template.as_ref(), &m.eos_token_ids)
    }

    pub fn of_info(m: &'a ModelInfo) -> Self {
        Self::from_parts(&m.source, &m.config.eos_token_ids, &m.tokenizer, m.chat_template.as_ref(), &m.eos_token_ids)
    }

    fn from_parts(
        source: &ModelSource,
        config_eos: &[u32],
        tokenizer: &'a TextTokenizer,
        chat_template: Option<&'a ChatTemplate>,
        stop_ids: &'a [u32],
    ) -> Self {
        let mut declared = Vec::new();
        match source {
            ModelSource::HfFolder(folder) => {
                declared.push(("config.json".to_string(), config_eos.to_vec()));
                if let Some(ids) = generation_config_eos(folder) {
                    declared.push(("generation_config.json".to_string(), ids));
                }
            }
            ModelSource::Gguf(_) => {
                declared.push(("GGUF tokenizer.ggml.eos_token_id".to_string(), config_eos.to_vec()))
            }
        }
        if let Some(id) = tokenizer.eos_token.as_deref().and_then(|t| tokenizer.token_to_id(t)) {
            declared.push(("the tokenizer's eos_token".to_string(), vec![id]));
        }
        Self { tokenizer, chat_template, stop_ids, declared }
    }

    fn names(&self, ids: &[u32]) -> String {
        let name = |id: &u32| self.tokenizer.id_to_token(*id).map(|t| format!("{t} ({id})")).unwrap_or(id.to_string());
        ids.iter().map(name).collect::<Vec<_>>().join(", ")
    }
}

fn generation_config_eos(folder: &Path) -> Option<Vec<u32>> {
    let text = std::fs::read_to_string(folder.join("generation_config.json")).ok()?;
    let value: serde_json::Value = serde_json::from_str(&text).ok()?;
    match value.get("eos_token_id")? {
        serde_json::Value::Array(items) => Some(items.iter().filter_map(|v| v.as_u64()).map(|v| v as u32).collect()),
        v => v.as_u64().map(|id| vec![id as u32]),
    }
}

/// The model checks (template round trip and eos agreement). Returns the warnings and the end-of-turn token id
/// the template closes assistant turns with, when it closes them with a stop token.
pub fn check_model(facts: &StopFacts) -> (Vec<StopWarning>, Option<u32>) {
    let mut warnings = Vec::new();
    let end_of_turn = match facts.chat_template {
        Some(template) => check_template(facts, template, &mut warnings),
        None => facts.tokenizer.eos_token.as_deref().and_then(|t| facts.tokenizer.token_to_id(t)),
    };
    check_agreement(facts, end_of_turn, &mut warnings);
    (warnings, end_of_turn)
}

const PROBE: [(&str, &str); 4] = [
    ("user", "doctor ping one"),
    ("assistant", "doctor pong two"),
    ("user", "doctor ping three"),
    ("assistant", "doctor pong four"),
];

/// Render the probe conversation; the token after the last assistant content must be a stop token.
fn check_template(facts: &StopFacts, template: &ChatTemplate, warnings: &mut Vec<StopWarning>) -> Option<u32> {
    let messages: Vec<ChatMessage> = PROBE.iter().map(|(r, c)| ChatMessage::new(*r, *c)).collect();
    let text = match template.render(&messages, false) {
        Ok(text) => text,
        Err(e) => {
            warnings.push(warn(
                StopCheck::Template,
                format!("the chat template cannot render a plain user/assistant conversation: {e}"),
                "fix the template (tokenizer_config.json `chat_template` or chat_template.jinja)",
            ));
            return None;
        }
    };
    let mut at = 0;
    for (role, content) in PROBE {
        match text[at..].find(content) {
            Some(pos) => at += pos + content.len(),
            None => {
                warnings.push(warn(
                    StopCheck::Template,
                    format!(
                        "the chat template drops or reorders the {role} message `{content}` of a test conversation"
                    ),
                    "make the template output every message's content in order",
                ));
                return None;
            }
        }
    }
    let after = facts.tokenizer.encode(&text[at..], false).unwrap_or_default();
    let stop = after.iter().take(4).find(|id| facts.stop_ids.contains(id)).copied();
    if stop.is_none() {
        warnings.push(warn(
            StopCheck::Template,
            format!(
                "the chat template does not end an assistant turn with a token the model stops on ({}): a \
                 fine-tune never learns to stop",
                facts.names(facts.stop_ids)
            ),
            "close assistant turns with the end-of-turn token in the template (e.g. `{{ eos_token }}` or \
             `<|im_end|>`), or add that token's id to generation_config.json `eos_token_id`",
        ));
    }
    stop
}

/// Every declared eos source should include the end-of-turn token, and the tokenizer's eos should be declared.
fn check_agreement(facts: &StopFacts, end_of_turn: Option<u32>, warnings: &mut Vec<StopWarning>) {
    if let Some(eot) = end_of_turn {
        let silent: Vec<&str> =
            facts.declared.iter().filter(|(_, ids)| !ids.contains(&eot)).map(|(name, _)| name.as_str()).collect();
        if !silent.is_empty() && silent.len() == facts.declared.len() {
            warnings.push(warn(
                StopCheck::Agreement,
                format!(
                    "the end-of-turn token {} is in none of the model's eos ids ({}): other runtimes will not stop there",
                    facts.names(&[eot]),
                    silent.join(", ")
                ),
                "add its id to generation_config.json `eos_token_id` (and config.json)",
            ));
        }
    }
    let tokenizer_eos = facts.declared.iter().find(|(n, _)| n.starts_with("the tokenizer")).map(|(_, ids)| ids[0]);
    let others: Vec<&(String, Vec<u32>)> =
        facts.declared.iter().filter(|(n, _)| !n.starts_with("the tokenizer")).collect();
    if let Some(eos) = tokenizer_eos {
        if !others.is_empty() && !others.iter().any(|(_, ids)| ids.contains(&eos)) {
            warnings.push(warn(
                StopCheck::Agreement,
                format!(
                    "the tokenizer's eos_token {} is not among the eos ids of {}",
                    facts.names(&[eos]),
                    others.iter().map(|(n, ids)| format!("{n} ({})", facts.names(ids))).collect::<Vec<_>>().join(", ")
                ),
                "make tokenizer_config.json `eos_token`, config.json and generation_config.json `eos_token_id` agree",
            ));
        }
    }
}

/// Rows whose training targets do not end with a stop token (truncated rows, which lose their end, excluded).
pub fn check_rows<'e>(examples: impl IntoIterator<Item = &'e Example>, stop_ids: &[u32]) -> Option<StopWarning> {
    let (mut checked, mut open) = (0usize, 0usize);
    for example in examples.into_iter().filter(|e| !e.truncated) {
        let last_target = example.input_ids.iter().zip(&example.target_mask).rev().find(|(_, t)| **t);
        if let Some((id, _)) = last_target {
            checked += 1;
            open += usize::from(!stop_ids.contains(id));
        }
    }
    (open > 0).then(|| {
        warn(
            StopCheck::Rows,
            format!("{open} of {checked} training rows end their trained tokens without a stop token: the model will not learn to stop"),
            "use a chat template that closes assistant turns with the end-of-turn token, or end text rows with the eos token",
        )
    })
}

/// What an export will write: the GGUF's eos/eot/eom ids and, for Ollama, the Modelfile's stop strings must
/// cover the end-of-turn token.
pub fn check_export(
    facts: &StopFacts,
    end_of_turn: Option<u32>,
    gguf_stop_ids: &[u32],
    modelfile: Option<&str>,
) -> Vec<StopWarning> {
    let mut warnings = Vec::new();
    let Some(eot) = end_of_turn else { return warnings };
    if !gguf_stop_ids.contains(&eot) {
        warnings.push(warn(
            StopCheck::Export,
            format!(
                "the GGUF's eos/eot ids ({}) do not include the end-of-turn token {}: llama.cpp may not stop there",
                facts.names(gguf_stop_ids),
                facts.names(&[eot])
            ),
            "set the model's eos_token (tokenizer_config.json) or generation_config.json `eos_token_id` to it",
        ));
    }
    if let (Some(text), Some(token)) = (modelfile, facts.tokenizer.id_to_token(eot)) {
        let line = format!("PARAMETER stop \"{}\"", token.replace('\\', "\\\\").replace('"', "\\\""));
        if !text.lines().any(|l| l.trim() == line) {
            warnings.push(warn(
                StopCheck::Export,
                format!("the Modelfile has no `{line}`: Ollama would not stop at the end of a turn"),
                "add the line to the Modelfile",
            ));
        }
    }
    warnings
}

/// Before training (the CLI's train, the studio's dataset report): the model checks and the rows check.
pub fn check_training<'e>(model: &LoadedModel, examples: impl IntoIterator<Item = &'e Example>) -> Vec<StopWarning> {
    let (mut warnings, _) = check_model(&StopFacts::of_model(model));
    warnings.extend(check_rows(examples, &model.eos_token_ids));
    warnings
}

fn warn(check: StopCheck, message: String, fix: &str) -> StopWarning {
    StopWarning { check, message, fix: fix.to_string() }
}

#[cfg(test)]
mod tests;
