//! What a dataset row is: the six row formats a file may be written in ([`DatasetFormat`]), the format a user
//! may name instead of detection ([`FormatChoice`]), validated rows ([`Row`], with the file position each came
//! from) and what is wrong with a row and where ([`RowProblem`]).
//!
//! Reading rows is elsewhere: `rows.rs` validates one row of a format, `detect.rs` finds a file's format, and
//! `files/` reads JSONL, JSON and parquet files.

use crate::engine::model::chat_template::ChatMessage;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::path::PathBuf;

/// The roles a chat row may use. Templates differ on anything else, so we refuse it up front. `tool` turns
/// (and assistant turns with `tool_calls`) are accepted here and checked against the model's chat template
/// when the row is tokenized.
pub const CHAT_ROLES: [&str; 4] = ["system", "user", "assistant", "tool"];

/// How the rows of one file are written: detected per file from the keys of its first row that has a
/// format's keys, or named by the user. run.json and metrics record these names, so they never change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DatasetFormat {
    /// `{"messages": [{"role": ..., "content": ...}, ...]}`, optionally with `tools` and tool-call turns.
    Chat,
    /// `{"prompt": ..., "completion": ...}`
    Completions,
    /// `{"text": ...}`
    Text,
    /// `{"conversations": [{"from": "human" | "gpt" | "system", "value": ...}, ...]}`
    ShareGpt,
    /// `{"instruction": ..., "input": ... (optional), "output": ...}`
    Alpaca,
    /// Preference pairs as TRL reads them: `{"prompt" (optional), "chosen", "rejected"}`, each a string (the
    /// standard form) or a list of messages (the conversational form), with optional `tools`.
    Preference,
    /// Prompts for GRPO, each with an optional reference `answer`: `{"prompt": text or messages, "answer"}`,
    /// `{"messages": [...], "answer"}`, gsm8k's `{"question", "answer"}` or MATH's `{"problem", "solution"}`
    /// (read in `prompt_rows.rs`).
    Prompts,
}

/// What a format's rows train: supervised targets (SFT), preference pairs (DPO, ORPO) or prompts the model
/// answers itself (GRPO). The trainer and the studio pick the method that fits from this.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RowKind {
    Supervised,
    Pairs,
    Prompts,
}

impl DatasetFormat {
    /// Every format, in the order detection reports candidates.
    pub const ALL: [DatasetFormat; 7] =
        [Self::Chat, Self::ShareGpt, Self::Alpaca, Self::Preference, Self::Prompts, Self::Completions, Self::Text];

    pub fn name(self) -> &'static str {
        match self {
            Self::Chat => "chat",
            Self::Completions => "completions",
            Self::Text => "text",
            Self::ShareGpt => "sharegpt",
            Self::Alpaca => "alpaca",
            Self::Preference => "preference",
            Self::Prompts => "prompts",
        }
    }

    /// What its rows train (see [`RowKind`]).
    pub fn kind(self) -> RowKind {
        match self {
            Self::Preference => RowKind::Pairs,
            Self::Prompts => RowKind::Prompts,
            _ => RowKind::Supervised,
        }
    }

    /// The field(s) that identify the format, for messages.
    pub fn fields(self) -> &'static str {
        match self {
            Self::Chat => "`messages`",
            Self::Completions => "`prompt`/`completion`",
            Self::Text => "`text`",
            Self::ShareGpt => "`conversations`",
            Self::Alpaca => "`instruction`/`output`",
            Self::Preference => "`chosen`/`rejected`",
            Self::Prompts => "`prompt`/`answer`",
        }
    }

    /// The columns a row of this format must have: a row with all of them (not null) has the format's keys.
    /// Prompts are found by their own rule (`prompt_rows::is_prompt_row`: `messages`, `question` or `problem`
    /// stand for `prompt` beside an answer), so `prompt` alone is listed here for mappings and messages.
    pub fn required_columns(self) -> &'static [&'static str] {
        match self {
            Self::Chat => &["messages"],
            Self::Completions => &["prompt", "completion"],
            Self::Text => &["text"],
            Self::ShareGpt => &["conversations"],
            Self::Alpaca => &["instruction", "output"],
            Self::Preference => &["chosen", "rejected"],
            Self::Prompts => &["prompt"],
        }
    }

    /// The columns a row of this format may have besides the required ones.
    pub fn optional_columns(self) -> &'static [&'static str] {
        match self {
            Self::Chat => &["tools"],
            Self::ShareGpt => &["system", "tools"],
            Self::Alpaca => &["input", "system"],
            Self::Preference => &["prompt", "tools"],
            Self::Prompts => &["answer", "tools"],
            Self::Completions | Self::Text => &[],
        }
    }

    /// What its rows are called in counts: "pairs" for preference data, "prompts" for GRPO prompts, "rows"
    /// otherwise.
    pub fn rows_word(self) -> &'static str {
        match self {
            Self::Preference => "pairs",
            Self::Prompts => "prompts",
            _ => "rows",
        }
    }

    /// Required then optional columns: what a column mapping may name for this format.
    pub fn columns(self) -> impl Iterator<Item = &'static str> {
        self.required_columns().iter().chain(self.optional_columns()).copied()
    }
}

impl std::fmt::Display for DatasetFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for DatasetFormat {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|f| f.name() == s)
            .ok_or_else(|| format!("unknown dataset format `{s}`; use {}", Self::ALL.map(|f| f.name()).join(", ")))
    }
}

/// Which format the rows are read as: detected per file (`auto`), or the one named.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FormatChoice {
    #[default]
    Auto,
    Chat,
    ShareGpt,
    Alpaca,
    Preference,
    Prompts,
    Completions,
    Text,
}

impl FormatChoice {
    /// Every choice, `auto` first (the dataset page's list).
    pub const ALL: [FormatChoice; 8] = [
        Self::Auto,
        Self::Chat,
        Self::ShareGpt,
        Self::Alpaca,
        Self::Preference,
        Self::Prompts,
        Self::Completions,
        Self::Text,
    ];

    /// The named format; `None` for `auto`.
    pub fn format(self) -> Option<DatasetFormat> {
        match self {
            Self::Auto => None,
            Self::Chat => Some(DatasetFormat::Chat),
            Self::ShareGpt => Some(DatasetFormat::ShareGpt),
            Self::Alpaca => Some(DatasetFormat::Alpaca),
            Self::Preference => Some(DatasetFormat::Preference),
            Self::Prompts => Some(DatasetFormat::Prompts),
            Self::Completions => Some(DatasetFormat::Completions),
            Self::Text => Some(DatasetFormat::Text),
        }
    }

    pub fn name(self) -> &'static str {
        self.format().map_or("auto", DatasetFormat::name)
    }
}

impl From<DatasetFormat> for FormatChoice {
    fn from(format: DatasetFormat) -> Self {
        match format {
            DatasetFormat::Chat => Self::Chat,
            DatasetFormat::ShareGpt => Self::ShareGpt,
            DatasetFormat::Alpaca => Self::Alpaca,
            DatasetFormat::Preference => Self::Preference,
            DatasetFormat::Prompts => Self::Prompts,
            DatasetFormat::Completions => Self::Completions,
            DatasetFormat::Text => Self::Text,
        }
    }
}

impl std::fmt::Display for FormatChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for FormatChoice {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|c| c.name() == s)
            .ok_or_else(|| format!("unknown dataset format `{s}`; use {}", Self::ALL.map(|c| c.name()).join(", ")))
    }
}

/// A conversation with the tools its assistant may call (`tools` as transformers' `apply_chat_template` takes
/// them: JSON schemas).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Conversation {
    pub messages: Vec<ChatMessage>,
    pub tools: Option<Vec<Value>>,
}

impl Conversation {
    /// Whether rendering this conversation needs a template that knows tools.
    pub fn uses_tools(&self) -> bool {
        self.tools.as_ref().is_some_and(|t| !t.is_empty()) || self.messages.iter().any(ChatMessage::uses_tools)
    }
}

impl From<Vec<ChatMessage>> for Conversation {
    fn from(messages: Vec<ChatMessage>) -> Self {
        Self { messages, tools: None }
    }
}

/// One validated dataset row. ShareGPT and Alpaca rows become chat rows.
#[derive(Debug, Clone, PartialEq)]
pub enum Row {
    Chat(Conversation),
    Completion {
        prompt: String,
        completion: String,
    },
    Text(String),
    /// A preference pair (trained with DPO or ORPO, never with SFT).
    Preference(PreferenceRow),
    /// A prompt for GRPO (the model writes the completions; nothing here is a target).
    Prompt(PromptRow),
}

/// What refuses supervised fine-tuning on preference pairs (one message for the trainer, the CLI and tokenizing).
pub const PREFERENCE_NOT_SFT: &str =
    "this dataset holds preference pairs (`chosen`/`rejected`); train with --method dpo or orpo, not sft";

/// What refuses SFT, DPO and ORPO on GRPO prompts (one message for the trainer, the CLI and tokenizing).
pub const PROMPTS_NOT_SUPERVISED: &str = "this dataset holds prompts for GRPO (`prompt` with an optional \
     `answer`): there is no completion to learn from or compare; train with --method grpo";

/// One side of a preference pair, or its prompt: text (the standard form) or messages (the conversational form).
/// A row holds one kind only.
#[derive(Debug, Clone, PartialEq)]
pub enum PreferenceTurns {
    Text(String),
    Messages(Vec<ChatMessage>),
}

impl PreferenceTurns {
    /// Whether this is the conversational form.
    pub fn is_messages(&self) -> bool {
        matches!(self, Self::Messages(_))
    }
}

/// A validated preference pair, its prompt already taken out of `chosen` and `rejected` when the row had none
/// (TRL's `extract_prompt`): `chosen` and `rejected` are only the completions that follow the prompt.
#[derive(Debug, Clone, PartialEq)]
pub struct PreferenceRow {
    pub prompt: PreferenceTurns,
    pub chosen: PreferenceTurns,
    pub rejected: PreferenceTurns,
    /// Tool schemas the chat template renders (conversational form only).
    pub tools: Option<Vec<Value>>,
}

/// A prompt for GRPO: the model samples its own completions. `prompt` is a text prompt (the standard form) or
/// messages (the conversational form, rendered with the generation prompt); `answer` is the reference the
/// exact-answer reward compares with.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptRow {
    pub prompt: PreferenceTurns,
    pub answer: Option<String>,
    /// Tool schemas the chat template renders (conversational form only).
    pub tools: Option<Vec<Value>>,
}

impl PromptRow {
    /// The prompt as rewards and the sample view show it: the text, or the last user message's content.
    pub fn prompt_text(&self) -> String {
        match &self.prompt {
            PreferenceTurns::Text(text) => text.clone(),
            PreferenceTurns::Messages(messages) => messages
                .iter()
                .rev()
                .find(|m| m.role == "user")
                .or(messages.last())
                .map(|m| m.content.clone())
                .unwrap_or_default(),
        }
    }
}

impl Row {
    /// The conversation a chat or completions row stands for (a completion is a user + assistant exchange);
    /// `None` for text rows.
    pub fn to_conversation(&self) -> Option<Conversation> {
        match self {
            Self::Chat(conversation) => Some(conversation.clone()),
            Self::Completion { prompt, completion } => Some(
                vec![ChatMessage::new("user", prompt.clone()), ChatMessage::new("assistant", completion.clone())]
                    .into(),
            ),
            Self::Text(_) | Self::Preference(_) | Self::Prompt(_) => None,
        }
    }
}

/// How positions in a file are counted: JSONL lines (1-based, blank lines included), or row indices (1-based)
/// of a JSON array or a parquet file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RowUnit {
    #[default]
    Line,
    Row,
}

impl RowUnit {
    /// "line" or "row", for messages.
    pub fn name(self) -> &'static str {
        match self {
            Self::Line => "line",
            Self::Row => "row",
        }
    }

    /// Where position `n` of `path` is, as messages write it: `data.jsonl:17` or `data.parquet: row 17`.
    pub fn locate(self, path: &std::path::Path, n: usize) -> String {
        match self {
            Self::Line => format!("{}:{n}", path.display()),
            Self::Row => format!("{}: row {n}", path.display()),
        }
    }
}

/// What is wrong with one row of a dataset file (`line` is 1-based: a JSONL line, or a row index where `unit`
/// says `row`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RowProblem {
    pub path: PathBuf,
    pub line: usize,
    pub message: String,
    #[serde(default)]
    pub unit: RowUnit,
}

impl std::fmt::Display for RowProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.unit.locate(&self.path, self.line), self.message)
    }
}

/// A valid row with where it came from: `line` is its position in its file (see [`RowUnit`]), `file` the
/// index of that file among its split's files (0 for a split of one file).
#[derive(Debug, Clone, PartialEq)]
pub struct SourcedRow {
    pub line: usize,
    pub row: Row,
    pub file: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_stay_what_run_json_records() {
        for f in DatasetFormat::ALL {
            assert_eq!(f.name().parse::<DatasetFormat>(), Ok(f));
            assert_eq!(serde_json::to_value(f).unwrap(), serde_json::json!(f.name()));
            assert_eq!(FormatChoice::from(f).format(), Some(f));
        }
        assert_eq!(serde_json::to_value(DatasetFormat::Completions).unwrap(), "completions");
        assert_eq!("auto".parse::<FormatChoice>(), Ok(FormatChoice::Auto));
        let err = "csv".parse::<FormatChoice>().unwrap_err();
        assert!(err.contains("auto, chat, sharegpt, alpaca, preference, prompts, completions, text"), "{err}");
        assert_eq!((DatasetFormat::Prompts.kind(), DatasetFormat::Prompts.rows_word()), (RowKind::Prompts, "prompts"));
    }

    #[test]
    fn problems_name_lines_or_rows() {
        let p = |unit| RowProblem { path: "d/x".into(), line: 17, message: "bad".into(), unit };
        assert_eq!(p(RowUnit::Line).to_string(), "d/x:17: bad");
        assert_eq!(p(RowUnit::Row).to_string(), "d/x: row 17: bad");
        let old: RowProblem = serde_json::from_str(r#"{"path":"a","line":2,"message":"m"}"#).unwrap();
        assert_eq!(old.unit, RowUnit::Line);
    }
}
