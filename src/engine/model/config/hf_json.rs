//! The inverse of `RawConfig::resolve`: a resolved [`ModelConfig`] written back as its family's Hugging Face
//! `config.json`, for model folders made from a source that has none (the merged export of a GGUF base).
//!
//! Every field that the family's transformers class and our resolver read is written: gemma3's activation
//! (`hidden_activation`), score scale (`query_pre_attn_scalar`), `layer_types`, sliding window and local rope
//! base; phi3's `partial_rotary_factor` and LongRoPE (`original_max_position_embeddings`); granite's four
//! multipliers; smollm3's `no_rope_layers`; qwen's sliding window; biases; rope scaling. Gemma3's norm weights
//! need nothing here: the GGUF reader already returns them as Hugging Face stores them (without the 1).
//!
//! The written config is then resolved back, as any loader of the folder would, and compared with the config it
//! came from (see [`semantic_view`]): a model that its family's config.json cannot describe (a granite file whose
//! `rope.scaling.finetuned` turns rope off, a llama whose q/k/v and output biases differ, ...) is an error naming
//! the family and the field, never a folder that loads as a different model.

use super::{Architecture, MlpActivation, ModelConfig, RawConfig, RopeScaling};
use crate::engine::{Error, Result};
use serde_json::{json, Map, Value};
use std::path::Path;

impl ModelConfig {
    /// This model as its family's Hugging Face `config.json` (f32 weights), checked to resolve back to the same
    /// model. `source` names the model this config describes in errors, which say what the folder would lose and
    /// what to export instead.
    pub fn to_hf_config(&self, source: &Path) -> Result<Value> {
        let config = self.hf_config_fields();
        let raw: RawConfig = serde_json::from_value(config.clone()).map_err(|e| Error::Json {
            path: source.to_path_buf(),
            message: format!("the config.json written for this model does not parse back: {e}"),
        })?;
        let refuse = |field: String, detail: String| Error::BadConfig {
            path: source.to_path_buf(),
            field,
            message: format!(
                "a Hugging Face config.json of {} cannot describe this model ({detail}), so a merged folder \
                 would load as a different model; export the adapter instead (`--format peft`) and use it \
                 with this base (`--adapter`), or merge onto the model's Hugging Face folder",
                self.architecture.as_str()
            ),
        };
        let back = raw.resolve(&source.join("config.json")).map_err(|e| refuse("config.json".into(), e.to_string()))?;
        match first_difference(&semantic_view(self), &semantic_view(&back), String::new()) {
            Some((field, ours, theirs)) => {
                Err(refuse(field.clone(), format!("{} is {ours}, the config would give {theirs}", describe(&field))))
            }
            None => Ok(config),
        }
    }

    /// The config.json fields, family by family (unchecked; see [`ModelConfig::to_hf_config`]).
    fn hf_config_fields(&self) -> Value {
        use Architecture::*;
        let arch = self.architecture;
        let mut m = Map::new();
        let mut put = |key: &str, value: Value| {
            m.insert(key.to_string(), value);
        };
        put("architectures", json!([class_name(arch)]));
        put("model_type", json!(arch.as_str()));
        put("vocab_size", json!(self.vocab_size));
        put("hidden_size", json!(self.hidden_size));
        put("intermediate_size", json!(self.intermediate_size));
        put("num_hidden_layers", json!(self.num_layers));
        put("num_attention_heads", json!(self.num_attention_heads));
        put("num_key_value_heads", json!(self.num_kv_heads));
        put("head_dim", json!(self.head_dim));
        put("rms_norm_eps", json!(self.rms_norm_eps));
        put("rope_theta", json!(self.rope_theta));
        put("rope_scaling", self.rope_scaling.as_ref().map_or(Value::Null, |s| self.rope_scaling_json(s)));
        put("max_position_embeddings", json!(self.max_position_embeddings));
        put("tie_word_embeddings", json!(self.tie_word_embeddings));
        if let Some(bos) = self.bos_token_id {
            put("bos_token_id", json!(bos));
        }
        match self.eos_token_ids.as_slice() {
            [] => {}
            [one] => put("eos_token_id", json!(one)),
            many => put("eos_token_id", json!(many)),
        }
        // No pad id is known here; transformers' class defaults (phi3's 32000, smollm3's 128004) can lie
        // outside a small vocabulary, which its embedding refuses.
        put("pad_token_id", Value::Null);
        put("torch_dtype", json!("float32"));
        let act = match self.mlp_activation {
            MlpActivation::Silu => "silu",
            MlpActivation::GeluTanh => "gelu_pytorch_tanh",
        };
        put("hidden_act", json!(act));
        if !matches!(arch, Qwen2 | Phi3) {
            // qwen2 always has q/k/v biases and phi3 none; the others read `attention_bias`.
            put("attention_bias", json!(self.qkv_bias));
        }
        if matches!(arch, Llama | Mistral | Granite | SmolLM3) {
            put("mlp_bias", json!(false));
        }
        match arch {
            Mistral | Phi3 => put("sliding_window", json!(self.sliding_window)),
            Qwen2 | Qwen3 => {
                put("use_sliding_window", json!(self.sliding_window.is_some()));
                put("sliding_window", json!(self.sliding_window));
                // transformers slides only layers from `max_window_layers` on; our resolver slides them all.
                put("max_window_layers", json!(if self.sliding_window.is_some() { 0 } else { self.num_layers }));
            }
            _ => {}
        }
        match arch {
            Gemma3 => self.gemma3_fields(&mut put),
            Phi3 => self.phi3_fields(&mut put),
            SmolLM3 => {
                put("use_sliding_window", json!(false));
                let flags: Vec<u8> = (0..self.num_layers).map(|i| u8::from(self.layer_uses_rope(i))).collect();
                put("no_rope_layers", json!(flags));
            }
            Granite => {
                put("embedding_multiplier", json!(self.embedding_multiplier));
                put("residual_multiplier", json!(self.residual_multiplier));
                put("attention_multiplier", json!(self.attention_scale));
                put("logits_scaling", json!(self.logits_scaling));
            }
            _ => {}
        }
        Value::Object(m)
    }

    /// gemma3: GeGLU under its own key, the score scale as `query_pre_attn_scalar` (an integer where it is one, as
    /// transformers 5 requires), which layers slide (all full
    /// when the model has no window), the window and the sliding layers' rope base.
    fn gemma3_fields(&self, put: &mut dyn FnMut(&str, Value)) {
        put("hidden_activation", json!("gelu_pytorch_tanh"));
        // scale = scalar ** -0.5; an integral scalar (what configs hold) is written as one.
        let scalar = self.attention_scale.powi(-2);
        let rounded = scalar.round();
        let scalar = match (scalar - rounded).abs() <= 1e-9 * rounded.abs() && rounded >= 1.0 {
            true => json!(rounded as u64),
            false => json!(scalar),
        };
        put("query_pre_attn_scalar", scalar);
        let types: Vec<&str> = (0..self.num_layers)
            .map(|i| if self.layer_slides(i) { "sliding_attention" } else { "full_attention" })
            .collect();
        put("layer_types", json!(types));
        if let Some(window) = self.sliding_window {
            put("sliding_window", json!(window));
        }
        if let Some(theta) = self.local_rope_theta {
            put("rope_local_base_freq", json!(theta));
        }
        put("final_logit_softcapping", Value::Null);
        put("attn_logit_softcapping", Value::Null);
        put("use_bidirectional_attention", json!(false));
    }

    /// phi3: the rotated fraction of each head and LongRoPE's original context (its factors are in
    /// `rope_scaling`; its cos/sin multiplier only where it differs from the one transformers computes).
    fn phi3_fields(&self, put: &mut dyn FnMut(&str, Value)) {
        if self.rotary_dim != self.head_dim {
            let mut factor = self.rotary_dim as f64 / self.head_dim as f64;
            // transformers and our resolver truncate `head_dim * factor`: never let rounding land one below.
            while ((self.head_dim as f64 * factor) as usize) < self.rotary_dim {
                factor = factor.next_up();
            }
            put("partial_rotary_factor", json!(factor));
        }
        if let Some(RopeScaling::LongRope(s)) = &self.rope_scaling {
            put("original_max_position_embeddings", json!(s.original_max_position_embeddings));
        }
    }
}

/// The transformers class of a family's causal LM.
fn class_name(arch: Architecture) -> &'static str {
    match arch {
        Architecture::Llama => "LlamaForCausalLM",
        Architecture::Mistral => "MistralForCausalLM",
        Architecture::Qwen2 => "Qwen2ForCausalLM",
        Architecture::Qwen3 => "Qwen3ForCausalLM",
        Architecture::Gemma3 => "Gemma3ForCausalLM",
        Architecture::Olmo2 => "Olmo2ForCausalLM",
        Architecture::Phi3 => "Phi3ForCausalLM",
        Architecture::SmolLM3 => "SmolLM3ForCausalLM",
        Architecture::Granite => "GraniteForCausalLM",
    }
}

impl ModelConfig {
    /// `rope_scaling` as transformers names it. LongRoPE's `attention_factor` is written only where it differs
    /// from the one transformers derives from the top-level `original_max_position_embeddings` (transformers 4
    /// refuses extra LongRoPE keys).
    fn rope_scaling_json(&self, scaling: &RopeScaling) -> Value {
        match scaling {
            RopeScaling::Llama3(s) => json!({
                "rope_type": "llama3",
                "factor": s.factor,
                "low_freq_factor": s.low_freq_factor,
                "high_freq_factor": s.high_freq_factor,
                "original_max_position_embeddings": s.original_max_position_embeddings,
            }),
            RopeScaling::Linear { factor } => json!({ "rope_type": "linear", "factor": factor }),
            RopeScaling::LongRope(s) => {
                let mut map = Map::new();
                map.insert("type".into(), json!("longrope"));
                map.insert("short_factor".into(), json!(s.short_factor));
                map.insert("long_factor".into(), json!(s.long_factor));
                let original = s.original_max_position_embeddings as f64;
                let factor = self.max_position_embeddings as f64 / original;
                let derived = if factor <= 1.0 { 1.0 } else { (1.0 + factor.ln() / original.ln()).sqrt() };
                if (s.attention_factor - derived).abs() > 1e-12 * derived {
                    map.insert("attention_factor".into(), json!(s.attention_factor));
                }
                Value::Object(map)
            }
        }
    }
}

/// What of a config changes the model's numbers, in a form where two configs that build the same model are
/// equal: per layer, its window (when it slides), the rope base of its sliding tables and whether it rotates,
/// instead of the fields that encode them several ways (`sliding_window` with no sliding layer, an empty
/// `sliding_layers`, ...). Token ids, the weights' dtype and the multimodal flag (no effect on the math) are left
/// out.
fn semantic_view(c: &ModelConfig) -> Value {
    let mut v = serde_json::to_value(c).unwrap_or(Value::Null);
    if let Value::Object(map) = &mut v {
        for key in ["sliding_window", "sliding_layers", "local_rope_theta", "rope_layers"] {
            map.remove(key);
        }
        for key in ["bos_token_id", "eos_token_ids", "weights_dtype", "multimodal"] {
            map.remove(key);
        }
        let layers: Vec<Value> = (0..c.num_layers)
            .map(|i| {
                let slides = c.layer_slides(i);
                let local_theta = if slides && !c.sliding_layers.is_empty() { c.local_rope_theta } else { None };
                json!({
                    "sliding_window": if slides { c.sliding_window } else { None },
                    "local_rope_theta": local_theta,
                    "rope": c.layer_uses_rope(i),
                })
            })
            .collect();
        map.insert("layers".into(), Value::Array(layers));
    }
    v
}

/// A field of [`semantic_view`] in words: `layers[3].rope` is "layer 3's rotary embedding".
fn describe(field: &str) -> String {
    let per_layer = field.strip_prefix("layers[").and_then(|rest| rest.split_once("]."));
    match per_layer {
        Some((layer, "rope")) => format!("layer {layer}'s rotary embedding"),
        Some((layer, "sliding_window")) => format!("layer {layer}'s sliding window"),
        Some((layer, "local_rope_theta")) => format!("layer {layer}'s local rope base"),
        _ => format!("`{field}`"),
    }
}

/// The first place (a dotted path) where `a` and `b` differ, with both values; numbers equal to 1e-9
/// (relative), as an f64 written to JSON and read back, or a scale and its inverse square, may differ by an ulp.
fn first_difference(a: &Value, b: &Value, path: String) -> Option<(String, String, String)> {
    let join = |key: &str| if path.is_empty() { key.to_string() } else { format!("{path}.{key}") };
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            keys.into_iter().find_map(|k| {
                first_difference(x.get(k).unwrap_or(&Value::Null), y.get(k).unwrap_or(&Value::Null), join(k))
            })
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            x.iter().zip(y).enumerate().find_map(|(i, (p, q))| first_difference(p, q, format!("{path}[{i}]")))
        }
        (Value::Number(x), Value::Number(y)) => {
            let (p, q) = (x.as_f64().unwrap_or(f64::NAN), y.as_f64().unwrap_or(f64::NAN));
            let close = (p - q).abs() <= 1e-9 * p.abs().max(q.abs()) || p == q;
            (!close).then(|| (path, a.to_string(), b.to_string()))
        }
        _ => (a != b).then(|| (path, a.to_string(), b.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolve(json: &str) -> ModelConfig {
        let raw: RawConfig = serde_json::from_str(json).unwrap();
        raw.resolve(Path::new("config.json")).unwrap()
    }

    #[test]
    fn family_configs_round_trip_through_config_json() {
        let common = r#""vocab_size":10,"hidden_size":64,"intermediate_size":16,"num_hidden_layers":4,
            "num_attention_heads":4,"num_key_value_heads":2"#;
        for extra in [
            r#""model_type":"gemma3_text","query_pre_attn_scalar":24,"sliding_window":4,
               "layer_types":["sliding_attention","full_attention","sliding_attention","sliding_attention"],
               "rope_local_base_freq":20000.0,"rope_scaling":{"rope_type":"linear","factor":2.0}"#,
            r#""model_type":"phi3","partial_rotary_factor":0.5,"max_position_embeddings":64,
               "original_max_position_embeddings":16,
               "rope_scaling":{"type":"longrope","short_factor":[1,1.5,2,3],"long_factor":[2,3,4,5]}"#,
            r#""model_type":"granite","embedding_multiplier":3.0,"residual_multiplier":0.4,
               "attention_multiplier":0.15,"logits_scaling":2.5"#,
            r#""model_type":"smollm3","no_rope_layers":[0,1,1,0]"#,
            r#""model_type":"qwen2","use_sliding_window":true,"sliding_window":8,"max_window_layers":0"#,
            r#""model_type":"llama","attention_bias":true,"rope_scaling":{"rope_type":"llama3","factor":8.0,
               "low_freq_factor":1.0,"high_freq_factor":4.0,"original_max_position_embeddings":64}"#,
        ] {
            let config = resolve(&format!("{{{common},{extra}}}"));
            let json = config.to_hf_config(Path::new("model.gguf")).unwrap();
            let back = resolve(&json.to_string());
            assert_eq!(first_difference(&semantic_view(&config), &semantic_view(&back), String::new()), None);
        }
    }

    #[test]
    fn a_model_config_json_cannot_describe_is_refused_by_family_and_field() {
        let mut granite = resolve(
            r#"{"model_type":"granite","vocab_size":10,"hidden_size":64,"intermediate_size":16,
            "num_hidden_layers":2,"num_attention_heads":4}"#,
        );
        granite.rope_layers = vec![false; 2];
        let err = granite.to_hf_config(Path::new("g.gguf")).unwrap_err().to_string();
        assert!(err.contains("g.gguf") && err.contains("granite") && err.contains("layers[0].rope"), "{err}");
        assert!(err.contains("layer 0's rotary embedding is false"), "{err}");
        assert!(err.contains("--format peft"), "{err}");
        let mut llama = resolve(
            r#"{"model_type":"llama","vocab_size":10,"hidden_size":64,"intermediate_size":16,
            "num_hidden_layers":2,"num_attention_heads":4}"#,
        );
        llama.qkv_bias = true;
        let err = llama.to_hf_config(Path::new("l.gguf")).unwrap_err().to_string();
        assert!(err.contains("o_bias") && err.contains("llama"), "{err}");
    }
}
