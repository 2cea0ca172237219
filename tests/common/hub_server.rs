//! A stand-in for the Hugging Face Hub on 127.0.0.1, for tests and benchmarks: exactly the endpoints metal-candle
//! and `huggingface_hub` use to search and download (repo info with siblings, search, HEAD/GET `resolve` with
//! `ETag`, `X-Repo-Commit`, `X-Linked-*` and ranges), gated repos answering 401 with `X-Error-Code: GatedRepo`
//! unless the right token comes, 404s with the Hub's error codes, and faults a test can switch on: 5xx answers,
//! a connection cut mid-file, a slowed transfer, corrupted bytes.
#![allow(dead_code)]

use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One file of a fake repository.
#[derive(Clone)]
pub struct FakeFile {
    pub path: String,
    pub data: Arc<Vec<u8>>,
    /// Stored in LFS: its ETag is the sha256 and the Hub sends `X-Linked-*` headers.
    pub lfs: bool,
    sha256: String,
}

impl FakeFile {
    /// A file stored in LFS when large or binary, as the Hub's .gitattributes does.
    pub fn new(path: &str, data: Vec<u8>) -> Self {
        let lfs = is_lfs(path, data.len());
        Self::with_lfs(path, data, lfs)
    }

    pub fn with_lfs(path: &str, data: Vec<u8>, lfs: bool) -> Self {
        let sha256 = hex(&Sha256::digest(&data));
        Self { path: path.into(), data: Arc::new(data), lfs, sha256 }
    }

    /// The sha256 for LFS files; a 40-digit id standing for the git blob id otherwise.
    pub fn etag(&self) -> String {
        if self.lfs {
            self.sha256.clone()
        } else {
            self.sha256[..40].to_string()
        }
    }
}

/// A repository the server answers for.
#[derive(Clone)]
pub struct FakeRepo {
    /// "models" or "datasets".
    pub collection: &'static str,
    pub id: String,
    pub commit: String,
    pub files: Vec<FakeFile>,
    pub gated: bool,
    pub downloads: u64,
    pub likes: u64,
    pub license: String,
    /// `config.model_type` or a GGUF's architecture, for search.
    pub architecture: Option<String>,
    /// Other revision names (tags, branches) pointing at `commit`.
    pub revisions: Vec<String>,
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl FakeRepo {
    pub fn new(collection: &'static str, id: &str, files: Vec<FakeFile>) -> Self {
        let mut h = Sha256::new();
        h.update(id.as_bytes());
        for f in &files {
            h.update(f.path.as_bytes());
            h.update(f.sha256.as_bytes());
        }
        let commit = hex(&h.finalize())[..40].to_string();
        Self {
            collection,
            id: id.to_string(),
            commit,
            files,
            gated: false,
            downloads: 0,
            likes: 0,
            license: "apache-2.0".into(),
            architecture: None,
            revisions: Vec::new(),
        }
    }

    /// Every file under `dir` (recursively); large and binary files in LFS, as the Hub's .gitattributes does.
    pub fn from_dir(collection: &'static str, id: &str, dir: &Path) -> Self {
        let mut files = Vec::new();
        collect(dir, "", &mut files);
        files.sort_by(|a: &FakeFile, b| a.path.cmp(&b.path));
        let mut repo = Self::new(collection, id, files);
        if let Some(cfg) = repo.files.iter().find(|f| f.path == "config.json") {
            let v: serde_json::Value = serde_json::from_slice(&cfg.data).unwrap_or_default();
            repo.architecture = v.get("model_type").and_then(|m| m.as_str()).map(str::to_string);
        }
        if let Some(gguf) = repo.files.iter().find(|f| f.path.ends_with(".gguf")) {
            repo.architecture = repo.architecture.clone().or_else(|| gguf_architecture(&gguf.data));
        }
        repo
    }

    pub fn file(mut self, path: &str, data: Vec<u8>) -> Self {
        self.files.retain(|f| f.path != path);
        self.files.push(FakeFile::new(path, data));
        self
    }
}

/// `general.architecture` of a GGUF file, as the Hub's `gguf` field reports it: the key, a u32 type (8, a
/// string), a u64 length and the text.
fn gguf_architecture(data: &[u8]) -> Option<String> {
    let key = b"general.architecture";
    let head = &data[..data.len().min(1 << 20)];
    let at = head.windows(key.len()).position(|w| w == key)? + key.len() + 4;
    let len = u64::from_le_bytes(head.get(at..at + 8)?.try_into().ok()?) as usize;
    String::from_utf8(head.get(at + 8..at + 8 + len)?.to_vec()).ok()
}

fn is_lfs(path: &str, len: usize) -> bool {
    len >= 10 * 1024 || [".safetensors", ".gguf", ".parquet", ".bin"].iter().any(|e| path.ends_with(e))
}

fn collect(dir: &Path, prefix: &str, out: &mut Vec<FakeFile>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let rel = if prefix.is_empty() { name.clone() } else { format!("{prefix}/{name}") };
        let path = entry.path();
        if path.is_dir() {
            collect(&path, &rel, out);
        } else {
            out.push(FakeFile::new(&rel, std::fs::read(&path).unwrap()));
        }
    }
}

/// Faults a test can switch on while the server runs.
#[derive(Default)]
pub struct Faults {
    /// Answer the next N requests with 503.
    pub fail_next: AtomicUsize,
    /// The next GET of this file sends its headers and only this many bytes, then closes the connection.
    pub cut: Mutex<Option<(String, usize)>>,
    /// Sleep this long after every 64 KiB of a file body.
    pub chunk_delay_ms: AtomicU64,
    /// Serve this file with its bytes flipped (the listing keeps the true sha256).
    pub corrupt: Mutex<Option<String>>,
    /// Every request: "METHOD /path range".
    pub log: Mutex<Vec<String>>,
    /// File bytes sent, all connections.
    pub bytes_sent: AtomicU64,
}

pub struct HubServer {
    pub url: String,
    pub faults: Arc<Faults>,
    stop: Arc<AtomicBool>,
}

impl Drop for HubServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = TcpStream::connect(self.url.trim_start_matches("http://"));
    }
}

struct State {
    repos: Vec<FakeRepo>,
    token: Option<String>,
    faults: Arc<Faults>,
}

impl HubServer {
    /// Serve `repos` on a free port of 127.0.0.1; gated repos need `Authorization: Bearer <token>`.
    pub fn start(repos: Vec<FakeRepo>, token: Option<&str>) -> Self {
        Self::start_on(repos, token, 0)
    }

    pub fn start_on(repos: Vec<FakeRepo>, token: Option<&str>, port: u16) -> Self {
        let listener = TcpListener::bind(("127.0.0.1", port)).expect("bind 127.0.0.1");
        let url = format!("http://{}", listener.local_addr().unwrap());
        let faults = Arc::new(Faults::default());
        let stop = Arc::new(AtomicBool::new(false));
        let state = Arc::new(State { repos, token: token.map(str::to_string), faults: faults.clone() });
        let stop_flag = stop.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                if stop_flag.load(Ordering::Relaxed) {
                    break;
                }
                let Ok(stream) = stream else { continue };
                let state = state.clone();
                std::thread::spawn(move || {
                    let _ = serve(stream, &state);
                });
            }
        });
        Self { url, faults, stop }
    }

    pub fn requests(&self) -> Vec<String> {
        self.faults.log.lock().unwrap().clone()
    }
}

fn percent_decode(text: &str, plus_is_space: bool) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let Ok(b) = u8::from_str_radix(&text[i + 1..i + 3], 16) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(if plus_is_space && bytes[i] == b'+' { b' ' } else { bytes[i] });
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

struct Request {
    method: String,
    path: String,
    query: HashMap<String, Vec<String>>,
    headers: HashMap<String, String>,
}

fn read_request(stream: &TcpStream) -> Option<Request> {
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    let mut parts = line.split_whitespace();
    let method = parts.next()?.to_string();
    let target = parts.next()?.to_string();
    let mut headers = HashMap::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).ok()? == 0 || h == "\r\n" || h == "\n" {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    let (path, query_text) = target.split_once('?').unwrap_or((&target, ""));
    let mut query: HashMap<String, Vec<String>> = HashMap::new();
    for pair in query_text.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        query.entry(percent_decode(k, true)).or_default().push(percent_decode(v, true));
    }
    Some(Request { method, path: path.to_string(), query, headers })
}

fn respond(
    stream: &mut TcpStream,
    status: u16,
    headers: &[(String, String)],
    body: &[u8],
    head_only: bool,
) -> std::io::Result<()> {
    let reason = match status {
        200 => "OK",
        206 => "Partial Content",
        401 => "Unauthorized",
        404 => "Not Found",
        416 => "Range Not Satisfiable",
        503 => "Service Unavailable",
        _ => "Status",
    };
    let mut head = format!("HTTP/1.1 {status} {reason}\r\nConnection: close\r\n");
    let has_length = headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("content-length"));
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    if !has_length {
        head.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes())?;
    if !head_only {
        stream.write_all(body)?;
    }
    stream.flush()
}

fn error(stream: &mut TcpStream, status: u16, code: &str, message: &str, head_only: bool) -> std::io::Result<()> {
    let body = serde_json::json!({ "error": message }).to_string();
    let headers = vec![
        ("X-Error-Code".to_string(), code.to_string()),
        ("X-Error-Message".to_string(), message.to_string()),
        ("Content-Type".to_string(), "application/json".to_string()),
    ];
    respond(stream, status, &headers, body.as_bytes(), head_only)
}

fn serve(mut stream: TcpStream, state: &State) -> std::io::Result<()> {
    let Some(request) = read_request(&stream) else { return Ok(()) };
    let faults = &state.faults;
    let range = request.headers.get("range").cloned().unwrap_or_default();
    faults.log.lock().unwrap().push(format!("{} {} {}", request.method, request.path, range).trim_end().to_string());
    let head_only = request.method == "HEAD";
    if faults.fail_next.load(Ordering::SeqCst) > 0 {
        faults.fail_next.fetch_sub(1, Ordering::SeqCst);
        return error(&mut stream, 503, "", "temporarily unavailable", head_only);
    }
    let path = percent_decode(&request.path, false);
    let authorized = |repo: &FakeRepo| {
        !repo.gated
            || state
                .token
                .as_ref()
                .is_some_and(|t| request.headers.get("authorization") == Some(&format!("Bearer {t}")))
    };
    // Search: /api/models?search=...
    if let Some(collection) = path.strip_prefix("/api/").filter(|c| *c == "models" || *c == "datasets") {
        let q = request.query.get("search").and_then(|v| v.first()).cloned().unwrap_or_default().to_lowercase();
        let limit: usize =
            request.query.get("limit").and_then(|v| v.first()).and_then(|l| l.parse().ok()).unwrap_or(20);
        let mut hits: Vec<&FakeRepo> =
            state.repos.iter().filter(|r| r.collection == collection && r.id.to_lowercase().contains(&q)).collect();
        hits.sort_by_key(|r| std::cmp::Reverse(r.downloads));
        let list: Vec<serde_json::Value> = hits.into_iter().take(limit).map(search_item).collect();
        let body = serde_json::to_vec(&list).unwrap();
        return respond(&mut stream, 200, &[("Content-Type".into(), "application/json".into())], &body, head_only);
    }
    // Repo info: /api/{collection}/{id...}/revision/{rev}
    if let Some(rest) = path.strip_prefix("/api/") {
        let (collection, rest) = rest.split_once('/').unwrap_or((rest, ""));
        // `/tree/{rev}`: the file listing huggingface_hub's snapshot_download reads (one page, no Link header).
        let (id, revision, tree) = match (rest.rsplit_once("/revision/"), rest.split_once("/tree/")) {
            (Some((id, rev)), _) => (id, rev, false),
            (None, Some((id, rev))) => (id, rev.split('/').next().unwrap_or(rev), true),
            _ => return error(&mut stream, 404, "", "unknown endpoint", head_only),
        };
        let Some(repo) = state.repos.iter().find(|r| r.collection == collection && r.id == id) else {
            return error(&mut stream, 404, "RepoNotFound", "Repository not found", head_only);
        };
        if !authorized(repo) {
            return error(&mut stream, 401, "GatedRepo", "Access to this repo is restricted", head_only);
        }
        if !knows_revision(repo, revision) {
            return error(&mut stream, 404, "RevisionNotFound", "Invalid rev id", head_only);
        }
        let body = serde_json::to_vec(&if tree { tree_listing(repo) } else { info(repo) }).unwrap();
        return respond(&mut stream, 200, &[("Content-Type".into(), "application/json".into())], &body, head_only);
    }
    // Files: [/datasets]/{id}/resolve/{rev}/{path}
    let (collection, rest) = match path.strip_prefix("/datasets/") {
        Some(rest) => ("datasets", rest),
        None => ("models", path.trim_start_matches('/')),
    };
    let Some((id, rest)) = rest.split_once("/resolve/") else {
        return error(&mut stream, 404, "", "unknown endpoint", head_only);
    };
    let Some(repo) = state.repos.iter().find(|r| r.collection == collection && r.id == id) else {
        return error(&mut stream, 404, "RepoNotFound", "Repository not found", head_only);
    };
    if !authorized(repo) {
        return error(&mut stream, 401, "GatedRepo", "Access to this repo is restricted", head_only);
    }
    let (revision, file_path) = rest.split_once('/').unwrap_or((rest, ""));
    if !knows_revision(repo, revision) {
        return error(&mut stream, 404, "RevisionNotFound", "Invalid rev id", head_only);
    }
    let Some(file) = repo.files.iter().find(|f| f.path == file_path) else {
        return error(&mut stream, 404, "EntryNotFound", "Entry not found", head_only);
    };
    let etag = file.etag();
    let total = file.data.len();
    let mut headers = vec![
        ("X-Repo-Commit".to_string(), repo.commit.clone()),
        ("ETag".to_string(), format!("\"{etag}\"")),
        ("Accept-Ranges".to_string(), "bytes".to_string()),
        ("Content-Type".to_string(), "application/octet-stream".to_string()),
    ];
    if file.lfs {
        headers.push(("X-Linked-Etag".into(), format!("\"{etag}\"")));
        headers.push(("X-Linked-Size".into(), total.to_string()));
    }
    let start = range.strip_prefix("bytes=").and_then(|r| r.split('-').next()).and_then(|s| s.parse::<usize>().ok());
    let (status, start) = match start {
        Some(s) if s >= total && total > 0 => {
            headers.push(("Content-Range".into(), format!("bytes */{total}")));
            return respond(&mut stream, 416, &headers, b"", head_only);
        }
        Some(s) => (206, s),
        None => (200, 0),
    };
    if status == 206 {
        headers.push(("Content-Range".into(), format!("bytes {start}-{}/{total}", total.saturating_sub(1))));
    }
    headers.push(("Content-Length".into(), (total - start).to_string()));
    if head_only {
        return respond(&mut stream, status, &headers, b"", true);
    }
    let body: std::borrow::Cow<[u8]> = if faults.corrupt.lock().unwrap().as_deref() == Some(file.path.as_str()) {
        file.data[start..].iter().map(|b| b ^ 0x5a).collect::<Vec<u8>>().into()
    } else {
        (&file.data[start..]).into()
    };
    let cut = {
        let mut cut = faults.cut.lock().unwrap();
        match cut.as_ref() {
            Some((p, n)) if *p == file.path => {
                let n = *n;
                *cut = None;
                Some(n.min(body.len()))
            }
            _ => None,
        }
    };
    respond(&mut stream, status, &headers, b"", true)?;
    let send = cut.unwrap_or(body.len());
    for chunk in body[..send].chunks(64 * 1024) {
        stream.write_all(chunk)?;
        faults.bytes_sent.fetch_add(chunk.len() as u64, Ordering::Relaxed);
        let delay = faults.chunk_delay_ms.load(Ordering::Relaxed);
        if delay > 0 {
            std::thread::sleep(Duration::from_millis(delay));
        }
    }
    stream.flush()?;
    if cut.is_some() {
        let _ = stream.shutdown(std::net::Shutdown::Both);
    }
    // Drain anything the client still sends, so the close is clean.
    let _ = stream.set_read_timeout(Some(Duration::from_millis(10)));
    let _ = stream.read(&mut [0u8; 16]);
    Ok(())
}

fn knows_revision(repo: &FakeRepo, revision: &str) -> bool {
    revision == "main" || revision == repo.commit || repo.revisions.iter().any(|r| r == revision)
}

fn info(repo: &FakeRepo) -> serde_json::Value {
    let siblings: Vec<serde_json::Value> = repo
        .files
        .iter()
        .map(|f| {
            let mut s = serde_json::json!({ "rfilename": f.path, "size": f.data.len(), "blobId": f.etag()[..40.min(f.etag().len())] });
            if f.lfs {
                s["blobId"] = serde_json::json!(hex(&Sha256::digest(f.path.as_bytes()))[..40]);
                s["lfs"] = serde_json::json!({ "sha256": f.etag(), "size": f.data.len(), "pointerSize": 134 });
            }
            s
        })
        .collect();
    serde_json::json!({
        "_id": repo.commit[..24], "id": repo.id, "sha": repo.commit, "private": false,
        "gated": if repo.gated { serde_json::json!("manual") } else { serde_json::json!(false) },
        "disabled": false, "downloads": repo.downloads, "likes": repo.likes, "tags": [format!("license:{}", repo.license)],
        "siblings": siblings, "lastModified": "2026-11-01T00:00:00.000Z", "createdAt": "2026-11-01T00:00:00.000Z",
        "cardData": { "license": repo.license },
    })
}

fn tree_listing(repo: &FakeRepo) -> serde_json::Value {
    let mut entries = Vec::new();
    let mut folders = std::collections::BTreeSet::new();
    for f in &repo.files {
        let mut parent = f.path.as_str();
        while let Some((dir, _)) = parent.rsplit_once('/') {
            folders.insert(dir.to_string());
            parent = dir;
        }
        let mut e = serde_json::json!({ "type": "file", "oid": f.etag(), "size": f.data.len(), "path": f.path });
        if f.lfs {
            e["lfs"] = serde_json::json!({ "oid": f.etag(), "size": f.data.len(), "pointerSize": 134 });
        }
        entries.push(e);
    }
    for dir in folders {
        entries.push(serde_json::json!({ "type": "directory", "oid": "0".repeat(40), "size": 0, "path": dir }));
    }
    serde_json::Value::Array(entries)
}

fn search_item(repo: &FakeRepo) -> serde_json::Value {
    let has_gguf = repo.files.iter().any(|f| f.path.ends_with(".gguf"));
    let mut tags = vec![format!("license:{}", repo.license)];
    if has_gguf {
        tags.push("gguf".into());
    }
    let mut item = serde_json::json!({
        "_id": repo.commit[..24], "id": repo.id, "downloads": repo.downloads, "likes": repo.likes,
        "gated": if repo.gated { serde_json::json!("manual") } else { serde_json::json!(false) },
        "tags": tags, "cardData": { "license": repo.license },
        "siblings": repo.files.iter().map(|f| serde_json::json!({ "rfilename": f.path })).collect::<Vec<_>>(),
        "usedStorage": repo.files.iter().map(|f| f.data.len() as u64).sum::<u64>(),
    });
    if let Some(arch) = &repo.architecture {
        if has_gguf {
            item["gguf"] = serde_json::json!({ "architecture": arch });
        } else {
            item["config"] = serde_json::json!({ "model_type": arch });
        }
    }
    item
}
