//! Deleting a whole run folder (the checkpoints page's "Delete run…", `runs delete`). One rule for both front
//! ends: only a folder directly inside the runs folder that holds a run.json is a run; a run that is training
//! (its claim, `train::run_lock`, held by this or another process) is refused; and the deletion itself holds
//! the run's claim, so no training can start in the folder while it is being removed.

use super::run_folder::{RunManifest, RUN_CONFIG};
use super::run_lock::{is_claimed, RunLock};
use crate::engine::checkpoint::list_checkpoints;
use crate::engine::{Error, Result};
use std::path::{Path, PathBuf};

/// What deleting a run removes: shown in the confirmation before anything is deleted.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RunDeletePlan {
    /// The run folder (absolute).
    pub run_dir: PathBuf,
    /// The name the run is shown by (its label, else its folder name).
    pub title: String,
    pub checkpoints: usize,
    /// Bytes of every file in the folder (links are counted, not followed).
    pub size_bytes: u64,
}

/// Check that `run_dir` is a run that may be deleted from `runs_dir` and say what deleting it removes.
/// Refused: a path that is not a folder directly inside `runs_dir` (after resolving `..` and links), a folder
/// without run.json, a run that is training now.
pub fn plan_run_delete(runs_dir: &Path, run_dir: &Path) -> Result<RunDeletePlan> {
    let run_dir = resolve_inside(runs_dir, run_dir)?;
    if !run_dir.join(RUN_CONFIG).is_file() {
        return Err(Error::InvalidSetting(format!(
            "{} has no {RUN_CONFIG}, so it is not a run folder; only runs are deleted here (delete other folders \
             by hand)",
            run_dir.display()
        )));
    }
    if is_claimed(&run_dir) {
        return Err(training_now(&run_dir));
    }
    let title = RunManifest::read(&run_dir)
        .ok()
        .and_then(|m| m.label)
        .unwrap_or_else(|| run_dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default());
    Ok(RunDeletePlan {
        checkpoints: list_checkpoints(&run_dir).len(),
        size_bytes: crate::engine::checkpoint::folder_size(&run_dir),
        title,
        run_dir,
    })
}

/// Delete the run folder `run_dir` inside `runs_dir` after the checks of [`plan_run_delete`], holding the run's
/// claim while it goes. Returns what was removed.
pub fn delete_run(runs_dir: &Path, run_dir: &Path) -> Result<RunDeletePlan> {
    let plan = plan_run_delete(runs_dir, run_dir)?;
    // The claim closes the gap between the check and the removal: a training that starts now is refused.
    let claim = match RunLock::claim(&plan.run_dir) {
        Ok(claim) => claim,
        Err(Error::RunInUse { .. }) => return Err(training_now(&plan.run_dir)),
        Err(e) => return Err(e),
    };
    let removed = std::fs::remove_dir_all(&plan.run_dir).map_err(|e| Error::write(&plan.run_dir, e));
    drop(claim);
    removed.map(|()| plan)
}

fn training_now(run_dir: &Path) -> Error {
    Error::InvalidSetting(format!(
        "{} is training now (this or another process holds the run); stop the training before deleting the run",
        run_dir.display()
    ))
}

/// `run_dir` made absolute and checked to be a folder (not a link) directly inside `runs_dir`.
fn resolve_inside(runs_dir: &Path, run_dir: &Path) -> Result<PathBuf> {
    let not_a_run = |why: &str| {
        Error::InvalidSetting(format!(
            "{} {why}; only a run folder directly inside the runs folder {} can be deleted",
            run_dir.display(),
            runs_dir.display()
        ))
    };
    let meta = std::fs::symlink_metadata(run_dir).map_err(|e| Error::io(run_dir, e))?;
    if meta.file_type().is_symlink() || !meta.is_dir() {
        return Err(not_a_run("is not a folder (or is a link)"));
    }
    let runs = std::fs::canonicalize(runs_dir).map_err(|e| Error::io(runs_dir, e))?;
    let run = std::fs::canonicalize(run_dir).map_err(|e| Error::io(run_dir, e))?;
    if run.parent() != Some(runs.as_path()) {
        return Err(not_a_run("is not inside the runs folder"));
    }
    Ok(run)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::train::TrainConfig;

    fn run(runs: &Path, name: &str) -> PathBuf {
        let dir = runs.join(name);
        std::fs::create_dir_all(dir.join("checkpoint-2")).unwrap();
        std::fs::write(dir.join("checkpoint-2/adapter_model.safetensors"), [0u8; 100]).unwrap();
        RunManifest::new(name, &TrainConfig::default()).write(&dir).unwrap();
        dir
    }

    #[test]
    fn a_run_is_planned_then_deleted() {
        let runs = tempfile::tempdir().unwrap();
        let dir = run(runs.path(), "r1");
        let plan = plan_run_delete(runs.path(), &dir).unwrap();
        assert_eq!(plan.title, "r1");
        assert!(plan.size_bytes >= 100, "{plan:?}");
        assert!(dir.exists(), "planning deletes nothing");
        delete_run(runs.path(), &dir).unwrap();
        assert!(!dir.exists());
        assert!(runs.path().exists(), "the runs folder stays");
    }

    #[test]
    fn folders_that_are_not_runs_here_are_refused() {
        let runs = tempfile::tempdir().unwrap();
        let other = tempfile::tempdir().unwrap();
        let outside = run(other.path(), "elsewhere");
        let err = delete_run(runs.path(), &outside).unwrap_err().to_string();
        assert!(err.contains("not inside the runs folder"), "{err}");
        let sneaky = runs.path().join("..").join(other.path().file_name().unwrap()).join("elsewhere");
        assert!(delete_run(runs.path(), &sneaky).is_err());
        let plain = runs.path().join("notes");
        std::fs::create_dir_all(&plain).unwrap();
        assert!(delete_run(runs.path(), &plain).unwrap_err().to_string().contains("has no run.json"));
        assert!(delete_run(runs.path(), runs.path()).is_err(), "the runs folder itself");
        let nested = run(&runs.path().join("a"), "b");
        assert!(delete_run(runs.path(), &nested).is_err(), "two levels down");
        assert!(outside.exists() && plain.exists() && nested.exists());
    }

    #[test]
    fn a_claimed_run_is_refused() {
        let runs = tempfile::tempdir().unwrap();
        let dir = run(runs.path(), "busy");
        let claim = RunLock::claim(&dir).unwrap();
        let err = delete_run(runs.path(), &dir).unwrap_err().to_string();
        assert!(err.contains("training now"), "{err}");
        assert!(dir.join(RUN_CONFIG).exists());
        drop(claim);
        delete_run(runs.path(), &dir).unwrap();
    }
}
