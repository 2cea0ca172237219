//! `--task multiple-choice` against lm-evaluation-harness itself: `tests/fixtures/mc/expected.json` holds what
//! lm-eval's `simple_evaluate` (model `hf`, the tiny fixtures, with and without the PEFT adapter) reported on
//! the rows beside it, per row and in aggregate (`scripts/make_lmeval_fixtures.py`). The same rows through
//! `run_eval` must give the same contexts and continuations, per-choice log-likelihoods within 1e-3, the same
//! is_greedy, and identical acc and acc_norm.

mod common;

use candle_core::{DType, Device};
use common::fixture;
use metal_candle::engine::data::{ReadOptions, SplitName};
use metal_candle::engine::eval::multiple_choice::{PairEncoder, TARGET_DELIMITER};
use metal_candle::engine::eval::{run_eval, EvalReport, EvalSpec, EvalTarget, EvalTask};
use metal_candle::engine::model::{load_model, LoadedModel};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

fn expected() -> Value {
    serde_json::from_str(&std::fs::read_to_string(fixture("mc/expected.json")).unwrap()).unwrap()
}

fn spec(data: PathBuf, targets: Vec<EvalTarget>, batch_size: usize) -> EvalSpec {
    EvalSpec {
        task: EvalTask::MultipleChoice,
        data,
        split: SplitName::Test,
        read: ReadOptions::default(),
        limit: None,
        seq_len: 2048,
        batch_size,
        targets,
        ..EvalSpec::default()
    }
}

fn eval(model: &LoadedModel, spec: &EvalSpec) -> EvalReport {
    run_eval(spec, model, &AtomicBool::new(false), &mut |_| {}).unwrap()
}

#[test]
fn loglikelihoods_acc_and_acc_norm_match_lm_eval() {
    let expected = expected();
    let cases = expected["cases"].as_array().unwrap();
    let mut checked = 0;
    for model_name in ["tiny-llama", "tiny-qwen2"] {
        let model = load_model(&fixture(model_name), &Device::Cpu, DType::F32).unwrap();
        for case in cases.iter().filter(|c| c["model"] == model_name) {
            let target = match case["adapter"].as_str() {
                Some(adapter) => EvalTarget::adapter(&fixture(adapter)),
                None => EvalTarget::base(),
            };
            let data = fixture(case["data"].as_str().unwrap());
            // Batches of 5 sequences mix rows of different lengths in one padded pass.
            let report = eval(&model, &spec(data, vec![target], 5));
            let result = &report.targets[0];
            let label = format!("{model_name} {} {}", case["adapter"], case["form"]);
            let ours = result.rows.as_array().unwrap();
            let theirs = case["rows"].as_array().unwrap();
            assert_eq!(ours.len(), theirs.len(), "{label}");
            for (i, (o, t)) in ours.iter().zip(theirs).enumerate() {
                assert_eq!(o["context"], t["context"], "{label} row {i}: the mapped context");
                let continuations: Vec<String> = o["choices"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|c| format!("{TARGET_DELIMITER}{}", c.as_str().unwrap()))
                    .collect();
                assert_eq!(serde_json::json!(continuations), t["continuations"], "{label} row {i}");
                assert_eq!(o["gold"], t["gold"], "{label} row {i}");
                let lls = common::floats(&o["loglikelihoods"]);
                let want = common::floats(&t["loglikelihoods"]);
                for (a, b) in lls.iter().zip(&want) {
                    assert!((a - b).abs() < 1e-3, "{label} row {i}: ll {a} vs lm-eval {b}");
                }
                assert_eq!(o["is_greedy"], t["is_greedy"], "{label} row {i}");
                assert_eq!(o["acc"], t["acc"], "{label} row {i}");
                assert_eq!(o["acc_norm"], t["acc_norm"], "{label} row {i}");
            }
            for name in ["acc", "acc_norm", "acc_stderr", "acc_norm_stderr"] {
                let ours = result.metric(name).unwrap();
                assert!((ours - case[name].as_f64().unwrap()).abs() < 1e-9, "{label} {name}: {ours} vs {}", case[name]);
            }
            checked += 1;
        }
    }
    assert_eq!(checked, cases.len(), "every lm-eval case is checked");
}

#[test]
fn batching_changes_nothing_and_the_report_describes_the_reading() {
    let model = load_model(&fixture("tiny-llama"), &Device::Cpu, DType::F32).unwrap();
    let data = fixture("mc/ai2_arc/ARC-Easy");
    let one = eval(&model, &spec(data.clone(), vec![EvalTarget::base()], 1));
    let many = eval(&model, &spec(data, vec![EvalTarget::base()], 64));
    let lls = |r: &EvalReport| -> Vec<f64> {
        r.targets[0].rows.as_array().unwrap().iter().flat_map(|row| common::floats(&row["loglikelihoods"])).collect()
    };
    for (a, b) in lls(&one).iter().zip(lls(&many)) {
        assert!((a - b).abs() < 1e-4, "{a} vs {b}");
    }
    let notes = one.notes.join("\n");
    assert!(notes.contains("ARC columns") && notes.contains("test-00000-of-00001.parquet"), "{notes}");
    assert!(notes.contains("adds its special tokens"), "tiny-llama's tokenizer prepends BOS: {notes}");
}

#[test]
fn encode_pair_moves_trailing_space_and_splits_the_whole_encoding() {
    // tiny-llama's tokenizer prepends BOS (id 0); tiny-qwen2's adds nothing.
    let llama = load_model(&fixture("tiny-llama"), &Device::Cpu, DType::F32).unwrap();
    let enc = PairEncoder::new(&llama.tokenizer);
    let (ctx, cont) = enc.encode_pair("The sky is ", "blue").unwrap();
    assert_eq!(ctx, llama.tokenizer.encode("The sky is", true).unwrap());
    assert_eq!(ctx[0], 0, "BOS first");
    let whole = llama.tokenizer.encode("The sky is blue", true).unwrap();
    assert_eq!([ctx.clone(), cont.clone()].concat(), [ctx.clone(), whole[ctx.len()..].to_vec()].concat());
    assert_eq!(enc.encode_pair("The sky is", " blue").unwrap(), (ctx.clone(), cont));
    // A context already starting with the BOS text gets no second BOS.
    let (with_bos, _) = enc.encode_pair("<|endoftext|>The sky is", " blue").unwrap();
    assert_eq!(with_bos, ctx);
    // An empty context is the BOS token alone.
    let (empty, cont) = enc.encode_pair("", " blue").unwrap();
    assert_eq!((empty, cont), (vec![0], llama.tokenizer.encode(" blue", false).unwrap()));
    let qwen = load_model(&fixture("tiny-qwen2"), &Device::Cpu, DType::F32).unwrap();
    let enc = PairEncoder::new(&qwen.tokenizer);
    assert!(!enc.adds_special_tokens().unwrap());
    let (ctx, _) = enc.encode_pair("The sky is", " blue").unwrap();
    assert_eq!(ctx, qwen.tokenizer.encode("The sky is", false).unwrap());
}

#[test]
fn bad_rows_fail_before_any_model_runs_naming_file_and_row() {
    let model = load_model(&fixture("tiny-llama"), &Device::Cpu, DType::F32).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.jsonl");
    std::fs::write(
        &path,
        "{\"context\": \"a\", \"choices\": [\"x\", \"y\"], \"gold\": 2}\n{\"context\": \"a\", \"choices\": [], \"gold\": 0}\n",
    )
    .unwrap();
    let mut events = 0;
    let err = run_eval(&spec(path, vec![EvalTarget::base()], 4), &model, &AtomicBool::new(false), &mut |_| events += 1)
        .unwrap_err()
        .to_string();
    assert!(err.contains("bad.jsonl:1: gold 2 is out of range") && err.contains("bad.jsonl:2: no choices"), "{err}");
    assert_eq!(events, 0, "nothing started");
    let err = run_eval(
        &spec(fixture("mc/ai2_arc"), vec![EvalTarget::base()], 4),
        &model,
        &AtomicBool::new(false),
        &mut |_| {},
    );
    // One configuration folder below: read through it, the test split.
    assert_eq!(err.unwrap().rows, 6);
    let missing = spec(Path::new("no/such/file.jsonl").into(), vec![EvalTarget::base()], 4);
    assert!(run_eval(&missing, &model, &AtomicBool::new(false), &mut |_| {}).is_err());
}

/// `metal-candle eval --task multiple-choice --json` end to end: the base and the PEFT adapter as two targets of
/// one run, on the MMLU-shaped rows, report lm-eval's log-likelihoods and accuracies.
#[test]
fn the_cli_scores_the_base_and_an_adapter_like_lm_eval() {
    let expected = expected();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_metal-candle"))
        .args(["eval", "--task", "multiple-choice", "--json", "--base", "--model"])
        .arg(fixture("tiny-llama"))
        .arg("--adapter")
        .arg(fixture("tiny-llama-peft"))
        .arg("--data")
        .arg(fixture("mc/mmlu.jsonl"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let targets = report["targets"].as_array().unwrap();
    assert_eq!(targets.len(), 2, "the base and the adapter");
    for target in targets {
        let adapter = target["target"]["adapter"].as_str().map(|_| "tiny-llama-peft");
        let case = expected["cases"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["model"] == "tiny-llama" && c["form"] == "mmlu" && c["adapter"].as_str() == adapter)
            .unwrap();
        let metric = |name: &str| {
            target["metrics"].as_array().unwrap().iter().find(|m| m["name"] == name).unwrap()["value"].as_f64().unwrap()
        };
        assert!((metric("acc") - case["acc"].as_f64().unwrap()).abs() < 1e-9, "{adapter:?}");
        assert!((metric("acc_norm") - case["acc_norm"].as_f64().unwrap()).abs() < 1e-9, "{adapter:?}");
        for (o, t) in target["rows"].as_array().unwrap().iter().zip(case["rows"].as_array().unwrap()) {
            for (a, b) in common::floats(&o["loglikelihoods"]).iter().zip(common::floats(&t["loglikelihoods"])) {
                assert!((a - b).abs() < 1e-3, "{adapter:?}: ll {a} vs lm-eval {b}");
            }
        }
    }
}
