//! Warnings about settings that work but are likely not what the user wants, said before any step runs (the
//! trainer's start notes, which the CLI prints; the studio's settings page shows the same from the dataset
//! report): many epochs over a small set, a learning rate far outside the usual LoRA range, a sequence length
//! that cuts many rows. None of them stops the run. (The warmup has its own note: `TrainConfig::warmup_note`.)

use super::TrainConfig;

/// More passes than this over a set of fewer than [`SMALL_SET_ROWS`] rows is warned about.
pub const MANY_EPOCHS: f64 = 10.0;
pub const SMALL_SET_ROWS: usize = 1000;
/// The learning rates LoRA runs usually use; ten times outside either end is warned about.
pub const USUAL_LR: (f64, f64) = (1e-5, 1e-3);
/// A sequence length that cuts more than this share of the rows is warned about.
pub const TRUNCATED_SHARE: f64 = 0.1;

/// What the warnings know of a run's training split.
#[derive(Debug, Clone, Copy)]
pub struct RowCounts {
    /// Training examples.
    pub examples: usize,
    /// Of them, longer than the sequence length.
    pub truncated: usize,
    /// Rows in an epoch: the examples, or with packing the packed rows.
    pub per_epoch: usize,
}

/// The warnings for `config` over a training split of `rows`, in a run of `total_steps` optimizer steps; each
/// starts with "warning: ".
pub fn settings_warnings(config: &TrainConfig, rows: RowCounts, total_steps: usize) -> Vec<String> {
    let mut out = Vec::new();
    let RowCounts { examples: train_rows, truncated: truncated_rows, per_epoch } = rows;
    let per_step = (config.batch_size * config.grad_accum).max(1);
    // An epoch is every row once: its last step takes the rows left over (as the settings page counts it).
    let epochs = total_steps as f64 / per_epoch.div_ceil(per_step).max(1) as f64;
    if train_rows > 0 && train_rows < SMALL_SET_ROWS && epochs > MANY_EPOCHS {
        out.push(format!(
            "warning: {total_steps} steps of {per_step} rows make {epochs:.0} passes over {train_rows} training rows: \
             the adapter will likely memorise them (overfit); fewer steps (--iters) or epochs (--epochs), or more \
             data, usually generalise better, and the validation loss shows when it starts"
        ));
    }
    let (low, high) = USUAL_LR;
    if config.lr < low / 10.0 || config.lr > high * 10.0 {
        out.push(format!(
            "warning: learning rate {:e} (--lr) is far outside the usual LoRA range {low:e} to {high:e}: {}",
            config.lr,
            if config.lr > high { "the loss may diverge" } else { "the adapter will barely change" }
        ));
    }
    if train_rows > 0 && truncated_rows as f64 > TRUNCATED_SHARE * train_rows as f64 {
        out.push(format!(
            "warning: {truncated_rows} of {train_rows} training rows ({:.0}%) are longer than the sequence length {} \
             (--seq-len) and lose their tail; raise it if memory allows, or the model never sees how those rows end",
            100.0 * truncated_rows as f64 / train_rows as f64,
            config.seq_len
        ));
    }
    out
}

/// [`settings_warnings`] for a prepared training split whose epoch is `per_epoch` rows (the batch plan's units:
/// examples, or packed rows) (the trainer's start notes).
pub fn run_warnings(
    config: &TrainConfig,
    train: &crate::engine::data::PreparedSplit,
    per_epoch: usize,
    total_steps: usize,
) -> Vec<String> {
    let truncated = train.examples.iter().filter(|e| e.truncated).count();
    let rows = RowCounts { examples: train.examples.len(), truncated, per_epoch };
    let mut out = settings_warnings(config, rows, total_steps);
    let lengths: Vec<usize> = train.examples.iter().map(|e| e.len()).collect();
    out.extend(packing_tip(config, &lengths));
    out
}

/// Packing pays when it cuts the rows of an SFT epoch at least this many times.
pub const PACKING_PAYS: f64 = 2.0;

/// A note when an unpacked SFT run's rows (of `lengths` tokens) are short enough that `--packing` would put
/// [`PACKING_PAYS`] or more examples in a row. Packing stays a choice: it changes what a step (and so the learning
/// rate's schedule) covers.
pub fn packing_tip(config: &TrainConfig, lengths: &[usize]) -> Option<String> {
    if config.packing || config.method != super::Method::Sft || lengths.is_empty() {
        return None;
    }
    let packs = crate::engine::data::pack_examples(lengths, config.seq_len).len();
    let per_row = lengths.len() as f64 / packs.max(1) as f64;
    let mean = lengths.iter().sum::<usize>() as f64 / lengths.len() as f64;
    (per_row >= PACKING_PAYS).then(|| {
        format!(
            "note: training rows average {mean:.0} tokens against a sequence length of {}: packing (--packing) would \
             put {per_row:.1} examples in each row without padding, with the same loss per example; --batch-size \
             then counts rows",
            config.seq_len
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(examples: usize, truncated: usize) -> RowCounts {
        RowCounts { examples, truncated, per_epoch: examples }
    }

    #[test]
    fn sensible_settings_say_nothing_and_odd_ones_are_named() {
        let config = TrainConfig { batch_size: 4, lr: 2e-4, seq_len: 512, ..Default::default() };
        assert!(settings_warnings(&config, counts(500, 0), 100).is_empty());
        let warnings = settings_warnings(&config, counts(40, 0), 200);
        assert!(warnings[0].contains("20 passes over 40 training rows"), "{warnings:?}");
        let hot = TrainConfig { lr: 0.5, ..config.clone() };
        assert!(settings_warnings(&hot, counts(500, 0), 100)[0].contains("may diverge"));
        let cold = TrainConfig { lr: 1e-8, ..config.clone() };
        assert!(settings_warnings(&cold, counts(500, 0), 100)[0].contains("barely change"));
        assert!(settings_warnings(&config, counts(500, 100), 100)[0].contains("100 of 500 training rows (20%)"));
        assert!(settings_warnings(&config, counts(500, 20), 100).is_empty(), "4% cut is fine");
        // Packed, 40 examples in 8 rows: 200 steps of 4 rows are 100 passes, not 20.
        let packed = RowCounts { per_epoch: 8, ..counts(40, 0) };
        assert!(settings_warnings(&config, packed, 200)[0].contains("100 passes over 40 training rows"));
    }

    #[test]
    fn packing_is_suggested_only_where_rows_are_short() {
        let config = TrainConfig { seq_len: 512, ..Default::default() };
        let tip = packing_tip(&config, &[100; 40]).unwrap();
        assert!(tip.contains("average 100 tokens") && tip.contains("5.0 examples in each row"), "{tip}");
        assert!(packing_tip(&config, &[300; 40]).is_none(), "one a row: nothing to gain");
        assert!(packing_tip(&TrainConfig { packing: true, ..config.clone() }, &[100; 40]).is_none());
        let dpo = TrainConfig { method: crate::engine::train::Method::Dpo, ..config };
        assert!(packing_tip(&dpo, &[100; 40]).is_none(), "DPO cannot pack");
    }
}
