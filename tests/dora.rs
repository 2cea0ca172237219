//! DoRA adapters (PEFT's `use_dora`) both ways: PEFT's DoRA adapter (`tests/fixtures/tiny-llama-dora-peft`,
//! `scripts/make_dora_fixtures.py`) loads and gives PEFT's log-probs and first-step gradients; `train --dora` saves
//! an adapter that reloads identically, resumes bit for bit and refuses to switch DoRA on when resumed; merged
//! exports equal the adapter-on model; the llama.cpp LoRA GGUF refuses DoRA. Our trained adapter is also left in
//! `CARGO_TARGET_TMPDIR/dora-interop` for `scripts/make_dora_fixtures.py --check` (PEFT loading it; not in CI).

mod common;

use candle_core::{DType, Device, Tensor};
use common::cli::*;
use common::*;
use metal_candle::engine::checkpoint::{self, ADAPTER_CONFIG, ADAPTER_WEIGHTS};
use metal_candle::engine::data::{collate, Example};
use metal_candle::engine::export::ExportFormat;
use metal_candle::engine::generate::score;
use metal_candle::engine::model::load_model;
use metal_candle::engine::train::backprop;
use std::collections::HashMap;
use std::path::Path;
use std::process::Stdio;

const PEFT_DORA: &str = "tiny-llama-dora-peft";

fn tensors(path: &Path) -> HashMap<String, Tensor> {
    candle_core::safetensors::load(path, &Device::Cpu).unwrap()
}

/// max |a - b| / max |b|.
fn relative(a: &Tensor, b: &Tensor) -> f64 {
    let max = |t: &Tensor| t.abs().unwrap().flatten_all().unwrap().max(0).unwrap().to_scalar::<f32>().unwrap() as f64;
    max(&(a - b).unwrap()) / max(b).max(1e-12)
}

fn base_logprobs(ids: &[u32]) -> Vec<f32> {
    score(&load_model(&fixture("tiny-llama"), &Device::Cpu, DType::F32).unwrap().model, ids).unwrap()
}

#[test]
fn peft_dora_adapter_gives_peft_logprobs_and_gradients() {
    let exp = expected(PEFT_DORA);
    let mut m = load_model(&fixture("tiny-llama"), &Device::Cpu, DType::F32).unwrap();
    let (summary, params) = checkpoint::load_adapter_params(&mut m.model, &fixture(PEFT_DORA)).unwrap();
    assert!(summary.use_dora && summary.adapted_linears == 8, "{summary:?}");
    assert!(params.iter().all(|p| p.magnitude.is_some()));
    let ids = common::ids(&exp["score"]["ids"]);
    let lp = score(&m.model, &ids).unwrap();
    let moved = max_abs_diff(&lp, &floats(&exp["base_score"]["token_logprobs"]));
    assert!(moved > 1e-3, "the adapter does not change the output ({moved})");
    let diff = max_abs_diff(&lp, &floats(&exp["score"]["token_logprobs"]));
    eprintln!("PEFT's DoRA adapter: ours vs PEFT max |logprob diff| = {diff:.3e}");
    assert!(diff < 1e-5, "ours vs PEFT max |logprob diff| = {diff}");

    // First-step gradients of the mean NLL over tokens 1.. (dropout 0), against torch autograd through PEFT.
    let example =
        Example { input_ids: ids.clone(), target_mask: (0..ids.len()).map(|i| i > 0).collect(), truncated: false };
    let batch = collate(&[example], &[0], 0).unwrap();
    let n = batch.target_tokens as f64;
    let out = backprop::loss_and_gradients(&m.model, &batch, 1.0 / n, false).unwrap();
    let loss = out.nll_sum.value().unwrap() / n;
    assert!((loss - exp["grad_loss"].as_f64().unwrap()).abs() < 1e-5, "loss {loss} vs PEFT {}", exp["grad_loss"]);
    let want = tensors(&fixture(PEFT_DORA).join("expected_grads.safetensors"));
    let mut worst = 0f64;
    for p in &params {
        let prefix = checkpoint::peft_prefix(p.layer, p.module);
        let magnitude = p.magnitude.as_ref().unwrap();
        for (name, var, transpose) in [
            (format!("{prefix}.lora_A.weight"), &p.a, true),
            (format!("{prefix}.lora_B.weight"), &p.b, true),
            (checkpoint::peft_magnitude_name(&prefix), magnitude, false),
        ] {
            let ours = out.grads.get(var.as_tensor()).unwrap_or_else(|| panic!("no gradient for {name}"));
            let ours = if transpose { ours.t().unwrap() } else { ours.clone() };
            let rel = relative(&ours, &want[&name]);
            assert!(rel < 1e-4, "{name}: gradient differs from PEFT's by {rel:.2e} (relative)");
            worst = worst.max(rel);
        }
    }
    eprintln!("PEFT's DoRA adapter: worst relative gradient difference {worst:.2e} over {} tensors", want.len());
    assert_eq!(want.len(), params.len() * 3);
}

#[test]
fn merged_export_of_a_dora_adapter_equals_the_adapter_on_model() {
    let exp = expected(PEFT_DORA);
    let ids = common::ids(&exp["score"]["ids"]);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("merged");
    metal_candle::engine::export::export(&fixture(PEFT_DORA), ExportFormat::Merged, &out, &fixture("tiny-llama"))
        .unwrap();
    let merged = score(&load_model(&out, &Device::Cpu, DType::F32).unwrap().model, &ids).unwrap();
    let diff = max_abs_diff(&merged, &floats(&exp["merged_score"]["token_logprobs"]));
    let diff_peft = max_abs_diff(&merged, &floats(&exp["score"]["token_logprobs"]));
    eprintln!("merged DoRA export: vs PEFT merge_and_unload {diff:.3e}, vs PEFT unmerged {diff_peft:.3e}");
    assert!(diff < 1e-5 && diff_peft < 1e-5, "{diff} / {diff_peft}");
    // The in-memory merge (what the GGUF export of a loaded model folds) agrees as well.
    let mut m = load_model(&fixture("tiny-llama"), &Device::Cpu, DType::F32).unwrap();
    checkpoint::load_adapter(&mut m.model, &fixture(PEFT_DORA)).unwrap();
    let on_disk = tensors(&out.join("model.safetensors"));
    for (name, w) in m.model.merged_named_weights().unwrap() {
        assert!(relative(&w, &on_disk[&name]) < 1e-6, "{name}");
    }

    // llama.cpp's LoRA GGUF has no magnitude: refused, naming the merged exports.
    let err = metal_candle::engine::export::export(
        &fixture(PEFT_DORA),
        ExportFormat::GgufLora,
        &dir.path().join("a.gguf"),
        &fixture("tiny-llama"),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("DoRA") && err.contains("merged"), "{err}");
    assert!(!dir.path().join("a.gguf").exists());
}

#[test]
fn a_lora_config_with_magnitudes_or_dora_without_them_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let copy = |to: &Path, config: String, weights: &HashMap<String, Tensor>| {
        std::fs::create_dir_all(to).unwrap();
        std::fs::write(to.join(ADAPTER_CONFIG), config).unwrap();
        candle_core::safetensors::save(weights, to.join(ADAPTER_WEIGHTS)).unwrap();
    };
    let config = std::fs::read_to_string(fixture(PEFT_DORA).join(ADAPTER_CONFIG)).unwrap();
    let weights = tensors(&fixture(PEFT_DORA).join(ADAPTER_WEIGHTS));
    let mut m = load_model(&fixture("tiny-llama"), &Device::Cpu, DType::F32).unwrap();

    let not_dora = dir.path().join("not-dora");
    copy(&not_dora, config.replace("\"use_dora\": true", "\"use_dora\": false"), &weights);
    let err = checkpoint::load_adapter(&mut m.model, &not_dora).unwrap_err().to_string();
    assert!(err.contains("lora_magnitude_vector") && err.contains("use_dora: true"), "{err}");

    let missing = dir.path().join("missing");
    let mut fewer = weights.clone();
    fewer.retain(|k, _| !k.contains("layers.1.self_attn.q_proj.lora_magnitude_vector"));
    copy(&missing, config, &fewer);
    let err = checkpoint::load_adapter(&mut m.model, &missing).unwrap_err().to_string();
    assert!(err.contains("layers.1.self_attn.q_proj") && err.contains("use_dora"), "{err}");
    assert!(m.model.linears().iter().all(|(_, _, l)| l.adapter.is_none()), "nothing half attached");
}

#[test]
fn train_dora_saves_reloads_and_resumes_exactly() {
    let runs = tempfile::tempdir().unwrap();
    let train = |name: &str, extra: &[&str]| {
        let out = train_command(runs.path(), name)
            .args(["--dora", "--targets", "q_proj,v_proj,down_proj", "--lr", "1e-2", "--save-every", "2"])
            .args(extra)
            .stdout(Stdio::null())
            .output()
            .unwrap();
        assert!(out.status.success(), "train {name}: {}", String::from_utf8_lossy(&out.stderr));
    };
    train("full", &["--iters", "4"]);
    let full = runs.path().join("full");
    let ckpt = full.join("checkpoint-4");
    let config = checkpoint::PeftAdapterConfig::read(&ckpt).unwrap();
    assert!(config.use_dora);
    let saved = tensors(&ckpt.join(ADAPTER_WEIGHTS));
    let magnitudes: Vec<&String> = saved.keys().filter(|k| k.ends_with(".lora_magnitude_vector")).collect();
    assert_eq!(magnitudes.len(), 6, "a magnitude per adapted linear: {:?}", saved.keys());
    let optimizer = tensors(&ckpt.join("optimizer.safetensors"));
    assert!(optimizer.keys().any(|k| k.ends_with("lora_magnitude_vector.exp_avg")), "the magnitude is optimized");

    // Trained: the magnitudes moved off the base rows' norms, and the adapter changes the model.
    let mut m = load_model(&fixture("tiny-llama"), &Device::Cpu, DType::F32).unwrap();
    let (_, params) = checkpoint::load_adapter_params(&mut m.model, &ckpt).unwrap();
    let ids = common::ids(&expected("tiny-llama")["score"]["ids"]);
    let lp = score(&m.model, &ids).unwrap();
    let moved = max_abs_diff(&lp, &base_logprobs(&ids).iter().map(|&x| x as f64).collect::<Vec<_>>());
    assert!(moved > 1e-3, "the trained DoRA adapter does not change the output ({moved})");
    let (_, _, q0) = m.model.linears().into_iter().find(|(l, name, _)| *l == 0 && *name == "q_proj").unwrap();
    let base_norms = q0.weight.to_dense(DType::F32).unwrap().sqr().unwrap().sum(1).unwrap().sqrt().unwrap();
    let m0 = params.iter().find(|p| p.layer == 0 && p.module == "q_proj").unwrap().magnitude.clone().unwrap();
    assert!(relative(m0.as_tensor(), &base_norms) > 1e-5, "the magnitude trained");

    // Saved again from the loaded adapter: the same tensors, and a reload scores the same, bit for bit.
    let again = runs.path().join("again");
    std::fs::create_dir_all(&again).unwrap();
    checkpoint::save_peft_adapter(&again, &params, &config).unwrap();
    let resaved = tensors(&again.join(ADAPTER_WEIGHTS));
    assert_eq!(resaved.len(), saved.len());
    for (name, t) in &saved {
        assert_eq!(relative(&resaved[name], t), 0.0, "{name}");
    }
    let mut m2 = load_model(&fixture("tiny-llama"), &Device::Cpu, DType::F32).unwrap();
    checkpoint::load_adapter(&mut m2.model, &again).unwrap();
    assert_eq!(score(&m2.model, &ids).unwrap(), lp, "a reloaded DoRA adapter scores identically");

    // For scripts/make_dora_fixtures.py --check: PEFT must load this folder and give these log-probs.
    let interop = Path::new(env!("CARGO_TARGET_TMPDIR")).join("dora-interop");
    let _ = std::fs::remove_dir_all(&interop);
    std::fs::create_dir_all(&interop).unwrap();
    for f in [ADAPTER_CONFIG, ADAPTER_WEIGHTS] {
        std::fs::copy(ckpt.join(f), interop.join(f)).unwrap();
    }
    let ours = serde_json::json!({ "ids": ids, "token_logprobs": lp });
    std::fs::write(interop.join("ours.json"), ours.to_string()).unwrap();
    eprintln!("for PEFT: python scripts/make_dora_fixtures.py --check {}", interop.display());

    // Resumed at step 2 it ends where the straight run did, bit for bit (magnitude moments included).
    std::fs::remove_dir_all(full.join("checkpoint-4")).unwrap();
    let out = resume_command(&full.join("checkpoint-2")).stdout(Stdio::null()).output().unwrap();
    assert!(out.status.success(), "resume: {}", String::from_utf8_lossy(&out.stderr));
    let resumed = tensors(&full.join("checkpoint-4").join(ADAPTER_WEIGHTS));
    for (name, t) in &saved {
        assert_eq!(relative(&resumed[name], t), 0.0, "{name} after resuming");
    }

    // A plain LoRA run cannot be resumed as DoRA.
    let plain = train_command(runs.path(), "plain").args(["--iters", "2"]).stdout(Stdio::null()).output().unwrap();
    assert!(plain.status.success(), "{}", String::from_utf8_lossy(&plain.stderr));
    let out =
        resume_command(&runs.path().join("plain/checkpoint-2")).args(["--dora", "--iters", "4"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("dora") && err.contains("cannot change on resume"), "{err}");
}

#[test]
fn a_config_file_turns_dora_on_under_lora() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("train.toml");
    std::fs::write(&file, "iters = 3\n[lora]\nrank = 4\ndora = true\n").unwrap();
    let config = metal_candle::engine::train::TrainConfig::from_toml_file(&file).unwrap();
    assert!(config.lora.dora && config.lora.rank == 4);
    // PEFT's name at the top level is refused, pointing at ours.
    std::fs::write(&file, "use_dora = true\n").unwrap();
    let err = metal_candle::engine::train::TrainConfig::from_toml_file(&file).unwrap_err().to_string();
    assert!(err.contains("`dora` under `[lora]`"), "{err}");
}

#[test]
fn dora_with_dropout_gives_the_same_gradients_with_gradient_checkpointing() {
    use metal_candle::engine::lora;
    let mut m = load_model(&fixture("tiny-llama"), &Device::Cpu, DType::F32).unwrap();
    let settings = metal_candle::engine::train::LoraSettings {
        rank: 4,
        alpha: 8.0,
        dropout: 0.2,
        dora: true,
        targets: "all-linear".parse().unwrap(),
        ..Default::default()
    };
    let params = random_adapters(&mut m.model, &settings, 3);
    let ids: Vec<u32> = (0..40).map(|i| (i * 37 + 11) % 500).collect();
    let example =
        Example { input_ids: ids.clone(), target_mask: (0..ids.len()).map(|i| i > 0).collect(), truncated: false };
    let batch = collate(&[example], &[0], 0).unwrap();
    let run = |checkpointing: bool| {
        lora::seed_dropout(&m.model, 5, 0);
        backprop::loss_and_gradients_with(&m.model, &batch, 1.0, true, checkpointing).unwrap()
    };
    let (plain, recomputed) = (run(false), run(true));
    assert_eq!(plain.nll_sum.value().unwrap(), recomputed.nll_sum.value().unwrap());
    for p in &params {
        let m = p.magnitude.as_ref().unwrap();
        for var in [&p.a, &p.b, m] {
            let (g1, g2) = (plain.grads.get(var.as_tensor()).unwrap(), recomputed.grads.get(var.as_tensor()).unwrap());
            assert!(relative(g2, g1) < 1e-6, "layer {} {}: {}", p.layer, p.module, relative(g2, g1));
            let largest = g1.abs().unwrap().flatten_all().unwrap().max(0).unwrap().to_scalar::<f32>().unwrap();
            assert!(largest > 0.0, "layer {} {}: a zero gradient", p.layer, p.module);
        }
    }
}
