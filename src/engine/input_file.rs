//! Opening the files users and strangers hand us (model configs, weights, tokenizers, templates, datasets,
//! settings files) safely: only regular files are opened, so a FIFO cannot block `open()` forever and a link
//! to `/dev/zero` cannot be read until memory runs out; sizes are bounded before reading; and what is odd
//! about a path (a folder where a file belongs, a link that loops or points nowhere, a device) is said in
//! words instead of "file not found".

use crate::engine::{Error, Result};
use std::fs::{File, Metadata};
use std::io::Read;
use std::path::Path;

/// Small JSON or text files (config.json, generation_config.json, a settings file, a chat template): 64 MiB.
pub const MAX_SMALL_FILE_BYTES: u64 = 64 << 20;
/// tokenizer.json and tokenizer_config.json (large vocabularies run to tens of MB): 512 MiB.
pub const MAX_TOKENIZER_BYTES: u64 = 512 << 20;

/// What an odd path is, in words; `None` for a regular file (following links).
fn oddity(path: &Path, meta: &Metadata) -> Option<String> {
    if meta.is_file() {
        return None;
    }
    if meta.is_dir() {
        return Some("is a folder, not a file".into());
    }
    let target = std::fs::read_link(path).ok().map(|t| format!(" (a link to {})", t.display())).unwrap_or_default();
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        let kind = meta.file_type();
        let what = if kind.is_fifo() {
            "a named pipe (FIFO)"
        } else if kind.is_char_device() {
            "a character device"
        } else if kind.is_block_device() {
            "a block device"
        } else if kind.is_socket() {
            "a socket"
        } else {
            "not a regular file"
        };
        return Some(format!("is {what}{target}, not a regular file; only regular files are read"));
    }
    #[allow(unreachable_code)]
    Some(format!("is not a regular file{target}; only regular files are read"))
}

/// The error for a path whose metadata cannot be read: a loop, a dangling link, or truly missing.
pub fn describe_io(path: &Path, e: std::io::Error) -> Error {
    if is_link_loop(&e) {
        return Error::Unreadable {
            path: path.to_path_buf(),
            message: "a symbolic link that loops (too many levels of links); point it at the real file".into(),
        };
    }
    if e.kind() == std::io::ErrorKind::NotFound {
        if let Ok(target) = std::fs::read_link(path) {
            return Error::MissingFile {
                path: path.to_path_buf(),
                what: format!("a symbolic link to {}, which does not exist", target.display()),
            };
        }
    }
    Error::io(path, e)
}

fn is_link_loop(e: &std::io::Error) -> bool {
    #[cfg(unix)]
    {
        e.raw_os_error() == Some(libc::ELOOP)
    }
    #[cfg(not(unix))]
    {
        let _ = e;
        false
    }
}

/// The metadata of `path`, which must be a regular file (links followed); folders, devices, FIFOs, sockets,
/// looping or dangling links are refused with what they are.
pub fn regular_file_metadata(path: &Path) -> Result<Metadata> {
    let meta = std::fs::metadata(path).map_err(|e| describe_io(path, e))?;
    match oddity(path, &meta) {
        None => Ok(meta),
        Some(message) => Err(Error::Unreadable { path: path.to_path_buf(), message }),
    }
}

/// `Some(path)` when an optional file is there and is a regular file, `None` when nothing is at that path
/// (not even a link); anything odd there (a folder, a FIFO, a loop, a dangling link) is an error rather than
/// silently "absent".
pub fn optional_file(path: &Path) -> Result<Option<&Path>> {
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(describe_io(path, e)),
        Ok(_) => regular_file_metadata(path).map(|_| Some(path)),
    }
}

/// Open a regular file of at most `limit` bytes. Checked before `open()` (which blocks forever on a FIFO)
/// and again on the opened handle (the path could have been swapped in between).
pub fn open_regular(path: &Path, limit: u64) -> Result<File> {
    let meta = regular_file_metadata(path)?;
    check_size(path, meta.len(), limit)?;
    let file = open_nonblocking(path).map_err(|e| describe_io(path, e))?;
    let meta = file.metadata().map_err(|e| Error::io(path, e))?;
    if let Some(message) = oddity(path, &meta) {
        return Err(Error::Unreadable { path: path.to_path_buf(), message });
    }
    check_size(path, meta.len(), limit)?;
    Ok(file)
}

/// Open without blocking on a FIFO that appeared between the check and the open; regular files ignore the flag.
fn open_nonblocking(path: &Path) -> std::io::Result<File> {
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(libc::O_NONBLOCK);
    }
    options.open(path)
}

fn check_size(path: &Path, len: u64, limit: u64) -> Result<()> {
    if len > limit {
        return Err(Error::Unreadable {
            path: path.to_path_buf(),
            message: format!("{} is larger than the {} this file may be", bytes_text(len), bytes_text(limit)),
        });
    }
    Ok(())
}

fn bytes_text(n: u64) -> String {
    match n {
        n if n >= 1 << 30 => format!("{:.1} GiB", n as f64 / (1u64 << 30) as f64),
        n if n >= 1 << 20 => format!("{:.1} MiB", n as f64 / (1u64 << 20) as f64),
        n => format!("{n} bytes"),
    }
}

/// Read a whole regular file of at most `limit` bytes (the limit holds while reading too).
pub fn read_regular(path: &Path, limit: u64) -> Result<Vec<u8>> {
    read_opened(open_regular(path, limit)?, path, limit)
}

/// Read all of `file` (opened from `path`), refusing more than `limit` bytes: a file that grew since it was
/// checked cannot make the read unbounded.
pub fn read_opened(file: File, path: &Path, limit: u64) -> Result<Vec<u8>> {
    let expected = file.metadata().map(|m| m.len() as usize).unwrap_or(0);
    let mut bytes = Vec::with_capacity(expected);
    file.take(limit.saturating_add(1)).read_to_end(&mut bytes).map_err(|e| Error::io(path, e))?;
    check_size(path, bytes.len() as u64, limit)?;
    Ok(bytes)
}

/// [`read_regular`] as UTF-8 text.
pub fn read_regular_text(path: &Path, limit: u64) -> Result<String> {
    let bytes = read_regular(path, limit)?;
    String::from_utf8(bytes).map_err(|e| Error::Unreadable {
        path: path.to_path_buf(),
        message: format!("not UTF-8 text (invalid byte at offset {})", e.utf8_error().valid_up_to()),
    })
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    fn message(r: Result<impl std::fmt::Debug>) -> String {
        r.unwrap_err().to_string()
    }

    #[test]
    fn odd_paths_are_named_for_what_they_are() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("config.json");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        assert!(message(read_regular(&fifo, 10)).contains("named pipe"));

        let zero = dir.path().join("zero.json");
        std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
        let m = message(read_regular(&zero, 10));
        assert!(m.contains("character device") && m.contains("/dev/zero"), "{m}");

        let a = dir.path().join("a");
        std::os::unix::fs::symlink(dir.path().join("b"), &a).unwrap();
        std::os::unix::fs::symlink(&a, dir.path().join("b")).unwrap();
        assert!(message(read_regular(&a, 10)).contains("loops"));

        let dangling = dir.path().join("gone.json");
        std::os::unix::fs::symlink(dir.path().join("nowhere"), &dangling).unwrap();
        assert!(message(read_regular(&dangling, 10)).contains("which does not exist"));
        assert!(message(optional_file(&dangling)).contains("which does not exist"));
        assert!(optional_file(&dir.path().join("absent")).unwrap().is_none());

        assert!(message(read_regular(dir.path(), 10)).contains("is a folder"));
        let big = dir.path().join("big");
        std::fs::write(&big, [0u8; 11]).unwrap();
        assert!(message(read_regular(&big, 10)).contains("larger than"));
        std::fs::write(&big, b"ok").unwrap();
        assert_eq!(read_regular_text(&big, 10).unwrap(), "ok");
    }
}
