//! Loading a model from disk: a Hugging Face folder (config.json, safetensors, tokenizer.json, chat template,
//! generation_config.json) or a single GGUF file, into one [`LoadedModel`].

use super::chat_template::{find_template_source, token_string, ChatMessage, ChatTemplate};
use super::config::{ModelConfig, OneOrMany, RawConfig};
use super::quant::BaseQuant;
use super::safetensors_reader::LoadProgressFn;
use super::safetensors_weights::Weights;
use super::tokenizer::TextTokenizer;
use super::transformer::Transformer;
use crate::engine::input_file::optional_file;
use crate::engine::{Error, Result};
use candle_core::{DType, Device};
use std::path::{Path, PathBuf};

/// What kind of model a path holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelSource {
    /// A Hugging Face model folder.
    HfFolder(PathBuf),
    /// A single `.gguf` file.
    Gguf(PathBuf),
}

impl ModelSource {
    /// Classify a path the user gave us: a folder, a `.gguf` file, or a `config.json` inside a folder.
    pub fn detect(path: &Path) -> Result<Self> {
        if std::fs::symlink_metadata(path).is_err() {
            return Err(Error::MissingFile {
                path: path.to_path_buf(),
                what: "expected a Hugging Face model folder or a .gguf file".into(),
            });
        }
        if std::fs::metadata(path).is_ok_and(|m| m.is_dir()) {
            return Ok(Self::HfFolder(path.to_path_buf()));
        }
        // Anything else must be a regular file: a looping or dangling link, a FIFO or a device says which.
        crate::engine::input_file::regular_file_metadata(path)?;
        let is_gguf = path.extension().map(|e| e.eq_ignore_ascii_case("gguf")).unwrap_or(false);
        if is_gguf {
            return Ok(Self::Gguf(path.to_path_buf()));
        }
        if path.file_name().map(|n| n == "config.json").unwrap_or(false) {
            if let Some(parent) = path.parent() {
                return Ok(Self::HfFolder(parent.to_path_buf()));
            }
        }
        Err(Error::InvalidSetting(format!("{} is neither a model folder nor a .gguf file", path.display())))
    }

    pub fn path(&self) -> &Path {
        match self {
            Self::HfFolder(p) | Self::Gguf(p) => p,
        }
    }

    pub fn format_name(&self) -> &'static str {
        match self {
            Self::HfFolder(_) => "safetensors",
            Self::Gguf(_) => "gguf",
        }
    }
}

/// Everything about a model but its weights: enough to tokenize, template and describe it (what an export
/// that streams the weights one tensor at a time needs). [`load_model_info`] reads it without any tensor.
pub struct ModelInfo {
    pub source: ModelSource,
    /// As the weights will resolve it, except `tie_word_embeddings`, which [`load_model`] also sets when a
    /// folder's weights ship no `lm_head` (the export's tensor source does the same).
    pub config: ModelConfig,
    pub tokenizer: TextTokenizer,
    pub chat_template: Option<ChatTemplate>,
    /// Every id that ends a generation (config, generation_config.json and the tokenizer's eos token).
    pub eos_token_ids: Vec<u32>,
    /// What a user should know about how the model was read (e.g. a multimodal checkpoint's vision tower
    /// left out); front ends show them with the model.
    pub notes: Vec<String>,
}

impl ModelInfo {
    /// Render a conversation with the model's chat template.
    pub fn render_chat(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        render_with(self.chat_template.as_ref(), &self.source, messages, add_generation_prompt)
    }
}

/// A model ready to run: weights on a device, tokenizer, chat template and stop ids.
pub struct LoadedModel {
    pub source: ModelSource,
    pub config: ModelConfig,
    pub model: Transformer,
    pub tokenizer: TextTokenizer,
    pub chat_template: Option<ChatTemplate>,
    /// Every id that ends a generation (config, generation_config.json and the tokenizer's eos token).
    pub eos_token_ids: Vec<u32>,
    /// What a user should know about how the model was read ([`ModelInfo::notes`]).
    pub notes: Vec<String>,
}

impl LoadedModel {
    /// Render a conversation with the model's chat template.
    pub fn render_chat(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        render_with(self.chat_template.as_ref(), &self.source, messages, add_generation_prompt)
    }

    /// Token ids for a chat: rendered text tokenized without adding special tokens again, as transformers'
    /// `apply_chat_template(tokenize=True)` does.
    pub fn encode_chat(&self, messages: &[ChatMessage]) -> Result<Vec<u32>> {
        let text = self.render_chat(messages, true)?;
        self.encode_prompt(&text, false)
    }

    /// Token ids of a prompt, refused before tokenizing when the text is longer than the context could hold
    /// even at the vocabulary's longest token: tokenizing megabytes (a prompt pasted by mistake, a hostile
    /// template's output) takes seconds and gigabytes only to be refused as too long afterwards.
    pub fn encode_prompt(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        let context = self.config.max_position_embeddings;
        let max_bytes = context.saturating_mul(self.tokenizer.longest_token_bytes().max(1));
        if text.len() > max_bytes {
            return Err(Error::PromptTooLongText { bytes: text.len(), context_len: context });
        }
        self.tokenizer.encode(text, add_special_tokens)
    }
}

fn render_with(
    template: Option<&ChatTemplate>,
    source: &ModelSource,
    messages: &[ChatMessage],
    add_generation_prompt: bool,
) -> Result<String> {
    let template = template.ok_or_else(|| {
        Error::ChatTemplate(format!(
            "{} has no chat template (tokenizer_config.json `chat_template`, chat_template.jinja or GGUF \
             `tokenizer.chat_template`); use a plain prompt instead",
            source.path().display()
        ))
    })?;
    template.render(messages, add_generation_prompt)
}

/// How a model is loaded, beyond its device and dtype: what every front end passes from its own choice
/// (the CLI's `--quantize`, the studio model panel's "Base weights").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LoadOptions {
    /// How the decoder layers' projections are held (dense, the GGUF's own types, or quantized at load).
    pub quantize: BaseQuant,
}

/// Load a model folder or GGUF file onto `device` in `dtype`, dense.
pub fn load_model(path: &Path, device: &Device, dtype: DType) -> Result<LoadedModel> {
    load_model_with(path, device, dtype, &LoadOptions::default())
}

/// Load a model folder or GGUF file onto `device` in `dtype`, as `options` say.
pub fn load_model_with(path: &Path, device: &Device, dtype: DType, options: &LoadOptions) -> Result<LoadedModel> {
    load_model_reporting(path, device, dtype, options, None)
}

/// [`load_model_with`], calling `progress` as the weights are read, tensor by tensor (bytes of the total and
/// the time so far): what the studio's and the CLI's load progress show.
pub fn load_model_reporting(
    path: &Path,
    device: &Device,
    dtype: DType,
    options: &LoadOptions,
    progress: Option<LoadProgressFn>,
) -> Result<LoadedModel> {
    match ModelSource::detect(path)? {
        ModelSource::HfFolder(folder) => load_hf_folder(&folder, device, dtype, options.quantize, progress),
        ModelSource::Gguf(file) => load_gguf_file(&file, device, dtype, options.quantize, progress.as_ref()),
    }
}

/// The family of the model at `path`, read cheaply (a folder's `config.json`, a GGUF file's header; no weights,
/// no tokenizer): the one rule for "is this a model we can run, and which family is it", asked by the model scan
/// of the studio and the CLI. An error says why not (unsupported architecture, a bad config, a corrupt file).
pub fn model_family(path: &Path) -> Result<super::config::Architecture> {
    match ModelSource::detect(path)? {
        ModelSource::HfFolder(folder) => {
            let config_path = folder.join("config.json");
            Ok(RawConfig::from_file(&config_path)?.resolve(&config_path)?.architecture)
        }
        ModelSource::Gguf(file) => super::gguf::gguf_family(&file),
    }
}

/// Read a model's config, tokenizer, chat template and stop ids without loading any weight.
pub fn load_model_info(path: &Path) -> Result<ModelInfo> {
    match ModelSource::detect(path)? {
        ModelSource::HfFolder(folder) => hf_folder_info(&folder),
        ModelSource::Gguf(file) => {
            let g = super::gguf::GgufTensorReader::open(&file)?;
            gguf_info(&file, g.model_without_tensors()?)
        }
    }
}

fn load_hf_folder(
    folder: &Path,
    device: &Device,
    dtype: DType,
    quant: BaseQuant,
    progress: Option<LoadProgressFn>,
) -> Result<LoadedModel> {
    let mut info = hf_folder_info(folder)?;
    let weights = Weights::open_folder_reporting(folder, progress)?;
    if info.config.multimodal {
        info.notes = vec![text_tower_note(Some(weights.ignored_tensors()))];
    }
    let model = Transformer::load_with(&info.config, &weights, dtype, device, quant)?;
    Ok(with_weights(info, model))
}

/// The notice for a multimodal checkpoint: what is loaded and what is not (`ignored` tensors, when counted).
fn text_tower_note(ignored: Option<usize>) -> String {
    let count = ignored.map(|n| format!(" ({n} tensors)")).unwrap_or_default();
    format!(
        "multimodal checkpoint: only its text model is loaded and trained; the vision tower and multimodal \
         projector weights{count} are ignored, so images are not supported"
    )
}

fn with_weights(info: ModelInfo, model: Transformer) -> LoadedModel {
    let ModelInfo { source, tokenizer, chat_template, eos_token_ids, notes, .. } = info;
    LoadedModel { source, config: model.config.clone(), model, tokenizer, chat_template, eos_token_ids, notes }
}

fn hf_folder_info(folder: &Path) -> Result<ModelInfo> {
    let config_path = folder.join("config.json");
    if optional_file(&config_path)?.is_none() {
        return Err(Error::MissingFile {
            path: config_path,
            what: "a Hugging Face model folder needs config.json".into(),
        });
    }
    let raw = RawConfig::from_file(&config_path)?;
    let config = raw.resolve(&config_path)?;
    let tokenizer_path = folder.join("tokenizer.json");
    let inner = TextTokenizer::from_file(&tokenizer_path)?;
    let tokenizer_config: Option<serde_json::Value> = {
        let p = folder.join("tokenizer_config.json");
        optional_file(&p)?.map(crate::engine::error::read_json).transpose()?
    };
    let bos = token_string(tokenizer_config.as_ref().and_then(|c| c.get("bos_token")));
    let eos = token_string(tokenizer_config.as_ref().and_then(|c| c.get("eos_token")));
    let tokenizer =
        TextTokenizer::new(inner, bos.clone(), eos.clone()).with_vocab_limit(&tokenizer_path, config.vocab_size);
    let template_file = match folder.join("chat_template.jinja") {
        jinja if optional_file(&jinja)?.is_some() => jinja,
        _ => folder.join("tokenizer_config.json"),
    };
    let chat_template = find_template_source(folder, tokenizer_config.as_ref())?
        .map(|src| ChatTemplate::new(src, bos, eos.clone()).map(|t| t.with_origin(template_file.display().to_string())))
        .transpose()?;

    let mut eos_token_ids = config.eos_token_ids.clone();
    let generation_config = folder.join("generation_config.json");
    if optional_file(&generation_config)?.is_some() {
        let value: serde_json::Value = crate::engine::error::read_json(&generation_config)?;
        if let Some(e) = value.get("eos_token_id") {
            if let Ok(ids) = serde_json::from_value::<OneOrMany>(e.clone()) {
                let ids = ids.to_vec();
                if let Some(id) = ids.iter().find(|id| **id as usize >= config.vocab_size) {
                    return Err(Error::BadConfig {
                        path: generation_config,
                        field: "eos_token_id".into(),
                        message: format!("token id {id} is past the vocabulary of {} tokens", config.vocab_size),
                    });
                }
                eos_token_ids.extend(ids);
            }
        }
    }
    if let Some(id) = eos.as_deref().and_then(|t| tokenizer.token_to_id(t)) {
        eos_token_ids.push(id);
    }
    dedup_in_order(&mut eos_token_ids);
    let mut notes = if config.multimodal { vec![text_tower_note(None)] } else { Vec::new() };
    notes.extend(tokenizer.vocab_note());
    Ok(ModelInfo {
        source: ModelSource::HfFolder(folder.to_path_buf()),
        config,
        tokenizer,
        chat_template,
        eos_token_ids,
        notes,
    })
}

fn load_gguf_file(
    file: &Path,
    device: &Device,
    dtype: DType,
    quant: BaseQuant,
    progress: Option<&LoadProgressFn>,
) -> Result<LoadedModel> {
    let mut g = super::gguf::load_gguf_with(file, device, dtype, quant.is_quantized(), progress)?;
    let (tensors, quantized) = (std::mem::take(&mut g.tensors), std::mem::take(&mut g.quantized));
    let weights = Weights::from_maps(tensors, quantized, file.to_path_buf());
    let info = gguf_info(file, g)?;
    let model = Transformer::load_with(&info.config, &weights, dtype, device, quant)?;
    Ok(with_weights(info, model))
}

fn gguf_info(file: &Path, g: super::gguf::GgufModel) -> Result<ModelInfo> {
    let tokenizer = TextTokenizer::new(g.tokenizer, g.bos_token.clone(), g.eos_token.clone())
        .with_vocab_limit(file, g.config.vocab_size);
    let origin = format!("{} (GGUF metadata `tokenizer.chat_template`)", file.display());
    let chat_template = g
        .chat_template
        .map(|src| ChatTemplate::new(src, g.bos_token.clone(), g.eos_token.clone()).map(|t| t.with_origin(origin)))
        .transpose()?;
    let mut eos_token_ids = g.config.eos_token_ids.clone();
    if let Some(id) = g.eos_token.as_deref().and_then(|t| tokenizer.token_to_id(t)) {
        eos_token_ids.push(id);
    }
    // Chat models end a turn with their end-of-turn token even when the GGUF's eos is another one.
    if let Some(template) = &chat_template {
        for marker in ["<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>"] {
            if template.source.contains(marker) {
                if let Some(id) = tokenizer.token_to_id(marker) {
                    eos_token_ids.push(id);
                }
            }
        }
    }
    dedup_in_order(&mut eos_token_ids);
    let notes = tokenizer.vocab_note().into_iter().collect();
    Ok(ModelInfo {
        source: ModelSource::Gguf(file.to_path_buf()),
        config: g.config,
        tokenizer,
        chat_template,
        eos_token_ids,
        notes,
    })
}

fn dedup_in_order(ids: &mut Vec<u32>) {
    let mut seen = std::collections::HashSet::new();
    ids.retain(|id| seen.insert(*id));
}
