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
/// warning (generate, score, the chat pane) or refuse (export, resume).
pub fn base_mismatch(adapter_dir: &Path, model: &LoadedModel) -> Result<Option<String>> {
    base_mismatch_of(adapter_dir, &model.source, &model.config)
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
