//! Choosing one file of a GGUF repository: the quantization in a file name (`...-Q4_K_M.gguf`), whether our
//! loader reads that type, and the default pick (Q4_K_M when present, as llama.cpp's `-hf` does).

use serde::{Deserialize, Serialize};

/// One `.gguf` file of a repository.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GgufChoice {
    pub file: String,
    /// `Q4_K_M`, `Q8_0`, `F16`, ... as the file name says, upper case; empty when the name does not say.
    pub quant: String,
    pub size_bytes: Option<u64>,
    /// Whether our GGUF reader has kernels for this type (the i-quants and ternary types it has not).
    pub supported: bool,
}

/// Preferred defaults, best first: a 4-bit K-quant is what llama.cpp, LM Studio and Ollama pick.
const DEFAULT_ORDER: [&str; 12] =
    ["Q4_K_M", "Q4_K_S", "Q4_K", "Q5_K_M", "Q5_K_S", "Q4_0", "Q4_1", "Q6_K", "Q8_0", "Q3_K_M", "BF16", "F16"];

/// The quantization a GGUF file name states, e.g. `Llama-3.2-1B-Instruct-Q4_K_M.gguf` -> `Q4_K_M`.
pub fn quant_of(file: &str) -> String {
    let name = file.rsplit('/').next().unwrap_or(file);
    let stem = name.strip_suffix(".gguf").unwrap_or(name);
    // Quant names hold `_` (Q4_K_M) but never `-` or `.`, which separate the name's parts.
    stem.split(['-', '.']).map(str::to_ascii_uppercase).filter(|part| is_quant_name(part)).last().unwrap_or_default()
}

fn is_quant_name(text: &str) -> bool {
    let t = text.strip_prefix('I').unwrap_or(text);
    matches!(t, "F16" | "F32" | "BF16")
        || (t.starts_with('Q') && t[1..].chars().next().is_some_and(|c| c.is_ascii_digit()))
        || t.starts_with("TQ")
}

/// Whether the reader handles the type a quant name stands for.
pub fn quant_supported(quant: &str) -> bool {
    !(quant.starts_with("IQ") || quant.starts_with("TQ"))
}

/// The single-file GGUFs among `files` (split `-00001-of-00003` sets are not read), with their quants.
pub fn gguf_choices<'a>(files: impl IntoIterator<Item = (&'a str, Option<u64>)>) -> Vec<GgufChoice> {
    files
        .into_iter()
        .filter(|(f, _)| f.to_ascii_lowercase().ends_with(".gguf") && !is_split_part(f))
        .map(|(f, size)| {
            let quant = quant_of(f);
            GgufChoice { file: f.to_string(), supported: quant_supported(&quant), quant, size_bytes: size }
        })
        .collect()
}

fn is_split_part(file: &str) -> bool {
    let stem = file.strip_suffix(".gguf").unwrap_or(file);
    let parts: Vec<&str> = stem.rsplitn(4, '-').collect();
    parts.len() == 4 && parts[1] == "of" && parts[0].chars().all(|c| c.is_ascii_digit())
}

/// The file to take: the one whose quant equals `wanted` (case-insensitive), else the default order, else the
/// first supported one.
pub fn pick<'c>(choices: &'c [GgufChoice], wanted: Option<&str>) -> Option<&'c GgufChoice> {
    if let Some(wanted) = wanted {
        let wanted = wanted.to_ascii_uppercase();
        return choices.iter().find(|c| c.quant == wanted || c.file.eq_ignore_ascii_case(&wanted));
    }
    DEFAULT_ORDER
        .iter()
        .find_map(|q| choices.iter().find(|c| c.quant == *q))
        .or_else(|| choices.iter().find(|c| c.supported))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quants_come_from_file_names() {
        assert_eq!(quant_of("Llama-3.2-1B-Instruct-Q4_K_M.gguf"), "Q4_K_M");
        assert_eq!(quant_of("sub/smollm2-135m-instruct.q8_0.gguf"), "Q8_0");
        assert_eq!(quant_of("model-IQ4_XS.gguf"), "IQ4_XS");
        assert_eq!(quant_of("SmolLM2-135M-Instruct-Q4_1.gguf"), "Q4_1");
        assert_eq!(quant_of("qwen2.5-0.5b-instruct-fp16.gguf"), "");
        assert_eq!(quant_of("x-BF16.gguf"), "BF16");
        assert!(!quant_supported("IQ4_XS"));
    }

    #[test]
    fn the_default_pick_is_q4_k_m_and_splits_are_skipped() {
        let files = [
            ("m-Q8_0.gguf", Some(8)),
            ("m-Q4_K_M.gguf", Some(4)),
            ("m-IQ2_M.gguf", Some(2)),
            ("big-Q4_K_M-00001-of-00002.gguf", Some(9)),
            ("README.md", None),
        ];
        let choices = gguf_choices(files);
        assert_eq!(choices.len(), 3);
        assert_eq!(pick(&choices, None).unwrap().file, "m-Q4_K_M.gguf");
        assert_eq!(pick(&choices, Some("q8_0")).unwrap().file, "m-Q8_0.gguf");
        assert!(pick(&choices, Some("Q5_K_M")).is_none());
    }
}
