//! Products with GGML-quantized frozen weights (QLoRA's base): the forward `x W^T` through Candle's quantized
//! matmul (CPU, CUDA and Metal kernels; on the CPU it quantizes the activations to 8 bits as llama.cpp does),
//! and the input gradient `dy W`, for which Candle has no kernel: the one weight is dequantized into a
//! temporary, multiplied, and dropped, so the whole model is never held dense.
//!
//! With our native kernels on the CPU and on CUDA, a forward of many rows (prefill, scoring, training) takes that
//! same route: dequantizing one weight costs `out x in` while the product costs `rows` times more, and the dense
//! product runs through BLAS or cuBLAS, where Candle's CPU kernels for some types (Q4_1, Q5_0 on x86) are scalar
//! and several times slower. Single rows (decoding) and the portable graph (what Metal runs) use Candle's kernel.
//!
//! Single rows of a quantized weight on an x86 CPU (decoding a GGUF kept as it is, a base quantized at load,
//! the quantized LM head) go through our own kernels ([`quantized_gemv`], `cpu/qgemv.rs`: Q4_1, Q5_0, Q5_1 and Q8_0
//! in our AVX2, other block types through Candle's row arithmetic on our team): Candle's numbers, without its
//! thread pool of its own beside our team (and, for Q4_1, Q5_0 and Q5_1, with SIMD, which Candle's lacks).
//!
//! Candle's Metal kernel reads f32 activations only, so every device gets f32 in and the result is cast back
//! to the caller's dtype: one rule for all of them.

use candle_core::quantized::{GgmlDType, QStorage, QTensor};
use candle_core::{DType, Device, Result, Tensor, D};

use super::cpu::host::cpu_row_pieces;
use super::cpu::qgemv;
use super::frozen_matmul::{frozen_matmul, frozen_matmul_t};
use super::kernel_choice::{metal_dtypes, native};
use std::sync::Arc;

/// `x W^T` for a quantized frozen weight `W` of shape (out, in); `x`: (..., in).
pub fn quantized_matmul_t(x: &Tensor, weight: &QTensor) -> Result<Tensor> {
    metal_dtypes("quantized_matmul_t", &[x])?;
    let (out_features, in_features) = weight.shape().dims2()?;
    let mut dims = x.dims().to_vec();
    let rows = x.elem_count() / in_features.max(1);
    let x2 = x.reshape((rows, in_features))?;
    let y = if let Some(y) = quantized_gemv(&x2, weight)? {
        y
    } else if dequantize_first(x, rows) {
        let pieces = row_pieces(weight, x.device())?;
        let products = pieces
            .iter()
            .map(|&(start, n)| frozen_matmul_t(&x2, &dequantize_rows(weight, start, n, x.device(), x.dtype())?));
        let mut parts = products.collect::<Result<Vec<_>>>()?;
        if parts.len() == 1 {
            parts.remove(0)
        } else {
            Tensor::cat(&parts, 1)?
        }
    } else {
        x2.to_dtype(DType::F32)?.contiguous()?.apply_op1_no_bwd(weight)?.to_dtype(x.dtype())?
    };
    if let Some(last) = dims.last_mut() {
        *last = out_features;
    }
    y.reshape(dims)
}

/// `x W^T` for a single row `x` (..., in) against the rows of `weights` end to end (the same row length and
/// block type: attention's q|k|v, the MLP's gate|up, a vocabulary's blocks), in one launch of our CUDA kernel
/// (`cuda/qgemv.rs`): (..., sum of rows) in `x`'s dtype. None where it does not run (more rows, another device,
/// block type or dtype, the portable graph, `--no-gemv`): then the caller multiplies each weight.
pub fn quantized_gemv_joined(x: &Tensor, weights: &[&QTensor]) -> Result<Option<Tensor>> {
    quantized_gemv_joined_with(x, weights, crate::engine::runtime::options().q4k_tensor_cores)
}

/// [`quantized_gemv_joined`], with Q4_K in bf16 on the tensor cores when `q4k_tensor_cores` (whatever the runtime
/// options: the tests compare both kernels in one process).
pub fn quantized_gemv_joined_with(x: &Tensor, weights: &[&QTensor], q4k_tensor_cores: bool) -> Result<Option<Tensor>> {
    #[cfg(feature = "cuda")]
    if let Some(y) = super::cuda::qgemv::gemv(&x.flatten_all()?, weights, q4k_tensor_cores)? {
        let mut dims = x.dims().to_vec();
        *dims.last_mut().expect("a row has a last dimension") = y.elem_count();
        return Ok(Some(y.reshape(dims)?));
    }
    let _ = (x, weights, q4k_tensor_cores);
    Ok(None)
}

/// Rows `ids` (u32, on the model's CUDA device) of the rows of `weights` end to end, dequantized in `dtype`
/// without reading the ids back to the host (the embedding lookup of a captured decode step): (ids, in), or
/// None where our kernel does not run (see [`quantized_gemv_joined`]). Ids past the rows give zero rows.
pub fn quantized_rows_on_device(weights: &[&QTensor], ids: &Tensor, dtype: DType) -> Result<Option<Tensor>> {
    if ids.dtype() != DType::U32 || !quantized_kernels_take(weights, ids.device(), dtype) {
        return Ok(None);
    }
    #[cfg(feature = "cuda")]
    return Ok(Some(super::cuda::qgemv::rows(weights, ids, dtype)?));
    #[cfg(not(feature = "cuda"))]
    Ok(None)
}

/// Whether our CUDA kernels for quantized single rows ([`quantized_gemv_joined`], [`quantized_rows_on_device`])
/// read `weights` on `device` with activations in `dtype`.
pub fn quantized_kernels_take(weights: &[&QTensor], device: &Device, dtype: DType) -> bool {
    #[cfg(feature = "cuda")]
    return super::cuda::qgemv::takes(weights, device, dtype);
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (weights, device, dtype);
        false
    }
}

/// `x W^T` for a single row `x` (1, in) through our own kernels (CUDA: `cuda/qgemv.rs`; CPU: `qgemv`), in
/// `x`'s dtype; None where none applies (more rows, another device or type, the portable graph): then the
/// caller multiplies.
fn quantized_gemv(x: &Tensor, weight: &QTensor) -> Result<Option<Tensor>> {
    if x.device().is_cuda() {
        return quantized_gemv_joined(x, &[weight]);
    }
    let (out_features, in_features) = weight.shape().dims2()?;
    let applies = x.elem_count() == in_features
        && x.device().is_cpu()
        && native()
        && gemv_kernel_reads(weight.dtype(), in_features);
    if !applies {
        return Ok(None);
    }
    let xs = x.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
    let data = weight.data()?;
    let y = match weight.dtype() {
        GgmlDType::Q4_1 => qgemv::q4_1_gemv(&data, &xs, out_features, in_features),
        GgmlDType::Q8_0 => qgemv::q8_0_gemv(&data, &xs, out_features, in_features),
        GgmlDType::Q5_0 => qgemv::q5_gemv::<false>(&data, &xs, out_features, in_features),
        GgmlDType::Q5_1 => qgemv::q5_gemv::<true>(&data, &xs, out_features, in_features),
        other => qgemv::candle_gemv(other, &data, &xs, out_features, in_features),
    };
    let mut dims = x.dims().to_vec();
    if let Some(last) = dims.last_mut() {
        *last = out_features;
    }
    Ok(Some(Tensor::from_vec(y, dims, x.device())?.to_dtype(x.dtype())?))
}

/// Whether our single-row CPU kernels read weights of `dtype` with rows of `in_features` on this CPU.
fn gemv_kernel_reads(dtype: GgmlDType, in_features: usize) -> bool {
    match dtype {
        GgmlDType::Q4_1 => qgemv::q4_1_fits(in_features),
        GgmlDType::Q8_0 => qgemv::q8_0_fits(in_features),
        GgmlDType::Q5_0 | GgmlDType::Q5_1 => qgemv::q5_fits(in_features),
        other => qgemv::candle_vec_dot_fits(other, in_features),
    }
}

/// Whether a product of `rows` rows of `x` dequantizes the weight and multiplies densely (see the module notes).
fn dequantize_first(x: &Tensor, rows: usize) -> bool {
    let device = x.device();
    native()
        && ((device.is_cpu() && rows >= crate::engine::blas::MIN_ROWS) || (device.is_cuda() && rows > CUDA_VECTOR_ROWS))
}

/// Up to this many rows Candle's CUDA kernels multiply the quantized blocks directly (its matrix-vector
/// kernels, decoding); more rows (prefill, scoring, training) dequantize the one weight on the GPU and multiply
/// in the activations' dtype through cuBLAS, as bitsandbytes' QLoRA does: Candle's many-row kernel
/// quantizes the activations to 8 bits, which training's forward should not.
const CUDA_VECTOR_ROWS: usize = 8;

/// `dy W` for a quantized frozen weight `W` of shape (out, in) and `dy`: (..., out): the input gradient of
/// [`quantized_matmul_t`]. The dequantized weight (or, on the CPU, each piece of its rows) lives only for this
/// product.
pub fn quantized_matmul(dy: &Tensor, weight: &QTensor) -> Result<Tensor> {
    let mut sum: Option<Tensor> = None;
    for (start, n) in row_pieces(weight, dy.device())? {
        let piece = dequantize_rows(weight, start, n, dy.device(), dy.dtype())?;
        let dy_piece =
            if n == weight.shape().dims2()?.0 { dy.clone() } else { dy.narrow(D::Minus1, start, n)?.contiguous()? };
        let part = frozen_matmul(&dy_piece, &piece)?;
        sum = Some(match sum {
            Some(s) => (s + part)?,
            None => part,
        });
    }
    sum.ok_or_else(|| candle_core::Error::Msg("quantized_matmul of a weight without rows".into()))
}

/// The (first row, rows) pieces in which [`dequantize_rows`] turns `weight` dense for a product on `device`: on the
/// CPU 64 MB pieces (`cpu/host.rs`); elsewhere (CUDA: one dequantize launch, device memory measured
/// within target) the whole weight.
fn row_pieces(weight: &QTensor, device: &Device) -> Result<Vec<(usize, usize)>> {
    let (out_features, in_features) = weight.shape().dims2()?;
    if !device.is_cpu() {
        return Ok(vec![(0, out_features)]);
    }
    Ok(cpu_row_pieces(out_features, in_features))
}

/// `weight` dense, in `dtype` on `device` (its own device): on the CPU dequantized in parallel on our team.
pub fn dequantize(weight: &QTensor, device: &Device, dtype: DType) -> Result<Tensor> {
    dequantize_rows(weight, 0, weight.shape().dims2()?.0, device, dtype)
}

/// Weights of the same row length held as consecutive blocks of rows (a quantized vocabulary), dense in `dtype` on
/// `device` as one (sum of rows, in) tensor.
pub fn dequantize_stacked(blocks: &[Arc<QTensor>], device: &Device, dtype: DType) -> Result<Tensor> {
    let parts = blocks.iter().map(|b| dequantize(b, device, dtype)).collect::<Result<Vec<_>>>()?;
    Tensor::cat(&parts, 0)
}

/// Rows `start..start + n` of `weight` dense, in `dtype` on `device`: on the CPU dequantized in parallel on our
/// team (Candle's dequantize is one thread: at 8B it was several seconds of each step); on CUDA the whole weight
/// (the only piece there) in one launch of our kernel where it takes the block type (`cuda/dequantize.rs`: the
/// same values as Candle's dequantize and cast), other block types through Candle's CUDA dequantize; on Metal and
/// in the portable graph (what Metal runs) [`every_row`].
fn dequantize_rows(weight: &QTensor, start: usize, n: usize, device: &Device, dtype: DType) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if device.is_cuda() && start == 0 && n == weight.shape().dims2()?.0 {
        if let Some(dense) = super::cuda::dequantize::dense(weight, dtype)? {
            return Ok(dense);
        }
    }
    if device.is_cuda() && native() {
        return weight.dequantize(device)?.to_dtype(dtype);
    }
    if !device.is_cpu() || !native() {
        return every_row(weight)?.to_device(device)?.to_dtype(dtype);
    }
    let (_, in_features) = weight.shape().dims2()?;
    let qtype = weight.dtype();
    let row_bytes = in_features / qtype.block_size() * qtype.type_size();
    let data = weight.data()?;
    let rows_per_task = n.div_ceil(crate::engine::cpu_team::threads() * 2).max(1);
    let mut values = vec![0f32; n * in_features];
    crate::engine::cpu_pool::try_for_each_chunk(&mut values, rows_per_task * in_features, |task, out| {
        let first = start + task * rows_per_task;
        let rows = out.len() / in_features;
        let bytes = &data[first * row_bytes..(first + rows) * row_bytes];
        // Each task's rows as a QTensor of their own (a copy of their blocks), dequantized by Candle.
        let storage = QStorage::from_data(std::borrow::Cow::Borrowed(bytes), &Device::Cpu, qtype)?;
        let dense = QTensor::new(storage, (rows, in_features))?.dequantize(&Device::Cpu)?;
        out.copy_from_slice(&dense.flatten_all()?.to_vec1::<f32>()?);
        Ok::<_, candle_core::Error>(())
    })?;
    Tensor::from_vec(values, (n, in_features), &Device::Cpu)?.to_dtype(dtype)
}

/// Every row of `weight` dense in f32 on its own device, through Candle's row lookup of a quantized matrix
/// (`QTensor::embedding`, a GPU kernel on Metal and CUDA). Candle's `dequantize` gives the same values, but on
/// Metal it copies the blocks to the host, waits for the GPU and dequantizes on one CPU thread: a Mac's QLoRA step
/// did that for every weight in its backward.
fn every_row(weight: &QTensor) -> Result<Tensor> {
    let rows = weight.shape().dims2()?.0;
    weight.embedding(&Tensor::arange(0u32, rows as u32, &weight.device())?)
}

/// `dense` (out, in), on the CPU, quantized to `dtype` and placed on `device`: rows are quantized in parallel
/// on the CPU team (Candle's own quantizer is single-threaded: an 8B model took minutes), each chunk of rows
/// with Candle's quantizer, so the blocks are exactly Candle's. Every row must fill whole blocks.
pub fn quantize_rows(dense: &Tensor, dtype: GgmlDType, device: &Device) -> Result<QTensor> {
    let (rows, row_len) = dense.dims2()?;
    let block = dtype.block_size();
    if row_len % block != 0 {
        candle_core::bail!("rows of {row_len} values do not fill {dtype:?} blocks of {block}");
    }
    let row_bytes = row_len / block * dtype.type_size();
    let dense = dense.to_dtype(DType::F32)?.contiguous()?;
    let (storage, layout) = dense.storage_and_layout();
    let values = match (&*storage, layout.contiguous_offsets()) {
        (candle_core::Storage::Cpu(candle_core::CpuStorage::F32(v)), Some((start, end))) => &v[start..end],
        _ => candle_core::bail!("quantize_rows reads f32 values on the CPU"),
    };
    // Enough rows per task that each is worth a scheduling round, and several tasks per thread to balance.
    let rows_per_task = (rows / (crate::engine::cpu_team::threads() * 4)).max(1);
    let mut bytes = vec![0u8; rows * row_bytes];
    let quantized = crate::engine::cpu_pool::try_for_each_chunk(&mut bytes, rows_per_task * row_bytes, |task, out| {
        let (start, count) = (task * rows_per_task * row_len, out.len() / row_bytes);
        // A tensor of its own: Candle's quantizer reads a view's whole underlying storage.
        let chunk = Tensor::from_slice(&values[start..start + count * row_len], (count, row_len), &Device::Cpu)?;
        out.copy_from_slice(&QTensor::quantize(&chunk, dtype)?.data()?);
        Ok::<_, candle_core::Error>(())
    });
    drop(storage);
    quantized?;
    let storage = QStorage::from_data(std::borrow::Cow::Owned(bytes), device, dtype)?;
    QTensor::new(storage, (rows, row_len))
}

/// The same quantized blocks on `device` (the weight itself, shared, when it is already there).
pub fn qtensor_to_device(weight: &Arc<QTensor>, device: &Device) -> Result<Arc<QTensor>> {
    if weight.device().same_device(device) {
        return Ok(weight.clone());
    }
    let storage = QStorage::from_data(weight.data()?, device, weight.dtype())?;
    Ok(Arc::new(QTensor::new(storage, weight.shape().clone())?))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A weight of more than `ops::CPU_PIECE_VALUES` values is dequantized in row pieces (here 4096 rows and then 4):
    /// the many-row forward and the input gradient equal the products with the whole dequantized weight.
    #[test]
    fn pieces_of_a_big_weight_multiply_like_the_whole() -> Result<()> {
        let dev = Device::Cpu;
        let weight = quantize_rows(&Tensor::randn(0f32, 0.05, (4100, 4096), &dev)?, GgmlDType::Q8_0, &dev)?;
        assert_eq!(row_pieces(&weight, &dev)?, vec![(0, 4096), (4096, 4)]);
        let whole = weight.dequantize(&dev)?;
        let x = Tensor::randn(0f32, 1.0, (2, 20, 4096), &dev)?;
        let dy = Tensor::randn(0f32, 1.0, (2, 20, 4100), &dev)?;
        let relative = |a: Tensor, b: Tensor| -> Result<f32> {
            let scale = b.abs()?.max_all()?.to_scalar::<f32>()?;
            Ok((a - b)?.abs()?.max_all()?.to_scalar::<f32>()? / scale)
        };
        let forward = relative(quantized_matmul_t(&x, &weight)?, x.broadcast_matmul(&whole.t()?)?)?;
        let backward = relative(quantized_matmul(&dy, &weight)?, dy.broadcast_matmul(&whole)?)?;
        assert!(forward < 1e-5 && backward < 1e-5, "forward {forward}, backward {backward}");
        Ok(())
    }

    /// The portable graph's (and Metal's) dense weight, every row looked up, is Candle's dequantize bit for bit.
    #[test]
    fn every_row_looked_up_equals_the_dequantized_weight() -> Result<()> {
        let dev = Device::Cpu;
        for qtype in [GgmlDType::Q4K, GgmlDType::Q6K, GgmlDType::Q8_0, GgmlDType::Q4_0] {
            let weight = quantize_rows(&Tensor::randn(0f32, 0.05, (37, 512), &dev)?, qtype, &dev)?;
            let rows: Vec<u32> =
                every_row(&weight)?.flatten_all()?.to_vec1::<f32>()?.iter().map(|v| v.to_bits()).collect();
            let whole = weight.dequantize(&dev)?.flatten_all()?.to_vec1::<f32>()?;
            assert_eq!(rows, whole.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), "{qtype:?}");
        }
        Ok(())
    }

    #[test]
    fn parallel_quantization_writes_candles_blocks() -> Result<()> {
        let dense = Tensor::randn(0f32, 1.0, (37, 512), &Device::Cpu)?;
        for dtype in [GgmlDType::Q4_0, GgmlDType::Q4_1, GgmlDType::Q8_0, GgmlDType::Q4K, GgmlDType::Q6K] {
            let ours = quantize_rows(&dense, dtype, &Device::Cpu)?;
            let candles = QTensor::quantize(&dense, dtype)?;
            assert_eq!(ours.shape(), candles.shape());
            assert!(ours.data()? == candles.data()?, "{dtype:?} blocks differ");
        }
        assert!(
            quantize_rows(&Tensor::zeros((2, 100), DType::F32, &Device::Cpu)?, GgmlDType::Q4K, &Device::Cpu).is_err()
        );
        Ok(())
    }
}
