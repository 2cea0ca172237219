//! Command-line front end. Every subcommand runs on the same engine the studio uses; without a subcommand
//! the studio opens.

mod bench;
mod data;
mod data_parallel;
mod eval;
mod grpo_flags;
pub mod hub;
mod inference;
mod inspect;
mod preference_flags;
mod rank_bench;
mod runs;
mod runtime;
mod train;

use clap::{Args, Parser, Subcommand};
use prelude::*;

/// Re-exports the CLI modules share.
mod prelude {
    pub use crate::engine::device::{DTypeChoice, DeviceChoice};
    pub use crate::engine::model::LoadedModel;
}

#[derive(Debug, Parser)]
#[command(name = "metal-candle", version, about = "LoRA fine-tuning studio and CLI on Candle")]
#[command(args_conflicts_with_subcommands = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Studio options (only without a subcommand).
    #[command(flatten)]
    pub studio: StudioArgs,
    /// Kernel and BLAS switches, for every subcommand and the studio.
    #[command(flatten)]
    pub runtime: runtime::RuntimeArgs,
}

/// Options of the studio, which opens when no subcommand is given.
#[derive(Debug, Clone, Default, Args)]
pub struct StudioArgs {
    /// Open this model in the studio: a Hugging Face model folder or a .gguf file.
    #[arg(long)]
    pub model: Option<std::path::PathBuf>,
    /// Open this dataset in the studio: a .jsonl, .json or .parquet file, or a folder of them (train.jsonl, a
    /// Hub dataset's data/train-*.parquet, ...).
    #[arg(long)]
    pub data: Option<std::path::PathBuf>,
    /// Runs folder (default: the remembered one, or ./runs).
    #[arg(long)]
    pub runs: Option<std::path::PathBuf>,
    /// Page to show first: model, dataset, lora, train, checkpoints, chat, rank.
    #[arg(long, hide = true)]
    pub page: Option<String>,
    /// Start training as soon as the model and dataset are ready.
    #[arg(long, hide = true)]
    pub train: bool,
    /// Record frame times for SECS seconds once training streams, print a JSON report, and close.
    #[arg(long, hide = true, value_name = "SECS")]
    pub measure_frames: Option<f64>,
    /// Write the --measure-frames report to this file instead of stdout.
    #[arg(long, hide = true)]
    pub measure_out: Option<std::path::PathBuf>,
    /// Neither read nor write remembered settings.
    #[arg(long, hide = true)]
    pub ephemeral: bool,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Describe a model: architecture, parameters, layers, context, dtype, device, chat template.
    Info(inference::InfoArgs),
    /// Generate text, streaming it as it is produced.
    Generate(inference::GenerateArgs),
    /// Per-token log-probabilities of a text under the model.
    Score(inference::ScoreArgs),
    /// LoRA fine-tuning; writes a run folder with checkpoints and metrics.
    Train(Box<train::TrainArgs>),
    /// Check a dataset: each split's files, detected format, columns, rows and problems, and with --model token
    /// lengths and truncation (the dataset page's report).
    Data(data::DataArgs),
    /// Export a checkpoint: PEFT or mlx-lm adapter, merged model folder, GGUF (merged, quantized), llama.cpp LoRA GGUF, Ollama folder.
    Export(train::ExportArgs),
    /// The adapter X-ray: per adapted module the singular values of its update, its norm (also relative to the
    /// frozen weight), its energy ranks, and a rank recommendation.
    Inspect(inspect::InspectArgs),
    /// Evaluate the base model, adapters or a run's checkpoints on a dataset: loss, generated answers, multiple choice.
    Eval(Box<eval::EvalArgs>),
    /// Benchmarks: generation, training and LoRA micro-benchmarks.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// What to paste into a bug report: build, OS, devices and dtypes, memory, BLAS, which kernel each op uses.
    Doctor(DoctorArgs),
    /// List the models on this machine (the studio's scan): the Hugging Face cache, ./models and --dir folders,
    /// each with its family, or why it cannot be run.
    Models(ModelsArgs),
    /// The Hugging Face Hub: search, download into the shared cache, store a token.
    #[command(subcommand)]
    Hub(hub::HubCommand),
    /// Runs in a runs folder: list, show side by side, rename, note, delete.
    #[command(subcommand)]
    Runs(runs::RunsCommand),
}

#[derive(Debug, Args)]
pub struct ModelsArgs {
    /// More folders (or .gguf files) to look in, besides the Hugging Face cache and ./models.
    #[arg(long = "dir")]
    pub dirs: Vec<std::path::PathBuf>,
    /// The Hugging Face hub cache (default: $HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub).
    #[arg(long)]
    pub hf_cache: Option<std::path::PathBuf>,
    /// Print the list as JSON.
    #[arg(long)]
    pub json: bool,
}

fn models(args: &ModelsArgs) -> anyhow::Result<()> {
    let cache = args.hf_cache.clone().or_else(crate::worker::default_hf_cache_dir);
    let mut dirs = vec![std::path::PathBuf::from("models")];
    dirs.extend(args.dirs.iter().cloned());
    let found = crate::worker::scan_models(cache.as_deref(), &dirs);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&found)?);
        return Ok(());
    }
    println!("{:<48} {:<12} {:<12} {:>10}  found in", "name", "family", "format", "size");
    for m in &found {
        let family = m.family.as_deref().unwrap_or("-");
        let size = format!("{:.1} MiB", m.size_bytes as f64 / (1u64 << 20) as f64);
        println!("{:<48} {family:<12} {:<12} {size:>10}  {}", m.name, m.format, m.origin);
        if let Some(why) = &m.unsupported {
            println!("    not supported: {why}");
        }
    }
    if found.is_empty() {
        let cache = cache.map(|c| c.display().to_string()).unwrap_or_else(|| "no Hugging Face cache".into());
        println!("(none; searched {cache} and ./models)");
    }
    Ok(())
}

#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

fn doctor(args: &DoctorArgs) -> anyhow::Result<()> {
    let report = crate::engine::doctor::report();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{report}");
    }
    Ok(())
}

/// Load a model, showing its progress on one updating stderr line when stderr is a terminal (bytes of the
/// total and time left, from the loader's progress reports).
pub fn load_model_showing_progress(
    path: &std::path::Path,
    placement: &crate::engine::device::Placement,
    options: &crate::engine::model::LoadOptions,
) -> anyhow::Result<LoadedModel> {
    use anyhow::Context;
    use std::io::IsTerminal;
    let progress: Option<crate::engine::model::LoadProgressFn> = std::io::stderr().is_terminal().then(|| {
        let last = std::sync::Mutex::new(std::time::Instant::now());
        let report = move |p: &crate::engine::model::LoadProgress| {
            let done = p.bytes_done >= p.bytes_total;
            let Ok(mut last) = last.lock() else { return };
            // About ten updates a second, and always the last one.
            if done || last.elapsed().as_millis() >= 100 {
                *last = std::time::Instant::now();
                eprint!("\rloading weights: {:>3.0}% ({})\x1b[K", 100.0 * p.fraction(), p.describe());
                if done {
                    eprintln!();
                }
            }
        };
        std::sync::Arc::new(report) as crate::engine::model::LoadProgressFn
    });
    crate::engine::model::load_model_reporting(path, &placement.device, placement.dtype, options, progress)
        .with_context(|| format!("loading model {}", path.display()))
}

/// The top-p / top-k cut of sampling, shared by `generate`, `bench generate` and `bench sample`, with the
/// engine's defaults.
#[derive(Debug, Clone, Args)]
pub struct SamplingCutArgs {
    #[arg(long, default_value_t = crate::engine::sampler::SamplingParams::default().top_p, allow_negative_numbers = true)]
    pub top_p: f64,
    /// 0 means off.
    #[arg(long, default_value_t = crate::engine::sampler::SamplingParams::default().top_k, allow_negative_numbers = true)]
    pub top_k: usize,
}

impl SamplingCutArgs {
    /// Sampling at `temperature` with this cut, the other settings from `rest`.
    pub fn params(
        &self,
        temperature: f64,
        rest: crate::engine::sampler::SamplingParams,
    ) -> crate::engine::sampler::SamplingParams {
        crate::engine::sampler::SamplingParams { temperature, top_p: self.top_p, top_k: self.top_k, ..rest }
    }
}

/// Options shared by every command that loads a model.
#[derive(Debug, Clone, Args)]
pub struct ModelArgs {
    /// A Hugging Face model folder, a .gguf file, or a Hub repo id (ORG/NAME[@REVISION][:QUANT]), read from the
    /// cache or downloaded.
    #[arg(long)]
    pub model: std::path::PathBuf,
    /// A LoRA adapter folder (ours or PEFT's) to apply.
    #[arg(long)]
    pub adapter: Option<std::path::PathBuf>,
    /// auto | cpu | cuda | metal
    #[arg(long, default_value = "auto")]
    pub device: DeviceChoice,
    /// auto | f32 | f16 | bf16 (auto: f32 on the CPU, bf16 on GPUs that run it)
    #[arg(long, default_value = "auto")]
    pub dtype: DTypeChoice,
    /// Base weights: none (dense) | keep (a GGUF's own quantized types) | q8_0 | q6k | q5k | q4k | q4_1 | q4_0
    /// (quantized at load; the head is then held in Q6_K and untied embeddings in Q4_K as in llama.cpp's Q4_K_M,
    /// both in Q8_0 with q8_0 and keep; norms stay dense).
    #[arg(long, default_value = "none", value_name = "none|keep|q8_0|q6k|q5k|q4k|q4_1|q4_0")]
    pub quantize: crate::engine::model::BaseQuant,
}

impl ModelArgs {
    /// Load the model (and adapter) the arguments name.
    pub fn load(&self) -> anyhow::Result<LoadedModel> {
        use anyhow::Context;
        let placement = crate::engine::device::setup(self.device, self.dtype)?;
        print_placement_notes(&placement);
        let options = crate::engine::model::LoadOptions { quantize: self.quantize };
        let source = hub::resolve_path(&self.model, crate::engine::hub::RepoKind::Model)?;
        let model = load_model_showing_progress(&source.path, &placement, &options)?;
        let mut model = model;
        if let Some(adapter) = &self.adapter {
            if let Some(warning) = crate::engine::checkpoint::base_mismatch(adapter, &model)? {
                eprintln!("warning: {warning}");
            }
            let summary = crate::engine::checkpoint::load_adapter(&mut model.model, adapter)
                .with_context(|| format!("loading adapter {}", adapter.display()))?;
            eprintln!(
                "adapter {}: rank {}, alpha {}{}, {} linears ({})",
                adapter.display(),
                summary.rank,
                summary.alpha,
                if summary.use_dora { ", DoRA" } else { "" },
                summary.adapted_linears,
                summary.targets.join(", ")
            );
        }
        Ok(model)
    }
}

/// Tell the user when the device or dtype is not what they asked for, and why (e.g. Metal listed no GPU).
pub(crate) fn print_placement_notes(placement: &crate::engine::device::Placement) {
    if let Some(note) = &placement.device_note {
        eprintln!("note: {note}");
    }
    if let crate::engine::device::DTypeReason::Fallback { .. } = placement.dtype_reason {
        eprintln!("note: {}; using {}", placement.dtype_reason, crate::engine::device::dtype_name(placement.dtype));
    }
}

/// Run a parsed command line.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    runtime::init(&cli.runtime)?;
    match cli.command {
        None => open_studio(cli.studio),
        Some(Command::Info(a)) => inference::info(&a),
        Some(Command::Generate(a)) => inference::generate(&a),
        Some(Command::Score(a)) => inference::score(&a),
        Some(Command::Train(a)) => train::train(&a),
        Some(Command::Export(a)) => train::export(&a),
        Some(Command::Inspect(a)) => inspect::inspect(&a),
        Some(Command::Data(a)) => data::data(&a),
        Some(Command::Eval(a)) => eval::eval(&a),
        Some(Command::Bench(b)) => bench::run(b),
        Some(Command::Doctor(a)) => doctor(&a),
        Some(Command::Models(a)) => models(&a),
        Some(Command::Hub(c)) => hub::run(c),
        Some(Command::Runs(c)) => runs::run(c),
    }
}

#[cfg(feature = "studio")]
fn open_studio(args: StudioArgs) -> anyhow::Result<()> {
    use crate::studio::{Page, StudioOptions};
    let page = match args.page.as_deref() {
        Some(name) => Some(Page::from_name(name).ok_or_else(|| anyhow::anyhow!("unknown page `{name}`"))?),
        None => None,
    };
    crate::studio::run(StudioOptions {
        model: args.model,
        data: args.data,
        runs_dir: args.runs,
        page,
        discover_defaults: true,
        start_training: args.train || args.measure_frames.is_some(),
        measure_frames_secs: args.measure_frames,
        measure_out: args.measure_out,
        persist: !args.ephemeral,
        ..Default::default()
    })
}

#[cfg(not(feature = "studio"))]
fn open_studio(args: StudioArgs) -> anyhow::Result<()> {
    let _ = args;
    anyhow::bail!("this build has no studio (built without the `studio` feature); see --help for subcommands")
}
