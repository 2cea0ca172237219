//! Reads safetensors files one tensor at a time with plain reads (no memory map), reporting progress.
//!
//! A memory-mapped file's pages count in the process's resident memory once touched, and stay counted until
//! the map is dropped at the end of the load: loading a bf16 file into f32 weights peaked at the file's size
//! plus the model's. Read into a buffer, converted and dropped, a tensor costs its bytes only while it is
//! being loaded, so the load's peak is the model plus its largest tensor; and every read is a point at which
//! the loader can say how far it is ([`LoadProgress`]).
//!
//! Layout (safetensors' spec): u64 little-endian header length, a JSON header mapping each name to its dtype,
//! shape and data offsets (relative to the end of the header), then the data.

use crate::engine::{Error, Result};
use candle_core::{DType, Device, Tensor};
use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// How far a model load is: bytes of weights read of the total, and the time it has taken.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LoadProgress {
    pub bytes_done: u64,
    pub bytes_total: u64,
    pub elapsed_secs: f64,
}

impl LoadProgress {
    pub fn fraction(&self) -> f64 {
        if self.bytes_total == 0 {
            1.0
        } else {
            (self.bytes_done as f64 / self.bytes_total as f64).clamp(0.0, 1.0)
        }
    }

    /// Time left at the rate so far; None before anything is read.
    pub fn secs_left(&self) -> Option<f64> {
        (self.bytes_done > 0 && self.elapsed_secs > 0.0).then(|| {
            let rate = self.bytes_done as f64 / self.elapsed_secs;
            self.bytes_total.saturating_sub(self.bytes_done) as f64 / rate
        })
    }

    /// "1.2 of 2.5 GB, 4 s left" (the CLI's line and the studio's label).
    pub fn describe(&self) -> String {
        let gb = |b: u64| b as f64 / 1e9;
        let left = self.secs_left().map(|s| format!(", {s:.0} s left")).unwrap_or_default();
        format!("{:.2} of {:.2} GB{left}", gb(self.bytes_done), gb(self.bytes_total))
    }
}

/// Called after each tensor a load reads.
pub type LoadProgressFn = Arc<dyn Fn(&LoadProgress) + Send + Sync>;

/// Where one tensor lies.
struct Entry {
    file: usize,
    dtype: DType,
    shape: Vec<usize>,
    /// Absolute byte range in its file.
    start: u64,
    end: u64,
}

/// The tensors of one or more safetensors files (a sharded checkpoint), read on request.
pub struct SafetensorsReader {
    files: Vec<(PathBuf, Mutex<std::fs::File>)>,
    entries: HashMap<String, Entry>,
    bytes_total: u64,
    bytes_done: AtomicU64,
    started: Instant,
    progress: Option<LoadProgressFn>,
}

impl SafetensorsReader {
    /// Read the headers of `paths`; every tensor's extent is checked against its file's size and its dtype
    /// and shape, so a truncated download is an error here, naming the file.
    pub fn open(paths: &[PathBuf], progress: Option<LoadProgressFn>) -> Result<Self> {
        let mut files = Vec::new();
        let mut entries = HashMap::new();
        for (index, path) in paths.iter().enumerate() {
            let mut file = crate::engine::input_file::open_regular(path, u64::MAX)?;
            let size = file.metadata().map_err(|e| Error::io(path, e))?.len();
            for (name, entry) in read_header(path, &mut file, size, index)? {
                if let Some(earlier) = entries.get(&name).map(|e: &Entry| e.file) {
                    return Err(corrupt(
                        path,
                        format!(
                            "tensor `{name}` is also in {}; a tensor must be stored once",
                            paths[earlier].display()
                        ),
                    ));
                }
                entries.insert(name, entry);
            }
            files.push((path.clone(), Mutex::new(file)));
        }
        let bytes_total = entries.values().map(|e| e.end - e.start).sum();
        Ok(Self { files, entries, bytes_total, bytes_done: AtomicU64::new(0), started: Instant::now(), progress })
    }

    pub fn contains(&self, name: &str) -> bool {
        self.entries.contains_key(name)
    }

    /// The stored shape of tensor `name`.
    pub fn shape(&self, name: &str) -> Option<&[usize]> {
        self.entries.get(name).map(|e| e.shape.as_slice())
    }

    /// Every stored tensor's name.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.entries.keys().map(String::as_str)
    }

    /// Count only the tensors `keep` names in the progress total (those a load will read).
    pub fn count_only(&mut self, keep: impl Fn(&str) -> bool) {
        self.bytes_total = self.entries.iter().filter(|(name, _)| keep(name)).map(|(_, e)| e.end - e.start).sum();
    }

    /// Tensor `name` as stored, on the CPU (None when the files have no such tensor).
    pub fn load(&self, name: &str) -> Result<Option<Tensor>> {
        let Some(entry) = self.entries.get(name) else { return Ok(None) };
        let rows = entry.shape.first().copied().unwrap_or(1);
        self.load_rows(name, 0, rows)
    }

    /// Rows `start..start + rows` (along the first dimension) of tensor `name` as stored, on the CPU, reading
    /// only their bytes: a 128k-vocabulary matrix can be converted block by block without holding it whole.
    /// None when the files have no such tensor.
    pub fn load_rows(&self, name: &str, start: usize, rows: usize) -> Result<Option<Tensor>> {
        let Some(entry) = self.entries.get(name) else { return Ok(None) };
        let (path, file) = &self.files[entry.file];
        if !entry.dtype.is_float() {
            return Err(corrupt(
                path,
                format!(
                    "tensor `{name}` is stored as {:?}, not as floating point; weights are F32, F16 or BF16",
                    entry.dtype
                ),
            ));
        }
        let total_rows = entry.shape.first().copied().unwrap_or(1);
        if start + rows > total_rows {
            return Err(corrupt(path, format!("tensor `{name}`: rows {start}..{} of {total_rows}", start + rows)));
        }
        let row_bytes = (entry.end - entry.start) / total_rows.max(1) as u64;
        let mut shape = entry.shape.clone();
        if let Some(first) = shape.first_mut() {
            *first = rows;
        }
        let mut bytes = vec![0u8; (row_bytes * rows as u64) as usize];
        {
            let mut file = file.lock().map_err(|_| corrupt(path, "a reader thread panicked"))?;
            file.seek(SeekFrom::Start(entry.start + row_bytes * start as u64)).map_err(|e| Error::io(path, e))?;
            file.read_exact(&mut bytes).map_err(|e| Error::io(path, e))?;
        }
        if let Some(at) = first_non_finite(&bytes, entry.dtype) {
            let row = start + at / (entry.shape.iter().skip(1).product::<usize>().max(1));
            return Err(corrupt(
                path,
                format!("tensor `{name}` holds NaN or infinite values (first in row {row}); the file is damaged"),
            ));
        }
        let tensor = Tensor::from_raw_buffer(&bytes, entry.dtype, &shape, &Device::Cpu)
            .map_err(|e| corrupt(path, format!("tensor `{name}`: {e}")))?;
        let done = self.bytes_done.fetch_add(bytes.len() as u64, Ordering::Relaxed) + bytes.len() as u64;
        if let Some(report) = &self.progress {
            let elapsed_secs = self.started.elapsed().as_secs_f64();
            report(&LoadProgress { bytes_done: done, bytes_total: self.bytes_total, elapsed_secs });
        }
        Ok(Some(tensor))
    }
}

fn corrupt(path: &Path, message: impl Into<String>) -> Error {
    Error::CorruptWeights { path: path.to_path_buf(), message: message.into() }
}

/// Largest header we accept: real ones are a few hundred KB; a bigger length means a corrupt file.
const MAX_HEADER_BYTES: u64 = 100 << 20;

fn read_header(path: &Path, file: &mut std::fs::File, size: u64, index: usize) -> Result<Vec<(String, Entry)>> {
    let not_safetensors =
        |what: &str| corrupt(path, format!("{what} (not a safetensors file, or truncated; download it again)"));
    let mut len = [0u8; 8];
    file.read_exact(&mut len).map_err(|_| not_safetensors("shorter than its 8-byte header length"))?;
    let header_len = u64::from_le_bytes(len);
    if header_len > MAX_HEADER_BYTES || 8 + header_len > size {
        return Err(not_safetensors(&format!("header length {header_len} does not fit the file of {size} bytes")));
    }
    let mut header = vec![0u8; header_len as usize];
    file.read_exact(&mut header).map_err(|e| Error::io(path, e))?;
    let header: KeysInOrder =
        serde_json::from_slice(&header).map_err(|e| not_safetensors(&format!("header is not JSON: {e}")))?;
    let data_start = 8 + header_len;
    let mut out: Vec<(String, Entry)> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for (name, info) in header.0 {
        if !seen.insert(name.clone()) {
            return Err(corrupt(path, format!("tensor `{name}` is named twice in the header")));
        }
        if name == "__metadata__" {
            continue;
        }
        let bad = |what: String| corrupt(path, format!("tensor `{name}`: {what}"));
        let dtype = info.get("dtype").and_then(|d| d.as_str()).ok_or_else(|| bad("no dtype".into()))?;
        let dtype = match dtype {
            "F32" => DType::F32,
            "F16" => DType::F16,
            "BF16" => DType::BF16,
            "F64" => DType::F64,
            "U8" => DType::U8,
            "U32" => DType::U32,
            "I64" => DType::I64,
            other => return Err(bad(format!("dtype {other} is not supported"))),
        };
        let numbers = |key: &str| -> Option<Vec<u64>> {
            info.get(key)?.as_array()?.iter().map(|v| v.as_u64()).collect::<Option<Vec<u64>>>()
        };
        let shape: Vec<usize> =
            numbers("shape").ok_or_else(|| bad("no shape".into()))?.into_iter().map(|d| d as usize).collect();
        let offsets = numbers("data_offsets").filter(|o| o.len() == 2).ok_or_else(|| bad("no data_offsets".into()))?;
        let (start, end) = (data_start.saturating_add(offsets[0]), data_start.saturating_add(offsets[1]));
        let expected = shape
            .iter()
            .try_fold(dtype.size_in_bytes() as u64, |acc, &d| acc.checked_mul(d as u64))
            .ok_or_else(|| bad(format!("shape {shape:?} is impossibly large")))?;
        if end < start || end - start != expected || end > size {
            return Err(bad(format!(
                "bytes {start}..{end} do not hold shape {shape:?} of {dtype:?} in a file of {size} bytes (truncated?)"
            )));
        }
        out.push((name, Entry { file: index, dtype, shape, start, end }));
    }
    refuse_overlaps(path, &out)?;
    Ok(out)
}

/// Two tensors sharing bytes would load one's values as the other's: refused, naming both.
fn refuse_overlaps(path: &Path, entries: &[(String, Entry)]) -> Result<()> {
    let mut spans: Vec<(u64, u64, &str)> =
        entries.iter().filter(|(_, e)| e.end > e.start).map(|(n, e)| (e.start, e.end, n.as_str())).collect();
    spans.sort_unstable();
    for pair in spans.windows(2) {
        let ((_, end, first), (start, _, second)) = (pair[0], pair[1]);
        if start < end {
            return Err(corrupt(path, format!("tensors `{first}` and `{second}` share bytes; the header is damaged")));
        }
    }
    Ok(())
}

/// The index of the first NaN or infinite value in `bytes` of a float `dtype`, if any. Branch-free over
/// chunks so that it runs at memory speed; the rare damaged chunk is then searched element by element.
pub(crate) fn first_non_finite(bytes: &[u8], dtype: DType) -> Option<usize> {
    fn scan<const N: usize>(bytes: &[u8], exponent: u64) -> Option<usize> {
        let word = |c: &[u8]| c.iter().rev().fold(0u64, |acc, b| (acc << 8) | *b as u64);
        let bad = |c: &[u8]| word(c) & exponent == exponent;
        let chunk_bytes = N * 256;
        for (k, chunk) in bytes.chunks(chunk_bytes).enumerate() {
            if chunk.chunks_exact(N).fold(false, |any, c| any | bad(c)) {
                let at = chunk.chunks_exact(N).position(bad)?;
                return Some(k * 256 + at);
            }
        }
        None
    }
    match dtype {
        DType::F32 => scan::<4>(bytes, 0x7F80_0000),
        DType::F16 => scan::<2>(bytes, 0x7C00),
        DType::BF16 => scan::<2>(bytes, 0x7F80),
        DType::F64 => scan::<8>(bytes, 0x7FF0_0000_0000_0000),
        _ => None,
    }
}

/// A JSON object's entries in file order, duplicates kept (serde_json's map keeps only the last of a
/// repeated key, which would hide a tensor named twice).
struct KeysInOrder(Vec<(String, serde_json::Value)>);

impl<'de> serde::Deserialize<'de> for KeysInOrder {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = KeysInOrder;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> std::result::Result<KeysInOrder, A::Error> {
                let mut entries = Vec::new();
                while let Some(entry) = map.next_entry()? {
                    entries.push(entry);
                }
                Ok(KeysInOrder(entries))
            }
        }
        deserializer.deserialize_map(Visit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file in the safetensors layout reads back tensor by tensor (or by rows), progress reaching the total;
    /// a truncated copy is refused at open, naming the tensor.
    #[test]
    fn reads_back_what_the_writer_wrote_and_refuses_truncation() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.safetensors");
        let values: Vec<Vec<f32>> = vec![(0..6).map(|i| i as f32).collect(), vec![9.0, 8.0, 7.0, 6.0]];
        let header = r#"{"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},"b":{"dtype":"F32","shape":[4],"data_offsets":[24,40]}}"#;
        let mut file = (header.len() as u64).to_le_bytes().to_vec();
        file.extend_from_slice(header.as_bytes());
        file.extend(values.iter().flatten().flat_map(|v| v.to_le_bytes()));
        std::fs::write(&path, file).unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let sink = seen.clone();
        let reader = SafetensorsReader::open(
            std::slice::from_ref(&path),
            Some(Arc::new(move |p: &LoadProgress| sink.lock().unwrap().push(*p))),
        )
        .unwrap();
        let a = reader.load("a").unwrap().unwrap();
        assert_eq!(a.dims(), &[2, 3]);
        assert_eq!(a.flatten_all().unwrap().to_vec1::<f32>().unwrap(), values[0]);
        assert!(reader.load("missing").unwrap().is_none());
        assert_eq!(reader.load("b").unwrap().unwrap().to_vec1::<f32>().unwrap(), values[1]);
        let seen = seen.lock().unwrap();
        assert_eq!(seen.iter().map(|p| p.bytes_done).collect::<Vec<_>>(), vec![24, 40]);
        assert!(seen.iter().all(|p| p.bytes_total == 40) && seen[1].fraction() == 1.0);
        // Rows read alone are those rows of the whole tensor; a range past the end is refused.
        let rows = SafetensorsReader::open(std::slice::from_ref(&path), None).unwrap();
        let second_row = rows.load_rows("a", 1, 1).unwrap().unwrap();
        assert_eq!(second_row.dims(), &[1, 3]);
        assert_eq!(second_row.flatten_all().unwrap().to_vec1::<f32>().unwrap(), values[0][3..]);
        assert_eq!(rows.load_rows("b", 1, 2).unwrap().unwrap().to_vec1::<f32>().unwrap(), values[1][1..3]);
        assert!(rows.load_rows("a", 1, 2).is_err());
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() - 3]).unwrap();
        let err = SafetensorsReader::open(&[path], None).err().unwrap().to_string();
        assert!(err.contains("tensor `b`") && err.contains("truncated"), "{err}");
    }
}
