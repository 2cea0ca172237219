//! `train` and `export`: LoRA fine-tuning from the command line, printing the same events the studio plots.

use crate::engine::device::{DTypeChoice, DeviceChoice};
use crate::engine::distributed::RankSpec;
use crate::engine::export::{ExportFormat, ExportRequest, GgufQuant};
use crate::engine::model::LoadOptions;
use crate::engine::train::run_folder::{self, RunManifest};
use crate::engine::train::{self, ModelLimits, Schedule, TrainConfig, TrainControl, TrainEvent};
use clap::Args;
use std::io::Write;
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct TrainArgs {
    /// A Hugging Face model folder or a .gguf file.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// A .jsonl, .json or .parquet file, or a folder of them (train/valid/test.jsonl, a Hugging Face dataset
    /// repo's data/train-00000-of-00001.parquet, ...).
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// How dataset rows are read: auto detects each file's format (recorded in run.json, kept on --resume).
    #[arg(long, value_name = "auto|chat|sharegpt|alpaca|completions|text|preference|prompts")]
    pub format: Option<crate::engine::data::FormatChoice>,
    /// Read dataset columns as a format's fields, e.g. prompt=question,completion=answer or
    /// conversations=dialog (recorded in run.json, kept on --resume).
    #[arg(long, value_name = "FIELD=COLUMN,...")]
    pub columns: Option<crate::engine::data::ColumnMap>,
    /// Runs folder; the run is written to OUT/<name>/.
    #[arg(long)]
    pub out: Option<PathBuf>,
    #[arg(long)]
    pub name: Option<String>,
    #[arg(long, allow_negative_numbers = true)]
    pub rank: Option<usize>,
    #[arg(long, allow_negative_numbers = true)]
    pub alpha: Option<f64>,
    #[arg(long, allow_negative_numbers = true)]
    pub dropout: Option<f32>,
    /// Comma-separated: q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj (phi3:
    /// qkv_proj,o_proj,gate_up_proj,down_proj) or all-linear (every linear the model has).
    #[arg(long)]
    pub targets: Option<crate::engine::lora::Targets>,
    /// Adapt only the last N layers.
    #[arg(long, allow_negative_numbers = true)]
    pub layers: Option<usize>,
    #[arg(long)]
    pub rslora: bool,
    #[command(flatten)]
    pub preference: super::preference_flags::PreferenceFlags,
    #[command(flatten)]
    pub grpo: super::grpo_flags::GrpoFlags,
    /// DoRA: train a magnitude per output row on top of the LoRA direction (PEFT's use_dora).
    #[arg(long)]
    pub dora: bool,
    #[arg(long, conflicts_with = "epochs", allow_negative_numbers = true)]
    pub iters: Option<usize>,
    #[arg(long, allow_negative_numbers = true)]
    pub epochs: Option<f64>,
    #[arg(long, allow_negative_numbers = true)]
    pub batch_size: Option<usize>,
    #[arg(long, allow_negative_numbers = true)]
    pub seq_len: Option<usize>,
    /// Pack several examples into each row of up to --seq-len tokens, without padding (SFT); attention never
    /// crosses from one example to the next and positions restart at each. --batch-size then counts rows.
    #[arg(long)]
    pub packing: bool,
    #[arg(long, allow_negative_numbers = true)]
    pub lr: Option<f64>,
    /// constant | linear | cosine
    #[arg(long)]
    pub schedule: Option<Schedule>,
    /// Warmup steps (default: 10, or a tenth of a run of 10 steps or fewer).
    #[arg(long, allow_negative_numbers = true)]
    pub warmup: Option<usize>,
    #[arg(long, allow_negative_numbers = true)]
    pub grad_accum: Option<usize>,
    /// Clip the gradient norm to this (0: no clipping).
    #[arg(long, allow_negative_numbers = true)]
    pub max_grad_norm: Option<f64>,
    #[arg(long, allow_negative_numbers = true)]
    pub weight_decay: Option<f64>,
    #[arg(long, allow_negative_numbers = true)]
    pub val_every: Option<usize>,
    #[arg(long, allow_negative_numbers = true)]
    pub save_every: Option<usize>,
    /// Stop after N evaluations in a row without improvement of the validation loss (0: off; needs a
    /// validation split and --val-every).
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub early_stopping_patience: Option<usize>,
    /// How much lower than the best a validation loss must be to count as an improvement (default 0).
    #[arg(long, value_name = "D", allow_negative_numbers = true)]
    pub early_stopping_min_delta: Option<f64>,
    /// Keep only the newest N checkpoints plus the best one (default: keep all).
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub save_total_limit: Option<usize>,
    #[arg(long, allow_negative_numbers = true)]
    pub seed: Option<u64>,
    /// Continue from a checkpoint folder (runs/<name>/checkpoint-<step>).
    #[arg(long)]
    pub resume: Option<PathBuf>,
    /// With --resume: continue even on a base model other than the one the checkpoint was trained on.
    #[arg(long, requires = "resume")]
    pub force_base: bool,
    /// Settings from a TOML file (run.json field names); flags override it.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Skip malformed dataset rows instead of failing.
    #[arg(long)]
    pub skip_invalid_rows: bool,
    #[arg(long)]
    pub train_on_prompt: bool,
    #[arg(long)]
    pub device: Option<DeviceChoice>,
    /// auto | f32 | f16 | bf16 (auto: f32 on the CPU, bf16 on GPUs that run it)
    #[arg(long)]
    pub dtype: Option<DTypeChoice>,
    /// Base weights: none (dense) | keep (a GGUF's own quantized types) | q8_0 | q6k | q5k | q4k | q4_1 | q4_0
    /// (quantized at load, QLoRA).
    #[arg(long, value_name = "none|keep|q8_0|q6k|q5k|q4k|q4_1|q4_0")]
    pub quantize: Option<crate::engine::model::BaseQuant>,
    /// Gradient checkpointing: keep each layer's input only and recompute the layer in the backward (less
    /// memory, about a third more compute); offload: on, with those inputs in pinned host memory on a CUDA GPU
    /// (copied while the layers compute; long contexts); auto: on when the memory estimate says the run would not fit.
    #[arg(long, value_name = "on|off|offload|auto")]
    pub checkpointing: Option<crate::engine::train::Checkpointing>,
    /// Print one JSON event per line.
    #[arg(long)]
    pub json: bool,
    /// Data-parallel training on N GPUs of this host: N processes, one per GPU (cuda:0..N-1), each training its
    /// share of every batch (--batch-size is the whole step's), gradients summed with NCCL. With --device cpu, N
    /// CPU processes (tests the path). Under torchrun or SLURM, leave it out: RANK, WORLD_SIZE, ... are read.
    #[arg(long, value_name = "N")]
    pub gpus: Option<usize>,
    /// In a data-parallel run, sum the gradients on the host over TCP instead of with NCCL (a host without
    /// libnccl; ranks sharing one GPU). Every rank must be given it.
    #[arg(long)]
    pub sum_on_host: bool,
    /// Read `stop`, `pause` and `resume` lines from standard input (the studio drives a multi-GPU run this way).
    #[arg(long, hide = true)]
    pub control_stdin: bool,
}

impl TrainArgs {
    /// Settings: defaults, then the TOML file, then the checkpoint's run.json when resuming, then flags.
    pub fn to_config(&self) -> anyhow::Result<TrainConfig> {
        let mut c = match &self.config {
            Some(path) => TrainConfig::from_toml_file(path)?,
            None => TrainConfig::default(),
        };
        if let Some(ckpt) = &self.resume {
            let ckpt = run_folder::absolute_path(ckpt)?;
            let run_dir = run_folder::run_dir_of_checkpoint(&ckpt);
            if run_dir.join(run_folder::RUN_CONFIG).exists() {
                let manifest = RunManifest::read(&run_dir)?;
                c = manifest.config.clone();
                if self.model.is_none() {
                    // A base that moved since is named, with the flag that points the resume at it.
                    manifest.recorded_model(&run_dir)?;
                }
            }
            c.resume = Some(ckpt);
        }
        c.force_base = self.force_base;
        macro_rules! set {
            ($field:expr, $value:expr) => {
                if let Some(v) = $value.clone() {
                    $field = v;
                }
            };
        }
        set!(c.model, self.model);
        set!(c.data, self.data);
        set!(c.data_format, self.format);
        set!(c.data_columns, self.columns);
        set!(c.out, self.out);
        if self.name.is_some() {
            c.run_name = self.name.clone();
        }
        set!(c.lora.rank, self.rank);
        set!(c.lora.alpha, self.alpha);
        set!(c.lora.dropout, self.dropout);
        if let Some(t) = &self.targets {
            c.lora.targets = t.clone();
        }
        if self.layers.is_some() {
            c.lora.layers = self.layers;
        }
        c.lora.use_rslora |= self.rslora;
        if let Some(method) = self.preference.method {
            // A resumed run keeps its method: its optimizer state and best loss belong to it.
            if c.resume.is_some() && method != c.method {
                anyhow::bail!(
                    "the run being resumed trains with {}; it cannot continue as {} (start a new run instead)",
                    c.method.name(),
                    method.name()
                );
            }
            c.method = method;
        }
        if c.method.is_reinforcement() {
            // GRPO's beta weighs its KL term (default 0); its other settings have their own flags.
            set!(c.grpo.beta, self.preference.beta);
            if self.preference.loss.is_some() || self.preference.label_smoothing.is_some() {
                anyhow::bail!(
                    "--loss and --label-smoothing are DPO's; GRPO's loss is --loss-type grpo|bnpo|dr_grpo|dapo"
                );
            }
        } else {
            let preference = self.preference.over(c.preference());
            (c.beta, c.preference_loss, c.label_smoothing) =
                (preference.beta, preference.loss, preference.label_smoothing);
        }
        self.grpo.apply(&mut c.grpo);
        self.grpo.check(c.method, &c.grpo)?;
        c.lora.dora |= self.dora;
        if self.iters.is_some() {
            c.iters = self.iters;
            c.epochs = None;
        }
        if self.epochs.is_some() {
            c.epochs = self.epochs;
            c.iters = None;
        }
        set!(c.batch_size, self.batch_size);
        set!(c.seq_len, self.seq_len);
        c.packing |= self.packing;
        set!(c.lr, self.lr);
        set!(c.schedule, self.schedule);
        if self.warmup.is_some() {
            c.warmup = self.warmup;
        }
        set!(c.grad_accum, self.grad_accum);
        if self.max_grad_norm.is_some() {
            // 0 turns clipping off; a negative or NaN norm is left for validation to refuse.
            c.max_grad_norm = self.max_grad_norm.filter(|n| *n != 0.0);
        }
        set!(c.weight_decay, self.weight_decay);
        set!(c.val_every, self.val_every);
        set!(c.save_every, self.save_every);
        set!(c.early_stopping_patience, self.early_stopping_patience);
        set!(c.early_stopping_min_delta, self.early_stopping_min_delta);
        if self.save_total_limit.is_some() {
            c.save_total_limit = self.save_total_limit;
        }
        set!(c.seed, self.seed);
        set!(c.device, self.device);
        set!(c.dtype, self.dtype);
        set!(c.quantize, self.quantize);
        set!(c.checkpointing, self.checkpointing);
        c.skip_invalid_rows |= self.skip_invalid_rows;
        c.train_on_prompt |= self.train_on_prompt;
        if c.model.as_os_str().is_empty() {
            anyhow::bail!("--model is required (or `model` in --config)");
        }
        if c.data.as_os_str().is_empty() {
            anyhow::bail!("--data is required (or `data` in --config)");
        }
        c.validate()?;
        Ok(c)
    }
}

/// A preference step's headline numbers for a progress line: reward accuracy and margin.
fn grpo_summary(m: &crate::engine::train::grpo::GrpoMetrics) -> String {
    format!(" reward {:.3} ± {:.3} len {:.0}", m.reward_mean, m.reward_std, m.mean_length)
}

/// `text` cut to `chars` characters, with an ellipsis when it was longer.
fn clip_chars(text: &str, chars: usize) -> String {
    match text.char_indices().nth(chars) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_string(),
    }
}

fn preference_summary(m: &crate::engine::train::preference::PreferenceMetrics) -> String {
    format!(" acc {:.2} margin {:.3}", m.rewards_accuracies, m.rewards_margins)
}

/// `ORG/NAME@COMMIT[:FILE]`: exactly what a run recorded, for a resume on a machine without that path.
fn origin_spec(origin: &crate::engine::hub::HubOrigin) -> PathBuf {
    let file = origin.file.as_ref().map_or(String::new(), |f| format!(":{f}"));
    PathBuf::from(format!("{}@{}{file}", origin.repo, origin.commit))
}

/// Model and dataset given as Hub repo ids become cache paths, their origins recorded for run.json and the
/// adapter's `base_model_name_or_path`. A recorded origin stands in for a recorded path that is not here.
pub(super) fn resolve_sources(config: &mut TrainConfig) -> anyhow::Result<()> {
    use crate::engine::hub::RepoKind;
    for (kind, path, source) in [
        (RepoKind::Model, &mut config.model, &mut config.model_source),
        (RepoKind::Dataset, &mut config.data, &mut config.data_source),
    ] {
        let wanted = match source.as_ref().filter(|_| !path.exists()) {
            Some(origin) => origin_spec(origin),
            None => path.clone(),
        };
        let resolved = super::hub::resolve_path(&wanted, kind)?;
        if resolved.origin.is_some() {
            *path = resolved.path;
            *source = resolved.origin;
        }
    }
    Ok(())
}

pub fn train(args: &TrainArgs) -> anyhow::Result<()> {
    // One rank of a data-parallel run (torchrun, SLURM, --gpus), or the launcher of one.
    let rank = super::data_parallel::rank_from_env()?;
    if let (None, Some(gpus)) = (&rank, args.gpus.filter(|&n| n > 1)) {
        // The settings are checked and Hub sources downloaded once, here, before any rank starts.
        let mut config = args.to_config()?;
        crate::engine::train::require_data_parallel_method(&config)?;
        resolve_sources(&mut config)?;
        return super::data_parallel::launch_ranks(&config, gpus);
    }
    if args.gpus == Some(0) {
        anyhow::bail!("--gpus 0: give the number of GPUs to train on (1 or more)");
    }
    let leader = rank.as_ref().is_none_or(RankSpec::is_leader);
    let mut config = args.to_config()?;
    if config.method.is_reinforcement() {
        // A bad pattern or a missing reward program is refused before the model loads.
        crate::engine::train::grpo::rewards::Rewards::new(&config.grpo.rewards)?;
    }
    resolve_sources(&mut config)?;
    let ordinal = rank.as_ref().map_or(0, |r| r.local_rank);
    config.distributed = rank.map(|r| RankSpec { host_sums: args.sum_on_host, ..r });
    let placement = crate::engine::device::setup_on(config.device, config.dtype, ordinal)?;
    if leader {
        super::print_placement_notes(&placement);
    }
    let options = LoadOptions { quantize: config.quantize };
    let base = super::load_model_showing_progress(&config.model, &placement, &options)?;
    // The engine's one settings check, now against the model (the studio refuses the same, word for word).
    config.validate_for_model(ModelLimits::of(&base.config))?;
    // Memory on the rows the run will see (batches are padded to their longest row, not to --seq-len).
    let plan = crate::engine::estimate::plan_run_memory(&mut config, &base);
    // Every rank of a data-parallel run decides the same; rank 0 says it.
    if let (Some(warning), true) = (&plan.warning, leader) {
        eprintln!("warning: {warning}");
    }
    for note in plan.notes.iter().filter(|_| leader) {
        eprintln!("note: {note}");
    }
    let control = TrainControl::default();
    // Ctrl-C or SIGTERM: stop after the current step and save a final checkpoint; a second one exits at once.
    // The other ranks of a data-parallel run stop when the leader does (after the same step), not on their own.
    if crate::stop_signals::install() && leader {
        let ctrl = control.clone();
        crate::stop_signals::forward(move || ctrl.request_stop());
    }
    if args.control_stdin && leader {
        super::data_parallel::follow_control_lines(control.clone());
    }
    let json = args.json;
    let mut printer = ProgressPrinter::default();
    let result = train::run_training(&config, &base, &control, &mut |event| {
        // The leader reports the run; another rank's failure is its exit's error message.
        if !leader {
            return;
        }
        if json {
            if let Ok(line) = serde_json::to_string(&event) {
                println!("{line}");
            }
        } else {
            printer.print(&event);
        }
    });
    result.map(|dir| {
        if !json && leader {
            eprintln!("run folder: {}", dir.display());
        }
    })?;
    Ok(())
}

/// Human-readable progress: a one-line bar refreshed per step, plus lines for evals and checkpoints.
#[derive(Default)]
struct ProgressPrinter {
    total_steps: usize,
}

impl ProgressPrinter {
    fn print(&mut self, event: &TrainEvent) {
        let mut err = std::io::stderr();
        match event {
            TrainEvent::Started {
                run_dir,
                trainable_params,
                total_steps,
                train_examples,
                valid_examples,
                truncated_examples,
                start_step,
                notes,
                ..
            } => {
                for note in notes {
                    // Doctor findings arrive as "warning: ..."; everything else is a note.
                    let label = if note.starts_with("warning: ") { "" } else { "note: " };
                    let _ = writeln!(err, "{label}{note}");
                }
                self.total_steps = *total_steps;
                let _ = writeln!(
                    err,
                    "training {} ({} trainable params) on {train_examples} examples ({valid_examples} validation, {truncated_examples} truncated), {total_steps} steps{}",
                    run_dir.display(),
                    trainable_params,
                    if *start_step > 0 { format!(", resuming at step {start_step}") } else { String::new() }
                );
            }
            TrainEvent::Step { step, total_steps, loss, lr, tokens_per_sec, eta_secs, preference, grpo, .. } => {
                let width = 30;
                let filled = (step * width / (*total_steps).max(1)).min(width);
                let rewards = match (preference, grpo) {
                    (Some(p), _) => preference_summary(p),
                    (_, Some(g)) => grpo_summary(g),
                    _ => String::new(),
                };
                let _ = write!(
                    err,
                    "\r[{}{}] {step}/{total_steps} loss {loss:.4}{rewards} lr {lr:.2e} {tokens_per_sec:.0} tok/s ETA {} ",
                    "#".repeat(filled),
                    "-".repeat(width - filled),
                    format_secs(*eta_secs)
                );
                if step == total_steps {
                    let _ = writeln!(err);
                }
            }
            TrainEvent::Eval { step, grpo: Some(g), best, .. } => {
                let best = if *best { ", new best" } else { "" };
                let _ = writeln!(
                    err,
                    "\nstep {step}: validation reward {:.4} (greedy, mean length {:.0}{best})",
                    g.reward_mean, g.mean_length
                );
            }
            TrainEvent::Eval { step, val_loss, perplexity, best, preference, .. } => {
                let best = if *best { ", new best" } else { "" };
                let rewards = preference.as_ref().map_or(String::new(), preference_summary);
                let _ = writeln!(
                    err,
                    "\nstep {step}: validation loss {val_loss:.4}{rewards} (perplexity {perplexity:.2}{best})"
                );
            }
            TrainEvent::Samples { step, samples } => {
                let _ = writeln!(err);
                for s in samples.iter().take(2) {
                    let one_line = |text: &str| text.split_whitespace().collect::<Vec<_>>().join(" ");
                    let _ = writeln!(
                        err,
                        "step {step} sample (reward {:.2}): {} => {}",
                        s.reward,
                        clip_chars(&one_line(&s.prompt), 60),
                        clip_chars(&one_line(&s.completion), 100)
                    );
                }
            }
            TrainEvent::CheckpointSaved { step, path } => {
                let _ = writeln!(err, "\nstep {step}: saved {}", path.display());
            }
            TrainEvent::CheckpointsRemoved { paths, .. } => {
                let names: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
                let _ =
                    writeln!(err, "removed {} (--save-total-limit keeps the newest and the best)", names.join(", "));
            }
            TrainEvent::Paused { step } => {
                let _ = writeln!(err, "\npaused at step {step}");
            }
            TrainEvent::Resumed { step } => {
                let _ = writeln!(err, "resumed at step {step}");
            }
            TrainEvent::Finished { step, final_loss, final_val_loss, stopped_early, elapsed_secs, early_stop } => {
                let _ = writeln!(
                    err,
                    "\n{} at step {step} after {}: train loss {}, validation loss {}",
                    if *stopped_early { "stopped" } else { "finished" },
                    format_secs(*elapsed_secs),
                    final_loss.map(|l| format!("{l:.4}")).unwrap_or("-".into()),
                    final_val_loss.map(|l| format!("{l:.4}")).unwrap_or("-".into()),
                );
                if let Some(early) = early_stop {
                    let _ = writeln!(err, "{}", early.reason());
                }
            }
            // The error itself is printed once, by `main`, when `train` returns it.
            TrainEvent::Failed { step, .. } => {
                let _ = writeln!(err, "\nfailed at step {step}");
            }
        }
    }
}

fn format_secs(secs: f64) -> String {
    let s = secs.max(0.0).round() as u64;
    if s >= 3600 {
        format!("{}h{:02}m", s / 3600, s % 3600 / 60)
    } else {
        format!("{}m{:02}s", s / 60, s % 60)
    }
}

#[derive(Debug, Args)]
pub struct ExportArgs {
    /// A checkpoint folder (runs/<name>/checkpoint-<step>). Without one, gguf and ollama export the base model.
    #[arg(long)]
    pub checkpoint: Option<PathBuf>,
    /// peft | mlx-lm | merged | gguf | gguf-lora | ollama
    #[arg(long, default_value = "mlx-lm")]
    pub format: ExportFormat,
    /// GGUF quantization for gguf and ollama (default f16): f16 | bf16 | q8_0 | q4_k_m | q5_k_m | q6_k
    #[arg(long)]
    pub quant: Option<GgufQuant>,
    /// A folder (peft, mlx-lm, merged, ollama) or a file (gguf, gguf-lora).
    #[arg(long)]
    pub out: PathBuf,
    /// The base model (default: the one in the run's run.json).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Export onto a base model the adapter was not trained on (its fingerprint differs).
    #[arg(long)]
    pub force_base: bool,
    /// Replace an existing --out (a file, or a folder that is not empty).
    #[arg(long)]
    pub overwrite: bool,
}

pub fn export(args: &ExportArgs) -> anyhow::Result<()> {
    let quant = args.format.quant_for(args.quant)?;
    let model = match (&args.model, &args.checkpoint) {
        (Some(m), _) => super::hub::resolve_path(m, crate::engine::hub::RepoKind::Model)?.path,
        (None, None) => anyhow::bail!("pass --checkpoint, or --model to export the base model alone"),
        (None, Some(checkpoint)) => {
            let run_dir = run_folder::run_dir_of_checkpoint(checkpoint);
            if !run_dir.join(run_folder::RUN_CONFIG).exists() {
                anyhow::bail!("no run.json next to {}; pass --model", checkpoint.display());
            }
            let manifest = RunManifest::read(&run_dir)?;
            // A base that moved since is named, with the flag that points the export at it (a peft copy reads none).
            if args.format.reads_base() {
                manifest.recorded_model(&run_dir)?
            } else {
                manifest.model
            }
        }
    };
    let checkpoint = args.checkpoint.as_deref().map(run_folder::absolute_path).transpose()?;
    let request = ExportRequest {
        checkpoint,
        format: args.format,
        quant,
        out: args.out.clone(),
        base_model: model,
        allow_other_base: args.force_base,
        overwrite: args.overwrite,
    };
    // The doctor reads the base model's files; a peft copy needs none, so a base that is gone does not stop it.
    if args.format.reads_base() || request.base_model.exists() {
        for warning in crate::engine::export::export_stop_warnings(&request)? {
            eprintln!("warning: {warning}");
        }
    }
    let mut last_shown = None;
    let outcome = crate::engine::export::export_with(&request, &mut |p| {
        let percent = 100 * p.done / p.total.max(1);
        if last_shown != Some(percent / 10) {
            last_shown = Some(percent / 10);
            eprintln!("[{percent:>3}%] {}", p.what);
        }
    })?;
    let what = match &args.checkpoint {
        Some(c) => c.display().to_string(),
        None => format!("{} (base model)", request.base_model.display()),
    };
    let quant = if args.format.uses_quant() { format!(", {quant}") } else { String::new() };
    eprintln!(
        "exported {what} ({}{quant}) to {} ({:.1} MB)",
        args.format.as_str(),
        outcome.path.display(),
        outcome.size_bytes as f64 / 1e6
    );
    Ok(())
}
