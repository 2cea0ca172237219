//! Checkpoint folders: `checkpoint-<step>/` holds a PEFT adapter (`adapter_config.json`,
//! `adapter_model.safetensors`) that `peft.PeftModel.from_pretrained` loads as is, and the trainer's state and
//! optimizer moments for an exact resume. Every write is atomic (temp file/folder + rename), so a crash or a
//! full disk mid-save never corrupts an earlier checkpoint.
//!
//! - base.rs: `base_model.json`, the fingerprint of the base an adapter was trained on, and the mismatch check;
//! - files.rs: atomic writes and safetensors I/O;
//! - peft.rs: the PEFT adapter format (typed `adapter_config.json`), loading an adapter onto a model;
//! - trainer_state.rs: saving and reading whole checkpoints, listing and deleting them.
//!
//! Below the trainer: imports `model`, `lora` and `data` only. The run folder around checkpoints (run.json,
//! metrics.jsonl, listing runs) belongs to the trainer (`train::run_folder`).

pub mod base;
mod files;
mod peft;
mod trainer_state;

pub use base::{base_mismatch, base_mismatch_of, BaseRecord, BASE_MODEL_FILE};
pub(crate) use files::folder_size;
pub(crate) use files::write_json;
pub use files::{make_world_readable, unix_now, write_atomic};
pub use peft::*;
pub use trainer_state::*;

pub const ADAPTER_CONFIG: &str = "adapter_config.json";

pub const ADAPTER_WEIGHTS: &str = "adapter_model.safetensors";

pub const TRAINER_STATE: &str = "trainer_state.json";

pub const OPTIMIZER_STATE: &str = "optimizer.safetensors";
