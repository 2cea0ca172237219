//! A file's rows, read one at a time, into a [`ParsedFile`]: the columns it has, its format (named by the user,
//! or detected from its first row that has one format's keys and is valid), its valid rows and what is wrong
//! with the others. Every file type (`files/`) feeds its rows through [`RowCollector`], so JSONL, JSON
//! and parquet files are detected, mapped and validated by the same rules.
//!
//! A row with the keys of several formats (`messages` and `instruction`, or Alpaca's beside prompt/completion) is
//! never guessed: the file is [`Detection::Ambiguous`], listing the candidates, and a user names the format
//! (`--format`, the dataset page). A `text` column beside a structured format's columns is not a second format
//! (it is the row rendered, as in tatsu-lab/alpaca): the structured format is detected. Rows are held back only until the format is known (at most
//! [`DETECT_WINDOW`] of them), so a large file streams.

use super::columns::ReadOptions;
use super::formats::{DatasetFormat, Row, RowProblem, RowUnit, SourcedRow};
use super::rows::{formats_of, key_list, kind, no_format_message, parse_as};
use crate::engine::{Error, Result};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::HashSet;
use std::path::{Path, PathBuf};

/// Rows held back while no row has told the format; after that many the file is of no known format.
pub const DETECT_WINDOW: usize = 1000;

/// Columns a report lists at most.
pub const MAX_LISTED_COLUMNS: usize = 64;

/// How a file's (or a split's) format was found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "lowercase")]
pub enum Detection {
    /// Named by the user (`--format`, the dataset page).
    Chosen { format: DatasetFormat },
    /// From the keys of the first valid row with one format's keys, at position `row` (a line for JSONL).
    Detected { format: DatasetFormat, row: usize },
    /// The first row with a format's keys (at `row`) has the keys of several formats.
    Ambiguous { candidates: Vec<DatasetFormat>, row: usize },
    /// No valid row has a known format's keys (or there are no rows).
    Unknown,
    /// The files of one split are in different formats (each file with its own).
    Mixed { files: Vec<(PathBuf, DatasetFormat)> },
}

impl Default for Detection {
    fn default() -> Self {
        Self::Unknown
    }
}

impl Detection {
    /// The format rows are read as; `None` when ambiguous, unknown or mixed.
    pub fn format(&self) -> Option<DatasetFormat> {
        match self {
            Self::Chosen { format } | Self::Detected { format, .. } => Some(*format),
            _ => None,
        }
    }

    /// "alpaca (detected from row 1)", "ambiguous: alpaca or completions (row 1)", ...: what reports print.
    pub fn describe(&self, unit: RowUnit) -> String {
        match self {
            Self::Chosen { format } => format!("{format} (chosen)"),
            Self::Detected { format, row } => format!("{format} (detected from {} {row})", unit.name()),
            Self::Ambiguous { candidates, row } => {
                format!("ambiguous: {} ({} {row})", or_list(candidates), unit.name())
            }
            Self::Unknown => "unknown".into(),
            Self::Mixed { files } => {
                let formats: Vec<String> = files.iter().map(|(p, f)| format!("{} is {f}", file_name(p))).collect();
                format!("mixed: {}", formats.join(", "))
            }
        }
    }

    /// Whether a user has to name the format (or map columns) before the file can be read.
    pub fn needs_choice(&self) -> bool {
        matches!(self, Self::Ambiguous { .. } | Self::Unknown)
    }
}

fn or_list(formats: &[DatasetFormat]) -> String {
    formats.iter().map(|f| f.name()).collect::<Vec<_>>().join(" or ")
}

fn file_name(p: &Path) -> String {
    p.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_else(|| p.display().to_string())
}

/// Everything read from one file: the valid rows, the problems, the detected format and the file's columns.
#[derive(Debug, Clone)]
pub struct ParsedFile {
    pub path: PathBuf,
    /// How the file's positions count (lines of JSONL, rows of JSON arrays and parquet).
    pub unit: RowUnit,
    /// `None` when no row of the file is valid, or the format is ambiguous.
    pub format: Option<DatasetFormat>,
    pub detection: Detection,
    pub rows: Vec<SourcedRow>,
    pub problems: Vec<RowProblem>,
    pub blank_lines: usize,
    /// The file's columns as written (before mapping): a parquet file's schema in order, or the keys of JSON
    /// rows as first seen (each row's keys sorted, as serde_json keeps them; at most [`MAX_LISTED_COLUMNS`]).
    pub columns: Vec<String>,
    /// Rows not read because the format is ambiguous.
    pub unread_rows: usize,
}

impl ParsedFile {
    /// Rows that held something (valid or not).
    pub fn non_blank_lines(&self) -> usize {
        self.rows.len() + self.problems.len() + self.unread_rows
    }

    /// The error that refuses the whole file (an ambiguous format), naming the row, the candidates, the
    /// columns and what to do.
    pub fn refusal(&self) -> Option<Error> {
        let Detection::Ambiguous { candidates, row } = &self.detection else { return None };
        let fields: Vec<String> = candidates.iter().map(|f| format!("{f} ({})", f.fields())).collect();
        let choices: Vec<&str> = candidates.iter().map(|f| f.name()).collect();
        Some(Error::Data(format!(
            "{}: ambiguous format: this row has the keys of {}; the file's columns: {}; name the format with \
             --format {} (or `data_format` in a config file, or on the dataset page)",
            self.unit.locate(&self.path, *row),
            fields.join(" and "),
            self.columns.join(", "),
            choices.join("|")
        )))
    }
}

enum State {
    Chosen(DatasetFormat),
    Undecided,
    Detected(DatasetFormat, usize),
    Ambiguous,
    Unknown,
}

/// Builds a [`ParsedFile`] from rows fed one at a time (see the module docs).
pub struct RowCollector {
    file: ParsedFile,
    read: ReadOptions,
    state: State,
    pending: Vec<(usize, std::result::Result<Value, String>)>,
    seen_columns: HashSet<String>,
    /// The columns come from a schema (parquet), not from the rows.
    fixed_columns: bool,
}

impl RowCollector {
    pub fn new(path: &Path, unit: RowUnit, read: &ReadOptions) -> Self {
        let state = match read.format.format() {
            Some(format) => State::Chosen(format),
            None => State::Undecided,
        };
        Self {
            file: ParsedFile {
                path: path.to_path_buf(),
                unit,
                format: None,
                detection: Detection::Unknown,
                rows: Vec::new(),
                problems: Vec::new(),
                blank_lines: 0,
                columns: Vec::new(),
                unread_rows: 0,
            },
            read: read.clone(),
            state,
            pending: Vec::new(),
            seen_columns: HashSet::new(),
            fixed_columns: false,
        }
    }

    /// The file's columns from its schema, checked against the column mapping at once.
    pub fn set_columns(&mut self, columns: Vec<String>) -> Result<()> {
        self.read.check_columns(&self.file.path, &columns)?;
        self.file.columns = columns;
        self.fixed_columns = true;
        Ok(())
    }

    pub fn blank_line(&mut self) {
        self.file.blank_lines += 1;
    }

    /// One row at `position` (1-based): a parsed JSON value, or why it could not be parsed.
    pub fn push(&mut self, position: usize, value: std::result::Result<Value, String>) {
        let value = match value {
            Ok(Value::Object(mut obj)) => {
                self.note_columns(obj.keys());
                self.read.columns.apply(&mut obj);
                Ok(Value::Object(obj))
            }
            other => other,
        };
        match self.state {
            State::Chosen(format) => {
                let checked = check_as(value, format);
                self.settle(position, checked)
            }
            State::Detected(format, at) => {
                let checked = check_row(value, Some((format, at)), self.file.unit);
                self.settle(position, checked)
            }
            State::Unknown => {
                let checked = check_row(value, None, self.file.unit);
                self.settle(position, checked)
            }
            State::Ambiguous => self.file.unread_rows += 1,
            State::Undecided => self.detect(position, value),
        }
    }

    fn detect(&mut self, position: usize, value: std::result::Result<Value, String>) {
        let own = value.as_ref().ok().and_then(Value::as_object).map(formats_of).unwrap_or_default();
        if own.len() > 1 {
            self.file.unread_rows += self.pending.len() + 1;
            self.pending.clear();
            self.file.detection = Detection::Ambiguous { candidates: own, row: position };
            self.state = State::Ambiguous;
            return;
        }
        let valid = match (&value, own.first()) {
            (Ok(Value::Object(obj)), Some(&format)) => parse_as(obj, format).is_ok().then_some(format),
            _ => None,
        };
        match valid {
            Some(format) => {
                self.state = State::Detected(format, position);
                self.file.detection = Detection::Detected { format, row: position };
                for (p, v) in std::mem::take(&mut self.pending) {
                    let checked = check_row(v, Some((format, position)), self.file.unit);
                    self.settle(p, checked);
                }
                let checked = check_row(value, Some((format, position)), self.file.unit);
                self.settle(position, checked);
            }
            None => {
                self.pending.push((position, value));
                if self.pending.len() >= DETECT_WINDOW {
                    self.give_up();
                }
            }
        }
    }

    /// No format found: every held-back row becomes a problem, and so will every later one.
    fn give_up(&mut self) {
        self.state = State::Unknown;
        for (p, v) in std::mem::take(&mut self.pending) {
            let checked = check_row(v, None, self.file.unit);
            self.settle(p, checked);
        }
    }

    fn settle(&mut self, position: usize, checked: std::result::Result<Row, String>) {
        match checked {
            Ok(row) => self.file.rows.push(SourcedRow { line: position, row, file: 0 }),
            Err(message) => self.file.problems.push(RowProblem {
                path: self.file.path.clone(),
                line: position,
                message,
                unit: self.file.unit,
            }),
        }
    }

    fn note_columns<'a>(&mut self, keys: impl Iterator<Item = &'a String>) {
        if self.fixed_columns {
            return;
        }
        for key in keys {
            if self.seen_columns.len() < MAX_LISTED_COLUMNS * 4 && self.seen_columns.insert(key.clone()) {
                if self.file.columns.len() < MAX_LISTED_COLUMNS {
                    self.file.columns.push(key.clone());
                }
            }
        }
    }

    /// Whether a lone JSON object has a format's keys (after the column mapping): a row, not a holder of rows.
    pub fn is_row(&self, obj: &serde_json::Map<String, Value>) -> bool {
        let mut mapped = obj.clone();
        self.read.columns.apply(&mut mapped);
        !formats_of(&mapped).is_empty()
    }

    /// The file, with its detection settled and the column mapping checked against its columns.
    pub fn finish(mut self) -> Result<ParsedFile> {
        if matches!(self.state, State::Undecided) {
            self.give_up();
        }
        if let State::Chosen(format) = self.state {
            self.file.detection = Detection::Chosen { format };
        }
        self.file.format = self.file.detection.format().filter(|_| !self.file.rows.is_empty());
        if !self.fixed_columns {
            let mut all: Vec<String> = self.seen_columns.iter().cloned().collect();
            all.sort();
            if self.read.missing_column(&all).is_some() {
                self.read.check_columns(&self.file.path, &self.file.columns)?;
            }
        }
        Ok(self.file)
    }
}

/// One row read as the format the user named.
fn check_as(value: std::result::Result<Value, String>, format: DatasetFormat) -> std::result::Result<Row, String> {
    let value = value?;
    let obj = value.as_object().ok_or_else(|| format!("expected a JSON object, found {}", kind(&value)))?;
    parse_as(obj, format).map_err(|e| {
        if formats_of(obj).is_empty() {
            format!("{e} (the rows are read as {format}: --format); found {}", key_list(obj))
        } else {
            e
        }
    })
}

/// Rows another format's keys describe that the file's format still reads: in a prompts file, messages without an
/// answer (answers are optional); in a completions or preference file, a lone `prompt` with no answer, so the
/// field it lacks is named rather than a mixed format.
fn file_format_reads(file: DatasetFormat, own: &[DatasetFormat], obj: &serde_json::Map<String, Value>) -> bool {
    match own {
        [DatasetFormat::Chat] => file == DatasetFormat::Prompts,
        [DatasetFormat::Prompts] => {
            file.columns().any(|c| c == "prompt")
                && !super::prompt_rows::ANSWER_COLUMNS.iter().any(|c| obj.get(*c).is_some_and(|v| !v.is_null()))
        }
        _ => false,
    }
}

/// One row against the file's format, if one was found (with the position it was detected at).
fn check_row(
    value: std::result::Result<Value, String>,
    file_format: Option<(DatasetFormat, usize)>,
    unit: RowUnit,
) -> std::result::Result<Row, String> {
    let value = value?;
    let obj = value.as_object().ok_or_else(|| format!("expected a JSON object, found {}", kind(&value)))?;
    let own = formats_of(obj);
    match (own.as_slice(), file_format) {
        ([], None) => Err(no_format_message(obj)),
        ([], Some((format, at))) => parse_as(obj, format).map_err(|e| {
            format!("{e} (the file is in {format} format, detected from {} {at}); found {}", unit.name(), key_list(obj))
        }),
        (own, Some((format, _))) if file_format_reads(format, own, obj) => parse_as(obj, format),
        (own, Some((format, at))) if !own.contains(&format) => Err(format!(
            "mixed formats: this row is {} ({}) but the file is {format} ({}), detected from {} {at}",
            own[0],
            own[0].fields(),
            format.fields(),
            unit.name()
        )),
        (_, Some((format, _))) => parse_as(obj, format),
        ([one], None) => parse_as(obj, *one),
        (several, None) => Err(format!("ambiguous row: it has the keys of {}", or_list(several))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::data::formats::FormatChoice;
    use serde_json::json;

    fn collect(rows: &[Value], read: &ReadOptions) -> Result<ParsedFile> {
        let mut c = RowCollector::new(Path::new("d.json"), RowUnit::Row, read);
        for (i, r) in rows.iter().enumerate() {
            c.push(i + 1, Ok(r.clone()));
        }
        c.finish()
    }

    fn auto(rows: &[Value]) -> ParsedFile {
        collect(rows, &ReadOptions::default()).unwrap()
    }

    #[test]
    fn each_format_is_detected_from_its_keys() {
        let cases = [
            (
                json!({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}),
                DatasetFormat::Chat,
            ),
            (
                json!({"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]}),
                DatasetFormat::ShareGpt,
            ),
            (json!({"instruction": "q", "input": "", "output": "a"}), DatasetFormat::Alpaca),
            (json!({"prompt": "q", "completion": "a"}), DatasetFormat::Completions),
            (json!({"text": "t", "id": 3}), DatasetFormat::Text),
        ];
        for (row, format) in cases {
            let p = auto(&[row]);
            assert_eq!((p.format, p.detection.clone()), (Some(format), Detection::Detected { format, row: 1 }));
            assert_eq!(p.rows.len(), 1);
        }
    }

    #[test]
    fn ambiguous_rows_are_not_guessed() {
        let row = json!({"instruction": "i", "output": "o", "prompt": "p", "completion": "c"});
        let p = auto(&[json!({"id": 1}), row.clone(), row]);
        assert_eq!(
            p.detection,
            Detection::Ambiguous { candidates: vec![DatasetFormat::Alpaca, DatasetFormat::Completions], row: 2 }
        );
        assert_eq!((p.format, p.rows.len(), p.unread_rows), (None, 0, 3));
        assert_eq!(p.columns, vec!["id", "completion", "instruction", "output", "prompt"]);
        let err = p.refusal().unwrap().to_string();
        assert!(err.starts_with("d.json: row 2: ambiguous format"), "{err}");
        assert!(
            err.contains("alpaca (`instruction`/`output`) and completions (`prompt`/`completion`)")
                && err.contains("--format alpaca|completions"),
            "{err}"
        );
        // A rendered `text` beside Alpaca's columns (tatsu-lab/alpaca) is not a second format.
        let p = auto(&[json!({"instruction": "i", "output": "o", "text": "### Instruction: i"})]);
        assert_eq!(p.detection, Detection::Detected { format: DatasetFormat::Alpaca, row: 1 });

        let chosen = ReadOptions { format: FormatChoice::Alpaca, ..Default::default() };
        let p = collect(&[json!({"instruction": "i", "output": "o", "text": "t"})], &chosen).unwrap();
        assert_eq!((p.detection, p.rows.len()), (Detection::Chosen { format: DatasetFormat::Alpaca }, 1));
    }

    #[test]
    fn unknown_columns_can_be_mapped() {
        let rows = [json!({"question": "2+2", "answer": "4"}), json!({"question": "3+3", "answer": "6"})];
        // gsm8k's columns are GRPO prompts; mapped, they read as completions.
        let p = auto(&rows);
        assert_eq!(
            (p.detection.clone(), p.rows.len()),
            (Detection::Detected { format: DatasetFormat::Prompts, row: 1 }, 2)
        );
        assert_eq!(p.columns, vec!["answer", "question"], "JSON objects list their keys sorted");
        let p = auto(&[json!({"query": "2+2", "reply": "4"})]);
        assert_eq!((p.detection.clone(), p.problems.len()), (Detection::Unknown, 1));
        assert!(p.problems[0].message.contains("no known format"), "{}", p.problems[0].message);

        let mapped =
            ReadOptions { columns: "prompt=question,completion=answer".parse().unwrap(), ..Default::default() };
        let p = collect(&rows, &mapped).unwrap();
        assert_eq!((p.format, p.rows.len()), (Some(DatasetFormat::Completions), 2));
        assert_eq!(p.columns, vec!["answer", "question"], "columns as the file has them");

        let typo = ReadOptions { columns: "prompt=questoin,completion=answer".parse().unwrap(), ..Default::default() };
        let err = collect(&rows, &typo).unwrap_err().to_string();
        assert!(err.contains("prompt=questoin") && err.contains("its columns: answer, question"), "{err}");
    }

    #[test]
    fn rows_before_detection_are_checked_against_the_format_found() {
        let rows = [
            json!({"text": 5}),
            json!({"prompt": "a", "completion": "b"}),
            json!({"text": "x"}),
            json!({"prompt": "p"}),
        ];
        let p = auto(&rows);
        assert_eq!(p.detection, Detection::Detected { format: DatasetFormat::Completions, row: 2 });
        let found: Vec<(usize, &str)> = p.problems.iter().map(|p| (p.line, p.message.as_str())).collect();
        assert_eq!(found.len(), 3);
        assert!(found[0].1.contains("mixed formats") && found[0].1.contains("detected from row 2"), "{found:?}");
        assert!(found[2].1.contains("missing field `completion`"), "{found:?}");
        assert_eq!(p.problems[0].to_string().split(": ").take(2).collect::<Vec<_>>(), ["d.json", "row 1"]);
    }

    #[test]
    fn a_file_of_no_known_format_gives_up_after_the_window() {
        let rows: Vec<Value> = (0..DETECT_WINDOW + 5).map(|i| json!({"n": i})).collect();
        let p = auto(&rows);
        assert_eq!((p.detection, p.problems.len(), p.rows.len()), (Detection::Unknown, DETECT_WINDOW + 5, 0));
    }
}
