//! The fused CUDA attention (`ops::fused_attention` and its backward) against Candle's autograd through the
//! composed attention (repeated KV heads, additive mask, softmax) in f64 on the CPU: the output and dQ, dK, dV
//! for causal, grouped-query and sliding-window attention, head sizes 16 to 128, lengths that are not a multiple
//! of the kernels' tiles, in f32, bf16 and f16; packed rows (several examples in a row, masked by their starts);
//! the prefill over a strided KV-cache view at an offset; and the split of projections into rotated heads and
//! back.
//! Built with `--features cuda`; skipped without a GPU. Run on a lent GPU machine.
#![cfg(feature = "cuda")]

mod common;

use candle_core::{DType, Device, Tensor, Var, D};
use common::cuda_or_skip;
use metal_candle::engine::ops;

#[derive(Debug, Clone, Copy)]
struct Case {
    b: usize,
    heads: usize,
    kv: usize,
    t: usize,
    d: usize,
    window: Option<usize>,
}

/// Output (b, t, heads * d) and the gradients of sum(out * d_out) with respect to q, k, v, by autograd in f64.
/// `starts` (packed rows): per batch row, where each query's example starts; no key before it is seen.
fn reference(q: &Tensor, k: &Tensor, v: &Tensor, d_out: &Tensor, c: Case, starts: Option<&[Vec<u32>]>) -> [Tensor; 4] {
    let (q, k, v) = (Var::from_tensor(q).unwrap(), Var::from_tensor(k).unwrap(), Var::from_tensor(v).unwrap());
    let rep = c.heads / c.kv;
    let repeat = |x: &Tensor| Tensor::cat(&vec![x.clone(); rep], 2).unwrap().reshape((c.b, c.heads, c.t, c.d)).unwrap();
    let mut mask = vec![0f64; c.b * c.t * c.t];
    for r in 0..c.b {
        for i in 0..c.t {
            let start = starts.map_or(0, |s| s[r][i] as usize);
            for j in 0..c.t {
                if j > i || c.window.is_some_and(|w| i - j >= w) || j < start {
                    mask[(r * c.t + i) * c.t + j] = -1e30;
                }
            }
        }
    }
    let mask = Tensor::from_vec(mask, (c.b, 1, c.t, c.t), &Device::Cpu).unwrap();
    let scale = 1.0 / (c.d as f64).sqrt();
    let scores = (q.as_tensor().matmul(&repeat(k.as_tensor()).t().unwrap()).unwrap() * scale).unwrap();
    let probs = candle_nn::ops::softmax(&scores.broadcast_add(&mask).unwrap(), D::Minus1).unwrap();
    let out = probs.matmul(&repeat(v.as_tensor())).unwrap();
    let out = out.transpose(1, 2).unwrap().reshape((c.b, c.t, c.heads * c.d)).unwrap();
    let grads = (&out * d_out).unwrap().sum_all().unwrap().backward().unwrap();
    let g = |x: &Var| grads.get(x.as_tensor()).unwrap().clone();
    [out.clone(), g(&q), g(&k), g(&v)]
}

/// max |a - b| over max |b|, or absolute where every |b| < 1 (a single token's dq and dk are exactly zero).
fn relative(a: &Tensor, b: &Tensor) -> f64 {
    let a = a.to_device(&Device::Cpu).unwrap().to_dtype(DType::F64).unwrap();
    let b = b.to_dtype(DType::F64).unwrap().reshape(a.shape()).unwrap();
    let diff: f64 = (&a - &b).unwrap().abs().unwrap().max_all().unwrap().to_scalar().unwrap();
    let scale: f64 = b.abs().unwrap().max_all().unwrap().to_scalar().unwrap();
    assert!(diff.is_finite(), "non-finite result");
    diff / scale.max(1.0)
}

/// Random inputs rounded to `dtype` (so the reference sees what the kernels see), on the CPU in f64.
fn inputs(c: Case, dtype: DType) -> [Tensor; 4] {
    let r = |shape: (usize, usize, usize, usize)| {
        let x = Tensor::randn(0f64, 1.0, shape, &Device::Cpu).unwrap();
        x.to_dtype(dtype).unwrap().to_dtype(DType::F64).unwrap()
    };
    let d_out = r((c.b, c.t, c.heads, c.d)).reshape((c.b, c.t, c.heads * c.d)).unwrap();
    [r((c.b, c.heads, c.t, c.d)), r((c.b, c.kv, c.t, c.d)), r((c.b, c.kv, c.t, c.d)), d_out]
}

fn check(gpu: &Device, c: Case, dtype: DType, tolerance: f64) {
    check_rows(gpu, c, dtype, tolerance, None);
}

/// The fused attention's output and gradients on `gpu` (inputs in `dtype`, packed rows' `starts` as a u32 (b, t)
/// tensor there or None): [out, dq, dk, dv].
fn fused(gpu: &Device, c: Case, dtype: DType, x: &[Tensor; 4], starts: Option<&Tensor>) -> [Tensor; 4] {
    let [gq, gk, gv, gd] = x.clone().map(|x| x.to_dtype(dtype).unwrap().to_device(gpu).unwrap());
    let scale = 1.0 / (c.d as f64).sqrt();
    let (out, lse) =
        ops::fused_attention(&gq, &gk, &gv, scale, 0, c.window, starts).unwrap().expect("fused attention applies");
    let rows = (c.b * c.t, c.heads * c.d);
    let (out2, gd2) = (out.reshape(rows).unwrap(), gd.reshape(rows).unwrap());
    let (dq, dk, dv) =
        ops::fused_attention_backward(&gq, &gk, &gv, &out2, &lse, &gd2, scale, c.window, starts).unwrap();
    [out, dq, dk, dv]
}

/// [`check`] with packed rows: `starts[r][i]` is where query i of batch row r has its example start.
fn check_rows(gpu: &Device, c: Case, dtype: DType, tolerance: f64, starts: Option<&[Vec<u32>]>) {
    let x = inputs(c, dtype);
    let [q, k, v, d_out] = &x;
    let want = reference(q, k, v, d_out, c, starts);
    let on_gpu = starts.map(|s| Tensor::new(s.to_vec(), &Device::Cpu).unwrap().to_device(gpu).unwrap());
    let got = fused(gpu, c, dtype, &x, on_gpu.as_ref());
    let errors: Vec<f64> = got.iter().zip(&want).map(|(g, w)| relative(g, w)).collect();
    let packed = if starts.is_some() { " packed" } else { "" };
    eprintln!(
        "{c:?} {dtype:?}{packed}: relative error out/dq/dk/dv {:.1e} {:.1e} {:.1e} {:.1e}",
        errors[0], errors[1], errors[2], errors[3]
    );
    assert!(errors.iter().all(|e| *e < tolerance), "{c:?} {dtype:?}{packed}: {errors:?} over {tolerance}");
}

const CASES: [Case; 9] = [
    Case { b: 2, heads: 4, kv: 4, t: 67, d: 64, window: None },
    // Many key blocks per query tile at head_dim 64 (the single-pass backward hands dQ's sums from block to
    // block): causal, a window over several blocks, and a window of one (only the diagonal block contributes).
    Case { b: 2, heads: 8, kv: 2, t: 700, d: 64, window: None },
    Case { b: 1, heads: 4, kv: 1, t: 517, d: 64, window: Some(130) },
    Case { b: 1, heads: 2, kv: 2, t: 300, d: 64, window: Some(1) },
    Case { b: 1, heads: 8, kv: 2, t: 130, d: 128, window: None },
    Case { b: 2, heads: 4, kv: 2, t: 100, d: 32, window: Some(17) },
    Case { b: 3, heads: 4, kv: 2, t: 5, d: 16, window: None },
    Case { b: 1, heads: 6, kv: 3, t: 203, d: 64, window: Some(70) },
    Case { b: 1, heads: 2, kv: 1, t: 1, d: 16, window: None },
];

#[test]
fn fused_attention_matches_autograd_of_the_composed_attention() {
    let Some(gpu) = cuda_or_skip() else { return };
    for c in CASES {
        check(&gpu, c, DType::F32, 1e-5);
    }
    // bf16 keeps 8 bits of mantissa: outputs and gradients are rounded to about 2^-9 of their size, over
    // values up to a few times the largest; f16 keeps 11.
    for c in CASES {
        check(&gpu, c, DType::BF16, 1.5e-2);
        check(&gpu, c, DType::F16, 2e-3);
    }
}

/// Per batch row, each query's example start for examples of the given lengths laid end to end.
fn row_starts(segments: &[usize]) -> Vec<u32> {
    let mut starts = Vec::new();
    for &len in segments {
        starts.extend(std::iter::repeat_n(starts.len() as u32, len));
    }
    starts
}

/// Packed rows (several examples laid end to end in one row, each query masked to its own example's keys) against
/// the reference with the same mask: examples that start mid-tile, a one-token example (it sees only itself), a
/// boundary on a tile edge and a row of one example, lengths that are not a multiple of the tiles and one with many
/// key blocks, grouped-query heads, with and without a sliding window; head_dim 64 and 128 (tensor cores in bf16 and
/// f16, FMAs in f32) and 32 (FMAs). Starts that are all zero change no bit of the unpacked result.
#[test]
fn packed_rows_never_attend_across_examples() {
    let Some(gpu) = cuda_or_skip() else { return };
    let kinds = [(DType::F32, 1e-5), (DType::BF16, 1.5e-2), (DType::F16, 2e-3)];
    for t in [129, 200] {
        let rows = [vec![37, 1, 90, t - 128], vec![64, 64, t - 128], vec![t]];
        let starts: Vec<Vec<u32>> = rows.iter().map(|r| row_starts(r)).collect();
        for d in [32, 64, 128] {
            for window in [None, Some(50)] {
                let c = Case { b: rows.len(), heads: 4, kv: 2, t, d, window };
                for (dtype, tolerance) in kinds {
                    check_rows(&gpu, c, dtype, tolerance, Some(&starts));
                }
            }
        }
    }
    // Many key and query blocks: examples spanning several, the dK/dV blocks' early stop, one-token examples.
    let t = 517;
    let rows = [vec![3, 200, 64, 1, 129, 120], vec![256, 261], vec![1, 1, 515]];
    let starts: Vec<Vec<u32>> = rows.iter().map(|r| row_starts(r)).collect();
    for d in [64, 128] {
        for window in [None, Some(130)] {
            let c = Case { b: rows.len(), heads: 4, kv: 2, t, d, window };
            check_rows(&gpu, c, DType::BF16, 1.5e-2, Some(&starts));
        }
    }
    check_rows(&gpu, Case { b: 3, heads: 4, kv: 2, t, d: 32, window: None }, DType::F32, 1e-5, Some(&starts));

    // All-zero starts (every row one example) give the unpacked attention's bits.
    for (d, dtype) in [(32, DType::F32), (64, DType::BF16), (128, DType::F16), (128, DType::F32)] {
        for window in [None, Some(50)] {
            let c = Case { b: 2, heads: 4, kv: 2, t: 200, d, window };
            let x = inputs(c, dtype);
            let zeros = Tensor::zeros((c.b, c.t), DType::U32, &gpu).unwrap();
            let plain = fused(&gpu, c, dtype, &x, None);
            let packed = fused(&gpu, c, dtype, &x, Some(&zeros));
            for (name, (a, b)) in ["out", "dq", "dk", "dv"].iter().zip(plain.iter().zip(&packed)) {
                let differ = differing_bits(&bits(a), &bits(b));
                assert_eq!(differ, 0, "{c:?} {dtype:?} {name}: {differ} elements differ with all-zero starts");
            }
        }
    }
}

/// A tensor's values as f32 (exact for f32, bf16 and f16), for comparing bits.
fn bits(x: &Tensor) -> Vec<f32> {
    x.flatten_all().unwrap().to_dtype(DType::F32).unwrap().to_vec1::<f32>().unwrap()
}

/// How many elements of `a` and `b` differ in their bits.
fn differing_bits(a: &[f32], b: &[f32]) -> usize {
    a.iter().zip(b).filter(|(x, y)| x.to_bits() != y.to_bits()).count()
}

/// Starts the kernels cannot use are refused with an error, not read out of bounds: the wrong shape or dtype, a
/// prefill at an offset.
#[test]
fn packed_row_starts_that_do_not_fit_are_refused() {
    let Some(gpu) = cuda_or_skip() else { return };
    let c = Case { b: 2, heads: 4, kv: 2, t: 16, d: 64, window: None };
    let [q, k, v, _] = inputs(c, DType::BF16).map(|x| x.to_dtype(DType::BF16).unwrap().to_device(&gpu).unwrap());
    let scale = 0.125;
    let attend =
        |q: &Tensor, offset: usize, starts: &Tensor| ops::fused_attention(q, &k, &v, scale, offset, None, Some(starts));
    let good = Tensor::zeros((c.b, c.t), DType::U32, &gpu).unwrap();
    assert!(attend(&q, 0, &good).is_ok());
    let wrong_shape = Tensor::zeros((c.b, c.t - 1), DType::U32, &gpu).unwrap();
    assert!(attend(&q, 0, &wrong_shape).is_err(), "starts of the wrong shape");
    let wrong_dtype = Tensor::zeros((c.b, c.t), DType::F32, &gpu).unwrap();
    assert!(attend(&q, 0, &wrong_dtype).is_err(), "starts of the wrong dtype");
    let on_cpu = Tensor::zeros((c.b, c.t), DType::U32, &Device::Cpu).unwrap();
    assert!(attend(&q, 0, &on_cpu).is_err(), "starts on the CPU");
    let tail = q.narrow(2, 8, 8).unwrap().contiguous().unwrap();
    let tail_starts = Tensor::zeros((c.b, 8), DType::U32, &gpu).unwrap();
    assert!(attend(&tail, 8, &tail_starts).is_err(), "starts with a prefill at an offset");
}

/// The backward gives the same bits on every run (dQ's sums over key blocks are added in a fixed order), at the
/// shape of the 1B model's attention, where hundreds of blocks run at once.
#[test]
fn fused_attention_backward_is_deterministic() {
    let Some(gpu) = cuda_or_skip() else { return };
    let c = Case { b: 1, heads: 32, kv: 8, t: 2048, d: 64, window: None };
    let [q, k, v, d_out] = inputs(c, DType::BF16).map(|x| x.to_dtype(DType::BF16).unwrap().to_device(&gpu).unwrap());
    let scale = 1.0 / 8.0;
    let (out, lse) = ops::fused_attention(&q, &k, &v, scale, 0, None, None).unwrap().expect("fused attention applies");
    let rows = (c.t, c.heads * c.d);
    let (out, d_out) = (out.reshape(rows).unwrap(), d_out.reshape(rows).unwrap());
    let run = || {
        let (dq, dk, dv) = ops::fused_attention_backward(&q, &k, &v, &out, &lse, &d_out, scale, None, None).unwrap();
        [bits(&dq), bits(&dk), bits(&dv)]
    };
    let first = run();
    assert!(first[0].iter().any(|x| *x != 0.0), "dq is all zeros");
    for _ in 0..4 {
        let again = run();
        for (name, (a, b)) in ["dq", "dk", "dv"].iter().zip(first.iter().zip(&again)) {
            let differ = differing_bits(a, b);
            assert_eq!(differ, 0, "{name}: {differ} elements differ between two runs of the same backward");
        }
    }
}

/// Prefill after a cached prefix: `tq` new queries at positions `start..` over a strided KV-cache view match
/// the same rows of the full causal attention: the f32 kernel at head_dim 32 and the tensor-core kernels (wgmma on
/// an H100) at 64 and 128.
#[test]
fn fused_prefill_over_a_strided_cache_matches_the_full_attention() {
    let Some(gpu) = cuda_or_skip() else { return };
    let kinds =
        [(32, DType::F32, 1e-5), (64, DType::BF16, 1.5e-2), (128, DType::BF16, 1.5e-2), (128, DType::F16, 2e-3)];
    for (d, dtype, tolerance) in kinds {
        for window in [None, Some(9)] {
            let c = Case { b: 2, heads: 4, kv: 2, t: 67, d, window };
            let [q, k, v, d_out] = inputs(c, dtype);
            let want = reference(&q, &k, &v, &d_out, c, None)[0].narrow(1, 60, 7).unwrap();
            let on_gpu = |x: &Tensor| x.to_dtype(dtype).unwrap().to_device(&gpu).unwrap();
            // A cache buffer of capacity 80 holding 67 positions: rows of d contiguous, heads 80 rows apart.
            let cache = |x: &Tensor| {
                let pad = Tensor::zeros((c.b, c.kv, 13, c.d), DType::F64, &Device::Cpu).unwrap();
                on_gpu(&Tensor::cat(&[x, &pad], 2).unwrap()).narrow(2, 0, c.t).unwrap()
            };
            let q_new = on_gpu(&q.narrow(2, 60, 7).unwrap());
            let scale = 1.0 / (c.d as f64).sqrt();
            let (out, _) =
                ops::fused_attention(&q_new, &cache(&k), &cache(&v), scale, 60, window, None).unwrap().unwrap();
            let error = relative(&out, &want);
            eprintln!("prefill at 60, head_dim {d} {dtype:?}, window {window:?}: relative error {error:.1e}");
            assert!(error < tolerance, "head_dim {d} {dtype:?} window {window:?}: {error} over {tolerance}");
        }
    }
}

/// The split into heads with the rotary embedding (`ops::split_heads`, one kernel on CUDA) and its gradient's way
/// back (`ops::merge_heads_backward`) against the composed path on the CPU (a transpose and Candle's rope), with
/// and without rotation, one batch and several, in f32 and bf16.
#[test]
fn split_heads_with_rope_and_its_backward_match_the_composed_path() {
    let Some(gpu) = cuda_or_skip() else { return };
    for (b, t, n, d) in [(1, 5, 3, 64), (2, 37, 4, 128), (3, 16, 2, 16)] {
        let x = Tensor::randn(0f32, 1.0, (b * t, n * d), &Device::Cpu).unwrap();
        let dy = Tensor::randn(0f32, 1.0, (b, n, t, d), &Device::Cpu).unwrap();
        let angles = Tensor::randn(0f32, 3.0, (t, d / 2), &Device::Cpu).unwrap();
        let (cos, sin) = (angles.cos().unwrap(), angles.sin().unwrap());
        for (dtype, tolerance) in [(DType::F32, 1e-6), (DType::BF16, 1.6e-2)] {
            // Inputs rounded to `dtype` first, so both sides see the same values.
            let round = |x: &Tensor| x.to_dtype(dtype).unwrap().to_dtype(DType::F32).unwrap();
            let (x, dy, cos, sin) = (round(&x), round(&dy), round(&cos), round(&sin));
            let on_gpu = |x: &Tensor| x.to_dtype(dtype).unwrap().to_device(&gpu).unwrap();
            let (gx, gdy, gcos, gsin) = (on_gpu(&x), on_gpu(&dy), on_gpu(&cos), on_gpu(&sin));
            for rotate in [true, false] {
                let (rope, grope) = if rotate { (Some((&cos, &sin)), Some((&gcos, &gsin))) } else { (None, None) };
                let want = ops::split_heads(&x, (b, t, n, d), rope).unwrap();
                let got = ops::split_heads(&gx, (b, t, n, d), grope).unwrap();
                assert_eq!(got.dims(), [b, n, t, d]);
                let err = relative(&got, &want);
                assert!(err <= tolerance, "split {dtype:?} rotate {rotate} ({b}, {t}, {n}, {d}): {err:e}");
                let want = ops::merge_heads_backward(&dy, rope).unwrap();
                let got = ops::merge_heads_backward(&gdy, grope).unwrap();
                assert_eq!(got.dims(), [b * t, n * d]);
                let err = relative(&got, &want);
                assert!(err <= tolerance, "merge {dtype:?} rotate {rotate} ({b}, {t}, {n}, {d}): {err:e}");
            }
        }
    }
}
