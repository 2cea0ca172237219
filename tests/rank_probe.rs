//! Issue 33, item 2 in the engine and the worker: rank probes run at the settings' LoRA scale and say which
//! alpha that was; the memory a probe reports is what that probe added (a bigger adapter adds its parameters,
//! gradients and AdamW moments), not the process's whole memory; the one-step measurement and every probe
//! report the times a sweep estimate multiplies; a sweep asked for while the measurement runs still starts; and
//! `bench ranks` prints the scale and each probe's alpha.
//!
//! The in-process parts share one test function on purpose: the heap count is process-wide and a watch's peak
//! is reset by the next one to open, while the tests of one binary run in parallel threads. The CLI test runs
//! in its own process.

mod common;

use candle_core::{DType, Device};
use common::fixture;
use metal_candle::engine::memory_watch::MemoryMeasure;
use metal_candle::engine::model::load_model;
use metal_candle::engine::rank_probe::{calibrate, rank_probe};
use metal_candle::engine::train::{LoraSettings, TrainConfig, TrainControl};
use metal_candle::engine::ErrorKind;
use metal_candle::worker::{Command, Event, Worker};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn config(out: &Path) -> TrainConfig {
    TrainConfig {
        model: fixture("tiny-llama"),
        data: Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/sample-chat"),
        out: out.to_path_buf(),
        // Scale 4: alpha 32 at rank 8.
        lora: LoraSettings { rank: 8, alpha: 32.0, targets: "all-linear".parse().unwrap(), ..Default::default() },
        batch_size: 4,
        seq_len: 96,
        lr: 5e-3,
        val_batches: 2,
        device: metal_candle::engine::device::DeviceChoice::Cpu,
        ..Default::default()
    }
}

#[test]
fn rank_probes_in_the_engine_and_through_the_worker() {
    probes_keep_the_scale_report_their_alpha_and_the_memory_their_adapter_added();
    a_sweep_asked_for_during_the_speed_measurement_starts_after_it();
}

fn probes_keep_the_scale_report_their_alpha_and_the_memory_their_adapter_added() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let base = load_model(&cfg.model, &Device::Cpu, DType::F32).unwrap();
    let budget = 1_500;
    let results = rank_probe(&base, &cfg, &[1, 64], budget, &TrainControl::default(), &mut |_| {}).unwrap();
    let (small, big) = (&results[0], &results[1]);

    // Alpha follows the rank at the settings' scale, and says so.
    assert_eq!((small.alpha, big.alpha), (4.0, 256.0));
    assert!(results.iter().all(|r| r.lora_scale() == 4.0 && !r.use_rslora));

    // Memory: measured on the heap (CPU tensors), per probe. Every probe trains on the same batches, so what
    // differs is the adapter: its parameters, their gradients and AdamW's two moments (four f32 copies), plus the
    // rank-wide activations x·A each adapted linear keeps for its backward (here about as much again).
    assert!(results.iter().all(|r| r.memory.measure == MemoryMeasure::Heap));
    let adapter_bytes = |r: &metal_candle::engine::rank_probe::RankProbeResult| r.trainable_params as u64 * 4;
    let grown = big.memory.added_bytes as i64 - small.memory.added_bytes as i64;
    let adapter_grown = (adapter_bytes(big) - adapter_bytes(small)) as i64;
    assert!(
        grown >= 3 * adapter_grown && grown <= 10 * adapter_grown + (1 << 20),
        "rank 64 added {grown} bytes more than rank 1; its adapter is {adapter_grown} bytes bigger"
    );
    // What the probe added is far below what the process holds (the base weights are not in it).
    let peak = big.memory.peak_bytes.expect("Linux reports the peak resident memory");
    assert!(big.memory.added_bytes < peak, "{} vs {peak}", big.memory.added_bytes);

    // Times: the plan reproduces the probe's step count, and the parts are measured.
    for r in &results {
        assert_eq!(r.plan.steps(budget), r.steps);
        assert!(r.plan.val_batches == 2 && r.timing.step_secs > 0.0 && r.timing.first_step_secs > 0.0);
        assert!(r.timing.val_batch_secs > 0.0, "{:?}", r.timing);
    }

    // The measurement before a sweep: the same plan, its own times.
    let (plan, timing) = calibrate(&base, &cfg, 8, &TrainControl::default()).unwrap();
    assert_eq!(plan, small.plan);
    assert!(timing.first_step_secs > 0.0 && timing.step_secs > 0.0 && timing.val_batch_secs > 0.0);
    let estimate = timing.sweep_secs(&plan, budget, 2);
    assert!(estimate > 0.0 && estimate.is_finite());

    // A stopped measurement says so.
    let stopped = TrainControl::default();
    stopped.request_stop();
    assert!(matches!(calibrate(&base, &cfg, 8, &stopped), Err(metal_candle::engine::Error::Cancelled)));
}

/// The studio measures speed when the rank page opens and the user may press Run at once: the worker stops the
/// measurement and starts the sweep after it, and nothing is refused.
fn a_sweep_asked_for_during_the_speed_measurement_starts_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let w = Worker::spawn(Arc::new(|| {}));
    w.send(Command::LoadModel {
        path: cfg.model.clone(),
        device: cfg.device,
        dtype: Default::default(),
        quantize: Default::default(),
    });
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut events = Vec::new();
    loop {
        assert!(Instant::now() < deadline, "the worker did not finish in time: {events:?}");
        let Some(event) = w.try_recv() else {
            std::thread::sleep(Duration::from_millis(2));
            continue;
        };
        match event {
            Event::ModelLoaded(_) => {
                // Back to back: the sweep arrives while the measurement is still preparing its data.
                w.send(Command::CalibrateRankProbe { config: Box::new(cfg.clone()), rank: 8 });
                w.send(Command::RankProbe { config: Box::new(cfg.clone()), ranks: vec![2, 4], token_budget: 600 });
            }
            Event::RankProbeCalibrated { .. } => events.push("calibrated".to_string()),
            Event::RankCalibrationFailed { error } => {
                assert_eq!(error.kind, ErrorKind::Cancelled, "{error:?}");
                events.push("calibration stopped".into());
            }
            Event::RankProbeResult(r) => events.push(format!("rank {}", r.rank)),
            Event::RankProbeFinished { .. } => break,
            Event::RankProbeFailed { error } => panic!("the sweep was refused or failed: {error:?} after {events:?}"),
            Event::ModelLoadFailed { error, .. } => panic!("{error:?}"),
            _ => {}
        }
    }
    assert_eq!(events.len(), 3, "{events:?}");
    assert!(events[0].starts_with("calibrat"), "the measurement ended first: {events:?}");
    assert_eq!(events[1..], ["rank 2".to_string(), "rank 4".to_string()]);
}

/// `bench ranks` prints the scale it probes at and each probe's alpha (its own process: no shared heap count).
#[test]
fn the_cli_prints_the_scale_and_each_probes_alpha() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_metal-candle"))
        .args(["bench", "ranks", "--ranks", "2,8", "--token-budget", "300", "--model"])
        .arg(fixture("tiny-llama"))
        .arg("--data")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/sample-chat"))
        .args(["--device", "cpu", "--rank", "4", "--alpha", "12", "--batch-size", "2", "--seq-len", "64"])
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("at LoRA scale 3.00 (alpha = 3.00 x rank, from --alpha 12 / --rank 4)"), "{stderr}");
    let alphas: Vec<(String, String)> = stdout
        .lines()
        .skip(1)
        .map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            (cols[0].to_string(), cols[1].to_string())
        })
        .collect();
    assert_eq!(alphas, [("2".into(), "6.00".into()), ("8".into(), "24.00".into())], "{stdout}");
    assert!(stderr.contains("memory: CPU: \"added\" is the peak of heap memory"), "{stderr}");
    let bad = std::process::Command::new(env!("CARGO_BIN_EXE_metal-candle"))
        .args(["bench", "ranks", "--ranks", "0,8", "--model", "x", "--data", "y"])
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--ranks must list ranks of at least 1"));
}
