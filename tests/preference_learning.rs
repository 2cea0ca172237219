//! Preference training learns, on the real SmolLM2-135M-Instruct, on the CPU: arithmetic pairs ("17 + 25 =", the
//! right sum chosen, a wrong one rejected). Before training the base prefers the right answer on about half the
//! held-out pairs; after a short DPO run, and after a short ORPO run, the trained model's reward accuracy on pairs it
//! never saw is at least 90%, as `eval --task preference` measures it.

mod common;

use candle_core::{DType, Device};
use common::*;
use metal_candle::engine::eval::preference::PreferenceTask;
use metal_candle::engine::eval::{run_eval, EvalSpec, EvalTarget, EvalTask};
use metal_candle::engine::model::load_model;
use metal_candle::engine::train::{self, LoraSettings, Method, PreferenceSettings, TrainConfig, TrainControl};
use std::io::Write;
use std::path::Path;
use std::sync::atomic::AtomicBool;

/// Deterministic arithmetic pairs: `rows` of them from `seed`, as standard preference rows.
fn write_pairs(path: &Path, rows: usize, seed: u64) {
    let mut state = seed;
    let mut next = |n: u64| {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (state >> 33) % n
    };
    let mut file = std::fs::File::create(path).unwrap();
    for _ in 0..rows {
        let (a, b) = (10 + next(40), 10 + next(40));
        let wrong_by = 1 + next(9);
        let wrong = if next(2) == 0 { a + b + wrong_by } else { a + b - wrong_by };
        let row = serde_json::json!({
            "prompt": format!("{a} + {b} ="),
            "chosen": format!(" {}", a + b),
            "rejected": format!(" {wrong}"),
        });
        writeln!(file, "{row}").unwrap();
    }
}

/// Reward accuracy of `adapter` (or, without one, whether the base alone prefers the chosen answer: ORPO's reward
/// of the base) on `data`.
fn reward_accuracy(
    base: &metal_candle::engine::model::LoadedModel,
    data: &Path,
    method: Method,
    adapter: Option<&Path>,
) -> f64 {
    let spec = EvalSpec {
        task: EvalTask::Preference(PreferenceTask { method, settings: PreferenceSettings::default() }),
        data: data.to_path_buf(),
        targets: vec![adapter.map_or_else(EvalTarget::base, EvalTarget::adapter)],
        seq_len: 64,
        batch_size: 16,
        ..EvalSpec::default()
    };
    let report = run_eval(&spec, base, &AtomicBool::new(false), &mut |_| {}).unwrap();
    report.targets[0].metric("rewards/accuracies").unwrap()
}

#[test]
fn dpo_and_orpo_teach_smollm2_to_prefer_the_right_sum() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("pairs");
    std::fs::create_dir(&data).unwrap();
    write_pairs(&data.join("train.jsonl"), 96, 1);
    write_pairs(&data.join("valid.jsonl"), 16, 2);
    let held_out = dir.path().join("held-out.jsonl");
    write_pairs(&held_out, 48, 3);
    let base = load_model(&smollm2_path(), &Device::Cpu, DType::F32).unwrap();
    // ORPO's reward of the base: its own per-token preference, before any training.
    let before = reward_accuracy(&base, &held_out, Method::Orpo, None);
    eprintln!("base prefers the right sum on {:.0}% of held-out pairs", 100.0 * before);
    for method in [Method::Dpo, Method::Orpo] {
        let config = TrainConfig {
            model: smollm2_path(),
            data: data.clone(),
            out: dir.path().join("runs"),
            run_name: Some(method.name().into()),
            method,
            lora: LoraSettings { rank: 8, alpha: 16.0, targets: "all-linear".parse().unwrap(), ..Default::default() },
            iters: Some(48),
            epochs: None,
            batch_size: 8,
            seq_len: 64,
            lr: 1e-3,
            warmup: Some(2),
            val_every: 0,
            save_every: 0,
            device: metal_candle::engine::device::DeviceChoice::Cpu,
            ..Default::default()
        };
        let run = train::run_training(&config, &base, &TrainControl::default(), &mut |_| {}).unwrap();
        let checkpoint = run.join("checkpoint-48");
        let after = reward_accuracy(&base, &held_out, method, Some(&checkpoint));
        eprintln!("{}: reward accuracy on held-out pairs {:.0}%", method.name(), 100.0 * after);
        assert!(after >= 0.9, "{}: held-out reward accuracy {after} (base {before})", method.name());
    }
}
