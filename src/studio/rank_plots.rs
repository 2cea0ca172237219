//! The rank explorer's plots: values against rank on a log2 axis labelled with the ranks themselves, and a
//! y axis whose marks are always far enough apart to carry labels.
//!
//! The y axes use `plot_axes::readable_marks`, so they keep their labels when a sweep widens the range.

use super::plot_axes::with_readable_y;
use super::widgets::palette;
use crate::engine::bench::LoraMicroResult;
use egui::{RichText, Ui};
use egui_plot::{AxisHints, GridMark, Legend, Line, MarkerShape, Plot, PlotPoints, Points};

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
    with_readable_y(plot.height(190.0))
        .allow_scroll(false)
        .allow_drag(false)
        .allow_zoom(false)
        .custom_x_axes(vec![rank_axis("rank")])
        .x_grid_spacer(|input| log2_marks(input.bounds))
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
    let mut plot = with_readable_y(Plot::new(id))
        .height(200.0)
        .legend(Legend::default().position(egui_plot::Corner::LeftTop))
        .allow_scroll(false)
        .x_axis_label(x_label.to_string())
        .y_axis_label("ms")
        .include_y(0.0);
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
}
