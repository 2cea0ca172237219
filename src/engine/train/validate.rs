//! The one settings check of a training run, shared by every front end (CLI, studio, worker, trainer): each
//! numeric setting is range-checked with a message naming the setting, its flag, the value and the allowed
//! range; the run name must be a plain folder name; and, once the model is known, the sequence length must fit
//! its context and `layers` its layer count.

use super::config::{ModelLimits, TrainConfig};
use crate::engine::{Error, Result};

/// Most epochs a run may ask for: beyond this a typo, not a plan (a run would never end).
pub const MAX_EPOCHS: f64 = 100_000.0;

/// Most optimizer steps (and the largest step interval) a run may ask for.
pub const MAX_STEPS: usize = 10_000_000;

/// Largest batch size, gradient accumulation, and LoRA rank.
pub const MAX_BATCH: usize = 4096;
pub const MAX_RANK: usize = 4096;

/// Longest sequence length accepted before the model is known.
pub const MAX_SEQ_LEN: usize = 1 << 20;

/// Refuse `value` for `name` unless `ok`.
fn check(ok: bool, name: &str, value: impl std::fmt::Display, allowed: &str) -> Result<()> {
    if ok {
        Ok(())
    } else {
        Err(Error::out_of_range(name, value, allowed))
    }
}

/// A sequence of `seq_len` tokens must fit the model's context (`max_position_embeddings`): its positions past it
/// have no rotation the model was made for.
pub fn check_seq_len(seq_len: usize, context_length: usize) -> Result<()> {
    if seq_len > context_length {
        return Err(Error::InvalidSetting(format!(
            "seq_len {seq_len} is longer than the model's context of {context_length} tokens; set seq_len to at \
             most {context_length}"
        )));
    }
    Ok(())
}

impl TrainConfig {
    /// The one settings check every front end runs before any work starts: [`Self::validate`] plus what needs
    /// the model (the sequence length must fit its context; `layers` cannot exceed its layer count).
    pub fn validate_for_model(&self, model: ModelLimits) -> Result<()> {
        self.validate()?;
        check_seq_len(self.seq_len, model.context_length)?;
        if let Some(n) = self.lora.layers.filter(|&n| n > model.num_layers) {
            return Err(Error::InvalidSetting(format!(
                "`layers` asks to adapt the last {n} layers but the model has only {}; set it to at most {} (or unset \
                 it for all layers)",
                model.num_layers, model.num_layers
            )));
        }
        Ok(())
    }

    /// Reject combinations that cannot work, with a reason a user can act on.
    pub fn validate(&self) -> Result<()> {
        self.validate_lora()?;
        self.validate_optimizer()?;
        self.validate_length()?;
        self.validate_stopping()?;
        self.preference().validate(self.method)?;
        if self.method.is_reinforcement() {
            self.grpo.validate()?;
        }
        if self.method.is_preference() && self.train_on_prompt {
            return Err(Error::InvalidSetting(format!(
                "train_on_prompt (--train-on-prompt) has no meaning for {}: a preference loss compares the chosen and \
                 rejected answers; leave it off",
                self.method.name()
            )));
        }
        if self.packing && self.method != super::method::Method::Sft {
            return Err(Error::InvalidSetting(format!(
                "packing (--packing) packs SFT rows; {} compares or scores whole rows of its own, so leave packing \
                 off",
                self.method.name()
            )));
        }
        self.read_options().validate()?;
        if let Some(name) = &self.run_name {
            super::run_folder::validate_run_name(name)?;
        }
        Ok(())
    }

    fn validate_lora(&self) -> Result<()> {
        let l = &self.lora;
        check((1..=MAX_RANK).contains(&l.rank), "LoRA rank `rank` (--rank)", l.rank, &format!("1 to {MAX_RANK}"))?;
        let alpha_ok = l.alpha > 0.0 && l.alpha <= 1e6;
        check(alpha_ok, "LoRA alpha `alpha` (--alpha)", l.alpha, "greater than 0 and at most 1000000")?;
        check((0.0..1.0).contains(&l.dropout), "LoRA dropout `dropout` (--dropout)", l.dropout, "0 to below 1")?;
        if l.layers == Some(0) {
            return Err(Error::InvalidSetting("`layers` must be at least 1 (or unset for all layers)".into()));
        }
        if l.targets.is_empty() {
            return Err(Error::InvalidSetting("choose at least one LoRA target module".into()));
        }
        Ok(())
    }

    fn validate_optimizer(&self) -> Result<()> {
        check(self.lr > 0.0 && self.lr <= 1.0, "learning rate `lr` (--lr)", self.lr, "greater than 0 and at most 1")?;
        let wd = self.weight_decay;
        check((0.0..=1.0).contains(&wd), "weight decay `weight_decay` (--weight-decay)", wd, "0 to 1")?;
        if let Some(n) = self.max_grad_norm {
            let allowed = "greater than 0 and at most 1000000 (0 on the command line, or unset, turns clipping off)";
            check(n > 0.0 && n <= 1e6, "max grad norm `max_grad_norm` (--max-grad-norm)", n, allowed)?;
        }
        let steps = format!("0 to {MAX_STEPS}");
        if let Some(warmup) = self.warmup {
            check(warmup <= MAX_STEPS, "warmup steps `warmup` (--warmup)", warmup, &steps)?;
        }
        check(self.val_every <= MAX_STEPS, "eval interval `val_every` (--val-every)", self.val_every, &steps)?;
        check(self.val_batches <= MAX_STEPS, "eval batches `val_batches`", self.val_batches, &steps)?;
        check(self.save_every <= MAX_STEPS, "save interval `save_every` (--save-every)", self.save_every, &steps)
    }

    /// Early stopping and the checkpoint limit. Whether the dataset has validation rows is checked once it is read
    /// (`early_stop::require_validation`).
    fn validate_stopping(&self) -> Result<()> {
        let patience = self.early_stopping_patience;
        let name = "early stopping patience `early_stopping_patience` (--early-stopping-patience)";
        check(patience <= MAX_STEPS, name, patience, &format!("0 (off) to {MAX_STEPS}"))?;
        let delta = self.early_stopping_min_delta;
        let name = "early stopping min delta `early_stopping_min_delta` (--early-stopping-min-delta)";
        check((0.0..=1e6).contains(&delta), name, delta, "0 to 1000000")?;
        if patience > 0 && self.val_every == 0 {
            return Err(Error::InvalidSetting(format!(
                "early stopping (patience {patience}, --early-stopping-patience) needs evaluations during the run, but \
                 eval interval `val_every` (--val-every) is 0 (only at the end); set --val-every to a number of steps, \
                 or the patience to 0"
            )));
        }
        if let Some(limit) = self.save_total_limit {
            let name = "checkpoint limit `save_total_limit` (--save-total-limit)";
            check((1..=MAX_STEPS).contains(&limit), name, limit, &format!("1 to {MAX_STEPS} (unset keeps all)"))?;
        }
        Ok(())
    }

    fn validate_length(&self) -> Result<()> {
        let batch = format!("1 to {MAX_BATCH}");
        check(
            (1..=MAX_BATCH).contains(&self.batch_size),
            "batch size `batch_size` (--batch-size)",
            self.batch_size,
            &batch,
        )?;
        let accum = self.grad_accum;
        check((1..=MAX_BATCH).contains(&accum), "gradient accumulation `grad_accum` (--grad-accum)", accum, &batch)?;
        let seq = format!("8 to {MAX_SEQ_LEN} (and at most the model's context)");
        check((8..=MAX_SEQ_LEN).contains(&self.seq_len), "sequence length `seq_len` (--seq-len)", self.seq_len, &seq)?;
        match (self.iters, self.epochs) {
            (Some(n), _) => {
                check((1..=MAX_STEPS).contains(&n), "iterations `iters` (--iters)", n, &format!("1 to {MAX_STEPS}"))
            }
            (None, Some(e)) => {
                let ok = e > 0.0 && e <= MAX_EPOCHS;
                check(ok, "epochs `epochs` (--epochs)", e, &format!("greater than 0 and at most {MAX_EPOCHS}"))
            }
            (None, None) => Err(Error::InvalidSetting("set either iterations or epochs".into())),
        }
    }
}
