//! The ML engine: devices, models, generation, LoRA and training. It never imports the GUI crates and knows
//! nothing of the worker, the CLI or the studio.

pub mod bench;
pub mod blas;
pub mod checkpoint;
pub mod cpu_pool;
pub mod cpu_team;
pub mod data;
pub mod device;
pub mod distributed;
pub mod doctor;
pub mod error;
pub mod estimate;
pub mod eval;
pub mod export;
pub mod generate;
pub mod grpo_bench;
pub mod hub;
pub mod hub_error;
pub mod input_file;
pub mod lora;
pub mod memory_budget;
pub mod memory_watch;
pub mod model;
pub mod ops;
pub mod rank_probe;
pub mod runtime;
pub mod sampler;
pub mod train;
pub mod xray;

pub use error::{Error, ErrorInfo, ErrorKind, Result};
