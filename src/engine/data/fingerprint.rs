//! A dataset's fingerprint: the SHA-256 of its split files' contents, so a resumed run can tell (and record)
//! that it now trains on other data. Files are found and read the way training reads them
//! ([`super::dataset_files`], with the same size and file-type guard), so a fingerprint never reads what
//! training would refuse.

use super::formats::{read_bounded, MAX_DATASET_BYTES};
use crate::engine::Result;
use sha2::{Digest, Sha256};
use std::path::Path;

/// `sha256:<hex>` over each split's name and its file's bytes, in split order.
pub fn dataset_fingerprint(path: &Path) -> Result<String> {
    let mut h = Sha256::new();
    for (split, file) in super::dataset_files(path)? {
        h.update(split.as_str().as_bytes());
        h.update([0u8]);
        h.update(read_bounded(&file, MAX_DATASET_BYTES)?);
    }
    Ok(format!("sha256:{}", crate::engine::model::fingerprint::hex(&h.finalize())))
}
