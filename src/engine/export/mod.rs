//! Exporting a checkpoint: a PEFT copy, mlx-lm's adapter format, a merged full model folder that
//! transformers loads like any other, or llama.cpp's formats: a merged GGUF file (any quantization in
//! [`GgufQuant`]), the adapter alone as a LoRA GGUF, or an Ollama folder (GGUF + Modelfile).
//!
//! Every front end calls [`export_with`] (or [`export`] for the adapter formats); the GGUF writer lives in
//! `gguf_writer`, the tensor types in `gguf_quant`, the metadata in `gguf_metadata`.

mod gguf_families;
mod gguf_lora;
mod gguf_metadata;
pub use gguf_metadata::from_candle_value;
mod gguf_model;
pub mod gguf_quant;
pub mod gguf_writer;
mod merged_tensors;
mod ollama;
mod output_guard;
mod safetensors_stream;

pub use gguf_quant::GgufQuant;
pub use ollama::OLLAMA_GGUF;

use crate::engine::checkpoint::{self, ADAPTER_CONFIG, ADAPTER_WEIGHTS};
use crate::engine::data::eos_doctor::{self, StopFacts, StopWarning};
use crate::engine::input_file::{optional_file, read_regular};
use crate::engine::model::transformer::{hf_linear_name, module_group};
use crate::engine::model::{load_model, load_model_info, LoadedModel, ModelInfo, ModelSource};
use crate::engine::{Error, Result};
use candle_core::{DType, Device, Tensor};
use merged_tensors::MergedTensors;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// One export: what to write, from what, where.
#[derive(Debug, Clone)]
pub struct ExportRequest {
    /// The checkpoint folder; `None` exports the base model alone (GGUF and Ollama formats only).
    pub checkpoint: Option<PathBuf>,
    pub format: ExportFormat,
    /// The quantization of `gguf` and `ollama` exports (ignored by the others).
    pub quant: GgufQuant,
    /// A folder for the folder formats, a file for `gguf` and `gguf-lora`.
    pub out: PathBuf,
    pub base_model: PathBuf,
    /// Export onto a base the adapter was not trained on (`--force-base`); refused otherwise, see
    /// [`checkpoint::base_mismatch`].
    pub allow_other_base: bool,
    /// Replace an existing output (`--overwrite`); an existing file or non-empty folder is refused otherwise.
    /// Outputs on the export's own inputs or a run's files are refused either way ([`output_guard`]).
    pub overwrite: bool,
}

/// How far an export has got: `done` of `total` tensors written, `what` is being written now.
#[derive(Debug, Clone, PartialEq)]
pub struct ExportProgress {
    pub done: usize,
    pub total: usize,
    pub what: String,
}

/// What an export wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct ExportOutcome {
    /// The file or folder written.
    pub path: PathBuf,
    /// Bytes written (the GGUF for `gguf`/`ollama`, the sum of the files for the folder formats).
    pub size_bytes: u64,
}

/// Export `checkpoint` into the folder `out` (created if needed). Returns `out`. An adapter trained on another
/// base than `base_model` is refused for the formats that apply it to one.
pub fn export(ckpt: &Path, format: ExportFormat, out: &Path, base_model: &Path) -> Result<PathBuf> {
    export_onto(ckpt, format, out, base_model, false)
}

/// As [`export`]; `allow_other_base` exports even onto a base the adapter was not trained on.
pub fn export_onto(
    ckpt: &Path,
    format: ExportFormat,
    out: &Path,
    base_model: &Path,
    allow_other_base: bool,
) -> Result<PathBuf> {
    let request = ExportRequest {
        checkpoint: Some(ckpt.to_path_buf()),
        format,
        quant: GgufQuant::default(),
        out: out.to_path_buf(),
        base_model: base_model.to_path_buf(),
        allow_other_base,
        overwrite: false,
    };
    Ok(export_with(&request, &mut |_| {})?.path)
}

/// Run one export, reporting progress tensor by tensor for the GGUF formats.
pub fn export_with(req: &ExportRequest, progress: &mut dyn FnMut(ExportProgress)) -> Result<ExportOutcome> {
    let ckpt = req.checkpoint.as_deref();
    if let Some(ckpt) = ckpt {
        if !ckpt.join(ADAPTER_CONFIG).exists() {
            return Err(Error::MissingFile { path: ckpt.join(ADAPTER_CONFIG), what: "not a checkpoint folder".into() });
        }
    }
    if req.format.reads_base() && !req.base_model.exists() {
        return Err(Error::MissingFile {
            path: req.base_model.clone(),
            what: format!(
                "the base model a {} export reads is not there (moved or deleted?); pass --model <path> with where it \
                 is now",
                req.format.as_str()
            ),
        });
    }
    output_guard::check_output(req)?;
    let out = req.out.as_path();
    // A folder this export creates is removed again when it fails: a refusal leaves nothing behind.
    let created_here = std::fs::symlink_metadata(out).is_err();
    let written = write_export(req, progress);
    if written.is_err() && created_here && out.is_dir() {
        let _ = std::fs::remove_dir_all(out);
    }
    Ok(ExportOutcome { path: out.to_path_buf(), size_bytes: written? })
}

/// The export itself, after the request was checked; the bytes written.
fn write_export(req: &ExportRequest, progress: &mut dyn FnMut(ExportProgress)) -> Result<u64> {
    let ckpt = req.checkpoint.as_deref();
    let (out, base) = (req.out.as_path(), req.base_model.as_path());
    Ok(match (req.format, ckpt) {
        (ExportFormat::Gguf, _) => {
            create_parent(out)?;
            let model = MergedTensors::open(ckpt, base)?;
            refuse_other_base(ckpt, &model.info.source, &model.info.config, req.allow_other_base)?;
            let plan = gguf_model::plan_model_gguf(&model, &export_name(ckpt, base), req.quant)?;
            gguf_model::write_model_gguf(model, plan, out, progress)?
        }
        (ExportFormat::Ollama, _) => export_ollama(ckpt, base, req, progress)?,
        (format, None) => {
            return Err(Error::InvalidSetting(format!(
                "the {} export needs a checkpoint (only gguf and ollama can export the base model alone)",
                format.as_str()
            )))
        }
        (ExportFormat::GgufLora, Some(ckpt)) => {
            create_parent(out)?;
            gguf_lora::export_gguf_lora(ckpt, base, req.allow_other_base, out)?
        }
        (format, Some(ckpt)) => {
            export_adapter_folder(ckpt, format, out, base, req.allow_other_base)?;
            crate::engine::checkpoint::folder_size(out)
        }
    })
}

/// The template and end-of-sequence doctor on what `req` will write: the model's checks, and for `gguf` /
/// `ollama` whether the GGUF's eos/eot ids and the Modelfile's stop lines cover the end-of-turn token. Front ends
/// show these before running [`export_with`]; reads no weights.
pub fn export_stop_warnings(req: &ExportRequest) -> Result<Vec<StopWarning>> {
    let info = load_model_info(&req.base_model)?;
    let facts = StopFacts::of_info(&info);
    let (mut warnings, end_of_turn) = eos_doctor::check_model(&facts);
    if req.format.uses_quant() {
        let ids = gguf_metadata::stop_ids(&gguf_metadata::tokenizer_metadata(&info)?);
        let modelfile = (req.format == ExportFormat::Ollama).then(|| ollama::modelfile(&info)).transpose()?;
        warnings.extend(eos_doctor::check_export(&facts, end_of_turn, &ids, modelfile.as_deref()));
    }
    Ok(warnings)
}

/// The `general.name` of an export: the checkpoint's run and step, or the base model's name.
fn export_name(ckpt: Option<&Path>, base: &Path) -> String {
    let name = |p: &Path| p.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    match ckpt {
        Some(c) => match c.parent() {
            Some(run) => format!("{}-{}", name(run), name(c)),
            None => name(c),
        },
        None => name(base),
    }
}

fn create_parent(out: &Path) -> Result<()> {
    match out.parent().filter(|p| !p.as_os_str().is_empty()) {
        Some(parent) => std::fs::create_dir_all(parent).map_err(|e| Error::write(parent, e)),
        None => Ok(()),
    }
}

/// An Ollama folder: the merged GGUF and a Modelfile.
fn export_ollama(
    ckpt: Option<&Path>,
    base: &Path,
    req: &ExportRequest,
    progress: &mut dyn FnMut(ExportProgress),
) -> Result<u64> {
    let (out, quant) = (req.out.as_path(), req.quant);
    std::fs::create_dir_all(out).map_err(|e| Error::write(out, e))?;
    let model = MergedTensors::open(ckpt, base)?;
    refuse_other_base(ckpt, &model.info.source, &model.info.config, req.allow_other_base)?;
    let modelfile = ollama::modelfile(&model.info)?;
    let plan = gguf_model::plan_model_gguf(&model, &export_name(ckpt, base), quant)?;
    let size = gguf_model::write_model_gguf(model, plan, &out.join(OLLAMA_GGUF), progress)?;
    checkpoint::write_atomic(&out.join("Modelfile"), modelfile.as_bytes())?;
    Ok(size)
}

/// The adapter and merged-folder formats, written into the folder `out`.
fn export_adapter_folder(
    ckpt: &Path,
    format: ExportFormat,
    out: &Path,
    base_model: &Path,
    allow_other_base: bool,
) -> Result<()> {
    std::fs::create_dir_all(out).map_err(|e| Error::write(out, e))?;
    match format {
        ExportFormat::Peft => {
            for name in [ADAPTER_CONFIG, ADAPTER_WEIGHTS, checkpoint::BASE_MODEL_FILE] {
                let from = ckpt.join(name);
                if name == checkpoint::BASE_MODEL_FILE && optional_file(&from)?.is_none() {
                    continue;
                }
                let bytes = read_regular(&from, u64::MAX)?;
                checkpoint::write_atomic(&out.join(name), &bytes)?;
            }
        }
        ExportFormat::MlxLm => export_mlx(base_for(ckpt, base_model, allow_other_base)?, ckpt, out, base_model)?,
        ExportFormat::Merged => export_merged(ckpt, out, base_model, allow_other_base)?,
        ExportFormat::Gguf | ExportFormat::GgufLora | ExportFormat::Ollama => {
            return Err(Error::InvalidSetting(format!("{} is not an adapter folder format", format.as_str())))
        }
    }
    Ok(())
}

/// Load `base_model` (f32, CPU) for applying the adapter in `ckpt`, refusing one the adapter was not trained
/// on unless `allow_other_base`.
fn base_for(ckpt: &Path, base_model: &Path, allow_other_base: bool) -> Result<LoadedModel> {
    let model = load_model(base_model, &Device::Cpu, DType::F32)?;
    refuse_other_base(Some(ckpt), &model.source, &model.config, allow_other_base)?;
    Ok(model)
}

/// Refuse to apply the adapter in `ckpt` to a base (known by `source` and `config`) other than the one it was
/// trained on, unless `allow_other_base` (`--force-base`); see [`checkpoint::base_mismatch_of`].
pub(super) fn refuse_other_base(
    ckpt: Option<&Path>,
    source: &ModelSource,
    config: &crate::engine::model::ModelConfig,
    allow_other_base: bool,
) -> Result<()> {
    let Some(ckpt) = ckpt.filter(|_| !allow_other_base) else { return Ok(()) };
    match checkpoint::base_mismatch_of(ckpt, source, config)? {
        Some(message) => Err(Error::Adapter {
            path: ckpt.join(checkpoint::BASE_MODEL_FILE),
            message: format!("{message} (or pass --force-base to export onto this one anyway)"),
        }),
        None => Ok(()),
    }
}

/// mlx-lm stores `lora_a` (in, r) and `lora_b` (r, out) under `model.layers.N.<group>.<module>` with the
/// final multiplier as `scale` — the same layout we train in. A DoRA adapter is mlx-lm's `fine_tune_type: dora`
/// with the magnitude as `m` (mlx-lm's `DoRALinear`, the same rescaling by `m / ||W + scale (AB)^T||_row`).
fn export_mlx(mut model: LoadedModel, ckpt: &Path, out: &Path, base_model: &Path) -> Result<()> {
    let (summary, params) = checkpoint::load_adapter_params(&mut model.model, ckpt)?;
    let mut tensors = HashMap::new();
    let mut keys = std::collections::BTreeSet::new();
    let mut min_layer = usize::MAX;
    for p in &params {
        let prefix = hf_linear_name(p.layer, p.module);
        tensors.insert(format!("{prefix}.lora_a"), p.a.as_tensor().clone());
        tensors.insert(format!("{prefix}.lora_b"), p.b.as_tensor().clone());
        if let Some(m) = &p.magnitude {
            tensors.insert(format!("{prefix}.m"), m.as_tensor().clone());
        }
        keys.insert(format!("{}.{}", module_group(p.module), p.module));
        min_layer = min_layer.min(p.layer);
    }
    let peft = checkpoint::PeftAdapterConfig::read(ckpt)?;
    let config = serde_json::json!({
        "fine_tune_type": if summary.use_dora { "dora" } else { "lora" },
        "num_layers": model.config.num_layers - min_layer,
        "model": base_model.to_string_lossy(),
        "lora_parameters": {
            "rank": summary.rank,
            "scale": peft.scale(),
            "dropout": peft.lora_dropout,
            "keys": keys.into_iter().collect::<Vec<_>>(),
        },
    });
    save_tensors(&tensors, &out.join("adapters.safetensors"))?;
    checkpoint::write_atomic(
        &out.join("adapter_config.json"),
        serde_json::to_string_pretty(&config).unwrap_or_default().as_bytes(),
    )
}

/// A Hugging Face folder: merged weights (f32, streamed one tensor at a time), config.json, tokenizer files and
/// chat template.
fn export_merged(ckpt: &Path, out: &Path, base_model: &Path, allow_other_base: bool) -> Result<()> {
    let mut model = MergedTensors::open(Some(ckpt), base_model)?;
    refuse_other_base(Some(ckpt), &model.info.source, &model.info.config, allow_other_base)?;
    // Before any weight is written: a GGUF model that its family's config.json cannot describe is refused.
    let gguf_config = match &model.info.source {
        ModelSource::Gguf(file) => Some(gguf_config_json(&model.info, file)?),
        ModelSource::HfFolder(_) => None,
    };
    let mut shapes = model.shapes();
    shapes.sort();
    safetensors_stream::write_f32_safetensors(&out.join("model.safetensors"), &shapes, |i| {
        let (name, dims) = &shapes[i];
        gguf_model::tensor_bytes(&model.tensor(name, dims)?, candle_core::quantized::GgmlDType::F32)
    })?;
    write_model_files(&model.info, gguf_config, out)
}

/// The config.json of a merged folder made from the GGUF `file`: the family's own fields
/// ([`ModelConfig::to_hf_config`](crate::engine::model::ModelConfig::to_hf_config), checked to resolve back to
/// this model), with every eos id the model stops on.
fn gguf_config_json(model: &ModelInfo, file: &Path) -> Result<serde_json::Value> {
    let mut config = model.config.to_hf_config(file)?;
    let eos = match model.eos_token_ids.as_slice() {
        [] => None,
        [one] => Some(serde_json::json!(one)),
        many => Some(serde_json::json!(many)),
    };
    if let (Some(map), Some(eos)) = (config.as_object_mut(), eos) {
        map.insert("eos_token_id".into(), eos);
    }
    Ok(config)
}

/// Write safetensors through a temporary file and a rename; failures are write errors naming the file.
fn save_tensors(tensors: &HashMap<String, Tensor>, path: &Path) -> Result<()> {
    let tmp = path.with_extension("safetensors.tmp");
    let written = candle_core::safetensors::save(tensors, &tmp)
        .map_err(|e| Error::write(path, e))
        .and_then(|_| std::fs::rename(&tmp, path).map_err(|e| Error::write(path, e)));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written?;
    checkpoint::make_world_readable(path)
}

/// config.json (`gguf_config` for a GGUF source), the tokenizer files and the generation config beside the
/// merged weights.
fn write_model_files(model: &ModelInfo, gguf_config: Option<serde_json::Value>, out: &Path) -> Result<()> {
    let json = |v: &serde_json::Value| serde_json::to_string_pretty(v).unwrap_or_default();
    match &model.source {
        ModelSource::HfFolder(src) if model.config.multimodal => {
            copy_model_files(src, out, &MODEL_FILES)?;
            let config = text_tower_config(&src.join("config.json"))?;
            checkpoint::write_atomic(&out.join("config.json"), json(&config).as_bytes())?;
        }
        ModelSource::HfFolder(src) => {
            copy_model_files(src, out, &["config.json"])?;
            copy_model_files(src, out, &MODEL_FILES)?;
        }
        ModelSource::Gguf(file) => {
            let c = &model.config;
            let config = match gguf_config {
                Some(config) => config,
                None => gguf_config_json(model, file)?,
            };
            checkpoint::write_atomic(&out.join("config.json"), json(&config).as_bytes())?;
            let tok_path = out.join("tokenizer.json");
            model
                .tokenizer
                .inner()
                .save(&tok_path, false)
                .map_err(|e| Error::Tokenizer(format!("writing {}: {e}", tok_path.display())))?;
            let tok_config = serde_json::json!({
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": model.tokenizer.bos_token,
                "eos_token": model.tokenizer.eos_token,
                "chat_template": model.chat_template.as_ref().map(|t| t.source.clone()),
            });
            checkpoint::write_atomic(&out.join("tokenizer_config.json"), json(&tok_config).as_bytes())?;
            let gen = serde_json::json!({ "eos_token_id": model.eos_token_ids, "bos_token_id": c.bos_token_id });
            checkpoint::write_atomic(&out.join("generation_config.json"), json(&gen).as_bytes())?;
        }
    }
    Ok(())
}

/// The files of a Hugging Face folder besides config.json and the weights that an export carries over.
const MODEL_FILES: [&str; 5] = [
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
    "chat_template.jinja",
    "special_tokens_map.json",
];

/// Copy the named files of a model folder that exist.
fn copy_model_files(src: &Path, out: &Path, names: &[&str]) -> Result<()> {
    for name in names {
        let from = src.join(name);
        if optional_file(&from)?.is_some() {
            let bytes = read_regular(&from, u64::MAX)?;
            checkpoint::write_atomic(&out.join(name), &bytes)?;
        }
    }
    Ok(())
}

/// A multimodal checkpoint's merged export holds its text model alone: config.json becomes the `text_config`
/// as a text-only model's config (`gemma3_text`, `Gemma3ForCausalLM`), with the outer token ids where the inner
/// config has none.
fn text_tower_config(path: &Path) -> Result<serde_json::Value> {
    let outer: serde_json::Value = crate::engine::error::read_json(path)?;
    let mut text = outer.get("text_config").cloned().filter(|t| t.is_object()).ok_or_else(|| Error::Json {
        path: path.to_path_buf(),
        message: "a multimodal config without a `text_config` object".into(),
    })?;
    if let Some(map) = text.as_object_mut() {
        map.insert("model_type".into(), "gemma3_text".into());
        map.insert("architectures".into(), serde_json::json!(["Gemma3ForCausalLM"]));
        for key in ["bos_token_id", "eos_token_id", "pad_token_id", "torch_dtype"] {
            if let (false, Some(v)) = (map.contains_key(key), outer.get(key)) {
                map.insert(key.into(), v.clone());
            }
        }
    }
    Ok(text)
}

/// Export targets for a checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ExportFormat {
    /// adapter_config.json + adapter_model.safetensors (a copy of the checkpoint's adapter).
    Peft,
    /// mlx-lm's adapters.safetensors + adapter_config.json.
    MlxLm,
    /// A full Hugging Face model folder with the adapter merged into the weights.
    Merged,
    /// One llama.cpp GGUF file with the adapter merged into the weights.
    Gguf,
    /// The adapter alone as a llama.cpp LoRA adapter GGUF.
    GgufLora,
    /// An Ollama folder: the merged GGUF and a Modelfile.
    Ollama,
}

impl ExportFormat {
    pub const ALL: [ExportFormat; 6] =
        [Self::Peft, Self::MlxLm, Self::Merged, Self::Gguf, Self::GgufLora, Self::Ollama];

    /// The name the CLI takes.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Peft => "peft",
            Self::MlxLm => "mlx-lm",
            Self::Merged => "merged",
            Self::Gguf => "gguf",
            Self::GgufLora => "gguf-lora",
            Self::Ollama => "ollama",
        }
    }

    /// Whether `out` names a file (else a folder).
    pub fn writes_file(self) -> bool {
        matches!(self, Self::Gguf | Self::GgufLora)
    }

    /// Whether the export reads the base model (all but `peft`, a copy of the adapter).
    pub fn reads_base(self) -> bool {
        self != Self::Peft
    }

    /// Whether the quantization choice applies.
    pub fn uses_quant(self) -> bool {
        matches!(self, Self::Gguf | Self::Ollama)
    }

    /// The quantization an export in this format writes: `asked` (a quantization the user named, `--quant`) or
    /// the default; a quantization named for a format that writes no quantized GGUF is refused, not ignored.
    pub fn quant_for(self, asked: Option<GgufQuant>) -> Result<GgufQuant> {
        match asked {
            Some(quant) if !self.uses_quant() => Err(Error::InvalidSetting(format!(
                "--quant {quant} does not apply to the {} export, which {}; only gguf and ollama exports are \
                 quantized: drop --quant, or export with --format gguf (or ollama)",
                self.as_str(),
                match self {
                    Self::Peft | Self::MlxLm => "writes the adapter's own f32 weights",
                    Self::Merged => "writes a full-precision Hugging Face folder",
                    _ => "writes the adapter's weights as they are",
                }
            ))),
            Some(quant) => Ok(quant),
            None => Ok(GgufQuant::default()),
        }
    }
}

impl std::str::FromStr for ExportFormat {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "peft" => Ok(Self::Peft),
            "mlx" | "mlx-lm" => Ok(Self::MlxLm),
            "merged" => Ok(Self::Merged),
            "gguf" => Ok(Self::Gguf),
            "gguf-lora" => Ok(Self::GgufLora),
            "ollama" => Ok(Self::Ollama),
            other => {
                Err(format!("unknown export format `{other}`; use peft, mlx-lm, merged, gguf, gguf-lora or ollama"))
            }
        }
    }
}
