//! `--format gguf`: the base model with the adapter merged in, as one llama.cpp GGUF file. Tensors are named
//! by the shared table in `model::gguf::names`, ordered as llama.cpp's convert script writes them (embedding,
//! layer by layer, final norm, output), q/k rows permuted for the `llama` architecture, and quantized one at a
//! time as the streaming writer asks for them (types chosen by [`GgufQuant::tensor_type`]).
//!
//! Memory: nothing of the model is loaded up front; [`MergedTensors`] reads one base tensor at a time, merges its
//! adapter update and the writer quantizes and writes it before asking for the next, so the peak is about one
//! f32 tensor (the largest: the embedding) plus the adapter.

use super::gguf_families::{config_tensors, phi3_file_name};
use super::gguf_metadata::{model_metadata, permutes_qk, tokenizer_metadata, Metadata};
use super::gguf_quant::GgufQuant;
use super::gguf_writer::{write_gguf, TensorEntry};
use super::merged_tensors::MergedTensors;
use super::ExportProgress;
use crate::engine::model::config::Architecture;
use crate::engine::model::config::RopeScaling;
use crate::engine::model::gguf::arch::norm_weight_shift;
use crate::engine::model::gguf::names::{gguf_module_of, gguf_tensor_name_in, hf_tensor_name_in};
use crate::engine::model::gguf::{llama3_rope_factors, permute_qk_rows};
use crate::engine::model::{ModelConfig, ModelInfo};
use crate::engine::{Error, Result};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{CpuStorage, DType, Device, Storage, Tensor};
use std::path::Path;

/// llama.cpp's name for the tensor of Llama 3 rope frequency divisors.
const ROPE_FREQS: &str = "rope_freqs.weight";

/// The GGUF file's metadata and tensor list for `model`, named `name`, in `quant`: what [`write_model_gguf`]
/// writes, available before any tensor is read (the export doctor checks its end-of-turn ids).
pub fn plan_model_gguf(model: &MergedTensors, name: &str, quant: GgufQuant) -> Result<(Metadata, Vec<TensorEntry>)> {
    let metadata = full_metadata(&model.info, name, quant)?;
    let mut shapes = model.shapes();
    if let Some(factors) = rope_freqs(&model.info.config)? {
        shapes.push((ROPE_FREQS.into(), factors.dims().to_vec()));
    }
    for (name, tensor) in config_tensors(&model.info.config)? {
        shapes.push((name.into(), tensor.dims().to_vec()));
    }
    Ok((metadata, tensor_entries(&model.info.config, shapes, quant)?))
}

/// Write `model` (adapter merged) to `out` as planned by [`plan_model_gguf`], one tensor at a time. Returns the
/// file size in bytes.
pub fn write_model_gguf(
    mut model: MergedTensors,
    (metadata, entries): (Metadata, Vec<TensorEntry>),
    out: &Path,
    progress: &mut dyn FnMut(ExportProgress),
) -> Result<u64> {
    let config = model.info.config.clone();
    let total = entries.len();
    write_gguf(out, &metadata, &entries, |i| {
        let entry = &entries[i];
        progress(ExportProgress { done: i, total, what: format!("{} ({:?})", entry.name, entry.dtype) });
        let tensor = match entry.name.as_str() {
            ROPE_FREQS => rope_freqs(&config)?
                .ok_or_else(|| Error::InvalidSetting("rope factors without Llama 3 rope scaling".into()))?,
            name => match config_tensors(&config)?.into_iter().find(|(n, _)| *n == name) {
                Some((_, tensor)) => tensor,
                None => model.tensor(&hf_name(config.architecture, name), &entry.dims)?,
            },
        };
        tensor_bytes(&prepare(&config, &entry.name, tensor)?, entry.dtype)
    })
}

/// General, architecture and tokenizer metadata.
fn full_metadata(model: &ModelInfo, name: &str, quant: GgufQuant) -> Result<Metadata> {
    let name = match model.config.architecture {
        Architecture::Phi3 => phi3_file_name(name, &|t: &str| model.tokenizer.token_to_id(t).is_some()),
        _ => name.to_string(),
    };
    let mut metadata = model_metadata(&model.config, &name, quant.file_type(), quant.is_quantized())?;
    metadata.extend(tokenizer_metadata(model)?);
    Ok(metadata)
}

/// The Hugging Face name a GGUF tensor is made from (`rope_freqs.weight` is its own).
fn hf_name(arch: Architecture, gguf_name: &str) -> String {
    hf_tensor_name_in(arch, gguf_name).unwrap_or_else(|| gguf_name.to_string())
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
    shapes: Vec<(String, Vec<usize>)>,
    quant: GgufQuant,
) -> Result<Vec<TensorEntry>> {
    let tied = !shapes.iter().any(|(hf, _)| hf == "lm_head.weight");
    let own: Vec<&str> = config_tensors(config)?.iter().map(|(n, _)| *n).collect();
    let mut named: Vec<(String, Vec<usize>)> = Vec::with_capacity(shapes.len());
    for (hf, dims) in shapes {
        let own_name = hf == ROPE_FREQS || own.contains(&hf.as_str());
        let gguf = if own_name { Some(hf.clone()) } else { gguf_tensor_name_in(config.architecture, &hf) };
        let gguf = gguf.ok_or_else(|| {
            Error::InvalidSetting(format!("tensor `{hf}` has no llama.cpp name; this model cannot be exported to GGUF"))
        })?;
        named.push((gguf, dims));
    }
    named.sort_by_key(|(name, _)| order_key(name));
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
    const LAYER_ORDER: [&str; 15] = [
        "attn_norm",
        "attn_qkv",
        "attn_q",
        "attn_k",
        "attn_v",
        "attn_q_norm",
        "attn_k_norm",
        "attn_output",
        "post_attention_norm",
        "ffn_norm",
        "ffn_gate",
        "ffn_up",
        "ffn_down",
        "post_ffw_norm",
        "layer_output_norm",
    ];
    match name {
        ROPE_FREQS | super::gguf_families::ROPE_FACTORS_LONG | super::gguf_families::ROPE_FACTORS_SHORT => {
            (0, 0, 0, name.to_string())
        }
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

/// Hugging Face layout to llama.cpp's: q/k rows (weights and biases) permuted for the `llama` architecture;
/// gemma3's norm weights stored as the `1 + w` its norms multiply by.
fn prepare(config: &ModelConfig, gguf_name: &str, tensor: Tensor) -> Result<Tensor> {
    let shift = norm_weight_shift(config.architecture);
    if shift != 0.0 && gguf_name.ends_with("norm.weight") {
        return Ok(tensor.affine(1.0, shift)?);
    }
    if !permutes_qk(config.architecture) {
        return Ok(tensor);
    }
    match gguf_module_of(gguf_name) {
        Some("attn_q") => permute_qk_rows(&tensor, config.num_attention_heads),
        Some("attn_k") => permute_qk_rows(&tensor, config.num_kv_heads),
        _ => Ok(tensor),
    }
}

/// The tensor's data in `dtype`, quantized with Candle's (ggml's reference) quantizers. The f32 values are read
/// in place when the tensor owns its storage (no copy of the largest tensor); a tensor that is a view into a
/// larger one is copied first, because `QTensor::quantize` reads the whole underlying storage.
pub(super) fn tensor_bytes(tensor: &Tensor, dtype: GgmlDType) -> Result<Vec<u8>> {
    let tensor = tensor.to_dtype(DType::F32)?;
    let owned = {
        let (storage, layout) = tensor.storage_and_layout();
        match (&*storage, layout.contiguous_offsets()) {
            (Storage::Cpu(CpuStorage::F32(v)), Some((start, end))) => start == 0 && end == v.len(),
            _ => false,
        }
    };
    let tensor = if owned {
        tensor
    } else {
        Tensor::from_vec(tensor.flatten_all()?.to_vec1::<f32>()?, tensor.dims(), &Device::Cpu)?
    };
    let convert = |f: &dyn Fn(&[f32]) -> Vec<u8>| -> Result<Vec<u8>> {
        let (storage, _) = tensor.storage_and_layout();
        match &*storage {
            Storage::Cpu(CpuStorage::F32(v)) => Ok(f(v)),
            _ => Err(Error::InvalidSetting("export tensors are f32 on the CPU".into())),
        }
    };
    match dtype {
        GgmlDType::F32 => convert(&|v| v.iter().flat_map(|x| x.to_le_bytes()).collect()),
        GgmlDType::F16 => convert(&|v| v.iter().flat_map(|x| half::f16::from_f32(*x).to_le_bytes()).collect()),
        GgmlDType::BF16 => convert(&|v| v.iter().flat_map(|x| half::bf16::from_f32(*x).to_le_bytes()).collect()),
        // Matrices quantize row chunks in parallel (the same blocks).
        _ if tensor.rank() == 2 => {
            Ok(crate::engine::ops::quantize_rows(&tensor, dtype, &Device::Cpu)?.data()?.into_owned())
        }
        _ => Ok(QTensor::quantize(&tensor, dtype)?.data()?.into_owned()),
    }
}
