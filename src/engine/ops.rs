//! Numeric building blocks of the transformer: RMS norm, rotary embeddings, softmax, SiLU gating.
//!
//! Inference uses Candle's fused kernels. Those have no backward pass (see design.md, "Traps"), so when
//! gradients are needed (`grad == true`) we use versions whose gradients are known to flow.

use candle_core::{DType, Result, Tensor, D};

/// RMS norm over the last dimension, computed in f32, scaled by `weight`.
pub fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64, grad: bool) -> Result<Tensor> {
    if !grad {
        return candle_nn::ops::rms_norm(&x.contiguous()?, weight, eps as f32);
    }
    if is_cpu_f32(x) {
        return x.contiguous()?.apply_op1(RmsNormOp { weight: weight.clone(), eps: eps as f32 });
    }
    let dtype = x.dtype();
    let xf = upcast(x)?;
    let mean_sq = xf.sqr()?.mean_keepdim(D::Minus1)?;
    let normed = xf.broadcast_div(&(mean_sq + eps)?.sqrt()?)?;
    normed.to_dtype(dtype)?.broadcast_mul(weight)
}

/// Rotary embedding, "rotate half" layout as in Hugging Face Llama. `x`: (b, heads, t, head_dim);
/// `cos`/`sin`: (t, head_dim / 2).
pub fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor, grad: bool) -> Result<Tensor> {
    if !grad {
        return candle_nn::rotary_emb::rope(&x.contiguous()?, cos, sin);
    }
    if is_cpu_f32(x) {
        // A rotation's gradient is the inverse rotation: rope with -sin.
        return x.contiguous()?.apply_op1(RopeOp { cos: cos.clone(), sin: sin.clone() });
    }
    let half = x.dim(D::Minus1)? / 2;
    let x1 = x.narrow(D::Minus1, 0, half)?;
    let x2 = x.narrow(D::Minus1, half, half)?;
    let cos = cos.unsqueeze(0)?.unsqueeze(0)?;
    let sin = sin.unsqueeze(0)?.unsqueeze(0)?;
    let out1 = (x1.broadcast_mul(&cos)? - x2.broadcast_mul(&sin)?)?;
    let out2 = (x2.broadcast_mul(&cos)? + x1.broadcast_mul(&sin)?)?;
    Tensor::cat(&[out1, out2], D::Minus1)
}

/// Softmax over the last dimension.
pub fn softmax_last_dim(x: &Tensor, grad: bool) -> Result<Tensor> {
    if !grad {
        return candle_nn::ops::softmax_last_dim(&x.contiguous()?);
    }
    if is_cpu_f32(x) {
        return x.contiguous()?.apply_op1(SoftmaxOp);
    }
    candle_nn::ops::softmax(x, D::Minus1)
}

fn is_cpu_f32(x: &Tensor) -> bool {
    x.device().is_cpu() && x.dtype() == DType::F32
}

/// Contiguous f32 data of a CPU storage.
fn f32_data<'a>(storage: &'a candle_core::CpuStorage, layout: &candle_core::Layout) -> Result<&'a [f32]> {
    let Some((start, end)) = layout.contiguous_offsets() else { candle_core::bail!("expected a contiguous tensor") };
    match storage {
        candle_core::CpuStorage::F32(v) => Ok(&v[start..end]),
        _ => candle_core::bail!("expected f32"),
    }
}

fn f32_of(t: &Tensor) -> Result<Vec<f32>> {
    t.flatten_all()?.to_vec1::<f32>()
}

/// Fused CPU RMS norm whose backward is one fused pass too (the weight is frozen: no gradient for it).
struct RmsNormOp {
    weight: Tensor,
    eps: f32,
}

impl candle_core::CustomOp1 for RmsNormOp {
    fn name(&self) -> &'static str {
        "rms-norm-train"
    }

    fn cpu_fwd(
        &self,
        storage: &candle_core::CpuStorage,
        layout: &candle_core::Layout,
    ) -> Result<(candle_core::CpuStorage, candle_core::Shape)> {
        let x = f32_data(storage, layout)?;
        let w = f32_of(&self.weight)?;
        let d = w.len();
        if d == 0 || x.len() % d != 0 {
            candle_core::bail!("rms norm: input width does not match the weight ({d})");
        }
        let mut out = vec![0f32; x.len()];
        for (row, dst) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
            let mean_sq = row.iter().map(|v| v * v).sum::<f32>() / d as f32;
            let inv = 1.0 / (mean_sq + self.eps).sqrt();
            for ((o, &v), &g) in dst.iter_mut().zip(row).zip(&w) {
                *o = v * inv * g;
            }
        }
        Ok((candle_core::CpuStorage::F32(out), layout.shape().clone()))
    }

    fn bwd(&self, x: &Tensor, _y: &Tensor, grad_y: &Tensor) -> Result<Option<Tensor>> {
        let xs = f32_of(x)?;
        let dy = f32_of(grad_y)?;
        let w = f32_of(&self.weight)?;
        let d = w.len();
        let mut dx = vec![0f32; xs.len()];
        // dx = inv * (dy*w - xhat * mean(dy*w*xhat)), xhat = x * inv.
        for ((row, drow), out) in xs.chunks_exact(d).zip(dy.chunks_exact(d)).zip(dx.chunks_exact_mut(d)) {
            let mean_sq = row.iter().map(|v| v * v).sum::<f32>() / d as f32;
            let inv = 1.0 / (mean_sq + self.eps).sqrt();
            let dot = row.iter().zip(drow).zip(&w).map(|((&v, &g), &wv)| g * wv * v * inv).sum::<f32>() / d as f32;
            for (((o, &v), &g), &wv) in out.iter_mut().zip(row).zip(drow).zip(&w) {
                *o = inv * (g * wv - v * inv * dot);
            }
        }
        Ok(Some(Tensor::from_vec(dx, x.shape(), x.device())?))
    }
}

/// Rope on the CPU with a backward pass (the inverse rotation).
struct RopeOp {
    cos: Tensor,
    sin: Tensor,
}

fn rope_cpu(x: &[f32], dims: &[usize], cos: &[f32], sin: &[f32], sign: f32) -> Vec<f32> {
    let d = dims[dims.len() - 1];
    let t = dims[dims.len() - 2];
    let half = d / 2;
    let mut out = vec![0f32; x.len()];
    for (i, (src, dst)) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)).enumerate() {
        let pos = i % t;
        let (c, s) = (&cos[pos * half..(pos + 1) * half], &sin[pos * half..(pos + 1) * half]);
        for j in 0..half {
            let (x1, x2) = (src[j], src[j + half]);
            let sj = sign * s[j];
            dst[j] = x1 * c[j] - x2 * sj;
            dst[j + half] = x2 * c[j] + x1 * sj;
        }
    }
    out
}

impl candle_core::CustomOp1 for RopeOp {
    fn name(&self) -> &'static str {
        "rope-train"
    }

    fn cpu_fwd(
        &self,
        storage: &candle_core::CpuStorage,
        layout: &candle_core::Layout,
    ) -> Result<(candle_core::CpuStorage, candle_core::Shape)> {
        let x = f32_data(storage, layout)?;
        let dims = layout.shape().dims();
        let out = rope_cpu(x, dims, &f32_of(&self.cos)?, &f32_of(&self.sin)?, 1.0);
        Ok((candle_core::CpuStorage::F32(out), layout.shape().clone()))
    }

    fn bwd(&self, x: &Tensor, _y: &Tensor, grad_y: &Tensor) -> Result<Option<Tensor>> {
        let dy = f32_of(grad_y)?;
        let out = rope_cpu(&dy, x.dims(), &f32_of(&self.cos)?, &f32_of(&self.sin)?, -1.0);
        Ok(Some(Tensor::from_vec(out, x.shape(), x.device())?))
    }
}

/// Softmax over the last dimension on the CPU with a fused backward: dx = y * (dy - sum(dy * y)).
struct SoftmaxOp;

impl candle_core::CustomOp1 for SoftmaxOp {
    fn name(&self) -> &'static str {
        "softmax-train"
    }

    fn cpu_fwd(
        &self,
        storage: &candle_core::CpuStorage,
        layout: &candle_core::Layout,
    ) -> Result<(candle_core::CpuStorage, candle_core::Shape)> {
        let x = f32_data(storage, layout)?;
        let d = layout.shape().dims().last().copied().unwrap_or(1).max(1);
        let mut out = vec![0f32; x.len()];
        for (row, dst) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut sum = 0f32;
            for (o, &v) in dst.iter_mut().zip(row) {
                *o = (v - max).exp();
                sum += *o;
            }
            let inv = 1.0 / sum;
            dst.iter_mut().for_each(|o| *o *= inv);
        }
        Ok((candle_core::CpuStorage::F32(out), layout.shape().clone()))
    }

    fn bwd(&self, x: &Tensor, y: &Tensor, grad_y: &Tensor) -> Result<Option<Tensor>> {
        let ys = f32_of(y)?;
        let dy = f32_of(grad_y)?;
        let d = x.dims().last().copied().unwrap_or(1).max(1);
        let mut dx = vec![0f32; ys.len()];
        for ((yr, gr), out) in ys.chunks_exact(d).zip(dy.chunks_exact(d)).zip(dx.chunks_exact_mut(d)) {
            let dot: f32 = yr.iter().zip(gr).map(|(a, b)| a * b).sum();
            for ((o, &yv), &g) in out.iter_mut().zip(yr).zip(gr) {
                *o = yv * (g - dot);
            }
        }
        Ok(Some(Tensor::from_vec(dx, x.shape(), x.device())?))
    }
}

/// Half-precision tensors converted to f32 for numerically sensitive steps (softmax, loss); f32 and f64 stay.
pub fn upcast(x: &Tensor) -> Result<Tensor> {
    match x.dtype() {
        DType::F16 | DType::BF16 => x.to_dtype(DType::F32),
        _ => Ok(x.clone()),
    }
}

/// SwiGLU gate: silu(gate) * up.
pub fn silu_mul(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    candle_nn::ops::silu(gate)? * up
}

/// `x W^T` for a frozen weight `W` of shape (out, in); `x`: (..., in).
///
/// Candle's matmul backward computes a gradient for both operands, which for a frozen weight is a wasted
/// weight-sized matmul per layer (and, for the tied lm_head, a vocabulary-sized one). This op's backward
/// returns only the input gradient.
pub fn frozen_matmul_t(x: &Tensor, weight: &Tensor) -> Result<Tensor> {
    let dims = x.dims().to_vec();
    let in_features = dims[dims.len() - 1];
    let rows = x.elem_count() / in_features.max(1);
    let x2 = x.reshape((rows, in_features))?;
    let y = x2.contiguous()?.apply_op1(FrozenMatmul { weight: weight.clone(), transposed: true })?;
    let mut out_dims = dims;
    let last = out_dims.len() - 1;
    out_dims[last] = weight.dim(0)?;
    y.reshape(out_dims)
}

/// `x W^T` (or `x W` when `transposed` is false) with the weight held inside the op, so autograd sees
/// only `x`. The backward of the transposed product is the plain one, which itself is never differentiated.
struct FrozenMatmul {
    weight: Tensor,
    transposed: bool,
}

/// Multiply a contiguous f32 CPU input by the held weight through OpenBLAS when it is loaded.
/// Returns None to fall back to Candle's GEMM.
fn blas_frozen_matmul(
    weight: &Tensor,
    storage: &candle_core::CpuStorage,
    layout: &candle_core::Layout,
    weight_transposed: bool,
) -> Option<(candle_core::CpuStorage, candle_core::Shape)> {
    let (rows, k) = layout.shape().dims2().ok()?;
    if rows < crate::engine::blas::MIN_ROWS || !crate::engine::blas::available() {
        return None;
    }
    let (start, end) = layout.contiguous_offsets()?;
    let candle_core::CpuStorage::F32(x) = storage else { return None };
    let (w_storage, w_layout) = weight.storage_and_layout();
    let (w_start, w_end) = w_layout.contiguous_offsets()?;
    let candle_core::Storage::Cpu(candle_core::CpuStorage::F32(w)) = &*w_storage else { return None };
    let (d0, d1) = w_layout.shape().dims2().ok()?;
    let n = if weight_transposed { d0 } else { d1 };
    let w_k = if weight_transposed { d1 } else { d0 };
    if w_k != k {
        return None;
    }
    let mut out = vec![0f32; rows * n];
    if !crate::engine::blas::sgemm(&x[start..end], &w[w_start..w_end], &mut out, rows, n, k, weight_transposed) {
        return None;
    }
    Some((candle_core::CpuStorage::F32(out), (rows, n).into()))
}

/// Token-by-token decoding multiplies one row by every weight matrix: a pass over the weights bound by
/// memory bandwidth, which one core cannot saturate. Split the output rows over a small pool of threads.
fn gemv_frozen(
    weight: &Tensor,
    storage: &candle_core::CpuStorage,
    layout: &candle_core::Layout,
) -> Option<(candle_core::CpuStorage, candle_core::Shape)> {
    use rayon::prelude::*;
    let (rows, k) = layout.shape().dims2().ok()?;
    if rows != 1 || gemv_disabled() {
        return None;
    }
    let pool = gemv_pool()?;
    let (start, end) = layout.contiguous_offsets()?;
    let candle_core::CpuStorage::F32(x) = storage else { return None };
    let x = &x[start..end];
    let (w_storage, w_layout) = weight.storage_and_layout();
    let (w_start, w_end) = w_layout.contiguous_offsets()?;
    let candle_core::Storage::Cpu(candle_core::CpuStorage::F32(w)) = &*w_storage else { return None };
    let w = &w[w_start..w_end];
    let (n, w_k) = w_layout.shape().dims2().ok()?;
    if w_k != k {
        return None;
    }
    let mut out = vec![0f32; n];
    const ROWS_PER_TASK: usize = 64;
    pool.install(|| {
        out.par_chunks_mut(ROWS_PER_TASK).enumerate().for_each(|(chunk, dst)| {
            for (i, o) in dst.iter_mut().enumerate() {
                let row = chunk * ROWS_PER_TASK + i;
                *o = dot(x, &w[row * k..(row + 1) * k]);
            }
        })
    });
    Some((candle_core::CpuStorage::F32(out), (1, n).into()))
}

/// `METAL_CANDLE_NO_GEMV=1` falls back to Candle's GEMM (for A/B measurements).
fn gemv_disabled() -> bool {
    static DISABLED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *DISABLED.get_or_init(|| std::env::var_os("METAL_CANDLE_NO_GEMV").is_some())
}

fn gemv_pool() -> Option<&'static rayon::ThreadPool> {
    static POOL: std::sync::OnceLock<Option<rayon::ThreadPool>> = std::sync::OnceLock::new();
    POOL.get_or_init(|| {
        let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1).min(8);
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("metal-candle-gemv-{i}"))
            .build()
            .ok()
    })
    .as_ref()
}

/// Dot product with independent accumulators so the compiler vectorises it.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 16];
    let (ac, bc) = (a.chunks_exact(16), b.chunks_exact(16));
    let tail: f32 = ac.remainder().iter().zip(bc.remainder()).map(|(x, y)| x * y).sum();
    for (x, y) in ac.zip(bc) {
        for i in 0..16 {
            acc[i] += x[i] * y[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}

impl FrozenMatmul {
    fn check(&self, layout: &candle_core::Layout) -> Result<()> {
        let (_, k) = layout.shape().dims2()?;
        let (d0, d1) = self.weight.dims2()?;
        let k_w = if self.transposed { d1 } else { d0 };
        if k != k_w {
            candle_core::bail!("frozen matmul: input has {k} features, weight expects {k_w}");
        }
        Ok(())
    }
}

/// Candle's matmul of `storage` by the weight (transposed or not) on any backend.
macro_rules! backend_matmul {
    ($self:ident, $storage:ident, $layout:ident, $variant:ident) => {{
        use candle_core::backend::BackendStorage;
        $self.check($layout)?;
        let (rows, k) = $layout.shape().dims2()?;
        let (w_storage, w_layout) = $self.weight.storage_and_layout();
        let (rhs_layout, n) = if $self.transposed {
            (w_layout.transpose(0, 1)?, w_layout.shape().dims2()?.0)
        } else {
            (w_layout.clone(), w_layout.shape().dims2()?.1)
        };
        match &*w_storage {
            candle_core::Storage::$variant(w) => {
                Ok(($storage.matmul(w, (1, rows, n, k), $layout, &rhs_layout)?, (rows, n).into()))
            }
            _ => candle_core::bail!("frozen matmul: weight and input are on different devices"),
        }
    }};
}

impl candle_core::CustomOp1 for FrozenMatmul {
    fn name(&self) -> &'static str {
        "frozen-matmul"
    }

    fn cpu_fwd(
        &self,
        storage: &candle_core::CpuStorage,
        layout: &candle_core::Layout,
    ) -> Result<(candle_core::CpuStorage, candle_core::Shape)> {
        self.check(layout)?;
        if self.transposed {
            if let Some(out) = gemv_frozen(&self.weight, storage, layout) {
                return Ok(out);
            }
        }
        if let Some(out) = blas_frozen_matmul(&self.weight, storage, layout, self.transposed) {
            return Ok(out);
        }
        backend_matmul!(self, storage, layout, Cpu)
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        storage: &candle_core::CudaStorage,
        layout: &candle_core::Layout,
    ) -> Result<(candle_core::CudaStorage, candle_core::Shape)> {
        backend_matmul!(self, storage, layout, Cuda)
    }

    #[cfg(target_os = "macos")]
    fn metal_fwd(
        &self,
        storage: &candle_core::MetalStorage,
        layout: &candle_core::Layout,
    ) -> Result<(candle_core::MetalStorage, candle_core::Shape)> {
        backend_matmul!(self, storage, layout, Metal)
    }

    fn bwd(&self, _x: &Tensor, _y: &Tensor, grad_y: &Tensor) -> Result<Option<Tensor>> {
        if !self.transposed {
            candle_core::bail!("frozen matmul: the backward product is not differentiable");
        }
        let plain = FrozenMatmul { weight: self.weight.clone(), transposed: false };
        Ok(Some(grad_y.contiguous()?.apply_op1_no_bwd(&plain)?))
    }
}

/// Per-row negative log-likelihood `logsumexp(logits[i]) - logits[i, targets[i]]` for logits (n, vocab).
///
/// On the CPU this is one fused pass forward and one backward (softmax minus one-hot), instead of the half
/// dozen vocabulary-sized temporaries a composed log-softmax creates; elsewhere it is composed from
/// differentiable ops.
pub fn cross_entropy_rows(logits: &Tensor, targets: &[u32]) -> Result<Tensor> {
    let (n, vocab) = logits.dims2()?;
    if n != targets.len() {
        candle_core::bail!("cross entropy: {n} rows but {} targets", targets.len());
    }
    if let Some(&bad) = targets.iter().find(|&&t| t as usize >= vocab) {
        candle_core::bail!("cross entropy: target id {bad} is outside the vocabulary of {vocab}");
    }
    if logits.device().is_cpu() && logits.dtype() == DType::F32 {
        return logits.contiguous()?.apply_op1(CrossEntropyRows { targets: targets.to_vec() });
    }
    let log_probs = candle_nn::ops::log_softmax(logits, D::Minus1)?;
    let index = Tensor::from_slice(targets, (n, 1), logits.device())?;
    log_probs.gather(&index, 1)?.squeeze(1)?.neg()
}

struct CrossEntropyRows {
    targets: Vec<u32>,
}

fn cpu_f32_rows<'a>(storage: &'a candle_core::CpuStorage, layout: &candle_core::Layout) -> Result<(&'a [f32], usize, usize)> {
    let (n, vocab) = layout.shape().dims2()?;
    let Some((start, end)) = layout.contiguous_offsets() else {
        candle_core::bail!("cross entropy expects contiguous logits")
    };
    let data = match storage {
        candle_core::CpuStorage::F32(v) => &v[start..end],
        _ => candle_core::bail!("cross entropy expects f32 logits"),
    };
    Ok((data, n, vocab))
}

fn log_sum_exp(row: &[f32]) -> f32 {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if !max.is_finite() {
        return max;
    }
    let sum: f32 = row.iter().map(|&x| (x - max).exp()).sum();
    max + sum.ln()
}

impl candle_core::CustomOp1 for CrossEntropyRows {
    fn name(&self) -> &'static str {
        "cross-entropy-rows"
    }

    fn cpu_fwd(
        &self,
        storage: &candle_core::CpuStorage,
        layout: &candle_core::Layout,
    ) -> Result<(candle_core::CpuStorage, candle_core::Shape)> {
        let (data, n, vocab) = cpu_f32_rows(storage, layout)?;
        let out: Vec<f32> = (0..n)
            .map(|i| {
                let row = &data[i * vocab..(i + 1) * vocab];
                log_sum_exp(row) - row[self.targets[i] as usize]
            })
            .collect();
        Ok((candle_core::CpuStorage::F32(out), n.into()))
    }

    fn bwd(&self, logits: &Tensor, _nll: &Tensor, grad_nll: &Tensor) -> Result<Option<Tensor>> {
        let scale: Vec<f32> = grad_nll.to_dtype(DType::F32)?.to_vec1()?;
        let grad = logits.apply_op1_no_bwd(&CrossEntropyRowsGrad { targets: self.targets.clone(), scale })?;
        Ok(Some(grad))
    }
}

/// d nll / d logits = scale[i] * (softmax(logits[i]) - onehot(targets[i])).
struct CrossEntropyRowsGrad {
    targets: Vec<u32>,
    scale: Vec<f32>,
}

impl candle_core::CustomOp1 for CrossEntropyRowsGrad {
    fn name(&self) -> &'static str {
        "cross-entropy-rows-grad"
    }

    fn cpu_fwd(
        &self,
        storage: &candle_core::CpuStorage,
        layout: &candle_core::Layout,
    ) -> Result<(candle_core::CpuStorage, candle_core::Shape)> {
        let (data, n, vocab) = cpu_f32_rows(storage, layout)?;
        let mut out = vec![0f32; n * vocab];
        for i in 0..n {
            let row = &data[i * vocab..(i + 1) * vocab];
            let lse = log_sum_exp(row);
            let dst = &mut out[i * vocab..(i + 1) * vocab];
            let s = self.scale[i];
            for (d, &x) in dst.iter_mut().zip(row) {
                *d = s * (x - lse).exp();
            }
            dst[self.targets[i] as usize] -= s;
        }
        Ok((candle_core::CpuStorage::F32(out), (n, vocab).into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
        (a - b).unwrap().abs().unwrap().max_all().unwrap().to_dtype(DType::F32).unwrap().to_scalar().unwrap()
    }

    #[test]
    fn fused_cross_entropy_matches_composed_value_and_gradient() {
        let dev = Device::Cpu;
        let logits = Var::from_tensor(&(Tensor::randn(0f32, 3.0, (5, 37), &dev).unwrap())).unwrap();
        let targets = [3u32, 0, 36, 7, 7];
        let fused = cross_entropy_rows(logits.as_tensor(), &targets).unwrap();
        let log_probs = candle_nn::ops::log_softmax(logits.as_tensor(), D::Minus1).unwrap();
        let index = Tensor::from_slice(&targets, (5, 1), &dev).unwrap();
        let composed = log_probs.gather(&index, 1).unwrap().squeeze(1).unwrap().neg().unwrap();
        assert!(max_diff(&fused, &composed) < 1e-5);
        let weights = Tensor::new(&[1f32, 2.0, 0.5, -1.0, 3.0], &dev).unwrap();
        let g1 = (fused * &weights).unwrap().sum_all().unwrap().backward().unwrap();
        let g2 = (composed * &weights).unwrap().sum_all().unwrap().backward().unwrap();
        let (g1, g2) = (g1.get(logits.as_tensor()).unwrap(), g2.get(logits.as_tensor()).unwrap());
        assert!(max_diff(g1, g2) < 1e-5);
    }

    #[test]
    fn frozen_matmul_gives_input_gradient_and_no_weight_gradient() {
        let dev = Device::Cpu;
        let x = Var::from_tensor(&Tensor::randn(0f32, 1.0, (2, 3, 8), &dev).unwrap()).unwrap();
        let w = Var::from_tensor(&Tensor::randn(0f32, 1.0, (5, 8), &dev).unwrap()).unwrap();
        let y = frozen_matmul_t(x.as_tensor(), w.as_tensor()).unwrap();
        let reference = x.as_tensor().broadcast_matmul(&w.as_tensor().t().unwrap()).unwrap();
        assert!(max_diff(&y, &reference) < 1e-5);
        let g = y.sqr().unwrap().sum_all().unwrap().backward().unwrap();
        let g_ref = reference.sqr().unwrap().sum_all().unwrap().backward().unwrap();
        assert!(max_diff(g.get(x.as_tensor()).unwrap(), g_ref.get(x.as_tensor()).unwrap()) < 1e-4);
        assert!(g.get(w.as_tensor()).is_none(), "a frozen weight must not receive a gradient");
    }

    #[test]
    fn differentiable_norm_rope_and_softmax_match_fused_kernels() {
        let dev = Device::Cpu;
        let x = Tensor::randn(0f32, 1.0, (2, 3, 4, 8), &dev).unwrap();
        let w = Tensor::randn(1f32, 0.1, 8, &dev).unwrap();
        assert!(max_diff(&rms_norm(&x, &w, 1e-6, true).unwrap(), &rms_norm(&x, &w, 1e-6, false).unwrap()) < 1e-5);
        let cos = Tensor::randn(0f32, 1.0, (4, 4), &dev).unwrap();
        let sin = Tensor::randn(0f32, 1.0, (4, 4), &dev).unwrap();
        assert!(max_diff(&rope(&x, &cos, &sin, true).unwrap(), &rope(&x, &cos, &sin, false).unwrap()) < 1e-5);
        assert!(max_diff(&softmax_last_dim(&x, true).unwrap(), &softmax_last_dim(&x, false).unwrap()) < 1e-6);
    }

    /// The fused CPU f32 ops (forward and backward) against the composed versions, run in f64.
    #[test]
    fn fused_training_ops_match_composed_gradients() {
        let dev = Device::Cpu;
        let x64 = Tensor::randn(0f64, 1.0, (2, 3, 5, 8), &dev).unwrap();
        let w64 = Tensor::randn(1f64, 0.2, 8, &dev).unwrap();
        let cos64 = Tensor::randn(0f64, 1.0, (5, 4), &dev).unwrap();
        let sin64 = Tensor::randn(0f64, 1.0, (5, 4), &dev).unwrap();
        let up = Tensor::randn(0f64, 1.0, (2, 3, 5, 8), &dev).unwrap();
        type Op = fn(&Tensor, &Tensor, &Tensor, &Tensor) -> Result<Tensor>;
        let cases: [(&str, Op); 3] = [
            ("rms_norm", |x, w, _, _| rms_norm(x, w, 1e-6, true)),
            ("rope", |x, _, c, s| rope(x, c, s, true)),
            ("softmax", |x, _, _, _| softmax_last_dim(x, true)),
        ];
        for (name, op) in cases {
            let run = |dtype: DType| {
                let x = Var::from_tensor(&x64.to_dtype(dtype).unwrap()).unwrap();
                let (w, c, s) = (w64.to_dtype(dtype).unwrap(), cos64.to_dtype(dtype).unwrap(), sin64.to_dtype(dtype).unwrap());
                let y = op(x.as_tensor(), &w, &c, &s).unwrap();
                // A non-trivial upstream gradient.
                let loss = (y.clone() * up.to_dtype(dtype).unwrap()).unwrap().sum_all().unwrap();
                let g = loss.backward().unwrap().get(x.as_tensor()).unwrap().to_dtype(DType::F64).unwrap();
                (y.to_dtype(DType::F64).unwrap(), g)
            };
            let (y32, g32) = run(DType::F32);
            let (y64, g64) = run(DType::F64);
            assert!(max_diff(&y32, &y64) < 1e-4, "{name}: forward differs");
            assert!(max_diff(&g32, &g64) < 1e-3, "{name}: gradient differs");
        }
    }
}
