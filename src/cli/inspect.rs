//! `metal-candle inspect`: the adapter X-ray of a checkpoint or PEFT adapter folder (`engine::xray`), as a table
//! (layer, module, update norm, relative norm, energy rank 90, top singular values) with the rank recommendation,
//! or as JSON.

use crate::engine::xray::{self, BaseChoice, XrayReport};
use clap::Args;
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct InspectArgs {
    /// A checkpoint folder of a run, or any PEFT LoRA adapter folder (adapter_config.json +
    /// adapter_model.safetensors).
    #[arg(long)]
    pub checkpoint: PathBuf,
    /// The base model to compare the updates with (default: the one in the run's run.json, else the adapter's
    /// base_model_name_or_path when it is a path here). Without one, relative norms are left out.
    #[arg(long)]
    pub base: Option<PathBuf>,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

/// How many singular values the table shows per module.
const TOP_VALUES: usize = 4;

pub fn inspect(args: &InspectArgs) -> anyhow::Result<()> {
    let named = match &args.base {
        Some(b) => Some(super::hub::resolve_path(b, crate::engine::hub::RepoKind::Model)?.path),
        None => None,
    };
    let base = xray::find_base(&args.checkpoint, named.as_deref());
    let report = xray::inspect(&args.checkpoint, &base)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    if let BaseChoice::Found(path) = &base {
        eprintln!("base model: {}", path.display());
    }
    print_table(&report);
    Ok(())
}

fn print_table(report: &XrayReport) {
    let kind = match (report.use_rslora, report.use_dora) {
        (true, true) => "rsLoRA + DoRA",
        (true, false) => "rsLoRA",
        (false, true) => "DoRA",
        (false, false) => "LoRA",
    };
    println!(
        "{}: {kind} rank {} alpha {} (scale {:.4}), {} adapted modules",
        report.checkpoint.display(),
        report.rank,
        report.alpha,
        report.scale,
        report.modules.len()
    );
    for note in &report.notes {
        println!("note: {note}");
    }
    let dora = report.modules.iter().any(|m| m.magnitude_change.is_some());
    println!(
        "{:>5}  {:<14} {:>11} {:>9} {:>6} {:>6} {:>6}  top singular values{}",
        "layer",
        "module",
        "update norm",
        "relative",
        "rank50",
        "rank90",
        "rank99",
        if dora { "  (DoRA magnitude change)" } else { "" }
    );
    for m in &report.modules {
        let relative = m.relative_norm.map_or("–".to_string(), |r| format!("{r:.3e}"));
        let top: Vec<String> = m.singular_values.iter().take(TOP_VALUES).map(|s| format!("{s:.3e}")).collect();
        let magnitude = m.magnitude_change.map_or(String::new(), |c| format!("  ({c:.3e})"));
        println!(
            "{:>5}  {:<14} {:>11.4e} {:>9} {:>6} {:>6} {:>6}  {}{magnitude}",
            m.layer,
            m.module,
            m.update_norm,
            relative,
            m.energy_rank_50,
            m.energy_rank_90,
            m.energy_rank_99,
            top.join(" ")
        );
    }
    println!();
    match report.summary.recommended_rank {
        Some(rank) => println!("recommended rank: {rank}"),
        None => println!("recommended rank: none"),
    }
    println!("why: {}", report.summary.reason);
    eprintln!("({:.2} s)", report.elapsed_secs);
}
