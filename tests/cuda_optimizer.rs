//! The fused CUDA optimizer (multi-tensor AdamW in place, the gradient norm, clipping and the skip of a non-finite
//! step, all on the device) against the composed one on the CPU: the same parameters and gradients over twelve
//! steps with weight decay and clipping, then the parameters, both moments, the norms and losses compared; a
//! non-finite loss or gradient leaves everything as it was; the head + loss (one cross-entropy kernel per chunk of
//! rows) against the CPU's; adapter dropout applied on the GPU equal to the CPU's masks, element for element; the
//! batched cast of the adapters equal to each one's own cast; training steps begun ahead of the previous step's
//! read equal to steps taken one by one; and gathered rows equal to index_select (built with `--features cuda`;
//! skipped without a GPU).
#![cfg(feature = "cuda")]

mod common;

use candle_core::{DType, Device, Tensor, Var};
use common::cuda_or_skip;
use metal_candle::engine::ops::{self, head_nll, Dropout, Scalar};
use metal_candle::engine::train::optimizer::{grad_norm, AdamW, AdamWParams};

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
    let Some(cuda) = cuda_or_skip() else { return };
    let cpu = Device::Cpu;
    // 30 parameters: two launches of the multi-tensor kernels (24 per launch), lengths from 3 to 65,536.
    let base = [(8usize, 2048usize), (512, 8), (8, 96), (1, 3), (8192, 8)];
    let shapes: Vec<(usize, usize)> = (0..30).map(|i| base[i % base.len()]).collect();
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
    for step in 0..12u64 {
        let grads: Vec<Tensor> = shapes.iter().zip(0..).map(|(&s, i)| seeded(s, 1.0, 100 * (step + 1) + i)).collect();
        let grads_cuda: Vec<Tensor> = grads.iter().map(|g| g.to_device(&cuda).unwrap()).collect();
        let norm = grad_norm(&grads).unwrap();
        // Clipping on every other step, and a loss that the CUDA step keeps on the device.
        let max_norm = if step % 2 == 0 { Some(norm * 0.5) } else { None };
        let loss = 2.5 + step as f64;
        let device_loss = Scalar::device_sum(&[Tensor::new(loss as f32, &cuda).unwrap()]).unwrap();
        let a = on_cpu.guarded_step(&grads, 1e-2, max_norm, &Scalar::Host(loss)).unwrap();
        let b = on_cuda.guarded_step(&grads_cuda, 1e-2, max_norm, &device_loss).unwrap();
        assert!(a.applied && b.applied, "step {step}: {a:?} {b:?}");
        assert!((a.grad_norm - b.grad_norm).abs() <= 1e-5 * a.grad_norm, "step {step}: norm {a:?} vs {b:?}");
        assert!((a.loss - b.loss).abs() <= 1e-6 * a.loss, "step {step}: loss {a:?} vs {b:?}");
    }
    assert_eq!((on_cpu.step, on_cuda.step), (12, 12));
    for ((name, a), (_, b)) in on_cpu.params().iter().zip(on_cuda.params()) {
        let d = max_rel_diff(a.as_tensor(), b.as_tensor());
        assert!(d <= 2e-5, "{name}: {d}");
    }
    let (state_cpu, state_cuda) = (on_cpu.state_tensors().unwrap(), on_cuda.state_tensors().unwrap());
    for (key, a) in &state_cpu {
        let d = max_rel_diff(a, &state_cuda[key]);
        assert!(d <= 2e-5, "{key}: {d}");
        assert_eq!(a.dtype(), DType::F32);
    }
    // The moments moved: the test would not notice an update that never ran.
    for (i, (_, p)) in on_cuda.params().iter().enumerate() {
        let moved = max_rel_diff(&initial[i], p.as_tensor());
        assert!(moved > 1e-3, "parameter {i} did not move ({moved})");
    }
}

/// A step whose loss or gradient norm is not finite changes nothing, on the device as on the host, and says so.
#[test]
fn fused_step_skips_a_non_finite_loss_or_gradient() {
    let Some(cuda) = cuda_or_skip() else { return };
    let initial = seeded((8, 64), 0.1, 1);
    let mut opt = AdamW::new(
        vec![("p".into(), Var::from_tensor(&initial.to_device(&cuda).unwrap()).unwrap())],
        AdamWParams::default(),
    )
    .unwrap();
    let grad = seeded((8, 64), 1.0, 2).to_device(&cuda).unwrap();
    let mut bad_grad = seeded((8, 64), 1.0, 2).to_vec2::<f32>().unwrap();
    bad_grad[3][5] = f32::NAN;
    let bad_grad = Tensor::new(bad_grad, &cuda).unwrap();
    let on_device = |v: f32| Scalar::device_sum(&[Tensor::new(v, &cuda).unwrap()]).unwrap();
    for (what, g, loss) in [
        ("infinite loss", &grad, on_device(f32::INFINITY)),
        ("NaN loss", &grad, on_device(f32::NAN)),
        ("NaN gradient", &bad_grad, on_device(1.0)),
    ] {
        let out = opt.guarded_step(std::slice::from_ref(g), 1e-2, Some(1.0), &loss).unwrap();
        assert!(!out.applied, "{what}: {out:?}");
        assert_eq!(opt.step, 0, "{what}");
        assert_eq!(max_rel_diff(&initial, opt.params()[0].1.as_tensor()), 0.0, "{what}: the parameter changed");
    }
    let out = opt.guarded_step(std::slice::from_ref(&grad), 1e-2, Some(1.0), &on_device(1.0)).unwrap();
    assert!(out.applied && opt.step == 1, "{out:?}");
    assert!(max_rel_diff(&initial, opt.params()[0].1.as_tensor()) > 1e-3);
}

/// Vocabularies a multiple of eight take the kernel's 16-byte path, others its element path; a row whose target
/// holds the largest logit and rows of tied logits check the online max-and-sum pass; a thousand rows, the
/// chunk sizes of real heads.
#[test]
fn head_loss_kernel_matches_the_cpu_in_f32_and_bf16() {
    let Some(cuda) = cuda_or_skip() else { return };
    let cpu = Device::Cpu;
    for (rows, hidden, vocab) in
        [(37usize, 64usize, 4096usize), (9, 32, 1001), (3, 16, 8), (1100, 16, 4096), (300, 8, 999)]
    {
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
            let (got_nll, want_nll) = (got.nll_sum.value().unwrap(), want.nll_sum.value().unwrap());
            let nll_err = ((got_nll - want_nll) / want_nll.abs().max(1e-9)).abs() as f32;
            let grad_err = max_rel_diff(want_grad, &grad);
            eprintln!("rows {rows} vocab {vocab} {dtype:?}: nll {got_nll} vs {want_nll}, grad error {grad_err:.1e}");
            assert!(nll_err < tol, "nll {got_nll} vs {want_nll} ({dtype:?}, vocab {vocab})");
            assert!(grad_err < tol, "gradient error {grad_err} ({dtype:?}, vocab {vocab})");
        }
    }
}

/// A mask is a function of its seed alone: the GPU's one-pass `apply` (the mask never written) equals the input
/// times the mask the CPU draws, in f32 and bf16, for lengths that are not multiples of anything. The input has no
/// zeros, so every kept or dropped element of the GPU's mask is checked against the CPU's.
#[test]
fn dropout_applied_on_the_gpu_equals_the_cpus_mask() {
    let Some(cuda) = cuda_or_skip() else { return };
    let host = |t: &Tensor| -> Vec<f32> {
        t.to_dtype(DType::F32).unwrap().to_device(&Device::Cpu).unwrap().flatten_all().unwrap().to_vec1().unwrap()
    };
    for (shape, p, seed) in [((4096usize, 2048usize), 0.05f32, 3u64), ((37, 1001), 0.5, 99), ((1, 3), 0.1, 7)] {
        let drop = Dropout::new(seed, p);
        for dtype in [DType::F32, DType::BF16] {
            let mask = drop.mask(&shape.into(), dtype, &Device::Cpu).unwrap();
            assert_eq!(mask.dtype(), dtype);
            let mask_values = host(&mask);
            let kept = mask_values.iter().filter(|&&v| v != 0.0).count() as f64 / mask_values.len() as f64;
            if mask_values.len() > 10_000 {
                assert!((kept - (1.0 - p as f64)).abs() < 0.01, "{shape:?}: kept {kept}");
            }
            let x = (seeded(shape, 1.0, seed).abs().unwrap() + 0.5)
                .unwrap()
                .to_dtype(dtype)
                .unwrap()
                .to_device(&cuda)
                .unwrap();
            let applied = host(&drop.apply(&x).unwrap());
            let product = host(&(&x * &mask.to_device(&cuda).unwrap()).unwrap());
            let differ = applied.iter().zip(&product).filter(|(a, b)| a != b).count();
            assert_eq!(
                differ, 0,
                "{shape:?} {dtype:?} dropout {p}: apply differs from the CPU's mask in {differ} elements"
            );
        }
    }
}

/// The batched cast (`ops::cast_many`, one launch per 24 tensors) equals each tensor's own cast bit for bit, in bf16
/// and f16, over 30 tensors (two launches) of lengths that are not multiples of anything, one of them a view that
/// starts inside its storage.
#[test]
fn batched_cast_equals_each_tensors_own_cast() {
    let Some(cuda) = cuda_or_skip() else { return };
    let mut tensors: Vec<Tensor> = (0..29u64)
        .map(|i| seeded((3 + i as usize * 37, 1 + (i as usize % 5)), 3.0, i).to_device(&cuda).unwrap())
        .collect();
    let big = seeded((64, 33), 3.0, 99).to_device(&cuda).unwrap();
    tensors.push(big.narrow(0, 7, 50).unwrap());
    let refs: Vec<&Tensor> = tensors.iter().collect();
    for dtype in [DType::BF16, DType::F16] {
        let cast = ops::cast_many(&refs, dtype).unwrap();
        assert_eq!(cast.len(), tensors.len());
        for (i, (got, t)) in cast.iter().zip(&tensors).enumerate() {
            assert_eq!(got.dtype(), dtype);
            assert_eq!(got.dims(), t.dims(), "tensor {i}");
            let bits = |x: &Tensor| x.to_dtype(DType::F32).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
            assert_eq!(bits(got), bits(&t.to_dtype(dtype).unwrap()), "tensor {i} ({dtype:?})");
        }
    }
}

#[test]
fn steps_begun_ahead_equal_steps_taken_one_by_one() {
    // The trainer and the benchmark begin step N+1 (its passes queued behind step N's update) before they read
    // step N. On the GPU that must train exactly as steps taken one at a time: the same losses, norms and adapters,
    // bit for bit, with dropout (seeded per step) and the fused update.
    use metal_candle::engine::bench::random_batch;
    use metal_candle::engine::lora;
    use metal_candle::engine::train::StepRunner;
    let Some(cuda) = cuda_or_skip() else { return };
    let base =
        metal_candle::engine::model::load_model(std::path::Path::new("tests/fixtures/tiny-llama"), &cuda, DType::BF16)
            .unwrap();
    let settings = common::all_linear_lora(0.1);
    let new_runner = || {
        let mut model = base.model.clone();
        lora::detach_adapters(&mut model);
        let params = lora::attach_new_adapters(&mut model, &settings, 3).unwrap();
        StepRunner::new(model, &params, 0.01, Some(1.0), 7).unwrap()
    };
    let batch = |i: usize| [random_batch(base.config.vocab_size, 2, 40, 50 + i as u64)];
    let lr = |i: usize| 2e-3 * (1.0 + i as f64);
    let steps = 6;
    // A few milliseconds of GPU work queued before each update keeps the GPU behind the host, so a read that did
    // not wait for its step's copy would see the previous step's values (or, on the first step, none).
    let busy = Tensor::ones((4096, 4096), DType::F32, &cuda).unwrap();
    let keep_gpu_busy = || drop(busy.matmul(&busy).unwrap());
    let mut one_by_one = new_runner();
    let sequential: Vec<(f64, f64)> = (0..steps)
        .map(|i| {
            let begun = one_by_one.begin(&batch(i)).unwrap();
            keep_gpu_busy();
            let queued = one_by_one.queue_update(begun, lr(i)).unwrap();
            one_by_one.finish(queued).unwrap()
        })
        .collect();
    let mut overlapped = new_runner();
    let mut ahead = Some(overlapped.begin(&batch(0)).unwrap());
    let mut pipelined = Vec::new();
    for i in 0..steps {
        keep_gpu_busy();
        let queued = overlapped.queue_update(ahead.take().unwrap(), lr(i)).unwrap();
        if i + 1 < steps {
            ahead = Some(overlapped.begin(&batch(i + 1)).unwrap());
        }
        pipelined.push(overlapped.finish(queued).unwrap());
    }
    assert_eq!(pipelined, sequential, "(loss, norm) per step");
    // Each step read is its own: finite, and the losses of six different batches all differ.
    assert!(sequential.iter().all(|(loss, norm)| loss.is_finite() && *loss > 0.0 && *norm > 0.0), "{sequential:?}");
    let mut losses: Vec<u64> = sequential.iter().map(|(loss, _)| loss.to_bits()).collect();
    losses.dedup();
    assert_eq!(losses.len(), steps, "a step read the previous step's statistics: {sequential:?}");
    for ((name, a), (_, b)) in one_by_one.optimizer.params().iter().zip(overlapped.optimizer.params()) {
        assert_eq!(max_rel_diff(a.as_tensor(), b.as_tensor()), 0.0, "{name}");
    }
}

#[test]
fn gathered_rows_equal_index_select() {
    // The embedding's lookup and the head's target rows: 16-byte copies where the rows allow them (2048 and 64
    // columns; the table a view one row in), element copies where they do not (37 columns), against Candle's
    // index_select.
    let Some(cuda) = cuda_or_skip() else { return };
    let ids: Vec<u32> = (0..300u32).map(|i| (i * 7919) % 1000).collect();
    let index = Tensor::new(ids.as_slice(), &cuda).unwrap();
    for dtype in [DType::F32, DType::BF16] {
        for (cols, offset) in [(2048, 0), (37, 0), (64, 3)] {
            let table =
                seeded((1001, cols + offset), 1.0, cols as u64).to_device(&cuda).unwrap().to_dtype(dtype).unwrap();
            let table = table.narrow(1, offset, cols).unwrap().narrow(0, 1, 1000).unwrap();
            let got = ops::gather_rows(&table, &index).unwrap();
            let want = table.contiguous().unwrap().index_select(&index, 0).unwrap();
            assert_eq!(got.dims(), &[300, cols]);
            assert_eq!(max_rel_diff(&got.to_dtype(DType::F32).unwrap(), &want.to_dtype(DType::F32).unwrap()), 0.0);
        }
    }
}
