//! Paths dropped on the studio's window or found at start: which are models and which are datasets.

use crate::engine::data::FileKind;
use std::path::{Path, PathBuf};

/// What a dropped path is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dropped {
    Model,
    Dataset,
}

/// Whether a path dropped on the window is a model (a folder with config.json, a .gguf, a config.json) or a
/// dataset (a .jsonl, .json or .parquet file, or a folder holding such files at its top or in `data/`, as
/// dataset folders and Hub dataset repos do); None for anything else.
pub fn classify_drop(path: &Path) -> Option<Dropped> {
    if path.is_dir() {
        if path.join("config.json").is_file() {
            return Some(Dropped::Model);
        }
        let holds_data = |dir: &Path| {
            std::fs::read_dir(dir)
                .is_ok_and(|entries| entries.flatten().any(|e| e.path().is_file() && FileKind::of(&e.path()).is_some()))
        };
        return (holds_data(path) || holds_data(&path.join("data"))).then_some(Dropped::Dataset);
    }
    match path.extension().and_then(|e| e.to_str()).map(|e| e.to_ascii_lowercase()).as_deref() {
        Some("gguf") => Some(Dropped::Model),
        _ if path.file_name().is_some_and(|n| n == "config.json") => Some(Dropped::Model),
        _ if FileKind::of(path).is_some() => Some(Dropped::Dataset),
        _ => None,
    }
}

/// The first `.gguf` file in `dir` by name (the sample model folder's file).
pub(super) fn first_gguf(dir: &Path) -> Option<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf")))
        .collect();
    files.sort();
    files.into_iter().next()
}
