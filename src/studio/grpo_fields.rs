//! GRPO's parameter rows on the LoRA settings page (inside the "Training method" card's grid): how completions
//! are sampled (completions per prompt, max new tokens, temperature, top-p, top-k), the clipped objective
//! (iterations, beta, epsilon and epsilon-high, loss type, reward scaling) and how often sampled completions are
//! reported. Values are checked by the engine's own `GrpoSettings::validate`, whose message the card shows.

use super::glossary;
use super::setting_rows::row_ui;
use crate::engine::train::grpo::{GrpoLoss, GrpoSettings, ScaleRewards};
use egui::{DragValue, RichText, Ui};

const MAX_NEW_TOKENS_HELP: &str = "Most tokens a sampled completion may have (TRL's max_completion_length); longer \
     ones are cut there and count as clipped. Generation time grows with it.";
const SAMPLING_HELP: &str = "How completions are sampled. Temperature 1 samples the model as it is (the policy's \
     log-probabilities are taken at the same temperature); top-p 1 and top-k 0 are off.";
const ITERATIONS_HELP: &str = "Optimizer steps on each batch of sampled completions (TRL's num_iterations, the \
     paper's μ). 1 samples anew before every step; more reuse the completions, which is where clipping matters.";
const SAMPLE_EVERY_HELP: &str = "Show a few sampled completions with their rewards on the Train page every N steps \
     (0: never). They are also written to the run's metrics.jsonl.";

/// Grid rows (two columns) for GRPO's parameters.
pub fn grpo_rows_ui(ui: &mut Ui, g: &mut GrpoSettings) {
    row_ui(ui, glossary::GENERATIONS.name, &glossary::GENERATIONS.hover(), |ui| {
        ui.add(DragValue::new(&mut g.num_generations).range(1..=256).suffix(" per prompt"));
        ui.label(RichText::new("the group each completion is compared with").weak());
    });
    row_ui(ui, "Max new tokens", MAX_NEW_TOKENS_HELP, |ui| {
        ui.add(DragValue::new(&mut g.max_new_tokens).range(1..=32_768).suffix(" tokens"));
    });
    row_ui(ui, "Sampling", SAMPLING_HELP, |ui| {
        ui.label("temperature");
        ui.add(DragValue::new(&mut g.temperature).range(0.0..=10.0).speed(0.01).max_decimals(3));
        ui.label("top-p");
        ui.add(DragValue::new(&mut g.top_p).range(0.0..=1.0).speed(0.01).max_decimals(3));
        ui.label("top-k");
        ui.add(DragValue::new(&mut g.top_k).range(0..=100_000));
    });
    row_ui(ui, "Iterations", ITERATIONS_HELP, |ui| {
        ui.add(DragValue::new(&mut g.num_iterations).range(1..=64).suffix(" per batch"));
    });
    row_ui(ui, glossary::KL_BETA.name, &glossary::KL_BETA.hover(), |ui| {
        ui.add(DragValue::new(&mut g.beta).range(0.0..=100.0).speed(0.001).max_decimals(4));
        let meaning = if g.beta > 0.0 { "KL to the base model on" } else { "0 = off (no reference pass)" };
        ui.label(RichText::new(meaning).weak());
    });
    row_ui(ui, glossary::CLIP_EPSILON.name, &glossary::CLIP_EPSILON.hover(), |ui| {
        ui.label("low");
        ui.add(DragValue::new(&mut g.epsilon).range(0.0..=1.0).speed(0.005).max_decimals(3));
        let mut high = g.epsilon_high.is_some();
        if ui.checkbox(&mut high, "high").on_hover_text("DAPO's clip-higher: its own upper bound").changed() {
            // The DAPO paper's 0.28 is the usual starting point.
            g.epsilon_high = high.then_some(g.epsilon_high.unwrap_or(0.28));
        }
        match &mut g.epsilon_high {
            Some(v) => {
                ui.add(DragValue::new(v).range(0.0..=10.0).speed(0.005).max_decimals(3));
            }
            None => {
                ui.label(RichText::new("same as low").weak());
            }
        }
    });
    row_ui(ui, glossary::GRPO_LOSS.name, &glossary::GRPO_LOSS.hover(), |ui| {
        for loss in GrpoLoss::ALL {
            ui.radio_value(&mut g.loss, loss, loss.name());
        }
    });
    row_ui(ui, glossary::REWARD_SCALING.name, &glossary::REWARD_SCALING.hover(), |ui| {
        for scale in ScaleRewards::ALL {
            ui.radio_value(&mut g.scale_rewards, scale, scale.name());
        }
    });
    row_ui(ui, "Show samples every", SAMPLE_EVERY_HELP, |ui| {
        ui.add(DragValue::new(&mut g.sample_every).range(0..=1_000_000).suffix(" steps"));
        ui.label(RichText::new("(0 = never)").weak());
    });
}

/// The engine's refusal of these settings, in its words (the CLI prints the same), or None.
pub fn grpo_error(g: &GrpoSettings) -> Option<String> {
    g.validate().err().map(|e| e.to_string())
}
