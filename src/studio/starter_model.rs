//! The first launch's way in: with no model loaded and none found on this machine, the model page offers one
//! small instruct model that downloads quickly, chats sensibly and trains in minutes on a laptop, one click
//! away, beside the Hub search and the file picker.

use super::widgets::{card_ui, palette};
use egui::{RichText, Ui};

/// The suggested first model: a Hugging Face repo of safetensors weights with config and tokenizer.
pub const STARTER_REPO: &str = "HuggingFaceTB/SmolLM2-135M-Instruct";

/// The card, shown by the model page while it has nothing else to offer; true when the user asked for the model
/// (`downloading`: a download already runs, so the button waits).
pub fn offer_ui(ui: &mut Ui, downloading: bool) -> bool {
    let mut clicked = false;
    card_ui(ui, |ui| {
        ui.set_width(ui.available_width());
        ui.label(RichText::new("New here? Start with a small model").strong().color(palette::ACCENT));
        ui.label(
            "SmolLM2-135M-Instruct: 135 million parameters, about 270 MB, a chat model from Hugging Face. It loads \
             in seconds, trains a small LoRA adapter in minutes on a CPU, and shows every page of the studio \
             working. Bigger models (Qwen2.5, Llama 3.2, Gemma) are in the search below.",
        );
        let button = ui
            .add_enabled(!downloading, egui::Button::new(RichText::new("Download and load SmolLM2-135M").strong()))
            .on_hover_text(format!("Download {STARTER_REPO} into the Hugging Face cache and load it"))
            .on_disabled_hover_text("A download is already running");
        clicked = button.clicked();
    });
    ui.add_space(8.0);
    clicked
}
