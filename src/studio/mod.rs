//! The studio: an eframe/egui desktop app over the engine. It talks to the engine only through
//! [`crate::worker`]'s commands and events; its panels hold plain numbers and strings.
//!
//! - `app`: the eframe app, persisted preferences, event routing, navigation;
//! - one file per page: `model_panel`, `dataset_panel`, `settings_panel`, `training_panel`,
//!   `checkpoints_panel`, `chat_panel`, `rank_panel`;
//! - `hub_panel`: the model page's Hugging Face search and the download card both data and model pages show;
//! - `widgets`: plots, progress, the token view, formatting; `file_picker`: native dialogs off the UI thread.
//!
//! Rules (settings validation, parameter and memory estimates, dataset reports) are the engine's; panels call
//! them and show their messages as the engine words them.

pub mod app;
pub mod chat_panel;
pub mod checkpoints_panel;
pub mod dataset_panel;
pub mod dataset_reading;
pub mod event_log;
pub mod export_dialog;
pub mod file_picker;
pub mod hub_panel;
pub mod model_panel;
pub mod rank_estimate;
pub mod rank_panel;
pub mod rank_plots;
pub mod reveal;
pub mod settings_panel;
pub mod training_panel;
pub mod widgets;

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
                crate::stop_signals::forward(move || ctx.send_viewport_cmd(egui::ViewportCommand::Close));
            }
            Ok(Box::new(StudioApp::new(&cc.egui_ctx, prefs, options)))
        }),
    )
    .map_err(|e| anyhow::anyhow!("cannot open the studio window: {e}"))
}
