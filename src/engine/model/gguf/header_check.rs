//! Opening a GGUF file safely. Candle's reader trusts the header: it allocates whatever lengths the file
//! declares (a string of 2^40 bytes aborts the process), divides by `general.alignment` (0 panics), and keeps
//! the last of a repeated metadata key or tensor name (a layer silently disappears). So before Candle reads a
//! byte, [`scan_header`] walks the header itself, bounding every declared length by the bytes the file has
//! left and refusing repeats, a zero or odd alignment, and impossible tensor shapes; after Candle's read,
//! every tensor must lie inside the file and no two may share bytes.

use super::corrupt;
use crate::engine::error::without_backtrace;
use crate::engine::{Error, Result};
use candle_core::quantized::gguf_file::{Content, TensorInfo};
use std::collections::HashSet;
use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::panic::AssertUnwindSafe;
use std::path::Path;

/// A GGUF tensor has at most this many dimensions (ggml's `GGML_MAX_DIMS`).
const MAX_DIMS: u32 = 4;
/// Arrays of arrays are allowed this deep (real files have none).
const MAX_ARRAY_DEPTH: usize = 2;

/// Open `path`, check its header, and read it with Candle; the reader is left for reading tensor data.
pub(crate) fn open_gguf(path: &Path) -> Result<(Content, BufReader<File>)> {
    let file = crate::engine::input_file::open_regular(path, u64::MAX)?;
    let file_size = file.metadata().map_err(|e| Error::io(path, e))?.len();
    let mut reader = BufReader::new(file);
    scan_header(&mut reader, file_size).map_err(|message| corrupt(path, message))?;
    reader.seek(SeekFrom::Start(0)).map_err(|e| Error::io(path, e))?;
    let content = guarded(path, "cannot read the GGUF header", || Content::read(&mut reader))?;
    check_tensor_extents(path, &content, file_size)?;
    Ok((content, reader))
}

/// Run a candle GGUF read, turning both its errors and any panic on malformed data into `CorruptWeights`.
pub(super) fn guarded<T>(path: &Path, what: &str, read: impl FnOnce() -> candle_core::Result<T>) -> Result<T> {
    match std::panic::catch_unwind(AssertUnwindSafe(read)) {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) => Err(corrupt(path, format!("{what}: {}", without_backtrace(e)))),
        Err(_) => Err(corrupt(path, format!("{what}: the GGUF reader failed on malformed data"))),
    }
}

/// A byte cursor over the header that never reads past the file's size.
struct Cursor<'a, R> {
    reader: &'a mut R,
    at: u64,
    size: u64,
    version: u32,
}

impl<R: Read> Cursor<'_, R> {
    fn left(&self) -> u64 {
        self.size.saturating_sub(self.at)
    }

    fn bytes<const N: usize>(&mut self, what: &str) -> std::result::Result<[u8; N], String> {
        let mut buf = [0u8; N];
        if (N as u64) > self.left() {
            return Err(format!("the header ends inside {what} at byte {} (truncated file?)", self.at));
        }
        self.reader.read_exact(&mut buf).map_err(|e| format!("cannot read {what} at byte {}: {e}", self.at))?;
        self.at += N as u64;
        Ok(buf)
    }

    fn u32(&mut self, what: &str) -> std::result::Result<u32, String> {
        self.bytes::<4>(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &str) -> std::result::Result<u64, String> {
        self.bytes::<8>(what).map(u64::from_le_bytes)
    }

    /// A length or count: u32 in version 1 files, u64 after.
    fn count(&mut self, what: &str) -> std::result::Result<u64, String> {
        if self.version == 1 {
            self.u32(what).map(u64::from)
        } else {
            self.u64(what)
        }
    }

    /// A declared count of items of at least `item_bytes` each, bounded by what is left of the file.
    fn bounded_count(&mut self, what: &str, item_bytes: u64) -> std::result::Result<u64, String> {
        let n = self.count(what)?;
        if n.saturating_mul(item_bytes.max(1)) > self.left() {
            return Err(format!(
                "{what} declares {n} items but only {} bytes of the file are left; the header is damaged",
                self.left()
            ));
        }
        Ok(n)
    }

    fn string(&mut self, what: &str) -> std::result::Result<Vec<u8>, String> {
        let len = self.bounded_count(&format!("the length of {what}"), 1)?;
        let mut buf = vec![0u8; len as usize];
        self.reader.read_exact(&mut buf).map_err(|e| format!("cannot read {what} at byte {}: {e}", self.at))?;
        self.at += len;
        Ok(buf)
    }

    fn skip(&mut self, n: u64, what: &str) -> std::result::Result<(), String> {
        if n > self.left() {
            return Err(format!("the header ends inside {what} at byte {} (truncated file?)", self.at));
        }
        std::io::copy(&mut (&mut *self.reader).take(n), &mut std::io::sink())
            .map_err(|e| format!("cannot read {what}: {e}"))?;
        self.at += n;
        Ok(())
    }

    /// Skip one value of GGUF type `kind`, returning it when it is a u32 (for `general.alignment`).
    fn value(&mut self, kind: u32, key: &str, depth: usize) -> std::result::Result<Option<u64>, String> {
        let fixed = |kind: u32| match kind {
            0 | 1 | 7 => Some(1u64),
            2 | 3 => Some(2),
            4..=6 => Some(4),
            10..=12 => Some(8),
            _ => None,
        };
        match kind {
            4 => Ok(Some(u64::from(self.u32(key)?))),
            8 => self.string(&format!("the value of `{key}`")).map(|_| None),
            9 => {
                let element = self.u32(&format!("the element type of `{key}`"))?;
                if element == 9 && depth >= MAX_ARRAY_DEPTH {
                    return Err(format!("`{key}` nests arrays deeper than {MAX_ARRAY_DEPTH}"));
                }
                let item_bytes = fixed(element).unwrap_or(8);
                let n = self.bounded_count(&format!("the array `{key}`"), item_bytes)?;
                match fixed(element) {
                    Some(size) => self.skip(n * size, &format!("the array `{key}`"))?,
                    None => {
                        for _ in 0..n {
                            self.value(element, key, depth + 1)?;
                        }
                    }
                }
                Ok(None)
            }
            other => match fixed(other) {
                Some(size) => self.skip(size, key).map(|_| None),
                None => Err(format!("`{key}` has unknown value type {other}")),
            },
        }
    }
}

/// Walk the header (magic, version, metadata, tensor table) without allocating more than the file holds.
/// The error is the message of a `CorruptWeights`.
pub(crate) fn scan_header<R: Read>(reader: &mut R, file_size: u64) -> std::result::Result<(), String> {
    let mut c = Cursor { reader, at: 0, size: file_size, version: 0 };
    if &c.bytes::<4>("the magic")? != b"GGUF" {
        return Err("not a GGUF file (its first bytes are not `GGUF`)".into());
    }
    c.version = c.u32("the version")?;
    if !(1..=3).contains(&c.version) {
        return Err(format!("GGUF version {} is not supported (1 to 3 are)", c.version));
    }
    // A tensor entry takes at least 8 (name length) + 4 + 8 + 4 + 8 bytes; a metadata entry at least 8 + 4 + 1.
    let tensor_count = c.bounded_count("the tensor count", 32)?;
    let kv_count = c.bounded_count("the metadata count", 13)?;
    let mut keys = HashSet::new();
    for _ in 0..kv_count {
        let key = String::from_utf8_lossy(&c.string("a metadata key")?).into_owned();
        let kind = c.u32(&format!("the type of `{key}`"))?;
        let value = c.value(kind, &key, 0)?;
        if key == "general.alignment" {
            match value {
                Some(a) if a > 0 && a.is_power_of_two() && a <= 1 << 20 => {}
                Some(a) => return Err(format!("general.alignment is {a}; it must be a power of two (32 by default)")),
                None => return Err("general.alignment must be a u32".into()),
            }
        }
        if !keys.insert(key.clone()) {
            return Err(format!("metadata key `{key}` appears twice; which one holds is ambiguous"));
        }
    }
    let mut names = HashSet::new();
    for _ in 0..tensor_count {
        let name = String::from_utf8_lossy(&c.string("a tensor name")?).into_owned();
        let dims = c.u32(&format!("the dimension count of `{name}`"))?;
        if dims == 0 || dims > MAX_DIMS {
            return Err(format!("tensor `{name}` has {dims} dimensions; GGUF tensors have 1 to {MAX_DIMS}"));
        }
        let mut elements = 1u64;
        for _ in 0..dims {
            let d = c.count(&format!("a dimension of `{name}`"))?;
            elements = elements.checked_mul(d).filter(|e| *e <= file_size.saturating_mul(8)).ok_or_else(|| {
                format!("tensor `{name}` declares more elements than a file of {file_size} bytes can hold")
            })?;
        }
        c.u32(&format!("the type of `{name}`"))?;
        c.u64(&format!("the offset of `{name}`"))?;
        if !names.insert(name.clone()) {
            return Err(format!("tensor `{name}` is listed twice; one of the two would be silently dropped"));
        }
    }
    Ok(())
}

/// Check, before reading any tensor data, that every tensor lies inside the file and that no two share
/// bytes: a truncated download is reported at once, with the file size, instead of after minutes of
/// dequantizing, and a crafted table cannot alias one layer's weights as another's.
fn check_tensor_extents(path: &Path, content: &Content, file_size: u64) -> Result<()> {
    let mut needed_bytes = 0u64;
    let mut spans = Vec::with_capacity(content.tensor_infos.len());
    for (name, info) in &content.tensor_infos {
        let span = tensor_size_bytes(info).and_then(|bytes| {
            let start = content.tensor_data_offset.checked_add(info.offset)?;
            Some((start, start.checked_add(bytes)?))
        });
        let (start, end) = span.ok_or_else(|| {
            corrupt(path, format!("tensor `{name}` has an impossible shape or offset {:?}", info.shape.dims()))
        })?;
        needed_bytes = needed_bytes.max(end);
        spans.push((start, end, name.as_str()));
    }
    if needed_bytes > file_size {
        return Err(corrupt(
            path,
            format!(
                "the file is truncated: its tensors need {needed_bytes} bytes but it has {file_size}; re-download it"
            ),
        ));
    }
    spans.retain(|(start, end, _)| end > start);
    spans.sort_unstable();
    for pair in spans.windows(2) {
        if pair[1].0 < pair[0].1 {
            return Err(corrupt(
                path,
                format!("tensors `{}` and `{}` share bytes; the tensor table is damaged", pair[0].2, pair[1].2),
            ));
        }
    }
    Ok(())
}

/// Bytes of a tensor's data, or `None` if its shape overflows or does not fill whole quantization blocks.
fn tensor_size_bytes(info: &TensorInfo) -> Option<u64> {
    let elems = info.shape.dims().iter().try_fold(1u64, |acc, &d| acc.checked_mul(d as u64))?;
    let block = info.ggml_dtype.block_size() as u64;
    if block == 0 || elems % block != 0 {
        return None;
    }
    (elems / block).checked_mul(info.ggml_dtype.type_size() as u64)
}
