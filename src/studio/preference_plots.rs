//! The training page's preference plots (DPO, ORPO), under TRL's names: `rewards/accuracies` (training steps and
//! `eval_rewards/accuracies` on the validation pairs), `rewards/margins` (and `eval_rewards/margins`), and
//! `rewards/chosen` beside `rewards/rejected`; x axes linked with the other training plots. Also the run's latest
//! values for its status line.

use super::plot_axes::with_readable_y;
use super::preference_series::PreferenceSeries;
use super::widgets::{decimate, palette};
use egui::{RichText, Ui};
use egui_plot::{Corner, Legend, Line, MarkerShape, Plot, PlotPoint, PlotPoints, Points};

/// Points drawn per series (the rest decimated for drawing only).
const MAX_DRAWN_POINTS: usize = 2000;

/// The three preference plots in a row, x axes linked through `link`.
pub fn preference_plots_ui(ui: &mut Ui, series: &PreferenceSeries, link: egui::Id, height: f32) {
    ui.columns(3, |cols| {
        // Accuracies climb towards 1: their legend sits low, out of the way.
        plot_ui(&mut cols[0], "rewards/accuracies", Corner::RightBottom, link, height, Some((0.0, 1.0)), |plot| {
            train_and_eval(plot, "rewards/accuracies", &series.accuracies, &series.val_accuracies);
        });
        plot_ui(&mut cols[1], "rewards/margins", Corner::LeftTop, link, height, None, |plot| {
            train_and_eval(plot, "rewards/margins", &series.margins, &series.val_margins);
        });
        plot_ui(&mut cols[2], "rewards/chosen · rewards/rejected", Corner::LeftBottom, link, height, None, |plot| {
            let chosen = decimate(&series.chosen, MAX_DRAWN_POINTS);
            let rejected = decimate(&series.rejected, MAX_DRAWN_POINTS);
            plot.line(
                Line::new("rewards/chosen", PlotPoints::Owned(chosen.into_owned())).color(palette::OK).width(1.5),
            );
            plot.line(
                Line::new("rewards/rejected", PlotPoints::Owned(rejected.into_owned()))
                    .color(palette::ERROR)
                    .width(1.5),
            );
        });
    });
}

fn plot_ui(
    ui: &mut Ui,
    title: &str,
    legend: Corner,
    link: egui::Id,
    height: f32,
    y_range: Option<(f64, f64)>,
    add: impl FnOnce(&mut egui_plot::PlotUi<'_>),
) {
    ui.label(RichText::new(title).strong());
    let mut plot = with_readable_y(Plot::new(format!("{title}-plot")))
        .allow_scroll(false)
        .height(height)
        .legend(Legend::default().position(legend))
        .link_axis(link, [true, false])
        .x_axis_label("step");
    if let Some((lo, hi)) = y_range {
        plot = plot.include_y(lo).include_y(hi);
    }
    plot.show(ui, add);
}

/// A training series as a line and its evaluations (TRL's `eval_` prefix) as a line with points.
fn train_and_eval(plot: &mut egui_plot::PlotUi<'_>, name: &str, train: &[PlotPoint], eval: &[PlotPoint]) {
    let drawn = decimate(train, MAX_DRAWN_POINTS);
    plot.line(Line::new(name.to_string(), PlotPoints::Owned(drawn.into_owned())).color(palette::TRAIN).width(1.5));
    if !eval.is_empty() {
        let eval_name = format!("eval_{name}");
        let (line, points) = (PlotPoints::Owned(eval.to_vec()), PlotPoints::Owned(eval.to_vec()));
        plot.line(Line::new(eval_name.clone(), line).color(palette::VALID).width(2.0));
        plot.points(Points::new(eval_name, points).color(palette::VALID).radius(3.5).shape(MarkerShape::Circle));
    }
}

/// The latest preference values for the run's status line: "rewards/accuracies 0.750", "rewards/margins 0.31",
/// and the last evaluation's accuracy.
pub fn status_parts(series: &PreferenceSeries) -> Vec<(String, bool)> {
    let mut out = Vec::new();
    if let Some(m) = &series.last {
        out.push((format!("rewards/accuracies {:.3}", m.rewards_accuracies), false));
        out.push((format!("rewards/margins {:.3}", m.rewards_margins), false));
    }
    if let Some(m) = &series.last_val {
        out.push((format!("eval_rewards/accuracies {:.3}", m.rewards_accuracies), true));
    }
    out
}

/// [`status_parts`] as separated labels (evaluation values in the validation colour).
pub fn status_ui(ui: &mut Ui, series: &PreferenceSeries) {
    for (text, eval) in status_parts(series) {
        ui.separator();
        let text = RichText::new(text);
        ui.label(if eval { text.color(palette::VALID) } else { text });
    }
}
