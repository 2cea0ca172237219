//! The studio app: persisted preferences, the worker handle, event routing, navigation and the frame around
//! the pages. Each frame drains the worker's events under a small time budget (the UI never waits on the
//! worker), runs the current page, then carries out the actions the pages asked for.

use super::chat_panel::ChatPanel;
use super::checkpoints_panel::CheckpointsPanel;
use super::dataset_panel::{DatasetPanel, InspectKey};
use super::eval_page::{EvalInputs, EvalPage, EvalRequest};
use super::model_panel::ModelPanel;
use super::rank_panel::RankPanel;
use super::settings_panel::{ready_config, SettingsPanel};
use super::training_panel::TrainingPanel;
use super::widgets::{self, palette, Tone};
use crate::engine::hub::RepoKind;
use crate::engine::train::TrainConfig;
use crate::worker::{display_name, Command, Worker};
use egui::{RichText, Ui};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod chrome;
mod close_guard;
mod dropped_path;
mod events;
mod frame_stats;
mod hub_flow;

pub use super::hub_status::{DownloadState, FailedDownload, HubStatus};
pub use super::panel_ctx::{Action, ModelStatus, PanelCtx};
pub use super::prefs::remember;
pub use super::prefs::{studio_train_defaults, ChatPrefs, Page, Prefs, RankPrefs, CHAT_REPETITION_PENALTY};
pub use close_guard::{close_without_asking, CloseGuard};
use dropped_path::first_gguf;
pub use dropped_path::{classify_drop, Dropped};
pub use frame_stats::FrameStats;

/// Key of the persisted preferences in eframe's storage.
pub const STORAGE_KEY: &str = "metal-candle-studio";
/// Time the UI spends draining worker events per frame before it draws (and asks for another frame).
pub const DRAIN_BUDGET: Duration = Duration::from_millis(4);
/// Events handled per frame at most.
pub const DRAIN_MAX_EVENTS: usize = 5000;
/// How the studio was opened (command-line flags and test setups).
#[derive(Debug, Clone, Default)]
pub struct StudioOptions {
    /// Open this model (overrides the remembered one).
    pub model: Option<PathBuf>,
    /// Open this dataset.
    pub data: Option<PathBuf>,
    /// Use this runs folder.
    pub runs_dir: Option<PathBuf>,
    /// Show this page first.
    pub page: Option<Page>,
    /// On a first launch, pick up models/smollm2/*.gguf and assets/sample-chat when present.
    pub discover_defaults: bool,
    /// Start training as soon as the model and the dataset are ready.
    pub start_training: bool,
    /// Measure frame times for this many seconds once training streams, write the report, then close.
    pub measure_frames_secs: Option<f64>,
    /// Where the frame-time report goes (stdout when None).
    pub measure_out: Option<PathBuf>,
    /// Remember preferences between launches.
    pub persist: bool,
    /// Hub settings (endpoint, cache, token); None: from the environment, as `huggingface_hub` reads it.
    pub hub: Option<crate::engine::hub::HubSettings>,
    /// How many CUDA GPUs to offer runs on; None: as many as this machine has.
    pub gpus_on_host: Option<usize>,
    /// The program a multi-GPU run starts once per GPU; None: this one (the studio is the CLI too).
    pub rank_program: Option<PathBuf>,
}

/// A short message in the corner.
struct Toast {
    tone: Tone,
    text: String,
    shown: Instant,
}

pub struct StudioApp {
    pub prefs: Prefs,
    worker: Worker,
    /// The Help window: quick start, glossary, shortcuts and the system report (`metal-candle doctor`).
    help: chrome::HelpWindow,
    pub close_guard: CloseGuard,
    pub model: ModelStatus,
    pub hub: HubStatus,
    pub model_panel: ModelPanel,
    pub dataset_panel: DatasetPanel,
    pub settings_panel: SettingsPanel,
    pub training_panel: TrainingPanel,
    pub checkpoints_panel: CheckpointsPanel,
    pub chat_panel: ChatPanel,
    pub rank_panel: RankPanel,
    pub eval_page: EvalPage,
    actions: Vec<Action>,
    toasts: Vec<Toast>,
    pub options: StudioOptions,
    pub frames: FrameStats,
    autostart_pending: bool,
    measurement_done: bool,
    last_drain_ms: f32,
    last_drained: usize,
}

impl StudioApp {
    /// Build the app on `ctx` (the worker wakes it with `request_repaint`).
    pub fn new(ctx: &egui::Context, mut prefs: Prefs, options: StudioOptions) -> Self {
        apply_style(ctx);
        let repaint = ctx.clone();
        let worker = Worker::spawn(Arc::new(move || repaint.request_repaint()));
        // A resume is a one-off request, not a setting to carry into the next launch.
        prefs.train.resume = None;
        prefs.gpus_on_host = options.gpus_on_host.unwrap_or_else(crate::engine::device::cuda_device_count);
        let mut app = Self {
            prefs,
            worker,
            help: chrome::HelpWindow::default(),
            close_guard: CloseGuard::default(),
            model: ModelStatus::default(),
            hub: HubStatus::new(
                options
                    .hub
                    .clone()
                    .unwrap_or_else(|| crate::engine::hub::HubSettings::from_env(|name| std::env::var(name).ok())),
            ),
            model_panel: ModelPanel::default(),
            dataset_panel: DatasetPanel::default(),
            settings_panel: SettingsPanel::default(),
            training_panel: TrainingPanel::default(),
            checkpoints_panel: CheckpointsPanel::default(),
            chat_panel: ChatPanel::default(),
            rank_panel: RankPanel::default(),
            eval_page: EvalPage::default(),
            actions: Vec::new(),
            toasts: Vec::new(),
            autostart_pending: options.start_training,
            options,
            frames: FrameStats::default(),
            measurement_done: false,
            last_drain_ms: 0.0,
            last_drained: 0,
        };
        app.apply_options();
        app
    }

    /// The command that starts `config`: in this process, or on the Train page's GPU count (one process per GPU;
    /// a count saved on a bigger machine comes down to this one's, as the count itself does when shown), refused
    /// here when the method cannot run that way.
    fn start_command(&self, config: crate::engine::train::TrainConfig) -> Result<Command, String> {
        let gpus = self.prefs.gpus.min(self.prefs.gpus_on_host.max(1));
        if gpus <= 1 {
            return Ok(Command::StartTraining(Box::new(config)));
        }
        crate::engine::train::require_data_parallel_method(&config).map_err(|e| e.to_string())?;
        let program = match &self.options.rank_program {
            Some(program) => program.clone(),
            None => std::env::current_exe()
                .map_err(|e| format!("cannot find this program to start the GPUs' processes: {e}"))?,
        };
        Ok(Command::StartTrainingOnGpus { config: Box::new(config), gpus, program })
    }

    fn apply_options(&mut self) {
        let o = self.options.clone();
        if let Some(dir) = &o.runs_dir {
            self.prefs.train.out = dir.clone();
        }
        if let Some(page) = o.page {
            self.prefs.page = page;
        }
        if o.discover_defaults {
            if self.prefs.model_path.trim().is_empty() && o.model.is_none() {
                if let Some(gguf) = first_gguf(Path::new("models/smollm2")) {
                    self.prefs.model_path = gguf.display().to_string();
                }
            }
            if self.prefs.dataset.is_none() && o.data.is_none() && Path::new("assets/sample-chat/train.jsonl").is_file()
            {
                self.actions.push(Action::OpenDataset(PathBuf::from("assets/sample-chat")));
            }
        }
        match &o.model {
            Some(m) => self.actions.push(Action::LoadModel(m.clone())),
            None => {
                let remembered = PathBuf::from(self.prefs.model_path.trim());
                if self.prefs.auto_load_model && !self.prefs.model_path.trim().is_empty() && remembered.exists() {
                    self.actions.push(Action::LoadModel(remembered));
                }
            }
        }
        // The chat's adapter picker and the navigation's run count need the run list from the start.
        self.actions.push(Action::RefreshRuns);
        if let Some(d) = &o.data {
            self.actions.push(Action::OpenDataset(d.clone()));
        } else if let Some(d) = self.prefs.dataset.clone() {
            if d.exists() {
                self.actions.push(Action::OpenDataset(d));
            }
        }
    }

    /// Drain worker events (time-boxed), then carry out queued actions. Safe to call more than once a frame.
    pub fn pump(&mut self, ctx: &egui::Context) {
        let started = Instant::now();
        let mut events = Vec::new();
        let more = self.worker.drain(DRAIN_BUDGET, DRAIN_MAX_EVENTS, |e| events.push(e));
        let drained = events.len();
        for e in events {
            self.handle_event(e);
        }
        if more {
            ctx.request_repaint();
        }
        self.last_drain_ms += started.elapsed().as_secs_f32() * 1e3;
        self.last_drained += drained;
        self.after_events();
        self.run_actions();
    }

    /// Follow-ups that depend on the state events left behind.
    fn after_events(&mut self) {
        let read = self.prefs.train.read_options();
        let key = self.prefs.dataset.clone().map(|path| InspectKey {
            path,
            read,
            max_seq_len: self.prefs.train.seq_len,
            train_on_prompt: self.prefs.train.train_on_prompt,
            model: self.model.loaded.as_ref().map(|m| m.path.clone()),
        });
        // While a model is loading, wait: the inspection would have to be redone with its tokenizer.
        if self.model.loading.is_none() {
            self.dataset_panel.refresh_if_stale(key, &mut self.actions);
        }
        if self.autostart_pending && self.model.loaded.is_some() && !self.dataset_panel.is_inspecting() {
            let ready = ready_config(&self.prefs, self.model.loaded.as_ref(), self.prefs.dataset.as_ref());
            if ready.is_ok() && self.dataset_panel.report.is_some() {
                self.autostart_pending = false;
                self.actions.push(Action::StartTraining);
                self.prefs.page = Page::Training;
            }
        }
    }

    fn run_actions(&mut self) {
        // Actions may queue more actions (a refresh sends a command); a bound keeps a bug from spinning.
        for _ in 0..8 {
            if self.actions.is_empty() {
                break;
            }
            for action in std::mem::take(&mut self.actions) {
                self.run_action(action);
            }
        }
    }

    fn run_action(&mut self, action: Action) {
        match action {
            Action::Send(c) => self.worker.send(c),
            Action::Goto(p) => self.prefs.page = p,
            Action::LoadModel(path) if is_repo_id(&path) => {
                self.actions.push(Action::Download { spec: path.display().to_string(), kind: RepoKind::Model })
            }
            Action::OpenDataset(path) if is_repo_id(&path) => {
                self.actions.push(Action::Download { spec: path.display().to_string(), kind: RepoKind::Dataset })
            }
            a @ (Action::Download { .. } | Action::CancelDownload | Action::SaveToken(_)) => self.run_hub_action(a),
            Action::LoadModel(path) => {
                self.prefs.model_path = path.display().to_string();
                self.model.loading = Some((path.clone(), Instant::now()));
                self.model.error = None;
                self.worker.send(Command::LoadModel {
                    path,
                    device: self.prefs.device,
                    dtype: self.prefs.dtype,
                    quantize: self.prefs.quantize,
                });
            }
            Action::OpenDataset(path) => {
                if self.prefs.dataset.as_ref().is_some_and(|d| !crate::worker::same_path(d, &path)) {
                    // A format and column mapping belong to the dataset they were picked for.
                    self.prefs.train.data_format = Default::default();
                    self.prefs.train.data_columns = Default::default();
                }
                self.prefs.dataset_input = path.display().to_string();
                remember(&mut self.prefs.recent_datasets, &path);
                self.dataset_panel.invalidate(&path);
                self.prefs.dataset = Some(path);
            }
            Action::StartTraining => {
                let report = self.dataset_panel.report.as_ref();
                let ready = ready_config(&self.prefs, self.model.loaded.as_ref(), self.prefs.dataset.as_ref());
                // A method that does not fit the data (SFT on pairs, DPO on chat rows) is refused in the engine's words.
                match ready.and_then(|cfg| super::method_settings::fits_data(cfg, report)) {
                    Ok(mut config) => {
                        // Runs on Hub models and datasets record where they came from (run.json, PEFT's base).
                        config.model_source = self.hub.origin_of(RepoKind::Model, &config.model);
                        config.data_source = self.hub.origin_of(RepoKind::Dataset, &config.data);
                        match self.start_command(config) {
                            Ok(command) => {
                                if let Command::StartTraining(config) | Command::StartTrainingOnGpus { config, .. } =
                                    &command
                                {
                                    self.training_panel.on_start_requested(config);
                                }
                                self.worker.send(command);
                                // A resume happens once; the next Start begins a fresh run.
                                self.prefs.train.resume = None;
                            }
                            Err(reason) => self.toast(Tone::Warn, reason),
                        }
                    }
                    Err(reason) => self.toast(Tone::Warn, reason),
                }
            }
            Action::RefreshRuns => {
                let dir = self.prefs.train.out.clone();
                self.checkpoints_panel.request_refresh(&dir, &mut self.actions);
            }
            Action::OpenInChat { checkpoint, base_model } => {
                let load = self.chat_panel.open_checkpoint(checkpoint, base_model, &self.model, &mut self.prefs);
                self.actions.extend(load);
            }
            Action::ResumeFrom { checkpoint, config } => {
                if let Some(c) = config {
                    let out = self.prefs.train.out.clone();
                    let loaded_matches =
                        self.model.loaded.as_ref().is_some_and(|m| crate::worker::same_path(&m.path, &c.model));
                    if !loaded_matches && c.model.exists() {
                        self.actions.push(Action::LoadModel(c.model.clone()));
                    }
                    if self.prefs.dataset.as_ref().is_none_or(|d| !crate::worker::same_path(d, &c.data))
                        && c.data.exists()
                    {
                        self.actions.push(Action::OpenDataset(c.data.clone()));
                    }
                    self.prefs.train = TrainConfig { out, ..*c };
                }
                self.prefs.train.resume = Some(checkpoint.clone());
                self.prefs.page = Page::Training;
                self.toast(Tone::Info, format!("Ready to resume from {}: press Resume training", checkpoint.display()));
            }
            Action::UseRank(probed) => {
                let note = super::rank_panel::apply_probed_rank(&mut self.prefs.train.lora, &probed);
                self.toast(Tone::Ok, note);
            }
        }
    }

    pub(super) fn toast(&mut self, tone: Tone, text: impl Into<String>) {
        self.toasts.push(Toast { tone, text: text.into(), shown: Instant::now() });
        if self.toasts.len() > 4 {
            self.toasts.remove(0);
        }
    }

    /// The whole window: top bar, navigation, status bar, the current page.
    pub fn ui_root(&mut self, ui: &mut Ui) {
        let frame_started = Instant::now();
        let ctx = ui.ctx().clone();
        self.pump(&ctx);
        self.handle_dropped_files(&ctx);

        egui::Panel::top("top-bar")
            .frame(egui::Frame::side_top_panel(ui.style()).inner_margin(egui::Margin::symmetric(12, 8)))
            .show(ui, |ui| {
                self.top_bar_ui(ui);
            });
        egui::Panel::bottom("status-bar").show(ui, |ui| self.status_bar_ui(ui));
        egui::Panel::left("nav").resizable(false).exact_size(178.0).show(ui, |ui| self.nav_ui(ui));
        egui::CentralPanel::default()
            .frame(egui::Frame::central_panel(ui.style()).inner_margin(egui::Margin::same(14)))
            .show(ui, |ui| {
                self.page_ui(ui);
            });
        self.help_window_ui(&ctx);
        self.close_guard_ui(&ctx);
        self.toasts_ui(&ctx);
        self.drop_overlay_ui(&ctx);
        self.run_actions();

        let ui_ms = frame_started.elapsed().as_secs_f32() * 1e3;
        let pending = self.worker.pending_events();
        self.frames.record(
            ui_ms,
            std::mem::take(&mut self.last_drain_ms),
            std::mem::take(&mut self.last_drained),
            pending,
        );
        self.measurement_tick(&ctx);
        // Time-based text (spinners, "loading 3.2 s") needs a slow tick even when no event arrives.
        if self.model.loading.is_some()
            || self.hub.download.is_some()
            || self.training_panel.is_active()
            || self.chat_panel.is_generating()
        {
            ctx.request_repaint_after(Duration::from_millis(500));
        }
    }

    fn page_ui(&mut self, ui: &mut Ui) {
        let checkpoints = self.checkpoints_panel.all_checkpoints();
        let checkpoints: Vec<(String, crate::worker::CheckpointInfo)> =
            checkpoints.into_iter().map(|(r, c)| (r, c.clone())).collect();
        let refs: Vec<(String, &crate::worker::CheckpointInfo)> =
            checkpoints.iter().map(|(r, c)| (r.clone(), c)).collect();
        let dataset = self.prefs.dataset.clone();
        let report = dataset.as_deref().and_then(|d| self.dataset_panel.report_for(d)).cloned();
        let mut ctx = PanelCtx {
            prefs: &mut self.prefs,
            model: &self.model,
            dataset: report.as_ref(),
            hub: &self.hub,
            training_active: self.training_panel.is_active(),
            active_run: self
                .training_panel
                .run
                .as_ref()
                .and_then(|r| r.run_dir.clone())
                .filter(|_| self.training_panel.is_active()),
            actions: &mut self.actions,
        };
        match ctx.prefs.page {
            Page::Model => self.model_panel.ui(ui, &mut ctx),
            Page::Dataset => self.dataset_panel.ui(ui, &mut ctx),
            Page::Settings => self.settings_panel.ui(ui, &mut ctx),
            Page::Training => self.training_panel.ui(ui, &mut ctx),
            Page::Checkpoints => self.checkpoints_panel.ui(ui, &mut ctx),
            Page::Evaluate => {
                let runs_dir = ctx.prefs.train.out.clone();
                let inputs = EvalInputs {
                    model: ctx.model.loaded.as_ref(),
                    model_loading: ctx.model.loading.is_some(),
                    dataset: ctx.dataset,
                    train: &ctx.prefs.train,
                    runs_dir: &runs_dir,
                };
                for request in self.eval_page.ui(ui, &mut ctx.prefs.eval, &inputs) {
                    ctx.actions.push(match request {
                        EvalRequest::Send(c) => Action::Send(c),
                        EvalRequest::RefreshRuns => Action::RefreshRuns,
                        EvalRequest::ShowModelPage => Action::Goto(Page::Model),
                        EvalRequest::ShowDatasetPage => Action::Goto(Page::Dataset),
                    });
                }
            }
            Page::Chat => self.chat_panel.ui(ui, &mut ctx, &refs),
            Page::Ranks => self.rank_panel.ui(ui, &mut ctx),
        }
    }

    /// Ask running jobs to stop (training saves its last step) and wait for them, up to `limit`: the
    /// window's exit path. A job still inside the engine when the process exits would run on while C
    /// libraries' exit handlers free what it uses (OpenBLAS releases its buffers in `gotoblas_quit`).
    /// Returns whether every job stopped in time.
    pub fn stop_jobs_and_wait(&mut self, limit: Duration) -> bool {
        self.worker.send(Command::StopTraining);
        self.worker.send(Command::StopRankProbe);
        self.worker.send(Command::CancelEvaluation);
        let deadline = Instant::now() + limit;
        let running =
            |app: &Self| app.training_panel.is_active() || app.rank_panel.is_busy() || app.eval_page.is_running();
        while running(self) && Instant::now() < deadline {
            let mut events = Vec::new();
            self.worker.drain(DRAIN_BUDGET, DRAIN_MAX_EVENTS, |e| events.push(e));
            for e in events {
                self.handle_event(e);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        !running(self)
    }
}

impl eframe::App for StudioApp {
    fn logic(&mut self, ctx: &egui::Context, _frame: &mut eframe::Frame) {
        // Also runs while the window is hidden, so the worker's channel keeps draining.
        self.pump(ctx);
    }

    fn ui(&mut self, ui: &mut Ui, frame: &mut eframe::Frame) {
        self.record_cpu_usage(frame.info().cpu_usage);
        self.ui_root(ui);
    }

    fn auto_save_interval(&self) -> Duration {
        // Settings survive a crash or a killed process, not only a clean close.
        Duration::from_secs(10)
    }

    fn save(&mut self, storage: &mut dyn eframe::Storage) {
        if self.options.persist {
            eframe::set_value(storage, STORAGE_KEY, &self.prefs);
        }
    }

    fn on_exit(&mut self, _gl: Option<&eframe::glow::Context>) {
        self.stop_jobs_and_wait(EXIT_WAIT);
    }
}

/// A model or dataset value that names a Hub repo rather than something on disk (a path that exists wins).
fn is_repo_id(path: &Path) -> bool {
    !path.exists() && crate::engine::hub::looks_like_repo_id(&path.to_string_lossy())
}

/// How long closing the window waits for running jobs to stop.
const EXIT_WAIT: Duration = Duration::from_secs(20);

/// The studio's look: the default theme with an amber accent and a little more air.
fn apply_style(ctx: &egui::Context) {
    ctx.all_styles_mut(|style| {
        style.spacing.item_spacing = egui::vec2(8.0, 6.0);
        style.spacing.button_padding = egui::vec2(8.0, 4.0);
        style.spacing.interact_size.y = 22.0;
        style.visuals.selection.bg_fill = palette::ACCENT.gamma_multiply(0.55);
        style.visuals.selection.stroke = egui::Stroke::new(1.0, egui::Color32::WHITE);
        style.visuals.hyperlink_color = palette::ACCENT;
    });
}

#[cfg(test)]
mod tests;
