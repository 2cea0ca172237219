//! The dataset page's "Format and columns" card: the format each split was detected as, and, when detection
//! cannot decide (ambiguous or unknown), a format to pick and the format's fields to map onto the file's
//! columns, from dropdowns of the columns the report found. The choice lives in the training settings
//! (`data_format`, `data_columns`), so a run started here reads the rows as the CLI's `--format` and
//! `--columns` would; the rules (which fields a format has, whether a mapping fits the file) are the engine's.

use super::widgets::{banner_ui, card_ui, palette, section_ui, Tone};
use crate::engine::data::{ColumnMap, DatasetFormat, DatasetReport, Detection, FormatChoice, ReadOptions};
use egui::{RichText, Ui};

/// What the card shows when no column is mapped to a field: the field's own name is read.
const SAME_NAME: &str = "(same name)";

/// The card; edits `read` (the training settings' reading choice). Opens itself when a split needs a choice
/// or a choice has been made.
pub fn reading_ui(ui: &mut Ui, report: &DatasetReport, read: &mut ReadOptions) {
    let needs_choice = report.needs_choice();
    section_ui(ui, "Format and columns");
    card_ui(ui, |ui| {
        ui.set_width(ui.available_width());
        match needs_choice {
            Some(split) => {
                banner_ui(ui, Tone::Warn, choice_hint(split.split.as_str(), &split.detection, &split.columns))
            }
            None => banner_ui(ui, Tone::Ok, detected_line(report)),
        };
        let columns = report.splits.first().map(|s| s.columns.clone()).unwrap_or_default();
        let open = needs_choice.is_some() || !read.is_default();
        egui::CollapsingHeader::new("Read the rows as another format, or map columns")
            .id_salt("reading")
            .open(open.then_some(true))
            .show(ui, |ui| {
                format_row_ui(ui, report, read);
                if let Some(format) = read.format.format() {
                    mapping_ui(ui, format, &columns, &mut read.columns);
                } else if !read.columns.is_empty() {
                    ui.label(format!("Columns mapped: {}", read.columns));
                    if ui.button("Clear the mapping").clicked() {
                        read.columns = ColumnMap::default();
                    }
                }
                status_ui(ui, report, read, &columns);
            });
    });
}

/// "train: chat (detected from row 1) · test: chat (...)".
fn detected_line(report: &DatasetReport) -> String {
    let splits: Vec<String> =
        report.splits.iter().map(|s| format!("{}: {}", s.split, s.detection.describe(s.unit))).collect();
    format!("Format: {}", splits.join(" · "))
}

fn choice_hint(split: &str, detection: &Detection, columns: &[String]) -> String {
    let columns = if columns.is_empty() { "none".to_string() } else { columns.join(", ") };
    match detection {
        Detection::Ambiguous { candidates, .. } => format!(
            "The {split} split's rows have the columns of several formats ({}), so none was guessed. Pick the \
             format to read them as. Columns: {columns}.",
            candidates.iter().map(|f| f.name()).collect::<Vec<_>>().join(", ")
        ),
        Detection::Mixed { .. } => format!(
            "The {split} split's files are in different formats ({}); convert them or open one file.",
            detection.describe(Default::default())
        ),
        _ => format!(
            "No known format in the {split} split: its columns are {columns}. Pick a format and map its fields to \
             these columns."
        ),
    }
}

/// The format choice: `auto` and every format, an ambiguous split's candidates marked.
fn format_row_ui(ui: &mut Ui, report: &DatasetReport, read: &mut ReadOptions) {
    let candidates: Vec<DatasetFormat> = report
        .splits
        .iter()
        .filter_map(|s| match &s.detection {
            Detection::Ambiguous { candidates, .. } => Some(candidates.clone()),
            _ => None,
        })
        .flatten()
        .collect();
    ui.horizontal_wrapped(|ui| {
        ui.label("Format");
        for choice in FormatChoice::ALL {
            let name = match choice.format() {
                Some(f) if candidates.contains(&f) => format!("{} (candidate)", choice.name()),
                _ => choice.name().to_string(),
            };
            let before = read.format;
            ui.selectable_value(&mut read.format, choice, name);
            if read.format != before {
                // Fields of another format mean nothing to the new one.
                let keep: Vec<(String, String)> = read
                    .columns
                    .iter()
                    .filter(|(field, _)| read.format.format().is_none_or(|f| f.columns().any(|c| c == *field)))
                    .map(|(a, b)| (a.to_string(), b.to_string()))
                    .collect();
                read.columns = ColumnMap(keep.into_iter().collect());
            }
        }
    });
}

/// One dropdown per field of `format`: the file's column read as that field.
fn mapping_ui(ui: &mut Ui, format: DatasetFormat, columns: &[String], map: &mut ColumnMap) {
    egui::Grid::new("column-mapping").num_columns(2).spacing([16.0, 4.0]).show(ui, |ui| {
        for field in format.columns() {
            let required = format.required_columns().contains(&field);
            // `field =` as --columns writes it (field=column).
            let label = ui.label(if required { format!("{field} =") } else { format!("{field} (optional) =") });
            let current = map.get(field).unwrap_or(SAME_NAME).to_string();
            egui::ComboBox::from_id_salt(("map", field))
                .selected_text(&current)
                .show_ui(ui, |ui| {
                    if ui.selectable_label(current == SAME_NAME, SAME_NAME).clicked() {
                        map.set(field, "");
                    }
                    for column in columns {
                        if ui.selectable_label(current == *column, column).clicked() {
                            map.set(field, column);
                        }
                    }
                })
                .response
                .labelled_by(label.id);
            ui.end_row();
        }
    });
}

/// What training will read, by the engine's own checks of the choice against the file's columns.
fn status_ui(ui: &mut Ui, report: &DatasetReport, read: &ReadOptions, columns: &[String]) {
    let unmapped = read.unmapped_fields(columns);
    let problem = read.validate().err().map(|e| e.to_string()).or_else(|| {
        read.missing_column(columns)
            .map(|(field, column)| format!("{field} is mapped to `{column}`, which this file does not have"))
    });
    let problem = problem.or_else(|| {
        (!unmapped.is_empty()).then(|| {
            format!(
                "Map {}: the file has no column of that name (its columns: {})",
                unmapped.join(" and "),
                columns.join(", ")
            )
        })
    });
    match problem {
        Some(p) => {
            ui.label(RichText::new(p).color(palette::ERROR));
        }
        None => {
            ui.label(RichText::new(format!("Training reads the rows as: {}", read.describe())).color(palette::OK));
        }
    }
    if !read.is_default() || *read != report.read {
        let cli = format!(
            "--format {}{}",
            read.format,
            if read.columns.is_empty() { String::new() } else { format!(" --columns {}", read.columns) }
        );
        let text = if *read == report.read {
            format!("The splits above were read this way (the CLI: {cli}).")
        } else {
            format!("Reading the rows again as {} (the CLI: {cli})…", read.describe())
        };
        ui.label(RichText::new(text).weak());
    }
}
