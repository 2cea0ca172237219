//! The chat's two columns side by side: what each answers with (the base model or any checkpoint or adapter
//! folder) and the heading that says so, "baseline r8 · step 40" (the run's name from the run list when the
//! checkpoint is one of its checkpoints, else its folder names). The left column's picker lives here; the
//! right column is the chat's adapter (the chat page's own).

use super::chat_adapter::AdapterLoader;
use super::chat_transcript::checkpoint_title;
use crate::worker::{ChatSide, CheckpointInfo, Command};
use egui::{RichText, Ui};
use std::path::{Path, PathBuf};

/// A column's heading: "Base model", or the checkpoint's run (its user-given name when the run list has it)
/// and step.
pub fn column_title(adapter: Option<&Path>, checkpoints: &[(String, &CheckpointInfo)]) -> String {
    let Some(path) = adapter else { return "Base model".into() };
    match checkpoints.iter().find(|(_, c)| c.path == path) {
        Some((run, c)) => format!("{run} · step {}", c.step),
        None => checkpoint_title(path),
    }
}

/// The left column's picker (side by side): the base model, any checkpoint of the runs, a folder loaded
/// before (checked again against the model), or "Load a folder…" (the adapter loader, for the left column).
pub fn left_pick_ui(
    ui: &mut Ui,
    left: &mut Option<PathBuf>,
    loader: &mut AdapterLoader,
    recent: &[PathBuf],
    checkpoints: &[(String, &CheckpointInfo)],
    commands: &mut Vec<Command>,
) {
    ui.horizontal_wrapped(|ui| {
        let l = ui.label(RichText::new("Left column").weak()).on_hover_text(
            "Side by side, the left column answers with the base model or any checkpoint, the right one with the \
             adapter above: the same prompt goes to both",
        );
        egui::ComboBox::from_id_salt("left-pick")
            .selected_text(column_title(left.as_deref(), checkpoints))
            .width(260.0)
            .show_ui(ui, |ui| match model_menu_ui(ui, "Base model", left.as_deref(), recent, checkpoints) {
                Some(ColumnPick::Nothing) => *left = None,
                Some(ColumnPick::Checkpoint(path)) => *left = Some(path),
                Some(ColumnPick::Folder(path)) => {
                    loader.target = ChatSide::Left;
                    loader.check(path, commands);
                }
                None => {}
            })
            .response
            .labelled_by(l.id);
        if ui
            .add_enabled(!loader.is_checking(), egui::Button::new("Load folder for left…"))
            .on_hover_text("Use an adapter folder from anywhere in the left column; it is checked against the model")
            .clicked()
        {
            loader.target = ChatSide::Left;
            loader.open = true;
        }
    });
}

/// What was picked in a column's model menu.
pub enum ColumnPick {
    /// The first entry: the base model (left) or no adapter (right).
    Nothing,
    /// A checkpoint of a run in the run list: usable at once.
    Checkpoint(PathBuf),
    /// A folder loaded before: to be checked against the model again before use.
    Folder(PathBuf),
}

/// The entries of a column's model menu (inside a combo box): `nothing_label`, each checkpoint of the runs, and
/// the folders loaded before that are not among them. `current` is the column's adapter. Returns what was
/// clicked, if it changes anything.
pub fn model_menu_ui(
    ui: &mut Ui,
    nothing_label: &str,
    current: Option<&Path>,
    recent: &[PathBuf],
    checkpoints: &[(String, &CheckpointInfo)],
) -> Option<ColumnPick> {
    let mut picked = None;
    if ui.selectable_label(current.is_none(), nothing_label).clicked() {
        picked = Some(ColumnPick::Nothing);
    }
    for (run, c) in checkpoints {
        let selected = current == Some(c.path.as_path());
        if ui.selectable_label(selected, format!("{run} · step {}", c.step)).clicked() {
            picked = Some(ColumnPick::Checkpoint(c.path.clone()));
        }
    }
    let others: Vec<&PathBuf> = recent.iter().filter(|p| !checkpoints.iter().any(|(_, c)| &c.path == *p)).collect();
    if !others.is_empty() {
        ui.separator();
        ui.label(RichText::new("Loaded from folders").weak().small());
    }
    for path in others {
        let selected = current == Some(path.as_path());
        let item = ui.selectable_label(selected, checkpoint_title(path));
        if item.on_hover_text(path.display().to_string()).clicked() && !selected {
            picked = Some(ColumnPick::Folder(path.clone()));
        }
    }
    picked
}
