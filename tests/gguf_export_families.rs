//! GGUF export of gemma3, phi3, olmo2, smollm3 and granite against llama.cpp, without node: llama.cpp's greedy
//! ids and log-probs on our exports are recorded by `scripts/make_gguf_export_fixtures.py`
//! (tests/fixtures/gguf-export/expected.json); here each tiny fixture with our trained adapter
//! (ours-tiny-<family>-adapter) is generated and scored by our engine and must give the same ids (merged f16,
//! base f16 + GGUF LoRA, merged q8_0 read back by our reader) and log-probs within f16 rounding. Our exports are
//! exported again and checked against what llama.cpp's converter writes: the `<arch>.*` keys and values and the
//! tensor names and shapes of tests/fixtures/gguf/tiny-<family>-f32.gguf (written after convert_hf_to_gguf.py by
//! make_gguf_fixtures.py), the LoRA tensors against the model's, the round trip through our reader, the Ollama
//! Modelfile's template and stops, and the refusal of configs a GGUF file cannot express.

mod common;

use candle_core::quantized::gguf_file::Content;
use candle_core::{DType, Device};
use common::fixture;
use metal_candle::engine::export::{export_with, ExportFormat, ExportRequest, GgufQuant};
use metal_candle::engine::generate::{generate, score, GenerateRequest};
use metal_candle::engine::model::{load_model, LoadedModel};
use metal_candle::engine::sampler::SamplingParams;
use serde_json::Value as Json;
use std::path::{Path, PathBuf};

const FAMILIES: [&str; 5] = ["gemma3", "phi3", "olmo2", "smollm3", "granite"];

fn expected() -> Json {
    let text = std::fs::read_to_string(fixture("gguf-export/expected.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn ids(v: &Json) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

/// The family's fixture, or a copy with the config patch the fixture script applied (gemma3, smollm3).
fn model_folder(family: &str, exp: &Json, dir: &Path) -> PathBuf {
    let src = fixture(&format!("tiny-{family}"));
    let Some(patch) = exp["config_patches"].get(family) else { return src };
    let dst = dir.join(format!("tiny-{family}-as-gguf"));
    std::fs::create_dir_all(&dst).unwrap();
    for entry in std::fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, dst.join(path.file_name().unwrap())).unwrap();
    }
    let mut config: Json = serde_json::from_str(&std::fs::read_to_string(dst.join("config.json")).unwrap()).unwrap();
    for (k, v) in patch.as_object().unwrap() {
        config[k] = v.clone();
    }
    std::fs::write(dst.join("config.json"), serde_json::to_string_pretty(&config).unwrap()).unwrap();
    dst
}

fn adapter(family: &str) -> PathBuf {
    fixture(&format!("ours-tiny-{family}-adapter"))
}

fn export(
    format: ExportFormat,
    quant: GgufQuant,
    model: &Path,
    ckpt: Option<PathBuf>,
    out: &Path,
) -> Result<(), String> {
    let req = ExportRequest {
        checkpoint: ckpt,
        format,
        quant,
        out: out.to_path_buf(),
        base_model: model.to_path_buf(),
        allow_other_base: false,
        overwrite: false,
    };
    export_with(&req, &mut |_| {}).map(|_| ()).map_err(|e| e.to_string())
}

fn greedy(m: &LoadedModel, prompt: &[u32], n: usize) -> Vec<u32> {
    let req = GenerateRequest {
        prompt_ids: prompt.to_vec(),
        max_new_tokens: n,
        sampling: SamplingParams::greedy(),
        eos_token_ids: m.eos_token_ids.clone(),
        ignore_eos: true,
        stop_strings: vec![],
    };
    generate(&m.model, &m.tokenizer, &req, &mut |_| true).unwrap().generated_ids
}

fn with_adapter(model: &Path, family: &str) -> LoadedModel {
    let mut m = load_model(model, &Device::Cpu, DType::F32).unwrap();
    metal_candle::engine::checkpoint::load_adapter(&mut m.model, &adapter(family)).unwrap();
    m
}

fn content(path: &Path) -> Content {
    Content::read(&mut std::fs::File::open(path).unwrap()).unwrap()
}

/// llama.cpp's ids equal ours, or llama.cpp stopped at an end-of-generation token that ours (eos ignored)
/// produced at the same place.
fn assert_same_ids(family: &str, case: &str, ours: &[u32], llama_cpp: &[u32], eos: &[u32]) {
    if llama_cpp.len() < ours.len() {
        assert_eq!(&ours[..llama_cpp.len()], llama_cpp, "{family} {case}: llama.cpp's ids are not a prefix of ours");
        assert!(eos.contains(&ours[llama_cpp.len()]), "{family} {case}: llama.cpp stopped where ours has no eos");
    } else {
        assert_eq!(ours, llama_cpp, "{family} {case}: greedy ids differ from llama.cpp's");
    }
}

#[test]
fn our_generate_matches_llama_cpp_on_our_exports_of_every_family() {
    let exp = expected();
    let dir = tempfile::tempdir().unwrap();
    let n = exp["n"].as_u64().unwrap() as usize;
    let prompt = exp["prompt"].as_str().unwrap();
    for family in FAMILIES {
        let e = &exp["families"][family];
        let model = model_folder(family, &exp, dir.path());
        let m = with_adapter(&model, family);
        let prompt_ids = m.tokenizer.encode(prompt, true).unwrap();
        assert_eq!(prompt_ids, ids(&e["prompt_ids"]), "{family}: prompt ids");
        assert_eq!(prompt_ids, ids(&e["llamacpp_prompt_ids"]), "{family}: llama.cpp tokenizes the prompt alike");
        let ours = greedy(&m, &prompt_ids, n);
        let eos = &m.eos_token_ids;
        for case in e["cases"].as_array().unwrap() {
            let name = case["case"].as_str().unwrap();
            let want = if name == "merged-q8_0" {
                // Our own reader on our q8_0 export, against llama.cpp on the same file.
                let out = dir.path().join(format!("{family}-q8_0.gguf"));
                export(ExportFormat::Gguf, GgufQuant::Q8_0, &model, Some(adapter(family)), &out).unwrap();
                greedy(&load_model(&out, &Device::Cpu, DType::F32).unwrap(), &prompt_ids, n)
            } else {
                ours.clone()
            };
            assert_same_ids(family, name, &want, &ids(&case["llamacpp_ids"]), eos);
        }
        // Log-probs of the score text: ours (HF folder + adapter) against llama.cpp's on merged f16 and on
        // base f16 + LoRA; f16 weights move them by a few thousandths.
        let score_ids = ids(&e["score"]["ids"]);
        assert_eq!(m.tokenizer.encode(exp["score_text"].as_str().unwrap(), true).unwrap(), score_ids);
        let ours_lp = score(&m.model, &score_ids).unwrap();
        for key in ["merged_f16_logprobs", "base_f16_lora_logprobs"] {
            let theirs: Vec<f64> = e["score"][key].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
            assert_eq!(theirs.len(), ours_lp.len(), "{family} {key}");
            let max = ours_lp.iter().zip(&theirs).map(|(a, b)| (*a as f64 - b).abs()).fold(0.0, f64::max);
            eprintln!("{family} {key}: max |d logprob| vs llama.cpp {max:.5}");
            assert!(max < 0.03, "{family} {key}: max |d logprob| {max}");
        }
    }
}

/// Keys our export may add to the converter's (harmless to llama.cpp, read by ours).
const EXTRA_KEYS: [&str; 4] = ["vocab_size", "rope.dimension_count", "attention.key_length", "attention.value_length"];

#[test]
fn exports_carry_the_converters_keys_and_tensors_and_read_back() {
    let exp = expected();
    let dir = tempfile::tempdir().unwrap();
    for family in FAMILIES {
        let model = model_folder(family, &exp, dir.path());
        let out = dir.path().join(format!("{family}-f16.gguf"));
        export(ExportFormat::Gguf, GgufQuant::F16, &model, Some(adapter(family)), &out).unwrap();
        let ours = content(&out);
        let theirs = content(&fixture(&format!("gguf/tiny-{family}-f32.gguf")));
        let arch = theirs.metadata["general.architecture"].to_string().unwrap().clone();
        assert_eq!(ours.metadata["general.architecture"].to_string().unwrap(), &arch);
        let prefix = format!("{arch}.");
        for (k, v) in theirs.metadata.iter().filter(|(k, _)| k.starts_with(&prefix)) {
            let got = ours.metadata.get(k).unwrap_or_else(|| panic!("{family}: {k} missing"));
            assert_eq!(format!("{got:?}"), format!("{v:?}"), "{family}: {k}");
        }
        for k in ours.metadata.keys().filter(|k| k.starts_with(&prefix) && !theirs.metadata.contains_key(*k)) {
            assert!(EXTRA_KEYS.contains(&&k[prefix.len()..]), "{family}: {k} is not written by the converter");
        }
        let shapes = |c: &Content| {
            let mut v: Vec<(String, Vec<usize>)> =
                c.tensor_infos.iter().map(|(n, i)| (n.clone(), i.shape.dims().to_vec())).collect();
            v.sort();
            v
        };
        assert_eq!(shapes(&ours), shapes(&theirs), "{family}: tensor names and shapes");

        // The LoRA GGUF: one lora_a (rank, in) / lora_b (out, rank) pair per adapted weight of the model file.
        let lora = dir.path().join(format!("{family}-lora.gguf"));
        export(ExportFormat::GgufLora, GgufQuant::F16, &model, Some(adapter(family)), &lora).unwrap();
        let l = content(&lora);
        assert_eq!(l.metadata["general.architecture"].to_string().unwrap(), &arch);
        assert!(!l.tensor_infos.is_empty());
        for (name, info) in &l.tensor_infos {
            let (weight, part) = name.rsplit_once('.').unwrap();
            let w = ours.tensor_infos.get(weight).unwrap_or_else(|| panic!("{family}: {name} adapts no tensor"));
            let (dims, wd) = (info.shape.dims(), w.shape.dims());
            match part {
                "lora_a" => assert_eq!(dims[1], wd[1], "{family}: {name} in"),
                "lora_b" => assert_eq!(dims[0], wd[0], "{family}: {name} out"),
                other => panic!("{family}: {other}"),
            }
        }

        // Our reader reads the file back as the model it was exported from.
        let back = load_model(&out, &Device::Cpu, DType::F32).unwrap();
        let reference = with_adapter(&model, family);
        let text = exp["score_text"].as_str().unwrap();
        let ids = reference.tokenizer.encode(text, true).unwrap();
        assert_eq!(back.tokenizer.encode(text, true).unwrap(), ids, "{family}: tokenizer round trip");
        let (a, b) = (score(&reference.model, &ids).unwrap(), score(&back.model, &ids).unwrap());
        let max = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
        assert!(max < 0.02, "{family}: our reader on our f16 export: max |d logprob| {max}");
    }
}

#[test]
fn configs_a_gguf_file_cannot_express_are_refused_before_writing() {
    let dir = tempfile::tempdir().unwrap();
    for (family, words) in [("gemma3", "query_pre_attn_scalar"), ("smollm3", "no_rope_layers")] {
        for format in [ExportFormat::Gguf, ExportFormat::GgufLora, ExportFormat::Ollama] {
            let out = dir.path().join(format!("{family}-{}", format.as_str()));
            let err = export(format, GgufQuant::F16, &fixture(&format!("tiny-{family}")), Some(adapter(family)), &out)
                .unwrap_err();
            assert!(err.contains(words) && err.contains("merged"), "{family} {format:?}: {err}");
            assert!(!out.exists(), "{family} {format:?}: something was written");
        }
    }
}

#[test]
fn ollama_modelfiles_carry_each_familys_template_and_stops() {
    let exp = expected();
    let dir = tempfile::tempdir().unwrap();
    // (family, markers its TEMPLATE must hold, stop lines, SYSTEM line start). The stops are the end-of-turn
    // token when the vocabulary has it, then the eos tokens: the tiny phi3 and granite vocabularies lack
    // `<|end|>` / `<|end_of_text|>` (the shared ChatML tokenizer), so their only stop is the eos `<|im_end|>`.
    let cases: [(&str, &[&str], &[&str], Option<&str>); 5] = [
        (
            "gemma3",
            &["<start_of_turn>user\n", "<start_of_turn>model\n", "<end_of_turn>"],
            &["<end_of_turn>", "<eos>"],
            None,
        ),
        ("phi3", &["<|system|>", "<|user|>", "<|end|>", "<|assistant|>"], &["<|im_end|>"], None),
        ("olmo2", &["<|user|>\n", "<|assistant|>\n", "<|im_end|>\n"], &["<|im_end|>"], None),
        (
            "smollm3",
            &["## Custom Instructions", "<|im_start|>assistant\n"],
            &["<|im_end|>"],
            Some("You are a helpful AI"),
        ),
        (
            "granite",
            &["<|start_of_role|>", "<|end_of_role|>", "<|end_of_text|>"],
            &["<|im_end|>"],
            Some("Knowledge Cutoff Date: April 2024."),
        ),
    ];
    for (family, markers, stops, system) in cases {
        let model = model_folder(family, &exp, dir.path());
        let out = dir.path().join(format!("{family}-ollama"));
        export(ExportFormat::Ollama, GgufQuant::Q8_0, &model, Some(adapter(family)), &out).unwrap();
        let text = std::fs::read_to_string(out.join("Modelfile")).unwrap();
        let template = text.split("TEMPLATE \"\"\"").nth(1).and_then(|t| t.split("\"\"\"").next());
        let template = template.unwrap_or_else(|| panic!("{family}: no TEMPLATE in\n{text}"));
        for m in markers {
            assert!(template.contains(m), "{family}: TEMPLATE lacks {m:?}:\n{template}");
        }
        let stop_lines: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("PARAMETER stop ")).collect();
        let want: Vec<String> = stops.iter().map(|s| format!("\"{s}\"")).collect();
        assert_eq!(stop_lines, want, "{family}: stops in\n{text}");
        match system {
            Some(start) => assert!(text.contains(&format!("SYSTEM \"\"\"{start}")), "{family}: SYSTEM in\n{text}"),
            None => assert!(!text.contains("SYSTEM"), "{family}: SYSTEM in\n{text}"),
        }
        let gguf = content(&out.join("model.gguf"));
        assert!(gguf.metadata.contains_key("tokenizer.chat_template"), "{family}");
    }
}
