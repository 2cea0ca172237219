//! The evaluation job ([`Command::Evaluate`](super::Command::Evaluate)): one at a time, on the loaded base model,
//! its progress streamed as [`Event::Eval`] (throttled to about ten a second) and ended by exactly one
//! `EvalFinished` or `EvalFailed`.

use super::dispatcher::{spawn_job, Dispatcher};
use super::{Event, Msg, Outbox};
use crate::engine::eval::{self, EvalEvent, EvalSpec};
use crate::engine::{ErrorInfo, ErrorKind};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Progress events closer together than this are dropped (the last of a target always goes out).
const PROGRESS_EVERY: Duration = Duration::from_millis(100);

impl Dispatcher {
    pub(super) fn start_evaluation(&mut self, spec: EvalSpec) {
        let refuse = |out: &Outbox, message: String| {
            out.send(Event::EvalFailed { error: ErrorInfo::new(ErrorKind::Setting, message), cancelled: false });
        };
        if self.evaluation.is_some() {
            return refuse(&self.out, "an evaluation is already running; wait for it or cancel it".into());
        }
        let Some((_, base)) = self.model.clone() else {
            return refuse(&self.out, "load a model before evaluating (the model page)".into());
        };
        let cancel = Arc::new(AtomicBool::new(false));
        self.evaluation = Some(cancel.clone());
        let (out, inbox, guard_inbox) = (self.out.clone(), self.inbox.clone(), self.inbox.clone());
        spawn_job(
            "mc-eval",
            self.out.clone(),
            move |error| {
                let _ = guard_inbox.send(Msg::EvaluationEnded);
                Event::EvalFailed { error, cancelled: false }
            },
            move || {
                let mut last_progress = Instant::now() - PROGRESS_EVERY;
                let mut emit = |event: EvalEvent| {
                    if let EvalEvent::Progress { done, total, .. } = &event {
                        if done < total && last_progress.elapsed() < PROGRESS_EVERY {
                            return;
                        }
                        last_progress = Instant::now();
                    }
                    out.send(Event::Eval(event));
                };
                let event = match eval::run_eval(&spec, &base, &cancel, &mut emit) {
                    Ok(report) => Event::EvalFinished(Box::new(report)),
                    Err(e) => {
                        Event::EvalFailed { cancelled: matches!(e, crate::engine::Error::Cancelled), error: e.into() }
                    }
                };
                let _ = inbox.send(Msg::EvaluationEnded);
                out.send(event);
            },
        );
    }

    pub(super) fn cancel_evaluation(&self) {
        if let Some(flag) = &self.evaluation {
            flag.store(true, Ordering::SeqCst);
        }
    }
}
