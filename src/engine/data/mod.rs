//! Datasets for LoRA training: finding a dataset's split files ([`layout`]: mlx-lm's train/valid/test.jsonl
//! and Hugging Face dataset repos' conventions), reading JSONL, JSON and parquet files ([`files`]), the row
//! formats (chat, ShareGPT, Alpaca, preference pairs, GRPO prompts, prompt/completion, text: [`formats`],
//! [`rows`], [`preference_rows`], [`prompt_rows`]) detected per file or named by the user with columns mapped
//! ([`detect`], [`columns`]), splits put together from their files ([`splits`]), templating and prompt masking
//! ([`tokenize`], pairs in [`preference`], GRPO prompts in [`prompts`]), batching with a resumable cursor ([`batches`]),
//! the [`DatasetSummary`] the studio and CLI show before a run, and paging and searching rows ([`browse`]).
//!
//! Without a validation split a seeded fraction of the training rows is held out.

pub mod batches;
pub mod browse;
pub mod columns;
pub mod detect;
pub mod eos_doctor;
pub mod files;
pub mod fingerprint;
pub mod formats;
pub mod layout;
pub mod packing;
pub mod preference;
pub mod preference_rows;
pub mod prompt_rows;
pub mod prompts;
pub mod report;
pub mod row_fields;
pub mod rows;
pub mod splits;
pub mod summary;
pub mod tokenize;
pub mod tool_support;
pub mod turn_order;

pub use batches::{
    collate, collate_rows, eval_batches, Batch, BatchIter, BatchOptions, BatchPlan, DataCursor, PlannedBatch, Schedule,
};
pub use browse::{match_ranges, BrowsedRow, RowBrowser, RowPage, RowQuery, RowRendering, RowView};
pub use columns::{ColumnMap, ReadOptions};
pub use detect::{Detection, ParsedFile};
pub use files::jsonl::parse_jsonl;
pub use files::{read_file, FileKind, MAX_DATASET_BYTES};
pub use fingerprint::dataset_fingerprint;
pub use formats::{
    Conversation, DatasetFormat, FormatChoice, PreferenceRow, PreferenceTurns, PromptRow, Row, RowKind, RowProblem,
    RowUnit, SourcedRow,
};
pub use layout::{dataset_layout, find_splits, DatasetLayout, SplitFiles};
pub use packing::{collate_packs, pack_examples, pack_lengths};
pub use preference::{collate_pairs, prompt_tokens, tokenize_pair, tokenize_sequences};
pub use prompts::{prompt_fits, tokenize_prompt};
pub use report::{inspect_dataset, inspect_dataset_with, DatasetReport, PreviewRow, SplitReport, TokenStats};
pub use splits::{read_split, RawSplit, ReadSplit, SourceFile};
pub use summary::{length_histogram, DatasetSummary, LengthHistogram, SplitSummary};
pub use tokenize::{
    chat_prompt, chat_prompt_ids, preview_example, preview_row, tokenize_row, ChatPrompt, Cut, Example, TokenizeSpec,
};

use crate::engine::{Error, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// How a dataset is read, split and tokenized.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct DataOptions {
    /// Fraction of training rows held out for validation when there is no validation split; 0 holds out none.
    pub valid_fraction: f64,
    /// Skip bad rows (and count them) instead of refusing the dataset.
    pub skip_invalid_rows: bool,
    /// Seed of the validation hold-out.
    pub seed: u64,
    /// Longer examples are cut to this many tokens.
    pub max_seq_len: usize,
    /// Train on prompt tokens too, not only on assistant replies.
    pub train_on_prompt: bool,
    /// How many problems errors and summaries list.
    pub max_listed_problems: usize,
    /// The row format (detected, or named) and the column mapping.
    pub read: ReadOptions,
}

impl Default for DataOptions {
    fn default() -> Self {
        Self {
            valid_fraction: 0.1,
            skip_invalid_rows: false,
            seed: 0,
            max_seq_len: 2048,
            train_on_prompt: false,
            max_listed_problems: 10,
            read: ReadOptions::default(),
        }
    }
}

/// Which part of the dataset a split is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SplitName {
    Train,
    Valid,
    Test,
}

impl SplitName {
    /// "train", "valid" or "test", as in the file names.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Train => "train",
            Self::Valid => "valid",
            Self::Test => "test",
        }
    }
}

impl std::fmt::Display for SplitName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A dataset read and validated, not yet tokenized: enough to check a file without loading a model.
#[derive(Debug, Clone)]
pub struct RawDataset {
    pub source: PathBuf,
    pub train: RawSplit,
    pub valid: Option<RawSplit>,
    pub test: Option<RawSplit>,
    /// Every row problem found (all of them skipped, or loading would have failed).
    pub problems: Vec<RowProblem>,
    pub notes: Vec<String>,
}

/// Read, validate and split a dataset. Bad rows fail the load (listing the first few with their lines)
/// unless `skip_invalid_rows` is set; an ambiguous format, a split of mixed formats and a column mapping
/// naming a missing column always fail it.
pub fn load_raw_dataset(path: &Path, options: &DataOptions) -> Result<RawDataset> {
    if !(0.0..1.0).contains(&options.valid_fraction) {
        return Err(Error::InvalidSetting(format!(
            "valid_fraction is {}; it must be at least 0 and below 1",
            options.valid_fraction
        )));
    }
    options.read.validate()?;
    let layout = dataset_layout(path)?;
    let read =
        |split: SplitName| layout.files_of(split).map(|files| read_split(split, files, &options.read)).transpose();
    let train_split = read(SplitName::Train)?
        .ok_or_else(|| Error::Data(format!("{}: the dataset has no train split", path.display())))?;
    let valid_split = read(SplitName::Valid)?;
    let test_split = read(SplitName::Test)?;
    for split in [Some(&train_split), valid_split.as_ref(), test_split.as_ref()].into_iter().flatten() {
        if let Some(refusal) = split.refusal() {
            return Err(refusal);
        }
    }

    let problems: Vec<RowProblem> = [Some(&train_split), valid_split.as_ref(), test_split.as_ref()]
        .into_iter()
        .flatten()
        .flat_map(|s| s.problems().cloned())
        .collect();
    if !options.skip_invalid_rows {
        check_problems(&problems, options.max_listed_problems)?;
    }
    if train_split.rows() == 0 {
        return Err(no_rows_error(&train_split));
    }

    let mut notes = Vec::new();
    if !layout.ignored.is_empty() {
        let names: Vec<String> = layout.ignored.iter().take(5).map(|p| p.display().to_string()).collect();
        notes.push(format!(
            "ignored {} data file{} that no split takes: {}{}",
            layout.ignored.len(),
            if layout.ignored.len() == 1 { "" } else { "s" },
            names.join(", "),
            if layout.ignored.len() > 5 { ", ..." } else { "" }
        ));
    }
    let mut train = train_split.into_raw();
    let valid = match valid_split.map(ReadSplit::into_raw) {
        Some(split) if !split.rows.is_empty() => Some(split),
        Some(split) => {
            notes
                .push(format!("{} has no valid rows; holding out validation rows from training", split.path.display()));
            carve_valid(&mut train, options, &mut notes)
        }
        None => carve_valid(&mut train, options, &mut notes),
    };
    let test = test_split.map(ReadSplit::into_raw);
    if train.format != Some(DatasetFormat::Chat) || !options.read.is_default() || train.files.len() > 1 {
        notes.push(reading_note(&train, &options.read));
    }
    if !problems.is_empty() {
        notes.push(format!("skipped {} invalid rows", problems.len()));
    }
    Ok(RawDataset { source: path.to_path_buf(), train, valid, test, problems, notes })
}

/// "train split: alpaca (detected from row 1), 2 files, columns prompt=question": how the rows were read.
fn reading_note(train: &RawSplit, read: &ReadOptions) -> String {
    let unit = train.files.first().map(|f| f.unit).unwrap_or_default();
    let mut note = format!("train split: {}", train.detection.describe(unit));
    if train.files.len() > 1 {
        note.push_str(&format!(", {} files", train.files.len()));
    }
    if !read.columns.is_empty() {
        note.push_str(&format!(", columns {}", read.columns));
    }
    note
}

/// The files of a dataset, split by split (see [`layout`]); the training split first.
pub fn dataset_files(path: &Path) -> Result<Vec<SplitFiles>> {
    Ok(dataset_layout(path)?.splits)
}

fn no_rows_error(split: &ReadSplit) -> Error {
    match split.problems().next() {
        None => Error::Dataset {
            path: splits::first_path(split).to_path_buf(),
            line: 1,
            message: "the dataset is empty: no rows, only blank lines or nothing at all".to_string(),
        },
        Some(first) => splits::problem_error(&RowProblem {
            message: format!(
                "no valid rows: all {} rows are invalid and were skipped; the first: {} {}: {}",
                split.problems().count(),
                first.unit.name(),
                first.line,
                first.message
            ),
            ..first.clone()
        }),
    }
}

/// The error for bad rows: one problem as a structured error, several as a list with the total count.
fn check_problems(problems: &[RowProblem], max_listed: usize) -> Result<()> {
    match problems {
        [] => Ok(()),
        [one] => Err(splits::problem_error(one)),
        many => {
            let listed = max_listed.max(1).min(many.len());
            let mut message = format!("{} invalid dataset rows:", many.len());
            for p in &many[..listed] {
                message.push_str(&format!("\n  {p}"));
            }
            if many.len() > listed {
                message.push_str(&format!("\n  ... and {} more", many.len() - listed));
            }
            message.push_str("\nfix these rows, or set skip_invalid_rows to train without them");
            Err(Error::Data(message))
        }
    }
}

/// Hold out a seeded fraction of the training rows for validation (at least one when there are two or more).
fn carve_valid(train: &mut RawSplit, options: &DataOptions, notes: &mut Vec<String>) -> Option<RawSplit> {
    let n = train.rows.len();
    if options.valid_fraction <= 0.0 {
        notes.push("no validation split: there is no validation file and valid_fraction is 0".into());
        return None;
    }
    if n < 2 {
        notes.push("no validation split: there is no validation file and only one training row".into());
        return None;
    }
    let count = ((n as f64 * options.valid_fraction).round() as usize).clamp(1, n - 1);
    let mut order: Vec<usize> = (0..n).collect();
    batches::SplitMix64::new(options.seed ^ 0x05EE_D0F5_A11D).shuffle(&mut order);
    let mut held_out = vec![false; n];
    for &i in &order[..count] {
        held_out[i] = true;
    }
    // Both halves keep file order, so line numbers read naturally.
    let (valid_rows, train_rows): (Vec<_>, Vec<_>) =
        std::mem::take(&mut train.rows).into_iter().zip(held_out).partition(|(_, held)| *held);
    train.rows = train_rows.into_iter().map(|(r, _)| r).collect();
    notes.push(format!(
        "no validation file: held out {count} of {n} rows of {} for validation (valid_fraction {}, seed {})",
        train.path.display(),
        options.valid_fraction,
        options.seed
    ));
    Some(RawSplit {
        name: SplitName::Valid,
        path: train.path.clone(),
        files: train.files.clone(),
        format: train.format,
        detection: train.detection.clone(),
        rows: valid_rows.into_iter().map(|(r, _)| r).collect(),
        skipped_rows: 0,
        carved_from_train: true,
    })
}

/// The tokenized examples of one split, with the source line of each. For preference data `examples[i]` is
/// a pair's chosen sequence and `rejected[i]` its rejected one.
#[derive(Debug, Clone)]
pub struct PreparedSplit {
    pub examples: Vec<Example>,
    pub source_lines: Vec<usize>,
    /// The rejected sequence of each pair (as long as `examples`); `None` for supervised (SFT) data.
    pub rejected: Option<Vec<Example>>,
    /// GRPO prompt rows (as long as `examples`, whose ids are the templated prompts ending in the generation
    /// prompt, with no targets); `None` for other data.
    pub prompts: Option<Vec<formats::PromptRow>>,
}

impl PreparedSplit {
    /// Token length of each example; for preference pairs the longer of the two sequences (what batches pad to).
    pub fn lengths(&self) -> Vec<usize> {
        match &self.rejected {
            None => self.examples.iter().map(Example::len).collect(),
            Some(rejected) => self.examples.iter().zip(rejected).map(|(c, r)| c.len().max(r.len())).collect(),
        }
    }
}

/// A dataset ready for the trainer.
#[derive(Debug, Clone)]
pub struct PreparedDataset {
    pub train: PreparedSplit,
    pub valid: Option<PreparedSplit>,
    pub test: Option<PreparedSplit>,
    pub summary: DatasetSummary,
}

/// Read, validate, split and tokenize a dataset. `options.max_seq_len` and `options.train_on_prompt` override
/// the spec's own values, so one `DataOptions` describes the whole dataset side of a run.
pub fn prepare_dataset(path: &Path, spec: &TokenizeSpec<'_>, options: &DataOptions) -> Result<PreparedDataset> {
    let spec = TokenizeSpec { max_seq_len: options.max_seq_len, train_on_prompt: options.train_on_prompt, ..*spec };
    let raw = load_raw_dataset(path, options)?;
    tokenize_dataset(raw, &spec, options)
}

/// Tokenize an already loaded dataset (see [`prepare_dataset`]).
pub fn tokenize_dataset(raw: RawDataset, spec: &TokenizeSpec<'_>, options: &DataOptions) -> Result<PreparedDataset> {
    preference::check_split_kinds(&raw, spec)?;
    let mut problems = raw.problems;
    let mut notes = raw.notes;
    if spec.uses_fallback_template() && raw.train.format != Some(DatasetFormat::Text) {
        notes.push(tokenize::FALLBACK_TEMPLATE_NOTE.into());
    }
    let mut template_problems = Vec::new();
    let mut too_long = Vec::new();
    let (train, train_summary) = tokenize_split(&raw.train, spec, &mut template_problems, &mut too_long);
    let valid = raw.valid.as_ref().map(|s| tokenize_split(s, spec, &mut template_problems, &mut too_long));
    let test = raw.test.as_ref().map(|s| tokenize_split(s, spec, &mut template_problems, &mut too_long));
    if !options.skip_invalid_rows {
        check_problems(&template_problems, options.max_listed_problems)?;
    } else if !template_problems.is_empty() {
        notes.push(format!("skipped {} rows the chat template could not render", template_problems.len()));
    }
    problems.extend(template_problems);

    if train.examples.is_empty() && train.prompts.is_some() {
        return Err(Error::Data(format!(
            "{}: no training prompts left: {} rows read, {} longer than max_seq_len {} dropped, {} skipped; raise \
             max_seq_len or check the rows",
            raw.train.path.display(),
            train_summary.rows,
            train_summary.dropped,
            spec.max_seq_len,
            train_summary.skipped_rows
        )));
    }
    if train.examples.is_empty() {
        return Err(Error::Data(format!(
            "{}: no training examples left: {} rows read, {} dropped with no target tokens after truncation to \
             max_seq_len {}, {} skipped; raise max_seq_len or check the rows",
            raw.train.path.display(),
            train_summary.rows,
            train_summary.dropped,
            spec.max_seq_len,
            train_summary.skipped_rows
        )));
    }
    let (valid, valid_summary) = valid.unzip();
    let (test, test_summary) = test.unzip();
    if let Some(v) = valid_summary.as_ref().filter(|v| v.examples == 0) {
        notes.push(format!("the validation split has no examples left ({} dropped)", v.dropped));
    }
    let splits = || [Some(&train_summary), valid_summary.as_ref(), test_summary.as_ref()].into_iter().flatten();
    if raw.train.format == Some(DatasetFormat::Preference) {
        notes.push(preference::pairs_note(&train_summary, valid_summary.as_ref()));
    }
    let truncated = splits().map(|s| s.truncated).sum::<usize>();
    let dropped = splits().map(|s| s.dropped).sum::<usize>();
    let skipped_rows = splits().map(|s| s.skipped_rows).sum::<usize>();
    if truncated > 0 {
        notes.push(format!("{truncated} rows were longer than max_seq_len {} and were cut", spec.max_seq_len));
    }
    let prompts = raw.train.format == Some(DatasetFormat::Prompts);
    if dropped > 0 && prompts {
        notes.extend(prompts::too_long_note(&too_long, spec.max_seq_len));
    } else if dropped > 0 {
        notes.push(if raw.train.format == Some(DatasetFormat::Preference) {
            format!("{dropped} pairs whose prompt alone fills max_seq_len {} were dropped", spec.max_seq_len)
        } else {
            format!("{dropped} rows had no target tokens left after truncation and were dropped")
        });
    }
    let summary = DatasetSummary {
        source: raw.source,
        format: raw.train.format.unwrap_or(DatasetFormat::Text),
        tokens_per_epoch: train_summary.tokens,
        target_tokens_per_epoch: train_summary.target_tokens,
        train: train_summary,
        valid: valid_summary,
        test: test_summary,
        skipped_rows,
        total_problems: problems.len(),
        problems: problems.into_iter().take(options.max_listed_problems).collect(),
        truncated,
        dropped,
        max_seq_len: spec.max_seq_len,
        notes,
    };
    let mut prepared = PreparedDataset { train, valid, test, summary };
    if prompts {
        let note = prompts::prompts_note(&prepared);
        prepared.summary.notes.push(note);
    }
    Ok(prepared)
}

/// Tokenize one split; the locations of prompts too long to keep go to `too_long`.
fn tokenize_split(
    split: &RawSplit,
    spec: &TokenizeSpec<'_>,
    problems: &mut Vec<RowProblem>,
    too_long: &mut Vec<String>,
) -> (PreparedSplit, SplitSummary) {
    let kind = split.format.map(DatasetFormat::kind);
    let mut prepared = PreparedSplit {
        examples: Vec::new(),
        source_lines: Vec::new(),
        rejected: (kind == Some(RowKind::Pairs)).then(Vec::new),
        prompts: (kind == Some(RowKind::Prompts)).then(Vec::new),
    };
    let mut summary = SplitSummary {
        name: split.name,
        path: split.path.clone(),
        files: split.files.iter().map(|f| f.path.clone()).collect(),
        format: split.format,
        carved_from_train: split.carved_from_train,
        rows: split.rows.len(),
        skipped_rows: split.skipped_rows,
        examples: 0,
        truncated: 0,
        dropped: 0,
        tokens: 0,
        target_tokens: 0,
        lengths: Vec::new(),
    };
    for sourced in &split.rows {
        match preference::tokenize_sequences(&sourced.row, spec) {
            Ok((example, _)) if matches!(sourced.row, Row::Prompt(_)) => {
                let location = || {
                    let file = split.file_of(sourced);
                    file.unit.locate(&file.path, sourced.line)
                };
                if prompts::keep_prompt(&example, spec.max_seq_len, location, &mut summary, too_long) {
                    if let (Some(all), Row::Prompt(row)) = (prepared.prompts.as_mut(), &sourced.row) {
                        all.push(row.clone());
                    }
                    prepared.examples.push(example);
                    prepared.source_lines.push(sourced.line);
                }
            }
            Ok((example, rejected)) => {
                // A pair counts once for truncation and dropping, and with both sequences for tokens.
                let sequences = || std::iter::once(&example).chain(rejected.as_ref());
                let cuts: Vec<Cut> = sequences().map(|e| e.cut(spec.max_seq_len)).collect();
                summary.truncated += usize::from(cuts.iter().any(|c| c.truncated));
                if cuts.iter().any(Cut::dropped) {
                    summary.dropped += 1;
                    continue;
                }
                summary.tokens += sequences().map(Example::len).sum::<usize>();
                summary.target_tokens += cuts.iter().map(|c| c.target_tokens).sum::<usize>();
                summary.lengths.push(sequences().map(Example::len).max().unwrap_or(0));
                prepared.examples.push(example);
                prepared.source_lines.push(sourced.line);
                if let (Some(all), Some(r)) = (prepared.rejected.as_mut(), rejected) {
                    all.push(r);
                }
            }
            Err(e) => {
                summary.skipped_rows += 1;
                problems.push(split.problem(sourced, e.to_string()));
            }
        }
    }
    summary.examples = prepared.examples.len();
    (prepared, summary)
}

#[cfg(test)]
mod tests;
