//! A repository (or the files of it a user asked for) into the cache, as `huggingface_hub.snapshot_download`
//! does: the revision resolved to a commit, the files chosen by glob, free disk space checked against what is
//! still missing, every file fetched and verified, the ref written last. Offline (HF_HUB_OFFLINE), or when the Hub
//! cannot be reached, a snapshot already in the cache is used as is.

use super::api::{repo_info, RepoInfo, Sibling};
use super::cache::RepoCache;
use super::download::{blob_present, download_file, file_url, FileJob};
use super::http::{header, HubClient, Target};
use super::{HubError, RepoId, RepoKind};
use crate::engine::{Error, Result};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

/// What to fetch.
#[derive(Debug, Clone)]
pub struct SnapshotRequest {
    pub kind: RepoKind,
    pub repo: RepoId,
    /// Branch, tag or commit (`main` by default).
    pub revision: String,
    /// `fnmatch`-style globs over repo paths (`*` crosses `/`, a trailing `/` means the folder); empty: all.
    pub include: Vec<String>,
}

/// Where a download stands, for progress bars and the CLI's status line.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DownloadProgress {
    pub repo: String,
    /// The file being fetched.
    pub file: String,
    pub files_done: usize,
    pub file_count: usize,
    /// Bytes held so far over all files (cached and resumed bytes included) and the total.
    pub bytes_done: u64,
    pub bytes_total: u64,
    /// Transfer rate of this session's fetched bytes.
    pub bytes_per_sec: f64,
    pub secs_left: Option<f64>,
}

/// A snapshot folder in the cache.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    pub path: PathBuf,
    pub commit: String,
    /// The repo paths it holds (those asked for).
    pub files: Vec<String>,
    pub bytes_total: u64,
    /// Bytes fetched over the network by this call.
    pub bytes_fetched: u64,
    /// Why the cache was used without asking the Hub (offline, unreachable), if so.
    pub cache_note: Option<String>,
}

/// Whether `path` matches one of `globs` (all paths when there are none).
pub fn matches_globs(globs: &[String], path: &str) -> bool {
    globs.is_empty()
        || globs.iter().any(|g| {
            let g = if g.ends_with('/') { format!("{g}*") } else { g.clone() };
            glob::Pattern::new(&g).is_ok_and(|p| p.matches(path))
        })
}

/// Check every glob compiles before any work.
pub fn check_globs(globs: &[String]) -> Result<()> {
    for g in globs {
        glob::Pattern::new(g).map_err(|e| Error::InvalidSetting(format!("--include `{g}`: {e}")))?;
    }
    Ok(())
}

/// The cached snapshot of `revision` with the files `wanted` accepts, if the cache has one.
pub fn cached_snapshot(cache: &RepoCache, revision: &str, wanted: &dyn Fn(&str) -> bool) -> Option<Snapshot> {
    let commit = cache.commit_of(revision)?;
    let dir = cache.snapshot_dir(&commit);
    let mut files = Vec::new();
    collect_files(&dir, "", &mut files);
    files.retain(|f| wanted(f));
    if files.is_empty() {
        return None;
    }
    let bytes_total = files.iter().filter_map(|f| std::fs::metadata(dir.join(f)).ok()).map(|m| m.len()).sum();
    Some(Snapshot { path: dir, commit, files, bytes_total, bytes_fetched: 0, cache_note: None })
}

fn collect_files(dir: &std::path::Path, prefix: &str, out: &mut Vec<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let rel = if prefix.is_empty() { name.clone() } else { format!("{prefix}/{name}") };
        let path = entry.path();
        if path.is_dir() {
            collect_files(&path, &rel, out);
        } else if path.is_file() {
            out.push(rel);
        }
    }
    out.sort();
}

/// Repository info online, or `None` with the reason when the cache must do (offline, or the Hub unreachable
/// and a snapshot is cached).
pub fn info_or_cache(
    client: &HubClient,
    request: &SnapshotRequest,
    cancel: &AtomicBool,
) -> Result<std::result::Result<RepoInfo, String>> {
    if client.settings.offline {
        return Ok(Err("HF_HUB_OFFLINE is set".into()));
    }
    match repo_info(client, request.kind, &request.repo, &request.revision, cancel) {
        Ok(info) => Ok(Ok(info)),
        Err(Error::Hub(HubError::Network { url, message, .. })) => {
            let cache = RepoCache::new(&client.settings.cache_dir, request.kind, &request.repo);
            if cache.commit_of(&request.revision).is_some() {
                Ok(Err(format!("the Hub could not be reached ({message}); using the cached copy")))
            } else {
                Err(HubError::Network { url, message, attempts: String::new() }.into())
            }
        }
        Err(e) => Err(e),
    }
}

/// Download the files of `request` that `wanted` accepts (on top of the globs) and return the snapshot.
pub fn download_snapshot(
    client: &HubClient,
    request: &SnapshotRequest,
    wanted: &dyn Fn(&str) -> bool,
    on_progress: &mut dyn FnMut(&DownloadProgress),
    cancel: &AtomicBool,
) -> Result<Snapshot> {
    check_globs(&request.include)?;
    let listing = info_or_cache(client, request, cancel)?;
    fetch_snapshot(client, request, listing, wanted, on_progress, cancel)
}

/// [`download_snapshot`] with the listing already asked for ([`info_or_cache`]): the files of `listing` that the
/// globs and `wanted` accept, or the cached snapshot when the listing is a reason to use the cache.
pub fn fetch_snapshot(
    client: &HubClient,
    request: &SnapshotRequest,
    listing: std::result::Result<RepoInfo, String>,
    wanted: &dyn Fn(&str) -> bool,
    on_progress: &mut dyn FnMut(&DownloadProgress),
    cancel: &AtomicBool,
) -> Result<Snapshot> {
    let cache = RepoCache::new(&client.settings.cache_dir, request.kind, &request.repo);
    let accept = |f: &str| matches_globs(&request.include, f) && wanted(f);
    let info = match listing {
        Ok(info) => info,
        Err(note) => {
            return match cached_snapshot(&cache, &request.revision, &accept) {
                Some(snapshot) => Ok(Snapshot { cache_note: Some(note), ..snapshot }),
                None => {
                    Err(HubError::Offline { repo: request.repo.to_string(), cache: client.settings.cache_dir.clone() }
                        .into())
                }
            };
        }
    };
    let siblings: Vec<&Sibling> = info.siblings.iter().filter(|s| accept(&s.rfilename)).collect();
    if siblings.is_empty() {
        let listed: Vec<&str> = info.siblings.iter().map(|s| s.rfilename.as_str()).take(20).collect();
        return Err(HubError::NothingToLoad {
            repo: request.repo.to_string(),
            message: format!("no file matches what was asked for; the repository has: {}", listed.join(", ")),
        }
        .into());
    }
    // Each file's blob name and size: from the listing, else from a HEAD of the file.
    let mut plan = Vec::with_capacity(siblings.len());
    for s in &siblings {
        let target =
            Target { kind: request.kind, repo: &request.repo, revision: &request.revision, file: Some(&s.rfilename) };
        let (etag, size) = match (s.etag(), s.byte_size()) {
            (Some(etag), Some(size)) => (etag.to_string(), Some(size)),
            _ => head_metadata(client, &target, &info.sha, &s.rfilename, cancel)?,
        };
        check_names(&s.rfilename, &etag, &request.repo)?;
        plan.push((s.rfilename.clone(), etag, size));
    }
    let bytes_total: u64 = plan.iter().filter_map(|(_, _, size)| *size).sum();
    let missing: u64 = plan
        .iter()
        .filter(|(_, etag, size)| !blob_present(&cache, etag, *size))
        .map(|(_, etag, size)| {
            let partial = std::fs::metadata(cache.incomplete_path(etag)).map(|m| m.len()).unwrap_or(0);
            size.unwrap_or(0).saturating_sub(partial)
        })
        .sum();
    if let Some(available) = super::disk::available_bytes(&client.settings.cache_dir) {
        if missing > available {
            return Err(HubError::DiskFull {
                path: client.settings.cache_dir.clone(),
                needed_mib: missing as f64 / 1048576.0,
                available_mib: available as f64 / 1048576.0,
            }
            .into());
        }
    }
    let started = Instant::now();
    let mut done_before = 0u64; // bytes of the files already finished
    let mut fetched = 0u64;
    let file_count = plan.len();
    for (index, (file, etag, size)) in plan.iter().enumerate() {
        let target = Target { kind: request.kind, repo: &request.repo, revision: &request.revision, file: Some(file) };
        let job = FileJob { cache: &cache, target, commit: &info.sha, file, etag: etag.clone(), size: *size };
        let mut first_seen: Option<u64> = None;
        let mut last_seen = 0u64;
        let mut report = |held: u64| {
            let first = *first_seen.get_or_insert(held);
            last_seen = held;
            let session = fetched + held.saturating_sub(first);
            let secs = started.elapsed().as_secs_f64().max(1e-3);
            let rate = session as f64 / secs;
            let done = done_before + held;
            on_progress(&DownloadProgress {
                repo: request.repo.to_string(),
                file: file.clone(),
                files_done: index,
                file_count,
                bytes_done: done,
                bytes_total,
                bytes_per_sec: rate,
                secs_left: (rate > 0.0 && session > 0).then(|| bytes_total.saturating_sub(done) as f64 / rate),
            });
        };
        download_file(client, &job, &mut report, cancel)?;
        fetched += last_seen.saturating_sub(first_seen.unwrap_or(last_seen));
        done_before += size.unwrap_or(last_seen);
    }
    cache.write_ref(&request.revision, &info.sha)?;
    on_progress(&DownloadProgress {
        repo: request.repo.to_string(),
        file: String::new(),
        files_done: file_count,
        file_count,
        bytes_done: bytes_total,
        bytes_total,
        bytes_per_sec: fetched as f64 / started.elapsed().as_secs_f64().max(1e-3),
        secs_left: Some(0.0),
    });
    Ok(Snapshot {
        path: cache.snapshot_dir(&info.sha),
        commit: info.sha.clone(),
        files: plan.into_iter().map(|(f, _, _)| f).collect(),
        bytes_total,
        bytes_fetched: fetched,
        cache_note: None,
    })
}

/// Refuse names a hostile server could use to write outside the cache: a repo path must be relative without
/// `..`, and a blob name plain letters and digits.
fn check_names(file: &str, etag: &str, repo: &RepoId) -> Result<()> {
    let bad_path = file.is_empty()
        || file.starts_with('/')
        || file.contains('\\')
        || file.split('/').any(|part| part.is_empty() || part == "." || part == "..");
    let bad_etag = etag.is_empty() || !etag.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if bad_path || bad_etag {
        let what =
            if bad_path { format!("an unsafe file path `{file}`") } else { format!("an unsafe blob name `{etag}`") };
        return Err(
            HubError::Protocol { url: repo.to_string(), message: format!("the listing has {what}; refused") }.into()
        );
    }
    Ok(())
}

/// ETag and size of a file from a HEAD request (`X-Linked-Etag`/`X-Linked-Size` for LFS files).
fn head_metadata(
    client: &HubClient,
    target: &Target,
    commit: &str,
    file: &str,
    cancel: &AtomicBool,
) -> Result<(String, Option<u64>)> {
    let url = file_url(client, target, commit, file);
    let response = client.head(&url, target, cancel)?;
    let headers = response.headers();
    let etag = header(headers, "x-linked-etag")
        .or_else(|| header(headers, "etag"))
        .map(|e| e.trim().trim_start_matches("W/").trim_matches('"').to_string())
        .filter(|e| !e.is_empty() && !e.contains('/') && e != "." && e != "..")
        .ok_or_else(|| HubError::Protocol { url: url.clone(), message: "no ETag header".into() })?;
    let size = header(headers, "x-linked-size")
        .or_else(|| header(headers, "content-length"))
        .and_then(|s| s.trim().parse().ok());
    Ok((etag, size))
}
