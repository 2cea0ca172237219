//! Renaming a run on the checkpoints page: an inline editor under the run's title that checks the name as it
//! is typed (the engine's `validate_run_label`: trimmed, not empty, at most 80 characters, one line) and asks
//! the worker to store it in the run's run.json. The run folder is never moved or renamed.

use super::widgets::palette;
use crate::engine::train::run_label::{validate_run_label, MAX_RUN_LABEL_LEN};
use crate::worker::{Command, RunInfo};
use egui::{RichText, Ui};
use std::path::PathBuf;

/// The open rename editor of one run.
pub struct RunRename {
    pub run_dir: PathBuf,
    folder_name: String,
    current: String,
    text: String,
    focus_requested: bool,
}

/// What the editor asks for this frame.
pub enum RenameClick {
    None,
    /// Store the name: the command to send.
    Save(Command),
    Cancel,
}

impl RunRename {
    /// An editor for `run`, starting from its current name.
    pub fn new(run: &RunInfo) -> Self {
        Self {
            run_dir: run.dir.clone(),
            folder_name: run.name.clone(),
            current: run.title().to_string(),
            text: run.title().to_string(),
            focus_requested: false,
        }
    }

    pub fn ui(&mut self, ui: &mut Ui) -> RenameClick {
        let checked = validate_run_label(&self.text);
        let unchanged = checked.as_deref().is_ok_and(|l| l == self.current);
        let mut click = RenameClick::None;
        ui.horizontal(|ui| {
            let label = ui.label("New run name");
            let mut output = egui::TextEdit::singleline(&mut self.text)
                .hint_text(self.folder_name.as_str())
                .desired_width(340.0)
                .show(ui);
            let edit = (*output.response).clone().labelled_by(label.id);
            if !self.focus_requested {
                // Focused with the current name selected: typing replaces it, the arrow keys keep it.
                edit.request_focus();
                let everything = egui::text::CCursorRange::two(
                    egui::text::CCursor::new(0),
                    egui::text::CCursor::new(self.text.chars().count()),
                );
                output.state.cursor.set_char_range(Some(everything));
                output.state.store(ui.ctx(), edit.id);
                self.focus_requested = true;
            }
            let enter = edit.lost_focus() && ui.input(|i| i.key_pressed(egui::Key::Enter));
            let escape = ui.input(|i| i.key_pressed(egui::Key::Escape));
            let save = ui
                .add_enabled(checked.is_ok() && !unchanged, egui::Button::new("Save name"))
                .on_hover_text("Store this name in the run's run.json; the folder keeps its name")
                .on_disabled_hover_text("Type a new name first");
            if let Ok(label) = &checked {
                if (save.clicked() || enter) && !unchanged {
                    click =
                        RenameClick::Save(Command::RenameRun { run_dir: self.run_dir.clone(), label: label.clone() });
                }
            }
            if ui.button("Cancel").clicked() || escape || (enter && unchanged) {
                click = RenameClick::Cancel;
            }
        });
        let count = self.text.trim().chars().count();
        let (text, color) = match &checked {
            Err(e) => (e.to_string(), palette::ERROR),
            Ok(_) => (
                format!(
                    "{count} / {MAX_RUN_LABEL_LEN} characters · shown in the run list and the comparison; the folder \
                     stays {}",
                    self.folder_name
                ),
                ui.visuals().weak_text_color(),
            ),
        };
        ui.label(RichText::new(text).small().color(color));
        click
    }
}
