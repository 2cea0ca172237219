//! Repo ids as users type them (`ORG/NAME`, `ORG/NAME@REVISION`, `ORG/NAME:QUANT`), validated by the Hub's own
//! rules, and the two kinds of repository we read (models and datasets) with their URL and cache prefixes.

use super::HubError;

/// Model or dataset repository: they differ in URL prefix, API path and cache folder prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum RepoKind {
    #[default]
    Model,
    Dataset,
}

impl RepoKind {
    /// The API collection: `/api/models/...`, `/api/datasets/...`.
    pub fn api_collection(self) -> &'static str {
        match self {
            Self::Model => "models",
            Self::Dataset => "datasets",
        }
    }

    /// The prefix of file URLs: `/{repo}/resolve/...` or `/datasets/{repo}/resolve/...`.
    pub fn url_prefix(self) -> &'static str {
        match self {
            Self::Model => "",
            Self::Dataset => "datasets/",
        }
    }

    /// The word for messages.
    pub fn noun(self) -> &'static str {
        match self {
            Self::Model => "model",
            Self::Dataset => "dataset",
        }
    }
}

/// A validated repo id: `NAME` or `ORG/NAME`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RepoId(String);

impl RepoId {
    /// Validate as `huggingface_hub.utils.validate_repo_id` does: one optional `/`, word characters, `-`, `.`,
    /// no `--` or `..`, at most 96 characters, no leading or trailing `-`/`.` in either part.
    pub fn parse(text: &str) -> Result<Self, HubError> {
        let bad = |message: &str| HubError::BadRepoId { spec: text.to_string(), message: message.to_string() };
        if text.is_empty() || text.len() > 96 {
            return Err(bad("it must be 1 to 96 characters"));
        }
        let parts: Vec<&str> = text.split('/').collect();
        if parts.len() > 2 {
            return Err(bad("it has more than one `/`"));
        }
        for part in &parts {
            if part.is_empty() {
                return Err(bad("a part is empty"));
            }
            if !part.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')) {
                return Err(bad("only letters, digits, `-`, `_` and `.` are allowed"));
            }
            if part.starts_with(['-', '.']) || part.ends_with(['-', '.']) {
                return Err(bad("a part starts or ends with `-` or `.`"));
            }
        }
        if text.contains("--") || text.contains("..") {
            return Err(bad("`--` and `..` are not allowed"));
        }
        Ok(Self(text.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The cache folder: `models--ORG--NAME` / `datasets--ORG--NAME`.
    pub fn cache_folder(&self, kind: RepoKind) -> String {
        format!("{}--{}", kind.api_collection(), self.0.replace('/', "--"))
    }
}

impl std::fmt::Display for RepoId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// What a user typed for a repository: the id, a revision after `@`, and for GGUF repos a quantization after
/// `:` (llama.cpp's `-hf ORG/NAME:Q4_K_M`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepoSpec {
    pub repo: RepoId,
    pub revision: Option<String>,
    pub quant: Option<String>,
}

impl RepoSpec {
    pub fn parse(text: &str) -> Result<Self, HubError> {
        let text = text.trim();
        let text = text.strip_prefix("hf.co/").or_else(|| text.strip_prefix("https://huggingface.co/")).unwrap_or(text);
        let (rest, quant) = match text.rsplit_once(':') {
            Some((rest, quant)) if !quant.is_empty() && !quant.contains(['/', '\\']) => (rest, Some(quant.to_string())),
            _ => (text, None),
        };
        let (id, revision) = match rest.split_once('@') {
            Some((id, rev)) if !rev.is_empty() => (id, Some(rev.to_string())),
            Some(_) => {
                return Err(HubError::BadRepoId { spec: text.to_string(), message: "nothing follows `@`".into() })
            }
            None => (rest, None),
        };
        Ok(Self { repo: RepoId::parse(id)?, revision, quant })
    }

    /// The revision asked for, `main` when none.
    pub fn revision(&self) -> &str {
        self.revision.as_deref().unwrap_or("main")
    }
}

/// Whether `text` reads as a repo id rather than a file name: `ORG/NAME` with one slash and no file extension
/// a model or dataset file would have. Callers first check that no local path of that name exists.
pub fn looks_like_repo_id(text: &str) -> bool {
    let lower = text.to_ascii_lowercase();
    let file_like =
        [".gguf", ".json", ".jsonl", ".parquet", ".safetensors", ".csv", ".txt"].iter().any(|ext| lower.ends_with(ext));
    text.contains('/') && !text.starts_with(['.', '/', '~']) && !file_like && RepoSpec::parse(text).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repo_ids_follow_the_hub_rules() {
        assert!(RepoId::parse("HuggingFaceTB/SmolLM2-135M-Instruct").is_ok());
        assert!(RepoId::parse("gpt2").is_ok());
        for bad in ["a/b/c", "a--b/c", "a/../b", "-a/b", "a/b.", "", "a b/c", "a/"] {
            assert!(RepoId::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(RepoId::parse("o/n").unwrap().cache_folder(RepoKind::Dataset), "datasets--o--n");
    }

    #[test]
    fn specs_carry_revision_and_quant() {
        let s = RepoSpec::parse("bartowski/Llama-3.2-1B-Instruct-GGUF@v1:Q4_K_M").unwrap();
        assert_eq!(s.repo.as_str(), "bartowski/Llama-3.2-1B-Instruct-GGUF");
        assert_eq!(s.revision.as_deref(), Some("v1"));
        assert_eq!(s.quant.as_deref(), Some("Q4_K_M"));
        assert_eq!(RepoSpec::parse("o/n").unwrap().revision(), "main");
        assert!(looks_like_repo_id("HuggingFaceTB/SmolLM2-135M-Instruct"));
        assert!(!looks_like_repo_id("models/x.gguf"));
        assert!(!looks_like_repo_id("./a/b"));
        assert!(!looks_like_repo_id("name"));
        assert!(!looks_like_repo_id("C:/models/x"));
    }
}
