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
    /// The (first) file of the split.
    pub path: PathBuf,
    /// Every file of the split, in the order read (shards of one split).
    #[serde(default)]
    pub files: Vec<PathBuf>,
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
    /// Histogram of training example lengths, with `max_seq_len` marked.
    pub fn length_histogram(&self) -> LengthHistogram {
        length_histogram(&self.train.lengths, self.max_seq_len)
    }
}

/// Token lengths in equal-width bins from 0 to the longest length (or `max_seq_len`, whichever is larger):
/// what the dataset page draws, with the bins past `max_seq_len` shown as cut.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LengthHistogram {
    pub bin_width: usize,
    /// (first length of the bin, rows in it), in order.
    pub bins: Vec<(usize, usize)>,
    pub max_seq_len: usize,
}

/// Bin `lengths` with a "nice" width (1, 2, 4, 5, 8 or 10 times a power of ten) giving about 40 bins, so
/// `max_seq_len` falls on a bin edge when it is a round number.
pub fn length_histogram(lengths: &[usize], max_seq_len: usize) -> LengthHistogram {
    let longest = lengths.iter().max().copied().unwrap_or(0).max(max_seq_len).max(1);
    let raw = (longest as f64 / 40.0).max(1.0);
    let magnitude = 10f64.powf(raw.log10().floor());
    let bin_width = [1.0, 2.0, 4.0, 5.0, 8.0, 10.0]
        .iter()
        .map(|m| (m * magnitude) as usize)
        .find(|w| *w as f64 >= raw)
        .unwrap_or((10.0 * magnitude) as usize)
        .max(1);
    let n = longest / bin_width + 1;
    let mut counts = vec![0usize; n];
    for &l in lengths {
        counts[(l / bin_width).min(n - 1)] += 1;
    }
    LengthHistogram {
        bin_width,
        bins: counts.into_iter().enumerate().map(|(i, c)| (i * bin_width, c)).collect(),
        max_seq_len,
    }
}
