//! A base model's tensors read one at a time by Hugging Face name, in f32 on the CPU, without loading the model:
//! from a folder's safetensors or dequantized from a GGUF file. For work that visits a model's weights once each
//! (the adapter X-ray's frozen-weight norms, the streaming merged exports) and must not hold the whole model.

use super::gguf::GgufTensorReader;
use super::safetensors_weights::Weights;
use super::ModelSource;
use crate::engine::Result;
use candle_core::{DType, Device, Tensor};

/// Where a base model's tensors come from.
pub enum BaseTensors {
    Folder(Weights),
    Gguf(Box<GgufTensorReader>),
}

impl BaseTensors {
    /// Open the model at `source`; no tensor is read yet.
    pub fn open(source: &ModelSource) -> Result<Self> {
        Ok(match source {
            ModelSource::HfFolder(folder) => Self::Folder(Weights::open_folder(folder)?),
            ModelSource::Gguf(file) => Self::Gguf(Box::new(GgufTensorReader::open(file)?)),
        })
    }

    /// The tensor `hf_name` (checked against `shape`) in f32 on the CPU.
    pub fn read(&mut self, hf_name: &str, shape: &[usize]) -> Result<Tensor> {
        match self {
            Self::Folder(weights) => weights.get(hf_name, shape, DType::F32, &Device::Cpu),
            Self::Gguf(reader) => reader.read_hf(hf_name, shape),
        }
    }
}
