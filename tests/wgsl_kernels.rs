//! Our WGSL kernels (src/engine/ops/metal/wgsl/) against the same math in Candle ops on the CPU, forward and
//! gradients, run through wgpu on Vulkan (lavapipe in CI; CI sets METAL_CANDLE_REQUIRE_VULKAN=1 so a missing
//! adapter fails there instead of skipping), plus naga's MSL translation of every kernel for the Mac.
//! f32 must agree to 1e-5 relative; f16 to 2^-10 (the kernel stores its result once in f16, 2^-11 relative,
//! from the same f16-rounded inputs the reference gets); bf16 to 2^-7 (stored once in bf16, 2^-8 relative, as
//! u32 words of two elements: element_access.rs). `bench_wgsl_1b_shapes` (ignored) times each kernel at
//! the Llama-3.2-1B shapes on whatever adapter wgpu finds.

mod wgsl_support;

use candle_core::{DType, Device, Tensor, Var, D};
use metal_candle::engine::ops;
use metal_candle::engine::ops::metal::wgsl::{self, AttentionShape, Factor, Kernel, Precision};
use wgsl_support::{assert_close, gpu_or_skip, msl, Gpu, Values};

const F32_TOL: f32 = 1e-5;
const F16_TOL: f32 = 1.0 / 1024.0;
const BF16_TOL: f32 = 1.0 / 128.0;

/// Deterministic values in [-amp, amp), rounded to f16 (bf16) for f16 (bf16) runs so both sides see the same
/// inputs.
fn values(n: usize, seed: u64, amp: f32, precision: Precision) -> Vec<f32> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            values_round(((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * amp, precision)
        })
        .collect()
}

fn t(data: &[f32], shape: &[usize]) -> Tensor {
    Tensor::from_slice(data, shape, &Device::Cpu).unwrap()
}

fn flat(x: &Tensor) -> Vec<f32> {
    x.to_dtype(DType::F32).unwrap().flatten_all().unwrap().to_vec1().unwrap()
}

/// The precisions this adapter runs, with their tolerances.
fn precisions(gpu: &Gpu) -> Vec<(Precision, f32)> {
    let mut p = vec![(Precision::F32, F32_TOL)];
    if gpu.f16 {
        p.push((Precision::F16, F16_TOL));
    } else {
        eprintln!("{}: no SHADER_F16, f16 kernels not run", gpu.name);
    }
    p.push((Precision::Bf16, BF16_TOL));
    p
}

#[test]
fn every_kernel_validates_and_translates_to_msl() {
    for kernel in Kernel::ALL {
        let head_dims: &[u32] = if kernel.needs_head_dim() { &wgsl::ATTENTION_HEAD_DIMS } else { &[0] };
        for precision in Precision::ALL {
            for &head_dim in head_dims {
                let source = wgsl::source(kernel, precision, head_dim);
                let out =
                    msl::translate(&source).unwrap_or_else(|e| panic!("{kernel:?} {precision:?} {head_dim}: {e}"));
                assert!(out.source.contains("#include <metal_stdlib>"), "{kernel:?}: not MSL");
                assert!(out.source.contains("kernel void"), "{kernel:?}: no compute function");
                for entry in kernel.entry_points() {
                    let name = out.function(entry).unwrap_or_else(|| panic!("{kernel:?}: no entry point {entry}"));
                    assert!(out.source.contains(name), "{kernel:?}: {name} missing from the MSL");
                }
            }
        }
    }
    // Bindings land at the buffer slots the glue binds: binding N -> [[buffer(N)]].
    let out = msl::translate(&wgsl::source(Kernel::AttentionBwd, Precision::F32, 64)).unwrap();
    for slot in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11] {
        assert!(out.source.contains(&format!("[[buffer({slot})]]")), "no [[buffer({slot})]] in the attention MSL");
    }
    assert!(out.source.contains(&format!("[[buffer({})]]", msl::BUFFER_SIZES_SLOT)), "no buffer-sizes slot");
    // Every storage binding is sized; their order is naga's (dependencies first), which the glue reads from here.
    let mut sized = out.sized_bindings.clone();
    sized.sort_unstable();
    assert_eq!(sized, (1..=11).collect::<Vec<u32>>());
    assert_eq!(msl::MSL_VERSION, (2, 4));
}

#[test]
fn rms_norm_forward_and_gradients() {
    let Some(gpu) = gpu_or_skip("rms_norm_forward_and_gradients") else { return };
    let (rows, cols, eps) = (37, 300, 1e-5f32);
    for (precision, tol) in precisions(gpu) {
        let (x, w, dy) = (
            values(rows * cols, 1, 2.0, precision),
            values(cols, 2, 1.5, precision),
            values(rows * cols, 3, 1.0, precision),
        );
        let (xt, wt, dyt) = (t(&x, &[rows, cols]), t(&w, &[cols]), t(&dy, &[rows, cols]));
        let y = gpu.run(&wgsl::rms_norm_fwd(rows, cols, eps), precision, 0, &[&x, &w]);
        assert_close(
            &format!("rms_norm y {precision:?}"),
            &y[0],
            &flat(&ops::rms_norm(&xt, &wt, eps as f64).unwrap()),
            tol,
        );

        let dx = gpu.run(&wgsl::rms_norm_bwd_dx(rows, cols, eps), precision, 0, &[&x, &w, &dy]);
        let want_dx = ops::rms_norm_backward(&xt, &wt, eps as f64, &dyt).unwrap();
        assert_close(&format!("rms_norm dx {precision:?}"), &dx[0], &flat(&want_dx), tol);
        let rstd =
            (xt.sqr().unwrap().mean_keepdim(D::Minus1).unwrap() + eps as f64).unwrap().sqrt().unwrap().recip().unwrap();
        assert_close(&format!("rms_norm rstd {precision:?}"), &dx[1], &flat(&rstd), F32_TOL);

        let dw = gpu.run(&wgsl::rms_norm_bwd_dw(rows, cols, eps), precision, 0, &[&x, &dy, &dx[1]]);
        let want_dw = (dyt * xt.broadcast_mul(&rstd).unwrap()).unwrap().sum(0).unwrap();
        assert_close(&format!("rms_norm dw {precision:?}"), &dw[0], &flat(&want_dw), tol);
    }
}

/// The rope kernel forward and back against Candle's rope, on x (b, h, seq, d) and `tables` tables of cos/sin
/// (1: one (seq, d / 2) table for every batch; b: one per batch, packed rows), angle `angle(table, pos, k)`.
fn check_rope(
    gpu: &Gpu,
    (b, h, seq, d): (usize, usize, usize, usize),
    tables: usize,
    angle: fn(usize, usize, usize) -> f32,
) {
    let rows = b * h * seq;
    let table_shape: Vec<usize> = if tables == 1 { vec![seq, d / 2] } else { vec![tables, seq, d / 2] };
    for (precision, tol) in precisions(gpu) {
        let x = values(rows * d, 4 + tables as u64, 1.0, precision);
        let angles: Vec<f32> =
            (0..tables * seq * d / 2).map(|i| angle(i / (seq * d / 2), (i / (d / 2)) % seq, i % (d / 2))).collect();
        let round = |v: f32| values_round(v, precision);
        let cos: Vec<f32> = angles.iter().map(|a| round(a.cos())).collect();
        let sin: Vec<f32> = angles.iter().map(|a| round(a.sin())).collect();
        let (xt, ct, st) = (t(&x, &[b, h, seq, d]), t(&cos, &table_shape), t(&sin, &table_shape));
        let what = format!("rope, {tables} table(s), {precision:?}");
        let y = gpu.run(&wgsl::rope(rows, seq, d / 2, 1.0, tables), precision, 0, &[&x, &cos, &sin]);
        assert_close(&what, &y[0], &flat(&ops::rope(&xt, &ct, &st).unwrap()), tol);
        let dx = gpu.run(&wgsl::rope(rows, seq, d / 2, -1.0, tables), precision, 0, &[&x, &cos, &sin]);
        let want = flat(&ops::rope_backward(&xt, &ct, &st).unwrap());
        assert_close(&format!("{what} backward"), &dx[0], &want, tol);
    }
}

#[test]
fn rope_forward_and_backward() {
    let Some(gpu) = gpu_or_skip("rope_forward_and_backward") else { return };
    check_rope(gpu, (2, 3, 17, 64), 1, |_, pos, k| pos as f32 * 0.37 + k as f32 * 0.11);
}

/// Packed rows: each batch turned by its own table (b, t, d / 2), as the model gathers at each token's position in
/// its example; batch i restarts its positions every 4 + i tokens (its examples' lengths).
#[test]
fn rope_with_a_table_per_batch() {
    let Some(gpu) = gpu_or_skip("rope_with_a_table_per_batch") else { return };
    check_rope(gpu, (3, 2, 11, 32), 3, |batch, pos, k| (pos % (4 + batch)) as f32 * 0.41 + k as f32 * 0.13);
}

fn values_round(v: f32, precision: Precision) -> f32 {
    match precision {
        Precision::F16 => half::f16::from_f32(v).to_f32(),
        Precision::Bf16 => half::bf16::from_f32(v).to_f32(),
        Precision::F32 => v,
    }
}

#[test]
fn swiglu_forward_and_gradients() {
    let Some(gpu) = gpu_or_skip("swiglu_forward_and_gradients") else { return };
    let n = 1000;
    for (precision, tol) in precisions(gpu) {
        let (g, u, dm) = (values(n, 5, 6.0, precision), values(n, 6, 2.0, precision), values(n, 7, 1.0, precision));
        let (gt, ut, dmt) = (t(&g, &[n]), t(&u, &[n]), t(&dm, &[n]));
        let y = gpu.run(&wgsl::swiglu_fwd(n), precision, 0, &[&g, &u]);
        assert_close(&format!("swiglu {precision:?}"), &y[0], &flat(&ops::silu_mul(&gt, &ut).unwrap()), tol);
        let grads = gpu.run(&wgsl::swiglu_bwd(n), precision, 0, &[&g, &u, &dm]);
        let (dg, du) = ops::silu_mul_backward(&gt, &ut, &dmt).unwrap();
        assert_close(&format!("swiglu dg {precision:?}"), &grads[0], &flat(&dg), tol);
        assert_close(&format!("swiglu du {precision:?}"), &grads[1], &flat(&du), tol);
    }
}

#[test]
fn cross_entropy_loss_and_gradient() {
    let Some(gpu) = gpu_or_skip("cross_entropy_loss_and_gradient") else { return };
    let (rows, vocab) = (9, 1000);
    let targets: Vec<f32> = vec![3.0, 999.0, -100.0, 0.0, 512.0, 77.0, -100.0, 256.0, 1.0];
    let counted = targets.iter().filter(|t| **t >= 0.0).count();
    let scale = 1.0 / counted as f32;
    for (precision, tol) in precisions(gpu) {
        let z = values(rows * vocab, 8, 8.0, precision);
        let out = gpu.run(&wgsl::cross_entropy(rows, vocab, scale), precision, 0, &[&z, &targets]);
        let zt = t(&z, &[rows, vocab]);
        let logp = candle_nn::ops::log_softmax(&zt, D::Minus1).unwrap();
        let mut onehot = vec![0f32; rows * vocab];
        let mut mask = vec![0f32; rows];
        for (r, &tg) in targets.iter().enumerate() {
            if tg >= 0.0 {
                onehot[r * vocab + tg as usize] = 1.0;
                mask[r] = 1.0;
            }
        }
        let (onehot, mask) = (t(&onehot, &[rows, vocab]), t(&mask, &[rows, 1]));
        let loss = (logp.clone() * &onehot).unwrap().sum_keepdim(D::Minus1).unwrap().neg().unwrap();
        let grad = ((logp.exp().unwrap() - onehot).unwrap().broadcast_mul(&mask).unwrap() * scale as f64).unwrap();
        assert_close(&format!("cross_entropy loss {precision:?}"), &out[1], &flat(&loss), F32_TOL);
        assert_close(&format!("cross_entropy grad {precision:?}"), &out[0], &flat(&grad), tol);
    }
}

#[test]
fn lora_epilogue_matches_two_matmuls() {
    let Some(gpu) = gpu_or_skip("lora_epilogue_matches_two_matmuls") else { return };
    let (rows, n_in, n_out, rank, scale) = (7, 300, 260, 8, 2.0f32);
    for (precision, tol) in precisions(gpu) {
        let y = values(rows * n_out, 9, 1.0, precision);
        let x = values(rows * n_in, 10, 1.0, precision);
        let a = values(rank * n_in, 11, 0.1, precision);
        let bw = values(n_out * rank, 12, 0.1, precision);
        let (yt, xt, at, bt) =
            (t(&y, &[rows, n_out]), t(&x, &[rows, n_in]), t(&a, &[rank, n_in]), t(&bw, &[n_out, rank]));
        let xa = xt.matmul(&at.t().unwrap()).unwrap();
        let want = (yt + (xa.matmul(&bt.t().unwrap()).unwrap() * scale as f64).unwrap()).unwrap();
        // The factors both ways: (rank, n_in) and (n_out, rank) rows, and as an adapter keeps them (transposed).
        let kept = |m: &Tensor| flat(&m.t().unwrap().contiguous().unwrap());
        let (a_kept, b_kept) = (kept(&at), kept(&bt));
        let tr = Factor::Transposed;
        let (a_both, b_both) = ([(tr, &a), (Factor::AsKept, &a_kept)], [(tr, &bw), (Factor::AsKept, &b_kept)]);
        for ((a_is, a), (b_is, b)) in a_both.iter().flat_map(|a| b_both.iter().map(move |b| (a, b))) {
            let launch = wgsl::lora_epilogue(rows, n_in, n_out, rank, scale, *a_is, *b_is);
            let out = gpu.run(&launch, precision, 0, &[&y, &x, a, b]);
            let what = format!("lora epilogue A {a_is:?} B {b_is:?} {precision:?}");
            assert_close(&what, &out[0], &flat(&want), tol);
        }
    }
}

/// bf16 stores round to nearest even, as Candle (the half crate) converts f32 to bf16: the low-rank add at rank 1
/// with x = 1 forms `y + b` in f32 (an IEEE sum, the same on both sides; exact for the leading pairs), then the kernel
/// rounds it once; ties both ways, a tie past the largest bf16 to infinity, and NaN are in the first row.
#[test]
fn bf16_stores_round_to_nearest_even_as_candle_does() {
    let Some(gpu) = gpu_or_skip("bf16_stores_round_to_nearest_even_as_candle_does") else { return };
    let bf = |v: f32| half::bf16::from_f32(v).to_f32();
    let mut pairs: Vec<(f32, f32)> = vec![
        (1.0, 2f32.powi(-8)),                 // a tie, to even (down)
        (1.0 + 2f32.powi(-7), 2f32.powi(-8)), // a tie, to even (up)
        (-1.0, -(2f32.powi(-8))),             // negative tie
        (bf(3.38e38), 2f32.powi(119)),        // past the largest bf16: infinity
        (f32::NAN, 1.0),
        (f32::INFINITY, -1.0),
    ];
    let mut s = 17u64;
    while pairs.len() < 4 * 64 {
        s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let e1 = ((s >> 33) % 40) as i32 - 20;
        let e2 = e1 + ((s >> 45) % 17) as i32 - 8;
        let sign = if s >> 63 == 1 { -1.0 } else { 1.0 };
        let mant = |shift: u32| 1.0 + ((s >> shift) & 0x7f) as f32 / 128.0;
        pairs.push((bf(mant(10) * 2f32.powi(e1)), sign * bf(mant(20) * 2f32.powi(e2))));
    }
    let (y, b): (Vec<f32>, Vec<f32>) = pairs.iter().copied().unzip();
    let launch = wgsl::lowrank_add(4, 1, 64, 1.0, Factor::AsKept, None);
    let got = gpu.run(&launch, Precision::Bf16, 0, &[&y, &[1.0; 4], &b[..64]]);
    let b_row = |i: usize| b[i % 64];
    for (i, (&yv, &g)) in y.iter().zip(&got[0]).enumerate() {
        let want = half::bf16::from_f32(yv + b_row(i)).to_f32();
        let same = (g.is_nan() && want.is_nan()) || g.to_bits() == want.to_bits();
        assert!(same, "element {i}: {yv} + {} stored as {g}, Candle rounds to {want}", b_row(i));
    }
}

/// The training form: y + scale * x B^T from a given (rows, rank) x, at ranks 1, 8 and the kernel's largest, a
/// negative scale, and output widths past a workgroup's 256 threads; and with a dropout mask over the product
/// (the backward through a dropped-out adapter input), drawn in the kernel as the CPU draws it.
#[test]
fn lowrank_add_matches_a_matmul() {
    let Some(gpu) = gpu_or_skip("lowrank_add_matches_a_matmul") else { return };
    for (rows, rank, n_out, scale) in
        [(70, 8, 260usize, 2.0f32), (5, 1, 33, -0.5), (3, wgsl::LORA_MAX_RANK as usize, 300, 1.0)]
    {
        for (precision, tol) in precisions(gpu) {
            // bf16 rows are written a word (two elements) at a time, so its launches take even widths only
            // (`metal::row_fits`); the odd width runs in f32 and f16.
            let n_out = if precision == Precision::Bf16 { n_out.next_multiple_of(2) } else { n_out };
            let y = values(rows * n_out, 21, 1.0, precision);
            let x = values(rows * rank, 22, 1.0, precision);
            let bw = values(n_out * rank, 23, 0.1, precision);
            let (yt, xt) = (t(&y, &[rows, n_out]), t(&x, &[rows, rank]));
            // B stored both ways: (n_out, rank) rows, and (rank, n_out) rows (the same values transposed).
            let bt = t(&bw, &[n_out, rank]);
            let product = (xt.matmul(&bt.t().unwrap()).unwrap() * scale as f64).unwrap();
            let by_rank = flat(&bt.t().unwrap().contiguous().unwrap());
            // A mask that starts after a row, as a block of rows' does.
            let dropout = ops::Dropout::new(rows as u64, 0.25).rows_from(1, n_out);
            let mask = dropout.mask(&candle_core::Shape::from((rows, n_out)), DType::F32, &Device::Cpu).unwrap();
            for masked in [false, true] {
                let want = match masked {
                    false => (&yt + &product).unwrap(),
                    true => (&yt + (&product * &mask).unwrap()).unwrap(),
                };
                for (layout, b) in [(Factor::Transposed, &bw), (Factor::AsKept, &by_rank)] {
                    let launch =
                        wgsl::lowrank_add(rows, rank, n_out, scale, layout, masked.then(|| dropout.for_wgsl()));
                    let out = gpu.run(&launch, precision, 0, &[&y, &x, b]);
                    let what = format!("lowrank add rank {rank} {layout:?} {precision:?} masked {masked}");
                    assert_close(&what, &out[0], &flat(&want), tol);
                }
            }
        }
    }
}

/// Whether query `i` (at position q_offset + i) of batch row `bi` sees key `j`, by the definition (the blocked
/// attention's): causal, no older than `window` (0: none) and, for packed rows, not before the query's example start.
fn sees(bi: usize, i: usize, j: usize, s: &AttentionShape, starts: Option<&[u32]>) -> bool {
    let at = s.q_offset + i;
    j <= at && (s.window == 0 || at - j < s.window) && starts.is_none_or(|st| j >= st[bi * s.seq + i] as usize)
}

/// Causal GQA attention by the T x T definition, its mask built element by element from [`sees`], with Candle's
/// autograd for the gradients of sum(o * d_o). Computed in f64 (from the same inputs), so the reference's own
/// rounding stays far below the f32 tolerance at the longer rows (t = 129, d = 128).
fn attention_reference(s: &AttentionShape, starts: Option<&[u32]>, [q, k, v, d_o]: [&Tensor; 4]) -> [Tensor; 5] {
    let f64_of = |x: &Tensor| x.to_dtype(DType::F64).unwrap();
    let (q, k, v, d_o) = (f64_of(q), f64_of(k), f64_of(v), f64_of(d_o));
    let (qv, kv, vv) = (Var::from_tensor(&q).unwrap(), Var::from_tensor(&k).unwrap(), Var::from_tensor(&v).unwrap());
    let group = s.heads / s.kv_heads;
    let repeat = |x: &Tensor| {
        let (b, h, t, d) = x.dims4().unwrap();
        x.unsqueeze(2).unwrap().expand((b, h, group, t, d)).unwrap().reshape((b, h * group, t, d)).unwrap()
    };
    let (b, t, tk) = (s.batch, s.seq, s.q_offset + s.seq);
    let sees_at = |e: usize| sees(e / (t * tk), e / tk % t, e % tk, s, starts);
    let mask: Vec<f64> = (0..b * t * tk).map(|e| if sees_at(e) { 0.0 } else { -1e9 }).collect();
    let mask = Tensor::from_vec(mask, (b, 1, t, tk), &Device::Cpu).unwrap();
    let scores =
        (qv.matmul(&repeat(&kv).t().unwrap()).unwrap() * s.scale as f64).unwrap().broadcast_add(&mask).unwrap();
    let lse = scores.exp().unwrap().sum(D::Minus1).unwrap().log().unwrap();
    let p = candle_nn::ops::softmax(&scores, D::Minus1).unwrap();
    let o = p.matmul(&repeat(&vv)).unwrap();
    let grads = (o.clone() * &d_o).unwrap().sum_all().unwrap().backward().unwrap();
    let g = |x: &Var| grads.get(x).unwrap().clone();
    [o, lse, g(&qv), g(&kv), g(&vv)]
}

/// (seq, head_dim, heads, kv_heads): every head size the kernels are made for, sequences shorter than, equal to,
/// between and past the 64-row tiles (1, 7, 64, 100, 129, 200), and query groups of 1, 2 and 4 heads.
const ATTENTION_CASES: [(usize, usize, usize, usize); 9] = [
    (70, 64, 4, 2),
    (33, 32, 4, 2),
    (21, 16, 4, 2),
    (1, 64, 4, 2),
    (7, 16, 2, 2),
    (64, 32, 4, 1),
    (100, 96, 4, 2),
    (129, 128, 4, 1),
    (200, 64, 2, 2),
];

/// [`assert_close`], except against an exact zero (dq and dk of a one-token sequence, whose softmax is constant:
/// dP - delta cancels only up to rounding) each value must be within `tol` of 0, the other gradients being O(1).
fn assert_close_or_zero(what: &str, got: &[f32], want: &[f32], tol: f32) {
    if want.iter().all(|w| *w == 0.0) {
        let worst = got.iter().fold(0.0f32, |m, g| m.max(g.abs()));
        assert!(worst <= tol, "{what}: {worst:e} against an exact zero (tolerance {tol:e})");
        eprintln!("{what}: max absolute value {worst:e} against an exact zero (tolerance {tol:e})");
    } else {
        assert_close(what, got, want, tol);
    }
}

/// The three attention launches of `s` (with packed rows' `starts`, (batch, seq)) against [`attention_reference`],
/// in every precision the adapter runs; after a cache (`q_offset` > 0) the forward only, as only a prefill runs it;
/// `case` names the case in messages.
fn check_attention(gpu: &Gpu, s: &AttentionShape, starts: Option<&[u32]>, case: &str) {
    let (seq, head_dim, heads, kv_heads, b) = (s.seq, s.head_dim, s.heads, s.kv_heads, s.batch);
    let keys = s.q_offset + seq;
    assert_eq!(s.packed, starts.is_some());
    let (qn, kn) = (b * heads * seq * head_dim, b * kv_heads * keys * head_dim);
    let rs: Vec<f32> = starts.map_or(vec![0.0], |st| st.iter().map(|&x| x as f32).collect());
    for (precision, tol) in precisions(gpu) {
        let (q, k, v) =
            (values(qn, 13, 2.0, precision), values(kn, 14, 2.0, precision), values(kn, 15, 1.0, precision));
        let d_o = values(qn, 16, 1.0, precision);
        let (qs, kvs) = ([b, heads, seq, head_dim], [b, kv_heads, keys, head_dim]);
        let [o, lse, dq, dk, dv] =
            attention_reference(s, starts, [&t(&q, &qs), &t(&k, &kvs), &t(&v, &kvs), &t(&d_o, &qs)]);
        let hd = head_dim as u32;
        let fwd = gpu.run(&wgsl::attention_fwd(s), precision, hd, &[&q, &k, &v, &rs]);
        let what = |name: &str| {
            format!(
                "attention {name} t={seq} from {} d={head_dim} h={heads}/{kv_heads} {case} {precision:?}",
                s.q_offset
            )
        };
        assert_close(&what("o"), &fwd[0], &flat(&o), tol);
        assert_close(&what("lse"), &fwd[1], &flat(&lse), F32_TOL);
        if s.q_offset > 0 {
            continue;
        }
        // The backward reads the kernel's own o and lse, as training does.
        let bq = gpu.run(&wgsl::attention_bwd_dq(s), precision, hd, &[&q, &k, &v, &fwd[0], &d_o, &fwd[1], &rs]);
        let bkv = gpu.run(&wgsl::attention_bwd_dkdv(s), precision, hd, &[&q, &k, &v, &d_o, &fwd[1], &bq[1], &rs]);
        // dp - delta can cancel, so the gradients' error is relative to dp, not to what is left: allow 4x in f32
        // (NVIDIA's Vulkan driver put dk at d=128 1.2e-5 off, lavapipe 4e-6) and 8x in f16 and bf16, where o is
        // also stored in the half type before delta = sum(dO * o) is formed (f16's dk at t=100 d=96 is 4.0e-3 off,
        // the same to the digit from the earlier one-thread-per-row kernel).
        let btol = if precision == Precision::F32 { 4.0 * tol } else { 8.0 * tol };
        assert_close_or_zero(&what("dq"), &bq[0], &flat(&dq), btol);
        assert_close_or_zero(&what("dk"), &bkv[0], &flat(&dk), btol);
        assert_close(&what("dv"), &bkv[1], &flat(&dv), btol);
    }
}

fn shape(seq: usize, head_dim: usize, heads: usize, kv_heads: usize) -> AttentionShape {
    let scale = 1.0 / (head_dim as f32).sqrt();
    AttentionShape { batch: 2, heads, kv_heads, seq, q_offset: 0, head_dim, scale, window: 0, packed: false }
}

#[test]
fn attention_forward_and_gradients() {
    let Some(gpu) = gpu_or_skip("attention_forward_and_gradients") else { return };
    let covered: std::collections::BTreeSet<u32> = ATTENTION_CASES.iter().map(|c| c.1 as u32).collect();
    assert_eq!(covered.into_iter().collect::<Vec<_>>(), wgsl::ATTENTION_HEAD_DIMS, "a head size without a case");
    for (seq, head_dim, heads, kv_heads) in ATTENTION_CASES {
        check_attention(gpu, &shape(seq, head_dim, heads, kv_heads), None, "causal");
    }
}

/// Packed rows' starts (batch rows of `seq`) for examples of the given lengths end to end in each row; the rest
/// of a row, if any, is one more span (the padding, as `data::packing` makes it).
fn packed_starts(rows: &[&[usize]], seq: usize) -> Vec<u32> {
    let mut starts = Vec::new();
    for lengths in rows {
        let mut at = 0;
        for &len in lengths.iter().chain(std::iter::once(&seq)) {
            let len = len.min(seq - at);
            starts.extend(std::iter::repeat_n(at as u32, len));
            at += len;
        }
    }
    starts
}

/// Sliding windows narrower than, as wide as and wider than a 64-key tile, at several head sizes and groups.
#[test]
fn attention_with_a_sliding_window() {
    let Some(gpu) = gpu_or_skip("attention_with_a_sliding_window") else { return };
    // (seq, head_dim, heads, kv_heads, window)
    for (seq, head_dim, heads, kv_heads, window) in [
        (150, 64, 4, 2, 5),
        (200, 16, 4, 1, 64),
        (200, 128, 2, 2, 100),
        (129, 32, 4, 2, 65),
        (70, 96, 4, 4, 1),
        (40, 64, 4, 2, 100),
    ] {
        let s = AttentionShape { window, ..shape(seq, head_dim, heads, kv_heads) };
        check_attention(gpu, &s, None, &format!("window {window}"));
    }
}

/// A prefill after a cache: queries from position q_offset against the cached keys and their own, one query and
/// many, cache lengths inside a tile, on a tile's edge and past several tiles, with and without a sliding window.
#[test]
fn attention_after_a_cache() {
    let Some(gpu) = gpu_or_skip("attention_after_a_cache") else { return };
    // (q_offset, seq, head_dim, heads, kv_heads, window)
    for (q_offset, seq, head_dim, heads, kv_heads, window) in [
        (9, 1, 64, 4, 2, 0),
        (64, 64, 32, 4, 1, 0),
        (100, 37, 16, 4, 2, 0),
        (130, 70, 128, 2, 2, 0),
        (1, 129, 96, 4, 2, 0),
        (150, 20, 64, 4, 2, 50),
        (63, 90, 32, 4, 4, 64),
    ] {
        let s = AttentionShape { q_offset, window, ..shape(seq, head_dim, heads, kv_heads) };
        check_attention(gpu, &s, None, &format!("after a cache, window {window}"));
    }
}

/// Packed rows: several examples a row, of one token, inside a tile, across tile edges and starting at one, with
/// and without a window.
#[test]
fn attention_over_packed_rows() {
    let Some(gpu) = gpu_or_skip("attention_over_packed_rows") else { return };
    // (seq, head_dim, heads, kv_heads, window, example lengths of each of the two rows)
    type Case = (usize, usize, usize, usize, usize, &'static [&'static [usize]]);
    let cases: [Case; 5] = [
        (150, 64, 4, 2, 0, &[&[1, 30, 1, 70, 1, 47], &[64, 1, 65, 20]]),
        (200, 16, 4, 1, 0, &[&[100, 3, 1, 1, 90], &[13, 51, 64, 1, 40]]),
        (129, 128, 2, 2, 0, &[&[129], &[1, 1, 1, 60, 66]]),
        (100, 32, 4, 2, 9, &[&[40, 30], &[16, 16, 16, 22]]),
        (180, 96, 4, 2, 70, &[&[1, 120, 59], &[90, 90]]),
    ];
    for (seq, head_dim, heads, kv_heads, window, rows) in cases {
        let starts = packed_starts(rows, seq);
        assert_eq!(starts.len(), 2 * seq);
        let s = AttentionShape { window, packed: true, ..shape(seq, head_dim, heads, kv_heads) };
        check_attention(gpu, &s, Some(&starts), &format!("packed {rows:?} window {window}"));
    }
}

/// Seconds per launch of `launch` on `inputs`: a timed warm-up launch, then as many launches as fill about half a
/// second (1 to 20, so a CPU adapter such as lavapipe finishes) in one submission. `None` where a binding is larger
/// than the adapter lets one storage binding be (lavapipe's 128 MiB against the f32 logits).
fn time_launch(
    gpu: &Gpu,
    launch: &wgsl::Launch,
    precision: Precision,
    head_dim: u32,
    inputs: &[&[f32]],
) -> Option<f64> {
    let max = gpu.device.limits().max_storage_buffer_binding_size as usize;
    let bytes = |b: &wgsl::Binding| b.len * if b.elem == wgsl::Elem::Et { precision.size_in_bytes() } else { 4 };
    if launch.bindings.iter().any(|b| bytes(b) > max) {
        return None;
    }
    let prepared = gpu.prepare_values(launch, precision, head_dim, inputs);
    let start = std::time::Instant::now();
    prepared.dispatch(1);
    let iters = (0.5 / start.elapsed().as_secs_f64()).clamp(1.0, 20.0) as usize;
    let start = std::time::Instant::now();
    prepared.dispatch(iters);
    Some(start.elapsed().as_secs_f64() / iters as f64)
}

/// The kernels at the Llama-3.2-1B shapes (4 x 1024 tokens, hidden 2048, vocab 128256, 32 heads / 8 kv heads of
/// 64), timed through wgpu on whatever adapter it finds: the proxy for their speed on a GPU, to set beside the
/// CUDA kernels' times. `cargo test --release --features wgpu-kernels --test wgsl_kernels -- --ignored --nocapture
/// bench_wgsl`.
#[test]
#[ignore]
fn bench_wgsl_1b_shapes() {
    let Some(gpu) = gpu_or_skip("bench_wgsl_1b_shapes") else { return };
    println!("adapter: {}", gpu.name);
    let (rows, hidden, ce_rows, vocab, rank) = (4 * 1024, 2048, 1024, 128256, 8);
    let s = AttentionShape {
        batch: 4,
        heads: 32,
        kv_heads: 8,
        seq: 1024,
        q_offset: 0,
        head_dim: 64,
        scale: 0.125,
        window: 0,
        packed: false,
    };
    let n = rows * hidden;
    let big = values(n, 1, 1.0, Precision::F16);
    let big2 = values(n, 2, 1.0, Precision::F16);
    let big3 = values(n, 3, 1.0, Precision::F16);
    let w = values(hidden, 4, 1.0, Precision::F16);
    let cs = values(1024 * 32, 5, 1.0, Precision::F16);
    let logits = values(ce_rows * vocab, 6, 4.0, Precision::F16);
    let targets: Vec<f32> = (0..ce_rows).map(|i| (i * 97 % vocab) as f32).collect();
    let a = values(rank * hidden, 7, 0.1, Precision::F16);
    let (qn, kvn) = (4 * 32 * 1024 * 64, 4 * 8 * 1024 * 64);
    let (q, k, v, o, d_o) = (&big[..qn], &big2[..kvn], &big3[..kvn], &big2[..qn], &big3[..qn]);
    let rowstat = vec![1.0f32; 4 * 32 * 1024];
    let unpacked = [0.0f32];
    let (win, packed) = (AttentionShape { window: 256, ..s }, AttentionShape { packed: true, ..s });
    let starts: Vec<f32> = (0..4 * 1024).map(|i| (i % 1024 / 256 * 256) as f32).collect();
    for (precision, _) in precisions(gpu) {
        let mut cases: Vec<(String, wgsl::Launch, Vec<&[f32]>, u32)> = vec![
            ("rms_norm fwd 4x1024x2048".into(), wgsl::rms_norm_fwd(rows, hidden, 1e-5), vec![&big, &w], 0),
            ("rms_norm bwd dx 4x1024x2048".into(), wgsl::rms_norm_bwd_dx(rows, hidden, 1e-5), vec![&big, &w, &big2], 0),
            ("rope 4x32x1024x64".into(), wgsl::rope(4 * 32 * 1024, 1024, 32, 1.0, 1), vec![&big, &cs, &cs], 0),
            ("swiglu fwd 4x1024x2048".into(), wgsl::swiglu_fwd(n), vec![&big, &big2], 0),
            ("swiglu bwd 4x1024x2048".into(), wgsl::swiglu_bwd(n), vec![&big, &big2, &big3], 0),
            (
                "cross_entropy 1024 x 128256".into(),
                wgsl::cross_entropy(ce_rows, vocab, 1.0 / 1024.0),
                vec![&logits, &targets],
                0,
            ),
            (
                "lora epilogue 4096x2048->2048 r8".into(),
                wgsl::lora_epilogue(rows, hidden, hidden, rank, 2.0, Factor::Transposed, Factor::Transposed),
                vec![&big2, &big, &a, &a],
                0,
            ),
        ];
        // Causal, then a 256-key sliding window, then packed rows of four 256-token examples: fully masked tiles are
        // skipped, so those visit 70 and 40 of the causal 136 (query tile, key tile) pairs per head.
        for (variant, shape, starts) in
            [("", s, &unpacked[..]), (" window 256", win, &unpacked), (" packed 4x256", packed, &starts)]
        {
            let at = |what: &str| format!("attention {what} 4x1024 h32/8 d64{variant}");
            cases.push((at("fwd"), wgsl::attention_fwd(&shape), vec![q, k, v, starts], 64));
            cases.push((at("bwd dq"), wgsl::attention_bwd_dq(&shape), vec![q, k, v, o, d_o, &rowstat, starts], 64));
            let dkdv = vec![q, k, v, d_o, &rowstat, &rowstat, starts];
            cases.push((at("bwd dkdv"), wgsl::attention_bwd_dkdv(&shape), dkdv, 64));
        }
        for (name, launch, inputs, head_dim) in cases {
            match time_launch(gpu, &launch, precision, head_dim, &inputs) {
                Some(secs) => println!("BENCH {precision:?} {name}: {:.3} ms", secs * 1e3),
                None => println!("BENCH {precision:?} {name}: skipped, a binding exceeds the adapter's limit"),
            }
        }
    }
}
