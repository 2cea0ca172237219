//! One chunk of the composed loss's unshifted pass (dense.rs) for bf16 logits, without an f32 copy of the
//! chunk. The exponentials are taken in bf16 (one pass); their row sums come from products against ones over
//! blocks of the vocabulary (`ops::row_sums`: one more pass, a read). The f32 route converts the chunk, takes the
//! exponentials and the sums in f32 and converts back: four passes, three of them at twice the width.
//!
//! The target's exponential stays out of the sums: the row sum is `others + e_t` with `e_t` taken in f32 from the
//! target's logit, and the gradient's target entry `(p_t - 1) s` is `-others`, with no difference of two nearly
//! equal numbers for a confident target (what the f32 route keeps its subtraction in f32 for).

use crate::engine::ops::precision::{filled, upcast};
use crate::engine::ops::products::row_sums;
use candle_core::{Result, Tensor};

/// What the unshifted pass needs of a chunk of `rows` logits.
pub(super) struct UnshiftedChunk {
    /// The rows' log-sum-exp, f32 (rows, 1).
    pub lse: Tensor,
    /// The rows' `-log p(target)`, f32 (rows, 1).
    pub nll: Tensor,
    /// The rows' sums of exponentials `s`, f32 (rows, 1).
    pub sum: Tensor,
    /// `e - s onehot`, bf16 (rows, vocab): the loss's gradient times `s`.
    pub scaled_grad: Tensor,
}

/// [`UnshiftedChunk`] of bf16 `logits` (rows, vocab) and their targets `index` (rows, 1), u32.
pub(super) fn unshifted_bf16(logits: &Tensor, index: &Tensor) -> Result<UnshiftedChunk> {
    let rows = logits.dim(0)?;
    let exp = logits.exp()?;
    let target_logit = upcast(&logits.gather(index, 1)?)?;
    exp.scatter_set(index, &filled(0.0, (rows, 1), exp.dtype(), exp.device())?, 1)?;
    let others = row_sums(&exp)?;
    let sum = (&others + target_logit.exp()?)?;
    let lse = sum.log()?;
    let nll = (&lse - &target_logit)?;
    exp.scatter_set(index, &others.neg()?.to_dtype(exp.dtype())?, 1)?;
    Ok(UnshiftedChunk { lse, nll, sum, scaled_grad: exp })
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};

    /// The rows' f64 log-sum-exp and the gradient `softmax - onehot` of the (bf16-rounded) logits.
    fn truth(logits: &[Vec<f32>], targets: &[u32]) -> (Vec<f64>, Vec<Vec<f64>>) {
        let mut lse = Vec::new();
        let mut grad = Vec::new();
        for (row, &t) in logits.iter().zip(targets) {
            let max = row.iter().fold(f64::MIN, |m, &v| m.max(v as f64));
            let sum: f64 = row.iter().map(|&v| (v as f64 - max).exp()).sum();
            let l = max + sum.ln();
            lse.push(l);
            grad.push(
                row.iter().enumerate().map(|(j, &v)| (v as f64 - l).exp() - (j == t as usize) as u8 as f64).collect(),
            );
        }
        (lse, grad)
    }

    fn chunk(logits: &Tensor, targets: &[u32]) -> UnshiftedChunk {
        let index = Tensor::from_slice(targets, (targets.len(), 1), logits.device()).unwrap();
        unshifted_bf16(logits, &index).unwrap()
    }

    /// Over a 4,096-word vocabulary (64 blocks of 64) the rows' log-sum-exp is within 2^-11 of the f64 one on average
    /// (one rounded row sum would be 2^-10 off on average: the bound fails with a single block).
    #[test]
    fn block_sums_keep_the_log_sum_exp_within_bf16_noise() {
        // Spread values from a fixed integer hash (no unseeded draw): -4 to 4, a different pattern in every row.
        let values: Vec<f32> =
            (0..64 * 4096u64).map(|i| ((i.wrapping_mul(2_654_435_761) >> 7) % 8001) as f32 / 1000.0 - 4.0).collect();
        let logits = Tensor::from_vec(values, (64, 4096), &Device::Cpu).unwrap().to_dtype(DType::BF16).unwrap();
        let targets: Vec<u32> = (0..64).map(|i| (i * 61 % 4096) as u32).collect();
        let rows: Vec<Vec<f32>> = logits.to_dtype(DType::F32).unwrap().to_vec2().unwrap();
        let (want, _) = truth(&rows, &targets);
        let got: Vec<f32> = chunk(&logits, &targets).lse.flatten_all().unwrap().to_vec1().unwrap();
        let mean = got.iter().zip(&want).map(|(&g, w)| (g as f64 - w).abs()).sum::<f64>() / want.len() as f64;
        assert!(mean < (2f64).powi(-11), "mean |lse error| {mean}");
    }

    /// A confident target's gradient entry `p - 1` (here about -1e-3) keeps its digits: within 1% of the f64 value,
    /// where `e_t - s` in bf16 would lose them all (s is rounded at 2^-9 of itself). The other entries are within a
    /// bf16 rounding of their size, and the loss (about 1e-3) within 1% too.
    #[test]
    fn a_confident_targets_gradient_keeps_its_digits() {
        let mut row: Vec<f32> = (0..512).map(|j| -4.0 - (j % 7) as f32 * 0.5).collect();
        row[100] = 7.5;
        let logits = Tensor::new(row.as_slice(), &Device::Cpu).unwrap().reshape((1, 512)).unwrap();
        let logits = logits.to_dtype(DType::BF16).unwrap();
        let rows: Vec<Vec<f32>> = logits.to_dtype(DType::F32).unwrap().to_vec2().unwrap();
        let (lse, grad) = truth(&rows, &[100]);
        let c = chunk(&logits, &[100]);
        let s: Vec<f32> = c.sum.flatten_all().unwrap().to_vec1().unwrap();
        let got: Vec<f32> = c.scaled_grad.to_dtype(DType::F32).unwrap().flatten_all().unwrap().to_vec1().unwrap();
        let target = got[100] as f64 / s[0] as f64;
        assert!(grad[0][100] < -5e-4 && grad[0][100] > -5e-3, "the fixture's target is confident: {}", grad[0][100]);
        assert!((target - grad[0][100]).abs() < 0.01 * grad[0][100].abs(), "p - 1: {target} against {}", grad[0][100]);
        for (j, (&g, &w)) in got.iter().zip(&grad[0]).enumerate().filter(|(j, _)| *j != 100) {
            assert!((g as f64 / s[0] as f64 - w).abs() <= w.abs() / 128.0, "entry {j}: {g} against {w}");
        }
        let nll: Vec<f32> = c.nll.flatten_all().unwrap().to_vec1().unwrap();
        let want = lse[0] - rows[0][100] as f64;
        assert!((nll[0] as f64 - want).abs() < 0.01 * want, "loss {} against {want}", nll[0]);
    }
}
