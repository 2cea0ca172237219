//! The resolution of a GGUF file's `<arch>.*` keys (llama.cpp names every hyperparameter after the file's
//! architecture) and its `tokenizer.ggml.*` keys into a [`ModelConfig`], rope scaling included (Llama 3 files
//! carry it as a factor tensor, which is inverted back into the scaling parameters). The common keys are resolved
//! here; what gemma3, phi3, olmo2, smollm3 and granite add lives in `families.rs`.

use super::families::{rotary_dim, with_family_blocks, RopeTensors};
use super::metadata::{GgufArch, Metadata};
use super::GgufVocab;
use crate::engine::model::config::{Llama3RopeScaling, MlpActivation, ModelConfig, NormLayout, RopeScaling};
use crate::engine::Result;
use candle_core::quantized::gguf_file::Content;

/// Llama 3 files carry their rope scaling as precomputed per-frequency factors in this tensor.
pub(super) const ROPE_FREQS: &str = "rope_freqs.weight";

pub(super) fn resolve_config(
    meta: &Metadata,
    arch: &GgufArch,
    content: &Content,
    vocab: &GgufVocab,
    rope_tensors: RopeTensors,
) -> Result<ModelConfig> {
    let key = |name: &str| arch.key(name);
    if let Some(experts) = meta.usize(&key("expert_count"))?.filter(|n| *n > 0) {
        return Err(
            meta.bad(&key("expert_count"), format!("{experts} experts: mixture-of-experts models are not supported"))
        );
    }
    let hidden_size = meta.need_usize(&key("embedding_length"))?;
    let num_attention_heads = meta.need_usize(&key("attention.head_count"))?;
    let num_kv_heads = meta.usize(&key("attention.head_count_kv"))?.unwrap_or(num_attention_heads);
    if num_kv_heads == 0 || num_attention_heads % num_kv_heads != 0 {
        return Err(meta.bad(
            &key("attention.head_count_kv"),
            format!("{num_kv_heads} does not divide attention.head_count {num_attention_heads}"),
        ));
    }
    let head_dim = meta.usize(&key("attention.key_length"))?.unwrap_or(hidden_size / num_attention_heads);
    let rotary_dim = rotary_dim(meta, arch, head_dim)?;
    let vocab_size = vocab.tokens.len();
    if let Some(declared) = meta.usize(&key("vocab_size"))? {
        if declared != vocab_size {
            return Err(
                meta.bad(&key("vocab_size"), format!("{declared} but tokenizer.ggml.tokens has {vocab_size} tokens"))
            );
        }
    }
    let rope_theta = meta.float(&key("rope.freq_base"))?.unwrap_or(10_000.0);
    let rope_scaling = match rope_tensors(ROPE_FREQS) {
        Some(factors) => Some(infer_llama3_rope_scaling(meta, arch, factors, rope_theta, head_dim)?),
        None => linear_rope_scaling(meta, arch)?,
    };
    let has_tensor = |name: &str| content.tensor_infos.contains_key(name);
    let config = ModelConfig {
        architecture: arch.architecture,
        vocab_size,
        hidden_size,
        intermediate_size: meta.need_usize(&key("feed_forward_length"))?,
        num_layers: meta.need_usize(&key("block_count"))?,
        num_attention_heads,
        num_kv_heads,
        head_dim,
        rms_norm_eps: meta.float(&key("attention.layer_norm_rms_epsilon"))?.unwrap_or(1e-5),
        rope_theta,
        rope_scaling,
        max_position_embeddings: meta.usize(&key("context_length"))?.unwrap_or(2048),
        tie_word_embeddings: !has_tensor("output.weight"),
        qkv_bias: has_tensor("blk.0.attn_q.bias"),
        o_bias: has_tensor("blk.0.attn_output.bias"),
        qk_norm: has_tensor("blk.0.attn_q_norm.weight"),
        sliding_window: meta.usize(&key("attention.sliding_window"))?.filter(|w| *w > 0),
        bos_token_id: vocab.bos_id,
        eos_token_ids: vocab.eos_id.into_iter().collect(),
        weights_dtype: content.tensor_infos.get("blk.0.attn_q.weight").map(|i| format!("gguf {:?}", i.ggml_dtype)),
        norm_layout: NormLayout::PreNorm,
        norm_weight_offset: 0.0,
        qk_norm_over_projection: false,
        mlp_activation: MlpActivation::Silu,
        embedding_multiplier: 1.0,
        attention_scale: 1.0 / (head_dim as f64).sqrt(),
        sliding_layers: Vec::new(),
        local_rope_theta: None,
        multimodal: false,
        rotary_dim,
        rope_layers: Vec::new(),
        fused_projections: false,
        residual_multiplier: 1.0,
        logits_scaling: 1.0,
    };
    // Bounded before the family's blocks too: they build per-layer lists.
    crate::engine::model::config::check_config_bounds(&config, meta.path, &|field| gguf_key(arch, field))?;
    let config = with_family_blocks(meta, arch, rope_tensors, config)?;
    crate::engine::model::config::check_config_bounds(&config, meta.path, &|field| gguf_key(arch, field))?;
    Ok(config)
}

/// `rope.scaling.type = linear` (or the older `rope.scale_linear`); any other scaling type is refused.
fn linear_rope_scaling(meta: &Metadata, arch: &GgufArch) -> Result<Option<RopeScaling>> {
    let type_key = arch.key("rope.scaling.type");
    let factor = match meta.string(&type_key)? {
        None | Some("none") => meta.float(&arch.key("rope.scale_linear"))?,
        Some("linear") => meta.float(&arch.key("rope.scaling.factor"))?,
        Some(other) => {
            return Err(meta.bad(&type_key, format!("`{other}` rope scaling is not supported; supported: none, linear")))
        }
    };
    Ok(factor.filter(|f| *f != 1.0 && *f > 0.0).map(|factor| RopeScaling::Linear { factor }))
}

/// llama.cpp stores Llama 3 rope scaling only as the resulting per-frequency divisors. All released Llama 3.x
/// models use low/high frequency factors 1 and 4 over an original context of 8192, so we assume those (the
/// original context from `rope.scaling.original_context_length` when the file has it, as our exports do), take
/// `factor` from the largest divisor, and accept the guess only if it reproduces every stored divisor.
pub(super) fn infer_llama3_rope_scaling(
    meta: &Metadata,
    arch: &GgufArch,
    factors: &[f32],
    theta: f64,
    head_dim: usize,
) -> Result<RopeScaling> {
    let factor = factors.iter().copied().fold(f32::MIN, f32::max) as f64;
    let guess = Llama3RopeScaling {
        factor,
        low_freq_factor: 1.0,
        high_freq_factor: 4.0,
        original_max_position_embeddings: meta
            .usize(&arch.key("rope.scaling.original_context_length"))?
            .unwrap_or(8192),
    };
    let expected = llama3_rope_factors(&guess, theta, head_dim);
    let matches = expected.len() == factors.len()
        && expected.iter().zip(factors).all(|(e, f)| (e - *f as f64).abs() <= 1e-3 * e.abs().max(1.0));
    if !matches {
        return Err(meta.bad(
            ROPE_FREQS,
            "these rope frequency factors are not Llama 3 scaling with low/high factors 1/4 over 8192 positions; \
             this rope scaling is not supported",
        ));
    }
    Ok(RopeScaling::Llama3(guess))
}

/// The divisor llama.cpp's convert script writes for each rope frequency under Llama 3 scaling.
pub(crate) fn llama3_rope_factors(s: &Llama3RopeScaling, theta: f64, head_dim: usize) -> Vec<f64> {
    let original = s.original_max_position_embeddings as f64;
    let low_freq_wavelen = original / s.low_freq_factor;
    let high_freq_wavelen = original / s.high_freq_factor;
    (0..head_dim / 2)
        .map(|i| {
            let freq = 1.0 / theta.powf((2 * i) as f64 / head_dim as f64);
            let wavelen = 2.0 * std::f64::consts::PI / freq;
            if wavelen < high_freq_wavelen {
                1.0
            } else if wavelen > low_freq_wavelen {
                s.factor
            } else {
                let smooth = (original / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
                1.0 / ((1.0 - smooth) / s.factor + smooth)
            }
        })
        .collect()
}

/// The GGUF metadata key behind a config.json field name, for errors about a GGUF file.
fn gguf_key(arch: &GgufArch, field: &str) -> String {
    let key = match field {
        "max_position_embeddings" => "context_length",
        "num_hidden_layers" => "block_count",
        "hidden_size" => "embedding_length",
        "intermediate_size" => "feed_forward_length",
        "num_attention_heads" => "attention.head_count",
        "num_key_value_heads" => "attention.head_count_kv",
        "head_dim" => "attention.key_length",
        "rope_theta" => "rope.freq_base",
        "rms_norm_eps" => "attention.layer_norm_rms_epsilon",
        "rope_scaling.factor" => "rope.scaling.factor",
        "vocab_size" => return "tokenizer.ggml.tokens".into(),
        "bos_token_id" => return "tokenizer.ggml.bos_token_id".into(),
        "eos_token_id" => return "tokenizer.ggml.eos_token_id".into(),
        other => return other.into(),
    };
    arch.key(key)
}
