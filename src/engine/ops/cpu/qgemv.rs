//! Matrix-vector products `y = W x` for quantized weights (n rows of `k / 32` blocks): a decoded token's
//! product with a projection or LM head held quantized. Candle 0.11's CPU kernels for Q4_1, Q5_0 and Q5_1
//! have no SIMD (their `vec_dot` is the scalar reference loop), and all run on Candle's own thread pool,
//! beside the team that runs everything else: decoding with kept Q4_1 weights was several times slower than with them
//! dequantized to f32, although it reads a sixth of the bytes, and Q8_0 decoded at a third of f32's speed.
//!
//! Each is the same arithmetic as Candle's (and ggml's) `vec_dot`, with the integer part in AVX2:
//! - Q4_1 (`vec_dot_q4_1_q8_1`): `x` is quantized to Q8_1 blocks (32 int8 values, a scale `d` and
//!   `s = d * sum(q)`, both f16) exactly as Candle's `BlockQ8_1::from_float` does, and each row is
//!   `sum_b sumi_b * dw_b * dx_b + mw_b * sx_b` over its blocks, the float terms folded in the same order.
//! - Q8_0 (`vec_dot_q8_0_q8_0`, Candle's AVX2 one): `x` is quantized to Q8_0 blocks as `BlockQ8_0::from_float`
//!   does, and each row accumulates `dw_b * dx_b * q_b` into eight f32 lanes (`q_b`: the block's integer
//!   products summed four by four) with the same fused multiply-adds, then the same horizontal sum.
//! - Q5_0 and Q5_1 (`vec_dot_q5_0_q8_0`, `vec_dot_q5_1_q8_1`, what a K-quant asked for on rows that do not
//!   fill 256-weight blocks falls back to): Q8_0 / Q8_1 activations, the integer dot exact, the float terms
//!   folded as Candle's scalar loop folds them.
//!
//! Other block types (Q4_0 and the K-quants: Q4_K_M files) run Candle's own `from_float` and
//! `vec_dot` for each row on our team ([`candle_gemv`]): Candle's arithmetic without its pool.
//!
//! So the results equal Candle's bit for bit where Candle runs those `vec_dot`s (the tests check it; on a CPU
//! with AVX512-VNNI or AVX-VNNI, Candle multiplies Q8_0 through repacked tiles with Q8_K activations
//! instead, a rounding apart), and greedy ids do not move. The Q8_0 kernel runs only with AVX2 and FMA (else
//! Candle's, which has NEON on Apple Silicon). Rows are split over [`cpu_pool`](crate::engine::cpu_pool),
//! the team the f32 matrix-vector kernel uses.

use candle_core::quantized::{GgmlDType, GgmlType};
use half::f16;

/// Weights per block, for Q4_1, Q5_0, Q5_1, Q8_0 and Q8_1.
const BLOCK: usize = 32;
/// Bytes of one Q4_1 block: `d` and `m` (f16) then 16 bytes of nibbles (low: weights 0..16, high: 16..32).
const Q4_1_BYTES: usize = 20;
/// Bytes of one Q8_0 block: `d` (f16) then 32 int8 weights.
const Q8_0_BYTES: usize = 34;
/// Rows per task at least: Q4_1 rows are a sixth of f32 ones, so tasks are shorter than gemv.rs's to stay
/// balanced on the small projections (k and v of SmolLM2 have 192 rows).
const MIN_ROWS_PER_TASK: usize = 32;
/// Tasks per thread at most: an LM head of 49152 rows in tasks of 32 rows would be 1536 tasks, each a
/// scheduling round on the team for a microsecond of work.
const TASKS_PER_THREAD: usize = 16;

/// One activation block in Q8_1 (or Q8_0, where `s` is unused), the scales widened to f32 once (f16 to f32
/// is exact).
#[derive(Clone, Copy)]
struct Q8Block {
    d: f32,
    s: f32,
    /// The sum of `qs`, exact (Q5_0's weights are stored offset by 16).
    sum: i32,
    qs: [i8; BLOCK],
}

/// Whether a (n, k) Q4_1 product can run here: `k` fills whole blocks.
pub fn q4_1_fits(k: usize) -> bool {
    k > 0 && k.is_multiple_of(BLOCK)
}

/// Whether a (n, k) Q8_0 product can run here: `k` fills whole blocks and the CPU has AVX2 and FMA (the
/// kernel is Candle's AVX2 arithmetic; elsewhere Candle's own kernel is the better one).
pub fn q8_0_fits(k: usize) -> bool {
    k > 0 && k.is_multiple_of(BLOCK) && avx2_fma()
}

/// Whether this is an x86-64 CPU with AVX2, FMA and F16C.
fn avx2_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    return has_avx2_fma();
    #[cfg(not(target_arch = "x86_64"))]
    return false;
}

/// `W x` for `w`, the raw bytes of a (n, k) Q4_1 tensor, and `x` (k).
pub fn q4_1_gemv(w: &[u8], x: &[f32], n: usize, k: usize) -> Vec<f32> {
    assert!(q4_1_fits(k) && x.len() == k, "q4_1_gemv: shapes do not fit");
    let xq = quantize_q8(x, true);
    let row_bytes = k / BLOCK * Q4_1_BYTES;
    rows_gemv(w, n, row_bytes, |rows, dst| {
        for (row, out) in rows.chunks_exact(row_bytes).zip(dst) {
            *out = q4_1_row_dot(row, &xq);
        }
    })
}

/// `W x` for `w`, the raw bytes of a (n, k) Q8_0 tensor, and `x` (k).
pub fn q8_0_gemv(w: &[u8], x: &[f32], n: usize, k: usize) -> Vec<f32> {
    assert!(q8_0_fits(k) && x.len() == k, "q8_0_gemv: shapes do not fit");
    let xq = quantize_q8(x, false);
    rows_gemv(w, n, k / BLOCK * Q8_0_BYTES, |rows, dst| q8_0_rows_dot(rows, &xq, dst))
}

/// Whether a (n, k) Q5_0 or Q5_1 product can run here: `k` fills whole blocks and the CPU has AVX2 (Candle's
/// kernels for both are scalar loops on every CPU: ours is the better one wherever it runs).
pub fn q5_fits(k: usize) -> bool {
    k > 0 && k.is_multiple_of(BLOCK) && avx2_fma()
}

/// `W x` for `w`, the raw bytes of a (n, k) Q5_0 tensor (`MIN` false: `d`, 4 bytes of fifth bits, 16 of
/// nibbles; weights `q - 16`) or Q5_1 tensor (`MIN` true: `d`, `m`, then the same; weights `q`, plus `m`),
/// and `x` (k). Candle's `vec_dot_q5_0_q8_0` / `vec_dot_q5_1_q8_1`: the integer dot exact, then per block
/// `sumi * dw * dx` (+ `mw * sx`) folded in the same order.
pub fn q5_gemv<const MIN: bool>(w: &[u8], x: &[f32], n: usize, k: usize) -> Vec<f32> {
    assert!(q5_fits(k) && x.len() == k, "q5_gemv: shapes do not fit");
    let xq = quantize_q8(x, MIN);
    let block_bytes = if MIN { 24 } else { 22 };
    let row_bytes = k / BLOCK * block_bytes;
    rows_gemv(w, n, row_bytes, |rows, dst| {
        for (row, out) in rows.chunks_exact(row_bytes).zip(dst) {
            let mut sumf = 0f32;
            for (b, y) in row.chunks_exact(block_bytes).zip(&xq) {
                let (head, qs) = b.split_at(block_bytes - BLOCK / 2);
                let qh = u32::from_le_bytes(head[head.len() - 4..].try_into().unwrap_or_default());
                let uy = q5_block_uy(qs, qh, &y.qs);
                if MIN {
                    sumf += uy as f32 * f16_at(b, 0) * y.d + f16_at(b, 2) * y.s;
                } else {
                    sumf += (uy - 16 * y.sum) as f32 * f16_at(b, 0) * y.d;
                }
            }
            *out = sumf;
        }
    })
}

/// The exact `sum_j u_j * y_j` of one Q5 block, `u_j` the unsigned 5-bit value (nibble and fifth bit).
fn q5_block_uy(qs: &[u8], qh: u32, y: &[i8; BLOCK]) -> i32 {
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        // SAFETY: the CPU supports the features the function is compiled for; `qs` holds 16 bytes.
        return unsafe { avx2::q5_block_uy(qs.as_ptr(), qh, y.as_ptr()) };
    }
    let mut uy = 0i32;
    for (j, &q) in qs.iter().enumerate() {
        let u0 = (q & 0x0F) as i32 | (((qh >> j) & 1) << 4) as i32;
        let u1 = (q >> 4) as i32 | (((qh >> (j + 16)) & 1) << 4) as i32;
        uy += u0 * y[j] as i32 + u1 * y[j + BLOCK / 2] as i32;
    }
    uy
}

/// Whether [`candle_gemv`] reads a (n, k) weight of `dtype` here: a block type other than Q4_1 and Q8_0 (ours),
/// Q5_0 and Q5_1 (ours), with `k` filling whole blocks, on an x86-64 CPU with AVX2 and FMA (where Candle's
/// `vec_dot`s for Q4_0 and the K-quants are AVX2). Elsewhere (Apple Silicon) Candle's own kernels, with their
/// repacked NEON paths, run instead.
pub fn candle_vec_dot_fits(dtype: GgmlDType, k: usize) -> bool {
    use GgmlDType as T;
    let typed = matches!(dtype, T::Q4_0 | T::Q2K | T::Q3K | T::Q4K | T::Q5K | T::Q6K);
    typed && k > 0 && k.is_multiple_of(dtype.block_size()) && avx2_fma()
}

/// `W x` for `w`, the raw bytes of a (n, k) tensor of `dtype` (where [`candle_vec_dot_fits`]), through
/// Candle's own row arithmetic: `x` quantized by its `from_float` to the type's activation blocks (Q8_0, or
/// Q8_K for the K-quants) and each row's `vec_dot`, the rows split over our team. So each result is Candle's
/// `vec_dot` bit for bit, which its QMatMul also returns except where it runs repacked tiles (Q4_K with rows
/// in multiples of 16 and 256, on x86): those sum in another order, a rounding apart.
pub fn candle_gemv(dtype: GgmlDType, w: &[u8], x: &[f32], n: usize, k: usize) -> Vec<f32> {
    use candle_core::quantized::k_quants as kq;
    assert!(candle_vec_dot_fits(dtype, k) && x.len() == k, "candle_gemv: shapes do not fit");
    match dtype {
        GgmlDType::Q4_0 => typed_gemv::<kq::BlockQ4_0>(w, x, n, k),
        GgmlDType::Q2K => typed_gemv::<kq::BlockQ2K>(w, x, n, k),
        GgmlDType::Q3K => typed_gemv::<kq::BlockQ3K>(w, x, n, k),
        GgmlDType::Q4K => typed_gemv::<kq::BlockQ4K>(w, x, n, k),
        GgmlDType::Q5K => typed_gemv::<kq::BlockQ5K>(w, x, n, k),
        _ => typed_gemv::<kq::BlockQ6K>(w, x, n, k),
    }
}

/// [`candle_gemv`] for Candle's block type `B`.
fn typed_gemv<B: GgmlType>(w: &[u8], x: &[f32], n: usize, k: usize) -> Vec<f32> {
    let blocks = k / B::BLCK_SIZE;
    let row_bytes = blocks * std::mem::size_of::<B>();
    // Candle's storage is a Vec of blocks, so aligned; a row's bytes are whole blocks.
    assert!(w.as_ptr().align_offset(std::mem::align_of::<B>()) == 0, "candle_gemv: unaligned blocks");
    let mut xq = vec![B::VecDotType::zeros(); k / B::VecDotType::BLCK_SIZE];
    B::VecDotType::from_float(x, &mut xq);
    rows_gemv(w, n, row_bytes, |rows, dst| {
        // SAFETY: `rows` is `dst.len()` whole rows of `B` blocks (plain data, repr(C)) at an aligned address.
        let typed = unsafe { std::slice::from_raw_parts(rows.as_ptr() as *const B, dst.len() * blocks) };
        for (row, out) in typed.chunks_exact(blocks).zip(dst) {
            *out = B::vec_dot(k, row, &xq);
        }
    })
}

/// The `n` products of the rows of `row_bytes` bytes in `w`, the rows split over the team in runs:
/// `dot(rows, dst)` fills `dst` with the products of the consecutive rows whose bytes are `rows`.
fn rows_gemv(w: &[u8], n: usize, row_bytes: usize, dot: impl Fn(&[u8], &mut [f32]) + Sync) -> Vec<f32> {
    assert!(w.len() >= n * row_bytes, "quantized gemv: the weight has fewer than {n} rows");
    let threads = crate::engine::cpu_team::threads();
    let rows_per_task = MIN_ROWS_PER_TASK.max(n.div_ceil(threads * TASKS_PER_THREAD));
    crate::engine::cpu_pool::new_f32(n, rows_per_task, |task, dst| {
        let first = task * rows_per_task;
        dot(&w[first * row_bytes..(first + dst.len()) * row_bytes], dst)
    })
}

/// Candle's `BlockQ8_1::from_float` (`with_sum`) or `BlockQ8_0::from_float` (ggml's `quantize_row_q8_1` /
/// `quantize_row_q8_0` references), step for step: the same `d`, the same rounding.
fn quantize_q8(x: &[f32], with_sum: bool) -> Vec<Q8Block> {
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
            let s = if with_sum { (f16::from_f32(sum as f32) * d16).to_f32() } else { 0.0 };
            Q8Block { d: d16.to_f32(), s, sum, qs }
        })
        .collect()
}

/// One Q4_1 row's dot product with the quantized activations.
fn q4_1_row_dot(row: &[u8], xq: &[Q8Block]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if has_avx2_f16c() {
        // SAFETY: the CPU supports the features the function is compiled for.
        return unsafe { avx2::q4_1_row_dot(row, xq) };
    }
    let mut sumf = 0f32;
    for (b, y) in row.chunks_exact(Q4_1_BYTES).zip(xq) {
        let (dw, mw) = (f16_at(b, 0), f16_at(b, 2));
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

/// The dot products of consecutive Q8_0 rows (`rows`, one per element of `dst`) with the quantized
/// activations (only reached where [`q8_0_fits`]).
fn q8_0_rows_dot(rows: &[u8], xq: &[Q8Block], dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        // SAFETY: the CPU supports the features the function is compiled for.
        return unsafe { avx2::q8_0_rows_dot(rows, xq, dst) };
    }
    // Candle's reference loop, for completeness (q8_0_fits keeps callers on the AVX2 path).
    for (row, out) in rows.chunks_exact(xq.len() * Q8_0_BYTES).zip(dst) {
        *out = 0.0;
        for (b, y) in row.chunks_exact(Q8_0_BYTES).zip(xq) {
            let sumi: i32 = b[2..].iter().zip(&y.qs).map(|(&w, &a)| w as i8 as i32 * a as i32).sum();
            *out += sumi as f32 * f16_at(b, 0) * y.d;
        }
    }
}

/// The f16 at byte `at` of a block, widened.
fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

#[cfg(target_arch = "x86_64")]
fn has_avx2_f16c() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| is_x86_feature_detected!("avx2") && is_x86_feature_detected!("f16c"))
}

#[cfg(target_arch = "x86_64")]
fn has_avx2_fma() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| has_avx2_f16c() && is_x86_feature_detected!("fma"))
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use crate::engine::ops::cpu::qgemv::{Q8Block, Q4_1_BYTES, Q8_0_BYTES};
    use std::arch::x86_64::*;

    /// The exact integer dot of one Q4_1 block: nibbles (u8) times int8 through `maddubs` (pairs fit in
    /// i16: 2 * 15 * 128 < 32768), then widened and summed.
    #[target_feature(enable = "avx2")]
    unsafe fn q4_1_block_sumi(qs: *const u8, y: *const i8) -> i32 {
        let packed = _mm_loadu_si128(qs as *const __m128i);
        let low_mask = _mm_set1_epi8(0x0F);
        let lo = _mm_and_si128(packed, low_mask);
        let hi = _mm_and_si128(_mm_srli_epi16(packed, 4), low_mask);
        let q4 = _mm256_set_m128i(hi, lo);
        let q8 = _mm256_loadu_si256(y as *const __m256i);
        hsum_pairs(_mm256_maddubs_epi16(q4, q8))
    }

    /// The exact dot of one Q5 block's unsigned 5-bit values with int8 activations: the nibbles as in
    /// [`q4_1_block_sumi`], each with its fifth bit (`qh` bit `j` for weight `j`) spread to a byte by ggml's
    /// `bytes_from_bits_32` and or-ed in as 16; pairs fit in i16 (2 * 31 * 128 < 32768).
    #[target_feature(enable = "avx2")]
    pub unsafe fn q5_block_uy(qs: *const u8, qh: u32, y: *const i8) -> i32 {
        let packed = _mm_loadu_si128(qs as *const __m128i);
        let low_mask = _mm_set1_epi8(0x0F);
        let lo = _mm_and_si128(packed, low_mask);
        let hi = _mm_and_si128(_mm_srli_epi16(packed, 4), low_mask);
        let shuffle = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
        let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(qh as i32), shuffle);
        let bytes = _mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
        let fifth = _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1));
        let u = _mm256_or_si256(_mm256_set_m128i(hi, lo), _mm256_and_si256(fifth, _mm256_set1_epi8(0x10)));
        hsum_pairs(_mm256_maddubs_epi16(u, _mm256_loadu_si256(y as *const __m256i)))
    }

    /// The sum of sixteen i16 pair sums, exactly, in i32.
    #[target_feature(enable = "avx2")]
    unsafe fn hsum_pairs(pairs: __m256i) -> i32 {
        let quads = _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
        let s = _mm_add_epi32(_mm256_castsi256_si128(quads), _mm256_extracti128_si256(quads, 1));
        let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 1));
        _mm_cvtsi128_si32(s)
    }

    /// As the scalar loop in the parent module, with the integer dot vectorised and the scales widened by
    /// F16C; the float terms are rounded and added in the same order, so the result is the same.
    #[target_feature(enable = "avx2,f16c")]
    pub unsafe fn q4_1_row_dot(row: &[u8], xq: &[Q8Block]) -> f32 {
        let mut sumf = 0f32;
        for (b, y) in row.chunks_exact(Q4_1_BYTES).zip(xq) {
            let p = b.as_ptr();
            let scales = _mm_cvtph_ps(_mm_cvtsi32_si128((p as *const i32).read_unaligned()));
            let dw = _mm_cvtss_f32(scales);
            let mw = _mm_cvtss_f32(_mm_shuffle_ps(scales, scales, 1));
            let sumi = q4_1_block_sumi(p.add(4), y.qs.as_ptr());
            sumf += sumi as f32 * dw * y.d + mw * y.s;
        }
        sumf
    }

    /// Candle's `avx::vec_dot_q8_0_q8_0` on raw blocks, four rows at a time: per block, `|w|` times
    /// `a * sign(w)` through `maddubs` (exact: weights and activations lie in -127..=127), summed four by
    /// four into eight i32 lanes, converted, and fused-multiply-added with `dw * da` into each row's eight
    /// f32 lanes; then the same horizontal sum (`hsum_float_8`). Each row's arithmetic is the one-row
    /// kernel's. The four rows' scales are widened by one F16C conversion whose every lane is used:
    /// widening one scale alone let the compiler insert it into the accumulator's register, chaining every
    /// block to the previous one's multiply-add (a quarter of the speed).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn q8_0_rows_dot(rows: &[u8], xq: &[Q8Block], dst: &mut [f32]) {
        let row_bytes = xq.len() * Q8_0_BYTES;
        let ones = _mm256_set1_epi16(1);
        let full = dst.len() / 4 * 4;
        let (quads, rest) = dst.split_at_mut(full);
        for (r, out) in quads.chunks_exact_mut(4).enumerate() {
            let p = rows.as_ptr().add(4 * r * row_bytes);
            let mut acc = [_mm256_setzero_ps(); 4];
            for (b, y) in xq.iter().enumerate() {
                let at = |i: usize| p.add(i * row_bytes + b * Q8_0_BYTES);
                let d16 = |i: usize| (at(i) as *const u16).read_unaligned() as i64;
                let scales = _mm_cvtph_ps(_mm_cvtsi64_si128(d16(0) | d16(1) << 16 | d16(2) << 32 | d16(3) << 48));
                let dw: [f32; 4] = std::mem::transmute(scales);
                let a = _mm256_loadu_si256(y.qs.as_ptr() as *const __m256i);
                for (i, acc) in acc.iter_mut().enumerate() {
                    let w = _mm256_loadu_si256(at(i).add(2) as *const __m256i);
                    let pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w));
                    let q = _mm256_cvtepi32_ps(_mm256_madd_epi16(ones, pairs));
                    *acc = _mm256_fmadd_ps(_mm256_set1_ps(dw[i] * y.d), q, *acc);
                }
            }
            for (out, acc) in out.iter_mut().zip(acc) {
                *out = hsum(acc);
            }
        }
        for (i, out) in rest.iter_mut().enumerate() {
            let p = rows.as_ptr().add((full + i) * row_bytes);
            let mut acc = _mm256_setzero_ps();
            for (b, y) in xq.iter().enumerate() {
                let at = p.add(b * Q8_0_BYTES);
                let d16 = (at as *const u16).read_unaligned() as i64;
                let dw = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi64_si128(d16 * 0x0001_0001_0001_0001)));
                let w = _mm256_loadu_si256(at.add(2) as *const __m256i);
                let a = _mm256_loadu_si256(y.qs.as_ptr() as *const __m256i);
                let pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w));
                let q = _mm256_cvtepi32_ps(_mm256_madd_epi16(ones, pairs));
                acc = _mm256_fmadd_ps(_mm256_set1_ps(dw * y.d), q, acc);
            }
            *out = hsum(acc);
        }
    }

    /// Candle's `hsum_float_8`, operation for operation.
    #[target_feature(enable = "avx2")]
    unsafe fn hsum(acc: __m256) -> f32 {
        let res = _mm_add_ps(_mm256_extractf128_ps(acc, 1), _mm256_castps256_ps128(acc));
        let res = _mm_add_ps(res, _mm_movehl_ps(res, res));
        let res = _mm_add_ss(res, _mm_movehdup_ps(res));
        _mm_cvtss_f32(res)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
    use candle_core::{Device, Module, Tensor};
    use std::sync::Arc;

    /// A (n, k) weight quantized to `dtype`, an activation row, and Candle's product of the two.
    fn case(dtype: GgmlDType, n: usize, k: usize) -> (Arc<QTensor>, Vec<f32>, Vec<f32>) {
        let dev = Device::Cpu;
        let w: Vec<f32> = (0..n * k).map(|i| (((i * 7919) % 97) as f32 - 48.0) * 0.013).collect();
        let x: Vec<f32> = (0..k).map(|i| (((i * 31) % 23) as f32 - 11.0) * 0.37).collect();
        let q = Arc::new(QTensor::quantize(&Tensor::from_vec(w, (n, k), &dev).unwrap(), dtype).unwrap());
        let xt = Tensor::from_vec(x.clone(), (1, k), &dev).unwrap();
        let want =
            QMatMul::from_arc(q.clone()).unwrap().forward(&xt).unwrap().flatten_all().unwrap().to_vec1().unwrap();
        (q, x, want)
    }

    #[test]
    fn equals_candles_q4_1_product_bit_for_bit() {
        for (n, k) in [(1usize, 32usize), (37, 64), (192, 576), (70, 1536)] {
            let (q, x, want) = case(GgmlDType::Q4_1, n, k);
            assert_eq!(q4_1_gemv(&q.data().unwrap(), &x, n, k), want, "n={n} k={k}");
        }
    }

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn equals_candles_q8_0_product_bit_for_bit() {
        if !q8_0_fits(32) {
            return; // no AVX2: Candle's kernel runs instead of ours
        }
        // With VNNI, Candle multiplies Q8_0 through repacked tiles and Q8_K activations (k a multiple of
        // 256, n of 16): a rounding apart. Elsewhere it runs the AVX2 `vec_dot` this kernel mirrors.
        let vnni = is_x86_feature_detected!("avx512vnni") || is_x86_feature_detected!("avxvnni");
        for (n, k) in [(1usize, 32usize), (37, 64), (192, 576), (70, 1536), (4099, 576)] {
            let (q, x, want) = case(GgmlDType::Q8_0, n, k);
            let got = q8_0_gemv(&q.data().unwrap(), &x, n, k);
            if vnni {
                let scale = want.iter().fold(1f32, |m, v| m.max(v.abs()));
                assert!(got.iter().zip(&want).all(|(a, b)| (a - b).abs() <= 1e-2 * scale), "n={n} k={k}");
            } else {
                assert_eq!(got, want, "n={n} k={k}");
            }
        }
    }

    #[test]
    fn equals_candles_row_arithmetic_for_other_block_types() {
        use GgmlDType as T;
        for dtype in [T::Q4_0, T::Q2K, T::Q3K, T::Q4K, T::Q5K, T::Q6K] {
            if !candle_vec_dot_fits(dtype, 256) {
                return; // not x86 with AVX2: Candle's own kernels run instead
            }
            // n not a multiple of 16: Candle's QMatMul runs its `vec_dot`s, which ours must equal exactly.
            for (n, k) in [(37usize, 256usize), (70, 1536), (4099, 512)] {
                let (q, x, want) = case(dtype, n, k);
                assert_eq!(candle_gemv(dtype, &q.data().unwrap(), &x, n, k), want, "{dtype:?} n={n} k={k}");
            }
            // n a multiple of 16 (for Q4_K, Candle's repacked tiles on x86: a rounding apart).
            let (n, k) = (192, 1536);
            let (q, x, want) = case(dtype, n, k);
            let got = candle_gemv(dtype, &q.data().unwrap(), &x, n, k);
            let scale = want.iter().fold(1f32, |m, v| m.max(v.abs()));
            let worst = got.iter().zip(&want).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            assert!(worst <= 1e-5 * scale, "{dtype:?}: {worst} of {scale}");
        }
    }

    #[test]
    fn equals_candles_q5_0_and_q5_1_products_bit_for_bit() {
        if !q5_fits(32) {
            return; // no AVX2: Candle's kernels run instead of ours
        }
        for (n, k) in [(1usize, 32usize), (37, 64), (192, 576), (70, 1536), (4099, 576)] {
            let (q, x, want) = case(GgmlDType::Q5_0, n, k);
            assert_eq!(q5_gemv::<false>(&q.data().unwrap(), &x, n, k), want, "Q5_0 n={n} k={k}");
            let (q, x, want) = case(GgmlDType::Q5_1, n, k);
            assert_eq!(q5_gemv::<true>(&q.data().unwrap(), &x, n, k), want, "Q5_1 n={n} k={k}");
        }
    }
}
