//! One file into the cache, safely: the blob is written under `<etag>.incomplete` while the blob's lock is held,
//! resumed with an HTTP range from whatever an earlier (cut, killed or Python) download left, checked against
//! its size and, for LFS files, its sha256, flushed, and only then renamed to its final name and linked from the
//! snapshot. A file under a final name is therefore always complete and verified.

use super::cache::RepoCache;
use super::http::{encode, header, sleep_unless_cancelled, HubClient, Target};
use super::HubError;
use crate::engine::{Error, Result};
use sha2::{Digest, Sha256};
use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Read and write granularity of a download.
const CHUNK_BYTES: usize = 1 << 20;

/// One file to fetch: where it lives on the Hub and under which blob name and size it belongs in the cache.
#[derive(Debug, Clone)]
pub struct FileJob<'a> {
    pub cache: &'a RepoCache,
    pub target: Target<'a>,
    pub commit: &'a str,
    pub file: &'a str,
    pub etag: String,
    /// Expected size; `None` reads to the end of the answer.
    pub size: Option<u64>,
}

/// An LFS ETag is the content's sha256 (64 hex digits); a git blob id is a sha1 of a header plus the content.
fn sha256_of_etag(etag: &str) -> Option<&str> {
    (etag.len() == 64 && etag.bytes().all(|b| b.is_ascii_hexdigit())).then_some(etag)
}

/// Whether the blob is already there at the right size.
pub fn blob_present(cache: &RepoCache, etag: &str, size: Option<u64>) -> bool {
    std::fs::metadata(cache.blob_path(etag)).is_ok_and(|m| m.is_file() && size.is_none_or(|s| m.len() == s))
}

/// The blob's URL at `commit`.
pub fn file_url(client: &HubClient, target: &Target, commit: &str, file: &str) -> String {
    format!(
        "{}/{}{}/resolve/{}/{}",
        client.settings.endpoint,
        target.kind.url_prefix(),
        target.repo,
        encode(commit, false),
        encode(file, true)
    )
}

/// Fetch `job` into the cache and return the snapshot path. `on_bytes` hears the bytes of this file held so far
/// (resumed bytes included); `cancel` stops between chunks, keeping the partial file for a later resume.
pub fn download_file(
    client: &HubClient,
    job: &FileJob,
    on_bytes: &mut dyn FnMut(u64),
    cancel: &AtomicBool,
) -> Result<PathBuf> {
    let cache = job.cache;
    if blob_present(cache, &job.etag, job.size) {
        on_bytes(job.size.unwrap_or(0));
        return cache.link(job.commit, job.file, &job.etag);
    }
    let _lock = lock_blob(&cache.lock_path(&job.etag), cancel)?;
    // Another process may have finished it while we waited.
    if !blob_present(cache, &job.etag, job.size) {
        fetch_blob(client, job, on_bytes, cancel)?;
    }
    on_bytes(std::fs::metadata(cache.blob_path(&job.etag)).map(|m| m.len()).unwrap_or(0));
    cache.link(job.commit, job.file, &job.etag)
}

/// Take the blob's lock (the file `huggingface_hub` locks too), waiting for another writer, cancellably.
fn lock_blob(path: &Path, cancel: &AtomicBool) -> Result<File> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|e| Error::write(parent, e))?;
    }
    let file =
        OpenOptions::new().create(true).truncate(false).write(true).open(path).map_err(|e| Error::write(path, e))?;
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(file),
            Err(TryLockError::WouldBlock) => sleep_unless_cancelled(Duration::from_millis(100), cancel)?,
            Err(TryLockError::Error(e)) => return Err(Error::write(path, format!("cannot lock it: {e}"))),
        }
    }
}

fn write_error(path: &Path, e: std::io::Error) -> Error {
    let full = e.raw_os_error() == Some(libc::ENOSPC);
    let message =
        if full { format!("{e}; the disk is full (the partial download is kept and resumes)") } else { e.to_string() };
    Error::write(path, message)
}

fn fetch_blob(client: &HubClient, job: &FileJob, on_bytes: &mut dyn FnMut(u64), cancel: &AtomicBool) -> Result<()> {
    let partial = job.cache.incomplete_path(&job.etag);
    if let Some(parent) = partial.parent() {
        std::fs::create_dir_all(parent).map_err(|e| Error::write(parent, e))?;
    }
    let mut file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&partial)
        .map_err(|e| Error::write(&partial, e))?;
    let mut have = file.metadata().map_err(|e| Error::write(&partial, e))?.len();
    if job.size.is_some_and(|size| have > size) {
        file.set_len(0).map_err(|e| write_error(&partial, e))?;
        have = 0;
    }
    let check_sha = sha256_of_etag(&job.etag).is_some();
    let mut hasher = Sha256::new();
    if check_sha && have > 0 {
        hash_prefix(&mut file, have, &mut hasher).map_err(|e| Error::Io { path: partial.clone(), source: e })?;
    }
    file.seek(SeekFrom::Start(have)).map_err(|e| write_error(&partial, e))?;
    on_bytes(have);
    let url = file_url(client, &job.target, job.commit, job.file);
    let attempts = client.settings.attempts.max(1);
    let mut failures = 0u32;
    let mut wait = client.settings.first_backoff;
    let mut buffer = vec![0u8; CHUNK_BYTES];
    loop {
        if job.size == Some(have) {
            break;
        }
        let response = client.get(&url, &job.target, Some(have), cancel)?;
        match response.status().as_u16() {
            206 => {
                let start = header(response.headers(), "content-range")
                    .and_then(|r| r.strip_prefix("bytes "))
                    .and_then(|r| r.split('-').next())
                    .and_then(|s| s.parse::<u64>().ok());
                if start != Some(have) {
                    return Err(HubError::Protocol {
                        url,
                        message: format!("asked for bytes from {have}, got {start:?}"),
                    }
                    .into());
                }
            }
            416 if job.size.is_none() => break,
            416 => {
                // Nothing past `have`: the partial file is longer than the server's; start over.
                file.set_len(0).map_err(|e| write_error(&partial, e))?;
                file.seek(SeekFrom::Start(0)).map_err(|e| write_error(&partial, e))?;
                hasher = Sha256::new();
                have = 0;
                failures += 1;
                if failures >= attempts {
                    return Err(HubError::Protocol { url, message: "the server refuses every range".into() }.into());
                }
                continue;
            }
            _ if have > 0 => {
                // The server ignored the range and sends the whole file.
                file.set_len(0).map_err(|e| write_error(&partial, e))?;
                file.seek(SeekFrom::Start(0)).map_err(|e| write_error(&partial, e))?;
                hasher = Sha256::new();
                have = 0;
                on_bytes(0);
            }
            _ => {}
        }
        let mut body = response.into_body().into_reader();
        let cut = loop {
            if cancel.load(Ordering::Relaxed) {
                file.flush().ok();
                return Err(Error::Cancelled);
            }
            match body.read(&mut buffer) {
                Ok(0) => break None,
                Ok(n) => {
                    file.write_all(&buffer[..n]).map_err(|e| write_error(&partial, e))?;
                    if check_sha {
                        hasher.update(&buffer[..n]);
                    }
                    have += n as u64;
                    on_bytes(have);
                    if job.size.is_some_and(|size| have > size) {
                        drop(file);
                        let _ = std::fs::remove_file(&partial);
                        return Err(corrupt(job, format!("more bytes than the {} announced", job.size.unwrap_or(0))));
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => break Some(e.to_string()),
            }
        };
        match (cut, job.size) {
            (None, None) => break,
            (None, Some(size)) if have == size => break,
            (cut, _) => {
                // A cut connection: resume from what arrived, with backoff, a few times.
                failures += 1;
                if failures >= attempts {
                    let message = cut.unwrap_or_else(|| format!("the connection closed at byte {have}"));
                    return Err(
                        HubError::Network { url, message, attempts: format!("after {failures} attempts") }.into()
                    );
                }
                sleep_unless_cancelled(wait, cancel)?;
                wait = (wait * 2).min(Duration::from_secs(8));
            }
        }
    }
    file.sync_all().map_err(|e| write_error(&partial, e))?;
    drop(file);
    if let Some(expected) = sha256_of_etag(&job.etag) {
        let got = format!("{:x}", hasher.finalize());
        if !got.eq_ignore_ascii_case(expected) {
            let _ = std::fs::remove_file(&partial);
            return Err(corrupt(job, format!("sha256 {got}, expected {expected}")));
        }
    }
    let blob = job.cache.blob_path(&job.etag);
    std::fs::rename(&partial, &blob).map_err(|e| write_error(&blob, e))
}

fn corrupt(job: &FileJob, message: String) -> Error {
    HubError::Corrupt { file: format!("{}/{}", job.target.repo, job.file), message }.into()
}

fn hash_prefix(file: &mut File, len: u64, hasher: &mut Sha256) -> std::io::Result<()> {
    file.seek(SeekFrom::Start(0))?;
    let mut reader = file.take(len);
    let mut buffer = vec![0u8; CHUNK_BYTES];
    loop {
        let n = reader.read(&mut buffer)?;
        if n == 0 {
            return Ok(());
        }
        hasher.update(&buffer[..n]);
    }
}
