//! The op-coverage check for the Mac: every Candle op the portable graph (`--kernels portable`, what Metal runs)
//! executes must be one Candle 0.11's Metal backend implements for its dtypes and input layouts.
//!
//! `tools/op-recorder` (built by scripts/test_setup.sh) runs our own CLI in-process against a copy of candle-core
//! whose `Storage` methods record each op as the backend receives it: SFT, checkpointing, DoRA, a q4k base, DPO,
//! ORPO, GRPO, the merged export, greedy generation with the KV cache and multiple-choice scoring for all nine
//! families, and training on the real SmolLM2 Q4_1 kept in its blocks (`--quantize keep`), in f32, bf16 and f16 (macOS before 14 has no bf16 kernels: f16 is what those Macs train in). `tools/op-recorder/check.py`
//! looks each record up in `metal-ops-candle-<version>.json`, the table `metal_table.py` reads from Candle's
//! source (candle-core's Metal backend, candle-metal-kernels' binary.metal, candle-nn's custom ops).

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn recorder() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| root().join("target"));
    let bin = target.join("release/op-recorder");
    assert!(bin.exists(), "{} is missing: run scripts/test_setup.sh (it builds tools/op-recorder)", bin.display());
    bin
}

fn record(args: &[&str], out: &Path) {
    let status = Command::new(recorder()).args(args).arg("--out").arg(out).output().unwrap();
    assert!(status.status.success(), "op-recorder failed: {}", String::from_utf8_lossy(&status.stderr));
}

fn check(records: &Path) -> (bool, String) {
    let out = Command::new("python3").arg(root().join("tools/op-recorder/check.py")).arg(records).output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned())
}

#[test]
fn every_op_of_every_family_and_method_exists_on_metal_in_three_dtypes() {
    let dir = tempfile::tempdir().unwrap();
    let records = dir.path().join("records.jsonl");
    record(&["--dtype", "f32,bf16,f16"], &records);
    let (ok, report) = check(&records);
    eprintln!("{report}");
    assert!(ok, "ops the portable graph runs that Candle's Metal backend lacks, or cases that failed:\n{report}");
    // (9 families x 12 cases + the kept Q4_1 base) x 3 dtypes, each of which ran.
    assert!(report.starts_with("327 cases"), "{report}");
    let per_step = report.lines().filter(|l| l.starts_with("ops per SFT step")).count();
    assert_eq!(per_step, 27, "{report}");
}

#[test]
fn the_check_fails_on_an_op_metal_lacks() {
    let dir = tempfile::tempdir().unwrap();
    let records = dir.path().join("records.jsonl");
    record(&["--dtype", "bf16", "--families", "llama", "--only", "generate", "--deliberate-unsupported"], &records);
    let (ok, report) = check(&records);
    assert!(!ok, "a bf16 -> f64 cast passed the check:\n{report}");
    assert!(report.contains("UNSUPPORTED on Metal: to_dtype ['bf16', 'f64']"), "{report}");
    assert!(report.contains("deliberate-unsupported"), "{report}");
}

#[test]
fn the_metal_table_is_the_one_candles_source_gives() {
    let dir = tempfile::tempdir().unwrap();
    let fresh = dir.path().join("table.json");
    let out = Command::new("python3")
        .arg(root().join("tools/op-recorder/metal_table.py"))
        .arg("--out")
        .arg(&fresh)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let lock = std::fs::read_to_string(root().join("Cargo.lock")).unwrap();
    let version = lock.split("name = \"candle-core\"\nversion = \"").nth(1).unwrap().split('"').next().unwrap();
    let checked_in = root().join(format!("tools/op-recorder/metal-ops-candle-{version}.json"));
    assert!(checked_in.exists(), "no table for candle-core {version}: run tools/op-recorder/metal_table.py");
    assert_eq!(
        std::fs::read_to_string(&fresh).unwrap(),
        std::fs::read_to_string(&checked_in).unwrap(),
        "the checked-in table differs from what Candle's source gives: regenerate it with metal_table.py"
    );
}
