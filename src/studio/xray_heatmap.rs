//! The X-ray heat map: one cell per (layer, adapted module), coloured by the chosen metric on a scale shared
//! with the map beside it (so two checkpoints of a run show how the update grew). Every cell is a widget of its
//! own: hovering shows the module's values, a click picks it for the spectrum.

use crate::engine::xray::{ModuleXray, XrayReport};
use egui::{Color32, RichText, Sense, Ui};

/// What the cells show.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Metric {
    #[default]
    UpdateNorm,
    /// The update's norm over the frozen weight's (needs the base model).
    RelativeNorm,
    EnergyRank,
}

impl Metric {
    pub const ALL: [Metric; 3] = [Metric::UpdateNorm, Metric::RelativeNorm, Metric::EnergyRank];

    pub fn label(self) -> &'static str {
        match self {
            Metric::UpdateNorm => "Update norm",
            Metric::RelativeNorm => "Relative norm",
            Metric::EnergyRank => "Energy rank 90",
        }
    }

    pub fn help(self) -> &'static str {
        match self {
            Metric::UpdateNorm => {
                "Frobenius norm of the scaled update scale · B·A: how much the adapter changes the weight"
            }
            Metric::RelativeNorm => "The update's norm over the frozen weight's norm (needs the base model)",
            Metric::EnergyRank => {
                "The fewest singular values that hold 90% of the update's squared norm: how many of the rank's \
                 directions the module really uses"
            }
        }
    }

    /// The metric's value for `m`; None when it cannot be known (no base for the relative norm).
    pub fn value(self, m: &ModuleXray) -> Option<f64> {
        match self {
            Metric::UpdateNorm => Some(m.update_norm),
            Metric::RelativeNorm => m.relative_norm,
            Metric::EnergyRank => Some(m.energy_rank_90 as f64),
        }
    }

    pub fn format(self, v: f64) -> String {
        match self {
            Metric::EnergyRank => format!("{v:.0}"),
            _ => format!("{v:.3e}"),
        }
    }
}

/// The cell size and the label margins, in points.
const CELL_W: f32 = 52.0;
const CELL_H: f32 = 14.0;
const LAYER_LABEL_W: f32 = 30.0;

/// Colours from dark (low) to bright (high), perceptually ordered (viridis' stops).
const RAMP: [Color32; 5] = [
    Color32::from_rgb(0x44, 0x01, 0x54),
    Color32::from_rgb(0x3B, 0x52, 0x8B),
    Color32::from_rgb(0x21, 0x90, 0x8C),
    Color32::from_rgb(0x5D, 0xC8, 0x63),
    Color32::from_rgb(0xFD, 0xE7, 0x25),
];

/// The ramp's colour at `t` in 0..=1.
pub fn ramp(t: f64) -> Color32 {
    let t = t.clamp(0.0, 1.0) * (RAMP.len() - 1) as f64;
    let (i, f) = ((t.floor() as usize).min(RAMP.len() - 2), (t - t.floor()) as f32);
    let f = if t >= (RAMP.len() - 1) as f64 { 1.0 } else { f };
    RAMP[i].lerp_to_gamma(RAMP[i + 1], f)
}

/// One heat map to draw.
pub struct HeatMap<'a> {
    /// Names the map in its cells' accessible labels ("<title> layer 3 q_proj").
    pub title: &'a str,
    pub report: &'a XrayReport,
    pub layers: &'a [usize],
    pub modules: &'a [String],
    pub metric: Metric,
    /// The top of the shared colour scale (the bottom is 0).
    pub max: f64,
    pub picked: Option<(usize, &'a str)>,
}

/// The hover text of one module.
pub fn module_text(m: &ModuleXray) -> String {
    let relative = m.relative_norm.map_or("– (no base model)".to_string(), |r| format!("{r:.3e}"));
    let top: Vec<String> = m.singular_values.iter().take(4).map(|s| format!("{s:.3e}")).collect();
    let mut text = format!(
        "{}\nupdate norm {:.4e}\nrelative norm {relative}\nenergy rank 50/90/99: {} / {} / {}\ntop singular values {}",
        m.name,
        m.update_norm,
        m.energy_rank_50,
        m.energy_rank_90,
        m.energy_rank_99,
        top.join(", ")
    );
    if let Some(change) = m.magnitude_change {
        text.push_str(&format!("\nDoRA magnitude change {change:.3e}"));
    }
    text + "\nclick for its spectrum"
}

/// Draw the map; returns the (layer, module) clicked, if any.
pub fn heatmap_ui(ui: &mut Ui, map: &HeatMap<'_>) -> Option<(usize, String)> {
    let mut clicked = None;
    ui.label(RichText::new(map.title).strong());
    ui.horizontal(|ui| {
        ui.add_space(LAYER_LABEL_W);
        ui.spacing_mut().item_spacing.x = 0.0;
        for module in map.modules {
            let short = module.trim_end_matches("_proj");
            ui.add_sized([CELL_W, 14.0], egui::Label::new(RichText::new(short).small()).truncate())
                .on_hover_text(module.as_str());
        }
    });
    ui.spacing_mut().item_spacing.y = 0.0;
    for &layer in map.layers {
        ui.horizontal(|ui| {
            ui.spacing_mut().item_spacing.x = 0.0;
            ui.add_sized([LAYER_LABEL_W, CELL_H], egui::Label::new(RichText::new(layer.to_string()).small().weak()));
            for module in map.modules {
                if let Some(pick) = cell_ui(ui, map, layer, module) {
                    clicked = Some(pick);
                }
            }
        });
    }
    clicked
}

fn cell_ui(ui: &mut Ui, map: &HeatMap<'_>, layer: usize, module: &str) -> Option<(usize, String)> {
    let (rect, response) = ui.allocate_exact_size(egui::vec2(CELL_W, CELL_H), Sense::click());
    let found = map.report.module(layer, module);
    let label = format!("{} layer {layer} {module}", map.title);
    response.widget_info(|| egui::WidgetInfo::labeled(egui::Role::Button, found.is_some(), &label));
    let painter = ui.painter();
    let inner = rect.shrink(0.5);
    let Some(m) = found else {
        painter.rect_filled(inner, 0.0, ui.visuals().faint_bg_color);
        return None;
    };
    let fill = match map.metric.value(m) {
        Some(v) if map.max > 0.0 => ramp(v / map.max),
        Some(_) => ramp(0.0),
        None => ui.visuals().weak_text_color().gamma_multiply(0.3),
    };
    painter.rect_filled(inner, 0.0, fill);
    if map.picked == Some((layer, module)) {
        painter.rect_stroke(rect.shrink(1.0), 0.0, egui::Stroke::new(2.0, Color32::WHITE), egui::StrokeKind::Inside);
    }
    if response.hovered() {
        painter.rect_stroke(
            rect,
            0.0,
            egui::Stroke::new(1.0, ui.visuals().strong_text_color()),
            egui::StrokeKind::Inside,
        );
    }
    let response = response.on_hover_text(module_text(m));
    response.clicked().then(|| (layer, module.to_string()))
}

/// The colour scale under the maps: the ramp from 0 to `max` of `metric`.
pub fn legend_ui(ui: &mut Ui, metric: Metric, max: f64) {
    ui.horizontal(|ui| {
        ui.label(RichText::new(format!("{}: 0", metric.label())).small().weak());
        let (rect, _) = ui.allocate_exact_size(egui::vec2(160.0, 10.0), Sense::hover());
        let steps = 32;
        for i in 0..steps {
            let x0 = rect.left() + rect.width() * i as f32 / steps as f32;
            let x1 = rect.left() + rect.width() * (i + 1) as f32 / steps as f32;
            let r = egui::Rect::from_min_max(egui::pos2(x0, rect.top()), egui::pos2(x1, rect.bottom()));
            ui.painter().rect_filled(r, 0.0, ramp(i as f64 / (steps - 1) as f64));
        }
        ui.label(RichText::new(metric.format(max)).small().weak());
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ramp_runs_from_its_first_to_its_last_stop() {
        assert_eq!(ramp(0.0), RAMP[0]);
        assert_eq!(ramp(1.0), RAMP[4]);
        assert_eq!(ramp(2.0), RAMP[4]);
        assert_ne!(ramp(0.3), ramp(0.7));
    }
}
