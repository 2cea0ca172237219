//! Plot y axes that keep their labels. egui_plot's default y spacer puts marks at powers of ten and labels only
//! those at least 20 points apart; in a short plot whose values span about one unit (validation losses from 3.65
//! down to 2.6, tokens/s from 60 to 75) the tenths or tens are too close and the only whole hundred or unit
//! inside the range is one or none, so the axis shows one label or none. [`readable_marks`] picks a 1-2-5 step
//! that always leaves room, and [`readable_label`] prints a mark with the decimals its step needs.

use egui_plot::{GridInput, GridMark, Plot};

/// `plot` with a y axis of [`readable_marks`] labelled by [`readable_label`] (a later `y_axis_formatter`, such as
/// scientific notation for learning rates, replaces the labels and keeps the marks).
pub fn with_readable_y(plot: Plot<'_>) -> Plot<'_> {
    plot.grid_spacing(GRID_MIN_POINTS..=300.0)
        .y_grid_spacer(readable_marks)
        .y_axis_formatter(|mark, _| readable_label(mark))
}

/// Points between two labelled y marks at least (egui_plot shows labels fully from 30 points apart).
const Y_LABEL_GAP_POINTS: f64 = 34.0;
/// The plot's smallest grid spacing in points: egui_plot sizes `GridInput::base_step_size` from it.
const GRID_MIN_POINTS: f32 = 8.0;

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

#[cfg(test)]
mod tests {
    use super::*;

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
