//! Reading multiple-choice rows: a JSONL, JSON or parquet file (through the dataset readers of `data/files`),
//! or a dataset folder and a split (a Hub dataset's folder included: `ARC-Challenge/test-00000-of-00001.parquet`,
//! `data/validation-00000-of-00001.parquet`). Each file's column form is detected from its first row or
//! schema and mapped (`choice_forms.rs`); every bad row is reported, by file and row, before any model runs.

use super::choice_forms::{ChoiceForm, MappedRow};
use crate::engine::data::files::{read_values, RowSink};
use crate::engine::data::{find_splits, RowProblem, RowUnit, SourceFile, SplitName};
use crate::engine::{Error, Result};
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};

/// Problems an error lists at most.
const LISTED_PROBLEMS: usize = 10;

/// One row to score, with where it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct ChoiceRow {
    pub context: String,
    pub choices: Vec<String>,
    pub gold: usize,
    /// Index into [`ChoiceRows::files`].
    pub file: usize,
    /// Its line (JSONL) or row (JSON array, parquet), 1-based.
    pub position: usize,
}

/// The rows of a multiple-choice evaluation and how they were read.
#[derive(Debug, Clone)]
pub struct ChoiceRows {
    pub rows: Vec<ChoiceRow>,
    pub files: Vec<SourceFile>,
    pub form: ChoiceForm,
    /// "read 1172 rows of ARC columns (...) from the test split: ARC-Challenge/test-00000-of-00001.parquet".
    pub note: String,
}

/// Read the rows of `path` (a file, or a folder's `split`), the first `limit` of them when given. Refuses a
/// file of no known form, a folder without that split or with several configurations of a dataset in it,
/// and any bad row (all of them listed, by file and position).
pub fn read_choice_rows(path: &Path, split: SplitName, limit: Option<usize>) -> Result<ChoiceRows> {
    let (files, split_note) = split_files(path, split)?;
    let mut rows = Vec::new();
    let mut problems = Vec::new();
    let mut sources = Vec::new();
    let mut form = None;
    for (index, file) in files.iter().enumerate() {
        let remaining = limit.map(|l| l.saturating_sub(rows.len() + problems.len()));
        if remaining == Some(0) {
            break;
        }
        let sink = read_values(file, |unit| ChoiceSink::new(file, unit, index, remaining))?;
        let file_form = sink.finish()?;
        if let (Some(first), Some(this)) = (form, file_form.form) {
            if first != this {
                return Err(Error::Data(format!(
                    "{}: {} but {} has {}; a split's files must share one form",
                    file.display(),
                    this.describe(),
                    files[0].display(),
                    ChoiceForm::describe(first)
                )));
            }
        }
        form = form.or(file_form.form);
        rows.extend(file_form.rows);
        problems.extend(file_form.problems);
        sources.push(SourceFile { path: file.clone(), unit: file_form.unit });
    }
    if !problems.is_empty() {
        return Err(problems_error(&problems));
    }
    let Some(form) = form.filter(|_| !rows.is_empty()) else {
        return Err(Error::Data(format!("{}: no multiple-choice rows to score", files[0].display())));
    };
    let note = format!("read {} rows of {} from {split_note}", rows.len(), form.describe());
    Ok(ChoiceRows { rows, files: sources, form, note })
}

/// The files to read: `path` itself, or the files of `split` in a folder (from one configuration only).
fn split_files(path: &Path, split: SplitName) -> Result<(Vec<PathBuf>, String)> {
    let layout = find_splits(path)?;
    if !path.is_dir() {
        return Ok((vec![path.to_path_buf()], path.display().to_string()));
    }
    let files = match layout.files_of(split) {
        Some(files) => files.to_vec(),
        None => {
            let have: Vec<&str> = layout.splits.iter().map(|s| s.split.as_str()).collect();
            return Err(Error::MissingFile {
                path: path.to_path_buf(),
                what: format!(
                    "a {split} split for the multiple-choice rows; this folder has {}: pick one with --split",
                    if have.is_empty() { "no data files".to_string() } else { have.join(", ") }
                ),
            });
        }
    };
    let relative = |p: &PathBuf| p.strip_prefix(path).map(Path::to_path_buf).unwrap_or_else(|_| p.clone());
    let mut configs: Vec<PathBuf> = files.iter().filter_map(|f| relative(f).parent().map(Path::to_path_buf)).collect();
    configs.dedup();
    if configs.len() > 1 {
        let listed: Vec<String> = configs.iter().take(8).map(|c| c.display().to_string()).collect();
        return Err(Error::Data(format!(
            "{}: the {split} split has files in {} folders ({}{}): each is a configuration of the dataset; point \
             --data at one of them, e.g. {}",
            path.display(),
            configs.len(),
            listed.join(", "),
            if configs.len() > 8 { ", ..." } else { "" },
            path.join(&configs[0]).display()
        )));
    }
    let names: Vec<String> = files.iter().map(|f| relative(f).display().to_string()).collect();
    Ok((files, format!("the {split} split of {}: {}", path.display(), names.join(", "))))
}

/// "3 invalid multiple-choice rows:\n  f.jsonl:2: gold 4 is out of range ...".
fn problems_error(problems: &[RowProblem]) -> Error {
    if let [one] = problems {
        return crate::engine::data::splits::problem_error(one);
    }
    let mut message = format!("{} invalid multiple-choice rows:", problems.len());
    for p in problems.iter().take(LISTED_PROBLEMS) {
        message.push_str(&format!("\n  {p}"));
    }
    if problems.len() > LISTED_PROBLEMS {
        message.push_str(&format!("\n  ... and {} more", problems.len() - LISTED_PROBLEMS));
    }
    message.push_str("\nfix these rows before evaluating");
    Error::Data(message)
}

/// What one file gave.
struct FileRows {
    unit: RowUnit,
    form: Option<ChoiceForm>,
    rows: Vec<ChoiceRow>,
    problems: Vec<RowProblem>,
}

/// Collects one file's rows as the dataset readers feed them.
struct ChoiceSink {
    path: PathBuf,
    index: usize,
    limit: Option<usize>,
    seen: usize,
    form: Option<ChoiceForm>,
    /// The file is of no known form: why, at which position.
    refusal: Option<Error>,
    out: FileRows,
}

impl ChoiceSink {
    fn new(path: &Path, unit: RowUnit, index: usize, limit: Option<usize>) -> Self {
        Self {
            path: path.to_path_buf(),
            index,
            limit,
            seen: 0,
            form: None,
            refusal: None,
            out: FileRows { unit, form: None, rows: Vec::new(), problems: Vec::new() },
        }
    }

    fn problem(&mut self, position: usize, message: String) {
        let unit = self.out.unit;
        self.out.problems.push(RowProblem { path: self.path.clone(), line: position, message, unit });
    }

    fn no_form(&self, position: usize, obj: &Map<String, Value>) -> Error {
        Error::Data(format!("{}: {}", self.out.unit.locate(&self.path, position), ChoiceForm::no_form_message(obj)))
    }

    fn finish(mut self) -> Result<FileRows> {
        if let Some(refusal) = self.refusal {
            return Err(refusal);
        }
        self.out.form = self.form;
        Ok(self.out)
    }
}

impl RowSink for ChoiceSink {
    fn set_columns(&mut self, columns: Vec<String>) -> Result<()> {
        self.form = ChoiceForm::detect(columns.iter().map(String::as_str));
        if self.form.is_none() {
            let obj: Map<String, Value> = columns.into_iter().map(|c| (c, Value::Null)).collect();
            return Err(Error::Data(format!("{}: {}", self.path.display(), ChoiceForm::no_form_message(&obj))));
        }
        Ok(())
    }

    fn blank_line(&mut self) {}

    fn push(&mut self, position: usize, value: std::result::Result<Value, String>) {
        if self.refusal.is_some() || self.limit.is_some_and(|l| self.seen >= l) {
            return;
        }
        self.seen += 1;
        let obj = match value {
            Ok(Value::Object(obj)) => obj,
            Ok(other) => {
                return self.problem(
                    position,
                    format!("expected a JSON object, found {}", crate::engine::data::rows::kind(&other)),
                )
            }
            Err(message) => return self.problem(position, message),
        };
        let form = match self.form {
            Some(form) => form,
            None => match ChoiceForm::detect(obj.keys().map(String::as_str)) {
                Some(form) => *self.form.insert(form),
                None => {
                    self.refusal = Some(self.no_form(position, &obj));
                    return;
                }
            },
        };
        match form.map(&obj) {
            Ok(MappedRow { context, choices, gold }) => {
                self.out.rows.push(ChoiceRow { context, choices, gold, file: self.index, position })
            }
            Err(message) => self.problem(position, message),
        }
    }

    fn is_row(&self, obj: &Map<String, Value>) -> bool {
        ChoiceForm::detect(obj.keys().map(String::as_str)).is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, text).unwrap();
        path
    }

    const ROW: &str = r#"{"context": "Sky is", "choices": ["blue", "green"], "gold": 0}"#;

    #[test]
    fn jsonl_json_and_limits() {
        let dir = tempfile::tempdir().unwrap();
        let jsonl = write(dir.path(), "mc.jsonl", &format!("{ROW}\n\n{ROW}\n{ROW}\n"));
        let read = read_choice_rows(&jsonl, SplitName::Test, Some(2)).unwrap();
        assert_eq!((read.rows.len(), read.rows[1].position, read.form), (2, 3, ChoiceForm::Plain));
        let json = write(dir.path(), "one.json", ROW);
        assert_eq!(read_choice_rows(&json, SplitName::Test, None).unwrap().rows.len(), 1);
        let wrapped = write(dir.path(), "wrapped.json", &format!("{{\"data\": [{ROW}, {ROW}]}}"));
        assert_eq!(read_choice_rows(&wrapped, SplitName::Test, None).unwrap().rows.len(), 2);
    }

    #[test]
    fn every_bad_row_is_listed_by_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        let text = format!(
            "{ROW}\n{}\n{}\n{}\n",
            r#"{"context": "a", "choices": ["x"], "gold": 3}"#,
            r#"{"context": "a", "choices": ["x", ""], "gold": 0}"#,
            r#"{"context": "a", "gold": 0}"#
        );
        let path = write(dir.path(), "bad.jsonl", &text);
        let err = read_choice_rows(&path, SplitName::Test, None).unwrap_err().to_string();
        assert!(err.starts_with("3 invalid multiple-choice rows:"), "{err}");
        assert!(err.contains("bad.jsonl:2: gold 3 is out of range"), "{err}");
        assert!(err.contains("bad.jsonl:3: choice 1 is empty"), "{err}");
        assert!(err.contains("bad.jsonl:4: missing column `choices`"), "{err}");
        let path = write(dir.path(), "other.jsonl", "{\"text\": \"hi\"}\n");
        let err = read_choice_rows(&path, SplitName::Test, None).unwrap_err().to_string();
        assert!(err.contains("other.jsonl:1: not a multiple-choice row: found keys `text`"), "{err}");
    }

    #[test]
    fn folders_take_the_split_and_refuse_several_configurations() {
        let dir = tempfile::tempdir().unwrap();
        let arc = r#"{"question": "q", "choices": {"text": ["a", "b"], "label": ["A", "B"]}, "answerKey": "B"}"#;
        write(dir.path(), "ARC-Easy/test-00000-of-00001.jsonl", arc);
        write(dir.path(), "ARC-Easy/validation-00000-of-00001.jsonl", &format!("{arc}\n{arc}\n"));
        let read = read_choice_rows(&dir.path().join("ARC-Easy"), SplitName::Valid, None).unwrap();
        assert_eq!((read.rows.len(), read.form, read.rows[0].gold), (2, ChoiceForm::Arc, 1));
        assert!(read.note.contains("the valid split of") && read.note.contains("validation-00000-of-00001.jsonl"));
        let err = read_choice_rows(&dir.path().join("ARC-Easy"), SplitName::Train, None).unwrap_err().to_string();
        assert!(err.contains("has valid, test: pick one with --split"), "{err}");
        write(dir.path(), "ARC-Challenge/test-00000-of-00001.jsonl", arc);
        let err = read_choice_rows(dir.path(), SplitName::Test, None).unwrap_err().to_string();
        assert!(err.contains("files in 2 folders (ARC-Challenge, ARC-Easy)"), "{err}");
    }
}
