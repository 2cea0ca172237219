//! Deleting a whole run from the checkpoints page: "Delete run…" asks the worker what would go (the engine's
//! `plan_run_delete`: the folder, its checkpoints, its size; or why the run cannot be deleted: it is training,
//! it is not a run, it is outside the runs folder), then a confirmation names exactly that before
//! [`Command::DeleteRun`] removes it on the worker.

use super::widgets::{fmt_bytes, palette};
use crate::engine::train::run_delete::RunDeletePlan;
use crate::worker::{Command, RunInfo};
use egui::{RichText, Ui};
use std::path::{Path, PathBuf};

/// The delete in progress: asked for, confirming, or being deleted.
#[derive(Default)]
pub struct RunDeleteDialog {
    /// The run whose plan was asked for.
    asked: Option<PathBuf>,
    /// The plan to confirm.
    pub plan: Option<RunDeletePlan>,
    /// The run being deleted.
    deleting: Option<PathBuf>,
}

impl RunDeleteDialog {
    /// Whether `run` is being planned or deleted (its button is off meanwhile).
    pub fn is_busy(&self, run: &Path) -> bool {
        [&self.asked, &self.deleting].into_iter().flatten().any(|p| crate::worker::paths_match(p, run))
    }

    /// The "Delete run…" button; returns the plan request to send.
    pub fn button_ui(&mut self, ui: &mut Ui, run: &RunInfo, runs_dir: &Path, training: bool) -> Option<Command> {
        let busy = self.is_busy(&run.dir);
        let button = ui
            .add_enabled(!busy && !training, egui::Button::new(RichText::new("Delete run…").color(palette::ERROR)))
            .on_hover_text("Delete this run folder with all its checkpoints (asks first)")
            .on_disabled_hover_text("This run is training, or its delete is under way");
        button.clicked().then(|| {
            self.asked = Some(run.dir.clone());
            Command::PlanRunDelete { runs_dir: runs_dir.to_path_buf(), run_dir: run.dir.clone() }
        })
    }

    /// The worker said what the delete would remove: confirm it.
    pub fn on_planned(&mut self, plan: RunDeletePlan) {
        self.asked = None;
        self.plan = Some(plan);
    }

    /// A plan or a delete failed (the page shows the reason): nothing is pending any more.
    pub fn on_failed(&mut self) {
        self.asked = None;
        self.deleting = None;
    }

    pub fn on_deleted(&mut self) {
        self.deleting = None;
    }

    /// The confirmation; returns the delete to send.
    pub fn modal_ui(&mut self, ui: &mut Ui, runs_dir: &Path) -> Option<Command> {
        let plan = self.plan.clone()?;
        let (mut close, mut command) = (false, None);
        egui::Modal::new(egui::Id::unique("confirm-run-delete")).show(ui.ctx(), |ui| {
            ui.set_width(460.0);
            ui.label(RichText::new(format!("Delete run \"{}\"?", plan.title)).strong().size(16.0));
            ui.add_space(4.0);
            ui.label(format!(
                "The folder {} will be removed from disk with its {} checkpoint{} ({} in all). This cannot be \
                 undone.",
                plan.run_dir.display(),
                plan.checkpoints,
                if plan.checkpoints == 1 { "" } else { "s" },
                fmt_bytes(plan.size_bytes)
            ));
            ui.add_space(8.0);
            ui.horizontal(|ui| {
                if ui.button(RichText::new("Delete run").color(palette::ERROR).strong()).clicked() {
                    self.deleting = Some(plan.run_dir.clone());
                    command =
                        Some(Command::DeleteRun { runs_dir: runs_dir.to_path_buf(), run_dir: plan.run_dir.clone() });
                    close = true;
                }
                if ui.button("Cancel").clicked() {
                    close = true;
                }
            });
        });
        if close {
            self.plan = None;
        }
        command
    }
}
