//! Preference datasets end to end on tiny-llama: both of TRL's forms read, detected, templated and masked exactly
//! as TRL 1.16 tokenizes them (tests/fixtures/preference, made by scripts/make_preference_fixtures.py), pairs
//! batched chosen-then-rejected, and the refusals (SFT on pairs, DPO on chat rows, train_on_prompt, bad rows).

mod common;

use common::{fixture, ids};
use metal_candle::engine::data::{
    collate_pairs, load_raw_dataset, prepare_dataset, DataOptions, DatasetFormat, Detection, TokenizeSpec,
};
use metal_candle::engine::model::{load_model, LoadedModel};
use metal_candle::engine::train::data_fit::require_rows_fit;
use metal_candle::engine::train::Method;
use std::path::Path;

fn tiny_llama() -> LoadedModel {
    load_model(&fixture("tiny-llama"), &candle_core::Device::Cpu, candle_core::DType::F32).unwrap()
}

fn options(max_seq_len: usize) -> DataOptions {
    DataOptions { valid_fraction: 0.0, max_seq_len, ..Default::default() }
}

/// TRL's sequence for one side: prompt then completion, cut keeping the start; the completion is trained.
fn trl_side(row: &serde_json::Value, side: &str, max_len: usize) -> (Vec<u32>, Vec<bool>) {
    let prompt = ids(&row["prompt_ids"]);
    let completion = ids(&row[side]);
    let mut all: Vec<u32> = prompt.iter().chain(&completion).copied().collect();
    let mut mask: Vec<bool> = (0..all.len()).map(|j| j >= prompt.len() && j > 0).collect();
    all.truncate(max_len);
    mask.truncate(max_len);
    (all, mask)
}

#[test]
fn both_forms_tokenize_as_trl_does() {
    let model = tiny_llama();
    let expected = common::expected("preference");
    let max_len = expected["max_length"].as_u64().unwrap() as usize;
    for form in ["standard", "conversational"] {
        let path = fixture("preference").join(format!("rows-{form}.jsonl"));
        let spec = TokenizeSpec::for_model(&model, max_len, false);
        let prepared = prepare_dataset(&path, &spec, &options(max_len)).unwrap();
        assert!(prepared.is_preference());
        assert_eq!(prepared.summary.format, DatasetFormat::Preference);
        let trl = expected["tokenized"][form].as_array().unwrap();
        let rejected = prepared.train.rejected.as_ref().unwrap();
        assert_eq!((prepared.train.examples.len(), rejected.len()), (trl.len(), trl.len()), "{form}");
        for (i, row) in trl.iter().enumerate() {
            let (chosen, mask) = trl_side(row, "chosen_ids", max_len);
            assert_eq!(prepared.train.examples[i].input_ids, chosen, "{form} row {i} chosen");
            assert_eq!(prepared.train.examples[i].target_mask, mask, "{form} row {i} chosen mask");
            let (ids, mask) = trl_side(row, "rejected_ids", max_len);
            assert_eq!(rejected[i].input_ids, ids, "{form} row {i} rejected");
            assert_eq!(rejected[i].target_mask, mask, "{form} row {i} rejected mask");
        }
        // Both sequences count, pairs are what the notes and lengths speak of.
        let s = &prepared.summary;
        let all = || prepared.train.examples.iter().chain(rejected);
        assert_eq!(s.tokens_per_epoch, all().map(|e| e.len()).sum::<usize>());
        assert_eq!(s.target_tokens_per_epoch, all().map(|e| e.target_tokens()).sum::<usize>());
        assert!(s.notes.iter().any(|n| n == &format!("{} preference pairs for training", trl.len())), "{:?}", s.notes);
        let longer: Vec<usize> =
            prepared.train.examples.iter().zip(rejected).map(|(c, r)| c.len().max(r.len())).collect();
        assert_eq!(prepared.train.lengths(), longer);
        assert_eq!(s.train.lengths, longer);
    }
}

#[test]
fn preference_files_are_detected_and_name_their_bad_rows() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("train.jsonl");
    let rows = [
        r#"{"prompt": "2+2=", "chosen": "4", "rejected": "5"}"#,
        r#"{"prompt": "3+3=", "chosen": "6", "rejected": "6"}"#,
        r#"{"prompt": [{"role": "user", "content": "hi"}], "chosen": "a", "rejected": "b"}"#,
        r#"{"prompt": "1+1=", "chosen": "2"}"#,
    ];
    std::fs::write(&path, rows.join("\n") + "\n").unwrap();
    let err = load_raw_dataset(&path, &options(64)).unwrap_err().to_string();
    assert!(err.contains("3 invalid dataset rows"), "{err}");
    for (line, what) in [(2, "are the same"), (3, "mixed forms"), (4, "missing field `rejected`")] {
        assert!(err.contains(&format!("train.jsonl:{line}: ")) && err.contains(what), "{line} {what}: {err}");
    }
    let skip = DataOptions { skip_invalid_rows: true, ..options(64) };
    let raw = load_raw_dataset(&path, &skip).unwrap();
    assert_eq!(raw.train.detection, Detection::Detected { format: DatasetFormat::Preference, row: 1 });
    assert_eq!(raw.train.rows.len(), 1);
}

#[test]
fn pairs_batch_chosen_then_rejected_and_methods_refuse_the_wrong_data() {
    let model = tiny_llama();
    let path = fixture("preference").join("rows-conversational.jsonl");
    let spec = TokenizeSpec::for_model(&model, 64, false);
    let prepared = prepare_dataset(&path, &spec, &options(64)).unwrap();
    let batch = collate_pairs(&prepared.train, &[2, 0], 7).unwrap();
    let rejected = prepared.train.rejected.as_ref().unwrap();
    let rows = [&prepared.train.examples[2], &prepared.train.examples[0], &rejected[2], &rejected[0]];
    assert_eq!(batch.batch_size, 4);
    assert_eq!(batch.seq_len, rows.iter().map(|e| e.len()).max().unwrap());
    for (r, example) in rows.iter().enumerate() {
        let row = &batch.input_ids[r * batch.seq_len..(r + 1) * batch.seq_len];
        assert_eq!(&row[..example.len()], example.input_ids.as_slice(), "row {r}");
        assert!(row[example.len()..].iter().all(|&id| id == 7), "row {r} pads");
    }
    assert_eq!(batch.target_tokens, rows.iter().map(|e| e.target_tokens()).sum::<usize>());

    let err = require_rows_fit(Method::Sft, &prepared, &path).unwrap_err().to_string();
    assert!(err.contains("preference pairs") && err.contains("--method dpo or orpo"), "{err}");
    require_rows_fit(Method::Dpo, &prepared, &path).unwrap();
    let on_prompt = TokenizeSpec::for_model(&model, 64, true);
    let err = prepare_dataset(&path, &on_prompt, &DataOptions { train_on_prompt: true, ..options(64) })
        .unwrap_err()
        .to_string();
    assert!(err.contains("train_on_prompt has no meaning for preference pairs"), "{err}");

    let chat = Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/sample-chat");
    let sft = prepare_dataset(&chat, &spec, &DataOptions { max_seq_len: 256, ..Default::default() }).unwrap();
    assert!(!sft.is_preference());
    require_rows_fit(Method::Sft, &sft, &chat).unwrap();
    let err = require_rows_fit(Method::Orpo, &sft, &chat).unwrap_err().to_string();
    assert!(err.contains("DPO and ORPO train on preference pairs") && err.contains("chat rows"), "{err}");
    assert!(collate_pairs(&sft.train, &[0], 0).is_err());
}

#[test]
fn a_prompt_that_fills_max_seq_len_drops_the_pair_and_splits_must_agree() {
    let model = tiny_llama();
    let path = fixture("preference").join("rows-conversational.jsonl");
    // Row 3's prompt (58 tokens) fills 40; TRL drops such pairs.
    let spec = TokenizeSpec::for_model(&model, 40, false);
    let prepared = prepare_dataset(&path, &spec, &options(40)).unwrap();
    assert_eq!(prepared.train.examples.len(), 5);
    assert_eq!(prepared.summary.dropped, 1);
    assert!(!prepared.train.source_lines.contains(&3));
    assert!(
        prepared.summary.notes.iter().any(|n| n.contains("1 pairs whose prompt alone fills")),
        "{:?}",
        prepared.summary.notes
    );

    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(&path, dir.path().join("train.jsonl")).unwrap();
    let chat = r#"{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}"#;
    std::fs::write(dir.path().join("valid.jsonl"), format!("{chat}\n")).unwrap();
    let err = prepare_dataset(dir.path(), &spec, &options(64)).unwrap_err().to_string();
    assert!(err.contains("valid split holds chat rows") && err.contains("preference"), "{err}");
}
