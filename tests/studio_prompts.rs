//! The dataset page with GRPO prompts, driven through the real panels with egui_kittest, headless: the bundled
//! sums show each prompt and its answer, as turns before a model loads and through tiny-llama's chat template after
//! (every token masked, ending in the generation prompt); the splits, the sidebar and the token statistics count
//! prompts; and the method card refuses SFT on them with a switch to GRPO.

#![cfg(feature = "studio")]

mod common;

use common::studio::{app, app_mut, step_until, StudioHarness};

use egui_kittest::kittest::{NodeT, Queryable};
use metal_candle::engine::data::RowView;
use metal_candle::engine::device::DeviceChoice;
use metal_candle::engine::train::Method;
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

fn first_prompt(h: &StudioHarness) -> (RowView, Option<String>) {
    let page = app(h).dataset_panel.rows.page.clone().expect("a page of rows");
    match page.rows[0].view.clone() {
        RowView::Prompt { prompt, answer } => (*prompt, answer),
        other => panic!("not a prompt: {other:?}"),
    }
}

#[test]
fn prompts_show_with_their_answer_before_and_after_a_model_loads() {
    let mut h = harness();
    let data = root().join("assets/sample-grpo");
    open_dataset(&mut h, &data);
    assert!(has_label(&h, "400 prompts") && has_label(&h, "48 prompts"), "the splits count prompts");
    assert!(has_label(&h, "400 train prompts"), "the sidebar counts prompts");
    let (prompt, answer) = first_prompt(&h);
    match &prompt {
        RowView::Turns { turns, error: None } => {
            assert_eq!(turns, &[("user".to_string(), "What is 37 + 23? Reply with the number only.".to_string())])
        }
        other => panic!("not plain turns: {other:?}"),
    }
    assert_eq!(answer.as_deref(), Some("60"));
    for text in ["Prompt", "answer", "What is 37 + 23? Reply with the number only."] {
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
    let (prompt, answer) = first_prompt(&h);
    let RowView::Templated { pieces, truncated: false, .. } = &prompt else { panic!("not templated: {prompt:?}") };
    let text: String = pieces.iter().map(|(s, _)| s.as_str()).collect();
    assert!(pieces.iter().all(|(_, trained)| !trained), "nothing of a prompt is trained");
    assert!(text.ends_with("Reply with the number only.<|im_end|>\n<|im_start|>assistant\n"), "{text}");
    assert_eq!(answer.as_deref(), Some("60"));
    assert!(has_label(&h, "Prompt · ") && has_label(&h, "training prompts"), "tokens are counted per prompt");
    assert!(!has_label(&h, "will be dropped"), "every prompt fits the sequence length");

    // SFT cannot train on prompts: the Train page refuses to start, in the engine's words, and switches to GRPO.
    goto(&mut h, Page::Training);
    assert!(has_label(&h, "This dataset holds prompts for GRPO: SFT cannot train on it."));
    assert!(has_label(&h, "train with --method grpo"), "the engine's refusal is shown");
    assert!(h.get_by_label("Start training").accesskit_node().is_disabled(), "and the run cannot start");
    h.get_by_label("Switch to GRPO").click();
    settle(&mut h);
    assert_eq!(app(&h).prefs.train.method, Method::Grpo);
    assert!(!has_label(&h, "This dataset holds prompts for GRPO"), "the method fits the data now");
}
