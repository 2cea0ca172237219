//! `metal-candle eval`: score the base model, adapters and a run's checkpoints on a dataset with the engine's
//! evaluation ([`crate::engine::eval::run_eval`], the one the studio's Evaluate page runs), printing a table
//! (targets as rows, metrics as columns, the best of each column marked) or the report as JSON. Progress goes to
//! stderr; Ctrl-C stops between rows.

use super::ModelArgs;
use crate::engine::data::{ColumnMap, FormatChoice, SplitName};
use crate::engine::eval::{self, EvalEvent, EvalReport, EvalSpec, EvalTarget, EvalTask, GenerateSettings, Metric};
use crate::engine::sampler::SamplingParams;
use crate::engine::train::run_folder::{run_dir_of_checkpoint, RunManifest, RUN_CONFIG};
use anyhow::{bail, Context};
use clap::{Args, ValueEnum};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TaskArg {
    Loss,
    Generate,
    MultipleChoice,
    Preference,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SplitArg {
    Test,
    Valid,
    Train,
}

impl From<SplitArg> for SplitName {
    fn from(split: SplitArg) -> Self {
        match split {
            SplitArg::Test => SplitName::Test,
            SplitArg::Valid => SplitName::Valid,
            SplitArg::Train => SplitName::Train,
        }
    }
}

#[derive(Debug, Args)]
pub struct EvalArgs {
    /// The base model: a Hugging Face model folder, a .gguf file, or a Hub repo id. Default: the model the named
    /// run trained on (its run.json).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// auto | cpu | cuda | metal
    #[arg(long, default_value = "auto")]
    pub device: crate::engine::device::DeviceChoice,
    /// auto | f32 | f16 | bf16
    #[arg(long, default_value = "auto")]
    pub dtype: crate::engine::device::DTypeChoice,
    /// Base weights: none (dense) | keep | q8_0 | q6k | q5k | q4k | q4_1 | q4_0 (as `generate --quantize`).
    #[arg(long, default_value = "none")]
    pub quantize: crate::engine::model::BaseQuant,
    /// An adapter folder to evaluate (ours or PEFT's); repeatable.
    #[arg(long = "adapter", value_name = "DIR")]
    pub adapters: Vec<PathBuf>,
    /// Checkpoint or run folders; a run folder means all of its checkpoints, in step order.
    #[arg(long, value_name = "DIR", num_args = 1..)]
    pub checkpoints: Vec<PathBuf>,
    /// Evaluate the base model too (the default when no adapter or checkpoint is named).
    #[arg(long)]
    pub base: bool,
    /// A .jsonl, .json or .parquet file, a folder of them, or a Hub dataset id. Default: the named run's dataset.
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// How dataset rows are read (default: the run's, else auto).
    #[arg(long, value_name = "auto|chat|sharegpt|alpaca|completions|text|preference|prompts")]
    pub format: Option<FormatChoice>,
    /// Read dataset columns as a format's fields, e.g. prompt=question,completion=answer.
    #[arg(long, value_name = "FIELD=COLUMN,...")]
    pub columns: Option<ColumnMap>,
    #[arg(long, value_enum, default_value = "loss")]
    pub task: TaskArg,
    /// The split to evaluate; a single file is its own test split, and `valid` without a validation file is the
    /// rows training held out (by the run's seed).
    #[arg(long, value_enum, default_value = "test")]
    pub split: SplitArg,
    /// Evaluate only the first N rows.
    #[arg(long, allow_negative_numbers = true)]
    pub limit: Option<usize>,
    /// Rows per forward pass (loss, multiple-choice).
    #[arg(long, default_value_t = 4, allow_negative_numbers = true)]
    pub batch_size: usize,
    /// Longest sequence in tokens (default: the run's, else 2048); loss rows are cut to it as training cuts them.
    #[arg(long, allow_negative_numbers = true)]
    pub seq_len: Option<usize>,
    /// Most tokens per answer (generate).
    #[arg(long, default_value_t = 256, allow_negative_numbers = true)]
    pub max_tokens: usize,
    /// 0 is greedy (generate).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub temperature: f64,
    /// Sampling seed (generate, with a temperature above 0).
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// An answer scores `regex` 1 when it matches this regex (generate).
    #[arg(long, value_name = "R")]
    pub regex: Option<String>,
    /// A model that grades each answer 1-10 against the reference (generate): folder, .gguf or Hub repo id.
    #[arg(long, value_name = "MODEL")]
    pub judge: Option<PathBuf>,
    #[command(flatten)]
    pub preference: super::preference_flags::PreferenceFlags,
    /// Print the whole report (every row) as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

/// What a run folder named among `--checkpoints` says: its run.json (the first one found).
fn named_run(args: &EvalArgs) -> anyhow::Result<Option<(PathBuf, RunManifest)>> {
    for path in &args.checkpoints {
        let run_dir = if path.join(RUN_CONFIG).exists() { path.clone() } else { run_dir_of_checkpoint(path) };
        if run_dir.join(RUN_CONFIG).exists() {
            return Ok(Some((run_dir.clone(), RunManifest::read(&run_dir)?)));
        }
    }
    Ok(None)
}

/// The evaluation the arguments ask for, with the model to load (nothing loaded or read yet).
fn spec_of(args: &EvalArgs) -> anyhow::Result<(EvalSpec, PathBuf)> {
    let run = named_run(args)?;
    let config = run.as_ref().map(|(_, m)| &m.config);
    let model = match (&args.model, &run) {
        (Some(model), _) => model.clone(),
        (None, Some((dir, manifest))) => manifest.recorded_model(dir)?,
        (None, None) => bail!("name the base model with --model (a model folder, a .gguf file or a Hub repo id)"),
    };
    let data = match (&args.data, &run) {
        (Some(data), _) => data.clone(),
        (None, Some((_, manifest))) => manifest.dataset.clone(),
        (None, None) => bail!("name the data to evaluate on with --data (a file, a folder or a Hub dataset id)"),
    };
    let data = super::hub::resolve_path(&data, crate::engine::hub::RepoKind::Dataset)?.path;
    let mut read = config.map(|c| c.read_options()).unwrap_or_default();
    if let Some(format) = args.format {
        read.format = format;
    }
    if let Some(columns) = &args.columns {
        read.columns = columns.clone();
    }
    let mut targets = Vec::new();
    if args.base || (args.adapters.is_empty() && args.checkpoints.is_empty()) {
        targets.push(EvalTarget::base());
    }
    targets.extend(args.adapters.iter().map(|a| EvalTarget::adapter(a)));
    targets.extend(EvalTarget::expand(&args.checkpoints)?);
    let task = match args.task {
        TaskArg::Loss => EvalTask::Loss,
        TaskArg::MultipleChoice => EvalTask::MultipleChoice,
        TaskArg::Preference => EvalTask::Preference(preference_task(args, config)?),
        TaskArg::Generate => {
            let judge = match &args.judge {
                Some(j) => Some(super::hub::resolve_path(j, crate::engine::hub::RepoKind::Model)?.path),
                None => None,
            };
            EvalTask::Generate(GenerateSettings {
                max_tokens: args.max_tokens,
                sampling: SamplingParams { temperature: args.temperature, seed: args.seed, ..SamplingParams::greedy() },
                regex: args.regex.clone(),
                judge,
            })
        }
    };
    if args.task != TaskArg::Preference && args.preference.any() {
        bail!("--method, --beta, --loss and --label-smoothing score preference pairs: add --task preference");
    }
    if args.task != TaskArg::Generate && (args.regex.is_some() || args.judge.is_some()) {
        bail!("--regex and --judge score generated answers: add --task generate");
    }
    let mut spec = EvalSpec {
        task,
        data,
        split: args.split.into(),
        read,
        limit: args.limit,
        batch_size: args.batch_size,
        targets,
        ..EvalSpec::default()
    };
    if let Some(config) = config {
        spec = spec.read_like(config);
    }
    if let Some(seq_len) = args.seq_len {
        spec.seq_len = seq_len;
    }
    Ok((spec, model))
}

/// The preference method and its parameters: the flags, else the named run's, else DPO's defaults are refused
/// without a method (a preference task must say how it scores).
fn preference_task(
    args: &EvalArgs,
    config: Option<&crate::engine::train::TrainConfig>,
) -> anyhow::Result<eval::preference::PreferenceTask> {
    let run = config.filter(|c| c.method.is_preference());
    let method = match (args.preference.method, run) {
        (Some(method), _) => method,
        (None, Some(c)) => c.method,
        (None, None) => bail!("name how pairs are scored with --method dpo or --method orpo"),
    };
    let settings = args.preference.over(run.map(|c| c.preference()).unwrap_or_default());
    settings.validate(method)?;
    Ok(eval::preference::PreferenceTask { method, settings })
}

pub fn eval(args: &EvalArgs) -> anyhow::Result<()> {
    let (spec, model) = spec_of(args)?;
    // Settings that need no model (a bad regex, --limit 0) are refused before it loads.
    spec.check()?;
    let base =
        ModelArgs { model, adapter: None, device: args.device, dtype: args.dtype, quantize: args.quantize }.load()?;
    let cancel = Arc::new(AtomicBool::new(false));
    if crate::stop_signals::install() {
        let flag = cancel.clone();
        crate::stop_signals::forward(move || flag.store(true, Ordering::SeqCst));
    }
    let mut progress = Progress::new(std::io::stderr().is_terminal());
    let result = eval::run_eval(&spec, &base, &cancel, &mut |event| progress.show(&event));
    progress.finish();
    let report = match result {
        Err(crate::engine::Error::Cancelled) => bail!("evaluation cancelled (Ctrl-C); nothing was reported"),
        other => other.context("evaluation failed")?,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", table(&report));
    }
    Ok(())
}

/// Progress on stderr: one updating line on a terminal, a line per finished target otherwise.
struct Progress {
    terminal: bool,
    labels: Vec<String>,
    open_line: bool,
}

impl Progress {
    fn new(terminal: bool) -> Self {
        Self { terminal, labels: Vec::new(), open_line: false }
    }

    fn show(&mut self, event: &EvalEvent) {
        match event {
            EvalEvent::Started { task, rows, targets, notes } => {
                for note in notes {
                    eprintln!("note: {note}");
                }
                self.labels = targets.iter().map(|t| t.label.clone()).collect();
                eprintln!("{task}: {rows} rows x {} targets", targets.len());
            }
            EvalEvent::Progress { target, done, total } if self.terminal => {
                let label = self.labels.get(*target).map_or("", String::as_str);
                eprint!("\r[{}/{}] {label}: {done}/{total} rows\x1b[K", target + 1, self.labels.len());
                self.open_line = true;
            }
            EvalEvent::Progress { .. } => {}
            EvalEvent::TargetFinished { target, result } => {
                if self.open_line {
                    eprint!("\r\x1b[K");
                    self.open_line = false;
                }
                let metrics: Vec<String> =
                    result.metrics.iter().map(|m| format!("{} {}", m.name, format_value(&m.name, m.value))).collect();
                eprintln!(
                    "[{}/{}] {}: {} ({:.1}s)",
                    target + 1,
                    self.labels.len(),
                    result.target.label,
                    metrics.join(", "),
                    result.elapsed_secs
                );
            }
        }
    }

    fn finish(&mut self) {
        if self.open_line {
            eprintln!();
        }
    }
}

fn format_value(name: &str, value: f64) -> String {
    if value.is_nan() {
        "-".into()
    } else if Metric::is_count(name) {
        format!("{value:.0}")
    } else {
        format!("{value:.4}")
    }
}

/// Targets as rows, metrics as columns, `*` after the best value of each score column (when there is a choice).
pub fn table(report: &EvalReport) -> String {
    let mut names: Vec<String> = Vec::new();
    for t in &report.targets {
        for m in &t.metrics {
            if !names.contains(&m.name) {
                names.push(m.name.clone());
            }
        }
    }
    let best: Vec<Option<f64>> = names
        .iter()
        .map(|name| {
            let better = Metric::higher_is_better(name)?;
            let values = report.targets.iter().filter_map(|t| t.metric(name)).filter(|v| !v.is_nan());
            let best = if better { values.reduce(f64::max) } else { values.reduce(f64::min) };
            best.filter(|_| report.targets.len() > 1)
        })
        .collect();
    let label_width = report.targets.iter().map(|t| t.target.label.len()).max().unwrap_or(6).max(6);
    let widths: Vec<usize> = names.iter().map(|n| n.len().max(11)).collect();
    let mut out = format!("{:<label_width$}", "target");
    for (name, w) in names.iter().zip(&widths) {
        out.push_str(&format!("  {name:>w$}"));
    }
    out.push('\n');
    for t in &report.targets {
        out.push_str(&format!("{:<label_width$}", t.target.label));
        for ((name, w), best) in names.iter().zip(&widths).zip(&best) {
            let cell = match t.metric(name) {
                Some(v) => {
                    let mark = if best.is_some_and(|b| b == v) { "*" } else { " " };
                    format!("{}{mark}", format_value(name, v))
                }
                None => "- ".into(),
            };
            out.push_str(&format!("  {cell:>w$}"));
        }
        out.push('\n');
    }
    out.push_str(&format!(
        "{} rows of {} ({} split), task {}{}\n",
        report.rows,
        report.data.display(),
        report.split,
        report.task,
        if report.targets.len() > 1 { "; * marks the best of each column" } else { "" }
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::eval::{Metric, TargetResult};

    #[test]
    fn the_table_marks_the_lowest_loss_and_the_highest_score() {
        let target = |label: &str, loss: f64, em: f64| TargetResult {
            target: EvalTarget { label: label.into(), adapter: None, step: None },
            metrics: vec![Metric::new("loss", loss), Metric::new("exact_match", em), Metric::new("rows", 3.0)],
            rows: serde_json::json!([]),
            elapsed_secs: 0.0,
        };
        let report = EvalReport {
            task: "generate".into(),
            data: "d".into(),
            split: SplitName::Test,
            rows: 3,
            notes: vec![],
            targets: vec![target("base", 2.0, 0.0), target("run/checkpoint-4", 1.5, 0.6667)],
        };
        let text = table(&report);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[1].starts_with("base") && lines[1].contains("2.0000 ") && !lines[1].contains('*'), "{text}");
        assert!(lines[2].contains("1.5000*") && lines[2].contains("0.6667*") && lines[2].contains("3 "), "{text}");
    }
}
