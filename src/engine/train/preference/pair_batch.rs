//! Which tokens of a preference batch a method scores, and how their NLLs become per-pair log-probabilities and
//! back into per-token loss weights. A preference batch holds B pairs as 2B rows: the chosen sequences first,
//! then their rejected ones in the same order (as TRL concatenates them); each row's target mask marks its
//! completion tokens.

use super::objective::{ChosenNll, PairLogps, PairObjective};
use crate::engine::data::Batch;
use crate::engine::train::method::Method;
use crate::engine::{Error, Result};

/// The scored tokens of a preference batch.
#[derive(Debug, Clone, PartialEq)]
pub struct PairTokens {
    /// Flat positions (row * seq_len + j - 1) whose hidden state predicts each scored token.
    pub sources: Vec<u32>,
    pub targets: Vec<u32>,
    /// The row of each scored token.
    rows: Vec<usize>,
    /// Whether each scored token belongs to its row's completion (ORPO also scores the chosen prompts).
    completion: Vec<bool>,
    pub pairs: usize,
}

impl PairTokens {
    /// The tokens `method` scores in `batch`: every completion token; for ORPO, whose NLL term covers the whole
    /// chosen sequence as TRL computes it, every token of the chosen rows after the first as well.
    pub fn of(batch: &Batch, method: Method) -> Result<Self> {
        if batch.batch_size % 2 != 0 || batch.batch_size == 0 {
            return Err(Error::Training(format!(
                "a preference batch holds chosen and rejected rows in pairs, but this one has {} rows",
                batch.batch_size
            )));
        }
        let pairs = batch.batch_size / 2;
        let t = batch.seq_len;
        let mut out = Self { sources: vec![], targets: vec![], rows: vec![], completion: vec![], pairs };
        for row in 0..batch.batch_size {
            let whole_row = method == Method::Orpo && row < pairs;
            for j in 1..batch.lengths[row] {
                let k = row * t + j;
                let completion = batch.target_mask[k] > 0.0;
                if completion || whole_row {
                    out.sources.push((k - 1) as u32);
                    out.targets.push(batch.input_ids[k]);
                    out.rows.push(row);
                    out.completion.push(completion);
                }
            }
        }
        Ok(out)
    }

    /// Per-pair completion log-probabilities from the scored tokens' NLLs, with the reference's per-row (NLL sum,
    /// completion tokens) when there is one, and ORPO's chosen-sequence NLL.
    pub fn pair_logps(&self, token_nll: &[f64], reference: Option<&[(f64, usize)]>) -> (Vec<PairLogps>, ChosenNll) {
        let b = self.pairs;
        let mut sums = vec![0.0; 2 * b];
        let mut counts = vec![0usize; 2 * b];
        let mut nll = ChosenNll::default();
        for ((&row, &completion), &value) in self.rows.iter().zip(&self.completion).zip(token_nll) {
            if completion {
                sums[row] -= value;
                counts[row] += 1;
            }
            if row < b {
                nll.sum += value;
                nll.tokens += 1;
            }
        }
        let pairs = (0..b)
            .map(|i| {
                let reference_logp = |row: usize| reference.map_or(0.0, |r| -r[row].0);
                PairLogps {
                    chosen: sums[i],
                    rejected: sums[b + i],
                    chosen_tokens: counts[i],
                    rejected_tokens: counts[b + i],
                    ref_chosen: reference_logp(i),
                    ref_rejected: reference_logp(b + i),
                }
            })
            .collect();
        (pairs, nll)
    }

    /// d loss / d NLL of each scored token, times `scale` (a micro-batch's share of its step), for `objective`
    /// computed over this batch with `method`.
    pub fn token_weights(&self, objective: &PairObjective, method: Method, scale: f64) -> Vec<f64> {
        let b = self.pairs;
        self.rows
            .iter()
            .zip(&self.completion)
            .map(|(&row, &completion)| {
                // log p = -NLL, so a log-probability's derivative enters with its sign flipped.
                let (d_chosen, d_rejected) = objective.d_logps[row % b];
                let from_logps = match (completion, row < b) {
                    (false, _) => 0.0,
                    (true, true) => -d_chosen,
                    (true, false) => -d_rejected,
                };
                let from_nll = if method == Method::Orpo && row < b { objective.d_chosen_token_nll } else { 0.0 };
                scale * (from_logps + from_nll)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::train::method::PreferenceSettings;
    use crate::engine::train::preference::objective::pair_objective;

    /// Two pairs, seq_len 5: row lengths 5, 4 (chosen), 3, 5 (rejected); completions from position 2.
    fn batch() -> Batch {
        let lengths = vec![5, 4, 3, 5];
        let mut mask = vec![0.0f32; 20];
        for (row, &len) in lengths.iter().enumerate() {
            for j in 2..len {
                mask[row * 5 + j] = 1.0;
            }
        }
        Batch {
            input_ids: (0..20).collect(),
            target_tokens: mask.iter().filter(|&&m| m > 0.0).count(),
            target_mask: mask,
            batch_size: 4,
            seq_len: 5,
            lengths,
            row_starts: None,
        }
    }

    #[test]
    fn dpo_scores_completions_and_orpo_the_whole_chosen_rows() {
        let dpo = PairTokens::of(&batch(), Method::Dpo).unwrap();
        assert_eq!(dpo.targets, vec![2, 3, 4, 7, 8, 12, 17, 18, 19]);
        assert_eq!(dpo.sources, vec![1, 2, 3, 6, 7, 11, 16, 17, 18]);
        let orpo = PairTokens::of(&batch(), Method::Orpo).unwrap();
        assert_eq!(orpo.targets, vec![1, 2, 3, 4, 6, 7, 8, 12, 17, 18, 19]);
        let nll: Vec<f64> = (0..orpo.targets.len()).map(|i| 0.5 + i as f64).collect();
        let (pairs, chosen) = orpo.pair_logps(&nll, None);
        assert_eq!((chosen.tokens, pairs[0].chosen_tokens, pairs[1].rejected_tokens), (7, 3, 3));
        assert!((pairs[0].chosen + (1.5 + 2.5 + 3.5)).abs() < 1e-12);
        let odd = Batch { batch_size: 3, ..batch() };
        assert!(PairTokens::of(&odd, Method::Dpo).unwrap_err().to_string().contains("in pairs"));
    }

    /// The weights are the derivative of the loss with respect to each token's NLL (finite differences).
    #[test]
    fn token_weights_are_the_loss_derivatives() {
        for method in [Method::Dpo, Method::Orpo] {
            let tokens = PairTokens::of(&batch(), method).unwrap();
            let n = tokens.targets.len();
            let nll: Vec<f64> = (0..n).map(|i| 0.3 + 0.2 * i as f64).collect();
            let reference = vec![(2.0, 3), (1.0, 2), (0.5, 1), (2.5, 3)];
            let settings = PreferenceSettings { beta: 0.7, ..Default::default() };
            let loss = |nll: &[f64]| {
                let (pairs, chosen) = tokens.pair_logps(nll, Some(&reference));
                pair_objective(method, &settings, &pairs, chosen)
            };
            let weights = tokens.token_weights(&loss(&nll), method, 0.5);
            for i in 0..n {
                let h = 1e-6;
                let mut up = nll.clone();
                up[i] += h;
                let mut down = nll.clone();
                down[i] -= h;
                let numeric = 0.5 * (loss(&up).metrics.loss - loss(&down).metrics.loss) / (2.0 * h);
                assert!((numeric - weights[i]).abs() < 1e-6, "{method:?} token {i}: {numeric} vs {}", weights[i]);
            }
        }
    }
}
