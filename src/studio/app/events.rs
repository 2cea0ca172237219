//! Routing the worker's events to the state and panels they change: the model's status, the pages, the Hub's
//! download state, toasts.

use super::{remember, Action, StudioApp};
use crate::studio::widgets::{self, Tone};
use crate::worker::Event;
use std::time::Instant;

impl StudioApp {
    pub(super) fn handle_event(&mut self, event: Event) {
        match event {
            Event::ModelLoading { path } => {
                self.model.loading = Some((path, Instant::now()));
                self.model.load_progress = None;
                self.model.error = None;
            }
            Event::ModelLoadProgress { path, progress } => {
                if self.model.loading.as_ref().is_some_and(|(p, _)| crate::worker::paths_match(p, &path)) {
                    self.model.load_progress = Some(progress);
                }
            }
            Event::ModelLoaded(summary) => {
                self.model.loading = None;
                self.model.error = None;
                remember(&mut self.prefs.recent_models, &summary.path);
                self.prefs.model_path = summary.path.display().to_string();
                self.toast(Tone::Ok, format!("Loaded {} in {}", summary.name(), widgets::fmt_secs(summary.load_secs)));
                self.model.loaded = Some(*summary);
            }
            Event::ModelLoadFailed { path, error } => {
                self.model.loading = None;
                self.model.error = Some((path, error.message));
            }
            e @ (Event::DatasetInspected(_)
            | Event::DatasetFailed { .. }
            | Event::DatasetRows { .. }
            | Event::DatasetRowsFailed { .. }) => self.dataset_panel.on_event(e),
            Event::ModelsFound(found) => self.model_panel.on_models_found(found),
            Event::Train(e) => {
                if let Some(a) = self.training_panel.on_event(e, self.prefs.smoothing as f64) {
                    self.actions.push(a);
                }
            }
            e @ (Event::GenerationStarted { .. }
            | Event::Token { .. }
            | Event::GenerationFinished { .. }
            | Event::GenerationFailed { .. }
            | Event::AdapterChecked { .. }
            | Event::AdapterCheckFailed { .. }) => self.chat_panel.on_event(e, &mut self.prefs.chat),
            Event::Diagnosis { text } => self.help.on_report(text),
            Event::Eval(e) => self.eval_page.on_eval(e),
            Event::EvalFinished(report) => self.eval_page.on_finished(*report),
            Event::EvalFailed { error, cancelled } => self.eval_page.on_failed(error.message, cancelled),
            Event::Runs { runs_dir, runs } => {
                self.training_panel.on_runs(&runs);
                self.eval_page.on_runs(&runs);
                self.checkpoints_panel.on_runs(runs_dir, runs);
                if self.checkpoints_panel.take_refresh_again() {
                    self.actions.push(Action::RefreshRuns);
                }
            }
            Event::RunsFailed { error, .. } => self.checkpoints_panel.on_runs_failed(error.message),
            Event::RunRenamed { run_dir, label } => self.checkpoints_panel.on_renamed(&run_dir, label),
            e @ (Event::RunNotesSaved { .. } | Event::RunDeletePlanned(_) | Event::RunDeleted(_)) => {
                if self.checkpoints_panel.on_run_event(e) {
                    self.actions.push(Action::RefreshRuns);
                }
            }
            Event::CheckpointDeleted { path } => {
                self.checkpoints_panel.on_deleted(&path);
                self.actions.push(Action::RefreshRuns);
            }
            Event::ExportProgress { done, total, what } => self.checkpoints_panel.on_export_progress(done, total, what),
            Event::ExportWarnings { warnings } => self.checkpoints_panel.on_export_warnings(warnings),
            Event::ExportFinished { path, size_bytes } => {
                self.toast(
                    Tone::Ok,
                    format!("Exported to {} ({})", path.display(), super::widgets::fmt_bytes(size_bytes)),
                );
                self.checkpoints_panel.on_export_finished(path, size_bytes);
            }
            Event::ActionFailed { what, error } => {
                self.toast(Tone::Error, format!("Could not {what} ({})", error.kind.label()));
                self.checkpoints_panel.on_action_failed(what, error.message);
            }
            e @ (Event::RankProbeResult(_)
            | Event::RankProbeFinished { .. }
            | Event::RankProbeFailed { .. }
            | Event::RankProbeCalibrated { .. }
            | Event::RankCalibrationFailed { .. }
            | Event::MicroBenchFinished(_)
            | Event::MicroBenchFailed { .. }) => self.rank_panel.on_event(e),
            e @ (Event::HubSearchResults { .. }
            | Event::HubSearchFailed { .. }
            | Event::HubDownloadProgress { .. }
            | Event::HubDownloadFinished { .. }
            | Event::HubDownloadFailed { .. }) => self.on_hub_event(e),
            e @ (Event::XrayReady(_) | Event::XrayFailed { .. }) => self.checkpoints_panel.xray.on_event(e),
        }
    }
}
