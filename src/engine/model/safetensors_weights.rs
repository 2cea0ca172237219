//! Weight sources: Hugging Face safetensors (single file or sharded with an index) memory-mapped, or an
//! in-memory map of tensors (what the GGUF loader produces). Lookups check shapes and name the file at fault.

use crate::engine::{Error, Result};
use candle_core::{DType, Device, Tensor};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Where the transformer's tensors come from.
pub enum Weights {
    Safetensors {
        files: candle_core::safetensors::MmapedSafetensors,
        /// For error messages: the folder's weight file(s).
        origin: PathBuf,
    },
    Map {
        tensors: HashMap<String, Tensor>,
        origin: PathBuf,
    },
}

impl Weights {
    /// Open `model.safetensors` or the shards listed in `model.safetensors.index.json` under `folder`.
    pub fn open_folder(folder: &Path) -> Result<Self> {
        let single = folder.join("model.safetensors");
        let index = folder.join("model.safetensors.index.json");
        let (paths, origin) = if single.exists() {
            (vec![single.clone()], single)
        } else if index.exists() {
            (shard_paths(&index)?, index)
        } else {
            return Err(Error::MissingFile {
                path: single,
                what: "no model.safetensors or model.safetensors.index.json in the model folder".into(),
            });
        };
        // SAFETY: the files are mapped read-only. Parsing the header checks that every tensor's extent lies
        // inside the file, so a truncated download is an error here, not a fault later. A file changed
        // underneath us while mapped is the usual mmap caveat, accepted by every safetensors user.
        let files = unsafe { candle_core::safetensors::MmapedSafetensors::multi(&paths) }.map_err(|e| {
            Error::CorruptWeights {
                path: origin.clone(),
                message: format!("{e} (the file may be truncated or not safetensors; download it again)"),
            }
        })?;
        Ok(Weights::Safetensors { files, origin })
    }

    pub fn from_map(tensors: HashMap<String, Tensor>, origin: PathBuf) -> Self {
        Weights::Map { tensors, origin }
    }

    fn origin(&self) -> &Path {
        match self {
            Weights::Safetensors { origin, .. } | Weights::Map { origin, .. } => origin,
        }
    }

    pub fn contains(&self, name: &str) -> bool {
        match self {
            Weights::Safetensors { files, .. } => files.get(name).is_ok(),
            Weights::Map { tensors, .. } => tensors.contains_key(name),
        }
    }

    /// Load `name` with the expected shape, converted to `dtype` on `device`.
    pub fn get(&self, name: &str, shape: &[usize], dtype: DType, device: &Device) -> Result<Tensor> {
        let tensor = match self {
            Weights::Safetensors { files, origin } => {
                if files.get(name).is_err() {
                    return Err(Error::MissingTensor { name: name.into(), path: origin.clone() });
                }
                files.load(name, &Device::Cpu).map_err(|e| Error::CorruptWeights {
                    path: origin.clone(),
                    message: format!("tensor `{name}`: {e}"),
                })?
            }
            Weights::Map { tensors, origin } => tensors
                .get(name)
                .cloned()
                .ok_or_else(|| Error::MissingTensor { name: name.into(), path: origin.clone() })?,
        };
        if tensor.dims() != shape {
            return Err(Error::CorruptWeights {
                path: self.origin().to_path_buf(),
                message: format!("tensor `{name}` has shape {:?} but the config implies {shape:?}", tensor.dims()),
            });
        }
        Ok(tensor.to_dtype(dtype)?.to_device(device)?)
    }
}

/// The weight files of a Hugging Face folder: `model.safetensors`, or the shards its index lists (sorted).
pub(crate) fn weight_files(folder: &Path) -> Result<Vec<PathBuf>> {
    let single = folder.join("model.safetensors");
    let index = folder.join("model.safetensors.index.json");
    if single.exists() {
        Ok(vec![single])
    } else if index.exists() {
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
    let mut files: Vec<PathBuf> = map.values().filter_map(|v| v.as_str()).map(|f| folder.join(f)).collect();
    files.sort();
    files.dedup();
    for f in &files {
        if !f.exists() {
            return Err(Error::MissingFile { path: f.clone(), what: format!("shard listed in {}", index.display()) });
        }
    }
    Ok(files)
}
