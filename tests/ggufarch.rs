//! GGUF files of every family we read, written by llama.cpp's own Python writer (the PyPI `gguf` package, with
//! its architecture names and per-architecture tensor names) from the tiny Hugging Face fixtures by
//! scripts/make_gguf_fixtures.py: `qwen2` and `qwen3` files (Qwen's `qwen2` pre-tokenizer, q/k rows as in
//! Hugging Face), a Mistral model as a `llama` file (q/k rows permuted), f32 and f16, SentencePiece
//! vocabularies (`tokenizer.ggml.model = llama`) with and without the space prefix, a `gemma3` file (norms stored
//! as 1 + w, llama.cpp's gemma3 tensor names, its fixed score scale and sliding pattern) and a `phi3` file (fused
//! `attn_qkv` / gate|up `ffn_up`, partial rotary, LongRoPE factor tensors), an `olmo2` file (post-norms only,
//! whole-projection q/k norms, q/k rows unpermuted), a `smollm3` file (llama.cpp's every-4th-layer NoPE) and a
//! `granite` file (its four scales), both with q/k rows permuted. Our reader must give the
//! Hugging Face original's log-probs, the family, the chat template, and llama.cpp's token ids on a list of
//! hostile strings; our own GGUF export of each family must use the same tensor names, keys and data.

mod common;

use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::{DType, Device, Tensor};
use common::{expected, fixture, floats, ids, max_abs_diff};
use metal_candle::engine::export::{export_with, ExportFormat, ExportRequest, GgufQuant};
use metal_candle::engine::generate::score;
use metal_candle::engine::model::chat_template::{ChatMessage, DateTime};
use metal_candle::engine::model::{load_model, load_model_info};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Every file of tests/fixtures/gguf/expected.json with its reference entry.
fn cases() -> Vec<(PathBuf, serde_json::Value)> {
    let all = expected("gguf");
    let map = all.as_object().expect("expected.json is an object of files");
    map.values().map(|case| (fixture("gguf").join(case["file"].as_str().unwrap()), case.clone())).collect()
}

fn hostile_strings() -> Vec<String> {
    let text = std::fs::read_to_string(fixture("gguf").join("hostile_strings.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

#[test]
fn every_family_scores_like_the_hugging_face_original() {
    let cases = cases();
    assert_eq!(cases.len(), 11, "tests/fixtures/gguf/expected.json lists eleven files");
    for (path, case) in cases {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let m = load_model(&path, &Device::Cpu, DType::F32).unwrap();
        assert_eq!(m.config.architecture.as_str(), case["family"].as_str().unwrap(), "{name}: family");
        let text = case["score"]["text"].as_str().unwrap();
        let ids = m.tokenizer.encode(text, true).unwrap();
        assert_eq!(ids, common::ids(&case["score"]["ids"]), "{name}: ids of the score text differ from llama.cpp's");
        let lp = score(&m.model, &ids).unwrap();
        // f32 files hold the original's weights exactly; the f16 file's reference is the original with its
        // matrices rounded to f16 the same way, so both agree to f32 arithmetic. The gemma3 file's reference is
        // tiny-gemma3 as the file describes it, the smollm3 file's likewise (see scripts/make_gguf_fixtures.py).
        let diff = max_abs_diff(&lp, &floats(&case["score"]["token_logprobs"]));
        eprintln!("{name}: max |logprob diff| vs Hugging Face = {diff:.2e}");
        assert!(diff < 1e-4, "{name}: max |logprob diff| = {diff}");
    }
}

#[test]
fn tokenization_matches_llama_cpp_on_hostile_strings() {
    let texts = hostile_strings();
    for (path, case) in cases() {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let info = load_model_info(&path).unwrap();
        let want = case["hostile_ids"].as_array().unwrap();
        assert_eq!(want.len(), texts.len(), "{name}");
        for (text, want) in texts.iter().zip(want) {
            let got = info.tokenizer.encode(text, true).unwrap();
            assert_eq!(got, ids(want), "{name}: {text:?}");
        }
    }
}

#[test]
fn chat_templates_come_from_the_file_for_every_family() {
    for (path, case) in cases() {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let mut info = load_model_info(&path).unwrap();
        // transformers rendered `strftime_now` (smollm3's template) on the fixture's recorded day.
        if let Some(today) =
            case["fixture"].as_str().and_then(|f| expected(f)["chat"]["today"].as_str().map(String::from))
        {
            let today = DateTime::parse_date(&today).unwrap();
            info.chat_template = info.chat_template.take().map(|t| t.with_today(today));
        }
        let template = info.chat_template.as_ref().unwrap_or_else(|| panic!("{name}: no chat template"));
        assert!(template.origin.contains("tokenizer.chat_template"), "{name}: {}", template.origin);
        if name.contains("spm") {
            let msgs = [ChatMessage::new("user", "Hi"), ChatMessage::new("assistant", "Hello")];
            assert_eq!(info.render_chat(&msgs, false).unwrap(), "<s>[INST] Hi [/INST]Hello</s>", "{name}");
            continue;
        }
        let chat = &expected(case["fixture"].as_str().unwrap())["chat"];
        let msgs: Vec<ChatMessage> = serde_json::from_value(chat["messages"].clone()).unwrap();
        assert_eq!(info.render_chat(&msgs, true).unwrap(), chat["rendered"].as_str().unwrap(), "{name}");
        let turn_end = if name.contains("gemma3") { "<end_of_turn>" } else { "<|im_end|>" };
        let turn_end_id = info.tokenizer.token_to_id(turn_end).unwrap();
        assert!(info.eos_token_ids.contains(&turn_end_id), "{name}: {turn_end} ends a turn");
    }
}

fn header(path: &Path) -> Content {
    Content::read(&mut std::fs::File::open(path).unwrap()).unwrap()
}

fn tensor(path: &Path, content: &Content, name: &str) -> Tensor {
    let mut file = std::fs::File::open(path).unwrap();
    content.tensor(&mut file, name, &Device::Cpu).unwrap().dequantize(&Device::Cpu).unwrap()
}

/// The `<arch>.*` hyperparameter keys with their values, as comparable text.
fn arch_keys(content: &Content) -> BTreeSet<(String, String)> {
    let arch = match &content.metadata["general.architecture"] {
        Value::String(s) => s.clone(),
        other => panic!("general.architecture is {other:?}"),
    };
    let keys = content.metadata.iter().filter(|(k, _)| k.starts_with(&format!("{arch}.")));
    keys.filter(|(k, _)| !k.ends_with(".vocab_size")).map(|(k, v)| (k.clone(), format!("{v:?}"))).collect()
}

#[test]
fn our_gguf_export_of_each_family_matches_llama_cpp_naming_keys_and_data() {
    let dir = tempfile::tempdir().unwrap();
    for (family, reference) in
        [("tiny-qwen2", "tiny-qwen2-f32"), ("tiny-qwen3", "tiny-qwen3-f32"), ("tiny-mistral", "tiny-mistral-f32")]
    {
        let out = dir.path().join(format!("{family}.gguf"));
        let req = ExportRequest {
            checkpoint: None,
            format: ExportFormat::Gguf,
            quant: GgufQuant::F16,
            out: out.clone(),
            base_model: fixture(family),
            allow_other_base: false,
            overwrite: false,
        };
        export_with(&req, &mut |_| {}).unwrap();
        let reference = fixture("gguf").join(format!("{reference}.gguf"));
        let (ours_h, ref_h) = (header(&out), header(&reference));
        let names = |c: &Content| c.tensor_infos.keys().cloned().collect::<BTreeSet<_>>();
        assert_eq!(names(&ours_h), names(&ref_h), "{family}: tensor names");
        let ref_keys = arch_keys(&ref_h);
        let our_keys = arch_keys(&ours_h);
        let missing: Vec<_> = ref_keys.difference(&our_keys).collect();
        assert!(
            missing.is_empty(),
            "{family}: keys llama.cpp's writer sets that ours lacks or sets otherwise: {missing:?}"
        );
        for name in names(&ref_h) {
            let ours = tensor(&out, &ours_h, &name);
            let mut want = tensor(&reference, &ref_h, &name);
            if ours_h.tensor_infos[&name].ggml_dtype == candle_core::quantized::GgmlDType::F16 {
                want = want.to_dtype(DType::F16).unwrap().to_dtype(DType::F32).unwrap();
            }
            let diff = (ours - want).unwrap().abs().unwrap().flatten_all().unwrap().max(0).unwrap();
            assert_eq!(diff.to_scalar::<f32>().unwrap(), 0.0, "{family}: tensor {name} differs");
        }
        let m = load_model(&out, &Device::Cpu, DType::F32).unwrap();
        assert_eq!(m.config.architecture.as_str(), family.trim_start_matches("tiny-"), "{family}: read back");
    }
}
