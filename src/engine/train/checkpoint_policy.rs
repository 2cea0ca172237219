//! Which checkpoints a run keeps under `save_total_limit`: after each save, the newest N plus the best checkpoint
//! (never deleted) and any checkpoint a branch of this run started from (its run.json names it). Only
//! `checkpoint-<step>` folders directly inside the run folder are considered (a link is never followed out of it),
//! and each goes through the one checkpoint delete helper.

use super::run_folder::{RunManifest, RUN_CONFIG};
use crate::engine::checkpoint::{self, BestCheckpoint, ADAPTER_CONFIG};
use crate::engine::Result;
use std::path::{Path, PathBuf};

/// The steps to delete from `steps` to keep the newest `limit` plus every step in `keep`.
pub fn steps_to_remove(steps: &[usize], limit: usize, keep: &[usize]) -> Vec<usize> {
    let mut sorted = steps.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let newest_from = sorted.len().saturating_sub(limit);
    sorted[..newest_from].iter().copied().filter(|s| !keep.contains(s)).collect()
}

/// Apply `limit` (None: keep all) to `run_dir` after a save, keeping `best` too; the folders deleted.
pub fn prune(run_dir: &Path, limit: Option<usize>, best: Option<usize>) -> Result<Vec<PathBuf>> {
    let Some(limit) = limit else { return Ok(Vec::new()) };
    let folders = checkpoint_folders(run_dir);
    let steps: Vec<usize> = folders.iter().map(|(s, _)| *s).collect();
    let mut keep = branch_origins(run_dir);
    keep.extend(best);
    let mut removed = Vec::new();
    for step in steps_to_remove(&steps, limit, &keep) {
        if let Some((_, path)) = folders.iter().find(|(s, _)| *s == step) {
            checkpoint::delete_checkpoint(path)?;
            removed.push(path.clone());
        }
    }
    Ok(removed)
}

/// `best` when its checkpoint is a folder of `run_dir` (a branch's best so far can lie in its parent run).
pub fn best_on_disk(run_dir: &Path, best: Option<BestCheckpoint>) -> Option<BestCheckpoint> {
    best.filter(|b| checkpoint_folders(run_dir).iter().any(|(step, _)| *step == b.step))
}

/// The `checkpoint-<step>` folders of `run_dir`: real folders (not links) holding an adapter.
fn checkpoint_folders(run_dir: &Path) -> Vec<(usize, PathBuf)> {
    let Ok(entries) = std::fs::read_dir(run_dir) else { return Vec::new() };
    entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| Some((checkpoint::step_of_folder(&e.path())?, e.path())))
        .filter(|(_, path)| path.join(ADAPTER_CONFIG).is_file())
        .collect()
}

/// Steps of `run_dir`'s checkpoints that a branch beside it started from (they stay: a branch names its origin).
fn branch_origins(run_dir: &Path) -> Vec<usize> {
    let Some(parent) = run_dir.parent() else { return Vec::new() };
    let Ok(entries) = std::fs::read_dir(parent) else { return Vec::new() };
    let this = std::fs::canonicalize(run_dir).unwrap_or_else(|_| run_dir.to_path_buf());
    entries
        .flatten()
        .map(|e| e.path())
        .filter(|dir| dir.join(RUN_CONFIG).is_file())
        .filter_map(|dir| RunManifest::read(&dir).ok()?.branched_from)
        .filter(|origin| std::fs::canonicalize(&origin.run).unwrap_or_else(|_| origin.run.clone()) == this)
        .map(|origin| origin.step)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_n_and_the_kept_steps_survive() {
        assert_eq!(steps_to_remove(&[2, 4, 6, 8], 2, &[]), [2, 4]);
        assert_eq!(steps_to_remove(&[8, 2, 6, 4], 1, &[2]), [4, 6]);
        assert_eq!(steps_to_remove(&[2, 4], 3, &[]), Vec::<usize>::new());
        assert_eq!(steps_to_remove(&[2, 4, 6], 1, &[6]), [2, 4], "the best may also be the newest");
    }

    #[test]
    fn prune_deletes_only_checkpoint_folders_of_the_run_and_keeps_the_best_and_branch_origins() {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().join("r");
        for s in [1, 2, 3, 4, 5] {
            std::fs::create_dir_all(run.join(format!("checkpoint-{s}"))).unwrap();
            std::fs::write(run.join(format!("checkpoint-{s}/{ADAPTER_CONFIG}")), "{}").unwrap();
        }
        // Not checkpoints of this run: a folder without an adapter, and a link to a folder outside.
        std::fs::create_dir_all(run.join("checkpoint-0")).unwrap();
        let outside = dir.path().join("outside");
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join(ADAPTER_CONFIG), "{}").unwrap();
        #[cfg(unix)]
        std::os::unix::fs::symlink(&outside, run.join("checkpoint-9")).unwrap();
        // A branch of this run started from checkpoint-1.
        let origin =
            super::super::run_folder::BranchOrigin { run: run.clone(), checkpoint: run.join("checkpoint-1"), step: 1 };
        let branch = RunManifest { branched_from: Some(origin), ..RunManifest::new("r-from-1", &Default::default()) };
        std::fs::create_dir_all(dir.path().join("r-from-1")).unwrap();
        branch.write(&dir.path().join("r-from-1")).unwrap();

        let removed = prune(&run, Some(1), Some(3)).unwrap();
        assert_eq!(removed, [run.join("checkpoint-2"), run.join("checkpoint-4")]);
        for (s, exists) in [(0, true), (1, true), (2, false), (3, true), (4, false), (5, true)] {
            assert_eq!(run.join(format!("checkpoint-{s}")).exists(), exists, "checkpoint-{s}");
        }
        assert!(outside.join(ADAPTER_CONFIG).exists(), "nothing outside the run folder is touched");
        assert_eq!(prune(&run, None, None).unwrap(), Vec::<PathBuf>::new());
    }
}
