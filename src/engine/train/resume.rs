//! What a resume may change, and its record in run.json: the base model must be the one the checkpoint was
//! trained on (by fingerprint) unless the user forces another; a changed dataset is accepted but recorded and
//! reported; every setting that differs from the run's last start (learning rate, iterations, save interval,
//! paths, ...) is listed in the run's resume history. LoRA settings are refused earlier
//! (`PeftAdapterConfig::check_resume`).

use super::run_folder::{ResumeRecord, RunManifest};
use super::TrainConfig;
use crate::engine::checkpoint::{self, BaseRecord};
use crate::engine::{Error, Result};
use std::path::Path;

/// The fingerprints of what a run trains on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fingerprints {
    pub base: String,
    pub dataset: String,
}

/// Refuse to resume `ckpt` on a base model other than the one it was trained on, unless `config.force_base`.
/// Returns whether the base differs (and the resume goes on because it was forced).
pub fn check_base(config: &TrainConfig, ckpt: &Path, fingerprints: &Fingerprints) -> Result<bool> {
    let Some(record) = BaseRecord::read(ckpt)? else { return Ok(false) };
    if record.fingerprint == fingerprints.base {
        return Ok(false);
    }
    if config.force_base {
        return Ok(true);
    }
    Err(Error::InvalidSetting(format!(
        "{} was trained on another base model ({}, fingerprint {}) than {} (fingerprint {}); resume with the \
         model it was trained on, or pass --force-base to continue on this one (recorded in run.json)",
        ckpt.display(),
        record.model.display(),
        checkpoint::base::short(&record.fingerprint),
        config.model.display(),
        checkpoint::base::short(&fingerprints.base)
    )))
}

/// Record a resume from `ckpt` at `step` in `run_dir/run.json`: append what changed to the history and make
/// the manifest describe this start. Returns notes to report (a changed dataset or a forced base). A run
/// without a readable run.json is left as it is.
pub fn record_resume(
    run_dir: &Path,
    config: &TrainConfig,
    ckpt: &Path,
    step: usize,
    fingerprints: &Fingerprints,
    forced_base: bool,
) -> Result<Vec<String>> {
    let Ok(mut manifest) = RunManifest::read(run_dir) else { return Ok(Vec::new()) };
    let mut changed = setting_changes(&manifest.config, config);
    let mut notes = Vec::new();
    let fingerprint_change = |what: &str, old: &Option<String>, new: &str| {
        old.as_deref()
            .filter(|o| *o != new)
            .map(|o| format!("{what} fingerprint: {} -> {}", checkpoint::base::short(o), checkpoint::base::short(new)))
    };
    if let Some(c) = fingerprint_change("dataset", &manifest.dataset_fingerprint, &fingerprints.dataset) {
        notes.push(format!(
            "the dataset changed since the run's last start ({c}); training continues on {}",
            config.data.display()
        ));
        changed.push(c);
    }
    if let Some(c) = fingerprint_change("base model", &manifest.base_fingerprint, &fingerprints.base) {
        changed.push(c);
    }
    if forced_base {
        notes.push(format!("continuing on another base model, {} (--force-base)", config.model.display()));
    }
    manifest.resumes.push(ResumeRecord {
        step,
        checkpoint: ckpt.to_path_buf(),
        unix_secs: checkpoint::unix_now(),
        changed,
        forced_base,
    });
    manifest.config = TrainConfig { force_base: false, ..config.clone() };
    manifest.model = config.model.clone();
    manifest.dataset = config.data.clone();
    manifest.base_fingerprint = Some(fingerprints.base.clone());
    manifest.dataset_fingerprint = Some(fingerprints.dataset.clone());
    manifest.write(run_dir)?;
    Ok(notes)
}

/// "field: old -> new" for every setting that differs (nested LoRA settings as `lora.field`); where the run
/// resumes from is not a setting.
fn setting_changes(old: &TrainConfig, new: &TrainConfig) -> Vec<String> {
    let flat = |c: &TrainConfig| {
        let mut out = std::collections::BTreeMap::new();
        flatten("", &serde_json::to_value(c).unwrap_or_default(), &mut out);
        out.remove("resume");
        out
    };
    let (old, new) = (flat(old), flat(new));
    new.iter()
        .filter(|(k, v)| old.get(*k) != Some(v))
        .map(|(k, v)| format!("{k}: {} -> {v}", old.get(k).map(|o| o.to_string()).unwrap_or("unset".into())))
        .collect()
}

fn flatten(prefix: &str, value: &serde_json::Value, out: &mut std::collections::BTreeMap<String, serde_json::Value>) {
    match value {
        serde_json::Value::Object(map) => {
            for (k, v) in map {
                let key = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
                flatten(&key, v, out);
            }
        }
        other => {
            out.insert(prefix.to_string(), other.clone());
        }
    }
}
