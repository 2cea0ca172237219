//! The head and cross-entropy loss when the head is held quantized in blocks of vocabulary rows (a quantized
//! base's LM head, `model/vocab_matrix.rs`): no dense copy of the whole head ever exists, only one block's,
//! dequantized in the hidden states' dtype, at a time.
//!
//! The dense path (`dense.rs`) cuts the rows into chunks and reads the whole head for each; here the
//! vocabulary is cut instead. A first pass over the blocks keeps each row's running maximum and sum of
//! exponentials (online log-sum-exp) and picks the target's logit out of the block that holds it; a second pass,
//! for the gradient, recomputes each block's logits and adds `scale * softmax` times the block to the hidden
//! states' gradient, from which `scale` times the target rows of the head (the one-hot part) is taken at the end.
//! Each block's logits are products in the hidden states' dtype, read as f32 for the statistics, as the dense
//! path reads them. Composed of Candle ops, so every device runs it (the portable graph included).
//!
//! Where our CUDA cross-entropy kernel runs, each chunk of rows goes through the dense path's kernel instead (the
//! composed passes over f32 logits took 0.5 s of a 7 s step at 8B x 32k tokens, the kernel a fraction). Up to
//! [`BLOCKWISE_CHUNKS`] chunks of rows, the chunk's logits are made a block of vocabulary rows at a time, each block
//! dequantized for its product only and the product written into its columns of the logits, and the gradient
//! likewise, summed over the blocks in f32 ([`BlockProducts`]): no dense copy of the head exists. Past that, the head
//! is dequantized whole for the pass (a transient copy of the vocabulary in the hidden states' dtype: 1 GiB at
//! Llama-3's 128k x 4096 in bf16), as every chunk would otherwise dequantize each block twice.

use super::dense::{HeadLoss, HeadProducts};
use crate::engine::ops::frozen_matmul::{frozen_matmul, frozen_matmul_t};
use crate::engine::ops::quantized::{dequantize, dequantize_stacked};
use crate::engine::ops::scalar::Scalar;
use candle_core::quantized::QTensor;
use candle_core::{DType, Result, Tensor};
use std::sync::Arc;

/// A head of vocabulary rows held as consecutive quantized blocks of `rows_per_block` rows (the last may be
/// shorter).
pub struct QuantizedHead<'a> {
    pub blocks: &'a [Arc<QTensor>],
    pub rows_per_block: usize,
    /// The head's rows of each target (n, hidden) in the hidden states' dtype (an embedding lookup).
    pub target_rows: &'a Tensor,
}

/// The first row of each block.
fn block_starts<'a>(head: &QuantizedHead<'a>) -> impl Iterator<Item = (usize, &'a Arc<QTensor>)> {
    let per_block = head.rows_per_block;
    head.blocks.iter().enumerate().map(move |(i, b)| (i * per_block, b))
}

/// One block's logits (n, block rows) as f32.
fn block_logits(hidden: &Tensor, block: &QTensor) -> Result<(Tensor, Tensor)> {
    let dense = dequantize(block, hidden.device(), hidden.dtype())?;
    let logits = frozen_matmul_t(hidden, &dense)?.to_dtype(DType::F32)?;
    Ok((logits, dense))
}

/// Whether the loss over a quantized head on `device` in `dtype` runs the dense head's cross-entropy kernel (CUDA),
/// which holds a dense copy of some of the head meanwhile ([`dequantized_head_rows`]), rather than the composed
/// online log-sum-exp.
pub fn kernel_takes_quantized_head(device: &candle_core::Device, dtype: candle_core::DType) -> bool {
    crate::engine::ops::cuda::availability::available(device, dtype)
}

/// Chunks of rows up to which the CUDA loss over a quantized head goes a block of the vocabulary at a time (each
/// chunk dequantizes every block twice: for its logits and for its gradient); past it the head is dequantized whole,
/// once. At Llama-3's 128k words a chunk is 1,024 rows. Measured at 8B on a lent H200 (BENCHMARKS.md, 2026-11-30):
/// one chunk (1 x 1024) by blocks took the head phase from 8.9 to 10.3 ms and 1.3 GiB off the peak; four chunks
/// (1 x 4096) from 18 to 39 ms (Candle's dequantization is most of it) for 0.5-1.1 GiB: one chunk it is.
pub const BLOCKWISE_CHUNKS: usize = 1;

/// Rows of a quantized head of `vocab` rows held dense at once by its CUDA loss over `rows` rows, the head stored
/// in blocks of `block_rows` (the memory estimate's figure): one block up to [`BLOCKWISE_CHUNKS`] chunks of rows,
/// the whole vocabulary past it.
pub fn dequantized_head_rows(vocab: usize, block_rows: usize, rows: usize) -> usize {
    if rows <= BLOCKWISE_CHUNKS * super::dense::cuda_chunk_rows(vocab) {
        block_rows.min(vocab)
    } else {
        vocab
    }
}

/// A quantized head's products a block of vocabulary rows at a time (CUDA): each block dequantized in the hidden
/// states' dtype for its product only. The logits' columns are written by each block's product in place; the input
/// gradient sums the blocks' products in f32 and is rounded once.
struct BlockProducts<'a> {
    head: &'a QuantizedHead<'a>,
    vocab: usize,
}

impl HeadProducts for BlockProducts<'_> {
    fn logits(&self, x: &Tensor) -> Result<Tensor> {
        let logits = Tensor::zeros((x.dim(0)?, self.vocab), x.dtype(), x.device())?;
        for (start, block) in block_starts(self.head) {
            let dense = dequantize(block, x.device(), x.dtype())?;
            crate::engine::ops::cuda::gemm::matmul_into_columns(&logits, start, x, &dense.t()?)?;
        }
        Ok(logits)
    }

    fn input_grad(&self, dlogits: &Tensor) -> Result<Tensor> {
        let mut sum = None;
        for (start, block) in block_starts(self.head) {
            let dense = dequantize(block, dlogits.device(), dlogits.dtype())?;
            let columns = dlogits.narrow(1, start, dense.dim(0)?)?;
            sum = Some(crate::engine::ops::cuda::gemm::matmul_add_f32(sum, &columns, &dense, 1.0)?);
        }
        sum.ok_or_else(|| candle_core::Error::Msg("head loss: a quantized head without blocks".into()))?
            .to_dtype(dlogits.dtype())
    }
}

/// Negative log-likelihood of `targets[i]` after `hidden[i]` (n, h) through the quantized head, pushing each
/// row's onto `row_nll` when given, and with `grad_scale` the gradient of `grad_scale * nll_sum` with respect
/// to `hidden`.
pub fn quantized_head_nll(
    hidden: &Tensor,
    head: &QuantizedHead<'_>,
    targets: &[u32],
    grad_scale: Option<f64>,
    row_nll: Option<&mut Vec<f64>>,
) -> Result<HeadLoss> {
    let (n, _) = hidden.dims2()?;
    if n != targets.len() {
        candle_core::bail!("head loss: {n} rows but {} targets", targets.len());
    }
    let device = hidden.device();
    if kernel_takes_quantized_head(device, hidden.dtype()) {
        let vocab = head.blocks.iter().map(|b| b.shape().dims2().map(|d| d.0)).sum::<Result<usize>>()?;
        if dequantized_head_rows(vocab, head.rows_per_block, n) < vocab {
            let products = BlockProducts { head, vocab };
            return super::dense::head_nll_cuda_with(hidden, &products, vocab, targets, grad_scale, row_nll);
        }
        let dense = dequantize_stacked(head.blocks, device, hidden.dtype())?;
        return super::dense::head_nll_rows(hidden, &dense, targets, grad_scale, row_nll);
    }
    let (mut max, mut sum, mut target_logit): (Option<Tensor>, Option<Tensor>, Option<Tensor>) = (None, None, None);
    for (start, block) in block_starts(head) {
        let (logits, _) = block_logits(hidden, block)?;
        let rows = logits.dim(1)?;
        let block_max = logits.max_keepdim(1)?;
        let block_sum = logits.broadcast_sub(&block_max)?.exp()?.sum_keepdim(1)?;
        (max, sum) = match (max, sum) {
            (Some(m), Some(s)) => {
                let new = m.maximum(&block_max)?;
                let s = ((s * (m - &new)?.exp()?)? + (block_sum * (block_max - &new)?.exp()?)?)?;
                (Some(new), Some(s))
            }
            _ => (Some(block_max), Some(block_sum)),
        };
        // The targets in this block: their logit, the others masked out.
        let local: Vec<u32> = targets
            .iter()
            .map(|&t| (t as usize).checked_sub(start).filter(|&l| l < rows).unwrap_or(0) as u32)
            .collect();
        let inside: Vec<f32> =
            targets.iter().map(|&t| ((t as usize) >= start && (t as usize) < start + rows) as u8 as f32).collect();
        if !inside.iter().any(|&v| v > 0.0) {
            continue;
        }
        let picked = logits.gather(&Tensor::from_vec(local, (n, 1), device)?, 1)?;
        let picked = (picked * Tensor::from_vec(inside, (n, 1), device)?)?;
        target_logit = Some(match target_logit {
            Some(t) => (t + picked)?,
            None => picked,
        });
    }
    let (Some(max), Some(sum), Some(target_logit)) = (max, sum, target_logit) else {
        candle_core::bail!("head loss: the quantized head has no rows holding the targets");
    };
    let lse = (max + sum.log()?)?;
    let nll = (&lse - target_logit)?.flatten_all()?.to_vec1::<f32>()?;
    if let Some(out) = row_nll {
        out.extend(nll.iter().map(|&v| f64::from(v)));
    }
    let nll_sum = nll.iter().map(|&v| f64::from(v)).sum();
    let grad_hidden = match grad_scale {
        None => None,
        Some(scale) => {
            let mut grad = (head.target_rows.to_dtype(DType::F32)? * -scale)?;
            for (_, block) in block_starts(head) {
                let (logits, dense) = block_logits(hidden, block)?;
                let softmax = (logits.broadcast_sub(&lse)?.exp()? * scale)?.to_dtype(hidden.dtype())?;
                grad = (grad + frozen_matmul(&softmax, &dense)?.to_dtype(DType::F32)?)?;
            }
            Some(grad.to_dtype(hidden.dtype())?)
        }
    };
    Ok(HeadLoss { nll_sum: Scalar::Host(nll_sum), grad_hidden })
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::GgmlDType;
    use candle_core::Device;

    /// One block dense up to one chunk of rows (1,024 at 128k words), the whole vocabulary past it; a vocabulary of
    /// one block is that block either way.
    #[test]
    fn the_cuda_loss_holds_one_block_dense_for_one_chunk_of_rows() {
        assert_eq!(dequantized_head_rows(128_256, 4096, 1), 4096);
        assert_eq!(dequantized_head_rows(128_256, 4096, 1024), 4096);
        assert_eq!(dequantized_head_rows(128_256, 4096, 1025), 128_256);
        assert_eq!(dequantized_head_rows(128_256, 4096, 32_768), 128_256);
        assert_eq!(dequantized_head_rows(3000, 4096, 10), 3000);
    }

    #[test]
    fn blocks_of_the_vocabulary_give_the_dense_heads_loss_and_gradient() -> Result<()> {
        let dev = Device::Cpu;
        let (vocab, h, n, per_block) = (300, 64, 7, 128);
        let head = Tensor::randn(0f32, 1.0, (vocab, h), &dev)?;
        let blocks = (0..vocab)
            .step_by(per_block)
            .map(|s| {
                let rows = per_block.min(vocab - s);
                Ok(Arc::new(crate::engine::ops::quantize_rows(&head.narrow(0, s, rows)?, GgmlDType::Q8_0, &dev)?))
            })
            .collect::<Result<Vec<_>>>()?;
        // The reference: the dense head path on the same (dequantized) weights.
        let dense = Tensor::cat(&blocks.iter().map(|b| b.dequantize(&dev)).collect::<Result<Vec<_>>>()?, 0)?;
        let hidden = Tensor::randn(0f32, 1.0, (n, h), &dev)?;
        let targets = [0u32, 5, 127, 128, 200, 256, 299];
        let ids = Tensor::new(&targets, &dev)?;
        let target_rows = dense.index_select(&ids, 0)?;
        let quantized = QuantizedHead { blocks: &blocks, rows_per_block: per_block, target_rows: &target_rows };
        let mut rows = Vec::new();
        let ours = quantized_head_nll(&hidden, &quantized, &targets, Some(0.5), Some(&mut rows))?;
        let reference = crate::engine::ops::head_nll(&hidden, &dense, &targets, Some(0.5))?;
        let (ours_nll, reference_nll) = (ours.nll_sum.value()?, reference.nll_sum.value()?);
        assert!((ours_nll - reference_nll).abs() < 1e-4 * reference_nll.abs(), "{ours_nll} vs {reference_nll}");
        assert_eq!(rows.len(), n);
        let diff =
            (ours.grad_hidden.unwrap() - reference.grad_hidden.unwrap())?.abs()?.max_all()?.to_scalar::<f32>()?;
        assert!(diff < 1e-5, "gradient differs by {diff}");
        Ok(())
    }
}
