//! Unit tests of the dispatchers against references computed differently: each hand-written backward against
//! Candle's autograd through the same block composed in f64, the f32 kernels (ours and Candle's) against the f64
//! composed forward, and the frozen products against plain ones.

use candle_core::{DType, Device, Tensor, Var, D};

use super::attention::scaled_masked_softmax;
use super::backward::{
    gelu_tanh_mul_backward, rms_norm_backward, rope_backward, silu_mul_backward, silu_mul_backward_with,
    silu_mul_remade, softmax_backward,
};
use super::elementwise::gelu_tanh_mul;
use super::frozen_matmul::{frozen_matmul, frozen_matmul_t};
use super::norm::rms_norm;
use super::rotary::rope;

/// The largest absolute difference of two tensors of one shape, in f64 whatever their dtypes.
pub(super) fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
    let d = (a.to_dtype(DType::F64).unwrap() - b.to_dtype(DType::F64).unwrap()).unwrap();
    d.abs().unwrap().max_all().unwrap().to_scalar().unwrap()
}

/// A tensor of `shape` with values drawn uniformly from `center - half_width..center + half_width` by a seeded
/// generator (the same values every run).
fn seeded(shape: &[usize], center: f64, half_width: f64, seed: u64) -> Tensor {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let values: Vec<f64> =
        (0..shape.iter().product()).map(|_| center + rng.random_range(-half_width..half_width)).collect();
    Tensor::from_vec(values, shape, &Device::Cpu).unwrap()
}

/// Every element of `got` within its `bound` (f64, elementwise) of `exact` (f64).
fn assert_within(what: &str, got: &Tensor, exact: &Tensor, bound: &Tensor) {
    let err = (got.to_dtype(DType::F64).unwrap() - exact).unwrap().abs().unwrap();
    let excess = (err - bound).unwrap().max_all().unwrap().to_scalar::<f64>().unwrap();
    assert!(excess <= 0.0, "{what}: an element is off by {excess} more than its bound");
}

/// Each hand-written input gradient (CPU f32 kernel) against Candle's autograd through the same block
/// composed from differentiable ops in f64, with a non-trivial upstream gradient.
#[test]
fn backward_kernels_match_autograd_of_composed_blocks() {
    let dev = Device::Cpu;
    let x64 = Tensor::randn(0f64, 1.0, (2, 3, 5, 8), &dev).unwrap();
    let other64 = Tensor::randn(0f64, 1.0, (2, 3, 5, 8), &dev).unwrap();
    let w64 = Tensor::randn(1f64, 0.2, 8, &dev).unwrap();
    let cos64 = Tensor::randn(0f64, 1.0, (5, 4), &dev).unwrap();
    let sin64 = Tensor::randn(0f64, 1.0, (5, 4), &dev).unwrap();
    let up64 = Tensor::randn(0f64, 1.0, (2, 3, 5, 8), &dev).unwrap();
    let f32 = |t: &Tensor| t.to_dtype(DType::F32).unwrap();
    // d/dx of sum(block(x) * up) by autograd.
    let autograd = |block: &dyn Fn(&Tensor) -> Tensor| -> Tensor {
        let x = Var::from_tensor(&x64).unwrap();
        let loss = (block(x.as_tensor()) * &up64).unwrap().sum_all().unwrap();
        loss.backward().unwrap().get(x.as_tensor()).unwrap().clone()
    };

    let expected = autograd(&|x| {
        let inv = (x.sqr().unwrap().mean_keepdim(D::Minus1).unwrap() + 1e-6).unwrap().sqrt().unwrap();
        x.broadcast_div(&inv).unwrap().broadcast_mul(&w64).unwrap()
    });
    let got = rms_norm_backward(&f32(&x64), &f32(&w64), 1e-6, &f32(&up64)).unwrap();
    assert!(max_diff(&got, &expected) < 1e-4, "rms norm");

    let expected = autograd(&|x| {
        let (x1, x2) = (x.narrow(D::Minus1, 0, 4).unwrap(), x.narrow(D::Minus1, 4, 4).unwrap());
        let (c, s) =
            (cos64.unsqueeze(0).unwrap().unsqueeze(0).unwrap(), sin64.unsqueeze(0).unwrap().unsqueeze(0).unwrap());
        let o1 = (x1.broadcast_mul(&c).unwrap() - x2.broadcast_mul(&s).unwrap()).unwrap();
        let o2 = (x2.broadcast_mul(&c).unwrap() + x1.broadcast_mul(&s).unwrap()).unwrap();
        Tensor::cat(&[o1, o2], D::Minus1).unwrap()
    });
    let got = rope_backward(&f32(&up64), &f32(&cos64), &f32(&sin64)).unwrap();
    assert!(max_diff(&got, &expected) < 1e-4, "rope");

    let scale = 0.35;
    let expected = autograd(&|x| candle_nn::ops::softmax(&(x * scale).unwrap(), D::Minus1).unwrap());
    let p = scaled_masked_softmax(&f32(&x64), scale, None).unwrap();
    let got = softmax_backward(&p, &f32(&up64), scale).unwrap();
    assert!(max_diff(&got, &expected) < 1e-4, "softmax");

    let expected = autograd(&|g| (candle_nn::ops::silu(g).unwrap() * &other64).unwrap());
    let (got, _) = silu_mul_backward(&f32(&x64), &f32(&other64), &f32(&up64)).unwrap();
    assert!(max_diff(&got, &expected) < 1e-4, "silu gate");

    // Candle's gelu is the tanh approximation (GeGLU, gemma3); its autograd rounds the constants, so the
    // f64 reference here is a central difference of the exact f64 forward.
    let h = 1e-6;
    let slope =
        ((((&x64 + h).unwrap().gelu().unwrap() - (&x64 - h).unwrap().gelu().unwrap()).unwrap()) / (2.0 * h)).unwrap();
    let expected = ((slope * &other64).unwrap() * &up64).unwrap();
    let (got, got_up) = gelu_tanh_mul_backward(&f32(&x64), &f32(&other64), &f32(&up64)).unwrap();
    assert!(max_diff(&got, &expected) < 1e-4, "gelu gate (CPU f32 kernel)");
    assert!(max_diff(&got_up, &(x64.gelu().unwrap() * &up64).unwrap()) < 1e-4, "gelu up");
    let (composed, _) = gelu_tanh_mul_backward(&x64, &other64, &up64).unwrap();
    assert!(max_diff(&composed, &expected) < 1e-8, "gelu gate (composed f64)");
    let fast = gelu_tanh_mul(&f32(&x64), &f32(&other64)).unwrap();
    assert!(max_diff(&fast, &(x64.gelu().unwrap() * &other64).unwrap()) < 1e-5, "gelu forward");
}

/// The remade SwiGLU product and its parts (the portable graph's down_proj input in the backward) give the gradient
/// the composed backward gives alone, bit for bit, and a product within one rounding of Candle's `silu(g) * u`.
#[test]
fn remade_silu_parts_give_the_same_gradients() {
    let (g64, u64, d64) = (seeded(&[4096], 0.0, 6.0, 7), seeded(&[4096], 0.0, 2.0, 8), seeded(&[4096], 0.0, 1.0, 9));
    for dtype in [DType::BF16, DType::F16] {
        let half = |t: &Tensor| t.to_dtype(dtype).unwrap();
        let (g, u, d) = (half(&g64), half(&u64), half(&d64));
        let (product, parts) = silu_mul_remade(&g, &u).unwrap();
        assert!(parts.is_some(), "{dtype:?}: the CPU composes in half precision");
        let f64_of = |t: &Tensor| t.to_dtype(DType::F64).unwrap();
        let want = (f64_of(&candle_nn::ops::silu(&g).unwrap()) * f64_of(&u)).unwrap();
        let bound = (want.abs().unwrap() * if dtype == DType::BF16 { 3.0 / 256.0 } else { 3.0 / 2048.0 }).unwrap();
        assert_within(&format!("{dtype:?} product"), &product, &want, &(bound + 1e-30).unwrap());
        let (with_parts, alone) =
            (silu_mul_backward_with(&g, &u, &d, parts).unwrap(), silu_mul_backward(&g, &u, &d).unwrap());
        assert_eq!(max_diff(&with_parts.0, &alone.0), 0.0, "{dtype:?} dgate");
        assert_eq!(max_diff(&with_parts.1, &alone.1), 0.0, "{dtype:?} dup");
    }
}

/// The composed SwiGLU backward in half precision (what the portable graph runs on a Mac; bf16 in bf16, f16
/// through f32, where Candle's f16 sigmoid would lose gates below -11) stays within a few roundings of the f64 truth
/// on the same rounded inputs: every element of both gradients within 4 units of the
/// dtype's last place of the terms it is made of (|dm u| (sig + |silu (1 - sig)|) for the gate, |dm silu| for up),
/// plus two of the dtype's smallest steps (f16 gradients this small are subnormal).
#[test]
fn silu_backward_in_half_precision_stays_within_a_few_roundings() {
    let (g64, u64, d64) = (seeded(&[4096], 0.0, 12.0, 1), seeded(&[4096], 0.0, 2.0, 2), seeded(&[4096], 0.0, 2e-3, 3));
    for (dtype, ulp, smallest) in [(DType::BF16, 1.0 / 128.0, 1e-40), (DType::F16, 1.0 / 1024.0, 6e-8)] {
        let half = |t: &Tensor| t.to_dtype(dtype).unwrap();
        let (dgate, dup) = silu_mul_backward(&half(&g64), &half(&u64), &half(&d64)).unwrap();
        let [g, u, d] = [&g64, &u64, &d64].map(|t| half(t).to_dtype(DType::F64).unwrap());
        let sig = candle_nn::ops::sigmoid(&g).unwrap();
        let silu = (&g * &sig).unwrap();
        let curve = (&silu * sig.affine(-1.0, 1.0).unwrap()).unwrap();
        let du = (&d * &u).unwrap();
        let exact_gate = (&du * (&sig + &curve).unwrap()).unwrap();
        let gate_size = (du.abs().unwrap() * (&sig + curve.abs().unwrap()).unwrap()).unwrap();
        let exact_up = (&d * &silu).unwrap();
        let up_size = exact_up.abs().unwrap();
        for (name, got, exact, size) in [("gate", &dgate, &exact_gate, &gate_size), ("up", &dup, &exact_up, &up_size)] {
            let bound = ((size * (4.0 * ulp)).unwrap() + 2.0 * smallest).unwrap();
            assert_within(&format!("{dtype:?} d{name}"), got, exact, &bound);
        }
    }
}

/// The composed GeGLU backward in half precision (gemma3 on the portable graph, composed in f32: a bf16 chain
/// failed this by half the slope at g = -3) stays within a few roundings of the f64 truth on the same rounded
/// inputs: each element within 8 units of the dtype's last place of the terms it is made of (|dm u| (0.5 (1 + t) +
/// |0.5 c g (1 - t^2) (1 + 3a g^2)|) for the gate, |dm gelu(g)| for up), plus 1e-6 |dm u| (|dm| for up) where
/// f32's t saturates, plus two of the dtype's smallest steps.
#[test]
fn gelu_backward_in_half_precision_stays_within_a_few_roundings() {
    let (g64, u64, d64) = (seeded(&[4096], 0.0, 8.0, 7), seeded(&[4096], 0.0, 2.0, 8), seeded(&[4096], 0.0, 2e-3, 9));
    for (dtype, ulp, smallest) in [(DType::BF16, 1.0 / 128.0, 1e-40), (DType::F16, 1.0 / 1024.0, 6e-8)] {
        let half = |t: &Tensor| t.to_dtype(dtype).unwrap();
        let (dgate, dup) = gelu_tanh_mul_backward(&half(&g64), &half(&u64), &half(&d64)).unwrap();
        let [g, u, d] = [&g64, &u64, &d64].map(|t| half(t).to_dtype(DType::F64).unwrap());
        let c = super::gelu::GELU_TANH_C;
        let g2 = g.sqr().unwrap();
        let t = (&g * g2.affine(c * 0.044_715, c).unwrap()).unwrap().tanh().unwrap();
        let half_one_plus_t = t.affine(0.5, 0.5).unwrap();
        let curve = ((&g * t.sqr().unwrap().affine(-1.0, 1.0).unwrap()).unwrap()
            * g2.affine(0.5 * c * 3.0 * 0.044_715, 0.5 * c).unwrap())
        .unwrap();
        let du = (&d * &u).unwrap();
        let exact_gate = (&du * (&half_one_plus_t + &curve).unwrap()).unwrap();
        // Plus 1e-6 |dm u|: where f32's t rounds to -1 (g below about -5) the slope and gelu(g), both under 1e-6,
        // are lost whole.
        let terms = ((&half_one_plus_t + curve.abs().unwrap()).unwrap() + 1e-6 / (8.0 * ulp)).unwrap();
        let gate_size = (du.abs().unwrap() * terms).unwrap();
        let exact_up = (&d * (&g * &half_one_plus_t).unwrap()).unwrap();
        let up_size = (exact_up.abs().unwrap() + (d.abs().unwrap() * (1e-6 / (8.0 * ulp))).unwrap()).unwrap();
        for (name, got, exact, size) in [("gate", &dgate, &exact_gate, &gate_size), ("up", &dup, &exact_up, &up_size)] {
            let bound = ((size * (8.0 * ulp)).unwrap() + 2.0 * smallest).unwrap();
            assert_within(&format!("{dtype:?} d{name}"), got, exact, &bound);
        }
    }
}

/// The composed RMS norm backward in half precision (the portable graph's; f16 through f32) stays within a few
/// roundings of the f64 truth on the same rounded inputs: each element within 6 units of the dtype's last place of
/// its two terms, |inv gw| + |x| inv^3 mean|gw x| (the row mean is of rounded products).
#[test]
fn rms_norm_backward_in_half_precision_stays_within_a_few_roundings() {
    let (x64, w64, dy64) =
        (seeded(&[16, 256], 0.0, 4.0, 4), seeded(&[256], 1.0, 0.5, 5), seeded(&[16, 256], 0.0, 2.0, 6));
    for (dtype, ulp) in [(DType::BF16, 1.0 / 128.0), (DType::F16, 1.0 / 1024.0)] {
        let half = |t: &Tensor| t.to_dtype(dtype).unwrap();
        let got = rms_norm_backward(&half(&x64), &half(&w64), 1e-6, &half(&dy64)).unwrap();
        let [x, w, dy] = [&x64, &w64, &dy64].map(|t| half(t).to_dtype(DType::F64).unwrap());
        let gw = dy.broadcast_mul(&w).unwrap();
        let inv = (x.sqr().unwrap().mean_keepdim(D::Minus1).unwrap() + 1e-6).unwrap().sqrt().unwrap().recip().unwrap();
        let dot = (&gw * &x).unwrap().mean_keepdim(D::Minus1).unwrap();
        let first = gw.broadcast_mul(&inv).unwrap();
        let inv3 = inv.powf(3.0).unwrap();
        let second = x.broadcast_mul(&(dot * &inv3).unwrap()).unwrap();
        let exact = (&first - &second).unwrap();
        // mean(gw x) is summed from rounded products: its error scales with mean|gw x|, not with itself.
        let dot_size = (&gw * &x).unwrap().abs().unwrap().mean_keepdim(D::Minus1).unwrap();
        let second_size = x.abs().unwrap().broadcast_mul(&(dot_size * inv3).unwrap()).unwrap();
        let size = (first.abs().unwrap() + second_size).unwrap();
        assert_within(&format!("{dtype:?}"), &got, &exact, &(size * (6.0 * ulp)).unwrap());
    }
}

/// The f32 kernels (ours and Candle's) compute what the f64 composed versions compute.
#[test]
fn f32_kernels_match_f64_forward() {
    let dev = Device::Cpu;
    let x = Tensor::randn(0f64, 1.0, (2, 3, 4, 8), &dev).unwrap();
    let w = Tensor::randn(1f64, 0.1, 8, &dev).unwrap();
    let (cos, sin) = (Tensor::randn(0f64, 1.0, (4, 4), &dev).unwrap(), Tensor::randn(0f64, 1.0, (4, 4), &dev).unwrap());
    let mask = Tensor::new(&[[0f32, -1e9, -1e9, -1e9, 0.0, 0.0, 0.0, 0.0]; 4], &dev).unwrap();
    let f32 = |t: &Tensor| t.to_dtype(DType::F32).unwrap();
    assert!(max_diff(&rms_norm(&f32(&x), &f32(&w), 1e-6).unwrap(), &rms_norm(&x, &w, 1e-6).unwrap()) < 1e-5);
    assert!(max_diff(&rope(&f32(&x), &f32(&cos), &f32(&sin)).unwrap(), &rope(&x, &cos, &sin).unwrap()) < 1e-5);
    let fast = scaled_masked_softmax(&f32(&x), 0.5, Some(&mask)).unwrap();
    let composed = scaled_masked_softmax(&x, 0.5, Some(&mask.to_dtype(DType::F64).unwrap())).unwrap();
    assert!(max_diff(&fast, &composed) < 1e-6);
}

#[test]
fn frozen_matmul_matches_a_plain_product_both_ways() {
    let dev = Device::Cpu;
    let x = Tensor::randn(0f32, 1.0, (2, 3, 8), &dev).unwrap();
    let w = Tensor::randn(0f32, 1.0, (5, 8), &dev).unwrap();
    let y = frozen_matmul_t(&x, &w).unwrap();
    assert!(max_diff(&y, &x.broadcast_matmul(&w.t().unwrap()).unwrap()) < 1e-5);
    let back = frozen_matmul(&y, &w).unwrap();
    assert!(max_diff(&back, &y.broadcast_matmul(&w).unwrap()) < 1e-4);
}

/// `acc + alpha a b` scales whichever operand is smaller than the product (a LoRA update's rank side) and keeps
/// the product's value: bf16 on the CPU (no fused CPU path) against f64, for the rank on either side and none.
#[test]
fn matmul_add_scales_the_smaller_operand_to_the_same_value() {
    use super::products::matmul_add;
    let dev = Device::Cpu;
    let bf16 = |t: &Tensor| t.to_dtype(DType::BF16).unwrap();
    for (m, k, n) in [(64, 4, 48), (4, 48, 64), (32, 40, 36)] {
        let a = bf16(&Tensor::randn(0f64, 1.0, (m, k), &dev).unwrap());
        let b = bf16(&Tensor::randn(0f64, 1.0, (k, n), &dev).unwrap());
        let acc = bf16(&Tensor::randn(0f64, 1.0, (m, n), &dev).unwrap());
        let f64 = |t: &Tensor| t.to_dtype(DType::F64).unwrap();
        let want = (f64(&acc) + (f64(&a).matmul(&f64(&b)).unwrap() * 2.0).unwrap()).unwrap();
        let size = (f64(&acc).abs().unwrap() + (f64(&a).abs().unwrap().matmul(&f64(&b).abs().unwrap()).unwrap() * 2.0))
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar::<f64>()
            .unwrap();
        let got = matmul_add(Some(acc.clone()), &a, &b, 2.0).unwrap();
        assert!(max_diff(&got, &want) <= size / 64.0, "{m}x{k}x{n}: {}", max_diff(&got, &want));
        let alone = matmul_add(None, &a, &b, 2.0).unwrap();
        assert!(max_diff(&alone, &(&want - f64(&acc)).unwrap()) <= size / 64.0, "{m}x{k}x{n} without acc");
    }
}

/// The queries split as a view of the rotated rows (Candle's `rope_thd`) hold the values the contiguous split
/// (a copy to heads, then `rope`) gives, in f32 and bf16, and come back as a strided view; a partial rotary
/// (tables narrower than half a head) keeps the contiguous split.
#[test]
fn query_heads_rotated_in_rows_equal_the_contiguous_split() {
    use super::heads::{split_heads, split_query_heads};
    let (b, t, n, d) = (2, 5, 3, 8);
    let x64 = seeded(&[b * t, n * d], 0.0, 2.0, 11);
    let (cos64, sin64) = (seeded(&[t, d / 2], 0.0, 1.0, 12), seeded(&[t, d / 2], 0.0, 1.0, 13));
    for dtype in [DType::F32, DType::BF16] {
        let cast = |x: &Tensor| x.to_dtype(dtype).unwrap();
        let (x, cos, sin) = (cast(&x64), cast(&cos64), cast(&sin64));
        let view = split_query_heads(&x, (b, t, n, d), Some((&cos, &sin))).unwrap();
        let contiguous = split_heads(&x, (b, t, n, d), Some((&cos, &sin))).unwrap();
        assert!(!view.is_contiguous() && contiguous.is_contiguous(), "{dtype:?}");
        assert_eq!(max_diff(&view, &contiguous), 0.0, "{dtype:?}");
        let narrow =
            (cos.narrow(1, 0, 2).unwrap().contiguous().unwrap(), sin.narrow(1, 0, 2).unwrap().contiguous().unwrap());
        let partial = split_query_heads(&x, (b, t, n, d), Some((&narrow.0, &narrow.1))).unwrap();
        assert!(partial.is_contiguous(), "{dtype:?}: a partial rotary keeps the contiguous split");
    }
}
