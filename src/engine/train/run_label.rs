//! What a user writes about a run: its human name, the label a user gives a run (the studio's Rename, `runs
//! rename`) so that the run list and the compare-runs legend say "baseline r8" instead of
//! `run-20261128-064447`, and a free-text note (the checkpoints page's Notes, `runs note`). Both live in the
//! run's own run.json ([`RunManifest::label`], [`RunManifest::notes`]); writing one rewrites that one field
//! atomically and never moves, renames or overwrites the run folder or anything in it, so paths to its
//! checkpoints stay valid.

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
    let mut manifest = read_for_edit(run_dir, "renamed")?;
    manifest.label = Some(label.clone());
    manifest.write(run_dir)?;
    Ok(label)
}

/// Longest run note, in characters: a few paragraphs about what was tried, not a log.
pub const MAX_RUN_NOTES_LEN: usize = 4000;

/// The one check of a run note: trimmed, at most [`MAX_RUN_NOTES_LEN`] characters; line breaks and tabs are
/// fine, other control characters are not. An empty note is None (the note is cleared).
pub fn validate_run_notes(notes: &str) -> Result<Option<String>> {
    let notes = notes.trim();
    let chars = notes.chars().count();
    if chars > MAX_RUN_NOTES_LEN {
        return Err(Error::InvalidSetting(format!(
            "a run note is at most {MAX_RUN_NOTES_LEN} characters; this one has {chars}: shorten it"
        )));
    }
    if notes.chars().any(|c| c.is_control() && c != '\n' && c != '\t' && c != '\r') {
        return Err(Error::InvalidSetting(
            "a run note is plain text: remove the control characters (line breaks and tabs are fine)".into(),
        ));
    }
    Ok((!notes.is_empty()).then(|| notes.to_string()))
}

/// Store `notes` (validated, trimmed; empty clears it) as the note of the run in `run_dir` by rewriting its
/// run.json atomically. Refused, with the file untouched, when the note is invalid or the run has no readable
/// run.json. Returns the stored note.
pub fn set_run_notes(run_dir: &Path, notes: &str) -> Result<Option<String>> {
    let notes = validate_run_notes(notes)?;
    let mut manifest = read_for_edit(run_dir, "annotated")?;
    manifest.notes = notes.clone();
    manifest.write(run_dir)?;
    Ok(notes)
}

/// The run.json of `run_dir` for an edit (`what`: "renamed", "annotated"): refused when the folder has none.
fn read_for_edit(run_dir: &Path, what: &str) -> Result<RunManifest> {
    if !run_dir.join(RUN_CONFIG).is_file() {
        return Err(Error::MissingFile {
            path: run_dir.join(RUN_CONFIG),
            what: format!("only a run folder with its run.json can be {what} (was the run deleted or moved?)"),
        });
    }
    RunManifest::read(run_dir)
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

    #[test]
    fn a_note_is_stored_alone_and_an_empty_one_clears_it() {
        let dir = tempfile::tempdir().unwrap();
        let manifest = RunManifest::new("r", &TrainConfig::default());
        manifest.write(dir.path()).unwrap();
        let stored = set_run_notes(dir.path(), "  lr too high?\nloss jumps at step 40 ").unwrap();
        assert_eq!(stored.as_deref(), Some("lr too high?\nloss jumps at step 40"));
        let read = RunManifest::read(dir.path()).unwrap();
        assert_eq!(read.notes, stored);
        assert_eq!(RunManifest { notes: None, ..read }, manifest, "nothing else changed");
        assert!(set_run_notes(dir.path(), "bell \u{7}").unwrap_err().to_string().contains("control"));
        assert!(set_run_notes(dir.path(), &"x".repeat(MAX_RUN_NOTES_LEN + 1)).is_err());
        assert_eq!(RunManifest::read(dir.path()).unwrap().notes, stored, "a refused note leaves the old one");
        assert_eq!(set_run_notes(dir.path(), "   ").unwrap(), None);
        assert_eq!(RunManifest::read(dir.path()).unwrap().notes, None);
        let empty = tempfile::tempdir().unwrap();
        assert!(set_run_notes(empty.path(), "x").unwrap_err().to_string().contains("annotated"));
    }
}
