//! A streaming safetensors writer for the merged model folder: the header (names, f32 dtype, shapes and data
//! offsets, which follow from the shapes alone) first, then each tensor's bytes as they are produced, so only one
//! merged tensor is in memory. Written as `<out>.partial`, fsynced, then renamed, like the GGUF writer.
//! Layout (safetensors' spec): u64 little-endian header length, the JSON header padded with spaces to 8 bytes,
//! then the data.

use super::gguf_writer::partial_path;
use crate::engine::{Error, Result};
use std::io::{BufWriter, Write};
use std::path::Path;

/// Write f32 tensors `(name, shape)` to `out`; `tensor_data(i)` returns tensor `i`'s little-endian bytes and is
/// called once per tensor, in order. Returns the file size.
pub fn write_f32_safetensors(
    out: &Path,
    tensors: &[(String, Vec<usize>)],
    mut tensor_data: impl FnMut(usize) -> Result<Vec<u8>>,
) -> Result<u64> {
    let mut header = serde_json::Map::new();
    header.insert("__metadata__".into(), serde_json::json!({ "format": "pt" }));
    let mut offset = 0usize;
    for (name, dims) in tensors {
        let bytes = 4 * dims.iter().product::<usize>();
        header.insert(
            name.clone(),
            serde_json::json!({ "dtype": "F32", "shape": dims, "data_offsets": [offset, offset + bytes] }),
        );
        offset += bytes;
    }
    let mut json = serde_json::to_string(&header).map_err(|e| Error::write(out, e))?;
    json.push_str(&" ".repeat((8 - json.len() % 8) % 8));
    let partial = partial_path(out);
    let written = (|| -> Result<u64> {
        let io = |e: std::io::Error| Error::write(&partial, e);
        let file = std::fs::File::create(&partial).map_err(io)?;
        let mut w = BufWriter::with_capacity(1 << 20, file);
        w.write_all(&(json.len() as u64).to_le_bytes()).map_err(io)?;
        w.write_all(json.as_bytes()).map_err(io)?;
        for (i, (name, dims)) in tensors.iter().enumerate() {
            let data = tensor_data(i)?;
            if data.len() != 4 * dims.iter().product::<usize>() {
                return Err(Error::write(&partial, format!("tensor `{name}`: {} bytes, shape {dims:?}", data.len())));
            }
            w.write_all(&data).map_err(io)?;
        }
        let file = w.into_inner().map_err(|e| io(e.into_error()))?;
        file.sync_all().map_err(io)?;
        Ok(8 + json.len() as u64 + offset as u64)
    })();
    match written {
        Ok(bytes) => {
            std::fs::rename(&partial, out).map_err(|e| Error::write(out, e))?;
            crate::engine::checkpoint::make_world_readable(out)?;
            Ok(bytes)
        }
        Err(e) => {
            let _ = std::fs::remove_file(&partial);
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Tensor};

    #[test]
    fn candle_reads_back_what_was_streamed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.safetensors");
        let a = Tensor::arange(0f32, 6., &Device::Cpu).unwrap().reshape((2, 3)).unwrap();
        let b = Tensor::new(&[7f32], &Device::Cpu).unwrap();
        let tensors = vec![("b.weight".to_string(), vec![1]), ("a.weight".to_string(), vec![2, 3])];
        let data = [&b, &a].map(|t| t.flatten_all().unwrap().to_vec1::<f32>().unwrap());
        write_f32_safetensors(&path, &tensors, |i| Ok(data[i].iter().flat_map(|x| x.to_le_bytes()).collect())).unwrap();
        let back = candle_core::safetensors::load(&path, &Device::Cpu).unwrap();
        assert_eq!(back["a.weight"].to_vec2::<f32>().unwrap(), a.to_vec2::<f32>().unwrap());
        assert_eq!(back["b.weight"].to_vec1::<f32>().unwrap(), vec![7.0]);
        assert!(!partial_path(&path).exists());
    }
}
