//! Host-side plumbing of our CPU kernels: a tensor's f32 elements borrowed without a copy where the storage allows,
//! and the row pieces in which a frozen weight is made dense for a product without adding it whole to the peak.

use candle_core::{DType, Result, Tensor};

/// Values of a frozen weight made dense in f32 at once for a CPU product: 2^24 (64 MB). An 8B model's MLP weight
/// (14336 x 4096, 235 MB in f32) would otherwise add itself whole to the step's peak, several times per layer.
pub(in crate::engine::ops) const CPU_PIECE_VALUES: usize = 1 << 24;

/// The (first row, rows) pieces of at most [`CPU_PIECE_VALUES`] values (and at least one row) in which a CPU
/// product turns a (rows, row_len) frozen weight dense: one piece when the whole weight fits.
pub(in crate::engine::ops) fn cpu_row_pieces(rows: usize, row_len: usize) -> Vec<(usize, usize)> {
    if rows * row_len <= CPU_PIECE_VALUES {
        return vec![(0, rows)];
    }
    let per_piece = (CPU_PIECE_VALUES / row_len.max(1)).max(1);
    (0..rows).step_by(per_piece).map(|first| (first, per_piece.min(rows - first))).collect()
}

/// A tensor's f32 elements in order (see [`F32Elems`]).
pub(in crate::engine::ops) fn f32_of(t: &Tensor) -> Result<F32Elems<'_>> {
    if t.device().is_cpu() && t.dtype() == DType::F32 {
        let (storage, layout) = t.storage_and_layout();
        if let Some((start, end)) = layout.contiguous_offsets() {
            return Ok(F32Elems::Borrowed(Box::new(storage), start, end));
        }
    }
    Ok(F32Elems::Owned(t.flatten_all()?.to_vec1::<f32>()?))
}

/// A tensor's f32 elements in order: borrowed from a contiguous CPU storage (no copy), else copied.
pub(in crate::engine::ops) enum F32Elems<'a> {
    Borrowed(Box<dyn std::ops::Deref<Target = candle_core::Storage> + 'a>, usize, usize),
    Owned(Vec<f32>),
}

impl std::ops::Deref for F32Elems<'_> {
    type Target = [f32];

    fn deref(&self) -> &[f32] {
        match self {
            F32Elems::Borrowed(storage, start, end) => match &***storage {
                candle_core::Storage::Cpu(candle_core::CpuStorage::F32(v)) => &v[*start..*end],
                _ => unreachable!("borrowed only from CPU f32 storage"),
            },
            F32Elems::Owned(v) => v,
        }
    }
}
