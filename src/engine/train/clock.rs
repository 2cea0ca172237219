//! Time keeping of a training run: the pause loop (its seconds are not training time) and the clock behind each
//! step's elapsed time, throughput and ETA.

use super::events::{TrainControl, TrainEvent};
use super::recorder::Recorder;
use crate::engine::Result;
use std::time::Instant;

/// Emit Paused, sleep until resumed or stopped, emit Resumed; the seconds it waited.
pub(super) fn wait_while_paused(control: &TrainControl, step: usize, rec: &mut Recorder) -> Result<f64> {
    rec.send(TrainEvent::Paused { step })?;
    let paused_at = Instant::now();
    while control.is_paused() && !control.stop_requested() {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    rec.send(TrainEvent::Resumed { step })?;
    Ok(paused_at.elapsed().as_secs_f64())
}

/// Time keeping of a run: total training time (including before a resume, excluding pauses), throughput over
/// the window since the last pause, and the time left at the rate of the steps trained so far.
pub(super) struct StepClock {
    run_started: Instant,
    start_step: usize,
    elapsed_before_secs: f64,
    /// Seconds this process spent paused: not training time.
    pub(super) paused_secs: f64,
    window_started: Instant,
    window_tokens: usize,
}

impl StepClock {
    pub(super) fn new(start_step: usize, elapsed_before_secs: f64) -> Self {
        let now = Instant::now();
        Self {
            run_started: now,
            start_step,
            elapsed_before_secs,
            paused_secs: 0.0,
            window_started: now,
            window_tokens: 0,
        }
    }

    /// A pause of `secs` ended: it counts neither in the elapsed time nor in the rate; throughput starts a new
    /// window.
    pub(super) fn exclude_pause(&mut self, secs: f64) {
        self.paused_secs += secs;
        self.window_started = Instant::now();
        self.window_tokens = 0;
    }

    /// Seconds trained in this process (pauses excluded).
    fn trained_here_secs(&self) -> f64 {
        (self.run_started.elapsed().as_secs_f64() - self.paused_secs).max(0.0)
    }

    pub(super) fn elapsed_secs(&self) -> f64 {
        self.elapsed_before_secs + self.trained_here_secs()
    }

    /// Count a finished step of `tokens` (padded): (tokens/s over the window, elapsed secs, eta secs).
    pub(super) fn record(&mut self, tokens: usize, step: usize, total_steps: usize) -> (f64, f64, f64) {
        self.window_tokens += tokens;
        let window_secs = self.window_started.elapsed().as_secs_f64().max(1e-9);
        let per_step = self.trained_here_secs() / (step - self.start_step).max(1) as f64;
        (self.window_tokens as f64 / window_secs, self.elapsed_secs(), per_step * (total_steps - step) as f64)
    }
}
