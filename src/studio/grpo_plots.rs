//! The training page's GRPO plots under TRL's names: `reward` with its ± std band and `eval_reward`, each
//! `rewards/<name>/mean`, `kl` (when beta > 0), `completions/mean_length`, and `clip_ratio/region_mean` beside
//! `completions/clipped_ratio`; x axes linked with the other training plots. Also the run's latest values for its
//! status line: the reward and the last batch's generation and training seconds.

use super::grpo_series::GrpoSeries;
use super::plot_axes::with_readable_y;
use super::widgets::{decimate, palette};
use egui::{Color32, RichText, Ui};
use egui_plot::{Corner, Legend, Line, LineStyle, MarkerShape, Plot, PlotPoint, PlotPoints, Points};

/// Points drawn per series (the rest decimated for drawing only).
const MAX_DRAWN_POINTS: usize = 2000;

/// One plot: its title, where its legend sits, a y range it always shows, and what it draws.
struct Panel<'a> {
    title: &'static str,
    legend: Corner,
    y_range: Option<(f64, f64)>,
    draw: Box<dyn FnOnce(&mut egui_plot::PlotUi<'_>) + 'a>,
}

/// The GRPO plots, three to a row, x axes linked through `link`.
pub fn grpo_plots_ui(ui: &mut Ui, series: &GrpoSeries, link: egui::Id, height: f32) {
    let mut panels = vec![
        Panel {
            title: "reward (mean ± std)",
            legend: Corner::LeftTop,
            y_range: None,
            draw: Box::new(|plot| {
                line(plot, "reward", &series.reward, palette::TRAIN, 1.8);
                for band in [&series.reward_high, &series.reward_low] {
                    let drawn = decimate(band, MAX_DRAWN_POINTS);
                    let band = Line::new("reward ± std", PlotPoints::Owned(drawn.into_owned()));
                    plot.line(band.color(palette::TRAIN_RAW).width(1.0).style(LineStyle::dashed_dense()));
                }
                if !series.val_reward.is_empty() {
                    let points = PlotPoints::Owned(series.val_reward.clone());
                    plot.line(
                        Line::new("eval_reward", PlotPoints::Owned(series.val_reward.clone())).color(palette::VALID),
                    );
                    plot.points(
                        Points::new("eval_reward", points).color(palette::VALID).radius(3.5).shape(MarkerShape::Circle),
                    );
                }
            }),
        },
        Panel {
            title: "rewards/<name>/mean",
            legend: Corner::LeftTop,
            y_range: None,
            draw: Box::new(|plot| {
                for (i, (name, points)) in series.each_reward.iter().enumerate() {
                    let color = palette::SERIES[i % palette::SERIES.len()];
                    line(plot, &format!("rewards/{name}/mean"), points, color, 1.5);
                }
            }),
        },
    ];
    if !series.kl.is_empty() {
        panels.push(Panel {
            title: "kl",
            legend: Corner::LeftTop,
            y_range: Some((0.0, 0.0)),
            draw: Box::new(|plot| line(plot, "kl", &series.kl, palette::LR, 1.5)),
        });
    }
    panels.push(Panel {
        title: "completions/mean_length",
        legend: Corner::LeftTop,
        y_range: Some((0.0, 0.0)),
        draw: Box::new(|plot| line(plot, "completions/mean_length", &series.mean_length, palette::SPEED, 1.5)),
    });
    panels.push(Panel {
        title: "clip_ratio/region_mean · completions/clipped_ratio",
        legend: Corner::LeftTop,
        y_range: Some((0.0, 1.0)),
        draw: Box::new(|plot| {
            line(plot, "clip_ratio/region_mean", &series.clip_region, palette::WARN, 1.5);
            line(plot, "completions/clipped_ratio", &series.clipped_ratio, palette::ERROR, 1.5);
        }),
    });
    let mut panels = panels.into_iter();
    while panels.len() > 0 {
        let row: Vec<Panel<'_>> = panels.by_ref().take(3).collect();
        ui.columns(3, |cols| {
            for (col, panel) in cols.iter_mut().zip(row) {
                plot_ui(col, panel, link, height);
            }
        });
        ui.add_space(4.0);
    }
}

fn plot_ui(ui: &mut Ui, panel: Panel<'_>, link: egui::Id, height: f32) {
    ui.label(RichText::new(panel.title).strong());
    let mut plot = with_readable_y(Plot::new(format!("{}-plot", panel.title)))
        .allow_scroll(false)
        .height(height)
        .legend(Legend::default().position(panel.legend))
        .link_axis(link, [true, false])
        .x_axis_label("step");
    if let Some((lo, hi)) = panel.y_range {
        plot = plot.include_y(lo).include_y(hi);
    }
    plot.show(ui, panel.draw);
}

fn line(plot: &mut egui_plot::PlotUi<'_>, name: &str, points: &[PlotPoint], color: Color32, width: f32) {
    let drawn = decimate(points, MAX_DRAWN_POINTS);
    plot.line(Line::new(name.to_string(), PlotPoints::Owned(drawn.into_owned())).color(color).width(width));
}

/// The latest GRPO values for the run's status line: "reward 0.625 ± 0.250", each reward's mean, the last batch's
/// "generation 3.2 s · training 0.8 s", and the last evaluation's reward (true: in the validation colour).
pub fn status_parts(series: &GrpoSeries) -> Vec<(String, bool)> {
    let mut out = Vec::new();
    if let Some(m) = &series.last {
        out.push((format!("reward {:.3} ± {:.3}", m.reward_mean, m.reward_std), false));
        let each: Vec<String> = m.reward_means().iter().map(|(name, v)| format!("{name} {v:.3}")).collect();
        if each.len() > 1 {
            out.push((each.join(" · "), false));
        }
        let generation = series.generation_secs.unwrap_or(m.generation_secs);
        out.push((format!("generation {generation:.1} s · training {:.1} s", m.training_secs), false));
    }
    if let Some(p) = series.val_reward.last() {
        out.push((format!("eval_reward {:.3}", p.y), true));
    }
    out
}

/// [`status_parts`] as separated labels (evaluation values in the validation colour).
pub fn status_ui(ui: &mut Ui, series: &GrpoSeries) {
    for (text, eval) in status_parts(series) {
        ui.separator();
        let text = RichText::new(text);
        ui.label(if eval { text.color(palette::VALID) } else { text });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::train::grpo::GrpoMetrics;

    #[test]
    fn the_status_line_names_the_reward_and_where_the_time_went() {
        let mut s = GrpoSeries::default();
        assert!(status_parts(&s).is_empty());
        let m = GrpoMetrics {
            reward_mean: 0.625,
            reward_std: 0.25,
            generation_secs: 3.2,
            training_secs: 0.8,
            ..Default::default()
        };
        s.push_step(1, &m);
        s.push_step(2, &GrpoMetrics { generation_secs: 0.0, training_secs: 0.7, ..m.clone() });
        s.push_eval(2, &GrpoMetrics { reward_mean: 0.5, ..Default::default() });
        let texts: Vec<String> = status_parts(&s).into_iter().map(|(t, _)| t).collect();
        assert_eq!(texts, ["reward 0.625 ± 0.250", "generation 3.2 s · training 0.7 s", "eval_reward 0.500"]);
    }
}
