//! Precision choices shared by the dispatchers: half-precision inputs widened to f32 for numerically sensitive
//! steps, f64 (the finite-difference test models) composed so its arithmetic stays in f64, and constants made in
//! a tensor's dtype.

use candle_core::{DType, Device, DeviceLocation, Result, Shape, Tensor};
use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Mutex, OnceLock};

/// Half-precision tensors converted to f32 for numerically sensitive steps (softmax, loss); f32 and f64 stay.
pub fn upcast(x: &Tensor) -> Result<Tensor> {
    match x.dtype() {
        DType::F16 | DType::BF16 => x.to_dtype(DType::F32),
        _ => Ok(x.clone()),
    }
}

/// `x` in the dtype a composed chain of element-wise passes runs in: its own, but f32 for f16, whose range loses
/// values such chains make on the way (Candle's f16 sigmoid computes its exp in f16, which overflows below -11).
pub(super) fn for_chain(x: &Tensor) -> Result<Tensor> {
    match x.dtype() {
        DType::F16 => x.to_dtype(DType::F32),
        _ => Ok(x.clone()),
    }
}

/// f64 (CPU-only test models) is normed by composed ops: Candle's CPU kernel accumulates in f32.
pub(super) fn composed_in_f64(dtype: DType) -> bool {
    dtype == DType::F64
}

/// A tensor of `shape` holding `value` in `dtype`: one fill on the device for the dtypes Metal has (`Tensor::ones`
/// and a scale would be two operations, each a dispatch on Metal); ones and a scale for any other.
pub(super) fn filled(value: f64, shape: impl Into<Shape>, dtype: DType, device: &Device) -> Result<Tensor> {
    match dtype {
        DType::F32 => Tensor::full(value as f32, shape, device),
        DType::BF16 => Tensor::full(half::bf16::from_f64(value), shape, device),
        DType::F16 => Tensor::full(half::f16::from_f64(value), shape, device),
        other => Tensor::ones(shape, other, device)?.affine(value, 0.0),
    }
}

/// A (len, 1) column of ones in `dtype` on `device`, a view of one kept between calls per dtype and device (remade
/// longer when a longer one is asked for): what `products::row_sums` multiplies by, without a fill dispatched each
/// time.
pub(super) fn ones_column(len: usize, dtype: DType, device: &Device) -> Result<Tensor> {
    static KEPT: OnceLock<Mutex<HashMap<(DType, DeviceLocation), Tensor>>> = OnceLock::new();
    let kept = KEPT.get_or_init(Default::default);
    let key = (dtype, device.location());
    let column = match kept_tensor(kept, &key, device, |c| c.dim(0).is_ok_and(|n| n >= len)) {
        Some(column) => column,
        None => {
            let column = filled(1.0, (len, 1), dtype, device)?;
            kept.lock().unwrap_or_else(|e| e.into_inner()).insert(key, column.clone());
            column
        }
    };
    column.narrow(0, 0, len)
}

/// The tensor kept in `cache` under `key` when it is `usable` and on `device` itself: Candle does not let ops mix two
/// device instances at one location, so a tensor made on another is made again by the caller.
pub(super) fn kept_tensor<K: Eq + Hash>(
    cache: &Mutex<HashMap<K, Tensor>>,
    key: &K,
    device: &Device,
    usable: impl Fn(&Tensor) -> bool,
) -> Option<Tensor> {
    let kept = cache.lock().unwrap_or_else(|e| e.into_inner()).get(key).cloned();
    kept.filter(|t| t.device().same_device(device) && usable(t))
}
