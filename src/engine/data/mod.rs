//! Datasets for LoRA training: reading and validating JSONL ([`formats`]), splitting into train / valid /
//! test, templating and prompt masking ([`tokenize`]), batching with a resumable cursor ([`batches`]), and
//! the [`DatasetSummary`] the studio and CLI show before a run.
//!
//! Input is a single `.jsonl` file or a folder with `train.jsonl` and optional `valid.jsonl` / `test.jsonl`
//! (mlx-lm's layout). Without a validation file a seeded fraction of the training rows is held out.

pub mod batches;
pub mod formats;
pub mod tokenize;

pub use batches::{collate, eval_batches, Batch, BatchIter, BatchOptions, BatchPlan, DataCursor, PlannedBatch, Schedule};
pub use formats::{parse_jsonl, read_jsonl, DatasetFormat, ParsedFile, Row, RowProblem, SourcedRow};
pub use tokenize::{preview_example, preview_row, tokenize_row, Example, TokenizeSpec};

use crate::engine::{Error, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// How a dataset is read, split and tokenized.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct DataOptions {
    /// Fraction of training rows held out for validation when there is no `valid.jsonl`; 0 holds out none.
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

/// The valid rows of one split, before tokenization.
#[derive(Debug, Clone)]
pub struct RawSplit {
    pub name: SplitName,
    /// The file the rows came from (`train.jsonl` for a held-out validation split).
    pub path: PathBuf,
    pub format: Option<DatasetFormat>,
    pub rows: Vec<SourcedRow>,
    /// Bad rows skipped under `skip_invalid_rows`.
    pub skipped_rows: usize,
    pub carved_from_train: bool,
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
/// unless `skip_invalid_rows` is set.
pub fn load_raw_dataset(path: &Path, options: &DataOptions) -> Result<RawDataset> {
    if !(0.0..1.0).contains(&options.valid_fraction) {
        return Err(Error::InvalidSetting(format!(
            "valid_fraction is {}; it must be at least 0 and below 1",
            options.valid_fraction
        )));
    }
    let (train_path, valid_path, test_path) = resolve_files(path)?;
    let train_file = read_jsonl(&train_path)?;
    let valid_file = valid_path.as_deref().map(read_jsonl).transpose()?;
    let test_file = test_path.as_deref().map(read_jsonl).transpose()?;

    let problems: Vec<RowProblem> = [Some(&train_file), valid_file.as_ref(), test_file.as_ref()]
        .into_iter()
        .flatten()
        .flat_map(|f| f.problems.iter().cloned())
        .collect();
    if !options.skip_invalid_rows {
        check_problems(&problems, options.max_listed_problems)?;
    }
    if train_file.rows.is_empty() {
        return Err(no_rows_error(&train_file));
    }

    let mut notes = Vec::new();
    let mut train = raw_split(SplitName::Train, train_file);
    let valid = match valid_file {
        Some(file) if !file.rows.is_empty() => Some(raw_split(SplitName::Valid, file)),
        Some(file) => {
            notes.push(format!("{} has no valid rows; holding out validation rows from training", file.path.display()));
            carve_valid(&mut train, options, &mut notes)
        }
        None => carve_valid(&mut train, options, &mut notes),
    };
    let test = test_file.map(|f| raw_split(SplitName::Test, f));
    if !problems.is_empty() {
        notes.push(format!("skipped {} invalid rows", problems.len()));
    }
    Ok(RawDataset { source: path.to_path_buf(), train, valid, test, problems, notes })
}

fn resolve_files(path: &Path) -> Result<(PathBuf, Option<PathBuf>, Option<PathBuf>)> {
    if !path.exists() {
        return Err(Error::MissingFile {
            path: path.to_path_buf(),
            what: "expected a .jsonl file or a folder with train.jsonl (and optional valid.jsonl, test.jsonl)".into(),
        });
    }
    if !path.is_dir() {
        return Ok((path.to_path_buf(), None, None));
    }
    let train = path.join("train.jsonl");
    if !train.is_file() {
        return Err(Error::MissingFile {
            path: train,
            what: "a dataset folder needs train.jsonl (valid.jsonl and test.jsonl are optional)".into(),
        });
    }
    let optional = |name: &str| Some(path.join(name)).filter(|p| p.is_file());
    Ok((train, optional("valid.jsonl"), optional("test.jsonl")))
}

fn raw_split(name: SplitName, file: ParsedFile) -> RawSplit {
    RawSplit {
        name,
        skipped_rows: file.problems.len(),
        path: file.path,
        format: file.format,
        rows: file.rows,
        carved_from_train: false,
    }
}

fn no_rows_error(file: &ParsedFile) -> Error {
    let message = match file.problems.first() {
        None => "the dataset is empty: no rows, only blank lines or nothing at all".to_string(),
        Some(first) => format!(
            "no valid rows: all {} rows are invalid and were skipped; the first: line {}: {}",
            file.problems.len(),
            first.line,
            first.message
        ),
    };
    Error::Dataset { path: file.path.clone(), line: first_line(file), message }
}

fn first_line(file: &ParsedFile) -> usize {
    file.problems.first().map(|p| p.line).unwrap_or(1)
}

/// The error for bad rows: one problem as a structured error, several as a list with the total count.
fn check_problems(problems: &[RowProblem], max_listed: usize) -> Result<()> {
    match problems {
        [] => Ok(()),
        [one] => Err(Error::Dataset { path: one.path.clone(), line: one.line, message: one.message.clone() }),
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
        notes.push("no validation split: there is no valid.jsonl and valid_fraction is 0".into());
        return None;
    }
    if n < 2 {
        notes.push("no validation split: there is no valid.jsonl and only one training row".into());
        return None;
    }
    let count = ((n as f64 * options.valid_fraction).round() as usize).clamp(1, n - 1);
    let mut order: Vec<usize> = (0..n).collect();
    batches::SplitMix64::new(options.seed ^ 0x5EED_0F_5A11D).shuffle(&mut order);
    let mut held_out = vec![false; n];
    for &i in &order[..count] {
        held_out[i] = true;
    }
    // Both halves keep file order, so line numbers read naturally.
    let (valid_rows, train_rows): (Vec<_>, Vec<_>) =
        std::mem::take(&mut train.rows).into_iter().zip(held_out).partition(|(_, held)| *held);
    train.rows = train_rows.into_iter().map(|(r, _)| r).collect();
    notes.push(format!(
        "no valid.jsonl: held out {count} of {n} rows of {} for validation (valid_fraction {}, seed {})",
        train.path.display(),
        options.valid_fraction,
        options.seed
    ));
    Some(RawSplit {
        name: SplitName::Valid,
        path: train.path.clone(),
        format: train.format,
        rows: valid_rows.into_iter().map(|(r, _)| r).collect(),
        skipped_rows: 0,
        carved_from_train: true,
    })
}

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

/// The tokenized examples of one split, with the source line of each.
#[derive(Debug, Clone)]
pub struct PreparedSplit {
    pub examples: Vec<Example>,
    pub source_lines: Vec<usize>,
}

impl PreparedSplit {
    pub fn lengths(&self) -> Vec<usize> {
        self.examples.iter().map(Example::len).collect()
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
    let mut problems = raw.problems;
    let mut notes = raw.notes;
    if spec.uses_fallback_template() && raw.train.format != Some(DatasetFormat::Text) {
        notes.push(tokenize::FALLBACK_TEMPLATE_NOTE.into());
    }
    let mut template_problems = Vec::new();
    let (train, train_summary) = tokenize_split(&raw.train, spec, &mut template_problems);
    let valid = raw.valid.as_ref().map(|s| tokenize_split(s, spec, &mut template_problems));
    let test = raw.test.as_ref().map(|s| tokenize_split(s, spec, &mut template_problems));
    if !options.skip_invalid_rows {
        check_problems(&template_problems, options.max_listed_problems)?;
    } else if !template_problems.is_empty() {
        notes.push(format!("skipped {} rows the chat template could not render", template_problems.len()));
    }
    problems.extend(template_problems);

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
    let truncated = splits().map(|s| s.truncated).sum::<usize>();
    let dropped = splits().map(|s| s.dropped).sum::<usize>();
    let skipped_rows = splits().map(|s| s.skipped_rows).sum::<usize>();
    if truncated > 0 {
        notes.push(format!("{truncated} rows were longer than max_seq_len {} and were cut", spec.max_seq_len));
    }
    if dropped > 0 {
        notes.push(format!("{dropped} rows had no target tokens left after truncation and were dropped"));
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
    Ok(PreparedDataset { train, valid, test, summary })
}

fn tokenize_split(
    split: &RawSplit,
    spec: &TokenizeSpec<'_>,
    problems: &mut Vec<RowProblem>,
) -> (PreparedSplit, SplitSummary) {
    let mut prepared = PreparedSplit { examples: Vec::new(), source_lines: Vec::new() };
    let mut summary = SplitSummary {
        name: split.name,
        path: split.path.clone(),
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
        match tokenize_row(&sourced.row, spec) {
            Ok(example) => {
                summary.truncated += usize::from(example.truncated);
                let targets = example.target_tokens();
                if targets == 0 {
                    summary.dropped += 1;
                    continue;
                }
                summary.tokens += example.len();
                summary.target_tokens += targets;
                summary.lengths.push(example.len());
                prepared.examples.push(example);
                prepared.source_lines.push(sourced.line);
            }
            Err(e) => {
                summary.skipped_rows += 1;
                problems.push(RowProblem { path: split.path.clone(), line: sourced.line, message: e.to_string() });
            }
        }
    }
    summary.examples = prepared.examples.len();
    (prepared, summary)
}

#[cfg(test)]
mod tests {
    use super::tokenize::tests::{byte_tokenizer, CHATML};
    use super::*;
    use crate::engine::model::chat_template::{ChatMessage, ChatTemplate};
    use crate::engine::model::tokenizer::TextTokenizer;

    fn chat_line(q: &str, a: &str) -> String {
        serde_json::json!({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]})
            .to_string()
    }

    fn write(dir: &Path, name: &str, lines: &[String]) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, lines.join("\n") + "\n").unwrap();
        path
    }

    fn rows(n: usize) -> Vec<String> {
        (0..n).map(|i| chat_line(&format!("question {i}"), &format!("answer {i}"))).collect()
    }

    #[test]
    fn bad_rows_fail_the_load_with_line_numbers_and_a_count() {
        let dir = tempfile::tempdir().unwrap();
        let mut lines = rows(3);
        for i in 0..12 {
            lines.push(format!("{{\"messages\": {i}}}"));
        }
        lines.insert(1, "{oops".into());
        let path = write(dir.path(), "data.jsonl", &lines);
        let err = load_raw_dataset(&path, &DataOptions::default()).unwrap_err().to_string();
        assert!(err.starts_with("13 invalid dataset rows:"), "{err}");
        assert!(err.contains("data.jsonl:2: invalid JSON at column 2"), "{err}");
        assert!(err.contains("data.jsonl:5: `messages` must be a list"), "{err}");
        assert!(err.contains("... and 3 more"), "{err}");
        assert!(err.contains("skip_invalid_rows"), "{err}");

        let one = write(dir.path(), "one.jsonl", &[chat_line("q", "a"), "{\"messages\": []}".into()]);
        match load_raw_dataset(&one, &DataOptions::default()) {
            Err(Error::Dataset { line, message, .. }) => assert_eq!((line, message.contains("empty conversation")), (2, true)),
            other => panic!("expected a Dataset error, got {other:?}"),
        }
    }

    #[test]
    fn skip_invalid_rows_skips_and_counts_them() {
        let dir = tempfile::tempdir().unwrap();
        let mut lines = rows(4);
        lines.push("{\"messages\": [{\"role\": \"user\", \"content\": \"no reply\"}]}".into());
        lines.push("not json".into());
        let path = write(dir.path(), "data.jsonl", &lines);
        let options = DataOptions { skip_invalid_rows: true, ..DataOptions::default() };
        let raw = load_raw_dataset(&path, &options).unwrap();
        assert_eq!(raw.problems.len(), 2);
        assert_eq!(raw.train.skipped_rows, 2);
        assert_eq!(raw.train.rows.len() + raw.valid.as_ref().unwrap().rows.len(), 4);

        let tok = byte_tokenizer();
        let template = ChatTemplate::new(CHATML.into(), None, None).unwrap();
        let spec = tokenize_spec(&tok, &template);
        let prepared = prepare_dataset(&path, &spec, &options).unwrap();
        let s = &prepared.summary;
        assert_eq!((s.skipped_rows, s.total_problems, s.problems.len()), (2, 2, 2));
        assert_eq!(s.problems[0].line, 5);
        assert!(s.notes.iter().any(|n| n.contains("skipped 2 invalid rows")), "{:?}", s.notes);
        let json = serde_json::to_string(s).unwrap();
        assert!(json.contains("\"format\":\"chat\""), "{json}");
    }

    fn tokenize_spec<'a>(tok: &'a TextTokenizer, template: &'a ChatTemplate) -> TokenizeSpec<'a> {
        TokenizeSpec {
            tokenizer: tok,
            chat_template: Some(template),
            eos_token_id: tok.token_to_id("<|im_end|>"),
            max_seq_len: 2048,
            train_on_prompt: false,
        }
    }

    #[test]
    fn empty_datasets_are_refused_clearly() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), "empty.jsonl", &["".into(), "   ".into()]);
        let err = load_raw_dataset(&path, &DataOptions::default()).unwrap_err().to_string();
        assert!(err.contains("the dataset is empty"), "{err}");
        let bad = write(dir.path(), "bad.jsonl", &["[]".into()]);
        let options = DataOptions { skip_invalid_rows: true, ..DataOptions::default() };
        let err = load_raw_dataset(&bad, &options).unwrap_err().to_string();
        assert!(err.contains("all 1 rows are invalid"), "{err}");
        let missing = load_raw_dataset(&dir.path().join("nope"), &options).unwrap_err().to_string();
        assert!(missing.contains("nope"), "{missing}");
        let folder = dir.path().join("folder");
        std::fs::create_dir(&folder).unwrap();
        let err = load_raw_dataset(&folder, &options).unwrap_err().to_string();
        assert!(err.contains("train.jsonl"), "{err}");
    }

    #[test]
    fn a_folder_with_train_valid_and_test_uses_them() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "train.jsonl", &rows(6));
        write(dir.path(), "valid.jsonl", &rows(2));
        write(dir.path(), "test.jsonl", &["{\"prompt\": \"p\", \"completion\": \"c\"}".into()]);
        let raw = load_raw_dataset(dir.path(), &DataOptions::default()).unwrap();
        assert_eq!(raw.train.rows.len(), 6);
        let valid = raw.valid.as_ref().unwrap();
        assert_eq!((valid.rows.len(), valid.carved_from_train), (2, false));
        assert!(valid.path.ends_with("valid.jsonl"));
        assert_eq!(raw.test.as_ref().unwrap().format, Some(DatasetFormat::Completions));

        let tok = byte_tokenizer();
        let template = ChatTemplate::new(CHATML.into(), None, None).unwrap();
        let prepared = prepare_dataset(dir.path(), &tokenize_spec(&tok, &template), &DataOptions::default()).unwrap();
        let s = &prepared.summary;
        assert_eq!((s.train.examples, s.valid.as_ref().unwrap().examples, s.test.as_ref().unwrap().examples), (6, 2, 1));
        assert_eq!(s.tokens_per_epoch, prepared.train.lengths().iter().sum::<usize>());
        assert!(s.target_tokens_per_epoch > 0 && s.target_tokens_per_epoch < s.tokens_per_epoch);
        assert_eq!(prepared.train.source_lines, vec![1, 2, 3, 4, 5, 6]);
    }

    #[test]
    fn without_valid_jsonl_a_seeded_validation_split_is_held_out() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), "data.jsonl", &rows(25));
        let raw = load_raw_dataset(&path, &DataOptions::default()).unwrap();
        let valid = raw.valid.as_ref().unwrap();
        assert!(valid.carved_from_train);
        assert_eq!((raw.train.rows.len(), valid.rows.len()), (22, 3));
        assert!(raw.notes.iter().any(|n| n.contains("held out 3 of 25 rows")), "{:?}", raw.notes);
        let lines = |s: &RawSplit| s.rows.iter().map(|r| r.line).collect::<Vec<_>>();
        let again = load_raw_dataset(&path, &DataOptions::default()).unwrap();
        assert_eq!(lines(valid), lines(again.valid.as_ref().unwrap()), "same seed, same hold-out");
        let other = load_raw_dataset(&path, &DataOptions { seed: 9, ..DataOptions::default() }).unwrap();
        assert_ne!(lines(valid), lines(other.valid.as_ref().unwrap()));

        let two = write(dir.path(), "two.jsonl", &rows(2));
        let raw = load_raw_dataset(&two, &DataOptions::default()).unwrap();
        assert_eq!((raw.train.rows.len(), raw.valid.unwrap().rows.len()), (1, 1));
        let one = write(dir.path(), "one.jsonl", &rows(1));
        let raw = load_raw_dataset(&one, &DataOptions::default()).unwrap();
        assert!(raw.valid.is_none());
        assert!(raw.notes[0].contains("only one training row"), "{:?}", raw.notes);
    }

    #[test]
    fn truncated_and_dropped_rows_are_counted() {
        let dir = tempfile::tempdir().unwrap();
        let long_answer = "x".repeat(200);
        let lines = vec![
            chat_line("short", "ok"),
            chat_line("q", &long_answer),
            chat_line(&"long question ".repeat(20), "a"),
        ];
        let path = write(dir.path(), "train.jsonl", &lines);
        let tok = byte_tokenizer();
        let template = ChatTemplate::new(CHATML.into(), None, None).unwrap();
        let options = DataOptions { max_seq_len: 100, valid_fraction: 0.0, ..DataOptions::default() };
        let prepared = prepare_dataset(&path, &tokenize_spec(&tok, &template), &options).unwrap();
        let s = &prepared.summary;
        assert_eq!((s.truncated, s.dropped, s.train.examples), (2, 1, 2));
        assert!(prepared.train.examples[1].truncated);
        assert_eq!(prepared.train.examples[1].len(), 100);
        assert_eq!(prepared.train.source_lines, vec![1, 2]);
        assert!(s.valid.is_none());
        let hist = s.length_histogram(4);
        assert_eq!(hist.iter().map(|b| b.count).sum::<usize>(), 2);
        assert_eq!(hist.last().unwrap().max_len, 100);
    }

    /// The sample dataset through a real loaded model (the tiny-llama fixture): `TokenizeSpec::for_model`,
    /// folder layout, every example ending in a trained `<|im_end|>`, batches that collate.
    #[test]
    fn sample_chat_dataset_with_a_loaded_model() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let (model_dir, data_dir) = (root.join("tests/fixtures/tiny-llama"), root.join("assets/sample-chat"));
        if !model_dir.join("model.safetensors").exists() || !data_dir.join("train.jsonl").exists() {
            eprintln!("skipped: tests/fixtures/tiny-llama or assets/sample-chat is absent");
            return;
        }
        let model = crate::engine::model::load_model(&model_dir, &candle_core::Device::Cpu, candle_core::DType::F32)
            .unwrap();
        let spec = TokenizeSpec::for_model(&model, 512, false);
        let prepared = prepare_dataset(&data_dir, &spec, &DataOptions::default()).unwrap();
        let s = &prepared.summary;
        assert_eq!((s.format, s.train.rows, s.valid.as_ref().map(|v| v.rows)), (DatasetFormat::Chat, 135, Some(17)));
        assert_eq!((s.truncated, s.dropped, s.skipped_rows), (0, 0, 0));
        let im_end = model.tokenizer.token_to_id("<|im_end|>").unwrap();
        for e in &prepared.train.examples {
            let last_trained = e.target_mask.iter().rposition(|&t| t).unwrap();
            assert_eq!(e.input_ids[last_trained], im_end);
        }
        let plan = BatchPlan::new(prepared.train.lengths(), BatchOptions { batch_size: 8, ..BatchOptions::default() })
            .unwrap();
        let total: usize = plan
            .iter()
            .map(|b| collate(&prepared.train.examples, &b.indices, 0).unwrap().target_tokens)
            .sum();
        assert_eq!(total, s.target_tokens_per_epoch);
    }

    /// The real SmolLM2 chat template and tokenizer: `$METAL_CANDLE_SMOLLM2`, else the GGUF that
    /// `scripts/fetch_smollm2.sh` puts in models/smollm2/.
    #[test]
    fn smollm2_masks_both_replies() {
        let path = std::env::var("METAL_CANDLE_SMOLLM2").map(PathBuf::from).unwrap_or_else(|_| {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("models/smollm2/SmolLM2-135M-Instruct-Q4_1.gguf")
        });
        if !path.exists() {
            eprintln!("skipped: {} is absent (run scripts/fetch_smollm2.sh)", path.display());
            return;
        }
        let model = crate::engine::model::load_model(&path, &candle_core::Device::Cpu, candle_core::DType::F32).unwrap();
        let spec = TokenizeSpec::for_model(&model, 512, false);
        let row = Row::Chat(vec![
            ChatMessage::new("user", "Capital of France?"),
            ChatMessage::new("assistant", "Paris."),
            ChatMessage::new("user", "And of Italy?"),
            ChatMessage::new("assistant", "Rome."),
        ]);
        let pieces = preview_row(&row, &spec).unwrap();
        let trained: String = pieces.iter().filter(|(_, t)| *t).map(|(p, _)| p.as_str()).collect();
        println!("{pieces:?}");
        assert_eq!(trained, "Paris.<|im_end|>Rome.<|im_end|>");
    }

    #[test]
    fn histogram_bins_cover_all_lengths() {
        let bins = length_histogram(&[1, 2, 3, 10, 10], 3);
        assert_eq!(bins.iter().map(|b| b.count).collect::<Vec<_>>(), vec![3, 0, 2]);
        assert_eq!((bins[0].min_len, bins[2].max_len), (1, 10));
        assert!(length_histogram(&[], 5).is_empty());
        assert_eq!(length_histogram(&[7, 7], 5).len(), 1);
    }
}
