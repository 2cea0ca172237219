//! The one bridge between the engine and its front ends: [`Command`]s go in, [`Event`]s come out.
//!
//! A dispatcher thread owns the shared state (the loaded base model behind an `Arc`, the controls of running
//! jobs) and starts every long job on its own thread, so a chat can stream while a training run continues and
//! both share the same base weights. Front ends never wait on it:
//! - [`Worker::send`] pushes onto an unbounded channel and returns at once;
//! - events arrive on a bounded channel (high-rate token and step events apply back-pressure to the job, not
//!   to the front end), which the front end drains with [`Worker::drain`] under a time budget;
//! - every job wakes the front end through a [`Waker`] after each event it sends;
//! - every job ends with exactly one explicit final event (`…Finished` / `…Failed` / `…Loaded`), and errors,
//!   even panics inside a job, come back as events instead of a dead thread.
//!
//! This module knows nothing of egui: the studio passes a waker that calls `Context::request_repaint`.

mod data_parallel_job;
mod dispatcher;
mod eval_jobs;
mod hub_jobs;
mod jobs;
mod preview_jobs;
mod run_jobs;
mod scan;
mod types;
mod xray_jobs;

pub use preview_jobs::{AdapterCheck, RowsRequest};
pub use scan::{default_hf_cache_dir, scan_models};
pub use types::*;

use dispatcher::Dispatcher;

use crate::engine::bench::LoraMicroResult;
use crate::engine::device::{DTypeChoice, DeviceChoice};
use crate::engine::export::{ExportFormat, GgufQuant};
use crate::engine::model::chat_template::ChatMessage;
use crate::engine::model::{BaseQuant, LoadedModel};
use crate::engine::rank_probe::{ProbePlan, ProbeTiming, RankProbeResult};
use crate::engine::sampler::SamplingParams;
use crate::engine::train::{TrainConfig, TrainControl, TrainEvent};
use crate::engine::{ErrorInfo, ErrorKind};
use crossbeam_channel::{Receiver, Sender};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Called by worker threads after they send an event, to wake the front end (e.g. request a repaint).
pub type Waker = Arc<dyn Fn() + Send + Sync>;

/// How many events may wait unread before a job blocks on sending the next one.
pub const EVENT_CAPACITY: usize = 4096;

/// What the front end asks the worker to do.
#[derive(Debug, Clone)]
pub enum Command {
    /// Load a model folder or GGUF file; it becomes the shared base model.
    LoadModel {
        path: PathBuf,
        device: DeviceChoice,
        dtype: DTypeChoice,
        /// How the base's projections are held (dense, or quantized: QLoRA).
        quantize: BaseQuant,
    },
    /// Validate a dataset file or folder; with a loaded model, also tokenize it for statistics and a preview.
    InspectDataset {
        path: PathBuf,
        /// The format and column mapping to read it with (auto-detection by default).
        read: crate::engine::data::ReadOptions,
        max_seq_len: usize,
        train_on_prompt: bool,
        preview_rows: usize,
    },
    /// A page of a dataset's rows, searched and rendered with the loaded model's template when there is one.
    BrowseRows(Box<RowsRequest>),
    /// Check that a folder holds a PEFT adapter that fits the loaded model (the chat's "Load adapter…").
    CheckAdapter {
        path: PathBuf,
    },
    /// Look for models in the Hugging Face cache and in `extra_dirs`.
    ScanModels {
        hf_cache: Option<PathBuf>,
        extra_dirs: Vec<PathBuf>,
    },
    /// Train on the loaded base model (its path must match `config.model`).
    StartTraining(Box<TrainConfig>),
    /// Train on `gpus` GPUs of this host, one process of `program` (this binary) each, data-parallel; the loaded
    /// base model must match `config.model` (its settings are checked against it first).
    StartTrainingOnGpus {
        config: Box<TrainConfig>,
        gpus: usize,
        program: PathBuf,
    },
    PauseTraining(bool),
    StopTraining,
    /// Stream a reply; `adapter` applies a checkpoint to a clone of the base model that shares its weights.
    Generate(GenerateJob),
    CancelGeneration {
        id: u64,
    },
    /// Gather the system report (`engine::doctor`) for the Help window.
    Diagnose,
    /// Read every run folder under `runs_dir`.
    ListRuns {
        runs_dir: PathBuf,
    },
    DeleteCheckpoint {
        path: PathBuf,
    },
    /// Give a run a human name in its run.json (`run_label::rename_run`); the folder stays as it is.
    RenameRun {
        run_dir: PathBuf,
        label: String,
    },
    /// Store a run's free-text note in its run.json (`run_label::set_run_notes`; empty clears it).
    SetRunNotes {
        run_dir: PathBuf,
        notes: String,
    },
    /// Say what deleting a run would remove, or why it is refused (`run_delete::plan_run_delete`).
    PlanRunDelete {
        runs_dir: PathBuf,
        run_dir: PathBuf,
    },
    /// Delete a run folder inside `runs_dir` (`run_delete::delete_run`: refused while it trains).
    DeleteRun {
        runs_dir: PathBuf,
        run_dir: PathBuf,
    },
    ExportCheckpoint {
        checkpoint: PathBuf,
        format: ExportFormat,
        /// The quantization of gguf and ollama exports.
        quant: GgufQuant,
        out: PathBuf,
        base_model: PathBuf,
        /// Replace an existing output.
        overwrite: bool,
    },
    /// Equal-budget probe trainings at each rank.
    RankProbe {
        config: Box<TrainConfig>,
        ranks: Vec<usize>,
        token_budget: usize,
    },
    /// Time one probe step and one validation batch at `rank` on `config`'s data: the sweep's time estimate
    /// before it runs. Shares the probe's slot (one at a time) and `StopRankProbe`.
    CalibrateRankProbe {
        config: Box<TrainConfig>,
        rank: usize,
    },
    StopRankProbe,
    /// The LoRA layer micro-benchmark on the loaded model's device (the CPU when none is loaded).
    LoraMicroBench {
        repeats: usize,
    },
    /// Search the Hub for models or datasets.
    HubSearch {
        settings: crate::engine::hub::HubSettings,
        kind: crate::engine::hub::RepoKind,
        query: String,
    },
    /// Fetch a repo id (`ORG/NAME[@REV][:QUANT]`) into the cache, or find it there; one download at a time.
    HubDownload {
        settings: crate::engine::hub::HubSettings,
        kind: crate::engine::hub::RepoKind,
        spec: String,
    },
    /// Stop the running download; what arrived stays for a resume.
    CancelHubDownload,
    /// Score the base, adapters or checkpoints on a dataset (`engine::eval`); one evaluation at a time, on the
    /// loaded base model.
    Evaluate(Box<crate::engine::eval::EvalSpec>),
    /// Stop the running evaluation (it ends with `EvalFailed { cancelled: true }`).
    CancelEvaluation,
    /// The adapter X-ray of a checkpoint or adapter folder (`engine::xray`), against the base its run recorded.
    XrayCheckpoint {
        checkpoint: PathBuf,
    },
}

/// Which column of the chat a generation belongs to. Each column answers with the base model or any
/// checkpoint (its [`GenerateJob::adapter`]): the left one is the base model unless side by side picks a
/// checkpoint for it, the right one is the chat's adapter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize)]
pub enum ChatSide {
    Left,
    #[default]
    Right,
}

/// One chat generation request.
#[derive(Debug, Clone)]
pub struct GenerateJob {
    /// Chosen by the front end; every event of this generation carries it.
    pub id: u64,
    pub side: ChatSide,
    /// A checkpoint (or PEFT adapter) folder to apply, on either side, or None for the base model.
    pub adapter: Option<PathBuf>,
    pub messages: Vec<ChatMessage>,
    pub sampling: SamplingParams,
    pub max_new_tokens: usize,
}

/// What the worker reports. Failures carry an [`ErrorInfo`]: the engine error's kind and its full message,
/// which front ends show as is. A training run's failure is its `TrainEvent::Failed` (with the same kind).
#[derive(Debug, Clone)]
pub enum Event {
    /// The system report asked for by [`Command::Diagnose`], as text.
    Diagnosis {
        text: String,
    },
    ModelLoading {
        path: PathBuf,
    },
    /// How far the load of `path` is (bytes of the weights read, time so far), about ten times a second.
    ModelLoadProgress {
        path: PathBuf,
        progress: crate::engine::model::LoadProgress,
    },
    ModelLoaded(Box<ModelSummary>),
    ModelLoadFailed {
        path: PathBuf,
        error: ErrorInfo,
    },
    DatasetInspected(Box<DatasetReport>),
    DatasetFailed {
        path: PathBuf,
        error: ErrorInfo,
    },
    /// The page of rows asked for by [`Command::BrowseRows`] with the same `id`.
    DatasetRows {
        id: u64,
        page: Box<crate::engine::data::RowPage>,
    },
    DatasetRowsFailed {
        id: u64,
        path: PathBuf,
        error: ErrorInfo,
    },
    /// The folder holds an adapter that fits the loaded model.
    AdapterChecked {
        path: PathBuf,
        check: Box<AdapterCheck>,
    },
    /// The folder is not an adapter, or not one for the loaded model; the message says which and why.
    AdapterCheckFailed {
        path: PathBuf,
        error: ErrorInfo,
    },
    ModelsFound(Vec<FoundModel>),
    /// A training run's own events, `Finished` or `Failed` last.
    Train(TrainEvent),
    GenerationStarted {
        id: u64,
        prompt_tokens: usize,
        /// Set when the adapter was trained on another base model than the loaded one
        /// (`checkpoint::base_mismatch`); the chat pane shows it above the reply.
        adapter_warning: Option<String>,
        /// Set when the model has no chat template and the chat is written in the plain fallback format
        /// (`data::chat_prompt`, as `generate --chat` says it); shown above the reply too.
        template_warning: Option<String>,
    },
    Token {
        id: u64,
        text: String,
    },
    GenerationFinished {
        id: u64,
        stats: GenerationStats,
    },
    GenerationFailed {
        id: u64,
        error: ErrorInfo,
    },
    Runs {
        runs_dir: PathBuf,
        runs: Vec<RunInfo>,
    },
    RunsFailed {
        runs_dir: PathBuf,
        error: ErrorInfo,
    },
    CheckpointDeleted {
        path: PathBuf,
    },
    /// A run got a new name (as stored: trimmed).
    RunRenamed {
        run_dir: PathBuf,
        label: String,
    },
    /// A run's note was stored (trimmed; None: cleared).
    RunNotesSaved {
        run_dir: PathBuf,
        notes: Option<String>,
    },
    /// What deleting a run would remove (for the confirmation).
    RunDeletePlanned(crate::engine::train::run_delete::RunDeletePlan),
    /// A run folder was deleted.
    RunDeleted(crate::engine::train::run_delete::RunDeletePlan),
    /// An export wrote `done` of `total` tensors; `what` is the one being written now.
    ExportProgress {
        done: usize,
        total: usize,
        what: String,
    },
    ExportFinished {
        path: PathBuf,
        size_bytes: u64,
    },
    /// The template and end-of-sequence doctor's warnings about an export, sent before it writes.
    ExportWarnings {
        warnings: Vec<String>,
    },
    /// A delete, rename or export that failed.
    ActionFailed {
        what: String,
        error: ErrorInfo,
    },
    RankProbeResult(RankProbeResult),
    RankProbeFinished {
        results: Vec<RankProbeResult>,
    },
    RankProbeFailed {
        error: ErrorInfo,
    },
    /// A probe's plan on the dataset and its measured parts, from `CalibrateRankProbe`.
    RankProbeCalibrated {
        plan: ProbePlan,
        timing: ProbeTiming,
    },
    RankCalibrationFailed {
        error: ErrorInfo,
    },
    MicroBenchFinished(Vec<LoraMicroResult>),
    MicroBenchFailed {
        error: ErrorInfo,
    },
    HubSearchResults {
        kind: crate::engine::hub::RepoKind,
        query: String,
        hits: Vec<crate::engine::hub::SearchHit>,
    },
    HubSearchFailed {
        kind: crate::engine::hub::RepoKind,
        query: String,
        error: ErrorInfo,
    },
    /// How far the download of `spec` is, about ten times a second.
    HubDownloadProgress {
        spec: String,
        progress: crate::engine::hub::DownloadProgress,
    },
    /// `spec` is in the cache at `path` (a snapshot folder, or the chosen GGUF file).
    HubDownloadFinished {
        spec: String,
        kind: crate::engine::hub::RepoKind,
        path: PathBuf,
        origin: Option<crate::engine::hub::HubOrigin>,
        /// Why the cache was used without the network, if so.
        note: Option<String>,
    },
    HubDownloadFailed {
        spec: String,
        kind: crate::engine::hub::RepoKind,
        error: ErrorInfo,
        /// Stopped by the user: what arrived is kept and a new download resumes it.
        cancelled: bool,
    },
    /// An evaluation's progress: started (rows, targets), rows done, a target's result.
    Eval(crate::engine::eval::EvalEvent),
    EvalFinished(Box<crate::engine::eval::EvalReport>),
    EvalFailed {
        error: ErrorInfo,
        /// Stopped by the user.
        cancelled: bool,
    },
    /// The X-ray asked for by [`Command::XrayCheckpoint`]; it or `XrayFailed` ends the job.
    XrayReady(Box<crate::engine::xray::XrayReport>),
    XrayFailed {
        checkpoint: PathBuf,
        error: ErrorInfo,
    },
}

/// Messages the dispatcher reads: front-end commands plus notes from its own job threads.
enum Msg {
    Command(Command),
    ModelReady { path: PathBuf, model: Arc<LoadedModel> },
    TrainingEnded,
    ProbeEnded,
    GenerationEnded { id: u64 },
    DownloadEnded,
    EvaluationEnded,
    Shutdown,
}

/// The front end's handle: cheap to call, never blocks.
pub struct Worker {
    commands: Sender<Msg>,
    events: Receiver<Event>,
}

impl Worker {
    /// Start the dispatcher thread.
    pub fn spawn(waker: Waker) -> Self {
        let (cmd_tx, cmd_rx) = crossbeam_channel::unbounded();
        let (ev_tx, ev_rx) = crossbeam_channel::bounded(EVENT_CAPACITY);
        let out = Outbox { events: ev_tx, waker };
        let dispatcher = Dispatcher {
            inbox: cmd_tx.clone(),
            out,
            model: None,
            training: None,
            probe: Default::default(),
            generations: HashMap::new(),
            download: None,
            evaluation: None,
            rows: Default::default(),
        };
        let spawned = std::thread::Builder::new().name("mc-dispatcher".into()).spawn(move || dispatcher.run(cmd_rx));
        if let Err(e) = spawned {
            // Without a dispatcher every command is answered by nobody; say so once.
            eprintln!("metal-candle: cannot start the worker thread: {e}");
        }
        Self { commands: cmd_tx, events: ev_rx }
    }

    /// Queue a command. Never blocks.
    pub fn send(&self, command: Command) {
        let _ = self.commands.send(Msg::Command(command));
    }

    /// The next event, if one is waiting.
    pub fn try_recv(&self) -> Option<Event> {
        self.events.try_recv().ok()
    }

    /// Hand waiting events to `handle` until none are left, `max_events` were handled or `budget` is spent.
    /// Returns whether events are still waiting (the caller should come back next frame).
    pub fn drain(&self, budget: Duration, max_events: usize, mut handle: impl FnMut(Event)) -> bool {
        let started = Instant::now();
        let mut handled = 0;
        while handled < max_events && started.elapsed() < budget {
            match self.events.try_recv() {
                Ok(event) => {
                    handle(event);
                    handled += 1;
                }
                Err(_) => return false,
            }
        }
        !self.events.is_empty()
    }

    /// Events waiting to be drained.
    pub fn pending_events(&self) -> usize {
        self.events.len()
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        // The dispatcher stops running jobs; nobody waits for them (they end at their next check).
        let _ = self.commands.send(Msg::Shutdown);
    }
}

/// The sending side of the event channel plus the waker; cloned into every job.
#[derive(Clone)]
pub(crate) struct Outbox {
    events: Sender<Event>,
    waker: Waker,
}

impl Outbox {
    /// Send an event and wake the front end. Blocks only while the channel is full (back-pressure on a job);
    /// returns false when the front end is gone, so the job can stop.
    pub(crate) fn send(&self, event: Event) -> bool {
        let delivered = self.events.send(event).is_ok();
        (self.waker)();
        delivered
    }
}

/// Whether two paths name the same file or folder (after resolving `.`/`..` and links when possible).
pub fn same_path(a: &std::path::Path, b: &std::path::Path) -> bool {
    if a == b {
        return true;
    }
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

/// Whether two paths name the same place, without touching the filesystem (cheap enough for every frame):
/// equal, or one is a relative tail of the other (typed relative to the working directory vs. absolute).
pub fn paths_match(a: &std::path::Path, b: &std::path::Path) -> bool {
    a == b || (a.is_relative() && b.ends_with(a)) || (b.is_relative() && a.ends_with(b))
}

#[cfg(test)]
mod tests {
    use super::dispatcher::spawn_job;
    use super::*;

    #[test]
    fn paths_match_relative_tails() {
        use std::path::Path;
        assert!(paths_match(Path::new("/w/models/m.gguf"), Path::new("models/m.gguf")));
        assert!(!paths_match(Path::new("/w/models/m.gguf"), Path::new("other/m.gguf")));
    }

    fn worker() -> Worker {
        Worker::spawn(Arc::new(|| {}))
    }

    fn next_event(w: &Worker) -> Event {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(e) = w.try_recv() {
                return e;
            }
            assert!(Instant::now() < deadline, "no event within 30 s");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn a_missing_model_fails_with_an_event() {
        let w = worker();
        w.send(Command::LoadModel {
            path: "/nonexistent/model".into(),
            device: DeviceChoice::Cpu,
            dtype: DTypeChoice::Auto,
            quantize: BaseQuant::None,
        });
        assert!(matches!(next_event(&w), Event::ModelLoading { .. }));
        match next_event(&w) {
            Event::ModelLoadFailed { error, .. } => {
                assert!(error.message.contains("/nonexistent/model"), "{error}");
                assert_eq!(error.kind, ErrorKind::MissingFile);
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn training_without_a_model_fails_with_an_event() {
        let w = worker();
        let config = TrainConfig { model: "/nonexistent".into(), ..Default::default() };
        w.send(Command::StartTraining(Box::new(config)));
        match next_event(&w) {
            Event::Train(TrainEvent::Failed { message, .. }) => {
                assert!(message.contains("load the model"), "{message}")
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn generation_without_a_model_fails_with_an_event() {
        let w = worker();
        w.send(Command::Generate(GenerateJob {
            id: 7,
            side: ChatSide::Left,
            adapter: None,
            messages: vec![ChatMessage::new("user", "hi")],
            sampling: SamplingParams::greedy(),
            max_new_tokens: 4,
        }));
        assert!(matches!(next_event(&w), Event::GenerationFailed { id: 7, .. }));
    }

    #[test]
    fn a_panicking_job_reports_instead_of_dying() {
        let (tx, rx) = crossbeam_channel::bounded(4);
        let out = Outbox { events: tx, waker: Arc::new(|| {}) };
        spawn_job("t", out, |error| Event::MicroBenchFailed { error }, || panic!("boom"));
        match rx.recv_timeout(Duration::from_secs(10)) {
            Ok(Event::MicroBenchFailed { error }) => {
                assert!(error.message.contains("boom"));
                assert_eq!(error.kind, ErrorKind::Internal);
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn display_names_of_cache_snapshots_use_the_repo() {
        let p = std::path::Path::new("/h/hub/models--HuggingFaceTB--SmolLM2-135M/snapshots/abc");
        assert_eq!(display_name(p), "HuggingFaceTB/SmolLM2-135M");
        assert_eq!(display_name(std::path::Path::new("/m/x.gguf")), "x.gguf");
    }
}
