//! The LoRA adapter layer: a low-rank update `scale * x A B` added to a frozen linear (`linear.rs`).
//! A and B are stored in the layout fastest for the forward pass, A as (in, r) and B as (r, out), so the
//! update is two plain products with no transposes; PEFT's (r, in) / (out, r) layout is converted on save and
//! load (checkpoint.rs). Adapters are kept in f32 (master weights) and cast to the compute dtype when used: for a
//! training step all at once, ahead of it (`lora::ComputeCopies`, which fills [`LoraAdapter::compute`]), otherwise
//! each when its product runs.
//! Attaching, detaching and counting adapters on a model is `engine::lora`.
//!
//! DoRA (PEFT's `use_dora`) adds a magnitude vector `m` (one per output row): the adapted weight is
//! `m / ||W + s (AB)^T||_row * (W + s (AB)^T)`, with the row norm treated as a constant (detached, as PEFT and the
//! DoRA paper do). The projection's forward and backward for it are in `linear.rs`; the merge is [`merge_weight`].

use candle_core::{DType, Tensor, Var};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// An adapter's A and B already cast to the compute dtype, while a training step runs (see the module docs).
pub type ComputeSlot = Arc<Mutex<Option<(Tensor, Tensor)>>>;

/// One adapter on one linear.
#[derive(Debug, Clone)]
pub struct LoraAdapter {
    /// (in_features, rank), f32.
    pub a: Var,
    /// (rank, out_features), f32; starts at zero so step 0 equals the base model.
    pub b: Var,
    pub scale: f64,
    pub dropout: f32,
    /// Seeds the dropout mask; the trainer bumps it each step so masks are reproducible on resume.
    pub dropout_seed: Arc<AtomicU64>,
    /// A and B in the compute dtype for the training step under way; empty outside one.
    pub compute: ComputeSlot,
    /// DoRA's magnitude, when this is a DoRA adapter.
    pub dora: Option<Dora>,
}

/// The DoRA part of an adapter (see the module docs).
#[derive(Debug, Clone)]
pub struct Dora {
    /// m, (out_features,), f32; PEFT's `lora_magnitude_vector`.
    pub magnitude: Var,
    /// Inference's factor `m / ||W + s (AB)^T||_row` (f32, (out,)), computed at its first use and kept: a decode step
    /// would otherwise pay a weight-sized sum per adapted linear per token. Every training pass empties it and
    /// computes its own, and the optimizer only changes the weights after a training pass, so it never goes stale.
    pub factor: Arc<Mutex<Option<Tensor>>>,
}

impl Dora {
    /// A DoRA part with magnitude `magnitude` (f32, (out,)).
    pub fn new(magnitude: Var) -> Self {
        Self { magnitude, factor: Default::default() }
    }

    /// Forget the inference factor (the weights are about to change).
    pub fn forget_factor(&self) {
        if let Ok(mut slot) = self.factor.lock() {
            *slot = None;
        }
    }
}

/// The L2 norm of each row of `w` (out, in) -> (out,), in `w`'s dtype.
pub fn row_norms(w: &Tensor) -> candle_core::Result<Tensor> {
    w.sqr()?.sum(1)?.sqrt()
}

/// A linear's weight with its adapter folded in, for merged exports: `W + delta` (LoRA), and with DoRA's
/// `magnitude` the rows rescaled to it, `m / ||W + delta||_row * (W + delta)`. `w` and `delta` are (out, in),
/// `delta = s (AB)^T` ([`LoraAdapter::delta`]), all on one device in one float dtype.
pub fn merge_weight(w: &Tensor, delta: &Tensor, magnitude: Option<&Tensor>) -> candle_core::Result<Tensor> {
    let merged = (w + delta)?;
    match magnitude {
        None => Ok(merged),
        Some(m) => {
            let factor = (m.to_dtype(merged.dtype())? / row_norms(&merged)?)?;
            merged.broadcast_mul(&factor.unsqueeze(1)?)
        }
    }
}

impl LoraAdapter {
    pub fn rank(&self) -> usize {
        self.a.dims()[1]
    }

    /// A and B in the compute dtype `dtype`: the step's copies when a training step prepared them, else cast from
    /// the f32 master weights when it differs.
    pub fn matrices(&self, dtype: DType) -> candle_core::Result<(Tensor, Tensor)> {
        let prepared = self.compute.lock().ok().and_then(|slot| slot.clone());
        if let Some((a, b)) = prepared.filter(|(a, _)| a.dtype() == dtype) {
            return Ok((a, b));
        }
        let (a, b) = (self.a.as_tensor().detach(), self.b.as_tensor().detach());
        if a.dtype() == dtype {
            return Ok((a, b));
        }
        Ok((a.to_dtype(dtype)?, b.to_dtype(dtype)?))
    }

    /// The update as a weight, `scale * (A B)^T` (out, in), f32 from the master weights.
    pub fn delta(&self) -> candle_core::Result<Tensor> {
        self.a.as_tensor().detach().matmul(&self.b.as_tensor().detach())?.t()? * self.scale
    }

    /// `y + scale * x A B` (inference: no dropout), `x`: (..., in), `y`: (..., out).
    pub fn add_to(&self, y: &Tensor, x: &Tensor) -> candle_core::Result<Tensor> {
        let in_features = x.dim(candle_core::D::Minus1)?;
        let rows = x.elem_count() / in_features.max(1);
        let (a, b) = self.matrices(x.dtype())?;
        let out_features = y.dim(candle_core::D::Minus1)?;
        let (y2, x2) = (y.reshape((rows, out_features))?, x.reshape((rows, in_features))?);
        crate::engine::ops::lora_add(&y2, &x2, &a, &b, self.scale)?.reshape(y.shape())
    }

    /// The next dropout mask, drawn from the shared seeded counter (so a training pass and a reference pass that
    /// draw in the same order get identical masks): its seed, applied with `Dropout::apply`.
    pub fn next_dropout(&self) -> crate::engine::ops::Dropout {
        crate::engine::ops::Dropout::new(self.dropout_seed.fetch_add(1, Ordering::Relaxed), self.dropout)
    }
}
