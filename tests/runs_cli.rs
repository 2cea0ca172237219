//! `metal-candle runs` on two real tiny-llama runs made with `metal-candle train`: list (text and JSON), show
//! (differing rows marked), rename, note (stored in run.json), and delete (asks, or `--yes`; refused for a run
//! that is training, a folder without run.json, and a folder outside the runs folder).

mod common;

use common::cli::two_runs;
use metal_candle::engine::train::run_folder::RunManifest;
use metal_candle::engine::train::run_lock::RunLock;
use std::path::Path;
use std::process::{Command, Output, Stdio};

fn runs_cmd(runs: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_metal-candle"))
        .arg("runs")
        .args(args)
        .arg("--dir")
        .arg(runs)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn refused(out: &Output) -> String {
    assert!(!out.status.success(), "should have been refused: {}", String::from_utf8_lossy(&out.stdout));
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn runs_are_listed_compared_named_annotated_and_deleted() {
    let tmp = tempfile::tempdir().unwrap();
    let runs = tmp.path().join("runs");
    two_runs(&runs);

    let list = ok(&runs_cmd(&runs, &["list"]));
    assert!(list.lines().any(|l| l.starts_with("r-a") && l.contains("3 / 3") && l.contains("finished")), "{list}");
    let json: serde_json::Value = serde_json::from_str(&ok(&runs_cmd(&runs, &["list", "--json"]))).unwrap();
    let rows = json.as_array().unwrap();
    assert_eq!(rows.len(), 2);
    assert!(rows.iter().all(|r| r["best_val_loss"]["step"] == 3 && r["final_train_loss"].as_f64().is_some()), "{json}");

    let show = ok(&runs_cmd(&runs, &["show", "r-a", "r-b"]));
    let line = |text: &str, setting: &str| -> String {
        text.lines().find(|l| l[2..].starts_with(setting)).unwrap_or_else(|| panic!("no {setting} in\n{text}")).into()
    };
    let lr = line(&show, "learning rate");
    assert!(lr.starts_with('*') && lr.contains("1e-3") && lr.contains("5e-4"), "{lr}");
    assert!(line(&show, "rank").starts_with(' '), "same rank, not marked:\n{show}");
    let only = ok(&runs_cmd(&runs, &["show", "r-a", "r-b", "--only-differences"]));
    assert!(only.contains("learning rate") && !only.contains("  rank "), "{only}");

    ok(&runs_cmd(&runs, &["rename", "r-a", "baseline"]));
    ok(&runs_cmd(&runs, &["note", "baseline", "lr 1e-3 converges faster"]));
    let manifest = RunManifest::read(&runs.join("r-a")).unwrap();
    assert_eq!(
        (manifest.label.as_deref(), manifest.notes.as_deref()),
        (Some("baseline"), Some("lr 1e-3 converges faster"))
    );
    let list = ok(&runs_cmd(&runs, &["list"]));
    assert!(list.lines().any(|l| l.contains("baseline") && l.ends_with("lr 1e-3 converges faster")), "{list}");
    let show = ok(&runs_cmd(&runs, &["show", "baseline", "r-b"]));
    assert!(line(&show, "notes").contains("lr 1e-3 converges faster"), "{show}");
    assert!(refused(&runs_cmd(&runs, &["note", "r-a", "bell \u{7}"])).contains("control"));
    assert!(refused(&runs_cmd(&runs, &["rename", "nope", "x"])).contains("no run \"nope\""));

    // Without a terminal to confirm on, nothing is deleted unless --yes says so.
    let asked = refused(&runs_cmd(&runs, &["delete", "r-b"]));
    assert!(asked.contains("--yes") && asked.contains("checkpoint"), "{asked}");
    assert!(runs.join("r-b").exists());
    let gone = ok(&runs_cmd(&runs, &["delete", "r-b", "--yes"]));
    assert!(gone.contains("deleted") && !runs.join("r-b").exists(), "{gone}");
    assert_eq!(ok(&runs_cmd(&runs, &["list"])).lines().count(), 2, "header and one run");
}

#[test]
fn delete_refuses_training_runs_and_folders_that_are_not_runs_here() {
    let tmp = tempfile::tempdir().unwrap();
    let runs = tmp.path().join("runs");
    two_runs(&runs);
    // This process holds r-a's claim, as a training would.
    let claim = RunLock::claim(&runs.join("r-a")).unwrap();
    let err = refused(&runs_cmd(&runs, &["delete", "r-a", "--yes"]));
    assert!(err.contains("training now"), "{err}");
    assert!(runs.join("r-a/run.json").exists());
    drop(claim);

    let junk = runs.join("junk");
    std::fs::create_dir_all(&junk).unwrap();
    let err = refused(&runs_cmd(&runs, &["delete", junk.to_str().unwrap(), "--yes"]));
    assert!(err.contains("has no run.json"), "{err}");
    // A run folder elsewhere is not this runs folder's to delete.
    let other = tmp.path().join("other");
    std::fs::create_dir_all(&other).unwrap();
    std::fs::rename(runs.join("r-b"), other.join("r-b")).unwrap();
    let err = refused(&runs_cmd(&runs, &["delete", other.join("r-b").to_str().unwrap(), "--yes"]));
    assert!(err.contains("not inside the runs folder"), "{err}");
    assert!(junk.exists() && other.join("r-b").exists());
    ok(&runs_cmd(&runs, &["delete", "r-a", "--yes"]));
}
