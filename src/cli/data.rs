//! `data`: check a dataset the way the studio's dataset page does, with the same engine report
//! ([`crate::engine::data::inspect_dataset`]): files, rows, problems, and with a model, token lengths and how
//! many rows `--seq-len` cuts or drops.

use super::{DeviceChoice, ModelArgs};
use crate::engine::data::{inspect_dataset, DatasetReport};
use crate::engine::device::DTypeChoice;
use clap::Args;
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct DataArgs {
    /// A .jsonl file or a folder with train/valid/test.jsonl.
    #[arg(long)]
    pub data: PathBuf,
    /// Tokenize with this model's tokenizer and chat template (a model folder or .gguf file).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// The sequence length truncation and dropped-row counts refer to.
    #[arg(long, default_value_t = 512)]
    pub seq_len: usize,
    #[arg(long)]
    pub train_on_prompt: bool,
    /// Templated rows to include in the report.
    #[arg(long, default_value_t = 0)]
    pub preview: usize,
    /// Print the whole report as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn data(args: &DataArgs) -> anyhow::Result<()> {
    let model = match &args.model {
        Some(path) => Some(
            ModelArgs {
                model: path.clone(),
                adapter: None,
                device: DeviceChoice::Cpu,
                dtype: DTypeChoice::Auto,
                quantize: Default::default(),
            }
            .load()?,
        ),
        None => None,
    };
    let report = inspect_dataset(&args.data, model.as_ref(), args.seq_len, args.train_on_prompt, args.preview)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_report(&report);
    }
    Ok(())
}

fn print_report(report: &DatasetReport) {
    for s in &report.splits {
        println!(
            "{:<6} {} ({}): {} rows, {} problems",
            s.split,
            s.path.display(),
            s.format.map_or("no valid rows", |f| f.name()),
            s.rows,
            s.problems.len()
        );
        for problem in s.problems.iter().take(10) {
            println!("       line {}: {}", problem.line, problem.message);
        }
    }
    if let Some(t) = &report.tokens {
        println!(
            "tokens: {} ({} targets) within seq_len {}; {} rows truncated, {} dropped (no target left)",
            t.total_tokens, t.target_tokens, t.max_seq_len, t.truncated, t.dropped
        );
    }
    for note in &report.notes {
        println!("note: {note}");
    }
    for warning in &report.warnings {
        println!("warning: {warning}");
    }
}
