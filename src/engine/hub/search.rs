//! Finding models (and datasets) by text: `GET /api/{models|datasets}?search=Q&limit=N&expand[]=...`, each hit
//! with what a user picks by: downloads, likes, license, gated, size, whether our loader reads its architecture,
//! and for GGUF repos the quantized files on offer.

use super::gguf_files::{gguf_choices, GgufChoice};
use super::http::{encode, HubClient, Target};
use super::{RepoId, RepoKind};
use crate::engine::model::config::Architecture;
use crate::engine::Result;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::sync::atomic::AtomicBool;

/// One search result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SearchHit {
    pub id: String,
    pub downloads: u64,
    pub likes: u64,
    pub license: Option<String>,
    /// Gated repos need accepted terms and a token.
    pub gated: bool,
    /// The repository's stored size, when the Hub says.
    pub size_bytes: Option<u64>,
    /// `model_type` from config.json, or a GGUF's `general.architecture`.
    pub architecture: Option<String>,
    /// Whether our loader reads this architecture; `None` when the Hub does not say which it is.
    pub supported: Option<bool>,
    /// "safetensors", "gguf" or "other" (weights we do not read, or none listed).
    pub weights: String,
    pub gguf_files: Vec<GgufChoice>,
}

/// What the search asks the Hub to include with each hit (fields absent from an answer stay unknown).
const EXPAND: [&str; 9] =
    ["downloads", "likes", "gated", "tags", "cardData", "config", "siblings", "usedStorage", "gguf"];

/// Up to `limit` repositories matching `query`, most downloaded first.
pub fn search(
    client: &HubClient,
    kind: RepoKind,
    query: &str,
    limit: usize,
    cancel: &AtomicBool,
) -> Result<Vec<SearchHit>> {
    if client.settings.offline {
        return Err(crate::engine::Error::InvalidSetting(
            "HF_HUB_OFFLINE is set: searching the Hub needs the network (`metal-candle models` lists what is cached)"
                .into(),
        ));
    }
    let mut url = format!(
        "{}/api/{}?search={}&limit={}&sort=downloads&direction=-1",
        client.settings.endpoint,
        kind.api_collection(),
        encode(query.trim(), false),
        limit.clamp(1, 100)
    );
    for field in EXPAND {
        url.push_str(&format!("&expand%5B%5D={field}"));
    }
    // Errors of a listing are not about one repo; name the query instead.
    let placeholder = RepoId::parse("search").unwrap_or_else(|_| unreachable!("a valid literal id"));
    let target = Target { kind, repo: &placeholder, revision: "main", file: None };
    let value = client.get_json(&url, &target, cancel)?;
    let Value::Array(items) = value else {
        return Err(super::HubError::Protocol { url, message: "the search answer is not a list".into() }.into());
    };
    Ok(items.iter().filter_map(hit_of).collect())
}

fn hit_of(item: &Value) -> Option<SearchHit> {
    let id = item.get("id").or_else(|| item.get("modelId"))?.as_str()?.to_string();
    let number = |key: &str| item.get(key).and_then(Value::as_u64);
    let tags: Vec<&str> =
        item.get("tags").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).collect();
    let license = item
        .pointer("/cardData/license")
        .and_then(Value::as_str)
        .map(str::to_string)
        .or_else(|| tags.iter().find_map(|t| t.strip_prefix("license:")).map(str::to_string));
    let gated = match item.get("gated") {
        Some(Value::Bool(b)) => *b,
        Some(Value::String(s)) => !s.is_empty() && s != "false",
        _ => false,
    };
    let files: Vec<(&str, Option<u64>)> = item
        .get("siblings")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|s| Some((s.get("rfilename")?.as_str()?, s.get("size").and_then(Value::as_u64))))
        .collect();
    let gguf_files = gguf_choices(files.iter().copied());
    let has_safetensors = files.iter().any(|(f, _)| f.ends_with(".safetensors"));
    let architecture = item
        .pointer("/config/model_type")
        .or_else(|| item.pointer("/gguf/architecture"))
        .and_then(Value::as_str)
        .map(str::to_string);
    let weights = if has_safetensors {
        "safetensors"
    } else if !gguf_files.is_empty() || tags.contains(&"gguf") {
        "gguf"
    } else {
        "other"
    };
    let supported = architecture.as_deref().map(|a| Architecture::from_model_type(a).is_some() && weights != "other");
    Some(SearchHit {
        id,
        downloads: number("downloads").unwrap_or(0),
        likes: number("likes").unwrap_or(0),
        license,
        gated,
        size_bytes: number("usedStorage").or_else(|| {
            let sizes: Option<Vec<u64>> = files.iter().map(|(_, s)| *s).collect();
            sizes.filter(|s| !s.is_empty()).map(|s| s.iter().sum())
        }),
        architecture,
        supported,
        weights: weights.to_string(),
        gguf_files,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hits_read_what_the_hub_sends() {
        let item = serde_json::json!({
            "id": "org/m-GGUF", "downloads": 7, "likes": 2, "gated": "manual",
            "tags": ["gguf", "license:apache-2.0"], "gguf": {"architecture": "llama"},
            "siblings": [{"rfilename": "m-Q4_K_M.gguf"}, {"rfilename": "m-IQ2_M.gguf"}], "usedStorage": 99
        });
        let hit = hit_of(&item).unwrap();
        assert!(hit.gated);
        assert_eq!(hit.license.as_deref(), Some("apache-2.0"));
        assert_eq!(hit.weights, "gguf");
        assert_eq!(hit.supported, Some(true));
        assert_eq!(hit.size_bytes, Some(99));
        assert_eq!(hit.gguf_files.len(), 2);
        let item = serde_json::json!({"id": "o/bert", "config": {"model_type": "bert"}, "siblings": [{"rfilename": "model.safetensors"}]});
        assert_eq!(hit_of(&item).unwrap().supported, Some(false));
    }
}
