//! The base model's tensors one at a time, with the adapter merged in, for exports that stream: each request
//! reads (memory-mapped safetensors) or dequantizes (GGUF) one base tensor to f32 on the CPU, adds the LoRA
//! update `scale * B @ A` when that linear has an adapter (a DoRA adapter's rows rescaled to its magnitude,
//! `adapter::merge_weight`), and hands it over; nothing else of the model is
//! held. Peak memory is about one f32 tensor (plus its source and the writer's quantized copy) and the adapter,
//! instead of the whole model loaded and a merged copy of it.

use crate::engine::checkpoint::{self, AdapterWeights};
use crate::engine::model::adapter::merge_weight;
use crate::engine::model::base_tensors::BaseTensors;
use crate::engine::model::gguf::expected_shapes;
use crate::engine::model::transformer::hf_linear_name;
use crate::engine::model::{load_model_info, ModelInfo};
use crate::engine::Result;
use candle_core::Tensor;
use std::collections::HashMap;
use std::path::Path;

/// A model to export: what it is ([`ModelInfo`]) and its merged tensors on request.
pub struct MergedTensors {
    pub info: ModelInfo,
    base: BaseTensors,
    /// Hugging Face weight name -> (lora_A (r, in), lora_B (out, r), DoRA magnitude (out)).
    deltas: HashMap<String, (Tensor, Tensor, Option<Tensor>)>,
    scale: f64,
}

impl MergedTensors {
    /// Open `base_model` without loading its weights and read the adapter in `ckpt` (if any), refusing one
    /// that does not fit this model.
    pub fn open(ckpt: Option<&Path>, base_model: &Path) -> Result<Self> {
        let mut info = load_model_info(base_model)?;
        let base = BaseTensors::open(&info.source)?;
        // As `Transformer::load`: a folder that ships no lm_head is tied whatever its config says.
        if let BaseTensors::Folder(weights) = &base {
            if !weights.contains("lm_head.weight") {
                info.config.tie_word_embeddings = true;
            }
        }
        let (mut deltas, mut scale) = (HashMap::new(), 0.0);
        if let Some(ckpt) = ckpt {
            let AdapterWeights { config, pairs, .. } = checkpoint::read_adapter_for(&info.config, ckpt)?;
            scale = config.scale();
            for (layer, module, a, b, magnitude) in pairs {
                deltas.insert(format!("{}.weight", hf_linear_name(layer, module)), (a, b, magnitude));
            }
        }
        Ok(Self { info, base, deltas, scale })
    }

    /// Every tensor of the model under its Hugging Face name with its shape, in no particular order.
    pub fn shapes(&self) -> Vec<(String, Vec<usize>)> {
        expected_shapes(&self.info.config)
    }

    /// The tensor `hf_name` (of `shape`) in f32 on the CPU, adapter merged: `W + scale * B @ A` (DoRA: rows
    /// rescaled to the magnitude).
    pub fn tensor(&mut self, hf_name: &str, shape: &[usize]) -> Result<Tensor> {
        let base = self.base.read(hf_name, shape)?;
        match self.deltas.get(hf_name) {
            Some((a, b, magnitude)) => Ok(merge_weight(&base, &(b.matmul(a)? * self.scale)?, magnitude.as_ref())?),
            None => Ok(base),
        }
    }
}
