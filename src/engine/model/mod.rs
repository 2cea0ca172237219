//! Models: configuration, the transformer, weight loading (Hugging Face folders and GGUF files),
//! the tokenizer and the chat template, tied together by [`load_model`].

pub mod chat_template;
pub mod config;
pub mod gguf;
pub mod linear;
pub mod loader;
pub mod safetensors_weights;
pub mod tokenizer;
pub mod transformer;

pub use config::{Architecture, ModelConfig};
pub use loader::{load_model, LoadedModel, ModelSource};
