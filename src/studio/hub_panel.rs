//! "Find on Hugging Face" on the model page: search the Hub by text, read each hit's downloads, likes, license,
//! gated flag, size and whether our loader reads its architecture, pick a GGUF repo's quant file, then download
//! it with a real progress bar (bytes of the total, speed, time left) that can be cancelled and resumed; the model
//! loads when it is done. A token for gated repos is entered once and stored where `huggingface_hub` keeps it.
//! The dataset page has the same search for datasets ("Download and open"), and shares the download card (a typed
//! dataset repo id downloads the same way).

use super::panel_ctx::{Action, PanelCtx};
use super::widgets::{banner_ui, card_ui, fmt_bytes, fmt_count, fmt_secs, palette, section_ui, Tone};
use crate::engine::hub::{pick_gguf, GgufChoice, RepoKind, SearchHit};
use crate::worker::Command;
use egui::{RichText, Ui};

/// The search box and its results, for models (the model page) or datasets (the dataset page).
#[derive(Default)]
pub struct HubPanel {
    kind: RepoKind,
    pub query: String,
    searching: Option<String>,
    pub hits: Vec<SearchHit>,
    searched: Option<String>,
    error: Option<String>,
    /// The chosen GGUF file per repo id.
    chosen_file: std::collections::HashMap<String, String>,
    token_input: String,
}

impl HubPanel {
    /// A search for `kind` repositories.
    pub fn for_kind(kind: RepoKind) -> Self {
        Self { kind, ..Self::default() }
    }

    pub fn on_results(&mut self, query: String, hits: Vec<SearchHit>) {
        if self.searching.as_deref() == Some(query.as_str()) {
            self.searching = None;
            self.error = None;
            self.hits = hits;
            self.searched = Some(query);
        }
    }

    pub fn on_failed(&mut self, query: String, message: String) {
        if self.searching.as_deref() == Some(query.as_str()) {
            self.searching = None;
            self.error = Some(message);
        }
    }

    pub fn is_searching(&self) -> bool {
        self.searching.is_some()
    }

    fn search(&mut self, ctx: &mut PanelCtx<'_>) {
        let query = self.query.trim().to_string();
        if query.is_empty() {
            return;
        }
        self.searching = Some(query.clone());
        ctx.actions.push(Action::Send(Command::HubSearch {
            settings: ctx.hub.settings.clone(),
            kind: self.kind,
            query,
        }));
    }

    /// The search card, in a scope of its own: its widgets' ids do not depend on what the page shows above it. A
    /// dataset's rows that arrive between a press on Search and its release (or between a screen reader finding the
    /// button and clicking it) would otherwise renumber the button and lose the click.
    pub fn ui(&mut self, ui: &mut Ui, ctx: &mut PanelCtx<'_>) {
        let scope = egui::Id::unique(("hub-search", self.kind));
        ui.scope_builder(egui::UiBuilder::new().scope_id(scope), |ui| self.card_ui(ui, ctx));
    }

    fn card_ui(&mut self, ui: &mut Ui, ctx: &mut PanelCtx<'_>) {
        let (title, hint, typed) = match self.kind {
            RepoKind::Model => (
                "Find on Hugging Face",
                "e.g. SmolLM2, Qwen2.5 0.5B Instruct, Llama-3.2-1B GGUF",
                "Or type ORG/NAME (ORG/NAME:Q4_K_M for one GGUF file) in the path above.",
            ),
            RepoKind::Dataset => (
                "Find a dataset on Hugging Face",
                "e.g. alpaca, sharegpt, gsm8k",
                "Or type ORG/NAME in the path above. JSONL, JSON and parquet files are fetched.",
            ),
        };
        section_ui(ui, title);
        card_ui(ui, |ui| {
            ui.set_width(ui.available_width());
            ui.horizontal(|ui| {
                let label = ui.label("Search");
                let busy = self.searching.is_some();
                ui.with_layout(egui::Layout::right_to_left(egui::Align::Center), |ui| {
                    let clicked =
                        ui.add_enabled(!busy && !self.query.trim().is_empty(), egui::Button::new("Search")).clicked();
                    if busy {
                        ui.spinner();
                    }
                    let edit =
                        egui::TextEdit::singleline(&mut self.query).hint_text(hint).desired_width(ui.available_width());
                    let response = ui.add(edit).labelled_by(label.id);
                    let enter = response.lost_focus() && ui.input(|i| i.key_pressed(egui::Key::Enter));
                    if clicked || (enter && !busy) {
                        self.search(ctx);
                    }
                });
            });
            ui.label(
                RichText::new(format!(
                    "From {} into {}. {typed}",
                    ctx.hub.settings.endpoint,
                    ctx.hub.settings.cache_dir.display()
                ))
                .weak()
                .small(),
            );
            if let Some(e) = &self.error {
                banner_ui(ui, Tone::Error, e.clone());
            }
            self.results_ui(ui, ctx);
            if self.kind == RepoKind::Model {
                self.token_ui(ui, ctx);
            }
        });
    }

    fn results_ui(&mut self, ui: &mut Ui, ctx: &mut PanelCtx<'_>) {
        if self.hits.is_empty() {
            if let Some(q) = &self.searched {
                ui.label(RichText::new(format!("Nothing on the Hub matches “{q}”.")).weak());
            }
            return;
        }
        if self.kind == RepoKind::Dataset {
            return self.dataset_results_ui(ui, ctx);
        }
        let downloading = ctx.hub.download.is_some();
        let hits = std::mem::take(&mut self.hits);
        egui::Grid::new("hub-hits").num_columns(7).striped(true).spacing([14.0, 6.0]).show(ui, |ui| {
            for title in ["Model", "Downloads", "Likes", "License", "Size", "Architecture", ""] {
                ui.label(RichText::new(title).strong());
            }
            ui.end_row();
            for hit in &hits {
                ui.horizontal(|ui| {
                    ui.label(&hit.id);
                    if hit.gated {
                        ui.label(RichText::new("gated").small().color(palette::WARN))
                            .on_hover_text("Accept the terms on the model's Hub page, then give a token below.");
                    }
                });
                ui.label(fmt_count(hit.downloads as usize));
                ui.label(fmt_count(hit.likes as usize));
                ui.label(hit.license.as_deref().unwrap_or("—"));
                ui.label(hit.size_bytes.map_or("—".into(), fmt_bytes));
                let arch = hit.architecture.as_deref().unwrap_or("unknown");
                match hit.supported {
                    Some(true) => ui.label(arch),
                    Some(false) => ui.label(RichText::new(format!("{arch} (not supported)")).color(palette::ERROR)),
                    None => ui.label(RichText::new(arch).weak()),
                };
                ui.horizontal(|ui| {
                    let file = self.gguf_picker_ui(ui, hit);
                    let spec = match (&file, hit.weights.as_str()) {
                        (Some(choice), _) => Some(format!(
                            "{}:{}",
                            hit.id,
                            if choice.quant.is_empty() { choice.file.as_str() } else { choice.quant.as_str() }
                        )),
                        (None, "safetensors") => Some(hit.id.clone()),
                        _ => None,
                    };
                    let readable = hit.supported != Some(false) && spec.is_some();
                    let button = ui
                        .add_enabled(readable && !downloading, egui::Button::new("Download and load"))
                        .on_disabled_hover_text(if downloading {
                            "Another download is running"
                        } else {
                            "Neither safetensors nor a GGUF file our loader reads"
                        });
                    if button.clicked() {
                        if let Some(spec) = spec {
                            ctx.actions.push(Action::Download { spec, kind: RepoKind::Model });
                        }
                    }
                });
                ui.end_row();
            }
        });
        self.hits = hits;
    }

    fn dataset_results_ui(&mut self, ui: &mut Ui, ctx: &mut PanelCtx<'_>) {
        let downloading = ctx.hub.download.is_some();
        egui::Grid::new("hub-dataset-hits").num_columns(6).striped(true).spacing([14.0, 6.0]).show(ui, |ui| {
            for title in ["Dataset", "Downloads", "Likes", "License", "Size", ""] {
                ui.label(RichText::new(title).strong());
            }
            ui.end_row();
            for hit in &self.hits {
                ui.horizontal(|ui| {
                    ui.label(&hit.id);
                    if hit.gated {
                        ui.label(RichText::new("gated").small().color(palette::WARN));
                    }
                });
                ui.label(fmt_count(hit.downloads as usize));
                ui.label(fmt_count(hit.likes as usize));
                ui.label(hit.license.as_deref().unwrap_or("—"));
                ui.label(hit.size_bytes.map_or("—".into(), fmt_bytes));
                let button = ui
                    .add_enabled(!downloading, egui::Button::new("Download and open"))
                    .on_disabled_hover_text("Another download is running");
                if button.clicked() {
                    ctx.actions.push(Action::Download { spec: hit.id.clone(), kind: RepoKind::Dataset });
                }
                ui.end_row();
            }
        });
    }

    /// For a GGUF repo, a choice of its quant files (Q4_K_M-like by default); `None` for other repos.
    fn gguf_picker_ui(&mut self, ui: &mut Ui, hit: &SearchHit) -> Option<GgufChoice> {
        if hit.weights != "gguf" || hit.gguf_files.is_empty() {
            return None;
        }
        let default = pick_gguf(&hit.gguf_files, None).map(|c| c.file.clone()).unwrap_or_default();
        let chosen = self.chosen_file.entry(hit.id.clone()).or_insert(default);
        let label = |c: &GgufChoice| {
            let size = c.size_bytes.map_or(String::new(), |b| format!(" · {}", fmt_bytes(b)));
            let quant = if c.quant.is_empty() { c.file.clone() } else { c.quant.clone() };
            format!("{quant}{size}{}", if c.supported { "" } else { " (not supported)" })
        };
        let current = hit.gguf_files.iter().find(|c| &c.file == chosen).cloned();
        egui::ComboBox::from_id_salt(("gguf-file", &hit.id))
            .selected_text(current.as_ref().map(label).unwrap_or_else(|| "pick a file".into()))
            .show_ui(ui, |ui| {
                for c in &hit.gguf_files {
                    ui.add_enabled_ui(c.supported, |ui| ui.selectable_value(chosen, c.file.clone(), label(c)));
                }
            });
        current
    }

    fn token_ui(&mut self, ui: &mut Ui, ctx: &mut PanelCtx<'_>) {
        ui.add_space(4.0);
        ui.horizontal(|ui| {
            let has = ctx.hub.settings.token.is_some();
            let label = ui.label("Access token").on_hover_text(
                "For gated and private repositories: create one at huggingface.co/settings/tokens. It is stored \
                 where huggingface_hub keeps its token, so both tools use it.",
            );
            let edit = egui::TextEdit::singleline(&mut self.token_input)
                .password(true)
                .hint_text(if has { "a token is set (hidden)" } else { "hf_…" })
                .desired_width(220.0);
            ui.add(edit).labelled_by(label.id);
            if ui.add_enabled(!self.token_input.trim().is_empty(), egui::Button::new("Save token")).clicked() {
                ctx.actions.push(Action::SaveToken(std::mem::take(&mut self.token_input)));
            }
            ui.label(
                RichText::new(if has { "token set" } else { "no token: public repositories only" }).weak().small(),
            );
        });
    }
}

/// The dataset page's search: a [`HubPanel`] for datasets.
pub struct DatasetSearch(pub HubPanel);

impl Default for DatasetSearch {
    fn default() -> Self {
        Self(HubPanel::for_kind(RepoKind::Dataset))
    }
}

/// The download card of `kind`: progress (bytes of the total, speed, time left) with Cancel while it runs; after
/// a failure or a cancel, what happened and a Resume / Retry button.
pub fn download_card_ui(ui: &mut Ui, ctx: &mut PanelCtx<'_>, kind: RepoKind) {
    let hub = ctx.hub;
    if let Some(d) = hub.download.as_ref().filter(|d| d.kind == kind) {
        card_ui(ui, |ui| {
            ui.set_width(ui.available_width());
            ui.horizontal(|ui| {
                ui.spinner();
                ui.label(RichText::new(format!("Downloading {}", d.spec)).strong());
                ui.with_layout(egui::Layout::right_to_left(egui::Align::Center), |ui| {
                    if ui.add_enabled(!d.cancelling, egui::Button::new("Cancel")).clicked() {
                        ctx.actions.push(Action::CancelDownload);
                    }
                });
            });
            let (fraction, text) = match &d.progress {
                Some(p) if p.bytes_total > 0 => {
                    let left = p.secs_left.map_or(String::new(), |s| format!(" · {} left", fmt_secs(s)));
                    (
                        p.bytes_done as f32 / p.bytes_total as f32,
                        format!(
                            "{} of {} · {}/s{left} · file {} of {}",
                            fmt_bytes(p.bytes_done),
                            fmt_bytes(p.bytes_total),
                            fmt_bytes(p.bytes_per_sec as u64),
                            (p.files_done + 1).min(p.file_count),
                            p.file_count
                        ),
                    )
                }
                _ => (0.0, format!("asking the Hub… {}", fmt_secs(d.started.elapsed().as_secs_f64()))),
            };
            ui.add(egui::ProgressBar::new(fraction.clamp(0.0, 1.0)).text(text).animate(true));
            if let Some(p) = &d.progress {
                if !p.file.is_empty() {
                    ui.label(RichText::new(&p.file).weak().small());
                }
            }
            if d.cancelling {
                ui.label(RichText::new("Cancelling; what arrived is kept for a resume.").weak());
            }
        });
    } else if let Some(f) = hub.failed.as_ref().filter(|f| f.kind == kind) {
        let spec = f.spec.clone();
        card_ui(ui, |ui| {
            ui.set_width(ui.available_width());
            if f.cancelled {
                banner_ui(ui, Tone::Info, format!("Download of {spec} cancelled; what arrived is kept."));
            } else {
                banner_ui(ui, Tone::Error, f.message.clone());
            }
            let label = if f.cancelled { "Resume download" } else { "Try again" };
            if ui.button(label).on_hover_text("Continues from the bytes already downloaded").clicked() {
                ctx.actions.push(Action::Download { spec, kind });
            }
        });
    }
}
