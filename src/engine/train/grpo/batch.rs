//! A step's completions (the rollout) and how they become training batches: each completion is its prompt's
//! ids followed by the completion's, right-padded; the scored tokens are the completion's (through its first
//! eos, which is part of it, as TRL masks them).

use crate::engine::data::Batch;
use crate::engine::{Error, Result};

/// One sampled completion.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Completion {
    /// The prompt's index in the training split.
    pub prompt: usize,
    pub prompt_ids: Vec<u32>,
    /// The completion's tokens, its eos included when it has one; never empty.
    pub ids: Vec<u32>,
    /// Ended with an eos (false: cut at `max_new_tokens`).
    pub finished: bool,
    pub text: String,
}

/// The completions a batch of `num_iterations` steps trains on, with what their objective needs. Prompt-major:
/// prompt i's `group` completions are `completions[i * group..(i + 1) * group]`; micro-batch m is the next
/// `micro_sizes[m]` completions (whole groups; a step's micro-batches need not be the same size: an epoch's last
/// batch of prompts is smaller and falls anywhere in the shuffled order).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Rollout {
    pub group: usize,
    pub micro_sizes: Vec<usize>,
    pub completions: Vec<Completion>,
    /// Each reward of each completion (unweighted), and their weighted sums.
    pub rewards: Vec<Vec<f64>>,
    pub reward_totals: Vec<f64>,
    pub advantages: Vec<f64>,
    pub zero_std_groups: f64,
    /// The sampling policy's per-token log-probabilities (computed when the batch is used more than once).
    pub old_logps: Option<Vec<Vec<f64>>>,
    /// The reference's (with beta > 0).
    pub ref_logps: Option<Vec<Vec<f64>>>,
    /// Seconds spent generating and scoring.
    pub generation_secs: f64,
    pub reward_secs: f64,
}

/// A micro-batch of completions ready for the model: the batch, and for each scored token its flat source
/// position, its id and (completion index, token index).
pub struct ScoredBatch {
    pub batch: Batch,
    pub sources: Vec<u32>,
    pub targets: Vec<u32>,
    pub owners: Vec<(usize, usize)>,
}

impl Rollout {
    /// The completion index ranges of the micro-batches.
    pub fn micro_ranges(&self) -> Vec<std::ops::Range<usize>> {
        let mut start = 0;
        self.micro_sizes
            .iter()
            .map(|&size| {
                let range = start..(start + size).min(self.completions.len());
                start += size;
                range
            })
            .collect()
    }

    /// The completion lengths of each micro-batch (what the loss types normalise with).
    pub fn micro_lengths(&self) -> Vec<Vec<usize>> {
        self.micro_ranges().into_iter().map(|r| self.completions[r].iter().map(|c| c.ids.len()).collect()).collect()
    }

    /// Pad completions `range` (prompt + completion) into one batch, right-padded with `pad_id`.
    pub fn collate(&self, range: std::ops::Range<usize>, pad_id: u32) -> Result<ScoredBatch> {
        let rows = &self.completions[range.clone()];
        if rows.is_empty() {
            return Err(Error::Training("an empty GRPO micro-batch".into()));
        }
        let seq_len = rows.iter().map(|c| c.prompt_ids.len() + c.ids.len()).max().unwrap_or(0);
        let mut batch = Batch {
            input_ids: Vec::with_capacity(rows.len() * seq_len),
            target_mask: Vec::with_capacity(rows.len() * seq_len),
            batch_size: rows.len(),
            seq_len,
            target_tokens: 0,
            lengths: Vec::with_capacity(rows.len()),
            row_starts: None,
        };
        let (mut sources, mut targets, mut owners) = (Vec::new(), Vec::new(), Vec::new());
        for (r, c) in rows.iter().enumerate() {
            let p = c.prompt_ids.len();
            if p == 0 {
                return Err(Error::Training(format!("prompt {} has no tokens", c.prompt)));
            }
            let len = p + c.ids.len();
            batch.input_ids.extend(c.prompt_ids.iter().chain(&c.ids).copied());
            batch.input_ids.extend(std::iter::repeat_n(pad_id, seq_len - len));
            batch.target_mask.extend((0..seq_len).map(|j| if j >= p && j < len { 1.0 } else { 0.0 }));
            batch.lengths.push(len);
            for (t, &id) in c.ids.iter().enumerate() {
                sources.push((r * seq_len + p + t - 1) as u32);
                targets.push(id);
                owners.push((range.start + r, t));
            }
        }
        batch.target_tokens = targets.len();
        Ok(ScoredBatch { batch, sources, targets, owners })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn completion(prompt: usize, prompt_ids: Vec<u32>, ids: Vec<u32>) -> Completion {
        Completion { prompt, prompt_ids, ids, finished: true, text: String::new() }
    }

    #[test]
    fn collate_scores_the_completion_tokens_only() {
        let rollout = Rollout {
            group: 2,
            micro_sizes: vec![2],
            completions: vec![completion(0, vec![5, 6], vec![7, 2]), completion(0, vec![5, 6], vec![8])],
            rewards: vec![],
            reward_totals: vec![],
            advantages: vec![],
            zero_std_groups: 0.0,
            old_logps: None,
            ref_logps: None,
            generation_secs: 0.0,
            reward_secs: 0.0,
        };
        let s = rollout.collate(0..2, 0).unwrap();
        assert_eq!(s.batch.input_ids, [5, 6, 7, 2, 5, 6, 8, 0]);
        assert_eq!(s.sources, [1, 2, 5]);
        assert_eq!(s.targets, [7, 2, 8]);
        assert_eq!(s.owners, [(0, 0), (0, 1), (1, 0)]);
        assert_eq!(rollout.micro_lengths(), vec![vec![2, 1]]);
        // A step's micro-batches may differ in size (an epoch's short last batch of prompts, anywhere in it).
        let uneven = Rollout { micro_sizes: vec![1, 1], ..rollout };
        assert_eq!(uneven.micro_ranges(), vec![0..1, 1..2]);
    }
}
