//! The Evaluate page's per-row grid, one row per dataset row and one column per target, a page of rows at a time:
//! for generate the prompt, the reference and each target's answer with its scores coloured (long text clipped,
//! with "more" to expand it); for multiple choice the context, the choices (gold marked) and each target's pick and
//! log-likelihoods; for loss each row's token count and each target's loss; for preference pairs each target's
//! chosen and rejected reward and whether it prefers the chosen answer. Rows are read as plain JSON, so a field a
//! task did not write shows "—".

use super::widgets::palette;
use crate::engine::eval::TargetResult;
use egui::{Color32, RichText, Ui};
use serde_json::Value;
use std::collections::HashSet;

/// Characters of a cell shown before "more".
const CLIP_CHARS: usize = 200;

/// Paging and expanded cells.
#[derive(Default)]
pub struct RowsView {
    pub page: usize,
    /// (row, column) cells shown in full.
    expanded: HashSet<(usize, usize)>,
}

impl RowsView {
    /// Back to the first page, nothing expanded (a new evaluation).
    pub fn reset(&mut self) {
        *self = Self::default();
    }
}

/// The rows of `results` for `task`, a page at a time.
pub fn rows_ui(ui: &mut Ui, task: &str, results: &[TargetResult], view: &mut RowsView) {
    let total = results.iter().map(|r| r.rows.as_array().map_or(0, Vec::len)).max().unwrap_or(0);
    if total == 0 {
        ui.label(RichText::new("No per-row results.").weak());
        return;
    }
    // Tasks of short numeric cells: more rows to a page, two leading columns.
    let numeric = matches!(task, "loss" | "preference");
    let per_page = if numeric { 50 } else { 20 };
    let pages = total.div_ceil(per_page);
    view.page = view.page.min(pages - 1);
    ui.horizontal(|ui| {
        if ui.add_enabled(view.page > 0, egui::Button::new("Previous")).clicked() {
            view.page -= 1;
        }
        let first = view.page * per_page;
        ui.label(format!("rows {}–{} of {total}", first + 1, (first + per_page).min(total)));
        if ui.add_enabled(view.page + 1 < pages, egui::Button::new("Next")).clicked() {
            view.page += 1;
        }
    });
    let range = view.page * per_page..((view.page + 1) * per_page).min(total);
    let columns = results.len() + if numeric { 2 } else { 3 };
    // Text columns share the width; many targets scroll sideways rather than squeeze.
    let width = ((ui.available_width() - 110.0) / (columns - 1) as f32 - 16.0).max(200.0);
    egui::ScrollArea::horizontal().id_salt("eval-rows-scroll").show(ui, |ui| {
        egui::Grid::new("eval-rows").striped(true).num_columns(columns).spacing([16.0, 8.0]).show(
            ui,
            |ui| match task {
                "loss" => loss_rows_ui(ui, results, range),
                "preference" => preference_rows_ui(ui, results, range),
                "multiple-choice" => choice_rows_ui(ui, results, range, width, view),
                _ => generate_rows_ui(ui, results, range, width, view),
            },
        );
    });
}

fn header_ui(ui: &mut Ui, first: &[&str], results: &[TargetResult]) {
    for h in first {
        ui.label(RichText::new(*h).strong());
    }
    for r in results {
        ui.label(RichText::new(&r.target.label).strong()).on_hover_text(super::eval_results::target_hover(&r.target));
    }
    ui.end_row();
}

fn loss_rows_ui(ui: &mut Ui, results: &[TargetResult], range: std::ops::Range<usize>) {
    header_ui(ui, &["row", "tokens"], results);
    for i in range {
        let first = row(results, i);
        ui.label(source(first));
        ui.label(text(first, "target_tokens"))
            .on_hover_text("tokens scored (the answer's, unless prompts are trained)");
        let losses: Vec<Option<f64>> = results.iter().map(|r| num(row_of(r, i), "loss")).collect();
        let finite: Vec<f64> = losses.iter().flatten().copied().filter(|v| v.is_finite()).collect();
        // The lowest loss of the row is green, unless every target has the same.
        let best = finite.iter().copied().reduce(f64::min).filter(|b| finite.iter().any(|v| v != b));
        for loss in losses {
            match loss {
                Some(v) if Some(v) == best => ui.label(RichText::new(format!("{v:.4}")).color(palette::OK)),
                Some(v) => ui.label(format!("{v:.4}")),
                None => ui.label("—"),
            };
        }
        ui.end_row();
    }
}

/// Each pair's tokens, and per target its chosen and rejected reward and whether the chosen one is preferred.
fn preference_rows_ui(ui: &mut Ui, results: &[TargetResult], range: std::ops::Range<usize>) {
    header_ui(ui, &["pair", "tokens"], results);
    for i in range {
        let first = row(results, i);
        ui.label(source(first));
        ui.label(format!("{} | {}", text(first, "chosen_tokens"), text(first, "rejected_tokens")))
            .on_hover_text("answer tokens scored: chosen | rejected");
        for r in results {
            let cell = row_of(r, i);
            let reward = |field| num(cell, field).map_or("—".into(), |v| format!("{v:.3}"));
            ui.horizontal(|ui| {
                ui.label(format!("chosen {} vs rejected {}", reward("chosen_reward"), reward("rejected_reward")))
                    .on_hover_text(
                        "the rewards of the chosen and the rejected answer (TRL's rewards/chosen, /rejected)",
                    );
                match num(cell, "preferred") {
                    Some(p) if p > 0.5 => ui.label(RichText::new("preferred: yes").color(palette::OK)),
                    Some(_) => ui.label(RichText::new("preferred: no").color(palette::ERROR)),
                    None => ui.label("—"),
                };
            });
        }
        ui.end_row();
    }
}

fn generate_rows_ui(
    ui: &mut Ui,
    results: &[TargetResult],
    range: std::ops::Range<usize>,
    width: f32,
    view: &mut RowsView,
) {
    header_ui(ui, &["row", "prompt", "reference"], results);
    for i in range {
        let first = row(results, i);
        // One line: the grid's first column is as wide as its widest source ("valid.jsonl:12").
        ui.vertical(|ui| ui.add(egui::Label::new(source(first)).extend()));
        clipped_ui(ui, &text(first, "prompt"), width, (i, 0), view);
        clipped_ui(ui, &text(first, "reference"), width, (i, 1), view);
        for (t, r) in results.iter().enumerate() {
            let cell = row_of(r, i);
            ui.vertical(|ui| {
                ui.set_width(width);
                clipped_ui(ui, &text(cell, "answer"), width, (i, t + 2), view);
                scores_ui(ui, cell);
            });
        }
        ui.end_row();
    }
}

/// The answer's scores as coloured chips: green for full marks, red for none, amber between.
fn scores_ui(ui: &mut Ui, cell: Option<&Value>) {
    let scores = cell.and_then(|c| c.get("scores"));
    ui.horizontal_wrapped(|ui| {
        ui.spacing_mut().item_spacing.x = 6.0;
        for (key, short, max) in [
            ("exact_match", "EM", 1.0),
            ("contains", "contains", 1.0),
            ("token_f1", "F1", 1.0),
            ("regex", "regex", 1.0),
        ] {
            let Some(v) = num(scores, key) else { continue };
            let shown = if key == "token_f1" { format!("{short} {v:.2}") } else { format!("{short} {v}") };
            ui.label(RichText::new(shown).small().color(score_color(v / max)));
        }
        // The judge's score sits beside the scores (null when its reply had no readable score).
        let judge = num(cell, "judge_score").or_else(|| num(scores, "judge_score"));
        let reply = text(cell, "judge_reply");
        match judge {
            Some(v) => {
                ui.label(RichText::new(format!("judge {v}/10")).small().color(score_color((v - 1.0) / 9.0)))
                    .on_hover_text(reply);
            }
            None if reply != "—" => {
                ui.label(RichText::new("judge: no score").small().weak()).on_hover_text(reply);
            }
            None => {}
        }
        let stop = text(cell, "stop_reason");
        if stop != "—" {
            ui.label(RichText::new(stop).small().weak()).on_hover_text("why the answer ended");
        }
    });
}

fn score_color(fraction: f64) -> Color32 {
    if fraction >= 0.999 {
        palette::OK
    } else if fraction <= 0.001 {
        palette::ERROR
    } else {
        palette::WARN
    }
}

fn choice_rows_ui(
    ui: &mut Ui,
    results: &[TargetResult],
    range: std::ops::Range<usize>,
    width: f32,
    view: &mut RowsView,
) {
    header_ui(ui, &["#", "context", "choices"], results);
    for i in range {
        let first = row(results, i);
        let gold = num(first, "gold").map(|g| g as usize);
        ui.vertical(|ui| ui.label((i + 1).to_string()));
        clipped_ui(ui, &text(first, "context"), width, (i, 0), view);
        ui.vertical(|ui| {
            ui.set_width(width);
            let choices = first.and_then(|r| r.get("choices")).and_then(Value::as_array);
            for (c, choice) in choices.into_iter().flatten().enumerate() {
                let line = format!("{c}. {}", choice.as_str().map(String::from).unwrap_or_else(|| choice.to_string()));
                let line = clip(&line, 120);
                if Some(c) == gold {
                    ui.label(RichText::new(format!("{line}  (gold)")).color(palette::OK));
                } else {
                    ui.label(line);
                }
            }
        });
        for r in results {
            let cell = row_of(r, i);
            ui.vertical(|ui| pick_ui(ui, cell, gold));
        }
        ui.end_row();
    }
}

/// A target's picks (by log-likelihood and length-normalized) and each choice's log-likelihood.
fn pick_ui(ui: &mut Ui, cell: Option<&Value>, gold: Option<usize>) {
    let pred = num(cell, "pred").map(|p| p as usize);
    let norm = num(cell, "pred_norm").map(|p| p as usize);
    let mark = |p: Option<usize>| match (p, gold) {
        (Some(p), Some(g)) if p == g => RichText::new(format!("{p} = gold")).color(palette::OK),
        (Some(p), Some(_)) => RichText::new(format!("{p} ≠ gold")).color(palette::ERROR),
        (Some(p), None) => RichText::new(p.to_string()),
        (None, _) => RichText::new("—"),
    };
    ui.horizontal(|ui| {
        ui.label("pick");
        ui.label(mark(pred)).on_hover_text("argmax of the log-likelihoods (acc)");
        ui.label("norm");
        ui.label(mark(norm)).on_hover_text("argmax of log-likelihood / length in characters (acc_norm)");
    });
    let lls = cell.and_then(|c| c.get("loglikelihoods")).and_then(Value::as_array);
    for (c, ll) in lls.into_iter().flatten().enumerate() {
        let shown = ll.as_f64().map(|v| format!("{c}: {v:.3}")).unwrap_or_else(|| format!("{c}: —"));
        let shown = RichText::new(shown).small().monospace();
        ui.label(if Some(c) == pred { shown.strong() } else { shown.weak() });
    }
}

/// Text wrapped to `width`, clipped to [`CLIP_CHARS`] with "more" / "less".
fn clipped_ui(ui: &mut Ui, full: &str, width: f32, key: (usize, usize), view: &mut RowsView) {
    ui.vertical(|ui| {
        ui.set_width(width);
        let long = full.chars().count() > CLIP_CHARS;
        let open = view.expanded.contains(&key);
        let shown = if long && !open { clip(full, CLIP_CHARS) } else { full.to_string() };
        ui.add(egui::Label::new(shown).wrap().selectable(true));
        if long && ui.small_button(if open { "less" } else { "more" }).clicked() {
            if open {
                view.expanded.remove(&key);
            } else {
                view.expanded.insert(key);
            }
        }
    });
}

/// The first `chars` characters of `s`, with "…" when cut.
fn clip(s: &str, chars: usize) -> String {
    match s.char_indices().nth(chars) {
        Some((at, _)) => format!("{}…", &s[..at]),
        None => s.to_string(),
    }
}

/// Where a row came from: its "file:line" source, else its line, else a dash.
fn source(row: Option<&Value>) -> String {
    match text(row, "source") {
        s if s != "—" => s.rsplit('/').next().unwrap_or(&s).to_string(),
        _ => text(row, "line"),
    }
}

/// Row `i` of the first target that has it.
fn row(results: &[TargetResult], i: usize) -> Option<&Value> {
    results.iter().find_map(|r| row_of(r, i))
}

fn row_of(result: &TargetResult, i: usize) -> Option<&Value> {
    result.rows.as_array().and_then(|a| a.get(i))
}

/// A field as text: strings as they are, numbers and other values as JSON, missing as "—".
fn text(row: Option<&Value>, field: &str) -> String {
    match row.and_then(|r| r.get(field)) {
        None | Some(Value::Null) => "—".into(),
        Some(Value::String(s)) => s.clone(),
        Some(v) => v.to_string(),
    }
}

fn num(row: Option<&Value>, field: &str) -> Option<f64> {
    row.and_then(|r| r.get(field)).and_then(|v| v.as_f64().or_else(|| v.as_bool().map(|b| f64::from(u8::from(b)))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn fields_read_defensively() {
        let r = json!({"line": 3, "prompt": "hi", "scores": {"exact_match": true, "token_f1": 0.5}});
        assert_eq!(text(Some(&r), "line"), "3");
        assert_eq!(text(Some(&r), "prompt"), "hi");
        assert_eq!(text(Some(&r), "answer"), "—");
        assert_eq!(text(None, "answer"), "—");
        assert_eq!(num(r.get("scores"), "exact_match"), Some(1.0));
        assert_eq!(num(r.get("scores"), "judge_score"), None);
        assert_eq!(num(Some(&json!([1, 2])), "loss"), None);
        assert_eq!(clip("ab✓cd", 3), "ab✓…");
        assert_eq!(clip("abc", 3), "abc");
    }
}
