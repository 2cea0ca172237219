//! The fused CUDA optimizer (AdamW in place, the gradient norm) against the composed one on the CPU: the same
//! parameters and gradients over twelve steps with weight decay and clipping coefficients, then the parameters,
//! both moments and the norms compared; and the head + loss (one cross-entropy kernel per chunk of rows) against
//! the CPU's (built with `--features cuda`; skipped without a GPU).
#![cfg(feature = "cuda")]

use candle_core::{DType, Device, Tensor, Var};
use metal_candle::engine::ops::head_nll;
use metal_candle::engine::train::optimizer::{clip_coefficient, grad_norm, AdamW, AdamWParams};

/// A (rows, cols) f32 tensor on the CPU of uniform values with standard deviation `std`, the same for a `seed` in
/// every run (Candle's CPU RNG cannot be seeded; a tolerance on random draws would fail now and then).
fn seeded(shape: (usize, usize), std: f32, seed: u64) -> Tensor {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let half_width = std * 3f32.sqrt();
    let values: Vec<f32> = (0..shape.0 * shape.1).map(|_| (rng.random::<f32>() * 2.0 - 1.0) * half_width).collect();
    Tensor::from_vec(values, shape, &Device::Cpu).unwrap()
}

fn max_rel_diff(a: &Tensor, b: &Tensor) -> f32 {
    let a: Vec<f32> = a.to_device(&Device::Cpu).unwrap().flatten_all().unwrap().to_vec1().unwrap();
    let b: Vec<f32> = b.to_device(&Device::Cpu).unwrap().flatten_all().unwrap().to_vec1().unwrap();
    let scale = a.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-30);
    a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max) / scale
}

#[test]
fn fused_adamw_and_grad_norm_match_the_composed_cpu_update() {
    let Ok(cuda) = Device::new_cuda(0) else {
        eprintln!("no CUDA device: skipped");
        return;
    };
    let cpu = Device::Cpu;
    let shapes = [(8usize, 2048usize), (512, 8), (8, 96), (1, 3)];
    let initial: Vec<Tensor> = shapes.iter().zip(0..).map(|(&s, i)| seeded(s, 0.1, i)).collect();
    let params = |device: &Device| -> Vec<(String, Var)> {
        initial
            .iter()
            .enumerate()
            .map(|(i, t)| (format!("p{i}"), Var::from_tensor(&t.to_device(device).unwrap()).unwrap()))
            .collect()
    };
    let hp = AdamWParams { weight_decay: 0.01, ..AdamWParams::default() };
    let (mut on_cpu, mut on_cuda) = (AdamW::new(params(&cpu), hp).unwrap(), AdamW::new(params(&cuda), hp).unwrap());
    for step in 0..12 {
        let grads: Vec<Tensor> = shapes.iter().zip(0..).map(|(&s, i)| seeded(s, 1.0, 100 * (step + 1) + i)).collect();
        let grads_cuda: Vec<Tensor> = grads.iter().map(|g| g.to_device(&cuda).unwrap()).collect();
        let (norm_cpu, norm_cuda) = (grad_norm(&grads).unwrap(), grad_norm(&grads_cuda).unwrap());
        assert!((norm_cpu - norm_cuda).abs() <= 1e-5 * norm_cpu, "step {step}: norm {norm_cpu} vs {norm_cuda}");
        let max_norm = if step % 2 == 0 { Some(norm_cpu * 0.5) } else { None };
        let scale = clip_coefficient(norm_cpu, max_norm);
        on_cpu.step(&grads, 1e-2, scale).unwrap();
        on_cuda.step(&grads_cuda, 1e-2, scale).unwrap();
    }
    for ((name, a), (_, b)) in on_cpu.params().iter().zip(on_cuda.params()) {
        let d = max_rel_diff(a.as_tensor(), b.as_tensor());
        println!("{name}: max relative difference {d:.2e}");
        assert!(d <= 2e-5, "{name}: {d}");
    }
    let (state_cpu, state_cuda) = (on_cpu.state_tensors(), on_cuda.state_tensors());
    for (key, a) in &state_cpu {
        let d = max_rel_diff(a, &state_cuda[key]);
        assert!(d <= 2e-5, "{key}: {d}");
        assert_eq!(a.dtype(), DType::F32);
    }
    // The moments moved: the test would not notice an update that never ran.
    let moved = max_rel_diff(&initial[0], on_cuda.params()[0].1.as_tensor());
    assert!(moved > 1e-3, "the parameters did not move ({moved})");
}

/// Vocabularies a multiple of eight take the kernel's 16-byte path, others its element path; a row whose target
/// holds the largest logit and rows of tied logits check the online max-and-sum pass.
#[test]
fn head_loss_kernel_matches_the_cpu_in_f32_and_bf16() {
    let Ok(cuda) = Device::new_cuda(0) else {
        eprintln!("no CUDA device: skipped");
        return;
    };
    let cpu = Device::Cpu;
    for (rows, hidden, vocab) in [(37usize, 64usize, 4096usize), (9, 32, 1001), (3, 16, 8)] {
        let x = Tensor::randn(0f32, 1.0, (rows, hidden), &cpu).unwrap();
        let mut head = Tensor::randn(0f32, 0.5, (vocab, hidden), &cpu).unwrap();
        if vocab == 8 {
            head = head.zeros_like().unwrap(); // every logit tied at zero
        }
        let targets: Vec<u32> = (0..rows).map(|i| ((i * 7919) % vocab) as u32).collect();
        let want = head_nll(&x, &head, &targets, Some(0.25)).unwrap();
        let want_grad = want.grad_hidden.as_ref().unwrap();
        for (dtype, tol) in [(DType::F32, 1e-4f32), (DType::BF16, 3e-2)] {
            let on = |t: &Tensor| t.to_device(&cuda).unwrap().to_dtype(dtype).unwrap();
            let got = head_nll(&on(&x), &on(&head), &targets, Some(0.25)).unwrap();
            let grad = got.grad_hidden.unwrap().to_dtype(DType::F32).unwrap();
            let nll_err = ((got.nll_sum - want.nll_sum) / want.nll_sum.abs().max(1e-9)).abs() as f32;
            let grad_err = max_rel_diff(want_grad, &grad);
            eprintln!(
                "rows {rows} vocab {vocab} {dtype:?}: nll {} vs {}, grad error {grad_err:.1e}",
                got.nll_sum, want.nll_sum
            );
            assert!(nll_err < tol, "nll {} vs {} ({dtype:?}, vocab {vocab})", got.nll_sum, want.nll_sum);
            assert!(grad_err < tol, "gradient error {grad_err} ({dtype:?}, vocab {vocab})");
        }
    }
}
