//! Batching: which examples go together, in what order, for how long, and how to pick up exactly where an
//! interrupted run stopped. Batches are index lists until [`collate`] pads them into a tensor-free [`Batch`].
//!
//! Each epoch is a pure function of `(seed, epoch)`: shuffle all examples, sort by length inside windows of
//! `bucket_window_batches` batches (so batches hold similar lengths and waste little padding), cut into
//! batches, then shuffle the batch order. A [`DataCursor`] `(epoch, batch_index, seed)` therefore names a
//! batch for good, and resuming from it replays the same sequence an uninterrupted run would have seen.
//! The random generator is our own SplitMix64, so the order does not change with a `rand` upgrade.

use super::tokenize::Example;
use crate::engine::{Error, Result};
use serde::{Deserialize, Serialize};

/// A position in the batch sequence: the next batch to train on. Save it with a checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct DataCursor {
    pub epoch: usize,
    pub batch_index: usize,
    pub seed: u64,
}

/// How long training runs over the data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Schedule {
    /// Whole passes over the training set.
    Epochs(usize),
    /// A fixed number of batches (optimizer micro-steps), wrapping into as many epochs as needed.
    Iterations(usize),
}

/// Batching settings.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct BatchOptions {
    pub batch_size: usize,
    pub seed: u64,
    /// Examples are sorted by length within windows of this many batches; 1 turns bucketing off.
    pub bucket_window_batches: usize,
    /// Drop the last, smaller batch of each epoch instead of training on it.
    pub drop_last: bool,
    pub schedule: Schedule,
}

impl Default for BatchOptions {
    fn default() -> Self {
        Self { batch_size: 4, seed: 0, bucket_window_batches: 16, drop_last: false, schedule: Schedule::Epochs(1) }
    }
}

/// The deterministic batch order for a set of example lengths.
#[derive(Debug, Clone)]
pub struct BatchPlan {
    lengths: Vec<usize>,
    options: BatchOptions,
}

/// One batch from [`BatchIter`]: the example indices, where it sits, and the cursor to save once it has
/// been trained on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedBatch {
    pub indices: Vec<usize>,
    /// The position of this batch.
    pub cursor: DataCursor,
    /// The position after this batch: what a checkpoint written after training on it should store.
    pub next: DataCursor,
    /// Batches trained before this one since the start of the run (0-based step).
    pub step: usize,
}

impl BatchPlan {
    /// A plan over examples of the given token lengths.
    pub fn new(lengths: Vec<usize>, options: BatchOptions) -> Result<Self> {
        if lengths.is_empty() {
            return Err(Error::Data("no training examples to batch".into()));
        }
        if options.batch_size == 0 {
            return Err(Error::InvalidSetting("batch_size must be at least 1".into()));
        }
        if options.drop_last && lengths.len() < options.batch_size {
            return Err(Error::InvalidSetting(format!(
                "batch_size is {} but there are only {} training examples; lower batch_size or turn off drop_last",
                options.batch_size,
                lengths.len()
            )));
        }
        match options.schedule {
            Schedule::Epochs(0) => return Err(Error::InvalidSetting("epochs must be at least 1".into())),
            Schedule::Iterations(0) => return Err(Error::InvalidSetting("iterations must be at least 1".into())),
            _ => {}
        }
        Ok(Self { lengths, options })
    }

    pub fn options(&self) -> &BatchOptions {
        &self.options
    }

    pub fn num_examples(&self) -> usize {
        self.lengths.len()
    }

    pub fn batches_per_epoch(&self) -> usize {
        let (n, b) = (self.lengths.len(), self.options.batch_size);
        if self.options.drop_last {
            n / b
        } else {
            n.div_ceil(b)
        }
    }

    /// Batches in the whole run.
    pub fn total_batches(&self) -> usize {
        match self.options.schedule {
            Schedule::Epochs(epochs) => epochs * self.batches_per_epoch(),
            Schedule::Iterations(iterations) => iterations,
        }
    }

    /// Where a fresh run starts.
    pub fn start(&self) -> DataCursor {
        DataCursor { epoch: 0, batch_index: 0, seed: self.options.seed }
    }

    /// Batches trained before `cursor`.
    pub fn steps_done(&self, cursor: &DataCursor) -> usize {
        cursor.epoch * self.batches_per_epoch() + cursor.batch_index
    }

    /// The batches of one epoch, in training order.
    pub fn epoch_batches(&self, epoch: usize) -> Vec<Vec<usize>> {
        let BatchOptions { batch_size, seed, bucket_window_batches, drop_last, .. } = self.options;
        let mut rng = SplitMix64::new(seed ^ (epoch as u64 + 1).wrapping_mul(0xD1B5_4A32_D192_ED03));
        let mut order: Vec<usize> = (0..self.lengths.len()).collect();
        rng.shuffle(&mut order);
        let window = batch_size.saturating_mul(bucket_window_batches.max(1));
        for chunk in order.chunks_mut(window) {
            // Stable sort: ties keep their shuffled order.
            chunk.sort_by_key(|&i| self.lengths[i]);
        }
        let mut batches: Vec<Vec<usize>> = order.chunks(batch_size).map(<[usize]>::to_vec).collect();
        if drop_last && batches.last().is_some_and(|b| b.len() < batch_size) {
            batches.pop();
        }
        rng.shuffle(&mut batches);
        batches
    }

    /// Batches from the start of the run.
    pub fn iter(&self) -> BatchIter<'_> {
        BatchIter { plan: self, cursor: self.start(), epoch_cache: None, remaining: self.total_batches() }
    }

    /// Batches from a saved cursor on, exactly as an uninterrupted run would have continued.
    pub fn iter_from(&self, cursor: DataCursor) -> Result<BatchIter<'_>> {
        if cursor.seed != self.options.seed {
            return Err(Error::InvalidSetting(format!(
                "the saved data position was made with seed {} but this run uses seed {}; resume with the same \
                 seed",
                cursor.seed, self.options.seed
            )));
        }
        let per_epoch = self.batches_per_epoch();
        if cursor.batch_index > per_epoch {
            return Err(Error::InvalidSetting(format!(
                "the saved data position is batch {} of epoch {}, but an epoch now has {per_epoch} batches; the \
                 dataset or batch size changed since the checkpoint",
                cursor.batch_index, cursor.epoch
            )));
        }
        let remaining = self.total_batches().saturating_sub(self.steps_done(&cursor));
        Ok(BatchIter { plan: self, cursor, epoch_cache: None, remaining })
    }
}

/// Iterator over a [`BatchPlan`]; computes each epoch's order once.
#[derive(Debug)]
pub struct BatchIter<'a> {
    plan: &'a BatchPlan,
    cursor: DataCursor,
    epoch_cache: Option<(usize, Vec<Vec<usize>>)>,
    remaining: usize,
}

impl BatchIter<'_> {
    /// The next batch's position (what to save if the run stopped now).
    pub fn cursor(&self) -> DataCursor {
        self.cursor
    }

    pub fn remaining(&self) -> usize {
        self.remaining
    }
}

impl Iterator for BatchIter<'_> {
    type Item = PlannedBatch;

    fn next(&mut self) -> Option<PlannedBatch> {
        if self.remaining == 0 {
            return None;
        }
        let per_epoch = self.plan.batches_per_epoch();
        if self.cursor.batch_index >= per_epoch {
            self.cursor.epoch += 1;
            self.cursor.batch_index = 0;
        }
        let epoch = self.cursor.epoch;
        if self.epoch_cache.as_ref().map(|(e, _)| *e) != Some(epoch) {
            self.epoch_cache = Some((epoch, self.plan.epoch_batches(epoch)));
        }
        let indices = self.epoch_cache.as_ref()?.1.get(self.cursor.batch_index)?.clone();
        let cursor = self.cursor;
        let mut next = cursor;
        next.batch_index += 1;
        if next.batch_index >= per_epoch {
            next.epoch += 1;
            next.batch_index = 0;
        }
        self.cursor = next;
        self.remaining -= 1;
        Some(PlannedBatch { indices, cursor, next, step: self.plan.steps_done(&cursor) })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.remaining, Some(self.remaining))
    }
}

/// Batches for evaluation: every example once, sorted by length so padding stays small.
pub fn eval_batches(lengths: &[usize], batch_size: usize) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..lengths.len()).collect();
    order.sort_by_key(|&i| lengths[i]);
    order.chunks(batch_size.max(1)).map(<[usize]>::to_vec).collect()
}

/// A padded batch, row-major `batch_size x seq_len`, ready to become tensors.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    pub input_ids: Vec<u32>,
    /// 1.0 where the token is a training target (see [`Example::target_mask`]), 0.0 elsewhere and on padding.
    pub target_mask: Vec<f32>,
    pub batch_size: usize,
    pub seq_len: usize,
    /// Number of 1.0 entries in `target_mask`.
    pub target_tokens: usize,
    /// Unpadded length of each row.
    pub lengths: Vec<usize>,
    /// Packed rows (`data::packing`): for every token, where its own example begins in its row. None: one
    /// example per row.
    pub row_starts: Option<Vec<u32>>,
}

/// Pad the examples at `indices` to the longest of them with `pad_id` (right padding; pads are never
/// targets, and causal attention keeps them from affecting real tokens).
pub fn collate(examples: &[Example], indices: &[usize], pad_id: u32) -> Result<Batch> {
    if indices.is_empty() {
        return Err(Error::Data("cannot build an empty batch".into()));
    }
    let rows: Vec<&Example> = indices
        .iter()
        .map(|&i| {
            examples.get(i).ok_or_else(|| {
                Error::Data(format!("batch refers to example {i} but there are only {}", examples.len()))
            })
        })
        .collect::<Result<_>>()?;
    collate_rows(&rows, pad_id)
}

/// Pad `rows` (in order) into one batch; see [`collate`].
pub fn collate_rows(rows: &[&Example], pad_id: u32) -> Result<Batch> {
    if rows.is_empty() {
        return Err(Error::Data("cannot build an empty batch".into()));
    }
    let seq_len = rows.iter().map(|e| e.len()).max().unwrap_or(0);
    let mut input_ids = vec![pad_id; rows.len() * seq_len];
    let mut target_mask = vec![0.0f32; rows.len() * seq_len];
    let mut target_tokens = 0;
    for (r, example) in rows.iter().enumerate() {
        target_tokens += place_example(example, r * seq_len, &mut input_ids, &mut target_mask);
    }
    Ok(Batch {
        input_ids,
        target_mask,
        batch_size: rows.len(),
        seq_len,
        target_tokens,
        lengths: rows.iter().map(|e| e.len()).collect(),
        row_starts: None,
    })
}

/// Write `example`'s ids and targets into a batch's flat `input_ids` and `target_mask` from index `at`: the number
/// of targets it placed. Its first token is never a target: it has nothing of its own to be predicted from,
/// whatever the example says (position 0 of a row, or an example's start in a packed row).
pub(super) fn place_example(example: &Example, at: usize, input_ids: &mut [u32], target_mask: &mut [f32]) -> usize {
    input_ids[at..at + example.len()].copy_from_slice(&example.input_ids);
    let mut targets = 0;
    for (j, &t) in example.target_mask.iter().enumerate().take(example.len()) {
        if t && j > 0 {
            target_mask[at + j] = 1.0;
            targets += 1;
        }
    }
    targets
}

/// SplitMix64 (Steele, Lea & Flood 2014): tiny, fast, and fixed forever, unlike `rand`'s `StdRng`.
#[derive(Debug, Clone)]
pub(crate) struct SplitMix64(u64);

impl SplitMix64 {
    pub(crate) fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (Lemire's multiply-shift; the bias is below 2^-40 for any dataset size).
    fn below(&mut self, n: usize) -> usize {
        ((self.next_u64() as u128 * n as u128) >> 64) as usize
    }

    /// Fisher-Yates.
    pub(crate) fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i + 1);
            items.swap(i, j);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lengths(n: usize) -> Vec<usize> {
        (0..n).map(|i| 5 + (i * 37) % 50).collect()
    }

    fn options(batch_size: usize, seed: u64, schedule: Schedule) -> BatchOptions {
        BatchOptions { batch_size, seed, schedule, ..BatchOptions::default() }
    }

    #[test]
    fn each_epoch_covers_every_example_once_with_length_buckets() {
        let plan = BatchPlan::new(lengths(103), options(8, 7, Schedule::Epochs(2))).unwrap();
        assert_eq!(plan.batches_per_epoch(), 13);
        let epoch = plan.epoch_batches(0);
        let mut seen: Vec<usize> = epoch.iter().flatten().copied().collect();
        seen.sort_unstable();
        assert_eq!(seen, (0..103).collect::<Vec<_>>());
        assert_eq!(epoch.iter().filter(|b| b.len() < 8).count(), 1);
        let spread: usize = epoch
            .iter()
            .map(|b| {
                let l: Vec<usize> = b.iter().map(|&i| plan.lengths[i]).collect();
                l.iter().max().unwrap() - l.iter().min().unwrap()
            })
            .sum();
        assert!(spread / 13 < 10, "bucketing should keep lengths close, mean spread {}", spread / 13);
        assert_ne!(plan.epoch_batches(1), epoch, "epochs are shuffled differently");
    }

    #[test]
    fn same_seed_same_batches_other_seed_other_batches() {
        let a: Vec<_> = BatchPlan::new(lengths(50), options(4, 1, Schedule::Epochs(3))).unwrap().iter().collect();
        let b: Vec<_> = BatchPlan::new(lengths(50), options(4, 1, Schedule::Epochs(3))).unwrap().iter().collect();
        let c: Vec<_> = BatchPlan::new(lengths(50), options(4, 2, Schedule::Epochs(3))).unwrap().iter().collect();
        assert_eq!(a.len(), 39);
        assert_eq!(a, b);
        assert_ne!(a.iter().map(|p| &p.indices).collect::<Vec<_>>(), c.iter().map(|p| &p.indices).collect::<Vec<_>>());
        assert_eq!(a.last().unwrap().cursor, DataCursor { epoch: 2, batch_index: 12, seed: 1 });
        assert_eq!(a.iter().map(|p| p.step).collect::<Vec<_>>(), (0..39).collect::<Vec<_>>());
    }

    #[test]
    fn resuming_from_a_saved_cursor_continues_the_same_sequence() {
        let plan = BatchPlan::new(lengths(30), options(4, 42, Schedule::Iterations(25))).unwrap();
        let full: Vec<PlannedBatch> = plan.iter().collect();
        assert_eq!(full.len(), 25, "iterations wrap into later epochs");
        for stop_after in [1, 7, 8, 16, 24] {
            // Save the cursor through JSON, as a checkpoint would, and resume in a "new process".
            let saved = serde_json::to_string(&full[stop_after - 1].next).unwrap();
            let cursor: DataCursor = serde_json::from_str(&saved).unwrap();
            let replan = BatchPlan::new(lengths(30), options(4, 42, Schedule::Iterations(25))).unwrap();
            let resumed: Vec<PlannedBatch> = replan.iter_from(cursor).unwrap().collect();
            assert_eq!(resumed, full[stop_after..].to_vec(), "stopped after {stop_after}");
        }
        let wrong_seed = DataCursor { seed: 3, ..full[3].next };
        assert!(plan.iter_from(wrong_seed).unwrap_err().to_string().contains("seed"));
    }

    #[test]
    fn collate_pads_and_never_targets_padding() {
        let examples = vec![
            Example { input_ids: vec![1, 2, 3], target_mask: vec![true, true, false], truncated: false },
            Example {
                input_ids: vec![4, 5, 6, 7, 8],
                target_mask: vec![false, false, true, true, true],
                truncated: false,
            },
        ];
        let batch = collate(&examples, &[0, 1], 0).unwrap();
        assert_eq!((batch.batch_size, batch.seq_len, batch.target_tokens), (2, 5, 4));
        assert_eq!(batch.input_ids, vec![1, 2, 3, 0, 0, 4, 5, 6, 7, 8]);
        assert_eq!(batch.target_mask, vec![0., 1., 0., 0., 0., 0., 0., 1., 1., 1.]);
        assert_eq!(batch.lengths, vec![3, 5]);
        assert!(collate(&examples, &[2], 0).is_err());
    }

    #[test]
    fn bad_settings_are_refused() {
        assert!(BatchPlan::new(vec![], BatchOptions::default()).is_err());
        assert!(BatchPlan::new(vec![3], options(0, 0, Schedule::Epochs(1))).is_err());
        assert!(BatchPlan::new(vec![3], options(1, 0, Schedule::Iterations(0))).is_err());
        let drop = BatchOptions { drop_last: true, ..options(4, 0, Schedule::Epochs(1)) };
        assert!(BatchPlan::new(vec![3, 4], drop).is_err());
        assert_eq!(BatchPlan::new(vec![3; 9], drop).unwrap().batches_per_epoch(), 2);
        assert_eq!(eval_batches(&[5, 1, 3], 2), vec![vec![1, 2], vec![0]]);
    }
}
