//! `bench ...`: speed measurements that print numbers (and JSON for scripts).

use super::ModelArgs;
use crate::engine::bench;
use crate::engine::device::device_name;
use clap::{Args, Subcommand};

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Prefill and decode tokens/s of greedy generation.
    Generate(GenerateBenchArgs),
    /// Training step time, tokens/s and peak memory on random batches.
    Train(TrainBenchArgs),
    /// LoRA layer forward/backward times across hidden sizes and ranks, plus softmax and norms.
    Lora(LoraBenchArgs),
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
    #[arg(long, default_value_t = 5)]
    pub steps: usize,
    #[arg(long, default_value_t = 1)]
    pub warmup: usize,
    /// Gradient checkpointing: on | off | auto (auto: on when the memory estimate does not fit).
    #[arg(long, default_value = "off", value_name = "on|off|auto")]
    pub checkpointing: crate::engine::train::Checkpointing,
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
    #[arg(long)]
    pub json: bool,
}

pub fn run(cmd: BenchCommand) -> anyhow::Result<()> {
    match cmd {
        BenchCommand::Generate(a) => generate(&a),
        BenchCommand::Train(a) => train(&a),
        BenchCommand::Lora(a) => lora(&a),
    }
}

fn train(args: &TrainBenchArgs) -> anyhow::Result<()> {
    let m = args.model.load()?;
    let lora = crate::engine::train::LoraSettings {
        rank: args.rank,
        alpha: args.alpha.unwrap_or(2.0 * args.rank as f64),
        targets: args.targets.clone(),
        ..Default::default()
    };
    // The same memory rules as `train`: the estimate, auto checkpointing decided against the budget.
    let mut config = crate::engine::train::TrainConfig {
        batch_size: args.batch_size,
        seq_len: args.seq_len,
        lora: lora.clone(),
        checkpointing: args.checkpointing,
        ..Default::default()
    };
    let shape = crate::engine::estimate::ModelShape::of_model(&m.model);
    let budget = crate::engine::device::memory_budget_bytes(m.model.device());
    let budget_name = crate::engine::device::memory_budget_name(m.model.device());
    if let Some(note) = crate::engine::estimate::resolve_checkpointing(&shape, &mut config, budget, budget_name) {
        eprintln!("note: {note}");
    }
    let estimate = crate::engine::estimate::training_memory(&shape, &config);
    let checkpointing = config.checkpointing.enabled()?;
    let r = bench::bench_train(&m, &lora, args.batch_size, args.seq_len, args.steps, args.warmup, checkpointing)?;
    let (device, dtype) = device_and_dtype(&m);
    if args.json {
        print_json(&r, device, Some(&dtype))?;
    } else {
        println!(
            "metal-candle train on {device} {dtype}: batch {}x{}, rank {} on {}, checkpointing {}: {:.3} s/step, {:.0} \
             tokens/s, loss {:.4}, peak RSS {} (estimate {:.2} GB)",
            r.batch_size,
            r.seq_len,
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
    let m = args.model.load()?;
    let r = bench::bench_generate(&m, args.prompt_tokens, args.new_tokens, args.repeats)?;
    let (device, dtype) = device_and_dtype(&m);
    if args.json {
        print_json(&r, device, Some(&dtype))?;
    } else {
        println!(
            "metal-candle generate on {device} {dtype}: prefill {:.1} tok/s ({} tokens), decode {:.1} tok/s ({} tokens), best of {}",
            r.prefill_tokens_per_sec, r.prompt_tokens, r.decode_tokens_per_sec, r.new_tokens, r.repeats
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
