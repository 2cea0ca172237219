//! LoRA and training settings: every knob of a run with a tooltip saying what it does, the effective LoRA
//! scale, and live consequences (trainable parameters, memory, steps, the learning-rate schedule). Invalid
//! combinations are explained, and the run cannot start until they are fixed.

use super::glossary;
use super::model_panel::memory_card_ui;
use super::panel_ctx::PanelCtx;
use super::prefs::Prefs;
use super::setting_rows::{block_row_ui, bookkeeping_rows_ui, row_ui};
use super::widgets::{self, banner_ui, card_ui, fmt_count, fmt_sci, palette, Tone};
use crate::engine::estimate;
use crate::engine::train::advice::{settings_warnings, RowCounts};
use crate::engine::train::config::DEFAULT_WARMUP;
use crate::engine::train::{lr_at, Checkpointing, Method, Schedule, Target, Targets, TrainConfig};
use crate::worker::{DatasetReport, ModelSummary, SplitName};
use egui::{DragValue, RichText, Ui};
use egui_plot::{Line, Plot, PlotPoints};
use std::path::PathBuf;

/// The configuration a Start button would run, or why it cannot.
pub fn ready_config(
    prefs: &Prefs,
    model: Option<&ModelSummary>,
    dataset: Option<&PathBuf>,
) -> Result<TrainConfig, String> {
    let Some(model) = model else { return Err("Load a base model first (Model page).".into()) };
    let Some(data) = dataset else { return Err("Open a dataset first (Dataset page).".into()) };
    let mut cfg = prefs.train.clone();
    cfg.model = model.path.clone();
    cfg.data = data.clone();
    cfg.device = prefs.device;
    cfg.dtype = prefs.dtype;
    cfg.quantize = model.quantize;
    if cfg.run_name.as_deref().is_some_and(|n| n.trim().is_empty()) {
        cfg.run_name = None;
    }
    // The engine's one settings check, shown as the engine words it (the CLI prints the same message).
    cfg.validate_for_model(model.shape.limits()).map_err(|e| e.to_string())?;
    Ok(cfg)
}

/// Settings page state (all settings themselves live in the persisted [`Prefs`]).
#[derive(Default)]
pub struct SettingsPanel {
    /// The training rows of the open dataset at the current sequence length and packing, kept between frames:
    /// packing them is O(n log n) in the rows, so it runs when one of those changes, not every frame.
    rows: Option<((Vec<usize>, usize, bool), Vec<usize>)>,
}

/// What the page's cards read of the rows a run at the current settings trains on.
struct EpochRows {
    /// Rows in an epoch: the training split's, or with packing the packed rows the trainer will fill.
    count: usize,
    word: String,
    /// The longest row a batch pads to (the fullest pack with packing): what the memory estimate assumes.
    longest: Option<usize>,
}

impl SettingsPanel {
    pub fn ui(&mut self, ui: &mut Ui, ctx: &mut PanelCtx<'_>) {
        widgets::page_header_ui(
            ui,
            "LoRA settings",
            "Hover any setting for what it does. Trainable parameters, memory and steps update as you change them.",
        );
        let model = ctx.model.loaded.clone();
        let report = ctx.dataset.cloned();
        let rows = report.as_ref().map(|r| self.epoch_rows(&ctx.prefs.train, r));
        egui::ScrollArea::vertical().id_salt("settings-page").auto_shrink([false; 2]).show(ui, |ui| {
            let status = ready_config(ctx.prefs, model.as_ref(), ctx.prefs.dataset.as_ref())
                .and_then(|cfg| super::method_settings::fits_data(cfg, report.as_ref()));
            // The memory card's estimate, on the dataset's real row lengths: a run that would not fit is ready
            // only with a warning, so the banner and the card never disagree.
            let longest = rows.as_ref().and_then(|r| r.longest);
            let memory = model.as_ref().and_then(|m| {
                let cfg = estimate::padded_to_data(&ctx.prefs.train, longest);
                estimate::memory_warning(&m.shape, &cfg, m.memory_budget_bytes, &m.memory_budget_name)
            });
            match &status {
                Ok(_) if memory.is_some() => banner_ui(
                    ui,
                    Tone::Warn,
                    "Ready to train, but the memory estimate below says this run would not fit: see its fix.",
                ),
                Ok(_) => banner_ui(ui, Tone::Ok, "Ready to train with these settings."),
                Err(reason) => banner_ui(ui, Tone::Warn, format!("Not ready: {reason}")),
            };
            ui.add_space(6.0);
            ui.columns(2, |cols| {
                lora_card_ui(&mut cols[0], ctx.prefs, model.as_ref());
                cols[0].add_space(8.0);
                data_card_ui(&mut cols[0], ctx.prefs, model.as_ref());
                // Training method (SFT / DPO / ORPO): its own file, issue 34.
                cols[0].add_space(8.0);
                super::method_settings::method_card_ui(&mut cols[0], ctx.prefs, report.as_ref());
                optimizer_card_ui(&mut cols[1], ctx.prefs);
                cols[1].add_space(8.0);
                summary_card_ui(&mut cols[1], ctx.prefs, model.as_ref(), report.as_ref().zip(rows.as_ref()));
            });
        });
    }
}

fn lora_card_ui(ui: &mut Ui, prefs: &mut Prefs, model: Option<&ModelSummary>) {
    card_ui(ui, |ui| {
        ui.set_width(ui.available_width());
        ui.label(RichText::new("LoRA adapter").strong().size(15.0));
        ui.add_space(4.0);
        let lora = &mut prefs.train.lora;
        egui::Grid::new("lora-grid").num_columns(2).spacing([14.0, 8.0]).show(ui, |ui| {
            row_ui(ui, glossary::RANK.name, &glossary::RANK.hover(), |ui| {
                ui.add(DragValue::new(&mut lora.rank).range(1..=1024).speed(0.2));
                for r in [4, 8, 16, 32, 64] {
                    if ui.selectable_label(lora.rank == r, r.to_string()).on_hover_text(format!("rank {r}")).clicked() {
                        lora.rank = r;
                    }
                }
            });
            row_ui(ui, glossary::ALPHA.name, &glossary::ALPHA.hover(), |ui| {
                ui.add(DragValue::new(&mut lora.alpha).range(0.1..=4096.0).speed(0.25).max_decimals(2));
                let scale = lora.scale();
                ui.label(
                    RichText::new(format!(
                        "effective scale {}",
                        if lora.use_rslora { format!("α/√r = {scale:.3}") } else { format!("α/r = {scale:.3}") }
                    ))
                    .color(palette::ACCENT),
                );
            });
            row_ui(ui, glossary::RSLORA.name, &glossary::RSLORA.hover(), |ui| {
                ui.checkbox(&mut lora.use_rslora, "scale by α/√r");
            });
            row_ui(ui, glossary::DORA.name, &glossary::DORA.hover(), |ui| {
                ui.checkbox(&mut lora.dora, "train a magnitude per output row");
            });
            row_ui(ui, glossary::DROPOUT.name, &glossary::DROPOUT.hover(), |ui| {
                ui.add(egui::Slider::new(&mut lora.dropout, 0.0..=0.5).fixed_decimals(2));
            });
            block_row_ui(ui, glossary::TARGETS.name, &glossary::TARGETS.hover(), |ui| {
                // The loaded model's own linears (phi3: qkv_proj, o_proj, gate_up_proj, down_proj).
                let available: Vec<Target> = model.map(|m| m.shape.linear_targets()).unwrap_or_else(Target::separate);
                let (attention, mlp): (Vec<Target>, Vec<Target>) = available.iter().partition(|t| t.is_attention());
                let family =
                    model.map(|m| format!("{} models", m.architecture.as_str())).unwrap_or_else(|| "this model".into());
                // What training will adapt: the engine's resolution (phi3: q_proj, v_proj adapt the fused qkv_proj).
                let resolved = lora.targets.among(&available, &family);
                for group in [&attention, &mlp] {
                    ui.horizontal(|ui| {
                        for &t in group {
                            let mut on = resolved.as_ref().map_or(lora.targets.contains(t), |r| r.contains(t));
                            if ui.checkbox(&mut on, t.name()).changed() {
                                if let Ok(r) = &resolved {
                                    lora.targets = r.clone();
                                }
                                if on {
                                    lora.targets.insert(t);
                                } else {
                                    lora.targets.remove(t);
                                }
                            }
                        }
                    });
                }
                match &resolved {
                    Err(e) => {
                        ui.label(RichText::new(format!("{e}: pick among the boxes above")).color(palette::WARN));
                    }
                    Ok(r) if *r != lora.targets && lora.targets != Targets::all() => {
                        ui.label(
                            RichText::new(format!("{} are fused in {family}: training adapts {r}", lora.targets))
                                .weak(),
                        );
                    }
                    Ok(_) => {}
                }
                ui.horizontal(|ui| {
                    ui.label(RichText::new("presets").weak());
                    if available.contains(&Target::QProj)
                        && ui.small_button("q, v").on_hover_text("The original LoRA paper's choice").clicked()
                    {
                        lora.targets = Targets::of(&[Target::QProj, Target::VProj]);
                    }
                    if ui.small_button("attention").on_hover_text("The attention block's projections").clicked() {
                        lora.targets = Targets::of(&attention);
                    }
                    if ui
                        .small_button("all linear")
                        .on_hover_text("Every linear of every block (QLoRA style)")
                        .clicked()
                    {
                        lora.targets = Targets::all();
                    }
                });
            });
            let n_layers = model.map(|m| m.shape.layers).unwrap_or(usize::MAX);
            row_ui(ui, glossary::LAYERS.name, &glossary::LAYERS.hover(), |ui| {
                let mut all = lora.layers.is_none();
                if ui.checkbox(&mut all, "all").changed() {
                    lora.layers = if all { None } else { Some(n_layers.clamp(1, 8)) };
                }
                if let Some(n) = &mut lora.layers {
                    ui.label("last");
                    ui.add(DragValue::new(n).range(1..=n_layers.min(1024)));
                    if let Some(m) = model {
                        ui.label(RichText::new(format!("of {}", m.shape.layers)).weak());
                    }
                }
            });
        });
    });
}

impl SettingsPanel {
    /// The rows of `report`'s training split a run at `cfg` trains on (`TokenStats::training_rows`, packed as the
    /// trainer packs them), made again only when the lengths, the sequence length or packing changed.
    fn epoch_rows(&mut self, cfg: &TrainConfig, report: &DatasetReport) -> EpochRows {
        let Some(tokens) = report.tokens.as_ref() else {
            return EpochRows { count: report.rows(SplitName::Train), word: report.rows_word().into(), longest: None };
        };
        let fresh = |(lengths, seq_len, packing): &(Vec<usize>, usize, bool)| {
            *seq_len == cfg.seq_len && *packing == cfg.packing && *lengths == tokens.lengths
        };
        if !self.rows.as_ref().is_some_and(|(key, _)| fresh(key)) {
            let rows = tokens.training_rows(cfg.seq_len, cfg.packing);
            self.rows = Some(((tokens.lengths.clone(), cfg.seq_len, cfg.packing), rows));
        }
        let rows = self.rows.as_ref().map_or(&[][..], |(_, rows)| rows.as_slice());
        let longest = rows.iter().copied().max();
        match cfg.packing {
            true => EpochRows { count: rows.len(), word: "packed rows".into(), longest },
            false => EpochRows { count: report.rows(SplitName::Train), word: report.rows_word().into(), longest },
        }
    }
}

fn data_card_ui(ui: &mut Ui, prefs: &mut Prefs, model: Option<&ModelSummary>) {
    card_ui(ui, |ui| {
        ui.set_width(ui.available_width());
        ui.label(RichText::new("Data and length").strong().size(15.0));
        ui.add_space(4.0);
        let cfg = &mut prefs.train;
        let context = model.map(|m| m.shape.context_length).unwrap_or(1 << 20);
        egui::Grid::new("data-grid").num_columns(2).spacing([14.0, 8.0]).show(ui, |ui| {
            row_ui(ui, glossary::SEQUENCE_LENGTH.name, &glossary::SEQUENCE_LENGTH.hover(), |ui| {
                ui.add(DragValue::new(&mut cfg.seq_len).range(8..=context).speed(4.0).suffix(" tokens"));
                for n in [256, 512, 1024, 2048] {
                    if n <= context && ui.selectable_label(cfg.seq_len == n, n.to_string()).on_hover_text(format!("{n} tokens")).clicked() {
                        cfg.seq_len = n;
                    }
                }
            });
            row_ui(ui, "Packing", "Put several short examples end to end in each row of up to the sequence length, without padding. Each example still attends only to itself and its positions restart, so the loss is the same as unpacked; steps hold more examples and run faster on data with short rows. The batch size then counts rows. SFT only.", |ui| {
                let sft = cfg.method == Method::Sft;
                ui.add_enabled(sft, egui::Checkbox::new(&mut cfg.packing, "pack examples"));
                if !sft {
                    ui.label(RichText::new("SFT only").weak());
                }
            });
            row_ui(ui, "Train on prompt", "Also compute the loss on system and user turns, not only on the assistant's replies. Usually off for chat data.", |ui| {
                ui.checkbox(&mut cfg.train_on_prompt, "all tokens");
            });
            row_ui(ui, "Skip invalid rows", "Train without the rows that fail validation instead of refusing the dataset.", |ui| {
                ui.checkbox(&mut cfg.skip_invalid_rows, "skip");
            });
            row_ui(ui, "Seed", "Seeds adapter initialisation, data order, dropout and the validation hold-out. Same seed + same settings = same run.", |ui| {
                ui.add(DragValue::new(&mut cfg.seed).speed(1.0));
            });
        });
    });
}

fn optimizer_card_ui(ui: &mut Ui, prefs: &mut Prefs) {
    card_ui(ui, |ui| {
        ui.set_width(ui.available_width());
        ui.label(RichText::new("Optimization").strong().size(15.0));
        ui.add_space(4.0);
        let cfg = &mut prefs.train;
        egui::Grid::new("opt-grid").num_columns(2).spacing([14.0, 8.0]).show(ui, |ui| {
            step_rows_ui(ui, cfg);
            duration_rows_ui(ui, cfg);
            bookkeeping_rows_ui(ui, cfg);
        });
    });
}

/// Learning rate, schedule and batch: what one optimizer step does.
fn step_rows_ui(ui: &mut Ui, cfg: &mut TrainConfig) {
    row_ui(ui, glossary::LEARNING_RATE.name, &glossary::LEARNING_RATE.hover(), |ui| {
        ui.add(
            egui::Slider::new(&mut cfg.lr, 1e-6..=1e-2)
                .logarithmic(true)
                .custom_formatter(|v, _| fmt_sci(v))
                .custom_parser(|s| s.trim().parse::<f64>().ok()),
        );
    });
    row_ui(
        ui,
        "Schedule",
        "How the learning rate decays after warmup: constant, linearly to zero, or along a cosine to zero.",
        |ui| {
            egui::ComboBox::from_id_salt("schedule")
                .selected_text(format!("{:?}", cfg.schedule).to_lowercase())
                .show_ui(ui, |ui| {
                    for s in [Schedule::Constant, Schedule::Linear, Schedule::Cosine] {
                        ui.selectable_value(&mut cfg.schedule, s, format!("{s:?}").to_lowercase());
                    }
                });
            ui.label("warmup");
            let mut auto = cfg.warmup.is_none();
            if ui.checkbox(&mut auto, "fit to run").on_hover_text(glossary::WARMUP.hover()).changed() {
                cfg.warmup = (!auto).then_some(DEFAULT_WARMUP);
            }
            if let Some(steps) = cfg.warmup.as_mut() {
                ui.add(DragValue::new(steps).range(0..=100_000).suffix(" steps"));
            }
        },
    );
    row_ui(ui, glossary::BATCH.name, &glossary::BATCH.hover(), |ui| {
        ui.add(DragValue::new(&mut cfg.batch_size).range(1..=1024));
    });
    row_ui(ui, "Accumulation", &glossary::BATCH.hover(), |ui| {
        ui.add(DragValue::new(&mut cfg.grad_accum).range(1..=1024));
        ui.label(RichText::new(format!("effective batch {}", cfg.batch_size * cfg.grad_accum)).weak());
    });
    row_ui(ui, glossary::CHECKPOINTING.name, &glossary::CHECKPOINTING.hover(), |ui| {
        for c in Checkpointing::ALL {
            ui.selectable_value(&mut cfg.checkpointing, c, c.name()).on_hover_text(format!(
                "checkpointing {}: {}",
                c.name(),
                c.describe()
            ));
        }
    });
}

/// How long to train and how gradients are kept in check.
fn duration_rows_ui(ui: &mut Ui, cfg: &mut TrainConfig) {
    row_ui(
        ui,
        "Duration",
        "How long to train: a number of optimizer steps, or passes over the training split.",
        |ui| {
            let mut by_epochs = cfg.iters.is_none();
            if ui.radio(!by_epochs, "iterations").clicked() {
                by_epochs = false;
                cfg.iters = Some(cfg.iters.unwrap_or(100));
            }
            if ui.radio(by_epochs, "epochs").clicked() {
                by_epochs = true;
                cfg.iters = None;
                cfg.epochs = Some(cfg.epochs.unwrap_or(1.0));
            }
            if by_epochs {
                let e = cfg.epochs.get_or_insert(1.0);
                ui.add(DragValue::new(e).range(0.01..=1000.0).speed(0.05).max_decimals(2));
            } else if let Some(n) = &mut cfg.iters {
                ui.add(DragValue::new(n).range(1..=10_000_000).speed(1.0).suffix(" steps"));
            }
        },
    );
    row_ui(
        ui,
        "Gradient clipping",
        "Rescale gradients whose global norm exceeds this, which keeps rare bad batches from derailing the run.",
        |ui| {
            let mut on = cfg.max_grad_norm.is_some();
            if ui.checkbox(&mut on, "clip at").changed() {
                cfg.max_grad_norm = on.then_some(1.0);
            }
            if let Some(n) = &mut cfg.max_grad_norm {
                ui.add(DragValue::new(n).range(0.01..=100.0).speed(0.05).max_decimals(2));
            }
        },
    );
    row_ui(ui, "Weight decay", "AdamW's decoupled weight decay on the adapter weights. 0 is common for LoRA.", |ui| {
        ui.add(DragValue::new(&mut cfg.weight_decay).range(0.0..=1.0).speed(0.001).max_decimals(4));
    });
}

fn summary_card_ui(
    ui: &mut Ui,
    prefs: &mut Prefs,
    model: Option<&ModelSummary>,
    report: Option<(&DatasetReport, &EpochRows)>,
) {
    // A copy: the memory card's one-click fixes change `prefs.train` (seen from the next frame on).
    let cfg = &prefs.train.clone();
    card_ui(ui, |ui| {
        ui.set_width(ui.available_width());
        ui.label(RichText::new("What this run costs").strong().size(15.0));
        ui.add_space(4.0);
        // A preference batch holds each pair's chosen and rejected sequences.
        let tokens_per_step = cfg.rows_per_batch() * cfg.grad_accum * cfg.seq_len;
        egui::Grid::new("summary-grid").num_columns(2).spacing([14.0, 4.0]).show(ui, |ui| {
            ui.label(RichText::new("Tokens per step").weak())
                .on_hover_text("batch × accumulation × sequence length: an upper bound, rows are usually shorter");
            ui.label(format!("≤ {}", fmt_count(tokens_per_step)));
            ui.end_row();
            if let Some((_, EpochRows { count: rows, word, .. })) = report {
                let steps_per_epoch = rows.div_ceil((cfg.batch_size * cfg.grad_accum).max(1)).max(1);
                ui.label(RichText::new("Steps per epoch").weak())
                    .on_hover_text("training rows / effective batch (before any validation hold-out); packed rows hold several examples each");
                ui.label(format!("≈ {steps_per_epoch} ({rows} {word})"));
                ui.end_row();
                let total = total_steps(cfg, steps_per_epoch);
                ui.label(RichText::new("Total steps").weak());
                ui.label(match cfg.iters {
                    Some(n) => format!("{n} (≈ {:.2} epochs)", n as f64 / steps_per_epoch as f64),
                    None => format!("≈ {total}"),
                });
                ui.end_row();
            }
        });
        ui.add_space(6.0);
        match model {
            Some(m) => {
                memory_card_ui(ui, m, prefs, false, report.and_then(|(_, rows)| rows.longest));
            }
            None => {
                ui.label(RichText::new("Load a model to see trainable parameters and memory.").weak());
            }
        }
        ui.add_space(6.0);
        let steps_per_epoch =
            report.map(|(_, rows)| rows.count.div_ceil((cfg.batch_size * cfg.grad_accum).max(1)).max(1)).unwrap_or(100);
        lr_preview_ui(ui, cfg, total_steps(cfg, steps_per_epoch));
        // The trainer's own start warnings (many epochs over a small set, an unusual lr, many rows cut).
        if let Some((r, epoch)) = report {
            let truncated = r.tokens.as_ref().map_or(0, |t| t.truncated);
            let total = total_steps(cfg, steps_per_epoch);
            let rows = RowCounts { examples: r.rows(SplitName::Train), truncated, per_epoch: epoch.count };
            for warning in settings_warnings(cfg, rows, total) {
                banner_ui(ui, Tone::Warn, warning.trim_start_matches("warning: ").to_string());
            }
        }
        if let Some(m) = model {
            let trainable = estimate::trainable_params(&m.shape, &cfg.lora).unwrap_or(0);
            ui.label(
                RichText::new(format!(
                    "{} trainable of {} parameters",
                    fmt_count(trainable),
                    fmt_count(m.shape.parameters)
                ))
                .weak()
                .small(),
            );
        }
    });
}

fn total_steps(cfg: &TrainConfig, steps_per_epoch: usize) -> usize {
    match (cfg.iters, cfg.epochs) {
        (Some(n), _) => n,
        (None, Some(e)) => ((e * steps_per_epoch as f64).ceil() as usize).max(1),
        (None, None) => steps_per_epoch,
    }
}

/// The learning rate over the run, as the trainer will schedule it.
fn lr_preview_ui(ui: &mut Ui, cfg: &TrainConfig, total: usize) {
    let total = total.max(1);
    let stride = (total / 400).max(1);
    let points: PlotPoints = (0..total)
        .step_by(stride)
        .chain(std::iter::once(total - 1))
        .map(|s| [s as f64, lr_at(cfg, s, total)])
        .collect();
    ui.label(RichText::new("Learning-rate schedule").weak());
    super::plot_axes::with_readable_y(Plot::new("lr-preview"))
        .height(110.0)
        .allow_drag(false)
        .allow_zoom(false)
        .allow_scroll(false)
        .show_x(false)
        .y_axis_formatter(widgets::axis_sci)
        .include_y(0.0)
        .show(ui, |plot| {
            plot.line(Line::new("learning rate", points).color(palette::LR).width(2.0));
        });
    // The trainer's own note on the warmup (cut to fit a short run, or a set warmup the run never gets past).
    if let Some(note) = cfg.warmup_note(total) {
        match note.strip_prefix("warning: ") {
            Some(warning) => banner_ui(ui, Tone::Warn, warning.to_string()),
            None => ui.label(RichText::new(note).weak()),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_are_the_engines_own_messages() {
        let model = ModelSummary {
            path: "m.gguf".into(),
            format: "gguf".into(),
            architecture: "llama".into(),
            shape: crate::engine::estimate::ModelShape { layers: 2, context_length: 64, ..Default::default() },
            tied_embeddings: true,
            dtype: "f32".into(),
            dtype_reason: String::new(),
            device_note: None,
            memory_budget_bytes: None,
            memory_budget_name: String::new(),
            weights_dtype: None,
            base_weights: "dense".into(),
            quantize: Default::default(),
            device: "cpu".into(),
            has_chat_template: false,
            eos_token_ids: vec![],
            load_secs: 0.0,
            notes: vec![],
        };
        let mut prefs = Prefs::default();
        prefs.train.seq_len = 128;
        let data = PathBuf::from("d.jsonl");
        let shown = ready_config(&prefs, Some(&model), Some(&data)).unwrap_err();
        let engine = prefs.train.validate_for_model(model.shape.limits()).unwrap_err().to_string();
        assert_eq!(shown, engine);
        assert!(shown.contains("context of 64 tokens"), "{shown}");
    }

    #[test]
    fn not_ready_without_model_or_data() {
        let prefs = Prefs::default();
        assert!(ready_config(&prefs, None, None).unwrap_err().contains("model"));
    }
}
