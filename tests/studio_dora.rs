//! The studio's DoRA checkbox (LoRA settings page): ticking it trains a DoRA adapter, saved as PEFT's `use_dora`
//! with a magnitude per adapted linear; the sidebar and the checkpoint browser say DoRA.

#![cfg(feature = "studio")]

mod common;

use common::studio::{app, click, goto, step_until, with_model_and_sample};
use egui_kittest::kittest::Queryable;
use metal_candle::engine::checkpoint::{self, ADAPTER_WEIGHTS};
use metal_candle::engine::device::DeviceChoice;
use metal_candle::studio::app::{studio_train_defaults, Page, Prefs};
use metal_candle::studio::training_panel::RunStatus;
use std::path::Path;

#[test]
fn the_dora_checkbox_trains_a_dora_adapter() {
    let runs = tempfile::tempdir().unwrap();
    let mut prefs = Prefs { device: DeviceChoice::Cpu, auto_load_model: false, ..Prefs::default() };
    prefs.model_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-llama").display().to_string();
    prefs.train = studio_train_defaults();
    prefs.train.out = runs.path().to_path_buf();
    prefs.train.iters = Some(2);
    prefs.train.batch_size = 2;
    prefs.train.seq_len = 64;
    prefs.train.val_every = 0;
    prefs.train.save_every = 0;
    let mut h = with_model_and_sample(prefs, 900.0);
    goto(&mut h, Page::Settings);
    assert!(!app(&h).prefs.train.lora.dora, "off by default");
    click(&mut h, "train a magnitude per output row");
    assert!(app(&h).prefs.train.lora.dora, "the checkbox sets DoRA");
    assert_eq!(h.query_all_by_label_contains("· DoRA").count(), 1, "the sidebar's LoRA line says DoRA");

    goto(&mut h, Page::Training);
    click(&mut h, "Start training");
    step_until(&mut h, "the run to finish", 180, |a| a.training_panel.run.is_some() && !a.training_panel.is_active());
    let t = &app(&h).training_panel;
    assert_eq!(t.status, RunStatus::Finished { stopped_early: false }, "log: {:?}", t.log);
    let run = std::fs::read_dir(runs.path()).unwrap().flatten().map(|e| e.path()).find(|p| p.is_dir()).unwrap();
    let ckpt = run.join("checkpoint-2");
    assert!(checkpoint::PeftAdapterConfig::read(&ckpt).unwrap().use_dora);
    let tensors = candle_core::safetensors::load(ckpt.join(ADAPTER_WEIGHTS), &candle_core::Device::Cpu).unwrap();
    assert!(tensors.keys().any(|k| k.ends_with(".lora_magnitude_vector")), "{:?}", tensors.keys());

    goto(&mut h, Page::Checkpoints);
    step_until(&mut h, "the run in the browser", 30, |a| !a.checkpoints_panel.runs.is_empty());
    h.step();
    h.step();
    assert_eq!(h.query_all_by_label_contains("· DoRA").count(), 2, "the run's LoRA row says DoRA too");
}
