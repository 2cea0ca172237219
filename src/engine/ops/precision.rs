//! Precision choices shared by the dispatchers: half-precision inputs widened to f32 for numerically sensitive
//! steps, and f64 (the finite-difference test models) composed so its arithmetic stays in f64.

use candle_core::{DType, Result, Tensor};

/// Half-precision tensors converted to f32 for numerically sensitive steps (softmax, loss); f32 and f64 stay.
pub fn upcast(x: &Tensor) -> Result<Tensor> {
    match x.dtype() {
        DType::F16 | DType::BF16 => x.to_dtype(DType::F32),
        _ => Ok(x.clone()),
    }
}

/// f64 (CPU-only test models) is normed by composed ops: Candle's CPU kernel accumulates in f32.
pub(super) fn composed_in_f64(dtype: DType) -> bool {
    dtype == DType::F64
}
