//! The dataset page's rows and the chat's adapter folders and exports, driven through the real panels with
//! egui_kittest, headless: page through every row of a generated dataset, search it, switch to the validation
//! split, see rows through the template once a model loads; load a PEFT adapter folder from elsewhere into the
//! chat (refusing folders that are not adapters or do not fit the model), get a reply, and export the
//! conversation to JSON and Markdown and read the files back.

#![cfg(feature = "studio")]

mod common;

use common::studio::{app, app_mut, step_until, StudioHarness};

use egui_kittest::kittest::{NodeT, Queryable};
use metal_candle::engine::data::{RowView, SplitName};
use metal_candle::engine::device::DeviceChoice;
use metal_candle::studio::app::{Page, Prefs, StudioOptions};
use metal_candle::studio::chat_panel::ChatMode;
use std::path::{Path, PathBuf};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn prefs() -> Prefs {
    let mut prefs = Prefs { device: DeviceChoice::Cpu, auto_load_model: false, ..Prefs::default() };
    prefs.model_path = fixtures().join("tiny-llama").display().to_string();
    prefs.train.seq_len = 64;
    prefs.chat.max_tokens = 8;
    prefs.chat.sampling.temperature = 0.0;
    prefs
}

fn harness() -> StudioHarness {
    let options = StudioOptions { discover_defaults: false, persist: false, ..Default::default() };
    // The random fixture model writes arbitrary bytes into chat replies.
    common::studio::build(prefs(), options, 900.0, true)
}

fn settle(h: &mut StudioHarness) {
    for _ in 0..3 {
        h.step();
    }
}

fn click(h: &mut StudioHarness, label: &str) {
    h.get_by_label(label).click();
    settle(h);
}

/// Click the first of the widgets labelled `label` (the rows pager is shown above and below a page).
fn click_first(h: &mut StudioHarness, label: &str) {
    h.get_all_by_label(label).next().unwrap_or_else(|| panic!("no {label}")).click();
    settle(h);
}

fn goto(h: &mut StudioHarness, page: Page) {
    click(h, page.title());
    assert_eq!(app(h).prefs.page, page);
}

fn load_model(h: &mut StudioHarness) {
    goto(h, Page::Model);
    click(h, "Load model");
    step_until(h, "the model to load", 60, |a| a.model.loaded.is_some() || a.model.error.is_some());
    assert!(app(h).model.error.is_none(), "{:?}", app(h).model.error);
}

fn chat_line(q: &str, a: &str) -> String {
    serde_json::json!({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}).to_string()
}

/// 45 training rows (every tenth mentions a zebra), 3 validation rows and 2 test rows.
fn write_dataset(dir: &Path) -> PathBuf {
    let data = dir.join("data");
    std::fs::create_dir_all(&data).unwrap();
    let train: Vec<String> = (1..=45)
        .map(|i| {
            let answer = if i % 10 == 7 { format!("Row {i} talks about a Zebra.") } else { format!("Row {i}.") };
            chat_line(&format!("Question number {i}?"), &answer)
        })
        .collect();
    std::fs::write(data.join("train.jsonl"), train.join("\n") + "\n").unwrap();
    let valid: Vec<String> = (1..=3).map(|i| chat_line(&format!("Held-out question {i}?"), "Held.")).collect();
    std::fs::write(data.join("valid.jsonl"), valid.join("\n") + "\n").unwrap();
    let test = [chat_line("Test question 1?", "T."), chat_line("Test question 2?", "T.")];
    std::fs::write(data.join("test.jsonl"), test.join("\n") + "\n").unwrap();
    data
}

fn open_dataset(h: &mut StudioHarness, path: &Path) {
    goto(h, Page::Dataset);
    app_mut(h).prefs.dataset_input = path.display().to_string();
    click(h, "Open dataset");
    let path = path.to_path_buf();
    step_until(h, "the dataset report", 60, move |a| {
        !a.dataset_panel.is_inspecting() && a.dataset_panel.report.as_ref().is_some_and(|r| r.path == path)
    });
}

/// Step until the rows section shows a page with nothing more asked, then return what it says.
fn wait_rows(h: &mut StudioHarness, what: &str) {
    step_until(h, what, 60, |a| !a.dataset_panel.rows.is_waiting() && a.dataset_panel.rows.page.is_some());
    settle(h);
}

fn shown_indices(h: &StudioHarness) -> Vec<usize> {
    app(h).dataset_panel.rows.page.as_ref().unwrap().rows.iter().map(|r| r.index + 1).collect()
}

fn has_label(h: &StudioHarness, text: &str) -> bool {
    h.query_all_by_label_contains(text).next().is_some()
}

#[test]
fn rows_page_search_and_switch_split() {
    let tmp = tempfile::tempdir().unwrap();
    let data = write_dataset(tmp.path());
    let mut h = harness();
    open_dataset(&mut h, &data);
    wait_rows(&mut h, "the first page of rows");

    // Every row, a page at a time, as plain turns before a model is loaded.
    assert!(has_label(&h, "rows 1–10 of 45"), "the pager says which rows are shown");
    assert_eq!(shown_indices(&h), (1..=10).collect::<Vec<_>>());
    assert!(has_label(&h, "Question number 1?"), "the first row's turns are shown");
    assert!(has_label(&h, "Load a model to see the rows through its chat template"));
    click_first(&mut h, "Next");
    wait_rows(&mut h, "the second page");
    assert!(has_label(&h, "rows 11–20 of 45"));
    assert!(has_label(&h, "Question number 11?"));
    click_first(&mut h, "Last");
    wait_rows(&mut h, "the last page");
    assert!(has_label(&h, "rows 41–45 of 45"));
    assert_eq!(shown_indices(&h), (41..=45).collect::<Vec<_>>());
    assert!(h.get_all_by_label("Next").all(|n| n.accesskit_node().is_disabled()), "Next is off on the last page");
    click_first(&mut h, "Previous");
    wait_rows(&mut h, "the page before");
    assert!(has_label(&h, "rows 31–40 of 45"));
    click_first(&mut h, "First");
    wait_rows(&mut h, "the first page again");
    assert!(has_label(&h, "rows 1–10 of 45"));

    // Search all rows of the split, in any case: rows 7, 17, 27 and 37 mention a zebra.
    let search = h.get_by_label("Search rows");
    search.focus();
    search.type_text("ZEBRA");
    settle(&mut h);
    wait_rows(&mut h, "the search");
    let page = app(&h).dataset_panel.rows.page.clone().unwrap();
    assert_eq!((page.query.search.as_str(), page.matches, page.split_rows), ("ZEBRA", 4, 45));
    assert_eq!(shown_indices(&h), vec![7, 17, 27, 37]);
    assert!(has_label(&h, "4 of 45 rows match"));
    assert!(has_label(&h, "matches 1–4 of 4"));
    assert!(has_label(&h, "Row 17 talks about a Zebra."));
    h.get_by_label("Search rows").type_text(" crossing");
    settle(&mut h);
    wait_rows(&mut h, "a search that matches nothing");
    assert!(has_label(&h, "no row of the train split matches \"ZEBRA crossing\""));
    click(&mut h, "Clear search");
    wait_rows(&mut h, "every row again");
    assert!(has_label(&h, "rows 1–10 of 45"));

    // Only the splits the dataset has, each with its rows.
    assert!(h.query_by_label("test · 2 rows").is_some());
    click(&mut h, "valid · 3 rows");
    wait_rows(&mut h, "the validation split");
    let page = app(&h).dataset_panel.rows.page.clone().unwrap();
    assert_eq!((page.split, page.split_rows), (Some(SplitName::Valid), 3));
    assert!(has_label(&h, "rows 1–3 of 3"));
    assert!(has_label(&h, "Held-out question 2?"));

    // With a model, rows come through its chat template with trained tokens marked; the split stays.
    load_model(&mut h);
    goto(&mut h, Page::Dataset);
    step_until(&mut h, "rows through the template", 60, |a| {
        a.dataset_panel.rows.page.as_ref().is_some_and(|p| p.templated) && !a.dataset_panel.rows.is_waiting()
    });
    settle(&mut h);
    let page = app(&h).dataset_panel.rows.page.clone().unwrap();
    assert_eq!(page.split, Some(SplitName::Valid));
    match &page.rows[0].view {
        RowView::Templated { pieces, .. } => {
            assert!(pieces.iter().any(|(_, trained)| *trained) && pieces.iter().any(|(_, trained)| !*trained));
            let text: String = pieces.iter().map(|(p, _)| p.as_str()).collect();
            assert!(text.contains("Held-out question 1?"), "{text}");
        }
        other => panic!("expected templated rows, got {other:?}"),
    }
    assert!(h.query_by_label(" trained ").is_some(), "the token legend is shown");
    h.check_accessibility();
}

#[test]
fn rows_of_a_hundred_thousand_row_split_page_and_search_without_freezing() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("big");
    std::fs::create_dir_all(&data).unwrap();
    let rows: Vec<String> = (1..=100_000)
        .map(|i| chat_line(&format!("Question {i}"), if i % 1000 == 0 { "A needle." } else { "Hay." }))
        .collect();
    std::fs::write(data.join("train.jsonl"), rows.join("\n") + "\n").unwrap();
    let mut h = harness();
    open_dataset(&mut h, &data);
    wait_rows(&mut h, "the first page");
    assert!(has_label(&h, "rows 1–10 of 100,000"), "commas group the count");
    click_first(&mut h, "Last");
    wait_rows(&mut h, "the last page");
    assert!(has_label(&h, "rows 99,991–100,000 of 100,000"));
    let search = h.get_by_label("Search rows");
    search.focus();
    search.type_text("needle");
    // Frames keep coming while the worker searches: the UI thread never waits for it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut slowest = std::time::Duration::ZERO;
    loop {
        let frame = std::time::Instant::now();
        h.step();
        slowest = slowest.max(frame.elapsed());
        let rows = &app(&h).dataset_panel.rows;
        if rows.page.as_ref().is_some_and(|p| p.query.search == "needle") && !rows.is_waiting() {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no search result within 60 s");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert!(slowest.as_secs_f64() < 0.5, "a frame took {slowest:?} while the search ran");
    settle(&mut h);
    assert!(has_label(&h, "100 of 100,000 rows match"));
    assert_eq!(shown_indices(&h), (1..=10).map(|i| i * 1000).collect::<Vec<_>>());
}

/// A PEFT adapter whose lora weights are shaped for a hidden size of 128, not the tiny model's 64.
fn write_wrong_size_adapter(dir: &Path) {
    use candle_core::{DType, Device, Tensor};
    std::fs::create_dir_all(dir).unwrap();
    let config = serde_json::json!({
        "peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["q_proj"],
        "base_model_name_or_path": "some-org/wider-model", "task_type": "CAUSAL_LM"
    });
    std::fs::write(dir.join("adapter_config.json"), config.to_string()).unwrap();
    let mut tensors = std::collections::HashMap::new();
    for layer in 0..2 {
        let prefix = format!("base_model.model.model.layers.{layer}.self_attn.q_proj");
        tensors.insert(format!("{prefix}.lora_A.weight"), Tensor::zeros((4, 128), DType::F32, &Device::Cpu).unwrap());
        tensors.insert(format!("{prefix}.lora_B.weight"), Tensor::zeros((128, 4), DType::F32, &Device::Cpu).unwrap());
    }
    candle_core::safetensors::save(&tensors, dir.join("adapter_model.safetensors")).unwrap();
}

fn copy_adapter(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for file in ["adapter_config.json", "adapter_model.safetensors"] {
        std::fs::copy(from.join(file), to.join(file)).unwrap();
    }
}

/// Type `folder` into the adapter row and press Load; wait for the worker's answer.
fn load_adapter_folder(h: &mut StudioHarness, folder: &Path) {
    if h.query_by_label("Adapter folder").is_none() {
        click(h, "Load adapter…");
    }
    h.get_by_label("Adapter folder").set_text_value_accesskit(&folder.display().to_string());
    settle(h);
    click(h, "Load");
    step_until(h, "the adapter check", 60, |a| !a.chat_panel.loader.is_checking());
    settle(h);
}

fn refusal(h: &StudioHarness) -> String {
    app(h).chat_panel.loader.error.clone().map(|(_, m)| m).unwrap_or_default()
}

#[test]
fn chat_loads_a_peft_adapter_from_any_folder_and_exports_the_conversation() {
    let tmp = tempfile::tempdir().unwrap();
    let mut h = harness();
    load_model(&mut h);
    goto(&mut h, Page::Chat);

    // Folders that are not adapters for this model are refused with the reason; the chat keeps no adapter.
    let empty = tmp.path().join("not-an-adapter");
    std::fs::create_dir_all(&empty).unwrap();
    load_adapter_folder(&mut h, &empty);
    assert!(refusal(&h).contains("adapter_config.json"), "{}", refusal(&h));
    assert!(has_label(&h, "Cannot use"), "the refusal is shown");
    load_adapter_folder(&mut h, &tmp.path().join("no-such-folder"));
    assert!(refusal(&h).contains("no-such-folder"), "{}", refusal(&h));
    let wide = tmp.path().join("wider-adapter");
    write_wrong_size_adapter(&wide);
    load_adapter_folder(&mut h, &wide);
    assert!(refusal(&h).contains("expected A (4, 64)"), "a wrong hidden size is named: {}", refusal(&h));
    let phi3 = tmp.path().join("phi3-adapter");
    copy_adapter(&fixtures().join("tiny-phi3-peft"), &phi3);
    load_adapter_folder(&mut h, &phi3);
    assert!(refusal(&h).contains("a module this model does not have"), "wrong modules: {}", refusal(&h));
    assert!(app(&h).chat_panel.adapter.is_none());
    assert_eq!(app(&h).prefs.chat.mode, ChatMode::Base);

    // A PEFT adapter saved by peft, copied somewhere unrelated to any run.
    let elsewhere = tmp.path().join("downloads").join("my-llama-lora");
    copy_adapter(&fixtures().join("tiny-llama-peft"), &elsewhere);
    load_adapter_folder(&mut h, &elsewhere);
    assert_eq!(refusal(&h), "");
    assert_eq!(app(&h).chat_panel.adapter.as_deref(), Some(elsewhere.as_path()));
    assert_eq!(app(&h).prefs.chat.mode, ChatMode::Adapter, "the chat switches to the adapter");
    assert_eq!(app(&h).prefs.chat.recent_adapters, vec![elsewhere.clone()], "remembered for the dropdown");
    assert!(has_label(&h, "rank 4, alpha 8"), "what the adapter is");
    assert!(h.query_by_label("Adapter folder").is_none(), "the row closes");

    app_mut(&mut h).chat_panel.input = "Hello there".into();
    settle(&mut h);
    click(&mut h, "Send");
    step_until(&mut h, "the adapter's reply", 60, |a| {
        a.chat_panel.exchanges.last().and_then(|e| e.adapter.as_ref()).is_some_and(|r| !r.streaming)
    });
    let reply = app(&h).chat_panel.exchanges[0].adapter.clone().unwrap();
    assert!(reply.error.is_none(), "{:?}", reply.error);
    assert!(reply.stats.as_ref().is_some_and(|s| s.new_tokens >= 1));
    assert_eq!(reply.adapter.as_deref(), Some(elsewhere.as_path()));

    // Export to JSON, then to Markdown; an existing file is not overwritten without asking.
    let out = tmp.path().join("exports");
    std::fs::create_dir_all(&out).unwrap();
    let json_path = out.join("talk.json");
    click(&mut h, "Export…");
    assert!(app(&h).chat_panel.export.is_open());
    h.get_by_label("File").set_text_value_accesskit(&json_path.display().to_string());
    settle(&mut h);
    click(&mut h, "Save");
    step_until(&mut h, "the JSON export", 30, |a| !a.chat_panel.export.is_writing());
    settle(&mut h);
    assert_eq!(
        app(&h).chat_panel.export.written.as_deref(),
        Some(json_path.as_path()),
        "{:?}",
        app(&h).chat_panel.export.error
    );
    assert!(has_label(&h, &format!("Conversation saved to {}", json_path.display())));
    assert!(h.query_by_label("Copy path").is_some() && h.query_by_label("Open folder").is_some());
    let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json_path).unwrap()).unwrap();
    let roles: Vec<&str> = doc["messages"].as_array().unwrap().iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert_eq!(roles, ["user", "assistant"]);
    assert_eq!(doc["messages"][0]["content"], "Hello there");
    assert_eq!(doc["messages"][1]["content"].as_str().unwrap(), reply.text.trim());
    assert_eq!(doc["adapter"].as_str().unwrap(), elsewhere.display().to_string());
    assert!(doc["model"].as_str().unwrap().ends_with("tiny-llama"));
    assert_eq!(doc["sampling"]["temperature"], 0.0);
    assert!((doc["sampling"]["repetition_penalty"].as_f64().unwrap() - 1.1).abs() < 1e-6);
    assert_eq!(doc["max_new_tokens"], 8);

    click(&mut h, "Export…");
    h.get_by_label("File").set_text_value_accesskit(&json_path.display().to_string());
    settle(&mut h);
    assert!(has_label(&h, "Replace it: the file already exists"), "an existing file is pointed out");
    assert!(h.get_by_label("Save").accesskit_node().is_disabled(), "and not overwritten silently");
    click(&mut h, "Markdown");
    let md_path = out.join("talk.md");
    assert_eq!(h.get_by_label("File").value().as_deref(), Some(md_path.to_str().unwrap()), "the extension follows");
    click(&mut h, "Save");
    step_until(&mut h, "the Markdown export", 30, |a| !a.chat_panel.export.is_writing());
    let md = std::fs::read_to_string(&md_path).unwrap();
    assert!(md.starts_with("# Chat with tiny-llama\n"), "{md}");
    assert!(md.contains(&format!("- **Adapter:** {}\n", elsewhere.display())), "{md}");
    assert!(md.contains("## User\n\nHello there\n\n## Assistant\n\n"), "{md}");
    assert!(md.contains("repetition penalty 1.10"), "{md}");

    // Exporting again to the same name offers a fresh one.
    click(&mut h, "Export…");
    h.get_by_label("File").set_text_value_accesskit(&md_path.display().to_string());
    settle(&mut h);
    click(&mut h, "Use talk-2.md");
    click(&mut h, "Save");
    step_until(&mut h, "the export under a fresh name", 30, |a| !a.chat_panel.export.is_writing());
    assert!(out.join("talk-2.md").is_file());
    assert_eq!(std::fs::read_to_string(&md_path).unwrap(), md, "the first file is untouched");
    h.check_accessibility();
}
