//! The preference losses as functions of per-sequence log-probabilities, with their derivatives: everything
//! DPO, IPO and ORPO compute after the model has scored a batch, in f64 on the host (a few numbers per pair).
//! The model's side (which tokens, their log-probabilities, the backward pass) is in `pair_batch.rs` and
//! `step.rs`; this file is the math alone, written after TRL 1.16 (`DPOTrainer._compute_loss`, the experimental
//! `ORPOTrainer.odds_ratio_loss`) so the two give the same numbers.

use super::metrics::PreferenceMetrics;
use crate::engine::train::method::{Method, PreferenceLoss, PreferenceSettings};

/// One pair as the model scored it: completion log-probabilities summed over tokens, and their token counts.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct PairLogps {
    pub chosen: f64,
    pub rejected: f64,
    pub chosen_tokens: usize,
    pub rejected_tokens: usize,
    /// DPO: the reference model's (the base without the adapter) sums; unused by ORPO.
    pub ref_chosen: f64,
    pub ref_rejected: f64,
}

/// ORPO's NLL term: the summed NLL of every token of the chosen sequences (prompt included) and their count.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ChosenNll {
    pub sum: f64,
    pub tokens: usize,
}

/// The loss of a batch of pairs and how it moves with the model's log-probabilities.
#[derive(Debug, Clone, PartialEq)]
pub struct PairObjective {
    pub metrics: PreferenceMetrics,
    /// Per pair: d loss / d (summed completion log-probability) of the chosen and the rejected sequence.
    pub d_logps: Vec<(f64, f64)>,
    /// ORPO: d loss / d (NLL of one chosen-sequence token) from the NLL term (the same for every such token).
    pub d_chosen_token_nll: f64,
}

/// `log sigmoid(x)`, stable for large |x|.
fn log_sigmoid(x: f64) -> f64 {
    if x >= 0.0 {
        -(-x).exp().ln_1p()
    } else {
        x - x.exp().ln_1p()
    }
}

fn sigmoid(x: f64) -> f64 {
    if x >= 0.0 {
        1.0 / (1.0 + (-x).exp())
    } else {
        let e = x.exp();
        e / (1.0 + e)
    }
}

/// `log(1 - exp(x))` for x < 0, split at -ln 2 as TRL does to avoid cancellation.
fn log1mexp(x: f64) -> f64 {
    if x < -std::f64::consts::LN_2 {
        (-x.exp()).ln_1p()
    } else {
        (-x.exp_m1()).ln()
    }
}

/// The loss over `pairs` (their mean, as TRL takes it) under `method` with `settings`, its metrics and its
/// derivatives. `nll` is ORPO's NLL term (ignored by DPO).
pub fn pair_objective(
    method: Method,
    settings: &PreferenceSettings,
    pairs: &[PairLogps],
    nll: ChosenNll,
) -> PairObjective {
    let mut objective = match method {
        Method::Orpo => orpo(settings.beta, pairs, nll),
        _ => dpo(settings, pairs),
    };
    objective.metrics.chosen_nll =
        (-pairs.iter().map(|p| p.chosen).sum::<f64>(), pairs.iter().map(|p| p.chosen_tokens).sum());
    objective
}

/// A pair's (chosen, rejected) rewards as `method` defines them: DPO's `beta * (log pi - log ref)` of the summed
/// log-probabilities, ORPO's `beta * log pi` averaged per token.
pub fn pair_rewards(method: Method, beta: f64, p: &PairLogps) -> (f64, f64) {
    match method {
        Method::Orpo => {
            (beta * p.chosen / p.chosen_tokens.max(1) as f64, beta * p.rejected / p.rejected_tokens.max(1) as f64)
        }
        _ => (beta * (p.chosen - p.ref_chosen), beta * (p.rejected - p.ref_rejected)),
    }
}

fn mean(values: impl Iterator<Item = f64>, n: usize) -> f64 {
    values.sum::<f64>() / n.max(1) as f64
}

fn dpo(settings: &PreferenceSettings, pairs: &[PairLogps]) -> PairObjective {
    let (beta, eps) = (settings.beta, settings.label_smoothing);
    let n = pairs.len();
    let mut losses = Vec::with_capacity(n);
    let mut d_logps = Vec::with_capacity(n);
    for p in pairs {
        let chosen_ratio = p.chosen - p.ref_chosen;
        let rejected_ratio = p.rejected - p.ref_rejected;
        let (loss, d_chosen, d_rejected) = match settings.loss {
            PreferenceLoss::Sigmoid => {
                let z = beta * (chosen_ratio - rejected_ratio);
                let loss = -(1.0 - eps) * log_sigmoid(z) - eps * log_sigmoid(-z);
                let d_z = -(1.0 - eps) * sigmoid(-z) + eps * sigmoid(z);
                (loss, beta * d_z, -beta * d_z)
            }
            PreferenceLoss::Ipo => {
                let (nc, nr) = (p.chosen_tokens.max(1) as f64, p.rejected_tokens.max(1) as f64);
                let delta = chosen_ratio / nc - rejected_ratio / nr;
                let gap = delta - 1.0 / (2.0 * beta);
                (gap * gap, 2.0 * gap / nc, -2.0 * gap / nr)
            }
        };
        losses.push(loss);
        d_logps.push((d_chosen / n as f64, d_rejected / n as f64));
    }
    let (chosen_rewards, rejected_rewards): (Vec<f64>, Vec<f64>) =
        pairs.iter().map(|p| pair_rewards(Method::Dpo, beta, p)).unzip();
    let metrics = PreferenceMetrics {
        loss: mean(losses.iter().copied(), n),
        rewards_chosen: mean(chosen_rewards.iter().copied(), n),
        rewards_rejected: mean(rejected_rewards.iter().copied(), n),
        rewards_accuracies: mean(
            chosen_rewards.iter().zip(&rejected_rewards).map(|(c, r)| f64::from(u8::from(c > r))),
            n,
        ),
        rewards_margins: mean(chosen_rewards.iter().zip(&rejected_rewards).map(|(c, r)| c - r), n),
        logps_chosen: mean(pairs.iter().map(|p| p.chosen), n),
        logps_rejected: mean(pairs.iter().map(|p| p.rejected), n),
        pairs: n,
        ..Default::default()
    };
    PairObjective { metrics, d_logps, d_chosen_token_nll: 0.0 }
}

fn orpo(beta: f64, pairs: &[PairLogps], nll: ChosenNll) -> PairObjective {
    let n = pairs.len();
    let nll_loss = nll.sum / nll.tokens.max(1) as f64;
    let (mut ratios, mut log_odds_all, mut d_logps) = (Vec::new(), Vec::new(), Vec::new());
    let (mut chosen_avg, mut rejected_avg) = (Vec::new(), Vec::new());
    for p in pairs {
        let (nc, nr) = (p.chosen_tokens.max(1) as f64, p.rejected_tokens.max(1) as f64);
        let (c, r) = (p.chosen / nc, p.rejected / nr);
        let log_odds = (c - r) - (log1mexp(c) - log1mexp(r));
        ratios.push(log_sigmoid(log_odds));
        log_odds_all.push(log_odds);
        // loss = nll - beta * mean(log sigmoid(log_odds)); d log_odds / dc = 1 / (1 - e^c), / dr = -1 / (1 - e^r).
        let d_log_odds = -beta * sigmoid(-log_odds) / n as f64;
        let d_c = d_log_odds / (-c.exp_m1());
        let d_r = -d_log_odds / (-r.exp_m1());
        d_logps.push((d_c / nc, d_r / nr));
        chosen_avg.push(c);
        rejected_avg.push(r);
    }
    let log_odds_ratio = mean(ratios.iter().copied(), n);
    let metrics = PreferenceMetrics {
        loss: nll_loss - beta * log_odds_ratio,
        rewards_chosen: beta * mean(chosen_avg.iter().copied(), n),
        rewards_rejected: beta * mean(rejected_avg.iter().copied(), n),
        rewards_accuracies: mean(chosen_avg.iter().zip(&rejected_avg).map(|(c, r)| f64::from(u8::from(c > r))), n),
        rewards_margins: beta * mean(chosen_avg.iter().zip(&rejected_avg).map(|(c, r)| c - r), n),
        logps_chosen: mean(chosen_avg.iter().copied(), n),
        logps_rejected: mean(rejected_avg.iter().copied(), n),
        nll_loss: Some(nll_loss),
        log_odds_ratio: Some(log_odds_ratio),
        log_odds_chosen: Some(mean(log_odds_all.iter().copied(), n)),
        pairs: n,
        chosen_nll: (0.0, 0),
        nll_tokens: nll.tokens,
    };
    PairObjective { metrics, d_logps, d_chosen_token_nll: 1.0 / nll.tokens.max(1) as f64 }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs() -> Vec<PairLogps> {
        vec![
            PairLogps {
                chosen: -12.0,
                rejected: -15.5,
                chosen_tokens: 6,
                rejected_tokens: 7,
                ref_chosen: -13.0,
                ref_rejected: -14.0,
            },
            PairLogps {
                chosen: -3.2,
                rejected: -2.1,
                chosen_tokens: 2,
                rejected_tokens: 3,
                ref_chosen: -3.0,
                ref_rejected: -2.5,
            },
        ]
    }

    /// Every derivative equals a central finite difference of the loss.
    #[test]
    fn derivatives_match_finite_differences() {
        let nll = ChosenNll { sum: 40.0, tokens: 20 };
        let cases = [
            (Method::Dpo, PreferenceSettings::default()),
            (Method::Dpo, PreferenceSettings { label_smoothing: 0.2, ..Default::default() }),
            (Method::Dpo, PreferenceSettings { loss: PreferenceLoss::Ipo, beta: 0.3, ..Default::default() }),
            (Method::Orpo, PreferenceSettings { beta: 0.5, ..Default::default() }),
        ];
        for (method, settings) in cases {
            let base = pair_objective(method, &settings, &pairs(), nll);
            for i in 0..2 {
                for side in 0..2 {
                    let h = 1e-5;
                    let shifted = |d: f64| {
                        let mut p = pairs();
                        if side == 0 {
                            p[i].chosen += d
                        } else {
                            p[i].rejected += d
                        }
                        pair_objective(method, &settings, &p, nll).metrics.loss
                    };
                    let numeric = (shifted(h) - shifted(-h)) / (2.0 * h);
                    let analytic = if side == 0 { base.d_logps[i].0 } else { base.d_logps[i].1 };
                    assert!(
                        (numeric - analytic).abs() < 1e-7,
                        "{method:?} {settings:?} pair {i} side {side}: {numeric} vs {analytic}"
                    );
                }
            }
        }
    }

    /// At the start of DPO (policy = reference) the loss is ln 2 and no pair is counted as won.
    #[test]
    fn dpo_starts_at_ln2() {
        let same: Vec<PairLogps> =
            pairs().into_iter().map(|p| PairLogps { ref_chosen: p.chosen, ref_rejected: p.rejected, ..p }).collect();
        let o = pair_objective(Method::Dpo, &PreferenceSettings::default(), &same, ChosenNll::default());
        assert!((o.metrics.loss - std::f64::consts::LN_2).abs() < 1e-12);
        assert_eq!((o.metrics.rewards_accuracies, o.metrics.rewards_margins), (0.0, 0.0));
    }

    #[test]
    fn log1mexp_is_accurate_on_both_sides_of_the_split() {
        for x in [-1e-8, -0.1, -0.69, -0.7, -5.0, -40.0] {
            let exact = (1.0 - f64::exp(x)).ln();
            assert!((log1mexp(x) - exact).abs() <= 1e-9 * exact.abs().max(1e-3), "{x}");
        }
    }
}
