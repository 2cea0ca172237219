//! "Open folder": show a file or folder in the OS file manager (`open -R` on macOS, `explorer /select,` on
//! Windows, `xdg-open` on the containing folder elsewhere). The opener is spawned and reaped on its own thread,
//! so the UI never waits on it; a launcher that cannot start is an error message, not a crash. Also the
//! "Copy path" and "Open folder" buttons every written file or folder gets ([`path_buttons_ui`]).

use std::path::{Path, PathBuf};
use std::process::Command;

/// The folder `xdg-open` should show for `path`: the folder itself, or a file's parent.
pub fn folder_of(path: &Path) -> PathBuf {
    if path.is_dir() {
        return path.to_path_buf();
    }
    path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new(".")).to_path_buf()
}

/// The command that reveals `path` on this OS.
fn reveal_command(path: &Path) -> Command {
    if cfg!(target_os = "macos") {
        let mut c = Command::new("open");
        c.arg("-R").arg(path);
        c
    } else if cfg!(target_os = "windows") {
        let mut c = Command::new("explorer");
        c.arg(format!("/select,{}", path.display()));
        c
    } else {
        let mut c = Command::new("xdg-open");
        c.arg(folder_of(path));
        c
    }
}

/// Reveal `path` without blocking; `Err` names the launcher that could not start and why.
pub fn reveal(path: &Path) -> Result<(), String> {
    let mut command = reveal_command(path);
    let program = command.get_program().to_string_lossy().into_owned();
    let mut child = command
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .map_err(|e| format!("could not run `{program}` to open {}: {e}", path.display()))?;
    std::thread::Builder::new()
        .name("mc-reveal".into())
        .spawn(move || {
            let _ = child.wait();
        })
        .map(|_| ())
        .map_err(|e| format!("could not wait for `{program}`: {e}"))
}

/// "Copy path" (the absolute path) and "Open folder" for something just written, `what` naming it in the
/// tooltips. Returns the message to show when no file manager could be started (it names the path).
pub fn path_buttons_ui(ui: &mut egui::Ui, path: &Path, what: &str) -> Option<String> {
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    if ui.button("Copy path").on_hover_text(format!("Copy the {what}'s full path")).clicked() {
        ui.ctx().copy_text(absolute.display().to_string());
    }
    let open = ui.button("Open folder").on_hover_text(format!("Show the {what} in its folder in the file manager"));
    if open.clicked() {
        if let Err(message) = reveal(&absolute) {
            return Some(format!(
                "No file manager could be started ({message}); the {what} is at {} (Copy path copies it)",
                absolute.display()
            ));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_is_shown_in_its_folder() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("model.gguf");
        std::fs::write(&file, b"x").unwrap();
        assert_eq!(folder_of(&file), dir.path());
        assert_eq!(folder_of(dir.path()), dir.path());
        assert_eq!(folder_of(Path::new("model.gguf")), Path::new("."));
    }
}
