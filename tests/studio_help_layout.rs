//! Issue 33 items 7 and 8, driven through the real studio with egui_kittest, headless: the Help window's quick
//! start, glossary and system report (one click away); renaming a run (its new name in the run list and the
//! compare legend, its folder untouched, bad names refused); the settings summary of a llama model naming only
//! llama's linears.

#![cfg(feature = "studio")]

mod common;

use common::studio::{app, app_mut, click, step_until, StudioHarness};

use egui_kittest::kittest::Queryable;
use metal_candle::engine::device::DeviceChoice;
use metal_candle::engine::lora::Targets;
use metal_candle::engine::train::run_folder::{append_metric, RunManifest};
use metal_candle::engine::train::{TrainConfig, TrainEvent};
use metal_candle::studio::app::{Page, Prefs, StudioOptions};
use metal_candle::studio::glossary;
use std::path::{Path, PathBuf};

const FOLDER: &str = "run-20260101-120000";

fn fixture_model() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-llama")
}

fn harness(prefs: Prefs) -> StudioHarness {
    let options = StudioOptions { discover_defaults: false, persist: false, ..Default::default() };
    common::studio::build(prefs, options, 860.0, false)
}

fn prefs_with_runs(runs: &Path) -> Prefs {
    let mut prefs = Prefs { device: DeviceChoice::Cpu, auto_load_model: false, ..Prefs::default() };
    prefs.model_path = fixture_model().display().to_string();
    prefs.train.out = runs.to_path_buf();
    prefs
}

/// Whether some widget is labelled `label` (pages and the Help window may both show it).
fn shown(h: &StudioHarness, label: &str) -> bool {
    h.query_all_by_label(label).next().is_some()
}

fn shown_containing(h: &StudioHarness, text: &str) -> bool {
    h.query_all_by_label_contains(text).next().is_some()
}

/// A finished run folder as the trainer writes it: run.json, and metrics with a loss curve and validation.
fn write_run(runs: &Path) -> PathBuf {
    let dir = runs.join(FOLDER);
    std::fs::create_dir_all(&dir).unwrap();
    let config = TrainConfig { model: fixture_model(), out: runs.to_path_buf(), ..TrainConfig::default() };
    RunManifest::new(FOLDER, &config).write(&dir).unwrap();
    for step in 1..=6 {
        let loss = 3.0 - 0.2 * step as f64;
        let event = TrainEvent::Step {
            step,
            total_steps: 6,
            loss,
            lr: 1e-4,
            grad_norm: 1.0,
            tokens_per_sec: 100.0,
            trained_tokens: 64 * step,
            elapsed_secs: step as f64,
            eta_secs: 0.0,
            preference: None,
            grpo: None,
        };
        append_metric(&dir, &event).unwrap();
        if step % 3 == 0 {
            append_metric(
                &dir,
                &TrainEvent::Eval {
                    step,
                    val_loss: loss + 0.1,
                    perplexity: (loss + 0.1).exp(),
                    best: false,
                    preference: None,
                    grpo: None,
                },
            )
            .unwrap();
        }
    }
    let finished = TrainEvent::Finished {
        step: 6,
        final_loss: Some(1.8),
        final_val_loss: Some(1.9),
        stopped_early: false,
        elapsed_secs: 6.0,
        early_stop: None,
    };
    append_metric(&dir, &finished).unwrap();
    dir
}

/// Every file under `dir` with its bytes, in path order.
fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else {
                out.push((path.clone(), std::fs::read(&path).unwrap()));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn help_shows_a_quick_start_and_a_glossary_with_the_system_report_one_click_away() {
    let tmp = tempfile::tempdir().unwrap();
    let mut h = harness(prefs_with_runs(tmp.path()));
    h.step();
    click(&mut h, "Help");
    // The quick start first: each step, with a button to its page.
    for step in
        ["Load a base model", "Pick your data", "Choose the settings", "Train", "Test what it learned", "Export"]
    {
        assert!(shown(&h, step), "the quick start lacks the step {step:?}");
    }
    assert!(shown_containing(&h, "\"The command line\""), "the README sections are named");
    assert!(!shown_containing(&h, "device: cpu"), "the report is not the first thing shown");
    click(&mut h, "Go to Dataset");
    assert_eq!(app(&h).prefs.page, Page::Dataset, "a step's button opens its page");
    h.check_accessibility();

    // The glossary: the settings a new user meets, with the very text their hover shows.
    click(&mut h, "Glossary");
    for term in [
        &glossary::RANK,
        &glossary::ALPHA,
        &glossary::TARGETS,
        &glossary::LEARNING_RATE,
        &glossary::WARMUP,
        &glossary::CHECKPOINTING,
        &glossary::BASE_WEIGHTS,
    ] {
        assert!(shown(&h, term.name), "the glossary lacks {}", term.name);
        assert!(shown(&h, term.meaning), "the glossary lacks the meaning of {}", term.name);
        assert!(shown(&h, &format!("Typical: {}", term.typical)), "{} lacks typical values", term.name);
    }

    click(&mut h, "Shortcuts");
    assert!(shown(&h, "In the chat box: send the message."), "the shortcuts are listed");

    // One click to the system report, gathered on demand, with Copy.
    click(&mut h, "System report");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !shown_containing(&h, "device: cpu") {
        assert!(std::time::Instant::now() < deadline, "the system report never appeared");
        h.step();
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    for needle in ["compute dtype", "BLAS"] {
        assert!(shown_containing(&h, needle), "the report lacks {needle}");
    }
    assert!(shown(&h, "Copy"), "the report can be copied");
    assert!(shown(&h, "Refresh"), "the report can be gathered again");
    h.check_accessibility();
}

#[test]
fn a_renamed_run_shows_its_name_in_the_list_and_the_compare_legend_and_keeps_its_folder() {
    let tmp = tempfile::tempdir().unwrap();
    let run_dir = write_run(tmp.path());
    let before = snapshot(tmp.path());
    let mut prefs = prefs_with_runs(tmp.path());
    prefs.page = Page::Checkpoints;
    prefs.overlay_runs = vec![FOLDER.to_string()];
    let mut h = harness(prefs);
    step_until(&mut h, "the run list", 30, |a| !a.checkpoints_panel.runs.is_empty());
    h.step();
    assert!(h.query_by_label(&format!("Legend: {FOLDER}")).is_some(), "the legend names the run by its folder");
    h.check_accessibility();

    // A name that is too long is refused before anything is written.
    click(&mut h, "Rename…");
    h.get_by_label("New run name").type_text(&"x".repeat(81));
    h.step();
    h.step();
    assert!(h.query_by_label_contains("at most 80 characters").is_some(), "the limit is explained");
    click(&mut h, "Save name");
    assert!(shown(&h, "New run name"), "an invalid name is not saved: the editor stays open");
    click(&mut h, "Cancel");
    assert!(h.query_by_label("New run name").is_none(), "Cancel closes the editor");
    assert_eq!(snapshot(tmp.path()), before, "nothing was written");

    // A good name (the editor starts with the current name selected: typing replaces it).
    click(&mut h, "Rename…");
    h.get_by_label("New run name").type_text("  baseline r8  ");
    h.step();
    click(&mut h, "Save name");
    step_until(&mut h, "the rename", 30, |a| a.checkpoints_panel.runs[0].label.is_some());
    h.step();
    assert_eq!(app(&h).checkpoints_panel.runs[0].label.as_deref(), Some("baseline r8"), "stored trimmed");
    assert!(h.query_by_label("Legend: baseline r8").is_some(), "the compare legend uses the new name");
    assert!(h.query_by_label(&format!("Legend: {FOLDER}")).is_none(), "and no longer the folder name");
    assert!(h.query_all_by_label("baseline r8").count() >= 2, "the run list and the title show it");

    // On disk: the same folder and files; run.json differs only by the label.
    let after = snapshot(tmp.path());
    let paths = |s: &[(PathBuf, Vec<u8>)]| s.iter().map(|(p, _)| p.clone()).collect::<Vec<_>>();
    assert_eq!(paths(&after), paths(&before), "no file was moved, added or removed");
    for ((path, old), (_, new)) in before.iter().zip(&after) {
        if path.file_name().is_some_and(|n| n == "run.json") {
            let renamed = RunManifest::read(&run_dir).unwrap();
            assert_eq!(renamed.label.as_deref(), Some("baseline r8"));
            let old: RunManifest = serde_json::from_slice(old).unwrap();
            assert_eq!(RunManifest { label: None, ..renamed }, old, "run.json changed only by its label");
        } else {
            assert_eq!(old, new, "{} changed", path.display());
        }
    }
    // A fresh listing (a new launch) reads the name back from run.json.
    app_mut(&mut h).checkpoints_panel.runs.clear();
    click(&mut h, "Refresh");
    step_until(&mut h, "the run list again", 30, |a| !a.checkpoints_panel.runs.is_empty());
    assert_eq!(app(&h).checkpoints_panel.runs[0].title(), "baseline r8");
}

#[test]
fn the_settings_summary_of_a_llama_model_names_only_llamas_linears() {
    let tmp = tempfile::tempdir().unwrap();
    let mut prefs = prefs_with_runs(tmp.path());
    prefs.train.lora.targets = Targets::all();
    let mut h = harness(prefs);
    h.step();

    // Before a model loads, the names apply when one does (the rank explorer repeats the settings).
    click(&mut h, Page::Ranks.title());
    h.step();
    assert!(shown_containing(&h, "once one is loaded"), "all linear waits for a model");
    assert!(!shown_containing(&h, "qkv_proj"), "no phi3 projection before a model loads");

    click(&mut h, Page::Model.title());
    click(&mut h, "Load model");
    step_until(&mut h, "the model to load", 60, |a| a.model.loaded.is_some() || a.model.error.is_some());
    assert!(app(&h).model.error.is_none(), "{:?}", app(&h).model.error);
    click(&mut h, Page::Settings.title());
    h.step();
    let llama = "q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj";
    assert!(shown_containing(&h, &format!("rank 8 · {llama} · batch")), "the summary lists llama's own linears");
    for phi3 in ["qkv_proj", "gate_up_proj"] {
        let found: Vec<String> = h.query_all_by_label_contains(phi3).map(|n| format!("{n:?}")).collect();
        assert!(found.is_empty(), "the settings page names phi3's {phi3}: {found:?}");
    }
}
