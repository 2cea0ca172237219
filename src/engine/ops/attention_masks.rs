//! The blocked attention's additive masks. A block of `bq` queries from position `q` masks its keys by where they
//! lie relative to `q`: a key after a query is hidden, and so is one `window` or more positions before it. So one
//! mask over relative positions, (bq, W) with column c standing for key `q + c - (W - bq)`, serves every block of
//! every layer as a column view: made once on the host per (block, window, dtype, device) and kept, O(bq x T)
//! values, never T x T. Packed rows add, per block, which keys lie before each query's example start, made on the
//! device from the starts (a handful of ops on (b, bq, keys), a heads-th of the scores).

use candle_core::{DType, Device, DeviceLocation, Result, Tensor};
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

/// The value of a hidden score: a sure zero after the softmax's exp, finite so that no product with 0 makes a NaN
/// (it becomes -inf in f16, which is still no NaN: masks are only added).
const HIDDEN: f32 = -1e30;

type MasterKey = (usize, usize, DType, DeviceLocation);

/// The relative mask of blocks of `bq` queries under `window` (usize::MAX: none) as a (bq, W) tensor with
/// W >= `width`, in `dtype` on `device`: kept between calls and remade wider when a longer sequence needs it.
fn master(bq: usize, window: usize, width: usize, dtype: DType, device: &Device) -> Result<Tensor> {
    static MASTERS: OnceLock<Mutex<HashMap<MasterKey, Tensor>>> = OnceLock::new();
    let masters = MASTERS.get_or_init(Default::default);
    let key = (bq, window, dtype, device.location());
    let kept = masters.lock().unwrap_or_else(|e| e.into_inner()).get(&key).cloned();
    // Candle does not let ops mix two device instances at one location: such a mask is remade.
    if let Some(mask) = kept.filter(|m| m.dim(1).is_ok_and(|w| w >= width) && m.device().same_device(device)) {
        return Ok(mask);
    }
    let mut values = vec![0f32; bq * width];
    for i in 0..bq {
        for c in 0..width {
            // The key's position minus the query's (query i of the block sits at relative position i).
            let back = i as i64 - (c as i64 - (width - bq) as i64);
            if back < 0 || back as u64 >= window as u64 {
                values[i * width + c] = HIDDEN;
            }
        }
    }
    let mask = Tensor::from_vec(values, (bq, width), device)?.to_dtype(dtype)?;
    masters.lock().unwrap_or_else(|e| e.into_inner()).insert(key, mask.clone());
    Ok(mask)
}

/// The causal (and window) mask of queries `first_query..first_query + bq` against keys
/// `first_key..first_key + keys` (all keys up to `first_query + bq`): a (bq, keys) view of the kept relative mask.
pub(super) fn causal(
    (first_query, bq): (usize, usize),
    (first_key, keys): (usize, usize),
    (window, total_keys): (usize, usize),
    dtype: DType,
    device: &Device,
) -> Result<Tensor> {
    let width = total_keys + bq;
    let master = master(bq, window, width, dtype, device)?;
    let w = master.dim(1)?;
    // Column of key j: j - first_query + (w - bq); first_key - first_query >= -total_keys keeps it >= 0.
    let column = (first_key + w - bq)
        .checked_sub(first_query)
        .ok_or_else(|| candle_core::Error::Msg("attention mask: keys before the relative mask".into()))?;
    master.narrow(1, column, keys)
}

/// Which keys `first_key..first_key + keys` lie before the example start of each query
/// `first_query..first_query + bq` of each packed row, as an additive (b, bq, keys) mask in `dtype`; `starts` holds
/// the rows' starts on the device, (b, t) in f32 (exact below 2^24).
pub(super) fn before_starts(
    starts: &Tensor,
    (first_query, bq): (usize, usize),
    (first_key, keys): (usize, usize),
    dtype: DType,
) -> Result<Tensor> {
    let b = starts.dim(0)?;
    let positions =
        Tensor::arange(first_key as f32, (first_key + keys) as f32, starts.device())?.reshape((1, 1, keys))?;
    let own = starts.narrow(1, first_query, bq)?.reshape((b, bq, 1))?;
    (positions.broadcast_lt(&own)?.to_dtype(DType::F32)? * HIDDEN as f64)?.to_dtype(dtype)
}
