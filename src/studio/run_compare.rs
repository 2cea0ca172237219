//! The checkpoints page's "Compare runs" section: the loss curves of the runs ticked in the run list on one
//! plot (training loss smoothed and solid, validation loss dashed, one colour per run), with a legend of its
//! own beside the plot (below it when the page is narrow). Each legend entry has a line swatch in the run's
//! colour, the run's name (its user-given name, wrapped, never cut), and its last training and best
//! validation loss; hovering an entry thickens that run's lines.

use super::widgets::{fmt_loss, palette, smooth, to_points};
use crate::worker::RunInfo;
use egui::{RichText, Ui};
use egui_plot::{Line, LineStyle, Plot, PlotPoints};

/// Width of the legend beside the plot.
const LEGEND_WIDTH: f32 = 290.0;
/// Narrower than this, the legend goes under the plot.
const SIDE_BY_SIDE_MIN_WIDTH: f32 = 760.0;
const PLOT_HEIGHT: f32 = 260.0;

/// The section's state: which run's lines the pointer is on in the legend.
#[derive(Default)]
pub struct RunCompare {
    highlighted: Option<String>,
}

impl RunCompare {
    /// Plot `runs` (in list order; the colour of a run is its place in this list) with their legend.
    pub fn ui(&mut self, ui: &mut Ui, runs: &[&RunInfo]) {
        let mut hovered = None;
        if ui.available_width() >= SIDE_BY_SIDE_MIN_WIDTH {
            ui.horizontal_top(|ui| {
                let plot_width = ui.available_width() - LEGEND_WIDTH - ui.spacing().item_spacing.x;
                ui.allocate_ui(egui::vec2(plot_width, PLOT_HEIGHT), |ui| self.plot_ui(ui, runs));
                ui.vertical(|ui| {
                    ui.set_width(LEGEND_WIDTH);
                    hovered = legend_ui(ui, runs);
                });
            });
        } else {
            self.plot_ui(ui, runs);
            hovered = legend_ui(ui, runs);
        }
        self.highlighted = hovered;
    }

    fn plot_ui(&self, ui: &mut Ui, runs: &[&RunInfo]) {
        super::plot_axes::with_readable_y(Plot::new("overlay"))
            .allow_scroll(false)
            .height(PLOT_HEIGHT)
            .width(ui.available_width())
            .x_axis_label("step")
            .y_axis_label("loss")
            .show(ui, |plot| {
                for (i, run) in runs.iter().enumerate() {
                    let color = series_color(i);
                    let emphasis = if self.highlighted.as_deref() == Some(run.name.as_str()) { 1.5 } else { 0.0 };
                    let train = smooth(&to_points(&run.train_loss), 0.6);
                    plot.line(
                        Line::new(format!("{} train", run.title()), PlotPoints::Owned(train))
                            .color(color)
                            .width(2.0 + emphasis),
                    );
                    if !run.val_loss.is_empty() {
                        plot.line(
                            Line::new(format!("{} val", run.title()), PlotPoints::Owned(to_points(&run.val_loss)))
                                .color(color)
                                .width(1.5 + emphasis)
                                .style(LineStyle::dashed_loose()),
                        );
                    }
                }
            });
    }
}

/// The colour of the `index`th run on the plot and in its legend.
fn series_color(index: usize) -> egui::Color32 {
    palette::SERIES[index % palette::SERIES.len()]
}

/// One entry per run; returns the run (folder name) the pointer is on.
fn legend_ui(ui: &mut Ui, runs: &[&RunInfo]) -> Option<String> {
    let mut hovered = None;
    ui.label(RichText::new("solid: training loss (smoothed) · dashed: validation").weak().small());
    for (i, run) in runs.iter().enumerate() {
        let color = series_color(i);
        let entry = ui
            .horizontal_top(|ui| {
                line_swatch_ui(ui, color, false).widget_info(|| {
                    egui::WidgetInfo::labeled(egui::Role::Image, true, format!("Legend: {}", run.title()))
                });
                ui.vertical(|ui| {
                    ui.add(egui::Label::new(RichText::new(run.title()).strong()).wrap());
                    ui.horizontal_wrapped(|ui| {
                        ui.spacing_mut().item_spacing.x = 4.0;
                        let last_train = run.train_loss.last().map(|p| fmt_loss(p[1]));
                        // A DPO or ORPO loss is not an SFT loss: the method tells which curves compare.
                        if let Some(c) = run.config.as_ref().filter(|c| c.method.is_preference()) {
                            ui.label(RichText::new(c.method.name()).small().color(palette::ACCENT));
                        }
                        ui.label(RichText::new(format!("train {}", last_train.unwrap_or_else(|| "–".into()))).small());
                        if let Some(best) = run.val_loss.iter().map(|p| p[1]).min_by(f64::total_cmp) {
                            line_swatch_ui(ui, color, true);
                            ui.label(RichText::new(format!("best val {}", fmt_loss(best))).small());
                        }
                    });
                });
            })
            .response;
        let tip =
            if run.label.is_some() { format!("folder {}", run.dir.display()) } else { run.dir.display().to_string() };
        if entry.on_hover_text(tip).contains_pointer() {
            hovered = Some(run.name.clone());
        }
        ui.add_space(2.0);
    }
    hovered
}

/// A short stretch of line in a run's colour: solid for training, dashed for validation, as on the plot.
fn line_swatch_ui(ui: &mut Ui, color: egui::Color32, dashed: bool) -> egui::Response {
    let (rect, response) = ui.allocate_exact_size(egui::vec2(24.0, 14.0), egui::Sense::hover());
    let (left, right) = (rect.left_center(), rect.right_center());
    if dashed {
        ui.painter().extend(egui::Shape::dashed_line(&[left, right], egui::Stroke::new(2.0, color), 5.0, 3.0));
    } else {
        ui.painter().line_segment([left, right], egui::Stroke::new(3.0, color));
    }
    response
}
