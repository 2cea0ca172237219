//! The claim on a run folder: one training process at a time. The claim is an OS lock (`flock` on Unix) on
//! `run_dir/.lock`, taken without waiting and held for the whole run, so the OS releases it when the process
//! ends, however it ends. The lock file's identity also tells the trainer whether the folder is still the
//! one it claimed (not moved, deleted or replaced), and only the holder cleans up what an interrupted save
//! left behind.

use super::run_folder::RUN_CONFIG;
use crate::engine::{Error, Result};
use std::fs::{File, TryLockError};
use std::io::Write;
use std::path::{Path, PathBuf};

/// The lock file inside every run folder (it stays there; only its lock comes and goes).
pub const RUN_LOCK: &str = ".lock";

/// A claimed run folder; dropping it (or the process ending) releases the claim.
#[derive(Debug)]
pub struct RunLock {
    dir: PathBuf,
    file: File,
}

impl RunLock {
    /// Claim `run_dir`, creating it if needed, or refuse naming the folder when another process holds it.
    pub fn claim(run_dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(run_dir).map_err(|e| Error::write(run_dir, e))?;
        let path = run_dir.join(RUN_LOCK);
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| Error::write(&path, e))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                return Err(Error::RunInUse { path: run_dir.to_path_buf(), holder: holder_of(&path) })
            }
            Err(TryLockError::Error(e)) => return Err(Error::write(&path, format!("cannot lock it: {e}"))),
        }
        // Who holds the folder, for the refusal another process prints.
        let pid = format!("{}\n", std::process::id());
        file.set_len(0).and_then(|_| file.write_all(pid.as_bytes())).map_err(|e| Error::write(&path, e))?;
        Ok(Self { dir: run_dir.to_path_buf(), file })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Fail unless the folder is still the one claimed: its `.lock` is the file we locked and its run.json
    /// is there. Called before every write into the folder, so a moved or deleted run is never recreated.
    pub fn check(&self) -> Result<()> {
        let lost = || Error::RunFolderLost { path: self.dir.clone() };
        let on_disk = std::fs::metadata(self.dir.join(RUN_LOCK)).map_err(|_| lost())?;
        let ours = self.file.metadata().map_err(|_| lost())?;
        if !same_file(&on_disk, &ours) || !self.dir.join(RUN_CONFIG).is_file() {
            return Err(lost());
        }
        Ok(())
    }

    /// Tidy what interrupted saves left: `.checkpoint-<step>.partial` folders and temporary files are
    /// removed; a `.checkpoint-<step>.old` whose replacement never landed is put back, otherwise removed.
    pub fn clean_leftovers(&self) -> Result<()> {
        let entries = std::fs::read_dir(&self.dir).map_err(|e| Error::io(&self.dir, e))?;
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = entry.path();
            let removed = if name.starts_with(".checkpoint-") && name.ends_with(".partial") {
                std::fs::remove_dir_all(&path)
            } else if let Some(step) = name.strip_prefix(".checkpoint-").and_then(|n| n.strip_suffix(".old")) {
                let kept = self.dir.join(format!("checkpoint-{step}"));
                if kept.exists() {
                    std::fs::remove_dir_all(&path)
                } else {
                    std::fs::rename(&path, &kept)
                }
            } else if is_temporary(&name) {
                std::fs::remove_file(&path)
            } else {
                Ok(())
            };
            removed.map_err(|e| Error::write(&path, e))?;
        }
        Ok(())
    }
}

/// Whether a process (this one included) holds `run_dir`'s claim now: a training is running there. Probed with a
/// shared lock taken and dropped at once; a folder without a `.lock` file is not claimed.
pub fn is_claimed(run_dir: &Path) -> bool {
    let Ok(file) = File::open(run_dir.join(RUN_LOCK)) else { return false };
    matches!(file.try_lock_shared(), Err(TryLockError::WouldBlock))
}

/// `name.tmp-<pid>`, as [`crate::engine::checkpoint::write_atomic`] names its temporary files.
fn is_temporary(name: &str) -> bool {
    name.rsplit_once(".tmp-").is_some_and(|(_, pid)| !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()))
}

/// " (pid N)" from a lock file, or nothing when it cannot be read.
fn holder_of(lock: &Path) -> String {
    std::fs::read_to_string(lock)
        .ok()
        .and_then(|text| text.trim().parse::<u32>().ok())
        .map(|pid| format!(" (pid {pid})"))
        .unwrap_or_default()
}

#[cfg(unix)]
fn same_file(a: &std::fs::Metadata, b: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::MetadataExt;
    (a.dev(), a.ino()) == (b.dev(), b.ino())
}

/// Without inode numbers, a lock file that still exists is taken as ours.
#[cfg(not(unix))]
fn same_file(_: &std::fs::Metadata, _: &std::fs::Metadata) -> bool {
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claimed_folder_is_refused_to_a_second_claim_until_released() {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().join("run");
        let first = RunLock::claim(&run).unwrap();
        let err = RunLock::claim(&run).unwrap_err();
        assert!(matches!(err, Error::RunInUse { .. }), "{err}");
        assert!(err.to_string().contains(&run.display().to_string()), "{err}");
        assert!(is_claimed(&run));
        drop(first);
        assert!(!is_claimed(&run));
        RunLock::claim(&run).unwrap();
        assert!(!is_claimed(&dir.path().join("never-run")));
    }

    #[test]
    fn temporary_names_are_recognised() {
        assert!(is_temporary("run.tmp-123"));
        assert!(!is_temporary("run.json"));
        assert!(!is_temporary("notes.tmp-x"));
    }
}
