//! The Evaluate page's plot: one metric against the training step, one line per run (its checkpoints' targets in
//! step order), the base model as a horizontal reference line. Targets without a step (an adapter folder from
//! elsewhere) are listed under the plot instead.

use super::plot_axes::with_readable_y;
use super::widgets::palette;
use crate::engine::eval::TargetResult;
use egui::{RichText, Ui};
use egui_plot::{Corner, HLine, Legend, Line, LineStyle, MarkerShape, Plot, Points};
use std::path::PathBuf;

/// One run's (step, value) points in step order.
#[derive(Debug, Clone, PartialEq)]
pub struct RunSeries {
    pub name: String,
    pub points: Vec<[f64; 2]>,
}

/// What the plot draws for `metric`: one series per run, the base's value, and the labels of targets that have
/// the metric but no step.
pub fn series(results: &[TargetResult], metric: &str) -> (Vec<RunSeries>, Option<f64>, Vec<String>) {
    let mut runs: Vec<(PathBuf, RunSeries)> = Vec::new();
    let (mut base, mut stepless) = (None, Vec::new());
    for r in results {
        let Some(value) = r.metric(metric).filter(|v| v.is_finite()) else { continue };
        match (&r.target.adapter, r.target.step) {
            (None, _) => base = Some(value),
            (Some(dir), Some(step)) => {
                let run = dir.parent().map(PathBuf::from).unwrap_or_default();
                let name = run.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "run".into());
                match runs.iter_mut().find(|(d, _)| *d == run) {
                    Some((_, s)) => s.points.push([step as f64, value]),
                    None => runs.push((run, RunSeries { name, points: vec![[step as f64, value]] })),
                }
            }
            (Some(_), None) => stepless.push(r.target.label.clone()),
        }
    }
    let mut out: Vec<RunSeries> = runs.into_iter().map(|(_, s)| s).collect();
    for s in &mut out {
        s.points.sort_by(|a, b| a[0].total_cmp(&b[0]));
    }
    (out, base, stepless)
}

/// The metric picker and the plot; `metric` is the remembered choice (empty or unknown: the first metric).
pub fn plot_ui(ui: &mut Ui, results: &[TargetResult], names: &[String], metric: &mut String) {
    if names.is_empty() {
        return;
    }
    if !names.contains(metric) {
        *metric = names[0].clone();
    }
    ui.horizontal(|ui| {
        ui.label(RichText::new("Against the training step").strong());
        egui::ComboBox::from_id_salt("eval-plot-metric").selected_text(metric.as_str()).show_ui(ui, |ui| {
            for n in names {
                ui.selectable_value(metric, n.clone(), n);
            }
        });
    });
    let (runs, base, stepless) = series(results, metric);
    if runs.is_empty() {
        ui.label(RichText::new("Pick checkpoints of a run to see the metric against the training step.").weak());
        return;
    }
    let (lo, hi) = y_range(&runs, base);
    with_readable_y(Plot::new("eval-metric-plot"))
        .allow_scroll(false)
        .height(220.0)
        // The base is step 0: the x axis starts there, and steps are whole numbers.
        .include_x(0.0)
        .include_y(lo)
        .include_y(hi)
        .x_axis_formatter(
            |mark, _| if mark.value.fract() == 0.0 { format!("{:.0}", mark.value) } else { String::new() },
        )
        .legend(Legend::default().position(Corner::RightTop))
        .x_axis_label("step")
        .y_axis_label(metric.as_str())
        .show(ui, |plot| {
            if let Some(b) = base {
                plot.hline(HLine::new("base", b).color(palette::MASKED_FG).width(1.5).style(LineStyle::dashed_loose()));
            }
            for (i, s) in runs.iter().enumerate() {
                let color = palette::SERIES[i % palette::SERIES.len()];
                plot.line(Line::new(s.name.clone(), s.points.clone()).color(color).width(2.0));
                plot.points(
                    Points::new(s.name.clone(), s.points.clone()).color(color).radius(3.5).shape(MarkerShape::Circle),
                );
            }
        });
    if !stepless.is_empty() {
        ui.label(RichText::new(format!("Not on the plot (no training step): {}", stepless.join(", "))).small().weak());
    }
}

/// The values' range with a tenth of it (or of the value, when all are equal) as margin, so the base's line and
/// the extreme points never sit on the plot's edge.
fn y_range(runs: &[RunSeries], base: Option<f64>) -> (f64, f64) {
    let values = runs.iter().flat_map(|s| s.points.iter().map(|p| p[1])).chain(base);
    let (lo, hi) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let span = hi - lo;
    let pad = if span > 0.0 { 0.1 * span } else { 0.05 * lo.abs().max(1e-3) };
    (lo - pad, hi + pad)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::eval::{EvalTarget, Metric};
    use std::path::Path;

    fn result(target: EvalTarget, loss: f64) -> TargetResult {
        TargetResult {
            target,
            metrics: vec![Metric::new("loss", loss)],
            rows: serde_json::Value::Null,
            elapsed_secs: 0.0,
        }
    }

    #[test]
    fn one_series_per_run_in_step_order_and_the_base_apart() {
        let results = [
            result(EvalTarget::base(), 3.0),
            result(EvalTarget::adapter(Path::new("runs/a/checkpoint-20")), 2.0),
            result(EvalTarget::adapter(Path::new("runs/b/checkpoint-10")), 2.6),
            result(EvalTarget::adapter(Path::new("runs/a/checkpoint-10")), 2.5),
            result(EvalTarget::adapter(Path::new("elsewhere/my-adapter")), 2.2),
        ];
        let (runs, base, stepless) = series(&results, "loss");
        assert_eq!(base, Some(3.0));
        assert_eq!(runs.len(), 2);
        assert_eq!(runs[0], RunSeries { name: "a".into(), points: vec![[10.0, 2.5], [20.0, 2.0]] });
        assert_eq!(runs[1].name, "b");
        assert_eq!(stepless, ["my-adapter"]);
        assert!(series(&results, "acc").0.is_empty());
        let (lo, hi) = y_range(&runs, base);
        assert!((lo - 1.9).abs() < 1e-9 && (hi - 3.1).abs() < 1e-9, "{lo} {hi}");
    }
}
