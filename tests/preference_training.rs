//! Preference runs end to end on tiny-llama (CPU): DPO and ORPO runs record TRL-named metrics in their events and
//! metrics.jsonl and their method in run.json; a stopped DPO run resumes bit for bit; checkpointing gives the same
//! preference gradients; quantized bases, DoRA and `eval --task preference` from the CLI work; data that does not
//! fit the method is refused before anything is trained.

mod common;

use candle_core::{DType, Device, Tensor};
use common::cli::sample_data;
use common::*;
use metal_candle::engine::data;
use metal_candle::engine::lora;
use metal_candle::engine::model::{load_model, load_model_with, BaseQuant, LoadOptions};
use metal_candle::engine::train::backprop::Pass;
use metal_candle::engine::train::preference::PreferenceObjective;
use metal_candle::engine::train::run_folder::{read_metrics, RunManifest};
use metal_candle::engine::train::{
    self, LoraSettings, Method, PreferenceSettings, TrainConfig, TrainControl, TrainEvent,
};
use std::path::{Path, PathBuf};

fn sample_pairs() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/sample-preference")
}

fn config(out: &Path, name: &str, method: Method, iters: usize) -> TrainConfig {
    TrainConfig {
        model: fixture("tiny-llama"),
        data: sample_pairs(),
        out: out.to_path_buf(),
        run_name: Some(name.into()),
        method,
        lora: LoraSettings { rank: 4, alpha: 8.0, targets: "all-linear".parse().unwrap(), ..Default::default() },
        iters: Some(iters),
        epochs: None,
        batch_size: 2,
        seq_len: 96,
        lr: 5e-3,
        warmup: Some(1),
        val_every: 0,
        save_every: 0,
        device: metal_candle::engine::device::DeviceChoice::Cpu,
        ..Default::default()
    }
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

fn run(cfg: &TrainConfig) -> (Vec<TrainEvent>, metal_candle::engine::Result<PathBuf>) {
    run_with(cfg, BaseQuant::None, |_| false)
}

fn step_losses(events: &[TrainEvent]) -> Vec<(usize, f64)> {
    events
        .iter()
        .filter_map(|e| if let TrainEvent::Step { step, loss, .. } = e { Some((*step, *loss)) } else { None })
        .collect()
}

#[test]
fn dpo_runs_record_trl_metrics_and_resume_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    let mut full = config(dir.path(), "full", Method::Dpo, 6);
    full.lora.dropout = 0.1;
    full.save_every = 3;
    full.val_every = 3;
    let (events, r) = run(&full);
    let run_dir = r.unwrap();
    // DPO starts at ln 2: the new adapter's B is zero, so the policy is the reference.
    let losses = step_losses(&events);
    assert!((losses[0].1 - std::f64::consts::LN_2).abs() < 1e-6, "first DPO loss {}", losses[0].1);
    let recorded = read_metrics(&run_dir);
    let step = recorded.iter().find_map(|e| match e {
        TrainEvent::Step { preference: Some(m), .. } => Some(*m),
        _ => None,
    });
    assert_eq!(step.map(|m| m.pairs), Some(2), "each step's metrics are over its pairs");
    let eval = recorded.iter().find_map(|e| match e {
        TrainEvent::Eval { preference: Some(m), .. } => Some(*m),
        _ => None,
    });
    assert_eq!(eval.map(|m| m.pairs), Some(10), "validation covers the 10 validation pairs");
    let line = std::fs::read_to_string(run_dir.join("metrics.jsonl")).unwrap();
    for key in [
        "rewards/chosen",
        "rewards/rejected",
        "rewards/accuracies",
        "rewards/margins",
        "logps/chosen",
        "logps/rejected",
    ] {
        assert!(line.contains(&format!("\"{key}\"")), "metrics.jsonl lacks {key}");
    }
    assert_eq!(RunManifest::read(&run_dir).unwrap().config.method, Method::Dpo);

    let mut part = config(dir.path(), "part", Method::Dpo, 6);
    part.lora.dropout = 0.1;
    part.save_every = 3;
    part.val_every = 3;
    let _ = run_with(&part, BaseQuant::None, |e| matches!(e, TrainEvent::CheckpointSaved { step: 3, .. }));
    let resume = TrainConfig { resume: Some(dir.path().join("part/checkpoint-3")), ..part };
    let (second, r) = run(&resume);
    r.unwrap();
    let resumed = step_losses(&second);
    assert_eq!(resumed.iter().map(|s| s.0).collect::<Vec<_>>(), vec![4, 5, 6]);
    for (step, loss) in resumed {
        assert_eq!(loss, losses[step - 1].1, "step {step}: resumed vs uninterrupted");
    }
    let weights = |d: &Path| {
        candle_core::safetensors::load(d.join("checkpoint-6/adapter_model.safetensors"), &Device::Cpu).unwrap()
    };
    let (a, b) = (weights(&run_dir), weights(&dir.path().join("part")));
    for (name, t) in &a {
        let diff: f32 = (t - &b[name]).unwrap().abs().unwrap().max_all().unwrap().to_scalar().unwrap();
        assert_eq!(diff, 0.0, "{name}");
    }
}

#[test]
fn orpo_and_dpo_train_on_a_quantized_base_with_checkpointing_and_dora() {
    let dir = tempfile::tempdir().unwrap();
    for (method, dora) in [(Method::Orpo, false), (Method::Dpo, true)] {
        let mut cfg = config(dir.path(), &format!("{}-{dora}", method.name()), method, 10);
        cfg.quantize = BaseQuant::Q8_0;
        cfg.checkpointing = train::Checkpointing::On;
        cfg.lora.dora = dora;
        let (events, r) = run_with(&cfg, BaseQuant::Q8_0, |_| false);
        let run_dir = r.unwrap();
        let losses = step_losses(&events);
        let (first, last) =
            (losses[..2].iter().map(|l| l.1).sum::<f64>(), losses[8..].iter().map(|l| l.1).sum::<f64>());
        assert!(last < first, "{}: {losses:?}", method.name());
        assert!(run_dir.join("checkpoint-10/adapter_model.safetensors").exists());
    }
}

#[test]
fn checkpointing_gives_the_same_preference_gradients() {
    let m = load_model(&fixture("tiny-llama"), &Device::Cpu, DType::F32).unwrap();
    let settings = LoraSettings { rank: 4, alpha: 8.0, targets: "all-linear".parse().unwrap(), ..Default::default() };
    let spec = data::TokenizeSpec::for_model(&m, 96, false);
    let prepared =
        data::prepare_dataset(&sample_pairs(), &spec, &data::DataOptions { max_seq_len: 96, ..Default::default() })
            .unwrap();
    let batch = data::collate_pairs(&prepared.train, &[0, 1, 2], m.eos_token_ids[0]).unwrap();
    for method in [Method::Dpo, Method::Orpo] {
        let mut model = m.model.clone();
        let params = lora::attach_new_adapters(&mut model, &settings, 3).unwrap();
        for p in &params {
            p.b.set(&Tensor::randn(0f32, 0.2, p.b.shape(), &Device::Cpu).unwrap()).unwrap();
        }
        let objective = PreferenceObjective::new(method, PreferenceSettings::default(), &m.model);
        let grads = |checkpointing| {
            objective.loss_and_gradients(&model, &batch, 1.0, Pass { checkpointing, ..Pass::default() }).unwrap()
        };
        let ((plain_metrics, plain), (ckpt_metrics, ckpt)) = (grads(false), grads(true));
        assert!((plain_metrics.loss - ckpt_metrics.loss).abs() < 1e-9);
        for p in &params {
            for var in [&p.a, &p.b] {
                let (a, b) = (plain.grads.get(var.as_tensor()).unwrap(), ckpt.grads.get(var.as_tensor()).unwrap());
                let size: f32 = a.abs().unwrap().max_all().unwrap().to_scalar().unwrap();
                let diff: f32 = (a - b).unwrap().abs().unwrap().max_all().unwrap().to_scalar().unwrap();
                assert!(
                    size > 0.0 && diff <= 1e-6 * size,
                    "{method:?} layer {} {}: {diff} of {size}",
                    p.layer,
                    p.module
                );
            }
        }
    }
}

#[test]
fn data_that_does_not_fit_the_method_is_refused_before_training() {
    let dir = tempfile::tempdir().unwrap();
    let sft_on_pairs = config(dir.path(), "sft", Method::Sft, 2);
    let err = run(&sft_on_pairs).1.unwrap_err().to_string();
    assert!(err.contains("dpo") && err.contains("orpo"), "{err}");
    let dpo_on_chat = TrainConfig { data: sample_data(), ..config(dir.path(), "dpo", Method::Dpo, 2) };
    let err = run(&dpo_on_chat).1.unwrap_err().to_string();
    assert!(err.contains("chosen") || err.contains("preference"), "{err}");
    let bad_beta = TrainConfig { beta: -1.0, ..config(dir.path(), "beta", Method::Dpo, 2) };
    assert!(run(&bad_beta).1.unwrap_err().to_string().contains("--beta"));
    for name in ["sft", "dpo", "beta"] {
        assert!(!dir.path().join(name).join("checkpoint-1").exists(), "{name}: nothing was trained");
    }
}

#[test]
fn the_cli_evaluates_an_adapter_on_pairs_as_json() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_metal-candle"))
        .args(["eval", "--task", "preference", "--method", "dpo", "--beta", "0.1", "--device", "cpu", "--dtype", "f32"])
        .arg("--model")
        .arg(fixture("tiny-llama"))
        .arg("--adapter")
        .arg(fixture("preference/tiny-llama-adapter"))
        .arg("--data")
        .arg(fixture("preference/rows-standard.jsonl"))
        .args(["--seq-len", "64", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let metrics = report["targets"][0]["metrics"].as_array().unwrap();
    let accuracy = metrics.iter().find(|m| m["name"] == "rewards/accuracies").unwrap()["value"].as_f64().unwrap();
    let fixture_json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("preference/expected.json")).unwrap()).unwrap();
    let expected = fixture_json["metrics"]["standard"]["dpo_sigmoid"]["rewards/accuracies"].as_f64().unwrap();
    assert!((accuracy - expected).abs() < 1e-6, "{accuracy} vs TRL {expected}");
    assert_eq!(report["targets"][0]["rows"].as_array().unwrap().len(), 6);
    // Preference flags on another task are refused.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_metal-candle"))
        .args(["eval", "--task", "loss", "--method", "dpo", "--model"])
        .arg(fixture("tiny-llama"))
        .arg("--data")
        .arg(fixture("preference/rows-standard.jsonl"))
        .output()
        .unwrap();
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("--task preference"));
}
