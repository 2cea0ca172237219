//! `base_model.json` in a checkpoint: the base model the adapter was trained on, by fingerprint (see
//! `model::fingerprint`), so that applying the adapter to another base with the same shapes is caught rather
//! than silently producing nonsense. PEFT does not read the file. Adapters without one (PEFT-trained, or
//! saved by an older release) load as before.

use super::files::write_json;
use crate::engine::model::fingerprint::fingerprint_of;
use crate::engine::model::{LoadedModel, ModelConfig, ModelSource};
use crate::engine::{Error, Result};
use std::path::{Path, PathBuf};

pub const BASE_MODEL_FILE: &str = "base_model.json";

/// The version [`BaseRecord::write`] writes.
pub const BASE_RECORD_VERSION: u32 = 1;

/// Which base model an adapter was trained on.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct BaseRecord {
    pub version: u32,
    /// The base model's path at training time (for messages; the fingerprint decides).
    pub model: PathBuf,
    /// `model::fingerprint::model_fingerprint` of that base.
    pub fingerprint: String,
}

impl BaseRecord {
    pub fn new(model: &Path, fingerprint: String) -> Self {
        Self { version: BASE_RECORD_VERSION, model: model.to_path_buf(), fingerprint }
    }

    /// The record in `dir`, or None when the adapter has none.
    pub fn read(dir: &Path) -> Result<Option<Self>> {
        let path = dir.join(BASE_MODEL_FILE);
        if !path.exists() {
            return Ok(None);
        }
        let record: Self = crate::engine::error::read_json(&path)?;
        if record.version > BASE_RECORD_VERSION {
            return Err(Error::Json {
                path,
                message: format!("version {} was written by a newer metal-candle", record.version),
            });
        }
        Ok(Some(record))
    }

    /// Write `dir/base_model.json` atomically.
    pub fn write(&self, dir: &Path) -> Result<()> {
        write_json(&dir.join(BASE_MODEL_FILE), self)
    }
}

/// The one check of an adapter against the model it is about to be applied to: None when the adapter was
/// trained on this base (or does not say which), otherwise a message naming both. Front ends show it as a
/// warning (generate, score, the chat pane). Without a fingerprint (a PEFT-trained adapter) the base named in
/// its adapter_config.json is compared by name ([`base_name_mismatch`]); shapes that do not fit are refused
/// when the adapter loads.
pub fn base_mismatch(adapter_dir: &Path, model: &LoadedModel) -> Result<Option<String>> {
    if BaseRecord::read(adapter_dir)?.is_none() {
        return base_name_mismatch(adapter_dir, &model.source);
    }
    base_mismatch_of(adapter_dir, &model.source, &model.config)
}

/// An adapter without a fingerprint whose adapter_config.json names another base (`base_model_name_or_path`)
/// than `source`: the same path, or the same model name (a folder's name, a Hub repo's `NAME` in the cache's
/// `models--ORG--NAME`, a GGUF file named after it) counts as the same. A warning, not a refusal: a renamed or
/// copied folder is the same model under another name, and shapes are checked when the adapter loads.
pub fn base_name_mismatch(adapter_dir: &Path, source: &ModelSource) -> Result<Option<String>> {
    let config = super::peft::PeftAdapterConfig::read(adapter_dir)?;
    let Some(named) = config.base_model_name_or_path.as_deref().map(str::trim).filter(|n| !n.is_empty()) else {
        return Ok(None);
    };
    let loaded = source.path();
    let same_path = |p: PathBuf| {
        p.exists() && std::fs::canonicalize(&p).ok().is_some_and(|c| std::fs::canonicalize(loaded).ok() == Some(c))
    };
    if same_path(PathBuf::from(named)) || same_path(adapter_dir.join(named)) {
        return Ok(None);
    }
    let wanted = last_name(named).to_lowercase();
    let names = model_names(source);
    let is_gguf = matches!(source, ModelSource::Gguf(_));
    if names.iter().any(|n| *n == wanted || (is_gguf && !wanted.is_empty() && n.contains(&wanted))) {
        return Ok(None);
    }
    Ok(Some(format!(
        "the adapter {} names `{named}` as its base model (adapter_config.json `base_model_name_or_path`) but the \
         model loaded is {}; if it was trained on another base, its output will be wrong. Load `{named}` (--model) \
         to use it as trained, or ignore this if {} is the same model under another name",
        adapter_dir.display(),
        loaded.display(),
        loaded.display()
    )))
}

/// The last part of a path or repo id (`ORG/NAME` -> `NAME`), without a `.gguf` extension.
fn last_name(name: &str) -> &str {
    let last = name.trim_end_matches(['/', '\\']).rsplit(['/', '\\']).next().unwrap_or(name);
    last.strip_suffix(".gguf").unwrap_or(last)
}

/// The names a loaded model goes by, lowercase: its folder's (or GGUF file's) name, and the repo's `NAME` when it
/// sits in a Hugging Face cache (`models--ORG--NAME/snapshots/<commit>/...`).
fn model_names(source: &ModelSource) -> Vec<String> {
    let path = source.path();
    let mut names: Vec<String> =
        path.file_name().map(|n| last_name(&n.to_string_lossy()).to_lowercase()).into_iter().collect();
    for part in path.components() {
        let part = part.as_os_str().to_string_lossy();
        if let Some(repo) = part.strip_prefix("models--") {
            names.extend(repo.rsplit("--").next().map(str::to_lowercase));
        }
    }
    names
}

/// [`base_mismatch`] for a model known by its source and resolved config (its weights need not be loaded).
pub fn base_mismatch_of(adapter_dir: &Path, source: &ModelSource, config: &ModelConfig) -> Result<Option<String>> {
    let Some(record) = BaseRecord::read(adapter_dir)? else { return Ok(None) };
    let current = fingerprint_of(source, config)?;
    if current == record.fingerprint {
        return Ok(None);
    }
    Ok(Some(format!(
        "the adapter {} was trained on another base model ({}, fingerprint {}) than {} (fingerprint {}); \
         its shapes fit, but its output will likely be wrong. Use the base it was trained on",
        adapter_dir.display(),
        record.model.display(),
        short(&record.fingerprint),
        source.path().display(),
        short(&current)
    )))
}

/// The first 12 hex digits of a fingerprint, enough to tell two apart in a message.
pub fn short(fingerprint: &str) -> &str {
    let end = fingerprint.char_indices().nth("sha256:".len() + 12).map(|(i, _)| i).unwrap_or(fingerprint.len());
    &fingerprint[..end]
}
