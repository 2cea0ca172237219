//! Exporting a checkpoint from the checkpoints page: the dialog (format, GGUF quantization, output, replace),
//! which opens with the last format and quantization used (`Prefs::export`; q4_k_m at first), and the card of
//! the finished export: its full path with a Copy button, "Open folder", and for an Ollama folder the exact
//! `ollama create` command to run.

use super::widgets::{banner_ui, fmt_bytes, Tone};
use crate::engine::export::{ExportFormat, GgufQuant};
use crate::worker::Command;
use egui::{RichText, Ui};
use std::path::{Path, PathBuf};

/// What the export dialog opens with: the last format and quantization used (PEFT and q4_k_m at first: a
/// GGUF or Ollama export in f16 is larger than a 4-bit base).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct ExportPrefs {
    pub format: ExportFormat,
    pub quant: GgufQuant,
}

impl Default for ExportPrefs {
    fn default() -> Self {
        Self { format: ExportFormat::Peft, quant: GgufQuant::Q4KM }
    }
}

/// An export being set up in the dialog.
#[derive(Debug, Clone)]
pub struct ExportDialog {
    checkpoint: PathBuf,
    base_model: PathBuf,
    format: ExportFormat,
    quant: GgufQuant,
    pub out: String,
    /// Replace an existing output (the CLI's --overwrite).
    replace: bool,
}

impl ExportDialog {
    /// The dialog for `checkpoint`, opened with the last format and quantization used.
    pub fn new(checkpoint: PathBuf, base_model: PathBuf, last: ExportPrefs) -> Self {
        let out = default_export_dir(&checkpoint, last.format).display().to_string();
        Self { checkpoint, base_model, format: last.format, quant: last.quant, out, replace: false }
    }
}

/// What the dialog did this frame.
pub enum Outcome {
    Open(ExportDialog),
    /// Export: the command for the worker, and the choice to remember.
    Started(Box<Command>, ExportPrefs),
    Closed,
}

/// The export dialog as a modal.
pub fn export_modal_ui(ui: &mut Ui, mut dialog: ExportDialog) -> Outcome {
    let mut outcome = None;
    egui::Modal::new(egui::Id::unique("export")).show(ui.ctx(), |ui| {
        ui.set_width(480.0);
        ui.label(RichText::new("Export checkpoint").strong().size(16.0));
        ui.label(RichText::new(dialog.checkpoint.display().to_string()).weak().small());
        ui.add_space(6.0);
        let before = dialog.format;
        ui.radio_value(&mut dialog.format, ExportFormat::Peft, "PEFT adapter")
            .on_hover_text("adapter_config.json + adapter_model.safetensors, loadable with peft / transformers");
        ui.radio_value(&mut dialog.format, ExportFormat::MlxLm, "mlx-lm adapter")
            .on_hover_text("adapters.safetensors + adapter_config.json for mlx_lm.generate --adapter-path");
        ui.radio_value(&mut dialog.format, ExportFormat::Merged, "Merged model")
            .on_hover_text("A full Hugging Face model folder with the adapter merged into the weights");
        ui.radio_value(&mut dialog.format, ExportFormat::Gguf, "GGUF (llama.cpp)")
            .on_hover_text("One .gguf file with the adapter merged in, for llama.cpp, LM Studio and friends");
        ui.radio_value(&mut dialog.format, ExportFormat::GgufLora, "GGUF LoRA adapter")
            .on_hover_text("The adapter alone for llama.cpp's --lora, on top of a GGUF of the same base model");
        ui.radio_value(&mut dialog.format, ExportFormat::Ollama, "Ollama")
            .on_hover_text("A folder with the merged GGUF and a Modelfile: ollama create NAME -f Modelfile");
        if dialog.format.uses_quant() {
            quant_choice_ui(ui, &mut dialog.quant);
        }
        if dialog.format != before {
            dialog.out = default_export_dir(&dialog.checkpoint, dialog.format).display().to_string();
        }
        ui.horizontal(|ui| {
            let l = ui.label(if dialog.format.writes_file() { "Output file" } else { "Output folder" });
            ui.add(egui::TextEdit::singleline(&mut dialog.out).desired_width(320.0)).labelled_by(l.id);
        });
        let exists = std::fs::symlink_metadata(dialog.out.trim()).is_ok();
        if exists || dialog.replace {
            ui.checkbox(&mut dialog.replace, "Replace it: the output already exists")
                .on_hover_text("Without this, an export never writes over an existing file or folder");
        }
        if matches!(dialog.format, ExportFormat::Merged | ExportFormat::Gguf | ExportFormat::Ollama) {
            ui.label(RichText::new(format!("base model: {}", dialog.base_model.display())).weak().small());
        }
        ui.add_space(8.0);
        ui.horizontal(|ui| {
            if ui.button(RichText::new("Export").strong()).clicked() {
                let command = Command::ExportCheckpoint {
                    checkpoint: dialog.checkpoint.clone(),
                    format: dialog.format,
                    quant: dialog.quant,
                    out: PathBuf::from(dialog.out.trim()),
                    base_model: dialog.base_model.clone(),
                    overwrite: dialog.replace,
                };
                let chosen = ExportPrefs { format: dialog.format, quant: dialog.quant };
                outcome = Some(Outcome::Started(Box::new(command), chosen));
            }
            if ui.button("Cancel").clicked() {
                outcome = Some(Outcome::Closed);
            }
        });
    });
    outcome.unwrap_or(Outcome::Open(dialog))
}

/// The GGUF quantization picker of the export dialog.
fn quant_choice_ui(ui: &mut Ui, quant: &mut GgufQuant) {
    ui.horizontal(|ui| {
        let l = ui.label("Quantization");
        egui::ComboBox::from_id_salt("export-quant")
            .selected_text(quant.as_str())
            .show_ui(ui, |ui| {
                for q in GgufQuant::ALL {
                    ui.selectable_value(quant, q, q.as_str());
                }
            })
            .response
            .labelled_by(l.id)
            .on_hover_text(
                "q4_k_m (the default) is about a quarter of f16's size and what most people run; q5_k_m and q6_k \
                 are larger and closer to the original; q8_0 is near-lossless; f16/bf16 keep the merged weights",
            );
    });
}

pub fn default_export_dir(checkpoint: &Path, format: ExportFormat) -> PathBuf {
    let name = checkpoint.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "checkpoint".into());
    let suffix = match format {
        ExportFormat::Peft => "peft",
        ExportFormat::MlxLm => "mlx",
        ExportFormat::Merged => "merged",
        ExportFormat::Gguf => "merged.gguf",
        ExportFormat::GgufLora => "lora.gguf",
        ExportFormat::Ollama => "ollama",
    };
    let run_dir = checkpoint.parent().unwrap_or(Path::new("."));
    run_dir.join("exports").join(format!("{name}-{suffix}"))
}

/// What a click on the finished export's card asked for.
pub enum FinishedClick {
    None,
    Dismiss,
    RevealFailed(String),
}

/// The command that imports an Ollama export folder (its Modelfile names the GGUF beside it).
pub fn ollama_create_command(folder: &Path) -> String {
    let name = folder.file_name().map(|n| n.to_string_lossy().to_lowercase()).unwrap_or_else(|| "my-model".into());
    let name: String =
        name.chars().map(|c| if c.is_ascii_alphanumeric() || "-_.".contains(c) { c } else { '-' }).collect();
    format!("ollama create {name} -f \"{}\"", folder.join("Modelfile").display())
}

/// The finished export: its absolute path with Copy, "Open folder", and for an Ollama folder the command.
pub fn finished_export_ui(ui: &mut Ui, path: &Path, size_bytes: u64) -> FinishedClick {
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let mut click = FinishedClick::None;
    banner_ui(ui, Tone::Ok, format!("Exported to {} ({})", absolute.display(), fmt_bytes(size_bytes)));
    let ollama = absolute.join("Modelfile").is_file().then(|| ollama_create_command(&absolute));
    if let Some(command) = &ollama {
        ui.label("Import it into Ollama with:");
        ui.horizontal(|ui| {
            ui.label(RichText::new(command).monospace());
            if ui.small_button("Copy command").clicked() {
                ui.ctx().copy_text(command.clone());
            }
        });
    }
    ui.horizontal(|ui| {
        if let Some(message) = super::reveal::path_buttons_ui(ui, &absolute, "export") {
            click = FinishedClick::RevealFailed(message);
        }
        if ui.small_button("Dismiss").on_hover_text("Hide this message").clicked() {
            click = FinishedClick::Dismiss;
        }
    });
    click
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ollama_command_names_the_folder_and_its_modelfile() {
        let command = ollama_create_command(Path::new("/runs/r/exports/checkpoint-50-ollama"));
        assert_eq!(command, "ollama create checkpoint-50-ollama -f \"/runs/r/exports/checkpoint-50-ollama/Modelfile\"");
    }
}
