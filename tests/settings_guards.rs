//! Issue 40, "nothing silently wrong": settings and files that used to be accepted and quietly gave a wrong result
//! (or failed with a message naming nothing) are refused or warned about, naming what is wrong, where, and what to
//! do; checked at the command line and, where the studio meets them, through the worker. Every input is written
//! by the test itself.

mod common;

use common::fixture;
use metal_candle::engine::device::{DTypeChoice, DeviceChoice};
use metal_candle::engine::export::{ExportFormat, GgufQuant};
use metal_candle::engine::model::chat_template::ChatMessage;
use metal_candle::engine::sampler::SamplingParams;
use metal_candle::engine::train::TrainConfig;
use metal_candle::worker::{ChatSide, Command, Event, GenerateJob, Worker};
use std::path::{Path, PathBuf};
use std::process::{Command as Process, Output};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn cli_in(dir: &Path, args: &[&str]) -> Output {
    Process::new(env!("CARGO_BIN_EXE_metal-candle")).current_dir(dir).args(args).output().unwrap()
}

fn cli(args: &[&str]) -> Output {
    cli_in(Path::new(env!("CARGO_MANIFEST_DIR")), args)
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// `o` failed with exit code 1 or 2 (clap) and its stderr holds every one of `words`.
fn refused(o: &Output, what: &str, words: &[&str]) {
    let err = stderr(o);
    assert!(matches!(o.status.code(), Some(1 | 2)), "{what} was accepted ({:?}): {err}", o.status.code());
    for w in words {
        assert!(err.contains(w), "{what}: expected {w:?} in {err}");
    }
}

/// A copy of the fixture folder `name` at `to`.
fn copy_fixture(name: &str, to: &Path) -> PathBuf {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(fixture(name)).unwrap().flatten() {
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
    to.to_path_buf()
}

/// Edit a JSON file in place.
fn edit_json(path: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let mut value: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    edit(&mut value);
    std::fs::write(path, serde_json::to_string_pretty(&value).unwrap()).unwrap();
}

/// A short CPU run of tiny-llama-shaped `model` on the sample chat, with `extra` flags (which replace the
/// defaults here of the same name).
fn train(dir: &Path, model: &Path, out: &Path, name: &str, extra: &[&str]) -> Output {
    let data = common::cli::sample_data();
    let mut args = vec!["train", "--model", s(model), "--out", s(out), "--name", name, "--device", "cpu"];
    for [flag, value] in [["--data", s(&data)], ["--seq-len", "64"], ["--batch-size", "2"], ["--rank", "4"]] {
        if !extra.contains(&flag) {
            args.extend([flag, value]);
        }
    }
    cli_in(dir, &[&args[..], extra].concat())
}

/// Events from `w` until `stop` returns true, for at most a minute.
fn drain_until(w: &Worker, mut stop: impl FnMut(Event) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        assert!(Instant::now() < deadline, "the worker did not answer in time");
        match w.try_recv() {
            Some(event) => {
                if stop(event) {
                    return;
                }
            }
            None => std::thread::sleep(Duration::from_millis(5)),
        }
    }
}

#[test]
fn chat_rows_out_of_order_or_with_empty_replies_are_refused_naming_file_line_and_order() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("chat.jsonl");
    let turn = |role: &str, content: &str| serde_json::json!({"role": role, "content": content});
    let rows = [
        vec![turn("user", "hi"), turn("assistant", "hello")],
        vec![turn("assistant", "hello"), turn("user", "hi")],
        vec![turn("user", "a"), turn("user", "b"), turn("assistant", "c")],
        vec![turn("user", "hi"), turn("assistant", "   ")],
    ];
    let text: String = rows.iter().map(|r| format!("{}\n", serde_json::json!({ "messages": r }))).collect();
    std::fs::write(&data, text).unwrap();
    let out = dir.path().join("runs");
    let o = train(dir.path(), &fixture("tiny-llama"), &out, "r", &["--data", s(&data), "--iters", "1"]);
    refused(
        &o,
        "rows out of order",
        &[
            "3 invalid dataset rows",
            &format!("{}:2", data.display()),
            "messages[0] (assistant) comes before any user turn",
            &format!("{}:3", data.display()),
            "messages[1] (user) follows another user turn",
            &format!("{}:4", data.display()),
            "messages[1] (assistant) is an empty reply",
            "expected: an optional system turn first, then user and assistant turns alternating",
            "skip_invalid_rows",
        ],
    );
    assert!(!out.join("r").exists());

    // The studio's dataset page reads the same problems, row by row, through the worker.
    let w = Worker::spawn(Arc::new(|| {}));
    w.send(Command::InspectDataset {
        path: data.clone(),
        read: Default::default(),
        max_seq_len: 64,
        train_on_prompt: false,
        preview_rows: 2,
    });
    drain_until(&w, |event| match event {
        Event::DatasetInspected(report) => {
            let problems = &report.splits[0].problems;
            let lines: Vec<usize> = problems.iter().map(|p| p.line).collect();
            assert_eq!(lines, [2, 3, 4], "{problems:?}");
            assert!(problems[1].message.contains("follows another user turn"), "{problems:?}");
            true
        }
        Event::DatasetFailed { error, .. } => panic!("{error:?}"),
        _ => false,
    });
}

#[test]
fn chat_without_a_template_warns_naming_the_fallback_format_in_the_cli_and_the_chat_pane() {
    let dir = tempfile::tempdir().unwrap();
    // tiny-llama without its chat template, under its own name (so the adapter below is not flagged for that).
    let model = copy_fixture("tiny-llama", &dir.path().join("plain/tiny-llama"));
    edit_json(&model.join("tokenizer_config.json"), |c| {
        c.as_object_mut().unwrap().remove("chat_template");
    });
    let fallback = "plain fallback format (`### User\\n...\\n\\n### Assistant\\n`)";
    let o =
        cli(&["generate", "--model", s(&model), "--device", "cpu", "--chat", "--prompt", "hi", "--max-tokens", "2"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.contains("warning: ") && err.contains("has no chat template") && err.contains(fallback), "{err}");
    // A plain prompt is not a chat: nothing to warn about.
    let o = cli(&["generate", "--model", s(&model), "--device", "cpu", "--prompt", "hi", "--max-tokens", "2"]);
    assert!(o.status.success() && !stderr(&o).contains("chat template"), "{}", stderr(&o));
    // --system without --chat used to be dropped without a word: refused before the model loads.
    let o = cli(&["generate", "--model", "/nonexistent", "--prompt", "hi", "--system", "Be terse."]);
    refused(&o, "--system without --chat", &["--system", "add --chat", "drop --system"]);

    // A PEFT adapter naming another base (and carrying no fingerprint).
    let adapter = copy_fixture("tiny-llama-peft", &dir.path().join("adapter"));
    edit_json(&adapter.join("adapter_config.json"), |c| {
        c["base_model_name_or_path"] = "HuggingFaceTB/SmolLM2-135M".into()
    });

    // The chat pane meets both through the worker, on the event that starts the reply.
    let w = Worker::spawn(Arc::new(|| {}));
    w.send(Command::LoadModel {
        path: model.clone(),
        device: DeviceChoice::Cpu,
        dtype: DTypeChoice::Auto,
        quantize: Default::default(),
    });
    let job = GenerateJob {
        id: 7,
        side: ChatSide::Right,
        adapter: Some(adapter),
        messages: vec![ChatMessage::new("user", "hi")],
        sampling: SamplingParams::greedy(),
        max_new_tokens: 2,
    };
    drain_until(&w, |event| match event {
        Event::ModelLoaded(_) => {
            w.send(Command::Generate(job.clone()));
            false
        }
        Event::GenerationStarted { adapter_warning, template_warning, .. } => {
            let template = template_warning.expect("no template warning");
            assert!(template.contains(fallback) && template.contains(s(&model)), "{template}");
            let adapter = adapter_warning.expect("no adapter warning");
            assert!(adapter.contains("names `HuggingFaceTB/SmolLM2-135M` as its base model"), "{adapter}");
            assert!(adapter.contains(s(&model)), "{adapter}");
            true
        }
        Event::GenerationFailed { error, .. } | Event::ModelLoadFailed { error, .. } => panic!("{error:?}"),
        _ => false,
    });
}

#[test]
fn adapters_naming_another_base_warn_and_ones_that_do_not_fit_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let llama = fixture("tiny-llama");
    let generate = |adapter: &Path| {
        cli(&["generate", "--model", s(&llama), "--adapter", s(adapter), "--device", "cpu", "--prompt", "hi"])
    };
    let named = copy_fixture("tiny-llama-peft", &dir.path().join("named"));
    edit_json(&named.join("adapter_config.json"), |c| c["base_model_name_or_path"] = "someorg/other-model".into());
    let o = generate(&named);
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.contains("warning: the adapter") && err.contains("`someorg/other-model`") && err.contains(s(&llama)));
    // Its own base by name (a repo id whose NAME is the folder's) is not flagged.
    edit_json(&named.join("adapter_config.json"), |c| c["base_model_name_or_path"] = "someorg/tiny-llama".into());
    assert!(!stderr(&generate(&named)).contains("warning"), "{}", stderr(&generate(&named)));

    // Shapes that do not fit the loaded base: refused, naming the module, the shapes and the base the adapter names.
    let misfit = copy_fixture("tiny-llama-peft", &dir.path().join("misfit"));
    edit_json(&misfit.join("adapter_config.json"), |c| c["base_model_name_or_path"] = "someorg/wider-model".into());
    let weights = misfit.join("adapter_model.safetensors");
    let mut tensors = candle_core::safetensors::load(&weights, &candle_core::Device::Cpu).unwrap();
    let name = tensors.keys().find(|k| k.contains("layers.0.self_attn.q_proj.lora_A")).unwrap().clone();
    let narrowed = tensors[&name].narrow(1, 0, 32).unwrap().contiguous().unwrap();
    tensors.insert(name, narrowed);
    candle_core::safetensors::save(&tensors, &weights).unwrap();
    let o = generate(&misfit);
    refused(&o, "a misfit adapter", &["q_proj", "does not fit this model", "`someorg/wider-model`", "another base"]);
    assert!(o.stdout.is_empty());
}

#[test]
fn a_short_run_scales_the_default_warmup_and_warns_about_a_warmup_set_too_long() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("runs");
    let llama = fixture("tiny-llama");
    let o = train(dir.path(), &llama, &out, "short", &["--iters", "4", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let events: Vec<serde_json::Value> =
        String::from_utf8_lossy(&o.stdout).lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    let started = events.iter().find(|e| e["event"] == "started").expect("no Started event");
    let notes = started["notes"].to_string();
    assert!(notes.contains("the default of 10 warmup steps is not shorter than this run's 4 steps"), "{notes}");
    // The learning rate reaches --lr (2e-4) and then decays.
    let lrs: Vec<f64> = events.iter().filter(|e| e["event"] == "step").filter_map(|e| e["lr"].as_f64()).collect();
    assert_eq!(lrs.len(), 4);
    assert!((lrs[0] - 2e-4).abs() < 1e-12 && lrs[3] < lrs[0], "{lrs:?}");

    let o = train(dir.path(), &llama, &out, "set", &["--iters", "4", "--warmup", "10"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.contains("warning: warmup is 10 steps") && err.contains("the run has only 4"), "{err}");
    // The rule the trainer, the CLI and the studio's schedule preview share.
    let auto = TrainConfig::default();
    assert_eq!(
        (auto.warmup_steps(4), auto.warmup_steps(10), auto.warmup_steps(11), auto.warmup_steps(500)),
        (0, 1, 10, 10)
    );
    assert_eq!(TrainConfig { warmup: Some(3), ..auto.clone() }.warmup_note(100), None);
}

#[test]
fn negative_numbers_reach_the_range_checks_and_unknown_blas_libraries_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("runs");
    let llama = fixture("tiny-llama");
    let cases: &[(&[&str], &[&str])] = &[
        (&["--lr", "-1"], &["learning rate `lr` (--lr) is -1", "greater than 0"]),
        (&["--alpha", "-2"], &["--alpha", "is -2"]),
        (&["--epochs", "-1"], &["--epochs", "greater than 0"]),
        (&["--rank", "-1"], &["'-1'", "--rank"]),
    ];
    for (args, words) in cases {
        refused(&train(dir.path(), &llama, &out, "r", args), &format!("{args:?}"), words);
        assert!(!out.join("r").exists());
    }
    let o = cli(&["generate", "--model", s(&llama), "--device", "cpu", "--prompt", "hi", "--temperature", "-1"]);
    refused(&o, "--temperature -1", &["temperature (--temperature) is -1"]);

    for lib in ["/nonexistent/libblas.so", "/etc/hostname"] {
        let o = cli(&["doctor", "--blas", lib]);
        refused(&o, lib, &["the BLAS library", lib, "--blas", "cannot be used", "--blas off"]);
    }
    assert!(cli(&["doctor", "--blas", "off"]).status.success());
}

#[test]
fn export_refuses_a_quantization_the_format_does_not_write() {
    let dir = tempfile::tempdir().unwrap();
    let peft = dir.path().join("peft");
    let ckpt = fixture("ours-tiny-llama-adapter");
    let llama = fixture("tiny-llama");
    for format in ["peft", "mlx-lm", "merged", "gguf-lora"] {
        let args = ["export", "--checkpoint", s(&ckpt), "--model", s(&llama), "--out", s(&peft)];
        let o = cli(&[&args[..], &["--format", format, "--quant", "q4_k_m"]].concat());
        refused(&o, format, &["--quant q4_k_m does not apply to the", format, "drop --quant"]);
        assert!(!peft.exists());
    }
    assert!(ExportFormat::Peft.quant_for(Some(GgufQuant::Q4KM)).is_err());
    assert_eq!(ExportFormat::Gguf.quant_for(Some(GgufQuant::Q4KM)).unwrap(), GgufQuant::Q4KM);
    assert_eq!(ExportFormat::Ollama.quant_for(None).unwrap(), GgufQuant::F16);
}

#[test]
fn checkpoints_resume_from_inside_their_run_refuse_an_edited_state_and_name_a_base_that_moved() {
    let dir = tempfile::tempdir().unwrap();
    let base = copy_fixture("tiny-llama", &dir.path().join("models/base"));
    let out = dir.path().join("runs");
    let o = train(dir.path(), Path::new("models/base"), Path::new("runs"), "r", &["--iters", "2"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let run = out.join("r");

    // An edited trainer_state.json: its step and the folder's both named, nothing resumed.
    let state = run.join("checkpoint-2/trainer_state.json");
    let saved = std::fs::read(&state).unwrap();
    edit_json(&state, |v| v["step"] = 1.into());
    let o = cli_in(&run, &["train", "--resume", "checkpoint-2", "--iters", "3", "--device", "cpu"]);
    refused(&o, "an edited step", &["trainer_state.json says step 1", "checkpoint-2 (saved at step 2)"]);
    assert!(!run.join("checkpoint-3").exists());
    std::fs::write(&state, saved).unwrap();

    // A bare checkpoint name from inside the run folder (its parent is the empty path), the base named relative to
    // where the run started: run.json recorded it absolute.
    let o = cli_in(&run, &["train", "--resume", "checkpoint-2", "--iters", "3", "--device", "cpu"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(run.join("checkpoint-3").exists());

    // The base moved: a resume and an export that reads it name the recorded path and --model; a peft copy needs no
    // base; --model points both at where it is now.
    let moved = dir.path().join("models/moved");
    std::fs::rename(&base, &moved).unwrap();
    let ckpt = run.join("checkpoint-3");
    let words = [s(&base), "run.json", "is not there", "--model <path>"];
    let o = cli(&["train", "--resume", s(&ckpt), "--iters", "4", "--device", "cpu"]);
    refused(&o, "a resume on a moved base", &words);
    let merged = dir.path().join("merged");
    let o = cli(&["export", "--checkpoint", s(&ckpt), "--format", "merged", "--out", s(&merged)]);
    refused(&o, "an export of a moved base", &words);
    assert!(!merged.exists());
    let o = cli(&["export", "--checkpoint", s(&ckpt), "--format", "peft", "--out", s(&dir.path().join("p"))]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = cli(&["export", "--checkpoint", s(&ckpt), "--format", "merged", "--out", s(&merged), "--model", s(&moved)]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = cli(&["train", "--resume", s(&ckpt), "--iters", "4", "--device", "cpu", "--model", s(&moved)]);
    assert!(o.status.success(), "{}", stderr(&o));
}

#[test]
fn a_token_id_past_the_model_vocabulary_is_refused_naming_the_tokenizer_file() {
    let dir = tempfile::tempdir().unwrap();
    let model = copy_fixture("tiny-llama", &dir.path().join("tiny-llama"));
    let tokenizer = model.join("tokenizer.json");
    edit_json(&tokenizer, |t| {
        let token = serde_json::json!({"id": 512, "content": "<|zap|>", "single_word": false, "lstrip": false,
            "rstrip": false, "normalized": false, "special": false});
        t["added_tokens"].as_array_mut().unwrap().push(token);
    });
    let generate = |prompt: &str| cli(&["generate", "--model", s(&model), "--device", "cpu", "--prompt", prompt]);
    let o = generate("hello <|zap|>");
    refused(&o, "an id past the vocabulary", &[s(&tokenizer), "token id 512 (`<|zap|>`)", "512 embedding rows"]);
    assert!(!stderr(&o).contains("index-select"), "{}", stderr(&o));
    // Text without that token still works, and `info` says what is wrong with the tokenizer up front.
    assert!(generate("hello").status.success());
    let o = cli(&["info", "--model", s(&model), "--device", "cpu"]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("has token ids up to 512 but the model has 512 embedding rows"), "{text}");
}

/// Settings that work but are likely mistakes are warned about before the first step, and the run goes on:
/// an lr far outside the LoRA range, a sequence length that cuts most rows, many epochs over a small set.
#[test]
fn odd_but_valid_settings_warn_before_training_and_the_run_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("runs");
    let llama = fixture("tiny-llama");
    for (name, extra, words) in [
        ("hot", &["--iters", "1", "--lr", "0.5"][..], &["learning rate 5e-1", "far outside", "may diverge"][..]),
        (
            "cut",
            &["--iters", "1", "--seq-len", "64"][..],
            &["longer than the sequence length 64", "lose their tail"][..],
        ),
        ("many", &["--iters", "40", "--batch-size", "64"][..], &["passes over", "overfit"][..]),
    ] {
        let o = train(dir.path(), &llama, &out, name, extra);
        assert!(o.status.success(), "{name}: {}", stderr(&o));
        let err = stderr(&o);
        for word in words {
            assert!(err.contains("warning: ") && err.contains(word), "{name}: `{word}` missing in {err}");
        }
    }
}
