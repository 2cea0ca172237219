//! Which GGML type each tensor of a GGUF export gets, following llama.cpp's `llama-quant.cpp` for the types
//! we offer:
//! - 1-D tensors (norms, biases) stay f32, as in every llama.cpp file;
//! - `f16` / `bf16` / `q8_0` / `q6_k`: every 2-D tensor in that type;
//! - `q4_k_m` / `q5_k_m` (llama.cpp's "_M" mixes): Q4_K / Q5_K, except `attn_v` and `ffn_down` of the layers
//!   `use_more_bits` picks (the first and last eighth, and every third layer between) in Q6_K, and the output
//!   matrix (the token embedding when it is tied) in Q6_K;
//! - the output matrix is Q8_0 instead of Q6_K when its rows do not fill 256-wide K-quant blocks;
//! - a tensor whose row length is not a multiple of the block size falls back as llama.cpp does: Q4_K to
//!   Q5_0, Q5_K to Q5_1, Q6_K to Q8_0, and f16 when even a 32-wide block does not fit.

use candle_core::quantized::GgmlDType;

/// The `--quant` choices of a GGUF export.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GgufQuant {
    #[default]
    F16,
    Bf16,
    Q8_0,
    Q4KM,
    Q5KM,
    Q6K,
}

impl GgufQuant {
    pub const ALL: [GgufQuant; 6] = [Self::F16, Self::Bf16, Self::Q8_0, Self::Q4KM, Self::Q5KM, Self::Q6K];

    /// The name users type and llama.cpp prints (`q4_k_m`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::F16 => "f16",
            Self::Bf16 => "bf16",
            Self::Q8_0 => "q8_0",
            Self::Q4KM => "q4_k_m",
            Self::Q5KM => "q5_k_m",
            Self::Q6K => "q6_k",
        }
    }

    /// llama.cpp's `general.file_type` (`LLAMA_FTYPE_MOSTLY_*`).
    pub fn file_type(self) -> u32 {
        match self {
            Self::F16 => 1,
            Self::Q8_0 => 7,
            Self::Q4KM => 15,
            Self::Q5KM => 17,
            Self::Q6K => 18,
            Self::Bf16 => 32,
        }
    }

    /// Whether the file holds block-quantized tensors (it then carries `general.quantization_version`).
    pub fn is_quantized(self) -> bool {
        !matches!(self, Self::F16 | Self::Bf16)
    }

    fn base_type(self) -> GgmlDType {
        match self {
            Self::F16 => GgmlDType::F16,
            Self::Bf16 => GgmlDType::BF16,
            Self::Q8_0 => GgmlDType::Q8_0,
            Self::Q4KM => GgmlDType::Q4K,
            Self::Q5KM => GgmlDType::Q5K,
            Self::Q6K => GgmlDType::Q6K,
        }
    }

    /// The type of the GGUF tensor `gguf_name` with Hugging Face shape `dims` (rows first) in a model of
    /// `num_layers` layers. `tied_output` says the token embedding doubles as the output matrix.
    pub fn tensor_type(self, gguf_name: &str, dims: &[usize], num_layers: usize, tied_output: bool) -> GgmlDType {
        if dims.len() < 2 {
            return GgmlDType::F32;
        }
        let row_len = dims.last().copied().unwrap_or(0);
        let base = self.base_type();
        if !self.is_quantized() {
            return base;
        }
        let is_output = gguf_name == "output.weight" || (tied_output && gguf_name == "token_embd.weight");
        let wanted = if is_output {
            match base {
                GgmlDType::Q8_0 => GgmlDType::Q8_0,
                _ if !row_len.is_multiple_of(GgmlDType::Q6K.block_size()) => GgmlDType::Q8_0,
                _ => GgmlDType::Q6K,
            }
        } else if matches!(self, Self::Q4KM | Self::Q5KM) && self.more_bits(gguf_name, num_layers) {
            GgmlDType::Q6K
        } else {
            base
        };
        fallback(wanted, row_len)
    }

    /// The "_M" rule: `attn_v` and `ffn_down` of the layers llama.cpp's `use_more_bits` picks get Q6_K.
    fn more_bits(self, gguf_name: &str, num_layers: usize) -> bool {
        let Some(rest) = gguf_name.strip_prefix("blk.") else { return false };
        let Some((layer, module)) = rest.split_once('.') else { return false };
        let Ok(layer) = layer.parse::<usize>() else { return false };
        let picked = module.starts_with("attn_v.") || module.starts_with("ffn_down.");
        picked && use_more_bits(layer, num_layers)
    }
}

/// llama.cpp's `use_more_bits(i_layer, n_layers)`.
fn use_more_bits(layer: usize, num_layers: usize) -> bool {
    let eighth = num_layers / 8;
    layer < eighth || layer >= 7 * num_layers / 8 || (layer - eighth) % 3 == 2
}

/// llama.cpp's `tensor_type_fallback`: a type whose blocks tile rows of `row_len`.
fn fallback(wanted: GgmlDType, row_len: usize) -> GgmlDType {
    if row_len.is_multiple_of(wanted.block_size()) {
        return wanted;
    }
    let second = match wanted {
        GgmlDType::Q4K => GgmlDType::Q5_0,
        GgmlDType::Q5K => GgmlDType::Q5_1,
        GgmlDType::Q6K => GgmlDType::Q8_0,
        other => other,
    };
    if row_len.is_multiple_of(second.block_size()) {
        second
    } else {
        GgmlDType::F16
    }
}

impl std::str::FromStr for GgufQuant {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let lower = s.to_ascii_lowercase();
        Self::ALL.into_iter().find(|q| q.as_str() == lower).ok_or_else(|| {
            let names: Vec<&str> = Self::ALL.iter().map(|q| q.as_str()).collect();
            format!("unknown GGUF quantization `{s}`; use one of {}", names.join(", "))
        })
    }
}

impl std::fmt::Display for GgufQuant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_and_unknown_ones_are_refused() {
        for q in GgufQuant::ALL {
            assert_eq!(q.as_str().parse::<GgufQuant>(), Ok(q));
        }
        let err = "q3_k_s".parse::<GgufQuant>().unwrap_err();
        assert!(err.contains("q4_k_m"), "{err}");
    }

    #[test]
    fn medium_mixes_follow_llama_cpp() {
        let q = GgufQuant::Q4KM;
        assert_eq!(q.tensor_type("blk.0.attn_norm.weight", &[576], 30, true), GgmlDType::F32);
        // 30 layers: use_more_bits picks 0..3, 27.., and 3 + 3k + 2.
        assert_eq!(q.tensor_type("blk.0.attn_v.weight", &[192, 512], 30, true), GgmlDType::Q6K);
        assert_eq!(q.tensor_type("blk.5.ffn_down.weight", &[512, 1536], 30, true), GgmlDType::Q6K);
        assert_eq!(q.tensor_type("blk.6.ffn_down.weight", &[512, 1536], 30, true), GgmlDType::Q4K);
        assert_eq!(q.tensor_type("blk.6.attn_q.weight", &[512, 512], 30, true), GgmlDType::Q4K);
        assert_eq!(q.tensor_type("token_embd.weight", &[100, 512], 30, true), GgmlDType::Q6K);
        assert_eq!(q.tensor_type("token_embd.weight", &[100, 512], 30, false), GgmlDType::Q4K);
        // Rows of 576 do not fill 256-wide blocks.
        assert_eq!(q.tensor_type("blk.6.attn_q.weight", &[576, 576], 30, true), GgmlDType::Q5_0);
        assert_eq!(q.tensor_type("token_embd.weight", &[100, 576], 30, true), GgmlDType::Q8_0);
        assert_eq!(GgufQuant::Q5KM.tensor_type("blk.6.attn_q.weight", &[576, 576], 30, true), GgmlDType::Q5_1);
        assert_eq!(GgufQuant::Q6K.tensor_type("blk.6.attn_q.weight", &[64, 64], 2, true), GgmlDType::Q8_0);
        assert_eq!(GgufQuant::Q8_0.tensor_type("blk.6.attn_q.weight", &[64, 48], 2, true), GgmlDType::F16);
        assert_eq!(GgufQuant::Bf16.tensor_type("output.weight", &[64, 48], 2, false), GgmlDType::BF16);
    }
}
