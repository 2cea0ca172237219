//! The checkpoints page: browse run folders (each run's settings and loss curve, its checkpoints with step,
//! loss, time and size), give a run a human name (Rename) and a note, delete a run, overlay the loss curves
//! of several runs and put their settings side by side ([`super::runs_table`]), and per
//! checkpoint open it in chat, resume training from it, export it (PEFT, mlx-lm, merged model, llama.cpp GGUF
//! with a quantization choice, GGUF LoRA adapter, Ollama folder; with a progress bar and the written size) or
//! delete it after a confirmation. Under the checkpoints, the run's adapter X-ray ([`super::xray_view`]).

use super::best_marker;
use super::export_dialog::{self, ExportDialog};
use super::panel_ctx::{Action, PanelCtx};
use super::run_compare::RunCompare;
use super::run_delete_dialog::RunDeleteDialog;
use super::run_notes::{notes_view_ui, NotesClick, RunNotesEditor};
use super::run_rename::{RenameClick, RunRename};
use super::widgets::{
    self, banner_ui, card_ui, fmt_age, fmt_bytes, fmt_count, fmt_loss, fmt_sci, palette, smooth, to_points, Tone,
};
use crate::engine::train::run_folder::RunStatus;
use crate::worker::{display_name, CheckpointInfo, Command, RunInfo};
use egui::{RichText, Ui};
use egui_plot::{Legend, Line, Plot, Points};
use std::path::{Path, PathBuf};

#[derive(Default)]
pub struct CheckpointsPanel {
    pub runs: Vec<RunInfo>,
    listed_dir: Option<PathBuf>,
    loading: bool,
    /// A refresh was asked for while one was under way (a checkpoint saved since): list again when it lands.
    refresh_again: bool,
    error: Option<String>,
    selected: Option<String>,
    confirm_delete: Option<PathBuf>,
    export: Option<ExportDialog>,
    exporting: Vec<PathBuf>,
    /// Tensors written of the running export, and the one being written.
    export_progress: Option<(usize, usize, String)>,
    /// The last export written and its size, offered with "Open folder".
    pub last_export: Option<(PathBuf, u64)>,
    notes: Vec<(Tone, String)>,
    /// The open rename editor, if any.
    renaming: Option<RunRename>,
    compare: RunCompare,
    /// The open note editor, if any.
    notes_editor: Option<RunNotesEditor>,
    pub delete_run: RunDeleteDialog,
    pub table: super::runs_table::RunsTable,
    /// The X-ray of the selected run's checkpoints.
    pub xray: super::xray_view::XrayView,
}

impl CheckpointsPanel {
    pub fn on_runs(&mut self, runs_dir: PathBuf, runs: Vec<RunInfo>) {
        self.loading = false;
        self.error = None;
        self.listed_dir = Some(runs_dir);
        if self.selected.as_ref().is_none_or(|s| !runs.iter().any(|r| &r.name == s)) {
            self.selected = runs.first().map(|r| r.name.clone());
        }
        self.runs = runs;
    }

    /// Whether a refresh asked for during the last listing is still owed (then the caller asks again).
    pub fn take_refresh_again(&mut self) -> bool {
        std::mem::take(&mut self.refresh_again)
    }

    pub fn on_runs_failed(&mut self, message: String) {
        self.loading = false;
        self.error = Some(message);
    }

    pub fn on_export_progress(&mut self, done: usize, total: usize, what: String) {
        self.export_progress = Some((done, total, what));
    }

    pub fn on_export_finished(&mut self, path: PathBuf, size_bytes: u64) {
        self.exporting.clear();
        self.export_progress = None;
        self.last_export = Some((path, size_bytes));
    }

    /// The end-of-sequence doctor's warnings about the export just started.
    pub fn on_export_warnings(&mut self, warnings: Vec<String>) {
        self.notes.extend(warnings.into_iter().map(|w| (Tone::Warn, format!("Export: {w}"))));
    }

    /// The finished export: where, how big, and how to use it.
    fn last_export_ui(&mut self, ui: &mut Ui) {
        let Some((path, size_bytes)) = self.last_export.clone() else { return };
        match export_dialog::finished_export_ui(ui, &path, size_bytes) {
            export_dialog::FinishedClick::Dismiss => self.last_export = None,
            export_dialog::FinishedClick::RevealFailed(message) => self.notes.push((Tone::Error, message)),
            export_dialog::FinishedClick::None => {}
        }
    }

    pub fn on_action_failed(&mut self, what: String, message: String) {
        self.delete_run.on_failed();
        self.exporting.clear();
        self.export_progress = None;
        self.notes.push((Tone::Error, format!("Could not {what}: {message}")));
    }

    /// The worker stored a run's new name: show it at once (the folder, and so the run list, is unchanged).
    pub fn on_renamed(&mut self, run_dir: &Path, label: String) {
        if let Some(run) = self.runs.iter_mut().find(|r| crate::worker::paths_match(&r.dir, run_dir)) {
            self.notes.push((Tone::Ok, format!("Renamed {} to \"{label}\"", run.name)));
            run.label = Some(label);
        }
    }

    /// The worker's answers to a note or a run delete; returns whether the run list should be read again.
    pub fn on_run_event(&mut self, event: crate::worker::Event) -> bool {
        use crate::worker::Event;
        match event {
            Event::RunNotesSaved { run_dir, notes } => {
                if let Some(run) = self.runs.iter_mut().find(|r| crate::worker::paths_match(&r.dir, &run_dir)) {
                    let said = if notes.is_some() { "Saved the note of" } else { "Cleared the note of" };
                    self.notes.push((Tone::Ok, format!("{said} {}", run.title())));
                    run.notes = notes;
                }
                false
            }
            Event::RunDeletePlanned(plan) => {
                self.delete_run.on_planned(plan);
                false
            }
            Event::RunDeleted(plan) => {
                self.delete_run.on_deleted();
                self.notes.push((Tone::Ok, format!("Deleted run \"{}\" ({})", plan.title, plan.run_dir.display())));
                true
            }
            _ => false,
        }
    }

    pub fn on_deleted(&mut self, path: &Path) {
        self.notes.push((Tone::Ok, format!("Deleted {}", path.display())));
    }

    /// Whether an export is under way.
    pub fn is_exporting(&self) -> bool {
        !self.exporting.is_empty()
    }

    /// The output folder field of the open export dialog.
    pub fn export_out_mut(&mut self) -> Option<&mut String> {
        self.export.as_mut().map(|d| &mut d.out)
    }

    /// Ask the worker for the run list (a refresh while one is under way is asked again once it lands, so the
    /// list never misses what changed meanwhile: [`Self::take_refresh_again`]).
    pub fn request_refresh(&mut self, runs_dir: &Path, actions: &mut Vec<Action>) {
        if self.loading {
            self.refresh_again = true;
            return;
        }
        self.loading = true;
        actions.push(Action::Send(Command::ListRuns { runs_dir: runs_dir.to_path_buf() }));
    }

    /// Every checkpoint of every run, newest first: for the chat's adapter picker.
    pub fn all_checkpoints(&self) -> Vec<(String, &CheckpointInfo)> {
        let mut out: Vec<(String, &CheckpointInfo)> =
            self.runs.iter().flat_map(|r| r.checkpoints.iter().map(move |c| (r.title().to_string(), c))).collect();
        out.sort_by(|a, b| b.1.saved_unix_secs.cmp(&a.1.saved_unix_secs).then(b.1.step.cmp(&a.1.step)));
        out
    }

    pub fn ui(&mut self, ui: &mut Ui, ctx: &mut PanelCtx<'_>) {
        if self.listed_dir.as_deref() != Some(ctx.prefs.train.out.as_path()) && !self.loading {
            self.request_refresh(&ctx.prefs.train.out.clone(), ctx.actions);
        }
        widgets::page_header_ui(
            ui,
            "Checkpoints",
            "Every run folder under the runs folder, newest first. Checkpoints appear here as they are written.",
        );
        ui.horizontal(|ui| {
            ui.label(RichText::new(format!("Runs folder: {}", ctx.prefs.train.out.display())).weak());
            if ui
                .add_enabled(!self.loading, egui::Button::new("Refresh"))
                .on_hover_text("Read the runs folder again")
                .clicked()
            {
                self.request_refresh(&ctx.prefs.train.out.clone(), ctx.actions);
            }
            if self.loading {
                ui.spinner();
            }
        });
        if let Some((done, total, what)) = self.export_progress.as_ref().filter(|_| self.is_exporting()) {
            let fraction = *done as f32 / (*total).max(1) as f32;
            ui.add(egui::ProgressBar::new(fraction).show_percentage().text(format!("Exporting: {what}")));
        }
        self.last_export_ui(ui);
        let mut dismiss = None;
        for (i, (tone, note)) in self.notes.iter().enumerate().rev().take(3) {
            ui.horizontal(|ui| {
                banner_ui(ui, *tone, note.clone());
            });
            if ui.small_button("Dismiss").on_hover_text("Hide this message").clicked() {
                dismiss = Some(i);
            }
        }
        if let Some(i) = dismiss {
            self.notes.remove(i);
        }
        if let Some(e) = &self.error {
            banner_ui(ui, Tone::Error, format!("Cannot read the runs folder: {e}"));
        }
        if self.runs.is_empty() {
            if !self.loading {
                banner_ui(
                    ui,
                    Tone::Info,
                    "No runs yet. Finished and running trainings show up here with their checkpoints.",
                );
            }
            return;
        }
        egui::Panel::left("runs-list").resizable(true).default_size(280.0).size_range(200.0..=460.0).show(ui, |ui| {
            self.run_list_ui(ui, ctx);
        });
        egui::CentralPanel::default().show(ui, |ui| {
            egui::ScrollArea::vertical().id_salt("run-detail").auto_shrink([false; 2]).show(ui, |ui| {
                self.detail_ui(ui, ctx);
                if let Some(run) = self.selected.as_ref().and_then(|s| self.runs.iter().find(|r| &r.name == s)) {
                    self.xray.ui(ui, run, ctx);
                }
                ui.add_space(10.0);
                self.overlay_ui(ui, ctx);
            });
        });
        self.modals_ui(ui, ctx);
    }

    fn run_list_ui(&mut self, ui: &mut Ui, ctx: &mut PanelCtx<'_>) {
        ui.label(RichText::new(format!("{} runs", self.runs.len())).strong());
        ui.label(RichText::new("tick runs to overlay their loss curves").weak().small());
        egui::ScrollArea::vertical().id_salt("runs-scroll").auto_shrink([false; 2]).show(ui, |ui| {
            for (i, run) in self.runs.iter().enumerate() {
                let selected = self.selected.as_deref() == Some(run.name.as_str());
                ui.push_id(i, |ui| {
                    ui.horizontal(|ui| {
                        let mut overlay = ctx.prefs.overlay_runs.contains(&run.name);
                        // Without text of its own, the hover text is the checkbox's accessible name.
                        let toggled = ui
                            .checkbox(&mut overlay, "")
                            .on_hover_text(format!("Overlay {} in the comparison plot", run.name))
                            .changed();
                        if toggled {
                            if overlay {
                                ctx.prefs.overlay_runs.push(run.name.clone());
                            } else {
                                ctx.prefs.overlay_runs.retain(|n| n != &run.name);
                            }
                        }
                        let text = RichText::new(run.title()).strong();
                        let item = ui.add(egui::Button::selectable(selected, text).wrap());
                        let item = match &run.label {
                            Some(_) => item.on_hover_text(format!("{}\nfolder {}", run.title(), run.name)),
                            None => item.on_hover_text(run.name.as_str()),
                        };
                        if item.clicked() {
                            self.selected = Some(run.name.clone());
                        }
                    });
                    let status = live_status(run, ctx);
                    let color = status_color(status);
                    ui.horizontal(|ui| {
                        ui.add_space(28.0);
                        widgets::status_dot_ui(ui, color);
                        ui.label(RichText::new(status.map_or("training", RunStatus::label)).color(color).small());
                        ui.label(RichText::new(format!("· {} ckpt", run.checkpoints.len())).weak().small());
                        if let Some(c) = &run.config {
                            ui.label(RichText::new(format!("· {}", c.method.name())).weak().small())
                                .on_hover_text(crate::engine::train::run_table::method_text(c));
                        }
                        if let Some(t) = run.started_unix_secs {
                            ui.label(RichText::new(format!("· {}", fmt_age(t))).weak().small());
                        }
                    });
                    ui.add_space(4.0);
                });
            }
        });
    }

    fn detail_ui(&mut self, ui: &mut Ui, ctx: &mut PanelCtx<'_>) {
        let Some(run) = self.selected.as_ref().and_then(|s| self.runs.iter().find(|r| &r.name == s)) else {
            ui.label("Select a run.");
            return;
        };
        let editing = self.renaming.as_ref().is_some_and(|r| crate::worker::paths_match(&r.run_dir, &run.dir));
        ui.horizontal_wrapped(|ui| {
            ui.add(egui::Label::new(RichText::new(run.title()).size(18.0).strong()).wrap());
            let status = live_status(run, ctx);
            let text = status.map_or_else(|| "training".to_string(), RunStatus::to_string);
            ui.label(RichText::new(text).color(status_color(status)));
            if !editing
                && ui
                    .small_button("Rename…")
                    .on_hover_text("Give this run a name of your own; the folder stays")
                    .clicked()
            {
                self.renaming = Some(RunRename::new(run));
            }
            let runs_dir = ctx.prefs.train.out.clone();
            if let Some(command) = self.delete_run.button_ui(ui, run, &runs_dir, live_status(run, ctx).is_none()) {
                ctx.actions.push(Action::Send(command));
            }
        });
        if let Some(editor) = self.renaming.as_mut().filter(|_| editing) {
            match editor.ui(ui) {
                RenameClick::Save(command) => {
                    ctx.actions.push(Action::Send(command));
                    self.renaming = None;
                }
                RenameClick::Cancel => self.renaming = None,
                RenameClick::None => {}
            }
        }
        let click = match self.notes_editor.as_mut().filter(|e| crate::worker::paths_match(&e.run_dir, &run.dir)) {
            Some(editor) => editor.ui(ui),
            None => notes_view_ui(ui, run),
        };
        match click {
            NotesClick::Edit => self.notes_editor = Some(RunNotesEditor::new(run)),
            NotesClick::Save(command) => {
                ctx.actions.push(Action::Send(command));
                self.notes_editor = None;
            }
            NotesClick::Cancel => self.notes_editor = None,
            NotesClick::None => {}
        }
        ui.add(egui::Label::new(RichText::new(run.dir.display().to_string()).weak().small()).wrap());
        ui.add_space(4.0);
        // Side by side only where both fit; each card keeps to its own column (long paths wrap inside it).
        if ui.available_width() >= TWO_CARD_MIN_WIDTH {
            ui.columns(2, |cols| {
                card_ui(&mut cols[0], |ui| run_settings_ui(ui, run));
                card_ui(&mut cols[1], |ui| run_loss_ui(ui, run));
            });
        } else {
            card_ui(ui, |ui| run_settings_ui(ui, run));
            ui.add_space(6.0);
            card_ui(ui, |ui| run_loss_ui(ui, run));
        }
        ui.add_space(6.0);
        widgets::section_ui(ui, &best_marker::checkpoints_title(run.checkpoints.len(), run.best_checkpoint));
        if run.checkpoints.is_empty() {
            ui.label(RichText::new("No checkpoint saved yet.").weak());
            return;
        }
        // On a narrow page the table scrolls sideways rather than widening the page under the plots below.
        let clicks = egui::ScrollArea::horizontal()
            .id_salt("ckpt-table")
            .show(ui, |ui| checkpoint_table_ui(ui, run, &self.exporting, ctx.training_active, ctx.prefs.export))
            .inner;
        if let Some(a) = clicks.action {
            ctx.actions.push(a);
        }
        if clicks.export.is_some() {
            self.export = clicks.export;
        }
        if clicks.delete.is_some() {
            self.confirm_delete = clicks.delete;
        }
    }

    fn overlay_ui(&mut self, ui: &mut Ui, ctx: &PanelCtx<'_>) {
        widgets::section_ui(ui, "Compare runs");
        let chosen: Vec<&RunInfo> = self.runs.iter().filter(|r| ctx.prefs.overlay_runs.contains(&r.name)).collect();
        if chosen.is_empty() {
            ui.label(RichText::new("Tick runs in the list to overlay their loss curves here.").weak());
            return;
        }
        self.compare.ui(ui, &chosen);
        ui.add_space(8.0);
        self.table.ui(ui, &chosen);
    }

    fn modals_ui(&mut self, ui: &mut Ui, ctx: &mut PanelCtx<'_>) {
        if let Some(command) = self.delete_run.modal_ui(ui, &ctx.prefs.train.out) {
            ctx.actions.push(Action::Send(command));
        }
        if let Some(path) = self.confirm_delete.clone() {
            let mut close = false;
            egui::Modal::new(egui::Id::unique("confirm-delete")).show(ui.ctx(), |ui| {
                ui.set_width(420.0);
                ui.label(RichText::new("Delete checkpoint?").strong().size(16.0));
                ui.add_space(4.0);
                ui.label(format!("{} will be removed from disk. This cannot be undone.", path.display()));
                ui.add_space(8.0);
                ui.horizontal(|ui| {
                    if ui.button(RichText::new("Delete checkpoint").color(palette::ERROR).strong()).clicked() {
                        ctx.actions.push(Action::Send(Command::DeleteCheckpoint { path: path.clone() }));
                        close = true;
                    }
                    if ui.button("Cancel").clicked() {
                        close = true;
                    }
                });
            });
            if close {
                self.confirm_delete = None;
            }
        }
        if let Some(dialog) = self.export.take() {
            match export_dialog::export_modal_ui(ui, dialog) {
                export_dialog::Outcome::Open(dialog) => self.export = Some(dialog),
                export_dialog::Outcome::Started(command, chosen) => {
                    if let Command::ExportCheckpoint { checkpoint, .. } = command.as_ref() {
                        self.exporting.push(checkpoint.clone());
                    }
                    ctx.prefs.export = chosen;
                    ctx.actions.push(Action::Send(*command));
                }
                export_dialog::Outcome::Closed => {}
            }
        }
    }
}

/// What a click in a run's checkpoint table asks for.
#[derive(Default)]
struct TableClicks {
    action: Option<Action>,
    export: Option<ExportDialog>,
    delete: Option<PathBuf>,
}

/// Narrower than this, the run's Settings and Loss cards stack instead of sharing a row.
const TWO_CARD_MIN_WIDTH: f32 = 720.0;

/// The run's settings as saved in its run.json. Values wrap within the card (a long data path never runs
/// under the card beside it).
fn run_settings_ui(ui: &mut Ui, run: &RunInfo) {
    ui.set_width(ui.available_width());
    ui.label(RichText::new("Settings").strong());
    match &run.config {
        Some(c) => {
            // A finite column width makes the grid wrap its text; the last column gets what is left.
            let grid = egui::Grid::new("run-settings").num_columns(2).spacing([14.0, 3.0]);
            grid.max_col_width(ui.available_width()).show(ui, |ui| {
                let row = |ui: &mut Ui, k: &str, v: String| {
                    ui.label(RichText::new(k).weak());
                    ui.label(v);
                    ui.end_row();
                };
                row(ui, "Model", display_name(&c.model));
                row(ui, "Data", c.data.display().to_string());
                row(ui, "Method", crate::engine::train::run_table::method_text(c));
                row(
                    ui,
                    "LoRA",
                    format!(
                        "rank {} · alpha {} · scale {:.2}{}{}",
                        c.lora.rank,
                        c.lora.alpha,
                        c.lora.scale(),
                        if c.lora.use_rslora { " (rsLoRA)" } else { "" },
                        if c.lora.dora { " · DoRA" } else { "" }
                    ),
                );
                row(ui, "Targets", c.lora.targets.to_string());
                row(ui, "Layers", c.lora.layers.map(|n| format!("last {n}")).unwrap_or_else(|| "all".into()));
                let warmup = c.warmup.map_or("auto".into(), |w: usize| w.to_string());
                row(ui, "Learning rate", format!("{} {:?}, warmup {warmup}", fmt_sci(c.lr), c.schedule).to_lowercase());
                row(ui, "Batch", format!("{} × {} accumulation · {} tokens", c.batch_size, c.grad_accum, c.seq_len));
                row(
                    ui,
                    "Duration",
                    match (c.iters, c.epochs, run.total_steps) {
                        (_, _, Some(t)) => format!("{t} steps"),
                        (Some(n), _, _) => format!("{n} steps"),
                        (None, Some(e), _) => format!("{e} epochs"),
                        _ => "–".into(),
                    },
                );
                row(ui, "Seed", c.seed.to_string());
                if let Some(p) = run.trainable_params {
                    row(ui, "Trainable", fmt_count(p));
                }
            });
        }
        None => {
            ui.label(RichText::new("run.json is missing or unreadable").weak());
        }
    }
}

/// The run's training loss (raw and smoothed) and validation loss.
fn run_loss_ui(ui: &mut Ui, run: &RunInfo) {
    ui.set_width(ui.available_width());
    ui.label(RichText::new("Loss").strong());
    let train = to_points(&run.train_loss);
    let smoothed = smooth(&train, 0.6);
    let val = to_points(&run.val_loss);
    super::plot_axes::with_readable_y(Plot::new(("run-loss", &run.name)))
        .allow_scroll(false)
        .height(210.0)
        .legend(Legend::default())
        .x_axis_label("step")
        .show(ui, |plot| {
            plot.line(Line::new("train", &train[..]).color(palette::TRAIN_RAW).width(1.0));
            plot.line(Line::new("train (smoothed)", &smoothed[..]).color(palette::TRAIN).width(2.0));
            if !val.is_empty() {
                plot.line(Line::new("validation", &val[..]).color(palette::VALID).width(2.0));
                plot.points(Points::new("validation", &val[..]).color(palette::VALID).radius(3.0));
            }
        });
}

/// One row per checkpoint, newest first, with its actions: chat, resume, export, delete.
fn checkpoint_table_ui(
    ui: &mut Ui,
    run: &RunInfo,
    exporting: &[PathBuf],
    training_active: bool,
    last: export_dialog::ExportPrefs,
) -> TableClicks {
    let base_model = run.config.as_ref().map(|c| c.model.clone()).unwrap_or_default();
    let config = run.config.clone();
    let mut clicks = TableClicks::default();
    egui::Grid::new("ckpts").num_columns(6).striped(true).spacing([18.0, 6.0]).show(ui, |ui| {
        for h in ["Step", "Train loss", "Val loss", "Saved", "Size", ""] {
            ui.label(RichText::new(h).strong());
        }
        ui.end_row();
        for c in run.checkpoints.iter().rev() {
            best_marker::checkpoint_step_ui(ui, c.step, run.best_checkpoint);
            ui.label(c.train_loss.map(fmt_loss).unwrap_or_else(|| "–".into()));
            ui.label(c.val_loss.map(fmt_loss).unwrap_or_else(|| "–".into()));
            ui.label(fmt_age(c.saved_unix_secs)).on_hover_text(widgets::fmt_unix(c.saved_unix_secs));
            ui.label(fmt_bytes(c.size_bytes));
            ui.push_id(&c.path, |ui| {
                ui.horizontal(|ui| {
                    if ui.button("Open in chat").on_hover_text("Chat with this adapter on the base model").clicked() {
                        clicks.action =
                            Some(Action::OpenInChat { checkpoint: c.path.clone(), base_model: base_model.clone() });
                    }
                    if ui
                        .add_enabled(!training_active, egui::Button::new("Resume"))
                        .on_hover_text("Continue this run from here with its saved settings")
                        .on_disabled_hover_text("A run is in progress")
                        .clicked()
                    {
                        clicks.action = Some(Action::ResumeFrom {
                            checkpoint: c.path.clone(),
                            config: config.clone().map(Box::new),
                        });
                    }
                    let exporting = exporting.contains(&c.path);
                    if ui
                        .add_enabled(!exporting, egui::Button::new(if exporting { "Exporting…" } else { "Export…" }))
                        .on_hover_text("Write the adapter as PEFT, mlx-lm, a merged model, GGUF or an Ollama folder")
                        .clicked()
                    {
                        clicks.export = Some(ExportDialog::new(c.path.clone(), base_model.clone(), last));
                    }
                    if ui
                        .button(RichText::new("Delete").color(palette::ERROR))
                        .on_hover_text("Delete this checkpoint folder")
                        .clicked()
                    {
                        clicks.delete = Some(c.path.clone());
                    }
                });
            });
            ui.end_row();
        }
    });
    clicks
}

/// The run's status; None while it is the run in progress (shown as "training").
fn live_status<'a>(run: &'a RunInfo, ctx: &PanelCtx<'_>) -> Option<&'a RunStatus> {
    match &ctx.active_run {
        Some(dir) if crate::worker::paths_match(dir, &run.dir) => None,
        _ => Some(&run.status),
    }
}

fn status_color(status: Option<&RunStatus>) -> egui::Color32 {
    match status {
        None | Some(RunStatus::Finished) => palette::OK,
        Some(RunStatus::Failed { .. }) => palette::ERROR,
        Some(RunStatus::Stopped) => palette::WARN,
        Some(RunStatus::Incomplete) => palette::TRAIN,
    }
}
