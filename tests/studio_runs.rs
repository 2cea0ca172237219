//! The checkpoints page's run management and the two-checkpoint chat, driven through the real panels with
//! egui_kittest on two real tiny-llama runs made with `metal-candle train` (lr 1e-3 and 5e-4): the runs table
//! marks the rows that differ, a note is saved to run.json and shown after a refresh, Delete run… says what goes
//! and removes the folder, a run that is training is not deleted, and the chat answers one prompt with two
//! checkpoints side by side under headings that name them.

#![cfg(feature = "studio")]

mod common;

use common::cli::two_runs;
use common::studio::{app, app_mut, build, click, goto, step_until, StudioHarness};
use egui::accesskit::Role;
use egui_kittest::kittest::{NodeT, Queryable};
use metal_candle::engine::device::DeviceChoice;
use metal_candle::engine::train::run_folder::RunManifest;
use metal_candle::engine::train::run_lock::RunLock;
use metal_candle::studio::app::{studio_train_defaults, Page, Prefs, StudioOptions};
use metal_candle::studio::chat_panel::ChatMode;
use std::path::Path;

fn harness(runs: &Path, page: Page) -> StudioHarness {
    let mut prefs = Prefs { device: DeviceChoice::Cpu, auto_load_model: false, ..Prefs::default() };
    prefs.model_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-llama").display().to_string();
    prefs.train = studio_train_defaults();
    prefs.train.out = runs.to_path_buf();
    prefs.page = page;
    let options = StudioOptions { discover_defaults: false, persist: false, ..Default::default() };
    // Replies of the random fixture model are arbitrary bytes.
    build(prefs, options, 900.0, true)
}

fn shown(h: &StudioHarness, label: &str) -> bool {
    h.query_by_label(label).is_some()
}

/// Bring the widget into view (the page scrolls), then click it through accesskit.
fn click_in_view(h: &mut StudioHarness, label: &str) {
    h.get_by_label(label).scroll_to_me();
    h.step();
    h.step();
    h.get_by_label(label).click_accesskit();
    h.step();
    h.step();
}

fn select_run(h: &mut StudioHarness, name: &str) {
    // The run list's entry is a selectable button named by the run's title.
    h.get_by_role_and_label(Role::Button, name).click_accesskit();
    h.step();
    h.step();
}

#[test]
fn runs_table_notes_and_delete_on_the_checkpoints_page() {
    let tmp = tempfile::tempdir().unwrap();
    let runs = tmp.path().join("runs");
    two_runs(&runs);
    let mut h = harness(&runs, Page::Checkpoints);
    step_until(&mut h, "the run list", 30, |a| a.checkpoints_panel.runs.len() == 2);
    app_mut(&mut h).prefs.overlay_runs = vec!["r-a".into(), "r-b".into()];
    h.step();
    h.step();

    // The runs table: the learning rate differs and is marked, the rank is the same and is not.
    assert!(shown(&h, "≠ learning rate"), "the differing row is marked");
    assert!(shown(&h, "1e-3") && shown(&h, "5e-4"), "both values are shown");
    assert!(shown(&h, "rank") && !shown(&h, "≠ rank"), "the same rank is not marked");
    click_in_view(&mut h, "Only differences");
    assert!(app(&h).checkpoints_panel.table.only_differences, "the switch is on");
    assert!(!shown(&h, "rank") && shown(&h, "≠ learning rate"), "only the differing rows are left");
    click_in_view(&mut h, "Only differences");

    // A note: written in the editor, stored in run.json, shown again after the list is read afresh.
    select_run(&mut h, "r-a");
    click_in_view(&mut h, "Add note…");
    h.get_by_label("Note").type_text("lr 1e-3 learns faster");
    h.step();
    click_in_view(&mut h, "Save note");
    step_until(&mut h, "the note", 30, |a| a.checkpoints_panel.runs.iter().any(|r| r.notes.is_some()));
    let stored = RunManifest::read(&runs.join("r-a")).unwrap().notes;
    assert_eq!(stored.as_deref(), Some("lr 1e-3 learns faster"));
    click(&mut h, "Refresh");
    step_until(&mut h, "the refreshed list", 30, |a| a.checkpoints_panel.runs.len() == 2);
    h.step();
    assert!(h.get_all_by_label("lr 1e-3 learns faster").count() >= 2, "in the run's detail and the runs table");

    // A run that is training (its claim held, here by this process) is not deleted.
    let claim = RunLock::claim(&runs.join("r-a")).unwrap();
    click_in_view(&mut h, "Delete run…");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while h.query_by_label_contains("training now").is_none() {
        assert!(std::time::Instant::now() < deadline, "no refusal shown");
        h.step();
    }
    assert!(app(&h).checkpoints_panel.delete_run.plan.is_none(), "no confirmation for a training run");
    assert!(runs.join("r-a/run.json").exists());
    drop(claim);

    // Delete asks first, naming the folder, its checkpoints and its size, then removes the folder.
    select_run(&mut h, "r-b");
    click_in_view(&mut h, "Delete run…");
    step_until(&mut h, "the confirmation", 30, |a| a.checkpoints_panel.delete_run.plan.is_some());
    h.step();
    let question = h.get_by_label_contains("will be removed from disk");
    let node = question.accesskit_node();
    let text = format!("{}{}", node.label().unwrap_or_default(), node.value().unwrap_or_default());
    assert!(text.contains("r-b") && text.contains("1 checkpoint") && text.contains("B in all"), "{text}");
    assert!(runs.join("r-b").exists(), "nothing is deleted before the answer");
    click_in_view(&mut h, "Delete run");
    step_until(&mut h, "the deletion and the refreshed list", 30, |a| a.checkpoints_panel.runs.len() == 1);
    assert!(!runs.join("r-b").exists() && runs.join("r-a").exists());
}

#[test]
fn the_chat_answers_with_two_checkpoints_side_by_side() {
    let tmp = tempfile::tempdir().unwrap();
    let runs = tmp.path().join("runs");
    two_runs(&runs);
    let mut h = harness(&runs, Page::Model);
    h.step();
    click(&mut h, "Load model");
    step_until(&mut h, "the model", 60, |a| a.model.loaded.is_some());
    let (a_ckpt, b_ckpt) = (runs.join("r-a/checkpoint-3"), runs.join("r-b/checkpoint-3"));
    assert!(a_ckpt.is_dir() && b_ckpt.is_dir());
    {
        let a = app_mut(&mut h);
        a.chat_panel.adapter = Some(a_ckpt.clone());
        a.chat_panel.left_adapter = Some(b_ckpt.clone());
        a.prefs.chat.mode = ChatMode::SideBySide;
        a.prefs.chat.max_tokens = 6;
        a.chat_panel.input = "Hi".into();
    }
    goto(&mut h, Page::Chat);
    assert!(shown(&h, "Left column"), "side by side offers a choice for the left column");
    click(&mut h, "Send");
    step_until(&mut h, "both replies", 60, |a| {
        a.chat_panel.exchanges.last().is_some_and(|e| {
            e.base.as_ref().is_some_and(|r| !r.streaming) && e.adapter.as_ref().is_some_and(|r| !r.streaming)
        })
    });
    let ex = app(&h).chat_panel.exchanges[0].clone();
    let (left, right) = (ex.base.unwrap(), ex.adapter.unwrap());
    for r in [&left, &right] {
        assert!(r.error.is_none(), "{:?}", r.error);
        assert!(r.stats.as_ref().is_some_and(|s| s.new_tokens > 0), "a reply streamed");
    }
    assert_eq!((left.adapter.as_deref(), right.adapter.as_deref()), (Some(b_ckpt.as_path()), Some(a_ckpt.as_path())));
    h.step();
    assert!(shown(&h, "r-b · step 3"), "the left column's heading names its run and step");
    assert!(shown(&h, "With adapter: r-a · step 3"), "the right column's heading names its checkpoint");
    assert!(shown(&h, "Assistant · r-b · step 3") && shown(&h, "Assistant · r-a · step 3"), "each reply says who");
}
