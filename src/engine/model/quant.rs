//! The base-quantization choice (`--quantize`, the studio's "Base weights" choice): whether the frozen
//! projections of the base model are held dense or as GGML-quantized blocks (QLoRA), which GGML type a
//! requested quantization becomes for a projection whose rows do not fill that type's blocks, and how many
//! bytes a weight costs in each type (what the one memory estimate uses).
//!
//! With a quantized base the decoder layers' linear projections take the requested type, and the vocabulary
//! matrices (token embeddings and the LM head, `vocab_matrix.rs`) take [`vocab_type`]: llama.cpp's Q4_K_M mix
//! (a 6-bit head, because every logit reads it; 4-bit embeddings), or 8 bits with `q8_0` and `keep`. Norms
//! stay dense.

use candle_core::quantized::GgmlDType;

/// How the base model's linear weights are held in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize)]
pub enum BaseQuant {
    /// Dense in the compute dtype (a GGUF is dequantized at load): today's behaviour.
    #[default]
    #[serde(rename = "none")]
    None,
    /// A GGUF's linears keep the file's own quantized types (Q4_0, Q4_1, Q4_K, Q5_K, Q6_K, Q8_0, ...);
    /// dense files (safetensors, an f16 GGUF) stay dense.
    #[serde(rename = "keep")]
    Keep,
    #[serde(rename = "q4_0")]
    Q4_0,
    #[serde(rename = "q4_1")]
    Q4_1,
    #[serde(rename = "q4k")]
    Q4K,
    #[serde(rename = "q5k")]
    Q5K,
    #[serde(rename = "q6k")]
    Q6K,
    #[serde(rename = "q8_0")]
    Q8_0,
}

impl BaseQuant {
    /// Every choice, in the order a front end lists them.
    pub const ALL: [BaseQuant; 8] = [
        BaseQuant::None,
        BaseQuant::Keep,
        BaseQuant::Q8_0,
        BaseQuant::Q6K,
        BaseQuant::Q5K,
        BaseQuant::Q4K,
        BaseQuant::Q4_1,
        BaseQuant::Q4_0,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            BaseQuant::None => "none",
            BaseQuant::Keep => "keep",
            BaseQuant::Q4_0 => "q4_0",
            BaseQuant::Q4_1 => "q4_1",
            BaseQuant::Q4K => "q4k",
            BaseQuant::Q5K => "q5k",
            BaseQuant::Q6K => "q6k",
            BaseQuant::Q8_0 => "q8_0",
        }
    }

    /// The GGML type a quantize-at-load choice asks for (None for `none` and `keep`).
    pub fn target_type(self) -> Option<GgmlDType> {
        match self {
            BaseQuant::None | BaseQuant::Keep => None,
            BaseQuant::Q4_0 => Some(GgmlDType::Q4_0),
            BaseQuant::Q4_1 => Some(GgmlDType::Q4_1),
            BaseQuant::Q4K => Some(GgmlDType::Q4K),
            BaseQuant::Q5K => Some(GgmlDType::Q5K),
            BaseQuant::Q6K => Some(GgmlDType::Q6K),
            BaseQuant::Q8_0 => Some(GgmlDType::Q8_0),
        }
    }

    /// Whether any linear may end up quantized.
    pub fn is_quantized(self) -> bool {
        self != BaseQuant::None
    }
}

impl std::fmt::Display for BaseQuant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for BaseQuant {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let wanted = s.trim().to_ascii_lowercase().replace(['-', '_'], "");
        BaseQuant::ALL.into_iter().find(|q| q.as_str().replace('_', "") == wanted).ok_or_else(|| {
            format!("unknown base quantization `{s}`; use none, keep, q8_0, q6k, q5k, q4k, q4_1 or q4_0")
        })
    }
}

/// The type a row of `row_len` weights is quantized to when `wanted` is asked for: `wanted` when the row
/// fills its blocks, else llama.cpp's fallback for K-quants (256-weight blocks) to a 32-weight type of at
/// least as many bits (Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0), else None (the weight stays dense).
pub fn fitting_type(wanted: GgmlDType, row_len: usize) -> Option<GgmlDType> {
    let fallback = match wanted {
        GgmlDType::Q4K => Some(GgmlDType::Q5_0),
        GgmlDType::Q5K => Some(GgmlDType::Q5_1),
        GgmlDType::Q6K => Some(GgmlDType::Q8_0),
        _ => None,
    };
    [Some(wanted), fallback].into_iter().flatten().find(|t| row_len > 0 && row_len.is_multiple_of(t.block_size()))
}

/// Which vocabulary matrix: the token embeddings (read by row) or the LM head (every logit reads it). Tied
/// embeddings are the head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VocabRole {
    Embeddings,
    Head,
}

/// The type a vocabulary matrix (`vocab_matrix.rs`) of rows of `hidden` values is held in under `quant`, as
/// llama.cpp's Q4_K_M mix holds them: with a base of 6 bits or fewer quantized at load, the head in Q6_K and
/// the (untied) embeddings in Q4_K; with `q8_0`, and with `keep` on a file whose projections are quantized
/// (`file_quantized`), both in Q8_0, which decoding on the CPU reads through our single-row Q8_0 kernel
/// (`qgemv.rs`). A row that does not fill a K-quant's 256-weight blocks takes its 32-weight fallback
/// ([`fitting_type`]: Q6_K -> Q8_0, Q4_K -> Q5_0). None (dense) without a quantized base.
pub fn vocab_type(quant: BaseQuant, role: VocabRole, hidden: usize, file_quantized: bool) -> Option<GgmlDType> {
    let wanted = match (quant, role) {
        (BaseQuant::None, _) => return None,
        (BaseQuant::Keep, _) if !file_quantized => return None,
        (BaseQuant::Keep | BaseQuant::Q8_0, _) => GgmlDType::Q8_0,
        (_, VocabRole::Head) => GgmlDType::Q6K,
        (_, VocabRole::Embeddings) => GgmlDType::Q4K,
    };
    fitting_type(wanted, hidden)
}

/// Bytes per weight of a GGML type (4.5 bits for Q4_0 is 0.5625 bytes).
pub fn bytes_per_weight(t: GgmlDType) -> f64 {
    t.type_size() as f64 / t.block_size() as f64
}

/// Whether a GGML type is a block quantization (not f32/f16/bf16, which load dense).
pub fn is_block_quantized(t: GgmlDType) -> bool {
    !matches!(t, GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16)
}

/// A short lowercase name for a GGML type (`q4_1`, `q4k`).
pub fn type_name(t: GgmlDType) -> String {
    format!("{t:?}").to_lowercase()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vocabulary_matrices_take_llama_cpp_s_q4_k_m_mix() {
        use VocabRole::{Embeddings, Head};
        assert_eq!(vocab_type(BaseQuant::Q4K, Head, 4096, false), Some(GgmlDType::Q6K));
        assert_eq!(vocab_type(BaseQuant::Q4K, Embeddings, 4096, false), Some(GgmlDType::Q4K));
        assert_eq!(vocab_type(BaseQuant::Q6K, Embeddings, 2048, false), Some(GgmlDType::Q4K));
        // SmolLM2's 576-wide rows fill no 256-weight block: the 32-weight fallbacks.
        assert_eq!(vocab_type(BaseQuant::Q4_0, Head, 576, false), Some(GgmlDType::Q8_0));
        assert_eq!(vocab_type(BaseQuant::Q4_1, Embeddings, 576, false), Some(GgmlDType::Q5_0));
        assert_eq!(vocab_type(BaseQuant::Q8_0, Embeddings, 4096, false), Some(GgmlDType::Q8_0));
        assert_eq!(vocab_type(BaseQuant::Keep, Head, 576, true), Some(GgmlDType::Q8_0));
        assert_eq!(vocab_type(BaseQuant::Keep, Embeddings, 576, false), None);
        assert_eq!(vocab_type(BaseQuant::None, Head, 4096, true), None);
        assert_eq!(vocab_type(BaseQuant::Q4K, Head, 100, false), None);
    }

    #[test]
    fn names_parse_both_ways() {
        for q in BaseQuant::ALL {
            assert_eq!(q.as_str().parse::<BaseQuant>().unwrap(), q);
        }
        assert_eq!("Q4_K".parse::<BaseQuant>().unwrap(), BaseQuant::Q4K);
        assert_eq!("q8-0".parse::<BaseQuant>().unwrap(), BaseQuant::Q8_0);
        assert!("q3k".parse::<BaseQuant>().unwrap_err().contains("q4k"));
        assert_eq!(serde_json::to_string(&BaseQuant::Q4K).unwrap(), "\"q4k\"");
    }

    #[test]
    fn rows_that_do_not_fill_a_block_fall_back() {
        assert_eq!(fitting_type(GgmlDType::Q4K, 512), Some(GgmlDType::Q4K));
        assert_eq!(fitting_type(GgmlDType::Q4K, 576), Some(GgmlDType::Q5_0));
        assert_eq!(fitting_type(GgmlDType::Q6K, 64), Some(GgmlDType::Q8_0));
        assert_eq!(fitting_type(GgmlDType::Q8_0, 48), None);
        assert!((bytes_per_weight(GgmlDType::Q4_0) - 0.5625).abs() < 1e-9);
        assert!((bytes_per_weight(GgmlDType::Q8_0) - 1.0625).abs() < 1e-9);
    }
}
