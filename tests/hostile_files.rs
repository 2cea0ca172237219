//! Issue 40: model and data files from strangers can neither crash, hang nor fool us. Every crafted file of
//! `common::hostile_files` (sizes that ask for terabytes, a zero alignment, FIFOs and /dev/zero where files
//! belong, NaN weights, aliased or repeated tensors, an index escaping its folder, config numbers that cannot
//! be right, a template that asks for unbounded memory or renders megabytes) is refused by the CLI within seconds, with an exit
//! code (not a signal) and a message naming the file and what is wrong.

mod common;

use common::fixture;
use common::hostile_files::{hostile_folders, hostile_ggufs, with_template, HOSTILE_TEMPLATES};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Run the CLI; fail the test if it runs past `limit` (a hang) or ends on a signal (an abort).
fn run_bounded(args: &[&str], limit: Duration) -> (i32, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_metal-candle"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > limit {
            child.kill().unwrap();
            panic!("`metal-candle {}` hung for {limit:?}", args.join(" "));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    let code = status.code().unwrap_or_else(|| panic!("`{}` ended on a signal: {status:?}\n{stderr}", args.join(" ")));
    (code, stderr)
}

fn refused(args: &[&str], words: &[&str]) {
    let (code, stderr) = run_bounded(args, Duration::from_secs(60));
    assert_ne!(code, 0, "`{}` was accepted", args.join(" "));
    for word in words {
        assert!(stderr.contains(word), "`{}`: expected `{word}` in:\n{stderr}", args.join(" "));
    }
    assert!(!stderr.contains("panicked"), "a panic: {stderr}");
    eprintln!("  -> {}", stderr.trim());
}

fn generate(model: &Path) -> Vec<String> {
    ["generate", "--model", model.to_str().unwrap(), "--prompt", "hi", "--max-tokens", "2", "--device", "cpu"]
        .map(String::from)
        .to_vec()
}

#[test]
fn crafted_model_folders_are_refused_naming_file_and_field() {
    let dir = tempfile::tempdir().unwrap();
    for case in hostile_folders(dir.path()) {
        let args = generate(&case.path);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        eprintln!("case {}", case.name);
        refused(&args, case.words);
    }
}

#[test]
fn crafted_gguf_files_are_refused_before_any_allocation_they_ask_for() {
    let dir = tempfile::tempdir().unwrap();
    for case in hostile_ggufs(dir.path()) {
        let args = generate(&case.path);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        eprintln!("case {}", case.name);
        refused(&args, case.words);
    }
    // The untouched fixture still loads through the same checks.
    let ok = generate(&fixture("gguf/tiny-mistral-f32.gguf"));
    let ok: Vec<&str> = ok.iter().map(String::as_str).collect();
    assert_eq!(run_bounded(&ok, Duration::from_secs(60)).0, 0);
}

#[test]
fn templates_that_ask_for_unbounded_memory_or_megabytes_of_prompt_fail_fast() {
    let dir = tempfile::tempdir().unwrap();
    for (name, template, words) in HOSTILE_TEMPLATES {
        let mut args = generate(&with_template(dir.path(), name, template));
        args.push("--chat".into());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let started = Instant::now();
        refused(&args, words);
        assert!(started.elapsed() < Duration::from_secs(10), "{name} took {:?}", started.elapsed());
    }
}

#[cfg(unix)]
#[test]
fn fifos_and_devices_as_dataset_or_settings_file_are_refused_without_blocking() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("train.jsonl");
    common::hostile_files::mkfifo(&fifo);
    let model = fixture("tiny-llama");
    let model = model.to_str().unwrap();
    let out = dir.path().join("runs");
    let out = out.to_str().unwrap();
    refused(&["data", "--data", fifo.to_str().unwrap()], &["train.jsonl", "named pipe"]);
    let train = ["train", "--model", model, "--out", out, "--device", "cpu", "--iters", "1", "--seq-len", "64"];
    refused(&[&train[..], &["--data", fifo.to_str().unwrap()]].concat(), &["train.jsonl", "named pipe"]);
    let settings = dir.path().join("settings.toml");
    std::os::unix::fs::symlink("/dev/zero", &settings).unwrap();
    refused(&[&train[..], &["--config", settings.to_str().unwrap()]].concat(), &["settings.toml", "device"]);
    // A folder named like a data file, and a link that loops, are named as such, not as missing files.
    let folder = dir.path().join("dataset");
    std::fs::create_dir_all(folder.join("train.jsonl")).unwrap();
    let looped = dir.path().join("loop.jsonl");
    std::os::unix::fs::symlink(&looped, &looped).unwrap();
    refused(&["data", "--data", looped.to_str().unwrap()], &["loop.jsonl", "loops"]);
    refused(&["data", "--data", folder.to_str().unwrap()], &["train.jsonl", "is a folder, not a file"]);
}
