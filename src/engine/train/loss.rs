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
    let (sources, targets) = target_positions(batch);
    let n = targets.len();
    if n == 0 {
        return Ok((0.0, 0));
    }
    let picked = target_hidden(model, batch, sources)?;
    let loss = model.head_nll(&picked, &targets, None)?;
    Ok((loss.nll_sum.value()?, n))
}

/// [`batch_nll_sum`] row by row: each row's target-token NLL sum and target count (what `eval --task loss`
/// reports per row; their totals are the batch's).
pub fn batch_row_nll(model: &Transformer, batch: &Batch) -> Result<Vec<(f64, usize)>> {
    let (sources, targets) = target_positions(batch);
    let mut rows = vec![(0.0, 0); batch.batch_size];
    if targets.is_empty() {
        return Ok(rows);
    }
    let row_of: Vec<usize> = sources.iter().map(|&k| k as usize / batch.seq_len.max(1)).collect();
    let picked = target_hidden(model, batch, sources)?;
    for (row, nll) in row_of.into_iter().zip(model.head_token_nll(&picked, &targets)?) {
        rows[row].0 += nll;
        rows[row].1 += 1;
    }
    Ok(rows)
}

/// `-log p(targets[i])` from the hidden state at flat position `sources[i]` of `batch`, for every i (no gradient).
pub fn token_nll_at(model: &Transformer, batch: &Batch, sources: Vec<u32>, targets: &[u32]) -> Result<Vec<f64>> {
    token_nll_tempered(model, batch, sources, targets, 1.0)
}

/// [`token_nll_at`] for the logits divided by `temperature` (GRPO's log-probabilities at its sampling
/// temperature).
pub fn token_nll_tempered(
    model: &Transformer,
    batch: &Batch,
    sources: Vec<u32>,
    targets: &[u32],
    temperature: f64,
) -> Result<Vec<f64>> {
    if targets.is_empty() {
        return Ok(Vec::new());
    }
    let picked = temper(&target_hidden(model, batch, sources)?, temperature)?;
    model.head_token_nll(&picked, targets)
}

/// The hidden states at the flat positions `sources` of `batch` (n, hidden).
fn target_hidden(model: &Transformer, batch: &Batch, sources: Vec<u32>) -> Result<Tensor> {
    let device = model.device();
    let (b, t) = (batch.batch_size, batch.seq_len);
    let n = sources.len();
    let input = Tensor::from_vec(batch.input_ids.clone(), (b, t), device)?;
    let hidden = model.forward_hidden(&input, 0, None)?.reshape((b * t, model.config.hidden_size))?;
    Ok(hidden.index_select(&Tensor::from_vec(sources, n, device)?, 0)?)
}

/// `hidden / temperature` (the hidden states whose head gives the logits divided by `temperature`); `hidden`
/// itself at 1.
pub fn temper(hidden: &Tensor, temperature: f64) -> Result<Tensor> {
    if temperature == 1.0 {
        return Ok(hidden.clone());
    }
    Ok((hidden * (1.0 / temperature))?)
}

/// Mean NLL per target token over (up to `max_batches`, 0 = all) batches of `examples`.
pub fn validation_loss(
    model: &Transformer,
    examples: &[crate::engine::data::Example],
    batch_size: usize,
    max_batches: usize,
    pad_id: u32,
) -> Result<f64> {
    let lengths: Vec<usize> = examples.iter().map(|e| e.len()).collect();
    let mut total = 0f64;
    let mut count = 0usize;
    for (i, indices) in crate::engine::data::eval_batches(&lengths, batch_size).iter().enumerate() {
        if max_batches > 0 && i >= max_batches {
            break;
        }
        let batch = crate::engine::data::collate(examples, indices, pad_id)?;
        let (nll, n) = batch_nll_sum(model, &batch)?;
        total += nll;
        count += n;
    }
    Ok(total / count.max(1) as f64)
}
