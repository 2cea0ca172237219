//! Tests of the projection's training math (linear.rs): the DoRA backward against finite differences of PEFT's
//! forward, written out in f64 with the row norm held fixed.

use super::*;
use candle_core::{Device, Var};

fn randn(shape: (usize, usize), std: f64) -> Tensor {
    Tensor::randn(0f64, std, shape, &Device::Cpu).unwrap()
}

/// PEFT's DoRA forward with the row norm `norm` held fixed (as its backward treats it), all in f64:
/// `x W^T + b + (g - 1) * xd W^T + g * s * xd A B`, `g = m / norm`, `xd` = `mask * x` (mask None: `x`).
fn reference(p: &[Tensor; 4], w: &Tensor, bias: &Tensor, norm: &Tensor, mask: Option<&Tensor>, s: f64) -> Tensor {
    let [a, b, m, x] = p;
    let xd = mask.map_or_else(|| x.clone(), |mask| (x * mask).unwrap());
    let g = (m / norm).unwrap();
    let base = x.matmul(&w.t().unwrap()).unwrap().broadcast_add(bias).unwrap();
    let frozen_d = xd.matmul(&w.t().unwrap()).unwrap().broadcast_mul(&(&g - 1.0).unwrap()).unwrap();
    let lora = (xd.matmul(a).unwrap().matmul(b).unwrap() * s).unwrap().broadcast_mul(&g).unwrap();
    ((base + frozen_d).unwrap() + lora).unwrap()
}

/// The DoRA projection's output equals PEFT's forward, and its hand-written backward (dA, dB, dm and dx)
/// equals central finite differences of that forward with the norm held fixed (PEFT detaches it), with and
/// without adapter dropout; inference equals training without dropout.
#[test]
fn dora_backward_matches_finite_differences_of_the_detached_norm_forward() {
    let (rows, d_in, d_out, r, s) = (5, 6, 4, 2, 1.5);
    for p_drop in [0.0f32, 0.3] {
        let w = randn((d_out, d_in), 0.5);
        let bias = Tensor::randn(0f64, 0.1, d_out, &Device::Cpu).unwrap();
        let a = Var::from_tensor(&randn((d_in, r), 0.4).to_dtype(DType::F32).unwrap()).unwrap();
        let b = Var::from_tensor(&randn((r, d_out), 0.4).to_dtype(DType::F32).unwrap()).unwrap();
        let w_norm = row_norms(&w).unwrap().to_dtype(DType::F32).unwrap();
        let noise = (Tensor::randn(0f32, 0.1, d_out, &Device::Cpu).unwrap() + 1.0).unwrap();
        let m = Var::from_tensor(&(w_norm * noise).unwrap()).unwrap();
        let mut lin = Linear::new(w.clone(), Some(bias.clone()));
        lin.adapter = Some(LoraAdapter {
            a: a.clone(),
            b: b.clone(),
            scale: s,
            dropout: p_drop,
            dropout_seed: Default::default(),
            compute: Default::default(),
            dora: Some(Dora::new(m.clone())),
        });
        let adapter = lin.adapter.clone().unwrap();
        let x = randn((rows, d_in), 1.0);
        let seed = adapter.dropout_seed.load(std::sync::atomic::Ordering::Relaxed);
        let (y, tape) = lin.forward_train(&x, true).unwrap();
        let mask =
            (p_drop > 0.0).then(|| ops::Dropout::new(seed, p_drop).mask(x.shape(), DType::F64, &Device::Cpu).unwrap());

        let f64_of = |v: &Var| v.as_tensor().to_dtype(DType::F64).unwrap();
        let params = [f64_of(&a), f64_of(&b), f64_of(&m), x.clone()];
        let delta = (params[0].matmul(&params[1]).unwrap().t().unwrap() * s).unwrap();
        let norm = row_norms(&(&w + delta).unwrap()).unwrap();
        let want = reference(&params, &w, &bias, &norm, mask.as_ref(), s);
        let max_diff = |a: &Tensor, b: &Tensor| -> f64 {
            (a - b).unwrap().abs().unwrap().flatten_all().unwrap().max(0).unwrap().to_scalar().unwrap()
        };
        assert!(max_diff(&y, &want) < 1e-6, "p {p_drop}: forward {}", max_diff(&y, &want));
        if p_drop == 0.0 {
            assert!(max_diff(&lin.forward(&x).unwrap(), &y) < 1e-9, "inference = training without dropout");
        }

        let dy = randn((rows, d_out), 1.0);
        let mut grads = Gradients::default();
        let dx = lin.backward(&tape, &dy, &mut grads, InputGrad::New).unwrap().unwrap();
        let ours = [
            grads.get(a.as_tensor()).unwrap().to_dtype(DType::F64).unwrap(),
            grads.get(b.as_tensor()).unwrap().to_dtype(DType::F64).unwrap(),
            grads.get(m.as_tensor()).unwrap().to_dtype(DType::F64).unwrap(),
            dx,
        ];
        let loss = |p: &[Tensor; 4]| -> f64 {
            (reference(p, &w, &bias, &norm, mask.as_ref(), s) * &dy).unwrap().sum_all().unwrap().to_scalar().unwrap()
        };
        let eps = 1e-5;
        for (which, name) in ["A", "B", "m", "x"].iter().enumerate() {
            let flat: Vec<f64> = params[which].flatten_all().unwrap().to_vec1().unwrap();
            let got: Vec<f64> = ours[which].flatten_all().unwrap().to_vec1().unwrap();
            assert!(got.iter().any(|g| g.abs() > 1e-3), "p {p_drop}: {name} gradient is zero");
            for k in 0..flat.len() {
                let at = |h: f64| {
                    let mut moved = flat.clone();
                    moved[k] += h;
                    let mut p = params.clone();
                    p[which] = Tensor::from_vec(moved, params[which].shape(), &Device::Cpu).unwrap();
                    loss(&p)
                };
                let fd = (at(eps) - at(-eps)) / (2.0 * eps);
                let tol = 1e-5 + 1e-4 * fd.abs();
                assert!(
                    (got[k] - fd).abs() < tol,
                    "p {p_drop}: d{name}[{k}] ours {} vs finite differences {fd}",
                    got[k]
                );
            }
        }
    }
}
