//! The merged export is exact for every family and both sources: a Hugging Face folder base and a GGUF base
//! (tests/fixtures/gguf, made by scripts/make_gguf_fixtures.py; llama's made here by our own GGUF export of
//! tiny-llama, f16, as no llama fixture file exists). For each, `export --format merged` with an adapter writes a
//! folder that our loader reads back with the per-token log-probs of the base + the adapter unmerged (1e-4), the
//! same token ids, and a config.json of the family's own class carrying its fields (gemma3's activation,
//! phi3's partial rotary and LongRoPE, granite's multipliers, ...), which a GGUF source must rebuild from metadata.

mod common;

use candle_core::{DType, Device};
use common::fixture;
use metal_candle::engine::checkpoint::load_adapter;
use metal_candle::engine::export::{export_with, ExportFormat, ExportRequest, GgufQuant};
use metal_candle::engine::generate::score;
use metal_candle::engine::model::load_model;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

const TEXT: &str = "The little robot visited the café by the sea 🌊 and wrote 3 short poems about it.";

/// One family: its Hugging Face fixture, its GGUF fixture (None: made from the folder by our GGUF export), an
/// adapter that fits it, and the config.json keys whose values the merged folder must share with the fixture.
struct Case {
    hf: &'static str,
    gguf: Option<&'static str>,
    adapter: &'static str,
    same_keys: &'static [&'static str],
}

const CASES: [Case; 9] = [
    Case { hf: "tiny-llama", gguf: None, adapter: "ours-tiny-llama-adapter", same_keys: &["rope_scaling"] },
    // tiny-mistral has tiny-llama's shapes; the llama adapter is exported onto it with --force-base.
    Case {
        hf: "tiny-mistral",
        gguf: Some("tiny-mistral-f32.gguf"),
        adapter: "ours-tiny-llama-adapter",
        same_keys: &[],
    },
    Case { hf: "tiny-qwen2", gguf: Some("tiny-qwen2-f32.gguf"), adapter: "tiny-qwen2-peft-rslora", same_keys: &[] },
    Case { hf: "tiny-qwen3", gguf: Some("tiny-qwen3-f32.gguf"), adapter: "ours-tiny-qwen3-adapter", same_keys: &[] },
    // The gemma3 file holds neither the score scalar nor the layer pattern: llama.cpp's (and so the merged
    // folder's) are 1/sqrt(head_dim) and every 6th layer global, not tiny-gemma3's 24 and [sliding, full].
    Case {
        hf: "tiny-gemma3",
        gguf: Some("tiny-gemma3-f32.gguf"),
        adapter: "ours-tiny-gemma3-adapter",
        same_keys: &["hidden_activation", "sliding_window", "rope_local_base_freq", "rope_scaling", "eos_token_id"],
    },
    Case {
        hf: "tiny-phi3",
        gguf: Some("tiny-phi3-f32.gguf"),
        adapter: "ours-tiny-phi3-adapter",
        same_keys: &["partial_rotary_factor", "original_max_position_embeddings", "sliding_window"],
    },
    Case { hf: "tiny-olmo2", gguf: Some("tiny-olmo2-f32.gguf"), adapter: "ours-tiny-olmo2-adapter", same_keys: &[] },
    // llama.cpp fixes smollm3's NoPE layers at every 4th; tiny-smollm3's own list differs, so it is not compared.
    Case {
        hf: "tiny-smollm3",
        gguf: Some("tiny-smollm3-f32.gguf"),
        adapter: "ours-tiny-smollm3-adapter",
        same_keys: &[],
    },
    Case {
        hf: "tiny-granite",
        gguf: Some("tiny-granite-f32.gguf"),
        adapter: "ours-tiny-granite-adapter",
        same_keys: &["embedding_multiplier", "residual_multiplier", "attention_multiplier", "logits_scaling"],
    },
];

/// Keys every merged config.json shares with the family's fixture.
const ALWAYS_SAME: [&str; 8] = [
    "architectures",
    "model_type",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "rms_norm_eps",
];

fn read_json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))).unwrap()
}

/// JSON values equal, numbers to 1e-6 relative (GGUF keeps its scales as f32).
fn same_value(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            let (x, y) = (x.as_f64().unwrap(), y.as_f64().unwrap());
            (x - y).abs() <= 1e-6 * x.abs().max(y.abs())
        }
        (Value::Array(x), Value::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(p, q)| same_value(p, q)),
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same_value(v, w)))
        }
        _ => a == b,
    }
}

fn export_request(base: &Path, ckpt: Option<PathBuf>, format: ExportFormat, out: &Path) -> ExportRequest {
    ExportRequest {
        checkpoint: ckpt,
        format,
        quant: GgufQuant::F16,
        out: out.to_path_buf(),
        base_model: base.to_path_buf(),
        allow_other_base: true,
        overwrite: false,
    }
}

/// Per-token log-probs of `TEXT` under `model` (+ `adapter`), with its token ids.
fn logprobs(model: &Path, adapter: Option<&Path>) -> (Vec<u32>, Vec<f32>) {
    let mut m = load_model(model, &Device::Cpu, DType::F32).unwrap_or_else(|e| panic!("{}: {e}", model.display()));
    if let Some(adapter) = adapter {
        load_adapter(&mut m.model, adapter).unwrap_or_else(|e| panic!("{}: {e}", adapter.display()));
    }
    let ids = m.tokenizer.encode(TEXT, true).unwrap();
    let lp = score(&m.model, &ids).unwrap();
    (ids, lp)
}

fn nll(lp: &[f32]) -> f64 {
    -lp.iter().map(|x| *x as f64).sum::<f64>() / lp.len() as f64
}

#[test]
fn merged_folders_score_like_base_plus_adapter_for_every_family_and_source() {
    let dir = tempfile::tempdir().unwrap();
    let mut report = Vec::new();
    for case in CASES {
        let hf = fixture(case.hf);
        let adapter = fixture(case.adapter);
        let gguf = match case.gguf {
            Some(file) => fixture("gguf").join(file),
            None => {
                let out = dir.path().join(format!("{}-f16.gguf", case.hf));
                export_with(&export_request(&hf, None, ExportFormat::Gguf, &out), &mut |_| {}).unwrap();
                out
            }
        };
        let fixture_config = read_json(&hf.join("config.json"));
        for (source_name, base) in [("hf", &hf), ("gguf", &gguf)] {
            let what = format!("{} from {source_name}", case.hf);
            let out = dir.path().join(format!("{}-{source_name}-merged", case.hf));
            let request = export_request(base, Some(adapter.clone()), ExportFormat::Merged, &out);
            export_with(&request, &mut |_| {}).unwrap_or_else(|e| panic!("{what}: {e}"));

            let (want_ids, want) = logprobs(base, Some(&adapter));
            let (ids, got) = logprobs(&out, None);
            assert_eq!(ids, want_ids, "{what}: the merged folder's tokenizer gives other ids");
            let max_diff = want.iter().zip(&got).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            let (want_nll, got_nll) = (nll(&want), nll(&got));
            eprintln!(
                "{what:>22}: NLL base+adapter {want_nll:.6}, merged {got_nll:.6}, max |d logprob| {max_diff:.2e}"
            );
            report.push((what.clone(), want_nll, got_nll));
            assert!(max_diff < 1e-4, "{what}: max |d logprob| {max_diff} (NLL {want_nll} vs merged {got_nll})");

            let config = read_json(&out.join("config.json"));
            for key in ALWAYS_SAME.iter().chain(case.same_keys) {
                let (got, want) = (&config[key], &fixture_config[*key]);
                assert!(same_value(got, want), "{what}: config.json `{key}` is {got}, the fixture's {want}");
            }
        }
    }
    // The family fields a GGUF source must rebuild (config.json from GGUF metadata).
    let gguf_config = |hf: &str| read_json(&dir.path().join(format!("{hf}-gguf-merged/config.json")));
    let gemma3 = gguf_config("tiny-gemma3");
    assert_eq!(gemma3["hidden_activation"], "gelu_pytorch_tanh");
    assert_eq!(gemma3["query_pre_attn_scalar"], json!(16), "llama.cpp's score scale: 1/sqrt(head_dim)");
    assert_eq!(gemma3["layer_types"], json!(["sliding_attention", "sliding_attention"]));
    let phi3 = gguf_config("tiny-phi3");
    assert_eq!(phi3["rope_scaling"]["type"], "longrope");
    assert_eq!(gguf_config("tiny-smollm3")["no_rope_layers"], json!([1, 1]));
    assert_eq!(report.len(), 2 * CASES.len());
}

/// A GGUF model that its family's config.json cannot describe is refused before any weight is written: a granite
/// file whose `granite.rope.scaling.finetuned = false` turns rope off on every layer (llama.cpp's reading, and
/// ours), which transformers' GraniteConfig cannot say.
#[test]
fn a_gguf_model_config_json_cannot_describe_is_refused_by_family() {
    use candle_core::quantized::gguf_file::{self, Content, Value as GgufValue};
    let dir = tempfile::tempdir().unwrap();
    let src = fixture("gguf").join("tiny-granite-f32.gguf");
    let mut reader = std::fs::File::open(&src).unwrap();
    let content = Content::read(&mut reader).unwrap();
    let tensors: Vec<(String, candle_core::quantized::QTensor)> = content
        .tensor_infos
        .keys()
        .map(|name| (name.clone(), content.tensor(&mut reader, name, &Device::Cpu).unwrap()))
        .collect();
    let mut metadata: Vec<(String, GgufValue)> = content.metadata.clone().into_iter().collect();
    metadata.push(("granite.rope.scaling.finetuned".into(), GgufValue::Bool(false)));
    let no_rope = dir.path().join("granite-no-rope.gguf");
    let meta_refs: Vec<(&str, &GgufValue)> = metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let tensor_refs: Vec<(&str, &candle_core::quantized::QTensor)> =
        tensors.iter().map(|(k, t)| (k.as_str(), t)).collect();
    gguf_file::write(&mut std::fs::File::create(&no_rope).unwrap(), &meta_refs, &tensor_refs).unwrap();
    assert!(logprobs(&no_rope, Some(&fixture("ours-tiny-granite-adapter"))).1.iter().all(|x| x.is_finite()));

    let out = dir.path().join("merged");
    let request = export_request(&no_rope, Some(fixture("ours-tiny-granite-adapter")), ExportFormat::Merged, &out);
    let err = export_with(&request, &mut |_| {}).unwrap_err().to_string();
    eprintln!("{err}");
    assert!(err.contains("granite") && err.contains("rotary embedding") && err.contains("--format peft"), "{err}");
    assert!(!out.exists(), "nothing written, not even the folder");
}
