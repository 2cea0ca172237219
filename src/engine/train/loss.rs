//! The training loss: mean negative log-likelihood over target tokens only, with logits computed just for
//! the positions that predict a target (prompt and padding positions cost no vocabulary projection).

use crate::engine::data::Batch;
use crate::engine::model::transformer::Transformer;
use crate::engine::Result;
use candle_core::Tensor;

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

/// Sum of target-token NLL for one batch (the evaluation loss, computed chunked without materialising the
/// logits), and the number of target tokens.
pub fn batch_nll_sum(model: &Transformer, batch: &Batch) -> Result<(f64, usize)> {
    let device = model.device();
    let (b, t) = (batch.batch_size, batch.seq_len);
    let (sources, targets) = target_positions(batch);
    let n = targets.len();
    if n == 0 {
        return Ok((0.0, 0));
    }
    let input = Tensor::from_vec(batch.input_ids.clone(), (b, t), device)?;
    let hidden = model.forward_hidden(&input, 0, None)?.reshape((b * t, model.config.hidden_size))?;
    let picked = hidden.index_select(&Tensor::from_vec(sources, n, device)?, 0)?;
    let loss = model.head_nll(&picked, &targets, None)?;
    Ok((loss.nll_sum.value()?, n))
}
