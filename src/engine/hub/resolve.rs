//! `--model` and `--data` values to local paths: a path that exists always wins; otherwise a repo id
//! (`ORG/NAME[@REVISION][:QUANT]`) is read from the cache, downloading what is missing (unless offline). A model
//! repo brings its config, tokenizer, chat template and safetensors (no PyTorch `.bin`, no `original/` copies);
//! a GGUF repo brings one quantized file. A dataset repo brings its data files.

use super::api::RepoInfo;
use super::gguf_files::{gguf_choices, pick};
use super::repo_id::looks_like_repo_id;
use super::snapshot::{cached_snapshot, check_globs, fetch_snapshot, info_or_cache, DownloadProgress, SnapshotRequest};
use super::{HubClient, HubError, RepoCache, RepoKind, RepoSpec};
use crate::engine::{Error, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

/// Where a model or dataset came from on the Hub: what run.json records and PEFT's `base_model_name_or_path`
/// names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HubOrigin {
    pub repo: String,
    #[serde(default)]
    pub kind: RepoKind,
    /// What was asked for (`main`, a tag, a commit).
    pub revision: String,
    /// The commit it resolved to.
    pub commit: String,
    /// The file taken from a GGUF repository.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
}

/// A local path, and where it came from when it came from the Hub.
#[derive(Debug, Clone, PartialEq)]
pub struct Resolved {
    pub path: PathBuf,
    pub origin: Option<HubOrigin>,
    /// Why the cache was used without the network, for a note.
    pub cache_note: Option<String>,
}

/// The files of a model repository we read.
pub fn is_model_file(path: &str) -> bool {
    if path.contains('/') {
        return false;
    }
    let lower = path.to_ascii_lowercase();
    lower.ends_with(".json")
        || lower.ends_with(".safetensors")
        || lower.ends_with(".jinja")
        || lower == "tokenizer.model"
}

/// The files of a dataset repository we read.
pub fn is_data_file(path: &str) -> bool {
    let lower = path.to_ascii_lowercase();
    lower.ends_with(".jsonl") || lower.ends_with(".json") || lower.ends_with(".parquet")
}

/// Resolve `spec` for a model (`kind` Model) or a dataset. `include` narrows the files further (globs).
pub fn resolve(
    client: &HubClient,
    spec: &str,
    kind: RepoKind,
    include: &[String],
    on_progress: &mut dyn FnMut(&DownloadProgress),
    cancel: &AtomicBool,
) -> Result<Resolved> {
    let local = Path::new(spec);
    if local.exists() || !looks_like_repo_id(spec) {
        if !local.exists() {
            return Err(Error::MissingFile {
                path: local.to_path_buf(),
                what: format!("no such file or folder, and not a Hugging Face repo id (ORG/NAME) of a {}", kind.noun()),
            });
        }
        return Ok(Resolved { path: local.to_path_buf(), origin: None, cache_note: None });
    }
    let text = spec;
    let spec = RepoSpec::parse(spec)?;
    // A typo in a local path reads as a repo id too: say, in a network failure, that no such path exists.
    let not_local = |e: Error| match e {
        Error::Hub(HubError::Network { url, message, attempts }) => Error::Hub(HubError::Network {
            url,
            message: format!("{message}; and no local file or folder `{text}` exists"),
            attempts,
        }),
        other => other,
    };
    let request = SnapshotRequest {
        kind,
        repo: spec.repo.clone(),
        revision: spec.revision().to_string(),
        include: include.to_vec(),
    };
    check_globs(&request.include)?;
    // One listing serves both the choice of files and their download.
    let listing = info_or_cache(client, &request, cancel).map_err(not_local)?;
    let (wanted, gguf_file) = match kind {
        RepoKind::Dataset => (Wanted::Data, None),
        RepoKind::Model => model_files(client, &request, &listing, spec.quant.as_deref())?,
    };
    let accept = |f: &str| wanted.accepts(f, gguf_file.as_deref());
    let snapshot = fetch_snapshot(client, &request, listing, &accept, on_progress, cancel).map_err(not_local)?;
    let path = match &gguf_file {
        Some(file) => snapshot.path.join(file),
        None => snapshot.path.clone(),
    };
    Ok(Resolved {
        path,
        origin: Some(HubOrigin {
            repo: spec.repo.to_string(),
            kind,
            revision: spec.revision().to_string(),
            commit: snapshot.commit,
            file: gguf_file,
        }),
        cache_note: snapshot.cache_note,
    })
}

/// Which files of a snapshot a resolve takes.
enum Wanted {
    Data,
    Model,
    Gguf,
}

impl Wanted {
    fn accepts(&self, file: &str, gguf_file: Option<&str>) -> bool {
        match self {
            Self::Data => is_data_file(file),
            Self::Model => is_model_file(file),
            Self::Gguf => Some(file) == gguf_file,
        }
    }
}

/// Decide between the safetensors folder and one GGUF file, from the listing online or the cache offline.
fn model_files(
    client: &HubClient,
    request: &SnapshotRequest,
    listing: &std::result::Result<RepoInfo, String>,
    quant: Option<&str>,
) -> Result<(Wanted, Option<String>)> {
    let files: Vec<(String, Option<u64>)> = match listing {
        Ok(info) => info.siblings.iter().map(|s| (s.rfilename.clone(), s.byte_size())).collect(),
        Err(_) => {
            let cache = RepoCache::new(&client.settings.cache_dir, request.kind, &request.repo);
            let snapshot = cached_snapshot(&cache, &request.revision, &|_| true).ok_or_else(|| HubError::Offline {
                repo: request.repo.to_string(),
                cache: client.settings.cache_dir.clone(),
            })?;
            snapshot.files.into_iter().map(|f| (f, None)).collect()
        }
    };
    let has = |name: &str| files.iter().any(|(f, _)| f == name);
    let has_safetensors = files.iter().any(|(f, _)| !f.contains('/') && f.ends_with(".safetensors"));
    let choices = gguf_choices(files.iter().map(|(f, s)| (f.as_str(), *s)));
    if quant.is_none() && has("config.json") && has_safetensors {
        return Ok((Wanted::Model, None));
    }
    if let Some(choice) = pick(&choices, quant) {
        if !choice.supported {
            return Err(HubError::NothingToLoad {
                repo: request.repo.to_string(),
                message: format!(
                    "{} is {}, a type the GGUF reader has no kernels for; pick a Q*/K-quant file",
                    choice.file, choice.quant
                ),
            }
            .into());
        }
        return Ok((Wanted::Gguf, Some(choice.file.clone())));
    }
    let offered: Vec<String> =
        choices.iter().map(|c| if c.quant.is_empty() { c.file.clone() } else { c.quant.clone() }).collect();
    let message = match quant {
        Some(q) if !choices.is_empty() => format!("no GGUF file for `{q}`; it offers {}", offered.join(", ")),
        _ if files.iter().any(|(f, _)| f.ends_with(".bin") || f.ends_with(".pth")) => {
            "it has only PyTorch .bin/.pth weights, which are not read; pick a repository with safetensors or GGUF"
                .into()
        }
        _ => "it has neither config.json with safetensors weights nor a single-file GGUF".into(),
    };
    Err(HubError::NothingToLoad { repo: request.repo.to_string(), message }.into())
}
