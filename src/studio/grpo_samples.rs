//! The Train page's "Sampled completions" card for a GRPO run: the completions of the latest `Samples` event (or
//! of an earlier kept one, picked by step), each with its prompt, its (scrollable, wrapped) text, the row's answer,
//! the total reward and each reward, its advantage within its group, its token count and whether it was cut at
//! max new tokens.

use super::grpo_series::GrpoSeries;
use super::widgets::{card_ui, palette};
use crate::engine::train::grpo::GrpoSample;
use egui::{RichText, Ui};

/// Height of one completion's scroll area.
const COMPLETION_HEIGHT: f32 = 110.0;

/// The card, when the run has sampled completions to show.
pub fn samples_ui(ui: &mut Ui, series: &mut GrpoSeries) {
    if series.samples.is_empty() {
        return;
    }
    card_ui(ui, |ui| {
        ui.set_width(ui.available_width());
        ui.horizontal_wrapped(|ui| {
            ui.label(RichText::new("Sampled completions").strong().size(15.0));
            ui.add_space(10.0);
            let shown = series.shown_samples().map(|(s, _)| *s);
            let latest = series.samples.back().map(|(s, _)| *s);
            for step in series.samples.iter().map(|(s, _)| *s).collect::<Vec<_>>() {
                if ui.selectable_label(shown == Some(step), format!("step {step}")).clicked() {
                    // The latest stays "the latest" as new samples arrive; an older pick stays put.
                    series.shown_step = (Some(step) != latest).then_some(step);
                }
            }
        });
        let Some((step, samples)) = series.shown_samples() else { return };
        if samples.is_empty() {
            ui.label(RichText::new(format!("Step {step} reported no completions.")).weak());
        }
        for (i, sample) in samples.iter().enumerate() {
            egui::Frame::group(ui.style()).show(ui, |ui| {
                ui.set_width(ui.available_width());
                ui.push_id(("sample", step, i), |ui| sample_ui(ui, sample));
            });
        }
    });
}

fn sample_ui(ui: &mut Ui, s: &GrpoSample) {
    ui.horizontal_wrapped(|ui| {
        ui.label(RichText::new("prompt").weak());
        ui.label(&s.prompt);
    });
    egui::ScrollArea::vertical().max_height(COMPLETION_HEIGHT).auto_shrink([false, true]).show(ui, |ui| {
        ui.add(egui::Label::new(RichText::new(&s.completion).monospace()).wrap());
    });
    ui.horizontal_wrapped(|ui| {
        if let Some(answer) = &s.answer {
            ui.label(RichText::new(format!("answer {answer}")).weak());
            ui.separator();
        }
        let each: Vec<String> = s.rewards.iter().map(|(name, v)| format!("{name} {v:.3}")).collect();
        ui.label(RichText::new(format!("reward {:.3}", s.reward)).strong());
        if !each.is_empty() {
            ui.label(RichText::new(format!("({})", each.join(" · "))).weak());
        }
        ui.separator();
        let color = if s.advantage > 0.0 {
            palette::OK
        } else if s.advantage < 0.0 {
            palette::ERROR
        } else {
            palette::MASKED_FG
        };
        ui.label(RichText::new(format!("advantage {:+.3}", s.advantage)).color(color))
            .on_hover_text("Its reward against its group's: pushed up when positive, down when negative");
        ui.separator();
        ui.label(format!("{} tokens", s.tokens));
        if !s.finished {
            ui.label(RichText::new("hit the length cap").color(palette::WARN))
                .on_hover_text("Cut at max new tokens without an end-of-sequence token");
        }
    });
}
