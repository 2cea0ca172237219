//! The real model: SmolLM2-135M-Instruct (Q4_1 GGUF from PyPI, fetched by scripts/fetch_smollm2.sh) loads,
//! tokenizes and scores like the transformers reference, chats sensibly, and the CLI speaks JSON.

mod common;

use candle_core::{DType, Device};
use common::*;
use metal_candle::engine::generate::{generate, score, GenerateRequest};
use metal_candle::engine::model::chat_template::ChatMessage;
use metal_candle::engine::model::load_model;
use metal_candle::engine::sampler::SamplingParams;

fn smollm2_expected() -> serde_json::Value {
    let path = fixture("smollm2_expected.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn smollm2_scores_match_transformers() {
    let m = load_model(&smollm2_path(), &Device::Cpu, DType::F32).unwrap();
    let exp = smollm2_expected();
    let ids = m.tokenizer.encode(exp["score"]["text"].as_str().unwrap(), true).unwrap();
    assert_eq!(ids, common::ids(&exp["score"]["ids"]));
    let lp = score(&m.model, &ids).unwrap();
    let diff = max_abs_diff(&lp, &floats(&exp["score"]["token_logprobs"]));
    assert!(diff < 1e-4, "max |logprob diff| = {diff}");
}

#[test]
fn smollm2_answers_that_paris_is_the_capital_of_france() {
    let m = load_model(&smollm2_path(), &Device::Cpu, DType::F32).unwrap();
    let exp = smollm2_expected();
    let messages: Vec<ChatMessage> = serde_json::from_value(exp["chat"]["messages"].clone()).unwrap();
    let prompt_ids = m.encode_chat(&messages).unwrap();
    assert_eq!(prompt_ids, ids(&exp["chat"]["prompt_ids"]));
    // The reference's 32 greedy tokens, eos ignored.
    let req = GenerateRequest {
        prompt_ids: prompt_ids.clone(),
        max_new_tokens: 32,
        sampling: SamplingParams::greedy(),
        eos_token_ids: m.eos_token_ids.clone(),
        ignore_eos: true,
        stop_strings: vec![],
    };
    let out = generate(&m.model, &m.tokenizer, &req, &mut |_| true).unwrap();
    assert_eq!(out.generated_ids, ids(&exp["greedy"]["generated_ids"]));
    // And as a user sees it: streamed, stopping at the end of the turn.
    let mut streamed = String::new();
    let req = GenerateRequest { ignore_eos: false, max_new_tokens: 64, ..req };
    let out = generate(&m.model, &m.tokenizer, &req, &mut |piece| {
        streamed.push_str(piece);
        true
    })
    .unwrap();
    assert_eq!(out.stop_reason, metal_candle::engine::generate::StopReason::Eos);
    assert!(streamed.contains("Paris"), "{streamed}");
    assert_eq!(streamed.trim(), out.text.trim());
}

fn cli(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_metal-candle")).args(args).output().unwrap()
}

#[test]
fn cli_generate_and_score_print_json() {
    let model = smollm2_path();
    let model = model.to_str().unwrap();
    let out = cli(&[
        "generate",
        "--model",
        model,
        "--device",
        "cpu",
        "--prompt",
        "What is the capital of France?",
        "--chat",
        "--temperature",
        "0",
        "--max-tokens",
        "16",
        "--json",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["text"].as_str().unwrap().contains("Paris"), "{v}");
    assert!(!v["prompt_ids"].as_array().unwrap().is_empty() && !v["generated_ids"].as_array().unwrap().is_empty());

    let exp = smollm2_expected();
    let out = cli(&[
        "score",
        "--model",
        model,
        "--device",
        "cpu",
        "--text",
        exp["score"]["text"].as_str().unwrap(),
        "--json",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(ids(&v["ids"]), ids(&exp["score"]["ids"]));
    assert_eq!(v["token_logprobs"].as_array().unwrap().len(), v["ids"].as_array().unwrap().len() - 1);
    assert!((v["nll_mean"].as_f64().unwrap() - exp["score"]["nll_mean"].as_f64().unwrap()).abs() < 1e-4);

    let out = cli(&["info", "--model", model, "--device", "cpu", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["architecture"], "llama");
    assert_eq!(v["layers"], 30);
    assert_eq!(v["chat_template"], true);
}

#[test]
fn bad_input_gives_clear_errors_not_panics() {
    let dir = tempfile::tempdir().unwrap();
    // Missing file.
    let out = cli(&["info", "--model", dir.path().join("nope.gguf").to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("nope.gguf"));
    // Truncated GGUF.
    let bytes = std::fs::read(smollm2_path()).unwrap();
    let cut = dir.path().join("cut.gguf");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let out = cli(&["info", "--model", cut.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success() && err.contains("cut.gguf") && !err.contains("panicked"), "{err}");
    // Unsupported architecture in a Hugging Face folder.
    let folder = dir.path().join("gpt2");
    std::fs::create_dir(&folder).unwrap();
    std::fs::write(folder.join("config.json"), r#"{"model_type": "gpt2"}"#).unwrap();
    let out = cli(&["info", "--model", folder.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(err.contains("gpt2") && err.contains("qwen3"), "{err}");
    // Truncated safetensors.
    let tiny = dir.path().join("tiny");
    std::fs::create_dir(&tiny).unwrap();
    for f in ["config.json", "tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(fixture("tiny-llama").join(f), tiny.join(f)).unwrap();
    }
    let weights = std::fs::read(fixture("tiny-llama").join("model.safetensors")).unwrap();
    std::fs::write(tiny.join("model.safetensors"), &weights[..weights.len() - 100]).unwrap();
    let out = cli(&["info", "--model", tiny.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success() && err.contains("model.safetensors") && !err.contains("panicked"), "{err}");
    // A prompt longer than the context.
    let long = "word ".repeat(300);
    let out =
        cli(&["generate", "--model", fixture("tiny-llama").to_str().unwrap(), "--prompt", &long, "--device", "cpu"]);
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success() && err.contains("context"), "{err}");
}

/// `bench sample` prints one draw time per spread and refuses settings that cannot draw, saying which.
#[test]
fn bench_sample_times_draws_and_refuses_settings_that_draw_nothing() {
    let out = cli(&["bench", "sample", "--vocab", "1000", "--spread", "0.1,8", "--draws", "5", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<serde_json::Value> =
        String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 2);
    for line in &lines {
        assert_eq!(line["vocab"], 1000);
        assert!(line["ms_per_draw"].as_f64().is_some_and(|ms| ms > 0.0), "{line}");
    }
    for (args, says) in [
        (&["--temperature", "0"][..], "--temperature"),
        (&["--spread=nan"][..], "--spread"),
        (&["--vocab", "0"][..], "--vocab"),
        (&["--top-p", "1.5"][..], "top-p"),
    ] {
        let out = cli(&[&["bench", "sample"][..], args].concat());
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(!out.status.success() && err.contains(says) && !err.contains("panicked"), "{args:?}: {err}");
    }
}

#[test]
fn smollm2_learns_the_sample_format_and_applies_it_to_a_new_country() {
    use metal_candle::engine::train::{self, LoraSettings, TrainConfig, TrainControl, TrainEvent};
    let dir = tempfile::tempdir().unwrap();
    let model_path = smollm2_path();
    let base = load_model(&model_path, &Device::Cpu, DType::F32).unwrap();
    let cfg = TrainConfig {
        model: model_path.clone(),
        data: std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/sample-chat"),
        out: dir.path().to_path_buf(),
        run_name: Some("format".into()),
        lora: LoraSettings { rank: 8, alpha: 16.0, targets: "all-linear".parse().unwrap(), ..Default::default() },
        iters: Some(24),
        epochs: None,
        batch_size: 4,
        seq_len: 96,
        lr: 2e-3,
        warmup: Some(3),
        val_every: 0,
        save_every: 0,
        device: metal_candle::engine::device::DeviceChoice::Cpu,
        ..Default::default()
    };
    let mut val_losses = Vec::new();
    let run_dir = train::run_training(&cfg, &base, &TrainControl::default(), &mut |e| {
        if let TrainEvent::Eval { val_loss, .. } = e {
            val_losses.push(val_loss);
        }
    })
    .unwrap();
    assert!(val_losses.last().copied().unwrap_or(f64::MAX) < 0.3, "validation loss {val_losses:?}");

    // Iceland is not in the dataset: the adapter must apply the learned format to it.
    let mut tuned = load_model(&model_path, &Device::Cpu, DType::F32).unwrap();
    metal_candle::engine::checkpoint::load_adapter(&mut tuned.model, &run_dir.join("checkpoint-24")).unwrap();
    let prompt_ids = tuned.encode_chat(&[ChatMessage::new("user", "Tell me about Iceland.")]).unwrap();
    let req = GenerateRequest {
        prompt_ids,
        max_new_tokens: 40,
        sampling: SamplingParams::greedy(),
        eos_token_ids: tuned.eos_token_ids.clone(),
        ignore_eos: false,
        stop_strings: vec![],
    };
    let out = generate(&tuned.model, &tuned.tokenizer, &req, &mut |_| true).unwrap();
    assert!(out.text.starts_with("Iceland -> capital: ") && out.text.contains("; continent: "), "{:?}", out.text);
    assert_eq!(out.stop_reason, metal_candle::engine::generate::StopReason::Eos, "the adapter learned to stop");
}
