//! Bad input for the GGUF exports and the template/end-of-sequence doctor at the CLI: an adapter trained on
//! another base is refused by every GGUF format with no output left behind; a disk that fills mid-write
//! (`FILE.partial` -> /dev/full) leaves no output file; a chat template that forgets the end-of-turn token is
//! reported by `metal-candle data`, `train` and `export`, and a good one is not.

mod common;

use common::cli::sample_data;
use common::fixture;
use metal_candle::engine::export::{export_with, gguf_writer::partial_path, ExportFormat, ExportRequest, GgufQuant};
use std::path::{Path, PathBuf};
use std::process::Command;

fn request(format: ExportFormat, ckpt: Option<PathBuf>, out: PathBuf) -> ExportRequest {
    ExportRequest {
        checkpoint: ckpt,
        format,
        quant: GgufQuant::Q8_0,
        out,
        base_model: fixture("tiny-llama"),
        allow_other_base: false,
        overwrite: false,
    }
}

/// ours-tiny-llama-adapter with lora_A cut to 32 inputs: an adapter for a model of hidden size 32.
fn adapter_for_another_base(dir: &Path) -> PathBuf {
    let src = fixture("ours-tiny-llama-adapter");
    let ckpt = dir.join("other-base");
    std::fs::create_dir_all(&ckpt).unwrap();
    std::fs::copy(src.join("adapter_config.json"), ckpt.join("adapter_config.json")).unwrap();
    let tensors =
        candle_core::safetensors::load(src.join("adapter_model.safetensors"), &candle_core::Device::Cpu).unwrap();
    let cut: std::collections::HashMap<_, _> = tensors
        .into_iter()
        .map(|(name, t)| {
            let t = if name.contains("lora_A") { t.narrow(1, 0, 32).unwrap().contiguous().unwrap() } else { t };
            (name, t)
        })
        .collect();
    candle_core::safetensors::save(&cut, ckpt.join("adapter_model.safetensors")).unwrap();
    ckpt
}

#[test]
fn an_adapter_for_another_base_is_refused_by_every_gguf_format() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = adapter_for_another_base(dir.path());
    for (format, name) in
        [(ExportFormat::Gguf, "m.gguf"), (ExportFormat::GgufLora, "a.gguf"), (ExportFormat::Ollama, "ollama")]
    {
        let out = dir.path().join(name);
        let err = export_with(&request(format, Some(ckpt.clone()), out.clone()), &mut |_| {}).unwrap_err();
        let message = err.to_string();
        assert!(message.contains("adapter") && message.contains("another base model"), "{format:?}: {message}");
        let written = if format == ExportFormat::Ollama { out.join("model.gguf") } else { out.clone() };
        assert!(!written.exists() && !partial_path(&written).exists(), "{format:?} left {}", written.display());
    }
}

#[cfg(unix)]
#[test]
fn a_disk_that_fills_mid_write_leaves_no_output() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("full.gguf");
    std::os::unix::fs::symlink("/dev/full", partial_path(&out)).unwrap();
    let err =
        export_with(&request(ExportFormat::Gguf, Some(fixture("ours-tiny-llama-adapter")), out.clone()), &mut |_| {})
            .unwrap_err();
    assert!(err.to_string().contains("full.gguf.partial"), "{err}");
    assert!(!out.exists(), "a failed write left {}", out.display());
    assert!(std::fs::symlink_metadata(partial_path(&out)).is_err(), "the partial file was not removed");
}

/// tiny-llama with a chat template that never writes `<|im_end|>`.
fn model_with_forgetful_template(dir: &Path) -> PathBuf {
    let model = dir.join("forgetful");
    std::fs::create_dir_all(&model).unwrap();
    for entry in std::fs::read_dir(fixture("tiny-llama")).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), model.join(entry.file_name())).unwrap();
    }
    let path = model.join("tokenizer_config.json");
    let mut config: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let template = config["chat_template"].as_str().unwrap().replace("+ '<|im_end|>\\n'", "+ '\\n'");
    assert!(!template.contains("content'] | trim + '<|im_end|>"), "the fixture's template changed");
    config["chat_template"] = template.into();
    std::fs::write(&path, serde_json::to_string(&config).unwrap()).unwrap();
    model
}

fn run(args: &[&str], model: &Path) -> String {
    let output =
        Command::new(env!("CARGO_BIN_EXE_metal-candle")).args(args).arg("--model").arg(model).output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "{args:?} failed: {text}");
    text
}

#[test]
fn the_cli_warns_about_a_template_that_forgets_the_end_of_turn_token() {
    let dir = tempfile::tempdir().unwrap();
    let bad = model_with_forgetful_template(dir.path());
    let data = sample_data();
    let data = data.to_str().unwrap();
    let out = dir.path().join("bad.gguf");
    let runs = dir.path().join("runs");

    let report = run(&["data", "--data", data], &bad);
    assert!(report.contains("warning: the chat template does not end an assistant turn"), "{report}");
    assert!(report.contains("training rows end their trained tokens without a stop token"), "{report}");
    let train = run(
        &[
            "train",
            "--data",
            data,
            "--out",
            runs.to_str().unwrap(),
            "--name",
            "t",
            "--iters",
            "1",
            "--device",
            "cpu",
            "--seq-len",
            "96",
            "--batch-size",
            "2",
            "--rank",
            "4",
        ],
        &bad,
    );
    assert!(
        train.lines().any(|l| l.starts_with("warning: the chat template does not end an assistant turn")),
        "{train}"
    );
    let export = run(&["export", "--format", "gguf", "--quant", "f16", "--out", out.to_str().unwrap()], &bad);
    assert!(export.contains("warning: the chat template does not end an assistant turn"), "{export}");

    let good = run(&["data", "--data", data], &fixture("tiny-llama"));
    assert!(!good.contains("warning:"), "{good}");
    let ollama = dir.path().join("ollama");
    let good = run(
        &["export", "--format", "ollama", "--quant", "q8_0", "--out", ollama.to_str().unwrap()],
        &fixture("tiny-llama"),
    );
    assert!(!good.contains("warning:"), "{good}");
}
