//! Where the Hub is and where its files go, from the variables `huggingface_hub` reads (HF_ENDPOINT, HF_HOME,
//! HF_HUB_CACHE, HF_TOKEN, HF_TOKEN_PATH, HF_HUB_OFFLINE), so both tools share one cache and one token. The front
//! ends build [`HubSettings`] from their environment; the engine itself reads no variables.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// The public Hub.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// An access token. Its `Debug` and `Display` never show it.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(String);

impl Token {
    /// `None` for an empty or blank token.
    pub fn new(text: &str) -> Option<Self> {
        let text = text.trim();
        (!text.is_empty()).then(|| Self(text.to_string()))
    }

    /// The secret itself, for the `Authorization` header and the token file only.
    pub fn secret(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(hidden)")
    }
}

/// Everything the Hub client needs, built once by a front end.
#[derive(Debug, Clone)]
pub struct HubSettings {
    /// Without a trailing slash, e.g. `https://huggingface.co` or a mirror.
    pub endpoint: String,
    /// The cache root (`models--ORG--NAME/...` live directly under it).
    pub cache_dir: PathBuf,
    pub token: Option<Token>,
    /// Where `huggingface_hub` keeps its token (`hf auth login`); `save_token` writes here.
    pub token_path: PathBuf,
    /// HF_HUB_OFFLINE: read the cache only.
    pub offline: bool,
    /// Attempts for one request before a transient failure (connection, 429, 5xx) is reported.
    pub attempts: u32,
    /// The first wait between attempts; it doubles each time, capped at 8 s.
    pub first_backoff: Duration,
}

fn truthy(value: &str) -> bool {
    matches!(value.trim().to_ascii_uppercase().as_str(), "1" | "ON" | "YES" | "TRUE")
}

impl HubSettings {
    /// Settings from an environment lookup (`std::env::var(..).ok()` in the front ends), following
    /// `huggingface_hub.constants`: HF_HOME defaults to `$XDG_CACHE_HOME/huggingface`, else
    /// `~/.cache/huggingface`; the cache to `$HF_HOME/hub`; the token to `$HF_HOME/token`.
    pub fn from_env(var: impl Fn(&str) -> Option<String>) -> Self {
        let var = |name: &str| var(name).filter(|v| !v.trim().is_empty());
        let home = var("HOME").or_else(|| var("USERPROFILE")).map(PathBuf::from).unwrap_or_else(|| PathBuf::from("."));
        let hf_home = var("HF_HOME").map(PathBuf::from).unwrap_or_else(|| {
            var("XDG_CACHE_HOME").map(PathBuf::from).unwrap_or_else(|| home.join(".cache")).join("huggingface")
        });
        let cache_dir = var("HF_HUB_CACHE")
            .or_else(|| var("HUGGINGFACE_HUB_CACHE"))
            .map(PathBuf::from)
            .unwrap_or_else(|| hf_home.join("hub"));
        let token_path = var("HF_TOKEN_PATH").map(PathBuf::from).unwrap_or_else(|| hf_home.join("token"));
        let token = var("HF_TOKEN")
            .or_else(|| var("HUGGING_FACE_HUB_TOKEN"))
            .and_then(|t| Token::new(&t))
            .or_else(|| read_token_file(&token_path));
        let endpoint = var("HF_ENDPOINT").unwrap_or_else(|| DEFAULT_ENDPOINT.to_string());
        Self {
            endpoint: endpoint.trim().trim_end_matches('/').to_string(),
            cache_dir,
            token,
            token_path,
            offline: var("HF_HUB_OFFLINE").is_some_and(|v| truthy(&v)),
            attempts: 5,
            first_backoff: Duration::from_millis(500),
        }
    }

    /// The web page of a repository, for messages (gated repos: where to accept the terms).
    pub fn repo_url(&self, kind: super::RepoKind, repo: &super::RepoId) -> String {
        format!("{}/{}{}", self.endpoint, kind.url_prefix(), repo)
    }
}

/// The token in `huggingface_hub`'s token file, if there is one.
pub fn read_token_file(path: &Path) -> Option<Token> {
    std::fs::read_to_string(path).ok().and_then(|t| Token::new(&t))
}

/// Store a token where `huggingface_hub` keeps it (readable by the owner only), so both tools use it.
pub fn save_token(path: &Path, token: &Token) -> crate::engine::Result<()> {
    use crate::engine::Error;
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|e| Error::write(parent, e))?;
    }
    let tmp = path.with_extension("tmp-metal-candle");
    write_private(&tmp, token.secret()).map_err(|e| Error::write(&tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| Error::write(path, e))
}

#[cfg(unix)]
fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(path)?;
    file.write_all(text.as_bytes())?;
    file.sync_all()
}

#[cfg(not(unix))]
fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    std::fs::write(path, text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn settings(vars: &[(&str, &str)]) -> HubSettings {
        let map: HashMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        HubSettings::from_env(|k| map.get(k).cloned())
    }

    #[test]
    fn paths_follow_huggingface_hub() {
        let s = settings(&[("HOME", "/h")]);
        assert_eq!(s.cache_dir, PathBuf::from("/h/.cache/huggingface/hub"));
        assert_eq!(s.token_path, PathBuf::from("/h/.cache/huggingface/token"));
        assert_eq!(s.endpoint, DEFAULT_ENDPOINT);
        assert!(!s.offline);
        let s = settings(&[("HOME", "/h"), ("XDG_CACHE_HOME", "/x"), ("HF_HUB_OFFLINE", "true")]);
        assert_eq!(s.cache_dir, PathBuf::from("/x/huggingface/hub"));
        assert!(s.offline);
        let s = settings(&[("HF_HOME", "/hf"), ("HF_HUB_CACHE", "/c"), ("HF_ENDPOINT", "http://127.0.0.1:9/")]);
        assert_eq!(s.cache_dir, PathBuf::from("/c"));
        assert_eq!(s.token_path, PathBuf::from("/hf/token"));
        assert_eq!(s.endpoint, "http://127.0.0.1:9");
    }

    #[test]
    fn tokens_never_print_and_round_trip_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hf").join("token");
        let token = Token::new(" hf_secret\n").unwrap();
        assert!(!format!("{token:?}").contains("secret"));
        save_token(&path, &token).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "hf_secret");
        let s = settings(&[("HF_TOKEN_PATH", path.to_str().unwrap())]);
        assert_eq!(s.token.unwrap().secret(), "hf_secret");
        let s = settings(&[("HF_TOKEN_PATH", path.to_str().unwrap()), ("HF_TOKEN", "hf_env")]);
        assert_eq!(s.token.unwrap().secret(), "hf_env");
    }
}
