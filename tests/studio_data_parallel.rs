//! The studio's multi-GPU runs, driven through its real panels: the GPU count on the Train page, a run started
//! on two processes that streams rank 0's losses into the plots and ends with its checkpoint, and a stop that ends
//! every process after the same step. The ranks run on the CPU here (the same processes, summing on the host); a
//! machine with several GPUs offers the count by itself, and scripts/gpu_data_parallel.sh runs them there.

#![cfg(feature = "studio")]

mod common;

use common::studio::{app, app_mut, click, goto, step_until, with_model_and_sample_options};
use egui_kittest::kittest::Queryable;
use metal_candle::engine::device::DeviceChoice;
use metal_candle::studio::app::{Page, Prefs, StudioOptions};
use metal_candle::studio::training_panel::RunStatus;
use std::path::{Path, PathBuf};

fn prefs(runs: &Path, iters: usize) -> Prefs {
    let mut prefs = Prefs { device: DeviceChoice::Cpu, auto_load_model: false, gpus: 2, ..Prefs::default() };
    prefs.model_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-llama").display().to_string();
    prefs.train.out = runs.to_path_buf();
    prefs.train.iters = Some(iters);
    prefs.train.batch_size = 4;
    prefs.train.seq_len = 96;
    prefs.train.warmup = Some(1);
    prefs.train.val_every = 3;
    prefs.train.val_batches = 1;
    prefs.train.save_every = 3;
    prefs
}

fn options(gpus_on_host: usize) -> StudioOptions {
    StudioOptions {
        discover_defaults: false,
        persist: false,
        gpus_on_host: Some(gpus_on_host),
        rank_program: Some(PathBuf::from(env!("CARGO_BIN_EXE_metal-candle"))),
        ..Default::default()
    }
}

#[test]
fn a_run_on_two_processes_plots_like_one_and_stops_with_every_rank() {
    let tmp = tempfile::tempdir().unwrap();
    let runs = tmp.path().join("runs");
    let mut h = with_model_and_sample_options(prefs(&runs, 6), options(2), 900.0);

    goto(&mut h, Page::Training);
    assert!(h.query_by_label("GPUs").is_some(), "the GPU count is offered on a machine with two");
    assert!(h.query_by_label_contains("2.0 rows per GPU").is_some(), "{:?}", app(&h).prefs.gpus);
    click(&mut h, "Start training");
    step_until(&mut h, "the run to finish", 180, |a| !a.training_panel.is_active());
    {
        let t = &app(&h).training_panel;
        assert_eq!(t.status, RunStatus::Finished { stopped_early: false }, "log: {:?}", t.log);
        let run = t.run.as_ref().unwrap();
        assert_eq!(run.loss.len(), 6, "rank 0's six steps were plotted");
        assert!(!run.val_loss.is_empty() && !run.checkpoints.is_empty());
        assert!(t.log.iter().any(|l| format!("{l:?}").contains("data-parallel over 2 processes")), "{:?}", t.log);
    }
    let run_dirs: Vec<_> = std::fs::read_dir(&runs).unwrap().flatten().collect();
    assert_eq!(run_dirs.len(), 1, "one run folder, written by rank 0");
    assert!(run_dirs[0].path().join("checkpoint-6").is_dir());

    // A long run, stopped from the studio after a few steps: rank 0 passes the stop to rank 1 and saves.
    app_mut(&mut h).prefs.train.iters = Some(100_000);
    app_mut(&mut h).prefs.train.run_name = Some("stopped".into());
    click(&mut h, "Start training");
    step_until(&mut h, "three steps", 120, |a| a.training_panel.run.as_ref().is_some_and(|r| r.loss.len() >= 3));
    click(&mut h, "Stop");
    step_until(&mut h, "the stopped run to end", 120, |a| !a.training_panel.is_active());
    let t = &app(&h).training_panel;
    assert_eq!(t.status, RunStatus::Finished { stopped_early: true }, "log: {:?}", t.log);
    let last = t.run.as_ref().unwrap().loss.len();
    assert!(runs.join("stopped").join(format!("checkpoint-{last}")).is_dir(), "the final checkpoint at step {last}");
}

#[test]
fn a_count_saved_on_a_bigger_machine_comes_down_to_this_ones() {
    let tmp = tempfile::tempdir().unwrap();
    let runs = tmp.path().join("runs");
    // A machine with two GPUs shows the count, brought down from the four saved elsewhere.
    let mut p = prefs(&runs, 2);
    p.gpus = 4;
    let mut h = with_model_and_sample_options(p.clone(), options(2), 900.0);
    goto(&mut h, Page::Training);
    h.step();
    assert_eq!(app(&h).prefs.gpus, 2);
    // A machine with one GPU shows no count, and a run set to two there trains in this process.
    p.gpus = 2;
    let mut h = with_model_and_sample_options(p, options(1), 900.0);
    goto(&mut h, Page::Training);
    assert!(h.query_by_label("GPUs").is_none());
    click(&mut h, "Start training");
    step_until(&mut h, "the run to finish", 120, |a| !a.training_panel.is_active());
    let t = &app(&h).training_panel;
    assert_eq!(t.status, RunStatus::Finished { stopped_early: false }, "log: {:?}", t.log);
    assert!(!t.log.iter().any(|l| format!("{l:?}").contains("data-parallel")), "{:?}", t.log);
}

#[test]
fn a_rank_that_dies_ends_the_run_with_its_name_and_the_saved_checkpoints_stay() {
    let tmp = tempfile::tempdir().unwrap();
    let runs = tmp.path().join("runs");
    let mut p = prefs(&runs, 100_000);
    p.train.save_every = 2;
    p.train.run_name = Some("dies".into());
    let mut h = with_model_and_sample_options(p, options(2), 900.0);
    goto(&mut h, Page::Training);
    click(&mut h, "Start training");
    step_until(&mut h, "four steps", 120, |a| a.training_panel.run.as_ref().is_some_and(|r| r.loss.len() >= 4));
    // The ranks are this process's children (the worker started them); rank 1 started last. The other tests of this
    // file run beside this one in the same process, so only ranks whose settings name this test's runs folder count.
    let runs_text = runs.display().to_string();
    let rank1 = common::cli::children_of(std::process::id(), "--control-stdin")
        .into_iter()
        .filter(|&pid| settings_of(pid).is_some_and(|toml| toml.contains(&runs_text)))
        .next_back()
        .expect("rank 1");
    assert!(std::process::Command::new("kill").args(["-KILL", &rank1.to_string()]).status().unwrap().success());
    step_until(&mut h, "the run to fail", 120, |a| !a.training_panel.is_active());
    let t = &app(&h).training_panel;
    let RunStatus::Failed(message) = &t.status else { panic!("{:?}, log {:?}", t.status, t.log) };
    assert!(message.contains("rank 1") && message.contains("signal 9"), "{message}");
    assert!(runs.join("dies").join("checkpoint-2").join("adapter_model.safetensors").is_file());
}

/// The settings file a rank the studio started reads (`train --config FILE`), from its command line.
fn settings_of(pid: u32) -> Option<String> {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let args: Vec<String> = cmdline.split(|&b| b == 0).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
    let file = args.windows(2).find(|w| w[0] == "--config")?.get(1)?.clone();
    std::fs::read_to_string(file).ok()
}
