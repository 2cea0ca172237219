//! The one table between Hugging Face tensor names and llama.cpp's GGUF names (`blk.N.attn_q.weight` is
//! `model.layers.N.self_attn.q_proj.weight`). The GGUF reader maps file names to Hugging Face ones with it and
//! the GGUF exporters map the other way, so the two can never disagree.
//!
//! Some GGUF architectures give a module name another meaning (llama.cpp's `tensor_mapping.py`): in `gemma3`,
//! `ffn_norm` is the pre-feedforward norm and `post_attention_norm` / `post_ffw_norm` are the sandwich norms; in
//! `phi3`, `attn_qkv` is the fused q|k|v projection and `ffn_up` the fused gate|up one; `olmo2` has only the
//! post-norms `post_attention_norm` / `post_ffw_norm` (no `attn_norm` / `ffn_norm`). Those architectures' modules
//! are listed in their own table, consulted before the common one.

use crate::engine::model::config::Architecture;

/// Tensors outside the layers: (GGUF name, Hugging Face name).
const GLOBAL: &[(&str, &str)] = &[
    ("token_embd.weight", "model.embed_tokens.weight"),
    ("output_norm.weight", "model.norm.weight"),
    ("output.weight", "lm_head.weight"),
];

/// Modules inside layer N: (GGUF module under `blk.N.`, Hugging Face module under `model.layers.N.`).
const LAYER_MODULES: &[(&str, &str)] = &[
    ("attn_norm", "input_layernorm"),
    ("ffn_norm", "post_attention_layernorm"),
    ("attn_q", "self_attn.q_proj"),
    ("attn_k", "self_attn.k_proj"),
    ("attn_v", "self_attn.v_proj"),
    ("attn_output", "self_attn.o_proj"),
    ("attn_q_norm", "self_attn.q_norm"),
    ("attn_k_norm", "self_attn.k_norm"),
    ("ffn_gate", "mlp.gate_proj"),
    ("ffn_up", "mlp.up_proj"),
    ("ffn_down", "mlp.down_proj"),
];

/// gemma3's layer modules whose GGUF names mean something else than in the common table.
const GEMMA3_LAYER_MODULES: &[(&str, &str)] = &[
    ("post_attention_norm", "post_attention_layernorm"),
    ("ffn_norm", "pre_feedforward_layernorm"),
    ("post_ffw_norm", "post_feedforward_layernorm"),
];

/// olmo2's post-norms (its `attn_q_norm` / `attn_k_norm` are the common names, over the whole projection).
const OLMO2_LAYER_MODULES: &[(&str, &str)] =
    &[("post_attention_norm", "post_attention_layernorm"), ("post_ffw_norm", "post_feedforward_layernorm")];

/// phi3's fused projections.
const PHI3_LAYER_MODULES: &[(&str, &str)] = &[("attn_qkv", "self_attn.qkv_proj"), ("ffn_up", "mlp.gate_up_proj")];

/// The architecture's own layer modules, consulted before [`LAYER_MODULES`].
fn own_layer_modules(arch: Architecture) -> &'static [(&'static str, &'static str)] {
    match arch {
        Architecture::Gemma3 => GEMMA3_LAYER_MODULES,
        Architecture::Phi3 => PHI3_LAYER_MODULES,
        Architecture::Olmo2 => OLMO2_LAYER_MODULES,
        _ => &[],
    }
}

/// The Hugging Face name of a GGUF tensor of the common (llama) layout, or `None` for tensors without one
/// (`rope_freqs.weight`).
pub fn hf_tensor_name(gguf_name: &str) -> Option<String> {
    hf_tensor_name_in(Architecture::Llama, gguf_name)
}

/// The Hugging Face name of a GGUF tensor in a file of architecture `arch`, or `None` for tensors without one
/// (`rope_freqs.weight`, `rope_factors_long.weight`).
pub fn hf_tensor_name_in(arch: Architecture, gguf_name: &str) -> Option<String> {
    if let Some((_, hf)) = GLOBAL.iter().find(|(g, _)| *g == gguf_name) {
        return Some((*hf).to_string());
    }
    let (layer, rest) = gguf_name.strip_prefix("blk.")?.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let (module, param) = rest.rsplit_once('.')?;
    let mut tables = own_layer_modules(arch).iter().chain(LAYER_MODULES);
    let (_, hf) = tables.find(|(g, _)| *g == module)?;
    Some(format!("model.layers.{layer}.{hf}.{param}"))
}

/// The GGUF name of a Hugging Face tensor of the common (llama) layout, or `None` for tensors llama.cpp does
/// not know.
pub fn gguf_tensor_name(hf_name: &str) -> Option<String> {
    gguf_tensor_name_in(Architecture::Llama, hf_name)
}

/// The GGUF name of a Hugging Face tensor in a file of architecture `arch`.
pub fn gguf_tensor_name_in(arch: Architecture, hf_name: &str) -> Option<String> {
    if let Some((g, _)) = GLOBAL.iter().find(|(_, hf)| *hf == hf_name) {
        return Some((*g).to_string());
    }
    let (layer, rest) = hf_name.strip_prefix("model.layers.")?.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let (module, param) = rest.rsplit_once('.')?;
    let mut tables = own_layer_modules(arch).iter().chain(LAYER_MODULES);
    let (g, _) = tables.find(|(_, hf)| *hf == module)?;
    Some(format!("blk.{layer}.{g}.{param}"))
}

/// The GGUF module name (`attn_q`) of one of our linear modules (`q_proj`), for adapter tensor names.
pub fn gguf_linear_module(module: &str) -> Option<&'static str> {
    LAYER_MODULES.iter().find(|(_, hf)| hf.rsplit('.').next() == Some(module)).map(|(g, _)| *g)
}

/// The GGUF module name of one of our linear modules in a file of architecture `arch` (phi3's fused `qkv_proj`
/// is `attn_qkv`, its `gate_up_proj` `ffn_up`), for adapter tensor names.
pub fn gguf_linear_module_in(arch: Architecture, module: &str) -> Option<&'static str> {
    let mut tables = own_layer_modules(arch).iter().chain(LAYER_MODULES);
    tables.find(|(_, hf)| hf.rsplit('.').next() == Some(module)).map(|(g, _)| *g)
}

/// The module part of a GGUF layer tensor name: `attn_q` for `blk.3.attn_q.weight`.
pub fn gguf_module_of(gguf_name: &str) -> Option<&str> {
    let rest = gguf_name.strip_prefix("blk.")?.split_once('.')?.1;
    rest.rsplit_once('.').map(|(module, _)| module)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_both_ways() {
        for hf in [
            "model.embed_tokens.weight",
            "lm_head.weight",
            "model.norm.weight",
            "model.layers.7.self_attn.q_proj.weight",
            "model.layers.0.self_attn.k_proj.bias",
            "model.layers.1.self_attn.k_norm.weight",
            "model.layers.12.mlp.down_proj.weight",
            "model.layers.2.post_attention_layernorm.weight",
        ] {
            let g = gguf_tensor_name(hf).unwrap();
            assert_eq!(hf_tensor_name(&g).as_deref(), Some(hf), "{g}");
        }
        assert_eq!(gguf_tensor_name("model.layers.3.self_attn.o_proj.weight").unwrap(), "blk.3.attn_output.weight");
        assert_eq!(gguf_linear_module("gate_proj"), Some("ffn_gate"));
        assert_eq!(gguf_linear_module_in(Architecture::Phi3, "qkv_proj"), Some("attn_qkv"));
        assert_eq!(gguf_linear_module_in(Architecture::Phi3, "gate_up_proj"), Some("ffn_up"));
        assert_eq!(gguf_linear_module_in(Architecture::Gemma3, "up_proj"), Some("ffn_up"));
        assert_eq!(gguf_module_of("blk.3.attn_q.weight"), Some("attn_q"));
        assert_eq!(hf_tensor_name("rope_freqs.weight"), None);
    }

    #[test]
    fn family_names_follow_llama_cpp_tensor_mapping() {
        let gemma = |g: &str| hf_tensor_name_in(Architecture::Gemma3, g);
        assert_eq!(gemma("blk.1.attn_norm.weight").unwrap(), "model.layers.1.input_layernorm.weight");
        assert_eq!(
            gemma("blk.1.post_attention_norm.weight").unwrap(),
            "model.layers.1.post_attention_layernorm.weight"
        );
        assert_eq!(gemma("blk.1.ffn_norm.weight").unwrap(), "model.layers.1.pre_feedforward_layernorm.weight");
        assert_eq!(gemma("blk.1.post_ffw_norm.weight").unwrap(), "model.layers.1.post_feedforward_layernorm.weight");
        assert_eq!(gemma("blk.1.attn_k_norm.weight").unwrap(), "model.layers.1.self_attn.k_norm.weight");
        assert_eq!(gemma("blk.1.ffn_up.weight").unwrap(), "model.layers.1.mlp.up_proj.weight");
        let phi = |g: &str| hf_tensor_name_in(Architecture::Phi3, g);
        assert_eq!(phi("blk.0.attn_qkv.weight").unwrap(), "model.layers.0.self_attn.qkv_proj.weight");
        assert_eq!(phi("blk.0.ffn_up.weight").unwrap(), "model.layers.0.mlp.gate_up_proj.weight");
        assert_eq!(phi("blk.0.ffn_norm.weight").unwrap(), "model.layers.0.post_attention_layernorm.weight");
        assert_eq!(phi("rope_factors_long.weight"), None);
        let olmo = |g: &str| hf_tensor_name_in(Architecture::Olmo2, g);
        assert_eq!(olmo("blk.0.post_attention_norm.weight").unwrap(), "model.layers.0.post_attention_layernorm.weight");
        assert_eq!(olmo("blk.0.post_ffw_norm.weight").unwrap(), "model.layers.0.post_feedforward_layernorm.weight");
        assert_eq!(olmo("blk.0.attn_q_norm.weight").unwrap(), "model.layers.0.self_attn.q_norm.weight");
        let olmo_norm = gguf_tensor_name_in(Architecture::Olmo2, "model.layers.2.post_attention_layernorm.weight");
        assert_eq!(olmo_norm.as_deref(), Some("blk.2.post_attention_norm.weight"));
        for arch in [Architecture::Gemma3, Architecture::Phi3] {
            for g in ["blk.3.ffn_norm.weight", "blk.3.ffn_up.weight", "blk.3.attn_output.weight", "output.weight"] {
                let hf = hf_tensor_name_in(arch, g).unwrap();
                assert_eq!(gguf_tensor_name_in(arch, &hf).as_deref(), Some(g), "{arch:?} {g}");
            }
        }
    }
}
