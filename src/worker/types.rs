//! Plain-data summaries the worker sends to its front ends: numbers and strings only, never tensors or
//! models, so a panel can keep them for as long as it likes.

use crate::engine::train::TrainConfig;
use std::path::PathBuf;

/// What a loaded model is, for the model panel and the memory estimate.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ModelSummary {
    pub path: PathBuf,
    /// "safetensors" or "gguf".
    pub format: String,
    pub architecture: String,
    pub parameters: usize,
    pub layers: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub attention_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub vocab_size: usize,
    pub context_length: usize,
    pub tied_embeddings: bool,
    /// Compute dtype, e.g. "f32", "bf16".
    pub dtype: String,
    /// Why this dtype: "default on cpu", "chosen", or why the device could not run the one asked for.
    #[serde(default)]
    pub dtype_reason: String,
    /// Why the model is not on the device asked for (e.g. Metal listed no GPU, so the CPU), if so.
    #[serde(default)]
    pub device_note: Option<String>,
    /// Bytes per element of the compute dtype.
    pub dtype_bytes: usize,
    /// What the checkpoint says it was saved in, if it says.
    pub weights_dtype: Option<String>,
    /// "cpu", "cuda" or "metal".
    pub device: String,
    pub has_chat_template: bool,
    pub eos_token_ids: Vec<u32>,
    /// (module, in_features, out_features) for each adaptable linear of a decoder layer.
    pub linear_shapes: Vec<(String, usize, usize)>,
    pub load_secs: f64,
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
}

/// One split (file) of a dataset.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SplitReport {
    /// "train", "valid", "test", or the file stem.
    pub split: String,
    pub path: PathBuf,
    /// "chat", "completions" or "text"; None when no row is valid.
    pub format: Option<String>,
    pub rows: usize,
    pub blank_lines: usize,
    /// (1-based line, message).
    pub problems: Vec<(usize, String)>,
}

/// Token statistics of the training split under a model's tokenizer and chat template.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TokenStats {
    /// Token length of each training row before truncation.
    pub lengths: Vec<usize>,
    pub max_seq_len: usize,
    /// Rows longer than `max_seq_len`.
    pub truncated: usize,
    /// Rows with no trained token left within `max_seq_len` (the trainer drops them).
    pub dropped: usize,
    pub total_tokens: usize,
    /// Tokens that are training targets (after truncation).
    pub target_tokens: usize,
    /// Rows that could not be tokenized: (split, line, message).
    pub failures: Vec<(String, usize, String)>,
}

/// One previewed row: its text pieces, each flagged trained (true) or masked (false).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PreviewRow {
    pub split: String,
    pub line: usize,
    pub tokens: usize,
    pub truncated: bool,
    pub pieces: Vec<(String, bool)>,
}

/// Everything the dataset panel shows.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct DatasetReport {
    pub path: PathBuf,
    pub splits: Vec<SplitReport>,
    /// None until a model (its tokenizer and template) is loaded.
    pub tokens: Option<TokenStats>,
    pub preview: Vec<PreviewRow>,
    /// The model the token statistics were computed with.
    pub tokenizer_model: Option<PathBuf>,
    /// Remarks worth showing (no chat template, no model loaded, ...).
    pub notes: Vec<String>,
}

impl DatasetReport {
    pub fn problem_count(&self) -> usize {
        self.splits.iter().map(|s| s.problems.len()).sum()
    }

    pub fn rows(&self, split: &str) -> usize {
        self.splits.iter().filter(|s| s.split == split).map(|s| s.rows).sum()
    }
}

/// One checkpoint of a run.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CheckpointSummary {
    pub step: usize,
    pub path: PathBuf,
    pub size_bytes: u64,
    pub train_loss: Option<f64>,
    pub val_loss: Option<f64>,
    pub saved_unix_secs: u64,
}

/// One run folder, reduced to what the browser shows.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RunSummary {
    pub name: String,
    pub dir: PathBuf,
    pub config: Option<TrainConfig>,
    pub started_unix_secs: Option<u64>,
    /// (step, loss).
    pub train_loss: Vec<[f64; 2]>,
    /// (step, validation loss).
    pub val_loss: Vec<[f64; 2]>,
    pub total_steps: Option<usize>,
    pub trainable_params: Option<usize>,
    /// "finished", "stopped", "failed: ..." or "incomplete".
    pub status: String,
    pub checkpoints: Vec<CheckpointSummary>,
}

/// How a generation went.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct GenerationStats {
    pub prompt_tokens: usize,
    pub new_tokens: usize,
    pub prefill_secs: f64,
    pub decode_secs: f64,
    /// "eos", "max_tokens", "stop_string", "context_full" or "cancelled".
    pub stop_reason: String,
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
