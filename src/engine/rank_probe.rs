//! The rank explorer's engine: short probe trainings at several ranks with the same seed, data order and token
//! budget, each at the settings' LoRA scale (alpha is set per rank so that alpha / r, or alpha / sqrt(r) with
//! rsLoRA, stays what the settings give), reporting speed, the memory each probe added and validation loss.
//!
//! Each probe also reports how long its parts took ([`ProbeTiming`]) and the shape of its work on this dataset
//! ([`ProbePlan`]), so a front end can say how long a sweep will take; [`calibrate`] measures the same with one
//! step before any probe has run.

use crate::engine::memory_watch::{MemoryWatch, PhaseMemory};
use crate::engine::model::LoadedModel;
use crate::engine::train::{self, lr_at, LoraSettings, StepRunner, TrainConfig, TrainControl};
use crate::engine::{Error, Result};
use std::time::Instant;

/// What one probe does on a dataset, whatever its rank: what a time estimate multiplies.
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize, serde::Deserialize)]
pub struct ProbePlan {
    /// Training tokens per optimizer step: the mean row length x batch size x gradient accumulation.
    pub tokens_per_step: f64,
    /// Validation batches scored after each probe.
    pub val_batches: usize,
}

impl ProbePlan {
    /// Optimizer steps of a probe that trains on `token_budget` tokens (at least one).
    pub fn steps(&self, token_budget: usize) -> usize {
        ((token_budget as f64 / self.tokens_per_step.max(1.0)).ceil() as usize).max(1)
    }
}

/// Measured seconds of a probe's parts.
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize, serde::Deserialize)]
pub struct ProbeTiming {
    /// Attaching a fresh adapter and building its optimizer.
    pub setup_secs: f64,
    /// The first optimizer step, which pays for first-time allocations (and, in a fresh process, thread pools
    /// and pages of the weights).
    pub first_step_secs: f64,
    /// Each later optimizer step (forward, backward and update of every micro-batch), on average.
    pub step_secs: f64,
    /// Scoring one validation batch.
    pub val_batch_secs: f64,
}

impl ProbeTiming {
    /// Seconds of one probe on `token_budget` tokens. Every rank is assumed to take as long per step as the
    /// measured one: the adapters add little compute next to the frozen base.
    pub fn probe_secs(&self, plan: &ProbePlan, token_budget: usize) -> f64 {
        let later_steps = plan.steps(token_budget) - 1;
        self.setup_secs
            + self.first_step_secs
            + later_steps as f64 * self.step_secs
            + plan.val_batches as f64 * self.val_batch_secs
    }

    /// Seconds of `probes` probes on `token_budget` tokens each.
    pub fn sweep_secs(&self, plan: &ProbePlan, token_budget: usize, probes: usize) -> f64 {
        probes as f64 * self.probe_secs(plan, token_budget)
    }
}

/// One point of the rank explorer: an equal-budget probe training at one rank.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RankProbeResult {
    pub rank: usize,
    /// The alpha this rank was probed at (the settings' scale kept), and whether the scale was rsLoRA's.
    pub alpha: f64,
    pub use_rslora: bool,
    pub trainable_params: usize,
    pub steps: usize,
    pub tokens_per_sec: f64,
    /// Memory this probe used above what was in use when it began, and its total peak.
    pub memory: PhaseMemory,
    pub val_loss: f64,
    pub plan: ProbePlan,
    pub timing: ProbeTiming,
}

impl RankProbeResult {
    /// The LoRA settings this probe trained with, on top of `settings` (targets, layers, dropout kept).
    pub fn lora(&self, settings: &LoraSettings) -> LoraSettings {
        LoraSettings { rank: self.rank, alpha: self.alpha, use_rslora: self.use_rslora, ..settings.clone() }
    }

    /// The LoRA scale this probe trained at.
    pub fn lora_scale(&self) -> f64 {
        self.lora(&LoraSettings::default()).scale()
    }
}

/// Train briefly at each rank with the same seed, data order and token budget; report speed, memory and
/// validation loss per rank. `on_result` is called as each rank finishes. The LoRA scale is held at the
/// settings' value ([`LoraSettings::at_rank_with_scale`]) so ranks differ only in capacity.
pub fn rank_probe(
    base: &LoadedModel,
    settings: &TrainConfig,
    ranks: &[usize],
    token_budget: usize,
    control: &TrainControl,
    on_result: &mut dyn FnMut(&RankProbeResult),
) -> Result<Vec<RankProbeResult>> {
    if ranks.is_empty() {
        return Err(Error::InvalidSetting("choose at least one rank to probe".into()));
    }
    let data = ProbeData::prepare(base, settings)?;
    let steps = data.plan.steps(token_budget);
    let mut results = Vec::new();
    for &rank in ranks {
        let r = probe_one(base, &data, settings, rank, steps, data.plan.val_batches, control)?;
        on_result(&r);
        results.push(r);
    }
    Ok(results)
}

/// Measure two training steps (the first is slower) and one validation batch at `rank` on the settings' data:
/// the plan and timing a sweep estimate needs before any probe has run.
pub fn calibrate(
    base: &LoadedModel,
    settings: &TrainConfig,
    rank: usize,
    control: &TrainControl,
) -> Result<(ProbePlan, ProbeTiming)> {
    let data = ProbeData::prepare(base, settings)?;
    let r = probe_one(base, &data, settings, rank, 2, 1, control)?;
    Ok((data.plan, r.timing))
}

/// The tokenized dataset and what every probe on it shares.
struct ProbeData {
    data: crate::engine::data::PreparedDataset,
    plan: ProbePlan,
    pad_id: u32,
}

impl ProbeData {
    fn prepare(base: &LoadedModel, settings: &TrainConfig) -> Result<Self> {
        settings.validate()?;
        let data = train::prepare_data(settings, base)?;
        let mean_row_tokens = data.summary.tokens_per_epoch as f64 / data.train.examples.len().max(1) as f64;
        let tokens_per_step = (mean_row_tokens * (settings.batch_size * settings.grad_accum) as f64).max(1.0);
        let pad_id = base.eos_token_ids.first().copied().unwrap_or(0);
        let mut probe = Self { data, plan: ProbePlan { tokens_per_step, val_batches: 0 }, pad_id };
        let valid_lengths: Vec<usize> = probe.valid().iter().map(|e| e.len()).collect();
        let all_batches = crate::engine::data::eval_batches(&valid_lengths, settings.batch_size).len();
        probe.plan.val_batches =
            if settings.val_batches > 0 { all_batches.min(settings.val_batches) } else { all_batches };
        Ok(probe)
    }

    /// The validation split, or the training split when there is none.
    fn valid(&self) -> &[crate::engine::data::Example] {
        let valid = self.data.valid.as_ref().filter(|v| !v.examples.is_empty()).unwrap_or(&self.data.train);
        &valid.examples
    }
}

/// One probe: `steps` optimizer steps at `rank`, then `val_batches` validation batches.
fn probe_one(
    base: &LoadedModel,
    data: &ProbeData,
    settings: &TrainConfig,
    rank: usize,
    steps: usize,
    val_batches: usize,
    control: &TrainControl,
) -> Result<RankProbeResult> {
    if control.stop_requested() {
        return Err(Error::Cancelled);
    }
    let lora = settings.lora.at_rank_with_scale(rank, settings.lora.scale());
    let probe_cfg = TrainConfig { iters: Some(steps), epochs: None, lora: lora.clone(), ..settings.clone() };
    let mut memory = MemoryWatch::start(base.model.device());
    let setup_started = Instant::now();
    let mut model = base.model.clone();
    crate::engine::lora::detach_adapters(&mut model);
    let params = crate::engine::lora::attach_new_adapters(&mut model, &lora, settings.seed)?;
    let trainable_params = params.iter().map(|p| p.elem_count()).sum();
    let mut runner = StepRunner::new(model, &params, settings.weight_decay, settings.max_grad_norm, settings.seed)?;
    runner.set_checkpointing(settings.checkpointing)?;
    let examples = &data.data.train.examples;
    let rows = train::TrainRows::new(&probe_cfg, examples);
    let (plan, total_steps) = train::plan_batches(&probe_cfg, rows.lengths(examples))?;
    let setup_secs = setup_started.elapsed().as_secs_f64();
    let mut batches = plan.iter();
    let started = Instant::now();
    let mut first_step_secs = 0.0;
    let mut tokens = 0usize;
    for step in 0..total_steps {
        if control.stop_requested() {
            return Err(Error::Cancelled);
        }
        let micro: Vec<_> = (0..settings.grad_accum).filter_map(|_| batches.next()).collect();
        let collated =
            micro.iter().map(|b| rows.collate(examples, &b.indices, data.pad_id)).collect::<Result<Vec<_>>>()?;
        tokens += collated.iter().map(|b| b.batch_size * b.seq_len).sum::<usize>();
        runner.step(&collated, lr_at(&probe_cfg, step, total_steps))?;
        memory.sample();
        if step == 0 {
            first_step_secs = started.elapsed().as_secs_f64();
        }
    }
    let train_secs = started.elapsed().as_secs_f64().max(1e-9);
    let step_secs = match total_steps {
        0 | 1 => first_step_secs,
        n => (train_secs - first_step_secs).max(0.0) / (n - 1) as f64,
    };
    let val_started = Instant::now();
    let val_loss =
        train::validation_loss(&runner.model, data.valid(), settings.batch_size, val_batches.max(1), data.pad_id)?;
    let val_secs = val_started.elapsed().as_secs_f64();
    Ok(RankProbeResult {
        rank,
        alpha: lora.alpha,
        use_rslora: lora.use_rslora,
        trainable_params,
        steps: total_steps,
        tokens_per_sec: tokens as f64 / train_secs,
        memory: memory.read(),
        val_loss,
        plan: data.plan,
        timing: ProbeTiming {
            setup_secs,
            first_step_secs,
            step_secs,
            val_batch_secs: val_secs / val_batches.max(1) as f64,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sweep_estimate_multiplies_measured_parts_by_the_plan() {
        let plan = ProbePlan { tokens_per_step: 1000.0, val_batches: 4 };
        assert_eq!(plan.steps(20_000), 20);
        assert_eq!(plan.steps(20_001), 21, "a partial step is still a step");
        assert_eq!(plan.steps(10), 1, "every probe trains at least one step");
        let timing = ProbeTiming { setup_secs: 0.5, first_step_secs: 9.0, step_secs: 6.0, val_batch_secs: 2.0 };
        assert_eq!(timing.probe_secs(&plan, 20_000), 0.5 + 9.0 + 19.0 * 6.0 + 4.0 * 2.0);
        assert_eq!(timing.sweep_secs(&plan, 20_000, 5), 5.0 * 131.5);
        assert_eq!(timing.probe_secs(&plan, 10), 0.5 + 9.0 + 4.0 * 2.0, "a one-step probe pays the first step only");
        assert_eq!(timing.sweep_secs(&plan, 20_000, 0), 0.0);
    }

    #[test]
    fn each_rank_is_probed_and_applied_at_the_settings_scale() {
        let settings = LoraSettings { rank: 8, alpha: 32.0, ..Default::default() };
        for rank in [1, 4, 16, 64] {
            let at = settings.at_rank_with_scale(rank, settings.scale());
            assert_eq!(at.rank, rank);
            assert!((at.scale() - 4.0).abs() < 1e-12, "rank {rank}: scale {}", at.scale());
        }
        let rs = LoraSettings { rank: 8, alpha: 16.0, use_rslora: true, ..Default::default() };
        let at = rs.at_rank_with_scale(32, rs.scale());
        assert!(at.use_rslora && (at.scale() - rs.scale()).abs() < 1e-12);
        let probed = RankProbeResult {
            rank: 16,
            alpha: 64.0,
            use_rslora: false,
            trainable_params: 0,
            steps: 1,
            tokens_per_sec: 1.0,
            memory: PhaseMemory::default(),
            val_loss: 1.0,
            plan: ProbePlan::default(),
            timing: ProbeTiming::default(),
        };
        assert_eq!(probed.lora_scale(), 4.0);
        let applied = probed.lora(&rs);
        assert_eq!((applied.rank, applied.alpha, applied.use_rslora), (16, 64.0, false));
        assert_eq!(applied.targets, rs.targets, "targets come from the settings");
    }
}
