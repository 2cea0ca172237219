//! A run's note on the checkpoints page: the note shown under the run's title, and an inline editor that checks
//! it as it is typed (the engine's `validate_run_notes`) and asks the worker to store it in the run's run.json
//! ([`Command::SetRunNotes`]). An empty note clears it.

use super::widgets::palette;
use crate::engine::train::run_label::{validate_run_notes, MAX_RUN_NOTES_LEN};
use crate::worker::{Command, RunInfo};
use egui::{RichText, Ui};
use std::path::PathBuf;

/// The note editor of one run, when open.
pub struct RunNotesEditor {
    pub run_dir: PathBuf,
    current: Option<String>,
    text: String,
    focus_requested: bool,
}

/// What the note area asks for this frame.
pub enum NotesClick {
    None,
    /// Open the editor for this run.
    Edit,
    /// Store the note: the command to send.
    Save(Command),
    Cancel,
}

impl RunNotesEditor {
    pub fn new(run: &RunInfo) -> Self {
        Self {
            run_dir: run.dir.clone(),
            current: run.notes.clone(),
            text: run.notes.clone().unwrap_or_default(),
            focus_requested: false,
        }
    }

    pub fn ui(&mut self, ui: &mut Ui) -> NotesClick {
        let checked = validate_run_notes(&self.text);
        let unchanged = checked.as_ref().is_ok_and(|n| *n == self.current);
        let l = ui.label("Note");
        let edit = ui
            .add(
                egui::TextEdit::multiline(&mut self.text)
                    .id_salt("run-notes-edit")
                    .hint_text("What this run tried, what you saw…")
                    .desired_rows(3)
                    .desired_width(ui.available_width().min(640.0)),
            )
            .labelled_by(l.id);
        if !self.focus_requested {
            // Opened to be typed in.
            edit.request_focus();
            self.focus_requested = true;
        }
        let mut click = NotesClick::None;
        ui.horizontal(|ui| {
            let save = ui
                .add_enabled(checked.is_ok() && !unchanged, egui::Button::new("Save note"))
                .on_hover_text("Store this note in the run's run.json (an empty note clears it)")
                .on_disabled_hover_text("Change the note first");
            if let (Ok(notes), true) = (&checked, save.clicked()) {
                let notes = notes.clone().unwrap_or_default();
                click = NotesClick::Save(Command::SetRunNotes { run_dir: self.run_dir.clone(), notes });
            }
            if ui.button("Cancel").clicked() {
                click = NotesClick::Cancel;
            }
            let (text, color) = match &checked {
                Err(e) => (e.to_string(), palette::ERROR),
                Ok(_) => (
                    format!("{} / {MAX_RUN_NOTES_LEN} characters", self.text.trim().chars().count()),
                    ui.visuals().weak_text_color(),
                ),
            };
            ui.label(RichText::new(text).small().color(color));
        });
        click
    }
}

/// The run's note (or a hint) and the button that opens the editor.
pub fn notes_view_ui(ui: &mut Ui, run: &RunInfo) -> NotesClick {
    let mut click = NotesClick::None;
    ui.horizontal_wrapped(|ui| {
        match &run.notes {
            Some(notes) => ui.add(egui::Label::new(RichText::new(notes).italics()).wrap()),
            None => ui.label(RichText::new("No note.").weak()),
        };
        let text = if run.notes.is_some() { "Edit note…" } else { "Add note…" };
        if ui.small_button(text).on_hover_text("Write what this run tried or showed; kept in its run.json").clicked() {
            click = NotesClick::Edit;
        }
    });
    click
}
