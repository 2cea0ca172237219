//! `--format gguf-lora`: the adapter alone as llama.cpp's LoRA adapter GGUF (what `convert_lora_to_gguf.py`
//! writes and `llama-cli --lora` / `llama_adapter_lora_init` load on top of a GGUF of the same base model).
//!
//! - metadata: `general.type = adapter`, `adapter.type = lora`, `general.architecture` of the base, and
//!   `adapter.lora.alpha`. llama.cpp scales by `alpha / rank`, so we write `alpha = scale * rank` with our own
//!   scale (which already covers rsLoRA's `alpha / sqrt(rank)`).
//! - tensors: `blk.N.<module>.weight.lora_a` shaped (rank, in) and `.lora_b` shaped (out, rank) in torch order,
//!   f32, as PEFT stores them (read without loading the base model).
//! - for the `llama` architecture the rows of q/k are permuted in the base GGUF; since the update is
//!   `lora_b @ lora_a`, permuting the rows of `lora_b` of q/k alone gives the permuted update.

use super::gguf_metadata::{gguf_architecture, permutes_qk};
use super::gguf_model::tensor_bytes;
use super::gguf_writer::{write_gguf, MetaValue, TensorEntry};
use crate::engine::checkpoint;
use crate::engine::model::gguf::names::gguf_linear_module_in;
use crate::engine::model::gguf::permute_qk_rows;
use crate::engine::model::load_model_info;
use crate::engine::{Error, Result};
use candle_core::quantized::GgmlDType;
use candle_core::Tensor;
use std::path::Path;

/// Write the adapter in `ckpt` (trained on `base_model`) to `out` as a llama.cpp LoRA GGUF. Returns the size.
pub fn export_gguf_lora(ckpt: &Path, base_model: &Path, allow_other_base: bool, out: &Path) -> Result<u64> {
    let info = load_model_info(base_model)?;
    super::refuse_other_base(Some(ckpt), &info.source, &info.config, allow_other_base)?;
    let config = &info.config;
    super::gguf_families::refuse_unexpressible(config)?;
    let adapter = checkpoint::read_adapter_for(config, ckpt)?;
    if adapter.config.use_dora {
        return Err(Error::InvalidSetting(format!(
            "{} is a DoRA adapter, which llama.cpp's LoRA GGUF cannot express (it has no magnitude vector); export \
             a merged model instead (--format gguf or --format merged)",
            ckpt.display()
        )));
    }
    let (scale, rank) = (adapter.config.scale(), adapter.summary.rank);
    let mut entries = Vec::with_capacity(2 * adapter.pairs.len());
    let mut tensors: Vec<Tensor> = Vec::with_capacity(2 * adapter.pairs.len());
    for (layer, hf_module, lora_a, mut lora_b, _) in adapter.pairs {
        let module = gguf_linear_module_in(config.architecture, hf_module)
            .ok_or_else(|| Error::InvalidSetting(format!("adapter module `{hf_module}` has no llama.cpp name")))?;
        let prefix = format!("blk.{layer}.{module}.weight");
        if permutes_qk(config.architecture) {
            match module {
                "attn_q" => lora_b = permute_qk_rows(&lora_b, config.num_attention_heads)?,
                "attn_k" => lora_b = permute_qk_rows(&lora_b, config.num_kv_heads)?,
                _ => {}
            }
        }
        for (suffix, tensor) in [("lora_a", lora_a), ("lora_b", lora_b)] {
            entries.push(TensorEntry {
                name: format!("{prefix}.{suffix}"),
                dims: tensor.dims().to_vec(),
                dtype: GgmlDType::F32,
            });
            tensors.push(tensor);
        }
    }
    let name = ckpt.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "adapter".into());
    let metadata = vec![
        ("general.architecture".to_string(), MetaValue::Str(gguf_architecture(config.architecture).into())),
        ("general.type".to_string(), MetaValue::Str("adapter".into())),
        ("general.name".to_string(), MetaValue::Str(name)),
        ("adapter.type".to_string(), MetaValue::Str("lora".into())),
        ("adapter.lora.alpha".to_string(), MetaValue::F32((scale * rank as f64) as f32)),
    ];
    write_gguf(out, &metadata, &entries, |i| tensor_bytes(&tensors[i], GgmlDType::F32))
}
