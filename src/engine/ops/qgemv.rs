//! Matrix-vector product `y = W x` for a Q4_1 weight (n rows of `k / 32` blocks): a decoded token's product
//! with a projection that a GGUF file keeps in Q4_1. Candle 0.11's CPU kernel for Q4_1 has no x86 SIMD (its
//! `vec_dot` is the scalar reference loop) and runs on Candle's own thread pool, beside the team that runs
//! everything else: decoding with the kept Q4_1 weights was several times slower than with them dequantized
//! to f32, although it reads a sixth of the bytes.
//!
//! This is the same arithmetic as Candle's (and ggml's) `vec_dot_q4_1_q8_1`, with the integer part in AVX2:
//! `x` is quantized to Q8_1 blocks (32 int8 values, a scale `d` and `s = d * sum(q)`, both f16) exactly as
//! Candle's `BlockQ8_1::from_float` does, and each row is `sum_b sumi_b * dw_b * dx_b + mw_b * sx_b` over its
//! blocks, with the integer dot `sumi_b` exact and the float terms folded in the same order. So the results
//! equal Candle's bit for bit (the tests check it), and greedy ids do not move. Rows are split over
//! [`cpu_pool`](crate::engine::cpu_pool), the team the f32 matrix-vector kernel uses.

use half::f16;

/// Weights per block, for Q4_1 and Q8_1.
const BLOCK: usize = 32;
/// Bytes of one Q4_1 block: `d` and `m` (f16) then 16 bytes of nibbles (low: weights 0..16, high: 16..32).
const Q4_1_BYTES: usize = 20;
/// Rows per task: Q4_1 rows are a sixth of f32 ones, so tasks are shorter than gemv.rs's to stay balanced on
/// the small projections (k and v of SmolLM2 have 192 rows).
const ROWS_PER_TASK: usize = 32;

/// One activation block in Q8_1, the scales widened to f32 once (f16 to f32 is exact).
#[derive(Clone, Copy)]
struct Q8Block {
    d: f32,
    s: f32,
    qs: [i8; BLOCK],
}

/// Whether a (n, k) Q4_1 product can run here: `k` fills whole blocks.
pub fn q4_1_fits(k: usize) -> bool {
    k > 0 && k.is_multiple_of(BLOCK)
}

/// `W x` for `w`, the raw bytes of a (n, k) Q4_1 tensor, and `x` (k).
pub fn q4_1_gemv(w: &[u8], x: &[f32], n: usize, k: usize) -> Vec<f32> {
    let blocks = k / BLOCK;
    assert!(q4_1_fits(k) && x.len() == k && w.len() >= n * blocks * Q4_1_BYTES, "q4_1_gemv: shapes do not fit");
    let xq = quantize_q8_1(x);
    let row_bytes = blocks * Q4_1_BYTES;
    crate::engine::cpu_pool::new_f32(n, ROWS_PER_TASK, |task, dst| {
        let first = task * ROWS_PER_TASK;
        for (i, out) in dst.iter_mut().enumerate() {
            let row = &w[(first + i) * row_bytes..(first + i + 1) * row_bytes];
            *out = row_dot(row, &xq);
        }
    })
}

/// Candle's `BlockQ8_1::from_float` (ggml's `quantize_row_q8_1` reference), step for step.
fn quantize_q8_1(x: &[f32]) -> Vec<Q8Block> {
    x.chunks_exact(BLOCK)
        .map(|xs| {
            let amax = xs.iter().fold(0f32, |a, &v| a.max(v.abs()));
            let d = amax / 127.0;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            let d16 = f16::from_f32(d);
            let mut qs = [0i8; BLOCK];
            let mut sum = 0i32;
            for (q, &v) in qs.iter_mut().zip(xs) {
                *q = (v * id).round() as i8;
                sum += *q as i32;
            }
            let s16 = f16::from_f32(sum as f32) * d16;
            Q8Block { d: d16.to_f32(), s: s16.to_f32(), qs }
        })
        .collect()
}

/// One row's dot product with the quantized activations.
fn row_dot(row: &[u8], xq: &[Q8Block]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if has_avx2_f16c() {
        // SAFETY: the CPU supports the features the function is compiled for.
        return unsafe { avx2::row_dot(row, xq) };
    }
    let mut sumf = 0f32;
    for (b, y) in row.chunks_exact(Q4_1_BYTES).zip(xq) {
        let (dw, mw) = block_scales(b);
        let qs = &b[4..];
        let mut sumi = 0i32;
        let (y_lo, y_hi) = y.qs.split_at(BLOCK / 2);
        for ((&q, &a), &b) in qs.iter().zip(y_lo).zip(y_hi) {
            sumi += (q & 0x0F) as i32 * a as i32 + (q >> 4) as i32 * b as i32;
        }
        sumf += sumi as f32 * dw * y.d + mw * y.s;
    }
    sumf
}

/// A block's scale `d` and minimum `m`.
fn block_scales(b: &[u8]) -> (f32, f32) {
    (f16::from_le_bytes([b[0], b[1]]).to_f32(), f16::from_le_bytes([b[2], b[3]]).to_f32())
}

#[cfg(target_arch = "x86_64")]
fn has_avx2_f16c() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| is_x86_feature_detected!("avx2") && is_x86_feature_detected!("f16c"))
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{Q8Block, Q4_1_BYTES};
    use std::arch::x86_64::*;

    /// The exact integer dot of one block: nibbles (u8) times int8 through `maddubs` (pairs fit in i16:
    /// 2 * 15 * 128 < 32768), then widened and summed.
    #[target_feature(enable = "avx2")]
    unsafe fn block_sumi(qs: *const u8, y: *const i8) -> i32 {
        let packed = _mm_loadu_si128(qs as *const __m128i);
        let low_mask = _mm_set1_epi8(0x0F);
        let lo = _mm_and_si128(packed, low_mask);
        let hi = _mm_and_si128(_mm_srli_epi16(packed, 4), low_mask);
        let q4 = _mm256_set_m128i(hi, lo);
        let q8 = _mm256_loadu_si256(y as *const __m256i);
        let pairs = _mm256_maddubs_epi16(q4, q8);
        let quads = _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
        let s = _mm_add_epi32(_mm256_castsi256_si128(quads), _mm256_extracti128_si256(quads, 1));
        let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 1));
        _mm_cvtsi128_si32(s)
    }

    /// As the scalar loop in the parent module, with the integer dot vectorised and the scales widened by
    /// F16C; the float terms are rounded and added in the same order, so the result is the same.
    #[target_feature(enable = "avx2,f16c")]
    pub unsafe fn row_dot(row: &[u8], xq: &[Q8Block]) -> f32 {
        let mut sumf = 0f32;
        for (b, y) in row.chunks_exact(Q4_1_BYTES).zip(xq) {
            let p = b.as_ptr();
            let scales = _mm_cvtph_ps(_mm_cvtsi32_si128((p as *const i32).read_unaligned()));
            let dw = _mm_cvtss_f32(scales);
            let mw = _mm_cvtss_f32(_mm_shuffle_ps(scales, scales, 1));
            let sumi = block_sumi(p.add(4), y.qs.as_ptr());
            sumf += sumi as f32 * dw * y.d + mw * y.s;
        }
        sumf
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::{GgmlDType, QTensor};
    use candle_core::{Device, Module, Tensor};

    #[test]
    fn equals_candles_q4_1_product_bit_for_bit() {
        let dev = Device::Cpu;
        for (n, k) in [(1usize, 32usize), (37, 64), (192, 576), (70, 1536)] {
            let w: Vec<f32> = (0..n * k).map(|i| (((i * 7919) % 97) as f32 - 48.0) * 0.013).collect();
            let x: Vec<f32> = (0..k).map(|i| (((i * 31) % 23) as f32 - 11.0) * 0.37).collect();
            let wt = Tensor::from_vec(w, (n, k), &dev).unwrap();
            let q = std::sync::Arc::new(QTensor::quantize(&wt, GgmlDType::Q4_1).unwrap());
            let xt = Tensor::from_vec(x.clone(), (1, k), &dev).unwrap();
            let want: Vec<f32> = candle_core::quantized::QMatMul::from_arc(q.clone())
                .unwrap()
                .forward(&xt)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap();
            let got = q4_1_gemv(&q.data().unwrap(), &x, n, k);
            assert_eq!(got, want, "n={n} k={k}");
        }
    }
}
