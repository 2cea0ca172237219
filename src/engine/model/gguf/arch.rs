//! The one table between our architectures and llama.cpp's `general.architecture` names, and what each GGUF
//! architecture means for reading and writing: which of llama.cpp's convert scripts' quirks apply to it. The GGUF
//! reader and the GGUF exporters both ask here, so a file we write is read back the way llama.cpp reads it.
//!
//! From llama.cpp's `convert_hf_to_gguf.py`: `LlamaModel` (registered for `LlamaForCausalLM` and
//! `MistralForCausalLM`) writes `general.architecture = llama` and permutes the q/k rows for GGML's interleaved
//! rope; `Qwen2Model` and `Qwen3Model` write `qwen2` / `qwen3` and keep Hugging Face's row order (llama.cpp runs
//! them with the NEOX, half-split, rope). llama.cpp has no dense `mistral` architecture, so a Mistral model is a
//! `llama` file; we tell it apart by the model name the convert script records (`general.basename` /
//! `general.name`), which changes only the family shown, not the math.
//!
//! `Gemma3Model` writes `gemma3` (registered for `Gemma3ForCausalLM` and the text tower of
//! `Gemma3ForConditionalGeneration`) and adds 1 to every `*norm.weight` (Gemma's RMS norm multiplies by 1 + w;
//! llama.cpp's by the stored weight), see [`norm_weight_shift`]. `Phi3MiniModel` writes `phi3` with the fused
//! q|k|v and gate|up projections as they are. Neither permutes q/k rows (llama.cpp runs both with NEOX rope).
//!
//! `Olmo2Model` writes `olmo2` and, deriving from the plain `TextModel`, keeps Hugging Face's q/k row order
//! (llama.cpp runs olmo2 with NEOX rope). `SmolLM3Model` and `GraniteModel` derive from `LlamaModel`: their
//! `smollm3` / `granite` files have q/k rows permuted like `llama` (llama.cpp runs both with its interleaved rope).

use crate::engine::model::config::Architecture;

/// The GGUF architectures the reader understands (`general.architecture`), for error messages.
pub const SUPPORTED_GGUF_ARCHITECTURES: &str =
    "llama (llama, mistral), qwen2, qwen3, gemma3, phi3, olmo2, smollm3, granite";

/// llama.cpp's `general.architecture` for ours.
pub fn gguf_architecture(arch: Architecture) -> &'static str {
    match arch {
        Architecture::Llama | Architecture::Mistral => "llama",
        Architecture::Qwen2 => "qwen2",
        Architecture::Qwen3 => "qwen3",
        Architecture::Gemma3 => "gemma3",
        Architecture::Olmo2 => "olmo2",
        Architecture::Phi3 => "phi3",
        Architecture::SmolLM3 => "smollm3",
        Architecture::Granite => "granite",
    }
}

/// Whether llama.cpp stores this architecture's q/k rows permuted for its interleaved rope.
pub fn permutes_qk(arch: Architecture) -> bool {
    matches!(gguf_architecture(arch), "llama" | "smollm3" | "granite")
}

/// What llama.cpp's convert script adds to every RMS norm weight (`*norm.weight`) of this architecture: 1 for
/// gemma3, whose Hugging Face weights are stored without the 1 the norm adds; 0 elsewhere. The reader subtracts
/// it, so the tensors it returns are the Hugging Face ones.
pub fn norm_weight_shift(arch: Architecture) -> f64 {
    match arch {
        Architecture::Gemma3 => 1.0,
        _ => 0.0,
    }
}

/// Our architecture for a GGUF file's `general.architecture`, given the model names the file records
/// (`general.basename`, `general.name`); `None` when we cannot read it.
pub fn architecture_of_gguf(gguf_arch: &str, model_names: &[&str]) -> Option<Architecture> {
    match gguf_arch {
        "llama" if model_names.iter().any(|n| n.to_ascii_lowercase().contains("mistral")) => {
            Some(Architecture::Mistral)
        }
        "llama" => Some(Architecture::Llama),
        "qwen2" => Some(Architecture::Qwen2),
        "qwen3" => Some(Architecture::Qwen3),
        "gemma3" => Some(Architecture::Gemma3),
        "phi3" => Some(Architecture::Phi3),
        "olmo2" => Some(Architecture::Olmo2),
        "smollm3" => Some(Architecture::SmolLM3),
        "granite" => Some(Architecture::Granite),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_architecture_round_trips_through_its_gguf_name() {
        for arch in [
            Architecture::Llama,
            Architecture::Qwen2,
            Architecture::Qwen3,
            Architecture::Gemma3,
            Architecture::Phi3,
            Architecture::Olmo2,
            Architecture::SmolLM3,
            Architecture::Granite,
        ] {
            assert_eq!(architecture_of_gguf(gguf_architecture(arch), &[]), Some(arch));
        }
        let mistral = architecture_of_gguf(gguf_architecture(Architecture::Mistral), &["Mistral-7B-Instruct-v0.3"]);
        assert_eq!(mistral, Some(Architecture::Mistral));
        assert!(permutes_qk(Architecture::Mistral) && permutes_qk(Architecture::Llama));
        assert!(!permutes_qk(Architecture::Qwen2) && !permutes_qk(Architecture::Qwen3));
        assert_eq!(architecture_of_gguf("gpt2", &["llama"]), None);
        assert_eq!(architecture_of_gguf("olmo3", &[]), None);
        assert!(!permutes_qk(Architecture::Olmo2));
        assert!(permutes_qk(Architecture::SmolLM3) && permutes_qk(Architecture::Granite));
        assert!(!permutes_qk(Architecture::Gemma3) && !permutes_qk(Architecture::Phi3));
        assert_eq!((norm_weight_shift(Architecture::Gemma3), norm_weight_shift(Architecture::Phi3)), (1.0, 0.0));
    }
}
