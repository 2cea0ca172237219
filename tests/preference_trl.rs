//! DPO, IPO, conservative DPO and ORPO against TRL 1.16 (tests/fixtures/preference, made by
//! scripts/make_preference_fixtures.py): on tiny-llama with a PEFT adapter whose B is not zero, our
//! `eval --task preference` reports TRL's loss, rewards, accuracies and log-probabilities on the same rows (1e-4
//! relative), our pair tokenization is TRL's, and one batch's adapter gradients equal TRL's autograd (1e-4); on the
//! real SmolLM2-135M-Instruct (dense f32 from its GGUF) the metrics agree as well.

mod common;

use candle_core::{DType, Device};
use common::*;
use metal_candle::engine::checkpoint;
use metal_candle::engine::data::{self, PreparedSplit, Row, TokenizeSpec};
use metal_candle::engine::eval::preference::PreferenceTask;
use metal_candle::engine::eval::{run_eval, EvalSpec, EvalTarget, EvalTask};
use metal_candle::engine::model::{load_model, LoadedModel};
use metal_candle::engine::train::backprop::Pass;
use metal_candle::engine::train::preference::PreferenceObjective;
use metal_candle::engine::train::{Method, PreferenceLoss, PreferenceSettings};
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;

const FORMS: [&str; 2] = ["standard", "conversational"];

fn dir() -> PathBuf {
    fixture("preference")
}

fn expected() -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir().join("expected.json")).unwrap()).unwrap()
}

fn tiny_llama() -> LoadedModel {
    load_model(&fixture("tiny-llama"), &Device::Cpu, DType::F32).unwrap()
}

/// The methods the fixture holds, by its names.
fn methods(beta: f64) -> Vec<(&'static str, Method, PreferenceSettings)> {
    let s = PreferenceSettings { beta, ..Default::default() };
    vec![
        ("dpo_sigmoid", Method::Dpo, s),
        ("dpo_ipo", Method::Dpo, PreferenceSettings { loss: PreferenceLoss::Ipo, ..s }),
        ("dpo_cdpo_0.1", Method::Dpo, PreferenceSettings { label_smoothing: 0.1, ..s }),
        ("orpo", Method::Orpo, s),
    ]
}

fn rows_file(form: &str) -> PathBuf {
    dir().join(format!("rows-{form}.jsonl"))
}

/// The rows of one form, tokenized as training tokenizes preference pairs.
fn pairs(m: &LoadedModel, form: &str, max_length: usize) -> PreparedSplit {
    let spec = TokenizeSpec::for_model(m, max_length, false);
    let raw =
        data::load_raw_dataset(&rows_file(form), &data::DataOptions { valid_fraction: 0.0, ..Default::default() })
            .unwrap();
    let mut split = PreparedSplit { examples: vec![], rejected: Some(vec![]), source_lines: vec![], prompts: None };
    for row in &raw.train.rows {
        let Row::Preference(pair) = &row.row else { panic!("{form}: line {} is not a pair", row.line) };
        let (chosen, rejected) = data::preference::tokenize_pair(pair, &spec).unwrap();
        split.examples.push(chosen);
        split.rejected.as_mut().unwrap().push(rejected);
        split.source_lines.push(row.line);
    }
    split
}

#[test]
fn pairs_are_tokenized_as_trl_tokenizes_them() {
    let (m, exp) = (tiny_llama(), expected());
    let max_length = exp["max_length"].as_u64().unwrap() as usize;
    for form in FORMS {
        let split = pairs(&m, form, max_length);
        let want = exp["tokenized"][form].as_array().unwrap();
        assert_eq!(split.examples.len(), want.len(), "{form}");
        for (i, row) in want.iter().enumerate() {
            let prompt = ids(&row["prompt_ids"]);
            for (side, example) in [("chosen", &split.examples[i]), ("rejected", &split.rejected.as_ref().unwrap()[i])]
            {
                let completion = ids(&row[format!("{side}_ids")]);
                let whole: Vec<u32> = prompt.iter().chain(&completion).copied().take(max_length).collect();
                assert_eq!(example.input_ids, whole, "{form} row {i} {side}");
                let targets: Vec<bool> = (0..whole.len()).map(|j| j >= prompt.len()).collect();
                assert_eq!(example.target_mask, targets, "{form} row {i} {side}: the completion is the target");
            }
        }
    }
}

fn close(ours: f64, theirs: f64, what: &str) {
    let tolerance = 1e-4 * theirs.abs().max(1e-2);
    assert!((ours - theirs).abs() <= tolerance, "{what}: ours {ours} vs TRL {theirs}");
}

/// Our `eval --task preference` of the fixture folder `dir`'s adapter on `m` against the TRL metrics it holds.
fn assert_eval_matches_trl(m: &LoadedModel, dir: &std::path::Path, adapter: &str) {
    let exp: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
    let beta = exp["beta"].as_f64().unwrap();
    for form in FORMS {
        for (name, method, settings) in methods(beta) {
            let spec = EvalSpec {
                task: EvalTask::Preference(PreferenceTask { method, settings }),
                data: dir.join(format!("rows-{form}.jsonl")),
                targets: vec![EvalTarget::adapter(&dir.join(adapter))],
                seq_len: exp["max_length"].as_u64().unwrap() as usize,
                batch_size: 4,
                ..EvalSpec::default()
            };
            let report = run_eval(&spec, m, &AtomicBool::new(false), &mut |_| {}).unwrap();
            let theirs = &exp["metrics"][form][name];
            let result = &report.targets[0];
            let keys = theirs.as_object().unwrap().keys().filter(|k| *k != "per_row");
            for key in keys {
                let ours = result.metric(key).unwrap_or_else(|| panic!("{form} {name}: we report no `{key}`"));
                close(ours, theirs[key].as_f64().unwrap(), &format!("{form} {name} {key}"));
            }
            let per_row = &theirs["per_row"];
            for (i, row) in result.rows.as_array().unwrap().iter().enumerate() {
                for key in ["chosen_logps", "rejected_logps"] {
                    if let Some(t) = per_row[key].get(i) {
                        close(row[key].as_f64().unwrap(), t.as_f64().unwrap(), &format!("{form} {name} row {i} {key}"));
                    }
                }
            }
        }
    }
}

#[test]
fn eval_reports_trls_metrics_for_every_method() {
    assert_eval_matches_trl(&tiny_llama(), &dir(), "tiny-llama-adapter");
}

/// The real SmolLM2-135M-Instruct (its Q4_1 GGUF read dense in f32, as transformers reads it): TRL's numbers too.
#[test]
fn eval_on_smollm2_reports_trls_metrics() {
    let m = load_model(&smollm2_path(), &Device::Cpu, DType::F32).unwrap();
    assert_eval_matches_trl(&m, &dir().join("smollm2"), "adapter");
}

#[test]
fn one_batch_gradients_equal_trls() {
    let exp = expected();
    let beta = exp["beta"].as_f64().unwrap();
    let max_length = exp["max_length"].as_u64().unwrap() as usize;
    let base = tiny_llama();
    for form in FORMS {
        let split = pairs(&base, form, max_length);
        let indices: Vec<usize> = (0..split.examples.len()).collect();
        let batch = data::collate_pairs(&split, &indices, base.eos_token_ids[0]).unwrap();
        for (name, method, settings) in methods(beta).into_iter().filter(|(n, ..)| *n != "dpo_cdpo_0.1") {
            let mut model = base.model.clone();
            let (_, params) = checkpoint::load_adapter_params(&mut model, &dir().join("tiny-llama-adapter")).unwrap();
            let objective = PreferenceObjective::new(method, settings, &base.model);
            let pass = Pass::default();
            let (_, out) = objective.loss_and_gradients(&model, &batch, 1.0, pass).unwrap();
            let theirs =
                candle_core::safetensors::load(dir().join(format!("grads-{form}-{name}.safetensors")), &Device::Cpu)
                    .unwrap();
            let mut compared = 0;
            for p in &params {
                let prefix = checkpoint::peft_prefix(p.layer, p.module);
                for (var, side) in [(&p.a, "lora_A"), (&p.b, "lora_B")] {
                    let key = format!("{prefix}.{side}.weight");
                    let want = theirs.get(&key).unwrap_or_else(|| panic!("{form} {name}: TRL has no {key}"));
                    let ours = out.grads.get(var.as_tensor()).unwrap_or_else(|| panic!("no gradient for {key}"));
                    // Ours are stored transposed from PEFT's: A (in, r), B (r, out).
                    let ours: Vec<f32> = ours.t().unwrap().flatten_all().unwrap().to_vec1().unwrap();
                    let want: Vec<f32> = want.flatten_all().unwrap().to_vec1().unwrap();
                    let scale = want.iter().map(|v| v.abs()).fold(0f32, f32::max).max(1e-8);
                    let worst = ours.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
                    assert!(worst / scale < 1e-4, "{form} {name} {key}: max diff {worst} of {scale}");
                    compared += 1;
                }
            }
            assert_eq!(compared, theirs.len(), "{form} {name}: every TRL gradient has ours");
        }
    }
}
