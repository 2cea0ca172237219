//! Rows of the LoRA settings page's grids (a label with its help, then the inputs), and the bookkeeping rows of
//! the Optimization card: evaluation, early stopping, checkpoints and their limit, and where the run is written.

use super::glossary;
use super::widgets;
use crate::engine::train::TrainConfig;
use egui::{DragValue, RichText, Ui};
use std::path::PathBuf;

/// A grid row: a label with help on hover, then the input(s), named by the label for screen readers.
pub(super) fn row_ui(ui: &mut Ui, label: &str, help: &str, add: impl FnOnce(&mut Ui)) {
    let l = widgets::setting_label_ui(ui, label, help);
    ui.horizontal(|ui| {
        ui.label_inputs_by(l.id, |ui| add(ui));
    })
    .response
    .on_hover_text(help);
    ui.end_row();
}

/// [`row_ui`] for inputs that take several lines.
pub(super) fn block_row_ui(ui: &mut Ui, label: &str, help: &str, add: impl FnOnce(&mut Ui)) {
    let l = widgets::setting_label_ui(ui, label, help);
    ui.vertical(|ui| {
        ui.label_inputs_by(l.id, |ui| add(ui));
    })
    .response
    .on_hover_text(help);
    ui.end_row();
}

/// Evaluation, checkpoints and where the run is written.
pub(super) fn bookkeeping_rows_ui(ui: &mut Ui, cfg: &mut TrainConfig) {
    row_ui(ui, "Evaluate every", "Compute the validation loss every N steps (0: only at the end).", |ui| {
        ui.add(DragValue::new(&mut cfg.val_every).range(0..=1_000_000).suffix(" steps"));
        ui.label("using");
        ui.add(DragValue::new(&mut cfg.val_batches).range(0..=100_000).suffix(" batches"));
        ui.label(RichText::new("(0 = all)").weak());
    });
    row_ui(ui, "Save every", "Write a checkpoint every N steps (0: only at the end). Checkpoints appear in the Checkpoints page as they are written.", |ui| {
        ui.add(DragValue::new(&mut cfg.save_every).range(0..=1_000_000).suffix(" steps"));
    });
    stopping_rows_ui(ui, cfg);
    row_ui(
        ui,
        "Runs folder",
        "Where run folders are written: <runs>/<run name>/{run.json, metrics.jsonl, checkpoint-N/}.",
        |ui| {
            let mut s = cfg.out.display().to_string();
            if ui.add(egui::TextEdit::singleline(&mut s).desired_width(200.0)).changed() {
                cfg.out = PathBuf::from(s);
            }
        },
    );
    row_ui(ui, "Run name", "Folder name of the run; leave empty for an automatic one (date, model, rank).", |ui| {
        let name = cfg.run_name.get_or_insert_with(String::new);
        ui.add(egui::TextEdit::singleline(name).hint_text("automatic").desired_width(200.0));
    });
}

/// Early stopping (patience, min delta) and the checkpoint limit.
fn stopping_rows_ui(ui: &mut Ui, cfg: &mut TrainConfig) {
    row_ui(ui, glossary::EARLY_STOPPING.name, &glossary::EARLY_STOPPING.hover(), |ui| {
        let mut on = cfg.early_stopping_patience > 0;
        if ui.checkbox(&mut on, "stop after").changed() {
            cfg.early_stopping_patience = if on { 3 } else { 0 };
        }
        if on {
            let unit = if cfg.early_stopping_patience == 1 { " eval" } else { " evals" };
            ui.add(DragValue::new(&mut cfg.early_stopping_patience).range(1..=10_000).suffix(unit));
            ui.label("without a gain of");
            ui.add(DragValue::new(&mut cfg.early_stopping_min_delta).range(0.0..=10.0).speed(0.001).max_decimals(4));
        }
    });
    row_ui(ui, glossary::SAVE_LIMIT.name, &glossary::SAVE_LIMIT.hover(), |ui| {
        let mut on = cfg.save_total_limit.is_some();
        if ui.checkbox(&mut on, "keep the newest").changed() {
            cfg.save_total_limit = on.then_some(3);
        }
        if let Some(n) = &mut cfg.save_total_limit {
            ui.add(DragValue::new(n).range(1..=100_000));
            ui.label(RichText::new("+ the best").weak());
        } else {
            ui.label(RichText::new("(all kept)").weak());
        }
    });
}
