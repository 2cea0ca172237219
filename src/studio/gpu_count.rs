//! The GPU count beside the Train page's Start button, on a machine with more than one CUDA GPU: above one, Start
//! launches a data-parallel run (one process per GPU; the worker's data_parallel_job).

use super::widgets::palette;
use egui::{DragValue, RichText, Ui};

const HOVER: &str = "Train on this many GPUs of this machine: one process per GPU, each holding the model and taking \
                     its share of every batch (the batch size is the whole step's), with the gradients summed over the \
                     GPUs (NCCL) before each update, so the run learns what one GPU would on the same batch, faster. \
                     Rank 0 writes the run, and its plots are these. SFT only.";

/// The count (`gpus`, brought down to `on_host`), and what it means for a batch of `batch_size` rows.
pub fn gpu_count_ui(ui: &mut Ui, gpus: &mut usize, on_host: usize, batch_size: usize) {
    if on_host <= 1 {
        return;
    }
    ui.separator();
    ui.label("GPUs").on_hover_text(HOVER);
    // A count chosen on a bigger machine comes down to this one's.
    ui.add(DragValue::new(gpus).range(1..=on_host)).on_hover_text(HOVER);
    let note = match *gpus {
        n if n > 1 && batch_size < n => {
            RichText::new(format!("a batch of {batch_size} leaves GPUs idle: raise it to {n}")).color(palette::WARN)
        }
        n if n > 1 => RichText::new(format!("{:.1} rows per GPU per micro-batch", batch_size as f64 / n as f64)).weak(),
        _ => RichText::new(format!("of {on_host}")).weak(),
    };
    ui.label(note);
}
