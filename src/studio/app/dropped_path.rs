//! Paths dropped on the studio's window or found at start: which are models and which are datasets.

use std::path::{Path, PathBuf};

/// What a dropped path is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dropped {
    Model,
    Dataset,
}

/// Whether a path dropped on the window is a model (a folder with config.json, a .gguf, a config.json) or a
/// dataset (a folder with train.jsonl, a .jsonl); None for anything else.
pub fn classify_drop(path: &Path) -> Option<Dropped> {
    if path.is_dir() {
        if path.join("config.json").is_file() {
            return Some(Dropped::Model);
        }
        if path.join("train.jsonl").is_file() {
            return Some(Dropped::Dataset);
        }
        return None;
    }
    match path.extension().and_then(|e| e.to_str()).map(|e| e.to_ascii_lowercase()).as_deref() {
        Some("gguf") => Some(Dropped::Model),
        Some("jsonl") => Some(Dropped::Dataset),
        _ if path.file_name().is_some_and(|n| n == "config.json") => Some(Dropped::Model),
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
