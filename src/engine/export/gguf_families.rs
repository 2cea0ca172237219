//! What a GGUF export of gemma3, phi3, olmo2, smollm3 and granite adds to the common (llama) layout, written as
//! llama.cpp's `convert_hf_to_gguf.py` writes it (`Gemma3Model`, `Phi3MiniModel`, `Olmo2Model`, `SmolLM3Model`,
//! `GraniteModel`) and read back the way `model::gguf::families` (our reader) and llama.cpp read it:
//!
//! - gemma3: every `*norm.weight` stored as `1 + w` (`arch::norm_weight_shift`; the converter's `norm_shift`),
//!   `attention.sliding_window`, the global layers' rope base and linear scaling; the embedding scale is
//!   llama.cpp's own (`sqrt(hidden)`), so no key.
//! - phi3: fused `attn_qkv` / `ffn_up` (gate rows first) as the checkpoint has them, `rope.dimension_count` =
//!   the rotary dims (partial rotary), LongRoPE as the tensors `rope_factors_long.weight` /
//!   `rope_factors_short.weight` with `rope.scaling.original_context_length` and `rope.scaling.attn_factor`,
//!   and `attention.sliding_window` (0: none).
//! - olmo2: only names (`post_attention_norm`, `post_ffw_norm`, whole-projection q/k norms; `model::gguf::names`).
//! - smollm3: no key says which layers skip rope: llama.cpp fixes every 4th (`n_no_rope_layer_step = 4`).
//! - granite: `attention.scale`, `embedding_scale`, `residual_scale`, `logit_scale`.
//!
//! Some things a Hugging Face config can say have no GGUF key, because llama.cpp fixes them per architecture
//! (`llama-model.cpp`): gemma3's score scale (`1 / sqrt(key_length)`, the 62-layer 27B `1 / sqrt(hidden /
//! heads)`), its global layers (every 6th) and its sliding layers' rope base (10000); smollm3's no-rope layers.
//! Every published Gemma 3 and SmolLM3 checkpoint has exactly those values; a model that differs would run as
//! another model in llama.cpp, so [`refuse_unexpressible`] refuses it before anything is written.

use super::gguf_writer::MetaValue;
use crate::engine::model::config::{Architecture, RopeScaling};
use crate::engine::model::ModelConfig;
use crate::engine::{Error, Result};
use candle_core::{Device, Tensor};

/// phi3's LongRoPE factor tensors, as llama.cpp names them.
pub const ROPE_FACTORS_LONG: &str = "rope_factors_long.weight";
pub const ROPE_FACTORS_SHORT: &str = "rope_factors_short.weight";

/// llama.cpp's fixed gemma3 values (`llama-model.cpp`, `LLM_ARCH_GEMMA3`).
const GEMMA3_SWA_PATTERN: usize = 6;
const GEMMA3_LOCAL_ROPE_BASE: f64 = 10_000.0;
/// llama.cpp's fixed smollm3 value: every 4th layer has no rope.
const SMOLLM3_NO_ROPE_LAYER_STEP: usize = 4;

fn refusal(c: &ModelConfig, what: String) -> Error {
    Error::InvalidSetting(format!(
        "GGUF export of this {} model: {what}; llama.cpp fixes that for the architecture (no GGUF key can say \
         otherwise), so the file would run as a different model. Export `merged` or `peft` instead",
        c.architecture.as_str()
    ))
}

/// Refuse a model whose config says something its GGUF file cannot (see the module docs).
pub fn refuse_unexpressible(c: &ModelConfig) -> Result<()> {
    match c.architecture {
        Architecture::Gemma3 => {
            let llama_cpp_scale = if c.num_layers == 62 {
                1.0 / ((c.hidden_size / c.num_attention_heads) as f64).sqrt()
            } else {
                1.0 / (c.head_dim as f64).sqrt()
            };
            if (c.attention_scale - llama_cpp_scale).abs() > 1e-6 * llama_cpp_scale {
                return Err(refusal(
                    c,
                    format!(
                        "attention scores are scaled by {:.6} (query_pre_attn_scalar {:.1}) where llama.cpp scales \
                         by {llama_cpp_scale:.6}",
                        c.attention_scale,
                        c.attention_scale.powi(-2)
                    ),
                ));
            }
            let llama_cpp_layers = gemma3_sliding_layers(c.num_layers);
            if c.sliding_window.is_none() || c.sliding_layers != llama_cpp_layers {
                return Err(refusal(
                    c,
                    format!(
                        "its sliding layers (layer_types) are {:?} (window {:?}) where llama.cpp slides {:?}",
                        c.sliding_layers, c.sliding_window, llama_cpp_layers
                    ),
                ));
            }
            if let Some(local) = c.local_rope_theta.filter(|b| *b != GEMMA3_LOCAL_ROPE_BASE) {
                return Err(refusal(
                    c,
                    format!("its sliding layers rotate with rope_local_base_freq {local} where llama.cpp uses 10000"),
                ));
            }
        }
        Architecture::SmolLM3 => {
            let llama_cpp_layers = smollm3_rope_layers(c.num_layers);
            let ours: Vec<bool> =
                if c.rope_layers.is_empty() { vec![true; c.num_layers] } else { c.rope_layers.clone() };
            if ours != llama_cpp_layers {
                return Err(refusal(
                    c,
                    format!(
                        "its rope layers (no_rope_layers) are {ours:?} where llama.cpp rotates {llama_cpp_layers:?}"
                    ),
                ));
            }
        }
        _ => {}
    }
    Ok(())
}

/// llama.cpp's gemma3 layers: every 6th global, the rest sliding.
fn gemma3_sliding_layers(num_layers: usize) -> Vec<bool> {
    (0..num_layers).map(|i| (i + 1) % GEMMA3_SWA_PATTERN != 0).collect()
}

/// llama.cpp's smollm3 layers: every 4th without rope.
fn smollm3_rope_layers(num_layers: usize) -> Vec<bool> {
    (0..num_layers).map(|i| (i + 1) % SMOLLM3_NO_ROPE_LAYER_STEP != 0).collect()
}

/// The family's own `<arch>.*` keys, after the common ones.
pub fn family_metadata(c: &ModelConfig, key: &dyn Fn(&str) -> String) -> Vec<(String, MetaValue)> {
    let f32_of = |v: f64| MetaValue::F32(v as f32);
    let u32_of = |n: usize| MetaValue::U32(u32::try_from(n).unwrap_or(u32::MAX));
    let mut meta = Vec::new();
    match c.architecture {
        Architecture::Gemma3 => {
            if let Some(window) = c.sliding_window {
                meta.push((key("attention.sliding_window"), u32_of(window)));
            }
        }
        Architecture::Phi3 => {
            meta.push((key("attention.sliding_window"), u32_of(c.sliding_window.unwrap_or(0))));
            if let Some(RopeScaling::LongRope(s)) = &c.rope_scaling {
                meta.push((key("rope.scaling.original_context_length"), u32_of(s.original_max_position_embeddings)));
                meta.push((key("rope.scaling.attn_factor"), f32_of(s.attention_factor)));
            }
        }
        Architecture::Granite => {
            meta.push((key("attention.scale"), f32_of(c.attention_scale)));
            meta.push((key("embedding_scale"), f32_of(c.embedding_multiplier)));
            meta.push((key("residual_scale"), f32_of(c.residual_multiplier)));
            meta.push((key("logit_scale"), f32_of(c.logits_scaling)));
        }
        _ => {}
    }
    meta
}

/// Tensors made from the config rather than the checkpoint: phi3's LongRoPE factors (long, then short).
pub fn config_tensors(c: &ModelConfig) -> Result<Vec<(&'static str, Tensor)>> {
    let Some(RopeScaling::LongRope(s)) = &c.rope_scaling else { return Ok(Vec::new()) };
    let tensor = |v: &[f64]| Tensor::new(v.iter().map(|x| *x as f32).collect::<Vec<f32>>(), &Device::Cpu);
    Ok(vec![(ROPE_FACTORS_LONG, tensor(&s.long_factor)?), (ROPE_FACTORS_SHORT, tensor(&s.short_factor)?)])
}

/// llama.cpp's vocabulary loader gives SentencePiece's `</s>`, `<unk>`, `<s>` and `<|endoftext|>` special
/// attributes when `general.name` contains "phi3" or "phi-3" (Phi-3's vocabulary) and fails to load a file whose
/// vocabulary lacks one of them (Phi-4-mini's byte-level BPE, whose files are named "Phi 4 Mini ..."). Such a
/// phi3 file is named without that word.
pub fn phi3_file_name(name: &str, has_token: &dyn Fn(&str) -> bool) -> String {
    let phi3_vocabulary = ["</s>", "<unk>", "<s>", "<|endoftext|>"].iter().all(|t| has_token(t));
    if phi3_vocabulary {
        return name.to_string();
    }
    let mut out = name.to_string();
    for word in ["phi-3", "phi3", "Phi-3", "Phi3", "PHI-3", "PHI3"] {
        out = out.replace(word, "phi-mini");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama_cpp_fixed_layers() {
        assert_eq!(gemma3_sliding_layers(7), vec![true, true, true, true, true, false, true]);
        assert_eq!(smollm3_rope_layers(5), vec![true, true, true, false, true]);
        let none = |_: &str| false;
        assert_eq!(phi3_file_name("tiny-phi3-ckpt", &none), "tiny-phi-mini-ckpt");
        assert_eq!(phi3_file_name("Phi-3.5-mini", &|_: &str| true), "Phi-3.5-mini");
    }
}
