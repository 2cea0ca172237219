//! The metadata of an exported GGUF file, under the keys llama.cpp reads: `general.*`, the architecture's
//! hyperparameters (`<arch>.context_length`, `embedding_length`, ...) and the tokenizer (`tokenizer.ggml.*`,
//! `tokenizer.chat_template`).
//!
//! llama.cpp has no `mistral` architecture for dense Mistral models: its convert script writes them as
//! `llama` (same blocks, q/k rows permuted the same way), and so do we (the architecture table is
//! `model::gguf::arch`). A tokenizer from a GGUF source is copied
//! key by key; one from `tokenizer.json` is described the way llama.cpp's `convert_hf_to_gguf.py` does for
//! byte-level BPE (`gpt2`), with the vocabulary padded with unused `[PADn]` tokens up to the embedding rows.

use super::gguf_writer::MetaValue;
use crate::engine::model::config::{Architecture, RopeScaling};
pub use crate::engine::model::gguf::arch::{gguf_architecture, permutes_qk};
use crate::engine::model::gguf::{
    pre_tokenizer_name, TOKEN_TYPE_CONTROL, TOKEN_TYPE_NORMAL, TOKEN_TYPE_UNUSED, TOKEN_TYPE_USER_DEFINED,
};
use crate::engine::model::{ModelConfig, ModelInfo, ModelSource};
use crate::engine::{Error, Result};
use candle_core::quantized::gguf_file::Value;

/// A metadata list in writing order.
pub type Metadata = Vec<(String, MetaValue)>;

fn str(s: impl Into<String>) -> MetaValue {
    MetaValue::Str(s.into())
}

fn u32_of(n: usize) -> MetaValue {
    MetaValue::U32(u32::try_from(n).unwrap_or(u32::MAX))
}

/// `general.*` and the architecture's hyperparameters.
pub fn model_metadata(c: &ModelConfig, name: &str, file_type: u32, quantized: bool) -> Result<Metadata> {
    super::gguf_families::refuse_unexpressible(c)?;
    let arch = gguf_architecture(c.architecture);
    let key = |k: &str| format!("{arch}.{k}");
    let mut meta: Metadata = vec![
        ("general.architecture".into(), str(arch)),
        ("general.type".into(), str("model")),
        ("general.name".into(), str(name)),
        ("general.file_type".into(), MetaValue::U32(file_type)),
    ];
    // A Mistral model is a `llama` file; its recorded base name is how a reader (ours) tells the family.
    if c.architecture == Architecture::Mistral && !name.to_ascii_lowercase().contains("mistral") {
        meta.push(("general.basename".into(), str("Mistral")));
    }
    if quantized {
        meta.push(("general.quantization_version".into(), MetaValue::U32(2)));
    }
    meta.extend([
        (key("vocab_size"), u32_of(c.vocab_size)),
        (key("context_length"), u32_of(c.max_position_embeddings)),
        (key("embedding_length"), u32_of(c.hidden_size)),
        (key("block_count"), u32_of(c.num_layers)),
        (key("feed_forward_length"), u32_of(c.intermediate_size)),
        (key("attention.head_count"), u32_of(c.num_attention_heads)),
        (key("attention.head_count_kv"), u32_of(c.num_kv_heads)),
        (key("attention.key_length"), u32_of(c.head_dim)),
        (key("attention.value_length"), u32_of(c.head_dim)),
        (key("attention.layer_norm_rms_epsilon"), MetaValue::F32(c.rms_norm_eps as f32)),
        (key("rope.freq_base"), MetaValue::F32(c.rope_theta as f32)),
        (key("rope.dimension_count"), u32_of(c.rotary_dim)),
    ]);
    match &c.rope_scaling {
        Some(RopeScaling::Linear { factor }) => {
            meta.push((key("rope.scaling.type"), str("linear")));
            meta.push((key("rope.scaling.factor"), MetaValue::F32(*factor as f32)));
        }
        // The per-frequency divisors go into the `rope_freqs.weight` tensor; the original context lets a reader
        // (ours) recover the scaling parameters. llama.cpp uses that key only for YaRN.
        Some(RopeScaling::Llama3(s)) => {
            meta.push((key("rope.scaling.original_context_length"), u32_of(s.original_max_position_embeddings)));
        }
        // phi3's factors are tensors and its keys the family's (`gguf_families`).
        Some(RopeScaling::LongRope(_)) | None => {}
    }
    meta.extend(super::gguf_families::family_metadata(c, &key));
    Ok(meta)
}

/// The tokenizer keys: copied from a GGUF source, built from `tokenizer.json` otherwise.
pub fn tokenizer_metadata(model: &ModelInfo) -> Result<Metadata> {
    let mut meta = match &model.source {
        ModelSource::Gguf(path) => copied_tokenizer_metadata(path)?,
        ModelSource::HfFolder(folder) => hf_tokenizer_metadata(model, folder)?,
    };
    if let Some(template) = &model.chat_template {
        meta.retain(|(k, _)| k != "tokenizer.chat_template");
        meta.push(("tokenizer.chat_template".into(), str(template.source.clone())));
    }
    Ok(meta)
}

/// The ids llama.cpp ends a generation on by key: `tokenizer.ggml.eos_token_id`, `eot_token_id`, `eom_token_id`.
pub fn stop_ids(meta: &Metadata) -> Vec<u32> {
    const KEYS: [&str; 3] =
        ["tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"];
    let id = |v: &MetaValue| match *v {
        MetaValue::U32(x) => Some(x),
        MetaValue::I32(x) => u32::try_from(x).ok(),
        MetaValue::U64(x) => u32::try_from(x).ok(),
        MetaValue::I64(x) => u32::try_from(x).ok(),
        _ => None,
    };
    meta.iter().filter(|(k, _)| KEYS.contains(&k.as_str())).filter_map(|(_, v)| id(v)).collect()
}

/// Every `tokenizer.*` key of the source GGUF file, in key order.
fn copied_tokenizer_metadata(path: &std::path::Path) -> Result<Metadata> {
    let (content, _) = crate::engine::model::gguf::open_gguf(path)?;
    let mut keys: Vec<&String> = content.metadata.keys().filter(|k| k.starts_with("tokenizer.")).collect();
    keys.sort();
    Ok(keys.into_iter().map(|k| (k.clone(), from_candle_value(&content.metadata[k]))).collect())
}

/// A value Candle's GGUF reader returned, as the writer's [`MetaValue`].
pub fn from_candle_value(v: &Value) -> MetaValue {
    match v {
        Value::U8(x) => MetaValue::U8(*x),
        Value::I8(x) => MetaValue::I8(*x),
        Value::U16(x) => MetaValue::U16(*x),
        Value::I16(x) => MetaValue::I16(*x),
        Value::U32(x) => MetaValue::U32(*x),
        Value::I32(x) => MetaValue::I32(*x),
        Value::U64(x) => MetaValue::U64(*x),
        Value::I64(x) => MetaValue::I64(*x),
        Value::F32(x) => MetaValue::F32(*x),
        Value::F64(x) => MetaValue::F64(*x),
        Value::Bool(x) => MetaValue::Bool(*x),
        Value::String(s) => MetaValue::Str(s.clone()),
        Value::Array(items) => MetaValue::Array(items.iter().map(from_candle_value).collect()),
    }
}

fn tokenizer_error(folder: &std::path::Path, message: impl std::fmt::Display) -> Error {
    Error::Tokenizer(format!("GGUF export of {}/tokenizer.json: {message}", folder.display()))
}

/// `convert_hf_to_gguf.py`'s description of a byte-level BPE tokenizer.
fn hf_tokenizer_metadata(model: &ModelInfo, folder: &std::path::Path) -> Result<Metadata> {
    let tok = model.tokenizer.inner();
    let tok_json: serde_json::Value =
        serde_json::from_str(&tok.to_string(false).map_err(|e| tokenizer_error(folder, e))?)
            .map_err(|e| tokenizer_error(folder, e))?;
    let bpe = &tok_json["model"];
    if bpe["type"] != "BPE" || tok.get_decoder().is_none() {
        return Err(tokenizer_error(folder, "only byte-level BPE tokenizers (GPT-2 style) can be exported to GGUF"));
    }
    let pre = pre_tokenizer_name(&tok_json["pre_tokenizer"]).ok_or_else(|| {
        tokenizer_error(folder, "its pre-tokenizer has no llama.cpp equivalent we know of (gpt-2, smollm, llama-bpe, qwen2, tekken, gpt-4o)")
    })?;
    let (tokens, token_types) = vocabulary(model, folder)?;
    let merges = merge_strings(&bpe["merges"]).ok_or_else(|| tokenizer_error(folder, "the BPE merges are missing"))?;
    let id = |token: &Option<String>| token.as_deref().and_then(|t| model.tokenizer.token_to_id(t));
    let bos = model.config.bos_token_id.or_else(|| id(&model.tokenizer.bos_token));
    let eos = id(&model.tokenizer.eos_token).or_else(|| model.eos_token_ids.first().copied());
    let probe = model.tokenizer.encode("a", true)?;
    let mut meta: Metadata = vec![
        ("tokenizer.ggml.model".into(), str("gpt2")),
        ("tokenizer.ggml.pre".into(), str(pre)),
        ("tokenizer.ggml.tokens".into(), MetaValue::Array(tokens.into_iter().map(MetaValue::Str).collect())),
        ("tokenizer.ggml.token_type".into(), MetaValue::Array(token_types.into_iter().map(MetaValue::I32).collect())),
        ("tokenizer.ggml.merges".into(), MetaValue::Array(merges.into_iter().map(MetaValue::Str).collect())),
    ];
    meta.extend(bos.map(|b| ("tokenizer.ggml.bos_token_id".to_string(), MetaValue::U32(b))));
    meta.extend(eos.map(|e| ("tokenizer.ggml.eos_token_id".to_string(), MetaValue::U32(e))));
    if let Some(pad) = pad_token_id(folder, model) {
        meta.push(("tokenizer.ggml.padding_token_id".into(), MetaValue::U32(pad)));
    }
    let add_bos = bos.is_some() && probe.first() == bos.as_ref();
    let add_eos = eos.is_some() && probe.len() > 1 && probe.last() == eos.as_ref();
    meta.push(("tokenizer.ggml.add_bos_token".into(), MetaValue::Bool(add_bos)));
    meta.push(("tokenizer.ggml.add_eos_token".into(), MetaValue::Bool(add_eos)));
    Ok(meta)
}

/// Tokens in id order with llama.cpp token types, padded with `[PADn]` (unused) up to the embedding rows.
fn vocabulary(model: &ModelInfo, folder: &std::path::Path) -> Result<(Vec<String>, Vec<i32>)> {
    let tok = model.tokenizer.inner();
    let vocab_size = model.config.vocab_size;
    let added = tok.get_added_tokens_decoder();
    let max_id = tok.get_vocab(true).values().copied().max().unwrap_or(0) as usize;
    if max_id >= vocab_size {
        return Err(tokenizer_error(folder, format!("token id {max_id} is outside the {vocab_size}-row embedding")));
    }
    let mut tokens = Vec::with_capacity(vocab_size);
    let mut types = Vec::with_capacity(vocab_size);
    for id in 0..vocab_size as u32 {
        let (token, token_type) = match (added.get(&id), tok.id_to_token(id)) {
            (Some(a), _) if a.special => (a.content.clone(), TOKEN_TYPE_CONTROL),
            (Some(a), _) => (a.content.clone(), TOKEN_TYPE_USER_DEFINED),
            (None, Some(t)) => (t, TOKEN_TYPE_NORMAL),
            (None, None) => (format!("[PAD{id}]"), TOKEN_TYPE_UNUSED),
        };
        tokens.push(token);
        types.push(token_type as i32);
    }
    Ok((tokens, types))
}

/// Merges as `"a b"` strings, from either serialization tokenizers uses.
fn merge_strings(merges: &serde_json::Value) -> Option<Vec<String>> {
    let items = merges.as_array()?;
    items
        .iter()
        .map(|m| match m {
            serde_json::Value::String(s) => Some(s.clone()),
            serde_json::Value::Array(pair) => match pair.as_slice() {
                [a, b] => Some(format!("{} {}", a.as_str()?, b.as_str()?)),
                _ => None,
            },
            _ => None,
        })
        .collect()
}

/// `pad_token` of `tokenizer_config.json`, when the tokenizer knows it.
fn pad_token_id(folder: &std::path::Path, model: &ModelInfo) -> Option<u32> {
    let text = std::fs::read_to_string(folder.join("tokenizer_config.json")).ok()?;
    let config: serde_json::Value = serde_json::from_str(&text).ok()?;
    let pad = config.get("pad_token")?;
    let token = pad.as_str().or_else(|| pad.get("content").and_then(|c| c.as_str()))?;
    model.tokenizer.token_to_id(token)
}
