//! A base model's fingerprint: a SHA-256 over what makes two models the same model, so an adapter or a
//! resumed run can tell that it is being applied to another base even when every shape matches. It covers
//! the resolved architecture (explicit fields, so it stays stable across releases), the weight files' layout
//! (safetensors headers: tensor names, dtypes, shapes, offsets; a GGUF's header and metadata) and a few KB
//! of tensor bytes from the start, middle and end of each file. It never covers the path, and it reads a
//! few hundred KB at most, so it is fast even for an 8B model.

use super::config::ModelConfig;
use super::loader::{LoadedModel, ModelSource};
use crate::engine::{Error, Result};
use sha2::{Digest, Sha256};
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

/// Bytes hashed at each sample point of a weight file.
const SAMPLE_BYTES: u64 = 4096;

/// Bytes hashed from the start of a GGUF file (its header, metadata and tensor table, or most of them).
const GGUF_HEAD_BYTES: u64 = 256 * 1024;

/// Largest safetensors header hashed whole (real headers are well under 1 MB).
const MAX_HEADER_BYTES: u64 = 64 * 1024 * 1024;

/// The fingerprint of a loaded model: `sha256:<hex>`.
pub fn model_fingerprint(model: &LoadedModel) -> Result<String> {
    fingerprint_of(&model.source, &model.config)
}

/// The fingerprint of the model at `source` whose resolved config is `config`.
pub fn fingerprint_of(source: &ModelSource, config: &ModelConfig) -> Result<String> {
    let mut h = Sha256::new();
    h.update(b"metal-candle base fingerprint v1\n");
    h.update(config_line(config).as_bytes());
    match source {
        ModelSource::HfFolder(folder) => {
            for file in super::safetensors_weights::weight_files(folder)? {
                hash_safetensors(&mut h, &file)?;
            }
        }
        ModelSource::Gguf(file) => hash_gguf(&mut h, file)?,
    }
    Ok(format!("sha256:{}", hex(&h.finalize())))
}

/// The resolved architecture as one line of explicit fields.
fn config_line(c: &ModelConfig) -> String {
    format!(
        "{} vocab={} hidden={} intermediate={} layers={} heads={} kv_heads={} head_dim={} eps={} theta={} \
         context={} tied={} qkv_bias={} qk_norm={}\n",
        c.architecture.as_str(),
        c.vocab_size,
        c.hidden_size,
        c.intermediate_size,
        c.num_layers,
        c.num_attention_heads,
        c.num_kv_heads,
        c.head_dim,
        c.rms_norm_eps,
        c.rope_theta,
        c.max_position_embeddings,
        c.tie_word_embeddings,
        c.qkv_bias,
        c.qk_norm
    )
}

/// A safetensors file: its size, its whole header, and samples of its tensor bytes.
fn hash_safetensors(h: &mut Sha256, path: &Path) -> Result<()> {
    let mut f = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let len = f.metadata().map_err(|e| Error::io(path, e))?.len();
    let mut n = [0u8; 8];
    f.read_exact(&mut n).map_err(|e| Error::io(path, e))?;
    let header_len = u64::from_le_bytes(n).min(MAX_HEADER_BYTES).min(len.saturating_sub(8));
    h.update(len.to_le_bytes());
    hash_range(h, &mut f, path, 8, header_len)?;
    sample(h, &mut f, path, 8 + header_len, len)
}

/// A GGUF file: its size, its head (header, metadata, tensor table), and samples of the rest.
fn hash_gguf(h: &mut Sha256, path: &Path) -> Result<()> {
    let mut f = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let len = f.metadata().map_err(|e| Error::io(path, e))?.len();
    h.update(len.to_le_bytes());
    let head = GGUF_HEAD_BYTES.min(len);
    hash_range(h, &mut f, path, 0, head)?;
    sample(h, &mut f, path, head, len)
}

/// Hash `SAMPLE_BYTES` at the start, middle and end of `[start, end)`.
fn sample(h: &mut Sha256, f: &mut std::fs::File, path: &Path, start: u64, end: u64) -> Result<()> {
    let span = end.saturating_sub(start);
    let n = SAMPLE_BYTES.min(span);
    for at in [start, start + span / 2 - (span / 2).min(n / 2), end - n] {
        hash_range(h, f, path, at, n)?;
    }
    Ok(())
}

fn hash_range(h: &mut Sha256, f: &mut std::fs::File, path: &Path, at: u64, n: u64) -> Result<()> {
    f.seek(SeekFrom::Start(at)).map_err(|e| Error::io(path, e))?;
    let mut buf = Vec::with_capacity(n as usize);
    f.take(n).read_to_end(&mut buf).map_err(|e| Error::io(path, e))?;
    h.update(&buf);
    Ok(())
}

/// Lower-case hex of a digest.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
