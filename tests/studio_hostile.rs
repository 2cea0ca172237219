//! Issue 40 in the studio: the crafted model files of `common::hostile_files` opened through the model page
//! (the same loader as the CLI) show their error on the page and leave the studio working (the next good model
//! loads); a FIFO opened as a dataset shows an error instead of freezing the page; a chat whose template asks
//! for unbounded memory or renders megabytes answers with an error in the chat pane.

#![cfg(feature = "studio")]

mod common;

use common::fixture;
use common::hostile_files::{hostile_folders, hostile_ggufs, with_template, HOSTILE_TEMPLATES};
use common::studio::{app, app_mut, click, step_until, StudioHarness};
use egui_kittest::kittest::Queryable;
use metal_candle::engine::device::DeviceChoice;
use metal_candle::studio::app::{Page, Prefs, StudioOptions};
use std::path::Path;

fn harness(runs: &Path) -> StudioHarness {
    let mut prefs = Prefs { device: DeviceChoice::Cpu, auto_load_model: false, ..Prefs::default() };
    prefs.train.out = runs.to_path_buf();
    prefs.chat.max_tokens = 4;
    let options = StudioOptions { discover_defaults: false, persist: false, ..Default::default() };
    common::studio::build(prefs, options, 860.0, true)
}

/// Load `path` from the model page; the load error (None when it loaded).
fn load(h: &mut StudioHarness, path: &Path) -> Option<String> {
    app_mut(h).prefs.page = Page::Model;
    app_mut(h).prefs.model_path = path.display().to_string();
    h.step();
    click(h, "Load model");
    step_until(h, "the load to end", 60, |a| {
        a.model.loading.is_none() && (a.model.loaded.is_some() || a.model.error.is_some())
    });
    h.step();
    app(h).model.error.as_ref().map(|(_, message)| message.clone())
}

#[test]
fn hostile_model_files_show_their_error_and_the_studio_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let mut h = harness(&dir.path().join("runs"));
    let cases = hostile_folders(dir.path()).into_iter().chain(hostile_ggufs(dir.path()));
    for case in cases {
        let message = load(&mut h, &case.path).unwrap_or_else(|| panic!("{} loaded", case.name));
        for word in case.words {
            assert!(message.contains(word), "{}: expected `{word}` in {message}", case.name);
        }
        assert!(h.query_by_label_contains("Could not load").is_some(), "{}: the page shows the error", case.name);
        assert!(app(&h).model.loaded.is_none());
    }
    // After all of them, a good model still loads.
    assert_eq!(load(&mut h, &fixture("tiny-llama")), None);
}

#[cfg(unix)]
#[test]
fn a_fifo_as_dataset_shows_an_error_without_freezing_the_page() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("train.jsonl");
    common::hostile_files::mkfifo(&fifo);
    let mut h = harness(&dir.path().join("runs"));
    app_mut(&mut h).prefs.page = Page::Dataset;
    app_mut(&mut h).prefs.dataset_input = fifo.display().to_string();
    h.step();
    click(&mut h, "Open dataset");
    step_until(&mut h, "the dataset error", 30, |a| a.dataset_panel.error.is_some());
    let (_, message) = app(&h).dataset_panel.error.clone().unwrap();
    assert!(message.contains("named pipe"), "{message}");
}

#[test]
fn hostile_chat_templates_answer_with_an_error_in_the_chat_pane() {
    let dir = tempfile::tempdir().unwrap();
    let mut h = harness(&dir.path().join("runs"));
    for (name, template, words) in HOSTILE_TEMPLATES {
        assert_eq!(
            load(&mut h, &with_template(dir.path(), name, template)),
            None,
            "{name} loads (templates render later)"
        );
        app_mut(&mut h).prefs.page = Page::Chat;
        app_mut(&mut h).chat_panel.input = "hi".into();
        h.step();
        click(&mut h, "Send");
        step_until(&mut h, "the reply to end", 30, |a| {
            a.chat_panel.exchanges.last().and_then(|e| e.base.as_ref()).is_some_and(|r| !r.streaming)
        });
        let reply = app(&h).chat_panel.exchanges.last().unwrap().base.clone().unwrap();
        let error = reply.error.unwrap_or_else(|| panic!("{name}: the reply has no error"));
        for word in words {
            assert!(error.contains(word), "{name}: expected `{word}` in {error}");
        }
    }
}
