//! Plain-data summaries the worker sends to its front ends: numbers and strings only, never tensors or
//! models, so a panel can keep them for as long as it likes. Where the engine already has a plain-data type
//! (run and checkpoint listings, the dataset report) the worker passes it on as is.

use crate::engine::estimate::ModelShape;
use crate::engine::generate::StopReason;
use std::path::PathBuf;

/// What a loaded model is, for the model panel and the memory estimate.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ModelSummary {
    pub path: PathBuf,
    /// "safetensors" or "gguf".
    pub format: String,
    pub architecture: String,
    /// Sizes for the estimates and the settings validation (the engine's own type).
    #[serde(flatten)]
    pub shape: ModelShape,
    pub tied_embeddings: bool,
    /// Compute dtype, e.g. "f32", "bf16".
    pub dtype: String,
    /// Why this dtype: "default on cpu", "chosen", or why the device could not run the one asked for.
    #[serde(default)]
    pub dtype_reason: String,
    /// Why the model is not on the device asked for (e.g. Metal listed no GPU, so the CPU), if so.
    #[serde(default)]
    pub device_note: Option<String>,
    /// Memory a run can use on the model's device (RAM; a Mac's recommended GPU working set), when known.
    #[serde(default)]
    pub memory_budget_bytes: Option<u64>,
    /// What that budget is, for messages.
    #[serde(default)]
    pub memory_budget_name: String,
    /// What the checkpoint says it was saved in, if it says.
    pub weights_dtype: Option<String>,
    /// How the loaded base's projections are held: "dense", or quantized types and counts ("q4_1 x 210").
    #[serde(default)]
    pub base_weights: String,
    /// The base quantization the model was loaded with (what a run on it records).
    #[serde(default)]
    pub quantize: crate::engine::model::BaseQuant,
    /// "cpu", "cuda" or "metal".
    pub device: String,
    pub has_chat_template: bool,
    pub eos_token_ids: Vec<u32>,
    pub load_secs: f64,
    /// What the user should know about how the model was read (the engine's `LoadedModel::notes`).
    #[serde(default)]
    pub notes: Vec<String>,
}

impl ModelSummary {
    /// Display name: the folder or file name.
    pub fn name(&self) -> String {
        display_name(&self.path)
    }
}

/// A short name for a model path: the file name, or for a Hugging Face cache snapshot the repo name.
pub fn display_name(path: &std::path::Path) -> String {
    let parts: Vec<String> = path.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    // .../models--org--name/snapshots/<hash>[/file.gguf]
    if let Some(i) = parts.iter().position(|p| p.starts_with("models--")) {
        let repo = parts[i].trim_start_matches("models--").replacen("--", "/", 1);
        return match parts.last() {
            Some(last) if last.ends_with(".gguf") => format!("{repo}/{last}"),
            _ => repo,
        };
    }
    path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| path.display().to_string())
}

/// A model found on disk by [`super::Command::ScanModels`].
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct FoundModel {
    pub path: PathBuf,
    pub name: String,
    /// "safetensors" or "gguf".
    pub format: String,
    pub size_bytes: u64,
    /// Where it was found: "Hugging Face cache" or the folder that was scanned.
    pub origin: String,
    /// The model family (`llama`, `mistral`, `qwen2`, ...) when we can run it (the engine's `model_family`).
    #[serde(default)]
    pub family: Option<String>,
    /// Why we cannot run it, when we cannot: the engine's error (an unsupported architecture, a bad config).
    #[serde(default)]
    pub unsupported: Option<String>,
}

pub use crate::engine::checkpoint::{BestCheckpoint, CheckpointInfo};
pub use crate::engine::data::{DatasetReport, LengthHistogram, PreviewRow, SplitName, SplitReport, TokenStats};
pub use crate::engine::train::run_folder::RunInfo;

/// How a generation went.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct GenerationStats {
    pub prompt_tokens: usize,
    pub new_tokens: usize,
    pub prefill_secs: f64,
    pub decode_secs: f64,
    pub stop_reason: StopReason,
}

impl GenerationStats {
    pub fn decode_tokens_per_sec(&self) -> f64 {
        if self.decode_secs > 0.0 {
            self.new_tokens.saturating_sub(1) as f64 / self.decode_secs
        } else {
            0.0
        }
    }
}
