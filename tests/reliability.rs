//! What a training process promises about its run folder when other processes, signals and the disk get in
//! the way, checked on the built binary: one process at a time holds a run folder (and the OS frees it when
//! that process dies); SIGTERM and SIGINT stop with a final checkpoint; a process killed at random points
//! during saves leaves only loadable checkpoints and resumes to the weights of an uninterrupted run; a full
//! disk stops the run with a write error and loses nothing saved before.

mod common;

use common::cli::*;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

fn with(mut command: Command, args: &[&str]) -> Command {
    command.args(args);
    command
}

fn newest_checkpoint(run_dir: &Path) -> Option<(usize, std::path::PathBuf)> {
    checkpoint_dirs(run_dir).pop()
}

fn no_leftovers(run_dir: &Path) -> bool {
    std::fs::read_dir(run_dir).unwrap().flatten().all(|e| !e.file_name().to_string_lossy().ends_with(".partial"))
}

#[test]
fn a_run_folder_is_held_by_one_process_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    // Two runs of the same name started at once: one trains, the other is refused naming the folder.
    let args = |seed: &'static str| ["--iters", "40", "--save-every", "2", "--seed", seed];
    let a = Running::spawn(with(train_command(dir.path(), "s"), &args("1")));
    let b = Running::spawn(with(train_command(dir.path(), "s"), &args("2")));
    let ((status_a, err_a), (status_b, err_b)) = (a.finish(), b.finish());
    assert_eq!(status_a.success() as u8 + status_b.success() as u8, 1, "exactly one runs:\n{err_a}\n{err_b}");
    let (winner_seed, loser_err) = if status_a.success() { (1, err_b) } else { (2, err_a) };
    let run_dir = dir.path().join("s");
    assert!(loser_err.contains(&run_dir.display().to_string()), "the refusal names the folder: {loser_err}");
    for (_, ckpt) in checkpoint_dirs(&run_dir) {
        let state: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(ckpt.join("trainer_state.json")).unwrap()).unwrap();
        assert_eq!(state["seed"], winner_seed, "{} was written by the refused run", ckpt.display());
    }
    assert!(no_leftovers(&run_dir));

    // While a run trains, resuming one of its checkpoints (or starting it again) is refused.
    let holder =
        Running::spawn(with(train_command(dir.path(), "held"), &["--json", "--iters", "100000", "--save-every", "2"]));
    let held = dir.path().join("held");
    holder.wait_for("checkpoint_saved", |_| true).expect("the run saves");
    for mut command in [resume_command(&held.join("checkpoint-2")), train_command(dir.path(), "held")] {
        let out = command.args(["--iters", "100000"]).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "a second process ran in a held folder");
        assert!(err.contains("in use") && err.contains(&held.display().to_string()), "{err}");
    }
    // The OS lets go of the folder when its holder dies, however it dies.
    holder.signal("KILL");
    holder.finish();
    let (step, newest) = newest_checkpoint(&held).unwrap();
    let out = with(resume_command(&newest), &["--iters", &(step + 2).to_string()]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(no_leftovers(&held), "the interrupted save of the killed holder was cleaned up");
}

#[test]
fn sigterm_and_sigint_stop_the_run_with_a_final_checkpoint() {
    for signal in ["TERM", "INT"] {
        let dir = tempfile::tempdir().unwrap();
        let run = Running::spawn(with(
            train_command(dir.path(), "sig"),
            &["--json", "--iters", "100000", "--save-every", "0"],
        ));
        run.wait_for("step", |e| e["step"].as_u64() >= Some(3)).expect("the run trains");
        run.signal(signal);
        let (status, err) = run.finish();
        assert!(status.success(), "SIG{signal}: {status}: {err}");
        let (step, ckpt) = newest_checkpoint(&dir.path().join("sig")).expect("a final checkpoint");
        assert!(step >= 3, "SIG{signal}: final checkpoint at step {step}");
        load_checkpoint(&ckpt);
        let metrics = std::fs::read_to_string(dir.path().join("sig/metrics.jsonl")).unwrap();
        let last: serde_json::Value = serde_json::from_str(metrics.lines().last().unwrap()).unwrap();
        assert_eq!((&last["event"], &last["stopped_early"]), (&"finished".into(), &true.into()), "SIG{signal}");
    }
}

/// A small deterministic generator for kill delays; the seed is printed so a failure can be replayed.
fn delays(seed: u64) -> impl FnMut(u64) -> Duration {
    let mut x = seed | 1;
    move |max_ms| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        Duration::from_millis(x % max_ms.max(1))
    }
}

#[test]
fn killed_at_random_points_during_saves_the_run_resumes_to_the_uninterrupted_weights() {
    let dir = tempfile::tempdir().unwrap();
    let args = ["--json", "--iters", "24", "--save-every", "1", "--seed", "3"];
    let whole = with(train_command(dir.path(), "whole"), &args).output().unwrap();
    assert!(whole.status.success(), "{}", String::from_utf8_lossy(&whole.stderr));
    let reference = load_checkpoint(&dir.path().join("whole/checkpoint-24"));

    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
    eprintln!("kill delays seed: {seed}");
    let mut delay = delays(seed);
    let run_dir = dir.path().join("killed");
    let started = Instant::now();
    for round in 0..6 {
        let run = match newest_checkpoint(&run_dir) {
            None => Running::spawn(with(train_command(dir.path(), "killed"), &args)),
            Some((_, ckpt)) => Running::spawn(with(resume_command(&ckpt), &["--json"])),
        };
        // The first round must leave a checkpoint to resume from; later ones die anywhere after start-up.
        let (event, max_ms) = if round == 0 { ("checkpoint_saved", 40) } else { ("started", 300) };
        let alive = run.wait_for(event, |_| true).is_some();
        std::thread::sleep(delay(max_ms));
        if alive {
            run.signal("KILL");
        }
        run.finish();
        for (step, ckpt) in checkpoint_dirs(&run_dir) {
            assert!(ckpt.join("trainer_state.json").exists(), "round {round}: checkpoint-{step} is incomplete");
            load_checkpoint(&ckpt);
        }
    }
    // The newest checkpoint resumes to the end (a finished run's resume trains nothing) and tidies up.
    let (_, newest) = newest_checkpoint(&run_dir).unwrap();
    let out = with(resume_command(&newest), &["--json"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(no_leftovers(&run_dir), "interrupted saves were cleaned up");
    let resumed = load_checkpoint(&run_dir.join("checkpoint-24"));
    assert!(same_tensors(&reference, &resumed), "resumed weights differ from the uninterrupted run (seed {seed})");
    assert!(started.elapsed() < Duration::from_secs(60), "keep this test quick");
}

#[test]
fn resuming_a_finished_run_rewrites_nothing() {
    // A kill during such a rewrite once left a half-saved copy next to the finished checkpoint.
    let dir = tempfile::tempdir().unwrap();
    let out = with(train_command(dir.path(), "done"), &["--iters", "3", "--save-every", "1"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let last = dir.path().join("done/checkpoint-3");
    let state = || std::fs::read(last.join("trainer_state.json")).unwrap();
    let modified = || std::fs::metadata(last.join("adapter_model.safetensors")).unwrap().modified().unwrap();
    let before = (state(), modified());
    let out = resume_command(&last).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(before == (state(), modified()), "checkpoint-3 was saved again");
}

#[test]
fn a_full_disk_stops_the_run_with_one_write_error_and_keeps_every_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let run_dir = dir.path().join("full");
    let run = Running::spawn(with(train_command(dir.path(), "full"), &["--iters", "100000", "--save-every", "2"]));
    let deadline = Instant::now() + Duration::from_secs(60);
    while !run_dir.join("checkpoint-4/trainer_state.json").exists() {
        assert!(Instant::now() < deadline, "no checkpoint-4 within 60 s");
        std::thread::sleep(Duration::from_millis(2));
    }
    // From now on every write to metrics.jsonl fails with ENOSPC, as on a full disk (swapped in by a rename,
    // so the running trainer never sees the file missing).
    let metrics = run_dir.join("metrics.jsonl");
    let full = dir.path().join("full-link");
    std::os::unix::fs::symlink("/dev/full", &full).unwrap();
    std::fs::rename(&full, &metrics).unwrap();
    let (status, err) = run.finish();
    assert!(!status.success(), "the run went on without its metrics: {err}");
    assert!(err.contains("cannot write") && err.contains(&metrics.display().to_string()), "{err}");
    assert_eq!(err.matches("No space left on device").count(), 1, "the OS error is printed once: {err}");
    let saved = checkpoint_dirs(&run_dir);
    assert!(saved.iter().any(|(s, _)| *s == 4), "checkpoint-4 was lost");
    for (_, ckpt) in &saved {
        load_checkpoint(ckpt);
    }
    assert!(no_leftovers(&run_dir));
    // With room again, the newest checkpoint resumes.
    std::fs::remove_file(&metrics).unwrap();
    let (step, newest) = newest_checkpoint(&run_dir).unwrap();
    let out = with(resume_command(&newest), &["--iters", &(step + 2).to_string()]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}
