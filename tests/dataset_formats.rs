//! Datasets in the formats and file types people have (tests/fixtures/datasets/, made by
//! scripts/make_dataset_fixtures.py with pyarrow): each parquet format, a Hub-style folder of shards and a JSON
//! array tokenize exactly as their chat JSONL equivalents do (ids and masks, through tiny-llama's tokenizer and
//! chat template); ambiguous, unknown, malformed and mixed data is refused naming the file and row; column
//! mappings and named formats read what detection cannot; `metal-candle data` reports it all; and `train` runs
//! end to end on a parquet folder and resumes a mapped dataset the same way.

mod common;

use common::fixture;
use metal_candle::engine::data::{
    inspect_dataset_with, load_raw_dataset, prepare_dataset, DataOptions, DatasetFormat, Detection, FormatChoice,
    ReadOptions, SplitName, TokenizeSpec,
};
use metal_candle::engine::model::{load_model, LoadedModel};
use std::path::{Path, PathBuf};
use std::process::Command;

fn datasets(name: &str) -> PathBuf {
    fixture("datasets").join(name)
}

fn tiny_llama() -> LoadedModel {
    load_model(&fixture("tiny-llama"), &candle_core::Device::Cpu, candle_core::DType::F32).unwrap()
}

/// Every row in order, no held-out validation split.
fn options(read: ReadOptions) -> DataOptions {
    DataOptions { valid_fraction: 0.0, max_seq_len: 256, read, ..Default::default() }
}

fn tokenized(model: &LoadedModel, path: &Path, read: ReadOptions) -> Vec<(Vec<u32>, Vec<bool>)> {
    let spec = TokenizeSpec::for_model(model, 256, false);
    let prepared = prepare_dataset(path, &spec, &options(read)).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    prepared.train.examples.into_iter().map(|e| (e.input_ids, e.target_mask)).collect()
}

fn error_of(path: &Path, read: ReadOptions) -> String {
    match load_raw_dataset(path, &options(read)) {
        Ok(_) => panic!("{} was read", path.display()),
        Err(e) => e.to_string(),
    }
}

fn mapping(columns: &str) -> ReadOptions {
    ReadOptions { columns: columns.parse().unwrap(), ..Default::default() }
}

#[test]
fn every_format_and_file_type_tokenizes_like_its_chat_jsonl() {
    let model = tiny_llama();
    let cases = [
        ("chat.parquet", "chat.jsonl", DatasetFormat::Chat),
        ("sharegpt.parquet", "sharegpt.jsonl", DatasetFormat::ShareGpt),
        ("alpaca.parquet", "alpaca.jsonl", DatasetFormat::Alpaca),
        ("completions.parquet", "completions.jsonl", DatasetFormat::Completions),
        ("text.parquet", "text.jsonl", DatasetFormat::Text),
        ("array.json", "alpaca.jsonl", DatasetFormat::Alpaca),
        ("hub", "hub-train.jsonl", DatasetFormat::Chat),
    ];
    for (file, equivalent, format) in cases {
        let path = datasets(file);
        let raw = load_raw_dataset(&path, &options(ReadOptions::default())).unwrap();
        assert_eq!(raw.train.format, Some(format), "{file}");
        assert_eq!(raw.train.detection, Detection::Detected { format, row: 1 }, "{file}");
        let ours = tokenized(&model, &path, ReadOptions::default());
        let expected = tokenized(&model, &datasets("equivalent").join(equivalent), ReadOptions::default());
        assert_eq!(ours.len(), expected.len(), "{file}");
        assert!(ours == expected, "{file} tokenizes differently from equivalent/{equivalent}");
        assert!(ours.iter().all(|(_, mask)| mask.iter().any(|&t| t)), "{file}: every row trains something");
    }
}

#[test]
fn a_hub_folder_concatenates_shards_in_name_order_and_keeps_its_test_split() {
    let hub = datasets("hub");
    let raw = load_raw_dataset(&hub, &options(ReadOptions::default())).unwrap();
    let files: Vec<String> =
        raw.train.files.iter().map(|f| f.path.strip_prefix(&hub).unwrap().display().to_string()).collect();
    assert_eq!(files, ["data/train-00000-of-00002.parquet", "data/train-00001-of-00002.parquet"]);
    let rows: Vec<(usize, usize)> = raw.train.rows.iter().map(|r| (r.file, r.line)).collect();
    assert_eq!(rows, [(0, 1), (0, 2), (1, 1), (1, 2)], "rows keep their own file and row");
    let test = raw.test.as_ref().unwrap();
    assert_eq!((test.rows.len(), test.path.ends_with("data/test-00000-of-00001.parquet")), (1, true));
    assert!(raw.valid.is_none());
    assert!(
        raw.notes.iter().any(|n| n.contains("train split: chat (detected from row 1), 2 files")),
        "{:?}",
        raw.notes
    );
}

#[test]
fn bad_data_is_refused_naming_the_file_and_the_row() {
    let malformed = error_of(&datasets("malformed.parquet"), ReadOptions::default());
    assert!(malformed.contains("malformed.parquet: row 2: `completion` is empty"), "{malformed}");

    let ambiguous = error_of(&datasets("ambiguous.jsonl"), ReadOptions::default());
    assert!(ambiguous.contains("ambiguous.jsonl:1: ambiguous format"), "{ambiguous}");
    assert!(
        ambiguous.contains("alpaca (`instruction`/`output`) and completions (`prompt`/`completion`)"),
        "{ambiguous}"
    );
    assert!(
        ambiguous.contains("columns: completion, input, instruction, output, prompt")
            && ambiguous.contains("--format alpaca|completions"),
        "{ambiguous}"
    );
    // tatsu-lab/alpaca's shape: a rendered `text` beside the Alpaca columns reads as Alpaca.
    let raw = load_raw_dataset(&datasets("alpaca_text.jsonl"), &options(ReadOptions::default())).unwrap();
    assert_eq!(
        (raw.train.detection, raw.train.rows.len()),
        (Detection::Detected { format: DatasetFormat::Alpaca, row: 1 }, 3)
    );
    let as_alpaca = ReadOptions { format: FormatChoice::Alpaca, ..Default::default() };
    let raw = load_raw_dataset(&datasets("ambiguous.jsonl"), &options(as_alpaca)).unwrap();
    assert_eq!((raw.train.detection, raw.train.rows.len()), (Detection::Chosen { format: DatasetFormat::Alpaca }, 3));

    // gsm8k's columns: GRPO prompts unless mapped to another format's fields.
    let raw = load_raw_dataset(&datasets("qa.jsonl"), &options(ReadOptions::default())).unwrap();
    assert_eq!(raw.train.detection, Detection::Detected { format: DatasetFormat::Prompts, row: 1 });
    let typo = error_of(&datasets("qa.jsonl"), mapping("prompt=questoin,completion=answer"));
    assert!(typo.contains("prompt=questoin names no column of this file; its columns: answer, question"), "{typo}");
    let wrong_field =
        error_of(&datasets("qa.jsonl"), ReadOptions { format: FormatChoice::Text, ..mapping("prompt=question") });
    assert!(wrong_field.contains("`prompt` is not a field of the text format; map one of: text"), "{wrong_field}");

    let mixed = error_of(&datasets("mixed"), ReadOptions::default());
    assert!(
        mixed.contains("train split's files are in different formats") && mixed.contains("train-b.parquet is alpaca"),
        "{mixed}"
    );

    // tiny-llama's template refuses a `tool` turn: the row fails with the template's own words and its line.
    let model = tiny_llama();
    let spec = TokenizeSpec::for_model(&model, 256, false);
    let err =
        prepare_dataset(&datasets("tools.jsonl"), &spec, &options(ReadOptions::default())).unwrap_err().to_string();
    assert!(err.contains("tools.jsonl:1: chat template error") && err.contains("Invalid role: tool"), "{err}");
}

#[test]
fn mapped_columns_read_like_the_format_they_name() {
    let model = tiny_llama();
    let read = mapping("prompt=question,completion=answer");
    let raw = load_raw_dataset(&datasets("qa.jsonl"), &options(read.clone())).unwrap();
    assert_eq!(raw.train.format, Some(DatasetFormat::Completions));
    let ours = tokenized(&model, &datasets("qa.jsonl"), read);
    assert!(ours == tokenized(&model, &datasets("equivalent/completions.jsonl"), ReadOptions::default()));
}

#[test]
fn the_report_shows_formats_files_columns_and_the_mapping() {
    let hub = datasets("hub");
    let report = inspect_dataset_with(&hub, &ReadOptions::default(), None, 256, false, 0).unwrap();
    let splits: Vec<(SplitName, usize, usize)> =
        report.splits.iter().map(|s| (s.split, s.files.len(), s.rows)).collect();
    assert_eq!(splits, [(SplitName::Train, 2, 4), (SplitName::Test, 1, 1)]);
    assert_eq!(report.splits[0].detection.describe(report.splits[0].unit), "chat (detected from row 1)");
    assert_eq!(report.splits[0].columns, ["messages"]);

    let ambiguous =
        inspect_dataset_with(&datasets("ambiguous.jsonl"), &ReadOptions::default(), None, 256, false, 0).unwrap();
    let split = ambiguous.needs_choice().unwrap();
    assert_eq!(split.detection.describe(split.unit), "ambiguous: alpaca or completions (line 1)");
    assert!(split.error.as_deref().is_some_and(|e| e.contains("--format alpaca|completions")));

    let out = Command::new(env!("CARGO_BIN_EXE_metal-candle"))
        .args(["data", "--json", "--columns", "prompt=question,completion=answer", "--data"])
        .arg(datasets("qa.jsonl"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        json["read"],
        serde_json::json!({"format": "auto", "columns": {"prompt": "question", "completion": "answer"}})
    );
    assert_eq!(
        json["splits"][0]["detection"],
        serde_json::json!({"status": "detected", "format": "completions", "row": 1})
    );
    assert_eq!(json["splits"][0]["columns"], serde_json::json!(["answer", "question"]));

    let out = Command::new(env!("CARGO_BIN_EXE_metal-candle")).args(["data", "--data"]).arg(&hub).output().unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("train  chat (detected from row 1): 4 rows, 0 problems"), "{table}");
    assert!(table.contains("files: data/train-00000-of-00002.parquet, data/train-00001-of-00002.parquet"), "{table}");
    let out = Command::new(env!("CARGO_BIN_EXE_metal-candle"))
        .args(["data", "--columns", "prompt=nope", "--data"])
        .arg(datasets("qa.jsonl"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("prompt=nope") && err.contains("its columns: answer, question"),
        "{err}"
    );
}

fn train(args: &[&str], data: &Path, out: &Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_metal-candle"))
        .args(["train", "--model"])
        .arg(fixture("tiny-llama"))
        .arg("--data")
        .arg(data)
        .arg("--out")
        .arg(out)
        .args(["--device", "cpu", "--seq-len", "64", "--batch-size", "2", "--rank", "2", "--val-every", "0"])
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn train_runs_on_a_parquet_folder_and_resumes_a_mapped_dataset_the_same_way() {
    let dir = tempfile::tempdir().unwrap();
    let out = train(&["--name", "hub", "--iters", "2"], &datasets("hub"), dir.path());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(dir.path().join("hub/checkpoint-2").exists());

    let out = train(
        &["--name", "qa", "--iters", "2", "--save-every", "1", "--columns", "prompt=question,completion=answer"],
        &datasets("qa.jsonl"),
        dir.path(),
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let run_json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("qa/run.json")).unwrap()).unwrap();
    assert_eq!(run_json["config"]["data_format"], "auto");
    assert_eq!(run_json["config"]["data_columns"], serde_json::json!({"prompt": "question", "completion": "answer"}));
    // The resume names neither the data nor the mapping: both come from run.json.
    let resumed = Command::new(env!("CARGO_BIN_EXE_metal-candle"))
        .args(["train", "--device", "cpu", "--iters", "3", "--resume"])
        .arg(dir.path().join("qa/checkpoint-2"))
        .output()
        .unwrap();
    assert!(resumed.status.success(), "{}", String::from_utf8_lossy(&resumed.stderr));
    assert!(dir.path().join("qa/checkpoint-3").exists());
}
