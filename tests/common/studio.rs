//! Driving the studio headless with egui_kittest: a harness whose app is built on the harness's own context in
//! the first frame, access to the app, and waits that step the UI with a deadline (a broken worker fails the test
//! instead of hanging it).

use egui_kittest::kittest::Queryable;
use egui_kittest::Harness;
use metal_candle::studio::app::{Page, Prefs, StudioApp, StudioOptions};
use std::time::{Duration, Instant};

pub type StudioHarness = Harness<'static, Option<StudioApp>>;

/// A 1360 x `height` window. A missing glyph in the studio's own text fails the test; chats with the random
/// fixture models emit arbitrary bytes, so those tests allow them (`model_text`).
pub fn build(prefs: Prefs, options: StudioOptions, height: f32, model_text: bool) -> StudioHarness {
    let mut builder = Harness::builder().with_size(egui::vec2(1360.0, height));
    if model_text {
        builder = builder.allow_missing_glyphs();
    }
    builder.build_ui_state(
        move |ui, state: &mut Option<StudioApp>| {
            let app = state.get_or_insert_with(|| StudioApp::new(ui.ctx(), prefs.clone(), options.clone()));
            app.ui_root(ui);
        },
        None,
    )
}

pub fn app(h: &StudioHarness) -> &StudioApp {
    h.state().as_ref().expect("the app is built in the first frame")
}

pub fn app_mut(h: &mut StudioHarness) -> &mut StudioApp {
    h.state_mut().as_mut().expect("the app is built in the first frame")
}

/// Step frames until `cond` holds, failing after `secs` seconds.
pub fn step_until(h: &mut StudioHarness, what: &str, secs: u64, cond: impl Fn(&StudioApp) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        h.step();
        if cond(app(h)) {
            return;
        }
        assert!(Instant::now() < deadline, "timed out after {secs} s waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The studio `height` points tall with `prefs`, whose model is loaded (the Load model button on the first
/// page), and the bundled sample dataset read with its token lengths.
pub fn with_model_and_sample(prefs: Prefs, height: f32) -> StudioHarness {
    let options = StudioOptions { discover_defaults: false, persist: false, ..Default::default() };
    with_model_and_sample_options(prefs, options, height)
}

/// [`with_model_and_sample`] with `options`.
pub fn with_model_and_sample_options(prefs: Prefs, options: StudioOptions, height: f32) -> StudioHarness {
    let mut h = build(prefs, options, height, false);
    h.step();
    h.get_by_label("Load model").click();
    step_until(&mut h, "the model", 60, |a| a.model.loaded.is_some());
    let sample = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/sample-chat");
    app_mut(&mut h).prefs.page = Page::Dataset;
    app_mut(&mut h).prefs.dataset_input = sample.display().to_string();
    h.step();
    h.get_by_label("Open dataset").click();
    step_until(&mut h, "token statistics", 60, |a| {
        a.dataset_panel.report.as_ref().is_some_and(|r| r.tokens.is_some()) && !a.dataset_panel.is_inspecting()
    });
    h
}

/// Click the widget labelled `label` and let two frames pass (the click's effect, then its layout).
pub fn click(h: &mut StudioHarness, label: &str) {
    h.get_by_label(label).click();
    h.step();
    h.step();
}

/// Go to `page` through the navigation, as a user would.
pub fn goto(h: &mut StudioHarness, page: Page) {
    click(h, page.title());
    assert_eq!(app(h).prefs.page, page);
}
