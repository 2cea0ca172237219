//! The rank explorer: equal-budget probe trainings at several ranks (same seed, same data order, same token
//! budget, same LoRA scale) on the worker, plotting speed, peak memory and validation loss against rank, with a
//! table whose buttons put a rank into the training settings. Below it, the LoRA layer micro-benchmark.

use super::app::{Action, PanelCtx};
use super::settings_panel::ready_config;
use super::widgets::{self, banner_ui, card_ui, fmt_bytes, fmt_count, fmt_loss, palette, Tone};
use crate::engine::bench::{LoraMicroResult, RankProbeResult};
use crate::engine::train::TrainConfig;
use crate::worker::Command;
use egui::{DragValue, RichText, Ui};
use egui_plot::{Legend, Line, MarkerShape, Plot, PlotPoints, Points};

/// Ranks offered as toggles.
pub const RANK_CHOICES: [usize; 8] = [1, 2, 4, 8, 16, 32, 64, 128];

#[derive(Default)]
pub struct RankPanel {
    pub results: Vec<RankProbeResult>,
    pub running: bool,
    /// Ranks of the probe in flight, in order.
    planned: Vec<usize>,
    pub error: Option<String>,
    pub micro: Vec<LoraMicroResult>,
    pub micro_running: bool,
    pub micro_error: Option<String>,
}

impl RankPanel {
    pub fn on_result(&mut self, r: RankProbeResult) {
        self.results.retain(|x| x.rank != r.rank);
        self.results.push(r);
        self.results.sort_by_key(|x| x.rank);
    }

    pub fn on_finished(&mut self, results: Vec<RankProbeResult>) {
        self.running = false;
        for r in results {
            self.on_result(r);
        }
    }

    pub fn on_failed(&mut self, error: crate::engine::ErrorInfo) {
        self.running = false;
        let stopped = error.kind == crate::engine::ErrorKind::Cancelled;
        self.error = Some(if stopped { "Stopped.".into() } else { error.message });
    }

    pub fn on_micro(&mut self, results: Vec<LoraMicroResult>) {
        self.micro_running = false;
        self.micro_error = None;
        self.micro = results;
    }

    pub fn on_micro_failed(&mut self, message: String) {
        self.micro_running = false;
        self.micro_error = Some(message);
    }

    pub fn ui(&mut self, ui: &mut Ui, ctx: &mut PanelCtx<'_>) {
        widgets::page_header_ui(
            ui,
            "Rank explorer",
            "Short probe trainings with the same seed, data order, token budget and LoRA scale: what does more rank buy?",
        );
        egui::ScrollArea::vertical().id_salt("rank-page").auto_shrink([false; 2]).show(ui, |ui| {
            self.controls_ui(ui, ctx);
            ui.add_space(8.0);
            if !self.results.is_empty() {
                self.plots_ui(ui);
                ui.add_space(6.0);
                self.table_ui(ui, ctx);
            }
            ui.add_space(12.0);
            self.micro_ui(ui, ctx);
        });
    }

    fn controls_ui(&mut self, ui: &mut Ui, ctx: &mut PanelCtx<'_>) {
        let ready = ready_config(ctx.prefs, ctx.model.loaded.as_ref(), ctx.prefs.dataset.as_ref());
        card_ui(ui, |ui| {
            ui.set_width(ui.available_width());
            Self::budget_ui(ui, ctx);
            ui.label(
                RichText::new(format!(
                    "Other settings come from the LoRA settings page: {} · batch {} · seq {} · lr {} · seed {}",
                    super::glossary::targets_summary(
                        &ctx.prefs.train.lora.targets,
                        ctx.model.loaded.as_ref().map(|m| &m.shape)
                    ),
                    ctx.prefs.train.batch_size,
                    ctx.prefs.train.seq_len,
                    widgets::fmt_sci(ctx.prefs.train.lr),
                    ctx.prefs.train.seed
                ))
                .weak()
                .small(),
            );
            ui.add_space(4.0);
            self.run_row_ui(ui, ctx, &ready);
            if let Err(reason) = &ready {
                ui.label(RichText::new(reason.as_str()).color(palette::WARN));
            }
            if let Some(e) = &self.error {
                banner_ui(ui, if e == "Stopped." { Tone::Warn } else { Tone::Error }, e.clone());
            }
        });
    }

    /// Which ranks to probe and the token budget each probe trains on.
    fn budget_ui(ui: &mut Ui, ctx: &mut PanelCtx<'_>) {
        ui.horizontal_wrapped(|ui| {
            ui.label("Ranks").on_hover_text("Each ticked rank gets one probe training.");
            for r in RANK_CHOICES {
                let mut on = ctx.prefs.rank.ranks.contains(&r);
                if ui.toggle_value(&mut on, r.to_string()).on_hover_text(format!("probe rank {r}")).changed() {
                    if on {
                        ctx.prefs.rank.ranks.push(r);
                    } else {
                        ctx.prefs.rank.ranks.retain(|x| *x != r);
                    }
                    ctx.prefs.rank.ranks.sort_unstable();
                }
            }
            ui.separator();
            let l = ui.label("Token budget").on_hover_text(
                "Training tokens per probe. Every rank sees exactly the same batches, so the comparison is fair.",
            );
            ui.add(
                DragValue::new(&mut ctx.prefs.rank.token_budget)
                    .range(256..=100_000_000)
                    .speed(256.0)
                    .suffix(" tokens"),
            )
            .labelled_by(l.id);
        });
    }

    /// Run and Stop, and the progress of a running probe series.
    fn run_row_ui(&mut self, ui: &mut Ui, ctx: &mut PanelCtx<'_>, ready: &Result<TrainConfig, String>) {
        ui.horizontal(|ui| {
            let can_run = ready.is_ok() && !self.running && !ctx.prefs.rank.ranks.is_empty();
            let run = ui.add_enabled(can_run, egui::Button::new(RichText::new("Run probes").strong()));
            let run = match &ready {
                Err(reason) => run.on_disabled_hover_text(reason.as_str()),
                Ok(_) => run.on_hover_text("Train briefly at each rank, one after another, on the worker"),
            };
            if run.clicked() {
                if let Ok(config) = &ready {
                    self.results.clear();
                    self.error = None;
                    self.running = true;
                    self.planned = ctx.prefs.rank.ranks.clone();
                    ctx.actions.push(Action::Send(Command::RankProbe {
                        config: Box::new(config.clone()),
                        ranks: ctx.prefs.rank.ranks.clone(),
                        token_budget: ctx.prefs.rank.token_budget,
                    }));
                }
            }
            if ui
                .add_enabled(self.running, egui::Button::new("Stop"))
                .on_hover_text("Stop after the current step")
                .clicked()
            {
                ctx.actions.push(Action::Send(Command::StopRankProbe));
            }
            if self.running {
                ui.spinner();
                let done = self.results.len();
                let total = self.planned.len().max(1);
                let current = self.planned.get(done).map(|r| format!("probing rank {r}")).unwrap_or_default();
                ui.add(
                    egui::ProgressBar::new(done as f32 / total as f32)
                        .desired_width(200.0)
                        .text(format!("{done}/{total} · {current}")),
                );
            }
        });
    }

    fn plots_ui(&self, ui: &mut Ui) {
        let series = |f: &dyn Fn(&RankProbeResult) -> f64| -> Vec<[f64; 2]> {
            self.results.iter().map(|r| [(r.rank as f64).log2(), f(r)]).collect()
        };
        let speed = series(&|r| r.tokens_per_sec);
        let memory = series(&|r| r.peak_memory_bytes as f64 / (1024.0 * 1024.0));
        let loss = series(&|r| r.val_loss);
        ui.columns(3, |cols| {
            // Speed and memory start at zero so small differences look small; loss differences are the point.
            rank_plot_ui(&mut cols[0], "rank-speed", "Speed (tokens/s)", speed, palette::SPEED, true);
            rank_plot_ui(&mut cols[1], "rank-memory", "Peak memory (MiB)", memory, palette::LR, true);
            rank_plot_ui(&mut cols[2], "rank-loss", "Validation loss", loss, palette::VALID, false);
        });
    }

    fn table_ui(&self, ui: &mut Ui, ctx: &mut PanelCtx<'_>) {
        card_ui(ui, |ui| {
            ui.set_width(ui.available_width());
            let best = self.results.iter().map(|r| r.val_loss).fold(f64::INFINITY, f64::min);
            egui::Grid::new("rank-table").num_columns(7).striped(true).spacing([22.0, 6.0]).show(ui, |ui| {
                for h in ["Rank", "Trainable", "Steps", "Tokens/s", "Peak memory", "Val loss", ""] {
                    ui.label(RichText::new(h).strong());
                }
                ui.end_row();
                for r in &self.results {
                    ui.label(RichText::new(r.rank.to_string()).monospace().strong());
                    ui.label(fmt_count(r.trainable_params));
                    ui.label(r.steps.to_string());
                    ui.label(format!("{:.0}", r.tokens_per_sec));
                    ui.label(fmt_bytes(r.peak_memory_bytes));
                    let text = RichText::new(fmt_loss(r.val_loss));
                    ui.label(if r.val_loss == best { text.color(palette::OK).strong() } else { text });
                    let current = ctx.prefs.train.lora.rank == r.rank;
                    ui.push_id(r.rank, |ui| {
                        if current {
                            ui.label(RichText::new("in settings").color(palette::OK));
                        } else if ui
                            .button("Use this rank")
                            .on_hover_text(format!("Set the LoRA rank to {} in the training settings", r.rank))
                            .clicked()
                        {
                            ctx.actions.push(Action::UseRank(r.rank));
                        }
                    });
                    ui.end_row();
                }
            });
        });
    }

    fn micro_ui(&mut self, ui: &mut Ui, ctx: &mut PanelCtx<'_>) {
        widgets::section_ui(ui, "LoRA layer micro-benchmark");
        ui.label(
            RichText::new("Forward and forward+backward time of one LoRA linear over a 4 × 128-token batch, on the loaded model's device (the CPU when none is loaded).")
                .weak(),
        );
        ui.horizontal(|ui| {
            if ui.add_enabled(!self.micro_running, egui::Button::new("Run micro-benchmark")).clicked() {
                self.micro_running = true;
                self.micro_error = None;
                ctx.actions.push(Action::Send(Command::LoraMicroBench { repeats: 10 }));
            }
            if self.micro_running {
                ui.spinner();
                ui.label("benchmarking…");
            }
        });
        if let Some(e) = &self.micro_error {
            banner_ui(ui, Tone::Error, e.clone());
        }
        if self.micro.is_empty() {
            return;
        }
        let lora: Vec<&LoraMicroResult> = self.micro.iter().filter(|m| m.op == "lora").collect();
        let at_hidden = |h: usize| -> Vec<&LoraMicroResult> {
            let mut v: Vec<_> = lora.iter().copied().filter(|m| m.hidden == h).collect();
            v.sort_by_key(|m| m.rank);
            v
        };
        let by_rank = at_hidden(1024);
        let mut by_hidden: Vec<&LoraMicroResult> = lora.iter().copied().filter(|m| m.rank == 8).collect();
        by_hidden.sort_by_key(|m| m.hidden);
        ui.columns(2, |cols| {
            micro_plot_ui(
                &mut cols[0],
                "micro-rank",
                "Time vs rank (hidden 1024)",
                "rank",
                &by_rank,
                |m| (m.rank as f64).log2(),
                true,
            );
            micro_plot_ui(
                &mut cols[1],
                "micro-hidden",
                "Time vs hidden size (rank 8)",
                "hidden",
                &by_hidden,
                |m| m.hidden as f64,
                false,
            );
        });
        card_ui(ui, |ui| {
            ui.set_width(ui.available_width());
            egui::Grid::new("micro-table").num_columns(5).striped(true).spacing([22.0, 4.0]).show(ui, |ui| {
                for h in ["Op", "Hidden", "Rank", "Forward", "Forward + backward"] {
                    ui.label(RichText::new(h).strong());
                }
                ui.end_row();
                for m in &self.micro {
                    ui.label(&m.op);
                    ui.label(m.hidden.to_string());
                    ui.label(if m.op == "lora" { m.rank.to_string() } else { "–".into() });
                    ui.label(format!("{:.3} ms", m.forward_ms));
                    ui.label(m.backward_ms.map(|b| format!("{b:.3} ms")).unwrap_or_else(|| "–".into()));
                    ui.end_row();
                }
            });
        });
    }
}

/// A plot against log2(rank), labelled with the ranks themselves.
fn rank_plot_ui(ui: &mut Ui, id: &str, title: &str, points: Vec<[f64; 2]>, color: egui::Color32, from_zero: bool) {
    ui.label(RichText::new(title).strong());
    let mut plot = Plot::new(id);
    if from_zero {
        plot = plot.include_y(0.0);
    }
    plot.height(190.0)
        .allow_scroll(false)
        .x_axis_label("rank")
        .x_axis_formatter(|m, _| rank_tick(m.value))
        .x_grid_spacer(|input| log2_marks(input.bounds))
        .show(ui, |plot| {
            plot.line(Line::new(title, PlotPoints::from(points.clone())).color(color).width(2.0));
            plot.points(
                Points::new(title, PlotPoints::from(points)).color(color).radius(4.0).shape(MarkerShape::Circle),
            );
        });
}

fn rank_tick(x: f64) -> String {
    if (x - x.round()).abs() < 1e-6 && x >= 0.0 {
        format!("{}", 2f64.powf(x.round()) as u64)
    } else {
        String::new()
    }
}

fn log2_marks(bounds: (f64, f64)) -> Vec<egui_plot::GridMark> {
    // Only marks inside the visible range: egui_plot draws labels for every mark it is given.
    let (lo, hi) = (bounds.0.ceil().max(0.0) as i64, bounds.1.floor().min(20.0) as i64);
    (lo..=hi).map(|v| egui_plot::GridMark { value: v as f64, step_size: 1.0 }).collect()
}

fn micro_plot_ui(
    ui: &mut Ui,
    id: &str,
    title: &str,
    x_label: &str,
    rows: &[&LoraMicroResult],
    x: impl Fn(&LoraMicroResult) -> f64,
    log2_x: bool,
) {
    ui.label(RichText::new(title).strong());
    let fwd: Vec<[f64; 2]> = rows.iter().map(|m| [x(m), m.forward_ms]).collect();
    let bwd: Vec<[f64; 2]> = rows.iter().filter_map(|m| m.backward_ms.map(|b| [x(m), b])).collect();
    let mut plot = Plot::new(id)
        .height(200.0)
        .legend(Legend::default().position(egui_plot::Corner::LeftTop))
        .allow_scroll(false)
        .x_axis_label(x_label.to_string())
        .y_axis_label("ms")
        .include_y(0.0);
    if log2_x {
        plot = plot.x_axis_formatter(|m, _| rank_tick(m.value)).x_grid_spacer(|input| log2_marks(input.bounds));
    }
    plot.show(ui, |plot| {
        plot.line(Line::new("forward", PlotPoints::from(fwd.clone())).color(palette::TRAIN).width(2.0));
        plot.points(Points::new("forward", PlotPoints::from(fwd)).color(palette::TRAIN).radius(3.5));
        if !bwd.is_empty() {
            plot.line(Line::new("forward + backward", PlotPoints::from(bwd.clone())).color(palette::ACCENT).width(2.0));
            plot.points(Points::new("forward + backward", PlotPoints::from(bwd)).color(palette::ACCENT).radius(3.5));
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_ticks_are_powers_of_two() {
        assert_eq!(rank_tick(3.0), "8");
        assert_eq!(rank_tick(0.0), "1");
        assert_eq!(rank_tick(2.5), "");
        let marks: Vec<f64> = log2_marks((1.9, 4.1)).iter().map(|m| m.value).collect();
        assert_eq!(marks, vec![2.0, 3.0, 4.0]);
    }
}
