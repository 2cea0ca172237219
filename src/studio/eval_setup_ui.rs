//! The Evaluate page's setup cards: what to evaluate (the base, checkpoints of the runs folder, adapter folders),
//! on which prompts (a split of the open dataset, or another file), and the task with its options. The choices
//! live in [`EvalPrefs`]; the native dialogs run off the UI thread ([`PanelPicker`]), and a typed path always
//! works as well (a machine without a desktop portal has no dialog).

use super::eval_setup::{DataChoice, EvalPrefs, TaskChoice};
use super::file_picker::{PanelPicker, PickKind};
use super::widgets::{self, banner_ui, palette, Tone};
use crate::worker::{DatasetReport, RunInfo, SplitName};
use egui::{RichText, Ui};
use std::path::PathBuf;

/// What the setup asks the app to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SetupRequest {
    /// Read the runs folder again.
    RefreshRuns,
    ShowModelPage,
    ShowDatasetPage,
}

/// Which path field a dialog's answer goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PickFor {
    Adapter,
    PromptFile,
    Judge,
}

/// The setup's own state: the dialog in flight and the typed adapter path.
#[derive(Default)]
pub struct SetupUi {
    picker: PanelPicker,
    pick_for: Option<PickFor>,
    /// The "add adapter folder" path field.
    pub adapter_input: String,
}

/// What the cards show besides the choices.
pub struct SetupView<'a> {
    pub runs: &'a [RunInfo],
    pub runs_dir: &'a std::path::Path,
    pub dataset: Option<&'a DatasetReport>,
    /// The loaded model's path: runs trained on another are marked.
    pub model: Option<&'a std::path::Path>,
    /// Setup is locked while an evaluation runs.
    pub enabled: bool,
}

impl SetupUi {
    /// The three cards side by side; returns the requests made this frame.
    pub fn ui(&mut self, ui: &mut Ui, prefs: &mut EvalPrefs, view: &SetupView<'_>) -> Vec<SetupRequest> {
        self.take_picked(prefs);
        let mut requests = Vec::new();
        ui.add_enabled_ui(view.enabled, |ui| {
            ui.columns(3, |cols| {
                widgets::card_ui(&mut cols[0], |ui| self.targets_ui(ui, prefs, view, &mut requests));
                widgets::card_ui(&mut cols[1], |ui| self.prompts_ui(ui, prefs, view, &mut requests));
                widgets::card_ui(&mut cols[2], |ui| self.task_ui(ui, prefs, view.runs));
            });
        });
        if let Some(note) = &self.picker.note {
            banner_ui(ui, Tone::Warn, note.clone());
        }
        requests
    }

    fn take_picked(&mut self, prefs: &mut EvalPrefs) {
        let Some(path) = self.picker.take_picked() else { return };
        match self.pick_for.take() {
            Some(PickFor::Adapter) => add_adapter(prefs, path),
            Some(PickFor::PromptFile) => prefs.file = path.display().to_string(),
            Some(PickFor::Judge) => prefs.judge = path.display().to_string(),
            None => {}
        }
    }

    fn open_picker(&mut self, ui: &Ui, kind: PickKind, what: PickFor, current: &str) {
        self.pick_for = Some(what);
        self.picker.open(ui, kind, current);
    }

    fn targets_ui(&mut self, ui: &mut Ui, prefs: &mut EvalPrefs, view: &SetupView<'_>, out: &mut Vec<SetupRequest>) {
        ui.set_width(ui.available_width());
        ui.horizontal(|ui| {
            ui.label(RichText::new("1 · What to evaluate").strong());
            ui.with_layout(egui::Layout::right_to_left(egui::Align::Center), |ui| {
                if ui.small_button("Refresh").on_hover_text("Read the runs folder again").clicked() {
                    out.push(SetupRequest::RefreshRuns);
                }
            });
        });
        ui.checkbox(&mut prefs.include_base, "Base model").on_hover_text("The loaded model with no adapter");
        egui::ScrollArea::vertical().id_salt("eval-targets").max_height(190.0).auto_shrink([false, true]).show(
            ui,
            |ui| {
                if view.runs.iter().all(|r| r.checkpoints.is_empty()) {
                    ui.label(
                        RichText::new(format!("No checkpoints in {} yet: train a run first.", view.runs_dir.display()))
                            .weak(),
                    );
                }
                for run in view.runs.iter().filter(|r| !r.checkpoints.is_empty()) {
                    run_checkpoints_ui(ui, prefs, run, view.model);
                }
            },
        );
        let mut remove = None;
        for (i, dir) in prefs.adapters.iter().enumerate() {
            ui.horizontal(|ui| {
                if ui.small_button("×").on_hover_text("Remove this adapter folder").clicked() {
                    remove = Some(i);
                }
                let name = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                let text = if dir.is_dir() { RichText::new(name) } else { RichText::new(name).color(palette::ERROR) };
                ui.add(egui::Label::new(text).truncate()).on_hover_text(dir.display().to_string());
            });
        }
        if let Some(i) = remove {
            prefs.adapters.remove(i);
        }
        ui.horizontal(|ui| {
            let browse = ui
                .add_enabled(!self.picker.is_open(), egui::Button::new("Add adapter folder…"))
                .on_hover_text("A checkpoint or PEFT adapter folder from anywhere");
            if browse.clicked() {
                let start = view.runs_dir.display().to_string();
                self.open_picker(ui, PickKind::Folder, PickFor::Adapter, &start);
            }
            ui.label(RichText::new("or type its path:").weak());
        });
        ui.horizontal(|ui| {
            let field = egui::TextEdit::singleline(&mut self.adapter_input)
                .hint_text("adapter folder path")
                .desired_width((ui.available_width() - 60.0).max(80.0));
            let r = ui.add(field);
            let typed = !self.adapter_input.trim().is_empty();
            let enter = r.lost_focus() && ui.input(|i| i.key_pressed(egui::Key::Enter));
            if ui.add_enabled(typed, egui::Button::new("Add")).clicked() || (enter && typed) {
                add_adapter(prefs, PathBuf::from(self.adapter_input.trim()));
                self.adapter_input.clear();
            }
        });
    }

    fn prompts_ui(&mut self, ui: &mut Ui, prefs: &mut EvalPrefs, view: &SetupView<'_>, out: &mut Vec<SetupRequest>) {
        ui.set_width(ui.available_width());
        ui.label(RichText::new("2 · On which prompts").strong());
        let name = view.dataset.map(|d| crate::worker::display_name(&d.path));
        let label = match &name {
            Some(n) => format!("A split of the open dataset ({n})"),
            None => "A split of the open dataset (none open)".into(),
        };
        ui.radio_value(&mut prefs.data, DataChoice::DatasetSplit, label);
        ui.horizontal(|ui| {
            ui.add_space(22.0);
            for split in [SplitName::Train, SplitName::Valid, SplitName::Test] {
                let rows = view.dataset.map(|d| d.rows(split));
                let text = match rows {
                    Some(n) => format!("{split} ({n})"),
                    None => split.to_string(),
                };
                // A split the open dataset does not have cannot be picked (the refusal names the ones it has).
                let enabled = prefs.data == DataChoice::DatasetSplit && rows != Some(0);
                ui.add_enabled_ui(enabled, |ui| ui.radio_value(&mut prefs.split, split, text));
            }
        });
        if view.dataset.is_none() && prefs.data == DataChoice::DatasetSplit && ui.link("Open a dataset").clicked() {
            out.push(SetupRequest::ShowDatasetPage);
        }
        ui.radio_value(&mut prefs.data, DataChoice::File, "Another file")
            .on_hover_text("A .jsonl, .json or .parquet file of rows (for multiple choice: context, choices, gold)");
        ui.add_enabled_ui(prefs.data == DataChoice::File, |ui| {
            ui.horizontal(|ui| {
                ui.add_space(22.0);
                ui.add(
                    egui::TextEdit::singleline(&mut prefs.file)
                        .hint_text("path to a .jsonl file")
                        .desired_width((ui.available_width() - 95.0).max(80.0)),
                );
                if ui.add_enabled(!self.picker.is_open(), egui::Button::new("Browse…")).clicked() {
                    let current = prefs.file.clone();
                    self.open_picker(ui, PickKind::DatasetFile, PickFor::PromptFile, &current);
                }
            });
        });
        ui.add_space(4.0);
        ui.horizontal(|ui| {
            let l = widgets::setting_label_ui(ui, "Limit", "Evaluate only the first N rows of each target (0: all)");
            ui.add(egui::DragValue::new(&mut prefs.limit).range(0..=1_000_000).speed(1.0)).labelled_by(l.id);
            ui.label(RichText::new(if prefs.limit == 0 { "all rows" } else { "rows" }).weak());
        });
    }

    fn task_ui(&mut self, ui: &mut Ui, prefs: &mut EvalPrefs, runs: &[RunInfo]) {
        ui.set_width(ui.available_width());
        ui.label(RichText::new("3 · Task").strong());
        ui.horizontal_wrapped(|ui| {
            for task in TaskChoice::ALL {
                let picked = ui.radio_value(&mut prefs.task, task, task.title()).on_hover_text(task.explain());
                if picked.clicked() && task == TaskChoice::Preference {
                    // Score pairs as the picked checkpoints' run trained, when it was a preference run.
                    super::eval_setup::adopt_run_method(prefs, super::eval_setup::picked_run_config(prefs, runs));
                }
            }
        });
        ui.label(RichText::new(prefs.task.explain()).small().weak());
        egui::Grid::new("eval-task-options").num_columns(2).spacing([10.0, 6.0]).show(ui, |ui| {
            if prefs.task == TaskChoice::Generate {
                let l = widgets::setting_label_ui(ui, "Max tokens", "Longest answer, in tokens");
                ui.add(egui::DragValue::new(&mut prefs.max_tokens).range(1..=4096)).labelled_by(l.id);
                ui.end_row();
                let l = widgets::setting_label_ui(ui, "Temperature", "0 answers greedily (the same answer every time)");
                ui.add(egui::DragValue::new(&mut prefs.temperature).range(0.0..=2.0).speed(0.05).fixed_decimals(2))
                    .labelled_by(l.id);
                ui.end_row();
                let l = widgets::setting_label_ui(ui, "Regex", "An answer scores 1 when this regex matches it");
                ui.add(egui::TextEdit::singleline(&mut prefs.regex).hint_text("optional, e.g. ^\\d+$"))
                    .labelled_by(l.id);
                ui.end_row();
                let l = widgets::setting_label_ui(
                    ui,
                    "Judge model",
                    "A local model (folder or .gguf) that scores each answer 1-10 against the reference",
                );
                ui.horizontal(|ui| {
                    ui.add(egui::TextEdit::singleline(&mut prefs.judge).hint_text("optional").desired_width(170.0))
                        .labelled_by(l.id);
                    if ui.add_enabled(!self.picker.is_open(), egui::Button::new("Browse…")).clicked() {
                        let current = prefs.judge.clone();
                        self.open_picker(ui, PickKind::ModelFile, PickFor::Judge, &current);
                    }
                });
                ui.end_row();
            } else {
                if prefs.task == TaskChoice::Preference {
                    preference_task_ui(ui, prefs);
                }
                let l =
                    widgets::setting_label_ui(ui, "Batch size", "Rows per forward pass: more is faster, needs memory");
                ui.add(egui::DragValue::new(&mut prefs.batch_size).range(1..=256)).labelled_by(l.id);
                ui.end_row();
            }
        });
    }
}

/// The preference task's method (DPO or ORPO) and parameters, grid rows, with the engine's refusal of them.
fn preference_task_ui(ui: &mut Ui, prefs: &mut EvalPrefs) {
    use crate::engine::train::Method;
    let help = "How pairs are scored: DPO's rewards are relative to the base model (the adapter switched off), \
                ORPO's are the answers' own per-token log-probabilities";
    let l = widgets::setting_label_ui(ui, "Method", help);
    ui.horizontal(|ui| {
        for m in [Method::Dpo, Method::Orpo] {
            if ui
                .radio(prefs.method == m, m.name().to_uppercase())
                .labelled_by(l.id)
                .on_hover_text(m.describe())
                .clicked()
            {
                prefs.method = m;
                prefs.preference = super::preference_fields::settings_for(m, prefs.preference);
            }
        }
    });
    ui.end_row();
    super::preference_fields::preference_rows_ui(ui, prefs.method, &mut prefs.preference);
    if let Some(e) = super::preference_fields::settings_error(prefs.method, &prefs.preference) {
        ui.label("");
        ui.label(RichText::new(e).color(palette::WARN));
        ui.end_row();
    }
}

/// One run's checkpoints as checkboxes, with All / None.
fn run_checkpoints_ui(ui: &mut Ui, prefs: &mut EvalPrefs, run: &RunInfo, model: Option<&std::path::Path>) {
    let picked =
        |prefs: &EvalPrefs, p: &std::path::Path| prefs.checkpoints.iter().any(|c| crate::worker::same_path(c, p));
    let count = run.checkpoints.iter().filter(|c| picked(prefs, &c.path)).count();
    ui.horizontal(|ui| {
        ui.label(RichText::new(run.title()).strong()).on_hover_text(run.dir.display().to_string());
        ui.label(RichText::new(format!("{count}/{}", run.checkpoints.len())).weak());
        // Known before Run: the evaluation would refuse an adapter that does not fit the loaded model.
        let trained_on = run.config.as_ref().map(|c| c.model.as_path());
        if let (Some(trained_on), Some(model)) = (trained_on, model) {
            if !crate::worker::same_path(trained_on, model) {
                ui.label(
                    RichText::new(format!("trained on {}", crate::worker::display_name(trained_on)))
                        .color(palette::WARN),
                )
                .on_hover_text(format!(
                    "This run trained on {}, not the loaded model: its checkpoints fit only if that is the same \
                         model (the evaluation refuses them otherwise)",
                    trained_on.display()
                ));
            }
        }
        if ui.small_button("All").clicked() {
            for c in &run.checkpoints {
                super::eval_setup::toggle(&mut prefs.checkpoints, &c.path, true);
            }
            super::eval_setup::adopt_run_method(prefs, run.config.as_ref());
        }
        if ui.small_button("None").clicked() {
            for c in &run.checkpoints {
                super::eval_setup::toggle(&mut prefs.checkpoints, &c.path, false);
            }
        }
    });
    ui.horizontal_wrapped(|ui| {
        ui.add_space(12.0);
        for c in &run.checkpoints {
            let mut on = picked(prefs, &c.path);
            let hover = match c.val_loss {
                Some(v) => format!("{} · validation loss {}", c.path.display(), widgets::fmt_loss(v)),
                None => c.path.display().to_string(),
            };
            if ui.checkbox(&mut on, format!("step {}", c.step)).on_hover_text(hover).changed() {
                super::eval_setup::toggle(&mut prefs.checkpoints, &c.path, on);
                if on {
                    super::eval_setup::adopt_run_method(prefs, run.config.as_ref());
                }
            }
        }
    });
}

/// Add an adapter folder once.
fn add_adapter(prefs: &mut EvalPrefs, path: PathBuf) {
    if !prefs.adapters.iter().any(|a| crate::worker::same_path(a, &path)) {
        prefs.adapters.push(path);
    }
}
