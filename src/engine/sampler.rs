//! Next-token sampling: greedy, temperature, top-k, top-p and repetition penalty, reproducible with a seed.

use crate::engine::{Error, Result};
use rand::{rngs::StdRng, Rng, SeedableRng};

/// Sampling settings. `temperature <= 0` means greedy.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct SamplingParams {
    pub temperature: f64,
    /// Keep the smallest set of tokens whose probability sums to at least this (1.0 = off).
    pub top_p: f64,
    /// Keep only the k most likely tokens (0 = off).
    pub top_k: usize,
    /// > 1 discourages tokens already present (1.0 = off), as transformers' RepetitionPenaltyLogitsProcessor.
    pub repetition_penalty: f32,
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self { temperature: 0.7, top_p: 0.9, top_k: 0, repetition_penalty: 1.0, seed: 42 }
    }
}

/// Most tokens one generation may ask for: beyond this a typo, not a plan.
pub const MAX_NEW_TOKENS: usize = 1_000_000;

impl SamplingParams {
    pub fn greedy() -> Self {
        Self { temperature: 0.0, top_p: 1.0, top_k: 0, repetition_penalty: 1.0, seed: 0 }
    }

    /// The one check of sampling settings (and the token budget) that every front end runs before generating:
    /// NaN, negative or absurd values would otherwise silently turn into greedy decoding or token-0 streams.
    pub fn validate(&self, max_new_tokens: usize) -> Result<()> {
        let t = self.temperature;
        if !(t.is_finite() && (0.0..=100.0).contains(&t)) {
            return Err(Error::out_of_range("temperature (--temperature)", t, "0 (greedy) to 100"));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(Error::out_of_range("top-p (--top-p)", self.top_p, "greater than 0 and at most 1 (1 = off)"));
        }
        let penalty = self.repetition_penalty;
        if !(penalty > 0.0 && penalty <= 10.0) {
            return Err(Error::out_of_range(
                "repetition penalty (--repetition-penalty)",
                penalty,
                "greater than 0 and at most 10 (1 = off)",
            ));
        }
        if !(1..=MAX_NEW_TOKENS).contains(&max_new_tokens) {
            return Err(Error::out_of_range(
                "max new tokens (--max-tokens)",
                max_new_tokens,
                &format!("1 to {MAX_NEW_TOKENS}"),
            ));
        }
        Ok(())
    }
}

/// Stateful sampler (owns the RNG).
pub struct Sampler {
    params: SamplingParams,
    rng: StdRng,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Self {
        let rng = StdRng::seed_from_u64(params.seed);
        Self { params, rng }
    }

    /// Pick the next token from raw logits, given the ids seen so far (prompt and generated).
    pub fn sample(&mut self, logits: &mut [f32], previous: &[u32]) -> u32 {
        let p = &self.params;
        if p.repetition_penalty != 1.0 {
            let mut seen = std::collections::HashSet::new();
            for &id in previous {
                if seen.insert(id) {
                    if let Some(l) = logits.get_mut(id as usize) {
                        *l = if *l > 0.0 { *l / p.repetition_penalty } else { *l * p.repetition_penalty };
                    }
                }
            }
        }
        if p.temperature <= 0.0 {
            return argmax(logits);
        }
        let mut candidates: Vec<(u32, f32)> = logits
            .iter()
            .enumerate()
            .filter(|(_, l)| l.is_finite())
            .map(|(i, &l)| (i as u32, l / p.temperature as f32))
            .collect();
        if candidates.is_empty() {
            return argmax(logits);
        }
        candidates.sort_by(|a, b| b.1.total_cmp(&a.1));
        if p.top_k > 0 && p.top_k < candidates.len() {
            candidates.truncate(p.top_k);
        }
        let max = candidates[0].1;
        let mut probs: Vec<f64> = candidates.iter().map(|(_, l)| ((l - max) as f64).exp()).collect();
        let total: f64 = probs.iter().sum();
        probs.iter_mut().for_each(|x| *x /= total);
        if p.top_p < 1.0 {
            let mut cumulative = 0.0;
            let mut keep = probs.len();
            for (i, pr) in probs.iter().enumerate() {
                cumulative += pr;
                if cumulative >= p.top_p {
                    keep = i + 1;
                    break;
                }
            }
            probs.truncate(keep);
            candidates.truncate(keep);
            let total: f64 = probs.iter().sum();
            probs.iter_mut().for_each(|x| *x /= total);
        }
        let mut r: f64 = self.rng.random();
        for (i, pr) in probs.iter().enumerate() {
            if r < *pr {
                return candidates[i].0;
            }
            r -= pr;
        }
        candidates[probs.len() - 1].0
    }
}

/// Index of the largest value (first on ties, like torch.argmax).
pub fn argmax(values: &[f32]) -> u32 {
    let mut best = 0;
    for (i, v) in values.iter().enumerate() {
        if *v > values[best] {
            best = i;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_picks_the_max() {
        let mut s = Sampler::new(SamplingParams::greedy());
        assert_eq!(s.sample(&mut [0.1, 3.0, 2.0], &[]), 1);
    }

    #[test]
    fn top_k_one_is_greedy_and_seed_is_reproducible() {
        let params = SamplingParams { temperature: 1.0, top_k: 1, ..Default::default() };
        let mut s = Sampler::new(params);
        assert_eq!(s.sample(&mut [0.1, 3.0, 2.0], &[]), 1);
        let params = SamplingParams { temperature: 1.0, top_p: 1.0, seed: 7, ..Default::default() };
        let draw = |p: &SamplingParams| {
            let mut s = Sampler::new(p.clone());
            (0..20).map(|_| s.sample(&mut [1.0, 1.0, 1.0, 1.0], &[])).collect::<Vec<_>>()
        };
        assert_eq!(draw(&params), draw(&params));
        assert!(draw(&params).iter().any(|&t| t != draw(&params)[0]));
    }

    #[test]
    fn repetition_penalty_demotes_seen_tokens() {
        let mut s = Sampler::new(SamplingParams { repetition_penalty: 10.0, ..SamplingParams::greedy() });
        assert_eq!(s.sample(&mut [1.0, 2.0, 1.5], &[1]), 2);
    }

    #[test]
    fn top_p_keeps_only_the_head() {
        let params = SamplingParams { temperature: 1.0, top_p: 0.5, seed: 3, ..Default::default() };
        let mut s = Sampler::new(params);
        for _ in 0..50 {
            assert_eq!(s.sample(&mut [10.0, 0.0, 0.0, 0.0], &[]), 0);
        }
    }
}
