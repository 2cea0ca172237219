//! GRPO learns (CPU, the real SmolLM2-135M-Instruct, ~3 minutes): on two-number sums ("Reply with the number
//! only") with the exact-answer reward, the mean reward of the sampled completions over the last steps of a short
//! run is clearly above the first steps', and the adapter's greedy exact-answer reward on the 48 held-out prompts
//! beats the base model's on the same prompts.

mod common;

use candle_core::{DType, Device};
use common::smollm2_path;
use metal_candle::engine::model::load_model;
use metal_candle::engine::train::grpo::run::GrpoRun;
use metal_candle::engine::train::{self, LoraSettings, Method, TrainConfig, TrainControl, TrainEvent};
use std::path::Path;

#[test]
fn grpo_raises_the_reward_of_sums() {
    let dir = tempfile::tempdir().unwrap();
    let base = load_model(&smollm2_path(), &Device::Cpu, DType::F32).unwrap();
    let mut cfg = TrainConfig {
        model: smollm2_path(),
        data: Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/sample-grpo"),
        out: dir.path().to_path_buf(),
        run_name: Some("sums".into()),
        method: Method::Grpo,
        lora: LoraSettings { rank: 8, alpha: 16.0, targets: "all-linear".parse().unwrap(), ..Default::default() },
        iters: Some(20),
        epochs: None,
        batch_size: 4,
        seq_len: 128,
        lr: 1e-3,
        val_every: 0,
        save_every: 0,
        device: metal_candle::engine::device::DeviceChoice::Cpu,
        ..Default::default()
    };
    (cfg.grpo.num_generations, cfg.grpo.max_new_tokens, cfg.grpo.sample_every) = (8, 8, 0);

    // The base model's greedy reward on the validation prompts, measured as the run's validation measures it.
    let data = train::prepare_data(&cfg, &base).unwrap();
    let valid = data.valid.as_ref().expect("assets/sample-grpo has a validation split");
    let locate = |i: usize| format!("validation prompt {i}");
    let pad = base.eos_token_ids[0];
    let grpo = GrpoRun::prepare(&cfg.grpo, &base, &data.train, &locate, pad).unwrap();
    let before = grpo.validate(&base.model, valid, 0, &locate).unwrap().unwrap().reward_mean;

    let mut rewards = Vec::new();
    let mut after = None;
    train::run_training(&cfg, &base, &TrainControl::default(), &mut |e| match e {
        TrainEvent::Step { grpo: Some(m), .. } => rewards.push(m.reward_mean),
        TrainEvent::Eval { grpo: Some(m), .. } => after = Some(m.reward_mean),
        _ => {}
    })
    .unwrap();
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let (first, last) = (mean(&rewards[..8]), mean(&rewards[12..]));
    let after = after.expect("the run ends with a validation");
    eprintln!("GRPO sums: sampled reward first 8 steps {first:.3}, last 8 {last:.3}; greedy validation reward base {before:.3}, adapter {after:.3}");
    assert!(last > first + 0.1, "sampled reward: first 8 steps {first:.3}, last 8 {last:.3}");
    assert!(after > before + 0.1, "greedy reward on held-out prompts: base {before:.3}, adapter {after:.3}");
}
