//! A preference run's series (DPO, ORPO): reward accuracy and margins of the training steps and of the evaluations
//! on the validation pairs, the chosen and rejected rewards, and the latest metrics, under TRL's names. Fed by the
//! live Step/Eval events and by a run's recorded metrics.jsonl alike; plain data.

use crate::engine::train::preference::PreferenceMetrics;
use egui_plot::PlotPoint;

/// The preference metrics of one run over its steps.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PreferenceSeries {
    /// `rewards/accuracies` of each training step.
    pub accuracies: Vec<PlotPoint>,
    /// `eval_rewards/accuracies`: the validation pairs at each evaluation.
    pub val_accuracies: Vec<PlotPoint>,
    /// `rewards/margins` of each training step.
    pub margins: Vec<PlotPoint>,
    /// `eval_rewards/margins`.
    pub val_margins: Vec<PlotPoint>,
    /// `rewards/chosen` and `rewards/rejected` of each training step.
    pub chosen: Vec<PlotPoint>,
    pub rejected: Vec<PlotPoint>,
    /// The latest step's and the latest evaluation's metrics.
    pub last: Option<PreferenceMetrics>,
    pub last_val: Option<PreferenceMetrics>,
}

impl PreferenceSeries {
    /// Whether any step or evaluation carried preference metrics (an SFT run has none).
    pub fn is_empty(&self) -> bool {
        self.accuracies.is_empty() && self.val_accuracies.is_empty()
    }

    /// A training step's metrics.
    pub fn push_step(&mut self, step: usize, m: &PreferenceMetrics) {
        let x = step as f64;
        self.accuracies.push(PlotPoint::new(x, m.rewards_accuracies));
        self.margins.push(PlotPoint::new(x, m.rewards_margins));
        self.chosen.push(PlotPoint::new(x, m.rewards_chosen));
        self.rejected.push(PlotPoint::new(x, m.rewards_rejected));
        self.last = Some(*m);
    }

    /// An evaluation's metrics on the validation pairs.
    pub fn push_eval(&mut self, step: usize, m: &PreferenceMetrics) {
        let x = step as f64;
        self.val_accuracies.push(PlotPoint::new(x, m.rewards_accuracies));
        self.val_margins.push(PlotPoint::new(x, m.rewards_margins));
        self.last_val = Some(*m);
    }

    /// Drop what was recorded after `step` (a resume replays from there).
    pub fn forget_after(&mut self, step: usize) {
        let before = |p: &PlotPoint| p.x <= step as f64;
        for s in self.all_mut() {
            s.retain(before);
        }
    }

    /// Put `older`'s points before `first_live_step` in front of these (a resumed run's recorded part); the
    /// latest values stay the live ones when there are any.
    pub fn splice_before(&mut self, older: PreferenceSeries, first_live_step: f64) {
        let PreferenceSeries { accuracies, val_accuracies, margins, val_margins, chosen, rejected, last, last_val } =
            older;
        for (old, live) in
            [accuracies, val_accuracies, margins, val_margins, chosen, rejected].into_iter().zip(self.all_mut())
        {
            let mut merged: Vec<PlotPoint> = old.into_iter().filter(|p| p.x < first_live_step).collect();
            merged.append(live);
            *live = merged;
        }
        self.last = self.last.or(last);
        self.last_val = self.last_val.or(last_val);
    }

    fn all_mut(&mut self) -> [&mut Vec<PlotPoint>; 6] {
        [
            &mut self.accuracies,
            &mut self.val_accuracies,
            &mut self.margins,
            &mut self.val_margins,
            &mut self.chosen,
            &mut self.rejected,
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metrics(acc: f64) -> PreferenceMetrics {
        PreferenceMetrics { rewards_accuracies: acc, rewards_margins: acc / 2.0, pairs: 2, ..Default::default() }
    }

    #[test]
    fn steps_and_evals_fill_their_series_and_a_resume_splices() {
        let mut older = PreferenceSeries::default();
        assert!(older.is_empty());
        for s in 1..=4 {
            older.push_step(s, &metrics(s as f64 / 4.0));
        }
        older.push_eval(4, &metrics(0.75));
        assert_eq!((older.accuracies.len(), older.val_accuracies.len()), (4, 1));
        assert_eq!(older.last.unwrap().rewards_accuracies, 1.0);
        let mut cut = older.clone();
        cut.forget_after(2);
        assert_eq!((cut.accuracies.len(), cut.val_accuracies.len(), cut.chosen.len()), (2, 0, 2));
        let mut live = PreferenceSeries::default();
        live.push_step(3, &metrics(0.5));
        live.splice_before(older, 3.0);
        let xs: Vec<f64> = live.accuracies.iter().map(|p| p.x).collect();
        assert_eq!(xs, [1.0, 2.0, 3.0]);
        assert_eq!(live.last.unwrap().rewards_accuracies, 0.5, "the live step is the latest");
        assert_eq!(live.last_val.unwrap().rewards_accuracies, 0.75);
    }
}
