//! `bench ranks`: the studio's rank explorer from the command line. Equal-budget probe trainings at several
//! ranks on the `train` settings, each at those settings' LoRA scale (the alpha of every probe is printed), one
//! line per rank with speed, the memory the probe added, its peak and the validation loss, and the time left.

use super::train::TrainArgs;
use crate::engine::model::LoadOptions;
use crate::engine::rank_probe::{rank_probe, RankProbeResult};
use crate::engine::train::{ModelLimits, TrainControl};
use clap::Args;

#[derive(Debug, Args)]
pub struct RankBenchArgs {
    /// Ranks to probe, comma-separated. Each is probed at the scale of --alpha / --rank (alpha / sqrt(rank) with
    /// --rslora): a probe at rank r uses alpha = scale x r.
    #[arg(long, value_delimiter = ',', default_value = "4,8,16,32,64")]
    pub ranks: Vec<usize>,
    /// Training tokens per probe; every rank trains on the same batches.
    #[arg(long, default_value_t = 20_000)]
    pub token_budget: usize,
    #[command(flatten)]
    pub train: TrainArgs,
}

pub fn ranks(args: &RankBenchArgs) -> anyhow::Result<()> {
    if args.train.resume.is_some() {
        anyhow::bail!("--resume does not apply to rank probes: each probe trains a fresh adapter");
    }
    if args.ranks.is_empty() || args.ranks.contains(&0) {
        anyhow::bail!("--ranks must list ranks of at least 1, e.g. --ranks 4,8,16");
    }
    let mut config = args.train.to_config()?;
    super::train::resolve_sources(&mut config)?;
    let placement = crate::engine::device::setup(config.device, config.dtype)?;
    super::print_placement_notes(&placement);
    let base =
        super::load_model_showing_progress(&config.model, &placement, &LoadOptions { quantize: config.quantize })?;
    config.validate_for_model(ModelLimits::of(&base.config))?;
    let plan = crate::engine::estimate::plan_run_memory(&mut config, &base);
    for note in plan.warning.iter().chain(&plan.notes) {
        eprintln!("note: {note}");
    }
    let control = TrainControl::default();
    if crate::stop_signals::install() {
        let ctrl = control.clone();
        crate::stop_signals::forward(move || ctrl.request_stop());
    }
    let lora = &config.lora;
    let rule = if lora.use_rslora { "sqrt(rank)" } else { "rank" };
    eprintln!(
        "probing ranks {:?} on {} training tokens each, at LoRA scale {:.2} (alpha = {:.2} x {rule}, from --alpha {} \
         / --rank {})",
        args.ranks,
        args.token_budget,
        lora.scale(),
        lora.scale(),
        lora.alpha,
        lora.rank
    );
    let json = args.train.json;
    if !json {
        println!(
            "{:>5} {:>8} {:>10} {:>6} {:>9} {:>12} {:>12} {:>9}",
            "rank", "alpha", "trainable", "steps", "tokens/s", "added", "peak", "val loss"
        );
    }
    let mut done = 0usize;
    let mut measure = None;
    let total = args.ranks.len();
    rank_probe(&base, &config, &args.ranks, args.token_budget, &control, &mut |r: &RankProbeResult| {
        done += 1;
        measure = Some(r.memory.measure);
        if json {
            if let Ok(line) = serde_json::to_string(r) {
                println!("{line}");
            }
            return;
        }
        println!(
            "{:>5} {:>8} {:>10} {:>6} {:>9.0} {:>12} {:>12} {:>9.4}",
            r.rank,
            format!("{:.2}", r.alpha),
            r.trainable_params,
            r.steps,
            r.tokens_per_sec,
            mib(r.memory.added_bytes),
            r.memory.peak_bytes.map(mib).unwrap_or_else(|| "-".into()),
            r.val_loss
        );
        if done < total {
            let left = r.timing.sweep_secs(&r.plan, args.token_budget, total - done);
            let more = total - done;
            let probes = if more == 1 { "probe" } else { "probes" };
            eprintln!("  {} left ({more} more {probes}, from this probe's speed)", about(left));
        }
    })?;
    if let Some(measure) = measure.filter(|_| !json) {
        eprintln!("memory: {}", measure.explain());
    }
    Ok(())
}

fn about(secs: f64) -> String {
    if secs < 90.0 {
        format!("about {:.0} s", secs.ceil())
    } else {
        format!("about {:.0} min", (secs / 60.0).round())
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}
