//! The rank explorer's plots: values against rank on a log2 axis labelled with the ranks themselves, and a
//! y axis whose marks are always far enough apart to carry labels.
//!
//! egui_plot's default y spacer puts marks at powers of ten and labels only those at least 20 points apart; in
//! a short plot whose values span about one unit (validation losses from 3.65 down to 2.6, say) the tenths are
//! too close and the only whole number inside the range is one or none, so the axis lost its labels as soon as
//! a sweep's last probe widened the range. [`readable_marks`] picks a 1-2-5 step that always leaves room.

use super::widgets::palette;
use crate::engine::bench::LoraMicroResult;
use egui::{RichText, Ui};
use egui_plot::{AxisHints, GridInput, GridMark, Legend, Line, MarkerShape, Plot, PlotPoints, Points};

/// Points between two labelled y marks at least (egui_plot shows labels fully from 30 points apart).
const Y_LABEL_GAP_POINTS: f64 = 34.0;
/// The plot's smallest grid spacing in points: egui_plot sizes `GridInput::base_step_size` from it.
const GRID_MIN_POINTS: f32 = 8.0;

/// A plot of one value against rank, the x axis spanning `ranks` (log2) so points land where they will stay.
pub fn rank_plot_ui(
    ui: &mut Ui,
    id: &str,
    title: &str,
    points: Vec<[f64; 2]>,
    ranks: &[usize],
    color: egui::Color32,
    from_zero: bool,
) -> egui::Response {
    let title_response = ui.label(RichText::new(title).strong());
    let mut plot = Plot::new(id);
    if from_zero {
        plot = plot.include_y(0.0);
    }
    for r in ranks {
        plot = plot.include_x((*r as f64).log2());
    }
    plot.height(190.0)
        .allow_scroll(false)
        .allow_drag(false)
        .allow_zoom(false)
        .custom_x_axes(vec![rank_axis("rank")])
        .x_grid_spacer(|input| log2_marks(input.bounds))
        .grid_spacing(GRID_MIN_POINTS..=300.0)
        .y_grid_spacer(readable_marks)
        .y_axis_formatter(|mark, _| readable_label(mark))
        .show(ui, |plot| {
            plot.line(Line::new(title, PlotPoints::from(points.clone())).color(color).width(2.0));
            plot.points(
                Points::new(title, PlotPoints::from(points)).color(color).radius(4.0).shape(MarkerShape::Circle),
            );
        });
    title_response
}

/// An x axis of ranks: 1, 2, 4, ... at whole log2 values, labels allowed close together (they are short).
fn rank_axis(label: &str) -> AxisHints<'static> {
    AxisHints::new_x().label(label.to_string()).formatter(|m, _| rank_tick(m.value)).label_spacing(22.0..=28.0)
}

/// The rank at a whole log2 value, nothing elsewhere.
pub fn rank_tick(x: f64) -> String {
    if (x - x.round()).abs() < 1e-6 && x >= 0.0 {
        format!("{}", 2f64.powf(x.round()) as u64)
    } else {
        String::new()
    }
}

/// One mark per power of two inside the visible range: egui_plot draws labels for every mark it is given.
pub fn log2_marks(bounds: (f64, f64)) -> Vec<GridMark> {
    let (lo, hi) = (bounds.0.ceil().max(0.0) as i64, bounds.1.floor().min(20.0) as i64);
    (lo..=hi).map(|v| GridMark { value: v as f64, step_size: 1.0 }).collect()
}

/// Marks at multiples of the smallest 1-2-5 step that leaves [`Y_LABEL_GAP_POINTS`] between them.
pub fn readable_marks(input: GridInput) -> Vec<GridMark> {
    let (lo, hi) = input.bounds;
    if !(lo.is_finite() && hi.is_finite()) || hi <= lo || input.base_step_size <= 0.0 {
        return Vec::new();
    }
    let value_per_point = input.base_step_size / GRID_MIN_POINTS as f64;
    let step = nice_step(value_per_point * Y_LABEL_GAP_POINTS);
    let first = (lo / step).ceil() as i64;
    let last = (hi / step).floor() as i64;
    (first..=last).map(|i| GridMark { value: i as f64 * step, step_size: step }).collect()
}

/// The smallest of 1, 2, 5 x 10^k at least `at_least`.
fn nice_step(at_least: f64) -> f64 {
    let power = 10f64.powf(at_least.log10().floor());
    [1.0, 2.0, 5.0, 10.0].into_iter().map(|m| m * power).find(|s| *s >= at_least * (1.0 - 1e-9)).unwrap_or(10.0 * power)
}

/// A mark's value with as many decimals as its step needs (0.2 -> 1, 0.05 -> 2, 50 -> 0).
pub fn readable_label(mark: GridMark) -> String {
    let decimals = (-mark.step_size.log10().floor()).max(0.0) as usize;
    let value = if mark.value.abs() < mark.step_size * 1e-6 { 0.0 } else { mark.value };
    format!("{value:.decimals$}")
}

/// The micro-benchmark's forward and forward+backward times against `x` (log2 ranks when `log2_x`).
pub fn micro_plot_ui(
    ui: &mut Ui,
    id: &str,
    title: &str,
    x_label: &str,
    rows: &[&LoraMicroResult],
    x: impl Fn(&LoraMicroResult) -> f64,
    log2_x: bool,
) {
    ui.label(RichText::new(title).strong());
    let fwd: Vec<[f64; 2]> = rows.iter().map(|m| [x(m), m.forward_ms]).collect();
    let bwd: Vec<[f64; 2]> = rows.iter().filter_map(|m| m.backward_ms.map(|b| [x(m), b])).collect();
    let mut plot = Plot::new(id)
        .height(200.0)
        .legend(Legend::default().position(egui_plot::Corner::LeftTop))
        .allow_scroll(false)
        .x_axis_label(x_label.to_string())
        .y_axis_label("ms")
        .include_y(0.0)
        .grid_spacing(GRID_MIN_POINTS..=300.0)
        .y_grid_spacer(readable_marks)
        .y_axis_formatter(|mark, _| readable_label(mark));
    if log2_x {
        plot = plot.custom_x_axes(vec![rank_axis(x_label)]).x_grid_spacer(|input| log2_marks(input.bounds));
    }
    plot.show(ui, |plot| {
        plot.line(Line::new("forward", PlotPoints::from(fwd.clone())).color(palette::TRAIN).width(2.0));
        plot.points(Points::new("forward", PlotPoints::from(fwd)).color(palette::TRAIN).radius(3.5));
        if !bwd.is_empty() {
            plot.line(Line::new("forward + backward", PlotPoints::from(bwd.clone())).color(palette::ACCENT).width(2.0));
            plot.points(Points::new("forward + backward", PlotPoints::from(bwd)).color(palette::ACCENT).radius(3.5));
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_ticks_are_powers_of_two() {
        assert_eq!(rank_tick(3.0), "8");
        assert_eq!(rank_tick(0.0), "1");
        assert_eq!(rank_tick(2.5), "");
        let marks: Vec<f64> = log2_marks((1.9, 4.1)).iter().map(|m| m.value).collect();
        assert_eq!(marks, vec![2.0, 3.0, 4.0]);
    }

    /// The GridInput egui_plot builds for a plot `height_points` tall showing `bounds`.
    fn input(bounds: (f64, f64), height_points: f64) -> GridInput {
        GridInput { bounds, base_step_size: (bounds.1 - bounds.0) / height_points * GRID_MIN_POINTS as f64 }
    }

    /// The cause: egui_plot's default spacer on losses 3.05 .. 3.95 in 160 points gives tenths 18 points apart
    /// (labels hidden under 20) and no whole number inside the range: not one label.
    #[test]
    fn the_default_spacer_leaves_such_a_plot_without_labels() {
        let marks = egui_plot::log_grid_spacer(10)(input((3.05, 3.95), 160.0));
        let points_per_value = 160.0 / 0.9;
        let labelled =
            marks.iter().filter(|m| m.step_size * points_per_value > 20.0 && (3.05..=3.95).contains(&m.value));
        assert_eq!(labelled.count(), 0);
    }

    #[test]
    fn a_short_plot_of_losses_spanning_about_one_unit_keeps_labelled_marks() {
        // The sweep that lost its labels: losses 3.65 .. 1.85 plus egui_plot's margins, 160 points tall.
        for bounds in [(1.78, 3.72), (3.05, 3.95), (2.58, 3.70), (0.0, 125.0), (955.2, 956.9)] {
            let marks = readable_marks(input(bounds, 160.0));
            assert!(marks.len() >= 2, "{bounds:?}: {marks:?}");
            let step = marks[0].step_size;
            assert!(step / (bounds.1 - bounds.0) * 160.0 >= Y_LABEL_GAP_POINTS - 1e-9, "{bounds:?}: {step}");
            let labels: Vec<String> = marks.iter().map(|m| readable_label(*m)).collect();
            assert!(labels.iter().all(|l| !l.is_empty()), "{labels:?}");
            let unique: std::collections::HashSet<_> = labels.iter().collect();
            assert_eq!(unique.len(), labels.len(), "labels tell marks apart: {labels:?}");
        }
        let marks = readable_marks(input((3.05, 3.95), 160.0));
        let labels: Vec<String> = marks.iter().map(|m| readable_label(*m)).collect();
        assert_eq!(labels, vec!["3.2", "3.4", "3.6", "3.8"]);
        assert!(readable_marks(input((1.0, 1.0), 160.0)).is_empty());
    }

    #[test]
    fn nice_steps_round_up_to_one_two_five() {
        assert_eq!(nice_step(0.13), 0.2);
        assert_eq!(nice_step(0.2), 0.2);
        assert_eq!(nice_step(3.1), 5.0);
        assert_eq!(nice_step(7.0), 10.0);
        assert_eq!(readable_label(GridMark { value: 0.30000000000000004, step_size: 0.1 }), "0.3");
        assert_eq!(readable_label(GridMark { value: -1e-17, step_size: 0.05 }), "0.00");
        assert_eq!(readable_label(GridMark { value: 250.0, step_size: 50.0 }), "250");
    }
}
