//! Which files of a dataset folder hold which split, by the conventions of Hugging Face dataset repos (the
//! `datasets` library's data-file patterns) and of mlx-lm:
//!
//! - Hub shards, `data/{split}-00000-of-00002.parquet` (what `push_to_hub` writes): when a folder has any, only
//!   they count, as in `datasets`.
//! - Otherwise a file whose name has a split keyword as a word (`train.jsonl`, `train.parquet`,
//!   `data/valid.json`, `my_test_set.jsonl`), else one inside a folder so named (`train/0000.parquet`).
//! - Keywords, as `datasets` has them: train: `train`, `training`; validation: `validation`, `valid`, `val`,
//!   `dev`; test: `test`, `testing`, `eval`, `evaluation`.
//! - Data files are `.jsonl`, `.ndjson`, `.json` and `.parquet`; README.md, dataset_info.json, hidden folders
//!   (`.cache`, `.git`) and everything else are ignored. A folder whose data files name no split is one train
//!   split of all of them (a single file, usually).
//!
//! The files of a split are taken in name order and read one after another (shards concatenated).

use super::files::FileKind;
use super::SplitName;
use crate::engine::{Error, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// How deep below the dataset folder data files are looked for (`default/train/0000.parquet` is 3).
pub const MAX_DEPTH: usize = 4;

/// Data files looked at in one folder at most (a wrong folder such as `/` is refused, not walked).
pub const MAX_FILES: usize = 10_000;

/// The files of one split, in the order they are read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SplitFiles {
    pub split: SplitName,
    pub files: Vec<PathBuf>,
}

/// A dataset's splits (train first, then valid, then test) and the data files no split took.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DatasetLayout {
    pub splits: Vec<SplitFiles>,
    pub ignored: Vec<PathBuf>,
}

impl DatasetLayout {
    pub fn files_of(&self, split: SplitName) -> Option<&[PathBuf]> {
        self.splits.iter().find(|s| s.split == split).map(|s| s.files.as_slice())
    }
}

const KEYWORDS: [(SplitName, &[&str]); 3] = [
    (SplitName::Train, &["train", "training"]),
    (SplitName::Valid, &["validation", "valid", "val", "dev"]),
    (SplitName::Test, &["test", "testing", "eval", "evaluation"]),
];

/// Metadata files with a data file's extension.
const NOT_DATA: [&str; 4] = ["dataset_info.json", "dataset_infos.json", "dataset_dict.json", "state.json"];

/// The splits of a dataset path: a file is the train split; a folder is laid out as the module docs say.
pub fn dataset_layout(path: &Path) -> Result<DatasetLayout> {
    let layout = find_splits(path)?;
    let has_train = layout.splits.first().is_some_and(|first| first.split == SplitName::Train);
    if let Some(folder) =
        ["train.jsonl", "train.json", "train.parquet"].map(|n| path.join(n)).into_iter().find(|p| p.is_dir())
    {
        if !has_train {
            return Err(Error::Unreadable {
                path: folder,
                message: "is a folder, not a file: the train split is a .jsonl, .json or .parquet file (or \
                          data/train-00000-of-00001.parquet)"
                    .into(),
            });
        }
    }
    match layout.splits.first() {
        Some(first) if first.split == SplitName::Train => Ok(layout),
        Some(_) => Err(Error::MissingFile {
            path: path.join("train.jsonl"),
            what: format!(
                "{} has {} but no train split: name a file train.jsonl / train.parquet (or data/train-00000-of-00001.parquet)",
                path.display(),
                layout.splits.iter().map(|s| s.split.as_str()).collect::<Vec<_>>().join(" and ")
            ),
        }),
        None => Err(Error::MissingFile {
            path: path.join("train.jsonl"),
            what: "a dataset folder needs a train split: train.jsonl (valid.jsonl and test.jsonl are optional), \
                   train.json, train.parquet or data/train-00000-of-00001.parquet"
                .into(),
        }),
    }
}

/// The splits of a dataset path as [`dataset_layout`] finds them, without requiring a train split (an
/// evaluation reads a test or validation split alone).
pub fn find_splits(path: &Path) -> Result<DatasetLayout> {
    if std::fs::symlink_metadata(path).is_ok() {
        // There, but perhaps a looping or dangling link: say which.
        std::fs::metadata(path).map_err(|e| crate::engine::input_file::describe_io(path, e))?;
    } else {
        return Err(Error::MissingFile {
            path: path.to_path_buf(),
            what: "expected a .jsonl, .json or .parquet file, or a folder of them (train.jsonl, \
                   data/train-00000-of-00001.parquet, ...)"
                .into(),
        });
    }
    if !path.is_dir() {
        return Ok(DatasetLayout {
            splits: vec![SplitFiles { split: SplitName::Train, files: vec![path.to_path_buf()] }],
            ignored: Vec::new(),
        });
    }
    let mut found = Vec::new();
    walk(path, 0, &mut found)?;
    found.sort();
    let relative = |p: &PathBuf| p.strip_prefix(path).map(Path::to_path_buf).unwrap_or_else(|_| p.clone());

    let shards: Vec<(SplitName, PathBuf)> =
        found.iter().filter_map(|p| hub_shard_split(&relative(p)).map(|s| (s, p.clone()))).collect();
    let named: Vec<(SplitName, PathBuf)> = if shards.is_empty() {
        found.iter().filter_map(|p| keyword_split(&relative(p)).map(|s| (s, p.clone()))).collect()
    } else {
        shards
    };
    let mut layout = DatasetLayout::default();
    if named.is_empty() {
        if !found.is_empty() {
            layout.splits.push(SplitFiles { split: SplitName::Train, files: found });
        }
    } else {
        for split in [SplitName::Train, SplitName::Valid, SplitName::Test] {
            let files: Vec<PathBuf> = named.iter().filter(|(s, _)| *s == split).map(|(_, p)| p.clone()).collect();
            if !files.is_empty() {
                layout.splits.push(SplitFiles { split, files });
            }
        }
        layout.ignored = found.into_iter().filter(|p| !named.iter().any(|(_, n)| n == p)).collect();
    }
    Ok(layout)
}

fn walk(dir: &Path, depth: usize, found: &mut Vec<PathBuf>) -> Result<()> {
    let entries = std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| Error::io(dir, e))?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with('.') {
            continue;
        }
        let path = entry.path();
        // `metadata` follows symlinks: a Hub snapshot's files are links into its blobs folder.
        let meta = match std::fs::metadata(&path) {
            Ok(meta) => meta,
            // A data file's name on a looping or dangling link: say so rather than leave the split out.
            Err(e) if FileKind::of(&path).is_some() => return Err(crate::engine::input_file::describe_io(&path, e)),
            Err(_) => continue,
        };
        if meta.is_dir() {
            if depth + 1 < MAX_DEPTH {
                walk(&path, depth + 1, found)?;
            }
        } else if FileKind::of(&path).is_some() && !NOT_DATA.contains(&name.as_ref()) {
            if found.len() >= MAX_FILES {
                return Err(Error::Data(format!(
                    "{}: more than {MAX_FILES} data files below this folder; point at the dataset's own folder",
                    dir.display()
                )));
            }
            found.push(path);
        }
    }
    Ok(())
}

/// The words of a name: split at `-`, `_`, `.` and spaces, lowercased.
fn words(name: &str) -> impl Iterator<Item = String> + '_ {
    name.split(['-', '_', '.', ' ']).filter(|w| !w.is_empty()).map(str::to_ascii_lowercase)
}

fn split_of_word(word: &str) -> Option<SplitName> {
    KEYWORDS.iter().find(|(_, keys)| keys.contains(&word)).map(|(s, _)| *s)
}

/// `data/{split}-NNNNN-of-NNNNN*.*`, the Hub's default layout.
fn hub_shard_split(relative: &Path) -> Option<SplitName> {
    let mut parts = relative.iter();
    let (dir, file) = (parts.next()?.to_str()?, parts.next()?.to_str()?);
    if dir != "data" || parts.next().is_some() {
        return None;
    }
    let (split, rest) = file.split_once('-')?;
    let digits = |s: &str| s.len() == 5 && s.bytes().all(|b| b.is_ascii_digit());
    let mut pieces = rest.splitn(3, '-');
    let (a, of, b) = (pieces.next()?, pieces.next()?, pieces.next()?);
    let b = b.split(['.', '-', '_']).next()?;
    (digits(a) && of == "of" && digits(b)).then_some(())?;
    split_of_word(&split.to_ascii_lowercase())
}

/// A split keyword among the file name's words (extension aside), else among its folders' names, nearest
/// first.
fn keyword_split(relative: &Path) -> Option<SplitName> {
    let stem = relative.file_stem()?.to_str()?;
    if let Some(split) = words(stem).find_map(|w| split_of_word(&w)) {
        return Some(split);
    }
    let folders: Vec<&str> = relative.parent()?.iter().filter_map(|c| c.to_str()).collect();
    folders.iter().rev().find_map(|dir| words(dir).find_map(|w| split_of_word(&w)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn folder(files: &[&str]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for f in files {
            let p = dir.path().join(f);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, "").unwrap();
        }
        dir
    }

    fn names(dir: &Path, layout: &DatasetLayout) -> Vec<(String, Vec<String>)> {
        let rel = |p: &PathBuf| p.strip_prefix(dir).unwrap().display().to_string();
        layout.splits.iter().map(|s| (s.split.to_string(), s.files.iter().map(rel).collect())).collect()
    }

    fn pairs(list: &[(&str, &[&str])]) -> Vec<(String, Vec<String>)> {
        list.iter().map(|(s, f)| (s.to_string(), f.iter().map(|x| x.to_string()).collect())).collect()
    }

    #[test]
    fn hub_shards_win_and_concatenate_in_name_order() {
        let d = folder(&[
            "README.md",
            "data/train-00001-of-00002.parquet",
            "data/train-00000-of-00002.parquet",
            "data/test-00000-of-00001.parquet",
            "train.jsonl",
            ".cache/huggingface/download/data/train-00000-of-00002.parquet.metadata",
        ]);
        let layout = dataset_layout(d.path()).unwrap();
        assert_eq!(
            names(d.path(), &layout),
            pairs(&[
                ("train", &["data/train-00000-of-00002.parquet", "data/train-00001-of-00002.parquet"]),
                ("test", &["data/test-00000-of-00001.parquet"]),
            ])
        );
        assert_eq!(layout.ignored, vec![d.path().join("train.jsonl")]);
    }

    #[test]
    fn split_names_in_files_and_folders() {
        let d = folder(&["train.parquet", "validation.json", "data/test.jsonl", "dataset_info.json"]);
        let layout = dataset_layout(d.path()).unwrap();
        assert_eq!(
            names(d.path(), &layout),
            pairs(&[("train", &["train.parquet"]), ("valid", &["validation.json"]), ("test", &["data/test.jsonl"])])
        );
        let d = folder(&["train/0000.parquet", "train/0001.parquet", "dev/0000.parquet", "notes.txt"]);
        let layout = dataset_layout(d.path()).unwrap();
        assert_eq!(
            names(d.path(), &layout),
            pairs(&[("train", &["train/0000.parquet", "train/0001.parquet"]), ("valid", &["dev/0000.parquet"])])
        );
        let d = folder(&["train.jsonl", "valid.jsonl", "test.jsonl"]);
        let splits: Vec<SplitName> = dataset_layout(d.path()).unwrap().splits.iter().map(|s| s.split).collect();
        assert_eq!(splits, [SplitName::Train, SplitName::Valid, SplitName::Test]);
    }

    #[test]
    fn unnamed_files_are_the_train_split_and_a_missing_train_is_refused() {
        let d = folder(&["alpaca_data.json", "README.md"]);
        assert_eq!(names(d.path(), &dataset_layout(d.path()).unwrap()), pairs(&[("train", &["alpaca_data.json"])]));
        let d = folder(&["test.jsonl"]);
        let err = dataset_layout(d.path()).unwrap_err().to_string();
        assert!(err.contains("has test but no train split"), "{err}");
        let d = folder(&["README.md"]);
        let err = dataset_layout(d.path()).unwrap_err().to_string();
        assert!(err.contains("train.jsonl") && err.contains("train.parquet"), "{err}");
    }

    #[test]
    fn shard_and_keyword_patterns() {
        assert_eq!(hub_shard_split(Path::new("data/validation-00000-of-00001.parquet")), Some(SplitName::Valid));
        assert_eq!(hub_shard_split(Path::new("data/train-00000-of-00001-abc.parquet")), Some(SplitName::Train));
        assert_eq!(hub_shard_split(Path::new("train-00000-of-00001.parquet")), None);
        assert_eq!(keyword_split(Path::new("my_eval_set.jsonl")), Some(SplitName::Test));
        assert_eq!(keyword_split(Path::new("trainer.jsonl")), None, "a keyword is a whole word");
    }
}
