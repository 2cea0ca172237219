//! A dataset's fingerprint: the SHA-256 of its split files' contents, so a resumed run can tell (and record)
//! that it now trains on other data. Files are found the way training finds them ([`super::dataset_layout`])
//! and opened with the same file-type and size guard, so a fingerprint never reads what training would
//! refuse; they are hashed as they stream, never held whole.

use super::files::{open_bounded, MAX_DATASET_BYTES};
use crate::engine::{Error, Result};
use sha2::{Digest, Sha256};
use std::io::Read;
use std::path::Path;

/// `sha256:<hex>` over each split file's split name and bytes, in split order (a split's files in the order
/// read). A dataset of one file per split hashes as it always did.
pub fn dataset_fingerprint(path: &Path) -> Result<String> {
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    for split in super::dataset_layout(path)?.splits {
        for file in &split.files {
            h.update(split.split.as_str().as_bytes());
            h.update([0u8]);
            let mut reader = open_bounded(file, MAX_DATASET_BYTES)?.take(MAX_DATASET_BYTES);
            loop {
                let n = reader.read(&mut buf).map_err(|e| Error::io(file, e))?;
                if n == 0 {
                    break;
                }
                h.update(&buf[..n]);
            }
        }
    }
    Ok(format!("sha256:{}", crate::engine::model::fingerprint::hex(&h.finalize())))
}
