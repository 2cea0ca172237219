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

#[test]
fn a_resume_from_an_earlier_checkpoint_branches_and_leaves_the_later_ones_alone() {
    let out = tempfile::tempdir().unwrap();
    let (_, result) = train(&config(out.path(), "r", 4), &mut |_| {});
    let run_dir = result.unwrap();
    let before = snapshot(&run_dir);
    let resume = TrainConfig { resume: Some(run_dir.join("checkpoint-2")), ..config(out.path(), "r", 6) };
    let (events, result) = train(&resume, &mut |_| {});
    let branch = result.unwrap();
    assert_eq!(branch, out.path().join("r-from-2"));
    let mut after = snapshot(&run_dir);
    // The parent's lock file is untouched too; only the branch was written.
    after.retain(|(p, _)| !p.ends_with(".lock"));
    let mut kept = before.clone();
    kept.retain(|(p, _)| !p.ends_with(".lock"));
    assert_unchanged(&kept, &after, "the parent of a branched resume");
    assert!(branch.join("checkpoint-6").is_dir() && !branch.join("checkpoint-2").exists());
    let manifest = train::run_folder::RunManifest::read(&branch).unwrap();
    let origin = manifest.branched_from.expect("run.json names its parent");
    assert_eq!((origin.run.as_path(), origin.step), (run_dir.as_path(), 2));
    let notes = events.iter().find_map(|e| match e {
        TrainEvent::Started { notes, .. } => Some(notes.join("\n")),
        _ => None,
    });
    assert!(notes.unwrap_or_default().contains("already has checkpoint-4 after checkpoint-2"));
    // The branch's metrics start with the parent's up to step 2.
    let steps: Vec<usize> =
        train::run_folder::read_metrics(&branch).iter().filter_map(train::run_folder::event_step).collect();
    assert!(steps.first().is_some_and(|s| *s <= 2) && steps.contains(&6), "{steps:?}");
    // A resume from the latest checkpoint continues in place.
    let (_, result) =
        train(&TrainConfig { resume: Some(branch.join("checkpoint-6")), ..config(out.path(), "r", 8) }, &mut |_| {});
    assert_eq!(result.unwrap(), branch);
}

#[test]
fn a_new_run_refuses_a_folder_holding_checkpoints_without_run_json() {
    let out = tempfile::tempdir().unwrap();
    let (_, result) = train(&config(out.path(), "r", 2), &mut |_| {});
    let run_dir = result.unwrap();
    std::fs::remove_file(run_dir.join("run.json")).unwrap();
    let before = snapshot(&run_dir);
    let (_, result) = train(&config(out.path(), "r", 2), &mut |_| {});
    let err = result.unwrap_err().to_string();
    assert!(err.contains("checkpoint-2") && err.contains("no run.json") && err.contains("--name"), "{err}");
    assert_unchanged(&before, &snapshot(&run_dir), "a refused run in a folder of foreign checkpoints");
}

#[test]
fn exports_refuse_their_own_inputs_and_existing_outputs() {
    use metal_candle::engine::export::{export_with, ExportFormat, ExportRequest, GgufQuant};
    let out = tempfile::tempdir().unwrap();
    let (_, result) = train(&config(out.path(), "r", 4), &mut |_| {});
    let run_dir = result.unwrap();
    let base_copy = out.path().join("base");
    std::fs::create_dir_all(&base_copy).unwrap();
    for f in std::fs::read_dir(fixture("tiny-llama")).unwrap().flatten() {
        std::fs::copy(f.path(), base_copy.join(f.file_name())).unwrap();
    }
    let request = |format: ExportFormat, to: PathBuf, overwrite: bool| ExportRequest {
        checkpoint: Some(run_dir.join("checkpoint-2")),
        format,
        quant: GgufQuant::Q8_0,
        out: to,
        base_model: base_copy.clone(),
        allow_other_base: false,
        overwrite,
    };
    let before = (snapshot(&run_dir), snapshot(&base_copy));
    for (format, to) in [
        (ExportFormat::Merged, base_copy.clone()),
        (ExportFormat::Peft, run_dir.join("checkpoint-2")),
        (ExportFormat::Peft, run_dir.join("checkpoint-4")),
        (ExportFormat::Peft, run_dir.clone()),
        (ExportFormat::Gguf, run_dir.join("run.json")),
        (ExportFormat::Gguf, base_copy.join("model.safetensors")),
    ] {
        let err = export_with(&request(format, to.clone(), true), &mut |_| {}).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Setting, "{}: {err}", to.display());
    }
    assert_unchanged(&before.0, &snapshot(&run_dir), "a run after refused exports");
    assert_unchanged(&before.1, &snapshot(&base_copy), "a base after refused exports");
    // The run's exports/ folder is free; a second export there needs --overwrite.
    let target = run_dir.join("exports/checkpoint-2-peft");
    export_with(&request(ExportFormat::Peft, target.clone(), false), &mut |_| {}).unwrap();
    let err = export_with(&request(ExportFormat::Peft, target.clone(), false), &mut |_| {}).unwrap_err();
    assert!(err.to_string().contains("already exists; pass --overwrite"), "{err}");
    export_with(&request(ExportFormat::Peft, target, true), &mut |_| {}).unwrap();
}

/// A full disk in the middle of a metrics line leaves no half line: the file is cut back to the last whole
/// event, and once there is room again the next event follows it on a line of its own. Needs a small tmpfs
/// (root); skipped where one cannot be mounted.
#[test]
fn a_full_disk_mid_line_leaves_metrics_whole() {
    use metal_candle::engine::train::run_folder::{append_metric, read_metrics};
    use std::process::Command;
    if unsafe { libc::getuid() } != 0 {
        eprintln!("skipped: mounting a small tmpfs needs root");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mount = dir.path().join("small");
    std::fs::create_dir_all(&mount).unwrap();
    let mounted = Command::new("mount").args(["-t", "tmpfs", "-o", "size=64k", "tmpfs"]).arg(&mount).status();
    if !mounted.is_ok_and(|s| s.success()) {
        eprintln!("skipped: this root cannot mount a tmpfs");
        return;
    }
    let result = std::panic::catch_unwind(|| {
        let run = mount.join("run");
        std::fs::create_dir_all(&run).unwrap();
        let step = |step| TrainEvent::Paused { step };
        append_metric(&run, &step(1)).unwrap();
        let whole = std::fs::metadata(run.join("metrics.jsonl")).unwrap().len();
        // Leave about 8 KB free, then try a 32 KB event.
        let filler = mount.join("filler");
        std::fs::write(&filler, vec![0u8; 52 << 10]).unwrap();
        let big = TrainEvent::Failed { step: 2, message: "x".repeat(32 << 10), kind: ErrorKind::Training };
        let err = append_metric(&run, &big).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Write, "{err}");
        assert_eq!(std::fs::metadata(run.join("metrics.jsonl")).unwrap().len(), whole, "cut back to the last line");
        std::fs::remove_file(&filler).unwrap();
        append_metric(&run, &step(3)).unwrap();
        assert_eq!(read_metrics(&run), vec![step(1), step(3)]);
        let text = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
        assert_eq!(text.lines().count(), 2, "{text}");
    });
    let _ = Command::new("umount").arg(&mount).status();
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
}
