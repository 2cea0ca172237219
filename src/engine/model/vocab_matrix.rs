//! The (vocab, hidden) matrices: the token embeddings, read by row, and the LM head (its own, or the embeddings
//! when tied), which turns hidden states into logits and the loss. Dense in the compute dtype, or with a
//! quantized base held as GGML blocks of consecutive rows ([`quant::vocab_type`]): at a 128k vocabulary they are
//! 2.1 GB each in f32, a quarter of an 8B model's weights, so a QLoRA base that left them dense would not fit where
//! QLoRA is meant to run.
//!
//! Blocks of rows, not one quantized matrix: a block is what the head dequantizes at a time (the loss over the
//! vocabulary in blocks, `ops::quantized_head_nll`; logits block by block), and quantized storage cannot be
//! viewed by rows on a GPU.

use super::quant::{vocab_type, BaseQuant, VocabRole};
use super::safetensors_weights::Weights;
use crate::engine::ops::{self, HeadLoss};
use crate::engine::Result;
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device, Tensor};
use std::sync::Arc;

/// Weights per quantized block: (4096 rows at hidden 4096), one dense block is 64 MB in f32.
const BLOCK_ELEMS: usize = 1 << 24;

/// A (vocab, hidden) matrix.
#[derive(Debug, Clone)]
pub enum VocabMatrix {
    /// In the compute dtype.
    Dense(Tensor),
    /// Consecutive blocks of `rows_per_block` rows (the last may be shorter), on the model's device; rows come
    /// out in `dtype`.
    Quantized { blocks: Vec<Arc<QTensor>>, rows_per_block: usize, vocab: usize, hidden: usize, dtype: DType },
}

impl VocabMatrix {
    /// Read tensor `name` of shape (vocab, hidden), held as `quant` says for a vocabulary matrix in `role`.
    pub fn load(
        weights: &Weights,
        (name, role): (&str, VocabRole),
        (vocab, hidden): (usize, usize),
        dtype: DType,
        device: &Device,
        quant: BaseQuant,
    ) -> Result<Self> {
        let Some(qtype) = vocab_type(quant, role, hidden, weights.has_quantized()) else {
            return Ok(Self::Dense(weights.get(name, &[vocab, hidden], dtype, device)?));
        };
        // From a file, one block of rows at a time: the load never holds the whole matrix unquantized
        // (1 GB in bf16 and 2.1 GB in f32 at a 128k vocabulary and hidden 4096).
        if weights.reads_rows_alone() {
            let shape = [vocab, hidden];
            let read = |start, rows| weights.get_rows(name, &shape, (start, rows), DType::F32, &Device::Cpu);
            return Self::from_row_blocks((vocab, hidden), qtype, dtype, device, Self::rows_per_block(hidden), read);
        }
        let dense = weights.get(name, &[vocab, hidden], DType::F32, &Device::Cpu)?;
        Ok(Self::quantize(&dense, qtype, dtype, device)?)
    }

    /// Rows per quantized block at this hidden size (before clamping to the vocabulary).
    pub fn rows_per_block(hidden: usize) -> usize {
        (BLOCK_ELEMS / hidden.max(1)).max(1)
    }

    /// `dense` (vocab, hidden) on the CPU quantized to `qtype` in blocks of rows on `device`.
    pub fn quantize(dense: &Tensor, qtype: GgmlDType, dtype: DType, device: &Device) -> candle_core::Result<Self> {
        Self::quantize_in_blocks(dense, qtype, dtype, device, Self::rows_per_block(dense.dim(1)?))
    }

    /// [`Self::quantize`] with blocks of `rows_per_block` rows.
    fn quantize_in_blocks(
        dense: &Tensor,
        qtype: GgmlDType,
        dtype: DType,
        device: &Device,
        rows_per_block: usize,
    ) -> candle_core::Result<Self> {
        let read = |start, rows| dense.narrow(0, start, rows);
        Self::from_row_blocks(dense.dims2()?, qtype, dtype, device, rows_per_block, read)
    }

    /// A (vocab, hidden) matrix quantized to `qtype` in blocks of `rows_per_block` rows, each block's dense
    /// f32 rows given by `read(start, rows)` on the CPU (the last block may be shorter).
    fn from_row_blocks<E: From<candle_core::Error>>(
        (vocab, hidden): (usize, usize),
        qtype: GgmlDType,
        dtype: DType,
        device: &Device,
        rows_per_block: usize,
        read: impl Fn(usize, usize) -> std::result::Result<Tensor, E>,
    ) -> std::result::Result<Self, E> {
        let rows_per_block = rows_per_block.clamp(1, vocab.max(1));
        let blocks = (0..vocab)
            .step_by(rows_per_block)
            .map(|start| {
                let dense = read(start, rows_per_block.min(vocab - start))?;
                Ok(Arc::new(ops::quantize_rows(&dense, qtype, device)?))
            })
            .collect::<std::result::Result<Vec<_>, E>>()?;
        Ok(Self::Quantized { blocks, rows_per_block, vocab, hidden, dtype })
    }

    /// (vocab, hidden).
    pub fn dims2(&self) -> candle_core::Result<(usize, usize)> {
        match self {
            Self::Dense(w) => w.dims2(),
            Self::Quantized { vocab, hidden, .. } => Ok((*vocab, *hidden)),
        }
    }

    /// The GGML type of a quantized matrix; None when dense.
    pub fn quantized_type(&self) -> Option<GgmlDType> {
        match self {
            Self::Dense(_) => None,
            Self::Quantized { blocks, .. } => blocks.first().map(|b| b.dtype()),
        }
    }

    /// Bytes held in memory.
    pub fn size_in_bytes(&self) -> u64 {
        match self {
            Self::Dense(w) => (w.elem_count() * w.dtype().size_in_bytes()) as u64,
            Self::Quantized { blocks, .. } => blocks.iter().map(|b| b.storage_size_in_bytes() as u64).sum(),
        }
    }

    /// Whether looking up one row keeps the id on `device` (a decode step that reads nothing back to the host,
    /// which a CUDA graph can capture): dense rows, or quantized ones our CUDA kernel reads.
    pub fn looks_up_on_device(&self, device: &Device) -> bool {
        match self {
            Self::Dense(_) => true,
            Self::Quantized { blocks, dtype, .. } => {
                let blocks = blocks.iter().map(|b| b.as_ref()).collect::<Vec<_>>();
                ops::quantized_kernels_take(&blocks, device, *dtype)
            }
        }
    }

    /// Rows `ids` (n) as an (n, hidden) tensor in the compute dtype: the embedding lookup.
    pub fn rows(&self, ids: &Tensor) -> candle_core::Result<Tensor> {
        let (blocks, rows_per_block, hidden, dtype) = match self {
            Self::Dense(w) => return crate::engine::ops::gather_rows(w, ids),
            Self::Quantized { blocks, rows_per_block, hidden, dtype, .. } => (blocks, *rows_per_block, *hidden, *dtype),
        };
        // One id (a decoded token, which the head's logits chose): looked up where it is, on the device, so that
        // a captured decode step can replay the lookup.
        if ids.elem_count() == 1 {
            let blocks = blocks.iter().map(|b| b.as_ref()).collect::<Vec<_>>();
            let ids = ids.to_dtype(DType::U32)?;
            if let Some(row) = ops::quantized_rows_on_device(&blocks, &ids, dtype)? {
                return Ok(row);
            }
        }
        let wanted = ids.to_dtype(DType::U32)?.flatten_all()?.to_vec1::<u32>()?;
        let device = blocks.first().map(|b| b.device()).unwrap_or(Device::Cpu);
        // Each block looks up its own ids; the rows are then put back in the order asked for.
        let (mut parts, mut order) = (Vec::new(), Vec::with_capacity(wanted.len()));
        for (b, block) in blocks.iter().enumerate() {
            let start = b * rows_per_block;
            let mine: Vec<(usize, u32)> = wanted
                .iter()
                .enumerate()
                .filter(|&(_, &id)| (id as usize) / rows_per_block == b)
                .map(|(i, &id)| (i, id - start as u32))
                .collect();
            if mine.is_empty() {
                continue;
            }
            let local = Tensor::from_vec(mine.iter().map(|&(_, l)| l).collect::<Vec<_>>(), mine.len(), &device)?;
            parts.push(block.embedding(&local)?.to_dtype(dtype)?);
            order.extend(mine.iter().map(|&(i, _)| i));
        }
        if order.len() != wanted.len() {
            let vocab = blocks.iter().map(|b| b.shape().dims()[0]).sum::<usize>();
            candle_core::bail!("a token id is outside the vocabulary of {vocab}");
        }
        let found =
            if parts.is_empty() { Tensor::zeros((0, hidden), dtype, &device)? } else { Tensor::cat(&parts, 0)? };
        let mut position = vec![0u32; order.len()];
        for (row, &i) in order.iter().enumerate() {
            position[i] = row as u32;
        }
        found.index_select(&Tensor::from_vec(position, order.len(), &device)?, 0)
    }

    /// Logits (…, vocab) for hidden states (…, hidden).
    pub fn logits(&self, hidden: &Tensor) -> candle_core::Result<Tensor> {
        match self {
            Self::Dense(w) => ops::frozen_matmul_t(hidden, w),
            Self::Quantized { blocks, .. } => {
                let joined = blocks.iter().map(|b| b.as_ref()).collect::<Vec<_>>();
                if let Some(logits) = ops::quantized_gemv_joined(hidden, &joined)? {
                    return Ok(logits);
                }
                let parts = blocks
                    .iter()
                    .map(|b| ops::quantized_matmul_t(hidden, b))
                    .collect::<candle_core::Result<Vec<_>>>()?;
                Tensor::cat(&parts, hidden.rank() - 1)
            }
        }
    }

    /// The head's loss over `targets` after `hidden` (n, hidden) (see `ops::head_nll`), pushing each row's NLL
    /// onto `row_nll` when given.
    pub fn head_nll(
        &self,
        hidden: &Tensor,
        targets: &[u32],
        grad_scale: Option<f64>,
        row_nll: Option<&mut Vec<f64>>,
    ) -> candle_core::Result<HeadLoss> {
        match self {
            Self::Dense(w) => ops::head_nll_rows(hidden, w, targets, grad_scale, row_nll),
            Self::Quantized { blocks, rows_per_block, .. } => {
                let target_rows = self.rows(&Tensor::new(targets, hidden.device())?)?.to_dtype(hidden.dtype())?;
                let head = ops::QuantizedHead { blocks, rows_per_block: *rows_per_block, target_rows: &target_rows };
                ops::quantized_head_nll(hidden, &head, targets, grad_scale, row_nll)
            }
        }
    }

    /// The matrix dense in `dtype` (a dequantized copy when quantized): for merging and export.
    pub fn to_dense(&self, dtype: DType) -> candle_core::Result<Tensor> {
        match self {
            Self::Dense(w) => w.to_dtype(dtype),
            Self::Quantized { blocks, .. } => match blocks.first() {
                Some(first) => ops::dequantize_stacked(blocks, &first.device(), dtype),
                None => candle_core::bail!("a quantized vocabulary without blocks"),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantized_rows_and_logits_match_the_dequantized_matrix() -> candle_core::Result<()> {
        let dev = Device::Cpu;
        let dense = Tensor::randn(0f32, 1.0, (1000, 64), &dev)?;
        let matrix = VocabMatrix::quantize(&dense, GgmlDType::Q8_0, DType::F32, &dev)?;
        let VocabMatrix::Quantized { rows_per_block, ref blocks, .. } = matrix else { panic!("quantized") };
        assert!(blocks.len() == 1 && rows_per_block == 1000);
        // Several blocks, to test lookups across them.
        let matrix = VocabMatrix::quantize_in_blocks(&dense, GgmlDType::Q8_0, DType::F32, &dev, 300)?;
        let reference = matrix.to_dense(DType::F32)?;
        assert_eq!(reference.dims(), &[1000, 64]);
        let ids = Tensor::new(&[999u32, 0, 301, 299, 600, 5, 301], &dev)?;
        let diff = (matrix.rows(&ids)? - reference.index_select(&ids, 0)?)?.abs()?.max_all()?.to_scalar::<f32>()?;
        assert_eq!(diff, 0.0);
        assert!(matrix.rows(&Tensor::new(&[1000u32], &dev)?).is_err());
        // Many rows multiply the dequantized block (exact); few (decoding) go through the single-row kernels, which
        // round the hidden state to 8-bit blocks as llama.cpp does: ~1/254 of each 32-block's largest value, a
        // logit error well under 2% of the logits' range for these 64-wide random rows.
        for (rows, relative) in [(16, 1e-5), (1, 0.02), (3, 0.02)] {
            let hidden = Tensor::randn(0f32, 1.0, (rows, 64), &dev)?;
            let reference = hidden.matmul(&reference.t()?)?;
            let range = reference.abs()?.max_all()?.to_scalar::<f32>()?;
            let diff = (matrix.logits(&hidden)? - reference)?.abs()?.max_all()?.to_scalar::<f32>()?;
            assert!(diff < relative * range, "{rows} rows: logits differ by {diff} (range {range})");
        }
        Ok(())
    }

    /// From a safetensors folder the matrix is read and quantized one block of rows at a time; the blocks are
    /// those of the whole matrix quantized at once; rows past the end, or a shape the file does not hold, are refused.
    #[test]
    fn a_file_matrix_loads_block_by_block_into_the_same_blocks() -> Result<()> {
        let dev = Device::Cpu;
        let dir = tempfile::tempdir().unwrap();
        let dense = Tensor::randn(0f32, 1.0, (1000, 64), &dev)?.to_dtype(DType::BF16)?;
        let name = "model.embed_tokens.weight";
        candle_core::safetensors::save(
            &std::collections::HashMap::from([(name.to_string(), dense.clone())]),
            dir.path().join("model.safetensors"),
        )?;
        let weights = Weights::open_folder(dir.path())?;
        assert!(weights.reads_rows_alone());
        let expected = VocabMatrix::quantize(&dense.to_dtype(DType::F32)?, GgmlDType::Q8_0, DType::F32, &dev)?;
        // 64-wide rows make one 1000-row block of 2^24 weights; the file read in 300-row blocks must agree.
        let read = |start, rows| weights.get_rows(name, &[1000, 64], (start, rows), DType::F32, &dev);
        let blocked = VocabMatrix::from_row_blocks((1000, 64), GgmlDType::Q8_0, DType::F32, &dev, 300, read)?;
        let VocabMatrix::Quantized { ref blocks, .. } = blocked else { panic!("quantized") };
        assert_eq!(blocks.len(), 4);
        let whole =
            VocabMatrix::load(&weights, (name, VocabRole::Head), (1000, 64), DType::F32, &dev, BaseQuant::Q8_0)?;
        assert_eq!(whole.quantized_type(), Some(GgmlDType::Q8_0));
        for matrix in [&blocked, &whole] {
            let diff = (matrix.to_dense(DType::F32)? - expected.to_dense(DType::F32)?)?.abs()?.max_all()?;
            assert_eq!(diff.to_scalar::<f32>()?, 0.0);
        }
        assert!(weights.get_rows(name, &[1000, 64], (900, 101), DType::F32, &dev).is_err());
        assert!(weights.get_rows(name, &[999, 64], (0, 10), DType::F32, &dev).is_err());
        Ok(())
    }
}
