//! The blocked attention's additive masks. A block of `bq` queries from position `q` masks its keys by where they
//! lie relative to `q`: a key after a query is hidden, and so is one `window` or more positions before it. So one
//! mask over relative positions, (bq, W) with column c standing for key `q + c - (W - bq)`, serves every block of
//! every layer as a column view: made once on the host per (block, window, dtype, device) and kept, O(bq x T)
//! values, never T x T. Packed rows add, per block, which keys lie before each query's example start, made on the
//! device from the starts (a handful of ops on (b, bq, keys), a heads-th of the scores). Unpacked, the mask a block
//! adds is also kept broadcast to the scores' shape ([`causal_expanded`]), so the add reads two contiguous tensors.

use super::precision::kept_tensor;
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
    if let Some(mask) = kept_tensor(masters, &key, device, |m| m.dim(1).is_ok_and(|w| w >= width)) {
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

/// Bytes of expanded masks kept at once (a training run uses a handful of shapes: 4 MiB each at the 1B shape and
/// 4 x 1024); the cache is emptied when a new one would pass it, and a mask larger than it is not expanded.
const EXPANDED_BYTES: usize = 64 << 20;

type ExpandedKey = (usize, usize, i64, usize, usize, usize, DType, DeviceLocation);

/// [`causal`] broadcast to the scores' whole shape `(b, heads, bq, keys)` and made contiguous, kept between calls:
/// a mask added to a contiguous piece of scores of that shape is then an add of two contiguous tensors, which
/// Candle's CUDA and Metal kernels do without the per-element index arithmetic of a broadcast (on an H200, 36 us
/// for the 2M scores of a 1B causal block's hidden columns broadcast, against about 6). It depends only on where
/// the keys lie relative to the queries, so one tensor serves every such block of every layer. `heads` counts the
/// scores' second dimension (query heads). None for a mask above [`EXPANDED_BYTES`] (the caller broadcasts).
pub(super) fn causal_expanded(
    (first_query, bq): (usize, usize),
    (first_key, keys): (usize, usize),
    (window, total_keys): (usize, usize),
    (b, heads): (usize, usize),
    dtype: DType,
    device: &Device,
) -> Result<Option<Tensor>> {
    let bytes = b * heads * bq * keys * dtype.size_in_bytes();
    if bytes > EXPANDED_BYTES {
        return Ok(None);
    }
    static EXPANDED: OnceLock<Mutex<HashMap<ExpandedKey, Tensor>>> = OnceLock::new();
    let expanded = EXPANDED.get_or_init(Default::default);
    let relative = first_key as i64 - first_query as i64;
    let key = (bq, window, relative, keys, b, heads, dtype, device.location());
    if let Some(mask) = kept_tensor(expanded, &key, device, |_| true) {
        return Ok(Some(mask));
    }
    let view = causal((first_query, bq), (first_key, keys), (window, total_keys), dtype, device)?;
    let mask = view.reshape((1, 1, bq, keys))?.broadcast_as((b, heads, bq, keys))?.contiguous()?;
    let mut kept = expanded.lock().unwrap_or_else(|e| e.into_inner());
    let held: usize = kept.values().map(|m| m.elem_count() * m.dtype().size_in_bytes()).sum();
    if held + bytes > EXPANDED_BYTES {
        kept.clear();
    }
    kept.insert(key, mask.clone());
    Ok(Some(mask))
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

#[cfg(test)]
mod tests {
    use super::super::kernel_tests::max_diff;
    use super::*;

    /// The expanded mask is the causal view broadcast to every head, the same values for blocks at the same
    /// relative place; a mask above the kept budget is not expanded.
    #[test]
    fn expanded_masks_repeat_the_causal_view_for_every_head() {
        let dev = Device::Cpu;
        for (queries, keys, window) in [((128, 4), (126, 6)), ((64, 4), (60, 6)), ((8, 4), (4, 8))]
            .into_iter()
            .zip([usize::MAX, 3, usize::MAX])
            .map(|((q, k), w)| (q, k, w))
        {
            let view = causal(queries, keys, (window, 200), DType::F32, &dev).unwrap();
            let expanded = causal_expanded(queries, keys, (window, 200), (2, 3), DType::F32, &dev).unwrap().unwrap();
            assert_eq!(expanded.dims(), [2, 3, queries.1, keys.1]);
            for (b, h) in [(0, 0), (1, 2)] {
                assert_eq!(max_diff(&expanded.get(b).unwrap().get(h).unwrap(), &view), 0.0, "{queries:?} {keys:?}");
            }
        }
        let huge = causal_expanded((0, 1024), (0, 1024), (usize::MAX, 1024), (64, 64), DType::F32, &dev).unwrap();
        assert!(huge.is_none(), "a 1 GiB mask was kept");
    }
}
