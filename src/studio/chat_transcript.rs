//! A chat conversation as the chat page holds it (user messages, and the replies of its two columns to each:
//! the left column's, the base model or in side by side any checkpoint, and the right column's, the chat's
//! adapter), and the conversation written out: JSON (the `messages` array with roles, as chat
//! datasets and OpenAI-style APIs take it, plus the model, adapter and sampling settings used) and Markdown
//! (readable, a heading per turn).

use crate::engine::model::chat_template::strftime::DateTime;
use crate::engine::sampler::SamplingParams;
use crate::worker::{ChatSide, GenerationStats};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::time::Instant;

/// Which model(s) answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub enum ChatMode {
    #[default]
    Base,
    Adapter,
    SideBySide,
}

impl ChatMode {
    /// The name the JSON export writes.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Base => "base",
            Self::Adapter => "adapter",
            Self::SideBySide => "side_by_side",
        }
    }
}

/// One streamed (or streaming) reply.
#[derive(Debug, Clone)]
pub struct Reply {
    pub id: u64,
    pub text: String,
    pub streaming: bool,
    pub started: Instant,
    pub first_token_at: Option<Instant>,
    pub pieces: usize,
    pub stats: Option<GenerationStats>,
    pub error: Option<String>,
    /// The worker's warnings: the adapter was trained on another base model, the model has no chat template.
    pub warning: Option<String>,
    /// The adapter that produced it (None: base model).
    pub adapter: Option<PathBuf>,
}

impl Reply {
    /// A reply about to stream.
    pub fn new(id: u64, adapter: Option<PathBuf>) -> Self {
        Self {
            id,
            text: String::new(),
            streaming: true,
            started: Instant::now(),
            first_token_at: None,
            pieces: 0,
            stats: None,
            error: None,
            warning: None,
            adapter,
        }
    }

    /// Tokens/s: the final decode rate, or a live estimate from the pieces streamed so far.
    pub fn tokens_per_sec(&self) -> Option<f64> {
        if let Some(s) = &self.stats {
            return Some(s.decode_tokens_per_sec());
        }
        let first = self.first_token_at?;
        let secs = first.elapsed().as_secs_f64();
        (secs > 0.2 && self.pieces > 1).then(|| (self.pieces - 1) as f64 / secs)
    }
}

/// A user message and the replies to it.
#[derive(Debug, Clone)]
pub struct Exchange {
    pub user: String,
    /// The left column's reply (the base model, or the checkpoint side by side picked for it).
    pub base: Option<Reply>,
    /// The right column's reply (the chat's adapter).
    pub adapter: Option<Reply>,
}

impl Exchange {
    pub fn reply(&self, side: ChatSide) -> Option<&Reply> {
        match side {
            ChatSide::Left => self.base.as_ref(),
            ChatSide::Right => self.adapter.as_ref(),
        }
    }

    pub fn reply_mut(&mut self, side: ChatSide) -> &mut Option<Reply> {
        match side {
            ChatSide::Left => &mut self.base,
            ChatSide::Right => &mut self.adapter,
        }
    }
}

/// A checkpoint or adapter folder as a column names it: "run-folder · step 40" for `run-folder/checkpoint-40`,
/// else "parent / folder". Paths only: nothing is read from disk.
pub fn checkpoint_title(path: &std::path::Path) -> String {
    let name = |p: Option<&std::path::Path>| {
        p.and_then(|p| p.file_name()).map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
    };
    let (folder, parent) = (name(Some(path)), name(path.parent()));
    match folder.strip_prefix("checkpoint-").filter(|s| s.parse::<usize>().is_ok()) {
        Some(step) => format!("{parent} · step {step}"),
        None => format!("{parent} / {folder}"),
    }
}

/// What a conversation was had with: written into both exports.
#[derive(Debug, Clone)]
pub struct ChatSetup {
    pub model: Option<PathBuf>,
    pub adapter: Option<PathBuf>,
    /// The checkpoint the left column answered with side by side (None: the base model).
    pub left_adapter: Option<PathBuf>,
    pub mode: ChatMode,
    pub system_prompt: String,
    pub sampling: SamplingParams,
    pub max_new_tokens: usize,
}

impl ChatSetup {
    /// The side whose conversation the export's `messages` hold: the adapter's when it answers.
    fn main_side(&self) -> ChatSide {
        match self.mode {
            ChatMode::Base => ChatSide::Left,
            ChatMode::Adapter | ChatMode::SideBySide => ChatSide::Right,
        }
    }
}

/// How a conversation is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TranscriptFormat {
    #[default]
    Json,
    Markdown,
}

impl TranscriptFormat {
    pub fn extension(self) -> &'static str {
        match self {
            Self::Json => "json",
            Self::Markdown => "md",
        }
    }

    /// The file's text.
    pub fn render(self, exchanges: &[Exchange], setup: &ChatSetup) -> String {
        match self {
            Self::Json => to_json(exchanges, setup),
            Self::Markdown => to_markdown(exchanges, setup),
        }
    }
}

fn absolute(path: &std::path::Path) -> String {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf()).display().to_string()
}

/// "2026-11-21 14:03:07 UTC".
pub fn utc_now_text() -> String {
    let t = DateTime::now_utc();
    format!("{:04}-{:02}-{:02} {:02}:{:02}:{:02} UTC", t.year, t.month, t.day, t.hour, t.minute, t.second)
}

/// One side's conversation as chat messages: the system prompt, then each user message and that side's reply
/// (an unfinished reply as far as it got, a failed one with its error).
fn messages_json(exchanges: &[Exchange], side: ChatSide, system: &str) -> Vec<Value> {
    let mut messages = Vec::new();
    if !system.trim().is_empty() {
        messages.push(json!({"role": "system", "content": system.trim()}));
    }
    for ex in exchanges {
        messages.push(json!({"role": "user", "content": ex.user}));
        let Some(reply) = ex.reply(side) else { continue };
        let mut message = json!({"role": "assistant", "content": reply.text.trim()});
        if let Some(s) = &reply.stats {
            message["generation"] = json!({
                "prompt_tokens": s.prompt_tokens,
                "new_tokens": s.new_tokens,
                "tokens_per_sec": (s.decode_tokens_per_sec() * 10.0).round() / 10.0,
                "stop_reason": s.stop_reason.as_str(),
            });
        }
        if let Some(e) = &reply.error {
            message["error"] = json!(e);
        }
        messages.push(message);
    }
    messages
}

/// The JSON export: `messages` (the adapter's side when it answers), side by side the left column's as
/// `base_messages` with `left_adapter` (null: the base model), and the setup (model, adapter, mode, sampling,
/// max new tokens).
pub fn to_json(exchanges: &[Exchange], setup: &ChatSetup) -> String {
    let side = setup.main_side();
    let mut doc = json!({
        "exported_by": "metal-candle chat",
        "exported_at": utc_now_text(),
        "model": setup.model.as_deref().map(absolute),
        "adapter": setup.adapter.as_deref().filter(|_| side == ChatSide::Right).map(absolute),
        "mode": setup.mode.as_str(),
        "sampling": setup.sampling,
        "max_new_tokens": setup.max_new_tokens,
        "messages": messages_json(exchanges, side, &setup.system_prompt),
    });
    if setup.mode == ChatMode::SideBySide {
        doc["base_messages"] = json!(messages_json(exchanges, ChatSide::Left, &setup.system_prompt));
        doc["left_adapter"] = json!(setup.left_adapter.as_deref().map(absolute));
    }
    serde_json::to_string_pretty(&doc).unwrap_or_default() + "\n"
}

/// "temperature 0.70, top-p 0.90, top-k off, repetition penalty 1.10, seed 42, at most 256 new tokens".
fn sampling_text(s: &SamplingParams, max_new_tokens: usize) -> String {
    let temperature = if s.temperature <= 0.0 {
        "temperature 0 (greedy)".to_string()
    } else {
        format!("temperature {:.2}", s.temperature)
    };
    let top_k = if s.top_k == 0 { "off".to_string() } else { s.top_k.to_string() };
    format!(
        "{temperature}, top-p {:.2}, top-k {top_k}, repetition penalty {:.2}, seed {}, at most {max_new_tokens} new tokens",
        s.top_p, s.repetition_penalty, s.seed
    )
}

/// One reply under its heading, with its statistics or error in italics.
fn reply_markdown(out: &mut String, heading: &str, reply: Option<&Reply>) {
    let Some(reply) = reply else { return };
    out.push_str(&format!("{heading}\n\n{}\n\n", reply.text.trim()));
    if let Some(e) = &reply.error {
        out.push_str(&format!("> Error: {e}\n\n"));
    } else if let Some(s) = &reply.stats {
        out.push_str(&format!(
            "*{} tokens · {:.1} tokens/s · stopped: {}*\n\n",
            s.new_tokens,
            s.decode_tokens_per_sec(),
            s.stop_reason.as_str().replace('_', " ")
        ));
    } else if reply.streaming {
        out.push_str("*(still generating when exported)*\n\n");
    }
}

/// The Markdown export: the setup as a list, then `## User` / `## Assistant` turns (side by side, the two
/// replies under `### Base model` and `### With adapter`, or the two checkpoints' names).
pub fn to_markdown(exchanges: &[Exchange], setup: &ChatSetup) -> String {
    let side = setup.main_side();
    let name = |p: &std::path::Path| crate::worker::display_name(p);
    let mut out = String::from("# Chat");
    if let Some(model) = &setup.model {
        out.push_str(&format!(" with {}", name(model)));
    }
    out.push_str("\n\n");
    out.push_str(&format!("- **Model:** {}\n", setup.model.as_deref().map(absolute).unwrap_or("none".into())));
    let adapter = setup.adapter.as_deref().filter(|_| side == ChatSide::Right);
    out.push_str(&format!("- **Adapter:** {}\n", adapter.map(absolute).unwrap_or("none (base model)".into())));
    let left = setup.left_adapter.as_deref().filter(|_| setup.mode == ChatMode::SideBySide);
    if let Some(left) = left {
        out.push_str(&format!("- **Left column:** {}\n", absolute(left)));
    }
    let (left_heading, right_heading) = match (left, setup.adapter.as_deref()) {
        (None, _) => ("### Base model".to_string(), "### With adapter".to_string()),
        (Some(l), r) => (
            format!("### {}", checkpoint_title(l)),
            format!("### {}", r.map(checkpoint_title).unwrap_or_else(|| "Base model".into())),
        ),
    };
    out.push_str(&format!("- **Sampling:** {}\n", sampling_text(&setup.sampling, setup.max_new_tokens)));
    out.push_str(&format!("- **Exported:** {}\n\n", utc_now_text()));
    if !setup.system_prompt.trim().is_empty() {
        out.push_str(&format!("## System\n\n{}\n\n", setup.system_prompt.trim()));
    }
    for ex in exchanges {
        out.push_str(&format!("## User\n\n{}\n\n", ex.user.trim()));
        match setup.mode {
            ChatMode::SideBySide => {
                reply_markdown(&mut out, &left_heading, ex.base.as_ref());
                reply_markdown(&mut out, &right_heading, ex.adapter.as_ref());
            }
            _ => reply_markdown(&mut out, "## Assistant", ex.reply(side)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::generate::StopReason;

    fn reply(text: &str, adapter: Option<&str>) -> Reply {
        let mut r = Reply::new(1, adapter.map(PathBuf::from));
        r.text = text.into();
        r.streaming = false;
        r.stats = Some(GenerationStats {
            prompt_tokens: 9,
            new_tokens: 3,
            prefill_secs: 0.1,
            decode_secs: 0.5,
            stop_reason: StopReason::Eos,
        });
        r
    }

    fn setup(mode: ChatMode) -> ChatSetup {
        ChatSetup {
            model: Some("/m/SmolLM2.gguf".into()),
            adapter: Some("/runs/r/checkpoint-4".into()),
            left_adapter: None,
            mode,
            system_prompt: "Be brief.".into(),
            sampling: SamplingParams { repetition_penalty: 1.1, ..SamplingParams::default() },
            max_new_tokens: 64,
        }
    }

    fn exchanges() -> Vec<Exchange> {
        vec![
            Exchange { user: "Capital of France?".into(), base: Some(reply("Paris.", None)), adapter: None },
            Exchange {
                user: "And Italy?".into(),
                base: Some(reply("Rome.", None)),
                adapter: Some(reply("Rome!", Some("/runs/r/checkpoint-4"))),
            },
        ]
    }

    #[test]
    fn json_holds_the_messages_with_roles_and_the_setup() {
        let doc: Value = serde_json::from_str(&to_json(&exchanges(), &setup(ChatMode::Base))).unwrap();
        let roles: Vec<&str> =
            doc["messages"].as_array().unwrap().iter().map(|m| m["role"].as_str().unwrap()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "user", "assistant"]);
        assert_eq!(doc["messages"][2]["content"], "Paris.");
        assert_eq!(doc["messages"][2]["generation"]["stop_reason"], "eos");
        assert_eq!(doc["model"], "/m/SmolLM2.gguf");
        assert!(doc["adapter"].is_null(), "the base model answered");
        assert!((doc["sampling"]["repetition_penalty"].as_f64().unwrap() - 1.1).abs() < 1e-6);
        assert_eq!(doc["max_new_tokens"], 64);
        assert!(doc.get("base_messages").is_none());

        let doc: Value = serde_json::from_str(&to_json(&exchanges(), &setup(ChatMode::SideBySide))).unwrap();
        assert_eq!(doc["adapter"], "/runs/r/checkpoint-4");
        assert_eq!(doc["messages"].as_array().unwrap().len(), 4, "the adapter did not answer the first question");
        assert_eq!(doc["messages"][3]["content"], "Rome!");
        assert_eq!(doc["base_messages"][4]["content"], "Rome.");
    }

    #[test]
    fn markdown_reads_as_headed_turns() {
        let md = to_markdown(&exchanges(), &setup(ChatMode::Adapter));
        assert!(md.starts_with("# Chat with SmolLM2.gguf\n"), "{md}");
        assert!(md.contains("- **Adapter:** /runs/r/checkpoint-4\n"), "{md}");
        assert!(md.contains("repetition penalty 1.10"), "{md}");
        assert!(
            md.contains("## System\n\nBe brief.\n\n## User\n\nCapital of France?\n\n## User\n\nAnd Italy?"),
            "{md}"
        );
        assert!(md.contains("## Assistant\n\nRome!\n\n*3 tokens"), "{md}");
        let side = to_markdown(&exchanges(), &setup(ChatMode::SideBySide));
        assert!(side.contains("### Base model\n\nRome.") && side.contains("### With adapter\n\nRome!"), "{side}");
    }

    #[test]
    fn two_checkpoints_side_by_side_are_named_in_both_exports() {
        let two = ChatSetup { left_adapter: Some("/runs/q/checkpoint-2".into()), ..setup(ChatMode::SideBySide) };
        let md = to_markdown(&exchanges(), &two);
        assert!(md.contains("- **Left column:** /runs/q/checkpoint-2\n"), "{md}");
        assert!(md.contains("### q · step 2\n\nRome.") && md.contains("### r · step 4\n\nRome!"), "{md}");
        let doc: Value = serde_json::from_str(&to_json(&exchanges(), &two)).unwrap();
        assert_eq!(doc["left_adapter"], "/runs/q/checkpoint-2");
        let doc: Value = serde_json::from_str(&to_json(&exchanges(), &setup(ChatMode::SideBySide))).unwrap();
        assert!(doc["left_adapter"].is_null(), "the base model answered on the left");
        assert_eq!(checkpoint_title(std::path::Path::new("/x/peft-adapter")), "x / peft-adapter");
    }
}
