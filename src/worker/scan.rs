//! Finding models on disk: the local Hugging Face cache (snapshot folders with `config.json` and safetensors,
//! and `.gguf` files) plus any folders the user keeps models in, each with its family or the reason we cannot
//! run it (the engine's `model_family` decides). Read-only; nothing is downloaded.

use super::types::{display_name, FoundModel};
use crate::engine::model::model_family;
use std::path::{Path, PathBuf};

/// How deep the scan descends below each root; the cache layout needs four levels.
const MAX_DEPTH: usize = 5;
/// Entries looked at per root before giving up, so a huge folder cannot stall the scan.
const MAX_ENTRIES: usize = 50_000;

/// The Hugging Face cache of this process's environment, by the rules `huggingface_hub` uses
/// (`engine::hub::HubSettings::from_env`: `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else
/// `$XDG_CACHE_HOME/huggingface/hub`, else `~/.cache/huggingface/hub`).
pub fn default_hf_cache_dir() -> Option<PathBuf> {
    Some(crate::engine::hub::HubSettings::from_env(|name| std::env::var(name).ok()).cache_dir)
}

/// Every model under the cache and the extra folders, sorted by name, without duplicates.
pub fn scan_models(hf_cache: Option<&Path>, extra_dirs: &[PathBuf]) -> Vec<FoundModel> {
    let mut found = Vec::new();
    if let Some(cache) = hf_cache {
        walk(cache, 0, &mut 0, "Hugging Face cache", &mut found);
    }
    for dir in extra_dirs {
        if dir.is_file() {
            if let Some(m) = as_model(dir, &dir.display().to_string()) {
                found.push(m);
            }
            continue;
        }
        walk(dir, 0, &mut 0, &dir.display().to_string(), &mut found);
    }
    let mut seen = std::collections::HashSet::new();
    found.retain(|m| seen.insert(std::fs::canonicalize(&m.path).unwrap_or_else(|_| m.path.clone())));
    found.sort_by_key(|m| m.name.to_lowercase());
    found
}

fn walk(dir: &Path, depth: usize, seen: &mut usize, origin: &str, found: &mut Vec<FoundModel>) {
    if depth > MAX_DEPTH || *seen > MAX_ENTRIES {
        return;
    }
    if let Some(m) = as_model(dir, origin) {
        found.push(m);
        // A model folder may also hold .gguf files; list those too, but do not descend further.
        if let Ok(entries) = std::fs::read_dir(dir) {
            for e in entries.flatten() {
                if is_gguf(&e.path()) {
                    if let Some(m) = as_model(&e.path(), origin) {
                        found.push(m);
                    }
                }
            }
        }
        return;
    }
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    let mut entries: Vec<_> = entries.flatten().collect();
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        *seen += 1;
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        // Blobs hold the cache's real files under hashed names; snapshots link to them.
        if name.starts_with('.') || name == "blobs" || name == "refs" {
            continue;
        }
        if path.is_dir() {
            walk(&path, depth + 1, seen, origin, found);
        } else if is_gguf(&path) {
            if let Some(m) = as_model(&path, origin) {
                found.push(m);
            }
        }
    }
}

fn is_gguf(path: &Path) -> bool {
    path.extension().map(|e| e.eq_ignore_ascii_case("gguf")).unwrap_or(false)
}

/// A model if `path` is a `.gguf` file or a folder with `config.json` and at least one `.safetensors` file.
fn as_model(path: &Path, origin: &str) -> Option<FoundModel> {
    if path.is_file() {
        if !is_gguf(path) {
            return None;
        }
        let size_bytes = std::fs::metadata(path).ok()?.len();
        return Some(found(path, "gguf", size_bytes, origin));
    }
    if !path.join("config.json").is_file() {
        return None;
    }
    let mut size_bytes = 0;
    let mut has_weights = false;
    for e in std::fs::read_dir(path).ok()?.flatten() {
        let p = e.path();
        if p.extension().map(|x| x == "safetensors").unwrap_or(false) {
            has_weights = true;
            size_bytes += std::fs::metadata(&p).map(|m| m.len()).unwrap_or(0);
        }
    }
    has_weights.then(|| found(path, "safetensors", size_bytes, origin))
}

/// A found model with its family, or why we cannot run it.
fn found(path: &Path, format: &str, size_bytes: u64, origin: &str) -> FoundModel {
    let (family, unsupported) = match model_family(path) {
        Ok(arch) => (Some(arch.as_str().to_string()), None),
        Err(e) => (None, Some(e.to_string())),
    };
    FoundModel {
        path: path.to_path_buf(),
        name: display_name(path),
        format: format.into(),
        size_bytes,
        origin: origin.into(),
        family,
        unsupported,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_cache_snapshots_and_gguf_files() {
        let root = tempfile::tempdir().unwrap();
        let snap = root.path().join("models--org--tiny/snapshots/abc123");
        std::fs::create_dir_all(&snap).unwrap();
        let tiny_qwen3 = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-qwen3/config.json");
        std::fs::copy(tiny_qwen3, snap.join("config.json")).unwrap();
        std::fs::write(snap.join("model.safetensors"), [0u8; 16]).unwrap();
        let gguf_dir = root.path().join("models--org--q/snapshots/def");
        std::fs::create_dir_all(&gguf_dir).unwrap();
        std::fs::write(gguf_dir.join("m-Q4.gguf"), [0u8; 8]).unwrap();
        let other = root.path().join("models--org--bert/snapshots/x");
        std::fs::create_dir_all(&other).unwrap();
        std::fs::write(other.join("config.json"), r#"{"model_type": "bert"}"#).unwrap();
        std::fs::write(other.join("model.safetensors"), [0u8; 4]).unwrap();
        let not_a_model = root.path().join("models--org--empty/snapshots/x");
        std::fs::create_dir_all(&not_a_model).unwrap();
        std::fs::write(not_a_model.join("config.json"), "{}").unwrap();

        let found = scan_models(Some(root.path()), &[]);
        let names: Vec<&str> = found.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(names, vec!["org/bert", "org/q/m-Q4.gguf", "org/tiny"]);
        assert_eq!(found[2].size_bytes, 16);
        assert_eq!(found[1].format, "gguf");
        assert_eq!(found[2].family.as_deref(), Some("qwen3"));
        let bert = found[0].unsupported.as_deref().unwrap();
        assert!(found[0].family.is_none() && bert.contains("bert") && bert.contains("qwen2"), "{bert}");
        let garbage = found[1].unsupported.as_deref().unwrap();
        assert!(found[1].family.is_none() && garbage.contains("m-Q4.gguf"), "{garbage}");
    }
}
