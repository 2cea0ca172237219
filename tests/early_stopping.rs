//! Early stopping, the best checkpoint and the checkpoint limit (issue 32), on tiny-llama and the sample data: a
//! run whose learning rate makes the validation loss turn back up stops before its last step (exit code 0, the
//! reason printed), run.json names its best checkpoint and that checkpoint holds the recorded loss;
//! `--save-total-limit 1` keeps the newest and the best only; a run stopped mid-way and resumed stops at the same
//! step with the same best as an uninterrupted one (the patience counter and the best travel in the checkpoint);
//! and bad settings are refused before any work starts.

mod common;

use candle_core::{DType, Device};
use common::cli::{sample_data, train_command};
use common::fixture;
use metal_candle::engine::checkpoint::{BestCheckpoint, TrainerState};
use metal_candle::engine::model::{load_model, LoadedModel};
use metal_candle::engine::train::early_stop::EarlyStop;
use metal_candle::engine::train::run_folder::{read_metrics, RunManifest};
use metal_candle::engine::train::{self, LoraSettings, Schedule, TrainConfig, TrainControl, TrainEvent};
use std::path::{Path, PathBuf};

/// A learning rate this high, held constant and unclipped, makes the validation loss fall and then rise again.
const DIVERGING: [&str; 10] =
    ["--lr", "1.0", "--schedule", "constant", "--max-grad-norm", "0", "--warmup", "0", "--val-every", "2"];

fn config(out: &Path, name: &str) -> TrainConfig {
    TrainConfig {
        model: fixture("tiny-llama"),
        data: sample_data(),
        out: out.to_path_buf(),
        run_name: Some(name.into()),
        lora: LoraSettings { rank: 4, alpha: 8.0, ..Default::default() },
        iters: Some(40),
        batch_size: 4,
        seq_len: 96,
        lr: 1.0,
        schedule: Schedule::Constant,
        warmup: Some(0),
        max_grad_norm: None,
        val_every: 2,
        save_every: 2,
        early_stopping_patience: 2,
        device: metal_candle::engine::device::DeviceChoice::Cpu,
        ..Default::default()
    }
}

fn base() -> LoadedModel {
    load_model(&fixture("tiny-llama"), &Device::Cpu, DType::F32).unwrap()
}

/// Train `cfg`, calling `on_event` with each event and the run's control; the events and the run folder.
fn train(cfg: &TrainConfig, mut on_event: impl FnMut(&TrainEvent, &TrainControl)) -> (Vec<TrainEvent>, PathBuf) {
    let control = TrainControl::default();
    let mut events = Vec::new();
    let run_dir = train::run_training(cfg, &base(), &control, &mut |e| {
        on_event(&e, &control);
        events.push(e);
    })
    .unwrap();
    (events, run_dir)
}

fn finished(events: &[TrainEvent]) -> (usize, bool, Option<EarlyStop>) {
    match events.last() {
        Some(TrainEvent::Finished { step, stopped_early, early_stop, .. }) => {
            (*step, *stopped_early, early_stop.clone())
        }
        other => panic!("the run did not finish: {other:?}"),
    }
}

fn state_of(checkpoint: &Path) -> TrainerState {
    serde_json::from_str(&std::fs::read_to_string(checkpoint.join("trainer_state.json")).unwrap()).unwrap()
}

/// The steps of the checkpoint folders in `run_dir`, ascending.
fn checkpoint_steps(run_dir: &Path) -> Vec<usize> {
    let mut steps: Vec<usize> = std::fs::read_dir(run_dir)
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.strip_prefix("checkpoint-")?.parse().ok())
        .collect();
    steps.sort_unstable();
    steps
}

/// (step, validation loss, new best) of every evaluation recorded in `run_dir`'s metrics.jsonl.
fn evals(run_dir: &Path) -> Vec<(usize, f64, bool)> {
    read_metrics(run_dir)
        .into_iter()
        .filter_map(|e| match e {
            TrainEvent::Eval { step, val_loss, best, .. } => Some((step, val_loss, best)),
            _ => None,
        })
        .collect()
}

#[test]
fn a_diverging_run_stops_early_and_run_json_names_its_best_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let out = train_command(dir.path(), "diverging")
        .args(DIVERGING)
        .args(["--iters", "40", "--save-every", "0", "--early-stopping-patience", "2"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "an early stop is a clean finish: {stderr}");
    assert!(stderr.contains("new best"), "evaluations say when they set a new best: {stderr}");
    assert!(stderr.contains("stopped early: validation loss stopped improving"), "{stderr}");

    let run_dir = dir.path().join("diverging");
    let evals = evals(&run_dir);
    let (stop_step, _, _) = *evals.last().unwrap();
    assert!(stop_step < 40, "the run stopped before its last step (at {stop_step})");
    let lowest = evals.iter().copied().min_by(|a, b| a.1.total_cmp(&b.1)).unwrap();
    let manifest = RunManifest::read(&run_dir).unwrap();
    let best = manifest.best_checkpoint.expect("run.json names the best checkpoint");
    assert_eq!((best.step, best.val_loss), (lowest.0, lowest.1), "the best is the lowest validation loss");
    assert!(best.step < stop_step, "the loss rose after the best");
    // The two evaluations after the best did not improve: patience 2 ran out at the second.
    assert_eq!(evals.iter().filter(|e| e.0 > best.step).count(), 2, "{evals:?}");
    assert!(evals.iter().filter(|e| e.2).all(|e| e.0 <= best.step), "a new best is never after the best");

    // --save-every 0 saves only at the end, but every new best was saved when it was found.
    let best_dir = run_dir.join(format!("checkpoint-{}", best.step));
    assert_eq!(state_of(&best_dir).val_loss, Some(best.val_loss), "the best checkpoint holds the recorded loss");
    assert!(run_dir.join(format!("checkpoint-{stop_step}")).is_dir(), "the final save");
    let saved_bests: Vec<usize> = evals.iter().filter(|e| e.2).map(|e| e.0).collect();
    assert_eq!(checkpoint_steps(&run_dir), [saved_bests, vec![stop_step]].concat());

    let metrics = read_metrics(&run_dir);
    let Some(TrainEvent::Finished { step, stopped_early, early_stop: Some(early), .. }) = metrics.last() else {
        panic!("metrics.jsonl ends with an early stop: {:?}", metrics.last());
    };
    assert_eq!((*step, *stopped_early), (stop_step, false), "stopped by patience, not by the user");
    assert_eq!(early.best, Some(best));
    assert_eq!((early.evals_without_improvement, early.patience), (2, 2));
}

#[test]
fn save_total_limit_1_keeps_only_the_newest_and_the_best() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = TrainConfig {
        iters: Some(24),
        save_every: 1,
        early_stopping_patience: 0,
        save_total_limit: Some(1),
        ..config(dir.path(), "limit")
    };
    let (events, run_dir) = train(&cfg, |_, _| {});
    let best = RunManifest::read(&run_dir).unwrap().best_checkpoint.expect("a best");
    assert!(best.step < 24, "the best came early (step {}), so the limit had to keep it", best.step);
    assert_eq!(checkpoint_steps(&run_dir), [best.step, 24], "the best and the newest survive, nothing else");
    assert_eq!(state_of(&run_dir.join(format!("checkpoint-{}", best.step))).val_loss, Some(best.val_loss));
    let removed: Vec<PathBuf> = events
        .iter()
        .filter_map(|e| match e {
            TrainEvent::CheckpointsRemoved { paths, .. } => Some(paths.clone()),
            _ => None,
        })
        .flatten()
        .collect();
    assert_eq!(removed.len(), 24 - 2, "every other checkpoint was removed once: {removed:?}");
    assert!(removed.iter().all(|p| p.parent() == Some(run_dir.as_path())), "only inside the run folder");
    assert!(!removed.contains(&run_dir.join(format!("checkpoint-{}", best.step))), "the best was never removed");
}

#[test]
fn a_resumed_run_keeps_the_best_and_the_patience_counter() {
    let dir = tempfile::tempdir().unwrap();
    let limited = |name| TrainConfig { save_total_limit: Some(1), ..config(dir.path(), name) };
    let (whole_events, whole) = train(&limited("whole"), |_, _| {});
    let (whole_stop, _, whole_early) = finished(&whole_events);
    let whole_early = whole_early.expect("the uninterrupted run stops early");
    assert!(whole_stop < 40);

    // The same run, stopped at the first checkpoint saved while an evaluation had not improved (so the counter is
    // not zero there), then resumed from it.
    let mut stopped_at = None;
    let (events, part) = train(&limited("part"), |e, control| {
        if let TrainEvent::CheckpointSaved { step, path } = e {
            if stopped_at.is_none() && state_of(path).evals_without_improvement > 0 {
                stopped_at = Some(*step);
                control.request_stop();
            }
        }
    });
    let stopped_at = stopped_at.expect("a checkpoint with a non-zero patience counter");
    assert_eq!(finished(&events).0, stopped_at);
    assert!(finished(&events).1, "stopped by the user");
    let ckpt = part.join(format!("checkpoint-{stopped_at}"));
    let saved = state_of(&ckpt);
    assert!(saved.best.is_some_and(|b| b.step < stopped_at), "the best so far travels in the checkpoint");

    let resume = TrainConfig { resume: Some(ckpt), ..limited("part") };
    let (events, resumed) = train(&resume, |_, _| {});
    assert_eq!(resumed, part, "resumed in place");
    let (stop, stopped_early, early) = finished(&events);
    assert_eq!((stop, stopped_early), (whole_stop, false), "the resumed run stops where the uninterrupted one did");
    assert_eq!(early.as_ref(), Some(&whole_early), "with the same best and counter");
    let best: Option<BestCheckpoint> = RunManifest::read(&part).unwrap().best_checkpoint;
    assert_eq!(best, RunManifest::read(&whole).unwrap().best_checkpoint);
    // The limit kept the best from before the resume.
    assert_eq!(checkpoint_steps(&part), checkpoint_steps(&whole));
    assert_eq!(checkpoint_steps(&part), [best.unwrap().step, stop]);

    // Resuming the early-stopped run ends again at once, changing nothing.
    let again = TrainConfig { resume: Some(part.join(format!("checkpoint-{stop}"))), ..limited("part") };
    let (events, _) = train(&again, |_, _| {});
    assert_eq!(finished(&events).0, stop);
    assert!(finished(&events).2.is_some());
    assert!(!events.iter().any(|e| matches!(e, TrainEvent::Step { .. })), "no step was trained");
}

/// `train` with `args` (on `data`, else the sample data) must fail, writing nothing; its stderr.
fn refused(args: &[&str], data: Option<&Path>) -> String {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_metal-candle"))
        .args(["train", "--model"])
        .arg(fixture("tiny-llama"))
        .arg("--data")
        .arg(data.map_or_else(sample_data, Path::to_path_buf))
        .arg("--out")
        .arg(dir.path())
        .args(["--name", "refused", "--device", "cpu", "--seq-len", "96"])
        .args(args)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "{args:?} ran: {stderr}");
    assert!(!dir.path().join("refused").exists(), "{args:?}: nothing was written before the refusal");
    stderr
}

#[test]
fn bad_settings_are_refused_before_any_work_starts() {
    let dir = tempfile::tempdir().unwrap();
    // One training row and no valid.jsonl: nothing can be held out for validation.
    let one_row = dir.path().join("one.jsonl");
    let row = include_str!("../assets/sample-chat/train.jsonl").lines().next().unwrap();
    std::fs::write(&one_row, format!("{row}\n")).unwrap();
    let err = refused(&["--iters", "4", "--early-stopping-patience", "2"], Some(&one_row));
    assert!(err.contains("early stopping") && err.contains("no validation rows") && err.contains("one.jsonl"), "{err}");

    let err = refused(&["--iters", "4", "--early-stopping-patience", "2", "--val-every", "0"], None);
    assert!(err.contains("--val-every") && err.contains("--early-stopping-patience"), "{err}");
    let err = refused(&["--iters", "4", "--save-total-limit", "0"], None);
    assert!(err.contains("--save-total-limit") && err.contains("1 to"), "{err}");
    let err = refused(&["--iters", "4", "--early-stopping-min-delta", "-0.1", "--early-stopping-patience", "1"], None);
    assert!(err.contains("--early-stopping-min-delta"), "{err}");

    // The settings file knows the same settings (and the same refusal).
    let toml = dir.path().join("settings.toml");
    std::fs::write(&toml, "early_stopping_patience = 3\nearly_stopping_min_delta = 0.01\nval_every = 0\n").unwrap();
    let err = refused(&["--iters", "4", "--config", toml.to_str().unwrap()], None);
    assert!(err.contains("patience 3") && err.contains("--val-every"), "{err}");
    std::fs::write(&toml, "save_total_limit = 2\nearly_stopping_patience = 1\nval_every = 2\n").unwrap();
    let cfg = TrainConfig::from_toml_file(&toml).unwrap();
    assert_eq!((cfg.save_total_limit, cfg.early_stopping_patience), (Some(2), 1));
}
