//! `--checkpointing offload` on a CUDA GPU: the kept layer inputs (and the fused attention's output and logsumexp
//! beside them, or, with a host budget too small for those, the inputs only) copied to pinned host memory and back on
//! a second stream give the gradients of checkpoints kept on the device, bit for bit, pass after pass (the second pass reuses the pooled host buffers), with dropout on and on packed
//! rows; and the pass really went through host memory; both match the pass that keeps every activation (built with
//! `--features cuda`; skipped without a GPU).
#![cfg(feature = "cuda")]

mod common;

use candle_core::{DType, Tensor};
use common::fixture;
use metal_candle::engine::bench::random_batch;
use metal_candle::engine::device::{select_device, DeviceChoice};
use metal_candle::engine::lora;
use metal_candle::engine::model::load_model;
use metal_candle::engine::train::backprop::{sft_loss_and_gradients, Pass};

fn values(t: &Tensor) -> Vec<f32> {
    t.to_dtype(DType::F32).unwrap().flatten_all().unwrap().to_vec1().unwrap()
}

#[test]
fn offloaded_checkpoints_give_the_resident_gradients_bit_for_bit() {
    let Ok(device) = select_device(DeviceChoice::Cuda) else {
        eprintln!("no CUDA device: skipped");
        return;
    };
    for (arch, dtype, packed) in
        [("tiny-llama", DType::F32, false), ("tiny-qwen3", DType::BF16, false), ("tiny-llama", DType::BF16, true)]
    {
        let mut m = load_model(&fixture(arch), &device, dtype).unwrap();
        let params = lora::attach_new_adapters(&mut m.model, &common::all_linear_lora(0.1), 3).unwrap();
        for (i, p) in params.iter().enumerate() {
            let b = Tensor::randn(0f32, 0.2, p.b.shape(), &candle_core::Device::Cpu).unwrap();
            let b = (b * (1.0 + i as f64 * 0.01)).unwrap().to_device(&device).unwrap();
            p.b.set(&b).unwrap();
        }
        let tag = format!("{arch} {dtype:?}{}", if packed { " packed" } else { "" });
        for seed in [1u64, 2] {
            let mut batch = random_batch(m.config.vocab_size, 2, 40, seed);
            if packed {
                // Two examples per row: the second starts at 15.
                batch.row_starts = Some((0..2).flat_map(|_| (0..40u32).map(|j| if j < 15 { 0 } else { 15 })).collect());
            }
            let scale = 1.0 / batch.target_tokens as f64;
            let run = |checkpointing: bool, offload: bool| {
                lora::seed_dropout(&m.model, 9, seed as usize);
                let pass = Pass { dropout: true, checkpointing, offload };
                sft_loss_and_gradients(&m.model, &batch, scale, pass).unwrap()
            };
            let kept = run(false, false);
            let resident = run(true, false);
            // A host budget of nothing: only the layer inputs go to host memory, the recompute attends again.
            std::env::set_var("METAL_CANDLE_OFFLOAD_HOST_GIB", "0");
            let inputs_only = run(true, true);
            std::env::remove_var("METAL_CANDLE_OFFLOAD_HOST_GIB");
            let offloaded = run(true, true);
            assert!(
                metal_candle::engine::ops::cuda::offload::pooled_bytes() > 0,
                "{tag}: nothing went through host memory"
            );
            assert_eq!(resident.nll_sum.value().unwrap(), offloaded.nll_sum.value().unwrap(), "{tag} loss");
            assert_eq!(
                resident.nll_sum.value().unwrap(),
                inputs_only.nll_sum.value().unwrap(),
                "{tag} loss, inputs only"
            );
            for p in &params {
                for var in [&p.a, &p.b] {
                    let (a, b) =
                        (resident.grads.get(var.as_tensor()).unwrap(), offloaded.grads.get(var.as_tensor()).unwrap());
                    let (a, b) = (values(a), values(b));
                    assert!(a.iter().any(|v| *v != 0.0), "{tag} layer {} {}: zero gradient", p.layer, p.module);
                    assert!(a == b, "{tag} pass {seed} layer {} {}: the offloaded gradient differs", p.layer, p.module);
                    let c = values(inputs_only.grads.get(var.as_tensor()).unwrap());
                    assert!(a == c, "{tag} pass {seed} layer {} {}: inputs-only offload differs", p.layer, p.module);
                    // The recompute (attention result kept, MLP deferred) against the pass that keeps everything:
                    // the same up to the order of sums (f32), or half precision's rounding.
                    let full = values(kept.grads.get(var.as_tensor()).unwrap());
                    let size = full.iter().fold(0f32, |m, v| m.max(v.abs()));
                    let diff = full.iter().zip(&a).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
                    let tolerance = if dtype == DType::F32 { 1e-4 } else { 5e-2 };
                    assert!(
                        diff <= tolerance * size,
                        "{tag} layer {} {}: checkpointed {diff} off ({size})",
                        p.layer,
                        p.module
                    );
                }
            }
        }
    }
}
