//! Packing in the studio, driven with egui_kittest on tiny-llama, headless: the "pack examples" box under Data and
//! length turns `--packing` on for the next run, which records it in run.json and logs what packing made of the
//! data; picking DPO turns it off and greys the box out (packing is for SFT rows).

#![cfg(feature = "studio")]

mod common;

use common::fixture;
use common::studio::{app, app_mut, click, goto, step_until, with_model_and_sample};
use egui_kittest::kittest::{NodeT, Queryable};
use metal_candle::engine::device::DeviceChoice;
use metal_candle::engine::train::Method;
use metal_candle::studio::app::{Page, Prefs};

#[test]
fn the_packing_box_packs_the_next_run_and_only_for_sft() {
    let dir = tempfile::tempdir().unwrap();
    let runs = dir.path().join("runs");
    let mut p = Prefs { device: DeviceChoice::Cpu, auto_load_model: false, ..Prefs::default() };
    p.model_path = fixture("tiny-llama").display().to_string();
    p.train.out = runs.clone();
    (p.train.seq_len, p.train.iters, p.train.batch_size, p.train.val_every, p.train.save_every) =
        (256, Some(2), 2, 2, 2);
    p.train.run_name = Some("packed".into());
    let mut h = with_model_and_sample(p, 1600.0);

    goto(&mut h, Page::Settings);
    assert!(!app(&h).prefs.train.packing);
    let has = |h: &common::studio::StudioHarness, text: &str| h.query_all_by_label_contains(text).next().is_some();
    assert!(!has(&h, "packed rows") && has(&h, " rows)"), "unpacked, an epoch is the training rows");
    click(&mut h, "pack examples");
    assert!(app(&h).prefs.train.packing, "the box turns packing on");
    // The cost card counts the packed rows the trainer will fill, and the memory estimate assumes the fullest.
    assert!(has(&h, "packed rows)"), "an epoch is packed rows now");
    assert!(has(&h, "assumes the fullest packed row"), "the estimate pads to a packed row");

    goto(&mut h, Page::Training);
    click(&mut h, "Start training");
    step_until(&mut h, "the packed run to finish", 240, |a| {
        !a.training_panel.is_active() && a.training_panel.run.as_ref().is_some_and(|r| r.step >= 2)
    });
    h.step();
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(runs.join("packed/run.json")).unwrap()).unwrap();
    assert_eq!(manifest["config"]["packing"].as_bool(), Some(true), "run.json records packing");
    assert!(h.query_all_by_label_contains("packing:").next().is_some(), "the log says what packing made of the data");

    // DPO cannot pack: picking it turns packing off and the box cannot be ticked.
    goto(&mut h, Page::Settings);
    click(&mut h, "DPO");
    assert_eq!(app(&h).prefs.train.method, Method::Dpo);
    assert!(!app(&h).prefs.train.packing, "switching to DPO turns packing off");
    assert!(h.get_by_label("pack examples").accesskit_node().is_disabled(), "and greys the box out");
    app_mut(&mut h).prefs.train.method = Method::Sft;
    h.step();
    assert!(!h.get_by_label("pack examples").accesskit_node().is_disabled());
}
