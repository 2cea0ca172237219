//! Native file dialogs (rfd over the XDG desktop portal on Linux) run on their own thread: a dialog that
//! blocks, or a machine without a portal, never freezes the window. The answer comes back on a channel the
//! panel polls each frame.

use crossbeam_channel::{Receiver, TryRecvError};
use std::path::PathBuf;

/// What to ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PickKind {
    /// A `.gguf` file.
    ModelFile,
    /// A Hugging Face model folder.
    ModelFolder,
    /// A dataset file: `.jsonl`, `.json` or `.parquet`.
    DatasetFile,
    /// A dataset folder (train.jsonl, valid.jsonl, a Hub dataset's data/ shards, ...).
    DatasetFolder,
    /// Any folder (export destination, runs folder).
    Folder,
}

/// How a pick ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PickOutcome {
    Picked(PathBuf),
    Cancelled,
    /// No dialog could be shown (e.g. no desktop portal); the message says what to do instead.
    Unavailable(String),
}

/// One dialog in flight.
pub struct FilePicker {
    kind: PickKind,
    rx: Receiver<PickOutcome>,
}

impl FilePicker {
    /// Open a dialog on a helper thread, starting in `start_dir` when given.
    pub fn open(kind: PickKind, start_dir: Option<PathBuf>, waker: impl Fn() + Send + 'static) -> Self {
        let (tx, rx) = crossbeam_channel::bounded(1);
        let spawned = std::thread::Builder::new().name("mc-file-dialog".into()).spawn(move || {
            let outcome = std::panic::catch_unwind(|| pick_blocking(kind, start_dir))
                .unwrap_or_else(|_| PickOutcome::Unavailable("the file dialog crashed".into()));
            let _ = tx.send(outcome);
            waker();
        });
        if spawned.is_err() {
            let (tx, rx2) = crossbeam_channel::bounded(1);
            let _ = tx.send(PickOutcome::Unavailable("cannot start the file dialog thread".into()));
            return Self { kind, rx: rx2 };
        }
        Self { kind, rx }
    }

    pub fn kind(&self) -> PickKind {
        self.kind
    }

    /// The outcome once the dialog has closed.
    pub fn poll(&self) -> Option<PickOutcome> {
        match self.rx.try_recv() {
            Ok(o) => Some(o),
            Err(TryRecvError::Empty) => None,
            Err(TryRecvError::Disconnected) => {
                Some(PickOutcome::Unavailable("the file dialog closed unexpectedly".into()))
            }
        }
    }
}

fn pick_blocking(kind: PickKind, start_dir: Option<PathBuf>) -> PickOutcome {
    let mut dialog = rfd::FileDialog::new();
    if let Some(dir) = start_dir.filter(|d| d.is_dir()) {
        dialog = dialog.set_directory(dir);
    }
    let picked = match kind {
        PickKind::ModelFile => dialog.set_title("Open a GGUF model").add_filter("GGUF model", &["gguf"]).pick_file(),
        PickKind::ModelFolder => dialog.set_title("Open a Hugging Face model folder").pick_folder(),
        PickKind::DatasetFile => {
            dialog.set_title("Open a dataset file").add_filter("Datasets", &["jsonl", "json", "parquet"]).pick_file()
        }
        PickKind::DatasetFolder => {
            dialog.set_title("Open a dataset folder (train.jsonl, data/train-*.parquet, ...)").pick_folder()
        }
        PickKind::Folder => dialog.set_title("Choose a folder").pick_folder(),
    };
    match picked {
        Some(p) => PickOutcome::Picked(p),
        None if portal_available() => PickOutcome::Cancelled,
        None => PickOutcome::Unavailable(
            "no file dialog is available here (no XDG desktop portal); type or paste the path, or drag it onto the window"
                .into(),
        ),
    }
}

/// Whether a desktop portal can be reached: without a session bus there is none, and rfd then returns
/// nothing, which would otherwise look like a cancelled dialog.
fn portal_available() -> bool {
    if cfg!(target_os = "linux") {
        std::env::var_os("DBUS_SESSION_BUS_ADDRESS").is_some()
    } else {
        true
    }
}

/// A panel's native file dialog: at most one open at a time, and the note shown when none could open.
#[derive(Default)]
pub struct PanelPicker {
    pending: Option<FilePicker>,
    /// Why no dialog could open (e.g. no desktop portal), shown in the panel.
    pub note: Option<String>,
}

impl PanelPicker {
    pub fn is_open(&self) -> bool {
        self.pending.is_some()
    }

    /// Open a dialog starting next to the path currently typed in the panel; the UI repaints when it ends.
    pub fn open(&mut self, ui: &egui::Ui, kind: PickKind, current_input: &str) {
        let start = PathBuf::from(current_input.trim());
        let start = if start.is_dir() { Some(start) } else { start.parent().map(|p| p.to_path_buf()) };
        let egui_ctx = ui.ctx().clone();
        self.note = None;
        self.pending = Some(FilePicker::open(kind, start, move || egui_ctx.request_repaint()));
    }

    /// The picked path once the dialog has ended with one; records the note when no dialog could open.
    pub fn take_picked(&mut self) -> Option<PathBuf> {
        let outcome = self.pending.as_ref()?.poll()?;
        self.pending = None;
        match outcome {
            PickOutcome::Picked(path) => {
                self.note = None;
                Some(path)
            }
            PickOutcome::Cancelled => None,
            PickOutcome::Unavailable(message) => {
                self.note = Some(message);
                None
            }
        }
    }
}
