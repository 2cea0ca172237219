//! How long a rank sweep will take, said before it starts and counted down while it runs, always from a
//! measurement of this model on this data with these settings: before any sweep, two training steps and one
//! validation batch timed on the worker (asked for automatically when the rank page shows ready settings);
//! after a probe, that probe's own times. The arithmetic is the engine's ([`ProbeTiming::sweep_secs`]).

use crate::engine::rank_probe::{ProbePlan, ProbeTiming, RankProbeResult};
use crate::engine::train::TrainConfig;
use std::time::Instant;

/// Where a timing came from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum TimingBasis {
    /// Two steps and one validation batch measured at this rank before the sweep.
    OneStep { rank: usize },
    /// The last probe that finished, at this rank.
    Probe { rank: usize },
}

impl TimingBasis {
    pub fn describe(self) -> String {
        match self {
            Self::OneStep { rank } => format!("two training steps measured at rank {rank}"),
            Self::Probe { rank } => format!("the rank {rank} probe's measured speed"),
        }
    }
}

/// A measured timing, for the settings it was measured with.
#[derive(Debug, Clone, PartialEq)]
pub struct MeasuredTiming {
    pub key: String,
    pub plan: ProbePlan,
    pub timing: ProbeTiming,
    pub basis: TimingBasis,
}

/// What the rank page knows about sweep times.
#[derive(Debug, Default)]
pub struct SweepClock {
    pub measured: Option<MeasuredTiming>,
    /// The settings key being measured now, and the rank it is measured at.
    pub calibrating: Option<(String, usize)>,
    /// The settings key whose measurement failed, and why (not asked again until the settings change).
    pub failed: Option<(String, String)>,
    /// When the running sweep, and its current probe, began.
    sweep_started: Option<Instant>,
    probe_started: Option<Instant>,
}

/// The settings that change a probe's time: everything but the rank, alpha, learning-rate schedule, seed and
/// where runs go. Two configs with the same key take the same time per step.
pub fn timing_key(config: &TrainConfig) -> String {
    let mut c = config.clone();
    c.lora.rank = 0;
    c.lora.alpha = 0.0;
    c.lora.use_rslora = false;
    c.lr = 0.0;
    c.warmup = None;
    c.schedule = Default::default();
    c.seed = 0;
    c.iters = None;
    c.epochs = None;
    c.val_every = 0;
    c.save_every = 0;
    c.out = Default::default();
    c.run_name = None;
    c.resume = None;
    c.force_base = false;
    c.model_source = None;
    c.data_source = None;
    serde_json::to_string(&c).unwrap_or_default()
}

impl SweepClock {
    /// The measurement for `key`, if there is one.
    pub fn for_key(&self, key: &str) -> Option<&MeasuredTiming> {
        self.measured.as_ref().filter(|m| m.key == key)
    }

    /// Whether to ask the worker to measure `key` now: nothing known, nothing asked, no failure for it.
    pub fn needs_calibration(&self, key: &str) -> bool {
        self.for_key(key).is_none()
            && self.calibrating.is_none()
            && self.failed.as_ref().is_none_or(|(failed, _)| failed != key)
    }

    pub fn on_calibrated(&mut self, plan: ProbePlan, timing: ProbeTiming) {
        if let Some((key, rank)) = self.calibrating.take() {
            self.measured = Some(MeasuredTiming { key, plan, timing, basis: TimingBasis::OneStep { rank } });
        }
    }

    /// A measurement that failed; a stopped one is simply asked again later.
    pub fn on_calibration_failed(&mut self, message: String, stopped: bool) {
        if let Some((key, _)) = self.calibrating.take() {
            if !stopped {
                self.failed = Some((key, message));
            }
        }
    }

    pub fn on_sweep_started(&mut self) {
        let now = Instant::now();
        self.sweep_started = Some(now);
        self.probe_started = Some(now);
    }

    /// A probe of the sweep run with settings `key` finished: its times now stand for the rest.
    pub fn on_probe(&mut self, key: &str, r: &RankProbeResult) {
        self.probe_started = Some(Instant::now());
        self.measured = Some(MeasuredTiming {
            key: key.to_string(),
            plan: r.plan,
            timing: r.timing,
            basis: TimingBasis::Probe { rank: r.rank },
        });
    }

    pub fn on_sweep_ended(&mut self) {
        self.sweep_started = None;
        self.probe_started = None;
    }

    /// Seconds since the running sweep began.
    pub fn elapsed_secs(&self) -> Option<f64> {
        self.sweep_started.map(|t| t.elapsed().as_secs_f64())
    }

    /// Seconds left of a running sweep of settings `key` with `probes_left` probes to finish (the current one
    /// included) on `token_budget` tokens each. None until something was measured for these settings.
    pub fn remaining_secs(&self, key: &str, token_budget: usize, probes_left: usize) -> Option<f64> {
        let m = self.for_key(key)?;
        let current_secs = self.probe_started.map_or(0.0, |t| t.elapsed().as_secs_f64());
        Some(remaining_secs(&m.timing, &m.plan, token_budget, probes_left, current_secs))
    }
}

/// Seconds left when `probes_left` probes remain and the current one has run `current_secs`: the current
/// probe's remaining share (never below zero: a probe running over its estimate is "finishing"), plus the rest.
pub fn remaining_secs(
    timing: &ProbeTiming,
    plan: &ProbePlan,
    token_budget: usize,
    probes_left: usize,
    current_secs: f64,
) -> f64 {
    if probes_left == 0 {
        return 0.0;
    }
    let per_probe = timing.probe_secs(plan, token_budget);
    (per_probe - current_secs).max(0.0) + (probes_left - 1) as f64 * per_probe
}

/// "about 17 min", "about 40 s", "about 1 h 05 min": an estimate, rounded as one.
pub fn fmt_about(secs: f64) -> String {
    if !secs.is_finite() || secs < 0.0 {
        return "unknown".into();
    }
    if secs < 60.0 {
        let s = ((secs / 5.0).ceil() * 5.0).max(5.0);
        format!("about {s:.0} s")
    } else if secs < 3600.0 {
        format!("about {:.0} min", (secs / 60.0).round().max(1.0))
    } else {
        let m = (secs / 60.0).round() as u64;
        format!("about {} h {:02} min", m / 60, m % 60)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timing() -> (ProbePlan, ProbeTiming) {
        (
            ProbePlan { tokens_per_step: 600.0, val_batches: 5 },
            ProbeTiming { setup_secs: 0.2, first_step_secs: 9.0, step_secs: 6.0, val_batch_secs: 2.0 },
        )
    }

    #[test]
    fn the_countdown_takes_off_what_the_current_probe_has_run() {
        let (plan, t) = timing();
        // 20 000 tokens: 34 steps (9 s, then 33 x 6 s) + 5 x 2 s + 0.2 s = 217.2 s a probe.
        let per = t.probe_secs(&plan, 20_000);
        assert!((per - 217.2).abs() < 1e-9);
        assert!((remaining_secs(&t, &plan, 20_000, 5, 0.0) - 5.0 * per).abs() < 1e-9);
        assert!((remaining_secs(&t, &plan, 20_000, 3, 100.0) - (per - 100.0 + 2.0 * per)).abs() < 1e-9);
        // A probe over its estimate counts as done, not as negative time.
        assert!((remaining_secs(&t, &plan, 20_000, 2, 1e6) - per).abs() < 1e-9);
        assert_eq!(remaining_secs(&t, &plan, 20_000, 0, 5.0), 0.0);
    }

    #[test]
    fn a_measurement_belongs_to_the_settings_it_was_made_with() {
        let config = TrainConfig::default();
        let key = timing_key(&config);
        let mut clock = SweepClock::default();
        assert!(clock.needs_calibration(&key));
        clock.calibrating = Some((key.clone(), 8));
        assert!(!clock.needs_calibration(&key), "one measurement at a time");
        let (plan, t) = timing();
        clock.on_calibrated(plan, t);
        assert_eq!(clock.for_key(&key).unwrap().basis, TimingBasis::OneStep { rank: 8 });
        // Rank, alpha, learning rate and seed leave the time per step alone; the batch size does not.
        let other_rank = TrainConfig {
            lora: crate::engine::train::LoraSettings { rank: 64, alpha: 3.0, ..Default::default() },
            lr: 1.0,
            seed: 7,
            ..config.clone()
        };
        assert_eq!(timing_key(&other_rank), key);
        let bigger_batch = TrainConfig { batch_size: config.batch_size * 2, ..config.clone() };
        assert!(clock.for_key(&timing_key(&bigger_batch)).is_none());
        assert!(clock.needs_calibration(&timing_key(&bigger_batch)));
        // A failure is not retried for the same settings; a stop is.
        clock.calibrating = Some((timing_key(&bigger_batch), 8));
        clock.on_calibration_failed("no rows".into(), false);
        assert!(!clock.needs_calibration(&timing_key(&bigger_batch)));
        clock.calibrating = Some((key.clone(), 8));
        clock.on_calibration_failed("stopped".into(), true);
        assert!(clock.failed.as_ref().is_some_and(|(k, _)| *k != key));
    }

    #[test]
    fn estimates_read_as_estimates() {
        assert_eq!(fmt_about(17.0 * 60.0 + 10.0), "about 17 min");
        assert_eq!(fmt_about(38.0), "about 40 s");
        assert_eq!(fmt_about(0.3), "about 5 s");
        assert_eq!(fmt_about(3900.0), "about 1 h 05 min");
        assert_eq!(fmt_about(f64::NAN), "unknown");
    }
}
