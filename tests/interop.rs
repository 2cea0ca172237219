//! Adapters trained by our own trainer interoperate with the reference. The fixtures
//! `tests/fixtures/ours-*-adapter/` are byte copies of `metal-candle train` checkpoints (adapter files only);
//! their `expected.json` holds what Hugging Face PEFT/transformers compute with them
//! (`scripts/check_interop.py`): the adapter as PEFT loads it, our merged export as transformers loads it,
//! and the mlx-lm export's layout. Here the same adapters and exports go through our engine.

mod common;

use candle_core::{DType, Device, Tensor};
use common::*;
use metal_candle::engine::checkpoint::{self, ADAPTER_CONFIG, ADAPTER_WEIGHTS};
use metal_candle::engine::export::ExportFormat;
use metal_candle::engine::generate::score;
use metal_candle::engine::model::load_model;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;

/// (adapter fixture, base model fixture)
const CASES: [(&str, &str); 4] = [
    ("ours-tiny-llama-adapter", "tiny-llama"),
    ("ours-tiny-qwen3-adapter", "tiny-qwen3"),
    ("ours-tiny-gemma3-adapter", "tiny-gemma3"),
    ("ours-tiny-olmo2-adapter", "tiny-olmo2"),
];

fn read_json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))).unwrap()
}

fn load_tensors(path: &Path) -> HashMap<String, Tensor> {
    candle_core::safetensors::load(path, &Device::Cpu).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn max_tensor_diff(a: &Tensor, b: &Tensor) -> f32 {
    assert_eq!(a.dims(), b.dims());
    (a - b).unwrap().abs().unwrap().flatten_all().unwrap().max(0).unwrap().to_scalar().unwrap()
}

#[test]
fn fixture_folders_hold_only_the_adapter() {
    for (adapter, _) in CASES {
        let mut names: Vec<String> = std::fs::read_dir(fixture(adapter))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
            .collect();
        names.sort();
        assert_eq!(
            names,
            vec![ADAPTER_CONFIG, ADAPTER_WEIGHTS, "expected.json"],
            "{adapter}: no optimizer/trainer state"
        );
    }
}

#[test]
fn our_adapters_reproduce_peft_logprobs() {
    for (adapter, base) in CASES {
        let exp = expected(adapter);
        let mut m = load_model(&fixture(base), &Device::Cpu, DType::F32).unwrap();
        let ids = common::ids(&exp["peft_score"]["ids"]);
        assert_eq!(ids, common::ids(&expected(base)["score"]["ids"]), "{adapter}: same text as the base fixture");
        let summary = checkpoint::load_adapter(&mut m.model, &fixture(adapter)).unwrap();
        assert_eq!(summary.rank as u64, exp["lora"]["r"].as_u64().unwrap());
        assert_eq!(summary.use_rslora, exp["lora"]["use_rslora"].as_bool().unwrap());
        let n_tensors = load_tensors(&fixture(adapter).join(ADAPTER_WEIGHTS)).len();
        assert_eq!(summary.adapted_linears * 2, n_tensors, "{adapter}: every tensor pair attached");

        let lp = score(&m.model, &ids).unwrap();
        // Not vacuous: the adapter moves the log-probs well away from the base model's.
        let moved = max_abs_diff(&lp, &floats(&expected(base)["score"]["token_logprobs"]));
        assert!(moved > 1e-3, "{adapter}: the adapter does not change the output (max diff vs base {moved})");
        let diff = max_abs_diff(&lp, &floats(&exp["peft_score"]["token_logprobs"]));
        eprintln!("{adapter}: ours vs PEFT max |logprob diff| = {diff:.3e}");
        assert!(diff < 1e-4, "{adapter}: ours vs PEFT max |logprob diff| = {diff}");
        let nll = -lp.iter().map(|&x| x as f64).sum::<f64>() / lp.len() as f64;
        let want = exp["peft_score"]["nll_mean"].as_f64().unwrap();
        assert!((nll - want).abs() < 1e-4, "{adapter}: nll_mean {nll} vs PEFT {want}");
    }
}

#[test]
fn merged_export_reproduces_transformers_logprobs() {
    for (adapter, base) in CASES {
        let exp = expected(adapter);
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("merged");
        metal_candle::engine::export::export(&fixture(adapter), ExportFormat::Merged, &out, &fixture(base)).unwrap();
        for f in ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"] {
            assert!(out.join(f).exists(), "{adapter}: merged export lacks {f}");
        }
        assert!(!out.join(ADAPTER_CONFIG).exists(), "{adapter}: a merged folder is a plain model, not an adapter");
        // The same tensor names as the base model: transformers reported no missing/unexpected keys for it.
        let names = |p: &Path| load_tensors(p).into_keys().collect::<BTreeSet<_>>();
        assert_eq!(names(&out.join("model.safetensors")), names(&fixture(base).join("model.safetensors")), "{adapter}");

        let m = load_model(&out, &Device::Cpu, DType::F32).unwrap();
        let ids = common::ids(&exp["merged_score"]["ids"]);
        let lp = score(&m.model, &ids).unwrap();
        let diff = max_abs_diff(&lp, &floats(&exp["merged_score"]["token_logprobs"]));
        let diff_peft = max_abs_diff(&lp, &floats(&exp["peft_score"]["token_logprobs"]));
        eprintln!(
            "{adapter}: merged vs transformers max |logprob diff| = {diff:.3e} (vs PEFT unmerged {diff_peft:.3e})"
        );
        assert!(diff < 1e-4, "{adapter}: merged export vs transformers max |logprob diff| = {diff}");
        assert!(diff_peft < 1e-4, "{adapter}: merged export vs PEFT max |logprob diff| = {diff_peft}");
    }
}

#[test]
fn mlx_lm_export_has_mlx_layout_and_values() {
    for (adapter, base) in CASES {
        let exp = expected(adapter);
        assert_eq!(exp["mlx_check"], true, "{adapter}: scripts/check_interop.py checked the mlx-lm export");
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("mlx");
        metal_candle::engine::export::export(&fixture(adapter), ExportFormat::MlxLm, &out, &fixture(base)).unwrap();

        // Config: mlx-lm's fields with the values the reference check recorded.
        let cfg = read_json(&out.join("adapter_config.json"));
        let want = &exp["mlx_config"];
        assert_eq!(cfg["fine_tune_type"], "lora", "{adapter}");
        assert_eq!(cfg["num_layers"], want["num_layers"], "{adapter}: num_layers");
        let lp = &cfg["lora_parameters"];
        for field in ["rank", "scale", "dropout", "keys"] {
            assert!(lp.get(field).is_some(), "{adapter}: lora_parameters.{field} missing");
        }
        assert_eq!(lp["rank"], want["lora_parameters"]["rank"], "{adapter}: rank");
        assert_eq!(lp["dropout"].as_f64(), want["lora_parameters"]["dropout"].as_f64(), "{adapter}: dropout");
        let mut keys: Vec<String> =
            lp["keys"].as_array().unwrap().iter().map(|k| k.as_str().unwrap().to_string()).collect();
        keys.sort();
        let want_keys: Vec<String> = want["lora_parameters"]["keys"]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| k.as_str().unwrap().to_string())
            .collect();
        assert_eq!(keys, want_keys, "{adapter}: keys");
        // scale = alpha / r, or alpha / sqrt(r) for rsLoRA.
        let (r, alpha) = (exp["lora"]["r"].as_f64().unwrap(), exp["lora"]["lora_alpha"].as_f64().unwrap());
        let scale = if exp["lora"]["use_rslora"].as_bool().unwrap() { alpha / r.sqrt() } else { alpha / r };
        assert!((lp["scale"].as_f64().unwrap() - scale).abs() < 1e-9, "{adapter}: scale {} vs {scale}", lp["scale"]);

        // Tensors: names and shapes as recorded; lora_a = PEFT lora_A^T (in, r), lora_b = PEFT lora_B^T (r, out).
        let mlx = load_tensors(&out.join("adapters.safetensors"));
        let shapes: BTreeMap<String, Vec<usize>> = mlx.iter().map(|(k, t)| (k.clone(), t.dims().to_vec())).collect();
        let want_shapes: BTreeMap<String, Vec<usize>> = exp["mlx_tensor_shapes"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.clone(), common::ids(v).into_iter().map(|x| x as usize).collect()))
            .collect();
        assert_eq!(shapes, want_shapes, "{adapter}: mlx tensor names/shapes");
        let peft = load_tensors(&fixture(adapter).join(ADAPTER_WEIGHTS));
        assert_eq!(mlx.len(), peft.len());
        for (name, t) in &mlx {
            assert!(name.starts_with("model.layers."), "{name}");
            let (stem, which) = name.rsplit_once('.').unwrap();
            let peft_name =
                format!("base_model.model.{stem}.{}.weight", if which == "lora_a" { "lora_A" } else { "lora_B" });
            let reference = peft.get(&peft_name).unwrap_or_else(|| panic!("{adapter}: no {peft_name} for {name}"));
            let d = max_tensor_diff(t, &reference.t().unwrap());
            assert_eq!(d, 0.0, "{adapter}: {name} differs from {peft_name}^T by {d}");
        }
    }
}

#[test]
fn peft_export_is_a_byte_copy() {
    for (adapter, base) in CASES {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("peft");
        metal_candle::engine::export::export(&fixture(adapter), ExportFormat::Peft, &out, &fixture(base)).unwrap();
        for f in [ADAPTER_CONFIG, ADAPTER_WEIGHTS] {
            let a = std::fs::read(fixture(adapter).join(f)).unwrap();
            let b = std::fs::read(out.join(f)).unwrap();
            assert!(a == b, "{adapter}: exported {f} is not byte-identical");
        }
        let mut names: Vec<_> = std::fs::read_dir(&out).unwrap().map(|e| e.unwrap().file_name()).collect();
        names.sort();
        assert_eq!(names, vec![ADAPTER_CONFIG, ADAPTER_WEIGHTS], "{adapter}: nothing else in a PEFT export");
    }
}
