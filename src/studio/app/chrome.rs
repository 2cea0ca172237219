//! The frame around the pages: top bar, navigation with per-page hints, status bar, toasts, the
//! drag-and-drop overlay and the Help window (`help`).

use super::*;
use crate::worker::SplitName;

mod help;
pub(super) use help::HelpWindow;

impl StudioApp {
    pub(super) fn top_bar_ui(&mut self, ui: &mut Ui) {
        ui.horizontal(|ui| {
            ui.label(RichText::new("metal-candle").size(18.0).strong().color(palette::ACCENT));
            ui.label(RichText::new("LoRA studio").size(14.0).weak());
            ui.add_space(16.0);
            // Model chip.
            if let Some((path, started)) = &self.model.loading {
                ui.spinner();
                let percent = self.model.load_progress.map(|p| format!(" · {:.0}%", 100.0 * p.fraction()));
                ui.label(format!(
                    "loading {} · {:.0} s{}",
                    display_name(path),
                    started.elapsed().as_secs_f64(),
                    percent.unwrap_or_default()
                ));
            } else if let Some(m) = &self.model.loaded {
                widgets::status_dot_ui(ui, palette::OK);
                ui.label(RichText::new(m.name()).strong()).on_hover_text(format!(
                    "{} · {} parameters · {} · {}",
                    m.path.display(),
                    widgets::fmt_count(m.shape.parameters),
                    m.dtype,
                    m.device
                ));
                ui.label(RichText::new(format!("{} · {}", m.device, m.dtype)).weak());
            } else if self.model.error.is_some() {
                widgets::status_dot_ui(ui, palette::ERROR);
                ui.label(RichText::new("model failed to load").color(palette::ERROR));
            } else {
                widgets::status_dot_ui(ui, ui.visuals().weak_text_color());
                ui.label(RichText::new("no model").weak());
            }
            // Help and the training chip on the right.
            ui.with_layout(egui::Layout::right_to_left(egui::Align::Center), |ui| {
                let help =
                    ui.button("Help").on_hover_text("Quick start, what each setting means, shortcuts, system report");
                if help.clicked() {
                    self.help.show();
                }
                if let Some(run) = &self.training_panel.run {
                    let status = &self.training_panel.status;
                    if status.is_active() || run.step > 0 {
                        let fraction = if run.total_steps > 0 { run.step as f32 / run.total_steps as f32 } else { 0.0 };
                        let eta = match (status.is_active(), run.eta_secs) {
                            (true, Some(e)) => format!(" · ETA {}", widgets::fmt_secs(e)),
                            _ => String::new(),
                        };
                        let r = ui.add(
                            egui::ProgressBar::new(fraction.clamp(0.0, 1.0))
                                .desired_width(150.0)
                                .desired_height(14.0)
                                .fill(palette::ACCENT.gamma_multiply(0.8)),
                        );
                        if r.on_hover_text("Open the training page").clicked() {
                            self.prefs.page = Page::Training;
                        }
                        ui.label(format!(
                            "{} {}/{}{eta}",
                            self.training_panel.status_label(),
                            run.step,
                            run.total_steps
                        ));
                    }
                }
            });
        });
    }

    pub(super) fn nav_ui(&mut self, ui: &mut Ui) {
        ui.add_space(8.0);
        for page in Page::ALL {
            let selected = self.prefs.page == page;
            let (hint, color) = self.nav_hint(page);
            let button = egui::Button::selectable(selected, RichText::new(page.title()).size(15.0))
                .min_size(egui::vec2(ui.available_width(), 30.0));
            if ui.add(button).clicked() {
                self.prefs.page = page;
            }
            if let Some(hint) = hint {
                ui.horizontal(|ui| {
                    ui.add_space(10.0);
                    ui.add(egui::Label::new(RichText::new(hint).small().color(color)).truncate());
                });
            }
            ui.add_space(4.0);
        }
        ui.with_layout(egui::Layout::bottom_up(egui::Align::LEFT), |ui| {
            ui.add_space(6.0);
            let mut dark = ui.visuals().dark_mode;
            if ui.checkbox(&mut dark, "Dark theme").changed() {
                ui.ctx().set_theme(if dark { egui::Theme::Dark } else { egui::Theme::Light });
            }
        });
    }

    /// The small status line under a navigation entry.
    pub(super) fn nav_hint(&self, page: Page) -> (Option<String>, egui::Color32) {
        let weak = palette::MASKED_FG;
        match page {
            Page::Model => match (&self.model.loaded, &self.model.loading, &self.model.error) {
                (_, Some(_), _) => (Some("loading…".into()), palette::WARN),
                (Some(m), _, _) => (Some(m.name()), palette::OK),
                (None, _, Some(_)) => (Some("failed to load".into()), palette::ERROR),
                _ => (Some("none loaded".into()), weak),
            },
            Page::Dataset => match (&self.dataset_panel.report, &self.dataset_panel.error) {
                (_, Some(_)) => (Some("cannot read".into()), palette::ERROR),
                (Some(r), _) if r.problem_count() > 0 => {
                    (Some(format!("{} invalid rows", r.problem_count())), palette::ERROR)
                }
                (Some(r), _) => (Some(format!("{} train {}", r.rows(SplitName::Train), r.rows_word())), palette::OK),
                _ => (Some("none open".into()), weak),
            },
            Page::Settings => {
                let l = &self.prefs.train.lora;
                (Some(format!("rank {} · α {}{}", l.rank, l.alpha, if l.dora { " · DoRA" } else { "" })), weak)
            }
            Page::Training => {
                let s = &self.training_panel.status;
                let color = match s {
                    crate::studio::training_panel::RunStatus::Running => palette::OK,
                    crate::studio::training_panel::RunStatus::Failed(_) => palette::ERROR,
                    _ => weak,
                };
                (Some(self.training_panel.status_label()), color)
            }
            Page::Checkpoints => {
                let n: usize = self.checkpoints_panel.runs.iter().map(|r| r.checkpoints.len()).sum();
                (Some(format!("{} runs · {n} checkpoints", self.checkpoints_panel.runs.len())), weak)
            }
            Page::Evaluate => match self.eval_page.nav_hint() {
                Some((hint, color)) => (Some(hint), color),
                None => (None, weak),
            },
            Page::Chat => {
                if self.chat_panel.is_generating() {
                    (Some("generating…".into()), palette::OK)
                } else if let Some(a) = &self.chat_panel.adapter {
                    (Some(a.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()), weak)
                } else {
                    (Some("base model".into()), weak)
                }
            }
            Page::Ranks => {
                if self.rank_panel.running {
                    (Some("probing…".into()), palette::OK)
                } else if !self.rank_panel.results.is_empty() {
                    (Some(format!("{} ranks probed", self.rank_panel.results.len())), weak)
                } else {
                    (None, weak)
                }
            }
        }
    }

    pub(super) fn status_bar_ui(&mut self, ui: &mut Ui) {
        ui.horizontal(|ui| {
            ui.label(RichText::new(format!("runs folder: {}", self.prefs.train.out.display())).small().weak());
            ui.separator();
            ui.label(
                RichText::new(format!(
                    "UI frame {:.1} ms · {} events waiting",
                    self.frames.last_ui_ms,
                    self.worker.pending_events()
                ))
                .small()
                .weak(),
            )
            .on_hover_text("Time this frame spent building the interface, and worker events not yet drawn");
            if self.frames.recording_since.is_some() {
                ui.separator();
                ui.label(RichText::new("measuring frame times…").small().color(palette::ACCENT));
            }
        });
    }

    pub(super) fn toasts_ui(&mut self, ctx: &egui::Context) {
        self.toasts.retain(|t| t.shown.elapsed() < Duration::from_secs(6));
        if self.toasts.is_empty() {
            return;
        }
        ctx.request_repaint_after(Duration::from_millis(500));
        egui::Area::new(egui::Id::unique("toasts"))
            .anchor(egui::Align2::RIGHT_BOTTOM, egui::vec2(-16.0, -36.0))
            .order(egui::Order::Foreground)
            .interactable(false)
            .show(ctx, |ui| {
                for t in &self.toasts {
                    egui::Frame::popup(ui.style()).show(ui, |ui| {
                        ui.set_max_width(420.0);
                        ui.horizontal(|ui| {
                            widgets::status_dot_ui(ui, t.tone.color());
                            ui.add(egui::Label::new(t.text.as_str()).wrap());
                        });
                    });
                    ui.add_space(4.0);
                }
            });
    }

    pub(super) fn handle_dropped_files(&mut self, ctx: &egui::Context) {
        let dropped: Vec<PathBuf> = ctx.input(|i| i.raw.dropped_files.iter().map(|f| f.path().to_path_buf()).collect());
        for path in dropped {
            match classify_drop(&path) {
                Some(Dropped::Model) => {
                    self.prefs.page = Page::Model;
                    self.actions.push(Action::LoadModel(path));
                }
                Some(Dropped::Dataset) => {
                    self.prefs.page = Page::Dataset;
                    self.actions.push(Action::OpenDataset(path));
                }
                None => self.toast(Tone::Warn, format!("{} is neither a model nor a dataset", path.display())),
            }
        }
    }

    pub(super) fn drop_overlay_ui(&self, ctx: &egui::Context) {
        let hovering = ctx.input(|i| !i.raw.hovered_files.is_empty());
        if !hovering {
            return;
        }
        let screen = ctx.content_rect();
        let painter = ctx.layer_painter(egui::LayerId::new(egui::Order::Foreground, egui::Id::unique("drop-overlay")));
        painter.rect_filled(screen, 0.0, egui::Color32::from_black_alpha(170));
        painter.text(
            screen.center(),
            egui::Align2::CENTER_CENTER,
            "Drop a model (.gguf or folder) or a dataset (.jsonl, .json, .parquet or folder)",
            egui::FontId::proportional(22.0),
            egui::Color32::WHITE,
        );
    }
}

impl StudioApp {
    /// The Help window; its buttons switch pages and ask the worker for the system report.
    pub(super) fn help_window_ui(&mut self, ctx: &egui::Context) {
        let clicks = self.help.ui(ctx);
        if let Some(page) = clicks.goto {
            self.prefs.page = page;
        }
        if clicks.diagnose {
            self.worker.send(Command::Diagnose);
        }
    }
}
