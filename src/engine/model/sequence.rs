//! Facts about one training batch that every decoder layer's training forward and backward share.

use candle_core::Tensor;

/// Per-batch context of a training pass: sequences start at position 0, rows are `batch * seq_len`.
pub struct SequenceContext {
    pub batch: usize,
    pub seq_len: usize,
    /// Rotary tables (seq_len, head_dim / 2) for positions 0..seq_len.
    pub cos: Tensor,
    pub sin: Tensor,
    /// Additive causal (and sliding-window) mask (t, t); None where the fused attention masks in its kernels.
    pub mask: Option<Tensor>,
    /// Apply adapter dropout.
    pub dropout: bool,
}
