//! The run folder around the checkpoints: `runs/<name>/run.json` (typed, versioned [`RunManifest`]),
//! `metrics.jsonl` (every [`TrainEvent`]), and the run list a browser shows. Read and written only here.

use crate::engine::checkpoint::{list_checkpoints, unix_now, write_atomic, write_json, BestCheckpoint, CheckpointInfo};
use crate::engine::train::{TrainConfig, TrainEvent};
use crate::engine::{Error, Result};
use std::path::{Path, PathBuf};

pub const RUN_CONFIG: &str = "run.json";

pub const METRICS: &str = "metrics.jsonl";

/// One run folder reduced to what a run browser shows: its manifest, loss curves from `metrics.jsonl`, how it
/// ended, and its checkpoints.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RunInfo {
    /// The run folder's name: the run's identity (overlay choices and paths use it).
    pub name: String,
    /// The name the user gave the run in run.json (`train::run_label`); None: shown by its folder name.
    #[serde(default)]
    pub label: Option<String>,
    /// The user's free-text note on the run in run.json (`train::run_label::set_run_notes`).
    #[serde(default)]
    pub notes: Option<String>,
    pub dir: PathBuf,
    /// None when run.json is missing or unreadable.
    pub config: Option<TrainConfig>,
    pub started_unix_secs: Option<u64>,
    /// (step, loss).
    pub train_loss: Vec<[f64; 2]>,
    /// (step, validation loss).
    pub val_loss: Vec<[f64; 2]>,
    pub total_steps: Option<usize>,
    pub trainable_params: Option<usize>,
    pub status: RunStatus,
    pub checkpoints: Vec<CheckpointInfo>,
    /// The run's best checkpoint by validation loss, from run.json.
    #[serde(default)]
    pub best_checkpoint: Option<BestCheckpoint>,
}

/// How a run ended, from its metrics.jsonl.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum RunStatus {
    /// No end event: still running elsewhere, or the process died.
    Incomplete,
    Finished,
    /// Stopped by the user (a final checkpoint was saved).
    Stopped,
    Failed {
        message: String,
    },
}

impl RunInfo {
    /// What the run is called where it is shown: the name the user gave it, else its folder name.
    pub fn title(&self) -> &str {
        self.label.as_deref().unwrap_or(&self.name)
    }
}

impl RunStatus {
    /// One word: incomplete, finished, stopped or failed.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Incomplete => "incomplete",
            Self::Finished => "finished",
            Self::Stopped => "stopped",
            Self::Failed { .. } => "failed",
        }
    }
}

/// The label, and for a failure its message ("failed: ...").
impl std::fmt::Display for RunStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Failed { message } => write!(f, "failed: {message}"),
            other => f.write_str(other.label()),
        }
    }
}

/// One resume of a run, as run.json keeps it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ResumeRecord {
    /// The step the run continued from.
    pub step: usize,
    pub checkpoint: PathBuf,
    pub unix_secs: u64,
    /// Each setting that differs from the previous start: "lr: 0.0002 -> 0.001".
    pub changed: Vec<String>,
    /// The resume went on with a base model other than the checkpoint's (`--force-base`).
    #[serde(default)]
    pub forced_base: bool,
}

/// Where a branched run came from (recorded in its run.json; see `train::branch`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BranchOrigin {
    /// The parent run folder.
    pub run: PathBuf,
    /// The checkpoint the branch resumed from.
    pub checkpoint: PathBuf,
    pub step: usize,
}

/// The version [`RunManifest::write`] writes. Files from releases before versioning have no `version` field
/// and read as version 0; their layout is the same.
pub const RUN_MANIFEST_VERSION: u32 = 1;

/// `run.json`: what a run was started with. Read and written only here.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RunManifest {
    #[serde(default)]
    pub version: u32,
    pub name: String,
    pub config: TrainConfig,
    pub model: PathBuf,
    pub dataset: PathBuf,
    #[serde(default)]
    pub started_unix_secs: u64,
    /// The metal-candle release that started the run.
    #[serde(default)]
    pub metal_candle_version: String,
    /// Fingerprint of the base model (`model::fingerprint`); None in runs from before fingerprints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_fingerprint: Option<String>,
    /// Fingerprint of the dataset files (`data::dataset_fingerprint`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dataset_fingerprint: Option<String>,
    /// Every resume, oldest first: what changed. `config`, `model`, `dataset` and the fingerprints above
    /// always describe the latest start.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resumes: Vec<ResumeRecord>,
    /// The run and checkpoint this run branched from (a resume from a checkpoint that later ones followed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branched_from: Option<BranchOrigin>,
    /// The name the user gave the run (the studio's Rename), shown instead of the folder name; renaming
    /// rewrites only this field and never moves the folder (`train::run_label::rename_run`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// The user's free-text note on the run (the checkpoints page's Notes, `runs note`), written only by
    /// `train::run_label::set_run_notes`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notes: Option<String>,
    /// The checkpoint with the lowest validation loss so far (always saved; kept under `save_total_limit`),
    /// updated at each new best by [`RunManifest::record_best`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub best_checkpoint: Option<BestCheckpoint>,
}

impl RunManifest {
    /// The manifest of a run starting now.
    pub fn new(name: &str, config: &TrainConfig) -> Self {
        Self {
            version: RUN_MANIFEST_VERSION,
            name: name.to_string(),
            config: config.clone(),
            model: config.model.clone(),
            dataset: config.data.clone(),
            started_unix_secs: unix_now(),
            metal_candle_version: env!("CARGO_PKG_VERSION").to_string(),
            base_fingerprint: None,
            dataset_fingerprint: None,
            resumes: Vec::new(),
            branched_from: None,
            label: None,
            notes: None,
            best_checkpoint: None,
        }
    }

    /// The run.json of `run_dir`. A manifest from a newer release is refused rather than half read.
    pub fn read(run_dir: &Path) -> Result<Self> {
        let path = run_dir.join(RUN_CONFIG);
        let manifest: Self = crate::engine::error::read_json(&path)?;
        if manifest.version > RUN_MANIFEST_VERSION {
            return Err(Error::Json {
                path,
                message: format!(
                    "version {} was written by a newer metal-candle (this one reads up to {RUN_MANIFEST_VERSION}); \
                     upgrade to open this run",
                    manifest.version
                ),
            });
        }
        Ok(manifest)
    }

    /// The manifest of the run a checkpoint folder belongs to (its parent folder).
    pub fn of_checkpoint(checkpoint: &Path) -> Result<Self> {
        Self::read(&run_dir_of_checkpoint(checkpoint))
    }

    /// The base model this run recorded, refused when it is no longer there (moved or deleted) and the run did not
    /// come from the Hub (a recorded Hub origin finds it again): the error names the recorded path, this run.json,
    /// and `--model`, which points a resume or an export at where the model is now.
    pub fn recorded_model(&self, run_dir: &Path) -> Result<PathBuf> {
        if self.model.exists() || self.config.model_source.is_some() {
            return Ok(self.model.clone());
        }
        let relative = if self.model.is_relative() {
            " (a path relative to the folder the run was started from, which older releases recorded)"
        } else {
            ""
        };
        Err(Error::MissingFile {
            path: self.model.clone(),
            what: format!(
                "the base model recorded in {}{relative} is not there (moved or deleted?); pass --model <path> with \
                 where it is now",
                run_dir.join(RUN_CONFIG).display()
            ),
        })
    }
}

/// The run folder of a checkpoint: its parent, or `.` for a bare `checkpoint-N` named from inside the run
/// folder (whose parent is the empty path).
pub fn run_dir_of_checkpoint(checkpoint: &Path) -> PathBuf {
    match checkpoint.parent().filter(|p| !p.as_os_str().is_empty()) {
        Some(parent) => parent.to_path_buf(),
        None => PathBuf::from("."),
    }
}

/// A checkpoint (or model, or dataset) path made absolute against the working folder, so its run folder and its
/// siblings are found however it was written (`checkpoint-2` from inside the run folder has an empty parent).
pub fn absolute_path(checkpoint: &Path) -> Result<PathBuf> {
    std::path::absolute(checkpoint).map_err(|e| Error::io(checkpoint, e))
}

impl RunManifest {
    /// Write `run_dir/run.json` atomically.
    pub fn write(&self, run_dir: &Path) -> Result<()> {
        write_json(&run_dir.join(RUN_CONFIG), self)
    }

    /// Record `best` as the run's best checkpoint in `run_dir/run.json` (read, changed, written atomically).
    pub fn record_best(run_dir: &Path, best: Option<BestCheckpoint>) -> Result<()> {
        let manifest = Self::read(run_dir)?;
        if manifest.best_checkpoint == best {
            return Ok(());
        }
        Self { best_checkpoint: best, ..manifest }.write(run_dir)
    }
}

/// Longest run name: a folder name, not a sentence.
pub const MAX_RUN_NAME_LEN: usize = 100;

/// The one check of a run name (CLI `--name`, the studio's run name field): a run lives in `out/<name>/`, so
/// the name must be one plain folder name inside `out`: not empty, no path separators, not `.` or `..`, no
/// leading dot (hidden, and the trainer's own `.checkpoint-*.partial` folders), letters, digits, `-`, `_`,
/// `.`, `+`, `=`, `@` and spaces only, at most [`MAX_RUN_NAME_LEN`] characters.
pub fn validate_run_name(name: &str) -> Result<()> {
    let refuse = |why: &str| {
        Err(Error::InvalidSetting(format!(
            "run name {name:?} {why}; use a plain folder name such as `lora-r8` (letters, digits, -, _, ., spaces)"
        )))
    };
    if name.trim().is_empty() {
        return refuse("is empty");
    }
    if name.contains(['/', '\\']) || name == ".." || name.contains("..") {
        return refuse("would write outside the runs folder (it contains a path separator or `..`)");
    }
    if name.starts_with('.') {
        return refuse("starts with a dot");
    }
    if name.chars().count() > MAX_RUN_NAME_LEN {
        return refuse(&format!("is longer than {MAX_RUN_NAME_LEN} characters"));
    }
    let allowed = |c: char| c.is_alphanumeric() || "-_.+=@ ".contains(c);
    if let Some(c) = name.chars().find(|&c| !allowed(c)) {
        return refuse(&format!("contains {c:?}"));
    }
    if name != name.trim() {
        return refuse("starts or ends with a space");
    }
    Ok(())
}

/// Append one event to `metrics.jsonl`.
pub fn append_metric(run_dir: &Path, event: &TrainEvent) -> Result<()> {
    use std::io::Write;
    let path = run_dir.join(METRICS);
    let mut line = serde_json::to_string(event).map_err(|e| Error::write(&path, e))?;
    line.push('\n');
    let mut f =
        std::fs::OpenOptions::new().create(true).append(true).open(&path).map_err(|e| Error::write(&path, e))?;
    // A short write (a full disk) must not leave half an event for the next one to be glued to: cut the file back
    // to where this line began.
    let before = f.metadata().map_err(|e| Error::write(&path, e))?.len();
    f.write_all(line.as_bytes()).map_err(|e| {
        let _ = f.set_len(before);
        Error::write(&path, e)
    })
}

/// Every event in a run's `metrics.jsonl` (unreadable lines are skipped).
pub fn read_metrics(run_dir: &Path) -> Vec<TrainEvent> {
    std::fs::read_to_string(run_dir.join(METRICS))
        .map(|text| text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect())
        .unwrap_or_default()
}

/// On resume: keep only events up to `step`, so the curve continues instead of repeating.
pub fn truncate_metrics(run_dir: &Path, step: usize) -> Result<()> {
    let kept: Vec<String> = read_metrics(run_dir)
        .into_iter()
        .filter(|e| event_step(e).map(|s| s <= step).unwrap_or(true))
        .filter(|e| !matches!(e, TrainEvent::Finished { .. } | TrainEvent::Failed { .. }))
        .filter_map(|e| serde_json::to_string(&e).ok())
        .collect();
    let mut text = kept.join("\n");
    if !text.is_empty() {
        text.push('\n');
    }
    write_atomic(&run_dir.join(METRICS), text.as_bytes())
}

/// The step an event belongs to (None for events without one).
pub fn event_step(e: &TrainEvent) -> Option<usize> {
    match e {
        TrainEvent::Started { start_step, .. } => Some(*start_step),
        TrainEvent::Step { step, .. }
        | TrainEvent::Eval { step, .. }
        | TrainEvent::Samples { step, .. }
        | TrainEvent::CheckpointSaved { step, .. }
        | TrainEvent::CheckpointsRemoved { step, .. }
        | TrainEvent::Paused { step }
        | TrainEvent::Resumed { step }
        | TrainEvent::Finished { step, .. }
        | TrainEvent::Failed { step, .. } => Some(*step),
    }
}

/// All runs under `runs_dir`, newest first. A missing folder is an empty list.
pub fn list_runs(runs_dir: &Path) -> Result<Vec<RunInfo>> {
    let Ok(entries) = std::fs::read_dir(runs_dir) else { return Ok(Vec::new()) };
    let mut runs: Vec<RunInfo> = entries
        .flatten()
        .filter(|e| e.path().join(RUN_CONFIG).exists())
        .map(|e| run_info(e.file_name().to_string_lossy().to_string(), e.path()))
        .collect();
    runs.sort_by(|a, b| b.started_unix_secs.cmp(&a.started_unix_secs).then(a.name.cmp(&b.name)));
    Ok(runs)
}

/// One run folder: its manifest (if readable), curves and end state from `metrics.jsonl`, its checkpoints.
fn run_info(name: String, dir: PathBuf) -> RunInfo {
    let manifest = RunManifest::read(&dir).ok();
    let mut info = RunInfo {
        name,
        label: manifest.as_ref().and_then(|m| m.label.clone()),
        notes: manifest.as_ref().and_then(|m| m.notes.clone()),
        best_checkpoint: manifest.as_ref().and_then(|m| m.best_checkpoint),
        config: manifest.as_ref().map(|m| m.config.clone()),
        started_unix_secs: manifest.map(|m| m.started_unix_secs),
        train_loss: Vec::new(),
        val_loss: Vec::new(),
        total_steps: None,
        trainable_params: None,
        status: RunStatus::Incomplete,
        checkpoints: list_checkpoints(&dir),
        dir,
    };
    for e in read_metrics(&info.dir) {
        match e {
            TrainEvent::Started { total_steps, trainable_params, .. } => {
                info.total_steps = Some(total_steps);
                info.trainable_params = Some(trainable_params);
            }
            TrainEvent::Step { step, loss, .. } => info.train_loss.push([step as f64, loss]),
            TrainEvent::Eval { step, val_loss, .. } => info.val_loss.push([step as f64, val_loss]),
            TrainEvent::Finished { stopped_early, .. } => {
                info.status = if stopped_early { RunStatus::Stopped } else { RunStatus::Finished };
            }
            TrainEvent::Failed { message, .. } => info.status = RunStatus::Failed { message },
            _ => {}
        }
    }
    info
}

#[cfg(test)]
mod tests {
    use super::RunStatus;

    #[test]
    fn run_status_is_a_word_and_a_failure_keeps_its_message() {
        let failed = RunStatus::Failed { message: "the loss became NaN".into() };
        assert_eq!((failed.label(), failed.to_string().as_str()), ("failed", "failed: the loss became NaN"));
        assert_eq!(RunStatus::Stopped.to_string(), "stopped");
        let json = serde_json::to_string(&failed).unwrap();
        assert_eq!(serde_json::from_str::<RunStatus>(&json).unwrap(), failed);
    }
}
