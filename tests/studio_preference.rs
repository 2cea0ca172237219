//! The dataset page with preference pairs, driven through the real panels with egui_kittest, headless: the
//! bundled arithmetic pairs show their prompt once and chosen | rejected side by side, as turns before a model
//! loads and through tiny-llama's chat template after (prompt masked, completions trained), counts speak of pairs,
//! and a bad pair is listed with its line as other invalid rows are.

#![cfg(feature = "studio")]

mod common;

use common::studio::{app, app_mut, step_until, StudioHarness};

use egui_kittest::kittest::Queryable;
use metal_candle::engine::data::RowView;
use metal_candle::engine::device::DeviceChoice;
use metal_candle::studio::app::{Page, Prefs, StudioOptions};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf()
}

fn harness() -> StudioHarness {
    let mut prefs = Prefs { device: DeviceChoice::Cpu, auto_load_model: false, ..Prefs::default() };
    prefs.model_path = root().join("tests/fixtures/tiny-llama").display().to_string();
    prefs.train.seq_len = 64;
    let options = StudioOptions { discover_defaults: false, persist: false, ..Default::default() };
    common::studio::build(prefs, options, 1400.0, true)
}

fn settle(h: &mut StudioHarness) {
    for _ in 0..3 {
        h.step();
    }
}

fn goto(h: &mut StudioHarness, page: Page) {
    h.get_by_label(page.title()).click();
    settle(h);
    assert_eq!(app(h).prefs.page, page);
}

fn open_dataset(h: &mut StudioHarness, path: &Path) {
    goto(h, Page::Dataset);
    app_mut(h).prefs.dataset_input = path.display().to_string();
    h.get_by_label("Open dataset").click();
    settle(h);
    let path = path.to_path_buf();
    step_until(h, "the dataset report", 60, move |a| {
        !a.dataset_panel.is_inspecting() && a.dataset_panel.report.as_ref().is_some_and(|r| r.path == path)
    });
    step_until(h, "the rows", 60, |a| !a.dataset_panel.rows.is_waiting() && a.dataset_panel.rows.page.is_some());
    settle(h);
}

fn has_label(h: &StudioHarness, text: &str) -> bool {
    h.query_all_by_label_contains(text).next().is_some()
}

fn first_pair(h: &StudioHarness) -> (RowView, RowView, RowView) {
    let page = app(h).dataset_panel.rows.page.clone().expect("a page of rows");
    match page.rows[0].view.clone() {
        RowView::Pair { prompt, chosen, rejected } => (*prompt, *chosen, *rejected),
        other => panic!("not a pair: {other:?}"),
    }
}

#[test]
fn pairs_show_side_by_side_before_and_after_a_model_loads() {
    let mut h = harness();
    let data = root().join("assets/sample-preference");
    open_dataset(&mut h, &data);
    assert!(has_label(&h, "40 pairs") && has_label(&h, "10 pairs"), "the splits count pairs");
    let (prompt, chosen, rejected) = first_pair(&h);
    let turns = |v: &RowView| match v {
        RowView::Turns { turns, error: None } => turns.clone(),
        other => panic!("not plain turns: {other:?}"),
    };
    assert_eq!(turns(&prompt), [("user".to_string(), "What is 35 + 24?".to_string())]);
    assert_eq!(turns(&chosen)[0].1, "35 + 24 = 59.");
    assert_eq!(turns(&rejected)[0].1, "35 + 24 = 61.");
    for text in ["Prompt", "Chosen", "Rejected", "35 + 24 = 59.", "35 + 24 = 61."] {
        assert!(has_label(&h, text), "{text} is shown");
    }

    goto(&mut h, Page::Model);
    h.get_by_label("Load model").click();
    settle(&mut h);
    step_until(&mut h, "the model", 60, |a| a.model.loaded.is_some() || a.model.error.is_some());
    assert!(app(&h).model.error.is_none(), "{:?}", app(&h).model.error);
    open_dataset(&mut h, &data);
    step_until(&mut h, "templated rows", 60, |a| {
        a.dataset_panel.rows.page.as_ref().is_some_and(|p| p.templated) && !a.dataset_panel.rows.is_waiting()
    });
    settle(&mut h);
    let (prompt, chosen, rejected) = first_pair(&h);
    let pieces = |v: &RowView| match v {
        RowView::Templated { pieces, .. } => pieces.clone(),
        other => panic!("not templated: {other:?}"),
    };
    let text = |p: &[(String, bool)]| p.iter().map(|(s, _)| s.as_str()).collect::<String>();
    assert!(pieces(&prompt).iter().all(|(_, trained)| !trained), "the prompt is masked");
    assert!(text(&pieces(&prompt)).ends_with("<|im_start|>assistant\n"), "{}", text(&pieces(&prompt)));
    assert!(pieces(&chosen).iter().all(|(_, trained)| *trained), "the chosen completion is trained");
    assert!(pieces(&rejected).iter().all(|(_, trained)| *trained), "the rejected completion is trained");
    assert!(text(&pieces(&chosen)).starts_with("35 + 24 = 59.<|im_end|>"), "{}", text(&pieces(&chosen)));
    assert!(text(&pieces(&rejected)).starts_with("35 + 24 = 61.<|im_end|>"), "{}", text(&pieces(&rejected)));
    assert!(has_label(&h, "Chosen · ") && has_label(&h, "Rejected · "), "each side says its tokens");
    assert!(has_label(&h, "training pairs"), "the token statistics count pairs");
}

#[test]
fn a_bad_pair_is_listed_with_its_line() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("train.jsonl");
    let good = r#"{"prompt": "2+2=", "chosen": "4", "rejected": "5"}"#;
    let same = r#"{"prompt": "3+3=", "chosen": "6", "rejected": "6"}"#;
    std::fs::write(&path, format!("{good}\n{same}\n{good}\n")).unwrap();
    let mut h = harness();
    open_dataset(&mut h, &path);
    assert!(has_label(&h, "Invalid rows (1)"));
    assert!(has_label(&h, "`chosen` and `rejected` are the same"), "the problem is shown");
    let report = app(&h).dataset_panel.report.clone().unwrap();
    assert_eq!(report.splits[0].problems[0].line, 2);
}
