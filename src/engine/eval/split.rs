//! The rows an evaluation reads: one split of a dataset, found and validated as training finds and validates it
//! (the same layout rules, row formats and checks), so `--split valid` is the very rows a run validated on.
//!
//! - `test` of a folder: its test files. A single file is its own test split (all of its rows).
//! - `train` and `valid`: the dataset loaded as training loads it ([`load_raw_dataset`] with the spec's
//!   `valid_fraction` and `seed`): without a validation file the `valid` rows are held out of `train` by them.
//!
//! A split the dataset does not have is an error naming the files that were found.

use super::EvalSpec;
use crate::engine::data::{self, dataset_layout, load_raw_dataset, read_split, DatasetLayout, RawSplit, SplitName};
use crate::engine::{Error, Result};

/// The rows of `spec.split`, at most `spec.limit` of them, and notes on how they were read.
pub fn read_rows(spec: &EvalSpec) -> Result<(RawSplit, Vec<String>)> {
    let layout = dataset_layout(&spec.data)?;
    let (mut split, notes) = if spec.split == SplitName::Test && spec.data.is_file() {
        whole_file(spec)?
    } else if spec.split == SplitName::Test {
        let files = layout.files_of(SplitName::Test).ok_or_else(|| missing(spec, &layout))?;
        (read_checked(SplitName::Test, files, spec)?, Vec::new())
    } else {
        if layout.files_of(SplitName::Train).is_none() && layout.files_of(spec.split).is_none() {
            return Err(missing(spec, &layout));
        }
        let raw = load_raw_dataset(&spec.data, &spec.data_options())?;
        let split = match spec.split {
            SplitName::Train => Some(raw.train),
            _ => raw.valid,
        };
        let split = split.ok_or_else(|| {
            Error::Data(format!(
                "{}: there are no validation rows to evaluate: no validation file, and {}; name another --split, \
                 or set the valid fraction the run used",
                spec.data.display(),
                raw.notes.iter().find(|n| n.starts_with("no validation")).map_or("none were held out", |n| n.as_str())
            ))
        })?;
        (split, raw.notes)
    };
    if let Some(limit) = spec.limit {
        split.rows.truncate(limit);
    }
    Ok((split, notes))
}

/// A single file read whole as the test split (nothing held out).
fn whole_file(spec: &EvalSpec) -> Result<(RawSplit, Vec<String>)> {
    let options = data::DataOptions { valid_fraction: 0.0, ..spec.data_options() };
    let raw = load_raw_dataset(&spec.data, &options)?;
    let mut split = raw.train;
    split.name = SplitName::Test;
    let notes = raw.notes.into_iter().filter(|n| !n.starts_with("no validation split")).collect();
    Ok((split, notes))
}

/// Read one split's files, refusing bad rows (by file and line) and an empty split, as training does.
fn read_checked(name: SplitName, files: &[std::path::PathBuf], spec: &EvalSpec) -> Result<RawSplit> {
    let read = read_split(name, files, &spec.read)?;
    if let Some(refusal) = read.refusal() {
        return Err(refusal);
    }
    if let Some(problem) = read.problems().next() {
        let count = read.problems().count();
        let mut problem = problem.clone();
        if count > 1 {
            problem.message = format!("{} (and {} more bad rows in the {name} split)", problem.message, count - 1);
        }
        return Err(data::splits::problem_error(&problem));
    }
    let split = read.into_raw();
    if split.rows.is_empty() {
        return Err(Error::Data(format!("{}: the {name} split has no rows", split.path.display())));
    }
    Ok(split)
}

/// "the dataset has no test split; found: train: a/train.jsonl; valid: a/valid.jsonl".
fn missing(spec: &EvalSpec, layout: &DatasetLayout) -> Error {
    let found: Vec<String> = layout
        .splits
        .iter()
        .map(|s| {
            let files: Vec<String> = s.files.iter().map(|f| f.display().to_string()).collect();
            format!("{}: {}", s.split, files.join(", "))
        })
        .collect();
    let found = if found.is_empty() { "no data files".to_string() } else { found.join("; ") };
    Error::Data(format!(
        "{}: the dataset has no {} split (found {found}); name a split it has with --split, or point --data at the \
         file to evaluate",
        spec.data.display(),
        spec.split
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn spec(data: &Path, split: SplitName) -> EvalSpec {
        EvalSpec { data: data.to_path_buf(), split, ..Default::default() }
    }

    fn write(dir: &Path, name: &str, rows: usize) {
        let text: String = (0..rows).map(|i| format!("{{\"prompt\": \"q{i}\", \"completion\": \"a{i}\"}}\n")).collect();
        std::fs::write(dir.join(name), text).unwrap();
    }

    #[test]
    fn a_missing_split_names_the_files_found() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "train.jsonl", 4);
        let err = read_rows(&spec(dir.path(), SplitName::Test)).unwrap_err().to_string();
        assert!(err.contains("no test split") && err.contains("train.jsonl"), "{err}");
    }

    #[test]
    fn the_valid_split_is_the_rows_training_held_out_and_a_file_is_its_own_test_split() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "train.jsonl", 20);
        let s = EvalSpec { valid_fraction: 0.25, seed: 7, ..spec(dir.path(), SplitName::Valid) };
        let (valid, _) = read_rows(&s).unwrap();
        let raw = load_raw_dataset(dir.path(), &s.data_options()).unwrap();
        assert_eq!(valid.rows, raw.valid.unwrap().rows);
        assert_eq!(valid.rows.len(), 5);
        let (train, _) = read_rows(&EvalSpec { split: SplitName::Train, ..s.clone() }).unwrap();
        assert_eq!(train.rows.len(), 15);
        let (whole, _) =
            read_rows(&EvalSpec { limit: Some(3), ..spec(&dir.path().join("train.jsonl"), SplitName::Test) }).unwrap();
        assert_eq!(whole.rows.iter().map(|r| r.line).collect::<Vec<_>>(), vec![1, 2, 3]);
    }

    #[test]
    fn a_bad_test_row_is_refused_by_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "train.jsonl", 2);
        std::fs::write(dir.path().join("test.jsonl"), "{\"prompt\": \"q\", \"completion\": \"a\"}\n{\"prompt\": 3}\n")
            .unwrap();
        let err = read_rows(&spec(dir.path(), SplitName::Test)).unwrap_err().to_string();
        assert!(err.contains("test.jsonl") && err.contains('2'), "{err}");
    }
}
