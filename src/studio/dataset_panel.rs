//! The dataset page: pick a `.jsonl`, `.json` or `.parquet` file or a folder of them (train/valid/test files, a
//! Hugging Face dataset repo's `data/` shards); see each split's files and detected format, pick the format and
//! map columns when detection cannot decide ([`super::dataset_reading`]), rows per split, every invalid row with
//! its line or row number, a token-length histogram against the maximum sequence length, and every row of each
//! split, paged and searched, rendered through the chat template with trained and masked tokens coloured
//! differently ([`super::dataset_rows`]).

use super::dataset_rows::{RowsSource, RowsView};
use super::file_picker::{PanelPicker, PickKind};
use super::panel_ctx::{Action, PanelCtx};
use super::widgets::{self, banner_ui, card_ui, fmt_count, palette, recent_paths_ui, section_ui, Tone};
use crate::engine::data::ReadOptions;
use crate::worker::{DatasetReport, Event, LengthHistogram, TokenStats};
use egui::{RichText, Ui};
use egui_plot::{Bar, BarChart, Legend, Plot, VLine};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// What an inspection depends on; a change of any part asks the worker again.
#[derive(Debug, Clone, PartialEq)]
pub struct InspectKey {
    pub path: PathBuf,
    /// The format and column mapping chosen on the page (a new choice reads the rows again).
    pub read: crate::engine::data::ReadOptions,
    pub max_seq_len: usize,
    pub train_on_prompt: bool,
    pub model: Option<PathBuf>,
}

#[derive(Default)]
pub struct DatasetPanel {
    picker: PanelPicker,
    pub report: Option<DatasetReport>,
    pub error: Option<(PathBuf, String)>,
    inspecting: Option<(InspectKey, Instant)>,
    last_key: Option<InspectKey>,
    histogram: Option<LengthHistogram>,
    /// "Find a dataset on Hugging Face".
    pub hub: super::hub_panel::DatasetSearch,
    /// Every row of each split, paged and searched.
    pub rows: RowsView,
    /// Reports received: a new one shows its rows again (the files may have changed).
    generation: u64,
}

impl DatasetPanel {
    pub fn is_inspecting(&self) -> bool {
        self.inspecting.is_some()
    }

    /// The report, if it belongs to `path`.
    pub fn report_for(&self, path: &Path) -> Option<&DatasetReport> {
        self.report.as_ref().filter(|r| r.path == path)
    }

    /// The worker's dataset events: inspections and pages of rows.
    pub fn on_event(&mut self, event: Event) {
        match event {
            Event::DatasetInspected(report) => self.on_inspected(*report),
            Event::DatasetFailed { path, error } => self.on_failed(path, error.message),
            Event::DatasetRows { id, page } => self.rows.on_page(id, *page),
            Event::DatasetRowsFailed { id, error, .. } => self.rows.on_failed(id, error.message),
            _ => {}
        }
    }

    pub fn on_inspected(&mut self, report: DatasetReport) {
        self.inspecting = None;
        self.generation += 1;
        self.error = None;
        self.histogram = report.tokens.as_ref().map(TokenStats::length_histogram);
        self.report = Some(report);
    }

    pub fn on_failed(&mut self, path: PathBuf, message: String) {
        self.inspecting = None;
        // The last report of the same dataset stays under the error: its format card is where a mapping that
        // failed is changed again.
        if self.report.as_ref().is_some_and(|r| r.path != path) {
            self.report = None;
            self.histogram = None;
        }
        self.error = Some((path, message));
    }

    /// Inspect the active dataset again when it, the sequence length, prompt masking or the model changed.
    pub fn refresh_if_stale(&mut self, key: Option<InspectKey>, actions: &mut Vec<Action>) {
        let Some(key) = key else { return };
        if self.inspecting.is_some() || self.last_key.as_ref() == Some(&key) {
            return;
        }
        self.last_key = Some(key.clone());
        actions.push(Action::Send(crate::worker::Command::InspectDataset {
            path: key.path.clone(),
            read: key.read.clone(),
            max_seq_len: key.max_seq_len,
            train_on_prompt: key.train_on_prompt,
            // The rows section pages through the rows itself.
            preview_rows: 0,
        }));
        self.inspecting = Some((key, Instant::now()));
    }

    /// Forget the last inspection so the next refresh asks again; a different path also clears what is shown.
    pub fn invalidate(&mut self, path: &Path) {
        self.last_key = None;
        if self.report.as_ref().is_some_and(|r| r.path != path) {
            self.report = None;
            self.histogram = None;
            self.rows.reset();
        }
        if self.error.as_ref().is_some_and(|e| e.0 != path) {
            self.error = None;
        }
    }

    pub fn ui(&mut self, ui: &mut Ui, ctx: &mut PanelCtx<'_>) {
        self.poll_picker(ctx);
        widgets::page_header_ui(
            ui,
            "Training data",
            "JSONL, JSON or parquet rows in chat ({\"messages\"}), ShareGPT ({\"conversations\"}), Alpaca ({\"instruction\", \"output\"}), completions ({\"prompt\", \"completion\"}), text ({\"text\"}), preference pairs ({\"prompt\", \"chosen\", \"rejected\"}, for DPO and ORPO) or prompts ({\"prompt\", \"answer\"} or gsm8k's {\"question\", \"answer\"}, for GRPO) format; a folder may hold train/valid/test files or a Hub dataset's data/ shards.",
        );
        egui::ScrollArea::vertical().id_salt("dataset-page").auto_shrink([false; 2]).show(ui, |ui| {
            self.open_row_ui(ui, ctx);
            super::hub_panel::download_card_ui(ui, ctx, crate::engine::hub::RepoKind::Dataset);
            ui.add_space(8.0);
            // The status row keeps its height when idle: a card that jumps by a line whenever a read starts or
            // ends moves what the user is about to click (a column dropdown's items, say).
            ui.horizontal(|ui| {
                ui.set_min_height(ui.spacing().interact_size.y);
                if let Some((key, started)) = &self.inspecting {
                    ui.spinner();
                    ui.label(format!("Inspecting {} … {:.1} s", key.path.display(), started.elapsed().as_secs_f64()));
                }
            });
            if let Some((path, message)) = &self.error {
                // Engine messages name the file already; others get it in front.
                let text = if message.contains(&path.display().to_string()) {
                    message.clone()
                } else {
                    format!("Cannot read {}:\n{message}", path.display())
                };
                banner_ui(ui, Tone::Error, text);
            }
            if let Some(report) = &self.report {
                let mut read = ctx.prefs.train.read_options();
                report_ui(ui, report, self.histogram.as_ref(), &mut read);
                ctx.prefs.train.data_format = read.format;
                ctx.prefs.train.data_columns = read.columns;
                let source = self.rows_source().filter(|s| s.path == report.path);
                if let Some(command) = self.rows.ui(ui, report, source) {
                    ctx.actions.push(Action::Send(command));
                }
            } else if self.error.is_none() && self.inspecting.is_none() {
                banner_ui(
                    ui,
                    Tone::Info,
                    "No dataset yet. Pick a .jsonl, .json or .parquet file or a folder, find one on Hugging Face below, or type its ORG/NAME; the bundled sample is assets/sample-chat.",
                );
            }
            ui.add_space(8.0);
            self.hub.0.ui(ui, ctx);
        });
    }

    /// What the rows are read with: the last inspection's, once its report is in.
    fn rows_source(&self) -> Option<RowsSource> {
        let key = self.last_key.as_ref().filter(|_| self.inspecting.is_none())?;
        Some(RowsSource {
            path: key.path.clone(),
            read: key.read.clone(),
            max_seq_len: key.max_seq_len,
            train_on_prompt: key.train_on_prompt,
            model: key.model.clone(),
            generation: self.generation,
        })
    }

    fn poll_picker(&mut self, ctx: &mut PanelCtx<'_>) {
        if let Some(path) = self.picker.take_picked() {
            ctx.actions.push(Action::OpenDataset(path));
        }
    }

    fn open_row_ui(&mut self, ui: &mut Ui, ctx: &mut PanelCtx<'_>) {
        card_ui(ui, |ui| {
            ui.set_width(ui.available_width());
            ui.horizontal(|ui| {
                let label = ui.label("Path");
                // Right to left: the buttons take what they need, the path field the rest.
                ui.with_layout(egui::Layout::right_to_left(egui::Align::Center), |ui| {
                    let picking = self.picker.is_open();
                    if ui
                        .add_enabled(!picking, egui::Button::new("Open folder…"))
                        .on_hover_text("Pick a folder with train.jsonl, train.parquet or data/train-*.parquet")
                        .clicked()
                    {
                        self.picker.open(ui, PickKind::DatasetFolder, &ctx.prefs.dataset_input);
                    }
                    if ui
                        .add_enabled(!picking, egui::Button::new("Open file…"))
                        .on_hover_text("Pick a .jsonl, .json or .parquet file")
                        .clicked()
                    {
                        self.picker.open(ui, PickKind::DatasetFile, &ctx.prefs.dataset_input);
                    }
                    let has_path = !ctx.prefs.dataset_input.trim().is_empty();
                    let open =
                        ui.add_enabled(has_path, egui::Button::new(RichText::new("Open dataset").strong())).clicked();
                    let response = ui
                        .add(
                            egui::TextEdit::singleline(&mut ctx.prefs.dataset_input)
                                .hint_text("/path/to/data.jsonl, a .parquet file or a dataset folder")
                                .desired_width(ui.available_width()),
                        )
                        .labelled_by(label.id);
                    let enter = response.lost_focus() && ui.input(|i| i.key_pressed(egui::Key::Enter));
                    if (open || enter) && !ctx.prefs.dataset_input.trim().is_empty() {
                        ctx.actions.push(Action::OpenDataset(PathBuf::from(ctx.prefs.dataset_input.trim())));
                    }
                });
            });
            if let Some(note) = &self.picker.note {
                banner_ui(ui, Tone::Warn, note.clone());
            }
            if !ctx.prefs.recent_datasets.is_empty() {
                if let Some(p) = recent_paths_ui(ui, &ctx.prefs.recent_datasets, short_path) {
                    ctx.actions.push(Action::OpenDataset(p));
                }
            }
        });
    }
}

/// "assets/sample-chat" for a folder, the file name for a file.
pub fn short_path(p: &Path) -> String {
    let parts: Vec<_> = p.iter().collect();
    let n = parts.len();
    if n >= 2 {
        format!("{}/{}", parts[n - 2].to_string_lossy(), parts[n - 1].to_string_lossy())
    } else {
        p.display().to_string()
    }
}

fn report_ui(ui: &mut Ui, report: &DatasetReport, hist: Option<&LengthHistogram>, read: &mut ReadOptions) {
    splits_ui(ui, report);
    super::dataset_reading::reading_ui(ui, report, read);
    problems_ui(ui, report);
    match &report.tokens {
        Some(t) => {
            section_ui(ui, "Token lengths");
            token_stats_ui(ui, t, hist, report.rows_word());
        }
        None => {
            ui.add_space(6.0);
            banner_ui(
                ui,
                Tone::Info,
                "Load a model to see token counts, the length histogram and the rows through its chat template.",
            );
        }
    }
}

/// One row per split: its files, format (or why there is none), rows, blank lines, problems; then the
/// report's notes.
fn splits_ui(ui: &mut Ui, report: &DatasetReport) {
    section_ui(ui, "Splits");
    card_ui(ui, |ui| {
        ui.set_width(ui.available_width());
        egui::Grid::new("splits").num_columns(6).striped(true).spacing([20.0, 4.0]).show(ui, |ui| {
            for h in ["Split", "Files", "Format", "Rows", "Blank lines", "Problems"] {
                ui.label(RichText::new(h).strong());
            }
            ui.end_row();
            for s in &report.splits {
                ui.label(s.split.as_str());
                let first = short_path(&s.path);
                let files = match s.files.len() {
                    0 | 1 => first,
                    n => format!("{first} + {} more", n - 1),
                };
                let all: Vec<String> = s.files.iter().map(|f| f.display().to_string()).collect();
                ui.label(files).on_hover_text(all.join("\n"));
                let tone = if s.detection.format().is_some() { palette::OK } else { palette::WARN };
                ui.label(RichText::new(s.detection.describe(s.unit)).color(tone));
                match s.format.map(|f| f.rows_word()).filter(|w| *w != "rows") {
                    Some(word) => ui.label(format!("{} {word}", s.rows)),
                    None => ui.label(s.rows.to_string()),
                };
                ui.label(s.blank_lines.to_string());
                if s.problems.is_empty() {
                    ui.label(RichText::new("none").color(palette::OK));
                } else {
                    ui.label(RichText::new(s.problems.len().to_string()).color(palette::ERROR).strong());
                }
                ui.end_row();
            }
        });
        for s in &report.splits {
            if let Some(error) = &s.error {
                ui.label(RichText::new(error).color(palette::ERROR));
            }
        }
        if !report.ignored.is_empty() {
            let names: Vec<String> = report.ignored.iter().map(|p| short_path(p)).collect();
            ui.label(RichText::new(format!("· not in any split: {}", names.join(", "))).weak());
        }
        for note in &report.notes {
            ui.label(RichText::new(format!("· {note}")).weak());
        }
    });
    stop_warnings_ui(ui, report);
}

/// The template and end-of-sequence doctor's warnings: what is wrong, then what to fix.
fn stop_warnings_ui(ui: &mut Ui, report: &DatasetReport) {
    for w in &report.warnings {
        banner_ui(ui, Tone::Warn, format!("Warning: {}\nFix: {}", w.message, w.fix));
    }
}

/// Every invalid row with its file and line.
fn problems_ui(ui: &mut Ui, report: &DatasetReport) {
    let problems = report.problem_count();
    if problems > 0 {
        section_ui(ui, &format!("Invalid rows ({problems})"));
        banner_ui(
            ui,
            Tone::Error,
            format!(
                "{problems} row{} cannot be used. Fix them, or tick \"Skip invalid rows\" in the LoRA settings to train without them.",
                if problems == 1 { "" } else { "s" }
            ),
        );
        egui::ScrollArea::vertical().id_salt("problems").max_height(220.0).show(ui, |ui| {
            for s in &report.splits {
                for problem in s.problems.iter().take(500) {
                    let file = problem.path.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
                    let at = problem.unit.locate(std::path::Path::new(&file), problem.line);
                    ui.horizontal_wrapped(|ui| {
                        ui.label(RichText::new(at).monospace().color(palette::ERROR));
                        ui.add(egui::Label::new(problem.message.as_str()).wrap());
                    });
                }
            }
        });
    }
}

/// Token counts, truncation and the length histogram under the loaded model's tokenizer.
/// `rows` names what the training split holds ("rows", or "pairs" for preference data: a pair's tokens count both
/// of its sequences, its length is the longer one).
fn token_stats_ui(ui: &mut Ui, t: &TokenStats, hist: Option<&LengthHistogram>, rows: &str) {
    card_ui(ui, |ui| {
        ui.set_width(ui.available_width());
        ui.horizontal_wrapped(|ui| {
            stat_ui(ui, &format!("training {rows}"), fmt_count(t.lengths.len()));
            stat_ui(ui, "tokens per epoch", fmt_count(t.total_tokens));
            stat_ui(ui, "trained tokens", fmt_count(t.target_tokens));
            stat_ui(ui, "longest row", t.longest_row().unwrap_or(0).to_string());
            let tone = if t.truncated > 0 { palette::WARN } else { palette::OK };
            ui.label(
                RichText::new(format!("{} truncated at max seq len {}", t.truncated, t.max_seq_len))
                    .color(tone)
                    .strong(),
            )
            .on_hover_text("Rows longer than the maximum sequence length lose their tail. Change it in LoRA settings.");
        });
        if t.dropped > 0 {
            banner_ui(
                ui,
                if t.dropped == t.lengths.len() { Tone::Error } else { Tone::Warn },
                match rows {
                    // GRPO prompts are never cut: one longer than the sequence length leaves no room to answer.
                    "prompts" => format!(
                        "{} of {} prompts are longer than {} tokens and will be dropped; raise the sequence length.",
                        t.dropped,
                        t.lengths.len(),
                        t.max_seq_len
                    ),
                    _ => format!(
                        "{} of {} {rows} have no trained tokens within {} tokens (the reply starts after the cut) and will be dropped; raise the sequence length.",
                        t.dropped,
                        t.lengths.len(),
                        t.max_seq_len
                    ),
                },
            );
        }
        if !t.failures.is_empty() {
            banner_ui(
                ui,
                Tone::Warn,
                format!("{} rows could not be templated, e.g. {}", t.failures.len(), t.failures[0]),
            );
        }
        if let Some(h) = hist {
            histogram_ui(ui, h);
        }
    });
}

fn stat_ui(ui: &mut Ui, label: &str, value: String) {
    ui.label(RichText::new(value).strong().size(15.0));
    ui.label(RichText::new(label).weak());
    ui.add_space(12.0);
}

fn histogram_ui(ui: &mut Ui, h: &LengthHistogram) {
    let w = h.bin_width as f64;
    let (mut kept, mut cut) = (Vec::new(), Vec::new());
    for &(start, count) in &h.bins {
        if count == 0 {
            continue;
        }
        let bar = Bar::new(start as f64 + w / 2.0, count as f64).width(w * 0.9);
        if start >= h.max_seq_len {
            cut.push(bar.name(format!("{start}–{} tokens: {count} rows (truncated)", start + h.bin_width - 1)));
        } else {
            kept.push(bar.name(format!("{start}–{} tokens: {count} rows", start + h.bin_width - 1)));
        }
    }
    let max_seq = h.max_seq_len as f64;
    let tallest = h.bins.iter().map(|(_, count)| *count).max().unwrap_or(0);
    super::plot_axes::with_readable_y(Plot::new("length-histogram"))
        .height(200.0)
        .legend(Legend::default())
        .allow_scroll(false)
        .x_axis_label("tokens per row")
        .y_axis_label("rows")
        // Counts start at 0 and an empty histogram still spans 0..1: no margin below zero, no negative labels.
        .include_y(0.0)
        .include_y((tallest as f64 * 1.1).max(1.0))
        .set_margin_fraction(egui::vec2(0.05, 0.0))
        .allow_drag(false)
        .include_x(0.0)
        .show(ui, |plot| {
            plot.bar_chart(BarChart::new("fits", kept).color(palette::TRAIN));
            if !cut.is_empty() {
                plot.bar_chart(BarChart::new("truncated", cut).color(palette::ERROR));
            }
            plot.vline(VLine::new("max seq len", max_seq).color(palette::ACCENT).width(2.0));
        });
}
