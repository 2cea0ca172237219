//! Repository metadata: `GET /api/{models|datasets}/{repo}/revision/{revision}?blobs=true`, which names the
//! commit a revision points to and lists every file with its size and, for LFS files, its sha256.

use super::http::{encode, HubClient, Target};
use super::{RepoId, RepoKind};
use crate::engine::Result;
use serde::{Deserialize, Serialize};
use std::sync::atomic::AtomicBool;

/// An LFS file's pointer data: the sha256 of its content (also its ETag and blob name) and its size.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LfsInfo {
    pub sha256: String,
    pub size: u64,
}

/// One file of a repository at a commit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sibling {
    /// Path inside the repo, `/`-separated.
    pub rfilename: String,
    #[serde(default)]
    pub size: Option<u64>,
    /// The git blob id (sha1): the ETag and blob name of a file kept in git.
    #[serde(default, rename = "blobId")]
    pub blob_id: Option<String>,
    #[serde(default)]
    pub lfs: Option<LfsInfo>,
}

impl Sibling {
    /// The name the cache stores this file's blob under (`huggingface_hub` uses the ETag, which is the LFS
    /// sha256 or the git blob id), when the listing says.
    pub fn etag(&self) -> Option<&str> {
        self.lfs.as_ref().map(|l| l.sha256.as_str()).or(self.blob_id.as_deref())
    }

    pub fn byte_size(&self) -> Option<u64> {
        self.lfs.as_ref().map(|l| l.size).or(self.size)
    }
}

/// What `repo_info` returns: the commit and the files.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RepoInfo {
    pub id: String,
    /// The commit the revision points to.
    pub sha: String,
    #[serde(default)]
    pub siblings: Vec<Sibling>,
    /// `false`, or `"auto"` / `"manual"` for gated repositories.
    #[serde(default)]
    pub gated: serde_json::Value,
    #[serde(default)]
    pub private: bool,
}

/// Repository metadata at `revision` (a branch, tag or commit).
pub fn repo_info(
    client: &HubClient,
    kind: RepoKind,
    repo: &RepoId,
    revision: &str,
    cancel: &AtomicBool,
) -> Result<RepoInfo> {
    let url = format!(
        "{}/api/{}/{}/revision/{}?blobs=true",
        client.settings.endpoint,
        kind.api_collection(),
        repo,
        encode(revision, false)
    );
    let target = Target { kind, repo, revision, file: None };
    let value = client.get_json(&url, &target, cancel)?;
    serde_json::from_value(value).map_err(|e| {
        super::HubError::Protocol { url, message: format!("repository info without `sha`/`siblings`: {e}") }.into()
    })
}
