//! A run's recorded history, read from its `metrics.jsonl` off the UI thread: what the training page plots
//! for the steps before a resume (so a resumed run's curves start at step 1, not at the resume step) and for
//! an interrupted run found after a restart.

use super::preference_series::PreferenceSeries;
use crate::engine::train::run_folder::read_metrics;
use crate::engine::train::TrainEvent;
use crossbeam_channel::{bounded, Receiver, TryRecvError};
use egui_plot::PlotPoint;
use std::path::{Path, PathBuf};

/// The series and counters of a run's recorded steps, in step order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunHistory {
    pub loss: Vec<PlotPoint>,
    pub val_loss: Vec<PlotPoint>,
    pub lr: Vec<PlotPoint>,
    pub tokens_per_sec: Vec<PlotPoint>,
    pub grad_norm: Vec<PlotPoint>,
    /// A preference run's rewards (empty for SFT).
    pub preference: PreferenceSeries,
    /// The run's method with its parameters, from its (last) start.
    pub method: Option<String>,
    pub checkpoints: Vec<(usize, PathBuf)>,
    /// The last recorded new best: (step, validation loss).
    pub best: Option<(usize, f64)>,
    /// The last recorded step, its training time and trained tokens.
    pub step: usize,
    pub elapsed_secs: f64,
    pub trained_tokens: usize,
    pub total_steps: usize,
    pub trainable_params: usize,
}

impl RunHistory {
    /// The history of `events` up to and including step `up_to` (everything when None). Events after a later
    /// start (a resume) replace what the earlier segment recorded past the resume step, as the trainer's own
    /// truncation on resume does.
    pub fn from_events(events: impl IntoIterator<Item = TrainEvent>, up_to: Option<usize>) -> Self {
        let mut h = Self::default();
        let keep = |step: usize| up_to.is_none_or(|limit| step <= limit);
        for event in events {
            match event {
                TrainEvent::Started { total_steps, trainable_params, start_step, config, .. } => {
                    h.forget_after(start_step);
                    h.method = Some(crate::engine::train::run_table::method_text(&config));
                    h.total_steps = total_steps;
                    h.trainable_params = trainable_params;
                }
                TrainEvent::Step {
                    step,
                    loss,
                    lr,
                    grad_norm,
                    tokens_per_sec,
                    trained_tokens,
                    elapsed_secs,
                    total_steps,
                    preference,
                    ..
                } if keep(step) => {
                    let x = step as f64;
                    if let Some(m) = &preference {
                        h.preference.push_step(step, m);
                    }
                    h.loss.push(PlotPoint::new(x, loss));
                    h.lr.push(PlotPoint::new(x, lr));
                    h.tokens_per_sec.push(PlotPoint::new(x, tokens_per_sec));
                    h.grad_norm.push(PlotPoint::new(x, grad_norm));
                    h.step = step;
                    h.elapsed_secs = elapsed_secs;
                    h.trained_tokens = trained_tokens;
                    h.total_steps = total_steps;
                }
                TrainEvent::Eval { step, val_loss, best, preference, .. } if keep(step) => {
                    if let Some(m) = &preference {
                        h.preference.push_eval(step, m);
                    }
                    h.val_loss.push(PlotPoint::new(step as f64, val_loss));
                    if best {
                        h.best = Some((step, val_loss));
                    }
                }
                TrainEvent::CheckpointsRemoved { step, paths } if keep(step) => {
                    h.checkpoints.retain(|(_, p)| !paths.contains(p));
                }
                TrainEvent::CheckpointSaved { step, path } if keep(step) => {
                    h.checkpoints.retain(|(s, _)| *s != step);
                    h.checkpoints.push((step, path));
                }
                _ => {}
            }
        }
        h
    }

    /// Drop what was recorded after `step`.
    fn forget_after(&mut self, step: usize) {
        let before = |p: &PlotPoint| p.x <= step as f64;
        self.loss.retain(before);
        self.val_loss.retain(before);
        self.lr.retain(before);
        self.tokens_per_sec.retain(before);
        self.grad_norm.retain(before);
        self.preference.forget_after(step);
        self.checkpoints.retain(|(s, _)| *s <= step);
        self.best = self.best.filter(|(s, _)| *s <= step);
    }
}

/// A history being read on its own thread; [`PendingHistory::poll`] hands it over once, when ready.
pub struct PendingHistory {
    pub run_dir: PathBuf,
    rx: Receiver<RunHistory>,
}

impl PendingHistory {
    /// Read `run_dir`'s metrics up to step `up_to` on a new thread (the page polls for it while it waits).
    pub fn spawn(run_dir: &Path, up_to: Option<usize>) -> Self {
        let (tx, rx) = bounded(1);
        let dir = run_dir.to_path_buf();
        std::thread::Builder::new()
            .name("run-history".into())
            .spawn(move || {
                let _ = tx.send(RunHistory::from_events(read_metrics(&dir), up_to));
            })
            .expect("spawning a thread");
        Self { run_dir: run_dir.to_path_buf(), rx }
    }

    /// The history once read; Some(empty) when the reading thread died.
    pub fn poll(&self) -> Option<RunHistory> {
        match self.rx.try_recv() {
            Ok(h) => Some(h),
            Err(TryRecvError::Empty) => None,
            Err(TryRecvError::Disconnected) => Some(RunHistory::default()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(step: usize, loss: f64) -> TrainEvent {
        TrainEvent::Step {
            step,
            total_steps: 10,
            loss,
            lr: 1e-4,
            grad_norm: 1.0,
            tokens_per_sec: 50.0,
            trained_tokens: step * 8,
            elapsed_secs: step as f64 * 2.0,
            eta_secs: 1.0,
            preference: None,
            grpo: None,
        }
    }

    fn started(start_step: usize) -> TrainEvent {
        TrainEvent::Started {
            run_dir: "r".into(),
            config: Box::default(),
            trainable_params: 99,
            total_steps: 10,
            tokens_per_epoch: 1,
            target_tokens_per_epoch: 1,
            train_examples: 1,
            valid_examples: 0,
            truncated_examples: 0,
            start_step,
            notes: vec![],
        }
    }

    #[test]
    fn a_resumed_segment_replaces_what_followed_its_resume_step() {
        let events = vec![
            started(0),
            step(1, 3.0),
            step(2, 2.5),
            TrainEvent::CheckpointSaved { step: 2, path: "c2".into() },
            step(3, 2.2),
            started(2),
            step(3, 2.1),
            step(4, 2.0),
        ];
        let h = RunHistory::from_events(events.clone(), None);
        let xs: Vec<(f64, f64)> = h.loss.iter().map(|p| (p.x, p.y)).collect();
        assert_eq!(xs, vec![(1.0, 3.0), (2.0, 2.5), (3.0, 2.1), (4.0, 2.0)]);
        assert_eq!((h.step, h.elapsed_secs, h.trained_tokens, h.trainable_params), (4, 8.0, 32, 99));
        assert_eq!(h.checkpoints, vec![(2, PathBuf::from("c2"))]);
        let before_resume = RunHistory::from_events(events, Some(2));
        assert_eq!(before_resume.loss.len(), 2);
        assert_eq!(before_resume.step, 2);
    }

    #[test]
    fn a_preference_run_replays_its_rewards_and_method() {
        use crate::engine::train::preference::PreferenceMetrics;
        let m = |acc: f64| PreferenceMetrics { rewards_accuracies: acc, pairs: 2, ..Default::default() };
        let with = |mut event: TrainEvent, metrics: PreferenceMetrics| {
            if let TrainEvent::Step { preference, .. } = &mut event {
                *preference = Some(metrics);
            }
            event
        };
        let mut start = started(0);
        if let TrainEvent::Started { config, .. } = &mut start {
            config.method = crate::engine::train::Method::Orpo;
        }
        let events = vec![
            start,
            with(step(1, 1.0), m(0.5)),
            with(step(2, 0.9), m(1.0)),
            TrainEvent::Eval { step: 2, val_loss: 0.8, perplexity: 2.0, best: true, preference: Some(m(0.75)) },
        ];
        let h = RunHistory::from_events(events, None);
        assert_eq!(h.method.as_deref(), Some("orpo · beta 0.1"));
        let acc: Vec<f64> = h.preference.accuracies.iter().map(|p| p.y).collect();
        assert_eq!(acc, [0.5, 1.0]);
        assert_eq!(h.preference.last_val.map(|v| v.rewards_accuracies), Some(0.75));
    }
}
