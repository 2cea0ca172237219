//! Per-row cross-entropy over the vocabulary: the loss and, in place, its gradient (softmax minus one-hot),
//! one exponential per logit. The head loss (dense.rs) runs it over chunks of rows.

pub(super) fn log_sum_exp(row: &[f32]) -> f32 {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if !max.is_finite() {
        return max;
    }
    // The sum runs in f64: over a 49k-150k vocabulary an f32 running sum drifts by ~1e-4 in the log.
    let sum: f64 = row.iter().map(|&x| f64::from((x - max).exp())).sum();
    max + sum.ln() as f32
}

/// `logsumexp(row) - row[target]`; with a scale, the row is overwritten by `scale * (softmax(row) - onehot)`.
/// One exponential per logit.
pub(super) fn row_loss_and_grad(row: &mut [f32], target: usize, grad_scale: Option<f32>) -> f64 {
    let target_logit = row[target];
    let Some(scale) = grad_scale else {
        return (log_sum_exp(row) - target_logit) as f64;
    };
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0f64;
    for v in row.iter_mut() {
        *v = (*v - max).exp();
        sum += f64::from(*v);
    }
    let factor = (f64::from(scale) / sum) as f32;
    row.iter_mut().for_each(|v| *v *= factor);
    row[target] -= scale;
    f64::from(max) + sum.ln() - f64::from(target_logit)
}
