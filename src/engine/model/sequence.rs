//! Facts about one training batch that every decoder layer's training forward and backward share.

use candle_core::Tensor;

/// Per-batch context of a training pass: sequences start at position 0, rows are `batch * seq_len`.
pub struct SequenceContext {
    pub batch: usize,
    pub seq_len: usize,
    /// Rotary tables (seq_len, head_dim / 2) for positions 0..seq_len; for packed rows (batch, seq_len,
    /// head_dim / 2), each token's own position.
    pub cos: Tensor,
    pub sin: Tensor,
    /// Additive causal (and, with a model-wide window, sliding-window) mask (t, t); None where the fused
    /// attention masks in its kernels.
    pub mask: Option<Tensor>,
    /// The sliding layers' own rope tables and windowed mask, when they differ from the others' (gemma3).
    pub local: Option<LocalAttention>,
    /// Apply adapter dropout.
    pub dropout: bool,
    /// Several examples per row (`data::packing`): attention never crosses from one to the next.
    pub packed: Option<PackedRows>,
}

/// Where each token's example begins in its row, for the attention of packed rows.
pub struct PackedRows {
    /// u32 (batch, seq_len) on the model's device, what the fused kernels read.
    pub starts: Tensor,
    /// The same on the host, what the blocked attention builds its block masks from.
    pub starts_host: Vec<u32>,
}

/// Rope tables and mask of the sliding layers of a model that mixes sliding and global layers (gemma3).
pub struct LocalAttention {
    pub cos: Tensor,
    pub sin: Tensor,
    pub mask: Option<Tensor>,
}

impl SequenceContext {
    /// The packed rows' starts, host and device, when rows are packed.
    pub fn row_starts(&self) -> Option<(&Tensor, &[u32])> {
        self.packed.as_ref().map(|p| (&p.starts, p.starts_host.as_slice()))
    }

    /// (cos, sin, mask) for a layer: the local ones when it rotates with the local tables and they exist.
    pub fn attention(&self, local: bool) -> (&Tensor, &Tensor, Option<&Tensor>) {
        match (&self.local, local) {
            (Some(l), true) => (&l.cos, &l.sin, l.mask.as_ref()),
            _ => (&self.cos, &self.sin, self.mask.as_ref()),
        }
    }
}

/// The rotary position of every token of packed rows of `seq_len`: its distance from its example's start
/// (`row_starts` as `data::packing` makes them).
pub fn packed_positions(row_starts: &[u32], seq_len: usize) -> Vec<u32> {
    row_starts.iter().enumerate().map(|(k, &s)| ((k % seq_len.max(1)) as u32).saturating_sub(s)).collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn positions_restart_at_every_example() {
        let starts = [0, 0, 0, 3, 3, 0, 0, 0, 0, 4];
        assert_eq!(super::packed_positions(&starts, 5), vec![0, 1, 2, 0, 1, 0, 1, 2, 3, 0]);
    }
}
