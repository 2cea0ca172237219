//! Dataset rows: the three JSONL formats (chat, completions, text), per-file format detection from the first
//! valid row, and line-by-line validation that says exactly what is wrong with a row and where.

use crate::engine::model::chat_template::ChatMessage;
use crate::engine::{Error, Result};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};

/// The roles a chat row may use. Templates differ on anything else, so we refuse it up front.
pub const CHAT_ROLES: [&str; 3] = ["system", "user", "assistant"];

/// How the rows of one file are written. Detected per file from its first valid row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DatasetFormat {
    /// `{"messages": [{"role": ..., "content": ...}, ...]}`
    Chat,
    /// `{"prompt": ..., "completion": ...}`
    Completions,
    /// `{"text": ...}`
    Text,
}

impl DatasetFormat {
    pub fn name(self) -> &'static str {
        match self {
            Self::Chat => "chat",
            Self::Completions => "completions",
            Self::Text => "text",
        }
    }

    /// The field(s) that identify the format, for messages.
    pub fn fields(self) -> &'static str {
        match self {
            Self::Chat => "`messages`",
            Self::Completions => "`prompt`/`completion`",
            Self::Text => "`text`",
        }
    }

    /// The format a JSON object's keys point to; `messages` wins over the others.
    fn of_object(obj: &Map<String, Value>) -> Option<Self> {
        if obj.contains_key("messages") {
            Some(Self::Chat)
        } else if obj.contains_key("prompt") || obj.contains_key("completion") {
            Some(Self::Completions)
        } else if obj.contains_key("text") {
            Some(Self::Text)
        } else {
            None
        }
    }
}

impl std::fmt::Display for DatasetFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One validated dataset row.
#[derive(Debug, Clone, PartialEq)]
pub enum Row {
    Chat(Vec<ChatMessage>),
    Completion { prompt: String, completion: String },
    Text(String),
}

impl Row {
    pub fn format(&self) -> DatasetFormat {
        match self {
            Self::Chat(_) => DatasetFormat::Chat,
            Self::Completion { .. } => DatasetFormat::Completions,
            Self::Text(_) => DatasetFormat::Text,
        }
    }

    /// The conversation a chat or completions row stands for (a completion is a user + assistant exchange);
    /// `None` for text rows.
    pub fn to_messages(&self) -> Option<Vec<ChatMessage>> {
        match self {
            Self::Chat(messages) => Some(messages.clone()),
            Self::Completion { prompt, completion } => {
                Some(vec![ChatMessage::new("user", prompt.clone()), ChatMessage::new("assistant", completion.clone())])
            }
            Self::Text(_) => None,
        }
    }
}

/// What is wrong with one line of a dataset file (`line` is 1-based).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RowProblem {
    pub path: PathBuf,
    pub line: usize,
    pub message: String,
}

impl std::fmt::Display for RowProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}: {}", self.path.display(), self.line, self.message)
    }
}

/// A valid row with the line it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct SourcedRow {
    pub line: usize,
    pub row: Row,
}

/// Everything read from one JSONL file: the valid rows, the problems, and the detected format.
#[derive(Debug, Clone)]
pub struct ParsedFile {
    pub path: PathBuf,
    /// `None` when no row of the file is valid (or the file is empty).
    pub format: Option<DatasetFormat>,
    /// The line the format was detected from (0 when `format` is `None`).
    pub format_line: usize,
    pub rows: Vec<SourcedRow>,
    pub problems: Vec<RowProblem>,
    pub blank_lines: usize,
}

impl ParsedFile {
    /// Lines that held something (valid or not).
    pub fn non_blank_lines(&self) -> usize {
        self.rows.len() + self.problems.len()
    }
}

/// The largest dataset file read (4 GiB): far beyond what fits a LoRA run, small enough to refuse a wrong
/// path before it exhausts memory.
pub const MAX_DATASET_BYTES: u64 = 4 << 30;

/// Read and validate a JSONL file. Only I/O, a file that is not a regular one or is over
/// [`MAX_DATASET_BYTES`], and invalid UTF-8 (named by line) fail here; bad rows become [`RowProblem`]s.
pub fn read_jsonl(path: &Path) -> Result<ParsedFile> {
    let bytes = read_bounded(path, MAX_DATASET_BYTES)?;
    let text = String::from_utf8(bytes).map_err(|e| {
        let valid = e.utf8_error().valid_up_to();
        let line = 1 + e.as_bytes()[..valid].iter().filter(|b| **b == b'\n').count();
        Error::Dataset {
            path: path.to_path_buf(),
            line,
            message: format!("invalid UTF-8 at byte {valid}; save the file as UTF-8"),
        }
    })?;
    Ok(parse_jsonl(path, &text))
}

/// A regular file of at most `limit` bytes, read whole. Devices, pipes and larger files are refused before
/// reading (`/dev/zero` would otherwise fill memory); the size is checked again while reading.
pub(super) fn read_bounded(path: &Path, limit: u64) -> Result<Vec<u8>> {
    use std::io::Read;
    let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let meta = file.metadata().map_err(|e| Error::io(path, e))?;
    let refuse = |what: String| Error::Data(format!("{}: {what}", path.display()));
    if !meta.is_file() {
        return Err(refuse("not a regular file; a dataset is a .jsonl file or a folder of them".into()));
    }
    let too_big = || refuse(format!("larger than the {} GiB a dataset file may be", limit >> 30));
    if meta.len() > limit {
        return Err(too_big());
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.take(limit + 1).read_to_end(&mut bytes).map_err(|e| Error::io(path, e))?;
    if bytes.len() as u64 > limit {
        return Err(too_big());
    }
    Ok(bytes)
}

/// Validate JSONL `text` as if read from `path`. Blank lines are skipped; every other line must be a row of
/// the file's format, which is taken from the first row that is valid on its own.
pub fn parse_jsonl(path: &Path, text: &str) -> ParsedFile {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut blank_lines = 0;
    // (line, parsed value or the JSON error message)
    let mut values: Vec<(usize, std::result::Result<Value, String>)> = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        if raw.trim().is_empty() {
            blank_lines += 1;
            continue;
        }
        values.push((i + 1, serde_json::from_str::<Value>(raw).map_err(|e| json_error_message(&e))));
    }

    let detected = values.iter().find_map(|(line, value)| {
        let obj = value.as_ref().ok()?.as_object()?;
        let format = DatasetFormat::of_object(obj)?;
        parse_as(obj, format).ok().map(|_| (format, *line))
    });

    let mut rows = Vec::new();
    let mut problems = Vec::new();
    for (line, value) in values {
        match check_row(value, detected) {
            Ok(row) => rows.push(SourcedRow { line, row }),
            Err(message) => problems.push(RowProblem { path: path.to_path_buf(), line, message }),
        }
    }
    ParsedFile {
        path: path.to_path_buf(),
        format: detected.map(|(f, _)| f),
        format_line: detected.map(|(_, l)| l).unwrap_or(0),
        rows,
        problems,
        blank_lines,
    }
}

/// One line against the file's format (if one was found).
fn check_row(
    value: std::result::Result<Value, String>,
    file_format: Option<(DatasetFormat, usize)>,
) -> std::result::Result<Row, String> {
    let value = value?;
    let obj = value.as_object().ok_or_else(|| format!("expected a JSON object, found {}", kind(&value)))?;
    let own = DatasetFormat::of_object(obj);
    match (own, file_format) {
        (None, None) => Err(format!("no `messages`, `prompt`/`completion` or `text` field; found {}", key_list(obj))),
        (None, Some((format, at))) => Err(format!(
            "missing field {} (the file is in {format} format, detected from line {at}); found {}",
            format.fields(),
            key_list(obj)
        )),
        (Some(own), Some((format, at))) if own != format => Err(format!(
            "mixed formats: this row is {own} ({}) but the file is {format} ({}), detected from line {at}",
            own.fields(),
            format.fields()
        )),
        (Some(own), _) => parse_as(obj, own),
    }
}

/// Validate an object as a row of `format`.
fn parse_as(obj: &Map<String, Value>, format: DatasetFormat) -> std::result::Result<Row, String> {
    match format {
        DatasetFormat::Chat => parse_chat(obj),
        DatasetFormat::Completions => {
            let prompt = string_field(obj, "prompt")?;
            let completion = string_field(obj, "completion")?;
            if completion.trim().is_empty() {
                return Err("`completion` is empty, so there is nothing to train on".into());
            }
            Ok(Row::Completion { prompt, completion })
        }
        DatasetFormat::Text => {
            let text = string_field(obj, "text")?;
            if text.trim().is_empty() {
                return Err("`text` is empty".into());
            }
            Ok(Row::Text(text))
        }
    }
}

fn parse_chat(obj: &Map<String, Value>) -> std::result::Result<Row, String> {
    let messages = obj.get("messages").ok_or("missing field `messages`")?;
    let list = messages.as_array().ok_or_else(|| {
        format!("`messages` must be a list of {{\"role\", \"content\"}} objects, found {}", kind(messages))
    })?;
    if list.is_empty() {
        return Err("empty conversation: `messages` is an empty list".into());
    }
    let mut out = Vec::with_capacity(list.len());
    for (i, m) in list.iter().enumerate() {
        let m = m
            .as_object()
            .ok_or_else(|| format!("messages[{i}] must be an object with `role` and `content`, found {}", kind(m)))?;
        let role = match m.get("role") {
            None => return Err(format!("messages[{i}] has no `role`")),
            Some(Value::String(r)) => r.clone(),
            Some(other) => return Err(format!("messages[{i}].role must be a string, found {}", kind(other))),
        };
        if !CHAT_ROLES.contains(&role.as_str()) {
            return Err(format!("messages[{i}] has unknown role `{role}`; expected one of {}", CHAT_ROLES.join(", ")));
        }
        let content = match m.get("content") {
            None => return Err(format!("messages[{i}] ({role}) has no `content`")),
            Some(Value::String(c)) => c.clone(),
            Some(other) => return Err(format!("messages[{i}].content must be a string, found {}", kind(other))),
        };
        out.push(ChatMessage { role, content });
    }
    if !out.iter().any(|m| m.role == "assistant") {
        return Err("the conversation has no assistant message, so there is nothing to train on".into());
    }
    Ok(Row::Chat(out))
}

fn string_field(obj: &Map<String, Value>, name: &str) -> std::result::Result<String, String> {
    match obj.get(name) {
        None => Err(format!("missing field `{name}`")),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(other) => Err(format!("`{name}` must be a string, found {}", kind(other))),
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

fn key_list(obj: &Map<String, Value>) -> String {
    if obj.is_empty() {
        return "an empty object".into();
    }
    let mut keys: Vec<String> = obj.keys().take(8).map(|k| format!("`{k}`")).collect();
    if obj.len() > 8 {
        keys.push(format!("and {} more", obj.len() - 8));
    }
    format!("keys {}", keys.join(", "))
}

/// serde's message without its "at line 1 column N" tail (each line is parsed alone), with the column first.
fn json_error_message(e: &serde_json::Error) -> String {
    let full = e.to_string();
    let message = match full.rfind(" at line ") {
        Some(pos) => &full[..pos],
        None => full.as_str(),
    };
    format!("invalid JSON at column {}: {message}", e.column())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> ParsedFile {
        parse_jsonl(Path::new("data.jsonl"), text)
    }

    fn only_problem(text: &str) -> String {
        let p = parse(text);
        assert_eq!(p.problems.len(), 1, "{:?}", p.problems);
        p.problems[0].message.clone()
    }

    #[test]
    fn detects_each_format() {
        let chat = parse(r#"{"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"yo"}]}"#);
        assert_eq!(chat.format, Some(DatasetFormat::Chat));
        assert_eq!(chat.rows.len(), 1);
        let comp = parse("{\"prompt\":\"a\",\"completion\":\"b\"}\n\n{\"prompt\":\"\",\"completion\":\"c\"}\n");
        assert_eq!(comp.format, Some(DatasetFormat::Completions));
        assert_eq!((comp.rows.len(), comp.blank_lines), (2, 1));
        assert_eq!(comp.rows[1].line, 3);
        let text = parse("{\"text\":\"hello world\",\"id\":7}");
        assert_eq!(text.format, Some(DatasetFormat::Text));
        assert_eq!(text.rows[0].row, Row::Text("hello world".into()));
    }

    #[test]
    fn format_comes_from_the_first_valid_row() {
        let p = parse("{\"text\": 5}\n{\"prompt\":\"a\",\"completion\":\"b\"}\n{\"text\":\"x\"}\n");
        assert_eq!(p.format, Some(DatasetFormat::Completions));
        assert_eq!(p.format_line, 2);
        let lines: Vec<usize> = p.problems.iter().map(|p| p.line).collect();
        assert_eq!(lines, vec![1, 3]);
        assert!(p.problems[1].message.contains("mixed formats"), "{}", p.problems[1].message);
        assert!(p.problems[1].message.contains("line 2"), "{}", p.problems[1].message);
    }

    #[test]
    fn problems_say_what_is_wrong() {
        let good = r#"{"messages":[{"role":"user","content":"q"},{"role":"assistant","content":"a"}]}"#;
        let cases = [
            ("{\"messages\": [", "invalid JSON at column"),
            ("[1, 2]", "expected a JSON object, found a list"),
            ("{\"other\": 1}", "missing field `messages`"),
            ("{\"messages\": \"hi\"}", "found a string"),
            ("{\"messages\": []}", "empty conversation"),
            ("{\"messages\": [{\"content\": \"x\"}]}", "messages[0] has no `role`"),
            ("{\"messages\": [{\"role\": \"user\"}]}", "messages[0] (user) has no `content`"),
            (
                "{\"messages\": [{\"role\": \"user\", \"content\": 3}]}",
                "messages[0].content must be a string, found a number",
            ),
            ("{\"messages\": [{\"role\": \"bot\", \"content\": \"x\"}]}", "unknown role `bot`"),
            ("{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}", "no assistant message"),
            ("{\"text\": \"x\"}", "mixed formats"),
        ];
        for (bad, expected) in cases {
            let message = only_problem(&format!("{good}\n{bad}\n"));
            assert!(message.contains(expected), "{bad}: {message}");
        }
        let p = parse(&format!("{good}\n{{\"messages\": [}}\n"));
        assert_eq!(p.problems[0].line, 2);
        assert!(p.problems[0].to_string().starts_with("data.jsonl:2: invalid JSON at column 15"), "{}", p.problems[0]);
    }

    #[test]
    fn a_file_without_any_valid_row_reports_every_line() {
        let p = parse("{\"a\":1}\nnot json\n");
        assert_eq!(p.format, None);
        assert_eq!(p.problems.len(), 2);
        assert!(p.problems[0].message.contains("no `messages`, `prompt`/`completion` or `text` field"));
    }
}
