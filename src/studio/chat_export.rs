//! Exporting the chat's conversation to a file: a dialog with the format (JSON or Markdown,
//! [`super::chat_transcript`]), the file (a dated default name in the run folder of the adapter's checkpoint,
//! else the home folder) and a folder picker; an existing file is never overwritten silently (it is replaced
//! only when ticked, or a fresh name is one click away). The file is written on its own thread, and the card
//! after it says where it went, with Copy path and Open folder.

use super::chat_transcript::{ChatSetup, Exchange, TranscriptFormat};
use super::file_picker::{PanelPicker, PickKind};
use super::widgets::{banner_ui, Tone};
use crossbeam_channel::Receiver;
use egui::{RichText, Ui};
use std::path::{Path, PathBuf};

/// The dialog being filled in.
#[derive(Debug, Clone)]
struct Dialog {
    format: TranscriptFormat,
    path: String,
    /// Replace an existing file.
    replace: bool,
}

/// The chat page's export: the dialog, the write in flight, and what came of the last one.
#[derive(Default)]
pub struct ChatExport {
    dialog: Option<Dialog>,
    picker: PanelPicker,
    writing: Option<Receiver<Result<PathBuf, String>>>,
    /// The file last written.
    pub written: Option<PathBuf>,
    /// Why the last export failed, or why its folder could not be shown.
    pub error: Option<String>,
}

impl ChatExport {
    pub fn is_open(&self) -> bool {
        self.dialog.is_some()
    }

    pub fn is_writing(&self) -> bool {
        self.writing.is_some()
    }

    /// Open the dialog with a fresh default file in `folder`.
    pub fn open(&mut self, folder: &Path) {
        let format = self.dialog.as_ref().map(|d| d.format).unwrap_or_default();
        let path = fresh_path(&folder.join(default_file_name(format)));
        self.dialog = Some(Dialog { format, path: path.display().to_string(), replace: false });
        self.error = None;
    }

    /// The dialog as a modal, when open; Save renders the conversation and writes it on a helper thread.
    pub fn dialog_ui(&mut self, ui: &mut Ui, exchanges: &[Exchange], setup: &ChatSetup) {
        if let Some(folder) = self.picker.take_picked() {
            if let Some(d) = self.dialog.as_mut() {
                let name = Path::new(d.path.trim()).file_name().map(PathBuf::from);
                let name = name.unwrap_or_else(|| default_file_name(d.format).into());
                d.path = folder.join(name).display().to_string();
            }
        }
        let Some(mut dialog) = self.dialog.take() else { return };
        let mut close = false;
        let mut save = false;
        egui::Modal::new(egui::Id::unique("chat-export")).show(ui.ctx(), |ui| {
            ui.set_width(520.0);
            ui.label(RichText::new("Export conversation").strong().size(16.0));
            ui.add_space(4.0);
            let before = dialog.format;
            ui.radio_value(&mut dialog.format, TranscriptFormat::Json, "JSON").on_hover_text(
                "The messages array with roles (the chat dataset format), plus the model, adapter and sampling \
                 settings used",
            );
            ui.radio_value(&mut dialog.format, TranscriptFormat::Markdown, "Markdown")
                .on_hover_text("Readable: the settings, then a heading per turn");
            if dialog.format != before {
                dialog.path = with_extension(&dialog.path, dialog.format);
            }
            ui.horizontal(|ui| {
                let l = ui.label("File");
                ui.add(egui::TextEdit::singleline(&mut dialog.path).desired_width(340.0)).labelled_by(l.id);
                if ui
                    .add_enabled(!self.picker.is_open(), egui::Button::new("Choose folder…"))
                    .on_hover_text("Pick the folder to write the file into")
                    .clicked()
                {
                    self.picker.open(ui, PickKind::Folder, &dialog.path);
                }
            });
            if let Some(note) = &self.picker.note {
                banner_ui(ui, Tone::Warn, note.clone());
            }
            let path = PathBuf::from(dialog.path.trim());
            let exists = std::fs::symlink_metadata(&path).is_ok();
            if exists {
                ui.horizontal(|ui| {
                    ui.checkbox(&mut dialog.replace, "Replace it: the file already exists")
                        .on_hover_text("Without this, an export never writes over an existing file");
                    let fresh = fresh_path(&path);
                    let name = fresh.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                    if ui.button(format!("Use {name}")).on_hover_text("Keep the existing file").clicked() {
                        dialog.path = fresh.display().to_string();
                        dialog.replace = false;
                    }
                });
            }
            let problem = match path.parent() {
                _ if dialog.path.trim().is_empty() => Some("Name the file to write.".to_string()),
                Some(p) if !p.as_os_str().is_empty() && !p.is_dir() => {
                    Some(format!("The folder {} does not exist.", p.display()))
                }
                _ if path.is_dir() => Some(format!("{} is a folder; name a file in it.", path.display())),
                _ => None,
            };
            if let Some(p) = &problem {
                ui.label(RichText::new(p).color(super::widgets::palette::ERROR));
            }
            ui.add_space(8.0);
            ui.horizontal(|ui| {
                let can_save = problem.is_none() && (!exists || dialog.replace);
                if ui.add_enabled(can_save, egui::Button::new(RichText::new("Save").strong())).clicked() {
                    save = true;
                }
                if ui.button("Cancel").clicked() {
                    close = true;
                }
            });
        });
        if save {
            let text = dialog.format.render(exchanges, setup);
            self.start_write(ui.ctx().clone(), PathBuf::from(dialog.path.trim()), text, dialog.replace);
        } else if !close {
            self.dialog = Some(dialog);
        }
    }

    fn start_write(&mut self, ctx: egui::Context, path: PathBuf, text: String, replace: bool) {
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.written = None;
        self.error = None;
        let spawned = std::thread::Builder::new().name("mc-chat-export".into()).spawn(move || {
            let _ = tx.send(write_file(&path, text.as_bytes(), replace).map(|()| path));
            ctx.request_repaint();
        });
        match spawned {
            Ok(_) => self.writing = Some(rx),
            Err(e) => self.error = Some(format!("cannot start the export thread: {e}")),
        }
    }

    /// Where the last export went (with Copy path and Open folder), or why it failed.
    pub fn status_ui(&mut self, ui: &mut Ui) {
        if let Some(rx) = &self.writing {
            match rx.try_recv() {
                Ok(Ok(path)) => (self.written, self.writing) = (Some(path), None),
                Ok(Err(message)) => (self.error, self.writing) = (Some(message), None),
                Err(crossbeam_channel::TryRecvError::Empty) => {
                    ui.horizontal(|ui| {
                        ui.spinner();
                        ui.label("Writing the conversation…");
                    });
                }
                Err(crossbeam_channel::TryRecvError::Disconnected) => {
                    (self.error, self.writing) = (Some("the export thread stopped unexpectedly".into()), None)
                }
            }
        }
        if let Some(e) = &self.error {
            banner_ui(ui, Tone::Error, format!("Could not export the conversation: {e}"));
        }
        let Some(path) = self.written.clone() else { return };
        let absolute = std::path::absolute(&path).unwrap_or(path);
        ui.horizontal_wrapped(|ui| {
            ui.label(
                RichText::new(format!("Conversation saved to {}", absolute.display()))
                    .color(super::widgets::palette::OK),
            );
            if let Some(message) = super::reveal::path_buttons_ui(ui, &absolute, "conversation") {
                self.error = Some(message);
            }
            if ui.small_button("Dismiss").on_hover_text("Hide this message").clicked() {
                self.written = None;
            }
        });
    }
}

/// Where a conversation goes by default: the run folder of `adapter` when it is a checkpoint of a run, else the
/// home folder (else the working folder).
pub fn default_folder(adapter: Option<&Path>, home: Option<PathBuf>) -> PathBuf {
    if let Some(run) =
        adapter.and_then(Path::parent).filter(|r| r.join(crate::engine::train::run_folder::RUN_CONFIG).is_file())
    {
        return run.to_path_buf();
    }
    home.filter(|h| h.is_dir()).unwrap_or_else(|| PathBuf::from("."))
}

/// The home folder, as the OS names it.
pub fn home_folder() -> Option<PathBuf> {
    std::env::var_os("HOME").or_else(|| std::env::var_os("USERPROFILE")).map(PathBuf::from)
}

/// `chat-YYYYMMDD-HHMMSS.json` (UTC).
fn default_file_name(format: TranscriptFormat) -> String {
    let t = crate::engine::model::chat_template::strftime::DateTime::now_utc();
    format!(
        "chat-{:04}{:02}{:02}-{:02}{:02}{:02}.{}",
        t.year,
        t.month,
        t.day,
        t.hour,
        t.minute,
        t.second,
        format.extension()
    )
}

/// `path` with the format's extension in place of `.json` or `.md` (another extension is kept, and added to).
fn with_extension(path: &str, format: TranscriptFormat) -> String {
    let trimmed = path.trim();
    let stem = trimmed.strip_suffix(".json").or_else(|| trimmed.strip_suffix(".md")).unwrap_or(trimmed);
    format!("{stem}.{}", format.extension())
}

/// `path` when nothing is there, else the first free `NAME-2.EXT`, `NAME-3.EXT`, ...
pub fn fresh_path(path: &Path) -> PathBuf {
    if std::fs::symlink_metadata(path).is_err() {
        return path.to_path_buf();
    }
    let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "chat".into());
    let ext = path.extension().map(|e| format!(".{}", e.to_string_lossy())).unwrap_or_default();
    (2..)
        .map(|n| path.with_file_name(format!("{stem}-{n}{ext}")))
        .find(|p| std::fs::symlink_metadata(p).is_err())
        .unwrap_or_else(|| path.to_path_buf())
}

/// Write `bytes` to `path`: a new file only, unless `replace`. Errors name the file.
pub fn write_file(path: &Path, bytes: &[u8], replace: bool) -> Result<(), String> {
    use std::io::Write;
    let mut options = std::fs::OpenOptions::new();
    options.write(true);
    if replace {
        options.create(true).truncate(true);
    } else {
        options.create_new(true);
    }
    let mut file = options.open(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::AlreadyExists => format!("{} already exists; pick another name", path.display()),
        _ => format!("cannot write {}: {e}", path.display()),
    })?;
    file.write_all(bytes).and_then(|()| file.sync_all()).map_err(|e| format!("cannot write {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fresh_names_never_take_an_existing_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("chat.json");
        assert_eq!(fresh_path(&file), file);
        std::fs::write(&file, "{}").unwrap();
        std::fs::write(dir.path().join("chat-2.json"), "{}").unwrap();
        assert_eq!(fresh_path(&file), dir.path().join("chat-3.json"));
        let err = write_file(&file, b"new", false).unwrap_err();
        assert!(err.contains("already exists"), "{err}");
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "{}", "not overwritten");
        write_file(&file, b"new", true).unwrap();
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "new");
    }

    #[test]
    fn the_default_folder_is_the_checkpoints_run_else_home() {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().join("run-1");
        std::fs::create_dir_all(run.join("checkpoint-4")).unwrap();
        let home = Some(dir.path().to_path_buf());
        assert_eq!(default_folder(Some(&run.join("checkpoint-4")), home.clone()), dir.path());
        std::fs::write(run.join("run.json"), "{}").unwrap();
        assert_eq!(default_folder(Some(&run.join("checkpoint-4")), home.clone()), run);
        assert_eq!(default_folder(None, home), dir.path());
        assert_eq!(with_extension("/a/chat-1.json", TranscriptFormat::Markdown), "/a/chat-1.md");
        assert_eq!(with_extension("/a/notes.txt", TranscriptFormat::Json), "/a/notes.txt.json");
    }
}
