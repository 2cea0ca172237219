//! A dataset's fingerprint: the SHA-256 of its `.jsonl` files' names and contents, so a resumed run can tell
//! (and record) that it now trains on other data.

use crate::engine::{Error, Result};
use sha2::{Digest, Sha256};
use std::path::Path;

/// `sha256:<hex>` of a `.jsonl` file, or of the `.jsonl` files of a folder (in name order).
pub fn dataset_fingerprint(path: &Path) -> Result<String> {
    let mut files: Vec<_> = if path.is_dir() {
        let entries = std::fs::read_dir(path).map_err(|e| Error::io(path, e))?;
        entries.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == "jsonl")).collect()
    } else {
        vec![path.to_path_buf()]
    };
    files.sort();
    let mut h = Sha256::new();
    for file in files {
        h.update(file.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default().as_bytes());
        h.update([0u8]);
        let mut f = std::fs::File::open(&file).map_err(|e| Error::io(&file, e))?;
        std::io::copy(&mut f, &mut h).map_err(|e| Error::io(&file, e))?;
    }
    Ok(format!("sha256:{}", crate::engine::model::fingerprint::hex(&h.finalize())))
}
