//! One split read from its files ([`read_split`]): each file parsed on its own, then the split's format
//! settled (all files must share one) and its rows put together in file order ([`RawSplit`]). Training
//! ([`super::load_raw_dataset`]) and the dataset report read splits through here, so they agree on what a
//! split holds and when it is refused.

use super::columns::ReadOptions;
use super::detect::{Detection, ParsedFile};
use super::files::read_file;
use super::formats::{DatasetFormat, RowProblem, RowUnit, SourcedRow};
use super::SplitName;
use crate::engine::{Error, Result};
use std::path::{Path, PathBuf};

/// A file rows came from, and how its positions count.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SourceFile {
    pub path: PathBuf,
    pub unit: RowUnit,
}

impl SourceFile {
    /// "data.jsonl:17" or "data.parquet: row 17".
    pub fn locate(&self, position: usize) -> String {
        self.unit.locate(&self.path, position)
    }
}

/// The files of one split, each read.
#[derive(Debug, Clone)]
pub struct ReadSplit {
    pub split: SplitName,
    pub files: Vec<ParsedFile>,
    /// The split's format: its files' (when they agree), or why there is none.
    pub detection: Detection,
}

/// Read every file of a split (in the order given) with the same reading options.
pub fn read_split(split: SplitName, files: &[PathBuf], read: &ReadOptions) -> Result<ReadSplit> {
    let files = files.iter().map(|f| read_file(f, read)).collect::<Result<Vec<_>>>()?;
    let detection = split_detection(&files);
    Ok(ReadSplit { split, files, detection })
}

/// An ambiguous file decides for the split; otherwise the files with rows must agree on one format.
fn split_detection(files: &[ParsedFile]) -> Detection {
    if let Some(ambiguous) = files.iter().find(|f| matches!(f.detection, Detection::Ambiguous { .. })) {
        return ambiguous.detection.clone();
    }
    let with_format: Vec<(&ParsedFile, DatasetFormat)> =
        files.iter().filter_map(|f| f.detection.format().map(|format| (f, format))).collect();
    match with_format.first() {
        None => files.first().map(|f| f.detection.clone()).unwrap_or(Detection::Unknown),
        Some((first, format)) if with_format.iter().all(|(_, f)| f == format) => first.detection.clone(),
        Some(_) => {
            Detection::Mixed { files: with_format.iter().map(|(f, format)| (f.path.clone(), *format)).collect() }
        }
    }
}

impl ReadSplit {
    pub fn format(&self) -> Option<DatasetFormat> {
        self.detection.format().filter(|_| self.rows() > 0)
    }

    pub fn rows(&self) -> usize {
        self.files.iter().map(|f| f.rows.len()).sum()
    }

    pub fn blank_lines(&self) -> usize {
        self.files.iter().map(|f| f.blank_lines).sum()
    }

    pub fn problems(&self) -> impl Iterator<Item = &RowProblem> {
        self.files.iter().flat_map(|f| f.problems.iter())
    }

    /// The file's columns (the first file's; shards of one split share them).
    pub fn columns(&self) -> &[String] {
        self.files.first().map(|f| f.columns.as_slice()).unwrap_or_default()
    }

    pub fn paths(&self) -> Vec<PathBuf> {
        self.files.iter().map(|f| f.path.clone()).collect()
    }

    /// What refuses the whole split: an ambiguous file, or files in different formats.
    pub fn refusal(&self) -> Option<Error> {
        if let Some(e) = self.files.iter().find_map(ParsedFile::refusal) {
            return Some(e);
        }
        let Detection::Mixed { files } = &self.detection else { return None };
        let each: Vec<String> = files.iter().map(|(p, f)| format!("{} is {f}", p.display())).collect();
        Some(Error::Data(format!(
            "the {} split's files are in different formats ({}); the files of one split must share one format: \
             convert them, or point --data at one of them",
            self.split,
            each.join(", ")
        )))
    }

    /// The split's valid rows in file order, each knowing its file.
    pub fn into_raw(self) -> RawSplit {
        let format = self.format();
        let mut raw = RawSplit {
            name: self.split,
            path: self.files.first().map(|f| f.path.clone()).unwrap_or_default(),
            files: self.files.iter().map(|f| SourceFile { path: f.path.clone(), unit: f.unit }).collect(),
            format,
            detection: self.detection,
            rows: Vec::with_capacity(self.files.iter().map(|f| f.rows.len()).sum()),
            skipped_rows: self.files.iter().map(|f| f.problems.len()).sum(),
            carved_from_train: false,
        };
        for (index, file) in self.files.into_iter().enumerate() {
            raw.rows.extend(file.rows.into_iter().map(|r| SourcedRow { file: index, ..r }));
        }
        raw
    }
}

/// The valid rows of one split, before tokenization.
#[derive(Debug, Clone)]
pub struct RawSplit {
    pub name: SplitName,
    /// The (first) file the rows came from (`train`'s for a held-out validation split).
    pub path: PathBuf,
    /// Every file the rows came from; a row's `file` indexes this.
    pub files: Vec<SourceFile>,
    pub format: Option<DatasetFormat>,
    pub detection: Detection,
    pub rows: Vec<SourcedRow>,
    /// Bad rows skipped under `skip_invalid_rows`.
    pub skipped_rows: usize,
    pub carved_from_train: bool,
}

impl RawSplit {
    /// The file a row came from.
    pub fn file_of(&self, row: &SourcedRow) -> SourceFile {
        self.files.get(row.file).cloned().unwrap_or_else(|| SourceFile { path: self.path.clone(), unit: RowUnit::Line })
    }

    /// A problem with `row`, located in its file.
    pub fn problem(&self, row: &SourcedRow, message: String) -> RowProblem {
        let file = self.file_of(row);
        RowProblem { path: file.path, line: row.line, message, unit: file.unit }
    }
}

/// The error of one problem where it happened: `path:line: message` (a structured dataset error) for JSONL,
/// `path: row N: message` for row-numbered files.
pub fn problem_error(problem: &RowProblem) -> Error {
    match problem.unit {
        RowUnit::Line => {
            Error::Dataset { path: problem.path.clone(), line: problem.line, message: problem.message.clone() }
        }
        RowUnit::Row => Error::Data(problem.to_string()),
    }
}

/// Where a split's first file is, for messages about a split as a whole.
pub fn first_path(split: &ReadSplit) -> &Path {
    split.files.first().map(|f| f.path.as_path()).unwrap_or(Path::new(""))
}
