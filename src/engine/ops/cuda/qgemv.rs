//! Single-row products against GGML-quantized frozen weights on CUDA (cuda/qgemv.cuh), for decoding with a
//! quantized base: `y = x W^T` for one row `x` of f32 or bf16 and `W` in Q4_K, Q6_K or Q8_0 blocks, one launch
//! that reads the blocks as they are. Several weights with the same row length multiply as one: their rows are
//! taken end to end (attention's q|k|v, the MLP's gate|up, a vocabulary's blocks of rows), so a decoder layer's
//! quantized products are as few launches as its dense ones.
//!
//! With bf16 activations, Q4_K weights go through the tensor cores (qgemv_mma.cuh, [`mma_takes`]) unless
//! `--no-q4k-tensor-cores`; the rest through the FMA units (qgemv.cuh).
//!
//! Candle's path for the same product is four launches (widen to f32, quantize the row to 8 bits, its kernel,
//! narrow back) per weight, and it rounds the activations to 8 bits; this one keeps them as they are, so the
//! result equals the dequantized weight's product up to the order of the f32 sums.
//!
//! Also [`rows`], the same weights' rows dequantized for ids read on the device: the embedding lookup of a
//! quantized vocabulary without reading the token back to the host, which a captured decode step needs.
//!
//! Taken under the native kernel set when `--no-gemv` is not given; built with the `cuda` feature only.

use crate::engine::ops::cuda::launch::{load, on_cuda, output, view, wrap};
use candle_core::cuda_backend::cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::{CudaDType, WrapErr};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Result, Tensor};

/// QSEG_MAX of qgemv.cuh: weights per launch.
pub const MAX_SEGMENTS: usize = 48;
/// QG_WARPS of qgemv.cuh and QMMA_WARPS of qgemv_mma.cuh: warps per block of the product.
const WARPS: usize = 4;

/// How a product of `n` rows is spread over warps: (rows a group of warps takes, warps in the group), the
/// kernels' ROWS and SPLIT. Measured on an H200, q4k decode, 256 tokens (`scripts/gpu_qgemv_rows.sh`, one call):
/// - from 16,384 rows (the MLP's gate|up, a vocabulary) four rows to a warp, which walks them alone: the input a
///   lane loads serves four rows, and there are warps enough. Splitting them too cost 5% at 8B and 15% at 1B.
/// - from 4,096 rows (an 8B layer's q|k|v, o and down) two rows to a group of the block's four warps, which split
///   the rows' blocks between them: four times the loads in flight. 8B 268.7 -> 274.5 tok/s (bf16 210.2).
/// - fewer rows (a 1B model's) one row to a warp: splitting them cost 4% (1,051 -> 1,014 tok/s).
fn launch_shape(n: usize) -> (usize, usize) {
    match n {
        16384.. => (4, 1),
        4096.. => (2, WARPS),
        _ => (1, 1),
    }
}

/// qgemv.cuh's QSegments: the weights' device addresses and the row each starts at.
#[repr(C)]
#[derive(Clone, Copy)]
struct Segments {
    w: [u64; MAX_SEGMENTS],
    first: [i32; MAX_SEGMENTS + 1],
    count: i32,
}

// SAFETY: a plain-old-data struct laid out as the kernels' C struct.
unsafe impl DeviceRepr for Segments {}

/// The kernel name part of a block type the kernels read (also dequantize.cuh's, which shares their block readers).
pub(super) fn type_name(t: GgmlDType) -> Option<&'static str> {
    match t {
        GgmlDType::Q4K => Some("q4k"),
        GgmlDType::Q6K => Some("q6k"),
        GgmlDType::Q8_0 => Some("q8_0"),
        _ => None,
    }
}

/// Whether the kernels read `weights` on `device` with activations of `dtype`: a block type they know, shared by
/// all, rows of one length that fill whole blocks, at most [`MAX_SEGMENTS`] weights on this CUDA device, under
/// 2^31 rows, f32 or bf16, and `--no-gemv` not given.
pub fn takes(weights: &[&QTensor], device: &candle_core::Device, dtype: DType) -> bool {
    let Some(first) = weights.first() else { return false };
    let (qtype, k) = (first.dtype(), first.shape().dims().last().copied().unwrap_or(0));
    let rows: usize = weights.iter().filter_map(|w| w.shape().dims2().ok()).map(|(n, _)| n).sum();
    type_name(qtype).is_some()
        && k > 0
        && k.is_multiple_of(qtype.block_size())
        && weights.len() <= MAX_SEGMENTS
        && weights.iter().all(|w| {
            w.dtype() == qtype && w.shape().dims2().is_ok_and(|(_, wk)| wk == k) && w.device().same_device(device)
        })
        && rows < i32::MAX as usize
        && crate::engine::ops::cuda::availability::available(device, dtype)
        && crate::engine::runtime::options().gemv
}

fn segments(weights: &[&QTensor]) -> Result<(Segments, usize)> {
    let mut s = Segments { w: [0; MAX_SEGMENTS], first: [0; MAX_SEGMENTS + 1], count: weights.len() as i32 };
    let mut row = 0usize;
    for (i, w) in weights.iter().enumerate() {
        s.w[i] = w.device_ptr()? as u64;
        s.first[i] = row as i32;
        row += w.shape().dims2()?.0;
    }
    s.first[weights.len()] = row as i32;
    Ok((s, row))
}

/// `x W^T` for the single row `x` (1, k) and `W` the rows of `weights` end to end: (1, rows), in `x`'s dtype;
/// None where the kernels do not take them ([`takes`], and `x` a 16-byte aligned contiguous row of k values).
/// Q4_K in bf16 goes through the tensor cores when `tensor_cores` (the runtime option `q4k_tensor_cores`).
pub fn gemv(x: &Tensor, weights: &[&QTensor], tensor_cores: bool) -> Result<Option<Tensor>> {
    if !takes(weights, x.device(), x.dtype()) {
        return Ok(None);
    }
    let k = weights[0].shape().dims2()?.1;
    let layout = x.layout();
    let aligned = layout.is_contiguous() && (layout.start_offset() * x.dtype().size_in_bytes()).is_multiple_of(16);
    if x.elem_count() != k || !aligned {
        return Ok(None);
    }
    Ok(Some(match x.dtype() {
        DType::F32 => gemv_as::<f32>(x, weights, "f32", false)?,
        _ => gemv_as::<half::bf16>(x, weights, "bf16", tensor_cores)?,
    }))
}

/// The dynamic shared memory of the tensor-core Q4_K kernel (qgemv_mma.cuh) for rows of `k`: x staged as pairs, the
/// sub-blocks' sums and 16 zero words.
fn mma_shared_bytes(k: usize) -> usize {
    (k / 2 + k / 32 + 16) * 4
}

/// Whether a product of bf16 `x` and Q4_K weights of rows of `k` can run on the tensor cores (qgemv_mma.cuh, about
/// two instructions a weight where the FMA kernel spends five): its staged x fits the 48 KiB of shared memory a
/// block gets without asking (k up to 22,784: every layer of the published models to 8B, whose widest is 14,336).
fn mma_takes(qtype: GgmlDType, dtype: DType, k: usize) -> bool {
    qtype == GgmlDType::Q4K && dtype == DType::BF16 && mma_shared_bytes(k) <= 48 * 1024
}

/// The tensor-core kernel's (split, rows a block takes): from 16,384 rows each warp takes 16 rows alone (64 a
/// block), fewer rows split each 16 over the block's four warps (`launch_shape`'s reasons).
fn mma_launch_shape(n: usize) -> (usize, usize) {
    if n >= 16384 {
        (1, 16 * WARPS)
    } else {
        (WARPS, 16)
    }
}

fn gemv_as<T: CudaDType + DeviceRepr>(
    x: &Tensor,
    weights: &[&QTensor],
    suffix: &str,
    tensor_cores: bool,
) -> Result<Tensor> {
    let (segs, n) = segments(weights)?;
    let k = x.elem_count();
    let (storage, layout) = x.storage_and_layout();
    let dev = x.device().as_cuda_device()?.clone();
    let kind = type_name(weights[0].dtype()).expect("takes checked the type");
    let (name, grid, shared) = if tensor_cores && mma_takes(weights[0].dtype(), x.dtype(), k) {
        let (split, block_rows) = mma_launch_shape(n);
        (format!("qgemv_q4k_mma_s{split}_bf16"), n.div_ceil(block_rows), mma_shared_bytes(k))
    } else {
        let (rows, split) = launch_shape(n);
        (format!("qgemv_{kind}_r{rows}_s{split}_{suffix}"), n.div_ceil(rows * WARPS / split), 0)
    };
    let f = load!(&dev, &name)?;
    let xv = view::<T>(on_cuda(&storage, "the quantized product's input")?, layout, "the quantized product's input")?;
    let out = output::<T>(&dev, n)?;
    let mut b = f.builder();
    b.arg(&xv);
    b.arg(&segs);
    b.arg(&out);
    candle_core::builder_arg!(b, n as i32, k as i32);
    let cfg = LaunchConfig {
        grid_dim: (grid as u32, 1, 1),
        block_dim: (32 * WARPS as u32, 1, 1),
        shared_mem_bytes: shared as u32,
    };
    // SAFETY: arguments match the kernel's signature; `takes` checked types and row lengths; the weights'
    // addresses stay valid while they live, which outlasts this launch on the stream.
    unsafe { b.launch(cfg) }.w()?;
    Ok(wrap(out, &dev, (1, n)))
}

/// Rows `ids` (m, u32 on the device) of the rows of `weights` end to end, dequantized into (m, k) of `dtype`
/// (f32 or bf16). An id past the rows gives zeros: the kernel cannot fail, so callers that can read ids check
/// them first. Callers check [`takes`].
pub fn rows(weights: &[&QTensor], ids: &Tensor, dtype: DType) -> Result<Tensor> {
    match dtype {
        DType::F32 => rows_as::<f32>(weights, ids, "f32"),
        _ => rows_as::<half::bf16>(weights, ids, "bf16"),
    }
}

fn rows_as<T: CudaDType + DeviceRepr>(weights: &[&QTensor], ids: &Tensor, suffix: &str) -> Result<Tensor> {
    let (segs, _) = segments(weights)?;
    let k = weights[0].shape().dims2()?.1;
    let ids = ids.flatten_all()?.contiguous()?;
    let m = ids.elem_count();
    let (storage, layout) = ids.storage_and_layout();
    let dev = ids.device().as_cuda_device()?.clone();
    let kind = type_name(weights[0].dtype()).expect("takes checked the type");
    let f = load!(&dev, &format!("qrows_{kind}_{suffix}"))?;
    let idv = view::<u32>(on_cuda(&storage, "token ids")?, layout, "token ids")?;
    let out = output::<T>(&dev, m * k)?;
    let mut b = f.builder();
    b.arg(&segs);
    b.arg(&idv);
    b.arg(&out);
    candle_core::builder_arg!(b, k as i32);
    let cfg = LaunchConfig {
        grid_dim: (m.max(1) as u32, k.div_ceil(256).min(64) as u32, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: arguments match the kernel's signature; the output holds m * k elements.
    unsafe { b.launch(cfg) }.w()?;
    Ok(wrap(out, &dev, (m, k)))
}
