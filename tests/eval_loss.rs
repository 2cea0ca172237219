//! `eval --task loss` against transformers + PEFT (tests/fixtures/eval_loss_expected.json, made by
//! scripts/make_eval_fixtures.py): the same templated, masked, cut rows give the same loss within 1e-4, for the
//! base and with an adapter. Also: cancel between rows, a missing split, and `eval --json` on a run folder.

mod common;

use candle_core::{DType, Device};
use common::fixture;
use metal_candle::engine::data::SplitName;
use metal_candle::engine::eval::{run_eval, EvalEvent, EvalSpec, EvalTarget, EvalTask};
use metal_candle::engine::model::load_model;
use metal_candle::engine::Error;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};

fn spec(targets: Vec<EvalTarget>) -> EvalSpec {
    EvalSpec {
        task: EvalTask::Loss,
        data: fixture("datasets/arithmetic"),
        split: SplitName::Test,
        seq_len: 48,
        batch_size: 3,
        targets,
        ..Default::default()
    }
}

#[test]
fn loss_and_perplexity_match_transformers_and_peft() {
    let text = std::fs::read_to_string(fixture("eval_loss_expected.json")).unwrap();
    let expected: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(expected["seq_len"], 48);
    let base = load_model(&fixture("tiny-llama"), &Device::Cpu, DType::F32).unwrap();
    let targets = vec![EvalTarget::base(), EvalTarget::adapter(&fixture("tiny-llama-peft"))];
    let report = run_eval(&spec(targets), &base, &AtomicBool::new(false), &mut |_| {}).unwrap();
    assert_eq!(report.rows, 10);
    assert!(report.notes.iter().any(|n| n.contains("1 rows were longer")), "{:?}", report.notes);
    for (result, key) in report.targets.iter().zip(["base_loss", "adapter_loss"]) {
        let want = expected[key].as_f64().unwrap();
        let loss = result.metric("loss").unwrap();
        assert!((loss - want).abs() < 1e-4, "{}: loss {loss} vs transformers {want}", result.target.label);
        assert!((result.metric("perplexity").unwrap() - want.exp()).abs() < 1e-4 * want.exp());
        assert_eq!(result.metric("target_tokens"), expected["target_tokens"].as_f64());
        assert_eq!(result.metric("rows"), Some(10.0));
        let rows = result.rows.as_array().unwrap();
        for (row, want) in rows.iter().zip(expected["rows"].as_array().unwrap()) {
            assert_eq!(row["line"], want["line"]);
            assert_eq!(row["target_tokens"], want["target_tokens"]);
            let (got, want) = (row["loss"].as_f64().unwrap(), want[key].as_f64().unwrap());
            assert!((got - want).abs() < 1e-4, "line {}: {got} vs {want}", row["line"]);
        }
    }
    assert_ne!(report.targets[0].metric("loss"), report.targets[1].metric("loss"), "the adapter changes the loss");
}

#[test]
fn cancel_stops_between_rows_and_a_missing_split_names_the_files() {
    let base = load_model(&fixture("tiny-llama"), &Device::Cpu, DType::F32).unwrap();
    let cancel = AtomicBool::new(false);
    let mut scored = Vec::new();
    let one_row = EvalSpec { batch_size: 1, ..spec(vec![EvalTarget::base()]) };
    let result = run_eval(&one_row, &base, &cancel, &mut |e| {
        if let EvalEvent::Progress { done, .. } = e {
            scored.push(done);
            if done == 2 {
                cancel.store(true, Ordering::SeqCst);
            }
        }
    });
    assert!(matches!(result, Err(Error::Cancelled)), "{result:?}");
    assert_eq!(scored, vec![0, 1, 2], "stopped right after the row it was cancelled in");

    let valid = EvalSpec { split: SplitName::Valid, valid_fraction: 0.0, ..spec(vec![EvalTarget::base()]) };
    let err = run_eval(&valid, &base, &AtomicBool::new(false), &mut |_| {}).unwrap_err().to_string();
    assert!(err.contains("no validation rows"), "{err}");
    let only_train = tempfile::tempdir().unwrap();
    std::fs::copy(fixture("datasets/arithmetic/train.jsonl"), only_train.path().join("train.jsonl")).unwrap();
    let missing = EvalSpec { data: only_train.path().to_path_buf(), ..spec(vec![EvalTarget::base()]) };
    let err = run_eval(&missing, &base, &AtomicBool::new(false), &mut |_| {}).unwrap_err().to_string();
    assert!(err.contains("no test split") && err.contains("train.jsonl"), "{err}");
    let none = EvalSpec { limit: Some(0), ..spec(vec![EvalTarget::base()]) };
    let err = run_eval(&none, &base, &AtomicBool::new(false), &mut |_| {}).unwrap_err().to_string();
    assert!(err.contains("--limit 0"), "{err}");
}

#[test]
fn cli_eval_json_on_a_run_folder_lists_every_checkpoint_in_step_order() {
    let out = tempfile::tempdir().unwrap();
    let train = Command::new(env!("CARGO_BIN_EXE_metal-candle"))
        .args(["train", "--model"])
        .arg(fixture("tiny-llama"))
        .arg("--data")
        .arg(fixture("datasets/arithmetic"))
        .arg("--out")
        .arg(out.path())
        .args(["--name", "sums", "--device", "cpu", "--seq-len", "48", "--batch-size", "4", "--rank", "4"])
        .args(["--iters", "6", "--save-every", "2", "--lr", "0.01"])
        .output()
        .unwrap();
    assert!(train.status.success(), "{}", String::from_utf8_lossy(&train.stderr));

    // Model, data, seq_len and seed come from the run's run.json.
    let eval = Command::new(env!("CARGO_BIN_EXE_metal-candle"))
        .args(["eval", "--device", "cpu", "--base", "--json", "--checkpoints"])
        .arg(out.path().join("sums"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&eval.stderr);
    assert!(eval.status.success(), "{stderr}");
    let report: serde_json::Value = serde_json::from_slice(&eval.stdout).unwrap();
    let labels: Vec<&str> =
        report["targets"].as_array().unwrap().iter().map(|t| t["target"]["label"].as_str().unwrap()).collect();
    assert_eq!(labels, ["base", "sums/checkpoint-2", "sums/checkpoint-4", "sums/checkpoint-6"]);
    let steps: Vec<_> = report["targets"].as_array().unwrap().iter().map(|t| t["target"]["step"].clone()).collect();
    assert_eq!(steps, [serde_json::Value::Null, 2.into(), 4.into(), 6.into()]);
    for t in report["targets"].as_array().unwrap() {
        let names: Vec<&str> = t["metrics"].as_array().unwrap().iter().map(|m| m["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["loss", "perplexity", "target_tokens", "rows"]);
        assert_eq!(t["rows"].as_array().unwrap().len(), 10);
    }
    let loss = |i: usize| report["targets"][i]["metrics"][0]["value"].as_f64().unwrap();
    assert!(loss(3) < loss(0), "training on sums lowers the test loss: {} -> {}", loss(0), loss(3));

    // The table marks the best loss; bad input fails before the model loads, with the engine's message.
    let table = Command::new(env!("CARGO_BIN_EXE_metal-candle"))
        .args(["eval", "--device", "cpu", "--checkpoints"])
        .arg(out.path().join("sums"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(table.status.success() && text.contains("sums/checkpoint-6") && text.contains('*'), "{text}");
    let bad = Command::new(env!("CARGO_BIN_EXE_metal-candle"))
        .args(["eval", "--task", "generate", "--regex", "(", "--checkpoints"])
        .arg(out.path().join("sums"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(!bad.status.success() && err.contains("not a valid regex") && !err.contains("loading"), "{err}");
}
