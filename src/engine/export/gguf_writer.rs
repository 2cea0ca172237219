//! A streaming GGUF (version 3) writer. Candle's `gguf_file::write` wants every tensor quantized in memory
//! at once; this one writes the header, the metadata and the tensor infos (whose offsets follow from shapes and
//! types alone), then asks for each tensor's bytes in turn, so only one tensor is ever held quantized.
//!
//! The file is written as `<out>.partial`, flushed and fsynced, then renamed: `out` appears only complete.
//! Layout (ggml's `docs/gguf.md`): magic `GGUF`, version, tensor count, metadata count, metadata key/values,
//! tensor infos (name, dims innermost first, type, offset), padding to `general.alignment` (32), tensor data
//! each padded to the alignment.

use crate::engine::{Error, Result};
use candle_core::quantized::GgmlDType;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// GGUF's default alignment of the data section and of each tensor in it.
pub const ALIGNMENT: u64 = 32;

/// A metadata value, with the GGUF value types we write.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    Str(String),
    Array(Vec<MetaValue>),
}

impl MetaValue {
    fn type_id(&self) -> u32 {
        match self {
            Self::U8(_) => 0,
            Self::I8(_) => 1,
            Self::U16(_) => 2,
            Self::I16(_) => 3,
            Self::U32(_) => 4,
            Self::I32(_) => 5,
            Self::F32(_) => 6,
            Self::Bool(_) => 7,
            Self::Str(_) => 8,
            Self::Array(_) => 9,
            Self::U64(_) => 10,
            Self::I64(_) => 11,
            Self::F64(_) => 12,
        }
    }

    fn write(&self, w: &mut impl Write) -> std::io::Result<()> {
        match self {
            Self::U8(v) => w.write_all(&v.to_le_bytes()),
            Self::I8(v) => w.write_all(&v.to_le_bytes()),
            Self::U16(v) => w.write_all(&v.to_le_bytes()),
            Self::I16(v) => w.write_all(&v.to_le_bytes()),
            Self::U32(v) => w.write_all(&v.to_le_bytes()),
            Self::I32(v) => w.write_all(&v.to_le_bytes()),
            Self::U64(v) => w.write_all(&v.to_le_bytes()),
            Self::I64(v) => w.write_all(&v.to_le_bytes()),
            Self::F32(v) => w.write_all(&v.to_le_bytes()),
            Self::F64(v) => w.write_all(&v.to_le_bytes()),
            Self::Bool(v) => w.write_all(&[u8::from(*v)]),
            Self::Str(s) => write_str(w, s),
            Self::Array(items) => {
                // GGUF arrays are homogeneous; an empty one is written as an array of u8.
                let item_type = items.first().map(|v| v.type_id()).unwrap_or(0);
                w.write_all(&item_type.to_le_bytes())?;
                w.write_all(&(items.len() as u64).to_le_bytes())?;
                items.iter().try_for_each(|v| v.write(w))
            }
        }
    }
}

fn write_str(w: &mut impl Write, s: &str) -> std::io::Result<()> {
    w.write_all(&(s.len() as u64).to_le_bytes())?;
    w.write_all(s.as_bytes())
}

/// One tensor of the file: its GGUF name, its shape rows first (as torch and candle write it) and its type.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorEntry {
    pub name: String,
    pub dims: Vec<usize>,
    pub dtype: GgmlDType,
}

impl TensorEntry {
    /// Bytes of the tensor's data (without padding).
    pub fn size_bytes(&self) -> u64 {
        let elems: u64 = self.dims.iter().map(|&d| d as u64).product();
        elems / self.dtype.block_size() as u64 * self.dtype.type_size() as u64
    }
}

/// ggml's type id for a tensor type (candle keeps its own mapping private).
pub fn ggml_type_id(dtype: GgmlDType) -> u32 {
    match dtype {
        GgmlDType::F32 => 0,
        GgmlDType::F16 => 1,
        GgmlDType::Q4_0 => 2,
        GgmlDType::Q4_1 => 3,
        GgmlDType::Q5_0 => 6,
        GgmlDType::Q5_1 => 7,
        GgmlDType::Q8_0 => 8,
        GgmlDType::Q8_1 => 9,
        GgmlDType::Q2K => 10,
        GgmlDType::Q3K => 11,
        GgmlDType::Q4K => 12,
        GgmlDType::Q5K => 13,
        GgmlDType::Q6K => 14,
        GgmlDType::Q8K => 15,
        GgmlDType::BF16 => 30,
    }
}

fn padding(len: u64) -> u64 {
    (ALIGNMENT - len % ALIGNMENT) % ALIGNMENT
}

/// Write a GGUF file at `out`: `tensor_data(i)` returns the bytes of `tensors[i]` (exactly
/// [`TensorEntry::size_bytes`] of them) and is called once per tensor, in order. Returns the file size.
pub fn write_gguf(
    out: &Path,
    metadata: &[(String, MetaValue)],
    tensors: &[TensorEntry],
    mut tensor_data: impl FnMut(usize) -> Result<Vec<u8>>,
) -> Result<u64> {
    let partial = partial_path(out);
    let written = (|| -> Result<u64> {
        let file = std::fs::File::create(&partial).map_err(|e| Error::write(&partial, e))?;
        let mut w = CountingWriter { inner: BufWriter::with_capacity(1 << 20, file), bytes: 0 };
        let io = |e: std::io::Error| Error::write(&partial, e);
        write_header(&mut w, metadata, tensors).map_err(io)?;
        for (i, entry) in tensors.iter().enumerate() {
            let data = tensor_data(i)?;
            if data.len() as u64 != entry.size_bytes() {
                return Err(Error::write(
                    &partial,
                    format!("tensor `{}`: {} bytes where {} were planned", entry.name, data.len(), entry.size_bytes()),
                ));
            }
            w.write_all(&data).map_err(io)?;
            w.write_all(&vec![0u8; padding(data.len() as u64) as usize]).map_err(io)?;
        }
        let bytes = w.bytes;
        let file = w.inner.into_inner().map_err(|e| io(e.into_error()))?;
        file.sync_all().map_err(io)?;
        Ok(bytes)
    })();
    match written {
        Ok(bytes) => {
            std::fs::rename(&partial, out).map_err(|e| Error::write(out, e))?;
            Ok(bytes)
        }
        Err(e) => {
            let _ = std::fs::remove_file(&partial);
            Err(e)
        }
    }
}

/// `model.gguf` -> `model.gguf.partial`.
pub fn partial_path(out: &Path) -> PathBuf {
    let mut name = out.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    name.push(".partial");
    out.with_file_name(name)
}

fn write_header(w: &mut impl Write, metadata: &[(String, MetaValue)], tensors: &[TensorEntry]) -> std::io::Result<()> {
    let mut head = CountingWriter { inner: w, bytes: 0 };
    head.write_all(b"GGUF")?;
    head.write_all(&3u32.to_le_bytes())?;
    head.write_all(&(tensors.len() as u64).to_le_bytes())?;
    head.write_all(&(metadata.len() as u64).to_le_bytes())?;
    for (key, value) in metadata {
        write_str(&mut head, key)?;
        head.write_all(&value.type_id().to_le_bytes())?;
        value.write(&mut head)?;
    }
    let mut offset = 0u64;
    for entry in tensors {
        write_str(&mut head, &entry.name)?;
        head.write_all(&(entry.dims.len() as u32).to_le_bytes())?;
        for &d in entry.dims.iter().rev() {
            head.write_all(&(d as u64).to_le_bytes())?;
        }
        head.write_all(&ggml_type_id(entry.dtype).to_le_bytes())?;
        head.write_all(&offset.to_le_bytes())?;
        offset += entry.size_bytes() + padding(entry.size_bytes());
    }
    let pad = padding(head.bytes) as usize;
    head.write_all(&vec![0u8; pad])
}

/// Counts bytes on their way through, for the alignment padding.
struct CountingWriter<W> {
    inner: W,
    bytes: u64,
}

impl<W: Write> Write for CountingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.bytes += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}
