//! Our cache and the real `huggingface_hub` client's, both ways, through the local Hub stand-in: the Python
//! client finds what we downloaded offline (and `scan_cache_dir` finds nothing wrong with it; transformers loads
//! it offline when installed), and we load, offline, what the Python client downloaded.
//! Needs Python 3 with `huggingface_hub` (`scripts/test_setup.sh` installs it).

mod common;

use common::hub_server::{FakeRepo, HubServer};
use std::path::Path;
use std::process::Command;

fn python(server: &HubServer, args: &[&str]) -> serde_json::Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/check_hub_interop.py");
    let out = Command::new(python_program())
        .arg(script)
        .args(args)
        .env("HF_ENDPOINT", &server.url)
        .env_remove("HF_HUB_OFFLINE")
        .env_remove("HF_TOKEN")
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "the huggingface_hub check failed (is huggingface_hub installed? scripts/test_setup.sh installs it):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.lines().last().unwrap_or_default()).unwrap_or_else(|e| panic!("{e}: {text}"))
}

/// `$PYTHON`, else the virtual environment `scripts/test_setup.sh` makes when the system Python lacks
/// huggingface_hub, else `python3`.
fn python_program() -> std::path::PathBuf {
    if let Some(p) = std::env::var_os("PYTHON") {
        return p.into();
    }
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv-test/bin/python");
    if venv.exists() {
        return venv;
    }
    "python3".into()
}

fn ours(server: &HubServer, cache: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_metal-candle"));
    c.env("HF_ENDPOINT", &server.url).env("HF_HUB_CACHE", cache).env_remove("HF_HUB_OFFLINE").env_remove("HF_TOKEN");
    c
}

#[test]
fn huggingface_hub_and_we_read_each_others_downloads() {
    let llama = FakeRepo::from_dir("models", "org/tiny-llama", &common::fixture("tiny-llama"));
    let qwen = FakeRepo::from_dir("models", "org/tiny-qwen2", &common::fixture("tiny-qwen2"));
    let server = HubServer::start(vec![llama, qwen], None);
    let cache = tempfile::tempdir().unwrap();
    let cache_str = cache.path().to_str().unwrap();

    // Ours -> theirs.
    let out = ours(&server, cache.path()).args(["hub", "download", "org/tiny-llama"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let snapshot = String::from_utf8_lossy(&out.stdout).lines().last().unwrap().to_string();
    let seen = python(&server, &["read-ours", cache_str, "org/tiny-llama", &snapshot]);
    eprintln!("huggingface_hub on our download: {seen}");
    assert_eq!(seen["same_snapshot"], true, "{seen}");
    assert_eq!(seen["config_found"], true);
    assert!(seen["try_to_load_from_cache"].as_str().is_some_and(|p| p.ends_with("model.safetensors")), "{seen}");
    assert_eq!(seen["scan_warnings"], serde_json::json!([]), "{seen}");
    assert_eq!(seen["scan_repos"], serde_json::json!(["org/tiny-llama"]));
    if !seen["transformers"].is_null() {
        assert_eq!(seen["transformers"]["model_type"], "llama");
    }
    // An adapter trained on the repo id names it as its base, and PEFT (when installed) finds that base offline.
    let runs = tempfile::tempdir().unwrap();
    let out = ours(&server, cache.path())
        .args(["train", "--model", "org/tiny-llama", "--data"])
        .arg(common::cli::sample_data())
        .arg("--out")
        .arg(runs.path())
        .args(["--name", "r", "--device", "cpu", "--iters", "1", "--seq-len", "48", "--batch-size", "2", "--rank", "2"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let checkpoint = runs.path().join("r/checkpoint-1");
    let peft = python(&server, &["peft-base", cache_str, checkpoint.to_str().unwrap()]);
    eprintln!("PEFT on our adapter: {peft}");
    if !peft["peft"].is_null() {
        assert_eq!(peft["base"], "org/tiny-llama");
        assert_eq!(peft["model_type"], "llama");
    }

    // Theirs -> ours, offline.
    let theirs = python(&server, &["download", cache_str, "org/tiny-qwen2"]);
    let their_snapshot = theirs["snapshot"].as_str().unwrap().to_string();
    let out = ours(&server, cache.path())
        .env("HF_HUB_OFFLINE", "1")
        .args(["info", "--model", "org/tiny-qwen2", "--device", "cpu"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("qwen2"));
    let requests_before = server.requests().len();
    let out = ours(&server, cache.path()).args(["hub", "download", "org/tiny-qwen2", "--json"]).output().unwrap();
    let ours_json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(ours_json["path"].as_str().unwrap(), their_snapshot, "the same snapshot folder");
    assert_eq!(ours_json["bytes_fetched"], 0, "nothing fetched again");
    assert!(
        server.requests()[requests_before..].iter().all(|r| !r.contains("/resolve/")),
        "only the listing was asked"
    );
}
