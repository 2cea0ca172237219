//! The X-ray section of the checkpoints page: what a run's adapter learned, per layer and module, from a saved
//! checkpoint (`engine::xray`, computed on the worker through `Command::XrayCheckpoint`). A layers x modules heat
//! map (update norm, relative norm or energy rank), a second checkpoint of the run beside it on the same colour
//! scale (how the update grew), the singular-value spectrum of a clicked module, and the rank recommendation with
//! "Use recommended rank", which sets the LoRA settings' rank and the alpha that keeps their scale.

use super::panel_ctx::{Action, PanelCtx};
use super::rank_panel::fmt_alpha;
use super::widgets::{banner_ui, card_ui, section_ui, Tone};
use super::xray_heatmap::{heatmap_ui, legend_ui, HeatMap, Metric};
use super::xray_spectrum::{spectrum_ui, Series};
use crate::engine::xray::XrayReport;
use crate::worker::{paths_match, Command, Event, RunInfo};
use egui::{RichText, Ui};
use std::path::{Path, PathBuf};

/// The section's state: plain data, the reports as the worker sent them.
#[derive(Default)]
pub struct XrayView {
    /// The run shown; selecting another resets the choices below.
    run_dir: Option<PathBuf>,
    /// The checkpoint X-rayed, and the one shown beside it.
    pub primary: Option<PathBuf>,
    pub second: Option<PathBuf>,
    /// Finished X-rays, by checkpoint folder.
    pub reports: Vec<XrayReport>,
    /// Asked for and not answered yet.
    pending: Vec<PathBuf>,
    /// Whether an X-ray was asked for in this run (then a newly chosen checkpoint is X-rayed at once).
    started: bool,
    errors: Vec<(PathBuf, String)>,
    pub metric: Metric,
    /// The module whose spectrum is shown: (layer, module).
    pub picked: Option<(usize, String)>,
    applied: Option<String>,
}

impl XrayView {
    /// The worker's answers.
    pub fn on_event(&mut self, event: Event) {
        match event {
            Event::XrayReady(report) => {
                self.pending.retain(|p| !paths_match(p, &report.checkpoint));
                self.errors.retain(|(p, _)| !paths_match(p, &report.checkpoint));
                self.reports.retain(|r| !paths_match(&r.checkpoint, &report.checkpoint));
                self.reports.push(*report);
            }
            Event::XrayFailed { checkpoint, error } => {
                self.pending.retain(|p| !paths_match(p, &checkpoint));
                self.errors.push((checkpoint, error.message));
            }
            _ => {}
        }
    }

    /// Whether an X-ray is under way.
    pub fn is_busy(&self) -> bool {
        !self.pending.is_empty()
    }

    pub fn report(&self, checkpoint: &Path) -> Option<&XrayReport> {
        self.reports.iter().find(|r| paths_match(&r.checkpoint, checkpoint))
    }

    fn request(&mut self, checkpoint: &Path, actions: &mut Vec<Action>) {
        if self.pending.iter().any(|p| paths_match(p, checkpoint)) {
            return;
        }
        self.errors.retain(|(p, _)| !paths_match(p, checkpoint));
        self.pending.push(checkpoint.to_path_buf());
        actions.push(Action::Send(Command::XrayCheckpoint { checkpoint: checkpoint.to_path_buf() }));
    }

    /// The section for `run` (drawn under its checkpoint table).
    pub fn ui(&mut self, ui: &mut Ui, run: &RunInfo, ctx: &mut PanelCtx<'_>) {
        let Some(latest) = run.checkpoints.last() else { return };
        if self.run_dir.as_deref() != Some(run.dir.as_path()) {
            *self = Self { reports: std::mem::take(&mut self.reports), metric: self.metric, ..Default::default() };
            self.run_dir = Some(run.dir.clone());
            self.primary = Some(latest.path.clone());
        }
        section_ui(ui, "X-ray");
        ui.label(
            RichText::new(
                "What the adapter learned: per layer and module, the size of its update and how many of the rank's \
                 directions it really uses (singular values of scale · B·A, from a QR of A and B and an r × r SVD).",
            )
            .weak(),
        );
        self.choices_ui(ui, run, ctx.actions);
        if self.is_busy() {
            ui.horizontal(|ui| {
                ui.spinner();
                ui.label("Reading the adapter…");
            });
        }
        for (path, message) in &self.errors {
            banner_ui(ui, Tone::Error, format!("X-ray of {} failed: {message}", path.display()));
        }
        let Some(primary) = self.primary.clone() else { return };
        let Some(report) = self.report(&primary).cloned() else { return };
        let second = self.second.as_deref().and_then(|p| self.report(p)).cloned();
        for note in &report.notes {
            banner_ui(ui, Tone::Info, note.as_str());
        }
        self.maps_ui(ui, &report, second.as_ref());
        let picked = self.picked.clone();
        if let Some(m) = picked.as_ref().and_then(|(l, name)| report.module(*l, name)) {
            let mut series = vec![Series { label: checkpoint_name(&report.checkpoint), module: m }];
            let other = second.as_ref().and_then(|s| picked.as_ref().and_then(|(l, name)| s.module(*l, name)));
            if let (Some(s), Some(o)) = (second.as_ref(), other) {
                series.push(Series { label: checkpoint_name(&s.checkpoint), module: o });
            }
            card_ui(ui, |ui| spectrum_ui(ui, &series));
        } else {
            ui.label(RichText::new("Click a cell to see that module's singular-value spectrum.").weak());
        }
        self.recommendation_ui(ui, &report, second.as_ref(), ctx);
    }

    /// The checkpoint pickers and the button that starts the X-ray.
    fn choices_ui(&mut self, ui: &mut Ui, run: &RunInfo, actions: &mut Vec<Action>) {
        let name_of = |p: &Option<PathBuf>| p.as_deref().map_or("none".to_string(), checkpoint_name);
        let (before_primary, before_second) = (self.primary.clone(), self.second.clone());
        ui.horizontal_wrapped(|ui| {
            let label = ui.label("Checkpoint");
            egui::ComboBox::from_id_salt("xray-primary")
                .selected_text(name_of(&self.primary))
                .show_ui(ui, |ui| {
                    for c in run.checkpoints.iter().rev() {
                        ui.selectable_value(&mut self.primary, Some(c.path.clone()), checkpoint_name(&c.path));
                    }
                })
                .response
                .labelled_by(label.id);
            let label = ui.label("beside it").on_hover_text("Another checkpoint of this run on the same colour scale");
            egui::ComboBox::from_id_salt("xray-second")
                .selected_text(name_of(&self.second))
                .show_ui(ui, |ui| {
                    ui.selectable_value(&mut self.second, None, "none");
                    for c in run.checkpoints.iter().rev() {
                        ui.selectable_value(&mut self.second, Some(c.path.clone()), checkpoint_name(&c.path));
                    }
                })
                .response
                .labelled_by(label.id);
            let button = ui
                .add_enabled(!self.is_busy(), egui::Button::new("X-ray"))
                .on_hover_text("Read the chosen checkpoints and measure every adapted module's update");
            if button.clicked() {
                self.started = true;
                for path in [self.primary.clone(), self.second.clone()].into_iter().flatten() {
                    self.request(&path, actions);
                }
            }
        });
        let changed = before_primary != self.primary || before_second != self.second;
        if changed && self.started {
            for path in [self.primary.clone(), self.second.clone()].into_iter().flatten() {
                if self.report(&path).is_none() {
                    self.request(&path, actions);
                }
            }
        }
    }

    /// The metric switch, the colour scale and the heat map(s).
    fn maps_ui(&mut self, ui: &mut Ui, report: &XrayReport, second: Option<&XrayReport>) {
        ui.horizontal(|ui| {
            ui.label("Colour by");
            for metric in Metric::ALL {
                ui.selectable_value(&mut self.metric, metric, metric.label()).on_hover_text(metric.help());
            }
        });
        let reports: Vec<&XrayReport> = std::iter::once(report).chain(second).collect();
        let max = match self.metric {
            Metric::EnergyRank => reports.iter().map(|r| r.rank as f64).fold(0.0, f64::max),
            metric => reports.iter().flat_map(|r| &r.modules).filter_map(|m| metric.value(m)).fold(0.0, f64::max),
        };
        if self.metric == Metric::RelativeNorm && report.base_model.is_none() {
            ui.label(RichText::new("No base model: relative norms are unknown (see the note above).").weak());
        }
        legend_ui(ui, self.metric, max);
        let layers = report.layers();
        let modules = report.module_names();
        let picked = self.picked.as_ref().map(|(l, m)| (*l, m.as_str()));
        let mut clicked = None;
        egui::ScrollArea::horizontal().id_salt("xray-maps").show(ui, |ui| {
            ui.horizontal_top(|ui| {
                for (k, r) in reports.iter().enumerate() {
                    let title = format!("{}{}", checkpoint_name(&r.checkpoint), if k == 1 { " (beside)" } else { "" });
                    let map = HeatMap {
                        title: &title,
                        report: r,
                        layers: &layers,
                        modules: &modules,
                        metric: self.metric,
                        max,
                        picked,
                    };
                    if let Some(pick) = ui.vertical(|ui| heatmap_ui(ui, &map)).inner {
                        clicked = Some(pick);
                    }
                    ui.add_space(24.0);
                }
            });
        });
        if clicked.is_some() {
            self.picked = clicked;
        }
    }

    /// The recommended rank, why, and the button that puts it into the LoRA settings.
    fn recommendation_ui(
        &mut self,
        ui: &mut Ui,
        report: &XrayReport,
        second: Option<&XrayReport>,
        ctx: &mut PanelCtx<'_>,
    ) {
        card_ui(ui, |ui| {
            ui.set_width(ui.available_width());
            for r in std::iter::once(report).chain(second) {
                let total = r.modules.iter().map(|m| m.update_norm * m.update_norm).sum::<f64>().sqrt();
                let rank = r.summary.recommended_rank.map_or("none".to_string(), |k| k.to_string());
                ui.label(format!(
                    "{}: rank {} · total update norm {total:.4e} · recommended rank {rank} · {:.2} s",
                    checkpoint_name(&r.checkpoint),
                    r.rank,
                    r.elapsed_secs
                ));
            }
            ui.add(egui::Label::new(RichText::new(&report.summary.reason).weak()).wrap());
            let Some(rank) = report.summary.recommended_rank else { return };
            let lora = &mut ctx.prefs.train.lora;
            let wanted = lora.at_rank_with_scale(rank, lora.scale());
            ui.horizontal(|ui| {
                if lora.rank == rank {
                    ui.label(
                        RichText::new(format!("rank {rank} is in the LoRA settings"))
                            .color(super::widgets::palette::OK),
                    );
                } else if ui
                    .button("Use recommended rank")
                    .on_hover_text(format!(
                        "Set LoRA rank {rank} and alpha {} in the training settings: the scale stays {:.3} ({})",
                        fmt_alpha(wanted.alpha),
                        lora.scale(),
                        if lora.use_rslora { "alpha / √rank" } else { "alpha / rank" }
                    ))
                    .clicked()
                {
                    self.applied = Some(format!(
                        "LoRA settings: rank {} to {rank}, alpha {} to {} (scale {:.3} kept)",
                        lora.rank,
                        fmt_alpha(lora.alpha),
                        fmt_alpha(wanted.alpha),
                        lora.scale()
                    ));
                    *lora = wanted;
                }
            });
            if let Some(note) = &self.applied {
                banner_ui(ui, Tone::Ok, note.as_str());
            }
        });
    }
}

/// A checkpoint's folder name ("checkpoint-40").
fn checkpoint_name(path: &Path) -> String {
    path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned())
}
