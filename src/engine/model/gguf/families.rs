//! What the `gemma3`, `phi3`, `olmo2`, `smollm3` and `granite` GGUF architectures add to the common resolution of
//! `metadata.rs`, read the way llama.cpp reads them (`src/llama-model.cpp` and `src/models/*.cpp`) from what its
//! convert script writes (`convert_hf_to_gguf.py`: `Gemma3Model`, `Phi3MiniModel`, `Olmo2Model`, `SmolLM3Model`,
//! `GraniteModel`).
//!
//! gemma3: sandwich norms (the stored `1 + w` is undone by the reader, see `arch::norm_weight_shift`), per-head
//! q/k norms, GeGLU, embeddings scaled by `sqrt(hidden)`, tied embeddings. Three things the file does not carry
//! and llama.cpp fixes instead: the score scale is `1 / sqrt(key_length)` (the 62-layer 27B:
//! `1 / sqrt(hidden / heads)`, its `query_pre_attn_scalar`), every 6th layer is global (a file that stores
//! `attention.sliding_window_pattern` says so itself), and the sliding layers rotate with base 10000 without the
//! rope scaling (`rope.freq_base_swa` when the file has it). No `sliding_window` (or 0) means no sliding layers.
//! A file with final-logit soft-capping is refused: we do not implement it.
//!
//! phi3: fused q|k|v and gate|up projections, rotary over `rope.dimension_count` leading dimensions of each head
//! (partial rotary), and LongRoPE: the factors as the tensors `rope_factors_long.weight` /
//! `rope_factors_short.weight`, the original context in `rope.scaling.original_context_length`, the cos/sin
//! multiplier in `rope.scaling.attn_factor`. `sliding_window = 0` is the converter's "none"; any other window is
//! kept as Hugging Face applies it (llama.cpp currently ignores phi3's window).
//!
//! olmo2: norms after each block only (`post_attention_norm`, `post_ffw_norm`), q/k norms over the whole
//! projection (`attn_q_norm` is `heads * head_dim` wide), scores scaled by `1 / sqrt(head_dim)`. A file with
//! `attention.sliding_window` is Olmo 3's (llama.cpp reads both as `olmo2`): refused, as its sliding layers and
//! their own rope are not implemented.
//!
//! smollm3: the file does not say which layers skip rope; llama.cpp fixes it (`n_no_rope_layer_step = 4`: every
//! 4th layer has none), and so do we. llama.cpp reads no sliding window for smollm3 or granite.
//!
//! granite: `embedding_scale`, `residual_scale` and `attention.scale` (each absent or 0: none, i.e. 1, 1 and
//! `1 / sqrt(head_dim)`), `logit_scale` (required, as llama.cpp requires it), and `rope.scaling.finetuned`, which
//! llama.cpp reads as a rope switch (false: no layer rotates).

use super::metadata::{GgufArch, Metadata};
use crate::engine::model::config::{
    Architecture, LongRopeScaling, MlpActivation, ModelConfig, NormLayout, RopeScaling,
};
use crate::engine::Result;
use candle_core::quantized::gguf_file::Value;

/// phi3's LongRoPE factor tensors.
pub(super) const ROPE_FACTORS_LONG: &str = "rope_factors_long.weight";
pub(super) const ROPE_FACTORS_SHORT: &str = "rope_factors_short.weight";

/// llama.cpp's fixed smollm3 value: every 4th layer has no rope.
const SMOLLM3_NO_ROPE_LAYER_STEP: usize = 4;

/// llama.cpp's fixed gemma3 values: every 6th layer global, the sliding layers' rope base.
const GEMMA3_SWA_PATTERN: usize = 6;
const GEMMA3_LOCAL_ROPE_BASE: f64 = 10_000.0;

/// Factor tensors read from the file, by name, for the families that keep rope parameters in tensors.
pub(super) type RopeTensors<'a> = &'a dyn Fn(&str) -> Option<&'a [f32]>;

/// Rotary dimensions of each head: `rope.dimension_count`, which only phi3 may set below `head_dim`.
pub(super) fn rotary_dim(meta: &Metadata, arch: &GgufArch, head_dim: usize) -> Result<usize> {
    let key = arch.key("rope.dimension_count");
    let Some(dims) = meta.usize(&key)? else { return Ok(head_dim) };
    if dims == head_dim {
        return Ok(dims);
    }
    if arch.architecture != Architecture::Phi3 {
        return Err(meta.bad(
            &key,
            format!("rope over {dims} of {head_dim} head dimensions (partial rotary) is supported for phi3 only"),
        ));
    }
    if dims == 0 || dims > head_dim || !dims.is_multiple_of(2) {
        return Err(meta.bad(&key, format!("{dims} rotary dimensions of head_dim {head_dim}; need an even count > 0")));
    }
    Ok(dims)
}

/// The family's blocks on top of the common resolution.
pub(super) fn with_family_blocks(
    meta: &Metadata,
    arch: &GgufArch,
    rope_tensors: RopeTensors,
    mut c: ModelConfig,
) -> Result<ModelConfig> {
    match arch.architecture {
        Architecture::Gemma3 => {
            for softcap in ["final_logit_softcapping", "attn_logit_softcapping"] {
                let key = arch.key(softcap);
                if meta.float(&key)?.is_some_and(|v| v != 0.0) {
                    return Err(meta.bad(&key, "logit soft-capping is not implemented (gemma3 files leave it out)"));
                }
            }
            if meta.float(&arch.key("attention.layer_norm_rms_epsilon"))?.is_none() {
                c.rms_norm_eps = 1e-6;
            }
            c.norm_layout = NormLayout::Sandwich;
            c.norm_weight_offset = 1.0;
            c.qk_norm = true;
            c.mlp_activation = MlpActivation::GeluTanh;
            c.embedding_multiplier = (c.hidden_size as f64).sqrt();
            c.attention_scale = if c.num_layers == 62 {
                1.0 / ((c.hidden_size / c.num_attention_heads) as f64).sqrt()
            } else {
                1.0 / (c.head_dim as f64).sqrt()
            };
            c.sliding_layers = gemma3_sliding_layers(meta, arch, c.num_layers)?;
            c.local_rope_theta = Some(meta.float(&arch.key("rope.freq_base_swa"))?.unwrap_or(GEMMA3_LOCAL_ROPE_BASE));
        }
        Architecture::Olmo2 => {
            if c.sliding_window.is_some() {
                return Err(meta.bad(
                    &arch.key("attention.sliding_window"),
                    "sliding-window layers (Olmo 3) are not supported; Olmo 2 files have no window",
                ));
            }
            c.norm_layout = NormLayout::PostNorm;
            c.qk_norm_over_projection = true;
        }
        Architecture::SmolLM3 => {
            c.sliding_window = None;
            c.rope_layers = (0..c.num_layers).map(|i| (i + 1) % SMOLLM3_NO_ROPE_LAYER_STEP != 0).collect();
        }
        Architecture::Granite => granite_multipliers(meta, arch, &mut c)?,
        Architecture::Phi3 => {
            c.fused_projections = true;
            if let Some(long_rope) = phi3_long_rope(meta, arch, rope_tensors, &c)? {
                c.rope_scaling = Some(RopeScaling::LongRope(long_rope));
            }
        }
        _ => {}
    }
    Ok(c)
}

/// granite's multipliers and rope switch (see the module docs).
fn granite_multipliers(meta: &Metadata, arch: &GgufArch, c: &mut ModelConfig) -> Result<()> {
    let scale = |name: &str| -> Result<Option<f64>> {
        let key = arch.key(name);
        match meta.float(&key)? {
            Some(v) if !v.is_finite() => Err(meta.bad(&key, format!("{v} must be finite"))),
            Some(v) => Ok(Some(v).filter(|v| *v != 0.0)),
            None => Ok(None),
        }
    };
    c.sliding_window = None;
    c.embedding_multiplier = scale("embedding_scale")?.unwrap_or(1.0);
    c.residual_multiplier = scale("residual_scale")?.unwrap_or(1.0);
    if let Some(attention_scale) = scale("attention.scale")? {
        c.attention_scale = attention_scale;
    }
    let logit_key = arch.key("logit_scale");
    c.logits_scaling = scale("logit_scale")?
        .ok_or_else(|| meta.bad(&logit_key, "missing or 0; granite files carry it (llama.cpp requires it)"))?;
    if meta.bool(&arch.key("rope.scaling.finetuned"))? == Some(false) {
        c.rope_layers = vec![false; c.num_layers];
    }
    Ok(())
}

/// Which layers slide: `attention.sliding_window_pattern` (per layer, or every n-th layer global) when the file
/// has it, else llama.cpp's every 6th layer global.
fn gemma3_sliding_layers(meta: &Metadata, arch: &GgufArch, num_layers: usize) -> Result<Vec<bool>> {
    let key = arch.key("attention.sliding_window_pattern");
    let pattern = match meta.map.get(&key) {
        Some(Value::Array(flags)) => {
            let flags: Option<Vec<bool>> =
                flags.iter().map(|v| if let Value::Bool(b) = v { Some(*b) } else { None }).collect();
            return match flags {
                Some(flags) if flags.len() == num_layers => Ok(flags),
                _ => Err(meta.bad(&key, format!("expected {num_layers} booleans, one per layer"))),
            };
        }
        Some(_) => meta.usize(&key)?.filter(|n| *n > 0).ok_or_else(|| meta.bad(&key, "must be at least 1"))?,
        None => GEMMA3_SWA_PATTERN,
    };
    Ok((0..num_layers).map(|i| (i + 1) % pattern != 0).collect())
}

/// LongRoPE from the factor tensors; `None` when the file has none (a model without rope scaling).
fn phi3_long_rope(
    meta: &Metadata,
    arch: &GgufArch,
    rope_tensors: RopeTensors,
    c: &ModelConfig,
) -> Result<Option<LongRopeScaling>> {
    let (long, short) = match (rope_tensors(ROPE_FACTORS_LONG), rope_tensors(ROPE_FACTORS_SHORT)) {
        (None, None) => return Ok(None),
        (Some(long), Some(short)) => (long, short),
        _ => return Err(meta.bad(ROPE_FACTORS_LONG, "LongRoPE needs both rope_factors_long and rope_factors_short")),
    };
    let want = c.rotary_dim / 2;
    for (name, factors) in [(ROPE_FACTORS_LONG, long), (ROPE_FACTORS_SHORT, short)] {
        if factors.len() != want || !factors.iter().all(|f| f.is_finite() && *f > 0.0) {
            return Err(meta.bad(name, format!("need {want} positive factors (rope.dimension_count / 2)")));
        }
    }
    let original_key = arch.key("rope.scaling.original_context_length");
    let original = meta.usize(&original_key)?.filter(|n| *n > 0).ok_or_else(|| {
        meta.bad(&original_key, "LongRoPE factors need the original context length; missing from the GGUF metadata")
    })?;
    // transformers' `_compute_longrope_parameters` when the converter did not record the multiplier.
    let scale = c.max_position_embeddings as f64 / original as f64;
    let computed = if scale > 1.0 { (1.0 + scale.ln() / (original as f64).ln()).sqrt() } else { 1.0 };
    let widen = |v: &[f32]| v.iter().map(|x| *x as f64).collect::<Vec<f64>>();
    Ok(Some(LongRopeScaling {
        short_factor: widen(short),
        long_factor: widen(long),
        original_max_position_embeddings: original,
        attention_factor: meta.float(&arch.key("rope.scaling.attn_factor"))?.unwrap_or(computed),
    }))
}
