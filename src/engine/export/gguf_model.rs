//! `--format gguf`: the base model with the adapter merged in, as one llama.cpp GGUF file. Tensors are named
//! by the shared table in `model::gguf::names`, ordered as llama.cpp's convert script writes them (embedding,
//! layer by layer, final norm, output), q/k rows permuted for the `llama` architecture, and quantized one at a
//! time as the streaming writer asks for them (types chosen by [`GgufQuant::tensor_type`]).
//!
//! Memory: the model is loaded in f32 and merged into a second f32 copy; each written tensor is dropped from
//! that copy, so the peak is about twice the f32 model.

use super::gguf_metadata::{model_metadata, permutes_qk, tokenizer_metadata, Metadata};
use super::gguf_quant::GgufQuant;
use super::gguf_writer::{write_gguf, TensorEntry};
use super::ExportProgress;
use crate::engine::checkpoint;
use crate::engine::model::config::RopeScaling;
use crate::engine::model::gguf::names::{gguf_module_of, gguf_tensor_name, hf_tensor_name};
use crate::engine::model::gguf::{llama3_rope_factors, permute_qk_rows};
use crate::engine::model::{load_model, LoadedModel, ModelConfig};
use crate::engine::{Error, Result};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device, Tensor};
use std::collections::HashMap;
use std::path::Path;

/// llama.cpp's name for the tensor of Llama 3 rope frequency divisors.
const ROPE_FREQS: &str = "rope_freqs.weight";

/// Load `base_model` in f32 on the CPU with the adapter in `ckpt` (if any) attached, ready for
/// [`write_model_gguf`].
pub fn load_for_export(ckpt: Option<&Path>, base_model: &Path, allow_other_base: bool) -> Result<LoadedModel> {
    let Some(ckpt) = ckpt else { return load_model(base_model, &Device::Cpu, DType::F32) };
    let mut model = super::base_for(ckpt, base_model, allow_other_base)?;
    checkpoint::load_adapter(&mut model.model, ckpt)?;
    Ok(model)
}

/// Write `model` (adapter merged) to `out` as GGUF in `quant`, named `name`. Returns the file size in bytes.
pub fn write_model_gguf(
    model: LoadedModel,
    name: &str,
    quant: GgufQuant,
    out: &Path,
    progress: &mut dyn FnMut(ExportProgress),
) -> Result<u64> {
    let metadata = full_metadata(&model, name, quant)?;
    let config = model.config.clone();
    let source = model.source.path().to_path_buf();
    let mut weights = model.model.merged_named_weights()?;
    drop(model);
    if let Some(factors) = rope_freqs(&config)? {
        weights.insert(ROPE_FREQS.into(), factors);
    }
    let entries = tensor_entries(&config, &weights, quant)?;
    let total = entries.len();
    write_gguf(out, &metadata, &entries, |i| {
        let entry = &entries[i];
        progress(ExportProgress { done: i, total, what: format!("{} ({:?})", entry.name, entry.dtype) });
        let tensor = weights
            .remove(&hf_name(&entry.name))
            .ok_or_else(|| Error::MissingTensor { name: entry.name.clone(), path: source.clone() })?;
        tensor_bytes(&prepare(&config, &entry.name, tensor)?, entry.dtype)
    })
}

/// General, architecture and tokenizer metadata.
fn full_metadata(model: &LoadedModel, name: &str, quant: GgufQuant) -> Result<Metadata> {
    let mut metadata = model_metadata(&model.config, name, quant.file_type(), quant.is_quantized());
    metadata.extend(tokenizer_metadata(model)?);
    Ok(metadata)
}

/// The Hugging Face name a GGUF tensor is made from (`rope_freqs.weight` is its own).
fn hf_name(gguf_name: &str) -> String {
    hf_tensor_name(gguf_name).unwrap_or_else(|| gguf_name.to_string())
}

/// Llama 3 rope scaling as the per-frequency divisors llama.cpp reads from `rope_freqs.weight`.
fn rope_freqs(config: &ModelConfig) -> Result<Option<Tensor>> {
    let Some(RopeScaling::Llama3(scaling)) = &config.rope_scaling else { return Ok(None) };
    let factors: Vec<f32> =
        llama3_rope_factors(scaling, config.rope_theta, config.head_dim).into_iter().map(|f| f as f32).collect();
    Ok(Some(Tensor::new(factors, &Device::Cpu)?))
}

/// Every tensor in llama.cpp's order, with its type. Hugging Face tensors without a GGUF name are an error,
/// not silently dropped.
fn tensor_entries(
    config: &ModelConfig,
    weights: &HashMap<String, Tensor>,
    quant: GgufQuant,
) -> Result<Vec<TensorEntry>> {
    let mut named: Vec<(String, Vec<usize>)> = Vec::with_capacity(weights.len());
    for (hf, tensor) in weights {
        let gguf = if hf == ROPE_FREQS { Some(hf.clone()) } else { gguf_tensor_name(hf) };
        let gguf = gguf.ok_or_else(|| {
            Error::InvalidSetting(format!("tensor `{hf}` has no llama.cpp name; this model cannot be exported to GGUF"))
        })?;
        named.push((gguf, tensor.dims().to_vec()));
    }
    named.sort_by_key(|(name, _)| order_key(name));
    let tied = !weights.contains_key("lm_head.weight");
    Ok(named
        .into_iter()
        .map(|(name, dims)| {
            let dtype = quant.tensor_type(&name, &dims, config.num_layers, tied);
            TensorEntry { name, dims, dtype }
        })
        .collect())
}

/// convert_hf_to_gguf.py's order: rope factors, embedding, each layer's tensors, final norm, output.
fn order_key(name: &str) -> (usize, usize, usize, String) {
    const LAYER_ORDER: [&str; 11] = [
        "attn_norm",
        "attn_q",
        "attn_k",
        "attn_v",
        "attn_q_norm",
        "attn_k_norm",
        "attn_output",
        "ffn_norm",
        "ffn_gate",
        "ffn_up",
        "ffn_down",
    ];
    match name {
        ROPE_FREQS => (0, 0, 0, String::new()),
        "token_embd.weight" => (1, 0, 0, String::new()),
        "output_norm.weight" => (3, 0, 0, String::new()),
        "output.weight" => (4, 0, 0, String::new()),
        _ => {
            let layer = name.split('.').nth(1).and_then(|l| l.parse().ok()).unwrap_or(usize::MAX);
            let module = gguf_module_of(name).unwrap_or_default();
            let slot = LAYER_ORDER.iter().position(|m| *m == module).unwrap_or(LAYER_ORDER.len());
            (2, layer, slot, name.to_string())
        }
    }
}

/// Hugging Face layout to llama.cpp's: q/k rows (weights and biases) permuted for the `llama` architecture.
fn prepare(config: &ModelConfig, gguf_name: &str, tensor: Tensor) -> Result<Tensor> {
    if !permutes_qk(config.architecture) {
        return Ok(tensor);
    }
    match gguf_module_of(gguf_name) {
        Some("attn_q") => permute_qk_rows(&tensor, config.num_attention_heads),
        Some("attn_k") => permute_qk_rows(&tensor, config.num_kv_heads),
        _ => Ok(tensor),
    }
}

/// The tensor's data in `dtype`, quantized with Candle's (ggml's reference) quantizers. The values are copied
/// into a fresh buffer first: `QTensor::quantize` reads the whole underlying storage, ignoring the offset of a
/// tensor that is a view into a larger one (a slice of fused weights).
pub(super) fn tensor_bytes(tensor: &Tensor, dtype: GgmlDType) -> Result<Vec<u8>> {
    let values = tensor.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
    Ok(match dtype {
        GgmlDType::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        GgmlDType::F16 => values.iter().flat_map(|v| half::f16::from_f32(*v).to_le_bytes()).collect(),
        GgmlDType::BF16 => values.iter().flat_map(|v| half::bf16::from_f32(*v).to_le_bytes()).collect(),
        _ => {
            let fresh = Tensor::from_vec(values, tensor.dims(), &Device::Cpu)?;
            QTensor::quantize(&fresh, dtype)?.data()?.into_owned()
        }
    })
}
