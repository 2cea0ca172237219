//! The Hub client against the local stand-in (tests/common/hub_server.rs): search, downloads into the shared
//! cache layout, repo ids in the CLI, provenance in runs, and faults (a cut connection, a killed download, 404s,
//! gated repos, 5xx answers, a full disk, corrupt bytes, hostile listings, two downloads at once).

mod common;

use common::fixture;
use common::hub_server::{FakeRepo, HubServer};
use metal_candle::engine::hub::{self, DownloadProgress, HubClient, HubError, HubSettings, RepoKind, SnapshotRequest};
use metal_candle::engine::Error;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

fn settings(server: &HubServer, cache: &Path) -> HubSettings {
    let mut s = HubSettings::from_env(|_| None);
    s.endpoint = server.url.clone();
    s.cache_dir = cache.to_path_buf();
    s.token = None;
    s.token_path = cache.join("no-token");
    s.first_backoff = Duration::from_millis(20);
    s
}

fn big_bytes(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + i / 251) as u8).collect()
}

fn model_repo() -> FakeRepo {
    let mut repo = FakeRepo::from_dir("models", "org/tiny-llama", &fixture("tiny-llama"));
    repo.downloads = 50;
    repo
}

fn big_repo() -> FakeRepo {
    FakeRepo::new("models", "org/big", vec![])
        .file("weights.bin", big_bytes(3 << 20))
        .file("config.json", b"{}".to_vec())
}

fn request(id: &str) -> SnapshotRequest {
    SnapshotRequest {
        kind: RepoKind::Model,
        repo: hub::RepoId::parse(id).unwrap(),
        revision: "main".into(),
        include: vec![],
    }
}

fn download(client: &HubClient, id: &str) -> metal_candle::engine::Result<hub::Snapshot> {
    hub::download_snapshot(client, &request(id), &|_| true, &mut |_| {}, &AtomicBool::new(false))
}

fn sha256_hex(path: &Path) -> String {
    common::hub_server::hex(&Sha256::digest(std::fs::read(path).unwrap()))
}

fn cli(server: &HubServer, cache: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_metal-candle"));
    c.env("HF_ENDPOINT", &server.url)
        .env("HF_HUB_CACHE", cache)
        .env("HF_TOKEN_PATH", cache.join("token"))
        .env_remove("HF_TOKEN")
        .env_remove("HF_HUB_OFFLINE");
    c
}

fn hub_error(result: metal_candle::engine::Result<hub::Snapshot>) -> HubError {
    match result {
        Err(Error::Hub(e)) => e,
        other => panic!("expected a Hub error, got {other:?}"),
    }
}

#[test]
fn a_snapshot_lands_in_the_cache_layout_huggingface_hub_uses() {
    let server = HubServer::start(vec![model_repo()], None);
    let cache = tempfile::tempdir().unwrap();
    let client = HubClient::new(settings(&server, cache.path()));
    let mut last = DownloadProgress::default();
    let snap = hub::download_snapshot(
        &client,
        &request("org/tiny-llama"),
        &|_| true,
        &mut |p| last = p.clone(),
        &AtomicBool::new(false),
    )
    .unwrap();
    let repo_dir = cache.path().join("models--org--tiny-llama");
    assert_eq!(std::fs::read_to_string(repo_dir.join("refs/main")).unwrap(), snap.commit);
    assert_eq!(snap.path, repo_dir.join("snapshots").join(&snap.commit));
    for file in ["config.json", "model.safetensors", "tokenizer.json"] {
        let pointer = snap.path.join(file);
        let link = std::fs::read_link(&pointer).unwrap();
        assert!(link.starts_with("../../blobs"), "{file} links to {link:?}");
        assert_eq!(std::fs::read(&pointer).unwrap(), std::fs::read(fixture("tiny-llama").join(file)).unwrap());
    }
    // LFS blobs are named by their sha256.
    let weights = sha256_hex(&fixture("tiny-llama").join("model.safetensors"));
    assert!(repo_dir.join("blobs").join(&weights).is_file());
    assert!(cache.path().join(".locks/models--org--tiny-llama").join(format!("{weights}.lock")).exists());
    assert_eq!(last.bytes_done, last.bytes_total);
    assert_eq!(snap.bytes_fetched, snap.bytes_total);
    // A second download fetches nothing.
    let before = server.faults.bytes_sent.load(Ordering::Relaxed);
    let again = download(&client, "org/tiny-llama").unwrap();
    assert_eq!(again.bytes_fetched, 0);
    assert_eq!(server.faults.bytes_sent.load(Ordering::Relaxed), before);
    // Offline, the cache answers without the server.
    let mut offline = settings(&server, cache.path());
    offline.offline = true;
    offline.endpoint = "http://127.0.0.1:9".into();
    let cached = download(&HubClient::new(offline), "org/tiny-llama").unwrap();
    assert_eq!(cached.path, snap.path);
    assert!(cached.cache_note.unwrap().contains("HF_HUB_OFFLINE"));
}

#[test]
fn search_reports_what_users_pick_by() {
    let gguf = std::fs::read(fixture("gguf").join("tiny-mistral-f32.gguf")).unwrap_or_else(|_| big_bytes(2048));
    let mut quantized = FakeRepo::new("models", "org/tiny-GGUF", vec![])
        .file("tiny-Q4_K_M.gguf", gguf.clone())
        .file("tiny-Q8_0.gguf", gguf)
        .file("tiny-IQ2_M.gguf", b"x".to_vec());
    quantized.architecture = Some("llama".into());
    quantized.downloads = 10;
    let mut other = FakeRepo::new("models", "org/tiny-bert", vec![]).file("model.safetensors", b"x".to_vec());
    other.architecture = Some("bert".into());
    let mut gated = model_repo();
    gated.id = "org/tiny-gated".into();
    gated.gated = true;
    let server = HubServer::start(vec![model_repo(), quantized, other, gated], None);
    let cache = tempfile::tempdir().unwrap();
    let client = HubClient::new(settings(&server, cache.path()));
    let hits = hub::search(&client, RepoKind::Model, "tiny", 10, &AtomicBool::new(false)).unwrap();
    let ids: Vec<&str> = hits.iter().map(|h| h.id.as_str()).collect();
    assert_eq!(ids[0], "org/tiny-llama", "most downloaded first: {ids:?}");
    let by_id = |id: &str| hits.iter().find(|h| h.id == id).unwrap();
    assert_eq!(by_id("org/tiny-llama").supported, Some(true));
    assert_eq!(by_id("org/tiny-llama").license.as_deref(), Some("apache-2.0"));
    assert!(by_id("org/tiny-llama").size_bytes.unwrap() > 100_000);
    assert_eq!(by_id("org/tiny-bert").supported, Some(false));
    assert!(by_id("org/tiny-gated").gated);
    let q = by_id("org/tiny-GGUF");
    assert_eq!(q.weights, "gguf");
    let quants: Vec<&str> = q.gguf_files.iter().map(|g| g.quant.as_str()).collect();
    assert_eq!(quants, ["Q4_K_M", "Q8_0", "IQ2_M"]);
    assert!(!q.gguf_files[2].supported);
    // The CLI prints the same.
    let out = cli(&server, cache.path()).args(["hub", "search", "gguf"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("org/tiny-GGUF") && text.contains("GGUF: Q4_K_M Q8_0 IQ2_M"), "{text}");
}

#[test]
fn repo_ids_work_as_model_and_data_arguments_and_runs_record_them() {
    let gguf = std::fs::read(fixture("gguf").join("tiny-mistral-f32.gguf")).unwrap();
    let quantized = FakeRepo::new("models", "org/tiny-GGUF", vec![])
        .file("tiny-Q8_0.gguf", gguf.clone())
        .file("tiny-Q4_K_M.gguf", gguf);
    let data = FakeRepo::from_dir("datasets", "org/sample-chat", &common::cli::sample_data());
    let server = HubServer::start(vec![model_repo(), quantized, data], None);
    let cache = tempfile::tempdir().unwrap();
    // info on a repo id downloads it; the last stdout line of `hub download` is the snapshot folder.
    let out =
        cli(&server, cache.path()).args(["info", "--model", "org/tiny-llama", "--device", "cpu"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("llama"));
    let out = cli(&server, cache.path()).args(["hub", "download", "org/tiny-llama"]).output().unwrap();
    let last_line = String::from_utf8_lossy(&out.stdout).lines().last().unwrap_or_default().to_string();
    assert!(Path::new(&last_line).join("config.json").is_file(), "{last_line}");
    // A GGUF repo gives one file: Q4_K_M by default, another by `:QUANT`.
    let out = cli(&server, cache.path()).args(["hub", "download", "org/tiny-GGUF:Q8_0", "--json"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["file"].as_str().unwrap().ends_with("tiny-Q8_0.gguf"));
    let snapshot = PathBuf::from(v["path"].as_str().unwrap());
    assert!(!snapshot.join("tiny-Q4_K_M.gguf").exists(), "only the chosen quant is fetched");
    // Training on repo ids records where they came from; the adapter names the repo as its base.
    let runs = tempfile::tempdir().unwrap();
    let out = cli(&server, cache.path())
        .args(["train", "--model", "org/tiny-llama", "--data", "org/sample-chat", "--out"])
        .arg(runs.path())
        .args([
            "--name",
            "hub",
            "--device",
            "cpu",
            "--iters",
            "2",
            "--seq-len",
            "64",
            "--batch-size",
            "2",
            "--rank",
            "2",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let run: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(runs.path().join("hub/run.json")).unwrap()).unwrap();
    assert_eq!(run["config"]["model_source"]["repo"], "org/tiny-llama");
    assert_eq!(run["config"]["data_source"]["repo"], "org/sample-chat");
    assert_eq!(run["config"]["data_source"]["kind"], "dataset");
    assert_eq!(run["config"]["model_source"]["commit"].as_str().unwrap().len(), 40);
    let adapter: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(runs.path().join("hub/checkpoint-2/adapter_config.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(adapter["base_model_name_or_path"], "org/tiny-llama");
    // Offline, a repo id that is cached still resolves; one that is not says so.
    let out = cli(&server, cache.path())
        .env("HF_HUB_OFFLINE", "1")
        .args(["info", "--model", "org/tiny-llama", "--device", "cpu"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = cli(&server, cache.path())
        .env("HF_HUB_OFFLINE", "1")
        .args(["info", "--model", "org/elsewhere"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("org/elsewhere") && err.contains("HF_HUB_OFFLINE"), "{err}");
    // A local folder wins over a repo id of the same name.
    let local = tempfile::tempdir().unwrap();
    let shadow = local.path().join("org/tiny-llama");
    std::fs::create_dir_all(shadow.parent().unwrap()).unwrap();
    std::fs::write(&shadow, b"not a model").unwrap();
    let out = cli(&server, cache.path())
        .current_dir(local.path())
        .args(["info", "--model", "org/tiny-llama"])
        .output()
        .unwrap();
    assert!(!out.status.success(), "the local file was read, not the repo");
}

/// A preference dataset on the Hub in trl-lib/ultrafeedback_binarized's layout (parquet shards of whole
/// conversations in `chosen` / `rejected`, scores beside them) trains DPO by its repo id and evaluates by it.
#[test]
fn a_hub_preference_dataset_trains_dpo_by_its_repo_id() {
    let data = FakeRepo::from_dir("datasets", "org/prefs", &fixture("datasets/preference-hub"));
    let server = HubServer::start(vec![model_repo(), data], None);
    let cache = tempfile::tempdir().unwrap();
    let runs = tempfile::tempdir().unwrap();
    let out = cli(&server, cache.path())
        .args(["train", "--model", "org/tiny-llama", "--data", "org/prefs", "--method", "dpo", "--out"])
        .arg(runs.path())
        .args(["--name", "dpo", "--device", "cpu", "--iters", "2", "--seq-len", "64", "--batch-size", "2"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let run: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(runs.path().join("dpo/run.json")).unwrap()).unwrap();
    assert_eq!(
        (run["config"]["method"].as_str(), run["config"]["data_source"]["repo"].as_str()),
        (Some("dpo"), Some("org/prefs"))
    );
    let out = cli(&server, cache.path())
        .args(["eval", "--task", "preference", "--data", "org/prefs", "--json", "--device", "cpu", "--checkpoints"])
        .arg(runs.path().join("dpo/checkpoint-2"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["rows"], 1, "the test shard's one pair");
}

/// A GRPO prompt dataset on the Hub in openai/gsm8k's layout (`main/{train,test}-00000-of-00001.parquet`,
/// `question` / `answer` columns) is read by its repo id as prompts with their answers.
#[test]
fn a_hub_gsm8k_dataset_reads_as_prompts_by_its_repo_id() {
    let data = FakeRepo::from_dir("datasets", "org/gsm8k", &fixture("datasets/gsm8k-hub"));
    let server = HubServer::start(vec![data], None);
    let cache = tempfile::tempdir().unwrap();
    let out = cli(&server, cache.path()).args(["data", "--data", "org/gsm8k", "--json"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let splits = report["splits"].as_array().unwrap();
    let summary: Vec<(&str, &str, u64)> = splits
        .iter()
        .map(|s| (s["split"].as_str().unwrap(), s["format"].as_str().unwrap_or("none"), s["rows"].as_u64().unwrap()))
        .collect();
    assert_eq!(summary, [("train", "prompts", 2), ("test", "prompts", 1)]);
    assert_eq!(splits[0]["columns"], serde_json::json!(["question", "answer"]));
    let raw = metal_candle::engine::data::load_raw_dataset(
        Path::new(report["path"].as_str().unwrap()),
        &metal_candle::engine::data::DataOptions::default(),
    )
    .unwrap();
    let rows: Vec<_> = raw.train.rows.iter().chain(raw.valid.iter().flat_map(|v| &v.rows)).collect();
    match &rows[0].row {
        metal_candle::engine::data::Row::Prompt(p) => {
            assert!(p.prompt_text().starts_with("Natalia sold clips"), "{p:?}");
            assert!(p.answer.as_deref().is_some_and(|a| a.ends_with("#### 72")), "{p:?}");
        }
        other => panic!("not a prompt: {other:?}"),
    }
}

#[test]
fn a_cut_connection_resumes_from_what_arrived() {
    let server = HubServer::start(vec![big_repo()], None);
    let cache = tempfile::tempdir().unwrap();
    let client = HubClient::new(settings(&server, cache.path()));
    *server.faults.cut.lock().unwrap() = Some(("weights.bin".into(), 1_000_000));
    let snap = download(&client, "org/big").unwrap();
    assert_eq!(
        sha256_hex(&snap.path.join("weights.bin")),
        common::hub_server::hex(&Sha256::digest(big_bytes(3 << 20)))
    );
    let log = server.requests();
    assert!(log.iter().any(|l| l.ends_with("weights.bin bytes=1000000-")), "{log:?}");
    // Across processes: a partial file left behind is resumed, not fetched again.
    let cache2 = tempfile::tempdir().unwrap();
    let client2 = HubClient::new(settings(&server, cache2.path()));
    let sha = common::hub_server::hex(&Sha256::digest(big_bytes(3 << 20)));
    let partial = cache2.path().join("models--org--big/blobs").join(format!("{sha}.incomplete"));
    std::fs::create_dir_all(partial.parent().unwrap()).unwrap();
    std::fs::write(&partial, &big_bytes(3 << 20)[..2_000_000]).unwrap();
    let sent_before = server.faults.bytes_sent.load(Ordering::Relaxed);
    let snap = download(&client2, "org/big").unwrap();
    let sent = server.faults.bytes_sent.load(Ordering::Relaxed) - sent_before;
    assert!(sent < 1_200_000, "sent {sent} bytes for a file two thirds present");
    assert_eq!(sha256_hex(&snap.path.join("weights.bin")), sha);
    assert!(!partial.exists());
}

#[test]
fn a_killed_download_leaves_no_file_under_a_final_name_and_resumes() {
    let server = HubServer::start(vec![big_repo()], None);
    server.faults.chunk_delay_ms.store(40, Ordering::Relaxed);
    let cache = tempfile::tempdir().unwrap();
    let mut child = cli(&server, cache.path()).args(["hub", "download", "org/big"]).spawn().unwrap();
    let sha = common::hub_server::hex(&Sha256::digest(big_bytes(3 << 20)));
    let blobs = cache.path().join("models--org--big/blobs");
    let partial = blobs.join(format!("{sha}.incomplete"));
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while std::fs::metadata(&partial).map(|m| m.len()).unwrap_or(0) < 300_000 {
        assert!(std::time::Instant::now() < deadline, "the download never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    assert!(!blobs.join(&sha).exists(), "a partial file under the final name");
    let snapshots = cache.path().join("models--org--big/snapshots");
    let mut pointers = Vec::new();
    if snapshots.exists() {
        for e in walk(&snapshots) {
            pointers.push(e);
        }
    }
    assert!(pointers.iter().all(|p| !p.ends_with("weights.bin")), "{pointers:?}");
    server.faults.chunk_delay_ms.store(0, Ordering::Relaxed);
    let out = cli(&server, cache.path()).args(["hub", "download", "org/big"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let folder = String::from_utf8_lossy(&out.stdout).lines().last().unwrap().to_string();
    assert_eq!(sha256_hex(&Path::new(&folder).join("weights.bin")), sha);
    assert!(server.requests().iter().any(|l| l.contains("weights.bin bytes=")), "resumed with a range");
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        if e.path().is_dir() {
            out.extend(walk(&e.path()));
        } else {
            out.push(e.path());
        }
    }
    out
}

#[test]
fn missing_repos_revisions_and_files_are_named() {
    let server = HubServer::start(vec![model_repo()], None);
    let cache = tempfile::tempdir().unwrap();
    let client = HubClient::new(settings(&server, cache.path()));
    let e = hub_error(download(&client, "org/nope"));
    assert!(matches!(e, HubError::RepoNotFound { .. }) && e.to_string().contains("org/nope"), "{e}");
    let mut req = request("org/tiny-llama");
    req.revision = "v9".into();
    let e = hub_error(hub::download_snapshot(&client, &req, &|_| true, &mut |_| {}, &AtomicBool::new(false)));
    assert!(e.to_string().contains("no revision `v9`"), "{e}");
    req.revision = "main".into();
    req.include = vec!["*.bin".into()];
    let e = hub_error(hub::download_snapshot(&client, &req, &|_| true, &mut |_| {}, &AtomicBool::new(false)));
    assert!(e.to_string().contains("no file matches") && e.to_string().contains("config.json"), "{e}");
    let out = cli(&server, cache.path()).args(["info", "--model", "org/nope"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("`org/nope` was not found"), "{err}");
}

#[test]
fn gated_repos_need_a_token_and_say_where_to_get_access() {
    let mut gated = model_repo();
    gated.gated = true;
    let server = HubServer::start(vec![gated], Some("hf_right"));
    let cache = tempfile::tempdir().unwrap();
    let mut s = settings(&server, cache.path());
    let e = hub_error(download(&HubClient::new(s.clone()), "org/tiny-llama"));
    let text = e.to_string();
    assert!(
        text.contains("gated") && text.contains(&format!("{}/org/tiny-llama", server.url)) && text.contains("no token"),
        "{text}"
    );
    s.token = hub::Token::new("hf_wrong");
    let text = hub_error(download(&HubClient::new(s.clone()), "org/tiny-llama")).to_string();
    assert!(text.contains("not been granted") && !text.contains("hf_wrong"), "{text}");
    s.token = hub::Token::new("hf_right");
    download(&HubClient::new(s), "org/tiny-llama").unwrap();
    // The CLI takes the token from HF_TOKEN or the token file `hub login` writes, and never prints it.
    let cache2 = tempfile::tempdir().unwrap();
    let out = cli(&server, cache2.path()).args(["hub", "download", "org/tiny-llama"]).output().unwrap();
    assert!(!out.status.success());
    let mut login =
        cli(&server, cache2.path()).args(["hub", "login"]).stdin(std::process::Stdio::piped()).spawn().unwrap();
    use std::io::Write;
    login.stdin.take().unwrap().write_all(b"hf_right\n").unwrap();
    assert!(login.wait().unwrap().success());
    let out = cli(&server, cache2.path()).args(["hub", "download", "org/tiny-llama"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let all = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(!all.contains("hf_right"));
}

#[test]
fn server_errors_are_retried_then_reported() {
    let server = HubServer::start(vec![model_repo()], None);
    let cache = tempfile::tempdir().unwrap();
    let client = HubClient::new(settings(&server, cache.path()));
    server.faults.fail_next.store(3, Ordering::SeqCst);
    download(&client, "org/tiny-llama").unwrap();
    assert!(server.requests().len() >= 3 + 4);
    let cache2 = tempfile::tempdir().unwrap();
    server.faults.fail_next.store(1000, Ordering::SeqCst);
    let e = hub_error(download(&HubClient::new(settings(&server, cache2.path())), "org/tiny-llama"));
    assert!(e.to_string().contains("503") && e.to_string().contains("after 5 attempts"), "{e}");
    server.faults.fail_next.store(0, Ordering::SeqCst);
}

#[test]
fn corrupt_bytes_and_hostile_listings_are_refused() {
    let mut hostile = FakeRepo::new("models", "org/evil", vec![]).file("config.json", b"{}".to_vec());
    hostile.files.push(common::hub_server::FakeFile::new("../../../../escaped.json", b"{}".to_vec()));
    let server = HubServer::start(vec![big_repo(), hostile], None);
    let cache = tempfile::tempdir().unwrap();
    let client = HubClient::new(settings(&server, cache.path()));
    *server.faults.corrupt.lock().unwrap() = Some("weights.bin".into());
    let e = hub_error(download(&client, "org/big"));
    assert!(matches!(e, HubError::Corrupt { .. }) && e.to_string().contains("sha256"), "{e}");
    let blobs = walk(&cache.path().join("models--org--big/blobs"));
    assert!(blobs.iter().all(|b| b.metadata().unwrap().len() < 1000), "no corrupt blob kept: {blobs:?}");
    let e = hub_error(download(&client, "org/evil"));
    assert!(e.to_string().contains("unsafe file path"), "{e}");
    assert!(!cache.path().parent().unwrap().join("escaped.json").exists());
}

#[test]
fn two_downloads_of_one_repo_at_once_share_the_blob() {
    let server = HubServer::start(vec![big_repo()], None);
    server.faults.chunk_delay_ms.store(5, Ordering::Relaxed);
    let cache = tempfile::tempdir().unwrap();
    let a = cli(&server, cache.path()).args(["hub", "download", "org/big"]).spawn().unwrap();
    let b = cli(&server, cache.path()).args(["hub", "download", "org/big"]).spawn().unwrap();
    for child in [a, b] {
        assert!(child.wait_with_output().unwrap().status.success());
    }
    let sha = common::hub_server::hex(&Sha256::digest(big_bytes(3 << 20)));
    let snap = walk(&cache.path().join("models--org--big/snapshots"));
    let weights = snap.iter().find(|p| p.ends_with("weights.bin")).unwrap();
    assert_eq!(sha256_hex(weights), sha);
    let blobs = walk(&cache.path().join("models--org--big/blobs"));
    assert_eq!(blobs.len(), 2, "one blob per file, no leftovers: {blobs:?}");
}

#[test]
fn a_full_disk_is_refused_before_the_download_starts() {
    // SAFETY: getuid has no preconditions.
    if unsafe { libc_getuid() } != 0 {
        eprintln!("skipped: mounting a small tmpfs needs root");
        return;
    }
    let server = HubServer::start(vec![big_repo()], None);
    let dir = tempfile::tempdir().unwrap();
    let mount = dir.path().join("small");
    std::fs::create_dir_all(&mount).unwrap();
    let mounted = Command::new("mount").args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"]).arg(&mount).status();
    if !mounted.is_ok_and(|s| s.success()) {
        eprintln!("skipped: this root cannot mount a tmpfs (a container without CAP_SYS_ADMIN)");
        return;
    }
    let client = HubClient::new(settings(&server, &mount.join("cache")));
    let result = download(&client, "org/big");
    let _ = Command::new("umount").arg(&mount).status();
    let e = hub_error(result);
    assert!(matches!(e, HubError::DiskFull { .. }) && e.to_string().contains("MiB"), "{e}");
    assert_eq!(server.faults.bytes_sent.load(Ordering::Relaxed), 0, "nothing fetched");
}

extern "C" {
    #[link_name = "getuid"]
    fn libc_getuid() -> u32;
}

#[test]
fn cancelling_keeps_the_partial_file_for_a_resume() {
    let server = HubServer::start(vec![big_repo()], None);
    server.faults.chunk_delay_ms.store(20, Ordering::Relaxed);
    let cache = tempfile::tempdir().unwrap();
    let client = HubClient::new(settings(&server, cache.path()));
    let cancel = AtomicBool::new(false);
    let result = hub::download_snapshot(
        &client,
        &request("org/big"),
        &|_| true,
        &mut |p| {
            if p.bytes_done > 500_000 {
                cancel.store(true, Ordering::SeqCst);
            }
        },
        &cancel,
    );
    assert!(matches!(result, Err(Error::Cancelled)), "{result:?}");
    let partials: Vec<_> = walk(&cache.path().join("models--org--big/blobs"))
        .into_iter()
        .filter(|p| p.to_string_lossy().ends_with(".incomplete"))
        .collect();
    assert_eq!(partials.len(), 1);
    assert!(partials[0].metadata().unwrap().len() > 500_000);
}
