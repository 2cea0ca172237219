//! The checkpoints page's runs table: the runs ticked in the run list side by side, one column per run and one
//! row per setting (the engine's `run_table`, the same rows `runs show` prints), rows whose values differ
//! tinted and marked, with an "Only differences" switch. Columns keep a readable width; with more runs than
//! fit, the table scrolls sideways.

use super::widgets::palette;
use crate::engine::train::run_table::{run_table, RunTable};
use crate::worker::RunInfo;
use egui::{RichText, Ui};

/// Narrowest and widest run column.
const COLUMN_MIN_WIDTH: f32 = 170.0;
const COLUMN_MAX_WIDTH: f32 = 320.0;
const SETTING_WIDTH: f32 = 130.0;

/// The table's own state: whether only differing rows are shown.
#[derive(Default)]
pub struct RunsTable {
    pub only_differences: bool,
}

/// The tint of a row whose values differ.
pub fn differs_fill() -> egui::Color32 {
    palette::WARN.gamma_multiply(0.16)
}

impl RunsTable {
    /// Draw the table of `runs` (the ticked runs, in list order).
    pub fn ui(&mut self, ui: &mut Ui, runs: &[&RunInfo]) {
        let table = run_table(runs);
        let differing = table.rows.iter().filter(|r| r.differs).count();
        ui.horizontal(|ui| {
            ui.label(RichText::new("Settings side by side").strong());
            ui.checkbox(&mut self.only_differences, "Only differences")
                .on_hover_text("Hide the rows where every run has the same value");
            let text = match (runs.len(), differing) {
                (1, _) => "tick another run to compare".to_string(),
                (_, 0) => "the runs have the same settings".to_string(),
                (_, n) => format!("{n} rows differ (tinted, ≠)"),
            };
            ui.label(RichText::new(text).weak().small());
        });
        let columns = runs.len().max(1) as f32;
        let spare = ui.available_width() - SETTING_WIDTH - 24.0;
        let column_width = (spare / columns - 12.0).clamp(COLUMN_MIN_WIDTH, COLUMN_MAX_WIDTH);
        egui::ScrollArea::horizontal().id_salt("runs-table-scroll").show(ui, |ui| {
            self.grid_ui(ui, &table, column_width);
        });
    }

    fn grid_ui(&self, ui: &mut Ui, table: &RunTable, column_width: f32) {
        egui::Grid::new("runs-table").num_columns(table.runs.len() + 1).spacing([12.0, 2.0]).show(ui, |ui| {
            ui.label("");
            for title in &table.runs {
                cell_ui(ui, column_width, None, RichText::new(title).strong());
            }
            ui.end_row();
            for row in table.rows(self.only_differences) {
                let fill = row.differs.then(differs_fill);
                let setting = if row.differs { format!("≠ {}", row.setting) } else { row.setting.clone() };
                let name = RichText::new(setting);
                let name = if row.differs { name.color(palette::WARN) } else { name.weak() };
                cell_ui(ui, SETTING_WIDTH, fill, name).on_hover_text(if row.differs {
                    "The runs differ here"
                } else {
                    "The same in every run"
                });
                for value in &row.values {
                    cell_ui(ui, column_width, fill, RichText::new(value));
                }
                ui.end_row();
            }
        });
    }
}

/// One cell: a fixed width, the text wrapped inside it, tinted when its row differs.
fn cell_ui(ui: &mut Ui, width: f32, fill: Option<egui::Color32>, text: RichText) -> egui::Response {
    egui::Frame::new()
        .fill(fill.unwrap_or(egui::Color32::TRANSPARENT))
        .inner_margin(egui::Margin::symmetric(4, 2))
        .show(ui, |ui| {
            ui.set_width(width);
            ui.add(egui::Label::new(text).wrap())
        })
        .inner
}
