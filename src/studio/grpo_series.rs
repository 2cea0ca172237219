//! A GRPO run's series under TRL's names: the reward mean with its standard deviation, each reward's mean, KL (with
//! beta > 0), completion lengths, clip ratios and the validation prompts' reward; the latest step's metrics with
//! the generation and training seconds; and the last few sampled-completion events with the one being shown. Fed
//! by the live Step/Eval/Samples events and by a run's recorded metrics.jsonl alike; plain data.

use crate::engine::train::grpo::{GrpoMetrics, GrpoSample};
use egui_plot::PlotPoint;
use std::collections::{BTreeMap, VecDeque};

/// Sample events kept for the step selector.
pub const KEPT_SAMPLE_STEPS: usize = 5;

/// The GRPO metrics of one run over its steps.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GrpoSeries {
    /// `reward` (TRL's name; our `reward_mean`) of each step, and mean ± `reward_std`.
    pub reward: Vec<PlotPoint>,
    pub reward_low: Vec<PlotPoint>,
    pub reward_high: Vec<PlotPoint>,
    /// `rewards/<name>/mean` of each reward, by name.
    pub each_reward: BTreeMap<String, Vec<PlotPoint>>,
    /// `kl` of each step that had one (beta > 0).
    pub kl: Vec<PlotPoint>,
    /// `completions/mean_length`.
    pub mean_length: Vec<PlotPoint>,
    /// `completions/clipped_ratio`: completions cut at max new tokens.
    pub clipped_ratio: Vec<PlotPoint>,
    /// `clip_ratio/region_mean`: tokens whose probability ratio was clipped.
    pub clip_region: Vec<PlotPoint>,
    /// `eval_reward`: the validation prompts' greedy completions at each evaluation.
    pub val_reward: Vec<PlotPoint>,
    /// The latest step's metrics.
    pub last: Option<GrpoMetrics>,
    /// Seconds the latest batch took to sample (reported on its first step only, so the last non-zero one).
    pub generation_secs: Option<f64>,
    /// The last few `Samples` events, oldest first: (step, samples).
    pub samples: VecDeque<(usize, Vec<GrpoSample>)>,
    /// The step whose samples are shown (None: the latest).
    pub shown_step: Option<usize>,
}

impl GrpoSeries {
    /// Whether any step, evaluation or sample carried GRPO metrics (the other methods have none).
    pub fn is_empty(&self) -> bool {
        self.reward.is_empty() && self.val_reward.is_empty() && self.samples.is_empty()
    }

    /// A training step's metrics.
    pub fn push_step(&mut self, step: usize, m: &GrpoMetrics) {
        let x = step as f64;
        self.reward.push(PlotPoint::new(x, m.reward_mean));
        self.reward_low.push(PlotPoint::new(x, m.reward_mean - m.reward_std));
        self.reward_high.push(PlotPoint::new(x, m.reward_mean + m.reward_std));
        for (name, mean) in m.reward_means() {
            self.each_reward.entry(name).or_default().push(PlotPoint::new(x, mean));
        }
        if let Some(kl) = m.kl {
            self.kl.push(PlotPoint::new(x, kl));
        }
        self.mean_length.push(PlotPoint::new(x, m.mean_length));
        self.clipped_ratio.push(PlotPoint::new(x, m.clipped_ratio));
        self.clip_region.push(PlotPoint::new(x, m.clip_region));
        if m.generation_secs > 0.0 {
            self.generation_secs = Some(m.generation_secs);
        }
        self.last = Some(m.clone());
    }

    /// An evaluation's rewards on the validation prompts.
    pub fn push_eval(&mut self, step: usize, m: &GrpoMetrics) {
        self.val_reward.push(PlotPoint::new(step as f64, m.reward_mean));
    }

    /// A `Samples` event; only the last [`KEPT_SAMPLE_STEPS`] are kept (a replay may repeat a step: it replaces).
    pub fn push_samples(&mut self, step: usize, samples: Vec<GrpoSample>) {
        self.samples.retain(|(s, _)| *s < step);
        self.samples.push_back((step, samples));
        while self.samples.len() > KEPT_SAMPLE_STEPS {
            self.samples.pop_front();
        }
    }

    /// The samples shown: the chosen step's while it is kept, else the latest.
    pub fn shown_samples(&self) -> Option<&(usize, Vec<GrpoSample>)> {
        self.shown_step.and_then(|step| self.samples.iter().find(|(s, _)| *s == step)).or(self.samples.back())
    }

    /// Drop what was recorded after `step` (a resume replays from there).
    pub fn forget_after(&mut self, step: usize) {
        let before = |p: &PlotPoint| p.x <= step as f64;
        for s in self.all_mut() {
            s.retain(before);
        }
        self.each_reward.retain(|_, s| {
            s.retain(before);
            !s.is_empty()
        });
        self.samples.retain(|(s, _)| *s <= step);
    }

    /// Put `older`'s points before `first_live_step` in front of these (a resumed run's recorded part); the
    /// latest values stay the live ones when there are any.
    pub fn splice_before(&mut self, mut older: GrpoSeries, first_live_step: f64) {
        let keep = |p: &PlotPoint| p.x < first_live_step;
        for (old, live) in older.all_mut().into_iter().zip(self.all_mut()) {
            let mut merged: Vec<PlotPoint> = old.drain(..).filter(keep).collect();
            merged.append(live);
            *live = merged;
        }
        for (name, old) in older.each_reward {
            let live = self.each_reward.entry(name).or_default();
            let mut merged: Vec<PlotPoint> = old.into_iter().filter(keep).collect();
            merged.append(live);
            *live = merged;
        }
        let mut samples: VecDeque<_> =
            older.samples.into_iter().filter(|(s, _)| (*s as f64) < first_live_step).collect();
        samples.append(&mut self.samples);
        while samples.len() > KEPT_SAMPLE_STEPS {
            samples.pop_front();
        }
        self.samples = samples;
        self.last = self.last.take().or(older.last);
        self.generation_secs = self.generation_secs.or(older.generation_secs);
    }

    fn all_mut(&mut self) -> [&mut Vec<PlotPoint>; 8] {
        [
            &mut self.reward,
            &mut self.reward_low,
            &mut self.reward_high,
            &mut self.kl,
            &mut self.mean_length,
            &mut self.clipped_ratio,
            &mut self.clip_region,
            &mut self.val_reward,
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metrics(reward: f64, generation_secs: f64) -> GrpoMetrics {
        let mut m = GrpoMetrics { reward_mean: reward, reward_std: 0.25, generation_secs, ..Default::default() };
        m.rewards.insert("rewards/exact_answer/mean".into(), reward);
        m.rewards.insert("rewards/exact_answer/std".into(), 0.5);
        m
    }

    fn sample(reward: f64) -> GrpoSample {
        GrpoSample {
            prompt: "2+2?".into(),
            completion: "4".into(),
            answer: Some("4".into()),
            reward,
            rewards: vec![("exact_answer".into(), reward)],
            advantage: 0.5,
            tokens: 1,
            finished: true,
        }
    }

    #[test]
    fn steps_fill_the_series_and_a_resume_splices() {
        let mut older = GrpoSeries::default();
        assert!(older.is_empty());
        for s in 1..=4 {
            // Two iterations per batch: generation seconds come on odd steps only.
            older.push_step(s, &metrics(s as f64 / 4.0, if s % 2 == 1 { 3.0 + s as f64 } else { 0.0 }));
        }
        older.push_eval(4, &metrics(0.5, 0.0));
        older.push_samples(2, vec![sample(1.0)]);
        older.push_samples(4, vec![sample(0.0)]);
        assert_eq!((older.reward.len(), older.each_reward["exact_answer"].len(), older.kl.len()), (4, 4, 0));
        assert_eq!((older.reward_low[3].y, older.reward_high[3].y), (0.75, 1.25));
        assert_eq!(older.generation_secs, Some(6.0), "the last batch's sampling time, not the 0 of its second step");
        assert_eq!(older.shown_samples().unwrap().0, 4, "the latest samples by default");
        older.shown_step = Some(2);
        assert_eq!(older.shown_samples().unwrap().0, 2);

        let mut cut = older.clone();
        cut.forget_after(2);
        assert_eq!((cut.reward.len(), cut.val_reward.len(), cut.samples.len()), (2, 0, 1));
        let mut live = GrpoSeries::default();
        live.push_step(3, &metrics(0.1, 2.0));
        live.splice_before(older, 3.0);
        let xs: Vec<f64> = live.reward.iter().map(|p| p.x).collect();
        assert_eq!(xs, [1.0, 2.0, 3.0]);
        assert_eq!(live.each_reward["exact_answer"].len(), 3);
        assert_eq!(live.last.as_ref().unwrap().reward_mean, 0.1, "the live step is the latest");
        assert_eq!(live.generation_secs, Some(2.0));
        assert_eq!(live.samples.iter().map(|(s, _)| *s).collect::<Vec<_>>(), [2]);
    }

    #[test]
    fn only_the_last_sample_events_are_kept() {
        let mut g = GrpoSeries::default();
        for s in 1..=(KEPT_SAMPLE_STEPS + 2) {
            g.push_samples(s * 10, vec![sample(s as f64)]);
        }
        assert_eq!(g.samples.len(), KEPT_SAMPLE_STEPS);
        assert_eq!(g.samples.front().unwrap().0, 30);
        g.shown_step = Some(10);
        assert_eq!(g.shown_samples().unwrap().0, 70, "a step no longer kept falls back to the latest");
        g.push_samples(70, vec![]);
        assert_eq!((g.samples.len(), g.samples.back().unwrap().1.len()), (KEPT_SAMPLE_STEPS, 0), "a repeat replaces");
    }
}
