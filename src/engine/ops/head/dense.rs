//! The language-model head and the cross-entropy loss in one chunked pass, optionally with the gradient for
//! the hidden states.
//!
//! A batch of 512 target tokens over a 49k vocabulary makes 100 MB of logits, and as many again for their
//! gradient; allocations that large bypass the allocator's cache and are page-faulted in fresh every step.
//! Here the logits exist a few rows at a time: each chunk is projected, turned into its loss and its
//! gradient `scale * (softmax - onehot)` in place, and multiplied back by the head into the hidden-state
//! gradient, which is all the backward pass needs (the head is frozen).

use super::row_loss::row_loss_and_grad;
use super::unshifted_bf16::unshifted_bf16;
use crate::engine::ops::cpu::host::f32_of;
use crate::engine::ops::cuda::{availability::available as cuda_available, training as cuda_training};
use crate::engine::ops::frozen_matmul::{frozen_matmul, frozen_matmul_t};
use crate::engine::ops::kernel_choice::{is_cpu_f32, metal_dtypes};
use crate::engine::ops::precision::{filled, upcast};
use crate::engine::ops::scalar::{sum_to_host, Scalar};
use candle_core::{DType, Result, Tensor, D};

/// Loss of one batch's target rows.
pub struct HeadLoss {
    /// Sum over rows of `-log p(target)`: still on the device on CUDA (read it with [`Scalar::value`]).
    pub nll_sum: Scalar,
    /// `grad_scale * d nll_sum / d hidden`, (n, hidden), when a gradient was asked for.
    pub grad_hidden: Option<Tensor>,
}

/// Rows of logits materialised at once on the CPU: 128 x 49k f32 = 25 MB stays below the allocator's mmap cut
/// (32 MB), and BLAS is ~20% faster on 128 rows than on 64.
const CPU_CHUNK_ROWS: usize = 128;
/// Logit elements per chunk elsewhere (fewer, larger kernels on a GPU).
const DEVICE_CHUNK_ELEMS: usize = 1 << 25;
/// On CUDA, where a chunk is the logits in the model's dtype, which their gradient then replaces (256 MiB in bf16:
/// on the lent H100 at the 1B shape, 2^26 was 0.6% slower with twice the buffers, 2^25 3% slower).
const CUDA_CHUNK_ELEMS: usize = 1 << 27;

/// Rows of logits the head loss materialises at once over a vocabulary of `vocab` (the memory estimate's
/// figure too): a fixed row count on the CPU, a fixed element budget elsewhere. Every model goes through the
/// chunks, whatever its vocabulary.
pub fn logits_chunk_rows(vocab: usize, on_cpu: bool) -> usize {
    if on_cpu {
        CPU_CHUNK_ROWS
    } else {
        device_chunk_rows(DEVICE_CHUNK_ELEMS, vocab)
    }
}

/// Rows a GPU product tile spans (cuBLAS's large tiles are 128 or 256 rows tall).
const GPU_TILE_ROWS: usize = 256;

/// Rows of a device chunk of at most `elems` logits: a whole number of [`GPU_TILE_ROWS`] when that many fit, so
/// the head's products over a chunk fill their last row of tiles. (At the 1B shape, 128,256 words, 2^27 elements
/// gave 1,046 rows: four tiles of 256 and a fifth of 22, and the chunk's logits product ran at 674 TFLOP/s on
/// the lent H100 where the last chunk of 957 rows ran at 776.)
fn device_chunk_rows(elems: usize, vocab: usize) -> usize {
    let rows = (elems / vocab.max(1)).max(1);
    if rows >= GPU_TILE_ROWS {
        rows / GPU_TILE_ROWS * GPU_TILE_ROWS
    } else {
        rows
    }
}

/// Negative log-likelihood of `targets[i]` after `hidden[i]` (n, h) through the frozen head (vocab, h), and
/// with `grad_scale` the gradient of `grad_scale * nll_sum` with respect to `hidden`.
pub fn head_nll(hidden: &Tensor, head: &Tensor, targets: &[u32], grad_scale: Option<f64>) -> Result<HeadLoss> {
    head_nll_rows(hidden, head, targets, grad_scale, None)
}

/// `-log p(targets[i] | hidden[i])` for every row, through the same chunks as [`head_nll`] (no logits
/// tensor of all rows): what scoring reports.
pub fn head_token_nll(hidden: &Tensor, head: &Tensor, targets: &[u32]) -> Result<Vec<f64>> {
    let mut rows = Vec::with_capacity(targets.len());
    head_nll_rows(hidden, head, targets, None, Some(&mut rows))?;
    Ok(rows)
}

/// [`head_nll`], also pushing each row's NLL onto `row_nll` when given (a preference loss weighs each token by
/// a function of all of them).
pub fn head_nll_rows(
    hidden: &Tensor,
    head: &Tensor,
    targets: &[u32],
    grad_scale: Option<f64>,
    row_nll: Option<&mut Vec<f64>>,
) -> Result<HeadLoss> {
    metal_dtypes("head_nll", &[hidden, head])?;
    let (n, _) = hidden.dims2()?;
    let (vocab, _) = head.dims2()?;
    if n != targets.len() {
        candle_core::bail!("head loss: {n} rows but {} targets", targets.len());
    }
    if let Some(&bad) = targets.iter().find(|&&t| t as usize >= vocab) {
        candle_core::bail!("head loss: target id {bad} is outside the vocabulary of {vocab}");
    }
    if crate::engine::ops::metal::takes(&[hidden, head]) && crate::engine::ops::metal::row_fits(head.dtype(), vocab) {
        return head_nll_wgsl(hidden, head, targets, grad_scale, row_nll);
    }
    if is_cpu_f32(hidden) && is_cpu_f32(head) && crate::engine::blas::available() {
        return head_nll_cpu(hidden, head, targets, grad_scale, row_nll);
    }
    if cuda_available(hidden.device(), hidden.dtype()) && head.dtype() == hidden.dtype() {
        return head_nll_cuda(hidden, head, targets, grad_scale, row_nll);
    }
    let chunk_rows = logits_chunk_rows(vocab, hidden.device().is_cpu());
    head_nll_composed(hidden, head, targets, grad_scale, row_nll, chunk_rows)
}

/// The two products by a frozen head (vocab, hidden) that the chunked loss takes: a dense head's, or a quantized
/// head's a block of vocabulary rows at a time (the quantized head's loss, beside this file).
pub(super) trait HeadProducts {
    /// The logits `x head^T`, (rows, vocab) contiguous in `x`'s dtype.
    fn logits(&self, x: &Tensor) -> Result<Tensor>;
    /// The input gradient `dlogits head`, (rows, hidden) in `dlogits`' dtype.
    fn input_grad(&self, dlogits: &Tensor) -> Result<Tensor>;
}

impl HeadProducts for Tensor {
    fn logits(&self, x: &Tensor) -> Result<Tensor> {
        frozen_matmul_t(x, self)
    }

    fn input_grad(&self, dlogits: &Tensor) -> Result<Tensor> {
        frozen_matmul(dlogits, self)
    }
}

/// Rows of one chunk of [`head_nll_cuda`]'s logits over a vocabulary of `vocab`.
pub(super) fn cuda_chunk_rows(vocab: usize) -> usize {
    device_chunk_rows(CUDA_CHUNK_ELEMS, vocab)
}

/// On CUDA: each chunk's logits stay in the model's dtype and one kernel per chunk turns them into the rows'
/// losses and their gradient (cuda/training.rs), where the composed path makes an f32 copy and about ten passes.
/// Its chunks hold four times the composed path's elements: a chunk is the logits in the model's dtype, which their
/// gradient replaces. The loss stays on the device ([`Scalar::Device`]): the step reads it once, at its end.
fn head_nll_cuda(
    hidden: &Tensor,
    head: &Tensor,
    targets: &[u32],
    grad_scale: Option<f64>,
    row_nll: Option<&mut Vec<f64>>,
) -> Result<HeadLoss> {
    head_nll_cuda_with(hidden, head, head.dim(0)?, targets, grad_scale, row_nll)
}

/// [`head_nll_cuda`] through `products` of a head of `vocab` rows.
pub(super) fn head_nll_cuda_with(
    hidden: &Tensor,
    products: &dyn HeadProducts,
    vocab: usize,
    targets: &[u32],
    grad_scale: Option<f64>,
    row_nll: Option<&mut Vec<f64>>,
) -> Result<HeadLoss> {
    let chunk_rows = cuda_chunk_rows(vocab);
    let targets = Tensor::from_slice(targets, hidden.dim(0)?, hidden.device())?;
    let (nll_parts, grad_hidden) =
        head_nll_chunks(hidden, products, grad_scale, row_nll, chunk_rows, |logits, start, rows| {
            cuda_training::cross_entropy_rows(logits, &targets.narrow(0, start, rows)?, grad_scale)
        })?;
    Ok(HeadLoss { nll_sum: Scalar::device_sum(&nll_parts)?, grad_hidden })
}

/// The chunk loop of the heads whose loss is one kernel: each chunk of `chunk_rows` rows' logits, in the model's
/// dtype, goes to `loss_kernel` (with the chunk's first row and row count), which returns the rows' NLLs and, with a
/// gradient scale, the logits' gradient. Returns each chunk's NLL sum and the hidden states' gradient.
fn head_nll_chunks(
    hidden: &Tensor,
    head: &dyn HeadProducts,
    grad_scale: Option<f64>,
    mut row_nll: Option<&mut Vec<f64>>,
    chunk_rows: usize,
    mut loss_kernel: impl FnMut(Tensor, usize, usize) -> Result<(Tensor, Option<Tensor>)>,
) -> Result<(Vec<Tensor>, Option<Tensor>)> {
    let n = hidden.dim(0)?;
    let (mut nll_parts, mut grads) = (Vec::new(), Vec::new());
    for start in (0..n).step_by(chunk_rows) {
        let rows = chunk_rows.min(n - start);
        let logits = head.logits(&hidden.narrow(0, start, rows)?)?;
        let (nll, dlogits) = loss_kernel(logits, start, rows)?;
        if let Some(out) = row_nll.as_deref_mut() {
            out.extend(nll.to_dtype(candle_core::DType::F32)?.to_vec1::<f32>()?.into_iter().map(f64::from));
        }
        nll_parts.push(nll.sum_all()?);
        if let Some(dlogits) = dlogits {
            grads.push(head.input_grad(&dlogits)?);
        }
    }
    let grad_hidden = if grad_scale.is_some() { Some(Tensor::cat(&grads, 0)?) } else { None };
    Ok((nll_parts, grad_hidden))
}

fn head_nll_cpu(
    hidden: &Tensor,
    head: &Tensor,
    targets: &[u32],
    grad_scale: Option<f64>,
    mut row_nll: Option<&mut Vec<f64>>,
) -> Result<HeadLoss> {
    let (n, h) = hidden.dims2()?;
    let (vocab, _) = head.dims2()?;
    let (x, w) = (f32_of(hidden)?, f32_of(head)?);
    let (x, w): (&[f32], &[f32]) = (&x, &w);
    let mut logits = vec![0f32; CPU_CHUNK_ROWS.min(n) * vocab];
    let mut grad = grad_scale.map(|_| vec![0f32; n * h]);
    let scale = grad_scale.unwrap_or(0.0) as f32;
    let mut nll_sum = 0f64;
    for start in (0..n).step_by(CPU_CHUNK_ROWS) {
        let rows = CPU_CHUNK_ROWS.min(n - start);
        let chunk = &mut logits[..rows * vocab];
        if !crate::engine::blas::sgemm(&x[start * h..(start + rows) * h], w, chunk, rows, vocab, h, true) {
            candle_core::bail!("head loss: BLAS multiply failed");
        }
        let with_grad = grad.is_some();
        let row_nll_chunk = crate::engine::cpu_pool::map_chunks(chunk, vocab, |row, logits| {
            row_loss_and_grad(logits, targets[start + row] as usize, with_grad.then_some(scale))
        });
        nll_sum += row_nll_chunk.iter().sum::<f64>();
        if let Some(out) = row_nll.as_deref_mut() {
            out.extend_from_slice(&row_nll_chunk);
        }
        if let Some(grad) = grad.as_mut() {
            let dst = &mut grad[start * h..(start + rows) * h];
            if !crate::engine::blas::sgemm(chunk, w, dst, rows, h, vocab, false) {
                candle_core::bail!("head loss: BLAS multiply failed");
            }
        }
    }
    let grad_hidden = grad.map(|g| Tensor::from_vec(g, (n, h), hidden.device())).transpose()?;
    Ok(HeadLoss { nll_sum: Scalar::Host(nll_sum), grad_hidden })
}

/// Under `--kernels wgsl` (a Mac through Metal; the CPU through Vulkan): each chunk's logits go through our WGSL
/// cross-entropy kernel (`metal::cross_entropy`: the rows' losses and the logits' gradient in one launch), where the
/// composed path makes an f32 copy and about ten passes over it.
fn head_nll_wgsl(
    hidden: &Tensor,
    head: &Tensor,
    targets: &[u32],
    grad_scale: Option<f64>,
    row_nll: Option<&mut Vec<f64>>,
) -> Result<HeadLoss> {
    let chunk_rows = logits_chunk_rows(head.dim(0)?, false);
    let ids = Tensor::from_vec(targets.iter().map(|&t| t as i32).collect(), targets.len(), hidden.device())?;
    let scale = grad_scale.unwrap_or(0.0) as f32;
    let (nll_parts, grad_hidden) =
        head_nll_chunks(hidden, head, grad_scale, row_nll, chunk_rows, |logits, start, rows| {
            let (nll, dlogits) =
                crate::engine::ops::metal::cross_entropy(&logits, &ids.narrow(0, start, rows)?, scale)?;
            Ok((nll, grad_scale.map(|_| dlogits)))
        })?;
    Ok(HeadLoss { nll_sum: Scalar::Host(sum_to_host(&nll_parts)?), grad_hidden })
}

/// The composed head and loss (Metal, the portable graph, half precision on the CPU): first without shifting the
/// logits by their row maxima ([`Shift::None`], two fewer passes over every chunk of logits; bf16 chunks without an
/// f32 copy, `unshifted_bf16.rs`), and again shifted when
/// a row's log-sum-exp left [`UNSHIFTED_LSE`]. Rows' NLLs for the caller (scoring) come from the shifted
/// pass alone, which never has to be undone.
fn head_nll_composed(
    hidden: &Tensor,
    head: &Tensor,
    targets: &[u32],
    grad_scale: Option<f64>,
    row_nll: Option<&mut Vec<f64>>,
    chunk_rows: usize,
) -> Result<HeadLoss> {
    if row_nll.is_none() {
        if let Some(loss) = composed_pass(hidden, head, targets, grad_scale, None, chunk_rows, Shift::None)? {
            return Ok(loss);
        }
    }
    let loss = composed_pass(hidden, head, targets, grad_scale, row_nll, chunk_rows, Shift::RowMax)?;
    loss.ok_or_else(|| candle_core::Error::Msg("head loss: the shifted pass gave no loss".into()))
}

/// How the composed pass forms its exponentials.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Shift {
    /// `exp(x)`: no row maximum, no broadcast subtraction over the chunk. As exact as the shifted pass where no
    /// row's log-sum-exp leaves [`UNSHIFTED_LSE`]; the pass answers None (and is done again shifted) where one does.
    None,
    /// `exp(x - max)`, the row maximum subtracted first: any logits.
    RowMax,
}

/// The rows' log-sum-exp the unshifted pass keeps, ln(1e-20) to ln(1e30): with a row sum of `exp(x)` below 1e30
/// every exponential, and the gradient product's sums of them times the head, are far inside f32 (and bf16) range;
/// above 1e-20 the row's largest logit is above ln(1e-20 / 2^18), about -58, so the exponentials that underflow
/// (logits below about -87) are below e^-29 of it, as the shifted pass loses those more than 87 below its maximum.
const UNSHIFTED_LSE: (f32, f32) = (-46.0, 69.0);

/// One composed pass over the chunks (see [`head_nll_composed`]); None when [`Shift::None`] met a row whose
/// log-sum-exp left [`UNSHIFTED_LSE`].
fn composed_pass(
    hidden: &Tensor,
    head: &Tensor,
    targets: &[u32],
    grad_scale: Option<f64>,
    mut row_nll: Option<&mut Vec<f64>>,
    chunk_rows: usize,
    shift: Shift,
) -> Result<Option<HeadLoss>> {
    let n = hidden.dim(0)?;
    let device = hidden.device();
    let (mut nll_parts, mut grads, mut unshifted_lse) = (Vec::new(), Vec::new(), Vec::new());
    for start in (0..n).step_by(chunk_rows) {
        let rows = chunk_rows.min(n - start);
        let logits = head.logits(&hidden.narrow(0, start, rows)?)?;
        let index = Tensor::from_slice(&targets[start..start + rows], (rows, 1), device)?;
        if shift == Shift::None && logits.dtype() == DType::BF16 {
            let chunk = unshifted_bf16(&logits, &index)?;
            unshifted_lse.push(chunk.lse);
            nll_parts.push(chunk.nll.sum_all()?);
            if let Some(scale) = grad_scale {
                grads.push(divided_by_sums(&chunk.scaled_grad, &chunk.sum, head, scale, hidden.dtype())?);
            }
            continue;
        }
        let logits = upcast(&logits)?;
        // The log-sum-exp through the exponentials e and their row sum s. Not Candle's fused softmax: it gives each
        // row one thread block, 3.6 ms a 256-row chunk of a 128k vocabulary on an H200.
        let max = match shift {
            Shift::None => None,
            Shift::RowMax => Some(logits.max_keepdim(D::Minus1)?),
        };
        let exp = match &max {
            Some(max) => logits.broadcast_sub(max)?.exp()?,
            None => logits.exp()?,
        };
        let sum = exp.sum_keepdim(D::Minus1)?;
        let lse = match max {
            Some(max) => (sum.log()? + max)?,
            None => {
                let lse = sum.log()?;
                unshifted_lse.push(lse.clone());
                lse
            }
        };
        let nll = (&lse - logits.gather(&index, 1)?)?;
        if let Some(out) = row_nll.as_deref_mut() {
            out.extend(
                nll.flatten_all()?.to_dtype(candle_core::DType::F32)?.to_vec1::<f32>()?.iter().map(|&v| v as f64),
            );
        }
        nll_parts.push(nll.sum_all()?);
        if let Some(scale) = grad_scale {
            grads.push(head_gradient(exp, &sum, &index, head, scale, hidden.dtype())?);
        }
    }
    if !unshifted_lse.is_empty() {
        // Read once, after every chunk is queued: the loss is read here too.
        let lse = Tensor::cat(&unshifted_lse, 0)?;
        let bounds = Tensor::stack(&[lse.min_all()?, lse.max_all()?], 0)?.to_dtype(DType::F32)?.to_vec1::<f32>()?;
        if !(bounds[0] >= UNSHIFTED_LSE.0 && bounds[1] <= UNSHIFTED_LSE.1) {
            return Ok(None);
        }
    }
    let grad_hidden = if grad_scale.is_some() { Some(Tensor::cat(&grads, 0)?) } else { None };
    Ok(Some(HeadLoss { nll_sum: Scalar::Host(sum_to_host(&nll_parts)?), grad_hidden }))
}

/// `scale * (softmax - onehot) W` for one f32 chunk (f32 and f16 logits, and any shifted) from its exponentials
/// `exp` (rows, vocab) in f32 and their row sums `sum` (rows, 1): `e - s onehot` in place, in f32 (so a confident
/// target's `p - 1` keeps its digits), then the product, and the division by `s` with the scale on the (rows,
/// hidden) result, not over the vocabulary.
/// f16 cannot hold `s` (up to the vocabulary's size): there the probabilities are formed first.
fn head_gradient(exp: Tensor, sum: &Tensor, index: &Tensor, head: &Tensor, scale: f64, dtype: DType) -> Result<Tensor> {
    if dtype == DType::F16 {
        let probs = exp.broadcast_div(sum)?;
        probs.scatter_add_set(index, &filled(-1.0, sum.shape(), probs.dtype(), probs.device())?, 1)?;
        return frozen_matmul(&probs.to_dtype(dtype)?, head)? * scale;
    }
    exp.scatter_add_set(index, &sum.neg()?, 1)?;
    divided_by_sums(&exp, sum, head, scale, dtype)
}

/// `scale * (g W) / s` for a chunk's loss gradient times its row sums, `g` (rows, vocab), and the sums `s` (rows, 1)
/// in f32: the product in `dtype`, the division and the scale on the (rows, hidden) result, not over the vocabulary.
fn divided_by_sums(g: &Tensor, sum: &Tensor, head: &Tensor, scale: f64, dtype: DType) -> Result<Tensor> {
    let per_row = (sum.recip()? * scale)?.to_dtype(dtype)?;
    frozen_matmul(&g.to_dtype(dtype)?, head)?.broadcast_mul(&per_row)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::ops::kernel_tests::max_diff;
    use candle_core::{DType, Device};

    /// Device chunks are whole rows of product tiles when at least one tile's rows fit, and never exceed their
    /// element budget.
    #[test]
    fn device_chunks_fill_their_last_row_of_tiles() {
        assert_eq!(device_chunk_rows(1 << 27, 128_256), 1024); // 1,046 fit
        assert_eq!(device_chunk_rows(1 << 27, 49_152), 2560); // 2,730 fit
        assert_eq!(device_chunk_rows(1 << 25, 151_936), 220); // under a tile: as many as fit
        assert_eq!(device_chunk_rows(1 << 20, 1 << 24), 1);
        for vocab in [32_000, 49_152, 128_256, 151_936, 256_000] {
            let rows = device_chunk_rows(1 << 27, vocab);
            assert!(rows * vocab <= 1 << 27 && rows.is_multiple_of(GPU_TILE_ROWS), "{vocab}: {rows} rows");
        }
    }

    /// A target whose probability underflows f32 still gets its whole loss: the composed path's log-sum-exp is
    /// the row's maximum plus the log of its shifted sum, never a log of the target's probability.
    #[test]
    fn composed_loss_of_an_underflowing_target_is_whole() {
        let dev = Device::Cpu;
        let hidden = Tensor::new(&[[1f32]], &dev).unwrap();
        let head = Tensor::new(&[[0f32], [100.0], [-150.0]], &dev).unwrap();
        let mut rows = Vec::new();
        let loss = head_nll_composed(&hidden, &head, &[2], Some(1.0), Some(&mut rows), 1).unwrap();
        assert!((rows[0] - 250.0).abs() < 1e-3, "{rows:?}");
        // d/dh = sum_j (p_j - onehot_j) w_j = 100 - (-150) = 250.
        let grad: Vec<f32> = loss.grad_hidden.unwrap().flatten_all().unwrap().to_vec1().unwrap();
        assert!((grad[0] - 250.0).abs() < 1e-3, "{grad:?}");
    }

    /// The unshifted pass gives the shifted pass's losses and gradients (f32, to a few ulps), in one chunk and in
    /// several.
    #[test]
    fn the_unshifted_pass_matches_the_shifted_one() {
        let dev = Device::Cpu;
        let hidden = (Tensor::randn(0f32, 1.0, (50, 16), &dev).unwrap() * 3.0).unwrap();
        let head = Tensor::randn(0f32, 1.0, (41, 16), &dev).unwrap();
        let targets: Vec<u32> = (0..50).map(|i| (i * 7 % 41) as u32).collect();
        for chunk_rows in [50, 8] {
            let pass = |shift| composed_pass(&hidden, &head, &targets, Some(0.5), None, chunk_rows, shift).unwrap();
            let (ours, shifted) = (pass(Shift::None).expect("in range"), pass(Shift::RowMax).unwrap());
            let (a, b) = (ours.nll_sum.value().unwrap(), shifted.nll_sum.value().unwrap());
            assert!((a - b).abs() <= 1e-5 * b.abs(), "{chunk_rows} rows a chunk: loss {a} against {b}");
            let (ga, gb) = (ours.grad_hidden.unwrap(), shifted.grad_hidden.unwrap());
            let largest = max_diff(&gb, &gb.zeros_like().unwrap());
            assert!(max_diff(&ga, &gb) <= 1e-5 * largest, "{chunk_rows} rows a chunk: gradient");
        }
    }

    /// Rows whose exponentials would overflow or all but vanish unshifted send the loss through the shifted pass,
    /// with the same result as a log-softmax in f64.
    #[test]
    fn logits_out_of_the_unshifted_range_are_shifted() {
        let dev = Device::Cpu;
        for (logits, target) in [([90f32, 80.0, -3.0], 1u32), ([-70.0, -72.0, -90.0], 2)] {
            let hidden = Tensor::new(&[[1f32]], &dev).unwrap();
            let head = Tensor::new(&[[logits[0]], [logits[1]], [logits[2]]], &dev).unwrap();
            let unshifted = composed_pass(&hidden, &head, &[target], Some(1.0), None, 1, Shift::None).unwrap();
            assert!(unshifted.is_none(), "{logits:?}: the unshifted pass kept a log-sum-exp out of range");
            let loss = head_nll_composed(&hidden, &head, &[target], Some(1.0), None, 1).unwrap();
            let max = logits.iter().fold(f64::MIN, |m, &v| m.max(v as f64));
            let lse = max + logits.iter().map(|&v| (v as f64 - max).exp()).sum::<f64>().ln();
            let want = lse - logits[target as usize] as f64;
            let got = loss.nll_sum.value().unwrap();
            assert!((got - want).abs() <= 1e-4 * want.abs().max(1.0), "{logits:?}: {got} against {want}");
        }
    }

    /// In bf16 (the division after the product) and f16 (the probabilities first) the composed gradient is the
    /// f32 one to within a few of the dtype's roundings of its largest value.
    #[test]
    fn composed_half_precision_gradients_match_f32() {
        let dev = Device::Cpu;
        let hidden = Tensor::randn(0f32, 1.0, (40, 16), &dev).unwrap();
        let head = Tensor::randn(0f32, 1.0, (37, 16), &dev).unwrap();
        let targets: Vec<u32> = (0..40).map(|i| (i * 5 % 37) as u32).collect();
        let want = head_nll_composed(&hidden, &head, &targets, Some(0.25), None, 7).unwrap().grad_hidden.unwrap();
        let largest = max_diff(&want, &want.zeros_like().unwrap());
        for (dtype, ulp) in [(DType::BF16, 1.0 / 128.0), (DType::F16, 1.0 / 1024.0)] {
            let (h, w) = (hidden.to_dtype(dtype).unwrap(), head.to_dtype(dtype).unwrap());
            let got = head_nll_composed(&h, &w, &targets, Some(0.25), None, 7).unwrap().grad_hidden.unwrap();
            let diff = max_diff(&got, &want);
            // The inputs' own rounding moves the logits by up to ~16 ulps of their size: the bound is generous
            // in ulps but far below the gradient's own size.
            assert!(diff <= 16.0 * ulp * largest, "{dtype:?}: off by {diff} (largest {largest})");
        }
    }

    /// The CPU chunked path and the composed (GPU) path agree with a log-softmax computed whole.
    #[test]
    fn chunked_head_loss_matches_a_whole_log_softmax() {
        let dev = Device::Cpu;
        let hidden = Tensor::randn(0f32, 1.0, (300, 16), &dev).unwrap();
        let head = Tensor::randn(0f32, 1.0, (37, 16), &dev).unwrap();
        let targets: Vec<u32> = (0..300).map(|i| (i * 7 % 37) as u32).collect();
        let logits = hidden.matmul(&head.t().unwrap()).unwrap();
        let log_probs = candle_nn::ops::log_softmax(&logits, D::Minus1).unwrap();
        let index = Tensor::from_slice(&targets, (300, 1), &dev).unwrap();
        let expected: f32 = log_probs.gather(&index, 1).unwrap().sum_all().unwrap().neg().unwrap().to_scalar().unwrap();
        // The composed path in chunks of 7 rows and in one chunk: every row goes through a chunk either way.
        for loss in [
            head_nll(&hidden, &head, &targets, Some(0.5)).unwrap(),
            head_nll_composed(&hidden, &head, &targets, Some(0.5), None, 7).unwrap(),
            head_nll_composed(&hidden, &head, &targets, Some(0.5), None, 300).unwrap(),
        ] {
            let nll = loss.nll_sum.value().unwrap();
            assert!((nll - expected as f64).abs() < 1e-3, "{nll} vs {expected}");
            // d/dh of 0.5 * nll = 0.5 * (softmax - onehot) W.
            let onehot = Tensor::zeros((300, 37), DType::F32, &dev)
                .unwrap()
                .scatter_add(&index, &Tensor::ones((300, 1), DType::F32, &dev).unwrap(), 1)
                .unwrap();
            let probs = candle_nn::ops::softmax_last_dim(&logits).unwrap();
            let expected_grad = ((probs - onehot).unwrap() * 0.5).unwrap().matmul(&head).unwrap();
            let diff = max_diff(&loss.grad_hidden.unwrap(), &expected_grad);
            assert!(diff < 1e-5, "gradient differs by {diff}");
        }
        // Per-row NLL (scoring): both paths, chunked, equal the whole log-softmax row by row.
        let expected_rows: Vec<f32> =
            log_probs.gather(&index, 1).unwrap().squeeze(1).unwrap().neg().unwrap().to_vec1().unwrap();
        let mut composed = Vec::new();
        head_nll_composed(&hidden, &head, &targets, None, Some(&mut composed), 7).unwrap();
        for rows in [head_token_nll(&hidden, &head, &targets).unwrap(), composed] {
            assert_eq!(rows.len(), 300);
            let worst = rows.iter().zip(&expected_rows).map(|(a, b)| (a - *b as f64).abs()).fold(0.0, f64::max);
            assert!(worst < 1e-5, "per-row nll differs by {worst}");
        }
    }
}
