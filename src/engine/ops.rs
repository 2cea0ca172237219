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
    candle_nn::ops::softmax(x, D::Minus1)
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
    let y = x2.contiguous()?.apply_op1(FrozenMatmulT { weight: weight.clone() })?;
    let mut out_dims = dims;
    let last = out_dims.len() - 1;
    out_dims[last] = weight.dim(0)?;
    y.reshape(out_dims)
}

/// `x W^T` with the weight held inside the op, so autograd sees only `x`.
struct FrozenMatmulT {
    weight: Tensor,
}

impl FrozenMatmulT {
    fn dims(&self, layout: &candle_core::Layout) -> Result<(usize, usize, usize)> {
        let (rows, k) = layout.shape().dims2()?;
        let (out, k_w) = self.weight.dims2()?;
        if k != k_w {
            candle_core::bail!("frozen matmul: input has {k} features, weight expects {k_w}");
        }
        Ok((rows, k, out))
    }
}

impl candle_core::CustomOp1 for FrozenMatmulT {
    fn name(&self) -> &'static str {
        "frozen-matmul-t"
    }

    fn cpu_fwd(
        &self,
        storage: &candle_core::CpuStorage,
        layout: &candle_core::Layout,
    ) -> Result<(candle_core::CpuStorage, candle_core::Shape)> {
        use candle_core::backend::BackendStorage;
        let (rows, k, out) = self.dims(layout)?;
        let (w_storage, w_layout) = self.weight.storage_and_layout();
        let w_t = w_layout.transpose(0, 1)?;
        match &*w_storage {
            candle_core::Storage::Cpu(w) => {
                Ok((storage.matmul(w, (1, rows, out, k), layout, &w_t)?, (rows, out).into()))
            }
            _ => candle_core::bail!("frozen matmul: weight and input are on different devices"),
        }
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        storage: &candle_core::CudaStorage,
        layout: &candle_core::Layout,
    ) -> Result<(candle_core::CudaStorage, candle_core::Shape)> {
        use candle_core::backend::BackendStorage;
        let (rows, k, out) = self.dims(layout)?;
        let (w_storage, w_layout) = self.weight.storage_and_layout();
        let w_t = w_layout.transpose(0, 1)?;
        match &*w_storage {
            candle_core::Storage::Cuda(w) => {
                Ok((storage.matmul(w, (1, rows, out, k), layout, &w_t)?, (rows, out).into()))
            }
            _ => candle_core::bail!("frozen matmul: weight and input are on different devices"),
        }
    }

    #[cfg(target_os = "macos")]
    fn metal_fwd(
        &self,
        storage: &candle_core::MetalStorage,
        layout: &candle_core::Layout,
    ) -> Result<(candle_core::MetalStorage, candle_core::Shape)> {
        use candle_core::backend::BackendStorage;
        let (rows, k, out) = self.dims(layout)?;
        let (w_storage, w_layout) = self.weight.storage_and_layout();
        let w_t = w_layout.transpose(0, 1)?;
        match &*w_storage {
            candle_core::Storage::Metal(w) => {
                Ok((storage.matmul(w, (1, rows, out, k), layout, &w_t)?, (rows, out).into()))
            }
            _ => candle_core::bail!("frozen matmul: weight and input are on different devices"),
        }
    }

    fn bwd(&self, _x: &Tensor, _y: &Tensor, grad_y: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(grad_y.matmul(&self.weight)?))
    }
}
