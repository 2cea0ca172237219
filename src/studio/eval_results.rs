//! What an evaluation has produced so far (targets fill in as they finish; a cancelled or failed run keeps the ones
//! that did) and the metrics table: targets as rows, metrics as columns, the best of each column marked. Also
//! "Save results…": the finished [`EvalReport`] as JSON (what `metal-candle eval --json` prints), written on its own
//! thread to a new file (an existing one is never replaced).

use super::chat_export::{fresh_path, write_file};
use super::widgets::{self, banner_ui, palette, Tone};
use crate::engine::eval::{EvalReport, EvalTarget, Metric, TargetResult};
use crossbeam_channel::Receiver;
use egui::{RichText, Ui};
use std::path::{Path, PathBuf};

/// The results of the evaluation shown on the page.
#[derive(Default)]
pub struct EvalResults {
    /// "loss", "generate" or "multiple-choice".
    pub task: String,
    /// Rows per target.
    pub rows: usize,
    pub targets: Vec<EvalTarget>,
    pub notes: Vec<String>,
    /// Finished targets, in target order.
    pub finished: Vec<TargetResult>,
    /// The whole report, once the evaluation finished.
    pub report: Option<EvalReport>,
    save: SaveState,
}

/// The "Save results…" row.
#[derive(Default)]
struct SaveState {
    /// The path field, while the row is open.
    path: Option<String>,
    writing: Option<Receiver<Result<PathBuf, String>>>,
    written: Option<PathBuf>,
    error: Option<String>,
}

impl EvalResults {
    /// A new evaluation has started (its data read and checked).
    pub fn begin(&mut self, task: String, rows: usize, targets: Vec<EvalTarget>, notes: Vec<String>) {
        *self = Self { task, rows, targets, notes, ..Self::default() };
    }

    pub fn on_target_finished(&mut self, result: TargetResult) {
        self.finished.push(result);
    }

    pub fn on_report(&mut self, report: EvalReport) {
        self.task = report.task.clone();
        self.rows = report.rows;
        self.notes = report.notes.clone();
        self.targets = report.targets.iter().map(|t| t.target.clone()).collect();
        self.finished = report.targets.clone();
        self.report = Some(report);
    }

    pub fn is_empty(&self) -> bool {
        self.finished.is_empty()
    }

    /// Score names in report order (counts such as rows are left out): what the plot offers.
    pub fn score_names(&self) -> Vec<String> {
        self.metric_names().into_iter().filter(|n| Metric::higher_is_better(n).is_some()).collect()
    }

    /// Metric names in report order (the union over finished targets).
    pub fn metric_names(&self) -> Vec<String> {
        let mut names: Vec<String> = Vec::new();
        for m in self.finished.iter().flat_map(|r| &r.metrics) {
            if !names.contains(&m.name) {
                names.push(m.name.clone());
            }
        }
        names
    }

    /// Targets as rows, metrics as columns; the best value of each column (of two targets or more) marked.
    pub fn metrics_table_ui(&self, ui: &mut Ui) {
        let names = self.metric_names();
        let best: Vec<Option<f64>> = names.iter().map(|n| best_value(&self.finished, n)).collect();
        egui::ScrollArea::horizontal().id_salt("eval-metrics-scroll").show(ui, |ui| {
            egui::Grid::new("eval-metrics").striped(true).num_columns(names.len() + 3).spacing([18.0, 4.0]).show(
                ui,
                |ui| {
                    ui.label(RichText::new("target").strong());
                    ui.label(RichText::new("step").strong());
                    for n in &names {
                        let dir = match Metric::higher_is_better(n) {
                            Some(true) => "higher is better",
                            Some(false) => "lower is better",
                            None => "a count, not a score",
                        };
                        ui.label(RichText::new(n).strong()).on_hover_text(dir);
                    }
                    ui.label(RichText::new("time").strong());
                    ui.end_row();
                    for r in &self.finished {
                        ui.label(&r.target.label).on_hover_text(target_hover(&r.target));
                        ui.label(r.target.step.map(|s| s.to_string()).unwrap_or_else(|| "—".into()));
                        for (n, best) in names.iter().zip(&best) {
                            match r.metric(n) {
                                Some(v) if best.is_some_and(|b| b == v) => {
                                    ui.label(
                                        RichText::new(format!("{}  best", fmt_metric(n, v)))
                                            .strong()
                                            .color(palette::OK),
                                    )
                                    .on_hover_text("best of the targets");
                                }
                                Some(v) => {
                                    ui.label(fmt_metric(n, v));
                                }
                                None => {
                                    ui.label("—");
                                }
                            }
                        }
                        ui.label(RichText::new(widgets::fmt_secs(r.elapsed_secs)).weak());
                        ui.end_row();
                    }
                },
            );
        });
    }

    /// "Save results…" and its path row, the write in flight, and where the last one went.
    pub fn save_ui(&mut self, ui: &mut Ui, runs_dir: &Path) {
        self.poll_write();
        let s = &mut self.save;
        let Some(report) = &self.report else { return };
        ui.horizontal(|ui| {
            let open = s.path.is_some();
            let button = ui
                .add_enabled(!open && s.writing.is_none(), egui::Button::new("Save results…"))
                .on_hover_text("Write the report as JSON, the same as `metal-candle eval --json`");
            if button.clicked() {
                let name = format!("eval-{}-{}.json", report.task, timestamp());
                s.path = Some(fresh_path(&runs_dir.join(name)).display().to_string());
                s.error = None;
            }
            if s.writing.is_some() {
                ui.spinner();
                ui.label("Writing…");
            }
        });
        if let Some(path) = s.path.as_mut() {
            let mut save = false;
            let mut cancel = false;
            ui.horizontal(|ui| {
                ui.label("File:");
                ui.add(egui::TextEdit::singleline(path).desired_width(ui.available_width() - 140.0));
                save = ui.add_enabled(!path.trim().is_empty(), egui::Button::new("Save")).clicked();
                cancel = ui.button("Cancel").clicked();
            });
            if save {
                let target = PathBuf::from(path.trim());
                match serde_json::to_string_pretty(report) {
                    Ok(text) => start_write(s, ui.ctx().clone(), target, text),
                    Err(e) => s.error = Some(format!("cannot encode the report: {e}")),
                }
            }
            if save || cancel {
                s.path = None;
            }
        }
        if let Some(e) = &s.error {
            banner_ui(ui, Tone::Error, format!("Could not save the results: {e}"));
        }
        if let Some(path) = s.written.clone() {
            ui.horizontal_wrapped(|ui| {
                ui.label(RichText::new(format!("Results saved to {}", path.display())).color(palette::OK));
                if let Some(message) = super::reveal::path_buttons_ui(ui, &path, "results file") {
                    s.error = Some(message);
                }
            });
        }
    }

    fn poll_write(&mut self) {
        let s = &mut self.save;
        let Some(rx) = &s.writing else { return };
        match rx.try_recv() {
            Ok(Ok(path)) => (s.written, s.writing) = (Some(std::path::absolute(&path).unwrap_or(path)), None),
            Ok(Err(message)) => (s.error, s.writing) = (Some(message), None),
            Err(crossbeam_channel::TryRecvError::Empty) => {}
            Err(crossbeam_channel::TryRecvError::Disconnected) => {
                (s.error, s.writing) = (Some("the writing thread stopped unexpectedly".into()), None)
            }
        }
    }
}

/// Write `text` to a new file at `path` on a helper thread.
fn start_write(s: &mut SaveState, ctx: egui::Context, path: PathBuf, text: String) {
    let (tx, rx) = crossbeam_channel::bounded(1);
    s.written = None;
    s.error = None;
    let spawned = std::thread::Builder::new().name("mc-eval-save".into()).spawn(move || {
        let _ = tx.send(write_file(&path, text.as_bytes(), false).map(|()| path));
        ctx.request_repaint();
    });
    match spawned {
        Ok(_) => s.writing = Some(rx),
        Err(e) => s.error = Some(format!("cannot start the writing thread: {e}")),
    }
}

/// `YYYYMMDD-HHMMSS` (UTC), for default file names.
fn timestamp() -> String {
    let t = crate::engine::model::chat_template::strftime::DateTime::now_utc();
    format!("{:04}{:02}{:02}-{:02}{:02}{:02}", t.year, t.month, t.day, t.hour, t.minute, t.second)
}

/// The best finite value of score `metric` among `results`, when two targets or more report it and they differ (a
/// tie of all marks nothing; counts have no best).
pub fn best_value(results: &[TargetResult], metric: &str) -> Option<f64> {
    let higher = Metric::higher_is_better(metric)?;
    let values: Vec<f64> = results.iter().filter_map(|r| r.metric(metric)).filter(|v| v.is_finite()).collect();
    if values.len() < 2 || values.iter().all(|v| *v == values[0]) {
        return None;
    }
    let pick = if higher { f64::max } else { f64::min };
    values.into_iter().reduce(pick)
}

/// A metric value with the digits that matter: counts whole, scores with 4 decimals below 100 and 1 above, a
/// missing one (NaN: no judge reply could be read) as a dash.
pub fn fmt_metric(name: &str, v: f64) -> String {
    if v.is_nan() {
        "—".into()
    } else if !v.is_finite() {
        format!("{v}")
    } else if Metric::is_count(name) {
        format!("{v:.0}")
    } else if v.abs() >= 100.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.4}")
    }
}

/// The target's adapter folder, or "the loaded model with no adapter".
pub fn target_hover(t: &EvalTarget) -> String {
    match &t.adapter {
        Some(dir) => dir.display().to_string(),
        None => "the loaded model with no adapter".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(label: &str, metrics: &[(&str, f64)]) -> TargetResult {
        TargetResult {
            target: EvalTarget { label: label.into(), adapter: None, step: None },
            metrics: metrics.iter().map(|(n, v)| Metric::new(n, *v)).collect(),
            rows: serde_json::Value::Null,
            elapsed_secs: 0.0,
        }
    }

    #[test]
    fn the_best_is_the_lowest_loss_and_the_highest_score() {
        let r = [
            result("base", &[("loss", 2.0), ("exact_match", 0.1)]),
            result("a", &[("loss", 1.5), ("exact_match", 0.4), ("acc", f64::NAN)]),
        ];
        assert_eq!(best_value(&r, "loss"), Some(1.5));
        assert_eq!(best_value(&r, "perplexity"), None);
        assert_eq!(best_value(&r, "exact_match"), Some(0.4));
        assert_eq!(best_value(&r, "acc"), None, "one value, and NaN, marks nothing");
        assert_eq!(best_value(&r[..1], "loss"), None);
        let tie = [result("a", &[("acc", 0.5)]), result("b", &[("acc", 0.5)])];
        assert_eq!(best_value(&tie, "acc"), None, "a tie of all marks nothing");
        assert_eq!(best_value(&[result("a", &[("rows", 3.0)]), result("b", &[("rows", 4.0)])], "rows"), None);
        assert_eq!((fmt_metric("loss", 2.0), fmt_metric("perplexity", 1234.56)), ("2.0000".into(), "1234.6".into()));
        assert_eq!((fmt_metric("rows", 17.0), fmt_metric("judge_score", f64::NAN)), ("17".into(), "—".into()));
    }
}
