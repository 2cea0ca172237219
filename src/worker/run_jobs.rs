//! The run-management jobs of the checkpoints page beyond rename: storing a run's note, and deleting a run
//! (first what it would remove, for the confirmation, then the deletion). Each runs on its own thread and ends
//! with one event: its result, or `ActionFailed` with the engine's refusal.

use super::dispatcher::Dispatcher;
use super::Event;
use std::path::PathBuf;

impl Dispatcher {
    pub(super) fn set_run_notes(&self, run_dir: PathBuf, notes: String) {
        let what = format!("save the note of {}", run_dir.display());
        self.spawn_fallible(
            "mc-run-notes",
            move |error| Event::ActionFailed { what: what.clone(), error },
            move |_| {
                let notes = crate::engine::train::run_label::set_run_notes(&run_dir, &notes)?;
                Ok(Event::RunNotesSaved { run_dir, notes })
            },
        );
    }

    pub(super) fn plan_run_delete(&self, runs_dir: PathBuf, run_dir: PathBuf) {
        let what = format!("delete {}", run_dir.display());
        self.spawn_fallible(
            "mc-run-delete-plan",
            move |error| Event::ActionFailed { what: what.clone(), error },
            move |_| {
                Ok(Event::RunDeletePlanned(crate::engine::train::run_delete::plan_run_delete(&runs_dir, &run_dir)?))
            },
        );
    }

    pub(super) fn delete_run(&self, runs_dir: PathBuf, run_dir: PathBuf) {
        let what = format!("delete {}", run_dir.display());
        self.spawn_fallible(
            "mc-run-delete",
            move |error| Event::ActionFailed { what: what.clone(), error },
            move |_| Ok(Event::RunDeleted(crate::engine::train::run_delete::delete_run(&runs_dir, &run_dir)?)),
        );
    }
}
