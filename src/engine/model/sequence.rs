//! Facts about one training batch that every decoder layer's training forward and backward share.

use candle_core::Tensor;

/// Per-batch context of a training pass: sequences start at position 0, rows are `batch * seq_len`.
pub struct SequenceContext {
    pub batch: usize,
    pub seq_len: usize,
    /// Rotary tables (seq_len, head_dim / 2) for positions 0..seq_len.
    pub cos: Tensor,
    pub sin: Tensor,
    /// Additive causal (and, with a model-wide window, sliding-window) mask (t, t).
    pub mask: Option<Tensor>,
    /// The sliding layers' own rope tables and windowed mask, when they differ from the others' (gemma3).
    pub local: Option<LocalAttention>,
    /// Apply adapter dropout.
    pub dropout: bool,
}

/// Rope tables and mask of the sliding layers of a model that mixes sliding and global layers (gemma3).
pub struct LocalAttention {
    pub cos: Tensor,
    pub sin: Tensor,
    pub mask: Option<Tensor>,
}

impl SequenceContext {
    /// (cos, sin, mask) for a layer: the local ones when it rotates with the local tables and they exist.
    pub fn attention(&self, local: bool) -> (&Tensor, &Tensor, Option<&Tensor>) {
        match (&self.local, local) {
            (Some(l), true) => (&l.cos, &l.sin, l.mask.as_ref()),
            _ => (&self.cos, &self.sin, self.mask.as_ref()),
        }
    }
}
