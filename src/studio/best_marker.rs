//! How the studio shows a run's best checkpoint (the lowest validation loss so far): the training page's "best so
//! far" and the mark on its row of the checkpoints table, worded the same on both pages. The mark is a word, not a
//! star: the studio's fonts (Ubuntu Light) have no star glyph.

use super::widgets::{fmt_loss, palette};
use crate::worker::BestCheckpoint;
use egui::{RichText, Ui};

/// "best: val 1.234 at step 40".
pub fn best_text(step: usize, val_loss: f64) -> String {
    format!("best: val {} at step {step}", fmt_loss(val_loss))
}

/// The training page's best so far, after a separator (nothing before the first evaluation).
pub fn best_so_far_ui(ui: &mut Ui, best: Option<(usize, f64)>) {
    let Some((step, val_loss)) = best else { return };
    ui.separator();
    ui.label(RichText::new(best_text(step, val_loss)).color(palette::VALID))
        .on_hover_text("The checkpoint with the lowest validation loss so far; it is always saved, and kept under the checkpoint limit.");
}

/// A checkpoint's step in the checkpoints table, "40 · best" when it is the run's best.
pub fn checkpoint_step_ui(ui: &mut Ui, step: usize, best: Option<BestCheckpoint>) {
    match best.filter(|b| b.step == step) {
        Some(b) => {
            ui.label(RichText::new(format!("{step} · best")).monospace().color(palette::VALID))
                .on_hover_text(best_text(b.step, b.val_loss));
        }
        None => {
            ui.label(RichText::new(step.to_string()).monospace());
        }
    }
}

/// The checkpoints section's title: the count, and the best when the run has one.
pub fn checkpoints_title(count: usize, best: Option<BestCheckpoint>) -> String {
    match best {
        Some(b) => format!("Checkpoints ({count}) · {}", best_text(b.step, b.val_loss)),
        None => format!("Checkpoints ({count})"),
    }
}
