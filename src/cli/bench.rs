//! `bench ...`: speed measurements that print numbers (and JSON for scripts).

use super::ModelArgs;
use crate::engine::bench;
use crate::engine::device::device_name;
use clap::{Args, Subcommand};

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Prefill and decode tokens/s of generation (greedy unless --temperature is above 0).
    Generate(GenerateBenchArgs),
    /// Training step time, tokens/s and peak memory on random batches.
    Train(TrainBenchArgs),
    /// GRPO step time on random prompts: generation of every completion to --max-new-tokens, a synthetic reward,
    /// one optimizer step (DAPO loss, beta 0); scripts/bench_trl_grpo.py times TRL's GRPOTrainer on the same work.
    Grpo(GrpoBenchArgs),
    /// LoRA layer forward/backward times across hidden sizes and ranks, plus softmax and norms.
    Lora(LoraBenchArgs),
    /// Time of one sampled draw over a vocabulary of random logits (the host side of sampled decoding).
    Sample(SampleBenchArgs),
    /// The rank explorer: equal-budget probe trainings at several ranks, at the settings' LoRA scale.
    Ranks(super::rank_bench::RankBenchArgs),
    /// Multiple-choice scoring throughput (items/s), from reading the rows to the metrics, as `eval --task
    /// multiple-choice` runs it (scripts/bench_mc_lmeval.sh runs lm-eval on the same items).
    MultipleChoice(McBenchArgs),
}

#[derive(Debug, Args)]
pub struct McBenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Multiple-choice rows: a .jsonl/.json/.parquet file or a dataset folder (with --split).
    #[arg(long)]
    pub data: std::path::PathBuf,
    /// The split of a dataset folder.
    #[arg(long, value_enum, default_value = "test")]
    pub split: super::eval::SplitArg,
    /// Score only the first N rows.
    #[arg(long)]
    pub limit: Option<usize>,
    /// Sequences per forward pass (whole rows; at least one row).
    #[arg(long, default_value_t = 8)]
    pub batch_size: usize,
    /// Longest sequence in tokens (longer ones are cut from the left, as lm-eval's max_length does).
    #[arg(long, default_value_t = 2048)]
    pub seq_len: usize,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct SampleBenchArgs {
    /// Vocabulary size (Llama 3: 128256; SmolLM2: 49152).
    #[arg(long, default_value_t = 128_256)]
    pub vocab: usize,
    /// Standard deviations of the normal logits, comma-separated (small: flat, large: peaked).
    #[arg(long, value_delimiter = ',', default_value = "0.1,3,8")]
    pub spread: Vec<f32>,
    #[arg(long, default_value_t = 0.7)]
    pub temperature: f64,
    #[command(flatten)]
    pub cut: super::SamplingCutArgs,
    #[arg(long, default_value_t = 200)]
    pub draws: usize,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct TrainBenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[arg(long, default_value_t = 4)]
    pub batch_size: usize,
    #[arg(long, default_value_t = 128)]
    pub seq_len: usize,
    #[arg(long, default_value_t = 8)]
    pub rank: usize,
    #[arg(long)]
    pub alpha: Option<f64>,
    #[arg(long, default_value = "q_proj,v_proj")]
    pub targets: crate::engine::lora::Targets,
    /// Adapter dropout probability (0: none), as `train --dropout`.
    #[arg(long, default_value_t = 0.0)]
    pub dropout: f32,
    #[arg(long, default_value_t = 5)]
    pub steps: usize,
    #[arg(long, default_value_t = 1)]
    pub warmup: usize,
    /// Gradient checkpointing: on | off | offload (on, the kept inputs in host memory on CUDA) | auto (auto: on when
    /// the memory estimate does not fit).
    #[arg(long, default_value = "off", value_name = "on|off|offload|auto")]
    pub checkpointing: crate::engine::train::Checkpointing,
    /// sft (random rows) | dpo | orpo (random pairs: --batch-size pairs of two --seq-len sequences, half prompt).
    #[arg(long, default_value = "sft", value_name = "sft|dpo|orpo")]
    pub method: crate::engine::train::Method,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct GrpoBenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Prompts per step (each sampled --num-generations times).
    #[arg(long, default_value_t = 4)]
    pub prompts: usize,
    /// Tokens of every random prompt.
    #[arg(long, default_value_t = 128)]
    pub prompt_len: usize,
    #[arg(long, default_value_t = 8)]
    pub num_generations: usize,
    /// Tokens of every completion (the eos does not end one early).
    #[arg(long, default_value_t = 128)]
    pub max_new_tokens: usize,
    #[arg(long, default_value_t = 8)]
    pub rank: usize,
    #[arg(long)]
    pub alpha: Option<f64>,
    #[arg(long, default_value = "all-linear")]
    pub targets: crate::engine::lora::Targets,
    #[arg(long, default_value_t = 5)]
    pub steps: usize,
    #[arg(long, default_value_t = 1)]
    pub warmup: usize,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct LoraBenchArgs {
    /// auto | cpu | cuda | metal
    #[arg(long, default_value = "auto")]
    pub device: crate::engine::device::DeviceChoice,
    #[arg(long, default_value_t = 10)]
    pub repeats: usize,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct GenerateBenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[arg(long, default_value_t = 128)]
    pub prompt_tokens: usize,
    #[arg(long, default_value_t = 64)]
    pub new_tokens: usize,
    #[arg(long, default_value_t = 3)]
    pub repeats: usize,
    /// 0 means greedy (the default); above 0, tokens are sampled as `generate` samples them.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f64,
    #[command(flatten)]
    pub cut: super::SamplingCutArgs,
    #[arg(long)]
    pub json: bool,
}

pub fn run(cmd: BenchCommand) -> anyhow::Result<()> {
    match cmd {
        BenchCommand::Generate(a) => generate(&a),
        BenchCommand::Train(a) => train(&a),
        BenchCommand::Grpo(a) => grpo(&a),
        BenchCommand::Lora(a) => lora(&a),
        BenchCommand::Sample(a) => sample(&a),
        BenchCommand::Ranks(a) => super::rank_bench::ranks(&a),
        BenchCommand::MultipleChoice(a) => multiple_choice(&a),
    }
}

/// What `bench multiple-choice` measured.
#[derive(Debug, serde::Serialize)]
struct McBench {
    items: usize,
    choices: usize,
    secs: f64,
    items_per_sec: f64,
    acc: f64,
    acc_norm: f64,
}

fn multiple_choice(args: &McBenchArgs) -> anyhow::Result<()> {
    use crate::engine::eval::{run_eval, EvalSpec, EvalTarget, EvalTask};
    let split = args.split.into();
    let m = args.model.load()?;
    // The target re-attaches the adapter to a clone of the base, as `eval` scores it.
    let target = args.model.adapter.as_deref().map(EvalTarget::adapter).unwrap_or_else(EvalTarget::base);
    let spec = EvalSpec {
        task: EvalTask::MultipleChoice,
        data: args.data.clone(),
        split,
        read: Default::default(),
        limit: args.limit,
        seq_len: args.seq_len,
        batch_size: args.batch_size,
        targets: vec![target],
        ..EvalSpec::default()
    };
    let started = std::time::Instant::now();
    let report = run_eval(&spec, &m, &std::sync::atomic::AtomicBool::new(false), &mut |_| {})?;
    let secs = started.elapsed().as_secs_f64();
    let result = &report.targets[0];
    let choices =
        result.rows.as_array().map_or(0, |rows| rows.iter().map(|r| r["choices"].as_array().map_or(0, Vec::len)).sum());
    let r = McBench {
        items: report.rows,
        choices,
        secs,
        items_per_sec: report.rows as f64 / secs,
        acc: result.metric("acc").unwrap_or(f64::NAN),
        acc_norm: result.metric("acc_norm").unwrap_or(f64::NAN),
    };
    let (device, dtype) = device_and_dtype(&m);
    if args.json {
        print_json(&r, device, Some(&dtype))?;
    } else {
        for note in &report.notes {
            eprintln!("note: {note}");
        }
        println!(
            "metal-candle multiple-choice on {device} {dtype}: {} items ({} choices) in {:.2} s: {:.2} items/s, acc \
             {:.4}, acc_norm {:.4} (batch {}, from reading the rows to the metrics)",
            r.items, r.choices, r.secs, r.items_per_sec, r.acc, r.acc_norm, args.batch_size
        );
    }
    Ok(())
}

fn sample(args: &SampleBenchArgs) -> anyhow::Result<()> {
    let sampling = args.cut.params(args.temperature, Default::default());
    sampling.validate(1)?;
    if sampling.temperature <= 0.0 {
        anyhow::bail!("--temperature must be above 0: greedy decoding draws nothing");
    }
    if !(1..=10_000_000).contains(&args.vocab) {
        anyhow::bail!("--vocab must be 1 to 10,000,000, not {}", args.vocab);
    }
    if let Some(bad) = args.spread.iter().find(|s| !(s.is_finite() && **s >= 0.0)) {
        anyhow::bail!("--spread must be finite and not negative, not {bad}");
    }
    for &spread in &args.spread {
        let r = bench::bench_sample(args.vocab, spread, sampling.clone(), args.draws);
        if args.json {
            print_json(&r, "cpu", None)?;
        } else {
            println!(
                "sample over {} logits (spread {spread}), temperature {}, top-p {}, top-k {}: {:.3} ms per draw ({} draws)",
                r.vocab, r.temperature, r.top_p, r.top_k, r.ms_per_draw, r.draws
            );
        }
    }
    Ok(())
}

fn train(args: &TrainBenchArgs) -> anyhow::Result<()> {
    let m = args.model.load()?;
    let lora = crate::engine::train::LoraSettings {
        rank: args.rank,
        alpha: args.alpha.unwrap_or(2.0 * args.rank as f64),
        targets: args.targets.clone(),
        dropout: args.dropout,
        ..Default::default()
    };
    // The same memory rules as `train`: the estimate, auto checkpointing decided against the budget.
    let mut config = crate::engine::train::TrainConfig {
        batch_size: args.batch_size,
        seq_len: args.seq_len,
        lora: lora.clone(),
        checkpointing: args.checkpointing,
        method: args.method,
        ..Default::default()
    };
    config.validate()?;
    let shape = crate::engine::estimate::ModelShape::of_model(&m.model);
    let budget = crate::engine::device::memory_budget_bytes(m.model.device());
    let budget_name = crate::engine::device::memory_budget_name(m.model.device());
    if let Some(note) = crate::engine::estimate::resolve_checkpointing(&shape, &mut config, budget, budget_name) {
        eprintln!("note: {note}");
    }
    if let Some(note) = crate::engine::estimate::offload_host_note(&shape, &config) {
        eprintln!("note: {note}");
    }
    let estimate = crate::engine::estimate::training_memory(&shape, &config);
    let spec = bench::TrainBenchSpec {
        lora,
        batch_size: args.batch_size,
        seq_len: args.seq_len,
        steps: args.steps,
        warmup_steps: args.warmup,
        checkpointing: config.checkpointing,
        method: args.method,
    };
    let r = bench::bench_train(&m, &spec)?;
    let (device, dtype) = device_and_dtype(&m);
    if args.json {
        print_json(&r, device, Some(&dtype))?;
    } else {
        println!(
            "metal-candle train ({}) on {device} {dtype}: batch {}x{}{}, rank {} on {}, checkpointing {}: {:.3} s/step, \
             {:.0} tokens/s, loss {:.4}, peak RSS {} (estimate {:.2} GB)",
            args.method.name(),
            r.batch_size,
            r.seq_len,
            if args.method.is_preference() { " pairs" } else { "" },
            r.rank,
            r.targets.join(","),
            config.checkpointing.name(),
            r.mean_step_secs,
            r.tokens_per_sec,
            r.last_loss,
            r.peak_rss_bytes.map(|b| format!("{:.2} GB", b as f64 / 1e9)).unwrap_or("n/a".into()),
            estimate.total_bytes() as f64 / 1e9
        );
    }
    Ok(())
}

fn grpo(args: &GrpoBenchArgs) -> anyhow::Result<()> {
    let m = args.model.load()?;
    let spec = crate::engine::grpo_bench::GrpoBenchSpec {
        lora: crate::engine::train::LoraSettings {
            rank: args.rank,
            alpha: args.alpha.unwrap_or(2.0 * args.rank as f64),
            targets: args.targets.clone(),
            ..Default::default()
        },
        prompts: args.prompts,
        prompt_len: args.prompt_len,
        num_generations: args.num_generations,
        max_new_tokens: args.max_new_tokens,
        steps: args.steps,
        warmup_steps: args.warmup,
    };
    let r = crate::engine::grpo_bench::bench_grpo(&m, &spec)?;
    let (device, dtype) = device_and_dtype(&m);
    if args.json {
        print_json(&r, device, Some(&dtype))?;
    } else {
        println!(
            "metal-candle grpo on {device} {dtype}: {} prompts x {} of {}+{} tokens, rank {} on {}: {:.3} s/step \
             ({:.3} s generation, {:.3} s training), {:.3} steps/s, {:.0} completion tokens/s, peak RSS {}",
            r.prompts,
            r.num_generations,
            r.prompt_len,
            r.max_new_tokens,
            r.rank,
            r.targets.join(","),
            r.mean_step_secs,
            r.mean_generation_secs,
            r.mean_training_secs,
            r.steps_per_sec,
            r.completion_tokens_per_sec,
            r.peak_rss_bytes.map(|b| format!("{:.2} GB", b as f64 / 1e9)).unwrap_or("n/a".into()),
        );
    }
    Ok(())
}

fn lora(args: &LoraBenchArgs) -> anyhow::Result<()> {
    let device = crate::engine::device::select_device(args.device)?;
    let rows = bench::bench_lora_micro(&device, args.repeats)?;
    if args.json {
        for r in &rows {
            print_json(r, device_name(&device), None)?;
        }
        return Ok(());
    }
    println!("{:<11} {:>6} {:>5} {:>12} {:>14}", "op", "hidden", "rank", "forward ms", "fwd+bwd ms");
    for r in &rows {
        println!(
            "{:<11} {:>6} {:>5} {:>12.3} {:>14}",
            r.op,
            r.hidden,
            if r.rank > 0 { r.rank.to_string() } else { "-".into() },
            r.forward_ms,
            r.backward_ms.map(|b| format!("{b:.3}")).unwrap_or("-".into())
        );
    }
    Ok(())
}

fn generate(args: &GenerateBenchArgs) -> anyhow::Result<()> {
    let sampling = args.cut.params(args.temperature, crate::engine::sampler::SamplingParams::greedy());
    sampling.validate(args.new_tokens)?;
    let m = args.model.load()?;
    let r = bench::bench_generate(&m, args.prompt_tokens, args.new_tokens, args.repeats, sampling)?;
    let (device, dtype) = device_and_dtype(&m);
    if args.json {
        print_json(&r, device, Some(&dtype))?;
    } else {
        println!(
            "metal-candle generate on {device} {dtype}: prefill {:.1} tok/s ({} tokens), decode {:.1} tok/s ({} tokens, {}), best of {}",
            r.prefill_tokens_per_sec,
            r.prompt_tokens,
            r.decode_tokens_per_sec,
            r.new_tokens,
            sampling_label(&r),
            r.repeats
        );
        if r.graph_replays > 0 {
            println!("  {} of the last run's tokens replayed a captured CUDA graph", r.graph_replays);
        }
    }
    if let Some(why) = &r.graph_fallback {
        eprintln!("note: decoding went on without a CUDA graph: {why}");
    }
    Ok(())
}

/// "greedy", or the sampling settings.
fn sampling_label(r: &bench::GenerateBench) -> String {
    if r.temperature <= 0.0 {
        return "greedy".into();
    }
    let top_k = if r.top_k > 0 { format!(", top-k {}", r.top_k) } else { String::new() };
    format!("sampled at temperature {}, top-p {}{top_k}", r.temperature, r.top_p)
}

fn device_and_dtype(m: &crate::engine::model::LoadedModel) -> (&'static str, String) {
    (device_name(m.model.device()), format!("{:?}", m.model.dtype()).to_lowercase())
}

/// One JSON line: the result's fields plus which implementation, device and dtype produced it.
fn print_json(result: &impl serde::Serialize, device: &str, dtype: Option<&str>) -> anyhow::Result<()> {
    let mut v = serde_json::to_value(result)?;
    v["impl"] = "metal-candle".into();
    v["device"] = device.into();
    if let Some(dtype) = dtype {
        v["dtype"] = dtype.into();
    }
    println!("{v}");
    Ok(())
}
