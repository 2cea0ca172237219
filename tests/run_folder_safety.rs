//! The trainer and its run folder when things on disk go wrong, through the engine: a run folder moved or
//! deleted mid-run stops the run (it is not recreated); a refused resume changes nothing on disk; leftovers
//! of an interrupted save are cleaned up on resume; a missing optimizer file is named as such; a dataset with
//! invalid UTF-8 names its line, and one that is not a regular file (or is huge) is refused before reading.

mod common;

use candle_core::{DType, Device};
use common::cli::sample_data;
use common::fixture;
use metal_candle::engine::model::{load_model, LoadedModel};
use metal_candle::engine::train::{self, LoraSettings, TrainConfig, TrainControl, TrainEvent};
use metal_candle::engine::{ErrorKind, Result};
use std::path::{Path, PathBuf};

fn config(out: &Path, name: &str, iters: usize) -> TrainConfig {
    TrainConfig {
        model: fixture("tiny-llama"),
        data: sample_data(),
        out: out.to_path_buf(),
        run_name: Some(name.into()),
        lora: LoraSettings { rank: 4, alpha: 8.0, ..Default::default() },
        iters: Some(iters),
        batch_size: 4,
        seq_len: 96,
        save_every: 2,
        device: metal_candle::engine::device::DeviceChoice::Cpu,
        ..Default::default()
    }
}

fn base() -> LoadedModel {
    load_model(&fixture("tiny-llama"), &Device::Cpu, DType::F32).unwrap()
}

fn train(cfg: &TrainConfig, on_event: &mut dyn FnMut(&TrainEvent)) -> (Vec<TrainEvent>, Result<PathBuf>) {
    let mut events = Vec::new();
    let result = train::run_training(cfg, &base(), &TrainControl::default(), &mut |e| {
        on_event(&e);
        events.push(e);
    });
    (events, result)
}

/// Every file under `dir` with its bytes.
fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(snapshot(&path));
        } else {
            out.push((path.clone(), std::fs::read(&path).unwrap()));
        }
    }
    out.sort();
    out
}

/// Fail naming the files that differ between two snapshots.
fn assert_unchanged(before: &[(PathBuf, Vec<u8>)], after: &[(PathBuf, Vec<u8>)], what: &str) {
    let changed: Vec<_> = before
        .iter()
        .filter(|b| !after.contains(b))
        .chain(after.iter().filter(|a| !before.contains(a)))
        .map(|(p, _)| p.display().to_string())
        .collect();
    assert!(changed.is_empty(), "{what} changed {changed:?}");
}

#[test]
fn a_run_folder_moved_or_deleted_mid_run_stops_the_run_without_recreating_it() {
    for moved in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let run_dir = dir.path().join("gone");
        let elsewhere = dir.path().join("elsewhere");
        let (events, result) = train(&config(dir.path(), "gone", 30), &mut |e| {
            if matches!(e, TrainEvent::CheckpointSaved { step: 2, .. }) {
                if moved {
                    std::fs::rename(&run_dir, &elsewhere).unwrap();
                } else {
                    std::fs::remove_dir_all(&run_dir).unwrap();
                }
            }
        });
        let err = result.unwrap_err();
        assert!(err.to_string().contains(&run_dir.display().to_string()), "{err}");
        assert!(err.to_string().contains("moved or deleted"), "{err}");
        assert!(matches!(events.last(), Some(TrainEvent::Failed { .. })));
        assert!(!run_dir.exists(), "the run folder was recreated");
        if moved {
            let metrics = std::fs::read_to_string(elsewhere.join("metrics.jsonl")).unwrap();
            assert!(!metrics.contains("\"finished\""), "the moved run was marked finished");
            assert!(elsewhere.join("checkpoint-2/adapter_model.safetensors").exists());
        }
    }
}

#[test]
fn a_refused_resume_changes_nothing_on_disk() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), "r", 4);
    train(&cfg, &mut |_| {}).1.unwrap();
    let run_dir = dir.path().join("r");
    let before = snapshot(&run_dir);
    // A dataset of another size: the saved data position does not exist in it.
    let small = dir.path().join("small");
    std::fs::create_dir(&small).unwrap();
    let rows: Vec<&str> = include_str!("../assets/sample-chat/train.jsonl").lines().take(3).collect();
    std::fs::write(small.join("train.jsonl"), rows.join("\n")).unwrap();
    let resume = TrainConfig { resume: Some(run_dir.join("checkpoint-2")), data: small, ..cfg.clone() };
    let err = train(&resume, &mut |_| {}).1.unwrap_err();
    assert!(err.to_string().contains("dataset"), "{err}");
    assert_unchanged(&before, &snapshot(&run_dir), "a resume refused for its dataset");

    // A checkpoint without its optimizer moments: named as such, and again nothing is touched.
    std::fs::remove_file(run_dir.join("checkpoint-2/optimizer.safetensors")).unwrap();
    let before = snapshot(&run_dir);
    let resume = TrainConfig { resume: Some(run_dir.join("checkpoint-2")), ..cfg };
    let err = train(&resume, &mut |_| {}).1.unwrap_err().to_string();
    assert!(err.contains("optimizer.safetensors") && err.contains("optimizer state"), "{err}");
    assert!(!err.contains("adapter weights"), "{err}");
    assert_unchanged(&before, &snapshot(&run_dir), "a resume refused for its optimizer file");
}

#[test]
fn leftovers_of_an_interrupted_save_are_cleaned_up_on_resume() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), "left", 4);
    train(&cfg, &mut |_| {}).1.unwrap();
    let run_dir = dir.path().join("left");
    std::fs::create_dir(run_dir.join(".checkpoint-99.partial")).unwrap();
    std::fs::write(run_dir.join(".checkpoint-99.partial/adapter_model.safetensors"), b"half").unwrap();
    let resume = TrainConfig { resume: Some(run_dir.join("checkpoint-4")), iters: Some(6), ..cfg };
    train(&resume, &mut |_| {}).1.unwrap();
    assert!(!run_dir.join(".checkpoint-99.partial").exists());
    assert!(run_dir.join("checkpoint-6/adapter_model.safetensors").exists());
}

#[test]
fn a_dataset_with_invalid_utf8_names_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("bad.jsonl");
    let good = include_str!("../assets/sample-chat/train.jsonl").lines().next().unwrap();
    let mut bytes = format!("{good}\n{good}\n").into_bytes();
    bytes.extend_from_slice(b"{\"text\": \"caf\xe9\"}\n");
    std::fs::write(&data, bytes).unwrap();
    let cfg = TrainConfig { data: data.clone(), ..config(dir.path(), "utf8", 2) };
    let err = train(&cfg, &mut |_| {}).1.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Dataset, "{err}");
    assert!(err.to_string().contains(&format!("{}:3", data.display())) && err.to_string().contains("UTF-8"), "{err}");
}

#[test]
fn a_dataset_that_is_not_a_regular_file_is_refused_before_reading() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = TrainConfig { data: PathBuf::from("/dev/zero"), ..config(dir.path(), "zero", 2) };
    let err = train(&cfg, &mut |_| {}).1.unwrap_err().to_string();
    assert!(err.contains("/dev/zero") && err.contains("not a regular file"), "{err}");
    assert!(!dir.path().join("zero").exists());
}
