//! Numeric building blocks of the transformer: RMS norm, rotary embeddings, softmax, SiLU gating.
//!
//! Inference uses Candle's fused kernels. Those have no backward pass (see design.md, "Traps"), so when
//! gradients are needed (`grad == true`) we use versions whose gradients are known to flow.

mod backward;
mod cross_entropy;
pub mod cuda_decode;
mod cuda_kernels;
mod cuda_training;
mod frozen_matmul;
mod gemv;
mod head_loss;
mod matmul;
mod training_kernels;

pub use backward::{rms_norm_backward, rope_backward, silu_mul_backward, softmax_backward};
pub use cross_entropy::cross_entropy_rows;
pub use frozen_matmul::{frozen_matmul, frozen_matmul_t};
pub use head_loss::{head_nll, HeadLoss};
pub use matmul::matmul;

use candle_core::{DType, Result, Tensor, D};
use training_kernels::{RmsNormOp, RopeOp, SoftmaxOp};

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

/// Attention probabilities `softmax(scale * scores + mask)` for scores (..., rows, total) whose rows are
/// query positions modulo `mask`'s height (t, total); one fused pass on the CPU in f32.
pub fn scaled_masked_softmax(scores: &Tensor, scale: f64, mask: Option<&Tensor>, composed: bool) -> Result<Tensor> {
    let total = scores.dim(D::Minus1)?;
    if !composed && cuda_kernels::available(scores.device(), scores.dtype()) {
        return cuda_training::masked_softmax(scores, scale, mask);
    }
    if is_cpu_f32(scores) && !composed {
        let mask_data = mask.map(f32_of).transpose()?;
        let t = mask.map(|m| m.dim(0)).transpose()?.unwrap_or(1);
        let out =
            training_kernels::scaled_masked_softmax_f32(&f32_of(scores)?, scale as f32, mask_data.as_deref(), t, total);
        return Tensor::from_vec(out, scores.shape(), scores.device());
    }
    let mut x = (upcast(scores)? * scale)?;
    if let Some(mask) = mask {
        let (t, dims) = (mask.dim(0)?, x.dims().to_vec());
        let rows = dims[dims.len() - 2];
        let lead: usize = dims[..dims.len() - 2].iter().product();
        x = x.reshape((lead, rows / t, t, total))?.broadcast_add(&mask.to_dtype(x.dtype())?)?.reshape(dims)?;
    }
    softmax_last_dim(&x, composed)
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

fn f32_of(t: &Tensor) -> Result<F32Elems<'_>> {
    if t.device().is_cpu() && t.dtype() == DType::F32 {
        let (storage, layout) = t.storage_and_layout();
        if let Some((start, end)) = layout.contiguous_offsets() {
            return Ok(F32Elems::Borrowed(Box::new(storage), start, end));
        }
    }
    Ok(F32Elems::Owned(t.flatten_all()?.to_vec1::<f32>()?))
}

/// A tensor's f32 elements in order: borrowed from a contiguous CPU storage (no copy), else copied.
enum F32Elems<'a> {
    Borrowed(Box<dyn std::ops::Deref<Target = candle_core::Storage> + 'a>, usize, usize),
    Owned(Vec<f32>),
}

impl std::ops::Deref for F32Elems<'_> {
    type Target = [f32];

    fn deref(&self) -> &[f32] {
        match self {
            F32Elems::Borrowed(storage, start, end) => match &***storage {
                candle_core::Storage::Cpu(candle_core::CpuStorage::F32(v)) => &v[*start..*end],
                _ => unreachable!("borrowed only from CPU f32 storage"),
            },
            F32Elems::Owned(v) => v,
        }
    }
}

/// Half-precision tensors converted to f32 for numerically sensitive steps (softmax, loss); f32 and f64 stay.
pub fn upcast(x: &Tensor) -> Result<Tensor> {
    match x.dtype() {
        DType::F16 | DType::BF16 => x.to_dtype(DType::F32),
        _ => Ok(x.clone()),
    }
}

/// SwiGLU gate: silu(gate) * up (one pass on the CPU in f32 when no gradient is tracked).
pub fn silu_mul(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    let tracked = gate.track_op() || up.track_op();
    if is_cpu_f32(gate) && is_cpu_f32(up) && gate.shape() == up.shape() && !tracked {
        let (g, u) = (f32_of(gate)?, f32_of(up)?);
        let (g, u): (&[f32], &[f32]) = (&g, &u);
        let chunk = crate::engine::cpu_pool::ELEMENTS_PER_TASK;
        let out = crate::engine::cpu_pool::new_f32(g.len(), chunk, |i, dst| {
            let (g, u) = (&g[i * chunk..], &u[i * chunk..]);
            for (j, o) in dst.iter_mut().enumerate() {
                *o = g[j] / (1.0 + (-g[j]).exp()) * u[j];
            }
        });
        return Tensor::from_vec(out, gate.shape(), gate.device());
    }
    candle_nn::ops::silu(gate)? * up
}

/// `a + scale * b` for tensors of one shape: one parallel pass on the CPU in f32 when no gradient is
/// tracked (the hand-written training pass's residuals, adapter outputs and gradient sums), Candle's ops
/// otherwise.
pub fn add_scaled(a: &Tensor, b: &Tensor, scale: f64) -> Result<Tensor> {
    let tracked = a.track_op() || b.track_op();
    if is_cpu_f32(a) && is_cpu_f32(b) && a.shape() == b.shape() && !tracked {
        let (x, y) = (f32_of(a)?, f32_of(b)?);
        let (x, y): (&[f32], &[f32]) = (&x, &y);
        let (s, chunk) = (scale as f32, crate::engine::cpu_pool::ELEMENTS_PER_TASK);
        let out = crate::engine::cpu_pool::new_f32(x.len(), chunk, |i, dst| {
            let (x, y) = (&x[i * chunk..], &y[i * chunk..]);
            for (j, o) in dst.iter_mut().enumerate() {
                *o = x[j] + s * y[j];
            }
        });
        return Tensor::from_vec(out, a.shape(), a.device());
    }
    if scale == 1.0 {
        a + b
    } else {
        a + (b * scale)?
    }
}

/// `a + b` for tensors of one shape (see [`add_scaled`]).
pub fn add(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    add_scaled(a, b, 1.0)
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
                let (w, c, s) =
                    (w64.to_dtype(dtype).unwrap(), cos64.to_dtype(dtype).unwrap(), sin64.to_dtype(dtype).unwrap());
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
