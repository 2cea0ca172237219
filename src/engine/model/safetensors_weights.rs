//! Weight sources: Hugging Face safetensors (single file or sharded with an index) read tensor by tensor, or an
//! in-memory map of tensors (what the GGUF loader produces, dense and still-quantized ones). Lookups check
//! shapes and name the file at fault. [`Weights::base_weight`] applies the base quantization choice to one
//! projection at a time: read, quantize, drop the dense copy, so no whole dense model is ever held.
//!
//! Names are asked for as a text-only model stores them (`model.layers.0...`, `lm_head.weight`). A multimodal
//! checkpoint (gemma3) keeps its language model elsewhere: under `language_model.model.*` (transformers before
//! 4.52) or `model.language_model.*` (after); [`TextTower`] maps the names, and the other tensors (vision tower,
//! projector) are never read.

use super::linear::BaseWeight;
use super::quant::{fitting_type, BaseQuant};
use super::safetensors_reader::{LoadProgressFn, SafetensorsReader};
use crate::engine::{ops, Error, Result};
use candle_core::quantized::QTensor;
use candle_core::{DType, Device, Tensor};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Where a multimodal checkpoint keeps its language model's tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TextTower {
    /// A text-only checkpoint: `model.*`, `lm_head.weight`.
    Root,
    /// `language_model.model.*`, `language_model.lm_head.weight` (transformers before 4.52).
    LanguageModelFirst,
    /// `model.language_model.*`, `lm_head.weight` (transformers 4.52 and later).
    ModelFirst,
}

impl TextTower {
    /// Which layout a checkpoint uses, from where its token embeddings are.
    fn detect(has: impl Fn(&str) -> bool) -> Self {
        if has("language_model.model.embed_tokens.weight") {
            Self::LanguageModelFirst
        } else if !has("model.embed_tokens.weight") && has("model.language_model.embed_tokens.weight") {
            Self::ModelFirst
        } else {
            Self::Root
        }
    }

    /// The stored name of a tensor a text-only model calls `name`.
    pub fn stored_name(self, name: &str) -> std::borrow::Cow<'_, str> {
        match self {
            Self::Root => name.into(),
            Self::LanguageModelFirst => format!("language_model.{name}").into(),
            Self::ModelFirst => match name.strip_prefix("model.") {
                Some(rest) => format!("model.language_model.{rest}").into(),
                None => name.into(),
            },
        }
    }

    /// Whether a stored name belongs to the language model.
    fn holds(self, stored: &str) -> bool {
        match self {
            Self::Root => true,
            Self::LanguageModelFirst => stored.starts_with("language_model."),
            Self::ModelFirst => stored.starts_with("model.language_model.") || stored == "lm_head.weight",
        }
    }
}

/// Where the transformer's tensors come from.
pub enum Weights {
    Safetensors {
        files: SafetensorsReader,
        /// For error messages: the folder's weight file(s).
        origin: PathBuf,
        /// Where the language model's tensors are.
        tower: TextTower,
    },
    Map {
        tensors: HashMap<String, Tensor>,
        /// GGML-quantized tensors kept as the file stores them (on the CPU, Hugging Face layout).
        quantized: HashMap<String, Arc<QTensor>>,
        origin: PathBuf,
    },
}

impl Weights {
    /// Open `model.safetensors` or the shards listed in `model.safetensors.index.json` under `folder`.
    pub fn open_folder(folder: &Path) -> Result<Self> {
        Self::open_folder_reporting(folder, None)
    }

    /// [`Self::open_folder`], calling `progress` after each tensor is read (tensors are read one at a time,
    /// not memory-mapped: see safetensors_reader.rs).
    pub fn open_folder_reporting(folder: &Path, progress: Option<LoadProgressFn>) -> Result<Self> {
        let paths = weight_files(folder)?;
        let single = folder.join("model.safetensors");
        let origin = if single.exists() { single } else { folder.join("model.safetensors.index.json") };
        let mut files = SafetensorsReader::open(&paths, progress)?;
        let tower = TextTower::detect(|name| files.contains(name));
        // Progress counts what the load reads: the language model's tensors.
        files.count_only(|name| tower.holds(name));
        Ok(Weights::Safetensors { files, origin, tower })
    }

    /// Stored tensors outside the language model (a multimodal checkpoint's vision tower and projector),
    /// which loading ignores.
    pub fn ignored_tensors(&self) -> usize {
        match self {
            Weights::Safetensors { files, tower, .. } => files.names().filter(|name| !tower.holds(name)).count(),
            Weights::Map { .. } => 0,
        }
    }

    pub fn from_map(tensors: HashMap<String, Tensor>, origin: PathBuf) -> Self {
        Weights::Map { tensors, quantized: HashMap::new(), origin }
    }

    /// Dense and still-quantized tensors (a GGUF loaded with its quantized linears kept).
    pub fn from_maps(
        tensors: HashMap<String, Tensor>,
        quantized: HashMap<String, Arc<QTensor>>,
        origin: PathBuf,
    ) -> Self {
        Weights::Map { tensors, quantized, origin }
    }

    /// Whether the source holds quantized tensors kept as stored (a GGUF loaded with `keep`).
    pub fn has_quantized(&self) -> bool {
        matches!(self, Weights::Map { quantized, .. } if !quantized.is_empty())
    }

    fn quantized(&self, name: &str) -> Option<&Arc<QTensor>> {
        match self {
            Weights::Map { quantized, .. } => quantized.get(name),
            Weights::Safetensors { .. } => None,
        }
    }

    /// A projection's frozen weight `name` of `shape` (out, in), held as `quant` asks: a quantized file
    /// tensor kept as it is (`keep`), quantized at load to the requested type (or the fallback that fits its
    /// rows, see [`fitting_type`]), or dense in `dtype`.
    pub fn base_weight(
        &self,
        name: &str,
        shape: &[usize],
        quant: BaseQuant,
        dtype: DType,
        device: &Device,
    ) -> Result<BaseWeight> {
        let row_len = shape.last().copied().unwrap_or(0);
        let target = quant.target_type().and_then(|t| fitting_type(t, row_len));
        if let Some(q) = self.quantized(name) {
            // Kept as stored: `keep`, or a file already in the requested type (no second rounding).
            if quant == BaseQuant::Keep || target == Some(q.dtype()) {
                self.check_shape(name, q.shape().dims(), shape)?;
                return Ok(BaseWeight::Quantized(ops::qtensor_to_device(q, device)?));
            }
        }
        match target {
            Some(target) => {
                let dense = self.get(name, shape, DType::F32, &Device::Cpu)?;
                Ok(BaseWeight::Quantized(Arc::new(ops::quantize_rows(&dense, target, device)?)))
            }
            None => Ok(BaseWeight::Dense(self.get(name, shape, dtype, device)?)),
        }
    }

    fn check_shape(&self, name: &str, found: &[usize], shape: &[usize]) -> Result<()> {
        if found != shape {
            return Err(Error::CorruptWeights {
                path: self.origin().to_path_buf(),
                message: format!("tensor `{name}` has shape {found:?} but the config implies {shape:?}"),
            });
        }
        Ok(())
    }

    fn origin(&self) -> &Path {
        match self {
            Weights::Safetensors { origin, .. } | Weights::Map { origin, .. } => origin,
        }
    }

    pub fn contains(&self, name: &str) -> bool {
        match self {
            Weights::Safetensors { files, tower, .. } => files.contains(&tower.stored_name(name)),
            Weights::Map { tensors, quantized, .. } => tensors.contains_key(name) || quantized.contains_key(name),
        }
    }

    /// Load `name` with the expected shape, converted to `dtype` on `device`.
    pub fn get(&self, name: &str, shape: &[usize], dtype: DType, device: &Device) -> Result<Tensor> {
        let tensor = match self {
            Weights::Safetensors { files, origin, tower } => {
                let stored = tower.stored_name(name);
                files
                    .load(&stored)?
                    .ok_or_else(|| Error::MissingTensor { name: stored.into_owned(), path: origin.clone() })?
            }
            Weights::Map { tensors, quantized, origin } => match (tensors.get(name), quantized.get(name)) {
                (Some(t), _) => t.clone(),
                (None, Some(q)) => q.dequantize(&Device::Cpu)?,
                (None, None) => return Err(Error::MissingTensor { name: name.into(), path: origin.clone() }),
            },
        };
        self.check_shape(name, tensor.dims(), shape)?;
        Ok(tensor.to_dtype(dtype)?.to_device(device)?)
    }

    /// Whether [`Self::get_rows`] reads only the rows asked for (a safetensors folder); an in-memory source
    /// (a GGUF's tensors) has the whole tensor already.
    pub fn reads_rows_alone(&self) -> bool {
        matches!(self, Weights::Safetensors { .. })
    }

    /// Rows `start..start + rows` of tensor `name` whose whole shape is `shape`, converted to `dtype` on
    /// `device`: read from the file alone for a safetensors folder, narrowed from the whole tensor otherwise.
    pub fn get_rows(
        &self,
        name: &str,
        shape: &[usize],
        (start, rows): (usize, usize),
        dtype: DType,
        device: &Device,
    ) -> Result<Tensor> {
        let Weights::Safetensors { files, origin, tower } = self else {
            return Ok(self
                .get(name, shape, DType::F32, &Device::Cpu)?
                .narrow(0, start, rows)?
                .to_dtype(dtype)?
                .to_device(device)?);
        };
        let stored = tower.stored_name(name);
        let missing = || Error::MissingTensor { name: stored.to_string(), path: origin.clone() };
        self.check_shape(name, files.shape(&stored).ok_or_else(missing)?, shape)?;
        let tensor = files.load_rows(&stored, start, rows)?.ok_or_else(missing)?;
        Ok(tensor.to_dtype(dtype)?.to_device(device)?)
    }
}

/// The weight files of a Hugging Face folder: `model.safetensors`, or the shards its index lists (sorted).
pub(crate) fn weight_files(folder: &Path) -> Result<Vec<PathBuf>> {
    let single = folder.join("model.safetensors");
    let index = folder.join("model.safetensors.index.json");
    use crate::engine::input_file::optional_file;
    if optional_file(&single)?.is_some() {
        Ok(vec![single])
    } else if optional_file(&index)?.is_some() {
        shard_paths(&index)
    } else {
        Err(Error::MissingFile {
            path: single,
            what: "no model.safetensors or model.safetensors.index.json in the model folder".into(),
        })
    }
}

fn shard_paths(index: &Path) -> Result<Vec<PathBuf>> {
    let value: serde_json::Value = crate::engine::error::read_json(index)?;
    let map = value
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| Error::Json { path: index.to_path_buf(), message: "no `weight_map` object".into() })?;
    let folder = index.parent().unwrap_or(Path::new("."));
    let mut files = Vec::new();
    for (tensor, file) in map {
        let name = file.as_str().ok_or_else(|| Error::Json {
            path: index.to_path_buf(),
            message: format!("weight_map[\"{tensor}\"] is {file}, not a file name"),
        })?;
        let inside = Path::new(name).components().all(|c| matches!(c, std::path::Component::Normal(_)));
        if !inside || name.is_empty() {
            return Err(Error::BadConfig {
                path: index.to_path_buf(),
                field: format!("weight_map[\"{tensor}\"]"),
                message: format!("`{name}` leaves the model folder; shards must be inside it"),
            });
        }
        files.push(folder.join(name));
    }
    files.sort();
    files.dedup();
    for f in &files {
        if crate::engine::input_file::optional_file(f)?.is_none() {
            return Err(Error::MissingFile { path: f.clone(), what: format!("shard listed in {}", index.display()) });
        }
    }
    Ok(files)
}
