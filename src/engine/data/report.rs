//! The dataset report the studio's dataset page and the CLI show before a run: each file's rows, format and
//! problems, and with a model loaded, token lengths under its tokenizer and chat template, how many rows
//! `max_seq_len` cuts or drops (the trainer's own rule, [`super::Example::cut`]) and a templated preview.
//! It reads files the way training does ([`super::dataset_files`], [`super::read_jsonl`]).

use super::{dataset_files, read_jsonl, tokenize, DatasetFormat, ParsedFile, Row, RowProblem, SplitName, TokenizeSpec};
use crate::engine::data::eos_doctor::{self, StopWarning};
use crate::engine::model::LoadedModel;
use crate::engine::Result;
use std::path::{Path, PathBuf};

/// Rows tokenized for the length statistics; larger datasets are sampled from the start.
pub const MAX_STAT_ROWS: usize = 20_000;

/// One split (file) of a dataset.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SplitReport {
    pub split: SplitName,
    pub path: PathBuf,
    /// None when no row is valid.
    pub format: Option<DatasetFormat>,
    pub rows: usize,
    pub blank_lines: usize,
    pub problems: Vec<RowProblem>,
}

/// Token statistics of the training split under a model's tokenizer and chat template.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TokenStats {
    /// Token length of each training row before truncation.
    pub lengths: Vec<usize>,
    pub max_seq_len: usize,
    /// Rows longer than `max_seq_len`.
    pub truncated: usize,
    /// Rows with no trained token left within `max_seq_len` (the trainer drops them).
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
}

/// One previewed row: its text pieces, each flagged trained (true) or masked (false).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PreviewRow {
    pub split: SplitName,
    pub line: usize,
    pub tokens: usize,
    pub truncated: bool,
    pub pieces: Vec<(String, bool)>,
}

/// Everything the dataset page shows.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct DatasetReport {
    pub path: PathBuf,
    pub splits: Vec<SplitReport>,
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
}

/// Read and check a dataset; with `model`, also tokenize it for statistics and a preview of `preview_rows` rows.
pub fn inspect_dataset(
    path: &Path,
    model: Option<&LoadedModel>,
    max_seq_len: usize,
    train_on_prompt: bool,
    preview_rows: usize,
) -> Result<DatasetReport> {
    let mut report = DatasetReport { path: path.to_path_buf(), ..Default::default() };
    let mut parsed = Vec::new();
    for (split, file) in dataset_files(path)? {
        let p = read_jsonl(&file)?;
        report.splits.push(SplitReport {
            split,
            path: file,
            format: p.format,
            rows: p.rows.len(),
            blank_lines: p.blank_lines,
            problems: p.problems.clone(),
        });
        parsed.push((split, p));
    }
    if !parsed.iter().any(|(s, _)| *s == SplitName::Valid) {
        report.notes.push("no valid.jsonl: training holds out a fraction of the training rows for validation".into());
    }
    let Some(model) = model else {
        report.notes.push("load a model to see token counts, the length histogram and the templated preview".into());
        return Ok(report);
    };
    report.tokenizer_model = Some(model.source.path().to_path_buf());
    if model.chat_template.is_none() && parsed.iter().any(|(_, p)| p.format != Some(DatasetFormat::Text)) {
        report.notes.push(tokenize::FALLBACK_TEMPLATE_NOTE.into());
    }
    // Lengths before truncation, so the histogram can show what a shorter max_seq_len would cut.
    let full = TokenizeSpec::for_model(model, usize::MAX / 2, train_on_prompt);
    if let Some((_, train)) = parsed.first() {
        if train.rows.len() > MAX_STAT_ROWS {
            report.notes.push(format!("token statistics from the first {MAX_STAT_ROWS} of {} rows", train.rows.len()));
        }
        report.tokens = Some(token_stats(train, &full, max_seq_len));
    }
    report.warnings = stop_warnings(&parsed, &full, model);
    let cut = TokenizeSpec { max_seq_len: max_seq_len.max(2), ..full };
    report.preview = preview_rows_of(&parsed, &cut, model, preview_rows);
    Ok(report)
}

/// Rows checked by the end-of-sequence doctor (the first of the training split).
const DOCTOR_ROWS: usize = 200;

/// The doctor's warnings for the model and the first [`DOCTOR_ROWS`] training rows, tokenized untruncated.
fn stop_warnings(parsed: &[(SplitName, ParsedFile)], full: &TokenizeSpec<'_>, model: &LoadedModel) -> Vec<StopWarning> {
    let rows = parsed.first().map(|(_, p)| p.rows.as_slice()).unwrap_or_default();
    let examples: Vec<_> =
        rows.iter().take(DOCTOR_ROWS).filter_map(|r| tokenize::tokenize_row(&r.row, full).ok()).collect();
    eos_doctor::check_training(model, &examples)
}

/// Lengths, truncation and target counts of (up to [`MAX_STAT_ROWS`]) training rows.
fn token_stats(train: &ParsedFile, full: &TokenizeSpec<'_>, max_seq_len: usize) -> TokenStats {
    let mut stats = TokenStats { max_seq_len, ..Default::default() };
    for sourced in train.rows.iter().take(MAX_STAT_ROWS) {
        match tokenize::tokenize_row(&sourced.row, full) {
            Ok(example) => {
                let len = example.len();
                let cut = example.cut(max_seq_len);
                stats.lengths.push(len);
                stats.total_tokens += len.min(max_seq_len);
                stats.truncated += usize::from(cut.truncated);
                stats.target_tokens += cut.target_tokens;
                stats.dropped += usize::from(cut.dropped());
            }
            Err(e) => {
                stats.failures.push(RowProblem { path: train.path.clone(), line: sourced.line, message: e.to_string() })
            }
        }
    }
    stats
}

/// The first `limit` rows that tokenize, as trained/masked pieces.
fn preview_rows_of(
    parsed: &[(SplitName, ParsedFile)],
    spec: &TokenizeSpec<'_>,
    model: &LoadedModel,
    limit: usize,
) -> Vec<PreviewRow> {
    let rows = parsed.iter().flat_map(|(split, file)| file.rows.iter().map(move |r| (*split, r)));
    rows.filter_map(|(split, sourced)| {
        let (tokens, truncated, pieces) = preview(&sourced.row, spec, model).ok()?;
        Some(PreviewRow { split, line: sourced.line, tokens, truncated, pieces })
    })
    .take(limit)
    .collect()
}

/// (tokens, truncated, pieces) of one row.
type Preview = (usize, bool, Vec<(String, bool)>);

fn preview(row: &Row, spec: &TokenizeSpec<'_>, model: &LoadedModel) -> Result<Preview> {
    let example = tokenize::tokenize_row(row, spec)?;
    let pieces = tokenize::preview_example(&example, &model.tokenizer)?;
    Ok((example.len(), example.truncated, pieces))
}
