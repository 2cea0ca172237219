//! The adapter X-ray (`engine::xray`, `metal-candle inspect`) against numpy's SVD of the dense scaled B·A
//! (`scripts/make_xray_fixtures.py` -> tests/fixtures/xray_expected.json): one of our checkpoints, a PEFT rsLoRA
//! adapter, a PEFT DoRA adapter, and a synthetic adapter whose updates have rank 3 inside r = 16. Singular values,
//! norms and relative norms agree to 1e-4 relative (singular values far below the largest, which f32 rounding puts
//! there, to 1e-10 of the largest), energy ranks exactly. Also: the base found from adapter_config.json, an
//! adapter without its base (relative norms null, a note), and the CLI's `inspect --json` and its errors.

mod common;

use common::fixture;
use metal_candle::engine::xray::{find_base, inspect, BaseChoice, XrayReport};
use serde_json::Value;
use std::process::Command;

fn expected() -> Value {
    let path = fixture("xray_expected.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn close(got: f64, want: f64, scale: f64, what: &str) {
    let tol = 1e-4 * want.abs() + 1e-10 * scale;
    assert!((got - want).abs() <= tol, "{what}: got {got}, numpy {want}");
}

/// Every module of `report` against the numpy reference `want` (one adapter's entry).
fn compare(report: &XrayReport, want: &Value, with_base: bool) {
    let modules = want["modules"].as_object().unwrap();
    assert_eq!(report.modules.len(), modules.len(), "{}", report.checkpoint.display());
    assert_eq!(report.rank as u64, want["rank"].as_u64().unwrap());
    close(report.scale, want["scale"].as_f64().unwrap(), 1.0, "scale");
    for m in &report.modules {
        let w = &modules[&m.name];
        let sv = common::floats(&w["singular_values"]);
        assert_eq!(m.singular_values.len(), sv.len(), "{}", m.name);
        for (k, (got, want)) in m.singular_values.iter().zip(&sv).enumerate() {
            close(*got, *want, sv[0], &format!("{} singular value {k}", m.name));
        }
        close(m.update_norm, w["update_norm"].as_f64().unwrap(), 0.0, &format!("{} update norm", m.name));
        close(m.update_norm, w["dense_frobenius"].as_f64().unwrap(), 0.0, &format!("{} dense norm", m.name));
        for key in ["energy_rank_50", "energy_rank_90", "energy_rank_99"] {
            let got = serde_json::to_value(m).unwrap()[key].as_u64().unwrap();
            assert_eq!(got, w[key].as_u64().unwrap(), "{} {key}", m.name);
        }
        if with_base {
            let relative = m.relative_norm.expect("a relative norm with the base");
            close(relative, w["relative_norm"].as_f64().unwrap(), 0.0, &format!("{} relative norm", m.name));
            if let Some(change) = w.get("magnitude_change") {
                close(m.magnitude_change.unwrap(), change.as_f64().unwrap(), 0.0, &format!("{} magnitude", m.name));
            }
        } else {
            assert_eq!(m.relative_norm, None, "{}: no base, no relative norm", m.name);
        }
    }
}

#[test]
fn singular_values_norms_and_ranks_match_numpy() {
    let expected = expected();
    for (adapter, want) in expected.as_object().unwrap() {
        let dir = fixture(adapter);
        // The base comes from adapter_config.json (relative to the working folder or to the adapter).
        let base = find_base(&dir, None);
        let BaseChoice::Found(path) = &base else { panic!("{adapter}: no base found: {base:?}") };
        let want_base = fixture(want["base"].as_str().unwrap());
        assert_eq!(std::fs::canonicalize(path).unwrap(), std::fs::canonicalize(&want_base).unwrap(), "{adapter}");
        let report = inspect(&dir, &base).unwrap();
        compare(&report, want, true);
        assert!(report.summary.recommended_rank.is_some(), "{adapter}");
    }
}

#[test]
fn a_rank_three_update_inside_rank_sixteen_reports_energy_rank_three() {
    let dir = fixture("xray-rank3-adapter");
    let report = inspect(&dir, &find_base(&dir, None)).unwrap();
    assert_eq!(report.rank, 16);
    for m in &report.modules {
        assert_eq!((m.energy_rank_90, m.energy_rank_99), (3, 3), "{}", m.name);
        assert!(m.singular_values[3] < 1e-6 * m.singular_values[0], "{}: {:?}", m.name, m.singular_values);
    }
    assert_eq!(report.summary.recommended_rank, Some(4));
    assert!(report.summary.reason.contains("3 of 16 directions"), "{}", report.summary.reason);
}

#[test]
fn without_the_base_relative_norms_are_null_and_a_note_says_why() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("adapter");
    std::fs::create_dir(&dir).unwrap();
    let src = fixture("tiny-qwen2-peft-rslora");
    for f in ["adapter_config.json", "adapter_model.safetensors"] {
        std::fs::copy(src.join(f), dir.join(f)).unwrap();
    }
    let base = find_base(&dir, None);
    assert!(matches!(&base, BaseChoice::Missing(why) if why.contains("../tiny-qwen2")), "{base:?}");
    let report = inspect(&dir, &base).unwrap();
    assert!(report.base_model.is_none());
    assert!(report.notes.iter().any(|n| n.contains("--base")), "{:?}", report.notes);
    compare(&report, &expected()["tiny-qwen2-peft-rslora"], false);
}

fn inspect_cli(args: &[&str], checkpoint: &std::path::Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_metal-candle"))
        .arg("inspect")
        .arg("--checkpoint")
        .arg(checkpoint)
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn inspect_json_has_the_issues_fields() {
    let out = inspect_cli(&["--json"], &fixture("xray-rank3-adapter"));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let modules = v["modules"].as_array().unwrap();
    assert_eq!(modules.len(), 4);
    for m in modules {
        assert!(m["name"].as_str().unwrap().starts_with("model.layers."), "{m}");
        assert_eq!(m["singular_values"].as_array().unwrap().len(), 16);
        assert!(m["update_norm"].as_f64().unwrap() > 0.0);
        assert!(m["relative_norm"].as_f64().unwrap() > 0.0);
        assert_eq!(
            (m["energy_rank_50"].as_u64(), m["energy_rank_90"].as_u64(), m["energy_rank_99"].as_u64()),
            (Some(2), Some(3), Some(3))
        );
    }
    assert_eq!(v["summary"]["recommended_rank"], 4);
    assert!(v["summary"]["reason"].as_str().unwrap().contains("rank 4"));

    // The table, and --base naming the base explicitly.
    let out = inspect_cli(&["--base", fixture("tiny-llama").to_str().unwrap()], &fixture("xray-rank3-adapter"));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("recommended rank: 4") && text.contains("down_proj"), "{text}");
}

#[test]
fn inspect_names_a_missing_or_corrupt_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("checkpoint-9");
    let out = inspect_cli(&[], &missing);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("checkpoint-9"), "{err}");

    let corrupt = tmp.path().join("corrupt");
    std::fs::create_dir(&corrupt).unwrap();
    std::fs::copy(fixture("xray-rank3-adapter/adapter_config.json"), corrupt.join("adapter_config.json")).unwrap();
    std::fs::write(corrupt.join("adapter_model.safetensors"), b"\x10\x00\x00\x00\x00\x00\x00\x00{not json").unwrap();
    let out = inspect_cli(&["--json"], &corrupt);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("adapter_model.safetensors"), "{err}");

    std::fs::remove_file(corrupt.join("adapter_config.json")).unwrap();
    let out = inspect_cli(&[], &corrupt);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("adapter_config.json"), "{err}");
}
