//! One adapted linear's update seen through its singular values, without forming the dense update: with
//! `B = Q_B R_B` and `A^T = Q_A R_A` (thin QRs), `scale * B A = Q_B (scale * R_B R_A^T) Q_A^T`, and the outer
//! factors have orthonormal columns, so the singular values of the r x r core `scale * R_B R_A^T` are exactly
//! those of the d_out x d_in update. Cost: O((d_out + d_in) r^2) per module instead of O(d_out d_in r).
//! From the singular values come the Frobenius norm (the root of their sum of squares) and the energy ranks.

use super::linalg::{qr_r, singular_values, ColMajor};

/// The spectrum of `scale * B A` for `a` = lora_A (r x d_in) and `b` = lora_B (d_out x r), both row-major:
/// `r` singular values, largest first (zeros where the update has fewer than r directions).
pub fn update_singular_values(a: &[f32], b: &[f32], rank: usize, scale: f64) -> Vec<f64> {
    let (d_in, d_out) = (a.len() / rank.max(1), b.len() / rank.max(1));
    let r_b = qr_r(ColMajor::from_row_major(b, d_out, rank));
    let r_a = qr_r(ColMajor::transpose_of_row_major(a, rank, d_in));
    let mut values: Vec<f64> =
        singular_values(&r_b.mul_transposed(&r_a)).into_iter().map(|s| s * scale.abs()).collect();
    values.resize(rank, 0.0);
    values
}

/// The Frobenius norm of a matrix with these singular values.
pub fn frobenius(singular_values: &[f64]) -> f64 {
    singular_values.iter().map(|s| s * s).sum::<f64>().sqrt()
}

/// The fewest leading singular values that hold `share` (0..=1) of the squared Frobenius norm; 0 for a zero
/// update. A relative slack of 1e-12 keeps rounding from adding a direction that holds nothing.
pub fn energy_rank(singular_values: &[f64], share: f64) -> usize {
    let total: f64 = singular_values.iter().map(|s| s * s).sum();
    if total <= 0.0 {
        return 0;
    }
    let wanted = share * total - 1e-12 * total;
    let mut held = 0.0;
    for (k, s) in singular_values.iter().enumerate() {
        held += s * s;
        if held >= wanted {
            return k + 1;
        }
    }
    singular_values.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_core_has_the_dense_products_singular_values() {
        // B A with B = [e1 * 2, e2 * 1] (4 x 2), A = [[1, 0, 0], [0, 1, 0]] (2 x 3): singular values 2, 1, scaled.
        let b = [2.0f32, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0];
        let a = [1.0f32, 0.0, 0.0, 0.0, 1.0, 0.0];
        let sv = update_singular_values(&a, &b, 2, 1.5);
        assert!((sv[0] - 3.0).abs() < 1e-12 && (sv[1] - 1.5).abs() < 1e-12, "{sv:?}");
        assert!((frobenius(&sv) - (9.0f64 + 2.25).sqrt()).abs() < 1e-12);
    }

    #[test]
    fn energy_ranks_count_the_directions_that_hold_the_norm() {
        let sv = [3.0, 2.5, 2.0, 0.0, 0.0];
        assert_eq!(energy_rank(&sv, 0.5), 2);
        assert_eq!(energy_rank(&sv, 0.9), 3);
        assert_eq!(energy_rank(&sv, 0.99), 3);
        assert_eq!(energy_rank(&[0.0, 0.0], 0.9), 0);
        assert_eq!(energy_rank(&[1.0, 1.0, 1.0, 1.0], 0.5), 2);
    }
}
