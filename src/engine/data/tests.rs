//! Tests of dataset loading, splitting, tokenizing and summaries.

use super::tokenize::tests::{byte_tokenizer, CHATML};
use super::*;
use crate::engine::model::chat_template::{ChatMessage, ChatTemplate};
use crate::engine::model::tokenizer::TextTokenizer;

fn chat_line(q: &str, a: &str) -> String {
    serde_json::json!({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}).to_string()
}

fn write(dir: &Path, name: &str, lines: &[String]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    path
}

fn rows(n: usize) -> Vec<String> {
    (0..n).map(|i| chat_line(&format!("question {i}"), &format!("answer {i}"))).collect()
}

#[test]
fn bad_rows_fail_the_load_with_line_numbers_and_a_count() {
    let dir = tempfile::tempdir().unwrap();
    let mut lines = rows(3);
    for i in 0..12 {
        lines.push(format!("{{\"messages\": {i}}}"));
    }
    lines.insert(1, "{oops".into());
    let path = write(dir.path(), "data.jsonl", &lines);
    let err = load_raw_dataset(&path, &DataOptions::default()).unwrap_err().to_string();
    assert!(err.starts_with("13 invalid dataset rows:"), "{err}");
    assert!(err.contains("data.jsonl:2: invalid JSON at column 2"), "{err}");
    assert!(err.contains("data.jsonl:5: `messages` must be a list"), "{err}");
    assert!(err.contains("... and 3 more"), "{err}");
    assert!(err.contains("skip_invalid_rows"), "{err}");

    let one = write(dir.path(), "one.jsonl", &[chat_line("q", "a"), "{\"messages\": []}".into()]);
    match load_raw_dataset(&one, &DataOptions::default()) {
        Err(Error::Dataset { line, message, .. }) => {
            assert_eq!((line, message.contains("empty conversation")), (2, true))
        }
        other => panic!("expected a Dataset error, got {other:?}"),
    }
}

#[test]
fn skip_invalid_rows_skips_and_counts_them() {
    let dir = tempfile::tempdir().unwrap();
    let mut lines = rows(4);
    lines.push("{\"messages\": [{\"role\": \"user\", \"content\": \"no reply\"}]}".into());
    lines.push("not json".into());
    let path = write(dir.path(), "data.jsonl", &lines);
    let options = DataOptions { skip_invalid_rows: true, ..DataOptions::default() };
    let raw = load_raw_dataset(&path, &options).unwrap();
    assert_eq!(raw.problems.len(), 2);
    assert_eq!(raw.train.skipped_rows, 2);
    assert_eq!(raw.train.rows.len() + raw.valid.as_ref().unwrap().rows.len(), 4);

    let tok = byte_tokenizer();
    let template = ChatTemplate::new(CHATML.into(), None, None).unwrap();
    let spec = tokenize_spec(&tok, &template);
    let prepared = prepare_dataset(&path, &spec, &options).unwrap();
    let s = &prepared.summary;
    assert_eq!((s.skipped_rows, s.total_problems, s.problems.len()), (2, 2, 2));
    assert_eq!(s.problems[0].line, 5);
    assert!(s.notes.iter().any(|n| n.contains("skipped 2 invalid rows")), "{:?}", s.notes);
    let json = serde_json::to_string(s).unwrap();
    assert!(json.contains("\"format\":\"chat\""), "{json}");
}

fn tokenize_spec<'a>(tok: &'a TextTokenizer, template: &'a ChatTemplate) -> TokenizeSpec<'a> {
    TokenizeSpec {
        tokenizer: tok,
        chat_template: Some(template),
        eos_token_id: tok.token_to_id("<|im_end|>"),
        max_seq_len: 2048,
        train_on_prompt: false,
    }
}

#[test]
fn empty_datasets_are_refused_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "empty.jsonl", &["".into(), "   ".into()]);
    let err = load_raw_dataset(&path, &DataOptions::default()).unwrap_err().to_string();
    assert!(err.contains("the dataset is empty"), "{err}");
    let bad = write(dir.path(), "bad.jsonl", &["[]".into()]);
    let options = DataOptions { skip_invalid_rows: true, ..DataOptions::default() };
    let err = load_raw_dataset(&bad, &options).unwrap_err().to_string();
    assert!(err.contains("all 1 rows are invalid"), "{err}");
    let missing = load_raw_dataset(&dir.path().join("nope"), &options).unwrap_err().to_string();
    assert!(missing.contains("nope"), "{missing}");
    let folder = dir.path().join("folder");
    std::fs::create_dir(&folder).unwrap();
    let err = load_raw_dataset(&folder, &options).unwrap_err().to_string();
    assert!(err.contains("train.jsonl"), "{err}");
}

#[test]
fn a_folder_with_train_valid_and_test_uses_them() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "train.jsonl", &rows(6));
    write(dir.path(), "valid.jsonl", &rows(2));
    write(dir.path(), "test.jsonl", &["{\"prompt\": \"p\", \"completion\": \"c\"}".into()]);
    let raw = load_raw_dataset(dir.path(), &DataOptions::default()).unwrap();
    assert_eq!(raw.train.rows.len(), 6);
    let valid = raw.valid.as_ref().unwrap();
    assert_eq!((valid.rows.len(), valid.carved_from_train), (2, false));
    assert!(valid.path.ends_with("valid.jsonl"));
    assert_eq!(raw.test.as_ref().unwrap().format, Some(DatasetFormat::Completions));

    let tok = byte_tokenizer();
    let template = ChatTemplate::new(CHATML.into(), None, None).unwrap();
    let prepared = prepare_dataset(dir.path(), &tokenize_spec(&tok, &template), &DataOptions::default()).unwrap();
    let s = &prepared.summary;
    assert_eq!((s.train.examples, s.valid.as_ref().unwrap().examples, s.test.as_ref().unwrap().examples), (6, 2, 1));
    assert_eq!(s.tokens_per_epoch, prepared.train.lengths().iter().sum::<usize>());
    assert!(s.target_tokens_per_epoch > 0 && s.target_tokens_per_epoch < s.tokens_per_epoch);
    assert_eq!(prepared.train.source_lines, vec![1, 2, 3, 4, 5, 6]);
}

#[test]
fn without_valid_jsonl_a_seeded_validation_split_is_held_out() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "data.jsonl", &rows(25));
    let raw = load_raw_dataset(&path, &DataOptions::default()).unwrap();
    let valid = raw.valid.as_ref().unwrap();
    assert!(valid.carved_from_train);
    assert_eq!((raw.train.rows.len(), valid.rows.len()), (22, 3));
    assert!(raw.notes.iter().any(|n| n.contains("held out 3 of 25 rows")), "{:?}", raw.notes);
    let lines = |s: &RawSplit| s.rows.iter().map(|r| r.line).collect::<Vec<_>>();
    let again = load_raw_dataset(&path, &DataOptions::default()).unwrap();
    assert_eq!(lines(valid), lines(again.valid.as_ref().unwrap()), "same seed, same hold-out");
    let other = load_raw_dataset(&path, &DataOptions { seed: 9, ..DataOptions::default() }).unwrap();
    assert_ne!(lines(valid), lines(other.valid.as_ref().unwrap()));

    let two = write(dir.path(), "two.jsonl", &rows(2));
    let raw = load_raw_dataset(&two, &DataOptions::default()).unwrap();
    assert_eq!((raw.train.rows.len(), raw.valid.unwrap().rows.len()), (1, 1));
    let one = write(dir.path(), "one.jsonl", &rows(1));
    let raw = load_raw_dataset(&one, &DataOptions::default()).unwrap();
    assert!(raw.valid.is_none());
    assert!(raw.notes[0].contains("only one training row"), "{:?}", raw.notes);
}

#[test]
fn truncated_and_dropped_rows_are_counted() {
    let dir = tempfile::tempdir().unwrap();
    let long_answer = "x".repeat(200);
    let lines =
        vec![chat_line("short", "ok"), chat_line("q", &long_answer), chat_line(&"long question ".repeat(20), "a")];
    let path = write(dir.path(), "train.jsonl", &lines);
    let tok = byte_tokenizer();
    let template = ChatTemplate::new(CHATML.into(), None, None).unwrap();
    let options = DataOptions { max_seq_len: 100, valid_fraction: 0.0, ..DataOptions::default() };
    let prepared = prepare_dataset(&path, &tokenize_spec(&tok, &template), &options).unwrap();
    let s = &prepared.summary;
    assert_eq!((s.truncated, s.dropped, s.train.examples), (2, 1, 2));
    assert!(prepared.train.examples[1].truncated);
    assert_eq!(prepared.train.examples[1].len(), 100);
    assert_eq!(prepared.train.source_lines, vec![1, 2]);
    assert!(s.valid.is_none());
    let hist = s.length_histogram();
    assert_eq!(hist.bins.iter().map(|b| b.1).sum::<usize>(), 2);
    assert_eq!(hist.max_seq_len, 100);
    assert!(hist.bins.last().unwrap().0 <= 100 && hist.bins.last().unwrap().0 + hist.bin_width > 100);
}

/// The sample dataset through a real loaded model (the tiny-llama fixture): `TokenizeSpec::for_model`,
/// folder layout, every example ending in a trained `<|im_end|>`, batches that collate.
#[test]
fn sample_chat_dataset_with_a_loaded_model() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let (model_dir, data_dir) = (root.join("tests/fixtures/tiny-llama"), root.join("assets/sample-chat"));
    if !model_dir.join("model.safetensors").exists() || !data_dir.join("train.jsonl").exists() {
        eprintln!("skipped: tests/fixtures/tiny-llama or assets/sample-chat is absent");
        return;
    }
    let model =
        crate::engine::model::load_model(&model_dir, &candle_core::Device::Cpu, candle_core::DType::F32).unwrap();
    let spec = TokenizeSpec::for_model(&model, 512, false);
    let prepared = prepare_dataset(&data_dir, &spec, &DataOptions::default()).unwrap();
    let s = &prepared.summary;
    assert_eq!((s.format, s.train.rows, s.valid.as_ref().map(|v| v.rows)), (DatasetFormat::Chat, 135, Some(17)));
    assert_eq!((s.truncated, s.dropped, s.skipped_rows), (0, 0, 0));
    let im_end = model.tokenizer.token_to_id("<|im_end|>").unwrap();
    for e in &prepared.train.examples {
        let last_trained = e.target_mask.iter().rposition(|&t| t).unwrap();
        assert_eq!(e.input_ids[last_trained], im_end);
    }
    let plan =
        BatchPlan::new(prepared.train.lengths(), BatchOptions { batch_size: 8, ..BatchOptions::default() }).unwrap();
    let total: usize =
        plan.iter().map(|b| collate(&prepared.train.examples, &b.indices, 0).unwrap().target_tokens).sum();
    assert_eq!(total, s.target_tokens_per_epoch);
}

/// The real SmolLM2 chat template and tokenizer: `$METAL_CANDLE_SMOLLM2`, else the GGUF that
/// `scripts/fetch_smollm2.sh` puts in models/smollm2/.
#[test]
fn smollm2_masks_both_replies() {
    let path = std::env::var("METAL_CANDLE_SMOLLM2").map(PathBuf::from).unwrap_or_else(|_| {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("models/smollm2/SmolLM2-135M-Instruct-Q4_1.gguf")
    });
    if !path.exists() {
        eprintln!("skipped: {} is absent (run scripts/fetch_smollm2.sh)", path.display());
        return;
    }
    let model = crate::engine::model::load_model(&path, &candle_core::Device::Cpu, candle_core::DType::F32).unwrap();
    let spec = TokenizeSpec::for_model(&model, 512, false);
    let row = Row::Chat(
        vec![
            ChatMessage::new("user", "Capital of France?"),
            ChatMessage::new("assistant", "Paris."),
            ChatMessage::new("user", "And of Italy?"),
            ChatMessage::new("assistant", "Rome."),
        ]
        .into(),
    );
    let pieces = preview_row(&row, &spec).unwrap();
    let trained: String = pieces.iter().filter(|(_, t)| *t).map(|(p, _)| p.as_str()).collect();
    println!("{pieces:?}");
    assert_eq!(trained, "Paris.<|im_end|>Rome.<|im_end|>");
}

#[test]
fn histogram_bins_cover_all_lengths() {
    let lengths = [3, 50, 51, 99, 700];
    let h = length_histogram(&lengths, 512);
    assert_eq!(h.bins.iter().map(|b| b.1).sum::<usize>(), lengths.len());
    assert_eq!(h.bin_width, 20);
    assert!(h.bins.iter().any(|&(start, _)| start == 500), "512 falls in the bin starting at 500");
    assert_eq!(length_histogram(&[], 5).bins.iter().map(|b| b.1).sum::<usize>(), 0);
    assert_eq!(length_histogram(&[7, 7], 5).bins.last(), Some(&(7, 2)));
}
