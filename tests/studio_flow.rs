//! The studio driven through its real panels with egui_kittest, headless, on the tiny Llama fixture: open the
//! model, open a dataset, train a short run and watch loss points arrive, find the checkpoint in the browser,
//! open it in chat and receive streamed tokens; stop a run midway; a malformed dataset shows its errors.
//!
//! Every wait steps the UI in a loop with a deadline, so a broken worker fails the test instead of hanging it.

#![cfg(feature = "studio")]

mod common;

use common::studio::{app, app_mut, click, goto, step_until, StudioHarness};

use egui_kittest::kittest::Queryable;
use metal_candle::engine::data::SplitName;
use metal_candle::engine::device::DeviceChoice;
use metal_candle::studio::app::{studio_train_defaults, Page, Prefs, StudioApp, StudioOptions};
use metal_candle::studio::training_panel::RunStatus;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn fixture_model() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-llama")
}

fn chat_line(q: &str, a: &str) -> String {
    serde_json::json!({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}).to_string()
}

/// A small chat dataset folder with train.jsonl and valid.jsonl.
fn write_dataset(dir: &Path) -> PathBuf {
    let data = dir.join("data");
    std::fs::create_dir_all(&data).unwrap();
    let pairs = [
        ("What is the capital of France?", "Paris."),
        ("What is the capital of Italy?", "Rome."),
        ("What is the capital of Spain?", "Madrid."),
        ("What is the capital of Japan?", "Tokyo."),
        ("What is two plus two?", "Four."),
        ("Name a primary colour.", "Red."),
        ("What do bees make?", "Honey."),
        ("Which planet is red?", "Mars."),
    ];
    let train: Vec<String> = pairs.iter().map(|(q, a)| chat_line(q, a)).collect();
    std::fs::write(data.join("train.jsonl"), train.join("\n") + "\n").unwrap();
    let valid = [chat_line("What is the capital of Germany?", "Berlin."), chat_line("What is one plus one?", "Two.")];
    std::fs::write(data.join("valid.jsonl"), valid.join("\n") + "\n").unwrap();
    data
}

/// Preferences for a quick CPU run into `runs`.
fn test_prefs(runs: &Path, iters: usize) -> Prefs {
    let mut prefs = Prefs { device: DeviceChoice::Cpu, auto_load_model: false, ..Prefs::default() };
    prefs.model_path = fixture_model().display().to_string();
    prefs.train = studio_train_defaults();
    prefs.train.out = runs.to_path_buf();
    prefs.train.iters = Some(iters);
    prefs.train.batch_size = 2;
    prefs.train.seq_len = 64;
    prefs.train.warmup = Some(1);
    prefs.train.val_every = 3;
    prefs.train.val_batches = 1;
    prefs.train.save_every = 3;
    prefs.chat.max_tokens = 12;
    prefs.chat.sampling.temperature = 0.0;
    prefs
}

fn harness_with(prefs: Prefs, model_text: bool) -> StudioHarness {
    let options = StudioOptions { discover_defaults: false, persist: false, ..Default::default() };
    common::studio::build(prefs, options, 860.0, model_text)
}

fn harness(prefs: Prefs) -> StudioHarness {
    harness_with(prefs, false)
}

fn load_fixture_model(h: &mut StudioHarness) {
    goto(h, Page::Model);
    click(h, "Load model");
    step_until(h, "the model to load", 60, |a| a.model.loaded.is_some() || a.model.error.is_some());
    if let Some((_, e)) = &app(h).model.error {
        panic!("the fixture model failed to load: {e}");
    }
    h.step();
    // The model list (a scan of ./models and the Hugging Face cache, finishing whenever it does) may show
    // "llama" too.
    assert!(h.query_all_by_label("llama").next().is_some(), "the model card shows the architecture");
    assert!(h.query_by_label_contains("Trainable parameters").is_some(), "the memory estimate is shown");
}

fn open_dataset(h: &mut StudioHarness, path: &Path) {
    goto(h, Page::Dataset);
    app_mut(h).prefs.dataset_input = path.display().to_string();
    click(h, "Open dataset");
    let path = path.to_path_buf();
    step_until(h, "the dataset report", 60, move |a| {
        !a.dataset_panel.is_inspecting()
            && (a.dataset_panel.report.as_ref().is_some_and(|r| r.path == path)
                || a.dataset_panel.error.as_ref().is_some_and(|e| e.0 == path))
    });
}

#[test]
fn open_model_train_browse_checkpoint_and_chat() {
    let tmp = tempfile::tempdir().unwrap();
    let data = write_dataset(tmp.path());
    let runs = tmp.path().join("runs");
    let mut h = harness_with(test_prefs(&runs, 6), true);

    load_fixture_model(&mut h);

    open_dataset(&mut h, &data);
    step_until(&mut h, "token statistics under the model's tokenizer", 60, |a| {
        a.dataset_panel.report.as_ref().is_some_and(|r| r.tokens.is_some())
    });
    {
        let report = app(&h).dataset_panel.report.clone().unwrap();
        assert_eq!(report.rows(SplitName::Train), 8);
        assert_eq!(report.rows(SplitName::Valid), 2);
        assert_eq!(report.problem_count(), 0);
    }
    step_until(&mut h, "rows through the chat template", 60, |a| {
        a.dataset_panel.rows.page.as_ref().is_some_and(|p| p.templated && !p.rows.is_empty())
    });
    {
        let page = app(&h).dataset_panel.rows.page.clone().unwrap();
        let metal_candle::engine::data::RowView::Templated { pieces, .. } = &page.rows[0].view else {
            panic!("rows are shown through the chat template: {:?}", page.rows[0].view)
        };
        assert!(pieces.iter().any(|(_, trained)| *trained) && pieces.iter().any(|(_, trained)| !*trained));
    }
    h.step();
    assert!(h.query_by_label_contains("truncated at max seq len 64").is_some());

    // Invalid settings are explained, and training cannot start with them.
    goto(&mut h, Page::Settings);
    let targets = std::mem::take(&mut app_mut(&mut h).prefs.train.lora.targets);
    h.step();
    assert!(h.query_by_label_contains("at least one LoRA target").is_some());
    app_mut(&mut h).prefs.train.lora.targets = targets;

    goto(&mut h, Page::Training);
    click(&mut h, "Start training");
    step_until(&mut h, "loss points", 120, |a| a.training_panel.run.as_ref().is_some_and(|r| r.loss.len() >= 2));
    step_until(&mut h, "the run to finish", 180, |a| !a.training_panel.is_active());
    {
        let t = &app(&h).training_panel;
        assert_eq!(t.status, RunStatus::Finished { stopped_early: false }, "log: {:?}", t.log);
        let run = t.run.as_ref().unwrap();
        assert_eq!(run.loss.len(), 6);
        assert!(!run.val_loss.is_empty(), "validation loss was plotted");
        assert!(!run.checkpoints.is_empty(), "checkpoints were reported");
    }

    goto(&mut h, Page::Checkpoints);
    // Until its final checkpoint is listed: earlier listings (a new best is saved as it is found) may land first.
    step_until(&mut h, "the run and its final checkpoint in the browser", 30, |a| {
        a.checkpoints_panel.runs.iter().any(|r| r.checkpoints.iter().any(|c| c.step == 6))
    });
    h.step();
    h.check_accessibility();
    let name = app(&h).checkpoints_panel.runs[0].name.clone();
    h.get_by_label(&format!("Overlay {name} in the comparison plot")).click();
    h.step();
    h.step();
    assert_eq!(app(&h).prefs.overlay_runs.len(), 1, "ticking a run overlays it");
    assert!(h.query_by_label("Compare runs").is_some());
    let opens = h.get_all_by_label("Open in chat").count();
    assert!(opens >= 1, "each checkpoint has an Open in chat button");
    h.get_all_by_label("Open in chat").next().unwrap().click();
    h.step();
    h.step();
    assert_eq!(app(&h).prefs.page, Page::Chat);
    assert!(app(&h).chat_panel.adapter.is_some(), "the checkpoint is the chat's adapter");

    app_mut(&mut h).chat_panel.input = "What is the capital of France?".into();
    h.step();
    click(&mut h, "Send");
    step_until(&mut h, "the adapter's reply to stream in", 60, |a| {
        a.chat_panel.exchanges.last().and_then(|e| e.adapter.as_ref()).is_some_and(|r| !r.streaming)
    });
    let reply = app(&h).chat_panel.exchanges.last().unwrap().adapter.clone().unwrap();
    assert!(reply.error.is_none(), "generation failed: {:?}", reply.error);
    assert!(reply.pieces >= 1, "tokens arrived one piece at a time");
    let stats = reply.stats.expect("final statistics");
    assert!(stats.new_tokens >= 1);
    assert!(reply.adapter.is_some(), "the reply came from the adapter side");
    h.check_accessibility();

    // The loaded pages name every input too.
    for page in [Page::Model, Page::Dataset, Page::Settings, Page::Training, Page::Ranks] {
        goto(&mut h, page);
        h.step();
        h.check_accessibility();
    }

    // Export the newest checkpoint as a PEFT adapter.
    goto(&mut h, Page::Checkpoints);
    h.get_all_by_label("Export…").next().unwrap().click();
    h.step();
    h.step();
    let out = tmp.path().join("exported-peft");
    *app_mut(&mut h).checkpoints_panel.export_out_mut().expect("the export dialog is open") = out.display().to_string();
    click(&mut h, "Export");
    step_until(&mut h, "the export", 60, |a| !a.checkpoints_panel.is_exporting());
    assert!(out.join("adapter_config.json").is_file(), "PEFT export written to {}", out.display());
    assert!(h.query_all_by_label_contains(&format!("Exported to {}", out.display())).next().is_some(), "the full path");
    assert!(h.query_by_label("Copy path").is_some());

    // An Ollama export: q4_k_m by default, remembered with its format, and the card gives the ollama command.
    h.get_all_by_label("Export…").next().unwrap().click();
    h.step();
    h.step();
    click(&mut h, "Ollama");
    let ollama = tmp.path().join("exported-ollama");
    *app_mut(&mut h).checkpoints_panel.export_out_mut().unwrap() = ollama.display().to_string();
    click(&mut h, "Export");
    step_until(&mut h, "the Ollama export", 120, |a| !a.checkpoints_panel.is_exporting());
    assert!(ollama.join("Modelfile").is_file());
    let remembered = app(&h).prefs.export;
    assert_eq!(remembered.format, metal_candle::engine::export::ExportFormat::Ollama);
    assert_eq!(remembered.quant, metal_candle::engine::export::GgufQuant::Q4KM, "q4_k_m by default");
    h.step();
    assert!(h.query_all_by_label_contains("ollama create exported-ollama -f").next().is_some(), "the command to run");

    // Delete a checkpoint, with a confirmation first.
    let before: usize = app(&h).checkpoints_panel.runs.iter().map(|r| r.checkpoints.len()).sum();
    h.get_all_by_label("Delete").next().unwrap().click();
    h.step();
    h.step();
    assert!(h.query_by_label_contains("cannot be undone").is_some(), "deleting asks first");
    click(&mut h, "Delete checkpoint");
    step_until(&mut h, "the checkpoint to disappear", 30, move |a| {
        a.checkpoints_panel.runs.iter().map(|r| r.checkpoints.len()).sum::<usize>() == before - 1
    });
}

#[test]
fn side_by_side_chat_streams_both_columns_while_training() {
    let tmp = tempfile::tempdir().unwrap();
    let data = write_dataset(tmp.path());
    let runs = tmp.path().join("runs");
    let mut h = harness_with(test_prefs(&runs, 400), true);
    load_fixture_model(&mut h);
    open_dataset(&mut h, &data);
    step_until(&mut h, "token statistics", 60, |a| a.dataset_panel.report.as_ref().is_some_and(|r| r.tokens.is_some()));
    goto(&mut h, Page::Training);
    click(&mut h, "Start training");
    step_until(&mut h, "a first checkpoint", 120, |a| {
        a.training_panel.run.as_ref().is_some_and(|r| !r.checkpoints.is_empty())
    });
    let checkpoint = app(&h).training_panel.run.as_ref().unwrap().checkpoints[0].1.clone();
    {
        let a = app_mut(&mut h);
        a.chat_panel.adapter = Some(checkpoint);
        a.prefs.chat.mode = metal_candle::studio::chat_panel::ChatMode::SideBySide;
        a.chat_panel.input = "Hi".into();
    }
    goto(&mut h, Page::Chat);
    click(&mut h, "Send");
    step_until(&mut h, "both replies", 60, |a| {
        a.chat_panel.exchanges.last().is_some_and(|e| {
            e.base.as_ref().is_some_and(|r| !r.streaming) && e.adapter.as_ref().is_some_and(|r| !r.streaming)
        })
    });
    assert!(app(&h).training_panel.is_active(), "training went on while chatting");
    let ex = app(&h).chat_panel.exchanges.last().unwrap().clone();
    for r in [ex.base.unwrap(), ex.adapter.unwrap()] {
        assert!(r.error.is_none(), "{:?}", r.error);
        assert!(r.stats.is_some());
    }
    goto(&mut h, Page::Training);
    click(&mut h, "Stop");
    step_until(&mut h, "the run to stop", 120, |a| !a.training_panel.is_active());
}

#[test]
fn a_run_stops_midway() {
    let tmp = tempfile::tempdir().unwrap();
    let data = write_dataset(tmp.path());
    let runs = tmp.path().join("runs");
    let mut h = harness(test_prefs(&runs, 2000));
    load_fixture_model(&mut h);
    open_dataset(&mut h, &data);
    step_until(&mut h, "token statistics", 60, |a| a.dataset_panel.report.as_ref().is_some_and(|r| r.tokens.is_some()));
    goto(&mut h, Page::Training);
    click(&mut h, "Start training");
    step_until(&mut h, "a few steps", 120, |a| a.training_panel.run.as_ref().is_some_and(|r| r.loss.len() >= 3));

    click(&mut h, "Pause");
    step_until(&mut h, "the run to pause", 60, |a| a.training_panel.status == RunStatus::Paused);
    let paused_at = app(&h).training_panel.run.as_ref().unwrap().step;
    for _ in 0..20 {
        h.step();
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(app(&h).training_panel.run.as_ref().unwrap().step, paused_at, "no steps while paused");
    click(&mut h, "Resume");

    click(&mut h, "Stop");
    step_until(&mut h, "the run to stop", 120, |a| !a.training_panel.is_active());
    let t = &app(&h).training_panel;
    assert_eq!(t.status, RunStatus::Finished { stopped_early: true }, "log: {:?}", t.log);
    let run = t.run.as_ref().unwrap();
    assert!(run.step < 2000, "stopped at step {}", run.step);
    assert!(t.log.iter().any(|l| l.text.contains("stopped")));
}

#[test]
fn a_malformed_dataset_shows_its_errors_with_line_numbers() {
    let tmp = tempfile::tempdir().unwrap();
    let bad = tmp.path().join("bad.jsonl");
    let lines = [
        chat_line("Hello?", "Hi."),
        "{\"messages\": [".to_string(),
        "{\"messages\": [{\"role\": \"user\", \"content\": \"no reply\"}]}".to_string(),
        chat_line("Fine?", "Yes."),
        "[1, 2, 3]".to_string(),
    ];
    std::fs::write(&bad, lines.join("\n") + "\n").unwrap();
    let mut h = harness(test_prefs(&tmp.path().join("runs"), 5));
    open_dataset(&mut h, &bad);
    let report = app(&h).dataset_panel.report.clone().expect("a report, not a crash");
    assert_eq!(report.rows(SplitName::Train), 2);
    let lines: Vec<usize> = report.splits[0].problems.iter().map(|p| p.line).collect();
    assert_eq!(lines, vec![2, 3, 5]);
    h.step();
    assert!(h.query_by_label("bad.jsonl:2").is_some(), "each problem is listed with file and line");
    assert!(h.query_by_label("bad.jsonl:3").is_some());
    assert!(h.query_by_label_contains("no assistant message").is_some());
    assert!(h.query_by_label_contains("3 rows cannot be used").is_some());

    // A path that does not exist is an error in the panel too.
    open_dataset(&mut h, &tmp.path().join("missing.jsonl"));
    assert!(app(&h).dataset_panel.error.is_some());
    h.step();
    assert!(h.query_by_label_contains("file not found: ").is_some());
}

#[test]
fn a_model_that_fails_to_load_says_why() {
    let tmp = tempfile::tempdir().unwrap();
    let mut prefs = test_prefs(&tmp.path().join("runs"), 5);
    prefs.model_path = tmp.path().join("no-such-model").display().to_string();
    let mut h = harness(prefs);
    click(&mut h, "Load model");
    step_until(&mut h, "the load error", 30, |a| a.model.error.is_some());
    h.step();
    assert!(h.query_by_label_contains("Could not load").is_some());
    assert!(app(&h).model.loaded.is_none());
}

/// A Hugging Face cache layout under `root`: a qwen3 snapshot folder, a snapshot holding a GGUF file of a Mistral
/// model (a `llama` file, tests/fixtures/gguf) and a model of an architecture we do not run.
fn write_hf_cache(root: &Path) {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let qwen3 = root.join("models--org--tiny-qwen3/snapshots/abc");
    std::fs::create_dir_all(&qwen3).unwrap();
    for entry in std::fs::read_dir(fixtures.join("tiny-qwen3")).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), qwen3.join(entry.file_name())).unwrap();
    }
    let gguf = root.join("models--org--tiny-mistral-GGUF/snapshots/def");
    std::fs::create_dir_all(&gguf).unwrap();
    std::fs::copy(fixtures.join("gguf/tiny-mistral-f32.gguf"), gguf.join("tiny-mistral-f32.gguf")).unwrap();
    let bert = root.join("models--org--tiny-bert/snapshots/0a1");
    std::fs::create_dir_all(&bert).unwrap();
    std::fs::write(bert.join("config.json"), r#"{"model_type": "bert"}"#).unwrap();
    std::fs::write(bert.join("model.safetensors"), [0u8; 8]).unwrap();
}

#[test]
fn the_model_scan_lists_each_family_and_loads_a_gguf_showing_its_family() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("hub");
    write_hf_cache(&cache);
    let mut prefs = test_prefs(&tmp.path().join("runs"), 5);
    prefs.model_dirs = vec![cache];
    let mut h = harness(prefs);
    goto(&mut h, Page::Model);
    let found = |a: &StudioApp| a.model_panel.found().iter().filter(|m| m.name.starts_with("org/")).count() == 3;
    step_until(&mut h, "the scan", 60, found);
    h.step();
    for (name, family) in
        [("org/tiny-qwen3", "qwen3"), ("org/tiny-mistral-GGUF/tiny-mistral-f32.gguf", "mistral"), ("org/tiny-bert", "")]
    {
        let m = app(&h).model_panel.found().iter().find(|m| m.name == name).unwrap().clone();
        assert_eq!(m.family.clone().unwrap_or_default(), family, "{name}");
        assert!(h.query_by_label(name).is_some(), "{name} is listed");
    }
    assert!(h.query_by_label("qwen3").is_some() && h.query_by_label("mistral").is_some());
    assert!(h.query_by_label("not supported").is_some(), "the bert folder is marked");
    // The GGUF row's Load button loads it, and the model card names its family.
    let rows: Vec<_> = app(&h).model_panel.found().iter().map(|m| m.name.clone()).collect();
    let load_buttons: Vec<_> = h.query_all_by_label("Load").collect();
    let gguf_row = rows.iter().position(|n| n.ends_with(".gguf")).unwrap();
    load_buttons[gguf_row].click();
    step_until(&mut h, "the GGUF to load", 60, |a| a.model.loaded.is_some() || a.model.error.is_some());
    assert!(app(&h).model.error.is_none(), "{:?}", app(&h).model.error);
    assert_eq!(app(&h).model.loaded.as_ref().unwrap().architecture, "mistral");
    h.step();
    assert!(h.query_all_by_label("mistral").count() >= 2, "the model card shows the family too");
}

#[test]
fn every_page_renders_with_named_widgets_before_anything_is_loaded() {
    let tmp = tempfile::tempdir().unwrap();
    let mut h = harness(test_prefs(&tmp.path().join("runs"), 5));
    for page in Page::ALL {
        goto(&mut h, page);
        for _ in 0..3 {
            h.step();
        }
        h.check_accessibility();
    }
    goto(&mut h, Page::Settings);
    h.step();
    assert!(h.query_by_label_contains("Not ready: Load a base model first").is_some());
}

#[test]
fn rank_explorer_probes_ranks_and_puts_one_into_the_settings() {
    let tmp = tempfile::tempdir().unwrap();
    let data = write_dataset(tmp.path());
    let mut prefs = test_prefs(&tmp.path().join("runs"), 5);
    prefs.rank.ranks = vec![2, 4];
    prefs.rank.token_budget = 300;
    prefs.train.lora.rank = 8;
    let mut h = harness(prefs);
    load_fixture_model(&mut h);
    open_dataset(&mut h, &data);
    step_until(&mut h, "token statistics", 60, |a| a.dataset_panel.report.as_ref().is_some_and(|r| r.tokens.is_some()));
    goto(&mut h, Page::Ranks);
    click(&mut h, "Run probes");
    step_until(&mut h, "the probes to finish", 180, |a| !a.rank_panel.running);
    {
        let r = &app(&h).rank_panel;
        assert!(r.error.is_none(), "{:?}", r.error);
        let ranks: Vec<usize> = r.results.iter().map(|x| x.rank).collect();
        assert_eq!(ranks, vec![2, 4]);
        assert!(r.results[1].trainable_params == 2 * r.results[0].trainable_params);
    }
    h.step();
    h.check_accessibility();
    h.get_all_by_label("Use this rank").last().unwrap().click();
    h.step();
    h.step();
    assert_eq!(app(&h).prefs.train.lora.rank, 4, "one click puts the rank into the settings");

    click(&mut h, "Run micro-benchmark");
    step_until(&mut h, "the micro-benchmark", 180, |a| !a.rank_panel.micro_running);
    let r = &app(&h).rank_panel;
    assert!(r.micro_error.is_none(), "{:?}", r.micro_error);
    assert!(r.micro.iter().any(|m| m.op == "lora" && m.backward_ms.is_some()));
}

#[test]
fn help_shows_the_system_report() {
    let dir = tempfile::tempdir().unwrap();
    let mut h = harness(test_prefs(dir.path(), 1));
    h.step();
    click(&mut h, "Help");
    click(&mut h, "System report");
    let deadline = Instant::now() + Duration::from_secs(30);
    while h.query_by_label_contains("device: cpu").is_none() {
        assert!(Instant::now() < deadline, "the system report never appeared in the Help window");
        h.step();
        std::thread::sleep(Duration::from_millis(5));
    }
    for needle in ["compute dtype", "RMS norm", "BLAS"] {
        assert!(h.query_all_by_label_contains(needle).next().is_some(), "the report lacks {needle}");
    }
    assert!(h.query_by_label("Copy").is_some(), "the report can be copied");
}

#[test]
fn load_progress_arrives_and_the_memory_card_fixes_a_run_that_does_not_fit() {
    use metal_candle::engine::estimate;
    use metal_candle::engine::train::Checkpointing;
    let tmp = tempfile::tempdir().unwrap();
    let mut h = harness(test_prefs(&tmp.path().join("runs"), 3));
    load_fixture_model(&mut h);
    let progress = app(&h).model.load_progress.expect("the loader reported its progress");
    assert!(progress.bytes_total > 0 && progress.bytes_done == progress.bytes_total, "{progress:?}");
    goto(&mut h, Page::Settings);
    click(&mut h, "on");
    assert_eq!(app(&h).prefs.train.checkpointing, Checkpointing::On);
    click(&mut h, "auto");
    assert_eq!(app(&h).prefs.train.checkpointing, Checkpointing::Auto);
    click(&mut h, "off");
    assert_eq!(app(&h).prefs.train.checkpointing, Checkpointing::Off);
    // A memory budget the run fits only with checkpointing: the card warns and offers it as one click.
    let shape = app(&h).model.loaded.as_ref().unwrap().shape.clone();
    let train = app(&h).prefs.train.clone();
    let without = estimate::training_memory_with(&shape, &train, false).total_bytes();
    let with = estimate::training_memory_with(&shape, &train, true).total_bytes();
    assert!(with < without);
    app_mut(&mut h).model.loaded.as_mut().unwrap().memory_budget_bytes = Some((with + without) / 2);
    h.step();
    h.step();
    assert!(h.query_by_label_contains("it would swap or fail").is_some(), "the card warns");
    h.get_by_label_contains("Fix: turn gradient checkpointing on").click_accesskit();
    h.step();
    h.step();
    assert_eq!(app(&h).prefs.train.checkpointing, Checkpointing::On, "one click applies the fix");
    assert!(h.query_by_label_contains("it would swap or fail").is_none(), "the run fits now");
}

#[test]
fn the_dataset_page_shows_the_detected_format_and_maps_columns() {
    let tmp = tempfile::tempdir().unwrap();
    let datasets = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/datasets");
    let mut h = harness(test_prefs(&tmp.path().join("runs"), 2));

    // A Hub dataset repo: two train shards and a test shard, detected as chat.
    open_dataset(&mut h, &datasets.join("hub"));
    h.step();
    assert!(h.query_by_label("data/train-00000-of-00002.parquet + 1 more").is_some(), "the split's files");
    assert_eq!(h.query_all_by_label("chat (detected from row 1)").count(), 2, "train and test");
    assert!(h.query_by_label_contains("Format: train: chat (detected from row 1)").is_some());

    // question/answer columns: read as GRPO prompts until the user maps them to completions.
    open_dataset(&mut h, &datasets.join("qa.jsonl"));
    h.step();
    assert!(h.query_by_label_contains("Format: train: prompts (detected from line 1)").is_some());
    click(&mut h, "Read the rows as another format, or map columns");
    click(&mut h, "completions");
    assert_eq!(app(&h).prefs.train.data_format, metal_candle::engine::data::FormatChoice::Completions);
    step_until(&mut h, "the rows read as completions", 30, |a| !a.dataset_panel.is_inspecting());
    assert!(h.query_by_label_contains("Map prompt and completion: the file has no column of that name").is_some());
    for (field, column) in [("prompt =", "question"), ("completion =", "answer")] {
        click(&mut h, field);
        click(&mut h, column);
        // Each choice reads the rows again with it; the page keeps its card while that runs.
        step_until(&mut h, "the rows read with the mapping", 30, |a| !a.dataset_panel.is_inspecting());
    }
    let columns = &app(&h).prefs.train.data_columns;
    assert_eq!(columns.to_string(), "completion=answer,prompt=question");
    assert!(h
        .query_by_label("Training reads the rows as: completions with columns completion=answer,prompt=question")
        .is_some());
    assert!(h.query_by_label_contains("--format completions --columns completion=answer,prompt=question").is_some());
    // The run the studio would start reads the rows that way.
    let config = app(&h).prefs.train.read_options();
    let raw = metal_candle::engine::data::load_raw_dataset(
        &datasets.join("qa.jsonl"),
        &metal_candle::engine::data::DataOptions { read: config, ..Default::default() },
    )
    .unwrap();
    assert_eq!(raw.train.rows.len() + raw.valid.map_or(0, |v| v.rows.len()), 3);

    // Another dataset starts from detection again.
    open_dataset(&mut h, &datasets.join("ambiguous.jsonl"));
    h.step();
    assert!(app(&h).prefs.train.read_options().is_default());
    assert!(h.query_by_label_contains("columns of several formats (alpaca, completions)").is_some());
    assert!(h.query_by_label("alpaca (candidate)").is_some());
}
