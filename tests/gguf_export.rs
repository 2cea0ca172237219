//! GGUF export round trip without network: the tiny-llama fixture with our trained adapter is exported merged
//! to GGUF (f16 and q8_0), loaded back with our own GGUF reader, and compared with the Hugging Face folder plus
//! the adapter: greedy ids (f16) and per-token log-probs (f16: max 2e-2 nats; q8_0: max 0.5, mean 0.05), plus the metadata
//! keys llama.cpp needs. The gguf-lora export is checked for llama.cpp's tensor names and shapes.

mod common;

use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::{DType, Device};
use common::fixture;
use metal_candle::engine::export::{export_with, ExportFormat, ExportRequest, GgufQuant};
use metal_candle::engine::generate::{generate, score, GenerateRequest};
use metal_candle::engine::model::{load_model, LoadedModel};
use metal_candle::engine::sampler::SamplingParams;
use std::path::{Path, PathBuf};

const TEXT: &str = "The little robot visited the café by the sea and wrote 3 short poems about it.";

fn export(format: ExportFormat, quant: GgufQuant, out: &Path, ckpt: Option<PathBuf>) -> u64 {
    let req = ExportRequest {
        checkpoint: ckpt,
        format,
        quant,
        out: out.to_path_buf(),
        base_model: fixture("tiny-llama"),
        allow_other_base: false,
        overwrite: false,
    };
    let mut steps = 0;
    let outcome = export_with(&req, &mut |_| steps += 1).unwrap();
    assert!(format != ExportFormat::Gguf || steps > 0, "no progress reported");
    outcome.size_bytes
}

fn greedy(m: &LoadedModel, prompt: &[u32]) -> Vec<u32> {
    let req = GenerateRequest {
        prompt_ids: prompt.to_vec(),
        max_new_tokens: 24,
        sampling: SamplingParams::greedy(),
        eos_token_ids: m.eos_token_ids.clone(),
        ignore_eos: true,
        stop_strings: vec![],
    };
    generate(&m.model, &m.tokenizer, &req, &mut |_| true).unwrap().generated_ids
}

fn hf_with_adapter() -> LoadedModel {
    let mut m = load_model(&fixture("tiny-llama"), &Device::Cpu, DType::F32).unwrap();
    metal_candle::engine::checkpoint::load_adapter(&mut m.model, &fixture("ours-tiny-llama-adapter")).unwrap();
    m
}

fn metadata(path: &Path) -> Content {
    Content::read(&mut std::fs::File::open(path).unwrap()).unwrap()
}

#[test]
fn merged_gguf_reads_back_like_the_hf_folder_with_its_adapter() {
    let dir = tempfile::tempdir().unwrap();
    let reference = hf_with_adapter();
    let ids = reference.tokenizer.encode(TEXT, true).unwrap();
    let want_lp = score(&reference.model, &ids).unwrap();
    let want_greedy = greedy(&reference, &ids[..8]);
    // (quant, max and mean |d logprob| allowed): this random tiny model has sharp distributions, so q8_0's
    // rounding moves single tokens by up to ~0.2 nats while the mean stays small.
    for (quant, max_allowed, mean_allowed) in [(GgufQuant::F16, 2e-2, 5e-3), (GgufQuant::Q8_0, 0.5, 5e-2)] {
        let out = dir.path().join(format!("tiny-{quant}.gguf"));
        let size = export(ExportFormat::Gguf, quant, &out, Some(fixture("ours-tiny-llama-adapter")));
        assert_eq!(size, std::fs::metadata(&out).unwrap().len());
        assert!(!dir.path().join(format!("tiny-{quant}.gguf.partial")).exists());

        let back = load_model(&out, &Device::Cpu, DType::F32).unwrap();
        assert_eq!(back.tokenizer.encode(TEXT, true).unwrap(), ids, "{quant}: tokenizer");
        let got_lp = score(&back.model, &ids).unwrap();
        let diffs: Vec<f32> = want_lp.iter().zip(&got_lp).map(|(a, b)| (a - b).abs()).collect();
        let max_diff = diffs.iter().copied().fold(0f32, f32::max);
        let mean_diff = diffs.iter().sum::<f32>() / diffs.len() as f32;
        eprintln!("{quant}: max |d logprob| {max_diff:.5}, mean {mean_diff:.5} over {} tokens", diffs.len());
        assert!(max_diff < max_allowed, "{quant}: max |d logprob| {max_diff} >= {max_allowed}");
        assert!(mean_diff < mean_allowed, "{quant}: mean |d logprob| {mean_diff} >= {mean_allowed}");
        if quant == GgufQuant::F16 {
            assert_eq!(greedy(&back, &ids[..8]), want_greedy, "{quant}: greedy ids");
        }
        assert!(back.chat_template.is_some(), "{quant}: chat template");
    }
}

#[test]
fn merged_gguf_carries_llama_cpp_metadata_and_tensor_types() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("base.gguf");
    export(ExportFormat::Gguf, GgufQuant::Q4KM, &out, None);
    let c = metadata(&out);
    let m = &c.metadata;
    let u = |k: &str| m.get(k).and_then(|v| v.to_u32().ok()).unwrap_or_else(|| panic!("{k} missing"));
    assert!(matches!(m.get("general.architecture"), Some(Value::String(s)) if s == "llama"));
    assert_eq!(u("general.file_type"), 15);
    assert_eq!(u("llama.block_count"), 2);
    assert_eq!(u("llama.embedding_length"), 64);
    assert_eq!(u("llama.feed_forward_length"), 128);
    assert_eq!(u("llama.attention.head_count"), 4);
    assert_eq!(u("llama.attention.head_count_kv"), 2);
    assert_eq!(u("llama.rope.dimension_count"), 16);
    assert_eq!(u("llama.context_length"), 256);
    assert_eq!(u("tokenizer.ggml.eos_token_id"), 2);
    for key in ["llama.attention.layer_norm_rms_epsilon", "llama.rope.freq_base", "tokenizer.chat_template"] {
        assert!(m.contains_key(key), "{key}");
    }
    assert!(matches!(m.get("tokenizer.ggml.model"), Some(Value::String(s)) if s == "gpt2"));
    assert!(matches!(m.get("tokenizer.ggml.add_bos_token"), Some(Value::Bool(true))));
    let t = &c.tensor_infos;
    use candle_core::quantized::GgmlDType as G;
    // Rows of 64 do not fill 256-wide K-quant blocks: llama.cpp's fallbacks apply; norms stay f32.
    assert_eq!(t["blk.0.attn_norm.weight"].ggml_dtype, G::F32);
    assert_eq!(t["blk.1.attn_q.weight"].ggml_dtype, G::Q5_0);
    // use_more_bits(1, 2): the last layer's attn_v wants Q6_K and falls back to Q8_0; layer 0's wants Q4_K.
    assert_eq!(t["blk.1.attn_v.weight"].ggml_dtype, G::Q8_0);
    assert_eq!(t["blk.0.attn_v.weight"].ggml_dtype, G::Q5_0);
    assert_eq!(t["output.weight"].ggml_dtype, G::Q8_0);
    assert_eq!(t["rope_freqs.weight"].ggml_dtype, G::F32);
    assert_eq!(t["blk.0.attn_q.weight"].shape.dims(), &[64, 64]);
    // A base-model export still reads back.
    load_model(&out, &Device::Cpu, DType::F32).unwrap();
}

#[test]
fn gguf_lora_has_llama_cpp_names_shapes_and_alpha() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("adapter.gguf");
    export(ExportFormat::GgufLora, GgufQuant::F16, &out, Some(fixture("ours-tiny-llama-adapter")));
    let c = metadata(&out);
    assert!(matches!(c.metadata.get("general.type"), Some(Value::String(s)) if s == "adapter"));
    assert!(matches!(c.metadata.get("adapter.type"), Some(Value::String(s)) if s == "lora"));
    assert!(c.metadata.contains_key("adapter.lora.alpha"));
    let a = &c.tensor_infos["blk.0.attn_q.weight.lora_a"];
    let b = &c.tensor_infos["blk.0.attn_q.weight.lora_b"];
    let rank = a.shape.dims()[0];
    assert_eq!(a.shape.dims(), &[rank, 64], "lora_a is (rank, in)");
    assert_eq!(b.shape.dims(), &[64, rank], "lora_b is (out, rank)");
}

#[test]
fn adapter_formats_refuse_a_missing_checkpoint_and_quant_names_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let req = ExportRequest {
        checkpoint: None,
        format: ExportFormat::GgufLora,
        quant: GgufQuant::F16,
        out: dir.path().join("x.gguf"),
        base_model: fixture("tiny-llama"),
        allow_other_base: false,
        overwrite: false,
    };
    let err = export_with(&req, &mut |_| {}).unwrap_err();
    assert!(err.to_string().contains("needs a checkpoint"), "{err}");
    assert!("q4_k_s".parse::<GgufQuant>().unwrap_err().contains("q4_k_m"));
}
