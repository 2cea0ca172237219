//! Resuming from a checkpoint that later checkpoints of its run followed: continuing in the same folder would
//! replace them, so the run branches. The branch is a new run folder beside the parent (`<run>-from-<step>`,
//! numbered when taken) whose run.json is the parent's, naming its parent and the checkpoint it started from, and
//! whose metrics are the parent's up to that step. The parent folder is left exactly as it was.

use super::run_folder::{self, BranchOrigin, RunManifest, METRICS};
use crate::engine::{Error, Result};
use std::path::{Path, PathBuf};

/// A resume that must branch: its origin and the later checkpoints it would otherwise replace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Branch {
    pub origin: BranchOrigin,
    pub later_steps: Vec<usize>,
}

/// The step of a `checkpoint-<step>` folder name.
fn step_of(path: &Path) -> Option<usize> {
    path.file_name()?.to_str()?.strip_prefix("checkpoint-")?.parse().ok()
}

/// The branch a resume from `ckpt` needs: `Some` when its run folder holds checkpoints of later steps.
pub fn branch_for(ckpt: &Path) -> Option<Branch> {
    let step = step_of(ckpt)?;
    let run = ckpt.parent()?;
    let mut later_steps: Vec<usize> = std::fs::read_dir(run)
        .ok()?
        .flatten()
        .filter(|e| e.path().is_dir())
        .filter_map(|e| step_of(&e.path()))
        .filter(|s| *s > step)
        .collect();
    later_steps.sort_unstable();
    (!later_steps.is_empty()).then(|| Branch {
        origin: BranchOrigin { run: run.to_path_buf(), checkpoint: ckpt.to_path_buf(), step },
        later_steps,
    })
}

/// Refuse to branch from a run another process is training in (its `.lock` held), as a resume in place would be:
/// the holder is still writing checkpoints. Takes a shared lock for a moment and changes nothing.
pub fn check_parent_free(branch: &Branch) -> Result<()> {
    let lock = branch.origin.run.join(super::run_lock::RUN_LOCK);
    let Ok(file) = std::fs::File::open(&lock) else { return Ok(()) };
    match file.try_lock_shared() {
        Err(std::fs::TryLockError::WouldBlock) => {
            Err(Error::RunInUse { path: branch.origin.run.clone(), holder: String::new() })
        }
        _ => Ok(()),
    }
}

/// A free folder name beside the parent run: `<run>-from-<step>`, then `-2`, `-3`, ...
pub fn branch_dir(branch: &Branch) -> PathBuf {
    let run = &branch.origin.run;
    let name = run.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "run".into());
    let parent = run.parent().unwrap_or(Path::new("."));
    let first = parent.join(format!("{name}-from-{}", branch.origin.step));
    std::iter::once(first)
        .chain((2..).map(|n| parent.join(format!("{name}-from-{}-{n}", branch.origin.step))))
        .find(|dir| !dir.exists())
        .unwrap_or_else(|| unreachable!("an unbounded sequence of names has a free one"))
}

/// Fill the (claimed, empty) branch folder: the parent's run.json naming its origin, and its metrics.
pub fn start_branch(branch: &Branch, run_dir: &Path) -> Result<()> {
    let parent = RunManifest::read(&branch.origin.run)?;
    let name = run_dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    // A branch of a named run says where it came from in the run list and the compare legend.
    let label = parent.label.as_ref().map(|l| format!("{l} (from step {})", branch.origin.step));
    let manifest = RunManifest { name, label, branched_from: Some(branch.origin.clone()), ..parent };
    manifest.write(run_dir)?;
    let metrics = branch.origin.run.join(METRICS);
    if metrics.exists() {
        let bytes = std::fs::read(&metrics).map_err(|e| Error::io(&metrics, e))?;
        crate::engine::checkpoint::write_atomic(&run_dir.join(METRICS), &bytes)?;
    }
    run_folder::truncate_metrics(run_dir, branch.origin.step)
}

/// What a branched resume tells the user.
pub fn note(branch: &Branch, run_dir: &Path) -> String {
    let later: Vec<String> = branch.later_steps.iter().map(|s| format!("checkpoint-{s}")).collect();
    format!(
        "{} already has {} after checkpoint-{}: this resume continues in a new run folder {} (its run.json names its \
         parent), and {} is left as it was",
        branch.origin.run.display(),
        later.join(", "),
        branch.origin.step,
        run_dir.display(),
        branch.origin.run.display()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_resume_with_later_checkpoints_branches_into_a_free_name() {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().join("r");
        for s in [2, 4, 6] {
            std::fs::create_dir_all(run.join(format!("checkpoint-{s}"))).unwrap();
        }
        assert!(branch_for(&run.join("checkpoint-6")).is_none());
        let b = branch_for(&run.join("checkpoint-2")).unwrap();
        assert_eq!(b.later_steps, [4, 6]);
        assert_eq!(branch_dir(&b), dir.path().join("r-from-2"));
        std::fs::create_dir_all(dir.path().join("r-from-2")).unwrap();
        assert_eq!(branch_dir(&b), dir.path().join("r-from-2-2"));
    }

    #[test]
    fn a_branch_of_a_named_run_says_where_it_came_from() {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().join("r");
        for s in [2, 4] {
            std::fs::create_dir_all(run.join(format!("checkpoint-{s}"))).unwrap();
        }
        let parent = RunManifest { label: Some("baseline".into()), ..RunManifest::new("r", &Default::default()) };
        parent.write(&run).unwrap();
        let branch = branch_for(&run.join("checkpoint-2")).unwrap();
        let branch_run = branch_dir(&branch);
        std::fs::create_dir_all(&branch_run).unwrap();
        start_branch(&branch, &branch_run).unwrap();
        let manifest = RunManifest::read(&branch_run).unwrap();
        assert_eq!((manifest.name.as_str(), manifest.label.as_deref()), ("r-from-2", Some("baseline (from step 2)")));
    }
}
