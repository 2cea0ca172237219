//! Blocked attention against the whole-matrix attention: Candle's autograd through a composed f64 softmax for
//! the output and all three gradients (f64 and f32), and the composed path's own half-precision arithmetic for
//! the bf16/f16 tolerance; grouped-query heads, a cache offset, sliding windows narrower and wider than a
//! block, and lengths that are not multiples of the block.

use super::*;
use candle_core::Var;
use candle_core::D;

/// One attention problem: q (b, heads, tq, d) at positions `q_offset..`, k/v (b, kv, tk, d), the output
/// gradient (b * tq, heads * d).
struct Case {
    q: Tensor,
    k: Tensor,
    v: Tensor,
    up: Tensor,
    q_offset: usize,
    window: Option<usize>,
    scale: f64,
    /// Packed rows: where each query's example starts, (b * tq).
    starts: Option<Vec<u32>>,
}

fn case(b: usize, (heads, kv): (usize, usize), (tq, tk): (usize, usize), window: Option<usize>, seed: u64) -> Case {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let d = 8;
    let mut r = |shape: &[usize]| {
        let values: Vec<f64> = (0..shape.iter().product()).map(|_| rng.random_range(-2.0..2.0)).collect();
        Tensor::from_vec(values, shape, &Device::Cpu).unwrap()
    };
    Case {
        q: r(&[b, heads, tq, d]),
        k: r(&[b, kv, tk, d]),
        v: r(&[b, kv, tk, d]),
        up: r(&[b * tq, heads * d]),
        q_offset: tk - tq,
        window,
        scale: 0.7,
        starts: None,
    }
}

/// A training case (no offset) whose rows pack examples of the given lengths (each row's lengths sum to t).
fn packed_case(rows: &[&[usize]], (heads, kv): (usize, usize), window: Option<usize>, seed: u64) -> Case {
    let t: usize = rows[0].iter().sum();
    let mut c = case(rows.len(), (heads, kv), (t, t), window, seed);
    let mut starts = Vec::new();
    for lengths in rows {
        assert_eq!(lengths.iter().sum::<usize>(), t);
        let mut at = 0u32;
        for &n in lengths.iter() {
            starts.extend(std::iter::repeat_n(at, n));
            at += n as u32;
        }
    }
    c.starts = Some(starts);
    c
}

/// The additive (tq, tk) mask of the whole matrix.
fn full_mask(c: &Case, dtype: DType) -> Tensor {
    let (tq, tk, w) = (c.q.dim(2).unwrap(), c.k.dim(2).unwrap(), c.window.unwrap_or(usize::MAX));
    let mut m = vec![0f32; tq * tk];
    for i in 0..tq {
        let p = c.q_offset + i;
        for j in 0..tk {
            if j > p || p - j >= w {
                m[i * tk + j] = f32::NEG_INFINITY;
            }
        }
    }
    Tensor::from_vec(m, (tq, tk), &Device::Cpu).unwrap().to_dtype(dtype).unwrap()
}

/// The additive (b, 1, tq, tk) mask of the whole matrix with packed rows' starts (or none).
fn batch_mask(c: &Case) -> Tensor {
    let (b, tq, tk) = (c.q.dim(0).unwrap(), c.q.dim(2).unwrap(), c.k.dim(2).unwrap());
    let causal = full_mask(c, DType::F64);
    let mut m = Vec::with_capacity(b * tq * tk);
    for r in 0..b {
        for i in 0..tq {
            let start = c.starts.as_ref().map_or(0, |s| s[r * tq + i] as usize);
            m.extend((0..tk).map(|j| if j < start { f64::NEG_INFINITY } else { 0.0 }));
        }
    }
    let packed = Tensor::from_vec(m, (b, 1, tq, tk), &Device::Cpu).unwrap();
    packed.broadcast_add(&causal).unwrap()
}

/// (out (b * tq, heads * d), dq, dk, dv) by autograd through the whole matrix in f64 (K/V heads repeated).
fn reference(c: &Case) -> [Tensor; 4] {
    let (b, heads, tq, d) = c.q.dims4().unwrap();
    let (kv, tk) = (c.k.dim(1).unwrap(), c.k.dim(2).unwrap());
    let (q, k, v) = (Var::from_tensor(&c.q).unwrap(), Var::from_tensor(&c.k).unwrap(), Var::from_tensor(&c.v).unwrap());
    let repeat = |x: &Tensor| {
        x.unsqueeze(2).unwrap().broadcast_as((b, kv, heads / kv, tk, d)).unwrap().reshape((b, heads, tk, d)).unwrap()
    };
    let scores = (q.as_tensor().matmul(&repeat(k.as_tensor()).t().unwrap()).unwrap() * c.scale).unwrap();
    let probs = candle_nn::ops::softmax(&scores.broadcast_add(&batch_mask(c)).unwrap(), D::Minus1);
    let out = probs.unwrap().matmul(&repeat(v.as_tensor())).unwrap();
    let out = out.transpose(1, 2).unwrap().reshape((b * tq, heads * d)).unwrap();
    let grads = (&out * &c.up).unwrap().sum_all().unwrap().backward().unwrap();
    let g = |x: &Var| grads.get(x.as_tensor()).unwrap().clone();
    [out, g(&q), g(&k), g(&v)]
}

/// (out, dq, dk, dv) of the blocked path in `dtype` with blocks of `block`.
fn blocked(c: &Case, dtype: DType, block: usize) -> [Tensor; 4] {
    let cast = |x: &Tensor| x.to_dtype(dtype).unwrap();
    let (q, k, v) = (cast(&c.q), cast(&c.k), cast(&c.v));
    let starts = c.starts.as_deref();
    let (out, stats) = blocked_attention_in(&q, &k, &v, c.scale, (c.q_offset, c.window), block, starts).unwrap();
    assert_eq!(out.dtype(), dtype);
    let out = out.reshape(c.up.dims()).unwrap();
    let up = cast(&c.up);
    let (dq, dk, dv) = blocked_attention_backward(&q, &k, &v, &out, &stats, &up, c.scale, c.window, starts).unwrap();
    [out, dq, dk, dv]
}

/// The composed path as `Attention::attend` / `composed_backward` compute it in `dtype`: products in the
/// input dtype, the softmax and its backward through f32, the probabilities kept in the input dtype.
fn composed(c: &Case, dtype: DType) -> [Tensor; 4] {
    let cast = |x: &Tensor| x.to_dtype(dtype).unwrap();
    let (b, heads, tq, d) = c.q.dims4().unwrap();
    let kv = c.k.dim(1).unwrap();
    let grouped = |x: &Tensor| x.contiguous().unwrap().reshape((b, kv, heads / kv * tq, d)).unwrap();
    let (q, k, v) = (grouped(&cast(&c.q)), cast(&c.k), cast(&c.v));
    let scores = matmul(&q, &k.t().unwrap()).unwrap();
    let mask = full_mask(c, DType::F32);
    let probs =
        super::super::attention::scaled_masked_softmax(&scores, c.scale, Some(&mask)).unwrap().to_dtype(dtype).unwrap();
    let out = matmul(&probs, &v).unwrap().reshape((b, heads, tq, d)).unwrap();
    let out = out.transpose(1, 2).unwrap().reshape((b * tq, heads * d)).unwrap();
    let d_o = grouped(&cast(&c.up).reshape((b, tq, heads, d)).unwrap().transpose(1, 2).unwrap());
    let dv = matmul(&probs.t().unwrap(), &d_o).unwrap();
    let d_probs = matmul(&d_o, &v.t().unwrap()).unwrap();
    let ds = super::super::backward::softmax_backward(&probs, &d_probs, c.scale).unwrap().to_dtype(dtype).unwrap();
    let dq = matmul(&ds, &k).unwrap().reshape((b, heads, tq, d)).unwrap();
    let dk = matmul(&ds.t().unwrap(), &q).unwrap();
    [out, dq, dk, dv]
}

fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
    let f = |x: &Tensor| x.to_dtype(DType::F64).unwrap().flatten_all().unwrap();
    (f(a) - f(b)).unwrap().abs().unwrap().max(0).unwrap().to_scalar::<f64>().unwrap()
}

const NAMES: [&str; 4] = ["out", "dq", "dk", "dv"];

/// GQA, a cache offset, windows narrower and wider than a block, lengths not multiples of the block.
fn cases() -> Vec<(&'static str, Case)> {
    vec![
        ("square causal", case(2, (4, 2), (75, 75), None, 1)),
        ("offset (prefill after a cache)", case(1, (4, 1), (37, 90), None, 2)),
        ("window narrower than a block", case(2, (4, 2), (70, 70), Some(5), 3)),
        ("window wider than a block, offset", case(1, (6, 2), (50, 83), Some(40), 4)),
        ("window of one key", case(1, (2, 2), (33, 33), Some(1), 5)),
        ("one block (shorter than it)", case(1, (4, 2), (9, 9), None, 6)),
        ("packed rows", packed_case(&[&[20, 1, 33, 21], &[75]], (4, 2), None, 8)),
        ("packed rows with a window", packed_case(&[&[40, 30], &[16, 16, 16, 22]], (4, 2), Some(9), 9)),
    ]
}

#[test]
fn blocked_matches_autograd_of_the_whole_matrix_in_f64_and_f32() {
    for (name, c) in cases() {
        let want = reference(&c);
        for block in [16, 32] {
            let got64 = blocked(&c, DType::F64, block);
            let got32 = blocked(&c, DType::F32, block);
            for i in 0..4 {
                let (e64, e32) = (max_diff(&got64[i], &want[i]), max_diff(&got32[i], &want[i]));
                assert!(e64 < 1e-10, "{name}, block {block}: f64 {} off by {e64}", NAMES[i]);
                assert!(e32 < 1e-5, "{name}, block {block}: f32 {} off by {e32}", NAMES[i]);
            }
        }
    }
}

/// The default block size on a length that needs three blocks (the last partial) and a mask on the diagonal.
#[test]
fn default_blocks_match_the_whole_matrix() {
    let c = case(1, (4, 2), (2 * BLOCK + 11, 2 * BLOCK + 11), Some(BLOCK + 3), 7);
    let (out, _) = blocked_attention(&c.q, &c.k, &c.v, c.scale, c.q_offset, c.window, None).unwrap();
    let want = reference(&c);
    assert!(max_diff(&out.reshape(c.up.dims()).unwrap(), &want[0]) < 1e-10);
    let got = blocked(&c, DType::F64, BLOCK);
    for i in 0..4 {
        assert!(max_diff(&got[i], &want[i]) < 1e-10, "{}", NAMES[i]);
    }
}

/// In half precision the blocked path is about as close to the f64 truth as the composed path is in the same
/// dtype (which keeps the probabilities rounded to it): the tolerance is the composed path's own error, plus a
/// few roundings of the case's largest value (D = rowsum(dO O) reads the rounded output, so a gradient that is
/// exactly zero in the composed path, dq under a one-key window, is off by a rounding of dO v).
#[test]
fn blocked_half_precision_is_as_close_as_the_composed_path() {
    for dtype in [DType::BF16, DType::F16] {
        let eps = if dtype == DType::BF16 { 1.0 / 256.0 } else { 1.0 / 2048.0 };
        // The composed path's (t, t) mask has no packed rows.
        for (name, c) in cases().into_iter().filter(|(_, c)| c.starts.is_none()) {
            let (want, got, theirs) = (reference(&c), blocked(&c, dtype, 16), composed(&c, dtype));
            let largest = want.iter().map(|w| max_diff(w, &w.zeros_like().unwrap())).fold(0.0, f64::max);
            for i in 0..4 {
                let (ours, composed) = (max_diff(&got[i], &want[i]), max_diff(&theirs[i], &want[i]));
                assert!(
                    ours <= 1.5 * composed + 8.0 * eps * largest,
                    "{dtype:?} {name}: {} off by {ours}, composed by {composed} (largest value {largest})",
                    NAMES[i]
                );
            }
        }
    }
}

/// A block's keys run from the first any of its queries sees, rounded down to a multiple of the block, to its
/// last query; the mask is left out only where every query sees every key of the span.
#[test]
fn key_spans_cover_what_the_block_sees_and_mask_only_cut_spans() {
    let span = |start, len, masked| KeySpan { start, len, masked };
    let c = case(1, (1, 1), (64, 64), None, 8);
    let g = Geometry::new(&c.q, &c.k, (0, None), 16, None).unwrap();
    // Query rows 32..48 see keys 0..48, the diagonal cut.
    assert_eq!(g.key_span((32, 16)), span(0, 48, true));
    let g = Geometry::new(&c.q, &c.k, (0, Some(20)), 16, None).unwrap();
    // With a 20-key window rows 32..48 reach back to key 13 (block 0), rows 48..64 to key 29 (block 16).
    assert_eq!(g.key_span((32, 16)), span(0, 48, true));
    assert_eq!(g.key_span((48, 16)), span(16, 48, true));
    // One query at the end of a cache sees every key up to its own: no mask.
    let c = case(1, (1, 1), (1, 64), None, 8);
    let g = Geometry::new(&c.q, &c.k, (63, None), 16, None).unwrap();
    assert_eq!(g.key_span((0, 1)), span(0, 64, false));
}

#[test]
fn packed_spans_start_at_the_earliest_example_start() {
    let span = |start, len, masked| KeySpan { start, len, masked };
    // Row 0 packs 40 + 24 tokens, row 1 holds one example of 64: rows 48..64 of row 1 see every key.
    let c = packed_case(&[&[40, 24], &[64]], (1, 1), None, 10);
    let g = Geometry::new(&c.q, &c.k, (0, None), 16, c.starts.as_deref()).unwrap();
    assert_eq!(g.key_span((48, 16)), span(0, 64, true));
    // Both rows start at 40 there: keys from 32 (40 rounded down to the block).
    let c = packed_case(&[&[40, 24], &[40, 24]], (1, 1), None, 10);
    let g = Geometry::new(&c.q, &c.k, (0, None), 16, c.starts.as_deref()).unwrap();
    assert_eq!(g.key_span((48, 16)), span(32, 32, true));
    assert!(Geometry::new(&c.q, &c.k, (0, None), 16, Some(&[0; 3])).is_err(), "one start per query");
}

/// Only the columns some query of a block does not see are masked: a causal block's last keys from its first
/// query on, a window's left edge, a packed row's start; both edges at once become one range where they meet.
#[test]
fn masks_cover_only_the_hidden_columns() {
    let c = case(1, (1, 1), (64, 64), None, 8);
    let g = Geometry::new(&c.q, &c.k, (0, None), 16, None).unwrap();
    // Rows 32..48 see keys 0..48; keys 33..48 are after query 32: columns 33..48.
    assert_eq!(g.hidden_columns((32, 16), g.key_span((32, 16))), vec![(33, 48)]);
    let g = Geometry::new(&c.q, &c.k, (0, Some(20)), 16, None).unwrap();
    // Rows 48..64 see keys 16..64; query 63 hides keys before 44 (columns 0..28), query 48 keys from 49 (33..48).
    assert_eq!(g.hidden_columns((48, 16), g.key_span((48, 16))), vec![(0, 28), (33, 48)]);
    let g = Geometry::new(&c.q, &c.k, (0, Some(4)), 16, None).unwrap();
    // A window narrower than the block: the edges meet, the whole span is masked.
    assert_eq!(g.hidden_columns((32, 16), g.key_span((32, 16))), vec![(0, 32)]);
    let c = packed_case(&[&[40, 24], &[64]], (1, 1), None, 10);
    let g = Geometry::new(&c.q, &c.k, (0, None), 16, c.starts.as_deref()).unwrap();
    // Row 0's queries 48..64 start at 40: keys 0..40 hidden from them, and the diagonal from 49.
    assert_eq!(g.hidden_columns((48, 16), g.key_span((48, 16))), vec![(0, 40), (49, 64)]);
}
