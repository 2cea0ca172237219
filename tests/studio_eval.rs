//! Issue 32, the studio's Evaluate page, driven with egui_kittest on the tiny Llama fixture: without a model the
//! page refuses in words; the base and a checkpoint of a run trained here are picked and become the evaluation's
//! targets; a failing evaluation shows the worker's error in the page; the results view (metrics table with the
//! best marked, the per-row grids of each task, the plot's series) and a cancelled run, from the job's events.

#![cfg(feature = "studio")]

mod common;

use common::fixture;
use common::studio::{app, app_mut, build, click, goto, step_until, with_model_and_sample, StudioHarness};
use egui_kittest::kittest::{NodeT, Queryable};
use metal_candle::engine::device::DeviceChoice;
use metal_candle::engine::eval::{EvalEvent, EvalReport, EvalTarget, Metric, TargetResult};
use metal_candle::engine::train::{self, LoraSettings, TrainConfig, TrainControl};
use metal_candle::studio::app::{Page, Prefs, StudioOptions};
use metal_candle::studio::eval_page::EvalStatus;
use metal_candle::worker::SplitName;
use serde_json::json;
use std::path::{Path, PathBuf};

/// Preferences for tiny-llama on the CPU with runs in `runs`.
fn prefs(runs: &Path) -> Prefs {
    let mut prefs = Prefs { device: DeviceChoice::Cpu, auto_load_model: false, ..Prefs::default() };
    prefs.model_path = fixture("tiny-llama").display().to_string();
    prefs.train.out = runs.to_path_buf();
    prefs.train.seq_len = 64;
    prefs
}

/// A four-step run of tiny-llama on the sample chat with checkpoints at steps 2 and 4.
fn train_tiny_run(runs: &Path) -> PathBuf {
    let base = metal_candle::engine::model::load_model(
        &fixture("tiny-llama"),
        &candle_core::Device::Cpu,
        candle_core::DType::F32,
    )
    .unwrap();
    let cfg = TrainConfig {
        model: fixture("tiny-llama"),
        data: Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/sample-chat"),
        out: runs.to_path_buf(),
        run_name: Some("tiny".into()),
        lora: LoraSettings { rank: 4, alpha: 8.0, ..Default::default() },
        iters: Some(4),
        epochs: None,
        batch_size: 2,
        seq_len: 64,
        lr: 5e-3,
        warmup: Some(1),
        val_every: 0,
        save_every: 2,
        device: DeviceChoice::Cpu,
        ..Default::default()
    };
    train::run_training(&cfg, &base, &TrainControl::default(), &mut |_| {}).unwrap()
}

fn has(h: &StudioHarness, text: &str) -> bool {
    h.query_all_by_label_contains(text).next().is_some()
}

#[test]
fn without_a_model_the_page_says_so_and_offers_no_run() {
    let dir = tempfile::tempdir().unwrap();
    let options = StudioOptions { discover_defaults: false, persist: false, ..Default::default() };
    let mut h = build(prefs(dir.path()), options, 1000.0, false);
    h.step();
    goto(&mut h, Page::Evaluate);
    assert!(has(&h, "No model is loaded. Load the base model on the Model page"), "the refusal is in the page");
    assert!(h.query_by_label_contains("Run evaluation").is_none(), "no Run button while refused");
    click(&mut h, "Go to the Model page");
    assert_eq!(app(&h).prefs.page, Page::Model);
}

#[test]
fn base_and_a_checkpoint_are_picked_and_a_failing_evaluation_shows_its_error() {
    let dir = tempfile::tempdir().unwrap();
    let runs = dir.path().join("runs");
    let run = train_tiny_run(&runs);
    let mut h = with_model_and_sample(prefs(&runs), 1400.0);
    goto(&mut h, Page::Evaluate);
    step_until(&mut h, "the runs list", 30, |a| a.checkpoints_panel.runs.len() == 1);
    h.step();
    // The sample set has no test split: the page says which splits it has.
    assert_eq!(app(&h).prefs.eval.split, SplitName::Test);
    assert!(has(&h, "has no test split; pick train or valid instead"), "a missing split is refused in words");
    click(&mut h, "valid (17)");
    assert!(has(&h, "1 target · loss on the valid split of sample-chat"), "the base alone is ready to run");

    click(&mut h, "step 2");
    let picked = &app(&h).prefs.eval.checkpoints;
    assert_eq!(picked, &vec![run.join("checkpoint-2")]);
    assert!(has(&h, "2 targets · loss on the valid split of sample-chat"));
    assert!(has(&h, "1/2"), "the run shows how many of its checkpoints are picked");
    assert!(!has(&h, "trained on"), "a run on the loaded model is not marked");

    // The loss task end to end on the worker: the table, the plot and every row of both targets.
    click(&mut h, "Run evaluation");
    step_until(&mut h, "the loss evaluation", 120, |a| !a.eval_page.is_running());
    h.step();
    assert_eq!(app(&h).eval_page.status, EvalStatus::Finished, "{:?}", app(&h).eval_page.status);
    let results = &app(&h).eval_page.results;
    assert_eq!(results.finished.len(), 2);
    let (base, ckpt) = (results.finished[0].metric("loss").unwrap(), results.finished[1].metric("loss").unwrap());
    assert!(base.is_finite() && ckpt.is_finite() && base != ckpt, "{base} {ckpt}");
    assert!(has(&h, "Finished in") && has(&h, "2 targets · 17 rows each · loss"));
    assert!(has(&h, &format!("{:.4}  best", base.min(ckpt))), "the lower loss is marked");
    assert!(has(&h, "valid.jsonl:"), "each row names its file and line");
    assert!(has(&h, "Against the training step") && has(&h, "Save results…"));

    // An adapter folder that holds no adapter: the job refuses it before any row runs, and the page shows why.
    let empty = dir.path().join("not-an-adapter");
    std::fs::create_dir_all(&empty).unwrap();
    app_mut(&mut h).prefs.eval.adapters.push(empty.clone());
    h.step();
    assert!(has(&h, "3 targets · loss"));
    click(&mut h, "Run evaluation");
    step_until(&mut h, "the evaluation to end", 60, |a| !a.eval_page.is_running());
    h.step();
    let EvalStatus::Failed { message, cancelled } = app(&h).eval_page.status.clone() else {
        panic!("the evaluation should fail: {:?}", app(&h).eval_page.status)
    };
    assert!(!cancelled);
    assert!(message.contains("not-an-adapter"), "the error names the folder: {message}");
    assert!(has(&h, "Evaluation failed:"), "the error is shown in the page");
    assert!(has(&h, &message), "with the worker's words");

    // A run trained on another model is marked before anything runs.
    let manifest_path = run.join("run.json");
    let mut manifest: serde_json::Value = serde_json::from_slice(&std::fs::read(&manifest_path).unwrap()).unwrap();
    manifest["config"]["model"] = json!(fixture("tiny-qwen2"));
    std::fs::write(&manifest_path, serde_json::to_vec(&manifest).unwrap()).unwrap();
    click(&mut h, "Refresh");
    step_until(&mut h, "the runs list again", 30, |a| {
        a.checkpoints_panel.runs.iter().any(|r| r.config.as_ref().is_some_and(|c| c.model.ends_with("tiny-qwen2")))
    });
    h.step();
    assert!(has(&h, "trained on tiny-qwen2"), "the run names the model it trained on");
}

fn target(label: &str, adapter: Option<&str>, step: Option<usize>) -> EvalTarget {
    EvalTarget { label: label.into(), adapter: adapter.map(PathBuf::from), step }
}

fn result(t: EvalTarget, metrics: &[(&str, f64)], rows: serde_json::Value) -> TargetResult {
    TargetResult {
        target: t,
        metrics: metrics.iter().map(|(n, v)| Metric::new(n, *v)).collect(),
        rows,
        elapsed_secs: 1.5,
    }
}

/// The page in a studio with no model, fed an evaluation's events as the worker sends them.
fn results_studio(task: &str, results: Vec<TargetResult>, finish: bool) -> StudioHarness {
    let dir = tempfile::tempdir().unwrap();
    let options = StudioOptions { discover_defaults: false, persist: false, ..Default::default() };
    let mut h = build(prefs(dir.path()), options, 1600.0, false);
    h.step();
    goto(&mut h, Page::Evaluate);
    let targets: Vec<EvalTarget> = results.iter().map(|r| r.target.clone()).collect();
    let page = &mut app_mut(&mut h).eval_page;
    page.on_eval(EvalEvent::Started {
        task: task.into(),
        rows: 2,
        targets,
        notes: vec!["2 rows cut to 64 tokens".into()],
    });
    for (i, r) in results.iter().enumerate() {
        page.on_eval(EvalEvent::Progress { target: i, done: 2, total: 2 });
        page.on_eval(EvalEvent::TargetFinished { target: i, result: Box::new(r.clone()) });
    }
    if finish {
        page.on_finished(EvalReport {
            task: task.into(),
            data: "data/test.jsonl".into(),
            split: SplitName::Test,
            rows: 2,
            notes: vec!["2 rows cut to 64 tokens".into()],
            targets: results,
        });
    }
    h.step();
    h.step();
    h
}

#[test]
fn loss_results_show_the_table_with_the_best_marked_and_each_rows_loss() {
    let rows = |a: f64, b: f64| {
        json!([{"line": 1, "source": "d/test.jsonl:1", "target_tokens": 12, "loss": a},
               {"line": 2, "source": "d/test.jsonl:2", "target_tokens": 30, "loss": b}])
    };
    let results = vec![
        result(target("base", None, None), &[("loss", 2.5), ("perplexity", 12.18)], rows(2.4, 2.6)),
        result(
            target("tiny/checkpoint-2", Some("runs/tiny/checkpoint-2"), Some(2)),
            &[("loss", 2.1), ("perplexity", 8.17)],
            rows(2.0, 2.2),
        ),
        result(
            target("tiny/checkpoint-4", Some("runs/tiny/checkpoint-4"), Some(4)),
            &[("loss", 2.3)],
            json!([{"line": 1}]),
        ),
    ];
    let mut h = results_studio("loss", results, true);
    assert_eq!(app(&h).eval_page.status, EvalStatus::Finished);
    assert!(has(&h, "Finished in"));
    assert!(has(&h, "2.1000  best"), "the lowest loss is marked");
    assert!(has(&h, "8.1700  best"), "and the lowest perplexity");
    assert!(!has(&h, "2.5000  best"));
    assert!(has(&h, "Note: 2 rows cut to 64 tokens"));
    assert!(has(&h, "rows 1–2 of 2") && has(&h, "test.jsonl:2"));
    assert!(has(&h, "2.2000") && has(&h, "2.6000"), "each row's loss per target");
    assert!(h.query_all_by_label("—").count() >= 2, "missing fields show a dash: checkpoint-4's perplexity and row 2");
    assert!(has(&h, "Save results…"));
    assert!(has(&h, "Against the training step"), "the checkpoints have steps: the plot is shown");
    click(&mut h, "Save results…");
    assert!(h.query_by_label("Save").is_some(), "the save row asks for the file");
}

#[test]
fn generate_results_put_answers_side_by_side_with_their_scores() {
    let long = "word ".repeat(100);
    let row = |answer: &str, em: bool| {
        json!({"line": 4, "prompt": long, "reference": "Paris", "answer": answer, "stop_reason": "eos",
               "scores": {"exact_match": em, "contains": em, "token_f1": if em { 1.0 } else { 0.25 }}})
    };
    let results = vec![
        result(
            target("base", None, None),
            &[("exact_match", 0.0), ("token_f1", 0.25)],
            json!([row("It is London", false)]),
        ),
        result(
            target("my-adapter", Some("elsewhere/my-adapter"), None),
            &[("exact_match", 1.0), ("token_f1", 1.0)],
            json!([row("Paris", true), {"line": 5}]),
        ),
    ];
    let mut h = results_studio("generate", results, false);
    assert!(has(&h, "It is London") && has(&h, "Paris"), "each target's answer");
    assert!(has(&h, "EM 1") && has(&h, "EM 0") && has(&h, "F1 0.25"), "scores beside the answers");
    assert!(has(&h, "1.0000  best"), "the best exact match is marked");
    assert!(!has(&h, "Save results…"), "the report is saved once the evaluation has finished");
    assert!(has(&h, "Pick checkpoints of a run to see the metric"), "no target has a step: no plot");
    let node = h.get_by_label_contains("word word");
    let clipped = node.accesskit_node().label().or(node.value()).unwrap_or_default();
    assert!(clipped.ends_with('…') && clipped.len() < long.len(), "a long prompt is clipped: {clipped:?}");
    h.get_all_by_label("more").next().unwrap().click();
    h.step();
    h.step();
    assert!(h.query_by_label_contains(long.trim_end()).is_some(), "more shows the whole prompt");
}

#[test]
fn multiple_choice_results_show_each_targets_pick_and_log_likelihoods() {
    let row = |pred: usize| {
        json!({"context": "The sky is", "choices": ["blue", "green"], "gold": 0,
               "loglikelihoods": [-1.25, -3.5], "pred": pred, "pred_norm": pred})
    };
    let results = vec![
        result(target("base", None, None), &[("acc", 0.0), ("acc_norm", 0.0)], json!([row(1)])),
        result(
            target("tiny/checkpoint-4", Some("runs/tiny/checkpoint-4"), Some(4)),
            &[("acc", 1.0), ("acc_norm", 1.0)],
            json!([row(0)]),
        ),
    ];
    let h = results_studio("multiple-choice", results, true);
    assert!(has(&h, "0. blue  (gold)"), "the gold choice is marked");
    assert!(has(&h, "0 = gold") && has(&h, "1 ≠ gold"), "each target's pick, right or wrong");
    assert!(has(&h, "0: -1.250"), "the log-likelihoods");
}

#[test]
fn a_cancelled_evaluation_says_so_and_keeps_the_finished_targets() {
    let dir = tempfile::tempdir().unwrap();
    let options = StudioOptions { discover_defaults: false, persist: false, ..Default::default() };
    let mut h = build(prefs(dir.path()), options, 1400.0, false);
    h.step();
    goto(&mut h, Page::Evaluate);
    let targets =
        vec![target("base", None, None), target("tiny/checkpoint-2", Some("runs/tiny/checkpoint-2"), Some(2))];
    let first = result(targets[0].clone(), &[("loss", 2.5)], json!([{"line": 1, "tokens": 3, "loss": 2.5}]));
    let page = &mut app_mut(&mut h).eval_page;
    page.on_eval(EvalEvent::Started { task: "loss".into(), rows: 10, targets, notes: vec![] });
    page.on_eval(EvalEvent::TargetFinished { target: 0, result: Box::new(first) });
    page.on_eval(EvalEvent::Progress { target: 1, done: 4, total: 10 });
    h.step();
    assert!(has(&h, "target 2 of 2 (tiny/checkpoint-2) · rows 4/10"), "the progress names the target and rows");
    assert!(has(&h, "evaluating 2/2…"), "the navigation shows it too");
    click(&mut h, "Cancel");
    assert!(has(&h, "cancelling…"));
    app_mut(&mut h).eval_page.on_failed("cancelled".into(), true);
    h.step();
    assert!(has(&h, "Evaluation cancelled after"), "the page says it was cancelled");
    assert!(has(&h, "1 of 2 targets finished"));
    assert!(has(&h, "2.5000"), "the finished target's result stays");
    assert!(h.query_by_label("Cancel").is_none());
    // The setup is usable again.
    assert!(!h.get_by_label("Base model").accesskit_node().is_disabled());
    assert!(has(&h, "No model is loaded"), "and the next run is checked again");
}

#[test]
fn cancel_ends_a_running_evaluation_with_cancelled() {
    let dir = tempfile::tempdir().unwrap();
    let runs = dir.path().join("runs");
    let run = train_tiny_run(&runs);
    // Enough rows that the job is still running when Cancel is pressed.
    let line = json!({"messages": [{"role": "user", "content": "What is two plus two?"},
                                    {"role": "assistant", "content": "Four, of course."}]})
    .to_string();
    let file = dir.path().join("many.jsonl");
    std::fs::write(&file, vec![line; 4000].join("\n") + "\n").unwrap();
    let mut p = prefs(&runs);
    p.eval.data = metal_candle::studio::eval_setup::DataChoice::File;
    p.eval.file = file.display().to_string();
    p.eval.checkpoints = vec![run.join("checkpoint-2"), run.join("checkpoint-4")];
    p.eval.batch_size = 1;
    let mut h = with_model_and_sample(p, 1400.0);
    goto(&mut h, Page::Evaluate);
    step_until(&mut h, "the runs list", 30, |a| a.checkpoints_panel.runs.len() == 1);
    h.step();
    assert!(has(&h, "3 targets · loss on many.jsonl"));
    click(&mut h, "Run evaluation");
    step_until(&mut h, "the first rows", 60, |a| a.eval_page.status == EvalStatus::Running);
    click(&mut h, "Cancel");
    step_until(&mut h, "the cancel", 60, |a| !a.eval_page.is_running());
    h.step();
    assert_eq!(app(&h).eval_page.status, EvalStatus::Failed { message: app_message(&h), cancelled: true });
    assert!(has(&h, "Evaluation cancelled after"), "the page says so");
    assert!(app(&h).eval_page.results.finished.len() < 3, "it stopped before the last target");
}

fn app_message(h: &StudioHarness) -> String {
    match &app(h).eval_page.status {
        EvalStatus::Failed { message, .. } => message.clone(),
        other => format!("{other:?}"),
    }
}
