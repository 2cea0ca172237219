//! Model configuration: the raw Hugging Face `config.json` as serde reads it, and the resolved
//! [`ModelConfig`] the transformer is built from (defaults filled in, architecture quirks made explicit).

use crate::engine::{Error, Result};
use serde::Deserialize;
use std::path::Path;

/// The Llama-family variants we implement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Architecture {
    Llama,
    Mistral,
    Qwen2,
    Qwen3,
}

impl Architecture {
    pub const SUPPORTED: &'static str = "llama, mistral, qwen2, qwen3";

    pub fn from_model_type(model_type: &str) -> Option<Self> {
        match model_type {
            "llama" => Some(Self::Llama),
            "mistral" => Some(Self::Mistral),
            "qwen2" => Some(Self::Qwen2),
            "qwen3" => Some(Self::Qwen3),
            _ => None,
        }
    }

    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Llama => "llama",
            Self::Mistral => "mistral",
            Self::Qwen2 => "qwen2",
            Self::Qwen3 => "qwen3",
        }
    }
}

/// Llama 3 style frequency-dependent rope scaling.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Llama3RopeScaling {
    pub factor: f64,
    pub low_freq_factor: f64,
    pub high_freq_factor: f64,
    pub original_max_position_embeddings: usize,
}

/// Rope variants beyond the plain one.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub enum RopeScaling {
    Llama3(Llama3RopeScaling),
    /// Positions divided by `factor` ("linear" in transformers).
    Linear {
        factor: f64,
    },
}

/// Everything the transformer needs, resolved.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ModelConfig {
    pub architecture: Architecture,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_attention_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub rope_scaling: Option<RopeScaling>,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    /// Biases on q/k/v projections (always on for qwen2).
    pub qkv_bias: bool,
    /// Bias on the output projection (llama's `attention_bias` covers it too).
    pub o_bias: bool,
    /// Per-head RMS norms on queries and keys before rope (qwen3).
    pub qk_norm: bool,
    pub sliding_window: Option<usize>,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
    /// The dtype the weights were saved in, as the config names it (informational).
    pub weights_dtype: Option<String>,
}

/// `eos_token_id` is an int in some configs and a list in others.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany {
    One(u32),
    Many(Vec<u32>),
}

impl OneOrMany {
    pub fn to_vec(&self) -> Vec<u32> {
        match self {
            Self::One(x) => vec![*x],
            Self::Many(v) => v.clone(),
        }
    }
}

/// `config.json` exactly as Hugging Face writes it (only the fields we use).
#[derive(Debug, Clone, Deserialize)]
pub struct RawConfig {
    pub model_type: Option<String>,
    pub vocab_size: Option<usize>,
    pub hidden_size: Option<usize>,
    pub intermediate_size: Option<usize>,
    pub num_hidden_layers: Option<usize>,
    pub num_attention_heads: Option<usize>,
    pub num_key_value_heads: Option<usize>,
    pub head_dim: Option<usize>,
    pub rms_norm_eps: Option<f64>,
    pub rope_theta: Option<f64>,
    pub rope_scaling: Option<serde_json::Value>,
    /// transformers 5 folds theta and scaling into one object.
    pub rope_parameters: Option<serde_json::Value>,
    pub max_position_embeddings: Option<usize>,
    pub tie_word_embeddings: Option<bool>,
    pub attention_bias: Option<bool>,
    pub sliding_window: Option<usize>,
    pub use_sliding_window: Option<bool>,
    pub bos_token_id: Option<u32>,
    pub eos_token_id: Option<OneOrMany>,
    pub torch_dtype: Option<String>,
    pub dtype: Option<String>,
    pub hidden_act: Option<String>,
}

impl RawConfig {
    pub fn from_file(path: &Path) -> Result<Self> {
        crate::engine::error::read_json(path)
    }

    /// Fill defaults the way transformers does for each architecture and check what must be present.
    pub fn resolve(&self, path: &Path) -> Result<ModelConfig> {
        let model_type = self.model_type.clone().unwrap_or_default();
        let architecture =
            Architecture::from_model_type(&model_type).ok_or_else(|| Error::UnsupportedArchitecture {
                found: if model_type.is_empty() { "(no model_type)".into() } else { model_type.clone() },
                path: path.to_path_buf(),
                supported: Architecture::SUPPORTED.into(),
            })?;
        let need = |v: Option<usize>, field: &str| -> Result<usize> {
            match v {
                Some(x) if x > 0 => Ok(x),
                _ => Err(Error::BadConfig {
                    path: path.to_path_buf(),
                    field: field.into(),
                    message: "missing or zero".into(),
                }),
            }
        };
        let hidden_size = need(self.hidden_size, "hidden_size")?;
        let num_attention_heads = need(self.num_attention_heads, "num_attention_heads")?;
        let num_kv_heads = self.num_key_value_heads.unwrap_or(num_attention_heads);
        if num_kv_heads == 0 || num_attention_heads % num_kv_heads != 0 {
            return Err(Error::BadConfig {
                path: path.to_path_buf(),
                field: "num_key_value_heads".into(),
                message: format!("{num_kv_heads} does not divide num_attention_heads {num_attention_heads}"),
            });
        }
        let head_dim = self.head_dim.unwrap_or(hidden_size / num_attention_heads);
        if let Some(act) = &self.hidden_act {
            if act != "silu" && act != "swish" {
                return Err(Error::BadConfig {
                    path: path.to_path_buf(),
                    field: "hidden_act".into(),
                    message: format!("`{act}` is not supported; only silu"),
                });
            }
        }
        let (rope_theta, rope_scaling) = self.resolve_rope(path)?;
        let sliding_window = match architecture {
            Architecture::Mistral => self.sliding_window,
            Architecture::Qwen2 | Architecture::Qwen3 if self.use_sliding_window == Some(true) => self.sliding_window,
            _ => None,
        };
        let attention_bias = self.attention_bias.unwrap_or(false);
        Ok(ModelConfig {
            architecture,
            vocab_size: need(self.vocab_size, "vocab_size")?,
            hidden_size,
            intermediate_size: need(self.intermediate_size, "intermediate_size")?,
            num_layers: need(self.num_hidden_layers, "num_hidden_layers")?,
            num_attention_heads,
            num_kv_heads,
            head_dim,
            rms_norm_eps: self.rms_norm_eps.unwrap_or(1e-6),
            rope_theta,
            rope_scaling,
            max_position_embeddings: self.max_position_embeddings.unwrap_or(2048),
            tie_word_embeddings: self.tie_word_embeddings.unwrap_or(false),
            qkv_bias: match architecture {
                Architecture::Qwen2 => true,
                _ => attention_bias,
            },
            o_bias: match architecture {
                Architecture::Llama => attention_bias,
                _ => false,
            },
            qk_norm: architecture == Architecture::Qwen3,
            sliding_window,
            bos_token_id: self.bos_token_id,
            eos_token_ids: self.eos_token_id.as_ref().map(|e| e.to_vec()).unwrap_or_default(),
            weights_dtype: self.torch_dtype.clone().or_else(|| self.dtype.clone()),
        })
    }

    fn resolve_rope(&self, path: &Path) -> Result<(f64, Option<RopeScaling>)> {
        let params = self.rope_parameters.as_ref();
        let theta = self
            .rope_theta
            .or_else(|| params.and_then(|p| p.get("rope_theta")).and_then(|v| v.as_f64()))
            .unwrap_or(10_000.0);
        let scaling = self.rope_scaling.as_ref().filter(|v| !v.is_null()).or(params);
        let Some(scaling) = scaling else {
            return Ok((theta, None));
        };
        let kind =
            scaling.get("rope_type").or_else(|| scaling.get("type")).and_then(|v| v.as_str()).unwrap_or("default");
        let num = |field: &str| -> Result<f64> {
            scaling.get(field).and_then(|v| v.as_f64()).ok_or_else(|| Error::BadConfig {
                path: path.to_path_buf(),
                field: format!("rope_scaling.{field}"),
                message: "missing".into(),
            })
        };
        let resolved = match kind {
            "default" => None,
            "linear" => Some(RopeScaling::Linear { factor: num("factor")? }),
            "llama3" => Some(RopeScaling::Llama3(Llama3RopeScaling {
                factor: num("factor")?,
                low_freq_factor: num("low_freq_factor")?,
                high_freq_factor: num("high_freq_factor")?,
                original_max_position_embeddings: num("original_max_position_embeddings")? as usize,
            })),
            other => {
                return Err(Error::BadConfig {
                    path: path.to_path_buf(),
                    field: "rope_scaling.rope_type".into(),
                    message: format!("`{other}` is not supported; supported: default, linear, llama3"),
                })
            }
        };
        Ok((theta, resolved))
    }
}

impl ModelConfig {
    /// Parameter count of the base model (embeddings counted once when tied).
    pub fn parameter_count(&self) -> usize {
        let h = self.hidden_size;
        let q = self.num_attention_heads * self.head_dim;
        let kv = self.num_kv_heads * self.head_dim;
        let mut attn = h * q + 2 * h * kv + q * h;
        if self.qkv_bias {
            attn += q + 2 * kv;
        }
        if self.o_bias {
            attn += h;
        }
        if self.qk_norm {
            attn += 2 * self.head_dim;
        }
        let mlp = 3 * h * self.intermediate_size;
        let norms = 2 * h;
        let embed = self.vocab_size * h;
        let head = if self.tie_word_embeddings { 0 } else { embed };
        self.num_layers * (attn + mlp + norms) + embed + head + h
    }

    /// (in_features, out_features) of a named linear in every decoder layer.
    pub fn linear_shape(&self, module: &str) -> Option<(usize, usize)> {
        let h = self.hidden_size;
        let q = self.num_attention_heads * self.head_dim;
        let kv = self.num_kv_heads * self.head_dim;
        let i = self.intermediate_size;
        Some(match module {
            "q_proj" => (h, q),
            "k_proj" | "v_proj" => (h, kv),
            "o_proj" => (q, h),
            "gate_proj" | "up_proj" => (h, i),
            "down_proj" => (i, h),
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsupported_model_type_lists_supported_ones() {
        let raw: RawConfig = serde_json::from_str(r#"{"model_type":"gpt2","hidden_size":8}"#).unwrap();
        let err = raw.resolve(Path::new("x/config.json")).unwrap_err().to_string();
        assert!(err.contains("gpt2") && err.contains("qwen3") && err.contains("x/config.json"), "{err}");
    }

    #[test]
    fn eos_list_and_llama3_rope_are_resolved() {
        let raw: RawConfig = serde_json::from_str(
            r#"{"model_type":"llama","vocab_size":10,"hidden_size":8,"intermediate_size":16,
            "num_hidden_layers":1,"num_attention_heads":2,"eos_token_id":[3,4],
            "rope_scaling":{"rope_type":"llama3","factor":8.0,"low_freq_factor":1.0,
            "high_freq_factor":4.0,"original_max_position_embeddings":64}}"#,
        )
        .unwrap();
        let cfg = raw.resolve(Path::new("config.json")).unwrap();
        assert_eq!(cfg.eos_token_ids, vec![3, 4]);
        assert_eq!(cfg.num_kv_heads, 2);
        assert_eq!(cfg.head_dim, 4);
        assert!(matches!(cfg.rope_scaling, Some(RopeScaling::Llama3(_))));
    }
}
