//! Frame time while a training run streams events: the studio, headless under egui_kittest, trains the tiny
//! fixture model (hundreds of step events a second) on the Training page, and every frame is timed. The UI
//! thread only ever `try_recv`s under a time budget, so a frame never waits on the worker.
//!
//! Prints a JSON report (copied into BENCHMARKS.md); asserts only loose bounds so it cannot flake on a busy
//! machine. Run alone for clean numbers:
//! `cargo test --release --test studio_frame_time -- --nocapture`

#![cfg(feature = "studio")]

use egui_kittest::kittest::Queryable;
use egui_kittest::Harness;
use metal_candle::engine::device::DeviceChoice;
use metal_candle::studio::app::{studio_train_defaults, Page, Prefs, StudioApp, StudioOptions};
use metal_candle::studio::training_panel::RunStatus;
use std::path::Path;
use std::time::{Duration, Instant};

fn chat_line(q: &str, a: &str) -> String {
    serde_json::json!({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}).to_string()
}

#[test]
fn frames_stay_short_while_training_streams_events() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data.jsonl");
    let rows: Vec<String> =
        (0..32).map(|i| chat_line(&format!("Question number {i}?"), &format!("Answer {i}."))).collect();
    std::fs::write(&data, rows.join("\n") + "\n").unwrap();

    let mut prefs = Prefs { device: DeviceChoice::Cpu, auto_load_model: false, ..Prefs::default() };
    prefs.train = studio_train_defaults();
    prefs.train.out = tmp.path().join("runs");
    prefs.train.iters = Some(100_000);
    prefs.train.batch_size = 2;
    prefs.train.seq_len = 96;
    prefs.train.val_every = 50;
    prefs.train.val_batches = 1;
    prefs.train.save_every = 0;
    prefs.page = Page::Training;
    let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-llama");
    let options = StudioOptions {
        model: Some(model),
        data: Some(data),
        start_training: true,
        persist: false,
        ..Default::default()
    };
    let mut h = Harness::builder().with_size(egui::vec2(1360.0, 860.0)).build_ui_state(
        move |ui, state: &mut Option<StudioApp>| {
            let app = state.get_or_insert_with(|| StudioApp::new(ui.ctx(), prefs.clone(), options.clone()));
            app.ui_root(ui);
        },
        None::<StudioApp>,
    );
    let app = |h: &Harness<'_, Option<StudioApp>>| -> bool {
        h.state().as_ref().is_some_and(|a| a.training_panel.run.as_ref().is_some_and(|r| r.loss.len() >= 5))
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while !app(&h) {
        h.step();
        if Instant::now() > deadline {
            let a = h.state().as_ref().unwrap();
            panic!(
                "training did not start streaming within 120 s: model {:?}, dataset {:?} / {:?}, status {:?}, log {:?}",
                a.model.loaded.as_ref().map(|m| m.name()),
                a.dataset_panel.report.as_ref().map(|r| r.rows(metal_candle::engine::data::SplitName::Train)),
                a.dataset_panel.error,
                a.training_panel.status,
                a.training_panel.log
            );
        }
        std::thread::sleep(Duration::from_millis(2));
    }

    // Record a fixed wall-clock window of frames, as fast as the harness can draw them.
    h.state_mut().as_mut().unwrap().frames.recording_since = Some(Instant::now());
    let steps_before = h.state().as_ref().unwrap().training_panel.steps_received;
    h.state_mut().as_mut().unwrap().frames.steps_at_start = steps_before;
    let mut frame_ms = Vec::new();
    let window = Instant::now();
    while window.elapsed() < Duration::from_secs(10) {
        let t = Instant::now();
        h.step();
        frame_ms.push(t.elapsed().as_secs_f32() * 1e3);
        // About 60 frames a second, as a window would draw.
        std::thread::sleep(Duration::from_millis(16));
    }
    assert!(h.query_by_label("Stop").is_some());
    let a = h.state().as_ref().unwrap();
    let mut report = a.frames.report(a.training_panel.steps_received);
    frame_ms.sort_by(|x, y| x.total_cmp(y));
    let pct = |p: f64| frame_ms[((frame_ms.len() - 1) as f64 * p).round() as usize];
    report["harness_step"] =
        serde_json::json!({"p50_ms": pct(0.5), "p95_ms": pct(0.95), "p99_ms": pct(0.99), "max_ms": pct(1.0)});
    println!("{}", serde_json::to_string_pretty(&report).unwrap());

    let steps = report["train_steps_received"].as_u64().unwrap_or(0);
    assert!(steps > 20, "the run streamed only {steps} steps in 10 s");
    let drain_max = report["event_drain"]["max_ms"].as_f64().unwrap();
    assert!(drain_max < 100.0, "draining events took {drain_max} ms in one frame");

    // Close as the window does: the run stops after its step and saves. Returning with the run still inside
    // the engine would let the process's exit handlers free what it uses (a crash after the test passed).
    let app = h.state_mut().as_mut().unwrap();
    assert!(app.stop_jobs_and_wait(Duration::from_secs(60)), "the run did not stop within 60 s of closing");
    let status = &app.training_panel.status;
    assert_eq!(*status, RunStatus::Finished { stopped_early: true }, "log: {:?}", app.training_panel.log);
    let run = app.training_panel.run.as_ref().unwrap();
    assert!(!run.checkpoints.is_empty(), "closing saved no checkpoint");
}
