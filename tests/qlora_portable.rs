//! LoRA on a quantized base through the portable op graph (`--kernels portable`, what Metal runs): every
//! product with a quantized weight goes through Candle's quantized matmul kernel (no dequantized shortcut),
//! the input gradient through a dequantized temporary. The kernel choice is process-wide, so this binary runs
//! every test portable.
//!
//! Tolerance: Candle's CPU kernel quantizes the activations to 8 bits (llama.cpp's arithmetic), so scores
//! differ from the same weights dequantized; on the tiny fixture, whose random weights (std 0.2) make a
//! sensitive model, by about 0.04 on average and under 0.3 at most. Metal's kernel keeps f32
//! activations.

mod common;

use candle_core::{DType, Device};
use common::*;
use metal_candle::engine::generate::score;
use metal_candle::engine::model::linear::BaseWeight;
use metal_candle::engine::model::{load_model_with, BaseQuant, LoadOptions, LoadedModel};
use metal_candle::engine::ops;
use metal_candle::engine::runtime::{self, Kernels, RuntimeOptions};
use metal_candle::engine::train::{self, TrainConfig, TrainControl, TrainEvent};

fn portable() {
    runtime::init(RuntimeOptions { kernels: Kernels::Portable, ..RuntimeOptions::default() }).unwrap();
    assert_eq!(ops::kernels(), Kernels::Portable);
}

fn load(quantize: BaseQuant) -> LoadedModel {
    load_model_with(&fixture("tiny-llama"), &Device::Cpu, DType::F32, &LoadOptions { quantize }).unwrap()
}

#[test]
fn portable_quantized_scores_match_the_dequantized_weights() {
    portable();
    let q8 = load(BaseQuant::Q8_0);
    let mut twin = load(BaseQuant::Q8_0);
    for (_, _, linear) in twin.model.linears_mut() {
        linear.weight = BaseWeight::Dense(linear.weight.to_dense(DType::F32).unwrap());
    }
    let exp = expected("tiny-llama");
    let ids = q8.tokenizer.encode(exp["score"]["text"].as_str().unwrap(), true).unwrap();
    let (a, b) = (score(&q8.model, &ids).unwrap(), score(&twin.model, &ids).unwrap());
    let diff = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
    let mean_diff = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).sum::<f32>() / a.len() as f32;
    eprintln!("portable q8_0 vs its dequantized weights: max |logprob diff| {diff}, mean {mean_diff}");
    assert!(diff < 0.3 && mean_diff < 0.08, "max |logprob diff| {diff}, mean {mean_diff}");
    let generated = greedy_ids(&q8, &exp["greedy"]);
    assert_eq!(generated.len(), exp["greedy"]["max_new_tokens"].as_u64().unwrap() as usize);
}

#[test]
fn portable_training_on_a_quantized_base_lowers_the_loss() {
    portable();
    let dir = tempfile::tempdir().unwrap();
    let base = load(BaseQuant::Q8_0);
    let cfg = TrainConfig {
        run_name: Some("portable-q8".into()),
        ..qlora_train_config(&fixture("tiny-llama"), dir.path(), BaseQuant::Q8_0, 20)
    };
    let mut losses = Vec::new();
    train::run_training(&cfg, &base, &TrainControl::default(), &mut |e| {
        if let TrainEvent::Step { loss, .. } = e {
            losses.push(loss);
        }
    })
    .unwrap();
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let (first, last) = (mean(&losses[..5]), mean(&losses[15..]));
    assert!(last < first - 0.3, "portable q8_0: first 5 {first:.3}, last 5 {last:.3}");
}

/// DPO and ORPO run on the portable graph too (what a Mac runs), on a quantized base: the reference pass, the
/// per-token weighed head loss and the backward all go through the portable ops, and the preference loss falls.
#[test]
fn portable_preference_training_lowers_the_loss() {
    portable();
    let dir = tempfile::tempdir().unwrap();
    let base = load(BaseQuant::Q8_0);
    for method in [train::Method::Dpo, train::Method::Orpo] {
        let cfg = TrainConfig {
            run_name: Some(format!("portable-{}", method.name())),
            data: std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/sample-preference"),
            method,
            batch_size: 4,
            seq_len: 96,
            lr: 5e-3,
            ..qlora_train_config(&fixture("tiny-llama"), dir.path(), BaseQuant::Q8_0, 16)
        };
        let mut losses = Vec::new();
        train::run_training(&cfg, &base, &TrainControl::default(), &mut |e| {
            if let TrainEvent::Step { loss, preference, .. } = e {
                assert!(preference.is_some(), "a preference step reports its metrics");
                losses.push(loss);
            }
        })
        .unwrap();
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
        let (first, last) = (mean(&losses[..4]), mean(&losses[12..]));
        assert!(last < first, "portable {}: first 4 {first:.3}, last 4 {last:.3}", method.name());
    }
}

/// GRPO runs on the portable graph too, on a quantized base: group sampling through the KV cache, the reference
/// pass (beta > 0), the temperature-scaled per-token head loss and the backward all go through the portable ops.
#[test]
fn portable_grpo_training_runs_on_a_quantized_base() {
    use metal_candle::engine::train::grpo::{RewardKind, RewardSpec};
    portable();
    let dir = tempfile::tempdir().unwrap();
    let base = load(BaseQuant::Q8_0);
    let mut cfg = TrainConfig {
        run_name: Some("portable-grpo".into()),
        data: std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/sample-grpo"),
        method: train::Method::Grpo,
        batch_size: 2,
        seq_len: 96,
        lr: 5e-3,
        ..qlora_train_config(&fixture("tiny-llama"), dir.path(), BaseQuant::Q8_0, 4)
    };
    (cfg.grpo.num_generations, cfg.grpo.max_new_tokens, cfg.grpo.beta) = (4, 6, 0.04);
    cfg.grpo.rewards = vec![RewardSpec { kind: RewardKind::Regex { pattern: "[aeiou]".into() }, weight: 1.0 }];
    let mut steps = Vec::new();
    train::run_training(&cfg, &base, &TrainControl::default(), &mut |e| {
        if let TrainEvent::Step { loss, grad_norm, grpo, .. } = e {
            let m = grpo.expect("a GRPO step reports its metrics");
            steps.push((loss, grad_norm, m.kl, m.mean_length));
        }
    })
    .unwrap();
    assert_eq!(steps.len(), 4);
    for (loss, norm, kl, length) in steps {
        assert!(loss.is_finite() && norm.is_finite() && kl.is_some_and(f64::is_finite) && length >= 1.0);
    }
}
