//! The checkpoints page's X-ray, driven with egui_kittest on a real tiny-llama run (rank 4, all linears,
//! checkpoints at steps 2 and 4, made with `metal-candle train`): the X-ray button computes on the worker, the
//! heat map shows a cell per layer and module, a second checkpoint sits beside it, clicking a cell shows that
//! module's spectrum, and "Use recommended rank" puts the rank into the LoRA settings with the alpha that keeps
//! their scale.

#![cfg(feature = "studio")]

mod common;

use common::cli::train_command;
use common::studio::{app, app_mut, build, step_until, StudioHarness};
use egui::accesskit::Role;
use egui_kittest::kittest::Queryable;
use metal_candle::engine::device::DeviceChoice;
use metal_candle::studio::app::{studio_train_defaults, Page, Prefs, StudioOptions};
use std::path::Path;
use std::process::Stdio;

fn harness(runs: &Path) -> StudioHarness {
    let mut prefs = Prefs { device: DeviceChoice::Cpu, auto_load_model: false, ..Prefs::default() };
    prefs.train = studio_train_defaults();
    prefs.train.out = runs.to_path_buf();
    prefs.train.lora.rank = 32;
    prefs.train.lora.alpha = 64.0;
    prefs.page = Page::Checkpoints;
    let options = StudioOptions { discover_defaults: false, persist: false, ..Default::default() };
    build(prefs, options, 1000.0, false)
}

/// Bring the widget into view (the page scrolls), then click it through accesskit.
fn click_in_view(h: &mut StudioHarness, role: Role, label: &str) {
    h.get_by_role_and_label(role, label).scroll_to_me();
    h.step();
    h.step();
    h.get_by_role_and_label(role, label).click_accesskit();
    h.step();
    h.step();
}

#[test]
fn the_xray_view_maps_picks_compares_and_sets_the_rank() {
    let tmp = tempfile::tempdir().unwrap();
    let runs = tmp.path().join("runs");
    let out = train_command(&runs, "xr")
        .args(["--iters", "4", "--save-every", "2", "--lr", "5e-3", "--targets", "all-linear"])
        .stdout(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "train: {}", String::from_utf8_lossy(&out.stderr));
    let (ck2, ck4) = (runs.join("xr/checkpoint-2"), runs.join("xr/checkpoint-4"));

    let mut h = harness(&runs);
    step_until(&mut h, "the run list", 30, |a| a.checkpoints_panel.runs.len() == 1);
    h.step();
    assert_eq!(app(&h).checkpoints_panel.xray.primary.as_deref(), Some(ck4.as_path()), "the latest checkpoint");
    click_in_view(&mut h, Role::Button, "X-ray");
    step_until(&mut h, "the X-ray", 60, |a| a.checkpoints_panel.xray.report(&ck4).is_some());
    h.step();
    let report = app(&h).checkpoints_panel.xray.report(&ck4).unwrap().clone();
    assert_eq!(report.modules.len(), 14, "2 layers x 7 linears");
    assert!(report.base_model.is_some(), "the base from run.json: {:?}", report.notes);
    for layer in 0..2 {
        for module in ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"] {
            let label = format!("checkpoint-4 layer {layer} {module}");
            assert!(h.query_by_label(&label).is_some(), "heat map cell {label}");
        }
    }

    // A second checkpoint of the run beside it.
    app_mut(&mut h).checkpoints_panel.xray.second = Some(ck2.clone());
    h.step();
    click_in_view(&mut h, Role::Button, "X-ray");
    step_until(&mut h, "the second X-ray", 60, |a| a.checkpoints_panel.xray.report(&ck2).is_some());
    h.step();
    h.step();
    assert!(h.query_by_label("checkpoint-2 (beside) layer 1 down_proj").is_some(), "the second map");

    // Pick a cell: its spectrum, for both checkpoints.
    assert!(h.query_by_label_contains("Spectrum of").is_none());
    click_in_view(&mut h, Role::Button, "checkpoint-4 layer 1 v_proj");
    assert_eq!(app(&h).checkpoints_panel.xray.picked, Some((1, "v_proj".to_string())));
    assert!(h.query_by_label("Spectrum of model.layers.1.self_attn.v_proj").is_some(), "the spectrum's title");
    assert!(h.query_by_label_contains("checkpoint-2: update norm").is_some(), "both checkpoints' values");

    // The switch to energy ranks.
    click_in_view(&mut h, Role::Button, "Energy rank 90");
    assert_eq!(app(&h).checkpoints_panel.xray.metric, metal_candle::studio::xray_heatmap::Metric::EnergyRank);

    // Use recommended rank: rank set, alpha / rank kept at 2.
    let recommended = report.summary.recommended_rank.expect("a trained adapter has a recommendation");
    assert!(recommended <= 4, "rank 4 at most: {recommended}");
    click_in_view(&mut h, Role::Button, "Use recommended rank");
    let lora = &app(&h).prefs.train.lora;
    assert_eq!(lora.rank, recommended);
    assert!((lora.alpha / lora.rank as f64 - 2.0).abs() < 1e-12, "alpha {} keeps scale 2", lora.alpha);
    assert!(h.query_by_label_contains("is in the LoRA settings").is_some());
}
