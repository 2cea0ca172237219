//! The Evaluate page: score the base model, checkpoints of the runs folder and adapter folders on a prompt set
//! (loss, generated answers, multiple choice) with the engine's evaluation job (`Command::Evaluate`), and compare
//! them: a metrics table, the metric against the training step, and every row side by side.
//!
//! The page is plain data: the setup's choices are preferences ([`EvalPrefs`]), the job's progress and results come
//! in as worker events, and what the page wants done goes out as [`EvalRequest`]s (the app turns them into
//! commands and page switches), so it never imports the app. The job runs on the worker: the window never waits.

use super::eval_plot::plot_ui;
use super::eval_results::EvalResults;
use super::eval_rows::{rows_ui, RowsView};
use super::eval_setup::{build_spec, EvalPrefs, SetupContext};
use super::eval_setup_ui::{SetupRequest, SetupUi, SetupView};
use super::widgets::{self, banner_ui, palette, Tone};
use crate::engine::eval::{EvalEvent, EvalReport, EvalSpec};
use crate::worker::{Command, DatasetReport, ModelSummary, RunInfo};
use egui::{Color32, RichText, Ui};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// What the page asks the app to do.
#[derive(Debug, Clone)]
pub enum EvalRequest {
    Send(Command),
    /// Read the runs folder (the answer, `Event::Runs`, reaches this page and the checkpoints page).
    RefreshRuns,
    ShowModelPage,
    ShowDatasetPage,
}

/// What the page reads from the rest of the studio.
pub struct EvalInputs<'a> {
    pub model: Option<&'a ModelSummary>,
    pub model_loading: bool,
    /// The dataset open on the dataset page.
    pub dataset: Option<&'a DatasetReport>,
    /// The training settings (sequence length, seed, prompt tokens trained): rows are read as training reads them.
    pub train: &'a crate::engine::train::TrainConfig,
    pub runs_dir: &'a Path,
}

/// Where the evaluation stands.
#[derive(Debug, Clone, PartialEq)]
pub enum EvalStatus {
    Idle,
    /// Sent: the worker reads and checks the data.
    Preparing,
    Running,
    Finished,
    Failed {
        message: String,
        cancelled: bool,
    },
}

/// The Evaluate page.
pub struct EvalPage {
    runs: Vec<RunInfo>,
    /// The runs folder last asked for (asked again when the setting changes).
    runs_asked: Option<PathBuf>,
    setup: SetupUi,
    pub status: EvalStatus,
    started: Option<Instant>,
    /// Seconds the last evaluation took, once it ended.
    elapsed_secs: Option<f64>,
    /// (target index, rows done, rows per target).
    progress: Option<(usize, usize, usize)>,
    cancel_requested: bool,
    pub results: EvalResults,
    rows_view: RowsView,
}

impl Default for EvalPage {
    fn default() -> Self {
        Self {
            runs: Vec::new(),
            runs_asked: None,
            setup: SetupUi::default(),
            status: EvalStatus::Idle,
            started: None,
            elapsed_secs: None,
            progress: None,
            cancel_requested: false,
            results: EvalResults::default(),
            rows_view: RowsView::default(),
        }
    }
}

impl EvalPage {
    pub fn is_running(&self) -> bool {
        matches!(self.status, EvalStatus::Preparing | EvalStatus::Running)
    }

    pub fn on_runs(&mut self, runs: &[RunInfo]) {
        self.runs = runs.to_vec();
    }

    pub fn on_eval(&mut self, event: EvalEvent) {
        match event {
            EvalEvent::Started { task, rows, targets, notes } => {
                self.results.begin(task, rows, targets, notes);
                self.rows_view.reset();
                self.status = EvalStatus::Running;
                self.progress = Some((0, 0, rows));
            }
            EvalEvent::Progress { target, done, total } => self.progress = Some((target, done, total)),
            EvalEvent::TargetFinished { result, .. } => self.results.on_target_finished(*result),
        }
    }

    pub fn on_finished(&mut self, report: EvalReport) {
        self.results.on_report(report);
        self.end(EvalStatus::Finished);
    }

    pub fn on_failed(&mut self, message: String, cancelled: bool) {
        self.end(EvalStatus::Failed { message, cancelled });
    }

    fn end(&mut self, status: EvalStatus) {
        self.elapsed_secs = self.started.map(|s| s.elapsed().as_secs_f64());
        self.status = status;
        self.cancel_requested = false;
    }

    fn start(&mut self, spec: EvalSpec, out: &mut Vec<EvalRequest>) {
        self.results = EvalResults::default();
        self.rows_view.reset();
        self.status = EvalStatus::Preparing;
        self.started = Some(Instant::now());
        self.elapsed_secs = None;
        self.progress = None;
        self.cancel_requested = false;
        out.push(EvalRequest::Send(Command::Evaluate(Box::new(spec))));
    }

    /// The navigation's status line.
    pub fn nav_hint(&self) -> Option<(String, Color32)> {
        let n = self.results.finished.len();
        match &self.status {
            EvalStatus::Preparing | EvalStatus::Running => {
                let of = self.results.targets.len().max(1);
                Some((format!("evaluating {}/{of}…", (n + 1).min(of)), palette::OK))
            }
            EvalStatus::Failed { cancelled: true, .. } => Some(("cancelled".into(), palette::WARN)),
            EvalStatus::Failed { .. } => Some(("failed".into(), palette::ERROR)),
            EvalStatus::Finished => Some((format!("{} scored", targets_text(n)), palette::MASKED_FG)),
            EvalStatus::Idle => None,
        }
    }

    /// The page; returns what it asks the app to do.
    pub fn ui(&mut self, ui: &mut Ui, prefs: &mut EvalPrefs, inputs: &EvalInputs<'_>) -> Vec<EvalRequest> {
        let mut out = Vec::new();
        if self.runs_asked.as_deref() != Some(inputs.runs_dir) {
            self.runs_asked = Some(inputs.runs_dir.to_path_buf());
            out.push(EvalRequest::RefreshRuns);
        }
        widgets::page_header_ui(
            ui,
            "Evaluate",
            "Score the base model, checkpoints and adapters on the same prompts: loss, generated answers or \
             multiple choice, side by side.",
        );
        egui::ScrollArea::vertical().id_salt("eval-page").auto_shrink([false, false]).show(ui, |ui| {
            let view = SetupView {
                runs: &self.runs,
                runs_dir: inputs.runs_dir,
                dataset: inputs.dataset,
                model: inputs.model.map(|m| m.path.as_path()),
                enabled: !self.is_running(),
            };
            for r in self.setup.ui(ui, prefs, &view) {
                out.push(match r {
                    SetupRequest::RefreshRuns => EvalRequest::RefreshRuns,
                    SetupRequest::ShowModelPage => EvalRequest::ShowModelPage,
                    SetupRequest::ShowDatasetPage => EvalRequest::ShowDatasetPage,
                });
            }
            ui.add_space(6.0);
            let cx = SetupContext {
                model_loaded: inputs.model.is_some(),
                model_loading: inputs.model_loading,
                dataset: inputs.dataset,
                train: inputs.train,
                runs: &self.runs,
            };
            let spec = build_spec(prefs, &cx);
            self.run_bar_ui(ui, spec, inputs, &mut out);
            self.status_ui(ui);
            self.results_ui(ui, prefs, inputs.runs_dir);
        });
        out
    }

    /// Run (or why not), or the progress with Cancel.
    fn run_bar_ui(
        &mut self,
        ui: &mut Ui,
        spec: Result<EvalSpec, String>,
        inputs: &EvalInputs<'_>,
        out: &mut Vec<EvalRequest>,
    ) {
        if self.is_running() {
            self.progress_ui(ui, out);
            return;
        }
        match spec {
            Err(reason) => {
                banner_ui(ui, Tone::Warn, reason);
                if inputs.model.is_none() && !inputs.model_loading && ui.link("Go to the Model page").clicked() {
                    out.push(EvalRequest::ShowModelPage);
                }
            }
            Ok(spec) => {
                ui.horizontal(|ui| {
                    let run = egui::Button::new(RichText::new("Run evaluation").strong().size(15.0))
                        .fill(palette::ACCENT.gamma_multiply(0.35));
                    let summary = spec_summary(&spec);
                    if ui.add(run).on_hover_text(&summary).clicked() {
                        self.start(spec, out);
                    }
                    ui.label(RichText::new(summary).weak());
                });
            }
        }
    }

    fn progress_ui(&mut self, ui: &mut Ui, out: &mut Vec<EvalRequest>) {
        let elapsed = self.started.map_or(0.0, |s| s.elapsed().as_secs_f64());
        let targets = self.results.targets.len();
        let (fraction, text) = match (self.status.clone(), self.progress) {
            (EvalStatus::Running, Some((target, done, total))) if targets > 0 => {
                let within = if total > 0 { done as f32 / total as f32 } else { 0.0 };
                let label = self.results.targets.get(target).map(|t| t.label.as_str()).unwrap_or("");
                (
                    (target as f32 + within) / targets as f32,
                    format!("target {} of {targets} ({label}) · rows {done}/{total}", target + 1),
                )
            }
            _ => (0.0, "reading and checking the data…".to_string()),
        };
        ui.horizontal(|ui| {
            ui.spinner();
            ui.add(
                egui::ProgressBar::new(fraction.clamp(0.0, 1.0))
                    .desired_width((ui.available_width() - 260.0).max(200.0))
                    .desired_height(18.0)
                    .fill(palette::ACCENT.gamma_multiply(0.85))
                    .text(RichText::new(text).strong()),
            );
            ui.label(format!("elapsed {}", widgets::fmt_secs(elapsed)));
            let cancel = ui.add_enabled(!self.cancel_requested, egui::Button::new("Cancel"));
            if cancel.on_hover_text("Stop after the current row; finished targets keep their results").clicked() {
                self.cancel_requested = true;
                out.push(EvalRequest::Send(Command::CancelEvaluation));
            }
            if self.cancel_requested {
                ui.label(RichText::new("cancelling…").color(palette::WARN));
            }
        });
        // The elapsed time moves even when no event arrives.
        ui.ctx().request_repaint_after(std::time::Duration::from_millis(250));
    }

    fn status_ui(&mut self, ui: &mut Ui) {
        let took = self.elapsed_secs.map(widgets::fmt_secs).unwrap_or_default();
        match &self.status {
            EvalStatus::Failed { cancelled: true, .. } => {
                let n = self.results.finished.len();
                banner_ui(
                    ui,
                    Tone::Warn,
                    format!(
                        "Evaluation cancelled after {took}: {n} of {} targets finished; their results are below.",
                        self.results.targets.len()
                    ),
                );
            }
            EvalStatus::Failed { message, .. } => {
                banner_ui(ui, Tone::Error, format!("Evaluation failed: {message}"));
            }
            EvalStatus::Finished => {
                let r = &self.results;
                ui.label(
                    RichText::new(format!(
                        "Finished in {took}: {} · {} rows each · {}",
                        targets_text(r.finished.len()),
                        r.rows,
                        r.task
                    ))
                    .color(palette::OK),
                );
            }
            _ => {}
        }
        for note in &self.results.notes {
            ui.label(RichText::new(format!("Note: {note}")).small().color(palette::WARN));
        }
    }

    fn results_ui(&mut self, ui: &mut Ui, prefs: &mut EvalPrefs, runs_dir: &Path) {
        if self.results.is_empty() {
            return;
        }
        widgets::section_ui(ui, "Metrics");
        self.results.metrics_table_ui(ui);
        self.results.save_ui(ui, runs_dir);
        ui.add_space(6.0);
        let names = self.results.score_names();
        plot_ui(ui, &self.results.finished, &names, &mut prefs.plot_metric);
        widgets::section_ui(ui, "Row by row");
        rows_ui(ui, &self.results.task, &self.results.finished, &mut self.rows_view);
    }
}

/// "3 targets · loss on the valid split of sample-chat · first 50 rows".
fn spec_summary(spec: &EvalSpec) -> String {
    let data = crate::worker::display_name(&spec.data);
    let on = if spec.data.is_dir() { format!("the {} split of {data}", spec.split) } else { data };
    let rows = spec.limit.map(|n| format!(" · first {n} rows")).unwrap_or_default();
    format!("{} · {} on {on}{rows}", targets_text(spec.targets.len()), spec.task.name())
}

/// "1 target", "3 targets".
fn targets_text(n: usize) -> String {
    format!("{n} target{}", if n == 1 { "" } else { "s" })
}
