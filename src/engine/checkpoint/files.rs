//! Atomic file writes and safetensors I/O for checkpoints and run folders.

use crate::engine::model::safetensors_reader::SafetensorsReader;
use crate::engine::{Error, Result};
use candle_core::{Device, Tensor};
use std::collections::HashMap;
use std::path::Path;

pub fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

// ---------------------------------------------------------------------------------------------------------
// Atomic file writes

/// Write `bytes` to `path` via a temporary file in the same folder and a rename; the file is on disk before
/// the rename and the rename is on disk before this returns, so a power loss leaves the old or the new file.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        sync_parent(path)
    })();
    if let Err(e) = result {
        let _ = std::fs::remove_file(&tmp);
        return Err(Error::write(path, e));
    }
    Ok(())
}

pub(crate) fn write_json(path: &Path, value: &impl serde::Serialize) -> Result<()> {
    let text = serde_json::to_string_pretty(value).map_err(|e| Error::write(path, e))?;
    write_atomic(path, text.as_bytes())
}

pub(crate) fn write_safetensors(path: &Path, tensors: &HashMap<String, Tensor>) -> Result<()> {
    let cpu: HashMap<String, Tensor> =
        tensors.iter().map(|(k, t)| Ok((k.clone(), t.to_device(&Device::Cpu)?))).collect::<Result<_>>()?;
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    let result = candle_core::safetensors::save(&cpu, &tmp)
        .map_err(|e| Error::write(path, e))
        .and_then(|_| sync_file(&tmp).map_err(|e| Error::write(path, e)))
        .and_then(|_| std::fs::rename(&tmp, path).map_err(|e| Error::write(path, e)))
        .and_then(|_| make_world_readable(path));
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Flush a file's contents to disk.
fn sync_file(path: &Path) -> std::io::Result<()> {
    std::fs::OpenOptions::new().write(true).open(path)?.sync_all()
}

/// Flush a folder's entries (names created, renamed or removed in it) to disk. Folders cannot be opened for
/// this outside Unix; there the rename itself is all we have.
pub fn sync_dir(dir: &Path) -> std::io::Result<()> {
    #[cfg(unix)]
    std::fs::File::open(dir)?.sync_all()?;
    #[cfg(not(unix))]
    let _ = dir;
    Ok(())
}

fn sync_parent(path: &Path) -> std::io::Result<()> {
    match path.parent().filter(|p| !p.as_os_str().is_empty()) {
        Some(dir) => sync_dir(dir),
        None => sync_dir(Path::new(".")),
    }
}

/// safetensors writes through an owner-only temporary file; give saved weights the usual 0644 so other
/// tools (and other users of a shared machine) can read them.
pub fn make_world_readable(path: &Path) -> Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644)).map_err(|e| Error::write(path, e))?;
    }
    Ok(())
}

/// Read a safetensors file; `what` names it in the error when it is missing ("adapter weights", ...).
pub(crate) fn read_safetensors(path: &Path, what: &str) -> Result<HashMap<String, Tensor>> {
    if crate::engine::input_file::optional_file(path)?.is_none() {
        return Err(Error::MissingFile { path: path.to_path_buf(), what: what.into() });
    }
    // The model reader's checks (a regular file, no repeated names or shared bytes, floats without NaN).
    let reader = SafetensorsReader::open(&[path.to_path_buf()], None)?;
    let names: Vec<String> = reader.names().map(str::to_string).collect();
    let mut tensors = HashMap::with_capacity(names.len());
    for name in names {
        if let Some(tensor) = reader.load(&name)? {
            tensors.insert(name, tensor);
        }
    }
    Ok(tensors)
}

// ---------------------------------------------------------------------------------------------------------
// PEFT adapter format

/// Bytes of the files under `dir`, sub-folders included, links counted as themselves (0 when unreadable): a
/// checkpoint's, an export's or a whole run's size.
pub(crate) fn folder_size(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => folder_size(&e.path()),
            _ => e.metadata().map(|m| m.len()).unwrap_or(0),
        })
        .sum()
}
