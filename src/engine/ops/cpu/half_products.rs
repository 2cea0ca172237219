//! Frozen-weight products in bf16 or f16 on the CPU. Candle's CPU matmul has no half-precision kernel: at
//! every call it widens both operands' whole storage to f32 on one thread (for a view, the whole tensor it
//! views), multiplies and narrows back; the 128k-vocabulary head of a 1B model is 1 GB of f32 each time. Here
//! the input is widened once, the weight one piece of rows at a time (about 2^24 values, 64 MB of f32) in
//! parallel on our team, and BLAS (or, for one row, our matrix-vector kernel) multiplies each piece; the result
//! is narrowed back to the input's dtype. Same arithmetic as Candle's (f32 products of the widened values).

use candle_core::{CpuStorage, Layout, Shape};
use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

/// A half-precision slice of either kind.
enum Half<'a> {
    Bf16(&'a [bf16]),
    F16(&'a [f16]),
}

impl<'a> Half<'a> {
    /// The contiguous values of `storage` under `layout`; None for other dtypes or strided layouts.
    fn of(storage: &'a CpuStorage, layout: &Layout) -> Option<Self> {
        let (start, end) = layout.contiguous_offsets()?;
        match storage {
            CpuStorage::BF16(v) => Some(Half::Bf16(&v[start..end])),
            CpuStorage::F16(v) => Some(Half::F16(&v[start..end])),
            _ => None,
        }
    }

    fn same_kind(&self, other: &Half) -> bool {
        matches!((self, other), (Half::Bf16(_), Half::Bf16(_)) | (Half::F16(_), Half::F16(_)))
    }

    /// Values `range` widened to f32, in parallel on the CPU team.
    fn widen(&self, range: std::ops::Range<usize>) -> Vec<f32> {
        let chunk = (range.len() / (crate::engine::cpu_team::threads() * 4)).max(1 << 14);
        crate::engine::cpu_pool::new_f32(range.len(), chunk, |i, out| {
            let from = range.start + i * chunk;
            match self {
                Half::Bf16(v) => v[from..from + out.len()].convert_to_f32_slice(out),
                Half::F16(v) => v[from..from + out.len()].convert_to_f32_slice(out),
            }
        })
    }

    /// `values` narrowed to this slice's kind.
    fn narrow(&self, values: &[f32]) -> CpuStorage {
        match self {
            Half::Bf16(_) => CpuStorage::BF16(values.iter().map(|&x| bf16::from_f32(x)).collect()),
            Half::F16(_) => CpuStorage::F16(values.iter().map(|&x| f16::from_f32(x)).collect()),
        }
    }
}

/// `x W^T` (`transposed`, W stored (n, k)) or `x W` (W stored (k, n)) for a contiguous half-precision CPU input
/// (rows, k) and weight of the same dtype; None where this does not apply (other dtypes, strided operands, no
/// BLAS loaded): the caller then uses Candle's matmul.
pub(in crate::engine::ops) fn half_frozen_matmul(
    weight: &candle_core::Tensor,
    storage: &CpuStorage,
    layout: &Layout,
    transposed: bool,
) -> Option<(CpuStorage, Shape)> {
    let (rows, k) = layout.shape().dims2().ok()?;
    if !crate::engine::blas::available() {
        return None;
    }
    let x = Half::of(storage, layout)?;
    let (w_storage, w_layout) = weight.storage_and_layout();
    let candle_core::Storage::Cpu(w_storage) = &*w_storage else { return None };
    let w = Half::of(w_storage, w_layout)?;
    let (d0, d1) = w_layout.shape().dims2().ok()?;
    let (n, w_k) = if transposed { (d0, d1) } else { (d1, d0) };
    if w_k != k || !x.same_kind(&w) {
        return None;
    }
    let x32 = x.widen(0..rows * k);
    // Pieces of the weight's stored rows: output columns when transposed, the inner dimension otherwise.
    let mut out = vec![0f32; rows * n];
    for (first, count) in super::host::cpu_row_pieces(d0, d1) {
        let piece = w.widen(first * d1..(first + count) * d1);
        if transposed {
            let part = if rows == 1 {
                super::gemv::gemv(&piece, &x32, count, k)
            } else {
                crate::engine::blas::sgemm_to_vec(&x32, &piece, rows, count, k, true)?
            };
            for r in 0..rows {
                out[r * n + first..r * n + first + count].copy_from_slice(&part[r * count..(r + 1) * count]);
            }
        } else {
            let x_cols: Vec<f32> =
                (0..rows).flat_map(|r| &x32[r * k + first..r * k + first + count]).copied().collect();
            let part = crate::engine::blas::sgemm_to_vec(&x_cols, &piece, rows, n, count, false)?;
            out.iter_mut().zip(&part).for_each(|(o, p)| *o += p);
        }
    }
    Some((x.narrow(&out), (rows, n).into()))
}

#[cfg(test)]
mod tests {
    use candle_core::{DType, Device, Tensor};

    /// Against the f32 product of the same (widened) values, both orientations, one row and many, a weight of
    /// several pieces (4100 x 4096 is 2^24 values and 4 rows more), bf16 and f16.
    #[test]
    fn half_products_equal_the_f32_product_of_the_same_values() -> candle_core::Result<()> {
        if !crate::engine::blas::available() {
            eprintln!("no BLAS: skipped");
            return Ok(());
        }
        let dev = Device::Cpu;
        for dtype in [DType::BF16, DType::F16] {
            let w = Tensor::randn(0f32, 0.05, (4100, 4096), &dev)?.to_dtype(dtype)?;
            for rows in [1, 9] {
                let x = Tensor::randn(0f32, 1.0, (rows, 4096), &dev)?.to_dtype(dtype)?;
                let dy = Tensor::randn(0f32, 1.0, (rows, 4100), &dev)?.to_dtype(dtype)?;
                let w32 = w.to_dtype(DType::F32)?;
                let want_t = x.to_dtype(DType::F32)?.matmul(&w32.t()?)?;
                let want = dy.to_dtype(DType::F32)?.matmul(&w32)?;
                let got_t = crate::engine::ops::frozen_matmul_t(&x, &w)?;
                let got = crate::engine::ops::frozen_matmul(&dy, &w)?;
                assert_eq!((got_t.dtype(), got.dtype()), (dtype, dtype));
                for (got, want) in [(got_t, want_t), (got, want)] {
                    let scale = want.abs()?.max_all()?.to_scalar::<f32>()?;
                    let rounded = want.to_dtype(dtype)?.to_dtype(DType::F32)?;
                    let diff = (got.to_dtype(DType::F32)? - rounded)?.abs()?.max_all()?.to_scalar::<f32>()?;
                    // Summation order apart, the one rounding to the half type: 2^-8 of the largest value for bf16.
                    assert!(diff <= scale / 128.0, "{dtype:?} {rows} rows: {diff} (largest {scale})");
                }
            }
        }
        Ok(())
    }
}
