//! What the studio and CLI show about a dataset before a run: per-split row, token and truncation counts,
//! problems, notes, and a length histogram.

use super::formats::{DatasetFormat, RowProblem};
use super::SplitName;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// Token statistics of one split.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SplitSummary {
    pub name: SplitName,
    pub path: PathBuf,
    pub format: Option<DatasetFormat>,
    pub carved_from_train: bool,
    /// Valid rows read into this split.
    pub rows: usize,
    /// Rows skipped as invalid (at reading or at templating).
    pub skipped_rows: usize,
    /// Examples kept after tokenization.
    pub examples: usize,
    /// Rows cut to `max_seq_len` (dropped ones included).
    pub truncated: usize,
    /// Rows dropped because no target token was left (usually after truncation).
    pub dropped: usize,
    /// Tokens of the kept examples (unpadded).
    pub tokens: usize,
    pub target_tokens: usize,
    /// Token length of each kept example, in example order: feed to [`length_histogram`].
    pub lengths: Vec<usize>,
}

/// What the studio and the CLI show about a prepared dataset.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DatasetSummary {
    pub source: PathBuf,
    /// The training file's format.
    pub format: DatasetFormat,
    pub train: SplitSummary,
    pub valid: Option<SplitSummary>,
    pub test: Option<SplitSummary>,
    pub skipped_rows: usize,
    /// The first `max_listed_problems` problems of the skipped rows.
    pub problems: Vec<RowProblem>,
    pub total_problems: usize,
    /// Over all splits.
    pub truncated: usize,
    pub dropped: usize,
    /// Training tokens in one epoch (unpadded) and how many of them are targets.
    pub tokens_per_epoch: usize,
    pub target_tokens_per_epoch: usize,
    pub max_seq_len: usize,
    /// Things the user should know: held-out validation, fallback template, skipped rows.
    pub notes: Vec<String>,
}

impl DatasetSummary {
    /// Histogram of training example lengths.
    pub fn length_histogram(&self, bins: usize) -> Vec<HistogramBin> {
        length_histogram(&self.train.lengths, bins)
    }
}

/// One bar of a length histogram: lengths in `min_len..=max_len`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistogramBin {
    pub min_len: usize,
    pub max_len: usize,
    pub count: usize,
}

/// Equal-width bins from the shortest to the longest length.
pub fn length_histogram(lengths: &[usize], bins: usize) -> Vec<HistogramBin> {
    let (Some(&lo), Some(&hi)) = (lengths.iter().min(), lengths.iter().max()) else {
        return Vec::new();
    };
    let bins = bins.max(1).min(hi - lo + 1);
    let width = (hi - lo + 1).div_ceil(bins);
    let mut out: Vec<HistogramBin> = (0..bins)
        .map(|b| HistogramBin { min_len: lo + b * width, max_len: (lo + (b + 1) * width - 1).min(hi), count: 0 })
        .filter(|bin| bin.min_len <= hi)
        .collect();
    for &l in lengths {
        let b = ((l - lo) / width).min(out.len() - 1);
        out[b].count += 1;
    }
    out
}
