//! The raw-config resolution of the families whose blocks differ from llama's: gemma3 (its defaults, sandwich
//! norms as 1 + w, GeGLU, scaled embeddings, score scale, sliding and global layers), olmo2 (post-norms,
//! whole-projection q/k norms), phi3 (partial rotary, LongRoPE), smollm3 (layers without rope). The common
//! resolution (`RawConfig::resolve`) lives in the parent module and calls these.

use super::{Architecture, MlpActivation, ModelConfig, NormLayout, OneOrMany, RawConfig};
use crate::engine::{Error, Result};
use std::path::Path;

/// LongRoPE parameters, resolved as transformers' `_compute_longrope_parameters` does.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct LongRopeScaling {
    /// One divisor per rotary frequency (rotary_dim / 2 of them), for sequences within the original context.
    pub short_factor: Vec<f64>,
    /// The same beyond it.
    pub long_factor: Vec<f64>,
    /// The pretraining context: a forward whose last position + 1 exceeds it uses `long_factor`.
    pub original_max_position_embeddings: usize,
    /// Multiplies cos and sin: the config's `attention_factor`, else `sqrt(1 + ln(f) / ln(original))` with
    /// `f = max_position_embeddings / original` (1 when `f <= 1`).
    pub attention_factor: f64,
}

impl RawConfig {
    /// transformers 5's `rope_parameters` for layers of `layer_type`: its entry for that type when kept per type
    /// (gemma3), else the shared object for `full_attention` (sliding layers then use `rope_local_base_freq`).
    pub(super) fn rope_parameters_of(&self, layer_type: &str) -> Option<&serde_json::Value> {
        let params = self.rope_parameters.as_ref()?;
        let per_type = params.get("full_attention").is_some() || params.get("sliding_attention").is_some();
        if per_type {
            params.get(layer_type)
        } else {
            (layer_type == "full_attention").then_some(params)
        }
    }

    /// `Gemma3TextConfig`'s defaults for the fields a gemma3 config leaves out (real checkpoints' `text_config`
    /// often omits the vocabulary size, rope bases and window).
    pub(super) fn with_gemma3_defaults(&self) -> RawConfig {
        let mut c = self.clone();
        c.vocab_size = c.vocab_size.or(Some(262_208));
        c.hidden_size = c.hidden_size.or(Some(2304));
        c.intermediate_size = c.intermediate_size.or(Some(9216));
        c.num_hidden_layers = c.num_hidden_layers.or(Some(26));
        c.num_attention_heads = c.num_attention_heads.or(Some(8));
        c.num_key_value_heads = c.num_key_value_heads.or(Some(4));
        c.head_dim = c.head_dim.or(Some(256));
        c.max_position_embeddings = c.max_position_embeddings.or(Some(131_072));
        let theta_of = |layer_type| self.rope_parameters_of(layer_type).and_then(|p| p.get("rope_theta")?.as_f64());
        c.rope_theta = c.rope_theta.or(theta_of("full_attention")).or(Some(1_000_000.0));
        c.rope_local_base_freq = c.rope_local_base_freq.or(theta_of("sliding_attention")).or(Some(10_000.0));
        c.query_pre_attn_scalar = c.query_pre_attn_scalar.or(Some(256.0));
        c.sliding_window = c.sliding_window.or(Some(4096));
        c.tie_word_embeddings = c.tie_word_embeddings.or(Some(true));
        c.bos_token_id = c.bos_token_id.or(Some(2));
        c.eos_token_id = c.eos_token_id.clone().or(Some(OneOrMany::One(1)));
        c
    }

    /// The block variations of the families that differ from llama's layout, in one place: gemma3 (sandwich
    /// norms applied as 1 + w, per-head q/k norms, GeGLU, scaled embeddings, its score scale, sliding and
    /// global layers with their own rope bases) and olmo2 (post-norms only, whole-projection q/k norms).
    pub(super) fn with_family_blocks(&self, mut c: ModelConfig, path: &Path) -> Result<ModelConfig> {
        match c.architecture {
            Architecture::Gemma3 => {
                self.refuse_unimplemented_gemma_options(path)?;
                c.norm_layout = NormLayout::Sandwich;
                c.norm_weight_offset = 1.0;
                c.qk_norm = true;
                c.embedding_multiplier = (c.hidden_size as f64).sqrt();
                if let Some(scalar) = self.query_pre_attn_scalar.filter(|s| *s > 0.0) {
                    c.attention_scale = scalar.powf(-0.5);
                }
                c.sliding_layers = self.gemma3_sliding_layers(c.num_layers, path)?;
                c.local_rope_theta = self.rope_local_base_freq;
            }
            Architecture::Olmo2 => {
                c.norm_layout = NormLayout::PostNorm;
                c.qk_norm = true;
                c.qk_norm_over_projection = true;
            }
            _ => {}
        }
        Ok(c)
    }

    /// The MLP activation: gemma3 names it `hidden_activation` (gelu tanh), the others `hidden_act` (silu).
    pub(super) fn mlp_activation(&self, architecture: Architecture, path: &Path) -> Result<MlpActivation> {
        let bad = |field: &str, act: &str, supported: &str| Error::BadConfig {
            path: path.to_path_buf(),
            field: field.into(),
            message: format!("`{act}` is not supported for {}; supported: {supported}", architecture.as_str()),
        };
        if architecture == Architecture::Gemma3 {
            let (field, act) = match (&self.hidden_activation, &self.hidden_act) {
                (Some(a), _) => ("hidden_activation", a.as_str()),
                (None, Some(a)) => ("hidden_act", a.as_str()),
                (None, None) => return Ok(MlpActivation::GeluTanh),
            };
            return match act {
                "gelu_pytorch_tanh" | "gelu_tanh" => Ok(MlpActivation::GeluTanh),
                other => Err(bad(field, other, "gelu_pytorch_tanh")),
            };
        }
        match self.hidden_act.as_deref() {
            None | Some("silu") | Some("swish") => Ok(MlpActivation::Silu),
            Some(other) => Err(bad("hidden_act", other, "silu")),
        }
    }

    /// Options of the gemma family that gemma3 checkpoints leave off and we do not implement: an error naming
    /// the field rather than silently different numbers.
    pub(super) fn refuse_unimplemented_gemma_options(&self, path: &Path) -> Result<()> {
        let refuse = |field: &str, message: &str| {
            Err(Error::BadConfig { path: path.to_path_buf(), field: field.into(), message: message.into() })
        };
        if self.final_logit_softcapping.is_some() {
            return refuse("final_logit_softcapping", "logit soft-capping is not implemented (gemma3 sets it null)");
        }
        if self.attn_logit_softcapping.is_some() {
            return refuse("attn_logit_softcapping", "attention soft-capping is not implemented (gemma3 sets it null)");
        }
        if self.use_bidirectional_attention == Some(true) {
            return refuse("use_bidirectional_attention", "bidirectional attention is not supported: causal LMs only");
        }
        Ok(())
    }

    /// gemma3's sliding layers: `layer_types`, else every `sliding_window_pattern`-th layer (default 6) global.
    pub(super) fn gemma3_sliding_layers(&self, num_layers: usize, path: &Path) -> Result<Vec<bool>> {
        let bad =
            |field: &str, message: String| Error::BadConfig { path: path.to_path_buf(), field: field.into(), message };
        if let Some(types) = &self.layer_types {
            if types.len() != num_layers {
                return Err(bad("layer_types", format!("{} entries for {num_layers} layers", types.len())));
            }
            return types
                .iter()
                .enumerate()
                .map(|(i, t)| match t.as_str() {
                    "sliding_attention" => Ok(true),
                    "full_attention" => Ok(false),
                    other => Err(bad(
                        &format!("layer_types[{i}]"),
                        format!("`{other}`; expected sliding_attention or full_attention"),
                    )),
                })
                .collect();
        }
        let pattern = self.sliding_window_pattern.unwrap_or(6);
        if pattern == 0 {
            return Err(bad("sliding_window_pattern", "must be at least 1".into()));
        }
        Ok((0..num_layers).map(|i| (i + 1) % pattern != 0).collect())
    }

    /// phi3's `partial_rotary_factor` as a count of leading head dimensions (transformers truncates
    /// `head_dim * factor` to an integer); every dimension elsewhere.
    pub(super) fn rotary_dim(&self, architecture: Architecture, head_dim: usize, path: &Path) -> Result<usize> {
        let factor = match architecture {
            Architecture::Phi3 => self.partial_rotary_factor.unwrap_or(1.0),
            _ => 1.0,
        };
        let dim = (head_dim as f64 * factor) as usize;
        if !(factor > 0.0 && factor <= 1.0) || dim == 0 || !dim.is_multiple_of(2) {
            return Err(Error::BadConfig {
                path: path.to_path_buf(),
                field: "partial_rotary_factor".into(),
                message: format!(
                    "{factor} gives {dim} rotary dimensions of head_dim {head_dim}; need an even count > 0"
                ),
            });
        }
        Ok(dim)
    }

    /// smollm3's `no_rope_layers` (1: rope, 0: none), or its default of no rope on every
    /// `no_rope_layer_interval`-th layer (4); empty (every layer rotates) for other families.
    pub(super) fn rope_layers(&self, architecture: Architecture, num_layers: usize, path: &Path) -> Result<Vec<bool>> {
        if architecture != Architecture::SmolLM3 {
            return Ok(Vec::new());
        }
        if self.use_sliding_window == Some(true) {
            return Err(Error::BadConfig {
                path: path.to_path_buf(),
                field: "use_sliding_window".into(),
                message: "smollm3 with sliding-window layers is not supported".into(),
            });
        }
        match &self.no_rope_layers {
            Some(flags) if flags.len() == num_layers => Ok(flags.iter().map(|&f| f != 0).collect()),
            Some(flags) => Err(Error::BadConfig {
                path: path.to_path_buf(),
                field: "no_rope_layers".into(),
                message: format!("{} entries for {num_layers} layers", flags.len()),
            }),
            None => {
                let interval = self.no_rope_layer_interval.unwrap_or(4).max(1);
                Ok((0..num_layers).map(|i| (i + 1) % interval != 0).collect())
            }
        }
    }

    /// LongRoPE as transformers' `_compute_longrope_parameters` reads it: a top-level
    /// `original_max_position_embeddings` makes the factor `max_position_embeddings / original`, else
    /// `rope_scaling.factor` with the original context equal to `max_position_embeddings`.
    pub(super) fn long_rope(
        &self,
        scaling: &serde_json::Value,
        path: &Path,
        max_position_embeddings: usize,
        rotary_dim: usize,
    ) -> Result<LongRopeScaling> {
        let bad = |field: &str, message: String| Error::BadConfig {
            path: path.to_path_buf(),
            field: format!("rope_scaling.{field}"),
            message,
        };
        let factors = |field: &str| -> Result<Vec<f64>> {
            let list = scaling.get(field).and_then(|v| v.as_array()).ok_or_else(|| bad(field, "missing".into()))?;
            let values: Option<Vec<f64>> = list.iter().map(|v| v.as_f64()).collect();
            match values {
                Some(v) if v.len() == rotary_dim / 2 && v.iter().all(|x| *x > 0.0) => Ok(v),
                _ => Err(bad(field, format!("need {} positive numbers (rotary_dim / 2)", rotary_dim / 2))),
            }
        };
        let (original, factor) = match self.original_max_position_embeddings {
            Some(original) if original > 0 => (original, max_position_embeddings as f64 / original as f64),
            _ => (max_position_embeddings, scaling.get("factor").and_then(|v| v.as_f64()).unwrap_or(1.0)),
        };
        let attention_factor = match scaling.get("attention_factor").and_then(|v| v.as_f64()) {
            Some(a) => a,
            None if factor <= 1.0 => 1.0,
            None => (1.0 + factor.ln() / (original as f64).ln()).sqrt(),
        };
        Ok(LongRopeScaling {
            short_factor: factors("short_factor")?,
            long_factor: factors("long_factor")?,
            original_max_position_embeddings: original,
            attention_factor,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::*;
    use std::path::Path;

    #[test]
    fn gemma3_text_tower_resolves_with_gemma_defaults() {
        let raw: RawConfig = serde_json::from_str(
            r#"{"model_type":"gemma3","eos_token_id":[1,106],"text_config":{"model_type":"gemma3_text",
            "hidden_size":2560,"intermediate_size":10240,"num_hidden_layers":12,"num_attention_heads":8,
            "num_key_value_heads":4,"sliding_window":1024,"rope_scaling":{"factor":8.0,"rope_type":"linear"}}}"#,
        )
        .unwrap();
        let cfg = raw.resolve(Path::new("config.json")).unwrap();
        assert_eq!(cfg.architecture, Architecture::Gemma3);
        assert!(cfg.multimodal);
        assert_eq!((cfg.vocab_size, cfg.head_dim, cfg.eos_token_ids.clone()), (262_208, 256, vec![1, 106]));
        assert_eq!(cfg.attention_scale, 1.0 / 16.0);
        assert_eq!(cfg.embedding_multiplier, 2560f64.sqrt());
        assert_eq!(cfg.mlp_activation, MlpActivation::GeluTanh);
        // Every sixth layer is global (the default sliding_window_pattern 6).
        let global: Vec<usize> = (0..12).filter(|&i| !cfg.layer_slides(i)).collect();
        assert_eq!(global, vec![5, 11]);
        assert_eq!(cfg.local_rope_theta, Some(10_000.0));
        assert_eq!(cfg.rope_scaling, Some(RopeScaling::Linear { factor: 8.0 }));
    }

    #[test]
    fn gemma3_rope_parameters_per_layer_type_as_transformers_5_writes_them() {
        // What transformers 5.17's save_pretrained writes for tests/fixtures/tiny-gemma3 (scripts/check_saved_configs.py).
        let raw: RawConfig = serde_json::from_str(
            r#"{"model_type":"gemma3_text","vocab_size":10,"hidden_size":64,"intermediate_size":16,
            "num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"head_dim":16,
            "rope_parameters":{"full_attention":{"factor":2.0,"rope_theta":500000.0,"rope_type":"linear"},
            "sliding_attention":{"rope_theta":20000.0,"rope_type":"default"}}}"#,
        )
        .unwrap();
        let cfg = raw.resolve(Path::new("config.json")).unwrap();
        assert_eq!(cfg.rope_theta, 500_000.0);
        assert_eq!(cfg.rope_scaling, Some(RopeScaling::Linear { factor: 2.0 }));
        assert_eq!(cfg.local_rope_theta, Some(20_000.0));
    }

    #[test]
    fn unimplemented_gemma_options_are_refused_by_name() {
        let raw: RawConfig = serde_json::from_str(
            r#"{"model_type":"gemma3_text","final_logit_softcapping":30.0,"hidden_size":8,"num_hidden_layers":1}"#,
        )
        .unwrap();
        let err = raw.resolve(Path::new("m/config.json")).unwrap_err().to_string();
        assert!(err.contains("final_logit_softcapping") && err.contains("m/config.json"), "{err}");
        let raw: RawConfig =
            serde_json::from_str(r#"{"model_type":"gemma3_text","hidden_activation":"relu"}"#).unwrap();
        let err = raw.resolve(Path::new("config.json")).unwrap_err().to_string();
        assert!(err.contains("hidden_activation") && err.contains("gelu_pytorch_tanh"), "{err}");
    }

    #[test]
    fn olmo2_norms_follow_each_block_and_span_the_projection() {
        let raw: RawConfig = serde_json::from_str(
            r#"{"model_type":"olmo2","vocab_size":10,"hidden_size":8,"intermediate_size":16,
            "num_hidden_layers":1,"num_attention_heads":2,"num_key_value_heads":1}"#,
        )
        .unwrap();
        let cfg = raw.resolve(Path::new("config.json")).unwrap();
        assert_eq!(cfg.norm_layout, NormLayout::PostNorm);
        assert_eq!(cfg.qk_norm_widths(), (8, 4));
        assert_eq!(cfg.rms_norm_eps, 1e-5);
    }

    #[test]
    fn phi3_smollm3_and_granite_resolve_their_quirks() {
        let phi3: RawConfig = serde_json::from_str(
            r#"{"model_type":"phi3","vocab_size":10,"hidden_size":64,"intermediate_size":16,
            "num_hidden_layers":1,"num_attention_heads":4,"partial_rotary_factor":0.75,
            "max_position_embeddings":131072,"original_max_position_embeddings":4096,
            "rope_scaling":{"type":"longrope","short_factor":[1,1,1,1,1,1],"long_factor":[2,2,2,2,2,2]}}"#,
        )
        .unwrap();
        let cfg = phi3.resolve(Path::new("config.json")).unwrap();
        assert_eq!((cfg.rotary_dim, cfg.fused_projections), (12, true));
        assert_eq!(cfg.linear_shape("qkv_proj"), Some((64, 192)));
        assert_eq!(cfg.linear_shape("q_proj"), None);
        let Some(RopeScaling::LongRope(s)) = &cfg.rope_scaling else { panic!("{:?}", cfg.rope_scaling) };
        // transformers: sqrt(1 + ln(131072 / 4096) / ln(4096)).
        assert!((s.attention_factor - (1.0 + 32f64.ln() / 4096f64.ln()).sqrt()).abs() < 1e-12);
        let short: RawConfig = serde_json::from_str(
            r#"{"model_type":"phi3","vocab_size":10,"hidden_size":64,"intermediate_size":16,
            "num_hidden_layers":1,"num_attention_heads":4,
            "rope_scaling":{"type":"longrope","short_factor":[1],"long_factor":[2]}}"#,
        )
        .unwrap();
        let err = short.resolve(Path::new("config.json")).unwrap_err().to_string();
        assert!(err.contains("rope_scaling.short_factor") && err.contains("8 positive"), "{err}");

        let smol: RawConfig = serde_json::from_str(
            r#"{"model_type":"smollm3","vocab_size":10,"hidden_size":8,"intermediate_size":16,
            "num_hidden_layers":8,"num_attention_heads":2}"#,
        )
        .unwrap();
        let cfg = smol.resolve(Path::new("config.json")).unwrap();
        let rope: Vec<bool> = (0..8).map(|i| cfg.layer_uses_rope(i)).collect();
        assert_eq!(rope, [true, true, true, false, true, true, true, false]);

        let granite: RawConfig = serde_json::from_str(
            r#"{"model_type":"granite","vocab_size":10,"hidden_size":8,"intermediate_size":16,
            "num_hidden_layers":1,"num_attention_heads":2,"attention_multiplier":0.5,"logits_scaling":8,
            "embedding_multiplier":12,"residual_multiplier":0.22}"#,
        )
        .unwrap();
        let cfg = granite.resolve(Path::new("config.json")).unwrap();
        assert_eq!((cfg.attention_scale, cfg.logits_scaling, cfg.embedding_multiplier), (0.5, 8.0, 12.0));
        assert_eq!(cfg.residual_multiplier, 0.22);
    }
}
