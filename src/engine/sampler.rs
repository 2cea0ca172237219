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

    /// Pick the next token from the logits tensor (1, vocab) or (vocab) f32, given the ids seen so far. Plain
    /// greedy decoding on CUDA takes the argmax there (`ops::cuda::decode::argmax`, the same tie rule as
    /// [`argmax`]) and reads back one id instead of the whole row: with a 128k vocabulary, copying the row and
    /// scanning it on the CPU left the GPU idle ~0.1 ms per token. Everything else (Metal included, where that
    /// kernel does not exist) copies the row and goes through [`Self::sample`].
    pub fn sample_tensor(&mut self, logits: &candle_core::Tensor, previous: &[u32]) -> Result<u32> {
        let row = logits.flatten_all()?;
        let p = &self.params;
        let greedy = p.temperature <= 0.0 && p.repetition_penalty == 1.0;
        if greedy && crate::engine::ops::cuda::decode::available(row.device(), row.dtype()) {
            return Ok(crate::engine::ops::cuda::decode::argmax(&row)?);
        }
        let mut values: Vec<f32> = row.to_vec1()?;
        Ok(self.sample(&mut values, previous))
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
        // Scaled in place (a positive factor keeps argmax's answer); non-finite logits are never drawn.
        let temperature = p.temperature as f32;
        for l in logits.iter_mut() {
            *l /= temperature;
        }
        let r: f64 = self.rng.random();
        pick(logits, p.top_k, p.top_p, r).unwrap_or_else(|| argmax(logits))
    }
}

/// The weight of a token with scaled logit `l` under the largest scaled logit `max`: exp(l - max), summed in f64.
fn weight(l: f32, max: f32) -> f64 {
    (l - max).exp() as f64
}

/// The largest finite value (-inf when none), in sixteen independent lanes so that the pass vectorises: a fold
/// with `f32::max` is one long dependency chain (half of a 128k-vocabulary draw's time).
fn finite_max(values: &[f32]) -> f32 {
    let larger = |m: f32, x: f32| if x.is_finite() && x > m { x } else { m };
    let mut lanes = [f32::NEG_INFINITY; 16];
    let chunks = values.chunks_exact(16);
    let rest = chunks.remainder().iter().fold(f32::NEG_INFINITY, |m, &x| larger(m, x));
    for chunk in chunks {
        for (lane, &x) in lanes.iter_mut().zip(chunk) {
            *lane = larger(*lane, x);
        }
    }
    lanes.into_iter().fold(rest, larger)
}

/// Highest first, ties by id: the order a stable sort by logit gives.
fn order(a: &(u32, f32), b: &(u32, f32)) -> std::cmp::Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

/// The token that `r` (uniform in [0, 1)) draws from `scaled` (logits / temperature): the top `top_k` (0: all),
/// then the top-p head, walked from the highest probability down. None when no logit is finite. Only the head
/// that the cut and the draw reach is sorted: the tokens within a margin of the largest logit (a prefix of the
/// sorted order, ties included), the margin widened until it suffices. Sorting a whole 128k vocabulary per token
/// took longer than a GPU decode step; so did building an (id, logit) pair per token and selecting among them.
fn pick(scaled: &[f32], top_k: usize, top_p: f64, r: f64) -> Option<u32> {
    let finite = scaled.iter().filter(|l| l.is_finite()).count();
    if finite == 0 {
        return None;
    }
    // The finite tokens at or above `floor`, as (id, scaled logit).
    let at_least = |floor: f32| -> Vec<(u32, f32)> {
        scaled.iter().enumerate().filter(|(_, &l)| l.is_finite() && l >= floor).map(|(i, &l)| (i as u32, l)).collect()
    };
    if top_k > 0 && top_k < finite {
        let mut candidates = at_least(f32::NEG_INFINITY);
        candidates.select_nth_unstable_by(top_k - 1, order);
        candidates.truncate(top_k);
        candidates.sort_by(order);
        let max = candidates[0].1;
        let total: f64 = candidates.iter().map(|&(_, l)| weight(l, max)).sum();
        return draw(&candidates, true, max, total, top_p, r);
    }
    let max = finite_max(scaled);
    let total: f64 = scaled.iter().filter(|l| l.is_finite()).map(|&l| weight(l, max)).sum();
    if top_p >= 1.0 {
        return Some(draw_unsorted(scaled, max, total, r));
    }
    let mut margin = 8.0f32;
    loop {
        // `max` is finite: an infinite margin takes every finite token.
        let mut head = at_least(max - margin);
        head.sort_by(order);
        let whole = head.len() == finite;
        if let Some(token) = draw(&head, whole, max, total, top_p, r) {
            return Some(token);
        }
        // e^-64 of the largest weight and below: beyond that, everything.
        margin = if margin < 64.0 { margin * 2.0 } else { f32::INFINITY };
    }
}

/// The token that `r` (uniform in [0, 1)) draws from all of `scaled` in id order: no cut, so no sort (with flat
/// logits, as early in a run or with random weights, the margin search of [`pick`] ends up sorting the whole
/// vocabulary: 7.7 ms per draw at 128k, against two passes here).
fn draw_unsorted(scaled: &[f32], max: f32, total: f64, r: f64) -> u32 {
    let mut left = r * total;
    let mut last = 0;
    for (i, &l) in scaled.iter().enumerate() {
        if !l.is_finite() {
            continue;
        }
        let w = weight(l, max);
        if left < w {
            return i as u32;
        }
        left -= w;
        last = i as u32;
    }
    last
}

/// The token that `r` (uniform in [0, 1)) picks from `sorted` (the head of the candidates, highest first) under
/// the top-p cut: the smallest head whose probability reaches `top_p`, renormalised. None when `sorted` is not
/// `whole` and the cut or the draw lies beyond it.
fn draw(sorted: &[(u32, f32)], whole: bool, max: f32, total: f64, top_p: f64, r: f64) -> Option<u32> {
    let probs: Vec<f64> = sorted.iter().map(|&(_, l)| weight(l, max) / total).collect();
    let kept = if top_p < 1.0 {
        let mut cumulative = 0.0;
        match probs.iter().position(|pr| {
            cumulative += pr;
            cumulative >= top_p
        }) {
            Some(i) => i + 1,
            None if whole => probs.len(),
            None => return None,
        }
    } else {
        probs.len()
    };
    let scale = if top_p < 1.0 { probs[..kept].iter().sum::<f64>() } else { 1.0 };
    let mut r = r;
    for (i, pr) in probs[..kept].iter().enumerate() {
        let pr = pr / scale;
        if r < pr {
            return Some(sorted[i].0);
        }
        r -= pr;
    }
    (whole || top_p < 1.0).then(|| sorted[kept - 1].0)
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
    fn sorting_only_the_head_draws_what_a_full_sort_draws() {
        use rand::{Rng, SeedableRng};
        let mut rng = StdRng::seed_from_u64(11);
        for case in 0..400 {
            let n = [5, 70, 3000, 300][case % 4];
            // Peaked and flat distributions, with ties, spans past every margin, and logits never drawn.
            let spread = [0.5f32, 4.0, 12.0, 40.0][case % 4];
            let mut logits: Vec<f32> = (0..n).map(|_| (rng.random::<f32>() * spread * 8.0).round() / 8.0).collect();
            if case % 5 == 0 {
                logits[1] = f32::NAN;
                logits[n - 1] = f32::NEG_INFINITY;
            }
            let (top_k, top_p) = ([0, 1, 10, 100][(case / 4) % 4], [1.0, 0.9, 0.5, 0.999][(case / 16) % 4]);
            let r: f64 = rng.random();
            let mut full: Vec<(u32, f32)> =
                logits.iter().enumerate().filter(|(_, l)| l.is_finite()).map(|(i, &l)| (i as u32, l)).collect();
            full.sort_by(|a, b| b.1.total_cmp(&a.1));
            let uncut = top_p >= 1.0 && (top_k == 0 || top_k >= full.len());
            if top_k > 0 && top_k < full.len() {
                full.truncate(top_k);
            }
            let max = full[0].1;
            let total: f64 = full.iter().map(|&(_, l)| weight(l, max)).sum();
            // Without a cut the draw walks the tokens in id order (no sort).
            let want = if uncut {
                draw_unsorted(&logits, max, total, r)
            } else {
                draw(&full, true, max, total, top_p, r).unwrap()
            };
            let got = pick(&logits, top_k, top_p, r).unwrap();
            assert_eq!(got, want, "case {case}: n {n} top_k {top_k} top_p {top_p}");
        }
        assert_eq!(pick(&[f32::NAN, f32::NEG_INFINITY], 0, 0.9, 0.5), None);
    }

    #[test]
    fn an_uncut_draw_follows_the_probabilities() {
        let logits = [0.0f32, 1.0, f32::NAN, 2.0];
        let total: f64 = [0.0f32, 1.0, 2.0].iter().map(|&l| weight(l, 2.0)).sum();
        let mut counts = [0usize; 4];
        for i in 0..10_000 {
            counts[draw_unsorted(&logits, 2.0, total, (i as f64 + 0.5) / 10_000.0) as usize] += 1;
        }
        assert_eq!(counts[2], 0);
        for (id, l) in [(0, 0.0f32), (1, 1.0), (3, 2.0)] {
            let expected = weight(l, 2.0) / total * 10_000.0;
            assert!((counts[id] as f64 - expected).abs() < 2.0, "{id}: {} vs {expected}", counts[id]);
        }
    }

    #[test]
    fn the_largest_finite_value_skips_nan_and_infinities() {
        let mut values: Vec<f32> = (0..37).map(|i| (i as f32 * 0.37).sin()).collect();
        let want = values.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        values[3] = f32::NAN;
        values[20] = f32::INFINITY;
        values[36] = f32::NEG_INFINITY;
        let without = values.iter().copied().filter(|v| v.is_finite()).fold(f32::NEG_INFINITY, f32::max);
        assert!(without <= want);
        assert_eq!(finite_max(&values), without);
        assert_eq!(finite_max(&[f32::NAN, f32::INFINITY]), f32::NEG_INFINITY);
        assert_eq!(finite_max(&[]), f32::NEG_INFINITY);
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
