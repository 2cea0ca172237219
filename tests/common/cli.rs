//! Driving the built `metal-candle train` as a child process: a tiny-llama run on the sample data, its JSON
//! events read line by line, signals sent to it, and the checkpoints it leaves checked.

use super::fixture;
use candle_core::{DType, Device, Tensor};
use metal_candle::engine::checkpoint;
use metal_candle::engine::model::load_model;
use std::collections::HashMap;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

pub fn sample_data() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/sample-chat")
}

/// `metal-candle train` on tiny-llama and the sample data, on the CPU, with small batches.
pub fn train_command(out: &Path, name: &str) -> Command {
    train_command_at(out, name, 96)
}

/// [`train_command`] with rows of up to `seq_len` tokens.
pub fn train_command_at(out: &Path, name: &str, seq_len: usize) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_metal-candle"));
    c.args(["train", "--model"])
        .arg(fixture("tiny-llama"))
        .arg("--data")
        .arg(sample_data())
        .arg("--out")
        .arg(out)
        .args([
            "--name",
            name,
            "--device",
            "cpu",
            "--seq-len",
            &seq_len.to_string(),
            "--batch-size",
            "4",
            "--rank",
            "4",
        ]);
    c
}

/// Two finished runs in `runs`: `r-a` (lr 1e-3) and `r-b` (lr 5e-4), three steps each.
pub fn two_runs(runs: &Path) {
    for (name, lr) in [("r-a", "1e-3"), ("r-b", "5e-4")] {
        let out = train_command(runs, name)
            .args(["--iters", "3", "--lr", lr, "--val-every", "3"])
            .stdout(Stdio::null())
            .output()
            .unwrap();
        assert!(out.status.success(), "train {name}: {}", String::from_utf8_lossy(&out.stderr));
    }
}

/// `metal-candle train --resume <checkpoint>` (everything else from the run's run.json).
pub fn resume_command(checkpoint: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_metal-candle"));
    c.args(["train", "--device", "cpu", "--resume"]).arg(checkpoint);
    c
}

/// A running `train`: the child and, when it was given `--json`, its stdout events (one JSON value a line).
pub struct Running {
    pub child: Child,
    events: Receiver<serde_json::Value>,
}

impl Running {
    pub fn spawn(mut command: Command) -> Self {
        let mut child = command.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, events) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Ok(v) = serde_json::from_str(&line) {
                    if tx.send(v).is_err() {
                        return;
                    }
                }
            }
        });
        Self { child, events }
    }

    /// Wait (up to 60 s) for an event of kind `event` for which `wanted` holds; None when the run ended first.
    pub fn wait_for(&self, event: &str, wanted: impl Fn(&serde_json::Value) -> bool) -> Option<serde_json::Value> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.events.recv_timeout(left) {
                Ok(v) if v["event"] == event && wanted(&v) => return Some(v),
                Ok(_) => continue,
                Err(RecvTimeoutError::Disconnected) => return None,
                Err(RecvTimeoutError::Timeout) => panic!("no `{event}` event within 60 s"),
            }
        }
    }

    pub fn signal(&self, name: &str) {
        let pid = self.child.id().to_string();
        assert!(Command::new("kill").args([&format!("-{name}"), &pid]).status().unwrap().success());
    }

    /// Wait for the process (up to 60 s, then kill it and fail): (exit status, stderr).
    pub fn finish(mut self) -> (std::process::ExitStatus, String) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.child.try_wait().unwrap().is_none() {
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("the training process did not end within 60 s");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let output = self.child.wait_with_output().unwrap();
        (output.status, String::from_utf8_lossy(&output.stderr).into_owned())
    }
}

/// The numbered checkpoint folders of a run (whatever they hold), by step; none while the folder is missing.
pub fn checkpoint_dirs(run_dir: &Path) -> Vec<(usize, PathBuf)> {
    let Ok(entries) = std::fs::read_dir(run_dir) else { return Vec::new() };
    let mut out: Vec<(usize, PathBuf)> = entries
        .flatten()
        .filter_map(|e| Some((e.file_name().to_str()?.strip_prefix("checkpoint-")?.parse().ok()?, e.path())))
        .collect();
    out.sort();
    out
}

/// Every tensor of a checkpoint (adapter and optimizer), after checking that it loads onto tiny-llama as an
/// adapter and as a resume point.
pub fn load_checkpoint(dir: &Path) -> HashMap<String, Tensor> {
    let mut m = load_model(&fixture("tiny-llama"), &Device::Cpu, DType::F32).unwrap();
    checkpoint::load_adapter(&mut m.model, dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let (_, mut tensors) = checkpoint::load_trainer_state(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let weights = candle_core::safetensors::load(dir.join(checkpoint::ADAPTER_WEIGHTS), &Device::Cpu).unwrap();
    tensors.extend(weights);
    tensors
}

/// Whether two checkpoints hold bit-identical tensors.
pub fn same_tensors(a: &HashMap<String, Tensor>, b: &HashMap<String, Tensor>) -> bool {
    let bits = |t: &Tensor| -> Vec<u32> {
        t.flatten_all().unwrap().to_vec1::<f32>().unwrap().iter().map(|x| x.to_bits()).collect()
    };
    a.len() == b.len() && a.iter().all(|(k, t)| b.get(k).is_some_and(|u| bits(t) == bits(u)))
}

/// The step events of a `metal-candle train` run on the CPU: `arch` (a tiny fixture) on `data` (relative to the
/// crate), with the given kernel set and dtype, rank-4 all-linear LoRA, and `extra` flags; the run must succeed and
/// log `iters` steps.
pub fn step_events(
    kernels: &str,
    arch: &str,
    dtype: &str,
    data: &str,
    iters: usize,
    extra: &[&str],
) -> Vec<serde_json::Value> {
    let dir = tempfile::tempdir().unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let iters_arg = iters.to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_metal-candle"))
        .current_dir(root)
        .args(["train", "--model", fixture(arch).to_str().unwrap(), "--data", data])
        .args(["--out", dir.path().to_str().unwrap(), "--name", "run", "--iters", &iters_arg, "--batch-size", "2"])
        .args(if extra.contains(&"--seq-len") { &[][..] } else { &["--seq-len", "64"][..] })
        .args(["--lr", "5e-3", "--warmup", "2", "--targets", "all-linear", "--rank", "4"])
        .args(["--alpha", "8", "--save-every", "0", "--val-every", "10", "--device", "cpu"])
        .args(["--dtype", dtype, "--kernels", kernels, "--json"])
        .args(extra)
        .output()
        .unwrap();
    let what = format!("{kernels} {arch} {dtype} {extra:?}");
    assert!(out.status.success(), "{what}: {}", String::from_utf8_lossy(&out.stderr));
    let steps: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| e["event"] == "step")
        .collect();
    assert_eq!(steps.len(), iters, "{what}");
    steps
}

/// The step losses of [`step_events`]' run.
pub fn step_losses(kernels: &str, arch: &str, dtype: &str, data: &str, iters: usize, extra: &[&str]) -> Vec<f64> {
    step_events(kernels, arch, dtype, data, iters, extra).iter().map(|e| e["loss"].as_f64().unwrap()).collect()
}

/// Step losses of a 20-step run of a tiny family fixture (dropout on) with the given kernel set and dtype: the chat
/// samples, except for smollm3 and granite, whose chat templates' system prompts alone outgrow 64 tokens: plain
/// text. How the portable graph and `--kernels wgsl` are compared with the paths they stand beside.
pub fn family_run_losses(kernels: &str, arch: &str, dtype: &str) -> Vec<f64> {
    let data = match arch {
        "tiny-smollm3" | "tiny-granite" => "tests/fixtures/datasets/text.parquet",
        _ => "assets/sample-chat",
    };
    step_losses(kernels, arch, dtype, data, 20, &["--dropout", "0.1"])
}

/// The process ids of `parent`'s children whose command line contains `needle`, oldest (lowest id) first, read from
/// /proc (Linux).
pub fn children_of(parent: u32, needle: &str) -> Vec<u32> {
    let mut found: Vec<u32> = std::fs::read_dir("/proc")
        .map(|entries| entries.flatten().filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok()).collect())
        .unwrap_or_default();
    found.retain(|p| {
        let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
        // pid (comm) state ppid ...: the comm may hold spaces, so read after its closing parenthesis.
        let ppid = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok());
        let cmdline = std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
        ppid == Some(parent) && String::from_utf8_lossy(&cmdline).contains(needle)
    });
    found.sort();
    found
}
