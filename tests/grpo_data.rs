//! GRPO prompt data end to end: every form read and detected (TRL's prompt-only rows, messages with an answer,
//! gsm8k's and MATH's columns), bad rows reported by file and line, prompts tokenized exactly as TRL 1.16's
//! `GRPOTrainer._tokenize_prompts` does (tests/fixtures/grpo-prompts, made by
//! scripts/make_grpo_prompt_fixtures.py) and as the chat pane prompts the real SmolLM2, prompts that do not fit
//! dropped and named, and the method/data refusals both ways.

mod common;

use common::{fixture, ids};
use metal_candle::engine::data::{
    chat_prompt_ids, load_raw_dataset, prepare_dataset, DataOptions, DatasetFormat, Detection, PreferenceTurns,
    PromptRow, Row, TokenizeSpec,
};
use metal_candle::engine::model::chat_template::ChatMessage;
use metal_candle::engine::model::{load_model, LoadedModel};
use metal_candle::engine::train::data_fit::require_rows_fit;
use metal_candle::engine::train::Method;
use std::path::{Path, PathBuf};

fn tiny_llama() -> LoadedModel {
    load_model(&fixture("tiny-llama"), &candle_core::Device::Cpu, candle_core::DType::F32).unwrap()
}

fn options(max_seq_len: usize) -> DataOptions {
    DataOptions { valid_fraction: 0.0, max_seq_len, ..Default::default() }
}

fn write(dir: &Path, name: &str, rows: &[serde_json::Value]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, rows.iter().map(|r| format!("{r}\n")).collect::<String>()).unwrap();
    path
}

fn prompt_rows(path: &Path) -> Vec<PromptRow> {
    let raw = load_raw_dataset(path, &options(512)).unwrap();
    assert_eq!(raw.train.format, Some(DatasetFormat::Prompts), "{}", path.display());
    raw.train
        .rows
        .into_iter()
        .map(|r| match r.row {
            Row::Prompt(p) => p,
            other => panic!("not a prompt: {other:?}"),
        })
        .collect()
}

fn user(text: &str) -> PreferenceTurns {
    PreferenceTurns::Messages(vec![ChatMessage::new("user", text)])
}

#[test]
fn every_form_is_read_and_detected_as_prompts() {
    let dir = tempfile::tempdir().unwrap();
    let u = |t: &str| serde_json::json!([{"role": "user", "content": t}]);
    let cases = [
        (serde_json::json!({"prompt": "2+2=", "answer": "4"}), PreferenceTurns::Text("2+2=".into()), Some("4")),
        (serde_json::json!({"prompt": u("2+2?"), "answer": 4}), user("2+2?"), Some("4")),
        (serde_json::json!({"messages": u("2+2?"), "answer": "4"}), user("2+2?"), Some("4")),
        (serde_json::json!({"question": "2+2?", "answer": "2+2=4\n#### 4"}), user("2+2?"), Some("2+2=4\n#### 4")),
        (serde_json::json!({"problem": "2+2?", "solution": "$\\boxed{4}$"}), user("2+2?"), Some("$\\boxed{4}$")),
        (serde_json::json!({"prompt": "Write a haiku."}), PreferenceTurns::Text("Write a haiku.".into()), None),
    ];
    for (i, (row, prompt, answer)) in cases.into_iter().enumerate() {
        let path = write(dir.path(), &format!("form{i}.jsonl"), &[row.clone()]);
        let raw = load_raw_dataset(&path, &options(512)).unwrap();
        assert_eq!(raw.train.detection, Detection::Detected { format: DatasetFormat::Prompts, row: 1 }, "{row}");
        let rows = prompt_rows(&path);
        assert_eq!((&rows[0].prompt, rows[0].answer.as_deref()), (&prompt, answer), "{row}");
    }
    // A conversation without an answer is chat; in a prompts file, a prompt without one is a prompt.
    let chat = write(
        dir.path(),
        "chat.jsonl",
        &[serde_json::json!({"messages": [
        {"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]})],
    );
    assert_eq!(load_raw_dataset(&chat, &options(512)).unwrap().train.format, Some(DatasetFormat::Chat));
    let mixed = write(
        dir.path(),
        "optional.jsonl",
        &[serde_json::json!({"messages": u("1+1?")}), serde_json::json!({"messages": u("2+2?"), "answer": "4"})],
    );
    let rows = prompt_rows(&mixed);
    assert_eq!((rows.len(), rows[0].answer.as_ref(), rows[1].answer.as_deref()), (2, None, Some("4")));
    // The sample dataset: 400 + 48 user-turn prompts of sums.
    let sample = Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/sample-grpo");
    let raw = load_raw_dataset(&sample, &DataOptions::default()).unwrap();
    assert_eq!((raw.train.rows.len(), raw.valid.map(|v| v.rows.len())), (400, Some(48)));
    match &raw.train.rows[0].row {
        Row::Prompt(p) => assert!(p.prompt_text().ends_with("Reply with the number only.") && p.answer.is_some()),
        other => panic!("not a prompt: {other:?}"),
    }
}

#[test]
fn bad_rows_are_reported_by_line() {
    let dir = tempfile::tempdir().unwrap();
    let rows = [
        serde_json::json!({"question": "1+1?", "answer": "2"}),
        serde_json::json!({"question": "2+2?", "answer": ""}),
        serde_json::json!({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "4"}],
            "answer": "4"}),
        serde_json::json!({"question": "3+3?", "answer": {"value": 6}}),
    ];
    let path = write(dir.path(), "train.jsonl", &rows);
    let err = load_raw_dataset(&path, &options(512)).unwrap_err().to_string();
    assert!(err.contains("3 invalid dataset rows"), "{err}");
    assert!(err.contains("train.jsonl:2: `answer` is empty"), "{err}");
    assert!(err.contains("train.jsonl:3: messages[1] (assistant) ends the prompt"), "{err}");
    assert!(err.contains("train.jsonl:4: `answer` must be a string or a number, found an object"), "{err}");
    let skipped = load_raw_dataset(&path, &DataOptions { skip_invalid_rows: true, ..options(512) }).unwrap();
    assert_eq!((skipped.train.rows.len(), skipped.problems.len()), (1, 3));
}

#[test]
fn prompts_tokenize_as_trl_does() {
    let model = tiny_llama();
    let expected = common::expected("grpo-prompts");
    for form in ["standard", "conversational"] {
        let path = fixture("grpo-prompts").join(format!("rows-{form}.jsonl"));
        let spec = TokenizeSpec::for_model(&model, 256, false);
        let prepared = prepare_dataset(&path, &spec, &options(256)).unwrap();
        assert!(prepared.is_prompts() && !prepared.is_preference(), "{form}");
        let trl = expected[form].as_array().unwrap();
        let prompts = prepared.train.prompts.as_ref().unwrap();
        assert_eq!((prepared.train.examples.len(), prompts.len()), (trl.len(), trl.len()), "{form}");
        for (i, (example, trl_ids)) in prepared.train.examples.iter().zip(trl).enumerate() {
            assert_eq!(example.input_ids, ids(trl_ids), "{form} row {i}");
            assert!(example.target_mask.iter().all(|t| !t) && example.target_mask.len() == example.len());
        }
        assert_eq!(prompts[1].answer.as_deref(), Some("72"), "a numeric answer keeps its text");
        assert_eq!(prepared.summary.target_tokens_per_epoch, 0);
        assert!(prepared.summary.notes.iter().any(|n| n == "2 prompts for training (2 with an answer)"), "{form}");
    }
}

#[test]
fn smollm2_prompts_end_with_the_generation_prompt_as_the_chat_pane_asks() {
    let model = load_model(&common::smollm2_path(), &candle_core::Device::Cpu, candle_core::DType::F32).unwrap();
    let sample = Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/sample-grpo");
    let spec = TokenizeSpec::for_model(&model, 128, false);
    let prepared = prepare_dataset(&sample, &spec, &DataOptions { max_seq_len: 128, ..Default::default() }).unwrap();
    let (train, valid) = (&prepared.train, prepared.valid.as_ref().unwrap());
    assert_eq!((train.examples.len(), valid.examples.len()), (400, 48));
    for (example, row) in train.examples.iter().zip(train.prompts.as_ref().unwrap()).take(20) {
        let PreferenceTurns::Messages(messages) = &row.prompt else { panic!("messages expected") };
        assert_eq!(example.input_ids, chat_prompt_ids(&model, messages).unwrap());
        let rendered = model.render_chat(messages, true).unwrap();
        assert_eq!(model.tokenizer.decode(&example.input_ids, false).unwrap(), rendered);
        assert!(rendered.ends_with("<|im_start|>assistant\n"), "{rendered:?}");
        assert!(rendered.contains(&row.prompt_text()));
    }
    // Prompts that do not fit are dropped whole and named.
    // (SmolLM2's template adds its default system turn: these prompts are 45 to 47 tokens.)
    let spec = TokenizeSpec::for_model(&model, 46, false);
    let lengths: Vec<usize> = train.examples.iter().map(|e| e.len()).collect();
    let too_long = lengths.iter().filter(|&&l| l > 46).count();
    assert!(too_long > 0 && too_long < 400, "{lengths:?}");
    let cut = prepare_dataset(&sample, &spec, &DataOptions { max_seq_len: 46, ..Default::default() }).unwrap();
    assert_eq!(cut.train.examples.len(), 400 - too_long);
    assert!(cut.train.examples.iter().all(|e| e.len() <= 46 && !e.truncated));
    assert_eq!(cut.summary.train.dropped, too_long);
    let note = cut.summary.notes.iter().find(|n| n.contains("longer than max_seq_len 46")).unwrap();
    assert!(note.contains("were dropped: ") && note.contains("train.jsonl:") && note.contains("tokens)"), "{note}");
    // The dataset report counts the same prompts as dropped, and none at a length they fit.
    let report = |len| metal_candle::engine::data::inspect_dataset(&sample, Some(&model), len, false, 1).unwrap();
    let stats = report(46).tokens.unwrap();
    assert_eq!((stats.dropped, stats.truncated, stats.target_tokens), (too_long, 0, 0));
    let fits = report(128);
    assert_eq!((fits.tokens.as_ref().unwrap().dropped, fits.rows_word()), (0, "prompts"));
    assert!(fits.preview[0].pieces.iter().all(|(_, trained)| !trained), "a prompt previews as masked");
    let none = prepare_dataset(&sample, &spec, &DataOptions { max_seq_len: 8, ..Default::default() });
    let err = none.unwrap_err().to_string();
    assert!(err.contains("no training prompts left") && err.contains("400 longer than max_seq_len 8"), "{err}");
}

#[test]
fn methods_and_data_must_fit_both_ways() {
    let model = tiny_llama();
    let spec = TokenizeSpec::for_model(&model, 256, false);
    let prompts_path = fixture("grpo-prompts").join("rows-conversational.jsonl");
    let prompts = prepare_dataset(&prompts_path, &spec, &options(256)).unwrap();
    require_rows_fit(Method::Grpo, &prompts, &prompts_path).unwrap();
    for method in [Method::Sft, Method::Dpo, Method::Orpo] {
        let err = require_rows_fit(method, &prompts, &prompts_path).unwrap_err().to_string();
        assert!(err.contains("prompts for GRPO") && err.contains("train with --method grpo"), "{method:?}: {err}");
    }
    let chat = Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/sample-chat");
    let sft = prepare_dataset(&chat, &spec, &DataOptions { max_seq_len: 256, ..Default::default() }).unwrap();
    let err = require_rows_fit(Method::Grpo, &sft, &chat).unwrap_err().to_string();
    assert!(err.contains("holds chat rows; GRPO needs prompts with answers: {\"prompt\", \"answer\"} rows"), "{err}");
    let pairs_path = fixture("preference").join("rows-conversational.jsonl");
    let pairs = prepare_dataset(&pairs_path, &spec, &options(256)).unwrap();
    let err = require_rows_fit(Method::Grpo, &pairs, &pairs_path).unwrap_err().to_string();
    assert!(err.contains("holds preference pairs") && err.contains("GRPO needs prompts with answers"), "{err}");

    // Prompts are never trained on: train_on_prompt is refused, and every split holds prompts or none does.
    let on_prompt = TokenizeSpec::for_model(&model, 256, true);
    let err = prepare_dataset(&prompts_path, &on_prompt, &DataOptions { train_on_prompt: true, ..options(256) })
        .unwrap_err()
        .to_string();
    assert!(err.contains("train_on_prompt has no meaning for GRPO prompts"), "{err}");
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(&prompts_path, dir.path().join("train.jsonl")).unwrap();
    std::fs::copy(chat.join("valid.jsonl"), dir.path().join("valid.jsonl")).unwrap();
    let err = prepare_dataset(dir.path(), &spec, &options(256)).unwrap_err().to_string();
    assert!(
        err.contains("the valid split holds chat rows") && err.contains("every split must hold GRPO prompts"),
        "{err}"
    );
}

#[test]
fn the_data_command_counts_prompts() {
    let sample = Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/sample-grpo");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_metal-candle"))
        .args(["data", "--data"])
        .arg(&sample)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("train  prompts (detected from line 1): 400 prompts, 0 problems"), "{stdout}");
    assert!(stdout.contains("valid  prompts (detected from line 1): 48 prompts"), "{stdout}");
}
