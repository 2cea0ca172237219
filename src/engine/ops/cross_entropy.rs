//! Per-row cross-entropy over the vocabulary: the loss and, in place, its gradient (softmax minus one-hot),
//! one exponential per logit. The head loss (head_loss.rs) runs it over chunks of rows.

pub(super) fn log_sum_exp(row: &[f32]) -> f32 {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if !max.is_finite() {
        return max;
    }
    let sum: f32 = row.iter().map(|&x| (x - max).exp()).sum();
    max + sum.ln()
}

/// `logsumexp(row) - row[target]`; with a scale, the row is overwritten by `scale * (softmax(row) - onehot)`.
/// One exponential per logit.
pub(super) fn row_loss_and_grad(row: &mut [f32], target: usize, grad_scale: Option<f32>) -> f64 {
    let target_logit = row[target];
    let Some(scale) = grad_scale else {
        return (log_sum_exp(row) - target_logit) as f64;
    };
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0f32;
    for v in row.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    let factor = scale / sum;
    row.iter_mut().for_each(|v| *v *= factor);
    row[target] -= scale;
    (max + sum.ln() - target_logit) as f64
}
