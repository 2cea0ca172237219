//! The studio: an eframe/egui desktop app over the engine. It talks to the engine only through
//! [`crate::worker`]'s commands and events; its panels hold plain numbers and strings.
//!
//! - `app`: the eframe app, persisted preferences, event routing, navigation;
//! - one file per page: `model_panel`, `dataset_panel`, `settings_panel`, `training_panel`,
//!   `checkpoints_panel`, `chat_panel`, `rank_panel`, `eval_page`;
//! - parts of pages in their own files: `dataset_reading` (format and columns), `dataset_rows` (paging and
//!   searching rows), `chat_adapter` (loading an adapter folder), `chat_transcript` and `chat_export` (the
//!   conversation and its export), `export_dialog` (exporting a checkpoint);
//! - `hub_panel`: the model page's Hugging Face search and the download card both data and model pages show;
//! - `widgets`: plots, progress, the token view, formatting; `file_picker`: native dialogs off the UI thread;
//! - `glossary`: what each setting means (hover texts and the Help window share it);
//! - `run_compare`, `run_rename`: the checkpoints page's compare-runs plot with its legend, and renaming a run;
//! - the training page's parts: `live_run` (what it shows of a run), `training_plots`, `event_log`,
//!   `run_history` (a run's recorded steps from metrics.jsonl) and `resume_offer` (an interrupted run);
//! - the Evaluate page's parts: `eval_setup` (its choices and the spec they make), `eval_setup_ui` (the setup
//!   cards), `eval_results` (the metrics table, saving the report), `eval_plot` (a metric against the step) and
//!   `eval_rows` (the per-row grid);
//! - `starter_model`: the first launch's one-click small model.
//!
//! Rules (settings validation, parameter and memory estimates, dataset reports) are the engine's; panels call
//! them and show their messages as the engine words them.

pub mod app;
pub mod best_marker;
pub mod chat_adapter;
pub mod chat_columns;
pub mod chat_export;
pub mod chat_panel;
pub mod chat_transcript;
pub mod checkpoints_panel;
pub mod dataset_panel;
pub mod dataset_reading;
pub mod dataset_rows;
pub mod eval_page;
pub mod eval_plot;
pub mod eval_results;
pub mod eval_rows;
pub mod eval_setup;
pub mod eval_setup_ui;
pub mod event_log;
pub mod export_dialog;
pub mod file_picker;
pub mod glossary;
pub mod gpu_count;
pub mod grpo_fields;
pub mod grpo_plots;
pub mod grpo_samples;
pub mod grpo_series;
pub mod hub_panel;
pub mod hub_status;
pub mod live_run;
pub mod method_settings;
pub mod model_panel;
pub mod panel_ctx;
pub mod plot_axes;
pub mod preference_fields;
pub mod preference_plots;
pub mod preference_series;
pub mod prefs;
pub mod rank_estimate;
pub mod rank_panel;
pub mod rank_plots;
pub mod resume_offer;
pub mod reveal;
pub mod reward_editor;
pub mod run_compare;
pub mod run_delete_dialog;
pub mod run_history;
pub mod run_notes;
pub mod run_rename;
pub mod run_status;
pub mod runs_table;
pub mod setting_rows;
pub mod settings_panel;
pub mod starter_model;
pub mod training_panel;
pub mod training_plots;
pub mod widgets;
pub mod xray_heatmap;
pub mod xray_spectrum;
pub mod xray_view;

pub use app::{Page, Prefs, StudioApp, StudioOptions};

/// Open the studio window and run until it is closed.
pub fn run(options: StudioOptions) -> anyhow::Result<()> {
    let native = eframe::NativeOptions {
        renderer: eframe::Renderer::Glow,
        viewport: egui::ViewportBuilder::default()
            .with_title("metal-candle studio")
            .with_app_id("metal-candle")
            .with_inner_size([1360.0, 860.0])
            .with_min_inner_size([900.0, 600.0])
            .with_drag_and_drop(true),
        persist_window: options.persist,
        ..Default::default()
    };
    eframe::run_native(
        "metal-candle",
        native,
        Box::new(move |cc| {
            let prefs = if options.persist {
                cc.storage.and_then(|s| eframe::get_value::<Prefs>(s, app::STORAGE_KEY)).unwrap_or_default()
            } else {
                Prefs::default()
            };
            // SIGINT/SIGTERM close the window through the normal exit path: a running training stops after its
            // step and saves (`StudioApp::on_exit`).
            if crate::stop_signals::install() {
                let ctx = cc.egui_ctx.clone();
                crate::stop_signals::forward(move || app::close_without_asking(&ctx));
            }
            Ok(Box::new(StudioApp::new(&cc.egui_ctx, prefs, options)))
        }),
    )
    .map_err(|e| anyhow::anyhow!("cannot open the studio window: {e}"))
}
