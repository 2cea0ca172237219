//! Models: configuration, weights (Hugging Face folders and GGUF files), the tokenizer and the chat template,
//! tied together by [`load_model`]; and the transformer, one file per block, each owning all of that block's
//! math (inference forward, training forward and backward, decode step): linear.rs (a projection with its
//! LoRA adapter, adapter.rs), norm.rs (an RMS norm, with gemma3's 1 + w), attention.rs, mlp.rs,
//! decoder_layer.rs, assembled by transformer.rs. The KV
//! cache (kv_cache.rs) and adapter gradients (gradients.rs) are the types those blocks share with callers.
//! A base model's projections may be held quantized (QLoRA): the choice is quant.rs, the storage linear.rs.
//!
//! The model imports only `ops` and `device` below it in the engine.

pub mod adapter;
pub mod attention;
pub mod base_tensors;
pub mod chat_template;
pub mod config;
pub mod decode_graph;
pub mod decoder_layer;
pub mod fingerprint;
pub mod gguf;
pub mod gradients;
pub mod kv_cache;
pub mod linear;
pub mod loader;
pub mod mlp;
pub mod norm;
pub mod projection_group;
pub mod quant;
pub mod rotary;
pub mod safetensors_reader;
pub mod safetensors_weights;
pub mod sequence;
pub mod tokenizer;
pub mod transformer;
pub mod vocab_matrix;
mod weight_loader;

pub use config::{Architecture, ModelConfig};
pub use gradients::Gradients;
pub use kv_cache::{KvCache, LayerCache};
pub use loader::{
    load_model, load_model_info, load_model_reporting, load_model_with, model_family, LoadOptions, LoadedModel,
    ModelInfo, ModelSource,
};
pub use quant::BaseQuant;
pub use safetensors_reader::{LoadProgress, LoadProgressFn};
pub use sequence::SequenceContext;
