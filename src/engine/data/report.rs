//! The dataset report the studio's dataset page and the CLI show before a run: each split's files, detected
//! format (or why there is none: ambiguous, unknown, mixed), columns, rows and problems, the column mapping
//! used, and with a model loaded, token lengths under its tokenizer and chat template, how many rows
//! `max_seq_len` cuts or drops (the trainer's own rule, [`super::Example::cut`]) and a templated preview.
//! It reads files the way training does ([`super::dataset_layout`], [`super::read_split`]).

use super::columns::ReadOptions;
use super::detect::Detection;
use super::formats::RowUnit;
use super::splits::RawSplit;
use super::{
    dataset_layout, read_split, tokenize, tokenize_sequences, DatasetFormat, Row, RowProblem, SplitName, TokenizeSpec,
};
use crate::engine::data::eos_doctor::{self, StopWarning};
use crate::engine::model::LoadedModel;
use crate::engine::Result;
use std::path::{Path, PathBuf};

/// Rows tokenized for the length statistics; larger datasets are sampled from the start.
pub const MAX_STAT_ROWS: usize = 20_000;

/// One split of a dataset: its files, how their rows read, and what is wrong with them.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SplitReport {
    pub split: SplitName,
    /// The split's (first) file.
    pub path: PathBuf,
    /// Every file of the split, in the order read (shards of one split are concatenated).
    #[serde(default)]
    pub files: Vec<PathBuf>,
    /// None when no row is valid, or the format is ambiguous, unknown or mixed.
    pub format: Option<DatasetFormat>,
    /// How the format was found, or why there is none.
    #[serde(default)]
    pub detection: Detection,
    /// The columns of the split's (first) file, as written (before any mapping).
    #[serde(default)]
    pub columns: Vec<String>,
    /// How the split's positions count (lines of JSONL; rows of JSON arrays and parquet).
    #[serde(default)]
    pub unit: RowUnit,
    pub rows: usize,
    pub blank_lines: usize,
    pub problems: Vec<RowProblem>,
    /// Why training would refuse the split as a whole (an ambiguous format, files in different formats).
    #[serde(default)]
    pub error: Option<String>,
}

/// Token statistics of the training split under a model's tokenizer and chat template. A preference pair counts
/// once (its longer sequence for lengths, cut or dropped when either is) and with both sequences for tokens.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TokenStats {
    /// Token length of each training row before truncation.
    pub lengths: Vec<usize>,
    pub max_seq_len: usize,
    /// Rows longer than `max_seq_len`.
    pub truncated: usize,
    /// Rows with no trained token left within `max_seq_len` (GRPO prompts: longer than it); the trainer drops them.
    pub dropped: usize,
    pub total_tokens: usize,
    /// Tokens that are training targets (after truncation).
    pub target_tokens: usize,
    /// Rows that could not be tokenized.
    pub failures: Vec<RowProblem>,
}

impl TokenStats {
    /// The lengths binned for the dataset page, with `max_seq_len` marked.
    pub fn length_histogram(&self) -> super::LengthHistogram {
        super::length_histogram(&self.lengths, self.max_seq_len)
    }

    /// Tokens of the longest training row before truncation (the memory estimate pads batches to it).
    pub fn longest_row(&self) -> Option<usize> {
        self.lengths.iter().max().copied()
    }

    /// The token length of each row a run trains on: every example cut at `seq_len`, and with `packing` the packs
    /// of them (`data::packing`, as the trainer fills them).
    pub fn training_rows(&self, seq_len: usize, packing: bool) -> Vec<usize> {
        let cut: Vec<usize> = self.lengths.iter().map(|&n| n.min(seq_len)).collect();
        match packing {
            true => super::packing::pack_lengths(&super::packing::pack_examples(&cut, seq_len), &cut),
            false => cut,
        }
    }
}

/// One previewed row: its text pieces, each flagged trained (true) or masked (false).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PreviewRow {
    pub split: SplitName,
    /// The row's position in its file (a line for JSONL, see `unit`).
    pub line: usize,
    #[serde(default)]
    pub unit: RowUnit,
    pub tokens: usize,
    pub truncated: bool,
    /// The row's pieces; for a preference pair, its chosen sequence (prompt then completion).
    pub pieces: Vec<(String, bool)>,
    /// A preference pair's rejected sequence (prompt then completion).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rejected: Option<Vec<(String, bool)>>,
}

/// Everything the dataset page shows.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct DatasetReport {
    pub path: PathBuf,
    /// How the rows were read: the format asked for (`auto`: detected per file) and the column mapping.
    #[serde(default)]
    pub read: ReadOptions,
    pub splits: Vec<SplitReport>,
    /// Data files in the folder that no split takes.
    #[serde(default)]
    pub ignored: Vec<PathBuf>,
    /// None until a model (its tokenizer and template) is loaded.
    pub tokens: Option<TokenStats>,
    pub preview: Vec<PreviewRow>,
    /// The model the token statistics were computed with.
    pub tokenizer_model: Option<PathBuf>,
    /// Remarks worth showing (no chat template, no model loaded, ...).
    pub notes: Vec<String>,
    /// The template and end-of-sequence doctor's findings with the model loaded (shown as warnings).
    #[serde(default)]
    pub warnings: Vec<crate::engine::data::eos_doctor::StopWarning>,
}

impl DatasetReport {
    pub fn problem_count(&self) -> usize {
        self.splits.iter().map(|s| s.problems.len()).sum()
    }

    pub fn rows(&self, split: SplitName) -> usize {
        self.splits.iter().filter(|s| s.split == split).map(|s| s.rows).sum()
    }

    /// What the training split's rows are called in counts ("pairs" for preference data, else "rows").
    pub fn rows_word(&self) -> &'static str {
        self.splits
            .iter()
            .find(|s| s.split == SplitName::Train)
            .and_then(|s| s.format)
            .map_or("rows", |f| f.rows_word())
    }

    /// The first split whose format a user has to name (ambiguous or unknown) or whose files disagree.
    pub fn needs_choice(&self) -> Option<&SplitReport> {
        self.splits.iter().find(|s| s.detection.needs_choice() || s.error.is_some())
    }
}

/// [`inspect_dataset_with`] with formats detected and no column mapping.
pub fn inspect_dataset(
    path: &Path,
    model: Option<&LoadedModel>,
    max_seq_len: usize,
    train_on_prompt: bool,
    preview_rows: usize,
) -> Result<DatasetReport> {
    inspect_dataset_with(path, &ReadOptions::default(), model, max_seq_len, train_on_prompt, preview_rows)
}

/// Read and check a dataset as `read` says; with `model`, also tokenize it for statistics and a preview of
/// `preview_rows` rows. An ambiguous or mixed split is reported (with its error), not refused; a column
/// mapping that names a column a file lacks is refused.
pub fn inspect_dataset_with(
    path: &Path,
    read: &ReadOptions,
    model: Option<&LoadedModel>,
    max_seq_len: usize,
    train_on_prompt: bool,
    preview_rows: usize,
) -> Result<DatasetReport> {
    read.validate()?;
    let layout = dataset_layout(path)?;
    let mut report = DatasetReport { path: path.to_path_buf(), read: read.clone(), ..Default::default() };
    report.ignored = layout.ignored.clone();
    let mut raw = Vec::new();
    for files in &layout.splits {
        let split = read_split(files.split, &files.files, read)?;
        let error = split.refusal().map(|e| e.to_string());
        report.splits.push(SplitReport {
            split: files.split,
            path: files.files.first().cloned().unwrap_or_default(),
            files: files.files.clone(),
            format: split.format(),
            detection: split.detection.clone(),
            columns: split.columns().to_vec(),
            unit: split.files.first().map(|f| f.unit).unwrap_or_default(),
            rows: split.rows(),
            blank_lines: split.blank_lines(),
            problems: split.problems().cloned().collect(),
            error: error.clone(),
        });
        if error.is_none() {
            raw.push(split.into_raw());
        }
    }
    if !layout.splits.iter().any(|s| s.split == SplitName::Valid) {
        report
            .notes
            .push("no validation split: training holds out a fraction of the training rows for validation".into());
    }
    let Some(model) = model else {
        report.notes.push("load a model to see token counts, the length histogram and the templated preview".into());
        return Ok(report);
    };
    report.tokenizer_model = Some(model.source.path().to_path_buf());
    if train_on_prompt && raw.iter().any(|s| s.format == Some(DatasetFormat::Preference)) {
        report.notes.push(
            "train on prompt is off for preference pairs: DPO and ORPO train the completions only, and training \
             refuses the setting for this dataset"
                .into(),
        );
    }
    if model.chat_template.is_none() && raw.iter().any(|s| s.format != Some(DatasetFormat::Text)) {
        report.notes.push(tokenize::FALLBACK_TEMPLATE_NOTE.into());
    }
    // Lengths before truncation, so the histogram can show what a shorter max_seq_len would cut.
    let full = TokenizeSpec::for_model(model, usize::MAX / 2, train_on_prompt);
    if let Some(train) = raw.first().filter(|s| s.name == SplitName::Train) {
        if train.rows.len() > MAX_STAT_ROWS {
            report.notes.push(format!("token statistics from the first {MAX_STAT_ROWS} of {} rows", train.rows.len()));
        }
        report.tokens = Some(token_stats(train, &full, max_seq_len));
    }
    report.warnings = stop_warnings(&raw, &full, model);
    let cut = TokenizeSpec { max_seq_len: max_seq_len.max(2), ..full };
    report.preview = preview_rows_of(&raw, &cut, model, preview_rows);
    Ok(report)
}

/// Rows checked by the end-of-sequence doctor (the first of the training split).
const DOCTOR_ROWS: usize = 200;

/// The doctor's warnings for the model and the first [`DOCTOR_ROWS`] training rows, tokenized untruncated.
fn stop_warnings(splits: &[RawSplit], full: &TokenizeSpec<'_>, model: &LoadedModel) -> Vec<StopWarning> {
    let rows = splits.iter().find(|s| s.name == SplitName::Train).map(|s| s.rows.as_slice()).unwrap_or_default();
    let stop_ids = &model.eos_token_ids;
    let examples: Vec<_> = rows
        .iter()
        .take(DOCTOR_ROWS)
        .filter_map(|r| tokenize_sequences(&r.row, full).ok())
        .flat_map(|(example, rejected)| match rejected {
            None => vec![example],
            Some(rejected) => vec![through_last_stop(example, stop_ids), through_last_stop(rejected, stop_ids)],
        })
        .collect();
    eos_doctor::check_training(model, &examples)
}

/// A pair's completion runs to the end of the rendered conversation (TRL keeps the template's newline after the
/// end-of-turn token), so it teaches stopping when it holds a stop token anywhere: cut it after the last one for
/// the doctor's check of where trained tokens end.
fn through_last_stop(mut example: super::Example, stop_ids: &[u32]) -> super::Example {
    let last_stop =
        (0..example.len()).rev().find(|&j| example.target_mask[j] && stop_ids.contains(&example.input_ids[j]));
    if let Some(j) = last_stop {
        example.input_ids.truncate(j + 1);
        example.target_mask.truncate(j + 1);
    }
    example
}

/// Lengths, truncation and target counts of (up to [`MAX_STAT_ROWS`]) training rows.
fn token_stats(train: &RawSplit, full: &TokenizeSpec<'_>, max_seq_len: usize) -> TokenStats {
    let mut stats = TokenStats { max_seq_len, ..Default::default() };
    for sourced in train.rows.iter().take(MAX_STAT_ROWS) {
        match tokenize_sequences(&sourced.row, full) {
            // A GRPO prompt has no targets and is never cut: it is dropped when it does not fit (the trainer's rule).
            Ok((example, _)) if matches!(sourced.row, Row::Prompt(_)) => {
                stats.lengths.push(example.len());
                stats.dropped += usize::from(!super::prompt_fits(&example, max_seq_len));
                stats.total_tokens += example.len().min(max_seq_len);
            }
            Ok((example, rejected)) => {
                let sequences: Vec<&super::Example> = std::iter::once(&example).chain(rejected.as_ref()).collect();
                let cuts: Vec<super::Cut> = sequences.iter().map(|e| e.cut(max_seq_len)).collect();
                stats.lengths.push(sequences.iter().map(|e| e.len()).max().unwrap_or(0));
                stats.total_tokens += sequences.iter().map(|e| e.len().min(max_seq_len)).sum::<usize>();
                stats.truncated += usize::from(cuts.iter().any(|c| c.truncated));
                stats.target_tokens += cuts.iter().map(|c| c.target_tokens).sum::<usize>();
                stats.dropped += usize::from(cuts.iter().any(super::Cut::dropped));
            }
            Err(e) => stats.failures.push(train.problem(sourced, e.to_string())),
        }
    }
    stats
}

/// The first `limit` rows that tokenize, as trained/masked pieces.
fn preview_rows_of(splits: &[RawSplit], spec: &TokenizeSpec<'_>, model: &LoadedModel, limit: usize) -> Vec<PreviewRow> {
    let rows = splits.iter().flat_map(|split| split.rows.iter().map(move |r| (split, r)));
    rows.filter_map(|(split, sourced)| {
        let (example, rejected) = tokenize_sequences(&sourced.row, spec).ok()?;
        let pieces = tokenize::preview_example(&example, &model.tokenizer).ok()?;
        let rejected = match rejected {
            Some(r) => Some(tokenize::preview_example(&r, &model.tokenizer).ok()?),
            None => None,
        };
        let (tokens, truncated) = (example.len(), example.truncated);
        let unit = split.file_of(sourced).unit;
        Some(PreviewRow { split: split.name, line: sourced.line, unit, tokens, truncated, pieces, rejected })
    })
    .take(limit)
    .collect()
}

/// (tokens, truncated, pieces) of one row.
pub(super) type Preview = (usize, bool, Vec<(String, bool)>);

/// One row through the template as the trainer sees it: its tokens, whether it was cut, and trained/masked pieces.
pub(super) fn preview(row: &Row, spec: &TokenizeSpec<'_>, model: &LoadedModel) -> Result<Preview> {
    let example = tokenize::tokenize_row(row, spec)?;
    let pieces = tokenize::preview_example(&example, &model.tokenizer)?;
    Ok((example.len(), example.truncated, pieces))
}
