//! GRPO's math on numbers already computed: group-normalised advantages from rewards, and the clipped
//! per-token policy objective with its KL term and its derivative, as TRL's GRPOTrainer defines them
//! (`_generate_and_score_completions`, `_compute_loss`, TRL 1.x):
//!
//! - advantage: `(r - mean(group)) / (std(group) + 1e-4)` (std unbiased, as torch's; `batch`: the whole step's
//!   std; `none`: not divided);
//! - per token: `ratio = exp(logp - old_logp)`, `loss = -min(ratio * A, clamp(ratio, 1 - eps, 1 + eps_high) * A)
//!   + beta * ratio * (exp(ref - logp) - (ref - logp) - 1)`: TRL 1.16's default `use_bias_correction_kl`
//!   weighs the k3 KL estimate by the (unclipped) ratio, in the loss, the logged `kl` and the gradient, where the
//!   ratio's derivative counts even on-policy (value 1).
//!
//! `old_logp` is the policy's own log-probability when the batch is used once (`num_iterations = 1`): the ratio is
//! then exactly 1 and only its gradient matters.

use super::settings::{GrpoLoss, ScaleRewards};

/// Each completion's advantage, and the share of groups whose rewards were all equal.
#[derive(Debug, Clone, PartialEq)]
pub struct Advantages {
    pub values: Vec<f64>,
    pub zero_std_groups: f64,
}

/// Mean and unbiased standard deviation (0 for fewer than two values).
pub fn mean_std(values: &[f64]) -> (f64, f64) {
    let n = values.len();
    if n == 0 {
        return (0.0, 0.0);
    }
    let mean = values.iter().sum::<f64>() / n as f64;
    if n < 2 {
        return (mean, 0.0);
    }
    let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
    (mean, var.sqrt())
}

/// The advantages of `rewards` (prompt-major: each prompt's `group` completions in a row).
pub fn advantages(rewards: &[f64], group: usize, scale: ScaleRewards) -> Advantages {
    let group = group.max(1);
    let (_, batch_std) = mean_std(rewards);
    let mut values = Vec::with_capacity(rewards.len());
    let mut zero_std = 0usize;
    let groups: Vec<&[f64]> = rewards.chunks(group).collect();
    for chunk in &groups {
        let (mean, std) = mean_std(chunk);
        let divisor = match scale {
            ScaleRewards::Group => Some(std),
            ScaleRewards::Batch => Some(batch_std),
            ScaleRewards::None => None,
        };
        // TRL counts a group as zero-std by the std it divides with (the group's for `none`).
        let logged_std = divisor.unwrap_or(std);
        if (logged_std - 0.0).abs() <= 1e-8 {
            zero_std += chunk.len();
        }
        values.extend(chunk.iter().map(|r| match divisor {
            Some(d) => (r - mean) / (d + 1e-4),
            None => r - mean,
        }));
    }
    Advantages { values, zero_std_groups: zero_std as f64 / rewards.len().max(1) as f64 }
}

/// The clipping bounds and KL weight of the per-token objective.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Clip {
    pub epsilon_low: f64,
    pub epsilon_high: f64,
    pub beta: f64,
}

/// One completion token's objective.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenTerm {
    /// The per-token loss (before the loss type's normalisation).
    pub loss: f64,
    /// d loss / d logp.
    pub d_logp: f64,
    /// The KL estimate to the reference, weighed by the ratio as TRL does (0 without one).
    pub kl: f64,
    /// The ratio fell below `1 - eps` with a negative advantage (its gradient is cut).
    pub clipped_low: bool,
    /// The ratio rose above `1 + eps_high` with a positive advantage.
    pub clipped_high: bool,
}

/// The objective of a token with log-probability `logp` under the policy, `old` under the policy that sampled
/// it, `reference` under the reference (with beta > 0), in a completion of advantage `advantage`.
pub fn token_term(logp: f64, old: f64, reference: Option<f64>, advantage: f64, clip: Clip) -> TokenTerm {
    let ratio = (logp - old).exp();
    let clipped = ratio.clamp(1.0 - clip.epsilon_low, 1.0 + clip.epsilon_high);
    let unclipped_term = ratio * advantage;
    let clipped_term = clipped * advantage;
    // -min(ratio A, clipped A): the gradient flows through the unclipped ratio unless the clipped term is the
    // smaller one and the clamp is active (then it is a constant).
    let clamp_active = clipped != ratio;
    let (policy, d_policy) = if clipped_term < unclipped_term && clamp_active {
        (-clipped_term, 0.0)
    } else {
        (-unclipped_term, -unclipped_term)
    };
    let (kl, d_kl) = match reference {
        Some(reference) if clip.beta != 0.0 => {
            let delta = reference - logp;
            let k3 = delta.exp() - delta - 1.0;
            // d (ratio k3) / d logp = ratio k3 + ratio (1 - e^delta): d ratio / d logp = ratio.
            (ratio * k3, ratio * (k3 + 1.0 - delta.exp()))
        }
        _ => (0.0, 0.0),
    };
    TokenTerm {
        loss: policy + clip.beta * kl,
        d_logp: d_policy + clip.beta * d_kl,
        kl,
        clipped_low: ratio < 1.0 - clip.epsilon_low && advantage < 0.0,
        clipped_high: ratio > 1.0 + clip.epsilon_high && advantage > 0.0,
    }
}

/// The weight of each token's loss in the step's loss, as TRL normalises with `loss_type` over a step of
/// micro-batches (its gradient accumulation): `lengths[m][s]` is the completion length of sequence `s` of
/// micro-batch `m`. Returns each sequence's per-token weight, in the same layout.
pub fn token_weights(loss: GrpoLoss, lengths: &[Vec<usize>], max_new_tokens: usize) -> Vec<Vec<f64>> {
    let micro = lengths.len().max(1) as f64;
    let step_tokens: usize = lengths.iter().flatten().sum();
    lengths
        .iter()
        .map(|seqs| {
            let tokens: usize = seqs.iter().sum();
            let n = seqs.len().max(1) as f64;
            seqs.iter()
                .map(|&len| match loss {
                    GrpoLoss::Grpo => 1.0 / (len.max(1) as f64 * n * micro),
                    GrpoLoss::Bnpo => 1.0 / (tokens.max(1) as f64 * micro),
                    GrpoLoss::DrGrpo => 1.0 / (n * max_new_tokens as f64 * micro),
                    GrpoLoss::Dapo => 1.0 / step_tokens.max(1) as f64,
                })
                .collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const CLIP: Clip = Clip { epsilon_low: 0.2, epsilon_high: 0.28, beta: 0.04 };

    #[test]
    fn advantages_normalise_per_group_and_count_flat_groups() {
        let a = advantages(&[1.0, 0.0, 1.0, 0.0, 0.5, 0.5, 0.5, 0.5], 4, ScaleRewards::Group);
        let std = (1.0f64 / 3.0).sqrt();
        assert!((a.values[0] - 0.5 / (std + 1e-4)).abs() < 1e-12);
        assert_eq!(&a.values[4..], &[0.0; 4]);
        assert_eq!(a.zero_std_groups, 0.5);
        let none = advantages(&[1.0, 0.0], 2, ScaleRewards::None);
        assert_eq!(none.values, [0.5, -0.5]);
    }

    #[test]
    fn token_gradient_matches_finite_differences() {
        for (logp, old, adv) in [(-1.0, -1.0, 0.7), (-1.0, -1.5, 0.7), (-1.0, -0.5, -0.7), (-1.0, -1.1, -0.3)] {
            let t = token_term(logp, old, Some(-1.2), adv, CLIP);
            let h = 1e-6;
            let num = (token_term(logp + h, old, Some(-1.2), adv, CLIP).loss
                - token_term(logp - h, old, Some(-1.2), adv, CLIP).loss)
                / (2.0 * h);
            assert!((num - t.d_logp).abs() < 1e-6, "{logp} {old} {adv}: {num} vs {}", t.d_logp);
        }
        // Ratio e^0.5 > 1.28 with a positive advantage: clipped high, no policy gradient.
        let high = token_term(-1.0, -1.5, None, 0.7, CLIP);
        assert!(high.clipped_high && high.d_logp == 0.0);
        // Ratio e^-0.5 < 0.8 with a negative advantage: clipped low.
        assert!(token_term(-1.0, -0.5, None, -0.7, CLIP).clipped_low);
        // On-policy: loss -A, gradient -A.
        let on = token_term(-2.0, -2.0, None, 0.5, Clip { beta: 0.0, ..CLIP });
        assert_eq!((on.loss, on.d_logp), (-0.5, -0.5));
        // On-policy with the KL term: the ratio's derivative adds k3 to the classic k3 gradient (TRL's bias
        // correction); the KL itself is k3.
        let t = token_term(-2.0, -2.0, Some(-1.5), 0.5, CLIP);
        let k3 = 0.5f64.exp() - 0.5 - 1.0;
        assert!((t.kl - k3).abs() < 1e-15);
        assert!((t.d_logp - (-0.5 + 0.04 * (k3 + 1.0 - 0.5f64.exp()))).abs() < 1e-15, "{}", t.d_logp);
    }

    #[test]
    fn loss_types_normalise_like_trl() {
        let lengths = vec![vec![2, 4], vec![6]];
        let w = token_weights(GrpoLoss::Dapo, &lengths, 8);
        assert_eq!(w[0][0], 1.0 / 12.0);
        let w = token_weights(GrpoLoss::Grpo, &lengths, 8);
        assert_eq!(w[0][0], 1.0 / (2.0 * 2.0 * 2.0));
        assert_eq!(w[1][0], 1.0 / (6.0 * 1.0 * 2.0));
        let w = token_weights(GrpoLoss::Bnpo, &lengths, 8);
        assert_eq!(w[0][1], 1.0 / (6.0 * 2.0));
        let w = token_weights(GrpoLoss::DrGrpo, &lengths, 8);
        assert_eq!(w[1][0], 1.0 / (1.0 * 8.0 * 2.0));
    }
}
