//! Issue 32's training part in the studio, driven headless with egui_kittest: the checkpoints page marks a run's
//! best checkpoint (made by the real trainer with a checkpoint limit) and names its validation loss; the LoRA
//! settings page sets early stopping and the checkpoint limit, and refuses early stopping without evaluations in the
//! engine's own words.

#![cfg(feature = "studio")]

mod common;

use common::cli::sample_data;
use common::studio::{app, app_mut, click, step_until, with_model_and_sample, StudioHarness};
use egui_kittest::kittest::Queryable;
use metal_candle::engine::device::DeviceChoice;
use metal_candle::engine::model::load_model;
use metal_candle::engine::train::run_folder::RunManifest;
use metal_candle::engine::train::{self, LoraSettings, Schedule, TrainConfig, TrainControl};
use metal_candle::studio::app::{Page, Prefs, StudioOptions};
use std::path::Path;

fn prefs_with_runs(runs: &Path) -> Prefs {
    let mut prefs = Prefs { device: DeviceChoice::Cpu, auto_load_model: false, ..Prefs::default() };
    prefs.model_path = common::fixture("tiny-llama").display().to_string();
    prefs.train.out = runs.to_path_buf();
    prefs
}

fn shown_containing(h: &StudioHarness, text: &str) -> bool {
    h.query_all_by_label_contains(text).next().is_some()
}

#[test]
fn the_checkpoints_page_marks_the_best_checkpoint_of_a_run() {
    let tmp = tempfile::tempdir().unwrap();
    // A real run whose validation loss falls then rises, keeping the newest checkpoint plus the best.
    let cfg = TrainConfig {
        model: common::fixture("tiny-llama"),
        data: sample_data(),
        out: tmp.path().to_path_buf(),
        run_name: Some("limited".into()),
        lora: LoraSettings { rank: 4, alpha: 8.0, ..Default::default() },
        iters: Some(24),
        batch_size: 4,
        seq_len: 96,
        lr: 1.0,
        schedule: Schedule::Constant,
        warmup: Some(0),
        max_grad_norm: None,
        val_every: 2,
        save_every: 2,
        save_total_limit: Some(1),
        device: DeviceChoice::Cpu,
        ..Default::default()
    };
    let base = load_model(&common::fixture("tiny-llama"), &candle_core::Device::Cpu, candle_core::DType::F32).unwrap();
    let run_dir = train::run_training(&cfg, &base, &TrainControl::default(), &mut |_| {}).unwrap();
    let best = RunManifest::read(&run_dir).unwrap().best_checkpoint.expect("a best checkpoint");
    assert!(best.step < 24, "the best is not the newest, so the limit had to keep it");

    let mut prefs = prefs_with_runs(tmp.path());
    prefs.page = Page::Checkpoints;
    let options = StudioOptions { discover_defaults: false, persist: false, ..Default::default() };
    let mut h = common::studio::build(prefs, options, 860.0, false);
    step_until(&mut h, "the run list", 30, |a| !a.checkpoints_panel.runs.is_empty());
    h.step();
    h.step();
    let run = &app(&h).checkpoints_panel.runs[0];
    assert_eq!(run.best_checkpoint, Some(best), "RunInfo carries run.json's best");
    let val = metal_candle::studio::widgets::fmt_loss(best.val_loss);
    let title = format!("Checkpoints (2) · best: val {val} at step {}", best.step);
    assert!(h.query_by_label(&title).is_some(), "the section names the best: {title}");
    let marked = format!("{} · best", best.step);
    assert!(h.query_by_label(&marked).is_some(), "the best checkpoint's row is marked");
    assert!(h.query_by_label("24 · best").is_none() && h.query_by_label("24").is_some(), "only the best is marked");
    h.check_accessibility();
}

#[test]
fn the_settings_page_sets_early_stopping_and_the_checkpoint_limit() {
    let tmp = tempfile::tempdir().unwrap();
    let mut h = with_model_and_sample(prefs_with_runs(tmp.path()), 1100.0);
    app_mut(&mut h).prefs.train.val_every = 0;
    click(&mut h, Page::Settings.title());
    assert!(shown_containing(&h, "(all kept)"), "no limit by default");
    click(&mut h, "stop after");
    assert_eq!(app(&h).prefs.train.early_stopping_patience, 3, "checking it turns early stopping on");
    // With evaluations only at the end the engine's own check refuses it, and the page says so before a start.
    assert!(shown_containing(&h, "Not ready: invalid setting: early stopping (patience 3"), "the refusal is shown");
    assert!(shown_containing(&h, "--val-every"), "and names what to change");
    app_mut(&mut h).prefs.train.val_every = 2;
    h.step();
    h.step();
    assert!(shown_containing(&h, "Ready to train"), "with evaluations it is ready");
    click(&mut h, "keep the newest");
    assert_eq!(app(&h).prefs.train.save_total_limit, Some(3));
    assert!(shown_containing(&h, "+ the best"), "the limit says the best is kept too");
    h.check_accessibility();
    click(&mut h, "stop after");
    click(&mut h, "keep the newest");
    let train = &app(&h).prefs.train;
    assert_eq!((train.early_stopping_patience, train.save_total_limit), (0, None), "both turn off again");
}
