//! `data`: check a dataset the way the studio's dataset page does, with the same engine report
//! ([`crate::engine::data::inspect_dataset_with`]): each split's files, detected format (or why there is
//! none), columns, rows and problems, the column mapping used, and with a model, token lengths and how many
//! rows `--seq-len` cuts or drops.

use super::{DeviceChoice, ModelArgs};
use crate::engine::data::{inspect_dataset_with, ColumnMap, DatasetReport, FormatChoice, ReadOptions};
use crate::engine::device::DTypeChoice;
use clap::Args;
use std::path::{Path, PathBuf};

#[derive(Debug, Args)]
pub struct DataArgs {
    /// A .jsonl, .json or .parquet file, a folder of them (train/valid/test.jsonl, a Hugging Face dataset
    /// repo's data/train-00000-of-00001.parquet, ...), or a Hub dataset id ORG/NAME.
    #[arg(long)]
    pub data: PathBuf,
    /// How rows are read: auto detects each file's format.
    #[arg(long, value_name = "auto|chat|sharegpt|alpaca|preference|prompts|completions|text", default_value = "auto")]
    pub format: FormatChoice,
    /// Read columns as a format's fields, e.g. prompt=question,completion=answer or conversations=dialog.
    #[arg(long, value_name = "FIELD=COLUMN,...")]
    pub columns: Option<ColumnMap>,
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
    let read = ReadOptions { format: args.format, columns: args.columns.clone().unwrap_or_default() };
    // A Hub dataset id (ORG/NAME) is read from its cached snapshot, downloaded when missing.
    let path = super::hub::resolve_path(&args.data, crate::engine::hub::RepoKind::Dataset)?.path;
    let report = inspect_dataset_with(&path, &read, model.as_ref(), args.seq_len, args.train_on_prompt, args.preview)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_report(&report);
    }
    Ok(())
}

/// A path shown relative to the dataset folder when it is inside it.
fn short<'a>(report: &DatasetReport, path: &'a Path) -> std::borrow::Cow<'a, str> {
    match path.strip_prefix(&report.path) {
        Ok(rel) if !rel.as_os_str().is_empty() => rel.to_string_lossy(),
        _ => path.to_string_lossy(),
    }
}

fn print_report(report: &DatasetReport) {
    println!("dataset {}: rows read as {}", report.path.display(), report.read.describe());
    for s in &report.splits {
        println!(
            "{:<6} {}: {} {}, {} problems",
            s.split.as_str(),
            s.detection.describe(s.unit),
            s.rows,
            s.format.map_or("rows", |f| f.rows_word()),
            s.problems.len()
        );
        let files: Vec<_> = s.files.iter().map(|f| short(report, f)).collect();
        println!("       files: {}", files.join(", "));
        if !s.columns.is_empty() {
            println!("       columns: {}", s.columns.join(", "));
        }
        if let Some(error) = &s.error {
            println!("       error: {error}");
        }
        for problem in s.problems.iter().take(10) {
            let file = if s.files.len() > 1 { format!("{} ", short(report, &problem.path)) } else { String::new() };
            println!("       {file}{} {}: {}", problem.unit.name(), problem.line, problem.message);
        }
    }
    if !report.ignored.is_empty() {
        let ignored: Vec<_> = report.ignored.iter().map(|f| short(report, f)).collect();
        println!("ignored (no split): {}", ignored.join(", "));
    }
    if let Some(s) = report.needs_choice() {
        println!(
            "hint: the {} split's format is not clear; name it with --format {} and map columns with --columns \
             FIELD=COLUMN (fields: {})",
            s.split,
            match &s.detection {
                crate::engine::data::Detection::Ambiguous { candidates, .. } =>
                    candidates.iter().map(|f| f.name()).collect::<Vec<_>>().join("|"),
                _ => "chat|sharegpt|alpaca|preference|prompts|completions|text".into(),
            },
            crate::engine::data::columns::known_fields().collect::<Vec<_>>().join(", ")
        );
    }
    if let Some(t) = &report.tokens {
        println!(
            "tokens: {} ({} targets) within seq_len {}; {} {word} truncated, {} dropped (no target left)",
            t.total_tokens,
            t.target_tokens,
            t.max_seq_len,
            t.truncated,
            t.dropped,
            word = report.rows_word()
        );
    }
    for note in &report.notes {
        println!("note: {note}");
    }
    for warning in &report.warnings {
        println!("warning: {warning}");
    }
}
