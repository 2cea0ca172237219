//! Loading a single GGUF file (llama.cpp's format) of the `llama` (Llama, Mistral), `qwen2`, `qwen3`, `gemma3`,
//! `phi3`, `olmo2`, `smollm3` or `granite` architecture into what a Hugging Face model folder would give us: a resolved [`ModelConfig`],
//! dequantized tensors under Hugging Face names and layout, a `tokenizers::Tokenizer` rebuilt from the
//! `tokenizer.ggml.*` metadata, and the chat template.
//!
//! Four things differ between a GGUF file and the Hugging Face checkpoint it was converted from, and this
//! module undoes each of them:
//! - tensor names (`blk.0.attn_q.weight` is `model.layers.0.self_attn.q_proj.weight`; per architecture, see
//!   `names.rs`);
//! - for the `llama`, `smollm3` and `granite` architectures, the rows of `attn_q`/`attn_k`, which llama.cpp's
//!   convert script permutes for its interleaved rope (see [`unpermute_qk_rows`] and `arch.rs`);
//! - for `gemma3` only, the norm weights, which the convert script stores as 1 + w (`arch::norm_weight_shift`);
//! - the tokenizer, which exists only as metadata. It is rebuilt the way transformers' GGUF loader does
//!   (`integrations/gguf/gguf_tokenizer_mapping.py`), with two deliberate differences that follow llama.cpp
//!   and the model's original `tokenizer.json` instead: BOS/EOS are added only where `tokenizer.ggml.add_bos_token`
//!   / `add_eos_token` say so (transformers 4.x adds BOS regardless), and `tokenizer.ggml.pre = smollm` isolates
//!   digits before the GPT-2 split (transformers uses the GPT-2 split alone, which differs on runs of spaces
//!   before a digit).
//!
//! Weights are dequantized to `dtype`, except, when the caller asks to keep them (QLoRA, `--quantize keep`),
//! the decoder layers' block-quantized projections: those stay as the file's quantized blocks (q/k rows
//! un-permuted block-row by block-row) and LoRA trains on top of them.
//! A truncated or corrupt file yields [`Error::CorruptWeights`], never a panic or a huge allocation.

use crate::engine::model::config::{Architecture, ModelConfig};
use crate::engine::model::quant::is_block_quantized;
use crate::engine::model::safetensors_reader::{LoadProgress, LoadProgressFn};
use crate::engine::{Error, Result};
use candle_core::quantized::gguf_file::{Content, TensorInfo};
use candle_core::quantized::{QStorage, QTensor};
use candle_core::{DType, Device, Tensor};
use std::borrow::Cow;
use std::collections::HashMap;
use std::fs::File;
use std::io::BufReader;
use std::path::Path;
use std::sync::Arc;

use arch::{norm_weight_shift, permutes_qk};
use families::{ROPE_FACTORS_LONG, ROPE_FACTORS_SHORT};
use header_check::guarded;
pub(crate) use header_check::open_gguf;
use metadata::{check_architecture, Metadata};
use names::hf_tensor_name_in;
pub(crate) use resolve::llama3_rope_factors;
use resolve::{resolve_config, ROPE_FREQS};
use tokenizer::{build_tokenizer, GgufVocab};
use tokenizers::Tokenizer;

pub mod arch;
mod families;
mod header_check;
mod metadata;
pub mod names;
mod resolve;
#[cfg(test)]
mod tests;
mod tokenizer;

pub(crate) use tokenizer::{
    pre_tokenizer_name, TOKEN_TYPE_CONTROL, TOKEN_TYPE_NORMAL, TOKEN_TYPE_UNUSED, TOKEN_TYPE_USER_DEFINED,
};

pub use arch::SUPPORTED_GGUF_ARCHITECTURES;

/// A GGUF file turned into what a Hugging Face folder would give us.
pub struct GgufModel {
    /// Resolved from the `<arch>.*` and `tokenizer.ggml.*` metadata.
    pub config: ModelConfig,
    /// Dequantized weights under Hugging Face names and in Hugging Face layout. `lm_head.weight` is present
    /// only when the file has `output.weight`; otherwise `config.tie_word_embeddings` is true.
    pub tensors: HashMap<String, Tensor>,
    /// Block-quantized projection weights kept as they are (only when asked), under Hugging Face names and in
    /// Hugging Face row order, on the CPU; these names are absent from `tensors`.
    pub quantized: HashMap<String, Arc<QTensor>>,
    /// Rebuilt from the `tokenizer.ggml.*` metadata.
    pub tokenizer: Tokenizer,
    /// `tokenizer.chat_template`.
    pub chat_template: Option<String>,
    /// The BOS token string (`tokenizer.ggml.bos_token_id`), for chat template rendering.
    pub bos_token: Option<String>,
    /// The EOS token string (`tokenizer.ggml.eos_token_id`), for chat template rendering.
    pub eos_token: Option<String>,
}

/// Load a GGUF file, dequantizing every tensor to `dtype` on `device`.
pub fn load_gguf(path: &Path, device: &Device, dtype: DType) -> Result<GgufModel> {
    load_gguf_with(path, device, dtype, false, None)
}

/// [`load_gguf`], keeping the decoder layers' block-quantized projections quantized when `keep_quantized`,
/// calling `progress` after each tensor is read.
pub fn load_gguf_with(
    path: &Path,
    device: &Device,
    dtype: DType,
    keep_quantized: bool,
    progress: Option<&LoadProgressFn>,
) -> Result<GgufModel> {
    let mut file = GgufTensorReader::open(path)?;
    let mut model = file.model_without_tensors()?;
    let GgufTensorReader { content, reader, config, .. } = &mut file;
    (model.tensors, model.quantized) =
        load_tensors(path, content, reader, config, (device, dtype), keep_quantized, progress)?;
    Ok(model)
}

/// The family of a GGUF file from its header alone (`general.architecture` and the recorded model name), without
/// reading tensors or building the tokenizer; an unsupported architecture is an error naming the supported ones.
pub fn gguf_family(path: &Path) -> Result<crate::engine::model::config::Architecture> {
    let (content, _) = open_gguf(path)?;
    Ok(check_architecture(&Metadata { path, map: &content.metadata })?.architecture)
}

/// Bytes a tensor's data takes in the file.
fn stored_bytes(info: &TensorInfo) -> u64 {
    let t = info.ggml_dtype;
    (info.shape.elem_count() / t.block_size().max(1) * t.type_size()) as u64
}

/// An open GGUF file whose header, config and vocabulary are read, and whose tensors are read one at a time
/// on request: [`load_gguf`] reads them all, an export streams them.
pub struct GgufTensorReader {
    path: std::path::PathBuf,
    content: Content,
    reader: BufReader<File>,
    vocab: GgufVocab,
    /// Resolved from the `<arch>.*` and `tokenizer.ggml.*` metadata.
    pub config: ModelConfig,
    /// Hugging Face tensor name -> GGUF tensor name.
    gguf_names: HashMap<String, String>,
}

impl GgufTensorReader {
    /// Read the header and resolve the config; no tensor data is read but the rope factors.
    pub fn open(path: &Path) -> Result<Self> {
        let (content, mut reader) = open_gguf(path)?;
        let meta = Metadata { path, map: &content.metadata };
        let arch = check_architecture(&meta)?;
        let vocab = GgufVocab::from_metadata(&meta)?;
        let mut rope_tensors = HashMap::new();
        for name in [ROPE_FREQS, ROPE_FACTORS_LONG, ROPE_FACTORS_SHORT] {
            if let Some(info) = content.tensor_infos.get(name) {
                rope_tensors.insert(name, read_f32_vec(path, &content, name, info, &mut reader)?);
            }
        }
        let rope_tensor = |name: &str| rope_tensors.get(name).map(Vec::as_slice);
        let config = resolve_config(&meta, &arch, &content, &vocab, &rope_tensor)?;
        let gguf_names = hf_names(&content, config.architecture).map(|(hf, g)| (hf, g.to_string())).collect();
        Ok(Self { path: path.to_path_buf(), content, reader, vocab, config, gguf_names })
    }

    /// Everything but the tensors (`tensors` is empty): tokenizer, chat template, bos/eos strings.
    pub fn model_without_tensors(&self) -> Result<GgufModel> {
        let meta = Metadata { path: &self.path, map: &self.content.metadata };
        let vocab = &self.vocab;
        let token_string = |id: Option<u32>| id.and_then(|i| vocab.tokens.get(i as usize).cloned());
        Ok(GgufModel {
            chat_template: meta.string("tokenizer.chat_template")?.map(str::to_owned),
            bos_token: token_string(vocab.bos_id),
            eos_token: token_string(vocab.eos_id),
            config: self.config.clone(),
            tensors: HashMap::new(),
            quantized: HashMap::new(),
            tokenizer: build_tokenizer(vocab)?,
        })
    }

    /// Every tensor the model has, under its Hugging Face name with its Hugging Face shape.
    pub fn hf_shapes(&self) -> Vec<(String, Vec<usize>)> {
        expected_shapes(&self.config)
    }

    /// Read the tensor with Hugging Face name `hf_name`, dequantized to f32 on the CPU, checked against `shape`,
    /// with Hugging Face row order for q/k.
    pub fn read_hf(&mut self, hf_name: &str, shape: &[usize]) -> Result<Tensor> {
        let path = self.path.as_path();
        let gguf_name = self
            .gguf_names
            .get(hf_name)
            .ok_or_else(|| Error::MissingTensor { name: hf_name.to_string(), path: path.to_path_buf() })?;
        let tensor = read_dequantized(path, &self.content, gguf_name, &mut self.reader)?;
        check_shape(path, gguf_name, hf_name, tensor.dims(), shape)?;
        to_hf_values(path, gguf_name, hf_name, tensor, &self.config)
    }
}

/// (Hugging Face name, GGUF name) of every tensor of the file that has one, for architecture `arch`.
fn hf_names(content: &Content, arch: Architecture) -> impl Iterator<Item = (String, &str)> {
    content.tensor_infos.keys().filter_map(move |g| hf_tensor_name_in(arch, g).map(|hf| (hf, g.as_str())))
}

/// A dequantized tensor as the Hugging Face checkpoint holds it: q/k rows in Hugging Face order (`llama`),
/// norm weights without the convert script's shift (`gemma3`).
fn to_hf_values(path: &Path, gguf_name: &str, hf_name: &str, tensor: Tensor, cfg: &ModelConfig) -> Result<Tensor> {
    let fail = |e: candle_core::Error| corrupt(path, format!("`{gguf_name}`: {e}"));
    let tensor = match qk_heads(gguf_name, cfg) {
        Some(n_head) => permute_rows(&tensor, n_head, true).map_err(fail)?,
        None => tensor,
    };
    let shift = norm_weight_shift(cfg.architecture);
    if shift != 0.0 && hf_name.ends_with("norm.weight") {
        return tensor.affine(1.0, -shift).map_err(fail);
    }
    Ok(tensor)
}

/// The head count whose row order llama.cpp permutes in `gguf_name` (q and k projections of the `llama`, `smollm3`
/// and `granite` architectures), if any.
fn qk_heads(gguf_name: &str, cfg: &ModelConfig) -> Option<usize> {
    if !permutes_qk(cfg.architecture) {
        return None;
    }
    match gguf_name.split('.').nth(2) {
        Some("attn_q") => Some(cfg.num_attention_heads),
        Some("attn_k") => Some(cfg.num_kv_heads),
        _ => None,
    }
}

fn corrupt(path: &Path, message: impl Into<String>) -> Error {
    Error::CorruptWeights { path: path.to_path_buf(), message: message.into() }
}

// ---------------------------------------------------------------------------------------------------------
// Tensors

/// Every tensor the transformer needs, with its Hugging Face shape (also the tensor list of a streamed export).
pub(crate) fn expected_shapes(cfg: &ModelConfig) -> Vec<(String, Vec<usize>)> {
    let (h, v) = (cfg.hidden_size, cfg.vocab_size);
    let q = cfg.num_attention_heads * cfg.head_dim;
    let kv = cfg.num_kv_heads * cfg.head_dim;
    let mut shapes =
        vec![("model.embed_tokens.weight".to_string(), vec![v, h]), ("model.norm.weight".to_string(), vec![h])];
    if !cfg.tie_word_embeddings {
        shapes.push(("lm_head.weight".into(), vec![v, h]));
    }
    for layer in 0..cfg.num_layers {
        let p = format!("model.layers.{layer}");
        let mut push = |name: &str, shape: Vec<usize>| shapes.push((format!("{p}.{name}"), shape));
        for (_, norm) in cfg.norm_layout.norms() {
            push(&format!("{norm}.weight"), vec![h]);
        }
        // The family's linears (phi3: fused qkv_proj and gate_up_proj), (out, in) as Hugging Face stores them.
        for &module in cfg.linear_modules() {
            let (in_f, out_f) = cfg.linear_shape(module).unwrap_or_default();
            push(&format!("{}.{module}.weight", crate::engine::model::config::module_group(module)), vec![out_f, in_f]);
        }
        if cfg.qkv_bias {
            push("self_attn.q_proj.bias", vec![q]);
            push("self_attn.k_proj.bias", vec![kv]);
            push("self_attn.v_proj.bias", vec![kv]);
        }
        if cfg.o_bias {
            push("self_attn.o_proj.bias", vec![h]);
        }
        if cfg.qk_norm {
            let (q_width, k_width) = cfg.qk_norm_widths();
            push("self_attn.q_norm.weight", vec![q_width]);
            push("self_attn.k_norm.weight", vec![k_width]);
        }
    }
    shapes
}

/// Dequantized tensors and kept quantized ones, by Hugging Face name.
type LoadedTensors = (HashMap<String, Tensor>, HashMap<String, Arc<QTensor>>);

/// Dequantize every tensor the model needs (or, with `keep_quantized`, keep block-quantized projections),
/// check its shape against the config, and restore Hugging Face row order for q/k. Work happens on the CPU;
/// each dense tensor moves to `device` once, already in `dtype`.
fn load_tensors(
    path: &Path,
    content: &Content,
    reader: &mut BufReader<File>,
    cfg: &ModelConfig,
    (device, dtype): (&Device, DType),
    keep_quantized: bool,
    progress: Option<&LoadProgressFn>,
) -> Result<LoadedTensors> {
    let gguf_names: HashMap<String, &str> = hf_names(content, cfg.architecture).collect();
    let (mut tensors, mut quantized) = (HashMap::new(), HashMap::new());
    let started = std::time::Instant::now();
    let bytes_total = gguf_names.values().filter_map(|g| content.tensor_infos.get(*g)).map(stored_bytes).sum();
    let mut bytes_done = 0;
    for (hf_name, shape) in expected_shapes(cfg) {
        let gguf_name = *gguf_names
            .get(&hf_name)
            .ok_or_else(|| Error::MissingTensor { name: hf_name.clone(), path: path.to_path_buf() })?;
        if let (Some(report), Some(info)) = (progress, content.tensor_infos.get(gguf_name)) {
            bytes_done += stored_bytes(info);
            report(&LoadProgress { bytes_done, bytes_total, elapsed_secs: started.elapsed().as_secs_f64() });
        }
        let n_head = qk_heads(gguf_name, cfg);
        let keep = keep_quantized
            && hf_name.ends_with("_proj.weight")
            && content.tensor_infos.get(gguf_name).is_some_and(|i| is_block_quantized(i.ggml_dtype));
        let permute_err = |e: candle_core::Error| corrupt(path, format!("`{gguf_name}`: {e}"));
        if keep {
            let q = guarded(path, &format!("cannot read tensor `{gguf_name}`"), || {
                content.tensor(reader, gguf_name, &Device::Cpu)
            })?;
            check_shape(path, gguf_name, &hf_name, q.shape().dims(), &shape)?;
            let q = match n_head {
                Some(n_head) => permute_quantized_rows(&q, n_head).map_err(permute_err)?,
                None => q,
            };
            quantized.insert(hf_name, Arc::new(q));
            continue;
        }
        let tensor = read_dequantized(path, content, gguf_name, reader)?;
        check_shape(path, gguf_name, &hf_name, tensor.dims(), &shape)?;
        let tensor = to_hf_values(path, gguf_name, &hf_name, tensor, cfg)?;
        tensors.insert(hf_name, tensor.to_dtype(dtype)?.to_device(device)?);
    }
    Ok((tensors, quantized))
}

fn check_shape(path: &Path, gguf_name: &str, hf_name: &str, found: &[usize], shape: &[usize]) -> Result<()> {
    if found != shape {
        return Err(corrupt(
            path,
            format!("tensor `{gguf_name}` has shape {found:?}, but the metadata implies {shape:?} for `{hf_name}`"),
        ));
    }
    Ok(())
}

/// [`unpermute_qk_rows`] on quantized blocks: each row is whole blocks, so rows move as byte strings.
fn permute_quantized_rows(q: &QTensor, n_head: usize) -> candle_core::Result<QTensor> {
    let (rows, cols) = q.shape().dims2()?;
    let row_bytes = cols / q.dtype().block_size() * q.dtype().type_size();
    let data = q.data()?;
    let bytes = Tensor::from_slice(&data, (rows, row_bytes), &Device::Cpu)?;
    let permuted = permute_rows(&bytes, n_head, true)?.flatten_all()?.to_vec1::<u8>()?;
    QTensor::new(QStorage::from_data(Cow::Owned(permuted), &Device::Cpu, q.dtype())?, q.shape().clone())
}

/// Read one tensor and dequantize it to f32 on the CPU.
fn read_dequantized(path: &Path, content: &Content, name: &str, reader: &mut BufReader<File>) -> Result<Tensor> {
    let tensor = guarded(path, &format!("cannot read tensor `{name}`"), || {
        content.tensor(reader, name, &Device::Cpu)?.dequantize(&Device::Cpu)
    })?;
    // Any NaN or infinity makes the sum one (finite weights of real models sum far below f32's range).
    if !tensor.sum_all()?.to_scalar::<f32>()?.is_finite() {
        return Err(corrupt(path, format!("tensor `{name}` holds NaN or infinite values; the file is damaged")));
    }
    Ok(tensor)
}

fn read_f32_vec(
    path: &Path,
    content: &Content,
    name: &str,
    info: &TensorInfo,
    reader: &mut BufReader<File>,
) -> Result<Vec<f32>> {
    let read = || {
        info.read(reader, content.tensor_data_offset, &Device::Cpu)?
            .dequantize(&Device::Cpu)?
            .flatten_all()?
            .to_vec1::<f32>()
    };
    guarded(path, &format!("cannot read tensor `{name}`"), read)
}

/// Undo llama.cpp's q/k row permutation. Its convert script turns Hugging Face's half-split rope layout into
/// GGML's interleaved one with `w.reshape(n_head, 2, rows / n_head / 2, cols).swapaxes(1, 2).reshape(rows, cols)`;
/// this is the inverse: `reshape(n_head, rows / n_head / 2, 2, cols).swapaxes(1, 2)`. For k, `n_head` is the
/// KV head count. Biases (rank 1) are permuted the same way.
pub fn unpermute_qk_rows(w: &Tensor, n_head: usize) -> Result<Tensor> {
    Ok(permute_rows(w, n_head, true)?)
}

/// llama.cpp's q/k row permutation (Hugging Face's half-split rope layout to GGML's interleaved one), as its
/// convert script applies it to the `llama` (llama, mistral), `smollm3` and `granite` architectures; the inverse
/// of [`unpermute_qk_rows`].
pub fn permute_qk_rows(w: &Tensor, n_head: usize) -> Result<Tensor> {
    Ok(permute_rows(w, n_head, false)?)
}

/// The permutation itself (`inverse = false`) or its inverse, on the first dimension of `w`.
fn permute_rows(w: &Tensor, n_head: usize, inverse: bool) -> candle_core::Result<Tensor> {
    let dims = w.dims().to_vec();
    let rows = dims.first().copied().unwrap_or(0);
    if n_head == 0 || rows == 0 || rows % (2 * n_head) != 0 {
        candle_core::bail!("cannot split {rows} q/k rows into {n_head} heads of two rope halves");
    }
    let cols: usize = dims[1..].iter().product();
    let half = rows / n_head / 2;
    let split = if inverse { (n_head, half, 2, cols) } else { (n_head, 2, half, cols) };
    w.reshape(split)?.transpose(1, 2)?.contiguous()?.reshape(dims)
}
