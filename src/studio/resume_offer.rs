//! After a restart: the newest run that ended without finishing (the window was closed, the process was killed,
//! the machine went down), offered on the training page for resuming from its last checkpoint.

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
    /// The newest checkpoint and its step; None when the run ended before its first save.
    pub checkpoint: Option<(PathBuf, usize)>,
    pub config: Option<TrainConfig>,
}

/// The offer for `runs` (newest first, as the run list has them): only the newest run counts (an older
/// interrupted run was followed by newer work), and only when it trained at least one step, has no end event
/// and no process is training in it. One that died before its first checkpoint is shown too: the user learns
/// what happened, though there is nothing to resume.
pub fn interrupted_run(runs: &[RunInfo]) -> Option<ResumeOffer> {
    let run = runs.first()?;
    if run.status != RunStatus::Incomplete || crate::engine::train::run_lock::is_claimed(&run.dir) {
        return None;
    }
    let last = run.checkpoints.iter().max_by_key(|c| c.step);
    let recorded = run.train_loss.last().map(|p| p[0] as usize);
    let reached_step = recorded.unwrap_or(0).max(last.map_or(0, |c| c.step));
    if reached_step == 0 {
        return None;
    }
    Some(ResumeOffer {
        run_name: run.title().to_string(),
        run_dir: run.dir.clone(),
        reached_step,
        total_steps: run.total_steps,
        checkpoint: last.map(|c| (c.path.clone(), c.step)),
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
            let how = "then ended without a stop or finish (the studio was closed or the process was killed)";
            let at = format!(
                "It reached step {}{of_total} after {} of training, {how}.",
                self.reached_step,
                fmt_secs(elapsed_secs)
            );
            ui.label(match &self.checkpoint {
                Some((_, step)) => match self.reached_step.saturating_sub(*step) {
                    0 => format!("{at} Its last checkpoint is step {step}."),
                    lost => format!(
                        "{at} Its last checkpoint is step {step}: resuming repeats the {lost} step{} after it.",
                        if lost == 1 { "" } else { "s" }
                    ),
                },
                None => format!(
                    "{at} It had saved no checkpoint yet, so there is nothing to resume: start it again (a smaller \
                     \"save every\" in the LoRA settings keeps more of a run that may be cut short)."
                ),
            });
            ui.label(RichText::new(format!("run folder {}", self.run_dir.display())).weak().small());
            ui.horizontal(|ui| {
                let Some((_, step)) = &self.checkpoint else {
                    if ui.button("Dismiss").on_hover_text("The run stays in Checkpoints with its plots").clicked() {
                        choice = Some(OfferChoice::Dismiss);
                    }
                    return;
                };
                let resume = ui.button(RichText::new(format!("Resume from step {step}")).strong()).on_hover_text(
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

    /// The checkpoint to resume from and the run's settings; None without a checkpoint.
    pub fn resume_from(&self) -> Option<(PathBuf, Option<Box<TrainConfig>>)> {
        let (checkpoint, _) = self.checkpoint.clone()?;
        Some((checkpoint, self.config.clone().map(Box::new)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::checkpoint::CheckpointInfo;

    fn run(status: RunStatus, steps: usize, checkpoints: &[usize]) -> RunInfo {
        RunInfo {
            name: "r".into(),
            label: None,
            notes: None,
            dir: PathBuf::from("/nonexistent/runs/r"),
            config: None,
            started_unix_secs: Some(1),
            train_loss: (1..=steps).map(|s| [s as f64, 2.0]).collect(),
            val_loss: vec![],
            total_steps: Some(100),
            trainable_params: Some(10),
            status,
            checkpoints: checkpoints
                .iter()
                .map(|&step| CheckpointInfo {
                    step,
                    path: PathBuf::from(format!("/nonexistent/runs/r/checkpoint-{step}")),
                    size_bytes: 1,
                    train_loss: None,
                    val_loss: None,
                    saved_unix_secs: 1,
                })
                .collect(),
        }
    }

    #[test]
    fn only_the_newest_unfinished_run_with_steps_is_offered() {
        let offer = interrupted_run(&[run(RunStatus::Incomplete, 37, &[20, 30])]).unwrap();
        assert_eq!((offer.reached_step, offer.checkpoint.unwrap().1), (37, 30));
        let no_save = interrupted_run(&[run(RunStatus::Incomplete, 12, &[])]).unwrap();
        assert!(no_save.checkpoint.is_none() && no_save.resume_from().is_none());
        assert!(interrupted_run(&[run(RunStatus::Incomplete, 0, &[])]).is_none(), "died before its first step");
        assert!(interrupted_run(&[run(RunStatus::Stopped, 37, &[37])]).is_none());
        let older = [run(RunStatus::Finished, 100, &[100]), run(RunStatus::Incomplete, 37, &[30])];
        assert!(interrupted_run(&older).is_none(), "newer work followed the interrupted run");
    }
}
