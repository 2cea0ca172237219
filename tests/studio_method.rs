//! Issue 34 in the studio, driven with egui_kittest on tiny-llama, headless: SFT on preference pairs is refused by
//! the Start button in the engine's words with a one-click switch; DPO picked on the LoRA settings page goes into
//! the run's config (run.json) and its live plots and status line read under TRL's names; Step/Eval events with
//! preference metrics fill the reward plots; a Preference evaluation of a DPO adapter shows `rewards/accuracies`
//! and each pair's rewards; the checkpoints page names each run's method.

#![cfg(feature = "studio")]

mod common;

use common::fixture;
use common::studio::{app, app_mut, build, click, goto, step_until, StudioHarness};
use egui_kittest::kittest::{NodeT, Queryable};
use metal_candle::engine::device::DeviceChoice;
use metal_candle::engine::train::preference::PreferenceMetrics;
use metal_candle::engine::train::{Method, TrainConfig, TrainEvent};
use metal_candle::studio::app::{Page, Prefs, StudioOptions};
use metal_candle::studio::eval_page::EvalStatus;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf()
}

fn prefs(runs: &Path) -> Prefs {
    let mut prefs = Prefs { device: DeviceChoice::Cpu, auto_load_model: false, ..Prefs::default() };
    prefs.model_path = fixture("tiny-llama").display().to_string();
    prefs.train.out = runs.to_path_buf();
    prefs.train.seq_len = 64;
    prefs
}

fn studio(prefs: Prefs, height: f32) -> StudioHarness {
    let options = StudioOptions { discover_defaults: false, persist: false, ..Default::default() };
    let mut h = build(prefs, options, height, true);
    h.step();
    h
}

fn has(h: &StudioHarness, text: &str) -> bool {
    h.query_all_by_label_contains(text).next().is_some()
}

fn load_model(h: &mut StudioHarness) {
    h.get_by_label("Load model").click();
    step_until(h, "the model", 60, |a| a.model.loaded.is_some());
}

fn open_dataset(h: &mut StudioHarness, path: &Path) {
    goto(h, Page::Dataset);
    app_mut(h).prefs.dataset_input = path.display().to_string();
    h.step();
    h.get_by_label("Open dataset").click();
    let path = path.to_path_buf();
    step_until(h, "the dataset report", 60, move |a| {
        !a.dataset_panel.is_inspecting() && a.dataset_panel.report.as_ref().is_some_and(|r| r.path == path)
    });
    h.step();
}

#[test]
fn dpo_picked_on_the_settings_page_trains_and_plots_under_trl_names() {
    let dir = tempfile::tempdir().unwrap();
    let runs = dir.path().join("runs");
    let mut p = prefs(&runs);
    (p.train.iters, p.train.batch_size, p.train.val_every, p.train.save_every) = (Some(3), 2, 3, 3);
    p.train.lr = 5e-3;
    p.train.warmup = Some(0);
    p.train.run_name = Some("dpo-run".into());
    let mut h = studio(p, 1500.0);
    load_model(&mut h);
    open_dataset(&mut h, &root().join("assets/sample-preference"));

    // SFT on pairs: the Train page refuses to start, in the engine's words, and offers the switch.
    goto(&mut h, Page::Training);
    assert!(has(&h, "This dataset holds preference pairs: SFT cannot train on it."));
    assert!(has(&h, "Switch to DPO"));
    assert!(has(&h, "train with --method dpo or orpo, not sft"), "the engine's refusal is shown");
    assert!(h.get_by_label("Start training").accesskit_node().is_disabled(), "and the run cannot start");
    assert!(has(&h, "method sft"), "the page says which method the next run uses");

    // DPO picked on the LoRA settings page, with its parameters.
    goto(&mut h, Page::Settings);
    assert!(!has(&h, "Label smoothing"), "no preference parameters for SFT");
    click(&mut h, "DPO");
    assert_eq!(app(&h).prefs.train.method, Method::Dpo);
    assert!(has(&h, "Beta") && has(&h, "Label smoothing") && h.query_by_label("ipo").is_some());
    assert!(!has(&h, "This dataset holds preference pairs"), "the method fits the data now");
    assert!(has(&h, "batch 2 pairs (4 sequences)"), "the memory estimate counts both sequences of a pair");
    // The engine's own check of the values, inline.
    app_mut(&mut h).prefs.train.beta = 0.0;
    h.step();
    h.step();
    assert!(has(&h, "beta (--beta) is 0; it must be a positive number"));
    app_mut(&mut h).prefs.train.beta = 0.2;
    h.step();
    // ORPO has no DPO loss; back to DPO.
    click(&mut h, "ORPO");
    assert!(!has(&h, "Label smoothing") && has(&h, "weight of the odds-ratio term"));
    click(&mut h, "DPO");

    // The run starts with DPO: run.json records it, and its steps plot the rewards.
    goto(&mut h, Page::Training);
    assert!(has(&h, "method dpo · beta 0.2 · sigmoid"));
    click(&mut h, "Start training");
    step_until(&mut h, "the DPO run to finish", 240, |a| {
        !a.training_panel.is_active() && a.training_panel.run.as_ref().is_some_and(|r| r.step >= 3)
    });
    h.step();
    h.step();
    let run = app(&h).training_panel.run.clone().unwrap();
    assert_eq!(run.preference.accuracies.len(), 3, "every step carries rewards/accuracies");
    assert!(!run.preference.val_accuracies.is_empty(), "the evaluation at step 3 too");
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(runs.join("dpo-run/run.json")).unwrap()).unwrap();
    assert_eq!((manifest["config"]["method"].as_str(), manifest["config"]["beta"].as_f64()), (Some("dpo"), Some(0.2)));
    for label in
        ["rewards/accuracies", "rewards/margins", "rewards/chosen · rewards/rejected", "eval_rewards/accuracies"]
    {
        assert!(has(&h, label), "{label} is shown");
    }
    assert!(has(&h, "method dpo · beta 0.2 · sigmoid"), "the run card names the method");

    // The checkpoints page names the method of each run.
    goto(&mut h, Page::Checkpoints);
    step_until(&mut h, "the runs list", 30, |a| a.checkpoints_panel.runs.len() == 1);
    h.step();
    assert!(has(&h, "· dpo"), "the run list tags the method");
}

fn metrics(accuracy: f64, margin: f64) -> PreferenceMetrics {
    PreferenceMetrics {
        loss: 0.69 - margin / 4.0,
        rewards_chosen: margin / 2.0,
        rewards_rejected: -margin / 2.0,
        rewards_accuracies: accuracy,
        rewards_margins: margin,
        pairs: 4,
        ..Default::default()
    }
}

#[test]
fn step_and_eval_events_with_preference_metrics_fill_the_reward_plots() {
    let dir = tempfile::tempdir().unwrap();
    let mut h = studio(prefs(dir.path()), 1500.0);
    goto(&mut h, Page::Training);
    assert!(!has(&h, "rewards/accuracies"), "no reward plots before a preference run");
    let config = TrainConfig { method: Method::Orpo, beta: 0.3, ..TrainConfig::default() };
    let panel = &mut app_mut(&mut h).training_panel;
    panel.on_event(
        TrainEvent::Started {
            run_dir: dir.path().join("orpo-run"),
            config: Box::new(config),
            trainable_params: 1000,
            total_steps: 4,
            tokens_per_epoch: 100,
            target_tokens_per_epoch: 40,
            train_examples: 8,
            valid_examples: 4,
            truncated_examples: 0,
            start_step: 0,
            notes: vec![],
        },
        0.6,
    );
    for step in 1..=4 {
        let m = metrics(step as f64 / 4.0, 0.1 * step as f64);
        let event = TrainEvent::Step {
            step,
            total_steps: 4,
            loss: m.loss,
            lr: 1e-4,
            grad_norm: 1.0,
            tokens_per_sec: 50.0,
            trained_tokens: step * 20,
            elapsed_secs: step as f64,
            eta_secs: (4 - step) as f64,
            preference: Some(m),
            grpo: None,
        };
        panel.on_event(event, 0.6);
    }
    let eval = metrics(0.75, 0.5);
    panel.on_event(
        TrainEvent::Eval { step: 4, val_loss: eval.loss, perplexity: 3.0, best: true, preference: Some(eval) },
        0.6,
    );
    h.step();
    h.step();
    for label in [
        "rewards/accuracies",
        "rewards/margins",
        "rewards/chosen · rewards/rejected",
        "rewards/accuracies 1.000",
        "rewards/margins 0.400",
        "eval_rewards/accuracies 0.750",
        "method orpo · beta 0.3",
    ] {
        assert!(has(&h, label), "{label} is shown");
    }
    let run = app(&h).training_panel.run.as_ref().unwrap();
    assert_eq!(
        (run.preference.margins.len(), run.preference.val_margins.len(), run.preference.rejected.len()),
        (4, 1, 4)
    );
}

#[test]
fn a_preference_evaluation_shows_rewards_accuracies_and_each_pair() {
    let dir = tempfile::tempdir().unwrap();
    let mut h = studio(prefs(dir.path()), 1500.0);
    load_model(&mut h);
    goto(&mut h, Page::Evaluate);
    click(&mut h, "Preference");
    assert!(has(&h, "Beta") && has(&h, "Label smoothing"), "DPO's parameters");
    click(&mut h, "Another file");
    {
        let eval = &mut app_mut(&mut h).prefs.eval;
        eval.file = fixture("preference/rows-standard.jsonl").display().to_string();
        eval.adapters.push(fixture("preference/tiny-llama-adapter"));
    }
    h.step();
    h.step();
    assert!(has(&h, "2 targets · preference"), "base and adapter are ready to score");
    click(&mut h, "Run evaluation");
    step_until(&mut h, "the preference evaluation", 120, |a| !a.eval_page.is_running());
    h.step();
    h.step();
    assert_eq!(app(&h).eval_page.status, EvalStatus::Finished, "{:?}", app(&h).eval_page.status);
    let results = &app(&h).eval_page.results;
    assert_eq!(results.task, "preference");
    let accuracy = results.finished[1].metric("rewards/accuracies").expect("the adapter's accuracy");
    assert!((0.0..=1.0).contains(&accuracy));
    assert_eq!(results.finished[0].metric("rewards/margins"), Some(0.0), "the base is its own DPO reference");
    for label in ["rewards/accuracies", "rewards/margins", "logps/chosen", "preferred: "] {
        assert!(has(&h, label), "{label} is shown");
    }
    assert!(has(&h, "rows-standard.jsonl:1"), "each pair names its file and line");
    assert!(has(&h, " vs rejected "), "each pair's chosen and rejected reward");
}
