//! The fused CUDA optimizer (AdamW in place, the gradient norm) against the composed one on the CPU: the same
//! parameters and gradients over twelve steps with weight decay and clipping coefficients, then the parameters,
//! both moments and the norms compared (built with `--features cuda`; skipped without a GPU).
#![cfg(feature = "cuda")]

use candle_core::{DType, Device, Tensor, Var};
use metal_candle::engine::train::optimizer::{clip_coefficient, grad_norm, AdamW, AdamWParams};

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
    let initial: Vec<Tensor> = shapes.iter().map(|&s| Tensor::randn(0f32, 0.1, s, &cpu).unwrap()).collect();
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
        let grads: Vec<Tensor> = shapes.iter().map(|&s| Tensor::randn(0f32, 1.0, s, &cpu).unwrap()).collect();
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
