//! Shared helpers for integration tests: fixture paths and loading.
#![allow(dead_code)]

pub mod cli;
pub mod hostile_files;
pub mod hub_server;
pub mod reference;
#[cfg(feature = "studio")]
pub mod studio;

use std::path::PathBuf;

/// The tiny fixture of every family we train (tests/fixtures/README.md says what each one exercises).
pub const FAMILIES: [&str; 9] = [
    "tiny-llama",
    "tiny-mistral",
    "tiny-qwen2",
    "tiny-qwen3",
    "tiny-gemma3",
    "tiny-olmo2",
    "tiny-phi3",
    "tiny-smollm3",
    "tiny-granite",
];

pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

pub fn expected(name: &str) -> serde_json::Value {
    let path = fixture(name).join("expected.json");
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

pub fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

pub fn floats(v: &serde_json::Value) -> Vec<f64> {
    v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect()
}

/// The real SmolLM2 GGUF: `$METAL_CANDLE_SMOLLM2`, else the first .gguf in models/smollm2/.
/// Panics with instructions when absent: the README's test command fetches it.
pub fn smollm2_path() -> PathBuf {
    if let Ok(p) = std::env::var("METAL_CANDLE_SMOLLM2") {
        return PathBuf::from(p);
    }
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models/smollm2");
    std::fs::read_dir(&dir)
        .ok()
        .and_then(|entries| {
            entries.flatten().map(|e| e.path()).find(|p| p.extension().map(|e| e == "gguf").unwrap_or(false))
        })
        .unwrap_or_else(|| panic!("SmolLM2 GGUF not found in {}; run scripts/fetch_smollm2.sh", dir.display()))
}

pub fn max_abs_diff(a: &[f32], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    a.iter().zip(b).map(|(x, y)| (*x as f64 - y).abs()).fold(0.0, f64::max)
}

/// Greedy ids the model generates for a fixture's `greedy` entry (its prompt ids and token count, eos ignored).
pub fn greedy_ids(m: &metal_candle::engine::model::LoadedModel, greedy: &serde_json::Value) -> Vec<u32> {
    use metal_candle::engine::generate::{generate, GenerateRequest};
    let req = GenerateRequest {
        prompt_ids: ids(&greedy["prompt_ids"]),
        max_new_tokens: greedy["max_new_tokens"].as_u64().unwrap() as usize,
        sampling: metal_candle::engine::sampler::SamplingParams::greedy(),
        eos_token_ids: m.eos_token_ids.clone(),
        ignore_eos: true,
        stop_strings: vec![],
    };
    generate(&m.model, &m.tokenizer, &req, &mut |_| true).unwrap().generated_ids
}

/// A short all-linear rank-4 run on the sample chat, CPU, on a base held as `quantize` (the QLoRA tests).
pub fn qlora_train_config(
    model: &std::path::Path,
    out: &std::path::Path,
    quantize: metal_candle::engine::model::BaseQuant,
    iters: usize,
) -> metal_candle::engine::train::TrainConfig {
    use metal_candle::engine::train::{LoraSettings, TrainConfig};
    TrainConfig {
        model: model.to_path_buf(),
        data: std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/sample-chat"),
        out: out.to_path_buf(),
        run_name: Some(format!("qlora-{quantize}")),
        lora: LoraSettings { rank: 4, alpha: 8.0, targets: "all-linear".parse().unwrap(), ..Default::default() },
        iters: Some(iters),
        epochs: None,
        batch_size: 2,
        seq_len: 64,
        lr: 1e-2,
        warmup: Some(2),
        val_every: 0,
        save_every: 0,
        quantize,
        device: metal_candle::engine::device::DeviceChoice::Cpu,
        ..Default::default()
    }
}

/// The first CUDA device, or None (printing that the test is skipped) where there is none: the CUDA tests run
/// on a lent GPU machine and skip elsewhere.
/// LoRA rank 4, alpha 8 on every linear, with adapter dropout `dropout`.
pub fn all_linear_lora(dropout: f32) -> metal_candle::engine::train::LoraSettings {
    metal_candle::engine::train::LoraSettings {
        rank: 4,
        alpha: 8.0,
        dropout,
        targets: "all-linear".parse().unwrap(),
        ..Default::default()
    }
}

/// How many elements of `a` and `b` differ in their bits once widened to f32 (which every half-precision value
/// survives exactly), and how many `a` has: for the tests that ask two paths to agree bit for bit.
pub fn differing_bits(a: &candle_core::Tensor, b: &candle_core::Tensor) -> (usize, usize) {
    let bits = |t: &candle_core::Tensor| -> Vec<u32> {
        let wide: Vec<f32> = t.to_dtype(candle_core::DType::F32).unwrap().flatten_all().unwrap().to_vec1().unwrap();
        wide.iter().map(|v| v.to_bits()).collect()
    };
    let (a, b) = (bits(a), bits(b));
    assert_eq!(a.len(), b.len(), "differing_bits: {} against {} elements", a.len(), b.len());
    (a.iter().zip(&b).filter(|(x, y)| x != y).count(), a.len())
}

pub fn cuda_or_skip() -> Option<candle_core::Device> {
    let device = candle_core::Device::new_cuda(0).ok();
    if device.is_none() {
        eprintln!("no CUDA device: skipped");
    }
    device
}

/// Fresh adapters on `model` (seeded), with B drawn at random (std 0.2) instead of zero, so that every adapter
/// changes the output and receives a gradient of its A. B comes from `seed` too (Candle's CPU `randn` cannot be
/// seeded), so a test's tolerance meets the same numbers on every run.
pub fn random_adapters(
    model: &mut metal_candle::engine::model::transformer::Transformer,
    settings: &metal_candle::engine::train::LoraSettings,
    seed: u64,
) -> Vec<metal_candle::engine::lora::AdapterParam> {
    let params = metal_candle::engine::lora::attach_new_adapters(model, settings, seed).unwrap();
    // xorshift64* and Box-Muller: normal values, std 0.2.
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut uniform = || {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        ((state.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    for p in &params {
        let values: Vec<f32> = (0..p.b.elem_count())
            .map(|_| {
                let (u, v) = (uniform(), uniform());
                (0.2 * (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()) as f32
            })
            .collect();
        p.b.set(&candle_core::Tensor::from_vec(values, p.b.shape(), &candle_core::Device::Cpu).unwrap()).unwrap();
    }
    params
}
