//! Closing the window while a run trains asks first: stop the run after its current step, save a checkpoint
//! and then close, or keep training. A close that comes from a signal (Ctrl-C, a logout) or from the
//! frame-time measurement does not ask: it goes through `StudioApp::on_exit`, which stops and saves too.

use super::StudioApp;
use crate::studio::training_panel::RunStatus;
use crate::studio::widgets::{fmt_secs, palette};
use egui::RichText;
use std::sync::atomic::{AtomicBool, Ordering};

/// Set once a close must not be questioned (a stop signal, the measurement's end).
static CLOSE_WITHOUT_ASKING: AtomicBool = AtomicBool::new(false);

/// Close the window without the question: the exit path still stops a run and saves it.
pub fn close_without_asking(ctx: &egui::Context) {
    CLOSE_WITHOUT_ASKING.store(true, Ordering::SeqCst);
    ctx.send_viewport_cmd(egui::ViewportCommand::Close);
}

/// Where a guarded close stands.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub enum CloseGuard {
    #[default]
    Idle,
    /// The question is on screen.
    Asking,
    /// The user chose to stop and close: the window closes once the run has saved and ended.
    ClosingAfterStop,
}

impl StudioApp {
    /// Catch a close request while a run trains, show the question, and close once a chosen stop has saved.
    pub(super) fn close_guard_ui(&mut self, ctx: &egui::Context) {
        let training = self.training_panel.is_active();
        let close_requested = ctx.input(|i| i.viewport().close_requested());
        if close_requested
            && training
            && self.close_guard == CloseGuard::Idle
            && !CLOSE_WITHOUT_ASKING.load(Ordering::SeqCst)
        {
            ctx.send_viewport_cmd(egui::ViewportCommand::CancelClose);
            self.close_guard = CloseGuard::Asking;
        }
        match self.close_guard {
            CloseGuard::Idle => {}
            CloseGuard::Asking if !training => self.close_guard = CloseGuard::Idle,
            CloseGuard::Asking | CloseGuard::ClosingAfterStop => self.close_question_ui(ctx, training),
        }
    }

    fn close_question_ui(&mut self, ctx: &egui::Context, training: bool) {
        let failed = match &self.training_panel.status {
            RunStatus::Failed(message) => Some(message.clone()),
            _ => None,
        };
        if self.close_guard == CloseGuard::ClosingAfterStop && !training && failed.is_none() {
            self.close_guard = CloseGuard::Idle;
            ctx.send_viewport_cmd(egui::ViewportCommand::Close);
            return;
        }
        let run = self.training_panel.run.as_ref();
        let (step, total, elapsed) = run.map(|r| (r.step, r.total_steps, r.elapsed_secs)).unwrap_or_default();
        let modal = egui::Modal::new(egui::Id::unique("close-while-training")).show(ctx, |ui| {
            ui.set_width(440.0);
            let mut keep_open = false;
            if let Some(message) = &failed {
                ui.label(RichText::new("The run failed while stopping").strong().color(palette::ERROR));
                ui.label(format!("{message}\n\nThe window stays open so you can see what happened."));
                keep_open = ui.button("OK").clicked();
            } else if self.close_guard == CloseGuard::ClosingAfterStop {
                ui.label(RichText::new("Stopping the run…").strong());
                ui.horizontal(|ui| {
                    ui.spinner();
                    ui.label("Saving a checkpoint after the current step; the window closes when it is written.");
                });
                keep_open = ui
                    .button("Keep the window open")
                    .on_hover_text("The run still stops and saves; only the window stays")
                    .clicked();
            } else {
                ui.label(RichText::new("A training run is still going").strong().color(palette::WARN));
                ui.label(format!(
                    "Step {step} of {total}, {} of training. Closing stops it after the current step and saves a \
                     checkpoint, so you can resume it later from the Training page.",
                    fmt_secs(elapsed)
                ));
                ui.add_space(6.0);
                ui.horizontal(|ui| {
                    if ui.button(RichText::new("Stop, save and close").strong()).clicked() {
                        self.training_panel.request_stop(&mut self.actions);
                        self.close_guard = CloseGuard::ClosingAfterStop;
                    }
                    keep_open = ui.button("Keep training").clicked();
                });
            }
            keep_open
        });
        if modal.inner || (modal.should_close() && self.close_guard == CloseGuard::Asking) {
            self.close_guard = CloseGuard::Idle;
        }
    }
}
