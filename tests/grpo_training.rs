//! GRPO runs end to end on tiny-llama (CPU): a run records TRL-named metrics and sampled completions, and a run
//! stopped at a checkpoint inside a batch's iterations resumes bit for bit (the batch's completions travel in the
//! checkpoint); a quantized base with checkpointing trains; a reward program that fails ends the run with the row
//! named and the checkpoint already saved kept; SFT data is refused before any work.

mod common;

use candle_core::{DType, Device};
use common::fixture;
use metal_candle::engine::model::{load_model_with, BaseQuant, LoadOptions};
use metal_candle::engine::train::grpo::{RewardKind, RewardSpec};
use metal_candle::engine::train::run_folder::read_metrics;
use metal_candle::engine::train::{self, LoraSettings, Method, TrainConfig, TrainControl, TrainEvent};
use std::path::{Path, PathBuf};

fn sample_prompts() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/sample-grpo")
}

fn config(out: &Path, name: &str, iters: usize) -> TrainConfig {
    let mut c = TrainConfig {
        model: fixture("tiny-llama"),
        data: sample_prompts(),
        out: out.to_path_buf(),
        run_name: Some(name.into()),
        method: Method::Grpo,
        lora: LoraSettings { rank: 4, alpha: 8.0, targets: "all-linear".parse().unwrap(), ..Default::default() },
        iters: Some(iters),
        epochs: None,
        batch_size: 2,
        seq_len: 96,
        lr: 5e-3,
        warmup: Some(1),
        val_every: 0,
        val_batches: 2,
        save_every: 0,
        device: metal_candle::engine::device::DeviceChoice::Cpu,
        ..Default::default()
    };
    c.grpo.num_generations = 4;
    c.grpo.max_new_tokens = 6;
    c.grpo.sample_every = 2;
    // tiny-llama's answers are noise: a length reward and a regex give every group different rewards.
    c.grpo.rewards = vec![
        RewardSpec { kind: RewardKind::Length { budget: 3 }, weight: 1.0 },
        RewardSpec { kind: RewardKind::Regex { pattern: "[aeiou]".into() }, weight: 0.5 },
    ];
    c
}

fn run_with(
    cfg: &TrainConfig,
    quantize: BaseQuant,
    stop_at: impl Fn(&TrainEvent) -> bool,
) -> (Vec<TrainEvent>, metal_candle::engine::Result<PathBuf>) {
    let base = load_model_with(&cfg.model, &Device::Cpu, DType::F32, &LoadOptions { quantize }).unwrap();
    let control = TrainControl::default();
    let asker = control.clone();
    let mut events = Vec::new();
    let result = train::run_training(cfg, &base, &control, &mut |e| {
        if stop_at(&e) {
            asker.request_stop();
        }
        events.push(e);
    });
    (events, result)
}

fn step_losses(events: &[TrainEvent]) -> Vec<(usize, f64)> {
    events
        .iter()
        .filter_map(|e| if let TrainEvent::Step { step, loss, .. } = e { Some((*step, *loss)) } else { None })
        .collect()
}

#[test]
fn grpo_records_metrics_and_resumes_inside_a_batch_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    let mut full = config(dir.path(), "full", 6);
    full.grpo.num_iterations = 2;
    full.grpo.beta = 0.04;
    full.lora.dropout = 0.1;
    full.save_every = 3;
    full.val_every = 3;
    let (events, r) = run_with(&full, BaseQuant::None, |_| false);
    let run_dir = r.unwrap();
    let losses = step_losses(&events);
    assert_eq!(losses.len(), 6);
    let recorded = read_metrics(&run_dir);
    let grpo: Vec<_> = recorded
        .iter()
        .filter_map(|e| match e {
            TrainEvent::Step { grpo: Some(m), .. } => Some(m.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(grpo.len(), 6);
    // Each batch of completions is sampled on its first step and trained on twice.
    assert!(grpo[0].generation_secs > 0.0 && grpo[1].generation_secs == 0.0);
    assert_eq!(grpo[0].reward_mean, grpo[1].reward_mean);
    assert!(grpo.iter().all(|m| m.kl.is_some() && m.mean_length >= 1.0));
    assert!(recorded.iter().any(|e| matches!(e, TrainEvent::Samples { samples, .. } if !samples.is_empty())));
    assert!(recorded.iter().any(|e| matches!(e, TrainEvent::Eval { grpo: Some(_), .. })));
    let text = std::fs::read_to_string(run_dir.join("metrics.jsonl")).unwrap();
    for key in
        ["reward_mean", "reward_std", "rewards/length/mean", "rewards/regex/mean", "kl", "clip_ratio/region_mean"]
    {
        assert!(text.contains(&format!("\"{key}\"")), "metrics.jsonl lacks {key}");
    }
    // Checkpoint 3 falls inside the second batch (steps 3 and 4): its completions are saved with it.
    assert!(run_dir.join("checkpoint-3/grpo_rollout.json").exists());

    let mut part = config(dir.path(), "part", 6);
    part.grpo = full.grpo.clone();
    part.lora.dropout = 0.1;
    part.save_every = 3;
    part.val_every = 3;
    let _ = run_with(&part, BaseQuant::None, |e| matches!(e, TrainEvent::CheckpointSaved { step: 3, .. }));
    let resume = TrainConfig { resume: Some(dir.path().join("part/checkpoint-3")), ..part };
    let (second, r) = run_with(&resume, BaseQuant::None, |_| false);
    r.unwrap();
    let resumed = step_losses(&second);
    assert_eq!(resumed.iter().map(|s| s.0).collect::<Vec<_>>(), vec![4, 5, 6]);
    for (step, loss) in resumed {
        assert_eq!(loss, losses[step - 1].1, "step {step}: resumed vs uninterrupted");
    }
    let checkpoint = |run: &Path| common::cli::load_checkpoint(&run.join("checkpoint-6"));
    assert!(
        common::cli::same_tensors(&checkpoint(&run_dir), &checkpoint(&dir.path().join("part"))),
        "the resumed run's adapter and optimizer state equal the uninterrupted run's"
    );
}

#[test]
fn grpo_trains_on_a_quantized_base_with_checkpointing() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path(), "q8", 4);
    cfg.checkpointing = train::Checkpointing::On;
    let (events, r) = run_with(&cfg, BaseQuant::Q8_0, |_| false);
    r.unwrap();
    assert_eq!(step_losses(&events).len(), 4);
    assert!(step_losses(&events).iter().all(|(_, l)| l.is_finite()));
}

#[test]
fn a_failing_reward_program_names_the_row_and_keeps_saved_work() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("score.sh");
    // Scores until its marker file exists, then fails: the first steps train, a later one meets the failure.
    let marker = dir.path().join("broken");
    std::fs::write(
        &script,
        format!("cat >/dev/null\nif [ -e '{}' ]; then echo oops >&2; exit 3; fi\necho 0.5\n", marker.display()),
    )
    .unwrap();
    let mut cfg = config(dir.path(), "program", 4);
    cfg.grpo.rewards.push(RewardSpec {
        kind: RewardKind::Program { command: vec!["sh".into(), script.display().to_string()], timeout_secs: 10.0 },
        weight: 1.0,
    });
    cfg.save_every = 1;
    let marker_at_step_2 = marker.clone();
    let (events, r) = run_with(&cfg, BaseQuant::None, move |e| {
        if matches!(e, TrainEvent::CheckpointSaved { step: 2, .. }) {
            std::fs::write(&marker_at_step_2, "").unwrap();
        }
        false
    });
    let err = r.unwrap_err().to_string();
    assert!(err.contains("line") && err.contains("oops"), "{err}");
    assert!(matches!(events.last(), Some(TrainEvent::Failed { .. })));
    assert!(dir.path().join("program/checkpoint-2/adapter_model.safetensors").exists(), "saved work is kept");
}

#[test]
fn grpo_refuses_data_without_prompts_before_any_work() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path(), "sft-data", 2);
    cfg.data = common::cli::sample_data();
    let (events, r) = run_with(&cfg, BaseQuant::None, |_| false);
    let err = r.unwrap_err().to_string();
    assert!(err.contains("GRPO"), "{err}");
    assert!(!events.iter().any(|e| matches!(e, TrainEvent::Step { .. })));
    assert!(!dir.path().join("sft-data/checkpoint-1").exists());
}
