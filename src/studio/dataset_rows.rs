//! The dataset page's rows: every row of a split, a page at a time (first, previous, next, last, go to a row,
//! rows per page), a search over all rows of the split (ignoring case; the count of matches, matches marked),
//! and a choice of the splits the dataset has. Rows are rendered through the model's chat template with trained
//! and masked tokens coloured, or as plain turns before a model is loaded.
//!
//! The worker reads, searches and renders ([`Command::BrowseRows`] over the engine's `RowBrowser`), so a
//! 100k-row split stays responsive: typing waits for a short pause before it searches, and each answer carries
//! the id of its request so a late answer to an older one is dropped.

use super::widgets::{self, banner_ui, card_ui, fmt_thousands, palette, section_ui, Tone};
use crate::engine::data::{BrowsedRow, ReadOptions, RowPage, RowQuery, RowView, SplitName};
use crate::worker::{Command, DatasetReport, RowsRequest};
use egui::{RichText, TextFormat, Ui};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// How long typing in the search box pauses before the search runs.
const SEARCH_PAUSE: Duration = Duration::from_millis(250);

/// The page sizes offered.
const PAGE_SIZES: [usize; 3] = [10, 25, 50];

/// What the rows are read and rendered with: the inspection's dataset, reading choice and tokenization. A new
/// `generation` (a new report of the same dataset) asks again.
#[derive(Debug, Clone, PartialEq)]
pub struct RowsSource {
    pub path: PathBuf,
    pub read: ReadOptions,
    pub max_seq_len: usize,
    pub train_on_prompt: bool,
    pub model: Option<PathBuf>,
    pub generation: u64,
}

/// The rows section's state.
pub struct RowsView {
    /// The split chosen (None: the dataset's first).
    pub split: Option<SplitName>,
    /// The search box.
    pub search: String,
    /// When the search box last changed, until its search is sent.
    edited_at: Option<Instant>,
    /// The search in effect (sent, or about to be).
    searched: String,
    /// The first row shown (0-based, among the matches).
    pub first: usize,
    pub page_len: usize,
    /// The last request: its id and what it asked.
    asked: Option<(u64, RowsSource, RowQuery)>,
    waiting: bool,
    next_id: u64,
    pub page: Option<RowPage>,
    pub error: Option<String>,
    /// The bottom pager asked for another page: bring the top of the rows into view once it is shown.
    scroll_to_top: bool,
}

impl Default for RowsView {
    fn default() -> Self {
        Self {
            split: None,
            search: String::new(),
            edited_at: None,
            searched: String::new(),
            first: 0,
            page_len: PAGE_SIZES[0],
            asked: None,
            waiting: false,
            next_id: 0,
            page: None,
            error: None,
            scroll_to_top: false,
        }
    }
}

impl RowsView {
    /// Whether a page is being fetched.
    pub fn is_waiting(&self) -> bool {
        self.waiting || self.edited_at.is_some()
    }

    /// Another dataset: start over at its first split and row.
    pub fn reset(&mut self) {
        *self = Self { page_len: self.page_len, next_id: self.next_id, ..Self::default() };
    }

    pub fn on_page(&mut self, id: u64, page: RowPage) {
        let Some((_, _, query)) = self.asked.as_mut().filter(|(asked, ..)| *asked == id) else { return };
        // The worker moves a page past the end back onto the last one, and names the split it showed.
        query.first = page.query.first;
        query.split = page.split;
        self.first = page.query.first;
        self.split = page.split;
        self.waiting = false;
        self.error = None;
        self.page = Some(page);
    }

    pub fn on_failed(&mut self, id: u64, message: String) {
        if self.asked.as_ref().is_some_and(|(asked, ..)| *asked == id) {
            self.waiting = false;
            self.error = Some(message);
        }
    }

    /// The request for what is chosen now, when it differs from the last one sent.
    fn request(&mut self, source: RowsSource) -> Option<Command> {
        let query =
            RowQuery { split: self.split, search: self.searched.clone(), first: self.first, count: self.page_len };
        if self.asked.as_ref().is_some_and(|(_, s, q)| *s == source && *q == query) {
            return None;
        }
        self.next_id += 1;
        self.asked = Some((self.next_id, source.clone(), query.clone()));
        self.waiting = true;
        Some(Command::BrowseRows(Box::new(RowsRequest {
            id: self.next_id,
            path: source.path,
            read: source.read,
            query,
            max_seq_len: source.max_seq_len,
            train_on_prompt: source.train_on_prompt,
        })))
    }

    /// The section; returns the request for the page to show when it changed. `source` is None while the
    /// dataset is being inspected.
    pub fn ui(&mut self, ui: &mut Ui, report: &DatasetReport, source: Option<RowsSource>) -> Option<Command> {
        // A split training refuses (ambiguous format, mixed files) has nothing to page; the report says why.
        let splits: Vec<(SplitName, usize)> =
            report.splits.iter().filter(|s| s.error.is_none()).map(|s| (s.split, s.rows)).collect();
        if splits.iter().all(|(_, rows)| *rows == 0) {
            return None;
        }
        // Where the section starts (the cursor's own rect reaches to infinity).
        let top = egui::Rect::from_min_size(ui.cursor().min, egui::vec2(1.0, 1.0));
        section_ui(ui, "Rows");
        self.controls_ui(ui, &splits);
        if let Some(edited) = self.edited_at {
            let waited = edited.elapsed();
            if waited >= SEARCH_PAUSE {
                self.edited_at = None;
                self.searched = self.search.trim().to_string();
                self.first = 0;
            } else {
                ui.ctx().request_repaint_after(SEARCH_PAUSE - waited);
            }
        }
        if let Some(e) = &self.error {
            banner_ui(ui, Tone::Error, format!("Cannot show the rows: {e}"));
        }
        if let Some(page) = &self.page {
            self.pager_ui(ui, page.clone());
        }
        if let Some(page) = self.page.clone() {
            rows_ui(ui, &page);
            // The pager again under a long page, so the next page is one click from its last row.
            if page.rows.len() > 3 {
                let before = self.first;
                ui.push_id("bottom-pager", |ui| self.pager_ui(ui, page));
                self.scroll_to_top |= self.first != before;
            }
        }
        if self.scroll_to_top
            && !self.is_waiting()
            && self.asked.as_ref().is_some_and(|(_, _, q)| q.first == self.first)
        {
            self.scroll_to_top = false;
            ui.scroll_to_rect(top, Some(egui::Align::TOP));
        }
        source.and_then(|s| self.request(s))
    }

    /// Split choice, search box with its count of matches, and rows per page.
    fn controls_ui(&mut self, ui: &mut Ui, splits: &[(SplitName, usize)]) {
        ui.horizontal_wrapped(|ui| {
            let shown = self.split.or(splits.first().map(|(s, _)| *s));
            for (split, rows) in splits {
                let label = format!("{split} · {} rows", fmt_thousands(*rows));
                if ui.selectable_label(shown == Some(*split), label).clicked() && shown != Some(*split) {
                    self.split = Some(*split);
                    self.first = 0;
                }
            }
            ui.separator();
            let l = ui.label("Search rows");
            let edit = egui::TextEdit::singleline(&mut self.search)
                .hint_text("text in any turn, any case")
                .desired_width(260.0);
            if ui.add(edit).labelled_by(l.id).changed() {
                self.edited_at = Some(Instant::now());
            }
            if ui.add_enabled(!self.search.is_empty(), egui::Button::new("Clear search")).clicked() {
                self.search.clear();
                (self.searched, self.edited_at, self.first) = (String::new(), None, 0);
            }
            if self.is_waiting() {
                ui.spinner();
            }
            if let Some(page) = self.page.as_ref().filter(|p| !p.query.search.is_empty()) {
                let text = match page.matches {
                    0 => format!(
                        "no row of the {} split matches \"{}\"",
                        page.split.map_or("", |s| s.as_str()),
                        page.query.search
                    ),
                    n => format!("{} of {} rows match", fmt_thousands(n), fmt_thousands(page.split_rows)),
                };
                ui.label(RichText::new(text).color(if page.matches == 0 { palette::WARN } else { palette::OK }));
            }
        });
    }

    /// First, previous, "rows 41–60 of 1,234", next, last, go to a row, and rows per page.
    fn pager_ui(&mut self, ui: &mut Ui, page: RowPage) {
        let total = page.matches;
        if total == 0 {
            return;
        }
        let len = self.page_len;
        let first = page.query.first.min(total - 1);
        let last_start = (total - 1) / len * len;
        ui.horizontal_wrapped(|ui| {
            let at_start = first == 0;
            let at_end = first + len >= total;
            if ui.add_enabled(!at_start, egui::Button::new("First")).clicked() {
                self.first = 0;
            }
            if ui.add_enabled(!at_start, egui::Button::new("Previous")).clicked() {
                self.first = first.saturating_sub(len);
            }
            let what = if page.query.search.is_empty() { "rows" } else { "matches" };
            let shown_end = (first + page.rows.len()).min(total);
            ui.label(
                RichText::new(format!(
                    "{what} {}–{} of {}",
                    fmt_thousands(first + 1),
                    fmt_thousands(shown_end),
                    fmt_thousands(total)
                ))
                .strong(),
            );
            if ui.add_enabled(!at_end, egui::Button::new("Next")).clicked() {
                self.first = first + len;
            }
            if ui.add_enabled(!at_end, egui::Button::new("Last")).clicked() {
                self.first = last_start;
            }
            ui.separator();
            let l = ui.label("Go to").on_hover_text(format!("Show the page from this {}", &what[..what.len() - 1]));
            let mut at = first + 1;
            let go = ui.add(egui::DragValue::new(&mut at).range(1..=total)).labelled_by(l.id);
            if go.changed() {
                self.first = at - 1;
            }
            ui.separator();
            let l = ui.label("Rows per page");
            egui::ComboBox::from_id_salt("rows-per-page")
                .selected_text(self.page_len.to_string())
                .width(60.0)
                .show_ui(ui, |ui| {
                    for n in PAGE_SIZES {
                        if ui.selectable_value(&mut self.page_len, n, n.to_string()).clicked() {
                            self.first = first / n * n;
                        }
                    }
                })
                .response
                .labelled_by(l.id);
        });
    }
}

/// The rows of a page, each in a card: where it is from, then its templated tokens or its turns.
fn rows_ui(ui: &mut Ui, page: &RowPage) {
    if page.templated && !page.rows.is_empty() {
        widgets::token_legend_ui(ui);
    } else if page.matches > 0 {
        banner_ui(
            ui,
            Tone::Info,
            "Load a model to see the rows through its chat template, with trained tokens marked.",
        );
    }
    for row in &page.rows {
        card_ui(ui, |ui| {
            ui.set_width(ui.available_width());
            ui.label(RichText::new(row_heading(page, row)).weak().small());
            ui.push_id(row.index, |ui| view_ui(ui, &row.view, &page.query.search));
        });
        ui.add_space(4.0);
    }
}

/// A row's view: templated tokens, plain turns, a preference pair (its prompt once, then the chosen and the
/// rejected completions side by side, each as templated tokens or turns), or a GRPO prompt and its answer.
fn view_ui(ui: &mut Ui, view: &RowView, search: &str) {
    match view {
        RowView::Templated { pieces, .. } => widgets::token_view_ui(ui, pieces, search),
        RowView::Turns { turns, error } => {
            if let Some(e) = error {
                ui.label(RichText::new(format!("The chat template cannot render this row: {e}")).color(palette::ERROR));
            }
            turns_ui(ui, turns, search);
        }
        RowView::Pair { prompt, chosen, rejected } => {
            ui.label(RichText::new("Prompt").strong().small());
            ui.push_id("prompt", |ui| view_ui(ui, prompt, search));
            ui.add_space(4.0);
            ui.columns(2, |columns| {
                for (column, (title, colour, side)) in
                    columns.iter_mut().zip([("Chosen", palette::OK, chosen), ("Rejected", palette::ERROR, rejected)])
                {
                    column.label(RichText::new(format!("{title}{}", side_tokens(side))).strong().color(colour));
                    column.push_id(title, |ui| view_ui(ui, side, search));
                }
            });
        }
        RowView::Prompt { prompt, answer } => {
            // A prompt is never cut: one too long for the sequence length is left out of training.
            let size = match &**prompt {
                RowView::Templated { tokens, truncated, .. } => {
                    format!(
                        " · {tokens} tokens{}",
                        if *truncated { " (longer than the sequence length: dropped)" } else { "" }
                    )
                }
                _ => String::new(),
            };
            ui.label(RichText::new(format!("Prompt{size}")).strong().small());
            ui.push_id("prompt", |ui| view_ui(ui, prompt, search));
            ui.add_space(4.0);
            answer_ui(ui, answer.as_deref(), search);
        }
    }
}

/// A GRPO prompt's reference answer (what the exact-answer reward compares with), or that it has none.
fn answer_ui(ui: &mut Ui, answer: Option<&str>, search: &str) {
    match answer {
        Some(answer) => {
            ui.label(RichText::new("answer").strong().small().color(palette::OK));
            let text = TextFormat { color: ui.visuals().text_color(), ..Default::default() };
            let job = widgets::highlighted_job(&[(answer, &text)], search, ui.available_width());
            ui.add(egui::Label::new(job).wrap().selectable(true));
        }
        None => {
            ui.label(
                RichText::new("no answer: only rewards that need none (format, length, a program) can score it")
                    .weak()
                    .small(),
            );
        }
    }
}

/// " · 12 tokens (truncated)" for a templated side of a pair (its whole sequence, prompt included).
fn side_tokens(view: &RowView) -> String {
    match view {
        RowView::Templated { tokens, truncated, .. } => {
            format!(" · {tokens} tokens{}", if *truncated { " (truncated)" } else { "" })
        }
        _ => String::new(),
    }
}

/// "train · row 41 · data.jsonl line 41 · 57 tokens (truncated)"; a pair's tokens are shown beside each side.
fn row_heading(page: &RowPage, row: &BrowsedRow) -> String {
    let split = page.split.map(|s| s.as_str()).unwrap_or("");
    let file = row.file.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let mut heading =
        format!("{split} · row {} · {file} {} {}", fmt_thousands(row.index + 1), row.unit.name(), row.line);
    if let RowView::Templated { tokens, truncated, .. } = &row.view {
        heading.push_str(&format!(" · {tokens} tokens{}", if *truncated { " (truncated)" } else { "" }));
    }
    heading
}

/// Each turn under its role, search matches marked.
fn turns_ui(ui: &mut Ui, turns: &[(String, String)], search: &str) {
    let text = TextFormat { color: ui.visuals().text_color(), ..Default::default() };
    for (role, content) in turns {
        ui.label(RichText::new(role).strong().small().color(palette::TRAIN));
        let job = widgets::highlighted_job(&[(content.as_str(), &text)], search, ui.available_width());
        ui.add(egui::Label::new(job).wrap().selectable(true));
    }
}
