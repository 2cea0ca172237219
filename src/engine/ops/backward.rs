//! Input gradients of the transformer's element-wise blocks, for the hand-written training backward pass
//! (engine/train/backprop). Each takes what the forward pass saved and the output gradient; CPU f32 uses the
//! fused kernels of `cpu/training.rs`, CUDA f32/bf16 those of `cuda/training.rs`, anything else composes Candle
//! ops.

use super::cpu::host::f32_of;
use super::cpu::training::{rms_norm_backward_f32, rope_cpu, softmax_backward_f32};
use super::cuda::{availability::available as cuda_available, residual as cuda_residual, training as cuda_training};
use super::elementwise::add;
use super::gelu::{gelu_tanh, GELU_TANH_C};
use super::kernel_choice::{is_cpu_f32, metal_dtypes};
use super::metal;
use super::precision::{for_chain, ones_column, upcast};
use super::products::{outer, row_dots};
use super::rotary::on_rotary_dims;
use candle_core::{Result, Tensor, D};

/// Whether the fused CUDA kernels (cuda_training.rs) take this tensor's dtype on its device.
fn fused_on_gpu(x: &Tensor) -> bool {
    cuda_available(x.device(), x.dtype())
}

/// Gradient of `rms_norm(x, weight, eps)` with respect to `x` (the weight is frozen).
pub fn rms_norm_backward(x: &Tensor, weight: &Tensor, eps: f64, dy: &Tensor) -> Result<Tensor> {
    metal_dtypes("rms_norm_backward", &[x, weight, dy])?;
    if metal::takes(&[x, weight, dy]) {
        return metal::rms_norm_backward(x, weight, eps, dy);
    }
    if is_cpu_f32(x) && is_cpu_f32(dy) {
        let dx = rms_norm_backward_f32(&f32_of(x)?, &f32_of(dy)?, &f32_of(weight)?, eps as f32);
        return Tensor::from_vec(dx, x.shape(), x.device());
    }
    if fused_on_gpu(x) {
        return cuda_residual::rms_norm_backward(x, weight, eps, dy, None);
    }
    // dx = inv gw - x (inv^3 mean(gw x)) with gw = dy weight and inv = 1 / sqrt(mean(x^2) + eps). The row sums are
    // row dots (a product in the inputs' dtype, summed by a product against ones), the per-row factors are in f32.
    // Each factor that scales whole rows or columns comes as an outer product (a matrix product over an inner size
    // of one) and then one contiguous multiply: `inv gw = dy * (inv w^T)`, `x c = x * (c 1^T)`. Broadcasting a
    // factor through Candle's strided kernels cost three contiguous passes each (one index division per dimension
    // per element), and there were three of them. In bf16 for bf16 inputs, each op rounding once: within a few units
    // of bf16's last place (kernel_tests.rs).
    let dtype = x.dtype();
    let (x, dy, weight) = (for_chain(x)?, for_chain(dy)?, for_chain(weight)?);
    let chain = x.dtype();
    let width = x.dim(D::Minus1)?;
    let rows = x.elem_count() / width.max(1);
    let (x2, dy2) = (x.reshape((rows, width))?, dy.reshape((rows, width))?);
    let mean_square = row_dots(&x2, &x2)?.affine(1.0 / width as f64, eps)?;
    let inv = mean_square.powf(-0.5)?.to_dtype(chain)?;
    let scaled = (&dy2 * outer(&inv, &weight.reshape((1, width))?)?)?;
    // inv^3 mean(gw x) = mean(inv gw x) / mean_square, negated: the second term is then added.
    let minus_along = (row_dots(&scaled, &x2)? / mean_square)?.affine(-1.0 / width as f64, 0.0)?.to_dtype(chain)?;
    let ones = ones_column(width, chain, x.device())?.t()?;
    let dx = (scaled + (&x2 * outer(&minus_along, &ones)?)?)?;
    dx.reshape(x.shape())?.to_dtype(dtype)
}

/// `addend + rms_norm_backward(x, weight, eps, dy)`: a residual branch's gradient joined by the gradient through
/// the norm on that branch, in the same pass on CUDA.
pub fn rms_norm_backward_add(x: &Tensor, weight: &Tensor, eps: f64, dy: &Tensor, addend: &Tensor) -> Result<Tensor> {
    if fused_on_gpu(x) && addend.dtype() == x.dtype() {
        return cuda_residual::rms_norm_backward(x, weight, eps, dy, Some(addend));
    }
    add(addend, &rms_norm_backward(x, weight, eps, dy)?)
}

/// Gradient of rotary embedding: the inverse rotation of the output gradient (rope with -sin), on the rotary
/// dimensions only (partial rotary passes the rest through). `dy`: (b, heads, t, head_dim); `cos`/`sin`:
/// (t, rotary_dim / 2), or (b, t, rotary_dim / 2) for packed rows (Candle's kernel then, or our WGSL kernel).
pub fn rope_backward(dy: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    metal_dtypes("rope_backward", &[dy, cos, sin])?;
    on_rotary_dims(dy, cos, |dy| {
        if metal::takes(&[dy, cos, sin]) && metal::rope_fits(dy, cos, sin) {
            return metal::rope_backward(dy, cos, sin);
        }
        if is_cpu_f32(dy) && cos.rank() == 2 {
            let dx = rope_cpu(&f32_of(dy)?, dy.dims(), &f32_of(cos)?, &f32_of(sin)?, -1.0);
            return Tensor::from_vec(dx, dy.shape(), dy.device());
        }
        candle_nn::rotary_emb::rope(&dy.contiguous()?, cos, &sin.neg()?)
    })
}

/// Gradient of `softmax(scale * x + mask)` over the last dimension with respect to `x`, from the output `p`:
/// `scale * p * (dp - sum(dp * p))`, in f32 or f64.
pub fn softmax_backward(p: &Tensor, dp: &Tensor, scale: f64) -> Result<Tensor> {
    metal_dtypes("softmax_backward", &[p, dp])?;
    if is_cpu_f32(p) && is_cpu_f32(dp) {
        let d = p.dims().last().copied().unwrap_or(1).max(1);
        let dx = softmax_backward_f32(&f32_of(p)?, &f32_of(dp)?, d, scale as f32);
        return Tensor::from_vec(dx, p.shape(), p.device());
    }
    if fused_on_gpu(p) && p.dtype() == dp.dtype() {
        return cuda_training::softmax_backward(p, dp, scale);
    }
    let (p, dp) = (upcast(p)?, upcast(dp)?);
    let dot = (&dp * &p)?.sum_keepdim(D::Minus1)?;
    (p * dp.broadcast_sub(&dot)?)? * scale
}

/// A gate's sigmoid and silu as the composed SwiGLU backward forms them, in the chain's dtype: made once where the
/// backward also remakes `silu(gate) * up` (down_proj's input), by [`silu_mul_remade`].
pub struct SiluParts {
    sig: Tensor,
    silu: Tensor,
}

impl SiluParts {
    /// The parts of `gate`, already in the chain's dtype.
    fn of(gate: &Tensor) -> Result<Self> {
        let sig = candle_nn::ops::sigmoid(gate)?;
        Ok(Self { silu: (gate * &sig)?, sig })
    }
}

/// Whether [`silu_mul_backward`] composes Candle ops for these tensors (no CPU f32, WGSL or CUDA kernel takes them).
fn silu_backward_composes(gate: &Tensor, up: &Tensor) -> bool {
    !(is_cpu_f32(gate) && is_cpu_f32(up))
        && !(metal::takes(&[gate, up]) && up.shape() == gate.shape())
        && !(fused_on_gpu(gate) && up.dtype() == gate.dtype())
}

/// `silu(gate) * up` made again for the backward that follows, with the gate's [`SiluParts`] where that backward
/// composes (one pass fewer: the product reuses the silu the gradient needs); `super::silu_mul` and None elsewhere.
pub fn silu_mul_remade(gate: &Tensor, up: &Tensor) -> Result<(Tensor, Option<SiluParts>)> {
    if !silu_backward_composes(gate, up) {
        return Ok((super::elementwise::silu_mul(gate, up)?, None));
    }
    let parts = SiluParts::of(&for_chain(gate)?)?;
    let product = (&parts.silu * for_chain(up)?)?.to_dtype(gate.dtype())?;
    Ok((product, Some(parts)))
}

/// Gradients of `silu(gate) * up` with respect to gate and up, given the output gradient `dm`.
pub fn silu_mul_backward(gate: &Tensor, up: &Tensor, dm: &Tensor) -> Result<(Tensor, Tensor)> {
    silu_mul_backward_with(gate, up, dm, None)
}

/// [`silu_mul_backward`] with the gate's sigmoid and silu when [`silu_mul_remade`] made them.
pub fn silu_mul_backward_with(
    gate: &Tensor,
    up: &Tensor,
    dm: &Tensor,
    parts: Option<SiluParts>,
) -> Result<(Tensor, Tensor)> {
    metal_dtypes("silu_mul_backward", &[gate, up, dm])?;
    let silu_and_slope = |g: f32| {
        let sig = 1.0 / (1.0 + (-g).exp());
        (g * sig, sig * (1.0 + g * (1.0 - sig)))
    };
    if let Some(grads) = gated_backward_cpu(gate, up, dm, silu_and_slope)? {
        return Ok(grads);
    }
    if metal::takes(&[gate, up, dm]) && up.shape() == gate.shape() && dm.shape() == gate.shape() {
        return metal::silu_mul_backward(gate, up, dm);
    }
    if fused_on_gpu(gate) && up.dtype() == gate.dtype() && dm.dtype() == gate.dtype() {
        return cuda_training::silu_mul_backward(gate, up, dm);
    }
    // In bf16 for bf16 inputs: eight passes over (rows, intermediate) against thirteen, half of them over f32
    // copies, through f32. Each op rounds once (Candle's bf16 kernels compute in f32): dgate takes about six
    // roundings to PyTorch's two, within a few units of bf16's last place (kernel_tests.rs bounds it).
    let dtype = gate.dtype();
    let (gate, up, dm) = (for_chain(gate)?, for_chain(up)?, for_chain(dm)?);
    let SiluParts { sig, silu } = match parts {
        Some(parts) => parts,
        None => SiluParts::of(&gate)?,
    };
    let dup = (&dm * &silu)?;
    // silu'(g) = sig * (1 + g * (1 - sig)) = sig + silu * (1 - sig)
    let dsilu = (&sig + (&silu * sig.affine(-1.0, 1.0)?)?)?;
    let dgate = ((dm * up)? * dsilu)?;
    Ok((dgate.to_dtype(dtype)?, dup.to_dtype(dtype)?))
}

/// The gradients of `act(gate) * up` for the output gradient `dm` in one parallel pass, when all three are CPU
/// f32 tensors; `act_and_slope` gives the activation and its derivative. None otherwise.
fn gated_backward_cpu(
    gate: &Tensor,
    up: &Tensor,
    dm: &Tensor,
    act_and_slope: impl Fn(f32) -> (f32, f32) + Sync,
) -> Result<Option<(Tensor, Tensor)>> {
    if !(is_cpu_f32(gate) && is_cpu_f32(up) && is_cpu_f32(dm)) {
        return Ok(None);
    }
    let (g, u, d) = (f32_of(gate)?, f32_of(up)?, f32_of(dm)?);
    let (g, u, d): (&[f32], &[f32], &[f32]) = (&g, &u, &d);
    let chunk = crate::engine::cpu_pool::ELEMENTS_PER_TASK;
    let (dgate, dup) = crate::engine::cpu_pool::new_f32_pair(g.len(), chunk, |c, dgate, dup| {
        let (g, u, d) = (&g[c * chunk..], &u[c * chunk..], &d[c * chunk..]);
        for i in 0..dgate.len() {
            let (value, slope) = act_and_slope(g[i]);
            dup[i] = d[i] * value;
            dgate[i] = d[i] * u[i] * slope;
        }
    });
    Ok(Some((Tensor::from_vec(dgate, gate.shape(), gate.device())?, Tensor::from_vec(dup, up.shape(), up.device())?)))
}

/// Gradients of `gelu_tanh(gate) * up` (GeGLU, gemma3) with respect to gate and up, given the output gradient
/// `dm`. One parallel pass on the CPU in f32; composed Candle ops elsewhere (CUDA included: no fused kernel).
pub fn gelu_tanh_mul_backward(gate: &Tensor, up: &Tensor, dm: &Tensor) -> Result<(Tensor, Tensor)> {
    metal_dtypes("gelu_tanh_mul_backward", &[gate, up, dm])?;
    if let Some(grads) = gated_backward_cpu(gate, up, dm, gelu_tanh)? {
        return Ok(grads);
    }
    // In f32 whatever the inputs: in bf16, t = tanh(..) rounds near +-1 to a step of 2^-8, and 1 + t and 1 - t^2
    // lose most of their digits there (kernel_tests.rs caught a bf16 chain off by 50% of the slope at g = -3).
    let dtype = gate.dtype();
    let (g, u, d) = (upcast(gate)?, upcast(up)?, upcast(dm)?);
    let t = ((&g + ((g.sqr()? * &g)? * 0.044_715)?)? * GELU_TANH_C)?.tanh()?;
    let one_plus_t = (&t + 1.0)?;
    let value = ((&g * &one_plus_t)? * 0.5)?;
    // d/dx: 0.5 (1 + t) + 0.5 x (1 - t^2) c (1 + 3 * 0.044715 x^2)
    let inner = ((g.sqr()? * (3.0 * 0.044_715))? + 1.0)?;
    let sech2 = (t.sqr()?.neg()? + 1.0)?;
    let slope = ((one_plus_t * 0.5)? + (((&g * sech2)? * inner)? * (0.5 * GELU_TANH_C))?)?;
    let dup = (&d * value)?;
    let dgate = ((d * u)? * slope)?;
    Ok((dgate.to_dtype(dtype)?, dup.to_dtype(dtype)?))
}
