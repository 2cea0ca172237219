//! GRPO's reward list on the LoRA settings page: each reward's kind (exact answer, regex, format, length, program)
//! with its own settings, its weight and a remove button, plus "Add reward". A program's command line is split into
//! arguments as a shell would split it (quotes, backslashes) but is never run through a shell; while the line does
//! not split (an open quote), the program has no command and the row says why.

use super::widgets::palette;
use crate::engine::train::grpo::rewards::program::{join_command, split_command};
use crate::engine::train::grpo::settings::DEFAULT_REWARD_TIMEOUT_SECS;
use crate::engine::train::grpo::{reward_names, RewardKind, RewardSpec};
use egui::{DragValue, RichText, TextEdit, Ui};

/// The preset structure of the format reward.
const THINK_ANSWER: &str = "think-answer";

/// The kinds in the dropdown's order, each with its label and what it scores.
const KINDS: [(&str, &str); 5] = [
    ("exact answer", "1 when the completion's answer (\\boxed{}, after ####, or the first number) equals the row's answer"),
    ("regex", "1 when the pattern matches anywhere in the completion"),
    ("format", "1 when the whole completion has the structure: <think>…</think><answer>…</answer>, or a regex"),
    ("length", "0 up to the budget, then down to −1 at twice the budget"),
    ("program", "runs once per completion without a shell: reads {\"prompt\", \"completion\", \"answer\"} on stdin, prints a number"),
];

fn kind_index(kind: &RewardKind) -> usize {
    match kind {
        RewardKind::ExactAnswer => 0,
        RewardKind::Regex { .. } => 1,
        RewardKind::Format { .. } => 2,
        RewardKind::Length { .. } => 3,
        RewardKind::Program { .. } => 4,
    }
}

/// A new reward of the kind at `index` of [`KINDS`], with settings that work as they are where there are any.
fn new_kind(index: usize) -> RewardKind {
    match index {
        1 => RewardKind::Regex { pattern: String::new() },
        2 => RewardKind::Format { structure: THINK_ANSWER.into() },
        3 => RewardKind::Length { budget: 64 },
        4 => RewardKind::Program { command: Vec::new(), timeout_secs: DEFAULT_REWARD_TIMEOUT_SECS },
        _ => RewardKind::ExactAnswer,
    }
}

/// The reward list with its add and remove buttons.
pub fn reward_editor_ui(ui: &mut Ui, rewards: &mut Vec<RewardSpec>) {
    ui.label(RichText::new("Rewards").strong()).on_hover_text(super::glossary::REWARDS.hover());
    let names = reward_names(rewards);
    // Where each row keeps its command-line draft (egui's memory: a text being typed, not a setting).
    let drafts = ui.make_persistent_id("reward-command-drafts");
    let mut remove = None;
    for (i, (reward, name)) in rewards.iter_mut().zip(&names).enumerate() {
        egui::Frame::group(ui.style()).show(ui, |ui| {
            ui.set_width(ui.available_width());
            ui.push_id(("reward", i), |ui| {
                if reward_row_ui(ui, reward, name, drafts.with(i)) {
                    remove = Some(i);
                }
            });
        });
    }
    if let Some(i) = remove {
        rewards.remove(i);
        // Command-line drafts are kept per row: the rows after the removed one moved up.
        for i in 0..=rewards.len() {
            ui.data_mut(|d| d.remove::<String>(drafts.with(i)));
        }
    }
    ui.horizontal(|ui| {
        if ui.button("Add reward").on_hover_text("Add a reward; the rewards are summed with their weights").clicked() {
            rewards.push(RewardSpec { kind: RewardKind::ExactAnswer, weight: 1.0 });
        }
        if rewards.is_empty() {
            ui.label(RichText::new("GRPO needs at least one reward").color(palette::WARN));
        }
    });
}

/// One reward; true when its remove button was clicked.
fn reward_row_ui(ui: &mut Ui, reward: &mut RewardSpec, name: &str, draft: egui::Id) -> bool {
    let mut removed = false;
    ui.horizontal_wrapped(|ui| {
        ui.label(RichText::new(name).monospace().strong())
            .on_hover_text(format!("Reported as rewards/{name}/mean in the plots and metrics.jsonl"));
        let current = kind_index(&reward.kind);
        let mut chosen = current;
        let k = ui.label("kind");
        ui.label_inputs_by(k.id, |ui| {
            egui::ComboBox::from_id_salt("kind").selected_text(KINDS[current].0).show_ui(ui, |ui| {
                for (k, (label, what)) in KINDS.iter().enumerate() {
                    ui.selectable_value(&mut chosen, k, *label).on_hover_text(*what);
                }
            });
        });
        if chosen != current {
            reward.kind = new_kind(chosen);
        }
        let l = ui.label("weight");
        ui.add(DragValue::new(&mut reward.weight).range(-100.0..=100.0).speed(0.05).max_decimals(3)).labelled_by(l.id);
        removed = ui.button("Remove").on_hover_text(format!("Remove the {name} reward")).clicked();
    });
    kind_settings_ui(ui, &mut reward.kind, draft);
    ui.label(RichText::new(KINDS[kind_index(&reward.kind)].1).weak().small());
    removed
}

/// The settings of the reward's kind.
fn kind_settings_ui(ui: &mut Ui, kind: &mut RewardKind, draft: egui::Id) {
    match kind {
        RewardKind::ExactAnswer => {}
        RewardKind::Regex { pattern } => {
            ui.horizontal(|ui| {
                let l = ui.label("pattern");
                ui.add(TextEdit::singleline(pattern).hint_text("a Rust regex, e.g. \\d+").desired_width(260.0))
                    .labelled_by(l.id);
            });
        }
        RewardKind::Format { structure } => {
            ui.horizontal_wrapped(|ui| {
                let preset = structure == THINK_ANSWER;
                if ui.radio(preset, "think-answer").clicked() && !preset {
                    *structure = THINK_ANSWER.into();
                }
                if ui.radio(!preset, "regex").clicked() && preset {
                    structure.clear();
                }
                if !preset {
                    ui.add(
                        TextEdit::singleline(structure)
                            .hint_text("the whole completion must match")
                            .desired_width(220.0),
                    );
                }
            });
        }
        RewardKind::Length { budget } => {
            ui.horizontal(|ui| {
                let l = ui.label("budget");
                ui.add(DragValue::new(budget).range(1..=32_768).suffix(" tokens")).labelled_by(l.id);
            });
        }
        RewardKind::Program { command, timeout_secs } => {
            ui.horizontal_wrapped(|ui| {
                let l = ui.label("command");
                let problem = command_line_ui(ui, command, l.id, draft);
                let t = ui.label("timeout");
                ui.add(DragValue::new(timeout_secs).range(0.1..=3600.0).speed(0.1).suffix(" s")).labelled_by(t.id);
                if let Some(problem) = problem {
                    ui.label(RichText::new(problem).color(palette::WARN));
                }
            });
        }
    }
}

/// The program's command line as text; returns why it does not split into arguments, if it does not.
fn command_line_ui(ui: &mut Ui, command: &mut Vec<String>, label: egui::Id, id: egui::Id) -> Option<String> {
    let shown = join_command(command);
    let mut text = ui.data_mut(|d| d.get_temp::<String>(id)).unwrap_or_else(|| shown.clone());
    // A draft that splits to something other than the command is stale (the config was replaced): show the command.
    if split_command(&text).is_ok_and(|words| words != *command) {
        text = shown;
    }
    let edit = ui
        .add(TextEdit::singleline(&mut text).hint_text("python3 score.py --strict").desired_width(260.0).code_editor());
    let edit = edit.labelled_by(label).on_hover_text(
        "The program and its arguments, split as a shell would (quotes keep spaces) but run without a shell: no \
         pipes, globs or variables.",
    );
    let split = split_command(&text);
    if edit.changed() {
        *command = split.clone().unwrap_or_default();
    }
    ui.data_mut(|d| d.insert_temp(id, text));
    split.err().map(|e| format!("the command line does not split into arguments: {e}"))
}
