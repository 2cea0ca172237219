//! The Hugging Face cache layout, shared with `huggingface_hub` and transformers in both directions:
//! `CACHE/models--ORG--NAME/blobs/<etag>` holds each file once, `snapshots/<commit>/<path>` are relative symlinks
//! to the blobs, `refs/<revision>` holds the commit a branch or tag pointed to, and
//! `CACHE/.locks/models--ORG--NAME/<etag>.lock` serialises writers of one blob. A blob being downloaded is
//! `blobs/<etag>.incomplete`, the name `huggingface_hub` uses, so either tool resumes the other's partial file.

use super::{RepoId, RepoKind};
use crate::engine::{Error, Result};
use std::path::{Path, PathBuf};

/// One repository's corner of the cache.
#[derive(Debug, Clone)]
pub struct RepoCache {
    cache_dir: PathBuf,
    folder: String,
}

/// Whether `text` is a full commit hash (40 hex digits).
pub fn is_commit_hash(text: &str) -> bool {
    text.len() == 40 && text.bytes().all(|b| b.is_ascii_hexdigit())
}

impl RepoCache {
    pub fn new(cache_dir: &Path, kind: RepoKind, repo: &RepoId) -> Self {
        Self { cache_dir: cache_dir.to_path_buf(), folder: repo.cache_folder(kind) }
    }

    pub fn cache_dir(&self) -> &Path {
        &self.cache_dir
    }

    pub fn repo_dir(&self) -> PathBuf {
        self.cache_dir.join(&self.folder)
    }

    pub fn blob_path(&self, etag: &str) -> PathBuf {
        self.repo_dir().join("blobs").join(etag)
    }

    pub fn incomplete_path(&self, etag: &str) -> PathBuf {
        self.repo_dir().join("blobs").join(format!("{etag}.incomplete"))
    }

    pub fn lock_path(&self, etag: &str) -> PathBuf {
        self.cache_dir.join(".locks").join(&self.folder).join(format!("{etag}.lock"))
    }

    pub fn snapshot_dir(&self, commit: &str) -> PathBuf {
        self.repo_dir().join("snapshots").join(commit)
    }

    /// The commit `revision` stands for in the cache: a commit hash with a snapshot folder is itself,
    /// otherwise `refs/<revision>`.
    pub fn commit_of(&self, revision: &str) -> Option<String> {
        if is_commit_hash(revision) && self.snapshot_dir(revision).is_dir() {
            return Some(revision.to_string());
        }
        let text = std::fs::read_to_string(self.repo_dir().join("refs").join(revision)).ok()?;
        let commit = text.trim();
        is_commit_hash(commit).then(|| commit.to_string())
    }

    /// Record that `revision` points at `commit` (written atomically; a commit hash needs no ref).
    pub fn write_ref(&self, revision: &str, commit: &str) -> Result<()> {
        if revision == commit {
            return Ok(());
        }
        let path = self.repo_dir().join("refs").join(revision);
        let parent = path.parent().unwrap_or(&path).to_path_buf();
        std::fs::create_dir_all(&parent).map_err(|e| Error::write(&parent, e))?;
        let tmp = parent.join(format!(".{}.tmp", path.file_name().and_then(|n| n.to_str()).unwrap_or("ref")));
        std::fs::write(&tmp, commit).map_err(|e| Error::write(&tmp, e))?;
        std::fs::rename(&tmp, &path).map_err(|e| Error::write(&path, e))
    }

    /// Point `snapshots/<commit>/<file>` at `blobs/<etag>` with a relative symlink (a copy where the file
    /// system has no symlinks), replacing whatever was there.
    pub fn link(&self, commit: &str, file: &str, etag: &str) -> Result<PathBuf> {
        let pointer = self.snapshot_dir(commit).join(file);
        let parent = pointer.parent().unwrap_or(&pointer).to_path_buf();
        std::fs::create_dir_all(&parent).map_err(|e| Error::write(&parent, e))?;
        let depth = file.split('/').count() + 1; // file's own folders, then <commit>, then snapshots
        let mut target = PathBuf::new();
        for _ in 0..depth {
            target.push("..");
        }
        target.push("blobs");
        target.push(etag);
        let _ = std::fs::remove_file(&pointer);
        make_link(&target, &self.blob_path(etag), &pointer).map_err(|e| Error::write(&pointer, e))?;
        Ok(pointer)
    }

    /// The cached copy of `file` at `revision`, if the snapshot has it and its blob is there.
    pub fn cached_file(&self, revision: &str, file: &str) -> Option<PathBuf> {
        let commit = self.commit_of(revision)?;
        let path = self.snapshot_dir(&commit).join(file);
        path.is_file().then_some(path) // is_file follows the link: a dangling pointer is not a cached file
    }
}

#[cfg(unix)]
fn make_link(relative_target: &Path, _blob: &Path, pointer: &Path) -> std::io::Result<()> {
    std::os::unix::fs::symlink(relative_target, pointer)
}

#[cfg(not(unix))]
fn make_link(_relative_target: &Path, blob: &Path, pointer: &Path) -> std::io::Result<()> {
    std::fs::copy(blob, pointer).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_matches_huggingface_hub() {
        let dir = tempfile::tempdir().unwrap();
        let repo = RepoId::parse("org/name").unwrap();
        let cache = RepoCache::new(dir.path(), RepoKind::Model, &repo);
        let commit = "a".repeat(40);
        std::fs::create_dir_all(cache.blob_path("e").parent().unwrap()).unwrap();
        std::fs::write(cache.blob_path("e"), b"hi").unwrap();
        let pointer = cache.link(&commit, "sub/f.json", "e").unwrap();
        assert_eq!(std::fs::read_link(&pointer).unwrap(), PathBuf::from("../../../blobs/e"));
        assert_eq!(std::fs::read(&pointer).unwrap(), b"hi");
        assert!(cache.cached_file("main", "sub/f.json").is_none());
        cache.write_ref("main", &commit).unwrap();
        assert_eq!(cache.cached_file("main", "sub/f.json").unwrap(), pointer);
        assert_eq!(cache.commit_of(&commit).unwrap(), commit);
        assert!(cache.lock_path("e").ends_with(".locks/models--org--name/e.lock"));
    }
}
