//! The studio's persisted preferences (one `#[serde(default)]` struct) and the pages they remember.

use super::chat_transcript::ChatMode;
use crate::engine::device::{DTypeChoice, DeviceChoice};
use crate::engine::sampler::SamplingParams;
use crate::engine::train::TrainConfig;
use std::path::{Path, PathBuf};

/// Entries kept in the recent lists.
const RECENT: usize = 8;

/// The pages, in navigation order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub enum Page {
    #[default]
    Model,
    Dataset,
    Settings,
    Training,
    Checkpoints,
    Evaluate,
    Chat,
    Ranks,
}

impl Page {
    pub const ALL: [Page; 8] = [
        Page::Model,
        Page::Dataset,
        Page::Settings,
        Page::Training,
        Page::Checkpoints,
        Page::Evaluate,
        Page::Chat,
        Page::Ranks,
    ];

    /// The navigation label.
    pub fn title(self) -> &'static str {
        match self {
            Page::Model => "Model",
            Page::Dataset => "Dataset",
            Page::Settings => "LoRA settings",
            Page::Training => "Train",
            Page::Checkpoints => "Checkpoints",
            Page::Evaluate => "Evaluate",
            Page::Chat => "Chat",
            Page::Ranks => "Rank explorer",
        }
    }

    /// Parse a page name as given to `--page` (case-insensitive, first word is enough).
    pub fn from_name(name: &str) -> Option<Page> {
        let n = name.to_ascii_lowercase();
        Page::ALL.into_iter().find(|p| {
            let t = p.title().to_ascii_lowercase();
            t == n || t.split_whitespace().next() == Some(n.as_str()) || format!("{p:?}").to_ascii_lowercase() == n
        })
    }
}

/// The chat pane's default repetition penalty: Ollama's default, 1.1. Without one, small base models loop on short
/// prompts (SmolLM2-135M-Instruct on "Tell me about cats.", temperature 0.7, seed 42, repeats "They're the most
/// beautiful thing." five times within 120 tokens at 1.0 and does not at 1.1); the CLI's `generate` keeps 1.0
/// (off), as transformers does, unless `--repetition-penalty` says otherwise.
pub const CHAT_REPETITION_PENALTY: f32 = 1.1;

/// Chat preferences.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct ChatPrefs {
    pub system_prompt: String,
    pub sampling: SamplingParams,
    pub max_tokens: usize,
    pub mode: ChatMode,
    /// Adapter folders loaded with "Load adapter…", newest first.
    pub recent_adapters: Vec<PathBuf>,
}

impl Default for ChatPrefs {
    fn default() -> Self {
        Self {
            system_prompt: String::new(),
            sampling: SamplingParams { repetition_penalty: CHAT_REPETITION_PENALTY, ..SamplingParams::default() },
            max_tokens: 256,
            mode: ChatMode::Base,
            recent_adapters: Vec::new(),
        }
    }
}

/// Rank explorer preferences.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct RankPrefs {
    pub ranks: Vec<usize>,
    pub token_budget: usize,
}

impl Default for RankPrefs {
    fn default() -> Self {
        Self { ranks: vec![4, 8, 16, 32, 64], token_budget: 20_000 }
    }
}

/// Everything that persists between launches. Runtime handles (the worker, channels) live outside it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct Prefs {
    pub page: Page,
    /// The model path field.
    pub model_path: String,
    pub recent_models: Vec<PathBuf>,
    /// Extra folders scanned for models.
    pub model_dirs: Vec<PathBuf>,
    pub device: DeviceChoice,
    pub dtype: DTypeChoice,
    /// How the next model load holds the base's projections (QLoRA when quantized).
    pub quantize: crate::engine::model::BaseQuant,
    pub auto_load_model: bool,
    /// The dataset path field.
    pub dataset_input: String,
    /// The dataset in use.
    pub dataset: Option<PathBuf>,
    pub recent_datasets: Vec<PathBuf>,
    pub train: TrainConfig,
    /// EMA smoothing of the loss plot.
    pub smoothing: f32,
    pub chat: ChatPrefs,
    pub rank: RankPrefs,
    pub overlay_runs: Vec<String>,
    /// The export dialog's last format and quantization, offered again next time.
    pub export: crate::studio::export_dialog::ExportPrefs,
    /// The Evaluate page's targets, prompt set and task options.
    pub eval: crate::studio::eval_setup::EvalPrefs,
    /// GPUs a run trains on (data-parallel above one: one process per GPU).
    pub gpus: usize,
    /// CUDA GPUs this machine has (found at start-up, never saved): the GPU count is offered above one.
    #[serde(skip)]
    pub gpus_on_host: usize,
}

impl Default for Prefs {
    fn default() -> Self {
        Self {
            page: Page::Model,
            model_path: String::new(),
            recent_models: Vec::new(),
            model_dirs: Vec::new(),
            device: DeviceChoice::Auto,
            dtype: DTypeChoice::Auto,
            quantize: crate::engine::model::BaseQuant::None,
            auto_load_model: true,
            dataset_input: String::new(),
            dataset: None,
            recent_datasets: Vec::new(),
            train: studio_train_defaults(),
            smoothing: 0.6,
            chat: ChatPrefs::default(),
            rank: RankPrefs::default(),
            overlay_runs: Vec::new(),
            export: crate::studio::export_dialog::ExportPrefs::default(),
            eval: crate::studio::eval_setup::EvalPrefs::default(),
            gpus: 1,
            gpus_on_host: 0,
        }
    }
}

/// Training defaults sized for a first run on a small model and the bundled sample data.
pub fn studio_train_defaults() -> TrainConfig {
    TrainConfig { iters: Some(100), seq_len: 256, val_every: 20, save_every: 50, ..TrainConfig::default() }
}

/// Put `path` first in a recent list.
pub fn remember(list: &mut Vec<PathBuf>, path: &Path) {
    list.retain(|p| p != path);
    list.insert(0, path.to_path_buf());
    list.truncate(RECENT);
}
