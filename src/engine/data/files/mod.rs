//! Dataset files of each type read into [`ParsedFile`]s through the one [`RowCollector`]: JSON Lines
//! ([`jsonl`]), JSON ([`json`]: an array of rows, an object holding one list of rows, or JSON Lines saved as
//! `.json`) and parquet ([`parquet_rows`], streamed row group by row group). The type comes from the
//! extension; a file with any other extension is read as JSON Lines, as before the other types existed.

pub mod json;
pub mod jsonl;
pub mod parquet_rows;

use super::columns::ReadOptions;
use super::detect::{ParsedFile, RowCollector};
use super::formats::RowUnit;
use crate::engine::{Error, Result};
use serde_json::{Map, Value};
use std::path::Path;

/// The largest dataset file read (4 GiB): far beyond what fits a LoRA run, small enough to refuse a wrong
/// path before it exhausts memory.
pub const MAX_DATASET_BYTES: u64 = 4 << 30;

/// A dataset file's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    Jsonl,
    Json,
    Parquet,
}

impl FileKind {
    /// The type an extension names (case-insensitive); `None` for files that are not dataset files.
    pub fn of(path: &Path) -> Option<Self> {
        let ext = path.extension()?.to_str()?.to_ascii_lowercase();
        match ext.as_str() {
            "jsonl" | "ndjson" => Some(Self::Jsonl),
            "json" => Some(Self::Json),
            "parquet" => Some(Self::Parquet),
            _ => None,
        }
    }
}

/// Read and validate one dataset file. Only I/O, a file that is not a regular one or is over
/// [`MAX_DATASET_BYTES`], invalid UTF-8 or JSON that cannot hold rows (named by line), an unreadable parquet
/// file and a column mapping naming a column the file lacks fail here; bad rows become row problems.
pub fn read_file(path: &Path, read: &ReadOptions) -> Result<ParsedFile> {
    read_values(path, |unit| RowCollector::new(path, unit, read))?.finish()
}

/// Where a file's rows go as they are read, one JSON value at a time: the [`RowCollector`] of training
/// datasets, or another reader's own (the multiple-choice rows of `eval/choice_rows.rs`), so every kind of row
/// is read from JSONL, JSON and parquet files by the same code.
pub trait RowSink {
    /// The file's columns from its schema (parquet), before any row.
    fn set_columns(&mut self, columns: Vec<String>) -> Result<()>;
    /// A blank JSONL line.
    fn blank_line(&mut self);
    /// One row at `position` (1-based): a parsed JSON value, or why it could not be parsed.
    fn push(&mut self, position: usize, value: std::result::Result<Value, String>);
    /// Whether a `.json` file holding one object is that one row (rather than an object holding a list of rows).
    fn is_row(&self, obj: &Map<String, Value>) -> bool;
}

impl RowSink for RowCollector {
    fn set_columns(&mut self, columns: Vec<String>) -> Result<()> {
        RowCollector::set_columns(self, columns)
    }

    fn blank_line(&mut self) {
        RowCollector::blank_line(self)
    }

    fn push(&mut self, position: usize, value: std::result::Result<Value, String>) {
        RowCollector::push(self, position, value)
    }

    fn is_row(&self, obj: &Map<String, Value>) -> bool {
        RowCollector::is_row(self, obj)
    }
}

/// Read the rows of any dataset file (the type from its extension, JSON Lines otherwise) into the sink `make`
/// builds for the file's positions (lines or rows); the same refusals as [`read_file`].
pub fn read_values<S: RowSink>(path: &Path, make: impl FnOnce(RowUnit) -> S) -> Result<S> {
    match FileKind::of(path).unwrap_or(FileKind::Jsonl) {
        FileKind::Jsonl => jsonl::stream_jsonl(path, make(RowUnit::Line)),
        FileKind::Json => json::json_values(path, &utf8_text(path, read_bounded(path, MAX_DATASET_BYTES)?)?, make),
        FileKind::Parquet => parquet_rows::parquet_values(path, make(RowUnit::Row)),
    }
}

/// A regular file of at most `limit` bytes, opened. Devices, pipes and larger files are refused before
/// reading (`/dev/zero` would otherwise fill memory).
pub(crate) fn open_bounded(path: &Path, limit: u64) -> Result<std::fs::File> {
    let file = crate::engine::input_file::open_regular(path, u64::MAX)?;
    if file.metadata().map_err(|e| Error::io(path, e))?.len() > limit {
        return Err(too_big(path, limit));
    }
    Ok(file)
}

/// [`open_bounded`], read whole; the size is checked again while reading.
pub(crate) fn read_bounded(path: &Path, limit: u64) -> Result<Vec<u8>> {
    crate::engine::input_file::read_opened(open_bounded(path, limit)?, path, limit)
}

fn refuse(path: &Path, what: &str) -> Error {
    Error::Data(format!("{}: {what}", path.display()))
}

fn too_big(path: &Path, limit: u64) -> Error {
    refuse(path, &format!("larger than the {} GiB a dataset file may be", limit >> 30))
}

/// serde's message without its "at line 1 column N" tail, with the column first.
pub(crate) fn json_error_message(e: &serde_json::Error) -> String {
    let full = e.to_string();
    let message = match full.rfind(" at line ") {
        Some(pos) => &full[..pos],
        None => full.as_str(),
    };
    format!("invalid JSON at column {}: {message}", e.column())
}

/// Text from bytes, or an error naming the line of the first invalid byte.
pub(crate) fn utf8_text(path: &Path, bytes: Vec<u8>) -> Result<String> {
    String::from_utf8(bytes).map_err(|e| {
        let valid = e.utf8_error().valid_up_to();
        let line = 1 + e.as_bytes()[..valid].iter().filter(|b| **b == b'\n').count();
        Error::Dataset {
            path: path.to_path_buf(),
            line,
            message: format!("invalid UTF-8 at byte {valid}; save the file as UTF-8"),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_come_from_the_extension() {
        assert_eq!(FileKind::of(Path::new("a/train.JSONL")), Some(FileKind::Jsonl));
        assert_eq!(FileKind::of(Path::new("x.json")), Some(FileKind::Json));
        assert_eq!(FileKind::of(Path::new("data/train-00000-of-00001.parquet")), Some(FileKind::Parquet));
        assert_eq!(FileKind::of(Path::new("README.md")), None);
    }

    #[test]
    fn devices_are_refused_before_reading() {
        let err = read_file(Path::new("/dev/zero"), &ReadOptions::default()).unwrap_err().to_string();
        assert!(err.contains("not a regular file"), "{err}");
    }
}
