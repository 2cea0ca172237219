//! Issue 33, item 2 in the studio: the rank explorer, driven through its page with egui_kittest on the tiny
//! Llama fixture. Before a sweep the page measures speed on its own and shows the sweep's time estimate; the
//! probes run at the settings' LoRA scale and the page says which; "Use this rank" sets the rank and its
//! probed alpha so training keeps the probed scale; the memory column is what each probe added.

#![cfg(feature = "studio")]

mod common;

use common::fixture;
use common::studio::{app, app_mut, click, step_until, with_model_and_sample, StudioHarness};
use egui_kittest::kittest::Queryable;
use metal_candle::engine::device::DeviceChoice;
use metal_candle::engine::memory_watch::MemoryMeasure;
use metal_candle::studio::app::{Page, Prefs};
use std::path::Path;

/// The studio on the rank page's settings: tiny-llama at rank 8, alpha 32 (scale 4), the sample dataset open.
fn studio(runs: &Path) -> StudioHarness {
    let mut prefs = Prefs { device: DeviceChoice::Cpu, auto_load_model: false, ..Prefs::default() };
    prefs.model_path = fixture("tiny-llama").display().to_string();
    prefs.train.out = runs.to_path_buf();
    prefs.train.lora.rank = 8;
    prefs.train.lora.alpha = 32.0;
    prefs.train.batch_size = 2;
    prefs.train.seq_len = 64;
    prefs.train.val_batches = 1;
    prefs.rank.ranks = vec![2, 16];
    prefs.rank.token_budget = 300;
    let mut h = with_model_and_sample(prefs, 1100.0);
    h.get_by_label(Page::Ranks.title()).click();
    h.step();
    assert_eq!(app(&h).prefs.page, Page::Ranks);
    h
}

#[test]
fn the_estimate_comes_first_and_use_this_rank_keeps_the_probed_scale() {
    let dir = tempfile::tempdir().unwrap();
    let mut h = studio(&dir.path().join("runs"));
    assert!(
        h.query_by_label_contains(
            "probed at your LoRA scale, alpha / r = 32 / 8 = 4.00, so rank r trains with alpha = 4.00 × r"
        )
        .is_some(),
        "the page says which scale the probes will use"
    );

    // Nothing pressed yet: the page measures two steps on its own and shows the sweep's time.
    step_until(&mut h, "the speed measurement", 60, |a| a.rank_panel.clock.measured.is_some());
    h.step();
    assert!(h.query_by_label_contains("Estimated time: about").is_some(), "an estimate before Run");
    assert!(h.query_by_label_contains("from two training steps measured at rank 16").is_some(), "and its basis");
    assert!(app(&h).rank_panel.clock.calibrating.is_none());

    click(&mut h, "Run probes");
    step_until(&mut h, "the probes", 120, |a| !a.rank_panel.running);
    h.step();
    let panel = &app(&h).rank_panel;
    assert!(panel.error.is_none(), "{:?}", panel.error);
    let alphas: Vec<(usize, f64)> = panel.results.iter().map(|r| (r.rank, r.alpha)).collect();
    assert_eq!(alphas, [(2, 8.0), (16, 64.0)], "each rank at the settings' scale 4");
    let probed_scale = panel.results[1].lora_scale();
    assert_eq!(probed_scale, 4.0);
    assert!(panel.results.iter().all(|r| r.memory.measure == MemoryMeasure::Heap && r.memory.added_bytes > 0));
    assert!(h.query_by_label_contains("Probed at LoRA scale 4.00 (alpha = 4.00 × rank)").is_some());
    assert!(h.query_by_label("Memory added by the probe (MiB, heap)").is_some());
    assert!(h.query_by_label("Added memory").is_some() && h.query_by_label("Peak memory").is_some());
    // The next sweep's estimate now rests on the last probe.
    assert!(h.query_by_label_contains("from the rank 16 probe's measured speed").is_some());
    h.check_accessibility();

    // Rank 8 is in the settings but was not probed: both rows offer their rank; the last is rank 16.
    h.get_all_by_label("Use this rank").last().unwrap().click();
    h.step();
    h.step();
    let lora = &app(&h).prefs.train.lora;
    assert_eq!((lora.rank, lora.alpha), (16, 64.0), "the rank and the alpha it was probed at");
    assert_eq!(lora.scale(), probed_scale, "training keeps the probed scale (not 32 / 16 = 2)");
    assert!(h.query_by_label_contains("LoRA rank 16 with alpha 64 (scale 4.00, as probed)").is_some(), "the toast");
    assert!(h.query_by_label("in settings").is_some());

    // Settings moved off the probed scale afterwards: the table says its numbers are at another scale.
    app_mut(&mut h).prefs.train.lora.alpha = 16.0;
    h.step();
    h.step();
    assert!(h.query_by_label_contains("Your settings are now at scale 1.00").is_some());
    assert_eq!(h.get_all_by_label("Use this rank").count(), 2, "rank 16 at alpha 16 is not what was probed");
}

/// A sweep started while the page is still measuring: the worker stops the measurement and runs the sweep.
#[test]
fn run_pressed_during_the_speed_measurement_still_runs_the_sweep() {
    let dir = tempfile::tempdir().unwrap();
    let mut h = studio(&dir.path().join("runs"));
    assert!(app(&h).rank_panel.clock.calibrating.is_some(), "opening the page starts the measurement");
    click(&mut h, "Run probes");
    step_until(&mut h, "the probes", 120, |a| !a.rank_panel.is_busy());
    let panel = &app(&h).rank_panel;
    assert!(panel.error.is_none(), "{:?}", panel.error);
    assert_eq!(panel.results.iter().map(|r| r.rank).collect::<Vec<_>>(), [2, 16]);
    h.step();
    assert!(h.query_by_label_contains("Estimated time: about").is_some(), "measured by the sweep itself");
}
