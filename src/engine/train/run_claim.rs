//! Where a run trains and claiming it: the run folder of a new run, a resume in place or a branch; the claim on
//! it (a new run's run.json, leftovers of interrupted saves tidied, metrics cut back to the resume step); and the
//! refusal of a folder that holds someone else's checkpoints.

use super::config::TrainConfig;
use super::run_lock::RunLock;
use super::{branch, resume, run_folder};
use crate::engine::checkpoint;
use crate::engine::{Error, Result};
use std::path::{Path, PathBuf};

/// The run folder a config trains in, the checkpoint it resumes from, and the branch when later checkpoints
/// follow that one in its run (never replaced: the run continues in a new folder). Touches nothing.
pub(super) fn run_dir_of(config: &TrainConfig) -> Result<(PathBuf, Option<PathBuf>, Option<branch::Branch>)> {
    if let Some(ckpt) = &config.resume {
        if !ckpt.join(checkpoint::TRAINER_STATE).exists() {
            return Err(Error::MissingFile {
                path: ckpt.join(checkpoint::TRAINER_STATE),
                what: "resuming needs a checkpoint folder written by `train`".into(),
            });
        }
        if let Some(branch) = branch::branch_for(ckpt) {
            branch::check_parent_free(&branch)?;
            return Ok((branch::branch_dir(&branch), Some(ckpt.clone()), Some(branch)));
        }
        return Ok((run_folder::run_dir_of_checkpoint(ckpt), Some(ckpt.clone()), None));
    }
    let name = config.run_name.clone().unwrap_or_else(default_run_name);
    Ok((config.out.join(name), None, None))
}

/// Claim the run folder for this process (creating it for a new run), then prepare it: a new run writes
/// run.json into a folder that holds no run yet; a resume from `resume_step` tidies leftovers of interrupted
/// saves and drops the metrics after that step.
pub(super) fn claim_run_dir(
    config: &TrainConfig,
    run_dir: &Path,
    resume_step: Option<usize>,
    branch: Option<&branch::Branch>,
    fingerprints: &resume::Fingerprints,
) -> Result<RunLock> {
    if resume_step.is_none() {
        refuse_foreign_checkpoints(run_dir)?;
    }
    let lock = RunLock::claim(run_dir)?;
    let has_manifest = run_dir.join(run_folder::RUN_CONFIG).exists();
    if resume_step.is_none() && has_manifest {
        return Err(Error::InvalidSetting(format!(
            "{} already holds a run; pick another name or resume from one of its checkpoints",
            run_dir.display()
        )));
    }
    lock.clean_leftovers()?;
    if let Some(branch) = branch.filter(|_| !has_manifest) {
        branch::start_branch(branch, run_dir)?;
    } else if !has_manifest {
        let name = run_dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let manifest = run_folder::RunManifest {
            base_fingerprint: Some(fingerprints.base.clone()),
            dataset_fingerprint: Some(fingerprints.dataset.clone()),
            ..run_folder::RunManifest::new(&name, config)
        };
        manifest.write(run_dir)?;
    }
    if let Some(step) = resume_step {
        run_folder::truncate_metrics(run_dir, step)?;
    }
    Ok(lock)
}

/// A new run never starts in a folder that holds checkpoints or metrics without a run.json (a copied or half
/// deleted run): they would be overwritten and mixed into the new run. Checked before the folder is claimed.
fn refuse_foreign_checkpoints(run_dir: &Path) -> Result<()> {
    let Ok(entries) = std::fs::read_dir(run_dir) else { return Ok(()) };
    let found: Vec<String> = entries
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("checkpoint-") || n == run_folder::METRICS)
        .collect();
    if found.is_empty() || run_dir.join(run_folder::RUN_CONFIG).exists() {
        return Ok(());
    }
    Err(Error::InvalidSetting(format!(
        "{} holds {} but no run.json; a new run there would write over them: pick another name (--name), or move \
         them away",
        run_dir.display(),
        found.join(", ")
    )))
}

/// `run-YYYYMMDD-HHMMSS` in UTC.
pub fn default_run_name() -> String {
    let secs = checkpoint::unix_now();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = crate::engine::model::chat_template::strftime::civil_from_days(days as i64);
    format!("run-{y:04}{m:02}{d:02}-{:02}{:02}{:02}", rem / 3600, rem % 3600 / 60, rem % 60)
}
