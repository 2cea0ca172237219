//! After a restart: the newest run that ended without finishing (the window was closed, the process was killed,
//! the machine went down), offered on the training page for resuming from its last checkpoint.

use super::app::Action;
use super::widgets::{fmt_secs, palette};
use crate::engine::train::run_folder::{RunInfo, RunStatus};
use crate::engine::train::TrainConfig;
use egui::{RichText, Ui};
use std::path::PathBuf;

/// An interrupted run and the checkpoint it can resume from.
#[derive(Debug, Clone, PartialEq)]
pub struct ResumeOffer {
    pub run_name: String,
    pub run_dir: PathBuf,
    /// The last step metrics.jsonl recorded, and the run's planned length.
    pub reached_step: usize,
    pub total_steps: Option<usize>,
    pub checkpoint: PathBuf,
    pub checkpoint_step: usize,
    pub config: Option<TrainConfig>,
}

/// The offer for `runs` (newest first, as the run list has them): only the newest run counts (an older
/// interrupted run was followed by newer work), and only when it has no end event, no process is training in
/// it, and it saved at least one checkpoint.
pub fn interrupted_run(runs: &[RunInfo]) -> Option<ResumeOffer> {
    let run = runs.first()?;
    if run.status != RunStatus::Incomplete || crate::engine::train::run_lock::is_claimed(&run.dir) {
        return None;
    }
    let last = run.checkpoints.iter().max_by_key(|c| c.step)?;
    let reached_step = run.train_loss.last().map(|p| p[0] as usize).unwrap_or(last.step).max(last.step);
    Some(ResumeOffer {
        run_name: run.name.clone(),
        run_dir: run.dir.clone(),
        reached_step,
        total_steps: run.total_steps,
        checkpoint: last.path.clone(),
        checkpoint_step: last.step,
        config: run.config.clone(),
    })
}

/// What the user chose in the offer card.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OfferChoice {
    Resume,
    Dismiss,
}

impl ResumeOffer {
    /// The card: what was interrupted, where, and how much a resume redoes. `elapsed_secs` is the training
    /// time recorded before the interruption.
    pub fn ui(&self, ui: &mut Ui, elapsed_secs: f64) -> Option<OfferChoice> {
        let mut choice = None;
        super::widgets::card_ui(ui, |ui| {
            ui.set_width(ui.available_width());
            let of_total = self.total_steps.map(|t| format!(" of {t}")).unwrap_or_default();
            ui.label(
                RichText::new(format!("The last run, {}, did not finish", self.run_name)).strong().color(palette::WARN),
            );
            ui.label(format!(
                "It reached step {}{of_total} after {} of training, then ended without a stop or finish (the studio \
                 was closed or the process was killed). Its last checkpoint is step {}{}.",
                self.reached_step,
                fmt_secs(elapsed_secs),
                self.checkpoint_step,
                match self.reached_step.saturating_sub(self.checkpoint_step) {
                    0 => String::new(),
                    lost => format!(": resuming repeats the {lost} step{} after it", if lost == 1 { "" } else { "s" }),
                }
            ));
            ui.label(RichText::new(format!("run folder {}", self.run_dir.display())).weak().small());
            ui.horizontal(|ui| {
                let resume = ui
                    .button(RichText::new(format!("Resume from step {}", self.checkpoint_step)).strong())
                    .on_hover_text(
                        "Load the run's model, dataset and settings and get ready to continue from its last \
                         checkpoint: the same data order, learning rate and optimizer state, as if never stopped",
                    );
                if resume.clicked() {
                    choice = Some(OfferChoice::Resume);
                }
                if ui.button("Dismiss").on_hover_text("Keep the run as it is; it stays in Checkpoints").clicked() {
                    choice = Some(OfferChoice::Dismiss);
                }
            });
        });
        choice
    }

    /// The app action that sets up the resume.
    pub fn resume_action(&self) -> Action {
        Action::ResumeFrom { checkpoint: self.checkpoint.clone(), config: self.config.clone().map(Box::new) }
    }
}
