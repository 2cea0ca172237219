//! Engine rules that every front end shares, checked across the front ends: the CLI and the studio refuse the
//! same settings with the same words; run.json and adapter_config.json round-trip through their types (and a
//! run.json from before versioning still loads); an adapter that does not match the model is refused naming
//! the module; errors keep their kind from the engine through the worker.

mod common;

use candle_core::{DType, Device, Tensor};
use common::fixture;
use metal_candle::engine::checkpoint::{self, PeftAdapterConfig, ADAPTER_WEIGHTS};
use metal_candle::engine::device::{DTypeChoice, DeviceChoice};
use metal_candle::engine::model::load_model;
use metal_candle::engine::train::run_folder::RunManifest;
use metal_candle::engine::train::{LoraSettings, TrainConfig, TrainEvent};
use metal_candle::engine::ErrorKind;
use metal_candle::worker::{Command, Event, Worker};
use std::path::{Path, PathBuf};
use std::process::Command as Process;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn sample_data() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/sample-chat")
}

fn next_event(w: &Worker, mut wanted: impl FnMut(&Event) -> bool) -> Event {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(e) = w.try_recv() {
            if wanted(&e) {
                return e;
            }
            continue;
        }
        assert!(Instant::now() < deadline, "no matching event within 60 s");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The CLI's refusal of `args` (stderr), which must come before any run folder is made.
fn cli_refusal(out: &Path, args: &[&str]) -> String {
    let output = Process::new(env!("CARGO_BIN_EXE_metal-candle"))
        .args(["train", "--model"])
        .arg(fixture("tiny-llama"))
        .arg("--data")
        .arg(sample_data())
        .arg("--out")
        .arg(out)
        .args(["--name", "refused", "--device", "cpu", "--iters", "2"])
        .args(args)
        .output()
        .unwrap();
    assert!(!output.status.success(), "the CLI accepted {args:?}");
    assert!(!out.join("refused").exists(), "the CLI started work before refusing {args:?}");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// The worker's refusal of `config` (the studio's Start sends exactly this command).
fn worker_refusal(w: &Worker, config: &TrainConfig) -> (String, ErrorKind) {
    w.send(Command::StartTraining(Box::new(config.clone())));
    match next_event(w, |e| matches!(e, Event::Train(TrainEvent::Failed { .. }))) {
        Event::Train(TrainEvent::Failed { message, kind, .. }) => (message, kind),
        _ => unreachable!(),
    }
}

#[test]
fn cli_and_studio_refuse_the_same_settings_with_the_same_message() {
    let dir = tempfile::tempdir().unwrap();
    let w = Worker::spawn(Arc::new(|| {}));
    w.send(Command::LoadModel {
        path: fixture("tiny-llama"),
        device: DeviceChoice::Cpu,
        dtype: DTypeChoice::Auto,
        quantize: Default::default(),
    });
    let summary = match next_event(&w, |e| matches!(e, Event::ModelLoaded(_) | Event::ModelLoadFailed { .. })) {
        Event::ModelLoaded(s) => *s,
        other => panic!("{other:?}"),
    };
    let base = TrainConfig {
        model: fixture("tiny-llama"),
        data: sample_data(),
        out: dir.path().to_path_buf(),
        run_name: Some("refused".into()),
        iters: Some(2),
        device: DeviceChoice::Cpu,
        ..Default::default()
    };
    // Beyond the model's context (256 tokens), more layers than it has, and a plain bad number.
    let cases: [(&[&str], TrainConfig); 3] = [
        (&["--seq-len", "512"], TrainConfig { seq_len: 512, ..base.clone() }),
        (
            &["--layers", "3"],
            TrainConfig { seq_len: 64, lora: LoraSettings { layers: Some(3), ..Default::default() }, ..base.clone() },
        ),
        (&["--weight-decay=-1"], TrainConfig { seq_len: 64, weight_decay: -1.0, ..base.clone() }),
    ];
    for (args, config) in cases {
        let args: Vec<&str> =
            if args[0] == "--seq-len" { args.to_vec() } else { [args, &["--seq-len", "64"]].concat() };
        let engine = config.validate_for_model(summary.shape.limits()).unwrap_err().to_string();
        let cli = cli_refusal(dir.path(), &args);
        assert!(cli.contains(&engine), "CLI said {cli:?}, the engine says {engine:?}");
        let (worker, kind) = worker_refusal(&w, &config);
        assert_eq!(worker, engine);
        assert_eq!(kind, ErrorKind::Setting);
        #[cfg(feature = "studio")]
        {
            use metal_candle::studio::app::Prefs;
            let prefs = Prefs { train: config.clone(), device: DeviceChoice::Cpu, ..Prefs::default() };
            let studio = metal_candle::studio::settings_panel::ready_config(&prefs, Some(&summary), Some(&config.data));
            assert_eq!(studio.unwrap_err(), engine, "the studio's Start button shows the engine's words");
        }
    }
    assert!(std::fs::read_dir(dir.path()).unwrap().next().is_none(), "nothing was written");
}

#[test]
fn a_run_json_from_before_versioning_still_loads() {
    let manifest = RunManifest::read(&fixture("run-v0")).unwrap();
    assert_eq!(manifest.version, 0);
    assert_eq!(manifest.name, "v0");
    assert_eq!(manifest.config.lora.rank, 4);
    assert_eq!(manifest.config.iters, Some(40));
    assert_eq!(manifest.model, PathBuf::from("tests/fixtures/tiny-llama"));
    assert_eq!(manifest.started_unix_secs, 1_795_300_000);
    // And through the run browser's listing.
    let runs = tempfile::tempdir().unwrap();
    std::fs::create_dir(runs.path().join("v0")).unwrap();
    std::fs::copy(fixture("run-v0/run.json"), runs.path().join("v0/run.json")).unwrap();
    let listed = metal_candle::engine::train::run_folder::list_runs(runs.path()).unwrap();
    assert_eq!(listed[0].config.as_ref(), Some(&manifest.config));
    assert_eq!(listed[0].started_unix_secs, Some(1_795_300_000));
}

#[test]
fn run_json_round_trips_and_refuses_newer_versions() {
    let dir = tempfile::tempdir().unwrap();
    let config = TrainConfig { model: fixture("tiny-llama"), data: sample_data(), ..Default::default() };
    let manifest = RunManifest::new("r", &config);
    assert_eq!(manifest.version, metal_candle::engine::train::run_folder::RUN_MANIFEST_VERSION);
    manifest.write(dir.path()).unwrap();
    assert_eq!(RunManifest::read(dir.path()).unwrap(), manifest);
    let newer = RunManifest { version: metal_candle::engine::train::run_folder::RUN_MANIFEST_VERSION + 1, ..manifest };
    newer.write(dir.path()).unwrap();
    let err = RunManifest::read(dir.path()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Format);
    assert!(err.to_string().contains("newer metal-candle"), "{err}");
}

#[test]
fn adapter_config_round_trips_and_writes_what_it_always_wrote() {
    // all-linear as the trainer resolves it for the model's family (TrainConfig::for_model): llama's seven.
    let llama = metal_candle::engine::model::config::RawConfig::from_file(&fixture("tiny-llama/config.json"))
        .unwrap()
        .resolve(Path::new("config.json"))
        .unwrap();
    let targets = "all-linear".parse::<metal_candle::engine::lora::Targets>().unwrap().for_model(&llama).unwrap();
    let settings = LoraSettings { rank: 4, alpha: 8.0, targets, ..Default::default() };
    let cfg = PeftAdapterConfig::for_settings(&settings, 2, "tests/fixtures/tiny-llama").unwrap();
    // Byte for byte the adapter_config.json the previous release wrote for these settings (a PEFT-loadable file).
    let before = std::fs::read_to_string(fixture("ours-tiny-llama-adapter/adapter_config.json")).unwrap();
    assert_eq!(serde_json::to_string_pretty(&cfg).unwrap().trim(), before.trim());
    let dir = tempfile::tempdir().unwrap();
    cfg.write(dir.path()).unwrap();
    assert_eq!(PeftAdapterConfig::read(dir.path()).unwrap(), cfg);
    let last = LoraSettings { layers: Some(1), dropout: 0.1, use_rslora: true, ..settings };
    let cfg = PeftAdapterConfig::for_settings(&last, 2, "m").unwrap();
    cfg.write(dir.path()).unwrap();
    let text = std::fs::read_to_string(dir.path().join("adapter_config.json")).unwrap();
    assert!(text.contains("\"lora_dropout\": 0.1,") && text.contains("\"layers_to_transform\": [\n    1\n  ]"));
    assert_eq!(PeftAdapterConfig::read(dir.path()).unwrap(), cfg);
    // PEFT's own file, with all the keys PEFT adds.
    let peft = PeftAdapterConfig::read(&fixture("tiny-llama-peft")).unwrap();
    assert_eq!((peft.r, peft.lora_alpha, peft.use_rslora), (4, 8.0, false));
}

/// A copy of our tiny-llama adapter with its weights changed by `edit`.
fn edited_adapter(dir: &Path, edit: impl FnOnce(&mut std::collections::HashMap<String, Tensor>)) -> PathBuf {
    let src = fixture("ours-tiny-llama-adapter");
    let out = dir.join("adapter");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::copy(src.join("adapter_config.json"), out.join("adapter_config.json")).unwrap();
    let mut tensors = candle_core::safetensors::load(src.join(ADAPTER_WEIGHTS), &Device::Cpu).unwrap();
    edit(&mut tensors);
    candle_core::safetensors::save(&tensors, out.join(ADAPTER_WEIGHTS)).unwrap();
    out
}

fn refusal(adapter: &Path) -> String {
    let mut m = load_model(&fixture("tiny-llama"), &Device::Cpu, DType::F32).unwrap();
    let err = checkpoint::load_adapter(&mut m.model, adapter).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Adapter, "{err}");
    assert!(m.model.linears().iter().all(|(_, _, l)| l.adapter.is_none()), "nothing half attached");
    err.to_string()
}

#[test]
fn an_adapter_that_does_not_match_the_model_is_refused_naming_the_module() {
    let q1 = "base_model.model.model.layers.1.self_attn.q_proj";
    // A module the config promises but the file lacks.
    let dir = tempfile::tempdir().unwrap();
    let missing = edited_adapter(dir.path(), |t| {
        t.remove(&format!("{q1}.lora_A.weight"));
        t.remove(&format!("{q1}.lora_B.weight"));
    });
    let err = refusal(&missing);
    assert!(err.contains(q1) && err.contains("target_modules"), "{err}");

    // A module the model does not have (a third layer).
    let dir = tempfile::tempdir().unwrap();
    let extra = edited_adapter(dir.path(), |t| {
        let a = t[&format!("{q1}.lora_A.weight")].clone();
        t.insert("base_model.model.model.layers.2.self_attn.q_proj.lora_A.weight".into(), a);
    });
    let err = refusal(&extra);
    assert!(err.contains("layers.2.self_attn.q_proj") && err.contains("does not have"), "{err}");

    // Wrong shapes: lora_A of q_proj with 32 input features instead of 64.
    let dir = tempfile::tempdir().unwrap();
    let wrong = edited_adapter(dir.path(), |t| {
        t.insert(format!("{q1}.lora_A.weight"), Tensor::zeros((4, 32), DType::F32, &Device::Cpu).unwrap());
    });
    let err = refusal(&wrong);
    assert!(err.contains("layer 1 q_proj"), "{err}");

    // A lora_A without its lora_B.
    let dir = tempfile::tempdir().unwrap();
    let half = edited_adapter(dir.path(), |t| {
        t.remove(&format!("{q1}.lora_B.weight"));
    });
    let err = refusal(&half);
    assert!(err.contains(q1) && err.contains("lora_B"), "{err}");
}

#[test]
fn write_failures_keep_their_kind_through_the_worker() {
    let dir = tempfile::tempdir().unwrap();
    // The export target sits under a file, so its folder cannot be made: a write error, not a "training" one.
    let blocker = dir.path().join("file");
    std::fs::write(&blocker, "x").unwrap();
    let target = blocker.join("export");
    let ckpt = fixture("ours-tiny-llama-adapter");
    let err = metal_candle::engine::export::export(
        &ckpt,
        metal_candle::engine::export::ExportFormat::Peft,
        &target,
        &fixture("tiny-llama"),
    )
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Write, "{err}");
    assert!(err.to_string().starts_with("cannot write"), "{err}");

    let w = Worker::spawn(Arc::new(|| {}));
    w.send(Command::ExportCheckpoint {
        checkpoint: ckpt,
        format: metal_candle::engine::export::ExportFormat::Peft,
        quant: Default::default(),
        out: target,
        base_model: fixture("tiny-llama"),
        overwrite: false,
    });
    match next_event(&w, |e| matches!(e, Event::ActionFailed { .. } | Event::ExportFinished { .. })) {
        Event::ActionFailed { error, .. } => {
            assert_eq!(error.kind, ErrorKind::Write);
            assert_eq!(error.message, err.to_string());
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn resume_refuses_lora_settings_the_checkpoint_was_not_trained_with() {
    let dir = tempfile::tempdir().unwrap();
    let base = load_model(&fixture("tiny-llama"), &Device::Cpu, DType::F32).unwrap();
    let config = TrainConfig {
        model: fixture("tiny-llama"),
        data: sample_data(),
        out: dir.path().to_path_buf(),
        run_name: Some("r".into()),
        lora: LoraSettings { rank: 4, alpha: 8.0, ..Default::default() },
        iters: Some(2),
        seq_len: 64,
        batch_size: 2,
        device: DeviceChoice::Cpu,
        ..Default::default()
    };
    let control = metal_candle::engine::train::TrainControl::default();
    metal_candle::engine::train::run_training(&config, &base, &control, &mut |_| {}).unwrap();
    let ckpt = dir.path().join("r/checkpoint-2");
    let metrics_before = std::fs::read_to_string(dir.path().join("r/metrics.jsonl")).unwrap();
    let resume =
        |lora: LoraSettings| TrainConfig { lora, resume: Some(ckpt.clone()), iters: Some(4), ..config.clone() };
    for (lora, field) in [
        (LoraSettings { alpha: 256.0, ..config.lora.clone() }, "alpha"),
        (LoraSettings { targets: "all-linear".parse().unwrap(), ..config.lora.clone() }, "targets"),
        (LoraSettings { layers: Some(1), ..config.lora.clone() }, "layers"),
        (LoraSettings { rank: 8, ..config.lora.clone() }, "rank"),
    ] {
        let err = metal_candle::engine::train::run_training(&resume(lora), &base, &control, &mut |_| {}).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Setting, "{err}");
        assert!(err.to_string().contains(&format!("LoRA {field}")), "{err}");
    }
    let metrics_after = std::fs::read_to_string(dir.path().join("r/metrics.jsonl")).unwrap();
    assert_eq!(metrics_before, metrics_after, "a refused resume touches nothing");
    // The same settings resume fine.
    metal_candle::engine::train::run_training(&resume(config.lora.clone()), &base, &control, &mut |_| {}).unwrap();
}
