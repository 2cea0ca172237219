//! Evaluation: how good a base model, an adapter, or a run's checkpoints are on a dataset, by one of three
//! tasks, with the same engine behind `metal-candle eval` and the studio's Evaluate page.
//!
//! - [`EvalTask::Loss`]: loss and perplexity on a split, templated and masked as training does (`loss.rs`).
//! - [`EvalTask::Generate`]: answers to each row's prompt scored against its reference (`generation.rs`,
//!   text metrics in `metrics.rs`, an optional local judge in `judge.rs`).
//! - [`EvalTask::MultipleChoice`]: log-likelihoods of each choice as lm-evaluation-harness computes them
//!   (`multiple_choice.rs`, rows and benchmark column forms in `choice_rows.rs`).
//!
//! A task is prepared once (the data read, checked row by row and tokenized: bad input fails here, before any
//! model runs) and then run for each [`EvalTarget`] in turn on a clone of the base that shares its weights, with
//! the target's adapter attached. Progress goes out as [`EvalEvent`]s; a cancel flag stops between rows.

pub mod choice_forms;
pub mod choice_rows;
pub mod generation;
pub mod judge;
pub mod loss;
pub mod metrics;
pub mod multiple_choice;
pub mod preference;
pub mod split;
pub mod targets;

pub use targets::EvalTarget;

use crate::engine::data::{DataOptions, ReadOptions, SplitName};
use crate::engine::model::transformer::Transformer;
use crate::engine::model::LoadedModel;
use crate::engine::sampler::SamplingParams;
use crate::engine::{Error, Result};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

/// What to evaluate, on what, with which task.
#[derive(Debug, Clone)]
pub struct EvalSpec {
    pub task: EvalTask,
    /// A dataset file or folder (the same forms training reads), or for multiple choice a file of choice rows.
    pub data: PathBuf,
    /// The split of a dataset folder to read (a single file is its own split).
    pub split: SplitName,
    pub read: ReadOptions,
    /// Evaluate only the first N rows (None: all).
    pub limit: Option<usize>,
    /// Longest sequence, in tokens; longer rows are cut as training cuts them (loss) or refused (the others).
    pub seq_len: usize,
    /// Rows per forward pass (loss, multiple choice).
    pub batch_size: usize,
    /// The models to compare, in the order they are reported.
    pub targets: Vec<EvalTarget>,
    /// The held-out validation fraction and its seed, as the run used them: without a validation file, the
    /// `valid` split is carved from the training rows by these, so it is the same rows the run validated on.
    pub valid_fraction: f64,
    pub seed: u64,
    /// Score every token (prompts too), as a run trained with `train_on_prompt` did (loss task).
    pub train_on_prompt: bool,
}

impl Default for EvalSpec {
    /// The loss task on a dataset's test split, the base alone, training's defaults for the split.
    fn default() -> Self {
        let data = DataOptions::default();
        Self {
            task: EvalTask::Loss,
            data: PathBuf::new(),
            split: SplitName::Test,
            read: data.read,
            limit: None,
            seq_len: data.max_seq_len,
            batch_size: 4,
            targets: vec![EvalTarget::base()],
            valid_fraction: data.valid_fraction,
            // Training's default seed, which carves its validation rows.
            seed: crate::engine::train::TrainConfig::default().seed,
            train_on_prompt: data.train_on_prompt,
        }
    }
}

impl EvalSpec {
    /// The checks that need no model and no data (run by [`run_eval`]; front ends call it before loading a
    /// model): something to evaluate, sizes of at least 1, a sampling setting and a regex that can work.
    pub fn check(&self) -> Result<()> {
        if self.targets.is_empty() {
            return Err(Error::InvalidSetting("nothing to evaluate: name the base, an adapter or checkpoints".into()));
        }
        if self.batch_size == 0 || self.seq_len == 0 || self.limit == Some(0) {
            return Err(Error::InvalidSetting(format!(
                "batch size (--batch-size {}), sequence length (--seq-len {}) and limit (--limit {}) must be at \
                 least 1",
                self.batch_size,
                self.seq_len,
                self.limit.map_or("none".into(), |l| l.to_string())
            )));
        }
        if let EvalTask::Generate(settings) = &self.task {
            settings.sampling.validate(settings.max_tokens)?;
            metrics::Scorer::new(settings.regex.as_deref())?;
        }
        Ok(())
    }

    /// Read and split rows as the training run of `config` did: its sequence length (rows cut alike), its seed
    /// (the same held-out validation rows) and whether prompt tokens were trained. The one rule the CLI (a named
    /// run) and the studio (the first picked checkpoint's run, else the training settings) follow.
    pub fn read_like(self, config: &crate::engine::train::TrainConfig) -> Self {
        Self { seq_len: config.seq_len, seed: config.seed, train_on_prompt: config.train_on_prompt, ..self }
    }

    /// How the data is read and split: training's [`DataOptions`] with this spec's values.
    pub fn data_options(&self) -> DataOptions {
        DataOptions {
            valid_fraction: self.valid_fraction,
            seed: self.seed,
            max_seq_len: self.seq_len,
            train_on_prompt: self.train_on_prompt,
            read: self.read.clone(),
            ..Default::default()
        }
    }
}

/// Which evaluation to run.
#[derive(Debug, Clone)]
pub enum EvalTask {
    Loss,
    Generate(GenerateSettings),
    MultipleChoice,
    Preference(preference::PreferenceTask),
}

impl EvalTask {
    /// "loss", "generate" or "multiple-choice", as `--task` spells them.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Loss => "loss",
            Self::Generate(_) => "generate",
            Self::MultipleChoice => "multiple-choice",
            Self::Preference(_) => "preference",
        }
    }
}

/// How answers are generated and scored.
#[derive(Debug, Clone)]
pub struct GenerateSettings {
    pub max_tokens: usize,
    /// Temperature 0 is greedy.
    pub sampling: SamplingParams,
    /// A user regex: an answer scores 1 when it matches.
    pub regex: Option<String>,
    /// A local model that scores each answer 1-10 against the reference.
    pub judge: Option<PathBuf>,
}

impl Default for GenerateSettings {
    /// Greedy answers of at most 256 tokens, no regex, no judge.
    fn default() -> Self {
        Self { max_tokens: 256, sampling: SamplingParams::greedy(), regex: None, judge: None }
    }
}

/// One named number of a target's result (`loss`, `perplexity`, `exact_match`, `acc`, ...), in report order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Metric {
    pub name: String,
    pub value: f64,
}

impl Metric {
    pub fn new(name: &str, value: f64) -> Self {
        Self { name: name.into(), value }
    }

    /// Whether metric `name` counts things (rows, tokens, unparsed replies): shown as a whole number.
    pub fn is_count(name: &str) -> bool {
        matches!(name, "rows" | "target_tokens" | "judge_unparsed")
    }

    /// Which way metric `name` is better: Some(true) higher, Some(false) lower (loss, perplexity), None for counts
    /// (rows, target tokens, unparsed judge replies) that are not scores. The CLI's table and the studio's both
    /// mark the best value by it.
    pub fn higher_is_better(name: &str) -> Option<bool> {
        match name {
            "loss" | "perplexity" | "nll_loss" => Some(false),
            // A preference run's log-probabilities and single rewards say nothing alone: their gap does.
            "rows" | "target_tokens" | "judge_unparsed" | "rewards/chosen" | "rewards/rejected" | "logps/chosen"
            | "logps/rejected" => None,
            _ => Some(true),
        }
    }
}

/// What one target scored: its metrics (means over rows) and the per-row detail, whose shape depends on the task.
#[derive(Debug, Clone, Serialize)]
pub struct TargetResult {
    pub target: EvalTarget,
    pub metrics: Vec<Metric>,
    /// Per-row results: a JSON array of the task's row records.
    pub rows: serde_json::Value,
    pub elapsed_secs: f64,
}

impl TargetResult {
    /// The value of metric `name`, if the task reports it.
    pub fn metric(&self, name: &str) -> Option<f64> {
        self.metrics.iter().find(|m| m.name == name).map(|m| m.value)
    }
}

/// The whole evaluation, as `eval --json` prints it.
#[derive(Debug, Clone, Serialize)]
pub struct EvalReport {
    pub task: String,
    pub data: PathBuf,
    pub split: SplitName,
    /// Rows evaluated per target.
    pub rows: usize,
    /// What the reader should know (rows cut to the sequence length, a fallback template, ...).
    pub notes: Vec<String>,
    pub targets: Vec<TargetResult>,
}

/// What an evaluation reports while it runs; `run_eval`'s result (or error) ends it.
#[derive(Debug, Clone)]
pub enum EvalEvent {
    /// The data is read and checked: `rows` per target.
    Started {
        task: String,
        rows: usize,
        targets: Vec<EvalTarget>,
        notes: Vec<String>,
    },
    /// `done` of `total` rows of target number `target`.
    Progress {
        target: usize,
        done: usize,
        total: usize,
    },
    TargetFinished {
        target: usize,
        result: Box<TargetResult>,
    },
}

/// A task with its data read, checked and tokenized, ready to run on any target.
pub trait PreparedTask: Send {
    /// Rows each target is scored on.
    fn rows(&self) -> usize;
    /// Notes for the report (cut rows, a fallback template, ...).
    fn notes(&self) -> Vec<String>;
    /// Score `model` (a clone of `base.model` with the target's adapter attached; `base` gives the tokenizer,
    /// template and eos ids). `progress(done)` after each row or batch; it fails with [`Error::Cancelled`] once
    /// the evaluation is cancelled.
    fn run(
        &self,
        base: &LoadedModel,
        model: &Transformer,
        progress: &mut dyn FnMut(usize) -> Result<()>,
    ) -> Result<(Vec<Metric>, serde_json::Value)>;
}

/// Evaluate every target of `spec` on `base`, emitting progress; stops with [`Error::Cancelled`] when `cancel` is
/// set. The data is checked before the first target runs.
pub fn run_eval(
    spec: &EvalSpec,
    base: &LoadedModel,
    cancel: &AtomicBool,
    emit: &mut dyn FnMut(EvalEvent),
) -> Result<EvalReport> {
    spec.check()?;
    let mut notes = Vec::new();
    for target in &spec.targets {
        notes.extend(target.check(base)?);
    }
    let task = prepare(spec, base)?;
    let rows = task.rows();
    notes.extend(task.notes());
    emit(EvalEvent::Started {
        task: spec.task.name().into(),
        rows,
        targets: spec.targets.clone(),
        notes: notes.clone(),
    });
    let mut results = Vec::with_capacity(spec.targets.len());
    for (index, target) in spec.targets.iter().enumerate() {
        let started = Instant::now();
        let model = target.model_for(base)?;
        let mut progress = |done: usize| {
            if cancel.load(Ordering::Relaxed) {
                return Err(Error::Cancelled);
            }
            emit(EvalEvent::Progress { target: index, done, total: rows });
            Ok(())
        };
        progress(0)?;
        let (metrics, row_results) = task.run(base, &model, &mut progress)?;
        let result = TargetResult {
            target: target.clone(),
            metrics,
            rows: row_results,
            elapsed_secs: started.elapsed().as_secs_f64(),
        };
        emit(EvalEvent::TargetFinished { target: index, result: Box::new(result.clone()) });
        results.push(result);
    }
    Ok(EvalReport {
        task: spec.task.name().into(),
        data: spec.data.clone(),
        split: spec.split,
        rows,
        notes,
        targets: results,
    })
}

/// Read, check and tokenize the data for `spec`'s task.
fn prepare(spec: &EvalSpec, base: &LoadedModel) -> Result<Box<dyn PreparedTask>> {
    match &spec.task {
        EvalTask::Loss => loss::prepare(spec, base),
        EvalTask::Generate(settings) => generation::prepare(spec, settings, base),
        EvalTask::MultipleChoice => multiple_choice::prepare(spec, base),
        EvalTask::Preference(task) => preference::prepare(spec, *task, base),
    }
}
