//! The trainer's one outlet for events: once the run folder is claimed, every event is first appended to its
//! `metrics.jsonl` (after checking that the folder is still ours) and only then passed to the caller. A write
//! that fails stops the run: training on without a record would end in a final save that fails too.

use super::run_folder::{self, event_step};
use super::run_lock::RunLock;
use super::TrainEvent;
use crate::engine::{Error, Result};

pub(crate) struct Recorder<'e> {
    emit: &'e mut dyn FnMut(TrainEvent),
    lock: Option<RunLock>,
    last_step: usize,
}

impl<'e> Recorder<'e> {
    pub(crate) fn new(emit: &'e mut dyn FnMut(TrainEvent)) -> Self {
        Self { emit, lock: None, last_step: 0 }
    }

    /// From now on events are recorded in this (claimed) run folder.
    pub(crate) fn attach(&mut self, lock: RunLock) {
        self.lock = Some(lock);
    }

    /// Fail unless the claimed run folder is still there and still ours (nothing to check before the claim).
    pub(crate) fn check_folder(&self) -> Result<()> {
        self.lock.as_ref().map_or(Ok(()), RunLock::check)
    }

    /// Record `event` in metrics.jsonl, then pass it on.
    pub(crate) fn send(&mut self, event: TrainEvent) -> Result<()> {
        if let Some(lock) = &self.lock {
            lock.check()?;
            run_folder::append_metric(lock.dir(), &event)?;
        }
        if let Some(step) = event_step(&event) {
            self.last_step = step;
        }
        (self.emit)(event);
        Ok(())
    }

    /// End the run with `error`: a `Failed` event, recorded too when the folder is still ours and writable.
    pub(crate) fn fail(&mut self, error: &Error) {
        let failed = TrainEvent::failed(self.last_step, error);
        if let Some(lock) = self.lock.as_ref().filter(|l| l.check().is_ok()) {
            // Best effort: when the failure is the disk itself, this write fails too and the caller still
            // gets the event and the error.
            let _ = run_folder::append_metric(lock.dir(), &failed);
        }
        (self.emit)(failed);
    }
}
