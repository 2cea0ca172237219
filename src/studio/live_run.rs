//! What the training page shows about one run: its series (raw and smoothed loss, validation loss, learning
//! rate, throughput, gradient norm; a preference or GRPO run's rewards), its method, counters and checkpoints, fed by live
//! events and by its recorded history.

use super::grpo_series::GrpoSeries;
use super::preference_series::PreferenceSeries;
use super::run_history::RunHistory;
use super::widgets::Ema;
use egui_plot::PlotPoint;
use std::path::PathBuf;

/// Everything plotted and shown about the live run.
#[derive(Debug, Clone, Default)]
pub struct LiveRun {
    pub run_dir: Option<PathBuf>,
    pub total_steps: usize,
    pub start_step: usize,
    pub trainable_params: usize,
    pub train_examples: usize,
    pub valid_examples: usize,
    pub step: usize,
    pub elapsed_secs: f64,
    pub eta_secs: Option<f64>,
    pub tokens_per_sec: Option<f64>,
    pub trained_tokens: usize,
    pub loss: Vec<PlotPoint>,
    pub smoothed: Vec<PlotPoint>,
    pub val_loss: Vec<PlotPoint>,
    pub lr: Vec<PlotPoint>,
    pub tokens_per_sec_series: Vec<PlotPoint>,
    pub grad_norm: Vec<PlotPoint>,
    /// A preference run's reward accuracies, margins and rewards (empty for SFT).
    pub preference: PreferenceSeries,
    /// A GRPO run's rewards, KL, lengths, clip ratios and sampled completions (empty for the other methods).
    pub grpo: GrpoSeries,
    /// The run's training method and its parameters ("dpo · beta 0.1 · sigmoid"), once known.
    pub method: Option<String>,
    pub checkpoints: Vec<(usize, PathBuf)>,
    /// The best checkpoint so far: (step, validation loss).
    pub best: Option<(usize, f64)>,
    /// Why the run stopped early (early stopping's patience ran out), once it ended so.
    pub early_stop: Option<String>,
    ema: Ema,
    smoothing: f64,
}

impl LiveRun {
    pub fn push_loss(&mut self, step: f64, loss: f64, smoothing: f64) {
        self.loss.push(PlotPoint::new(step, loss));
        if (smoothing - self.smoothing).abs() > 1e-9 {
            self.resmooth(smoothing);
        } else {
            let s = self.ema.push(loss, smoothing);
            self.smoothed.push(PlotPoint::new(step, s));
        }
    }

    /// A run shown from its recorded history alone (an interrupted run after a restart).
    pub fn from_history(run_dir: PathBuf, h: RunHistory) -> Self {
        let mut run = Self { run_dir: Some(run_dir), ..Self::pending() };
        run.merge_history(h);
        run
    }

    /// Put the recorded steps before the first live one in front of the live series (a resumed run), and take
    /// the counters from the history where no live step has arrived yet. Smoothing is redone on the next frame.
    pub fn merge_history(&mut self, h: RunHistory) {
        let first_live = self.loss.first().map(|p| p.x).unwrap_or(f64::INFINITY);
        let splice = |older: Vec<PlotPoint>, live: &mut Vec<PlotPoint>| {
            let mut merged: Vec<PlotPoint> = older.into_iter().filter(|p| p.x < first_live).collect();
            merged.append(live);
            *live = merged;
        };
        splice(h.loss, &mut self.loss);
        splice(h.val_loss, &mut self.val_loss);
        splice(h.lr, &mut self.lr);
        splice(h.tokens_per_sec, &mut self.tokens_per_sec_series);
        splice(h.grad_norm, &mut self.grad_norm);
        self.preference.splice_before(h.preference, first_live);
        self.grpo.splice_before(h.grpo, first_live);
        self.method = self.method.take().or(h.method);
        let mut checkpoints: Vec<_> = h.checkpoints.into_iter().filter(|(s, _)| (*s as f64) < first_live).collect();
        checkpoints.append(&mut self.checkpoints);
        self.checkpoints = checkpoints;
        // A best found live is newer than the recorded one.
        self.best = self.best.or(h.best);
        if self.step <= h.step {
            self.step = h.step;
            self.elapsed_secs = self.elapsed_secs.max(h.elapsed_secs);
            self.trained_tokens = self.trained_tokens.max(h.trained_tokens);
        }
        if self.total_steps == 0 {
            self.total_steps = h.total_steps;
        }
        if self.trainable_params == 0 {
            self.trainable_params = h.trainable_params;
        }
        self.smoothing = -1.0;
    }

    /// A run waiting for its first event; smoothing is set by the first loss point.
    pub fn pending() -> Self {
        Self { smoothing: -1.0, ..Default::default() }
    }

    /// Smooth again when the smoothing setting changed since the curve was smoothed.
    pub fn follow_smoothing(&mut self, smoothing: f64) {
        if (self.smoothing - smoothing).abs() > 1e-9 && !self.loss.is_empty() {
            self.resmooth(smoothing);
        }
    }

    fn resmooth(&mut self, smoothing: f64) {
        self.smoothing = smoothing;
        self.ema = Ema::default();
        self.smoothed = self.loss.iter().map(|p| PlotPoint::new(p.x, self.ema.push(p.y, smoothing))).collect();
    }
}
