//! Chat templates rendered by a real Jinja engine (minijinja with Python-compatible string methods), the way
//! transformers' `apply_chat_template` does: `trim_blocks`, `lstrip_blocks`, `raise_exception`,
//! `strftime_now` (today's date, [`strftime`]), the `{% generation %}` block (rendered as its body),
//! `add_generation_prompt`, `bos_token` / `eos_token`. Every difference between minijinja and Jinja2 that a
//! published template runs into is bridged here, once, for all templates.
//!
//! A template comes with the model and is untrusted code: every render runs on a fuel budget
//! ([`TEMPLATE_FUEL`] instructions) and an output cap ([`MAX_RENDER_BYTES`]), so a hostile or broken template
//! fails fast with an error naming the file it came from instead of spinning or filling memory.

pub mod strftime;

use crate::engine::{Error, Result};
use std::path::Path;
pub use strftime::DateTime;

/// One chat message. The tool fields follow transformers' message dicts (`tool_calls` on an assistant turn,
/// `tool_call_id` / `name` on a `tool` turn) and are left out of what the template sees when absent, as a
/// plain `{"role", "content"}` dict would be.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
    /// `[{"type": "function", "function": {"name", "arguments"}}]` on an assistant turn that calls tools.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<serde_json::Value>>,
    /// On a `tool` turn: the call it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// On a `tool` turn: the tool that answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self { role: role.into(), content: content.into(), ..Self::default() }
    }

    /// Whether the message takes part in tool use: a `tool` turn or a turn with tool calls.
    pub fn uses_tools(&self) -> bool {
        self.role == "tool" || self.tool_calls.as_ref().is_some_and(|c| !c.is_empty())
    }
}

/// Instructions one render may execute: real templates need a few thousand per message.
pub const TEMPLATE_FUEL: u64 = 20_000_000;

/// Longest text one render may produce: 8 MiB is about two million tokens, past any context we run, and
/// what the tokenizer then holds for it stays in the hundreds of MB.
pub const MAX_RENDER_BYTES: usize = 8 * 1024 * 1024;

/// Memory one render may hold at once (its values and output); real renders need a few MB.
pub const RENDER_MEMORY_BYTES: usize = 128 * 1024 * 1024;

/// Longest `strftime_now` format a template may pass (real ones are a dozen characters).
const MAX_STRFTIME_FORMAT: usize = 256;

/// A compiled chat template plus the special-token strings it may reference.
pub struct ChatTemplate {
    env: std::sync::Arc<minijinja::Environment<'static>>,
    pub source: String,
    /// Where the template came from, for errors: a file (tokenizer_config.json, chat_template.jinja) or a
    /// GGUF's metadata key.
    pub origin: String,
    bos_token: String,
    eos_token: String,
    /// Memory one render may hold ([`RENDER_MEMORY_BYTES`] unless set).
    memory_budget_bytes: usize,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate").field("source", &self.source).finish()
    }
}

fn raise_exception(message: String) -> std::result::Result<String, minijinja::Error> {
    Err(minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, message))
}

/// transformers' `AssistantTracker` extension gives Jinja a `{% generation %}...{% endgeneration %}` block that
/// marks assistant text for training masks and renders its body unchanged; minijinja has no such tag, so each
/// becomes `{% if true %}` / `{% endif %}`, a block tag with the same whitespace control (`-`, `+`) and so the
/// same `trim_blocks` / `lstrip_blocks` behaviour.
fn rewrite_generation_tags(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        out.push_str(&rest[..start]);
        let tag = &rest[start..];
        // The closing `%}` after the opening `{%` (in `{%}` they overlap: that is no tag).
        let Some(end) = tag[2..].find("%}").map(|e| e + 2) else {
            rest = tag;
            break;
        };
        let inner = &tag[2..end];
        let (open, body) = split_modifier_front(inner);
        let (body, close) = split_modifier_back(body);
        match body.trim() {
            "generation" => out.push_str(&format!("{{%{open} if true {close}%}}")),
            "endgeneration" => out.push_str(&format!("{{%{open} endif {close}%}}")),
            _ => out.push_str(&tag[..end + 2]),
        }
        rest = &tag[end + 2..];
    }
    out.push_str(rest);
    out
}

fn split_modifier_front(inner: &str) -> (&str, &str) {
    match inner.chars().next() {
        Some(c @ ('-' | '+')) => inner.split_at(c.len_utf8()),
        _ => ("", inner),
    }
}

fn split_modifier_back(inner: &str) -> (&str, &str) {
    match inner.chars().last() {
        Some('-' | '+') => inner.split_at(inner.len() - 1),
        _ => (inner, ""),
    }
}

impl ChatTemplate {
    /// Compile `source`; errors name the template problem.
    pub fn new(source: String, bos_token: Option<String>, eos_token: Option<String>) -> Result<Self> {
        let mut env = minijinja::Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_fuel(Some(TEMPLATE_FUEL));
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", |format: String| strftime_now(DateTime::now_utc(), &format));
        env.add_template_owned("chat", rewrite_generation_tags(&source))
            .map_err(|e| Error::ChatTemplate(format!("the template does not compile: {e}")))?;
        Ok(Self {
            env: std::sync::Arc::new(env),
            source,
            origin: "the chat template".into(),
            bos_token: bos_token.unwrap_or_default(),
            eos_token: eos_token.unwrap_or_default(),
            memory_budget_bytes: RENDER_MEMORY_BYTES,
        })
    }

    /// Name where the template came from (a file path, or a GGUF's metadata key) in its errors.
    pub fn with_origin(mut self, origin: impl Into<String>) -> Self {
        self.origin = origin.into();
        self
    }

    /// Bound a render's memory to `bytes` instead of [`RENDER_MEMORY_BYTES`]. A render that goes over leaves
    /// its thread parked holding at most this much (see `engine::memory_budget`), so a fuzzer that renders
    /// thousands of hostile templates sets it small.
    pub fn with_memory_budget(mut self, bytes: usize) -> Self {
        self.memory_budget_bytes = bytes;
        self
    }

    /// Render `strftime_now` at a fixed moment instead of the current UTC time: reference renders made on
    /// another day (the fixtures record theirs) stay comparable.
    pub fn with_today(mut self, today: DateTime) -> Self {
        std::sync::Arc::make_mut(&mut self.env)
            .add_function("strftime_now", move |format: String| strftime_now(today, &format));
        self
    }

    /// Render a conversation; `add_generation_prompt` opens the assistant's turn. A render that runs out of
    /// fuel or output room is an error naming the template's file.
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        self.render_with_tools(messages, None, add_generation_prompt)
    }

    /// [`Self::render`] with the tool definitions a conversation may call (`tools` in transformers'
    /// `apply_chat_template`: JSON schemas, `{"type": "function", "function": {...}}`). Without tools the
    /// template sees no `tools` variable at all, exactly as before tools were supported.
    pub fn render_with_tools(
        &self,
        messages: &[ChatMessage],
        tools: Option<&[serde_json::Value]>,
        add_generation_prompt: bool,
    ) -> Result<String> {
        let env = self.env.clone();
        let (messages, tools) = (messages.to_vec(), tools.map(<[_]>::to_vec));
        let (bos_token, eos_token) = (self.bos_token.clone(), self.eos_token.clone());
        let job = move || {
            let mut out = CappedWriter { bytes: Vec::new(), full: false };
            let template = match env.get_template("chat") {
                Ok(t) => t,
                Err(e) => return (Err(e), out),
            };
            let base = minijinja::context! {
                messages => messages,
                add_generation_prompt => add_generation_prompt,
                bos_token => bos_token,
                eos_token => eos_token,
            };
            let context = match tools {
                Some(tools) => minijinja::context! { tools => tools, ..base },
                None => base,
            };
            let rendered = template.render_captured_to(context, &mut out).map(|_| ());
            (rendered, out)
        };
        let (rendered, out) =
            crate::engine::memory_budget::run_with_budget(self.memory_budget_bytes, job).map_err(|e| {
                Error::ChatTemplate(match e {
                    crate::engine::memory_budget::BudgetError::MemoryExceeded { limit_bytes } => format!(
                        "{}: the chat template asked for more than {} MB of memory while rendering; the template is \
                     broken or hostile",
                        self.origin,
                        limit_bytes >> 20
                    ),
                    other => format!("{}: the chat template could not be rendered ({other:?})", self.origin),
                })
            })?;
        match rendered {
            Ok(_) => String::from_utf8(out.bytes).map_err(|e| Error::ChatTemplate(format!("{}: {e}", self.origin))),
            Err(_) if out.full => Err(Error::ChatTemplate(format!(
                "{}: the chat template produced more than {} MB of text; the template is broken or hostile",
                self.origin,
                MAX_RENDER_BYTES / (1024 * 1024)
            ))),
            Err(e) if e.kind() == minijinja::ErrorKind::OutOfFuel => Err(Error::ChatTemplate(format!(
                "{}: the chat template ran more than {TEMPLATE_FUEL} steps without finishing (an endless or \
                 huge loop); the template is broken or hostile",
                self.origin
            ))),
            Err(e) => {
                let mut msg = format!("{}: {e}", self.origin);
                let mut source = std::error::Error::source(&e);
                while let Some(s) = source {
                    msg.push_str(&format!(": {s}"));
                    source = s.source();
                }
                Err(Error::ChatTemplate(msg))
            }
        }
    }
}

/// `strftime_now(format)` with the format's length bounded (each directive expands to a few dozen bytes).
fn strftime_now(today: DateTime, format: &str) -> std::result::Result<String, minijinja::Error> {
    if format.len() > MAX_STRFTIME_FORMAT {
        return Err(minijinja::Error::new(
            minijinja::ErrorKind::InvalidOperation,
            format!("strftime_now's format is {} characters; at most {MAX_STRFTIME_FORMAT} are allowed", format.len()),
        ));
    }
    Ok(today.strftime(format))
}

/// Collects rendered text up to [`MAX_RENDER_BYTES`], then refuses more.
struct CappedWriter {
    bytes: Vec<u8>,
    full: bool,
}

impl std::io::Write for CappedWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.bytes.len() + buf.len() > MAX_RENDER_BYTES {
            self.full = true;
            return Err(std::io::Error::other("the rendered chat template is too long"));
        }
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
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
    if crate::engine::input_file::optional_file(&jinja)?.is_some() {
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
    fn a_runaway_template_fails_fast_naming_its_file() {
        let looping = "{% for i in range(100000) %}{% for j in range(100000) %}{% set k = j %}{% endfor %}{% endfor %}";
        let t = ChatTemplate::new(looping.into(), None, None).unwrap().with_origin("m/tokenizer_config.json");
        let started = std::time::Instant::now();
        let err = t.render(&[ChatMessage::new("user", "hi")], true).unwrap_err().to_string();
        assert!(err.contains("m/tokenizer_config.json") && err.contains("steps"), "{err}");
        assert!(started.elapsed().as_secs() < 5);
        let huge = "{% for i in range(100000) %}{{ 'x' * 100000 }}{% endfor %}";
        let t = ChatTemplate::new(huge.into(), None, None).unwrap().with_origin("m/chat_template.jinja");
        let err = t.render(&[ChatMessage::new("user", "hi")], true).unwrap_err().to_string();
        assert!(err.contains("m/chat_template.jinja") && err.contains("MB"), "{err}");
    }

    /// Steps and output are bounded, and so is memory: templates that ask for terabytes in a few steps fail
    /// with an error naming the file instead of aborting the process.
    #[test]
    fn templates_that_ask_for_huge_memory_fail_naming_their_file() {
        let hostile = [
            ("{{ 'x' | indent(100000000000) }}", "memory"),
            ("{% set ns = namespace(s='y' * 1000000) %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}", "memory"),
            ("{% set ns = namespace(s='z' * 100000000) %}{% set ns.l = [ns.s, ns.s ~ 'a', ns.s ~ 'b', ns.s ~ 'c'] %}", "memory"),
            ("{{ strftime_now('%A' * 10000000) }}", "strftime_now"),
        ];
        for (source, word) in hostile {
            let t = ChatTemplate::new(source.into(), None, None).unwrap().with_origin("evil/chat_template.jinja");
            let err = t.render(&[ChatMessage::new("user", "hi")], true).unwrap_err().to_string();
            assert!(err.contains("evil/chat_template.jinja") && err.contains(word), "{source}: {err}");
        }
        // A normal render still works afterwards.
        let t = ChatTemplate::new(CHATML.into(), None, None).unwrap();
        assert!(t.render(&[ChatMessage::new("user", "hi")], true).unwrap().contains("hi"));
    }

    #[test]
    fn tags_that_overlap_or_never_close_are_left_for_the_compiler() {
        assert_eq!(rewrite_generation_tags("a{%}b"), "a{%}b");
        assert_eq!(rewrite_generation_tags("a {% if x"), "a {% if x");
        assert!(ChatTemplate::new("{%}{{ x }}".into(), None, None).is_err());
    }

    #[test]
    fn generation_blocks_render_their_body_with_jinja_whitespace_rules() {
        // What Jinja2 with transformers' AssistantTracker renders for the same source (trim/lstrip blocks).
        let source =
            "{% for m in messages %}\n  {% generation %}\n[{{ m.content }}]\n  {%- endgeneration +%}\n{% endfor %}";
        assert_eq!(
            rewrite_generation_tags(source),
            "{% for m in messages %}\n  {% if true %}\n[{{ m.content }}]\n  {%- endif +%}\n{% endfor %}"
        );
        let t = ChatTemplate::new(source.into(), None, None).unwrap();
        let out = t.render(&[ChatMessage::new("user", "a"), ChatMessage::new("user", "b")], false).unwrap();
        assert_eq!(out, "[a]\n[b]\n");
        assert_eq!(rewrite_generation_tags("{{ x }}{% if a %}{%- generation -%}"), "{{ x }}{% if a %}{%- if true -%}");
    }

    #[test]
    fn strftime_now_uses_the_clock_or_the_fixed_day() {
        let source = "{{ strftime_now('%d %B %Y') }}|{{ 'x' in undefined_name }}";
        let t = ChatTemplate::new(source.into(), None, None).unwrap();
        let now = t.render(&[], false).unwrap();
        assert_eq!(now, format!("{}|False", DateTime::now_utc().strftime("%d %B %Y")));
        let fixed = t.with_today(DateTime::date(2025, 3, 7)).render(&[], false).unwrap();
        assert_eq!(fixed, "07 March 2025|False"); // Jinja2 prints Python booleans too
    }

    #[test]
    fn raise_exception_becomes_an_error() {
        let t = ChatTemplate::new(CHATML.into(), None, None).unwrap();
        let err = t.render(&[ChatMessage::new("robot", "x")], false).unwrap_err().to_string();
        assert!(err.contains("bad role robot"), "{err}");
    }
}
