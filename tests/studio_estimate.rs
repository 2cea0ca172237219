//! Issue 33, item 1 in the studio: with a dataset of short rows open, the settings page's memory card estimates
//! the batch padded to the dataset's longest row (as the trainer pads it), says so, and neither warns nor
//! offers to shrink a batch that fits; the banner above agrees with the card.

#![cfg(feature = "studio")]

mod common;

use common::fixture;
use common::studio::{app, app_mut, with_model_and_sample};
use egui_kittest::kittest::Queryable;
use metal_candle::engine::device::DeviceChoice;
use metal_candle::engine::estimate;
use metal_candle::studio::app::{Page, Prefs};

#[test]
fn the_memory_card_pads_to_the_longest_row_and_agrees_with_the_banner() {
    let dir = tempfile::tempdir().unwrap();
    let mut prefs = Prefs { device: DeviceChoice::Cpu, auto_load_model: false, ..Prefs::default() };
    prefs.model_path = fixture("tiny-llama").display().to_string();
    prefs.train.out = dir.path().join("runs");
    prefs.train.batch_size = 64;
    prefs.train.seq_len = 256;
    let mut h = with_model_and_sample(prefs, 1400.0);
    let longest = app(&h).dataset_panel.report.as_ref().unwrap().tokens.as_ref().unwrap().longest_row().unwrap();
    assert!(longest < 256, "the sample's rows are short: {longest}");

    // A budget between the padded estimate and the full-length one.
    let shape = app(&h).model.loaded.as_ref().unwrap().shape.clone();
    let train = app(&h).prefs.train.clone();
    let full = estimate::training_memory(&shape, &train).total_bytes();
    let padded = estimate::training_memory(&shape, &estimate::padded_to_data(&train, Some(longest))).total_bytes();
    assert!(padded < full);
    app_mut(&mut h).model.loaded.as_mut().unwrap().memory_budget_bytes = Some((padded + full) / 2);
    app_mut(&mut h).prefs.page = Page::Settings;
    h.step();
    h.step();
    assert!(
        h.query_by_label_contains(&format!("longest row, {longest} tokens")).is_some(),
        "the card says what it assumed"
    );
    assert!(h.query_by_label_contains("it would swap or fail").is_none(), "a batch that fits is not warned about");
    assert!(h.query_by_label_contains("Fix: lower the batch size").is_none(), "nor shrunk");
    assert!(h.query_by_label("Ready to train with these settings.").is_some());

    // Below the padded estimate, card and banner warn together.
    app_mut(&mut h).model.loaded.as_mut().unwrap().memory_budget_bytes = Some(padded / 2);
    h.step();
    h.step();
    assert!(h.query_by_label_contains("it would swap or fail").is_some());
    assert!(h.query_by_label_contains("the memory estimate below says this run would not fit").is_some());
}

/// The settings page shows the trainer's start warnings from the open dataset's report (its lr slider keeps the
/// learning rate inside the range that would be warned about).
#[test]
fn the_settings_page_warns_about_many_epochs_and_cut_rows() {
    let dir = tempfile::tempdir().unwrap();
    let mut prefs = Prefs { device: DeviceChoice::Cpu, auto_load_model: false, ..Prefs::default() };
    prefs.model_path = fixture("tiny-llama").display().to_string();
    prefs.train.out = dir.path().join("runs");
    prefs.train.seq_len = 24;
    prefs.train.iters = Some(2000);
    prefs.train.batch_size = 4;
    let mut h = with_model_and_sample(prefs, 1400.0);
    app_mut(&mut h).prefs.page = Page::Settings;
    h.step();
    h.step();
    assert!(h.query_by_label_contains("passes over 135 training rows").is_some(), "many epochs over a small set");
    assert!(h.query_by_label_contains("are longer than the sequence length 24").is_some());
}
