//! The studio's Hugging Face journey, headless with egui_kittest against the local Hub stand-in: search on the
//! model page, pick a result, download it with progress, cancel and resume, the model loads; a dataset typed as a
//! repo id downloads and opens; a training run started from the studio records both origins.

#![cfg(feature = "studio")]

mod common;

use common::hub_server::{FakeRepo, HubServer};
use common::studio::{app, app_mut, step_until, StudioHarness};
use egui::accesskit::Role;
use egui_kittest::kittest::Queryable;
use metal_candle::engine::device::DeviceChoice;
use metal_candle::engine::hub::{HubSettings, RepoKind};
use metal_candle::studio::app::{studio_train_defaults, Page, Prefs, StudioOptions};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::Duration;

fn harness(server: &HubServer, cache: &Path, runs: &Path) -> StudioHarness {
    let mut settings = HubSettings::from_env(|_| None);
    settings.endpoint = server.url.clone();
    settings.cache_dir = cache.to_path_buf();
    settings.token_path = cache.join("token");
    settings.token = None;
    settings.first_backoff = Duration::from_millis(20);
    let mut prefs = Prefs { device: DeviceChoice::Cpu, auto_load_model: false, ..Prefs::default() };
    prefs.train = studio_train_defaults();
    prefs.train.out = runs.to_path_buf();
    prefs.train.iters = Some(2);
    prefs.train.batch_size = 2;
    prefs.train.seq_len = 64;
    prefs.train.val_every = 0;
    prefs.train.save_every = 0;
    let options = StudioOptions { discover_defaults: false, persist: false, hub: Some(settings), ..Default::default() };
    common::studio::build(prefs, options, 900.0, false)
}

fn click_button(h: &mut StudioHarness, label: &str) {
    // Long pages scroll: bring the button into view first, as a user would. The click goes through accesskit, as a
    // screen reader's would: toasts in the window's corner can sit over a button the pointer would hit.
    h.get_by_role_and_label(Role::Button, label).scroll_to_me();
    h.step();
    h.step();
    h.get_by_role_and_label(Role::Button, label).click_accesskit();
    h.step();
    h.step();
}

#[test]
fn search_pick_download_cancel_resume_and_load() {
    let mut model = FakeRepo::from_dir("models", "org/tiny-llama", &common::fixture("tiny-llama"));
    model.downloads = 9;
    let mut other = FakeRepo::new("models", "org/tiny-bert", vec![]).file("model.safetensors", vec![0; 64]);
    other.architecture = Some("bert".into());
    let data = FakeRepo::from_dir("datasets", "org/sample-chat", &common::cli::sample_data());
    let server = HubServer::start(vec![model, other, data], None);
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("hub");
    let mut h = harness(&server, &cache, &tmp.path().join("runs"));
    app_mut(&mut h).prefs.page = Page::Model;
    h.step();

    // Search.
    app_mut(&mut h).model_panel.hub.query = "tiny".into();
    click_button(&mut h, "Search");
    step_until(&mut h, "search results", 30, |a| !a.model_panel.hub.hits.is_empty());
    h.step();
    assert!(h.query_by_label("org/tiny-llama").is_some());
    assert!(h.query_by_label_contains("bert (not supported)").is_some(), "unsupported architectures are marked");

    // Pick the supported hit; a slow server lets us cancel midway.
    server.faults.chunk_delay_ms.store(60, Ordering::Relaxed);
    h.query_all_by_role_and_label(Role::Button, "Download and load").next().unwrap().click();
    step_until(&mut h, "download progress", 30, |a| {
        a.hub.download.as_ref().and_then(|d| d.progress.as_ref()).is_some_and(|p| p.bytes_done > 0)
    });
    h.step();
    assert!(h.query_by_label_contains("Downloading org/tiny-llama").is_some());
    click_button(&mut h, "Cancel");
    step_until(&mut h, "the cancel", 30, |a| a.hub.failed.as_ref().is_some_and(|f| f.cancelled));
    h.step();
    assert!(h.query_all_by_label_contains("what arrived is kept").next().is_some());

    // Resume: the model downloads and loads.
    server.faults.chunk_delay_ms.store(0, Ordering::Relaxed);
    click_button(&mut h, "Resume download");
    step_until(&mut h, "the model to load", 60, |a| a.model.loaded.is_some() || a.model.error.is_some());
    assert!(app(&h).model.error.is_none(), "{:?}", app(&h).model.error);
    let loaded = app(&h).model.loaded.as_ref().unwrap().path.clone();
    assert!(loaded.starts_with(cache.join("models--org--tiny-llama/snapshots")), "{}", loaded.display());
    assert!(app(&h).hub.origin_of(RepoKind::Model, &loaded).is_some());

    // A dataset typed as a repo id downloads and opens.
    app_mut(&mut h).prefs.page = Page::Dataset;
    h.step();
    app_mut(&mut h).prefs.dataset_input = "org/sample-chat".into();
    click_button(&mut h, "Open dataset");
    step_until(&mut h, "the dataset report", 60, |a| {
        a.prefs.dataset.as_ref().is_some_and(|d| d.starts_with(cache.join("datasets--org--sample-chat")))
            && a.dataset_panel.report.is_some()
            && !a.dataset_panel.is_inspecting()
    });

    // The dataset page searches datasets too; "Download and open" opens the pick (here already cached).
    // The click lands even when the page above the search changes between finding the button and the click's
    // frame (the dataset's rows arriving did that, and the click was lost).
    step_until(&mut h, "the dataset's rows", 60, |a| {
        a.dataset_panel.rows.page.is_some() && !a.dataset_panel.rows.is_waiting()
    });
    app_mut(&mut h).dataset_panel.hub.0.query = "sample".into();
    h.get_by_role_and_label(Role::Button, "Search").scroll_to_me();
    h.step();
    h.step();
    h.get_by_role_and_label(Role::Button, "Search").click_accesskit();
    app_mut(&mut h).dataset_panel.rows.reset();
    h.step();
    assert!(app(&h).dataset_panel.hub.0.is_searching() || !app(&h).dataset_panel.hub.0.hits.is_empty());
    step_until(&mut h, "dataset search results", 30, |a| !a.dataset_panel.hub.0.hits.is_empty());
    assert!(app(&h).model_panel.hub.hits.iter().all(|hit| hit.id != "org/sample-chat"), "searches stay on their page");
    h.step();
    click_button(&mut h, "Download and open");
    step_until(&mut h, "the dataset to reopen", 30, |a| a.hub.download.is_none() && a.hub.data_origin.is_some());

    // Training from the studio records both origins in run.json.
    app_mut(&mut h).prefs.page = Page::Training;
    h.step();
    let runs = tmp.path().join("runs");
    h.get_by_label("Start training").click();
    step_until(&mut h, "the run to finish", 120, |a| {
        !a.training_panel.is_active() && a.training_panel.steps_received > 0
    });
    let run_json =
        std::fs::read_dir(&runs).unwrap().flatten().map(|e| e.path().join("run.json")).find(|p| p.exists()).unwrap();
    let run: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(run_json).unwrap()).unwrap();
    assert_eq!(run["config"]["model_source"]["repo"], "org/tiny-llama");
    assert_eq!(run["config"]["data_source"]["repo"], "org/sample-chat");
}

#[test]
fn an_empty_first_launch_offers_a_starter_model_that_downloads_and_loads() {
    let starter = metal_candle::studio::starter_model::STARTER_REPO;
    let server = HubServer::start(vec![FakeRepo::from_dir("models", starter, &common::fixture("tiny-llama"))], None);
    let tmp = tempfile::tempdir().unwrap();
    let mut h = harness(&server, &tmp.path().join("hub"), &tmp.path().join("runs"));
    app_mut(&mut h).prefs.page = Page::Model;
    step_until(&mut h, "the scan for models on this machine", 60, |a| !a.model_panel.is_scanning());
    // A machine with no models at all (this checkout's ./models holds the test suite's SmolLM2).
    app_mut(&mut h).model_panel.on_models_found(Vec::new());
    h.step();
    assert!(h.query_by_label("New here? Start with a small model").is_some(), "the empty model page offers one");
    click_button(&mut h, "Download and load SmolLM2-135M");
    step_until(&mut h, "the starter model to download and load", 60, |a| {
        a.model.loaded.is_some() || a.model.error.is_some() || a.hub.failed.is_some()
    });
    let a = app(&h);
    assert!(a.model.loaded.is_some(), "error: {:?} / {:?}", a.model.error, a.hub.failed.as_ref().map(|f| &f.message));
    h.step();
    assert!(h.query_by_label("New here? Start with a small model").is_none(), "the offer is gone once a model loads");
}
