//! Issue 14, the "silently wrong" half: hostile or mistaken inputs that used to be accepted and quietly do the
//! wrong thing are refused (or warned about) with a message naming the setting, the value and what is allowed;
//! checked at the command line, where the issue found them, and through the worker where the studio meets them.

mod common;

use common::fixture;
use metal_candle::engine::device::{DTypeChoice, DeviceChoice};
use metal_candle::engine::sampler::SamplingParams;
use metal_candle::engine::train::run_folder::RunManifest;
use metal_candle::worker::{ChatSide, Command, Event, GenerateJob, Worker};
use std::path::{Path, PathBuf};
use std::process::{Command as Process, Output};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn sample_data() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/sample-chat")
}

fn cli(args: &[&str]) -> Output {
    Process::new(env!("CARGO_BIN_EXE_metal-candle")).args(args).output().unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// `train` on tiny-llama with the sample data into `out`, plus `extra` flags (which replace the defaults
/// here of the same name).
fn train(out: &Path, extra: &[&str]) -> Output {
    let model = fixture("tiny-llama");
    let data = sample_data();
    let mut args = vec!["train", "--model", s(&model), "--data", s(&data), "--out", s(out), "--device", "cpu"];
    for pair in [["--seq-len", "64"], ["--batch-size", "2"], ["--rank", "4"], ["--alpha", "8"]] {
        if !extra.iter().any(|a| a.split('=').next() == Some(pair[0])) {
            args.extend(pair);
        }
    }
    args.extend(extra);
    cli(&args)
}

/// A refused `train`: it fails, says `words`, and writes nothing under `out`.
fn refused(out: &Path, extra: &[&str], words: &[&str]) {
    let iters: &[&str] = if extra.contains(&"--iters") { &[] } else { &["--iters", "2"] };
    let o = train(out, &[&["--name", "r"], iters, extra].concat());
    let err = stderr(&o);
    assert!(!o.status.success(), "{extra:?} was accepted");
    for w in words {
        assert!(err.contains(w), "{extra:?}: expected {w:?} in {err:?}");
    }
    assert!(!out.join("r").exists(), "{extra:?} started a run before refusing");
}

/// A copy of tiny-llama in `dir` whose weights differ in their first bytes (same shapes, another model).
fn other_tiny_llama(dir: &Path) -> PathBuf {
    let out = dir.join("tiny-llama-other");
    std::fs::create_dir_all(&out).unwrap();
    for e in std::fs::read_dir(fixture("tiny-llama")).unwrap().flatten() {
        std::fs::copy(e.path(), out.join(e.file_name())).unwrap();
    }
    let path = out.join("model.safetensors");
    let mut bytes = std::fs::read(&path).unwrap();
    let header = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    for b in &mut bytes[8 + header..8 + header + 64] {
        *b ^= 0x01;
    }
    std::fs::write(&path, bytes).unwrap();
    out
}

#[test]
fn numeric_settings_out_of_range_are_refused_naming_flag_value_and_range() {
    let dir = tempfile::tempdir().unwrap();
    let cases: &[(&[&str], &[&str])] = &[
        (&["--weight-decay", "NaN"], &["--weight-decay", "NaN", "allowed: 0 to 1"]),
        (&["--weight-decay=-0.1"], &["--weight-decay", "-0.1"]),
        (&["--max-grad-norm=-1"], &["--max-grad-norm", "-1", "allowed"]),
        (&["--max-grad-norm", "NaN"], &["--max-grad-norm", "NaN"]),
        (&["--lr", "1e30"], &["--lr", "1000000000000000000000000000000", "at most 1"]),
        (&["--lr", "0"], &["--lr", "greater than 0"]),
        (&["--batch-size", "0"], &["--batch-size", "is 0", "1 to 4096"]),
        (&["--grad-accum", "100000"], &["--grad-accum", "100000"]),
        (&["--warmup", "99999999"], &["--warmup", "99999999"]),
        (&["--seq-len", "4"], &["--seq-len", "is 4"]),
        (&["--val-every", "99999999999"], &["--val-every"]),
        (&["--save-every", "99999999999"], &["--save-every"]),
        (&["--rank", "0"], &["--rank", "is 0"]),
        (&["--alpha", "inf"], &["--alpha", "inf"]),
        (&["--dropout", "NaN"], &["--dropout", "NaN"]),
        (&["--iters", "999999999"], &["--iters", "999999999"]),
    ];
    for (args, words) in cases {
        refused(dir.path(), args, words);
    }
    // Epochs: NaN and absurd counts (1e300 used to run forever), and the step bound for a count that is
    // allowed on its own but makes too many steps over the data.
    let epochs = |value: &str, words: &[&str]| {
        let flag = format!("--epochs={value}");
        let o = train(dir.path(), &["--name", "r", &flag]);
        assert!(!o.status.success() && !dir.path().join("r").exists(), "--epochs {value} was accepted");
        let err = stderr(&o);
        assert!(words.iter().all(|w| err.contains(w)), "--epochs {value}: {err}");
    };
    epochs("NaN", &["--epochs", "NaN"]);
    epochs("1e300", &["--epochs", "at most 100000"]);
    epochs("-1", &["--epochs", "greater than 0"]);
}

#[test]
fn run_names_that_leave_the_runs_folder_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("runs");
    let outside = dir.path().join("escaped");
    for name in ["../escaped", s(&outside), "", "  ", ".hidden", "a/b", "x\ty"] {
        let o = train(&out, &["--name", name, "--iters", "1"]);
        assert!(!o.status.success(), "--name {name:?} was accepted");
        assert!(stderr(&o).contains("run name"), "--name {name:?}: {}", stderr(&o));
        assert!(!outside.exists() && !out.exists(), "--name {name:?} wrote something");
    }
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    metal_candle::engine::train::run_folder::validate_run_name("lora-r8 v2.1").unwrap();
}

#[test]
fn unknown_keys_in_a_config_file_are_refused_with_the_closest_key() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("learning_rate = 0.5\n", "unknown setting `learning_rate`; did you mean `lr`"),
        ("rank = 8\n", "unknown setting `rank`; did you mean `rank` under `[lora]`"),
        ("warmpu = 3\n", "did you mean `warmup`"),
        ("[lora]\nalpah = 3.0\n", "unknown setting `lora.alpah`; did you mean `alpha` under `[lora]`"),
        ("[lora]\nlr = 0.1\n", "did you mean `lr` (at the top level)"),
    ];
    for (text, words) in cases {
        let path = dir.path().join("run.toml");
        std::fs::write(&path, text).unwrap();
        let o = train(dir.path(), &["--name", "r", "--iters", "1", "--config", s(&path)]);
        assert!(!o.status.success(), "{text:?} was accepted");
        assert!(stderr(&o).contains(words) && stderr(&o).contains("run.toml"), "{text:?}: {}", stderr(&o));
        assert!(!dir.path().join("r").exists());
    }
    // Known keys still load.
    let path = dir.path().join("ok.toml");
    std::fs::write(&path, "lr = 0.001\nwarmup = 0\n[lora]\nrank = 2\n").unwrap();
    let config = metal_candle::engine::train::TrainConfig::from_toml_file(&path).unwrap();
    assert_eq!((config.lr, config.warmup, config.lora.rank), (0.001, Some(0), 2));
}

#[test]
fn sampling_settings_out_of_range_are_refused_before_generating() {
    let model = fixture("tiny-llama");
    let cases: &[(&[&str], &str)] = &[
        (&["--temperature", "NaN"], "--temperature"),
        (&["--temperature=-0.5"], "--temperature"),
        (&["--repetition-penalty", "0"], "--repetition-penalty"),
        (&["--repetition-penalty=-1"], "--repetition-penalty"),
        (&["--repetition-penalty", "NaN"], "--repetition-penalty"),
        (&["--top-p", "0"], "--top-p"),
        (&["--top-p", "1.5"], "--top-p"),
        (&["--max-tokens", "0"], "--max-tokens"),
    ];
    for (args, flag) in cases {
        let o = cli(&[&["generate", "--model", s(&model), "--device", "cpu", "--prompt", "hi"], *args].concat());
        assert!(!o.status.success(), "{args:?} was accepted");
        let err = stderr(&o);
        assert!(err.contains(flag) && err.contains("allowed"), "{args:?}: {err}");
        assert!(o.stdout.is_empty(), "{args:?} generated something");
    }
    // The engine's check is the one the chat pane runs before sending.
    let nan = SamplingParams { temperature: f64::NAN, ..Default::default() };
    assert!(nan.validate(16).unwrap_err().to_string().contains("temperature"));
    SamplingParams::default().validate(16).unwrap();
}

#[test]
fn a_hostile_chat_template_fails_fast_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("hostile");
    std::fs::create_dir(&model).unwrap();
    for e in std::fs::read_dir(fixture("tiny-llama")).unwrap().flatten() {
        std::fs::copy(e.path(), model.join(e.file_name())).unwrap();
    }
    let path = model.join("tokenizer_config.json");
    let mut config: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    config["chat_template"] =
        "{% for i in range(100000) %}{% for j in range(100000) %}{{ j }}{% endfor %}{% endfor %}".into();
    std::fs::write(&path, serde_json::to_string(&config).unwrap()).unwrap();
    let started = Instant::now();
    let o = cli(&["generate", "--model", s(&model), "--device", "cpu", "--chat", "--prompt", "hi"]);
    let secs = started.elapsed().as_secs_f64();
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(err.contains(s(&path)) && err.contains("chat template"), "{err}");
    assert!(secs < 10.0, "took {secs:.1} s");
}

#[test]
fn a_row_longer_than_the_context_with_seq_len_above_it_is_refused_before_step_1() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("long.jsonl");
    let long = "word ".repeat(2000);
    let row =
        serde_json::json!({"messages": [{"role": "user", "content": long}, {"role": "assistant", "content": "ok"}]});
    std::fs::write(&data, format!("{row}\n{row}\n")).unwrap();
    let model = fixture("tiny-llama");
    let out = dir.path().join("runs");
    let o = cli(&[
        "train",
        "--model",
        s(&model),
        "--data",
        s(&data),
        "--out",
        s(&out),
        "--name",
        "r",
        "--device",
        "cpu",
        "--iters",
        "2",
        "--seq-len",
        "512",
    ]);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(err.contains("seq_len 512") && err.contains("context of 256"), "{err}");
    assert!(!err.contains("prompt"), "{err}");
    assert!(!out.join("r").exists());
}

#[test]
fn resume_refuses_lora_changes_and_another_base_and_records_what_changed() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("runs");
    let o = train(&out, &["--name", "r", "--iters", "2"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let run = out.join("r");
    let ckpt = run.join("checkpoint-2");
    let started = RunManifest::read(&run).unwrap();
    assert!(started.base_fingerprint.as_deref().unwrap().starts_with("sha256:"));
    assert!(started.dataset_fingerprint.is_some());
    let record = metal_candle::engine::checkpoint::BaseRecord::read(&ckpt).unwrap().unwrap();
    assert_eq!(Some(record.fingerprint), started.base_fingerprint);
    let resume = |extra: &[&str]| cli(&[&["train", "--resume", s(&ckpt), "--device", "cpu"], extra].concat());

    // LoRA settings cannot change on resume: refused at the command line, nothing touched.
    for (args, field) in [
        (&["--alpha", "256"][..], "LoRA alpha"),
        (&["--targets", "all-linear"][..], "LoRA targets"),
        (&["--layers", "1"][..], "LoRA layers"),
        (&["--rank", "8"][..], "LoRA rank"),
    ] {
        let o = resume(args);
        assert!(!o.status.success() && stderr(&o).contains(field), "{args:?}: {}", stderr(&o));
    }
    // Another base with the same shapes: refused, naming --force-base.
    let other = other_tiny_llama(dir.path());
    let o = resume(&["--model", s(&other), "--iters", "3"]);
    assert!(!o.status.success() && stderr(&o).contains("--force-base"), "{}", stderr(&o));
    assert_eq!(RunManifest::read(&run).unwrap(), started, "a refused resume leaves run.json alone");

    // Changed data and optimisation settings are accepted, reported and recorded.
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    for f in ["train.jsonl", "valid.jsonl"] {
        std::fs::copy(sample_data().join(f), data.join(f)).unwrap();
    }
    let mut text = std::fs::read_to_string(data.join("train.jsonl")).unwrap();
    text.push_str(&text.lines().next().unwrap().replace("\"content\": \"", "\"content\": \"Hey. "));
    text.push('\n');
    std::fs::write(data.join("train.jsonl"), text).unwrap();
    let o = resume(&["--data", s(&data), "--lr", "0.001", "--iters", "4", "--save-every", "3"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("note: the dataset changed"), "{}", stderr(&o));
    let after = RunManifest::read(&run).unwrap();
    assert_eq!((after.config.lr, after.config.iters, after.config.save_every), (0.001, Some(4), 3));
    assert_eq!(after.dataset, data);
    let changed = after.resumes[0].changed.join("; ");
    for w in ["lr: 0.0002 -> 0.001", "iters: 2 -> 4", "save_every", "data:", "dataset fingerprint"] {
        assert!(changed.contains(w), "{w:?} not in {changed}");
    }
    assert_eq!(after.resumes[0].step, 2);
    assert!(!after.resumes[0].forced_base);

    // Forced onto the other base: accepted and recorded.
    let ckpt4 = run.join("checkpoint-4");
    let o =
        cli(&["train", "--resume", s(&ckpt4), "--device", "cpu", "--model", s(&other), "--iters", "5", "--force-base"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let last = RunManifest::read(&run).unwrap();
    assert!(last.resumes[1].forced_base && last.resumes[1].changed.iter().any(|c| c.contains("base model")));
    assert_eq!(last.model, other);
    assert!(!last.config.force_base, "forcing is a choice of one invocation, not a setting");
}

#[test]
fn an_adapter_trained_on_another_base_is_flagged_everywhere() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("runs");
    let o = train(&out, &["--name", "r", "--iters", "2"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let ckpt = out.join("r/checkpoint-2");
    let qwen = fixture("tiny-qwen2");
    let llama = fixture("tiny-llama");
    let warning = "was trained on another base model";
    let generate = |model: &Path, adapter: &Path| {
        cli(&["generate", "--model", s(model), "--adapter", s(adapter), "--device", "cpu", "--prompt", "hi"])
    };
    let o = generate(&qwen, &ckpt);
    assert!(o.status.success() && stderr(&o).contains(warning), "{}", stderr(&o));
    let o = cli(&["score", "--model", s(&qwen), "--adapter", s(&ckpt), "--device", "cpu", "--text", "hi there"]);
    assert!(o.status.success() && stderr(&o).contains(warning), "{}", stderr(&o));
    // The right base, and a PEFT-trained adapter without a fingerprint: no warning.
    assert!(!stderr(&generate(&llama, &ckpt)).contains(warning));
    assert!(!stderr(&generate(&llama, &fixture("tiny-llama-peft"))).contains(warning));
    // Export onto another base is refused unless forced; a PEFT copy keeps the fingerprint.
    let merged = dir.path().join("merged");
    let export = |extra: &[&str]| {
        let args = ["export", "--checkpoint", s(&ckpt), "--format", "merged", "--model", s(&qwen), "--out", s(&merged)];
        cli(&[&args[..], extra].concat())
    };
    let o = export(&[]);
    assert!(!o.status.success() && stderr(&o).contains(warning) && stderr(&o).contains("--force-base"));
    assert!(export(&["--force-base"]).status.success());
    let peft = dir.path().join("peft");
    let o = cli(&["export", "--checkpoint", s(&ckpt), "--format", "peft", "--out", s(&peft)]);
    assert!(o.status.success() && peft.join(metal_candle::engine::checkpoint::BASE_MODEL_FILE).exists());

    // The worker tells the chat pane, on the event that starts the reply.
    let w = Worker::spawn(Arc::new(|| {}));
    w.send(Command::LoadModel {
        path: qwen,
        device: DeviceChoice::Cpu,
        dtype: DTypeChoice::Auto,
        quantize: Default::default(),
    });
    let job = GenerateJob {
        id: 1,
        side: ChatSide::Right,
        adapter: Some(ckpt),
        messages: vec![metal_candle::engine::model::chat_template::ChatMessage::new("user", "hi")],
        sampling: SamplingParams::greedy(),
        max_new_tokens: 2,
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut sent = false;
    loop {
        assert!(Instant::now() < deadline, "no GenerationStarted");
        match w.try_recv() {
            Some(Event::ModelLoaded(_)) if !sent => {
                w.send(Command::Generate(job.clone()));
                sent = true;
            }
            Some(Event::GenerationStarted { adapter_warning, .. }) => {
                assert!(adapter_warning.unwrap().contains(warning));
                break;
            }
            Some(Event::GenerationFailed { error, .. }) => panic!("{error:?}"),
            Some(_) => {}
            None => std::thread::sleep(Duration::from_millis(5)),
        }
    }
}
