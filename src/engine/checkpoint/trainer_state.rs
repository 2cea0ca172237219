//! Whole checkpoints: the adapter plus the trainer's state and optimizer moments, saved atomically and read
//! back for an exact resume; listing a run's checkpoints and deleting one.

use super::base::BaseRecord;
use super::files::{folder_size, read_safetensors, sync_dir, write_json, write_safetensors};
use super::peft::{save_peft_adapter, PeftAdapterConfig};
use super::{ADAPTER_CONFIG, ADAPTER_WEIGHTS, OPTIMIZER_STATE, TRAINER_STATE};
use crate::engine::data::DataCursor;
use crate::engine::lora::AdapterParam;
use crate::engine::{Error, Result};
use candle_core::Tensor;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// One saved checkpoint, as the run browser and the CLI list it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CheckpointInfo {
    pub step: usize,
    pub path: PathBuf,
    pub size_bytes: u64,
    pub train_loss: Option<f64>,
    pub val_loss: Option<f64>,
    pub saved_unix_secs: u64,
}

/// Where the trainer was when it saved, enough to continue exactly.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct TrainerState {
    pub step: usize,
    pub total_steps: usize,
    pub cursor: DataCursor,
    pub seed: u64,
    pub train_loss: Option<f64>,
    pub val_loss: Option<f64>,
    pub trained_tokens: usize,
    pub elapsed_secs: f64,
    pub saved_unix_secs: u64,
    /// The evaluation with the lowest validation loss so far (its checkpoint is always saved). Checkpoints from
    /// before early stopping have none and read as None.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub best: Option<BestCheckpoint>,
    /// Evaluations in a row since the last that improved on `best` by more than the early-stopping min delta:
    /// early stopping's patience counter, so a resumed run stops exactly where an uninterrupted one would.
    #[serde(default)]
    pub evals_without_improvement: usize,
}

impl TrainerState {
    /// A new run's state: step 0 of `total_steps`, at `cursor`, nothing trained or saved yet.
    pub fn fresh(total_steps: usize, cursor: DataCursor, seed: u64) -> Self {
        Self {
            step: 0,
            total_steps,
            cursor,
            seed,
            train_loss: None,
            val_loss: None,
            trained_tokens: 0,
            elapsed_secs: 0.0,
            saved_unix_secs: 0,
            best: None,
            evals_without_improvement: 0,
        }
    }
}

/// The best checkpoint of a run: the step whose validation loss is the lowest so far, and that loss (recorded
/// in each checkpoint's trainer_state.json and in run.json).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct BestCheckpoint {
    pub step: usize,
    pub val_loss: f64,
}

/// Save a full checkpoint (adapter, the base it was trained on, optimizer moments, trainer state) as
/// `run_dir/checkpoint-<step>/`. Built in a `.partial` folder, flushed to disk and renamed into place, so an
/// interrupted save (or a power loss) leaves no half checkpoint. `run_dir` must exist: a run folder that
/// vanished is not recreated here.
///
/// `extra_files` (file name, bytes) are written inside the same atomic save (GRPO's in-flight completions, when a
/// checkpoint falls inside a batch's iterations).
pub fn save_checkpoint(
    run_dir: &Path,
    params: &[AdapterParam],
    adapter_config: &PeftAdapterConfig,
    base: &BaseRecord,
    optimizer_state: &HashMap<String, Tensor>,
    state: &TrainerState,
    extra_files: &[(&str, Vec<u8>)],
) -> Result<PathBuf> {
    let final_dir = run_dir.join(format!("checkpoint-{}", state.step));
    let partial = run_dir.join(format!(".checkpoint-{}.partial", state.step));
    let _ = std::fs::remove_dir_all(&partial);
    std::fs::create_dir(&partial).map_err(|e| Error::write(&partial, e))?;
    let written = (|| {
        save_peft_adapter(&partial, params, adapter_config)?;
        base.write(&partial)?;
        write_safetensors(&partial.join(OPTIMIZER_STATE), optimizer_state)?;
        write_json(&partial.join(TRAINER_STATE), state)?;
        for (name, bytes) in extra_files {
            let path = partial.join(name);
            std::fs::write(&path, bytes).map_err(|e| Error::write(&path, e))?;
        }
        sync_dir(&partial).map_err(|e| Error::write(&partial, e))?;
        if final_dir.exists() {
            let old = run_dir.join(format!(".checkpoint-{}.old", state.step));
            let _ = std::fs::remove_dir_all(&old);
            std::fs::rename(&final_dir, &old).map_err(|e| Error::write(&final_dir, e))?;
            std::fs::rename(&partial, &final_dir).map_err(|e| Error::write(&final_dir, e))?;
            let _ = std::fs::remove_dir_all(&old);
        } else {
            std::fs::rename(&partial, &final_dir).map_err(|e| Error::write(&final_dir, e))?;
        }
        sync_dir(run_dir).map_err(|e| Error::write(run_dir, e))
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_dir_all(&partial);
        return Err(e);
    }
    Ok(final_dir)
}

/// The step a `checkpoint-<step>` folder is named for (None for a folder named otherwise).
pub fn step_of_folder(checkpoint: &Path) -> Option<usize> {
    checkpoint.file_name()?.to_str()?.strip_prefix("checkpoint-")?.parse().ok()
}

/// Read a checkpoint's trainer state and optimizer moments. A state whose step is not the one the folder is
/// named for (an edited or copied `trainer_state.json`) is refused naming both: a resume from it would continue
/// at the wrong step, data position and schedule.
pub fn load_trainer_state(checkpoint: &Path) -> Result<(TrainerState, HashMap<String, Tensor>)> {
    let path = checkpoint.join(TRAINER_STATE);
    let state: TrainerState = crate::engine::error::read_json(&path)?;
    if let Some(named) = step_of_folder(checkpoint).filter(|&named| named != state.step) {
        return Err(Error::InvalidSetting(format!(
            "{} says step {} but its folder is checkpoint-{named} (saved at step {named}): the state was edited or \
             copied from another checkpoint, and a resume would continue at the wrong step and data position; put \
             back this checkpoint's own trainer_state.json (step {named}), or resume from checkpoint-{} if that is \
             the step meant",
            path.display(),
            state.step,
            state.step
        )));
    }
    let optimizer = read_safetensors(&checkpoint.join(OPTIMIZER_STATE), "the optimizer state an exact resume needs")?;
    Ok((state, optimizer))
}

/// The checkpoints of one run, by step.
pub fn list_checkpoints(run_dir: &Path) -> Vec<CheckpointInfo> {
    let mut out: Vec<CheckpointInfo> = std::fs::read_dir(run_dir)
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| {
                    let name = e.file_name().to_string_lossy().to_string();
                    let step: usize = name.strip_prefix("checkpoint-")?.parse().ok()?;
                    let path = e.path();
                    if !path.join(ADAPTER_WEIGHTS).exists() {
                        return None;
                    }
                    let state: Option<TrainerState> = crate::engine::error::read_json(&path.join(TRAINER_STATE)).ok();
                    let mtime = e
                        .metadata()
                        .ok()
                        .and_then(|m| m.modified().ok())
                        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                        .map(|d| d.as_secs())
                        .unwrap_or(0);
                    Some(CheckpointInfo {
                        step,
                        size_bytes: folder_size(&path),
                        train_loss: state.as_ref().and_then(|s| s.train_loss),
                        val_loss: state.as_ref().and_then(|s| s.val_loss),
                        saved_unix_secs: state.map(|s| s.saved_unix_secs).unwrap_or(mtime),
                        path,
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    out.sort_by_key(|c| c.step);
    out
}

/// Delete one checkpoint folder (it must look like one).
pub fn delete_checkpoint(path: &Path) -> Result<()> {
    if !path.join(ADAPTER_CONFIG).exists() {
        return Err(Error::InvalidSetting(format!("{} is not a checkpoint folder", path.display())));
    }
    std::fs::remove_dir_all(path).map_err(|e| Error::write(path, e))
}
