//! A preference batch through the model: the reference model's log-probabilities (DPO), the policy's with
//! the backward pass weighed by the preference loss (training) or without it (evaluation).
//!
//! DPO's reference is the base model: the policy's own weights with no adapter, a clone that shares every
//! tensor (no second copy of the weights). Its log-probabilities are computed per batch, one forward pass
//! without a tape (about a third of a training step's compute and one layer's activations of memory), rather
//! than cached per example, so a resumed run computes exactly what an uninterrupted one does.

use super::metrics::PreferenceMetrics;
use super::objective::{pair_objective, PairLogps};
use super::pair_batch::PairTokens;
use crate::engine::data::{self, Batch, PreparedSplit};
use crate::engine::lora;
use crate::engine::model::transformer::Transformer;
use crate::engine::train::backprop::{self, BatchGradients, Pass, TokenWeights};
use crate::engine::train::loss;
use crate::engine::train::method::{Method, PreferenceSettings};
use crate::engine::Result;

/// What a preference step needs beside the policy model.
#[derive(Debug, Clone)]
pub struct PreferenceObjective {
    pub method: Method,
    pub settings: PreferenceSettings,
    /// DPO's reference model (None for ORPO).
    reference: Option<Transformer>,
}

impl PreferenceObjective {
    /// The objective of `method` for a policy trained on `base` (any adapters `base` carries are left out of the
    /// reference).
    pub fn new(method: Method, settings: PreferenceSettings, base: &Transformer) -> Self {
        let reference = (method == Method::Dpo).then(|| {
            let mut reference = base.clone();
            lora::detach_adapters(&mut reference);
            reference
        });
        Self { method, settings, reference }
    }

    /// The reference's (NLL sum, completion tokens) of each row of `batch`, when the method has a reference.
    fn reference_rows(&self, batch: &Batch) -> Result<Option<Vec<(f64, usize)>>> {
        self.reference.as_ref().map(|reference| loss::batch_row_nll(reference, batch)).transpose()
    }

    /// Forward and backward over one batch of pairs: its metrics, and the gradients of `scale` times its loss.
    pub fn loss_and_gradients(
        &self,
        model: &Transformer,
        batch: &Batch,
        scale: f64,
        pass: Pass,
    ) -> Result<(PreferenceMetrics, BatchGradients)> {
        let reference = self.reference_rows(batch)?;
        let tokens = PairTokens::of(batch, self.method)?;
        let mut metrics = None;
        let mut weigh = |token_nll: &[f64]| {
            let (pairs, nll) = tokens.pair_logps(token_nll, reference.as_deref());
            let objective = pair_objective(self.method, &self.settings, &pairs, nll);
            metrics = Some(objective.metrics);
            Ok(tokens.token_weights(&objective, self.method, scale))
        };
        let positions = (tokens.sources.clone(), tokens.targets.clone());
        let grads = backprop::loss_and_gradients_at(
            model,
            batch,
            positions,
            TokenWeights::PerToken { weigh: &mut weigh, temperature: 1.0 },
            pass,
        )?;
        let metrics = metrics.ok_or_else(|| {
            crate::engine::Error::Training("a preference batch had no completion tokens to score".into())
        })?;
        Ok((metrics, grads))
    }

    /// The metrics of one batch of pairs, forward passes only (evaluation).
    pub fn metrics(&self, model: &Transformer, batch: &Batch) -> Result<PreferenceMetrics> {
        Ok(self.scored(model, batch)?.0)
    }

    /// [`PreferenceObjective::metrics`], with each pair's log-probabilities.
    pub fn scored(&self, model: &Transformer, batch: &Batch) -> Result<(PreferenceMetrics, Vec<PairLogps>)> {
        let reference = self.reference_rows(batch)?;
        let tokens = PairTokens::of(batch, self.method)?;
        let token_nll = loss::token_nll_at(model, batch, tokens.sources.clone(), &tokens.targets)?;
        let (pairs, nll) = tokens.pair_logps(&token_nll, reference.as_deref());
        Ok((pair_objective(self.method, &self.settings, &pairs, nll).metrics, pairs))
    }

    /// The metrics over (up to `max_batches`, 0 = all) batches of `batch_size` pairs of `split`, forward passes
    /// only: a run's validation and `eval --task preference`. None when the split holds no pairs.
    pub fn split_metrics(
        &self,
        model: &Transformer,
        split: &PreparedSplit,
        batch_size: usize,
        max_batches: usize,
        pad_id: u32,
    ) -> Result<Option<PreferenceMetrics>> {
        let mut parts = Vec::new();
        for (i, indices) in data::eval_batches(&split.lengths(), batch_size).iter().enumerate() {
            if max_batches > 0 && i >= max_batches {
                break;
            }
            parts.push(self.metrics(model, &data::collate_pairs(split, indices, pad_id)?)?);
        }
        Ok(PreferenceMetrics::combine(&parts))
    }
}
