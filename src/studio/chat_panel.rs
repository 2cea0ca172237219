//! The chat page: talk to the base model, to the base model with an adapter (a checkpoint of a run, or a PEFT
//! adapter folder from anywhere: [`super::chat_adapter`]), or side by side with the same prompt: the adapter
//! on the right, the base model or any other checkpoint on the left ([`super::chat_columns`]).
//! Replies stream token by token from the worker's KV-cache generator, which runs on its own thread and shares
//! the loaded base weights with any training run. A conversation exports to JSON or Markdown
//! ([`super::chat_export`]).

use super::chat_adapter::AdapterLoader;
use super::chat_columns::{column_title, model_menu_ui, ColumnPick};
use super::chat_export::ChatExport;
use super::chat_transcript::ChatSetup;
pub use super::chat_transcript::{ChatMode, Exchange, Reply};
use super::panel_ctx::{Action, ModelStatus, PanelCtx};
use super::prefs::{ChatPrefs, Page, Prefs};
use super::widgets::{self, banner_ui, palette, Tone};
use crate::engine::model::chat_template::ChatMessage;
use crate::worker::{display_name, ChatSide, CheckpointInfo, Command, Event, GenerateJob, GenerationStats};
use egui::{DragValue, RichText, Ui};
use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Default)]
pub struct ChatPanel {
    /// The checkpoint whose adapter the "adapter" side uses.
    pub adapter: Option<PathBuf>,
    /// The base model the adapter was trained on, when known (to warn about a mismatch).
    pub adapter_base: Option<PathBuf>,
    /// The checkpoint the left column answers with side by side; None: the base model.
    pub left_adapter: Option<PathBuf>,
    pub input: String,
    /// Why the last send was refused (the engine's sampling check); nothing was generated.
    pub settings_error: Option<String>,
    pub exchanges: Vec<Exchange>,
    /// Generation id -> (exchange index, side).
    pending: HashMap<u64, (usize, ChatSide)>,
    next_id: u64,
    /// "Load adapter…": an adapter folder from anywhere, checked against the model.
    pub loader: AdapterLoader,
    /// "Export…": the conversation to a JSON or Markdown file.
    pub export: ChatExport,
}

impl ChatPanel {
    pub fn is_generating(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Open the chat with a checkpoint's adapter (the checkpoints page's "Open in chat"); returns the load of
    /// its base model when no model is loaded or loading and the base is on disk.
    pub fn open_checkpoint(
        &mut self,
        checkpoint: PathBuf,
        base_model: PathBuf,
        model: &ModelStatus,
        prefs: &mut Prefs,
    ) -> Option<Action> {
        let base = (!base_model.as_os_str().is_empty()).then_some(base_model);
        let load = base
            .clone()
            .filter(|b| model.loaded.is_none() && model.loading.is_none() && b.exists())
            .map(Action::LoadModel);
        self.use_adapter(checkpoint, base, &mut prefs.chat);
        prefs.page = Page::Chat;
        load
    }

    /// Answer with `adapter` from now on (the adapter side, unless side by side is already on).
    fn use_adapter(&mut self, adapter: PathBuf, base_model: Option<PathBuf>, chat: &mut ChatPrefs) {
        self.adapter = Some(adapter);
        self.adapter_base = base_model;
        if chat.mode == ChatMode::Base {
            chat.mode = ChatMode::Adapter;
        }
    }

    /// The worker's chat events: generation progress, and the answer to an adapter check.
    pub fn on_event(&mut self, event: Event, chat: &mut ChatPrefs) {
        match event {
            Event::GenerationStarted { id, prompt_tokens, adapter_warning, template_warning } => {
                self.on_started(id, prompt_tokens, [adapter_warning, template_warning])
            }
            Event::Token { id, text } => self.on_token(id, &text),
            Event::GenerationFinished { id, stats } => self.on_finished(id, stats),
            Event::GenerationFailed { id, error } => self.on_failed(id, error.message),
            Event::AdapterChecked { path, check } => {
                let asked_for = self.loader.on_checked(path.clone(), *check);
                if asked_for {
                    super::prefs::remember(&mut chat.recent_adapters, &path);
                    match self.loader.target {
                        ChatSide::Right => self.use_adapter(path, None, chat),
                        ChatSide::Left => {
                            self.left_adapter = Some(path);
                            chat.mode = ChatMode::SideBySide;
                        }
                    }
                }
            }
            Event::AdapterCheckFailed { path, error } => self.loader.on_failed(path, error.message),
            _ => {}
        }
    }

    fn reply_for(&mut self, id: u64) -> Option<&mut Reply> {
        let &(i, side) = self.pending.get(&id)?;
        self.exchanges.get_mut(i)?.reply_mut(side).as_mut()
    }

    /// The worker's warnings on a reply that starts: the adapter's base and the model's missing chat template.
    pub fn on_started(&mut self, id: u64, _prompt_tokens: usize, warnings: [Option<String>; 2]) {
        if let Some(r) = self.reply_for(id) {
            let warnings: Vec<String> = warnings.into_iter().flatten().collect();
            r.warning = (!warnings.is_empty()).then(|| warnings.join("\n\n"));
        }
    }

    pub fn on_token(&mut self, id: u64, text: &str) {
        if let Some(r) = self.reply_for(id) {
            if r.first_token_at.is_none() {
                r.first_token_at = Some(Instant::now());
            }
            r.pieces += 1;
            r.text.push_str(text);
        }
    }

    pub fn on_finished(&mut self, id: u64, stats: GenerationStats) {
        if let Some(r) = self.reply_for(id) {
            r.streaming = false;
            r.stats = Some(stats);
        }
        self.pending.remove(&id);
    }

    pub fn on_failed(&mut self, id: u64, message: String) {
        if let Some(r) = self.reply_for(id) {
            r.streaming = false;
            r.error = Some(message);
        }
        self.pending.remove(&id);
    }

    /// Send the input to the active side(s).
    fn send(&mut self, ctx: &mut PanelCtx<'_>) {
        let text = self.input.trim().to_string();
        if text.is_empty() || self.is_generating() {
            return;
        }
        // The engine's one sampling check: a bad setting is shown and nothing is generated.
        let c = &ctx.prefs.chat;
        self.settings_error = c.sampling.validate(c.max_tokens).err().map(|e| e.to_string());
        if self.settings_error.is_some() {
            return;
        }
        self.input.clear();
        let mode = ctx.prefs.chat.mode;
        let sides: &[ChatSide] = match mode {
            ChatMode::Base => &[ChatSide::Left],
            ChatMode::Adapter => &[ChatSide::Right],
            ChatMode::SideBySide => &[ChatSide::Left, ChatSide::Right],
        };
        let index = self.exchanges.len();
        self.exchanges.push(Exchange { user: text, base: None, adapter: None });
        for &side in sides {
            let adapter = match (side, mode) {
                (ChatSide::Right, _) => self.adapter.clone(),
                (ChatSide::Left, ChatMode::SideBySide) => self.left_adapter.clone(),
                (ChatSide::Left, _) => None,
            };
            self.next_id += 1;
            let id = self.next_id;
            let messages = self.history(side, ctx.prefs.chat.system_prompt.trim());
            *self.exchanges[index].reply_mut(side) = Some(Reply::new(id, adapter.clone()));
            self.pending.insert(id, (index, side));
            let c = &ctx.prefs.chat;
            ctx.actions.push(Action::Send(Command::Generate(GenerateJob {
                id,
                side,
                adapter,
                messages,
                sampling: c.sampling.clone(),
                max_new_tokens: c.max_tokens,
            })));
        }
    }

    /// The conversation one side has seen, ending with the newest user message.
    fn history(&self, side: ChatSide, system: &str) -> Vec<ChatMessage> {
        let mut messages = Vec::new();
        if !system.is_empty() {
            messages.push(ChatMessage::new("system", system));
        }
        let n = self.exchanges.len();
        for (i, ex) in self.exchanges.iter().enumerate() {
            let reply = ex.reply(side).filter(|r| r.error.is_none() && !r.text.is_empty());
            if i + 1 < n && reply.is_none() {
                continue;
            }
            messages.push(ChatMessage::new("user", ex.user.clone()));
            if let (Some(r), true) = (reply, i + 1 < n) {
                messages.push(ChatMessage::new("assistant", r.text.trim()));
            }
        }
        messages
    }

    fn stop(&mut self, actions: &mut Vec<Action>) {
        for id in self.pending.keys() {
            actions.push(Action::Send(Command::CancelGeneration { id: *id }));
        }
    }

    pub fn ui(&mut self, ui: &mut Ui, ctx: &mut PanelCtx<'_>, checkpoints: &[(String, &CheckpointInfo)]) {
        widgets::page_header_ui(
            ui,
            "Chat",
            "Replies stream from a KV-cache generator on the worker; it shares the base weights with a running training.",
        );
        egui::Panel::right("chat-settings").resizable(true).default_size(260.0).size_range(220.0..=380.0).show(
            ui,
            |ui| {
                egui::ScrollArea::vertical().id_salt("chat-settings-scroll").show(ui, |ui| settings_ui(ui, ctx));
            },
        );
        egui::Panel::top("chat-top").show(ui, |ui| self.top_ui(ui, ctx, checkpoints));
        egui::Panel::bottom("chat-input").show(ui, |ui| self.input_ui(ui, ctx));
        egui::CentralPanel::default().show(ui, |ui| self.transcript_ui(ui, ctx, checkpoints));
        let setup = ChatSetup {
            model: ctx.model.loaded.as_ref().map(|m| m.path.clone()),
            adapter: self.adapter.clone(),
            left_adapter: self.left_adapter.clone(),
            mode: ctx.prefs.chat.mode,
            system_prompt: ctx.prefs.chat.system_prompt.clone(),
            sampling: ctx.prefs.chat.sampling.clone(),
            max_new_tokens: ctx.prefs.chat.max_tokens,
        };
        self.export.dialog_ui(ui, &self.exchanges, &setup);
    }

    fn top_ui(&mut self, ui: &mut Ui, ctx: &mut PanelCtx<'_>, checkpoints: &[(String, &CheckpointInfo)]) {
        let mut commands = Vec::new();
        ui.horizontal_wrapped(|ui| {
            ui.label(RichText::new("Base").weak());
            match &ctx.model.loaded {
                Some(m) => ui.label(RichText::new(m.name()).strong()),
                None => ui.label(RichText::new("no model loaded").color(palette::WARN)),
            };
            ui.separator();
            self.adapter_pick_ui(ui, &ctx.prefs.chat.recent_adapters, checkpoints, &mut commands);
            if ui
                .add_enabled(!self.loader.is_checking(), egui::Button::new("Load adapter…"))
                .on_hover_text(
                    "Use an adapter folder from anywhere: a PEFT adapter (adapter_config.json + \
                     adapter_model.safetensors) or a checkpoint of another run. It is checked against the loaded model.",
                )
                .clicked()
            {
                self.loader.open = !self.loader.open || self.loader.target != ChatSide::Right;
                self.loader.target = ChatSide::Right;
            }
            ui.separator();
            let mode = &mut ctx.prefs.chat.mode;
            ui.selectable_value(mode, ChatMode::Base, "Base").on_hover_text("Only the base model answers");
            ui.add_enabled_ui(self.adapter.is_some(), |ui| {
                ui.selectable_value(mode, ChatMode::Adapter, "With adapter")
                    .on_hover_text("The base model with the chosen adapter");
            });
            ui.add_enabled_ui(self.adapter.is_some() || self.left_adapter.is_some(), |ui| {
                ui.selectable_value(mode, ChatMode::SideBySide, "Side by side").on_hover_text(
                    "The same prompt answered by two columns: the adapter, and the base model or another checkpoint",
                );
            });
            let two_sides = self.adapter.is_some() || self.left_adapter.is_some();
            if (*mode == ChatMode::Adapter && self.adapter.is_none()) || (*mode == ChatMode::SideBySide && !two_sides) {
                *mode = ChatMode::Base;
            }
        });
        if ctx.prefs.chat.mode == ChatMode::SideBySide {
            let recent = &ctx.prefs.chat.recent_adapters;
            let (left, loader) = (&mut self.left_adapter, &mut self.loader);
            super::chat_columns::left_pick_ui(ui, left, loader, recent, checkpoints, &mut commands);
        }
        self.loader.row_ui(ui, &mut commands);
        ctx.actions.extend(commands.into_iter().map(Action::Send));
        self.loader.info_ui(ui, self.adapter.as_deref());
        self.loader.info_ui(ui, self.left_adapter.as_deref().filter(|_| ctx.prefs.chat.mode == ChatMode::SideBySide));
        if let (Some(base), Some(loaded)) = (&self.adapter_base, &ctx.model.loaded) {
            if !base.as_os_str().is_empty() && !crate::worker::paths_match(base, &loaded.path) {
                ui.horizontal(|ui| {
                    banner_ui(
                        ui,
                        Tone::Warn,
                        format!("This adapter was trained on {}, but {} is loaded.", display_name(base), loaded.name()),
                    );
                });
                if ui.small_button(format!("Load {}", display_name(base))).clicked() {
                    ctx.actions.push(Action::LoadModel(base.clone()));
                }
            }
        }
        ui.add_space(2.0);
    }

    /// The adapter dropdown: none, every checkpoint of the runs, and the folders loaded before (checked again
    /// when picked: the model may have changed since).
    fn adapter_pick_ui(
        &mut self,
        ui: &mut Ui,
        recent: &[PathBuf],
        checkpoints: &[(String, &CheckpointInfo)],
        commands: &mut Vec<Command>,
    ) {
        let l = ui.label(RichText::new("Adapter").weak());
        let current =
            self.adapter.as_deref().map(|p| column_title(Some(p), checkpoints)).unwrap_or_else(|| "none".into());
        egui::ComboBox::from_id_salt("adapter-pick")
            .selected_text(current)
            .width(260.0)
            .show_ui(ui, |ui| match model_menu_ui(ui, "none", self.adapter.as_deref(), recent, checkpoints) {
                Some(ColumnPick::Nothing) => {
                    self.adapter = None;
                    self.adapter_base = None;
                }
                Some(ColumnPick::Checkpoint(path)) => {
                    self.adapter = Some(path);
                    self.adapter_base = None;
                }
                Some(ColumnPick::Folder(path)) => {
                    self.loader.target = ChatSide::Right;
                    self.loader.check(path, commands);
                }
                None => {}
            })
            .response
            .labelled_by(l.id);
    }

    fn input_ui(&mut self, ui: &mut Ui, ctx: &mut PanelCtx<'_>) {
        ui.add_space(4.0);
        if let Some(e) = &self.settings_error {
            banner_ui(ui, Tone::Error, e.clone());
        }
        let generating = self.is_generating();
        let can_send = ctx.model.loaded.is_some() && !generating;
        ui.horizontal(|ui| {
            let width = (ui.available_width() - 200.0).max(150.0);
            let edit = egui::TextEdit::multiline(&mut self.input)
                .id_salt("chat-input-box")
                .hint_text("Message (Enter sends, Shift+Enter for a new line)")
                .desired_rows(2)
                .desired_width(width)
                .return_key(egui::KeyboardShortcut::new(egui::Modifiers::SHIFT, egui::Key::Enter));
            let response = ui.add(edit);
            let enter = response.has_focus() && ui.input(|i| i.key_pressed(egui::Key::Enter) && !i.modifiers.shift);
            ui.vertical(|ui| {
                let send = ui.add_enabled(
                    can_send && !self.input.trim().is_empty(),
                    egui::Button::new(RichText::new("Send").strong()).min_size(egui::vec2(80.0, 24.0)),
                );
                if send.clicked() || (enter && can_send) {
                    self.send(ctx);
                }
                ui.horizontal(|ui| {
                    if ui.add_enabled(generating, egui::Button::new("Stop")).on_hover_text("Stop generating").clicked()
                    {
                        self.stop(ctx.actions);
                    }
                    if ui
                        .add_enabled(!self.exchanges.is_empty(), egui::Button::new("Clear"))
                        .on_hover_text("Start a new conversation")
                        .clicked()
                    {
                        self.stop(ctx.actions);
                        self.pending.clear();
                        self.exchanges.clear();
                    }
                });
                let can_export = !self.exchanges.is_empty() && !self.export.is_writing();
                if ui
                    .add_enabled(can_export, egui::Button::new("Export…"))
                    .on_hover_text("Save the conversation as JSON (messages and settings) or Markdown")
                    .clicked()
                {
                    let home = super::chat_export::home_folder();
                    self.export.open(&super::chat_export::default_folder(self.adapter.as_deref(), home));
                }
            });
        });
        self.export.status_ui(ui);
        if ctx.model.loaded.is_none() {
            ui.label(RichText::new("Load a model on the Model page to chat.").color(palette::WARN));
        }
        ui.add_space(4.0);
    }

    fn transcript_ui(&self, ui: &mut Ui, ctx: &PanelCtx<'_>, checkpoints: &[(String, &CheckpointInfo)]) {
        if self.exchanges.is_empty() {
            ui.add_space(20.0);
            ui.vertical_centered(|ui| {
                ui.label(RichText::new("Ask something to start.").weak().size(16.0));
                if self.adapter.is_some() {
                    ui.label(RichText::new("Side by side shows how the adapter changes the answers.").weak());
                }
            });
            return;
        }
        match ctx.prefs.chat.mode {
            ChatMode::SideBySide => {
                let left = column_title(self.left_adapter.as_deref(), checkpoints);
                let right = match &self.adapter {
                    Some(_) => format!("With adapter: {}", column_title(self.adapter.as_deref(), checkpoints)),
                    None => "Base model".into(),
                };
                ui.columns(2, |cols| {
                    self.column_ui(&mut cols[0], ChatSide::Left, &left, checkpoints);
                    self.column_ui(&mut cols[1], ChatSide::Right, &right, checkpoints);
                });
            }
            ChatMode::Base => self.column_ui(ui, ChatSide::Left, "", checkpoints),
            ChatMode::Adapter => self.column_ui(ui, ChatSide::Right, "", checkpoints),
        }
    }

    fn column_ui(&self, ui: &mut Ui, side: ChatSide, title: &str, checkpoints: &[(String, &CheckpointInfo)]) {
        if !title.is_empty() {
            ui.label(RichText::new(title).strong().color(if side == ChatSide::Left {
                palette::TRAIN
            } else {
                palette::ACCENT
            }));
        }
        egui::ScrollArea::vertical()
            .id_salt(("transcript", side as u8))
            .stick_to_bottom(true)
            .auto_shrink([false; 2])
            .show(ui, |ui| {
                for (i, ex) in self.exchanges.iter().enumerate() {
                    ui.push_id(i, |ui| {
                        bubble_ui(ui, "You", &ex.user, palette::TRAIN, None);
                        if let Some(r) = ex.reply(side) {
                            reply_ui(ui, r, side, checkpoints);
                        }
                    });
                }
            });
    }
}

fn bubble_ui(ui: &mut Ui, who: &str, text: &str, color: egui::Color32, footer: Option<(String, egui::Color32)>) {
    egui::Frame::new()
        .fill(color.gamma_multiply(0.08))
        .stroke(egui::Stroke::new(1.0, color.gamma_multiply(0.35)))
        .corner_radius(6.0)
        .inner_margin(egui::Margin::symmetric(10, 6))
        .show(ui, |ui| {
            ui.set_width(ui.available_width());
            // Columns lay out justified; chat text reads better ragged.
            ui.with_layout(egui::Layout::top_down(egui::Align::LEFT), |ui| {
                ui.label(RichText::new(who).color(color).strong().small());
                ui.add(egui::Label::new(text).wrap().selectable(true));
                if let Some((f, c)) = footer {
                    ui.label(RichText::new(f).color(c).small());
                }
            });
        });
    ui.add_space(4.0);
}

fn reply_ui(ui: &mut Ui, r: &Reply, side: ChatSide, checkpoints: &[(String, &CheckpointInfo)]) {
    let color = if side == ChatSide::Left { palette::SPEED } else { palette::ACCENT };
    let who = match &r.adapter {
        Some(p) => format!("Assistant · {}", column_title(Some(p), checkpoints)),
        None => "Assistant · base".into(),
    };
    let tps = r.tokens_per_sec().map(|t| format!("{t:.1} tokens/s")).unwrap_or_default();
    let footer = if let Some(e) = &r.error {
        Some((format!("error: {e}"), palette::ERROR))
    } else if r.streaming {
        Some((format!("generating… {tps}"), palette::MASKED_FG))
    } else {
        r.stats.as_ref().map(|s| {
            (
                format!(
                    "{} tokens · {tps} · prompt {} tokens in {:.2} s · stopped: {}",
                    s.new_tokens,
                    s.prompt_tokens,
                    s.prefill_secs,
                    s.stop_reason.as_str().replace('_', " ")
                ),
                palette::MASKED_FG,
            )
        })
    };
    let text = if r.text.is_empty() && r.streaming { "…" } else { r.text.as_str() };
    if let Some(w) = &r.warning {
        banner_ui(ui, Tone::Warn, w.clone());
    }
    bubble_ui(ui, &who, text, color, footer);
    if r.streaming {
        ui.ctx().request_repaint_after(std::time::Duration::from_millis(250));
    }
}

fn settings_ui(ui: &mut Ui, ctx: &mut PanelCtx<'_>) {
    let c = &mut ctx.prefs.chat;
    ui.label(RichText::new("Generation").strong());
    ui.add_space(4.0);
    let l = ui
        .label("System prompt")
        .on_hover_text("Sent first in every conversation; leave empty to use the template's default.");
    ui.add(egui::TextEdit::multiline(&mut c.system_prompt).desired_rows(3).desired_width(f32::INFINITY))
        .labelled_by(l.id);
    ui.add_space(6.0);
    egui::Grid::new("chat-grid").num_columns(2).spacing([10.0, 8.0]).show(ui, |ui| {
        let l = ui.label("Temperature").on_hover_text(
            "Randomness: 0 always picks the most likely token (greedy); 0.7 is a good default; above 1 gets wild.",
        );
        ui.add(egui::Slider::new(&mut c.sampling.temperature, 0.0..=2.0).fixed_decimals(2)).labelled_by(l.id);
        ui.end_row();
        let l = ui
            .label("Top-p")
            .on_hover_text("Sample only from the most likely tokens whose probabilities add up to p (1 = off).");
        ui.add(egui::Slider::new(&mut c.sampling.top_p, 0.05..=1.0).fixed_decimals(2)).labelled_by(l.id);
        ui.end_row();
        let l = ui.label("Top-k").on_hover_text("Sample only from the k most likely tokens (0 = off).");
        ui.add(DragValue::new(&mut c.sampling.top_k).range(0..=1000)).labelled_by(l.id);
        ui.end_row();
        let l = ui.label("Repetition penalty").on_hover_text(format!(
            "Above 1 discourages tokens that already appeared in the conversation (1 = off). The default, {} \
             (Ollama's), stops small models from looping on short prompts: at 1.0 SmolLM2-135M-Instruct repeats one \
             sentence five times in 120 tokens on \"Tell me about cats.\", at 1.1 it does not. Raise it if replies \
             still repeat; lower it toward 1 for code or lists, where repeats are wanted.",
            super::prefs::CHAT_REPETITION_PENALTY
        ));
        ui.add(DragValue::new(&mut c.sampling.repetition_penalty).range(1.0..=2.0).speed(0.01).max_decimals(2))
            .labelled_by(l.id);
        ui.end_row();
        let l = ui.label("Max tokens").on_hover_text("The longest reply, in tokens.");
        ui.add(DragValue::new(&mut c.max_tokens).range(1..=8192)).labelled_by(l.id);
        ui.end_row();
        let l = ui.label("Seed").on_hover_text("Same seed, prompt and settings give the same reply.");
        ui.add(DragValue::new(&mut c.sampling.seed)).labelled_by(l.id);
        ui.end_row();
    });
    ui.add_space(6.0);
    if ui
        .small_button("Greedy")
        .on_hover_text("Temperature 0: deterministic, good for comparing base and adapter")
        .clicked()
    {
        c.sampling.temperature = 0.0;
    }
}
