//! Tests of the studio app's preferences and drop handling.

use super::*;

#[test]
fn prefs_round_trip_and_tolerate_unknown_or_missing_fields() {
    let mut p = Prefs::default();
    p.recent_models.push("/m/x.gguf".into());
    p.train.lora.rank = 32;
    let json = serde_json::to_string(&p).unwrap();
    let back: Prefs = serde_json::from_str(&json).unwrap();
    assert_eq!(back, p);
    let partial: Prefs = serde_json::from_str(r#"{"smoothing": 0.9, "something_new": 1}"#).unwrap();
    assert_eq!(partial.smoothing, 0.9);
    assert_eq!(partial.train, studio_train_defaults());
}

#[test]
fn pages_parse_from_names() {
    assert_eq!(Page::from_name("chat"), Some(Page::Chat));
    assert_eq!(Page::from_name("rank"), Some(Page::Ranks));
    assert_eq!(Page::from_name("LoRA"), Some(Page::Settings));
    assert_eq!(Page::from_name("checkpoints"), Some(Page::Checkpoints));
    assert_eq!(Page::from_name("nope"), None);
}

#[test]
fn drops_are_classified() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("train.jsonl"), "").unwrap();
    assert_eq!(classify_drop(dir.path()), Some(Dropped::Dataset));
    assert_eq!(classify_drop(Path::new("/x/model.GGUF")), Some(Dropped::Model));
    assert_eq!(classify_drop(Path::new("/x/readme.md")), None);
    assert_eq!(classify_drop(Path::new("/x/train.parquet")), Some(Dropped::Dataset));
    let hub = tempfile::tempdir().unwrap();
    std::fs::create_dir(hub.path().join("data")).unwrap();
    std::fs::write(hub.path().join("README.md"), "").unwrap();
    assert_eq!(classify_drop(hub.path()), None, "a folder without data files");
    std::fs::write(hub.path().join("data/train-00000-of-00001.parquet"), "").unwrap();
    assert_eq!(classify_drop(hub.path()), Some(Dropped::Dataset), "a Hub dataset repo");
}
