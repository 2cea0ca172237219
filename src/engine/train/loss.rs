//! The training loss: mean negative log-likelihood over target tokens only, with logits computed just for
//! the positions that predict a target (prompt and padding positions cost no vocabulary projection).

use crate::engine::data::Batch;
use crate::engine::model::transformer::{ForwardOptions, Transformer};
use crate::engine::Result;
use candle_core::{DType, Tensor};

/// Sum of target-token NLL for one batch, and the number of target tokens.
pub fn batch_nll_sum(model: &Transformer, batch: &Batch, train: bool) -> Result<(Tensor, usize)> {
    let device = model.device();
    let (b, t) = (batch.batch_size, batch.seq_len);
    let input = Tensor::from_vec(batch.input_ids.clone(), (b, t), device)?;
    let hidden = model.forward_hidden(&input, 0, None, ForwardOptions { train })?;
    let mut sources = Vec::new();
    let mut targets = Vec::new();
    for row in 0..b {
        for j in 1..t {
            let k = row * t + j;
            if batch.target_mask[k] > 0.0 {
                sources.push((k - 1) as u32);
                targets.push(batch.input_ids[k]);
            }
        }
    }
    let n = targets.len();
    if n == 0 {
        return Ok((Tensor::zeros((), DType::F32, device)?, 0));
    }
    let hidden = hidden.reshape((b * t, model.config.hidden_size))?;
    let picked = hidden.index_select(&Tensor::from_vec(sources, n, device)?, 0)?;
    let logits = crate::engine::ops::upcast(&model.logits(&picked)?)?;
    let nll = crate::engine::ops::cross_entropy_rows(&logits, &targets)?.sum_all()?;
    Ok((nll, n))
}
