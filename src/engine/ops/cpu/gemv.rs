//! Matrix-vector product `y = W x` for a row-major f32 weight (n, k): what every projection does for each
//! decoded token. It is a single pass over the weights, bound by memory bandwidth, so the work is to keep
//! both cores streaming: rows are split into tasks on [`cpu_pool`](crate::engine::cpu_pool) and each task
//! reads four rows at a time with AVX2/FMA when the CPU has it.

/// Rows per task: large enough for the hardware prefetcher to follow a long stream, small enough that
/// the two cores finish together.
const ROWS_PER_TASK: usize = 64;

/// `W x` for `w` (n, k) row-major and `x` (k).
pub fn gemv(w: &[f32], x: &[f32], n: usize, k: usize) -> Vec<f32> {
    debug_assert_eq!(w.len(), n * k);
    debug_assert_eq!(x.len(), k);
    crate::engine::cpu_pool::new_f32(n, ROWS_PER_TASK, |task, dst| {
        let first = task * ROWS_PER_TASK;
        rows_times_vector(&w[first * k..(first + dst.len()) * k], x, k, dst);
    })
}

/// `dst[r] = w[r] . x` for the rows of `w` (dst.len(), k).
fn rows_times_vector(w: &[f32], x: &[f32], k: usize, dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        // SAFETY: the CPU supports the features the function is compiled for.
        return unsafe { avx2::rows_times_vector(w, x, k, dst) };
    }
    for (r, o) in dst.iter_mut().enumerate() {
        *o = dot(&w[r * k..(r + 1) * k], x);
    }
}

#[cfg(target_arch = "x86_64")]
fn has_avx2_fma() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"))
}

/// Dot product with independent accumulators so the compiler vectorises it.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 16];
    let (ac, bc) = (a.chunks_exact(16), b.chunks_exact(16));
    let tail: f32 = ac.remainder().iter().zip(bc.remainder()).map(|(x, y)| x * y).sum();
    for (x, y) in ac.zip(bc) {
        for i in 0..16 {
            acc[i] += x[i] * y[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx2,fma")]
    unsafe fn horizontal_sum(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
        _mm_cvtss_f32(s)
    }

    /// Four rows per pass: each 8-wide slice of `x` is loaded once and used four times.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn rows_times_vector(w: &[f32], x: &[f32], k: usize, dst: &mut [f32]) {
        let rows = dst.len();
        assert!(w.len() >= rows * k && x.len() >= k);
        let body = k / 8 * 8;
        let (wp, xp) = (w.as_ptr(), x.as_ptr());
        let mut r = 0;
        while r + 4 <= rows {
            let (w0, w1, w2, w3) = (wp.add(r * k), wp.add((r + 1) * k), wp.add((r + 2) * k), wp.add((r + 3) * k));
            let (mut a0, mut a1, mut a2, mut a3) =
                (_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps());
            let mut j = 0;
            while j < body {
                let xv = _mm256_loadu_ps(xp.add(j));
                a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w0.add(j)), xv, a0);
                a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w1.add(j)), xv, a1);
                a2 = _mm256_fmadd_ps(_mm256_loadu_ps(w2.add(j)), xv, a2);
                a3 = _mm256_fmadd_ps(_mm256_loadu_ps(w3.add(j)), xv, a3);
                j += 8;
            }
            let mut sums = [horizontal_sum(a0), horizontal_sum(a1), horizontal_sum(a2), horizontal_sum(a3)];
            for j in body..k {
                let xv = *xp.add(j);
                sums[0] += *w0.add(j) * xv;
                sums[1] += *w1.add(j) * xv;
                sums[2] += *w2.add(j) * xv;
                sums[3] += *w3.add(j) * xv;
            }
            dst[r..r + 4].copy_from_slice(&sums);
            r += 4;
        }
        for (i, o) in dst.iter_mut().enumerate().skip(r) {
            *o = crate::engine::ops::cpu::gemv::dot(&w[i * k..(i + 1) * k], &x[..k]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_a_plain_product_for_odd_shapes() {
        for (n, k) in [(1usize, 1usize), (3, 7), (5, 8), (67, 19), (130, 576), (257, 33)] {
            let w: Vec<f32> = (0..n * k).map(|i| ((i * 7919) % 13) as f32 * 0.25 - 1.5).collect();
            let x: Vec<f32> = (0..k).map(|i| ((i * 31) % 11) as f32 * 0.5 - 2.0).collect();
            let got = gemv(&w, &x, n, k);
            for r in 0..n {
                let want: f32 = (0..k).map(|j| w[r * k + j] * x[j]).sum();
                assert!((got[r] - want).abs() <= 1e-4 * want.abs().max(1.0), "n={n} k={k} row {r}");
            }
        }
    }
}
