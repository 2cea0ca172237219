//! The training loss: mean negative log-likelihood over target tokens only, with logits computed just for
//! the positions that predict a target (prompt and padding positions cost no vocabulary projection).

use crate::engine::data::Batch;
use crate::engine::model::transformer::{ForwardOptions, Transformer};
use crate::engine::Result;
use candle_core::{DType, Tensor};

/// The flat positions (row * seq_len + j) whose hidden state predicts a target token, and those targets.
pub fn target_positions(batch: &Batch) -> (Vec<u32>, Vec<u32>) {
    let t = batch.seq_len;
    let mut sources = Vec::new();
    let mut targets = Vec::new();
    for row in 0..batch.batch_size {
        for j in 1..t {
            let k = row * t + j;
            if batch.target_mask[k] > 0.0 {
                sources.push((k - 1) as u32);
                targets.push(batch.input_ids[k]);
            }
        }
    }
    (sources, targets)
}

/// Sum of target-token NLL for one batch, and the number of target tokens.
///
/// With `train` this goes through Candle's autograd-capable ops and returns a tensor to call `backward` on:
/// the reference the hand-written training pass (train/backprop) is tested against. Without, it is the
/// evaluation loss, computed chunked without materialising the logits.
pub fn batch_nll_sum(model: &Transformer, batch: &Batch, train: bool) -> Result<(Tensor, usize)> {
    let device = model.device();
    let (b, t) = (batch.batch_size, batch.seq_len);
    let input = Tensor::from_vec(batch.input_ids.clone(), (b, t), device)?;
    let hidden = model.forward_hidden(&input, 0, None, ForwardOptions { train })?;
    let (sources, targets) = target_positions(batch);
    let n = targets.len();
    if n == 0 {
        return Ok((Tensor::zeros((), DType::F32, device)?, 0));
    }
    let hidden = hidden.reshape((b * t, model.config.hidden_size))?;
    let picked = hidden.index_select(&Tensor::from_vec(sources, n, device)?, 0)?;
    if !train {
        let loss = crate::engine::ops::head_nll(&picked, model.head_weight(), &targets, None)?;
        let dtype = if model.dtype() == DType::F64 { DType::F64 } else { DType::F32 };
        return Ok((Tensor::new(loss.nll_sum, device)?.to_dtype(dtype)?, n));
    }
    let logits = crate::engine::ops::upcast(&model.logits(&picked)?)?;
    let nll = crate::engine::ops::cross_entropy_rows(&logits, &targets)?.sum_all()?;
    Ok((nll, n))
}
