//! A run's human name: the label a user gives a run (the studio's Rename) so that the run list and the
//! compare-runs legend say "baseline r8" instead of `run-20261128-064447`. It lives in the run's own run.json
//! ([`RunManifest::label`]); renaming rewrites that one field atomically and never moves, renames or
//! overwrites the run folder or anything in it, so paths to its checkpoints stay valid.

use super::run_folder::{RunManifest, RUN_CONFIG};
use crate::engine::{Error, Result};
use std::path::Path;

/// Longest run label, in characters: a name for a list and a legend, not a description.
pub const MAX_RUN_LABEL_LEN: usize = 80;

/// The one check of a run label: trimmed, not empty, at most [`MAX_RUN_LABEL_LEN`] characters, one line.
/// Returns the label as it will be stored (trimmed).
pub fn validate_run_label(label: &str) -> Result<String> {
    let label = label.trim();
    if label.is_empty() {
        return Err(Error::InvalidSetting("a run name cannot be empty; type a name such as `baseline r8`".into()));
    }
    let chars = label.chars().count();
    if chars > MAX_RUN_LABEL_LEN {
        return Err(Error::InvalidSetting(format!(
            "a run name is at most {MAX_RUN_LABEL_LEN} characters; this one has {chars}"
        )));
    }
    if label.chars().any(char::is_control) {
        return Err(Error::InvalidSetting("a run name is one line of text: remove the line break or tab".into()));
    }
    Ok(label.to_string())
}

/// Give the run in `run_dir` the name `label` (validated, trimmed) by rewriting its run.json atomically.
/// Refused, with the file untouched, when the label is invalid or the run has no readable run.json.
/// Returns the stored label.
pub fn rename_run(run_dir: &Path, label: &str) -> Result<String> {
    let label = validate_run_label(label)?;
    if !run_dir.join(RUN_CONFIG).is_file() {
        return Err(Error::MissingFile {
            path: run_dir.join(RUN_CONFIG),
            what: "only a run folder with its run.json can be renamed (was the run deleted or moved?)".into(),
        });
    }
    let mut manifest = RunManifest::read(run_dir)?;
    manifest.label = Some(label.clone());
    manifest.write(run_dir)?;
    Ok(label)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::train::TrainConfig;

    #[test]
    fn a_label_is_trimmed_one_line_and_bounded() {
        assert_eq!(validate_run_label("  baseline r8 ").unwrap(), "baseline r8");
        assert!(validate_run_label("   ").unwrap_err().to_string().contains("cannot be empty"));
        let long = "x".repeat(MAX_RUN_LABEL_LEN + 1);
        assert!(validate_run_label(&long).unwrap_err().to_string().contains("at most 80"));
        assert!(validate_run_label(&"é".repeat(MAX_RUN_LABEL_LEN)).is_ok(), "characters, not bytes");
        assert!(validate_run_label("two\nlines").unwrap_err().to_string().contains("one line"));
        // Slashes are fine: a label names nothing on disk.
        assert_eq!(validate_run_label("r8 / q,v").unwrap(), "r8 / q,v");
    }

    #[test]
    fn renaming_rewrites_only_the_label_and_leaves_the_folder_where_it_is() {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().join("run-20260101-000000");
        std::fs::create_dir_all(run.join("checkpoint-2")).unwrap();
        std::fs::write(run.join("checkpoint-2/adapter_model.safetensors"), b"weights").unwrap();
        let manifest = RunManifest::new("run-20260101-000000", &TrainConfig::default());
        manifest.write(&run).unwrap();

        assert_eq!(rename_run(&run, " baseline r8 ").unwrap(), "baseline r8");
        let renamed = RunManifest::read(&run).unwrap();
        assert_eq!(renamed.label.as_deref(), Some("baseline r8"));
        assert_eq!(RunManifest { label: None, ..renamed }, manifest, "nothing else changed");
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, ["run-20260101-000000"], "the folder keeps its name");
        assert_eq!(std::fs::read(run.join("checkpoint-2/adapter_model.safetensors")).unwrap(), b"weights");
        let listed = super::super::run_folder::list_runs(dir.path()).unwrap();
        assert_eq!((listed[0].title(), listed[0].name.as_str()), ("baseline r8", "run-20260101-000000"));

        // A bad name leaves the stored one alone.
        assert!(rename_run(&run, "").is_err());
        assert_eq!(RunManifest::read(&run).unwrap().label.as_deref(), Some("baseline r8"));
    }

    #[test]
    fn a_folder_without_run_json_is_not_renamed() {
        let dir = tempfile::tempdir().unwrap();
        let err = rename_run(dir.path(), "name").unwrap_err().to_string();
        assert!(err.contains("run.json"), "{err}");
        assert!(!dir.path().join(RUN_CONFIG).exists(), "nothing was written");
    }
}
