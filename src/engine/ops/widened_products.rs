//! A frozen product and its adapter's low-rank part as one product over an inner size widened by the rank, for the
//! graphs whose products cannot accumulate into an output (the portable graph: a Mac, or `--kernels portable`).
//!
//! - Forward: `x W^T + (x A) (s B)` as `[x | x A] [W | (s B)^T]^T`.
//! - Input gradient: `dy W + dxa A^T` as `[dy | dxa] [W ; A^T]`, with `dxa = s dy B^T` (and an accumulator added
//!   after, as [`frozen_matmul_add`] does); for projections sharing an input (q|k|v), every part and adapter in one
//!   product, `[dy_1 | .. | dxa_1 | ..] [W_1 ; .. ; A_1^T ; ..]` (the same [`widened_input_grad`]).
//!
//! The widened operands are copies: the activation and the frozen weight, each once. The product-then-add it
//! replaces writes the low-rank part (an output-sized tensor) and then reads two output-sized tensors and writes a
//! third. [`forward_widening_pays`] and [`input_widening_pays`] weigh the two by element counts: at the
//! Llama-3.2-1B shape and 4,096 rows, the forwards of gate_proj and up_proj (8,192 outputs from 2,048 inputs) and
//! the input gradient of down_proj are widened, k_proj's and v_proj's 512 outputs are not. Measured on a lent H200
//! (CUPTI, per layer of the portable step at 4 x 1024): gate_proj's forward 365 -> 292 us (base product, update
//! and add against the two copies and the wider product), down_proj's input gradient 356 -> 285 us; q_proj's and
//! o_proj's, which the rule also widens, about even. The widened product sums both parts in the product's
//! accumulator and rounds once, where the add rounded the two parts and their sum. CUDA under the native kernels
//! adds in place (cuBLAS's beta) and the WGSL low-rank add fuses the update: neither widens.

use candle_core::{Result, Tensor};

use super::frozen_matmul::{frozen_matmul_add, frozen_matmul_t};
use super::kernel_choice::{is_cpu_f32, native};

/// Whether the add after a product is Candle's composed add for tensors like `x`: not CUDA or CPU f32 under the
/// native kernels (in-place products there), not the WGSL low-rank add.
fn adds_by_composed_ops(x: &Tensor) -> bool {
    let in_place = native() && (x.device().is_cuda() || is_cpu_f32(x));
    !in_place && !super::metal::takes(&[x])
}

/// Whether the widened form costs fewer element passes: `2 * m * n` saved against `(m + n) * (k + rank)` copied, for
/// a product (m, k) by (k, n) with an update of `rank`.
fn pays(m: usize, k: usize, n: usize, rank: usize) -> bool {
    2 * m * n > (m + n) * (k + rank)
}

/// Whether [`widened_forward`] is the cheaper way to `x W^T + (x A) (s B)` for `x` (..., in), `weight` (out, in) and
/// an update of `rank`.
pub fn forward_widening_pays(x: &Tensor, weight: &Tensor, rank: usize) -> bool {
    let Ok((out, inputs)) = weight.dims2() else { return false };
    adds_by_composed_ops(x) && pays(x.elem_count() / inputs.max(1), inputs, out, rank)
}

/// `x W^T + (xa) (scale b)` for `x` (..., in), `weight` (out, in), `xa = x A` (..., rank) and `b` (rank, out), as one
/// product over the widened inner size: (..., out).
pub fn widened_forward(x: &Tensor, weight: &Tensor, xa: &Tensor, b: &Tensor, scale: f64) -> Result<Tensor> {
    let scaled_bt = match scale {
        1.0 => b.t()?.contiguous()?,
        _ => b.t()?.affine(scale, 0.0)?,
    };
    let widened_weight = Tensor::cat(&[weight, &scaled_bt], 1)?;
    let widened_x = Tensor::cat(&[&x.contiguous()?, &xa.contiguous()?], candle_core::D::Minus1)?;
    frozen_matmul_t(&widened_x, &widened_weight)
}

/// Whether [`widened_input_grad`] is the cheaper way to the input gradient of one projection or of projections
/// sharing one input, with weights (out_i, in), adapters of `ranks` (0: none) and output gradients like `dy` (rows,
/// out_1).
pub fn input_widening_pays(dy: &Tensor, weights: &[&Tensor], ranks: &[usize]) -> bool {
    let Some(Ok((first_out, inputs))) = weights.first().map(|w| w.dims2()) else { return false };
    let outs: usize = weights.iter().map(|w| w.dim(0).unwrap_or(0)).sum();
    let adapters = ranks.iter().filter(|&&r| r > 0).count();
    let shape = (dy.elem_count() / first_out.max(1), inputs, outs + ranks.iter().sum::<usize>());
    adds_by_composed_ops(dy) && input_pays(shape, weights.len(), adapters)
}

/// Whether widening the input gradient of `parts` projections with `adapters` adapters costs fewer element passes,
/// for (rows, in, the widened inner size: outputs plus ranks): saved, the parts' products' n - 1 adds (three passes
/// each) and each adapter's product and add (four), all over (rows, in); copied, the output gradients and the weights
/// into their widened forms. For one projection with an adapter it is [`pays`] of the transposed product.
fn input_pays((rows, inputs, widened): (usize, usize, usize), parts: usize, adapters: usize) -> bool {
    (parts.saturating_sub(1) * 3 + adapters * 4) * rows * inputs > 2 * (rows + inputs) * widened
}

/// `acc + sum_i dy_i W_i + sum_j dxa_j A_j^T` (without `acc`: the product alone) for output gradients `d_outputs`
/// (rows, out_i), `weights` (out_i, in) and adapter parts (`dxa_j = s_j dy_j B_j^T` (rows, r_j), `a_j` (in, r_j)), as
/// one product over the widened inner size: (rows, in). One projection's, or q|k|v's together.
pub fn widened_input_grad(
    acc: Option<Tensor>,
    d_outputs: &[Tensor],
    weights: &[&Tensor],
    adapters: &[(Tensor, Tensor)],
) -> Result<Tensor> {
    let mut dys = Vec::with_capacity(d_outputs.len() + adapters.len());
    for (dy, w) in d_outputs.iter().zip(weights) {
        let out = w.dim(0)?;
        dys.push(dy.reshape((dy.elem_count() / out.max(1), out))?.contiguous()?);
    }
    let mut rows_of_weight: Vec<Tensor> = weights.iter().map(|w| (*w).clone()).collect();
    for (dxa, a) in adapters {
        dys.push(dxa.contiguous()?);
        rows_of_weight.push(a.t()?.contiguous()?);
    }
    frozen_matmul_add(acc, &Tensor::cat(&dys, 1)?, &Tensor::cat(&rows_of_weight, 0)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// Deterministic values in (-1, 1), different for each seed.
    fn values(shape: (usize, usize), seed: u64) -> Tensor {
        let values = (0..shape.0 * shape.1).map(|i| ((i as f64 + 1.0) * (seed as f64 + 0.37)).sin()).collect();
        Tensor::from_vec(values, shape, &Device::Cpu).unwrap()
    }

    fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
        (a - b).unwrap().abs().unwrap().flatten_all().unwrap().max(0).unwrap().to_scalar().unwrap()
    }

    #[test]
    fn the_widened_products_equal_the_product_plus_the_update() {
        let (x, w, a, b) = (values((6, 5), 1), values((7, 5), 2), values((5, 3), 3), values((3, 7), 4));
        let xa = x.matmul(&a).unwrap();
        let plain = (x.matmul(&w.t().unwrap()).unwrap() + (xa.matmul(&b).unwrap() * 0.5).unwrap()).unwrap();
        assert!(max_diff(&widened_forward(&x, &w, &xa, &b, 0.5).unwrap(), &plain) < 1e-12);
        let (dy, acc) = (values((6, 7), 5), values((6, 5), 6));
        let dxa = (dy.matmul(&b.t().unwrap()).unwrap() * 0.5).unwrap();
        let plain = ((&acc + dy.matmul(&w).unwrap()).unwrap() + dxa.matmul(&a.t().unwrap()).unwrap()).unwrap();
        let widened = widened_input_grad(Some(acc), &[dy], &[&w], &[(dxa, a)]).unwrap();
        assert!(max_diff(&widened, &plain) < 1e-12);
    }

    #[test]
    fn the_grouped_input_gradient_equals_the_sum_of_the_parts() {
        let (w1, w2, w3) = (values((7, 5), 7), values((3, 5), 8), values((3, 5), 9));
        let (dy1, dy2, dy3) = (values((6, 7), 10), values((6, 3), 11), values((6, 3), 12));
        let (a1, a3, dxa1, dxa3) = (values((5, 2), 13), values((5, 4), 14), values((6, 2), 15), values((6, 4), 16));
        let mut plain =
            ((dy1.matmul(&w1).unwrap() + dy2.matmul(&w2).unwrap()).unwrap() + dy3.matmul(&w3).unwrap()).unwrap();
        plain = ((plain + dxa1.matmul(&a1.t().unwrap()).unwrap()).unwrap() + dxa3.matmul(&a3.t().unwrap()).unwrap())
            .unwrap();
        let grouped = widened_input_grad(None, &[dy1, dy2, dy3], &[&w1, &w2, &w3], &[(dxa1, a1), (dxa3, a3)]).unwrap();
        assert!(max_diff(&grouped, &plain) < 1e-12);
    }

    #[test]
    fn widening_pays_for_wide_outputs_of_many_rows_only() {
        // Llama-3.2-1B at 4,096 rows, rank 8: gate/up forward and down's input gradient widen, k/v's do not.
        assert!(pays(4096, 2048, 8192, 8));
        assert!(!pays(4096, 2048, 512, 8));
        assert!(input_pays((4096, 8192, 2048 + 8), 1, 1));
        // At 1,024 rows the weight's copy outweighs the saved passes.
        assert!(!pays(1024, 2048, 8192, 8));
        assert!(!input_pays((1024, 8192, 2048 + 8), 1, 1));
        // Together q|k|v's input gradient widens; gate|up's, whose output gradients are four times wider, does not.
        assert!(input_pays((4096, 2048, 3072 + 24), 3, 3));
        assert!(!input_pays((4096, 2048, 16384 + 16), 2, 2));
        // For one projection the two rules agree.
        for (rows, inputs, out) in [(4096, 8192, 2048), (4096, 2048, 2048), (1024, 2048, 8192), (512, 64, 256)] {
            assert_eq!(input_pays((rows, inputs, out + 8), 1, 1), pays(rows, out, inputs, 8));
        }
    }
}
