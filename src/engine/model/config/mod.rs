//! Model configuration: the raw Hugging Face `config.json` as serde reads it, and the resolved
//! [`ModelConfig`] the transformer is built from (defaults filled in, architecture quirks made explicit).

use crate::engine::{Error, Result};
use serde::Deserialize;
use std::path::Path;

mod bounds;
mod families;
mod hf_json;
mod rope;

pub use bounds::{check_config_bounds, MAX_CONTEXT_POSITIONS};
pub use families::LongRopeScaling;

/// The Llama-family variants we implement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Architecture {
    Llama,
    Mistral,
    Qwen2,
    Qwen3,
    /// Gemma 3's text model (`gemma3_text`, or the text tower of a multimodal `gemma3` checkpoint): (1 + w) RMS
    /// norms before and after each block, GeGLU (gelu tanh), scaled embeddings, per-head q/k norms, sliding and
    /// global layers with their own rope bases.
    Gemma3,
    /// OLMo 2: no pre-norms, RMS norms on each block's output before its residual add, q/k RMS norms over the
    /// whole projection.
    Olmo2,
    /// Phi-3 / Phi-3.5 / Phi-4-mini: fused `qkv_proj` and `gate_up_proj`, partial rotary, LongRoPE.
    Phi3,
    /// Llama with no rotary embedding on some layers (`no_rope_layers`).
    SmolLM3,
    /// Llama with embedding, residual, attention and logits multipliers.
    Granite,
}

impl Architecture {
    pub const SUPPORTED: &'static str =
        "llama, mistral, qwen2, qwen3, gemma3_text (and gemma3's text tower), olmo2, phi3, smollm3, granite";

    pub fn from_model_type(model_type: &str) -> Option<Self> {
        match model_type {
            "llama" => Some(Self::Llama),
            "mistral" => Some(Self::Mistral),
            "qwen2" => Some(Self::Qwen2),
            "qwen3" => Some(Self::Qwen3),
            "gemma3_text" | "gemma3" => Some(Self::Gemma3),
            "olmo2" => Some(Self::Olmo2),
            "phi3" => Some(Self::Phi3),
            "smollm3" => Some(Self::SmolLM3),
            "granite" => Some(Self::Granite),
            _ => None,
        }
    }

    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Llama => "llama",
            Self::Mistral => "mistral",
            Self::Qwen2 => "qwen2",
            Self::Qwen3 => "qwen3",
            Self::Gemma3 => "gemma3_text",
            Self::Olmo2 => "olmo2",
            Self::Phi3 => "phi3",
            Self::SmolLM3 => "smollm3",
            Self::Granite => "granite",
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
    /// Phi-3's LongRoPE ("longrope" in transformers): per-frequency divisors, `short_factor` while a forward's
    /// last position is below `original_max_position_embeddings`, `long_factor` beyond it, and cos/sin
    /// multiplied by `attention_factor`.
    LongRope(LongRopeScaling),
}

/// Where a decoder layer applies its RMS norms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum NormLayout {
    /// Before attention (`input_layernorm`) and before the MLP (`post_attention_layernorm`): llama and kin.
    PreNorm,
    /// Before and after each block (`input_layernorm`, `post_attention_layernorm` on the attention output,
    /// `pre_feedforward_layernorm`, `post_feedforward_layernorm` on the MLP output): gemma3.
    Sandwich,
    /// After each block only, before its residual add (`post_attention_layernorm`, `post_feedforward_layernorm`):
    /// olmo2.
    PostNorm,
}

/// Where one of a decoder layer's RMS norms applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NormSite {
    AttentionInput,
    AttentionOutput,
    MlpInput,
    MlpOutput,
}

impl NormLayout {
    /// Whether a norm follows the MLP (its backward then reads the MLP's output).
    pub fn norms_mlp_output(self) -> bool {
        self.norms().iter().any(|(site, _)| *site == NormSite::MlpOutput)
    }

    /// The layer's norms in the order it applies them, with their Hugging Face names (under `model.layers.N.`).
    pub fn norms(self) -> &'static [(NormSite, &'static str)] {
        use NormSite::*;
        match self {
            Self::PreNorm => &[(AttentionInput, "input_layernorm"), (MlpInput, "post_attention_layernorm")],
            Self::Sandwich => &[
                (AttentionInput, "input_layernorm"),
                (AttentionOutput, "post_attention_layernorm"),
                (MlpInput, "pre_feedforward_layernorm"),
                (MlpOutput, "post_feedforward_layernorm"),
            ],
            Self::PostNorm => {
                &[(AttentionOutput, "post_attention_layernorm"), (MlpOutput, "post_feedforward_layernorm")]
            }
        }
    }
}

/// The activation of the MLP's gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum MlpActivation {
    /// SwiGLU: `silu(gate) * up`.
    Silu,
    /// GeGLU with the tanh approximation of gelu (`gelu_pytorch_tanh`): gemma3.
    GeluTanh,
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
    /// Where each decoder layer applies its RMS norms.
    pub norm_layout: NormLayout,
    /// Every RMS norm of the model (layers, q/k norms, final norm) multiplies by `norm_weight_offset + w`:
    /// 1.0 for gemma3 (its checkpoints store w with the 1 taken out), 0.0 elsewhere.
    pub norm_weight_offset: f64,
    /// With `qk_norm`: the q and k norms span the whole projection (`heads * head_dim` wide, before the split
    /// into heads: olmo2) instead of each head (`head_dim` wide: qwen3, gemma3).
    pub qk_norm_over_projection: bool,
    /// The activation of the MLP's gate.
    pub mlp_activation: MlpActivation,
    /// Token embeddings are multiplied by this, rounded to the model dtype first (gemma3: `sqrt(hidden_size)`,
    /// as transformers does; granite: `embedding_multiplier`; 1.0 elsewhere).
    pub embedding_multiplier: f64,
    /// The attention score scale: gemma3's `query_pre_attn_scalar ** -0.5`, granite's `attention_multiplier`
    /// (default 1), else `1 / sqrt(head_dim)`.
    pub attention_scale: f64,
    /// Per layer, whether it attends through `sliding_window` (gemma3's `layer_types`, or the older
    /// `sliding_window_pattern`). Empty means every layer does when `sliding_window` is set (mistral).
    pub sliding_layers: Vec<bool>,
    /// The rope base of the sliding layers (gemma3's `rope_local_base_freq`, applied without `rope_scaling`);
    /// None: every layer rotates with `rope_theta` and `rope_scaling`.
    pub local_rope_theta: Option<f64>,
    /// The config is a multimodal checkpoint's (`text_config` inside): only its text tower is loaded, the
    /// vision tower and projector weights are ignored (a notice says so).
    pub multimodal: bool,
    /// Leading dimensions of each head that the rotary embedding turns (even; `head_dim` unless phi3's
    /// `partial_rotary_factor` < 1); the rest pass through unrotated.
    pub rotary_dim: usize,
    /// Per layer, whether it applies the rotary embedding (smollm3's `no_rope_layers[i] == 0`: no rope, "NoPE").
    /// Empty means every layer does.
    pub rope_layers: Vec<bool>,
    /// q|k|v and gate|up are single fused projections in the checkpoint and for LoRA (phi3's `qkv_proj`,
    /// `gate_up_proj`; the GGUF reader's `attn_qkv` and phi3 `ffn_up`). The fused gate_up holds gate rows
    /// first, then up.
    pub fused_projections: bool,
    /// Granite's multipliers (1.0 elsewhere): each block's output is multiplied by `residual_multiplier` before
    /// its residual add, and logits are divided by `logits_scaling`.
    pub residual_multiplier: f64,
    pub logits_scaling: f64,
}

/// The block a projection belongs to in Hugging Face names: `self_attn` or `mlp`.
pub fn module_group(module: &str) -> &'static str {
    match module {
        "q_proj" | "k_proj" | "v_proj" | "qkv_proj" | "o_proj" => "self_attn",
        _ => "mlp",
    }
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
    /// transformers 5: theta and scaling in one object (gemma3: one per layer type, see `rope_parameters_of`).
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
    /// gemma3: the MLP activation (`gelu_pytorch_tanh`).
    pub hidden_activation: Option<String>,
    /// gemma3: attention scores are scaled by `query_pre_attn_scalar ** -0.5`.
    pub query_pre_attn_scalar: Option<f64>,
    /// gemma3: per layer, `sliding_attention` or `full_attention`.
    pub layer_types: Option<Vec<String>>,
    /// gemma3 (older configs): every `sliding_window_pattern`-th layer is global, the others slide.
    pub sliding_window_pattern: Option<usize>,
    /// gemma3: the rope base of the sliding layers.
    pub rope_local_base_freq: Option<f64>,
    /// gemma2-style tanh soft-capping; None in gemma3 (refused when set: not implemented).
    pub final_logit_softcapping: Option<f64>,
    pub attn_logit_softcapping: Option<f64>,
    /// gemma3 embedding models attend both ways (refused: a causal LM is what we train).
    pub use_bidirectional_attention: Option<bool>,
    /// A multimodal checkpoint's language model config (gemma3).
    pub text_config: Option<Box<RawConfig>>,
    /// phi3: the fraction of each head's dimensions that is rotated.
    pub partial_rotary_factor: Option<f64>,
    /// phi3: the pretraining context LongRoPE switches factors at.
    pub original_max_position_embeddings: Option<usize>,
    /// smollm3: per layer, 1 when it uses rope, 0 when not.
    pub no_rope_layers: Option<Vec<u8>>,
    /// smollm3: when `no_rope_layers` is absent, every `no_rope_layer_interval`-th layer has no rope.
    pub no_rope_layer_interval: Option<usize>,
    pub embedding_multiplier: Option<f64>,
    pub residual_multiplier: Option<f64>,
    pub attention_multiplier: Option<f64>,
    pub logits_scaling: Option<f64>,
    pub mlp_bias: Option<bool>,
}

impl RawConfig {
    pub fn from_file(path: &Path) -> Result<Self> {
        crate::engine::error::read_json(path)
    }

    /// Fill defaults the way transformers does for each architecture and check what must be present. A
    /// multimodal gemma3 config resolves to its text tower (`text_config`, with the outer config's token ids
    /// where the inner one has none).
    pub fn resolve(&self, path: &Path) -> Result<ModelConfig> {
        if self.model_type.as_deref() == Some("gemma3") {
            let Some(text) = &self.text_config else {
                return Err(Error::BadConfig {
                    path: path.to_path_buf(),
                    field: "text_config".into(),
                    message: "a multimodal gemma3 config needs its language model's `text_config`".into(),
                });
            };
            let mut text = (**text).clone();
            text.model_type = Some("gemma3_text".into());
            text.bos_token_id = text.bos_token_id.or(self.bos_token_id);
            text.eos_token_id = text.eos_token_id.clone().or_else(|| self.eos_token_id.clone());
            text.torch_dtype =
                text.torch_dtype.clone().or_else(|| self.torch_dtype.clone().or_else(|| self.dtype.clone()));
            let mut resolved = text.resolve(path)?;
            resolved.multimodal = true;
            return Ok(resolved);
        }
        if self.model_type.as_deref() == Some("gemma3_text") {
            return self.with_gemma3_defaults().resolve_checked(path);
        }
        self.resolve_checked(path)
    }

    fn architecture(&self, path: &Path) -> Result<Architecture> {
        let model_type = self.model_type.clone().unwrap_or_default();
        Architecture::from_model_type(&model_type).ok_or_else(|| Error::UnsupportedArchitecture {
            found: if model_type.is_empty() { "(no model_type)".into() } else { model_type.clone() },
            path: path.to_path_buf(),
            supported: Architecture::SUPPORTED.into(),
        })
    }

    fn resolve_checked(&self, path: &Path) -> Result<ModelConfig> {
        let architecture = self.architecture(path)?;
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
        let mlp_activation = self.mlp_activation(architecture, path)?;
        let max_position_embeddings = self.max_position_embeddings.unwrap_or(match architecture {
            Architecture::Phi3 => 4096,
            _ => 2048,
        });
        let rotary_dim = self.rotary_dim(architecture, head_dim, path)?;
        let (rope_theta, rope_scaling) = self.resolve_rope(path, max_position_embeddings, rotary_dim)?;
        let sliding_window = match architecture {
            Architecture::Mistral | Architecture::Gemma3 | Architecture::Phi3 => self.sliding_window,
            Architecture::Qwen2 | Architecture::Qwen3 if self.use_sliding_window == Some(true) => self.sliding_window,
            _ => None,
        };
        let num_layers = need(self.num_hidden_layers, "num_hidden_layers")?;
        let bad =
            |field: &str, message: String| Error::BadConfig { path: path.to_path_buf(), field: field.into(), message };
        if self.mlp_bias == Some(true) {
            return Err(bad("mlp_bias", "MLP biases are not supported".into()));
        }
        let attention_bias = self.attention_bias.unwrap_or(false);
        let granite = architecture == Architecture::Granite;
        let multiplier = |v: Option<f64>, field: &str| -> Result<f64> {
            match v {
                Some(x) if granite && !(x.is_finite() && x != 0.0) => {
                    Err(bad(field, format!("{x} must be finite and non-zero")))
                }
                Some(x) if granite => Ok(x),
                _ => Ok(1.0),
            }
        };
        let config = ModelConfig {
            architecture,
            vocab_size: need(self.vocab_size, "vocab_size")?,
            hidden_size,
            intermediate_size: need(self.intermediate_size, "intermediate_size")?,
            num_layers,
            num_attention_heads,
            num_kv_heads,
            head_dim,
            rms_norm_eps: self.rms_norm_eps.unwrap_or(match architecture {
                Architecture::Phi3 | Architecture::Olmo2 => 1e-5,
                _ => 1e-6,
            }),
            rope_theta,
            rope_scaling,
            max_position_embeddings,
            tie_word_embeddings: self.tie_word_embeddings.unwrap_or(false),
            qkv_bias: match architecture {
                Architecture::Qwen2 => true,
                Architecture::Phi3 => false,
                _ => attention_bias,
            },
            o_bias: match architecture {
                Architecture::Llama | Architecture::SmolLM3 | Architecture::Granite => attention_bias,
                _ => false,
            },
            qk_norm: architecture == Architecture::Qwen3,
            sliding_window,
            bos_token_id: self.bos_token_id,
            eos_token_ids: self.eos_token_id.as_ref().map(|e| e.to_vec()).unwrap_or_default(),
            weights_dtype: self.torch_dtype.clone().or_else(|| self.dtype.clone()),
            norm_layout: NormLayout::PreNorm,
            norm_weight_offset: 0.0,
            qk_norm_over_projection: false,
            mlp_activation,
            sliding_layers: Vec::new(),
            local_rope_theta: None,
            multimodal: false,
            rotary_dim,
            rope_layers: self.rope_layers(architecture, num_layers, path)?,
            fused_projections: architecture == Architecture::Phi3,
            embedding_multiplier: multiplier(self.embedding_multiplier, "embedding_multiplier")?,
            residual_multiplier: multiplier(self.residual_multiplier, "residual_multiplier")?,
            logits_scaling: multiplier(self.logits_scaling, "logits_scaling")?,
            // Granite's default attention_multiplier is 1.0 (transformers' GraniteConfig), not 1/sqrt(head_dim).
            attention_scale: if granite {
                multiplier(self.attention_multiplier, "attention_multiplier")?
            } else {
                1.0 / (head_dim as f64).sqrt()
            },
        };
        // Bounded before the family's blocks too: they build per-layer lists.
        check_config_bounds(&config, path, &|field| field.to_string())?;
        let config = self.with_family_blocks(config, path)?;
        check_config_bounds(&config, path, &|field| field.to_string())?;
        Ok(config)
    }
}

impl ModelConfig {
    /// Width of the q and k norm weights: the whole projection (olmo2) or one head.
    pub fn qk_norm_widths(&self) -> (usize, usize) {
        if self.qk_norm_over_projection {
            (self.num_attention_heads * self.head_dim, self.num_kv_heads * self.head_dim)
        } else {
            (self.head_dim, self.head_dim)
        }
    }

    /// Whether decoder layer `layer` attends through the sliding window.
    pub fn layer_slides(&self, layer: usize) -> bool {
        self.sliding_window.is_some()
            && self.sliding_layers.get(layer).copied().unwrap_or(self.sliding_layers.is_empty())
    }

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
            attn += if self.qk_norm_over_projection { q + kv } else { 2 * self.head_dim };
        }
        let mlp = 3 * h * self.intermediate_size;
        let norms = self.norm_layout.norms().len() * h;
        let embed = self.vocab_size * h;
        let head = if self.tie_word_embeddings { 0 } else { embed };
        self.num_layers * (attn + mlp + norms) + embed + head + h
    }

    /// The linears of every decoder layer by their Hugging Face (and PEFT) module names, in model order: what
    /// LoRA can target on this family.
    pub fn linear_modules(&self) -> &'static [&'static str] {
        if self.fused_projections {
            &["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]
        } else {
            &["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
        }
    }

    /// (in_features, out_features) of a named linear in every decoder layer; None when this family has no
    /// linear of that name.
    pub fn linear_shape(&self, module: &str) -> Option<(usize, usize)> {
        let h = self.hidden_size;
        let q = self.num_attention_heads * self.head_dim;
        let kv = self.num_kv_heads * self.head_dim;
        let i = self.intermediate_size;
        if !self.linear_modules().contains(&module) {
            return None;
        }
        Some(match module {
            "q_proj" => (h, q),
            "k_proj" | "v_proj" => (h, kv),
            "qkv_proj" => (h, q + 2 * kv),
            "o_proj" => (q, h),
            "gate_proj" | "up_proj" => (h, i),
            "gate_up_proj" => (h, 2 * i),
            "down_proj" => (i, h),
            _ => return None,
        })
    }

    /// Whether decoder layer `layer` applies the rotary embedding (all but smollm3's NoPE layers).
    pub fn layer_uses_rope(&self, layer: usize) -> bool {
        self.rope_layers.get(layer).copied().unwrap_or(true)
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
