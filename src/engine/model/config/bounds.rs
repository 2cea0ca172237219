//! Sanity bounds on a resolved [`ModelConfig`], whichever file it came from (config.json or a GGUF header):
//! sizes a file declares are bounded before anything is allocated from them (a context of 10^11 positions
//! would otherwise ask for terabytes of rotary tables), and numbers that cannot be right (a zero rope base, a
//! negative norm epsilon or rope factor, a token id past the vocabulary) are refused instead of quietly
//! producing a different model.

use super::{ModelConfig, RopeScaling};
use crate::engine::{Error, Result};
use std::path::Path;

/// The longest context we accept: 2^21 positions (the longest released models of our families declare about
/// one million). The rotary tables hold every position.
pub const MAX_CONTEXT_POSITIONS: usize = 1 << 21;
/// Decoder layers: the largest released models have under 200.
pub const MAX_LAYERS: usize = 1024;
const MAX_WIDTH: usize = 1 << 20;
const MAX_VOCAB: usize = 1 << 24;
const MAX_HEADS: usize = 1 << 12;

/// Check `cfg` (read from `path`) against the bounds in the module docs; the error names the config.json field
/// as `field_name` spells it in the file (a GGUF names `llama.context_length` where config.json has
/// `max_position_embeddings`).
pub fn check_config_bounds(cfg: &ModelConfig, path: &Path, field_name: &dyn Fn(&str) -> String) -> Result<()> {
    let bad =
        |field: &str, message: String| Error::BadConfig { path: path.to_path_buf(), field: field_name(field), message };
    let sizes = [
        ("max_position_embeddings", cfg.max_position_embeddings, MAX_CONTEXT_POSITIONS),
        ("num_hidden_layers", cfg.num_layers, MAX_LAYERS),
        ("hidden_size", cfg.hidden_size, MAX_WIDTH),
        ("intermediate_size", cfg.intermediate_size, 4 * MAX_WIDTH),
        ("vocab_size", cfg.vocab_size, MAX_VOCAB),
        ("num_attention_heads", cfg.num_attention_heads, MAX_HEADS),
        ("num_key_value_heads", cfg.num_kv_heads, MAX_HEADS),
        ("head_dim", cfg.head_dim, MAX_WIDTH / 16),
    ];
    for (field, value, max) in sizes {
        if value == 0 || value > max {
            return Err(bad(field, format!("{value} is outside 1..={max}; the file is damaged or not a model config")));
        }
    }
    if cfg.rotary_dim == 0 || cfg.rotary_dim > cfg.head_dim || cfg.rotary_dim % 2 != 0 {
        return Err(bad("rotary_dim", format!("{} must be even and within 2..={}", cfg.rotary_dim, cfg.head_dim)));
    }
    positive("rope_theta", cfg.rope_theta, &bad)?;
    if let Some(theta) = cfg.local_rope_theta {
        positive("rope_local_base_freq", theta, &bad)?;
    }
    let eps = cfg.rms_norm_eps;
    if !(eps.is_finite() && eps > 0.0 && eps < 1.0) {
        return Err(bad("rms_norm_eps", format!("{eps} must be a small positive number (typically 1e-5 or 1e-6)")));
    }
    match &cfg.rope_scaling {
        None => {}
        Some(RopeScaling::Linear { factor }) => positive("rope_scaling.factor", *factor, &bad)?,
        Some(RopeScaling::Llama3(s)) => {
            positive("rope_scaling.factor", s.factor, &bad)?;
            positive("rope_scaling.low_freq_factor", s.low_freq_factor, &bad)?;
            positive("rope_scaling.high_freq_factor", s.high_freq_factor, &bad)?;
            if s.high_freq_factor <= s.low_freq_factor {
                return Err(bad(
                    "rope_scaling.high_freq_factor",
                    format!("{} must be above low_freq_factor {}", s.high_freq_factor, s.low_freq_factor),
                ));
            }
            context("rope_scaling.original_max_position_embeddings", s.original_max_position_embeddings, &bad)?;
        }
        Some(RopeScaling::LongRope(s)) => {
            positive("rope_scaling.attention_factor", s.attention_factor, &bad)?;
            context("rope_scaling.original_max_position_embeddings", s.original_max_position_embeddings, &bad)?;
        }
    }
    for id in cfg.bos_token_id.iter().chain(&cfg.eos_token_ids) {
        if *id as usize >= cfg.vocab_size {
            let field = if Some(*id) == cfg.bos_token_id { "bos_token_id" } else { "eos_token_id" };
            return Err(bad(field, format!("token id {id} is past the vocabulary of {} tokens", cfg.vocab_size)));
        }
    }
    Ok(())
}

fn positive(field: &str, value: f64, bad: &impl Fn(&str, String) -> Error) -> Result<()> {
    if value.is_finite() && value > 0.0 {
        return Ok(());
    }
    Err(bad(field, format!("{value} must be a finite number above 0")))
}

fn context(field: &str, value: usize, bad: &impl Fn(&str, String) -> Error) -> Result<()> {
    if value == 0 || value > MAX_CONTEXT_POSITIONS {
        return Err(bad(field, format!("{value} is outside 1..={MAX_CONTEXT_POSITIONS}")));
    }
    Ok(())
}
