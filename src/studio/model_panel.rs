//! The model page: open a model folder or `.gguf` file (typed, picked in a native dialog, dropped on the
//! window, or chosen from the models found on this machine), watch it load on the worker, and read what it is:
//! architecture, size, context, dtype, device, and what training it will cost at the current settings.

use super::file_picker::{PanelPicker, PickKind};
use super::panel_ctx::{Action, ModelStatus, PanelCtx};
use super::widgets::{
    self, banner_ui, card_ui, fmt_bytes, fmt_count, fmt_secs, palette, recent_paths_ui, section_ui, Tone,
};
use crate::engine::device::{DTypeChoice, DeviceChoice};
use crate::engine::estimate;
use crate::engine::model::BaseQuant;
use crate::worker::{display_name, FoundModel, ModelSummary};
use egui::{RichText, Ui};
use std::path::PathBuf;

/// State of the model page that is not persisted.
#[derive(Default)]
pub struct ModelPanel {
    /// "Find on Hugging Face".
    pub hub: super::hub_panel::HubPanel,
    picker: PanelPicker,
    found: Vec<FoundModel>,
    scanning: bool,
    scanned_once: bool,
    filter: String,
}

impl ModelPanel {
    /// The models the last scan found.
    pub fn found(&self) -> &[FoundModel] {
        &self.found
    }

    /// Whether the look for models on this machine is still running.
    pub fn is_scanning(&self) -> bool {
        self.scanning
    }

    pub fn on_models_found(&mut self, found: Vec<FoundModel>) {
        self.found = found;
        self.scanning = false;
        self.scanned_once = true;
    }

    /// Ask the worker for the models on this machine (once per session unless asked again).
    pub fn ensure_scanned(&mut self, ctx: &mut PanelCtx<'_>) {
        if !self.scanned_once && !self.scanning {
            self.rescan(ctx);
        }
    }

    fn rescan(&mut self, ctx: &mut PanelCtx<'_>) {
        self.scanning = true;
        // ./models of wherever the studio was started, the folders the user added, and recently opened models.
        let mut extra = vec![PathBuf::from("models")];
        extra.extend(ctx.prefs.model_dirs.iter().cloned());
        extra.extend(ctx.prefs.recent_models.iter().filter(|p| p.exists()).cloned());
        ctx.actions.push(Action::Send(crate::worker::Command::ScanModels {
            hf_cache: Some(ctx.hub.settings.cache_dir.clone()),
            extra_dirs: extra,
        }));
    }

    pub fn ui(&mut self, ui: &mut Ui, ctx: &mut PanelCtx<'_>) {
        self.poll_picker(ctx);
        self.ensure_scanned(ctx);
        widgets::page_header_ui(
            ui,
            "Base model",
            "A Hugging Face model folder (config.json + safetensors) or a single .gguf file. Chat and training share it.",
        );
        egui::ScrollArea::vertical().id_salt("model-page").auto_shrink([false; 2]).show(ui, |ui| {
            self.open_row_ui(ui, ctx);
            super::hub_panel::download_card_ui(ui, ctx, crate::engine::hub::RepoKind::Model);
            ui.add_space(8.0);
            if let Some(quantize) = status_ui(ui, ctx.model, ctx.prefs) {
                // The proposal the memory card made: reload the same model with a quantized base.
                if let Some(m) = &ctx.model.loaded {
                    ctx.prefs.quantize = quantize;
                    ctx.actions.push(Action::LoadModel(m.path.clone()));
                }
            }
            ui.add_space(8.0);
            let nothing_yet = ctx.model.loaded.is_none() && ctx.model.loading.is_none() && self.found.is_empty();
            if nothing_yet && !self.scanning && super::starter_model::offer_ui(ui, ctx.hub.download.is_some()) {
                let spec = super::starter_model::STARTER_REPO.to_string();
                ctx.actions.push(Action::Download { spec, kind: crate::engine::hub::RepoKind::Model });
            }
            self.hub.ui(ui, ctx);
            ui.add_space(8.0);
            self.found_ui(ui, ctx);
        });
    }

    fn poll_picker(&mut self, ctx: &mut PanelCtx<'_>) {
        if let Some(path) = self.picker.take_picked() {
            ctx.actions.push(Action::LoadModel(path));
        }
    }

    fn open_row_ui(&mut self, ui: &mut Ui, ctx: &mut PanelCtx<'_>) {
        card_ui(ui, |ui| {
            ui.set_width(ui.available_width());
            ui.horizontal(|ui| {
                let label = ui.label("Path");
                // Right to left: the buttons take what they need, the path field the rest.
                ui.with_layout(egui::Layout::right_to_left(egui::Align::Center), |ui| {
                    let picking = self.picker.is_open();
                    if ui
                        .add_enabled(!picking, egui::Button::new("Open folder…"))
                        .on_hover_text("Pick a Hugging Face model folder")
                        .clicked()
                    {
                        self.picker.open(ui, PickKind::ModelFolder, &ctx.prefs.model_path);
                    }
                    if ui
                        .add_enabled(!picking, egui::Button::new("Open .gguf…"))
                        .on_hover_text("Pick a GGUF file")
                        .clicked()
                    {
                        self.picker.open(ui, PickKind::ModelFile, &ctx.prefs.model_path);
                    }
                    let busy = ctx.model.loading.is_some();
                    let can_load = !ctx.prefs.model_path.trim().is_empty() && !busy;
                    let load = ui
                        .add_enabled(can_load, egui::Button::new(RichText::new("Load model").strong()))
                        .on_hover_text("Load the weights on the worker; the window stays responsive.")
                        .clicked();
                    let edit = egui::TextEdit::singleline(&mut ctx.prefs.model_path)
                        .hint_text("/path/to/model-folder, model.gguf, or ORG/NAME from Hugging Face")
                        .desired_width(ui.available_width());
                    let response = ui.add(edit).labelled_by(label.id);
                    let enter = response.lost_focus() && ui.input(|i| i.key_pressed(egui::Key::Enter));
                    if (load || (enter && can_load)) && !ctx.prefs.model_path.trim().is_empty() {
                        ctx.actions.push(Action::LoadModel(PathBuf::from(ctx.prefs.model_path.trim())));
                    }
                });
            });
            placement_row_ui(ui, ctx.prefs);
            ui.label(RichText::new("Tip: drop a model folder or .gguf file anywhere on the window.").weak().small());
            if self.picker.is_open() {
                ui.horizontal(|ui| {
                    ui.spinner();
                    ui.label("Waiting for the file dialog…");
                });
            }
            if let Some(note) = &self.picker.note {
                banner_ui(ui, Tone::Warn, note.clone());
            }
            if !ctx.prefs.recent_models.is_empty() {
                ui.add_space(4.0);
                if let Some(p) = recent_paths_ui(ui, &ctx.prefs.recent_models, display_name) {
                    ctx.actions.push(Action::LoadModel(p));
                }
            }
        });
    }

    fn found_ui(&mut self, ui: &mut Ui, ctx: &mut PanelCtx<'_>) {
        ui.horizontal(|ui| {
            section_ui(ui, "Models on this machine");
            ui.add_space(8.0);
            if ui
                .add_enabled(!self.scanning, egui::Button::new("Rescan"))
                .on_hover_text("Look again in the Hugging Face cache (~/.cache/huggingface/hub) and ./models")
                .clicked()
            {
                self.rescan(ctx);
            }
            if self.scanning {
                ui.spinner();
            }
            let label = ui.label("Filter");
            ui.add(egui::TextEdit::singleline(&mut self.filter).hint_text("name").desired_width(140.0))
                .labelled_by(label.id);
        });
        ui.label(
            RichText::new(format!(
                "Hugging Face cache: {} · plus ./models, your folders and recent models",
                ctx.hub.settings.cache_dir.display()
            ))
            .weak()
            .small(),
        );
        if self.found.is_empty() {
            ui.label(
                RichText::new(if self.scanning {
                    "Scanning…"
                } else {
                    "No models found yet. Find one on Hugging Face above, or open a folder or .gguf file."
                })
                .weak(),
            );
            return;
        }
        let filter = self.filter.to_lowercase();
        let mut load = None;
        egui::Grid::new("found-models").num_columns(6).striped(true).spacing([16.0, 6.0]).show(ui, |ui| {
            ui.label(RichText::new("Name").strong());
            ui.label(RichText::new("Family").strong());
            ui.label(RichText::new("Format").strong());
            ui.label(RichText::new("Size").strong());
            ui.label(RichText::new("Found in").strong());
            ui.label("");
            ui.end_row();
            for (i, m) in self.found.iter().enumerate() {
                if !filter.is_empty() && !m.name.to_lowercase().contains(&filter) {
                    continue;
                }
                let is_loaded = ctx.model.loaded.as_ref().is_some_and(|l| crate::worker::paths_match(&l.path, &m.path));
                ui.label(&m.name).on_hover_text(m.path.display().to_string());
                match (&m.family, &m.unsupported) {
                    (Some(family), _) => ui.label(family),
                    (None, why) => ui
                        .label(RichText::new("not supported").color(palette::WARN))
                        .on_hover_text(why.clone().unwrap_or_default()),
                };
                ui.label(&m.format);
                ui.label(fmt_bytes(m.size_bytes));
                ui.label(RichText::new(&m.origin).weak());
                ui.push_id(i, |ui| {
                    if is_loaded {
                        ui.label(RichText::new("loaded").color(palette::OK));
                    } else if m.family.is_none() {
                        ui.add_enabled(false, egui::Button::new("Load").small())
                            .on_disabled_hover_text(m.unsupported.clone().unwrap_or_default());
                    } else if ui.small_button("Load").on_hover_text(format!("Load {}", m.name)).clicked() {
                        load = Some(m.path.clone());
                    }
                });
                ui.end_row();
            }
        });
        if let Some(p) = load {
            ctx.actions.push(Action::LoadModel(p));
        }
    }
}

/// Loading progress, the load error, or the loaded model's card.
/// The loading state and the loaded model's cards; a base quantization when the user takes the memory
/// card's proposal.
fn status_ui(ui: &mut Ui, status: &ModelStatus, prefs: &mut super::prefs::Prefs) -> Option<BaseQuant> {
    if let Some((path, started)) = &status.loading {
        card_ui(ui, |ui| {
            ui.set_width(ui.available_width());
            ui.horizontal(|ui| {
                ui.spinner();
                ui.label(RichText::new(format!("Loading {}", display_name(path))).strong());
                ui.label(RichText::new(format!("{:.1} s", started.elapsed().as_secs_f64())).weak());
            });
            match &status.load_progress {
                Some(p) => {
                    let text = format!("{:.0}% · {}", 100.0 * p.fraction(), p.describe());
                    ui.add(egui::ProgressBar::new(p.fraction() as f32).text(text));
                }
                None => {
                    ui.add(egui::ProgressBar::new(0.0).animate(true).desired_height(6.0));
                }
            }
            ui.label(RichText::new(path.display().to_string()).weak().small());
        });
        ui.add_space(6.0);
    }
    if let Some((path, message)) = &status.error {
        banner_ui(ui, Tone::Error, format!("Could not load {}:\n{message}", path.display()));
        ui.add_space(6.0);
    }
    match &status.loaded {
        Some(m) => return model_card_ui(ui, m, prefs),
        None if status.loading.is_none() => {
            banner_ui(ui, Tone::Info, "No model loaded yet. Pick one above, or drop it on the window.");
        }
        None => {}
    }
    None
}

fn model_card_ui(ui: &mut Ui, m: &ModelSummary, prefs: &mut super::prefs::Prefs) -> Option<BaseQuant> {
    let mut chosen = None;
    ui.columns(2, |cols| {
        card_ui(&mut cols[0], |ui| {
            ui.set_width(ui.available_width());
            ui.horizontal(|ui| {
                widgets::status_dot_ui(ui, palette::OK);
                // Hub names are long (ORG/NAME/file.gguf): cut them to the column, the full path is below.
                ui.add(egui::Label::new(RichText::new(m.name()).strong().size(16.0)).truncate())
                    .on_hover_text(m.name());
            });
            ui.add(egui::Label::new(RichText::new(m.path.display().to_string()).weak().small()).truncate())
                .on_hover_text(m.path.display().to_string());
            ui.add_space(4.0);
            egui::Grid::new("model-facts").num_columns(2).spacing([18.0, 4.0]).show(ui, |ui| {
                let row = |ui: &mut Ui, k: &str, v: String| {
                    ui.label(RichText::new(k).weak());
                    ui.label(v);
                    ui.end_row();
                };
                row(ui, "Architecture", m.architecture.clone());
                row(ui, "Parameters", format!("{} ({})", fmt_count(m.shape.parameters), m.shape.parameters));
                row(ui, "Layers", m.shape.layers.to_string());
                row(ui, "Hidden size", format!("{} · MLP {}", m.shape.hidden_size, m.shape.intermediate_size));
                row(
                    ui,
                    "Attention",
                    format!(
                        "{} heads · {} KV heads · head dim {}",
                        m.shape.attention_heads, m.shape.kv_heads, m.shape.head_dim
                    ),
                );
                row(ui, "Vocabulary", m.shape.vocab_size.to_string());
                row(ui, "Context", format!("{} tokens", m.shape.context_length));
                row(
                    ui,
                    "Format",
                    match &m.weights_dtype {
                        Some(w) if w.starts_with(&m.format) => w.clone(),
                        Some(w) => format!("{} (saved as {w})", m.format),
                        None => m.format.clone(),
                    },
                );
                row(ui, "Compute dtype", with_reason(&m.dtype, Some(&m.dtype_reason)));
                row(ui, "Base weights", format!("{} ({})", m.base_weights, m.quantize));
                row(ui, "Device", with_reason(&m.device, m.device_note.as_ref()));
                row(
                    ui,
                    "Chat template",
                    if m.has_chat_template { "yes".into() } else { "none (plain fallback format)".into() },
                );
                row(ui, "Loaded in", fmt_secs(m.load_secs));
            });
            for note in &m.notes {
                ui.label(RichText::new(format!("Note: {note}")).color(palette::WARN));
            }
        });
        card_ui(&mut cols[1], |ui| {
            ui.set_width(ui.available_width());
            chosen = memory_card_ui(ui, m, prefs, true, None);
        });
    });
    chosen
}

/// The estimate of training memory at the current settings, part by part, against the device's memory.
/// When the run would not fit, it offers the settings change that makes it fit (checkpointing, a smaller
/// batch or sequence) as a button that applies it to `prefs`, and names the base quantization that would fit
/// (with `offer_reload`, as a button whose choice is returned).
pub fn memory_card_ui(
    ui: &mut Ui,
    m: &ModelSummary,
    prefs: &mut super::prefs::Prefs,
    offer_reload: bool,
    longest_row_tokens: Option<usize>,
) -> Option<BaseQuant> {
    let budget = (m.memory_budget_bytes, m.memory_budget_name.as_str());
    // Batches are padded to their longest row: with the dataset's lengths known, that is the worst batch.
    let cfg = &estimate::padded_to_data(&prefs.train, longest_row_tokens);
    let decision = estimate::checkpointing_decision(&m.shape, cfg, budget.0, budget.1);
    let est = estimate::run_memory(&m.shape, cfg, budget.0, budget.1);
    let trainable = estimate::trainable_params(&m.shape, &cfg.lora).unwrap_or(0);
    ui.label(RichText::new("Training at the current settings").strong()).on_hover_text(
        "An estimate from the model's shape and the LoRA / training settings; it updates as you change them.",
    );
    ui.label(
        RichText::new(format!(
            "rank {} · {} · batch {} × {} tokens",
            cfg.lora.rank,
            super::glossary::targets_summary(&cfg.lora.targets, Some(&m.shape)),
            // A preference batch holds a chosen and a rejected sequence per pair: the estimate counts both.
            match cfg.method.is_preference() {
                true => format!("{} pairs ({} sequences)", cfg.batch_size, cfg.rows_per_batch()),
                false => cfg.batch_size.to_string(),
            },
            cfg.seq_len
        ))
        .weak()
        .small(),
    );
    ui.label(RichText::new(estimate::padding_assumption(&prefs.train, longest_row_tokens)).weak().small());
    ui.add_space(4.0);
    egui::Grid::new("mem-est").num_columns(2).spacing([18.0, 4.0]).show(ui, |ui| {
        let row = |ui: &mut Ui, k: &str, v: String, help: &str| {
            ui.label(RichText::new(k).weak()).on_hover_text(help);
            ui.label(v);
            ui.end_row();
        };
        row(
            ui,
            "Trainable parameters",
            format!(
                "{} ({:.3}% of the model)",
                fmt_count(trainable),
                100.0 * trainable as f64 / m.shape.parameters.max(1) as f64
            ),
            "rank × (in + out) for every adapted linear in every adapted layer",
        );
        row(
            ui,
            "Base weights",
            format!("{} · {}", fmt_bytes(est.base_weights_bytes), m.base_weights),
            "what the loaded base holds: dense parameters × bytes of the compute dtype, quantized projections \
             at their type's bytes per weight; frozen, shared with chat",
        );
        row(
            ui,
            "Adapter + optimizer",
            fmt_bytes(est.adapter_state_bytes),
            "LoRA weights, gradients and AdamW's two moments, all f32",
        );
        row(
            ui,
            "Activations",
            format!("{} · checkpointing {}", fmt_bytes(est.activations_bytes), decision.reason),
            "what the backward pass keeps for one micro-batch: every trained layer's activations, or with \
             gradient checkpointing each layer's input plus one layer being recomputed",
        );
        row(
            ui,
            "Head and loss",
            fmt_bytes(est.logits_bytes),
            "the LM head and cross-entropy run over chunks of positions: one chunk's logits (f32), the final \
             hidden states and their gradient; never a whole tokens × vocabulary tensor",
        );
        row(
            ui,
            "Transient",
            fmt_bytes(est.transient_bytes + est.runtime_bytes),
            "the largest short-lived buffers of one layer's backward (attention scores and their gradients), \
             plus the process itself (code, tokenizer, thread pools)",
        );
        ui.label(RichText::new("Total (≈)").strong());
        ui.label(RichText::new(fmt_bytes(est.total_bytes())).strong().color(palette::ACCENT));
        ui.end_row();
        if let Some(budget) = m.memory_budget_bytes {
            row(ui, "Available", fmt_bytes(budget), &m.memory_budget_name);
        }
    });
    if let Some(warning) = estimate::memory_warning(&m.shape, cfg, budget.0, budget.1) {
        ui.label(RichText::new(format!("Warning: {warning}")).color(palette::WARN));
    }
    if let Some((fix, fixed)) = estimate::memory_fix(&m.shape, cfg, budget.0, budget.1) {
        let label = format!("Fix: {} (then about {})", fix.describe(), fmt_bytes(fixed.total_bytes()));
        if ui.button(label).on_hover_text("Change this setting so the run fits the memory").clicked() {
            fix.apply(&mut prefs.train);
        }
    }
    quantization_proposal_ui(ui, m, prefs, offer_reload)
}

/// For a dense base that does not fit: the quantized base that would, and (with `offer_reload`) a button
/// that reloads the model with it.
fn quantization_proposal_ui(
    ui: &mut Ui,
    m: &ModelSummary,
    prefs: &super::prefs::Prefs,
    offer_reload: bool,
) -> Option<BaseQuant> {
    if m.quantize.is_quantized() {
        return None;
    }
    let (quantize, est) = estimate::quantization_that_fits(&m.shape, &prefs.train, m.memory_budget_bytes)?;
    let text = format!(
        "With the base weights quantized to {quantize} (QLoRA) this run needs about {}.",
        fmt_bytes(est.total_bytes())
    );
    ui.label(RichText::new(text).color(palette::ACCENT));
    let button = offer_reload && ui.button(format!("Reload with {quantize} base weights")).clicked();
    button.then_some(quantize)
}

/// A value with why it was chosen, when there is a reason worth showing ("bf16 (default on cuda)").
fn with_reason(value: &str, reason: Option<&String>) -> String {
    match reason.filter(|r| !r.is_empty()) {
        Some(reason) => format!("{value} ({reason})"),
        None => value.to_string(),
    }
}

/// Device and dtype choice, and whether the last model loads on start.
fn placement_row_ui(ui: &mut Ui, prefs: &mut super::prefs::Prefs) {
    ui.horizontal(|ui| {
        let label = ui.label("Device").on_hover_text(
            "auto picks Metal on a Mac, CUDA when built with --features cuda and a GPU is present, else the CPU.",
        );
        egui::ComboBox::from_id_salt("device")
            .selected_text(prefs.device.to_string())
            .show_ui(ui, |ui| {
                for d in [DeviceChoice::Auto, DeviceChoice::Cpu, DeviceChoice::Cuda, DeviceChoice::Metal] {
                    ui.selectable_value(&mut prefs.device, d, d.to_string());
                }
            })
            .response
            .labelled_by(label.id);
        let label = ui.label("dtype").on_hover_text(
            "Compute precision of the base weights. auto: f32 on the CPU, bf16 on GPUs. GGUF files are dequantized to it.",
        );
        egui::ComboBox::from_id_salt("dtype")
            .selected_text(prefs.dtype.as_str())
            .show_ui(ui, |ui| {
                for d in [DTypeChoice::Auto, DTypeChoice::F32, DTypeChoice::F16, DTypeChoice::Bf16] {
                    ui.selectable_value(&mut prefs.dtype, d, d.as_str());
                }
            })
            .response
            .labelled_by(label.id);
        let label = ui.label(super::glossary::BASE_WEIGHTS.name).on_hover_text(super::glossary::BASE_WEIGHTS.hover());
        egui::ComboBox::from_id_salt("quantize")
            .selected_text(prefs.quantize.as_str())
            .show_ui(ui, |ui| {
                for q in BaseQuant::ALL {
                    ui.selectable_value(&mut prefs.quantize, q, q.as_str());
                }
            })
            .response
            .labelled_by(label.id);
        ui.checkbox(&mut prefs.auto_load_model, "Load last model on start")
            .on_hover_text("Load the last model in the background when the studio opens.");
    });
}
