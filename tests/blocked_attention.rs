//! Blocked attention in whole training passes on the portable graph (what a Mac runs, here on the CPU): the
//! memory of a training step grows linearly in T (no T x T scores anywhere), and gradient checkpointing gives
//! the uncheckpointed losses and gradients when the rows span several blocks (a sliding window included).
//! The op itself is tested against the whole-matrix attention in `ops/blocked_attention_tests.rs`.
//!
//! The kernel choice and the heap counter are process-wide: this binary runs only portable tests, one at a time.

mod common;

use candle_core::{DType, Device, Tensor};
use common::*;
use metal_candle::engine::bench::random_batch;
use metal_candle::engine::lora;
use metal_candle::engine::memory_watch::MemoryWatch;
use metal_candle::engine::model::{load_model, LoadedModel};
use metal_candle::engine::ops;
use metal_candle::engine::runtime::{self, Kernels, RuntimeOptions};
use metal_candle::engine::train::{backprop, LoraSettings};
use std::sync::Mutex;

/// Held by each test: the heap peak is one counter for the process.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn portable() {
    runtime::init(RuntimeOptions { kernels: Kernels::Portable, ..RuntimeOptions::default() }).unwrap();
    assert_eq!(ops::kernels(), Kernels::Portable);
}

/// A fixture whose config allows 8192 positions (the fixtures stop at 256), with adapters whose B is non-zero.
fn long_context(arch: &str, dropout: f32) -> (LoadedModel, Vec<lora::AdapterParam>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(fixture(arch)).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, dir.path().join(path.file_name().unwrap())).unwrap();
    }
    let config_path = dir.path().join("config.json");
    let mut config: serde_json::Value = serde_json::from_slice(&std::fs::read(&config_path).unwrap()).unwrap();
    config["max_position_embeddings"] = 8192.into();
    std::fs::write(&config_path, serde_json::to_vec(&config).unwrap()).unwrap();
    let mut m = load_model(dir.path(), &Device::Cpu, DType::F32).unwrap();
    let lora =
        LoraSettings { rank: 4, alpha: 8.0, dropout, targets: "all-linear".parse().unwrap(), ..Default::default() };
    let params = lora::attach_new_adapters(&mut m.model, &lora, 3).unwrap();
    for p in &params {
        p.b.set(&Tensor::randn(0f32, 0.2, p.b.shape(), &Device::Cpu).unwrap()).unwrap();
    }
    (m, params, dir)
}

/// Heap bytes one training step (forward, backward) adds at its peak, for one sequence of `seq_len` tokens.
fn step_peak_bytes(m: &LoadedModel, seq_len: usize) -> u64 {
    let batch = random_batch(m.config.vocab_size, 1, seq_len, 4);
    let mut watch = MemoryWatch::start(&Device::Cpu);
    let out = backprop::loss_and_gradients_with(&m.model, &batch, 1.0 / batch.target_tokens as f64, false, false);
    let added = watch.read().added_bytes;
    assert!(out.unwrap().nll_sum.value().unwrap().is_finite());
    added
}

#[test]
fn a_portable_training_step_grows_linearly_in_t() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    portable();
    let (m, _params, _dir) = long_context("tiny-llama", 0.0);
    let (heads, layers) = (m.config.num_attention_heads as u64, m.config.num_layers as u64);
    let short = step_peak_bytes(&m, 2048);
    let long = step_peak_bytes(&m, 4096);
    // One layer's f32 scores at T = 4096 alone would be heads x T^2 x 4 bytes (256 MiB here); the composed
    // path kept them for every layer.
    let scores = heads * 4096 * 4096 * 4;
    assert!(long < scores / 4, "T = 4096 step peak {long} B against {scores} B of one layer's scores");
    // Twice the tokens, about twice the memory (T x T would be four times).
    let ratio = long as f64 / short as f64;
    eprintln!("portable step peak: {short} B at T = 2048, {long} B at T = 4096 (x{ratio:.2})");
    assert!(ratio < 2.5, "step peak {short} B at T = 2048, {long} B at 4096: x{ratio:.2} ({layers} layers)");
}

#[test]
fn portable_checkpointing_matches_the_plain_pass_across_blocks() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    portable();
    // 1100 tokens: two whole query blocks and a partial one; gemma3's sliding layers (a 4-token window) see
    // one block of keys back at most.
    for arch in ["tiny-llama", "tiny-gemma3"] {
        let (m, params, _dir) = long_context(arch, 0.1);
        let block = ops::attention_block_size(1, m.config.num_attention_heads, m.config.head_dim, 1100, None);
        assert!(1100 > 2 * block && 1100 % block != 0, "{arch}: blocks of {block}");
        let batch = random_batch(m.config.vocab_size, 1, 1100, 8);
        let scale = 1.0 / batch.target_tokens as f64;
        lora::seed_dropout(&m.model, 5, 2);
        let plain = backprop::loss_and_gradients_with(&m.model, &batch, scale, true, false).unwrap();
        lora::seed_dropout(&m.model, 5, 2);
        let ckpt = backprop::loss_and_gradients_with(&m.model, &batch, scale, true, true).unwrap();
        let (plain_nll, ckpt_nll) = (plain.nll_sum.value().unwrap(), ckpt.nll_sum.value().unwrap());
        assert!(plain_nll.is_finite() && (plain_nll - ckpt_nll).abs() <= 1e-6 * plain_nll.abs(), "{arch}");
        for p in &params {
            for var in [&p.a, &p.b] {
                let (a, b) = (plain.grads.get(var.as_tensor()).unwrap(), ckpt.grads.get(var.as_tensor()).unwrap());
                let size: f32 = a.abs().unwrap().max_all().unwrap().to_scalar().unwrap();
                let diff: f32 = (a - b).unwrap().abs().unwrap().max_all().unwrap().to_scalar().unwrap();
                assert!(size > 0.0, "{arch} layer {} {}: zero gradient", p.layer, p.module);
                assert!(diff <= 1e-5 * size, "{arch} layer {} {}: {diff} of {size}", p.layer, p.module);
            }
        }
    }
}
