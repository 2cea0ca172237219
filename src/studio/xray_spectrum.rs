//! The singular-value spectrum of one picked module: a bar per singular value of its scaled update, for one
//! checkpoint or two side by side (how the update grew), with its norms and energy ranks underneath.

use super::widgets::palette;
use crate::engine::xray::ModuleXray;
use egui::{RichText, Ui};
use egui_plot::{Bar, BarChart, Legend, Plot};

/// One checkpoint's view of the picked module: a label for the legend ("step 40") and its values.
pub struct Series<'a> {
    pub label: String,
    pub module: &'a ModuleXray,
}

/// Draw the spectrum of `series` (one or two), all of the same module.
pub fn spectrum_ui(ui: &mut Ui, series: &[Series<'_>]) {
    let Some(first) = series.first() else { return };
    ui.label(RichText::new(format!("Spectrum of {}", first.module.name)).strong());
    let colors = [palette::TRAIN, palette::VALID];
    let width = 0.8 / series.len() as f64;
    let charts: Vec<BarChart> = series
        .iter()
        .enumerate()
        .map(|(k, s)| {
            let offset = (k as f64 - (series.len() as f64 - 1.0) / 2.0) * width;
            let bars = s
                .module
                .singular_values
                .iter()
                .enumerate()
                .map(|(i, v)| Bar::new(i as f64 + 1.0 + offset, *v).width(width * 0.95))
                .collect();
            BarChart::new(s.label.clone(), bars).color(colors[k % colors.len()])
        })
        .collect();
    Plot::new(("xray-spectrum", &first.module.name))
        .height(200.0)
        .allow_scroll(false)
        .legend(Legend::default())
        .x_axis_label("index")
        .y_axis_label("singular value")
        .include_y(0.0)
        .show(ui, |plot| {
            for chart in charts {
                plot.bar_chart(chart);
            }
        });
    for s in series {
        let m = s.module;
        let relative = m.relative_norm.map_or("–".to_string(), |r| format!("{r:.3e}"));
        ui.label(
            RichText::new(format!(
                "{}: update norm {:.4e} · relative {relative} · energy rank 50/90/99 {} / {} / {}{}",
                s.label,
                m.update_norm,
                m.energy_rank_50,
                m.energy_rank_90,
                m.energy_rank_99,
                m.magnitude_change.map_or(String::new(), |c| format!(" · DoRA magnitude change {c:.3e}"))
            ))
            .small(),
        );
    }
}
