//! The small dense linear algebra the X-ray needs, in f64 on the CPU: the R factor of a thin Householder QR of a
//! tall matrix (n x r, n in the thousands, r at most a few hundred) and the singular values of a small matrix by
//! one-sided (Hestenes) Jacobi.
//!
//! Why our own and not a crate: only these two routines are needed, on matrices of at most a few hundred columns,
//! and a linear-algebra crate (nalgebra with simba, approx, matrixmultiply and num-traits' friends) is a cold
//! build on the machines we build on for about 150 lines of work. One-sided Jacobi is also the most accurate SVD
//! for this job: it computes small singular values to high relative accuracy, which the energy ranks read.

/// A dense matrix stored column by column (`data[col * rows + row]`): the QR and the Jacobi rotations both
/// work on whole columns.
#[derive(Debug, Clone, PartialEq)]
pub struct ColMajor {
    pub rows: usize,
    pub cols: usize,
    pub data: Vec<f64>,
}

impl ColMajor {
    /// A `rows` x `cols` matrix of zeros.
    pub fn zeros(rows: usize, cols: usize) -> Self {
        Self { rows, cols, data: vec![0.0; rows * cols] }
    }

    /// The matrix stored row by row in `row_major` (`rows` x `cols`).
    pub fn from_row_major(row_major: &[f32], rows: usize, cols: usize) -> Self {
        let mut m = Self::zeros(rows, cols);
        for (i, row) in row_major.chunks_exact(cols.max(1)).take(rows).enumerate() {
            for (j, v) in row.iter().enumerate() {
                m.data[j * rows + i] = *v as f64;
            }
        }
        m
    }

    /// The transpose of the matrix stored row by row in `row_major` (`rows` x `cols`): (`cols` x `rows`), whose
    /// columns are `row_major`'s rows, so this is a plain copy.
    pub fn transpose_of_row_major(row_major: &[f32], rows: usize, cols: usize) -> Self {
        Self { rows: cols, cols: rows, data: row_major.iter().map(|v| *v as f64).collect() }
    }

    pub fn get(&self, row: usize, col: usize) -> f64 {
        self.data[col * self.rows + row]
    }

    fn col(&self, j: usize) -> &[f64] {
        &self.data[j * self.rows..(j + 1) * self.rows]
    }

    /// `self * other^T`.
    pub fn mul_transposed(&self, other: &ColMajor) -> ColMajor {
        let mut out = ColMajor::zeros(self.rows, other.rows);
        for k in 0..self.cols.min(other.cols) {
            let (a, b) = (self.col(k), other.col(k));
            for (j, bj) in b.iter().enumerate() {
                let dst = &mut out.data[j * self.rows..(j + 1) * self.rows];
                for (d, ai) in dst.iter_mut().zip(a) {
                    *d += ai * bj;
                }
            }
        }
        out
    }
}

/// The R factor of the thin QR of `m` (rows x cols): `min(rows, cols)` x `cols`, upper triangular, with
/// `m = Q R` for a Q with orthonormal columns. Householder reflections, applied column by column.
pub fn qr_r(mut m: ColMajor) -> ColMajor {
    let (rows, cols) = (m.rows, m.cols);
    let k_max = rows.min(cols);
    for k in 0..k_max {
        let (head, tail) = m.data.split_at_mut((k + 1) * rows);
        let x = &mut head[k * rows + k..(k + 1) * rows];
        let norm = x.iter().map(|v| v * v).sum::<f64>().sqrt();
        if norm == 0.0 {
            continue;
        }
        // v = x - alpha e1 with alpha of the opposite sign of x0 (no cancellation); H x = alpha e1.
        let alpha = if x[0] >= 0.0 { -norm } else { norm };
        let mut v: Vec<f64> = x.to_vec();
        v[0] -= alpha;
        let v_norm2 = v.iter().map(|a| a * a).sum::<f64>();
        x[0] = alpha;
        x[1..].iter_mut().for_each(|e| *e = 0.0);
        if v_norm2 == 0.0 {
            continue;
        }
        for j in 0..cols - k - 1 {
            let col = &mut tail[j * rows + k..(j + 1) * rows];
            let f = 2.0 * col.iter().zip(&v).map(|(c, vi)| c * vi).sum::<f64>() / v_norm2;
            col.iter_mut().zip(&v).for_each(|(c, vi)| *c -= f * vi);
        }
    }
    let mut r = ColMajor::zeros(k_max, cols);
    for j in 0..cols {
        for i in 0..k_max.min(j + 1) {
            r.data[j * k_max + i] = m.data[j * rows + i];
        }
    }
    r
}

/// The singular values of `m`, largest first (`min(rows, cols)` of them), by one-sided Jacobi: columns are
/// rotated in pairs until every pair is orthogonal to working precision; the column norms are then the
/// singular values.
pub fn singular_values(m: &ColMajor) -> Vec<f64> {
    // Jacobi orthogonalises columns: work on the side with fewer of them.
    let mut a = if m.cols <= m.rows { m.clone() } else { transpose(m) };
    let (rows, n) = (a.rows, a.cols);
    const MAX_SWEEPS: usize = 80;
    for _ in 0..MAX_SWEEPS {
        let mut rotated = false;
        for p in 0..n {
            for q in p + 1..n {
                let (cp, cq) = (a.col(p), a.col(q));
                let alpha = cp.iter().map(|v| v * v).sum::<f64>();
                let beta = cq.iter().map(|v| v * v).sum::<f64>();
                let gamma = cp.iter().zip(cq).map(|(x, y)| x * y).sum::<f64>();
                if gamma == 0.0 || gamma.abs() <= f64::EPSILON * (alpha * beta).sqrt() {
                    continue;
                }
                rotated = true;
                let zeta = (beta - alpha) / (2.0 * gamma);
                let t = zeta.signum() / (zeta.abs() + (1.0 + zeta * zeta).sqrt());
                let c = 1.0 / (1.0 + t * t).sqrt();
                let s = c * t;
                let (lo, hi) = a.data.split_at_mut(q * rows);
                let cp = &mut lo[p * rows..(p + 1) * rows];
                let cq = &mut hi[..rows];
                for (x, y) in cp.iter_mut().zip(cq.iter_mut()) {
                    let (xp, yq) = (*x, *y);
                    *x = c * xp - s * yq;
                    *y = s * xp + c * yq;
                }
            }
        }
        if !rotated {
            break;
        }
    }
    let mut values: Vec<f64> = (0..n).map(|j| a.col(j).iter().map(|v| v * v).sum::<f64>().sqrt()).collect();
    values.sort_by(|x, y| y.total_cmp(x));
    values
}

fn transpose(m: &ColMajor) -> ColMajor {
    let mut t = ColMajor::zeros(m.cols, m.rows);
    for j in 0..m.cols {
        for i in 0..m.rows {
            t.data[i * m.cols + j] = m.get(i, j);
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dense(rows: usize, cols: usize, f: impl Fn(usize, usize) -> f64) -> ColMajor {
        let mut m = ColMajor::zeros(rows, cols);
        for j in 0..cols {
            for i in 0..rows {
                m.data[j * rows + i] = f(i, j);
            }
        }
        m
    }

    #[test]
    fn r_of_qr_keeps_the_gram_matrix() {
        // R^T R = M^T M for any QR.
        let m = dense(9, 4, |i, j| ((i * 7 + j * 3) % 5) as f64 - 1.5 + (i as f64) * 0.1);
        let r = qr_r(m.clone());
        assert_eq!((r.rows, r.cols), (4, 4));
        for p in 0..4 {
            for q in 0..4 {
                let mm: f64 = (0..9).map(|i| m.get(i, p) * m.get(i, q)).sum();
                let rr: f64 = (0..4).map(|i| r.get(i, p) * r.get(i, q)).sum();
                assert!((mm - rr).abs() < 1e-10, "{p},{q}: {mm} vs {rr}");
            }
            for i in p + 1..4 {
                assert_eq!(r.get(i, p), 0.0, "upper triangular");
            }
        }
    }

    #[test]
    fn jacobi_finds_known_singular_values() {
        // diag(3, 2, 0.5) rotated on both sides: an orthogonal Q (Householder of u) on the left.
        let u = [0.6, 0.0, 0.8];
        let h = |i: usize, j: usize| if i == j { 1.0 } else { 0.0 } - 2.0 * u[i] * u[j];
        let d = [3.0, 2.0, 0.5];
        let m = dense(3, 3, |i, j| h(i, j) * d[j]);
        let sv = singular_values(&m);
        for (got, want) in sv.iter().zip(d) {
            assert!((got - want).abs() < 1e-12, "{sv:?}");
        }
        // A wide matrix and a rank-deficient one.
        let wide = dense(2, 5, |i, j| if i == 0 { j as f64 } else { 1.0 });
        assert_eq!(singular_values(&wide).len(), 2);
        let rank1 = dense(4, 3, |i, j| (i + 1) as f64 * (j + 2) as f64);
        let sv = singular_values(&rank1);
        assert!(sv[1] < 1e-12 * sv[0] && sv[2] < 1e-12 * sv[0], "{sv:?}");
    }

    #[test]
    fn product_through_qr_matches_the_dense_spectrum() {
        // B (6 x 2) A (2 x 5): the singular values of R_B R_A^T are those of B A.
        let b = dense(6, 2, |i, j| (i as f64 + 1.0) * if j == 0 { 1.0 } else { -0.5 } + j as f64);
        let at = dense(5, 2, |i, j| ((i + j) % 3) as f64 - 0.7);
        let core = qr_r(b.clone()).mul_transposed(&qr_r(at.clone()));
        let product = b.mul_transposed(&at);
        let (small, big) = (singular_values(&core), singular_values(&product));
        for k in 0..2 {
            assert!((small[k] - big[k]).abs() < 1e-10 * big[0], "{small:?} vs {big:?}");
        }
        assert!(big[2] < 1e-10 * big[0]);
    }
}
