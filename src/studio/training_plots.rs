//! The training page's four live plots (loss raw and smoothed with validation points, learning rate,
//! throughput, gradient norm), and for a preference or GRPO run its reward plots below them, their x axes linked; long
//! series are decimated for drawing only.

use super::live_run::LiveRun;
use super::plot_axes::with_readable_y;
use super::widgets::{self, decimate, palette};
use egui::{RichText, Ui};
use egui_plot::{Corner, Legend, Line, MarkerShape, Plot, Points};

/// Points drawn per series; longer series are decimated (min/max per bucket) for drawing only.
const MAX_DRAWN_POINTS: usize = 2000;

/// The four live plots, x axes linked.
pub fn plots_ui(ui: &mut Ui, run: &LiveRun, smoothing: &mut f32) {
    let link = egui::Id::unique("train-plots-x");
    let height = 200.0;
    ui.columns(2, |cols| {
        let ui = &mut cols[0];
        ui.horizontal(|ui| {
            ui.label(RichText::new("Loss").strong());
            ui.add_space(10.0);
            let l = ui.label(RichText::new("smoothing").weak());
            ui.add(egui::Slider::new(smoothing, 0.0..=0.99).fixed_decimals(2))
                .labelled_by(l.id)
                .on_hover_text("Exponential moving average of the raw loss (debiased, as TensorBoard does)");
        });
        let raw = decimate(&run.loss, MAX_DRAWN_POINTS);
        let smooth = decimate(&run.smoothed, MAX_DRAWN_POINTS);
        with_readable_y(Plot::new("loss-plot"))
            .allow_scroll(false)
            .height(height)
            .legend(Legend::default().position(Corner::RightTop))
            .link_axis(link, [true, false])
            .x_axis_label("step")
            .show(ui, |plot| {
                plot.line(Line::new("train (raw)", &raw[..]).color(palette::TRAIN_RAW).width(1.0));
                plot.line(Line::new("train (smoothed)", &smooth[..]).color(palette::TRAIN).width(2.0));
                if !run.val_loss.is_empty() {
                    plot.line(Line::new("validation", &run.val_loss[..]).color(palette::VALID).width(2.0));
                    plot.points(
                        Points::new("validation", &run.val_loss[..])
                            .color(palette::VALID)
                            .radius(3.5)
                            .shape(MarkerShape::Circle),
                    );
                }
            });

        let ui = &mut cols[1];
        ui.label(RichText::new("Learning rate").strong());
        let lr = decimate(&run.lr, MAX_DRAWN_POINTS);
        with_readable_y(Plot::new("lr-plot"))
            .allow_scroll(false)
            .height(height)
            .link_axis(link, [true, false])
            .y_axis_formatter(widgets::axis_sci)
            .include_y(0.0)
            .x_axis_label("step")
            .show(ui, |plot| {
                plot.line(Line::new("learning rate", &lr[..]).color(palette::LR).width(2.0));
            });
    });
    ui.add_space(4.0);
    ui.columns(2, |cols| {
        let ui = &mut cols[0];
        ui.label(RichText::new("Throughput").strong());
        let tps = decimate(&run.tokens_per_sec_series, MAX_DRAWN_POINTS);
        with_readable_y(Plot::new("tps-plot"))
            .allow_scroll(false)
            .height(height * 0.8)
            .link_axis(link, [true, false])
            .include_y(0.0)
            .x_axis_label("step")
            .y_axis_label("tokens/s")
            .show(ui, |plot| {
                plot.line(Line::new("tokens/s", &tps[..]).color(palette::SPEED).width(2.0).fill(0.0).fill_alpha(0.15));
            });
        let ui = &mut cols[1];
        ui.label(RichText::new("Gradient norm").strong());
        let gn = decimate(&run.grad_norm, MAX_DRAWN_POINTS);
        with_readable_y(Plot::new("grad-plot"))
            .allow_scroll(false)
            .height(height * 0.8)
            .link_axis(link, [true, false])
            .include_y(0.0)
            .x_axis_label("step")
            .show(ui, |plot| {
                plot.line(Line::new("grad norm", &gn[..]).color(palette::SERIES[3]).width(1.5));
            });
    });
    if !run.preference.is_empty() {
        ui.add_space(4.0);
        super::preference_plots::preference_plots_ui(ui, &run.preference, link, height * 0.8);
    }
    if !run.grpo.is_empty() {
        ui.add_space(4.0);
        super::grpo_plots::grpo_plots_ui(ui, &run.grpo, link, height * 0.8);
    }
}
