//! Per-row cross-entropy over the vocabulary with a fused CPU forward and backward.

use super::f32_data;
use candle_core::{DType, Result, Tensor, D};

/// Per-row negative log-likelihood `logsumexp(logits[i]) - logits[i, targets[i]]` for logits (n, vocab).
///
/// On the CPU this is one fused pass forward and one backward (softmax minus one-hot), instead of the half
/// dozen vocabulary-sized temporaries a composed log-softmax creates; elsewhere it is composed from
/// differentiable ops.
pub fn cross_entropy_rows(logits: &Tensor, targets: &[u32]) -> Result<Tensor> {
    let (n, vocab) = logits.dims2()?;
    if n != targets.len() {
        candle_core::bail!("cross entropy: {n} rows but {} targets", targets.len());
    }
    if let Some(&bad) = targets.iter().find(|&&t| t as usize >= vocab) {
        candle_core::bail!("cross entropy: target id {bad} is outside the vocabulary of {vocab}");
    }
    if logits.device().is_cpu() && logits.dtype() == DType::F32 {
        return logits.contiguous()?.apply_op1(CrossEntropyRows { targets: targets.to_vec() });
    }
    let log_probs = candle_nn::ops::log_softmax(logits, D::Minus1)?;
    let index = Tensor::from_slice(targets, (n, 1), logits.device())?;
    log_probs.gather(&index, 1)?.squeeze(1)?.neg()
}

struct CrossEntropyRows {
    targets: Vec<u32>,
}

fn cpu_f32_rows<'a>(
    storage: &'a candle_core::CpuStorage,
    layout: &candle_core::Layout,
) -> Result<(&'a [f32], usize, usize)> {
    let (n, vocab) = layout.shape().dims2()?;
    Ok((f32_data(storage, layout)?, n, vocab))
}

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

impl candle_core::CustomOp1 for CrossEntropyRows {
    fn name(&self) -> &'static str {
        "cross-entropy-rows"
    }

    fn cpu_fwd(
        &self,
        storage: &candle_core::CpuStorage,
        layout: &candle_core::Layout,
    ) -> Result<(candle_core::CpuStorage, candle_core::Shape)> {
        let (data, n, vocab) = cpu_f32_rows(storage, layout)?;
        let out: Vec<f32> = (0..n)
            .map(|i| {
                let row = &data[i * vocab..(i + 1) * vocab];
                log_sum_exp(row) - row[self.targets[i] as usize]
            })
            .collect();
        Ok((candle_core::CpuStorage::F32(out), n.into()))
    }

    fn bwd(&self, logits: &Tensor, _nll: &Tensor, grad_nll: &Tensor) -> Result<Option<Tensor>> {
        let scale: Vec<f32> = grad_nll.to_dtype(DType::F32)?.to_vec1()?;
        let grad = logits.apply_op1_no_bwd(&CrossEntropyRowsGrad { targets: self.targets.clone(), scale })?;
        Ok(Some(grad))
    }
}

/// d nll / d logits = scale[i] * (softmax(logits[i]) - onehot(targets[i])).
struct CrossEntropyRowsGrad {
    targets: Vec<u32>,
    scale: Vec<f32>,
}

impl candle_core::CustomOp1 for CrossEntropyRowsGrad {
    fn name(&self) -> &'static str {
        "cross-entropy-rows-grad"
    }

    fn cpu_fwd(
        &self,
        storage: &candle_core::CpuStorage,
        layout: &candle_core::Layout,
    ) -> Result<(candle_core::CpuStorage, candle_core::Shape)> {
        let (data, n, vocab) = cpu_f32_rows(storage, layout)?;
        let mut out = data.to_vec();
        for (i, row) in out.chunks_exact_mut(vocab).enumerate().take(n) {
            row_loss_and_grad(row, self.targets[i] as usize, Some(self.scale[i]));
        }
        Ok((candle_core::CpuStorage::F32(out), (n, vocab).into()))
    }
}
