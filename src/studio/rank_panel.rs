//! The rank explorer: equal-budget probe trainings at several ranks (same seed, same data order, same token
//! budget, each at the settings' LoRA scale) on the worker, plotting speed, the memory each probe added and
//! validation loss against rank, with a table whose buttons put a rank and its probed alpha into the training
//! settings, and the sweep's time estimate before and while it runs. Below it, the LoRA layer micro-benchmark.

use super::panel_ctx::{Action, PanelCtx};
use super::rank_estimate::{fmt_about, timing_key, SweepClock};
use super::rank_plots::{self, rank_plot_ui};
use super::settings_panel::ready_config;
use super::widgets::{self, banner_ui, card_ui, fmt_bytes, fmt_count, fmt_loss, palette, Tone};
use crate::engine::bench::LoraMicroResult;
use crate::engine::memory_watch::MemoryMeasure;
use crate::engine::rank_probe::{ProbePlan, ProbeTiming, RankProbeResult};
use crate::engine::train::{LoraSettings, TrainConfig};
use crate::worker::{Command, Event};
use egui::{DragValue, RichText, Ui};

/// Ranks offered as toggles.
pub const RANK_CHOICES: [usize; 8] = [1, 2, 4, 8, 16, 32, 64, 128];

#[derive(Default)]
pub struct RankPanel {
    pub results: Vec<RankProbeResult>,
    pub running: bool,
    /// Ranks of the sweep in flight (or the last one), in order.
    planned: Vec<usize>,
    /// The token budget and settings key of that sweep.
    sweep_budget: usize,
    sweep_key: String,
    /// Measured probe times and the sweep's countdown.
    pub clock: SweepClock,
    pub error: Option<String>,
    pub micro: Vec<LoraMicroResult>,
    pub micro_running: bool,
    pub micro_error: Option<String>,
}

/// Put a probed rank into `lora` with the alpha it was probed at, so training keeps the probed scale; returns
/// what changed, for a toast.
pub fn apply_probed_rank(lora: &mut LoraSettings, probed: &RankProbeResult) -> String {
    *lora = probed.lora(lora);
    format!(
        "LoRA rank {} with alpha {} (scale {:.2}, as probed)",
        probed.rank,
        fmt_alpha(probed.alpha),
        probed.lora_scale()
    )
}

/// An alpha as a person would type it: whole numbers without decimals.
pub fn fmt_alpha(alpha: f64) -> String {
    if (alpha - alpha.round()).abs() < 1e-9 {
        format!("{alpha:.0}")
    } else {
        format!("{alpha:.2}")
    }
}

/// "alpha = 2.00 x r" (or "x sqrt(r)" with rsLoRA): how a probe's alpha follows its rank at a fixed scale.
fn alpha_rule(scale: f64, use_rslora: bool) -> String {
    format!("alpha = {scale:.2} × {}", if use_rslora { "√rank" } else { "rank" })
}

impl RankPanel {
    /// The rank explorer's events from the worker.
    pub fn on_event(&mut self, event: Event) {
        match event {
            Event::RankProbeResult(r) => self.on_result(r),
            Event::RankProbeFinished { results } => {
                for r in results {
                    self.on_result(r);
                }
                self.ended();
            }
            Event::RankProbeFailed { error } => {
                self.ended();
                let stopped = error.kind == crate::engine::ErrorKind::Cancelled;
                self.error = Some(if stopped { "Stopped.".into() } else { error.message });
            }
            Event::RankProbeCalibrated { plan, timing } => self.clock.on_calibrated(plan, timing),
            Event::RankCalibrationFailed { error } => {
                let stopped = error.kind == crate::engine::ErrorKind::Cancelled;
                self.clock.on_calibration_failed(error.message, stopped);
            }
            Event::MicroBenchFinished(results) => {
                self.micro_running = false;
                self.micro_error = None;
                self.micro = results;
            }
            Event::MicroBenchFailed { error } => {
                self.micro_running = false;
                self.micro_error = Some(error.message);
            }
            _ => {}
        }
    }

    /// A sweep or the speed measurement is running on the worker.
    pub fn is_busy(&self) -> bool {
        self.running || self.clock.calibrating.is_some()
    }

    fn on_result(&mut self, r: RankProbeResult) {
        if !self.results.iter().any(|x| *x == r) {
            self.clock.on_probe(&self.sweep_key, &r);
        }
        self.results.retain(|x| x.rank != r.rank);
        self.results.push(r);
        self.results.sort_by_key(|x| x.rank);
    }

    fn ended(&mut self) {
        self.running = false;
        self.clock.on_sweep_ended();
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
        if self.running {
            // The countdown moves between events.
            ui.ctx().request_repaint_after(std::time::Duration::from_secs(1));
        }
    }

    fn controls_ui(&mut self, ui: &mut Ui, ctx: &mut PanelCtx<'_>) {
        let ready = ready_config(ctx.prefs, ctx.model.loaded.as_ref(), ctx.prefs.dataset.as_ref());
        card_ui(ui, |ui| {
            ui.set_width(ui.available_width());
            Self::budget_ui(ui, ctx);
            let lora = &ctx.prefs.train.lora;
            ui.label(format!(
                "Every rank is probed at your LoRA scale, {}, so rank r trains with {}.",
                scale_formula(lora),
                alpha_rule(lora.scale(), lora.use_rslora).replace("rank", "r")
            ))
            .on_hover_text(
                "Holding the scale fixed makes ranks differ only in capacity. \"Use this rank\" in the results sets \
                 the rank and its probed alpha together, so training keeps this scale.",
            );
            ui.label(
                RichText::new(format!(
                    "Other settings come from the LoRA settings page: {} · batch {} · seq {} · lr {} · seed {}",
                    super::glossary::targets_summary(&lora.targets, ctx.model.loaded.as_ref().map(|m| &m.shape)),
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
            self.estimate_ui(ui, ctx, &ready);
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

    /// Run and Stop, and the progress of a running sweep.
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
                    self.sweep_budget = ctx.prefs.rank.token_budget;
                    self.sweep_key = timing_key(config);
                    self.clock.on_sweep_started();
                    // A speed measurement still running is stopped by the worker, which then starts the sweep.
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

    /// The sweep's time: estimated before it starts (measuring two steps when nothing is known), counted down
    /// while it runs. Says what the number rests on.
    fn estimate_ui(&mut self, ui: &mut Ui, ctx: &mut PanelCtx<'_>, ready: &Result<TrainConfig, String>) {
        if self.running {
            let left = self.planned.len().saturating_sub(self.results.len());
            let elapsed = self.clock.elapsed_secs().map(widgets::fmt_secs).unwrap_or_default();
            let text = match (self.clock.remaining_secs(&self.sweep_key, self.sweep_budget, left), &self.clock.measured)
            {
                (Some(secs), Some(m)) => {
                    format!("{} left · {elapsed} elapsed (from {})", fmt_about(secs), m.basis.describe())
                }
                _ => format!("{elapsed} elapsed · the time left is known once the first probe finishes"),
            };
            ui.label(RichText::new(text).color(palette::ACCENT));
            return;
        }
        let Ok(config) = ready else { return };
        let ranks = &ctx.prefs.rank.ranks;
        if ranks.is_empty() {
            return;
        }
        let key = timing_key(config);
        if let Some(m) = self.clock.for_key(&key) {
            let budget = ctx.prefs.rank.token_budget;
            let secs = m.timing.sweep_secs(&m.plan, budget, ranks.len());
            ui.label(RichText::new(format!("Estimated time: {}", fmt_about(secs))).color(palette::ACCENT))
                .on_hover_text(estimate_breakdown(&m.plan, &m.timing, budget, ranks.len()));
            ui.label(
                RichText::new(format!(
                    "{} × {} steps, from {}: a step takes {}",
                    if ranks.len() == 1 { "1 probe".to_string() } else { format!("{} probes", ranks.len()) },
                    m.plan.steps(budget),
                    m.basis.describe(),
                    widgets::fmt_secs(m.timing.step_secs)
                ))
                .weak()
                .small(),
            );
            return;
        }
        if let Some((_, rank)) = &self.clock.calibrating {
            ui.horizontal(|ui| {
                ui.spinner();
                ui.label(format!("Estimating the time: measuring two training steps at rank {rank}…"));
            });
            return;
        }
        let rank = ranks[ranks.len() / 2];
        let mut measure = |clock: &mut SweepClock| {
            clock.calibrating = Some((key.clone(), rank));
            clock.failed = None;
            ctx.actions.push(Action::Send(Command::CalibrateRankProbe { config: Box::new(config.clone()), rank }));
        };
        if let Some((_, message)) = self.clock.failed.clone().filter(|(k, _)| *k == key) {
            ui.horizontal(|ui| {
                ui.label(RichText::new(format!("No time estimate: {message}")).color(palette::WARN));
                if ui.button("Measure again").clicked() {
                    measure(&mut self.clock);
                }
            });
        } else if ctx.training_active {
            // Measuring would slow the training that is running: only when asked.
            ui.horizontal(|ui| {
                ui.label(RichText::new("Time estimate: measured on request while training runs.").weak());
                let hint = format!("Time two training steps at rank {rank}");
                if ui.button("Estimate time").on_hover_text(hint).clicked() {
                    measure(&mut self.clock);
                }
            });
        } else {
            measure(&mut self.clock);
        }
    }

    fn plots_ui(&self, ui: &mut Ui) {
        let series = |f: &dyn Fn(&RankProbeResult) -> f64| -> Vec<[f64; 2]> {
            self.results.iter().map(|r| [(r.rank as f64).log2(), f(r)]).collect()
        };
        let mut ranks: Vec<usize> = self.results.iter().map(|r| r.rank).collect();
        if self.running {
            ranks.extend(&self.planned);
        }
        let speed = series(&|r| r.tokens_per_sec);
        let memory = series(&|r| r.memory.added_bytes as f64 / (1024.0 * 1024.0));
        let loss = series(&|r| r.val_loss);
        let measure = self.memory_measure();
        ui.columns(3, |cols| {
            // Speed and memory start at zero so small differences look small; loss differences are the point.
            rank_plot_ui(&mut cols[0], "rank-speed", "Speed (tokens/s)", speed, &ranks, palette::SPEED, true);
            let title = format!("Memory added by the probe (MiB, {})", measure.short_name());
            rank_plot_ui(&mut cols[1], "rank-memory", &title, memory, &ranks, palette::LR, true)
                .on_hover_text(measure.explain());
            rank_plot_ui(&mut cols[2], "rank-loss", "Validation loss", loss, &ranks, palette::VALID, false);
        });
    }

    fn memory_measure(&self) -> MemoryMeasure {
        self.results.first().map_or(MemoryMeasure::Unmeasured, |r| r.memory.measure)
    }

    fn table_ui(&self, ui: &mut Ui, ctx: &mut PanelCtx<'_>) {
        card_ui(ui, |ui| {
            ui.set_width(ui.available_width());
            self.scale_note_ui(ui, &ctx.prefs.train.lora);
            let best = self.results.iter().map(|r| r.val_loss).fold(f64::INFINITY, f64::min);
            let measure = self.memory_measure();
            egui::Grid::new("rank-table").num_columns(9).striped(true).spacing([22.0, 6.0]).show(ui, |ui| {
                let headers: [(&str, &str); 9] = [
                    ("Rank", ""),
                    ("Alpha", "The alpha this rank was probed at: the same LoRA scale for every rank."),
                    ("Trainable", "Adapter parameters at this rank."),
                    ("Steps", "Optimizer steps of the probe (the same for every rank)."),
                    ("Tokens/s", "Training tokens per second, padding included."),
                    ("Added memory", measure.explain()),
                    ("Peak memory", measure.explain()),
                    ("Val loss", "Validation loss after the probe; the lowest is green."),
                    ("", ""),
                ];
                for (h, help) in headers {
                    let label = ui.label(RichText::new(h).strong());
                    if !help.is_empty() {
                        label.on_hover_text(help);
                    }
                }
                ui.end_row();
                let settings = &ctx.prefs.train.lora;
                for r in &self.results {
                    ui.label(RichText::new(r.rank.to_string()).monospace().strong());
                    ui.label(fmt_alpha(r.alpha));
                    ui.label(fmt_count(r.trainable_params));
                    ui.label(r.steps.to_string());
                    ui.label(format!("{:.0}", r.tokens_per_sec));
                    ui.label(fmt_bytes(r.memory.added_bytes));
                    ui.label(r.memory.peak_bytes.map(fmt_bytes).unwrap_or_else(|| "–".into()));
                    let text = RichText::new(fmt_loss(r.val_loss));
                    ui.label(if r.val_loss == best { text.color(palette::OK).strong() } else { text });
                    let current = settings.rank == r.rank
                        && (settings.alpha - r.alpha).abs() < 1e-9
                        && settings.use_rslora == r.use_rslora;
                    ui.push_id(r.rank, |ui| {
                        if current {
                            ui.label(RichText::new("in settings").color(palette::OK));
                        } else if ui
                            .button("Use this rank")
                            .on_hover_text(format!(
                                "Set LoRA rank {} and alpha {} in the training settings: scale {:.2}, as probed",
                                r.rank,
                                fmt_alpha(r.alpha),
                                r.lora_scale()
                            ))
                            .clicked()
                        {
                            ctx.actions.push(Action::UseRank(Box::new(r.clone())));
                        }
                    });
                    ui.end_row();
                }
            });
        });
    }

    /// Which scale the table's probes ran at, what "Use this rank" sets, and whether the settings moved since.
    fn scale_note_ui(&self, ui: &mut Ui, settings: &LoraSettings) {
        let Some(first) = self.results.first() else { return };
        let (scale, rslora) = (first.lora_scale(), first.use_rslora);
        ui.label(
            RichText::new(format!(
                "Probed at LoRA scale {scale:.2} ({}). \"Use this rank\" sets both the rank and its alpha, so training \
                 keeps the scale the probe measured.",
                alpha_rule(scale, rslora)
            ))
            .weak(),
        );
        if (settings.scale() - scale).abs() > 1e-9 || settings.use_rslora != rslora {
            ui.label(
                RichText::new(format!(
                    "Your settings are now at scale {:.2} ({}): run the probes again to compare ranks there.",
                    settings.scale(),
                    scale_formula(settings)
                ))
                .color(palette::WARN),
            );
        }
        ui.add_space(4.0);
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
            rank_plots::micro_plot_ui(
                &mut cols[0],
                "micro-rank",
                "Time vs rank (hidden 1024)",
                "rank",
                &by_rank,
                |m| (m.rank as f64).log2(),
                true,
            );
            rank_plots::micro_plot_ui(
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

/// "alpha / r = 16 / 8 = 2.00" (or with sqrt(r) for rsLoRA).
fn scale_formula(lora: &LoraSettings) -> String {
    let r = if lora.use_rslora { format!("√{}", lora.rank) } else { lora.rank.to_string() };
    let name = if lora.use_rslora { "alpha / √r" } else { "alpha / r" };
    format!("{name} = {} / {r} = {:.2}", fmt_alpha(lora.alpha), lora.scale())
}

/// The estimate's parts, for its tooltip.
fn estimate_breakdown(plan: &ProbePlan, timing: &ProbeTiming, budget: usize, probes: usize) -> String {
    format!(
        "Per probe: first step {} + {} more steps × {} + {} validation batches × {} + {} setup = {}.\n\
         Every rank is assumed as fast per step as the measured one (adapters add little compute); the estimate is \
         corrected from each probe's own times as the sweep runs.\n{probes} probes: {}.",
        widgets::fmt_secs(timing.first_step_secs),
        plan.steps(budget) - 1,
        widgets::fmt_secs(timing.step_secs),
        plan.val_batches,
        widgets::fmt_secs(timing.val_batch_secs),
        widgets::fmt_secs(timing.setup_secs),
        widgets::fmt_secs(timing.probe_secs(plan, budget)),
        widgets::fmt_secs(timing.sweep_secs(plan, budget, probes)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::memory_watch::PhaseMemory;

    #[test]
    fn using_a_probed_rank_sets_the_alpha_it_was_probed_at() {
        // Settings at rank 8, alpha 32 (scale 4); the probe at rank 16 ran at alpha 64.
        let mut lora = LoraSettings { rank: 8, alpha: 32.0, ..Default::default() };
        let probed = RankProbeResult {
            rank: 16,
            alpha: 64.0,
            use_rslora: false,
            trainable_params: 1,
            steps: 1,
            tokens_per_sec: 1.0,
            memory: PhaseMemory::default(),
            val_loss: 1.0,
            plan: ProbePlan::default(),
            timing: ProbeTiming::default(),
        };
        let note = apply_probed_rank(&mut lora, &probed);
        assert_eq!((lora.rank, lora.alpha), (16, 64.0));
        assert_eq!(lora.scale(), 4.0);
        assert_eq!(note, "LoRA rank 16 with alpha 64 (scale 4.00, as probed)");
        assert_eq!(alpha_rule(2.0, false), "alpha = 2.00 × rank");
        assert_eq!(
            scale_formula(&LoraSettings { rank: 8, alpha: 16.0, ..Default::default() }),
            "alpha / r = 16 / 8 = 2.00"
        );
    }
}
