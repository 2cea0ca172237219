//! The chat's "Load adapter…": an adapter folder from anywhere (a PEFT adapter saved by `peft`'s
//! `save_pretrained`, a checkpoint copied from another machine), typed or chosen with the folder picker, and
//! checked by the worker against the loaded model before the chat uses it ([`Command::CheckAdapter`]): a folder
//! that is not an adapter, or holds one for another model (other hidden size, modules this model lacks), is
//! refused with the engine's message and the chat keeps its adapter. The folder goes to the column that asked
//! ([`AdapterLoader::target`]): the right one (the chat's adapter) or, side by side, the left one.

use super::file_picker::{PanelPicker, PickKind};
use super::widgets::{banner_ui, palette, Tone};
use crate::worker::{AdapterCheck, ChatSide, Command};
use egui::{RichText, Ui};
use std::path::{Path, PathBuf};

/// The loader row and the check in flight.
#[derive(Default)]
pub struct AdapterLoader {
    /// Whether the row with the folder field is shown.
    pub open: bool,
    /// The folder field.
    pub input: String,
    picker: PanelPicker,
    /// The folder being checked.
    checking: Option<PathBuf>,
    /// The last folder refused, and why.
    pub error: Option<(PathBuf, String)>,
    /// What the adapter in use is, when it was loaded here.
    pub loaded: Option<(PathBuf, AdapterCheck)>,
    /// The chat column the folder being chosen is for.
    pub target: ChatSide,
}

impl AdapterLoader {
    pub fn is_checking(&self) -> bool {
        self.checking.is_some()
    }

    /// Ask the worker to check `path`; the answer comes as `AdapterChecked` or `AdapterCheckFailed`.
    pub fn check(&mut self, path: PathBuf, commands: &mut Vec<Command>) {
        self.input = path.display().to_string();
        self.error = None;
        self.checking = Some(path.clone());
        commands.push(Command::CheckAdapter { path });
    }

    /// The check of `path` passed: returns true when it is the folder asked for (the chat then uses it).
    pub fn on_checked(&mut self, path: PathBuf, check: AdapterCheck) -> bool {
        if self.checking.as_ref() != Some(&path) {
            return false;
        }
        self.checking = None;
        self.open = false;
        self.loaded = Some((path, check));
        true
    }

    pub fn on_failed(&mut self, path: PathBuf, message: String) {
        if self.checking.as_ref() == Some(&path) {
            self.checking = None;
            self.open = true;
            self.error = Some((path, message));
        }
    }

    /// The folder row: path field, Browse…, Load and Cancel; a picked folder is checked at once.
    pub fn row_ui(&mut self, ui: &mut Ui, commands: &mut Vec<Command>) {
        if let Some(path) = self.picker.take_picked() {
            self.check(path, commands);
        }
        if !self.open {
            return;
        }
        ui.horizontal(|ui| {
            let l = ui.label("Adapter folder");
            let busy = self.is_checking();
            let response = ui
                .add(
                    egui::TextEdit::singleline(&mut self.input)
                        .hint_text("a folder with adapter_config.json and adapter_model.safetensors")
                        .desired_width((ui.available_width() - 260.0).max(200.0)),
                )
                .labelled_by(l.id);
            let enter = response.lost_focus() && ui.input(|i| i.key_pressed(egui::Key::Enter));
            if ui
                .add_enabled(!busy && !self.picker.is_open(), egui::Button::new("Browse…"))
                .on_hover_text("Choose the adapter folder")
                .clicked()
            {
                self.picker.open(ui, PickKind::Folder, &self.input);
            }
            let typed = !self.input.trim().is_empty();
            let load = ui
                .add_enabled(!busy && typed, egui::Button::new(RichText::new("Load").strong()))
                .on_hover_text("Check the folder against the loaded model, then chat with it");
            if (load.clicked() || (enter && typed)) && !busy {
                self.check(PathBuf::from(self.input.trim()), commands);
            }
            if ui.button("Cancel").clicked() {
                self.open = false;
                self.error = None;
            }
            if busy {
                ui.spinner();
            }
        });
        if let Some(note) = &self.picker.note {
            banner_ui(ui, Tone::Warn, note.clone());
        }
        if let Some((path, message)) = &self.error {
            let text = if message.contains(&path.display().to_string()) {
                format!("Cannot use this adapter: {message}")
            } else {
                format!("Cannot use {} as an adapter: {message}", path.display())
            };
            banner_ui(ui, Tone::Error, text);
        }
    }

    /// A line on the adapter in use when it was loaded here: its rank, alpha and modules, and the warning
    /// when it names another base.
    pub fn info_ui(&self, ui: &mut Ui, adapter: Option<&Path>) {
        let Some((path, check)) = self.loaded.as_ref().filter(|(p, _)| Some(p.as_path()) == adapter) else {
            return;
        };
        let s = &check.summary;
        let base = check.base_named.as_deref().map(|b| format!(" · trained on {b}")).unwrap_or_default();
        ui.label(
            RichText::new(format!(
                "Adapter {}: rank {}, alpha {}{}{}, {} adapted linears ({}){base}",
                path.display(),
                s.rank,
                s.alpha,
                if s.use_rslora { " (rsLoRA)" } else { "" },
                if s.use_dora { " · DoRA" } else { "" },
                s.adapted_linears,
                s.targets.join(", ")
            ))
            .color(palette::MASKED_FG)
            .small(),
        );
        if let Some(w) = &check.warning {
            banner_ui(ui, Tone::Warn, w.clone());
        }
    }
}
