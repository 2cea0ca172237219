//! The fused CUDA decode kernels against the CPU: step-by-step logits of a KV-cache decode on every tiny
//! architecture, and with a quantized base, an active adapter and q/k norms (built with `--features cuda`;
//! skipped without a GPU). Run on a lent GPU machine.
#![cfg(feature = "cuda")]

use candle_core::{DType, Device, Tensor};
use metal_candle::engine::generate::KvCache;
use metal_candle::engine::lora;
use metal_candle::engine::model::{load_model, load_model_with, BaseQuant, LoadOptions};
use metal_candle::engine::train::LoraSettings;

fn logits_per_step(model_dir: &str, device: &Device, dtype: DType, prompt: &[u32], steps: usize) -> Vec<Vec<f32>> {
    let loaded = load_model(std::path::Path::new(model_dir), device, dtype).unwrap();
    decode_logits(&loaded.model, prompt, steps)
}

/// Logits after the prompt and after each of `steps` single-token decode steps through the KV cache.
fn decode_logits(
    model: &metal_candle::engine::model::transformer::Transformer,
    prompt: &[u32],
    steps: usize,
) -> Vec<Vec<f32>> {
    let device = model.device();
    let mut cache = KvCache::new(model.config.num_layers);
    let mut out = Vec::new();
    let mut ids = prompt.to_vec();
    let mut pos = 0;
    for step in 0..=steps {
        let input = if step == 0 { ids.clone() } else { vec![*ids.last().unwrap()] };
        let t = input.len();
        let input = Tensor::from_vec(input, (1, t), device).unwrap();
        let hidden = model.forward_hidden(&input, pos, Some(&mut cache)).unwrap();
        pos += t;
        let last = hidden.narrow(1, t - 1, 1).unwrap().squeeze(1).unwrap();
        let logits: Vec<f32> =
            model.logits(&last).unwrap().to_dtype(DType::F32).unwrap().flatten_all().unwrap().to_vec1().unwrap();
        // Follow the CPU-independent argmax so both runs see the same tokens: a fixed pseudo-random walk.
        ids.push(((step * 7919 + 13) % model.config.vocab_size) as u32);
        out.push(logits);
    }
    out
}

/// The prompt both tests decode after.
const PROMPT: [u32; 5] = [281, 358, 289, 422, 348];

/// The first CUDA device, or None (printing that the test is skipped) on a machine without one.
fn cuda_or_skip() -> Option<Device> {
    let device = Device::new_cuda(0).ok();
    if device.is_none() {
        eprintln!("no CUDA device: skipped");
    }
    device
}

#[test]
fn fused_decode_logits_match_the_cpu_on_every_architecture() {
    let Some(cuda) = cuda_or_skip() else { return };
    let prompt = PROMPT;
    for arch in ["tiny-llama", "tiny-mistral", "tiny-qwen2", "tiny-qwen3"] {
        let dir = format!("tests/fixtures/{arch}");
        let want = logits_per_step(&dir, &Device::Cpu, DType::F32, &prompt, 80);
        let got = logits_per_step(&dir, &cuda, DType::F32, &prompt, 80);
        let diffs = max_diffs(arch, &want, &got);
        assert!(diffs.iter().all(|d| *d < 1e-3), "{arch}: CUDA decode differs from the CPU");
    }
}

/// Per step, the largest |logit difference| (printed).
fn max_diffs(label: &str, want: &[Vec<f32>], got: &[Vec<f32>]) -> Vec<f32> {
    let diffs: Vec<f32> =
        want.iter().zip(got).map(|(a, b)| a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max)).collect();
    eprintln!(
        "{label}: max |logit diff| per step: {:?}",
        &diffs.iter().map(|d| format!("{d:.1e}")).collect::<Vec<_>>()
    );
    diffs
}

/// `arch` loaded on `device` with its base held as `quantize`, and rank-4 adapters on every linear whose B
/// is a fixed non-zero pattern (the same on every device), so the adapters change the logits.
fn adapted_model(arch: &str, device: &Device, quantize: BaseQuant) -> metal_candle::engine::model::LoadedModel {
    let path = format!("tests/fixtures/{arch}");
    let mut m = load_model_with(std::path::Path::new(&path), device, DType::F32, &LoadOptions { quantize }).unwrap();
    let settings = LoraSettings { rank: 4, alpha: 8.0, targets: "all-linear".parse().unwrap(), ..Default::default() };
    for p in lora::attach_new_adapters(&mut m.model, &settings, 5).unwrap() {
        let n = p.b.elem_count();
        let pattern: Vec<f32> = (0..n).map(|i| 0.2 * ((i * 37 % 101) as f32 / 101.0 - 0.5)).collect();
        p.b.set(&Tensor::from_vec(pattern, p.b.shape(), device).unwrap()).unwrap();
    }
    m
}

/// The fused decode also runs with an active adapter, on q/k-norm families (qwen3) and with a quantized base
/// (Q8_0): CUDA against the CPU, within 1e-3 like the plain decode. With a quantized base both sides round each
/// single-row product's input to 8-bit blocks the same way (the CPU to Q8_0, Candle's CUDA kernel to Q8_1: the
/// same scale and integers), so they agree to float summation order (measured on the lent H100: <= 1e-6). The
/// adapters must move the logits (measured >= 0.9 here), so a dropped adapter cannot pass.
#[test]
fn fused_decode_with_adapters_qk_norms_and_a_quantized_base_matches_the_cpu() {
    let Some(cuda) = cuda_or_skip() else { return };
    let prompt = PROMPT;
    for (arch, quantize) in [
        ("tiny-llama", BaseQuant::None),
        ("tiny-qwen3", BaseQuant::None),
        ("tiny-llama", BaseQuant::Q8_0),
        ("tiny-qwen3", BaseQuant::Q8_0),
    ] {
        let cpu = adapted_model(arch, &Device::Cpu, quantize);
        let gpu = adapted_model(arch, &cuda, quantize);
        let plain = load_model_with(
            std::path::Path::new(&format!("tests/fixtures/{arch}")),
            &Device::Cpu,
            DType::F32,
            &LoadOptions { quantize },
        )
        .unwrap();
        let want = decode_logits(&cpu.model, &prompt, 40);
        let got = decode_logits(&gpu.model, &prompt, 40);
        let label = format!("{arch} {quantize} + adapters");
        let diffs = max_diffs(&label, &want, &got);
        let without =
            max_diffs(&format!("{label} (CPU without adapters)"), &want, &decode_logits(&plain.model, &prompt, 40));
        for (d, adapter_effect) in diffs.iter().zip(&without) {
            assert!(*d < 1e-3, "{label}: CUDA decode differs from the CPU by {d}");
            assert!(*adapter_effect > 0.1, "{label}: the adapters move the logits by only {adapter_effect}");
        }
    }
}
