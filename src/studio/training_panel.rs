//! The training page: start, pause and stop a run on the worker; live plots of train loss (raw and smoothed),
//! validation loss, learning rate and tokens/s; a progress bar with ETA; and an event log. Events arrive
//! through the app's drain each frame; this panel only keeps numbers. A resumed run's plots start at step 1
//! (the steps before the resume come from its metrics.jsonl), and after a restart an interrupted run is shown
//! with an offer to resume it.

use super::best_marker::best_so_far_ui;
use super::event_log::EventLog;
pub use super::live_run::LiveRun;
use super::method_settings::{fits_data, method_mismatch, mismatch_ui};
use super::panel_ctx::{Action, PanelCtx};
use super::resume_offer::{interrupted_run, OfferChoice, ResumeOffer};
use super::run_history::PendingHistory;
pub use super::run_status::RunStatus;
use super::settings_panel::ready_config;
use super::training_plots::plots_ui;
use super::widgets::{self, banner_ui, card_ui, fmt_count, fmt_loss, fmt_sci, fmt_secs, palette, Tone};
use crate::engine::train::run_folder::RunInfo;
use crate::engine::train::TrainEvent;
use crate::worker::Command;
use egui::{RichText, Ui};
use egui_plot::PlotPoint;
use std::path::PathBuf;

pub struct TrainingPanel {
    pub status: RunStatus,
    pub run: Option<LiveRun>,
    pub log: EventLog,
    /// Steps received since the studio opened (all runs), for the frame-time measurement.
    pub steps_received: usize,
    /// An interrupted run found after a restart, until it is resumed, dismissed or another run starts.
    pub offer: Option<ResumeOffer>,
    /// The run folder whose offer was dismissed (it is not offered again this session).
    dismissed: Option<PathBuf>,
    /// Recorded steps being read for the run shown: the part before a resume, or an interrupted run.
    history: Option<PendingHistory>,
}

impl Default for TrainingPanel {
    fn default() -> Self {
        Self {
            status: RunStatus::Idle,
            run: None,
            log: EventLog::default(),
            steps_received: 0,
            offer: None,
            dismissed: None,
            history: None,
        }
    }
}

impl TrainingPanel {
    pub fn is_active(&self) -> bool {
        self.status.is_active()
    }

    /// The status in a word, for the page and the top bar: "interrupted" while an interrupted run is shown.
    pub fn status_label(&self) -> String {
        if self.status == RunStatus::Idle && self.offer.is_some() {
            return "interrupted".into();
        }
        self.status.label()
    }

    fn log(&mut self, tone: Tone, text: impl Into<String>) {
        // Stamped with the run's training time (what its plots and metrics use), not the studio's uptime.
        let at_secs = self.run.as_ref().map(|r| r.elapsed_secs).unwrap_or(0.0);
        self.log.push(at_secs, tone, text.into());
    }

    /// A start was requested (the worker answers with `Started` or `Failed`).
    pub fn on_start_requested(&mut self, config: &crate::engine::train::TrainConfig) {
        self.status = RunStatus::Starting;
        self.offer = None;
        self.history = None;
        self.run = Some(LiveRun::pending());
        let what = match &config.resume {
            Some(ckpt) => format!("resuming from {}", ckpt.display()),
            None => format!("new run on {}", config.data.display()),
        };
        self.log(Tone::Info, format!("start requested: {what}"));
    }

    /// Fold one training event into the plots and the log. Returns an action for the app when the event
    /// changes what other pages show (a checkpoint appeared, the run ended).
    pub fn on_event(&mut self, event: TrainEvent, smoothing: f64) -> Option<Action> {
        match event {
            TrainEvent::Started { .. } => self.on_started(event),
            TrainEvent::Step { .. } => self.on_step(event, smoothing),
            TrainEvent::Samples { step, samples } => {
                self.live().grpo.push_samples(step, samples);
                None
            }
            TrainEvent::Eval { step, val_loss, perplexity, best, preference, grpo } => {
                self.live().val_loss.push(PlotPoint::new(step as f64, val_loss));
                if let Some(m) = &preference {
                    self.live().preference.push_eval(step, m);
                }
                if let Some(m) = &grpo {
                    self.live().grpo.push_eval(step, m);
                }
                if best {
                    self.live().best = Some((step, val_loss));
                }
                let new_best = if best { ", new best" } else { "" };
                let loss = fmt_loss(val_loss);
                let rewards = preference.map_or(String::new(), |m| {
                    format!(
                        ", eval_rewards/accuracies {:.3}, eval_rewards/margins {:.3}",
                        m.rewards_accuracies, m.rewards_margins
                    )
                });
                self.log(
                    Tone::Ok,
                    format!(
                        "eval at step {step}: validation loss {loss} (perplexity {perplexity:.2}{new_best}){rewards}"
                    ),
                );
                None
            }
            TrainEvent::CheckpointsRemoved { paths, .. } => {
                self.live().checkpoints.retain(|(_, p)| !paths.contains(p));
                let names: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
                self.log(
                    Tone::Info,
                    format!("removed {} (checkpoint limit: the newest and the best stay)", names.join(", ")),
                );
                Some(Action::RefreshRuns)
            }
            TrainEvent::CheckpointSaved { step, path } => {
                self.live().checkpoints.push((step, path.clone()));
                self.log(Tone::Ok, format!("checkpoint saved at step {step}: {}", path.display()));
                Some(Action::RefreshRuns)
            }
            TrainEvent::Paused { step } => {
                self.status = RunStatus::Paused;
                self.log(Tone::Warn, format!("paused at step {step}"));
                None
            }
            TrainEvent::Resumed { step } => {
                self.status = RunStatus::Running;
                self.log(Tone::Info, format!("resumed at step {step}"));
                None
            }
            TrainEvent::Finished { .. } => self.on_finished(event),
            TrainEvent::Failed { step, message, kind } => {
                self.live().eta_secs = None;
                self.log(Tone::Error, format!("failed at step {step} ({}): {message}", kind.label()));
                self.status = RunStatus::Failed(message);
                Some(Action::RefreshRuns)
            }
        }
    }

    /// The run being shown (created when an event arrives without a start request, e.g. after a restart).
    fn live(&mut self) -> &mut LiveRun {
        self.run.get_or_insert_with(LiveRun::default)
    }

    fn on_started(&mut self, event: TrainEvent) -> Option<Action> {
        let TrainEvent::Started {
            run_dir,
            trainable_params,
            total_steps,
            train_examples,
            valid_examples,
            truncated_examples,
            start_step,
            tokens_per_epoch,
            notes,
            config,
            ..
        } = event
        else {
            return None;
        };
        let run = self.live();
        run.run_dir = Some(run_dir.clone());
        run.total_steps = total_steps;
        run.start_step = start_step;
        run.step = start_step;
        run.trainable_params = trainable_params;
        run.train_examples = train_examples;
        run.valid_examples = valid_examples;
        run.method = Some(crate::engine::train::run_table::method_text(&config));
        self.status = RunStatus::Running;
        if start_step > 0 {
            self.history = Some(PendingHistory::spawn(&run_dir, Some(start_step)));
        }
        self.log(
            Tone::Info,
            format!(
                "started {}: {total_steps} steps, {} trainable parameters, {train_examples} train / {valid_examples} valid examples, {} tokens per epoch{}{}",
                run_dir.display(),
                fmt_count(trainable_params),
                fmt_count(tokens_per_epoch),
                if truncated_examples > 0 { format!(", {truncated_examples} truncated") } else { String::new() },
                if start_step > 0 { format!(", resuming at step {start_step}") } else { String::new() },
            ),
        );
        for note in notes {
            self.log(Tone::Warn, note);
        }
        Some(Action::RefreshRuns)
    }

    fn on_step(&mut self, event: TrainEvent, smoothing: f64) -> Option<Action> {
        let TrainEvent::Step {
            step,
            total_steps,
            loss,
            lr,
            grad_norm,
            tokens_per_sec,
            trained_tokens,
            elapsed_secs,
            eta_secs,
            preference,
            grpo,
        } = event
        else {
            return None;
        };
        self.steps_received += 1;
        let run = self.live();
        let x = step as f64;
        run.push_loss(x, loss, smoothing);
        run.lr.push(PlotPoint::new(x, lr));
        run.tokens_per_sec_series.push(PlotPoint::new(x, tokens_per_sec));
        run.grad_norm.push(PlotPoint::new(x, grad_norm));
        if let Some(m) = &preference {
            run.preference.push_step(step, m);
        }
        if let Some(m) = &grpo {
            run.grpo.push_step(step, m);
        }
        run.step = step;
        run.total_steps = total_steps;
        run.elapsed_secs = elapsed_secs;
        run.eta_secs = Some(eta_secs);
        run.tokens_per_sec = Some(tokens_per_sec);
        run.trained_tokens = trained_tokens;
        if self.status == RunStatus::Starting {
            self.status = RunStatus::Running;
        }
        let every = (total_steps / 100).max(1);
        if step % every == 0 || step == total_steps || step <= 3 {
            self.log(
                Tone::Info,
                format!(
                    "step {step}/{total_steps}  loss {}  lr {}  grad norm {grad_norm:.3}  {tokens_per_sec:.0} tok/s",
                    fmt_loss(loss),
                    fmt_sci(lr)
                ),
            );
        }
        None
    }

    fn on_finished(&mut self, event: TrainEvent) -> Option<Action> {
        let TrainEvent::Finished { step, final_loss, final_val_loss, stopped_early, elapsed_secs, early_stop } = event
        else {
            return None;
        };
        let run = self.live();
        run.step = step;
        run.early_stop = early_stop.map(|e| e.reason());
        if let Some(reason) = run.early_stop.clone() {
            self.log(Tone::Warn, reason);
        }
        let run = self.live();
        if elapsed_secs > 0.0 {
            run.elapsed_secs = elapsed_secs;
        }
        run.eta_secs = None;
        self.status = RunStatus::Finished { stopped_early };
        self.log(
            Tone::Ok,
            format!(
                "{} at step {step} after {}: final loss {}, validation loss {}",
                if stopped_early { "stopped" } else { "finished" },
                fmt_secs(elapsed_secs),
                final_loss.map(fmt_loss).unwrap_or_else(|| "–".into()),
                final_val_loss.map(fmt_loss).unwrap_or_else(|| "–".into()),
            ),
        );
        Some(Action::RefreshRuns)
    }

    pub fn ui(&mut self, ui: &mut Ui, ctx: &mut PanelCtx<'_>) {
        widgets::page_header_ui(
            ui,
            "Training",
            "Runs on a worker thread; the plots stream live and the window stays responsive.",
        );
        self.controls_ui(ui, ctx);
        ui.add_space(6.0);
        self.take_history(ui.ctx());
        self.offer_ui(ui, ctx);
        let smoothing = ctx.prefs.smoothing as f64;
        if let Some(run) = &mut self.run {
            run.follow_smoothing(smoothing);
        }
        egui::ScrollArea::vertical().id_salt("training-page").auto_shrink([false; 2]).show(ui, |ui| {
            if let Some(run) = &mut self.run {
                card_ui(ui, |ui| {
                    ui.set_width(ui.available_width());
                    widgets::run_progress_ui(
                        ui,
                        run.step,
                        run.total_steps,
                        run.elapsed_secs,
                        run.eta_secs,
                        run.tokens_per_sec,
                    );
                    if let Some(reason) = &run.early_stop {
                        banner_ui(ui, Tone::Info, reason);
                    }
                    ui.horizontal_wrapped(|ui| {
                        if let Some(method) = &run.method {
                            ui.label(RichText::new(format!("method {method}")).strong());
                            ui.separator();
                        }
                        if let Some(dir) = &run.run_dir {
                            ui.label(RichText::new(format!("run folder {}", dir.display())).weak());
                        }
                        if let Some(p) = run.loss.last() {
                            ui.separator();
                            ui.label(format!("loss {}", fmt_loss(p.y)));
                        }
                        if let Some(p) = run.val_loss.last() {
                            ui.separator();
                            ui.label(RichText::new(format!("val loss {}", fmt_loss(p.y))).color(palette::VALID));
                        }
                        super::preference_plots::status_ui(ui, &run.preference);
                        super::grpo_plots::status_ui(ui, &run.grpo);
                        best_so_far_ui(ui, run.best);
                        ui.separator();
                        ui.label(format!("{} trained tokens", fmt_count(run.trained_tokens)));
                        if !run.checkpoints.is_empty() {
                            ui.separator();
                            let n = run.checkpoints.len();
                            ui.label(format!("{n} checkpoint{}", if n == 1 { "" } else { "s" }));
                        }
                    });
                });
                ui.add_space(6.0);
                plots_ui(ui, run, &mut ctx.prefs.smoothing);
                super::grpo_samples::samples_ui(ui, &mut run.grpo);
            } else {
                banner_ui(
                    ui,
                    Tone::Info,
                    "No run yet. Load a model, open a dataset, check the LoRA settings, then press Start training.",
                );
            }
            ui.add_space(6.0);
            self.log.ui(ui);
        });
    }

    /// Stop the run after its current step; the worker saves a final checkpoint.
    pub fn request_stop(&mut self, actions: &mut Vec<Action>) {
        actions.push(Action::Send(Command::StopTraining));
        self.status = RunStatus::Stopping;
        self.log(Tone::Warn, "stop requested");
    }

    /// The run list changed: offer the newest run if it was interrupted, and show its recorded plots, unless a
    /// run was started or shown this session.
    pub fn on_runs(&mut self, runs: &[RunInfo]) {
        if self.status != RunStatus::Idle || self.run.is_some() && self.offer.is_none() {
            return;
        }
        let offer = interrupted_run(runs).filter(|o| self.dismissed.as_ref() != Some(&o.run_dir));
        if offer.as_ref().map(|o| &o.run_dir) != self.offer.as_ref().map(|o| &o.run_dir) {
            self.run = None;
            self.history = offer.as_ref().map(|o| PendingHistory::spawn(&o.run_dir, None));
        }
        self.offer = offer;
    }

    /// Fold in a history that finished reading: before a resumed run's live steps, or as the interrupted run.
    fn take_history(&mut self, ctx: &egui::Context) {
        let Some(pending) = &self.history else { return };
        let Some(history) = pending.poll() else {
            ctx.request_repaint_after(std::time::Duration::from_millis(50));
            return;
        };
        let run_dir = pending.run_dir.clone();
        self.history = None;
        match &mut self.run {
            Some(run) if run.run_dir.as_ref() == Some(&run_dir) => run.merge_history(history),
            None if self.offer.as_ref().is_some_and(|o| o.run_dir == run_dir) => {
                self.run = Some(LiveRun::from_history(run_dir, history));
            }
            _ => {}
        }
    }

    /// The interrupted run's card, while the studio is idle and the resume is not already set up.
    fn offer_ui(&mut self, ui: &mut Ui, ctx: &mut PanelCtx<'_>) {
        let Some(offer) = &self.offer else { return };
        if self.status.is_active()
            || offer.checkpoint.as_ref().is_some_and(|(c, _)| ctx.prefs.train.resume.as_ref() == Some(c))
        {
            return;
        }
        let elapsed = self.run.as_ref().map(|r| r.elapsed_secs).unwrap_or(0.0);
        match offer.ui(ui, elapsed) {
            Some(OfferChoice::Resume) => {
                if let Some((checkpoint, config)) = offer.resume_from() {
                    ctx.actions.push(Action::ResumeFrom { checkpoint, config });
                }
            }
            Some(OfferChoice::Dismiss) => {
                self.dismissed = Some(offer.run_dir.clone());
                self.offer = None;
                self.run = None;
            }
            None => {}
        }
        ui.add_space(6.0);
    }

    fn controls_ui(&mut self, ui: &mut Ui, ctx: &mut PanelCtx<'_>) {
        let ready = ready_config(ctx.prefs, ctx.model.loaded.as_ref(), ctx.prefs.dataset.as_ref())
            .and_then(|cfg| fits_data(cfg, ctx.dataset));
        let mismatch = method_mismatch(&ctx.prefs.train, ctx.prefs.dataset.as_ref(), ctx.dataset);
        card_ui(ui, |ui| {
            ui.set_width(ui.available_width());
            ui.horizontal(|ui| {
                let active = self.status.is_active();
                let start_label = if ctx.prefs.train.resume.is_some() { "Resume training" } else { "Start training" };
                let start = ui
                    .add_enabled(
                        !active && ready.is_ok(),
                        egui::Button::new(RichText::new(start_label).strong()).min_size(egui::vec2(120.0, 28.0)),
                    )
                    .on_hover_text("Train an adapter with the current settings");
                let start = match &ready {
                    Err(reason) if !active => start.on_disabled_hover_text(reason.as_str()),
                    _ => start,
                };
                if start.clicked() {
                    ctx.actions.push(Action::StartTraining);
                }
                let paused = matches!(self.status, RunStatus::Paused | RunStatus::Pausing);
                let can_pause = matches!(self.status, RunStatus::Running | RunStatus::Paused);
                let pause_label = if paused { "Resume" } else { "Pause" };
                if ui
                    .add_enabled(can_pause, egui::Button::new(pause_label).min_size(egui::vec2(80.0, 28.0)))
                    .on_hover_text("Pause after the current step; the model stays loaded")
                    .clicked()
                {
                    if paused {
                        ctx.actions.push(Action::Send(Command::PauseTraining(false)));
                        self.status = RunStatus::Running;
                    } else {
                        ctx.actions.push(Action::Send(Command::PauseTraining(true)));
                        self.status = RunStatus::Pausing;
                    }
                }
                let can_stop = matches!(
                    self.status,
                    RunStatus::Running | RunStatus::Paused | RunStatus::Pausing | RunStatus::Starting
                );
                if ui
                    .add_enabled(can_stop, egui::Button::new("Stop").min_size(egui::vec2(80.0, 28.0)))
                    .on_hover_text("Stop after the current step and save a final checkpoint")
                    .clicked()
                {
                    self.request_stop(ctx.actions);
                }
                ui.add_space(12.0);
                let color = match &self.status {
                    RunStatus::Running => palette::OK,
                    RunStatus::Failed(_) => palette::ERROR,
                    RunStatus::Paused | RunStatus::Pausing | RunStatus::Stopping => palette::WARN,
                    _ => ui.visuals().weak_text_color(),
                };
                widgets::status_dot_ui(ui, color);
                ui.label(RichText::new(self.status_label()).color(color).strong());
                if !active {
                    ui.separator();
                    let method = crate::engine::train::run_table::method_text(&ctx.prefs.train);
                    ui.label(RichText::new(format!("method {method}")).weak())
                        .on_hover_text(ctx.prefs.train.method.describe());
                    let (gpus, on_host, batch) =
                        (&mut ctx.prefs.gpus, ctx.prefs.gpus_on_host, ctx.prefs.train.batch_size);
                    super::gpu_count::gpu_count_ui(ui, gpus, on_host, batch);
                }
            });
            if let Some(ckpt) = ctx.prefs.train.resume.clone() {
                ui.horizontal(|ui| {
                    ui.label(RichText::new(format!("Will resume from {}", ckpt.display())).color(palette::ACCENT));
                    if ui.small_button("Start fresh instead").clicked() {
                        ctx.prefs.train.resume = None;
                    }
                });
            }
            match (&ready, &mismatch, self.status.is_active()) {
                (_, Some(m), false) => mismatch_ui(ui, &mut ctx.prefs.train, m),
                (Err(reason), None, false) => {
                    ui.label(RichText::new(reason.as_str()).color(palette::WARN));
                }
                _ => {}
            }
            if let RunStatus::Failed(message) = &self.status {
                banner_ui(ui, Tone::Error, format!("The run failed: {message}"));
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(step: usize, loss: f64) -> TrainEvent {
        TrainEvent::Step {
            step,
            total_steps: 10,
            loss,
            lr: 1e-4,
            grad_norm: 1.0,
            tokens_per_sec: 100.0,
            trained_tokens: step * 10,
            elapsed_secs: step as f64,
            eta_secs: (10 - step) as f64,
            preference: None,
            grpo: None,
        }
    }

    #[test]
    fn events_fill_the_series_and_end_the_run() {
        let mut p = TrainingPanel::default();
        p.on_event(step(1, 2.0), 0.6);
        p.on_event(step(2, 1.0), 0.6);
        p.on_event(
            TrainEvent::Eval { step: 2, val_loss: 1.5, perplexity: 4.48, best: true, preference: None, grpo: None },
            0.6,
        );
        let run = p.run.as_ref().unwrap();
        assert_eq!(run.best, Some((2, 1.5)));
        assert_eq!(run.loss.len(), 2);
        assert_eq!(run.smoothed.len(), 2);
        assert_eq!(run.val_loss.len(), 1);
        assert!(run.smoothed[1].y > 1.0 && run.smoothed[1].y < 2.0);
        let action = p.on_event(
            TrainEvent::Finished {
                step: 2,
                final_loss: Some(1.0),
                final_val_loss: Some(1.5),
                stopped_early: true,
                elapsed_secs: 2.0,
                early_stop: None,
            },
            0.6,
        );
        assert!(matches!(action, Some(Action::RefreshRuns)));
        assert_eq!(p.status, RunStatus::Finished { stopped_early: true });
        assert!(!p.is_active());
    }

    #[test]
    fn an_early_stop_keeps_its_reason_and_the_best() {
        use crate::engine::checkpoint::BestCheckpoint;
        use crate::engine::train::early_stop::EarlyStop;
        let mut p = TrainingPanel::default();
        p.on_event(
            TrainEvent::Eval { step: 4, val_loss: 1.25, perplexity: 3.5, best: true, preference: None, grpo: None },
            0.6,
        );
        p.on_event(
            TrainEvent::Eval { step: 8, val_loss: 1.5, perplexity: 4.5, best: false, preference: None, grpo: None },
            0.6,
        );
        let best = Some(BestCheckpoint { step: 4, val_loss: 1.25 });
        let early_stop = Some(EarlyStop { best, evals_without_improvement: 1, patience: 1, min_delta: 0.0 });
        let finished = TrainEvent::Finished {
            step: 8,
            final_loss: None,
            final_val_loss: None,
            stopped_early: false,
            elapsed_secs: 1.0,
            early_stop,
        };
        p.on_event(finished, 0.6);
        let run = p.run.as_ref().unwrap();
        assert_eq!(run.best, Some((4, 1.25)));
        let reason = run.early_stop.as_deref().unwrap_or_default();
        assert!(reason.contains("stopped early") && reason.contains("step 4"), "{reason}");
        assert_eq!(p.status, RunStatus::Finished { stopped_early: false });
    }
}
