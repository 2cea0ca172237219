//! Chat templates rendered by a real Jinja engine (minijinja with Python-compatible string methods), the way
//! transformers' `apply_chat_template` does: `trim_blocks`, `lstrip_blocks`, `raise_exception`,
//! `add_generation_prompt`, `bos_token` / `eos_token`.

use crate::engine::{Error, Result};
use std::path::Path;

/// One chat message.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self { role: role.into(), content: content.into() }
    }
}

/// A compiled chat template plus the special-token strings it may reference.
pub struct ChatTemplate {
    env: minijinja::Environment<'static>,
    pub source: String,
    bos_token: String,
    eos_token: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate").field("source", &self.source).finish()
    }
}

fn raise_exception(message: String) -> std::result::Result<String, minijinja::Error> {
    Err(minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, message))
}

fn strftime_now(format: String) -> String {
    // Templates use this for "Today Date"; a fixed, neutral date keeps renders reproducible.
    format.replace("%d", "01").replace("%b", "Jan").replace("%B", "January").replace("%Y", "2026").replace("%m", "01")
}

impl ChatTemplate {
    /// Compile `source`; errors name the template problem.
    pub fn new(source: String, bos_token: Option<String>, eos_token: Option<String>) -> Result<Self> {
        let mut env = minijinja::Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_template_owned("chat", source.clone())
            .map_err(|e| Error::ChatTemplate(format!("the template does not compile: {e}")))?;
        Ok(Self { env, source, bos_token: bos_token.unwrap_or_default(), eos_token: eos_token.unwrap_or_default() })
    }

    /// Render a conversation; `add_generation_prompt` opens the assistant's turn.
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        let template = self.env.get_template("chat").map_err(|e| Error::ChatTemplate(e.to_string()))?;
        template
            .render(minijinja::context! {
                messages => messages,
                add_generation_prompt => add_generation_prompt,
                bos_token => self.bos_token,
                eos_token => self.eos_token,
            })
            .map_err(|e| {
                let mut msg = e.to_string();
                let mut source = std::error::Error::source(&e);
                while let Some(s) = source {
                    msg.push_str(&format!(": {s}"));
                    source = s.source();
                }
                Error::ChatTemplate(msg)
            })
    }
}

/// A token given in tokenizer_config.json either as a string or as `{"content": ...}`.
pub fn token_string(value: Option<&serde_json::Value>) -> Option<String> {
    match value? {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Object(o) => o.get("content").and_then(|c| c.as_str()).map(str::to_string),
        _ => None,
    }
}

/// Find a Hugging Face folder's chat template: `chat_template.jinja`, else `tokenizer_config.json`'s
/// `chat_template` (a string, or a list of named templates of which we take "default").
pub fn find_template_source(folder: &Path, tokenizer_config: Option<&serde_json::Value>) -> Result<Option<String>> {
    let jinja = folder.join("chat_template.jinja");
    if jinja.exists() {
        return crate::engine::error::read_to_string(&jinja).map(Some);
    }
    let Some(value) = tokenizer_config.and_then(|c| c.get("chat_template")) else {
        return Ok(None);
    };
    Ok(match value {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Array(items) => items
            .iter()
            .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
            .or_else(|| items.first())
            .and_then(|t| t.get("template"))
            .and_then(|t| t.as_str())
            .map(str::to_string),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHATML: &str = "{% for message in messages %}{% if message['role'] not in ['system','user','assistant'] %}{{ raise_exception('bad role ' + message['role']) }}{% endif %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'].strip() + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    #[test]
    fn renders_loops_conditionals_and_generation_prompt() {
        let t = ChatTemplate::new(CHATML.into(), None, None).unwrap();
        let out = t.render(&[ChatMessage::new("user", " hi ")], true).unwrap();
        assert_eq!(out, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
    }

    #[test]
    fn raise_exception_becomes_an_error() {
        let t = ChatTemplate::new(CHATML.into(), None, None).unwrap();
        let err = t.render(&[ChatMessage::new("robot", "x")], false).unwrap_err().to_string();
        assert!(err.contains("bad role robot"), "{err}");
    }
}
