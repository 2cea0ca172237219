//! The Hugging Face Hub: search, downloads into the standard cache (shared with `huggingface_hub` and
//! transformers both ways), and `ORG/NAME` resolved to a local path wherever a model or dataset is named.
//!
//! Written on `ureq` rather than the `hf-hub` crate: hf-hub 1.0 truncates a partial download instead of resuming
//! it, verifies no sha256, has no cancel, checks no disk space, and brings tokio, reqwest and hf-xet with it.
//! The behaviour follows `huggingface_hub`: the same cache layout, `.incomplete` names, lock files, ETags,
//! headers and error codes.

mod api;
mod cache;
mod disk;
mod download;
mod gguf_files;
mod http;
mod repo_id;
mod resolve;
mod search;
mod settings;
mod snapshot;

pub use crate::engine::hub_error::HubError;
pub use api::{repo_info, LfsInfo, RepoInfo, Sibling};
pub use cache::{is_commit_hash, RepoCache};
pub use disk::available_bytes;
pub use gguf_files::{gguf_choices, pick as pick_gguf, quant_of, GgufChoice};
pub use http::HubClient;
pub use repo_id::{looks_like_repo_id, RepoId, RepoKind, RepoSpec};
pub use resolve::{is_data_file, is_model_file, resolve, HubOrigin, Resolved};
pub use search::{search, SearchHit};
pub use settings::{read_token_file, save_token, HubSettings, Token, DEFAULT_ENDPOINT};
pub use snapshot::{download_snapshot, matches_globs, DownloadProgress, Snapshot, SnapshotRequest};
