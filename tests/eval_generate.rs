//! `eval --task generate`: SmolLM2 taught the arithmetic task's answer form by a short LoRA run scores a higher
//! exact match than the base; rows without a reference and other bad input are refused before anything is
//! generated; the judge's replies are kept per row, scored or counted as unparsed.

mod common;

use candle_core::{DType, Device};
use common::{fixture, smollm2_path};
use metal_candle::engine::data::SplitName;
use metal_candle::engine::eval::{run_eval, EvalReport, EvalSpec, EvalTarget, EvalTask, GenerateSettings};
use metal_candle::engine::model::{load_model, LoadedModel};
use std::path::Path;
use std::sync::atomic::AtomicBool;

fn generate_spec(data: &Path, settings: GenerateSettings, targets: Vec<EvalTarget>) -> EvalSpec {
    EvalSpec {
        task: EvalTask::Generate(settings),
        data: data.to_path_buf(),
        split: SplitName::Test,
        seq_len: 256,
        targets,
        ..Default::default()
    }
}

fn run(spec: &EvalSpec, base: &LoadedModel) -> metal_candle::engine::Result<EvalReport> {
    run_eval(spec, base, &AtomicBool::new(false), &mut |_| {})
}

#[test]
fn bad_input_is_refused_by_file_and_line_before_any_generation() {
    let base = load_model(&fixture("tiny-llama"), &Device::Cpu, DType::F32).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("questions.jsonl");
    std::fs::write(
        &file,
        "{\"messages\": [{\"role\": \"user\", \"content\": \"1+1?\"}, {\"role\": \"assistant\", \"content\": \"2\"}]}\n\
         \n{\"messages\": [{\"role\": \"user\", \"content\": \"2+2?\"}]}\n",
    )
    .unwrap();
    let settings = GenerateSettings { max_tokens: 2, ..Default::default() };
    let err = run(&generate_spec(&file, settings.clone(), vec![EvalTarget::base()]), &base).unwrap_err().to_string();
    assert!(err.contains("questions.jsonl:3") && err.contains("no assistant message"), "{err}");

    std::fs::write(&file, "{\"text\": \"just text\"}\n").unwrap();
    let err = run(&generate_spec(&file, settings.clone(), vec![EvalTarget::base()]), &base).unwrap_err().to_string();
    assert!(err.contains("questions.jsonl:1") && err.contains("text row has no reference"), "{err}");

    let arithmetic = fixture("datasets/arithmetic");
    let bad_regex = GenerateSettings { regex: Some("[0-9".into()), ..settings.clone() };
    let err = run(&generate_spec(&arithmetic, bad_regex, vec![EvalTarget::base()]), &base).unwrap_err().to_string();
    assert!(err.contains("--regex `[0-9`") && err.contains("not a valid regex"), "{err}");
    let none = EvalSpec { limit: Some(0), ..generate_spec(&arithmetic, settings, vec![EvalTarget::base()]) };
    assert!(run(&none, &base).unwrap_err().to_string().contains("--limit 0"));
}

#[test]
fn the_judge_reply_is_kept_per_row_and_unparsed_replies_are_counted() {
    let base = load_model(&fixture("tiny-llama"), &Device::Cpu, DType::F32).unwrap();
    let arithmetic = fixture("datasets/arithmetic");
    // A judge whose context cannot hold the rubric is refused before anything is generated.
    let small = GenerateSettings { max_tokens: 4, judge: Some(fixture("tiny-llama")), ..Default::default() };
    let err = run(&generate_spec(&arithmetic, small, vec![EvalTarget::base()]), &base).unwrap_err().to_string();
    assert!(err.contains("test.jsonl:1") && err.contains("context of 256 tokens"), "{err}");

    // SmolLM2 judges tiny-llama's random answers: every reply is shown, scored when it holds a number 1-10.
    let settings = GenerateSettings {
        max_tokens: 4,
        regex: Some(r"\d".into()),
        judge: Some(smollm2_path()),
        ..Default::default()
    };
    let spec = EvalSpec { limit: Some(3), ..generate_spec(&arithmetic, settings, vec![EvalTarget::base()]) };
    let report = run(&spec, &base).unwrap();
    let result = &report.targets[0];
    let names: Vec<&str> = result.metrics.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(names, ["exact_match", "contains", "regex", "token_f1", "judge_score", "judge_unparsed", "rows"]);
    let rows = result.rows.as_array().unwrap();
    assert_eq!(rows.len(), 3);
    let scored: Vec<u64> = rows.iter().filter_map(|r| r["judge_score"].as_u64()).collect();
    eprintln!("{}", serde_json::to_string_pretty(&result.rows).unwrap());
    assert_eq!(result.metric("judge_unparsed"), Some((3 - scored.len()) as f64));
    if !scored.is_empty() {
        let mean = scored.iter().sum::<u64>() as f64 / scored.len() as f64;
        assert!((result.metric("judge_score").unwrap() - mean).abs() < 1e-12);
    }
    for row in rows {
        assert!(row["judge_reply"].as_str().is_some_and(|r| !r.is_empty()) && row["answer"].is_string(), "{row}");
        assert!(row["prompt"].as_str().unwrap().starts_with("What is "), "{row}");
    }
}

#[test]
fn smollm2_taught_the_answer_form_beats_the_base_at_exact_match() {
    use metal_candle::engine::train::{self, LoraSettings, TrainConfig, TrainControl};
    let dir = tempfile::tempdir().unwrap();
    let model_path = smollm2_path();
    let base = load_model(&model_path, &Device::Cpu, DType::F32).unwrap();
    let arithmetic = fixture("datasets/arithmetic");
    let config = TrainConfig {
        model: model_path.clone(),
        data: arithmetic.clone(),
        out: dir.path().to_path_buf(),
        run_name: Some("sums".into()),
        lora: LoraSettings { rank: 8, alpha: 16.0, targets: "all-linear".parse().unwrap(), ..Default::default() },
        iters: Some(12),
        epochs: None,
        batch_size: 4,
        seq_len: 64,
        lr: 2e-3,
        warmup: Some(2),
        val_every: 0,
        save_every: 0,
        device: metal_candle::engine::device::DeviceChoice::Cpu,
        ..Default::default()
    };
    let run_dir = train::run_training(&config, &base, &TrainControl::default(), &mut |_| {}).unwrap();

    let settings = GenerateSettings { max_tokens: 8, regex: Some(r"^\s*\d+\s*$".into()), ..Default::default() };
    let targets = EvalTarget::expand(&[run_dir]).unwrap();
    let targets = [vec![EvalTarget::base()], targets].concat();
    let report = run(&generate_spec(&arithmetic, settings, targets), &base).unwrap();
    for t in &report.targets {
        eprintln!("{}: {:?}", t.target.label, t.metrics);
        for row in t.rows.as_array().unwrap() {
            eprintln!("  {}", row);
        }
    }
    let (plain, tuned) = (&report.targets[0], &report.targets[1]);
    assert_eq!(tuned.target.label, "sums/checkpoint-12");
    let em = |t: &metal_candle::engine::eval::TargetResult| t.metric("exact_match").unwrap();
    assert!(em(tuned) > em(plain), "exact match: adapter {} vs base {}", em(tuned), em(plain));
    // Twelve steps teach the form (a bare number) more surely than the sums themselves.
    let form = |t: &metal_candle::engine::eval::TargetResult| t.metric("regex").unwrap();
    assert!(form(tuned) >= 0.8 && form(tuned) > form(plain), "bare numbers: {} vs base {}", form(tuned), form(plain));
    // The per-row JSON shows why: the adapter's answers are the bare number, the base's are not.
    let row = &tuned.rows[0];
    assert_eq!(
        (row["line"].as_u64(), row["prompt"].as_str(), row["reference"].as_str()),
        (Some(1), Some("What is 2+3?"), Some("5"))
    );
    assert!(row["scores"]["exact_match"].is_f64() && row["stop_reason"].is_string(), "{row}");
}
