//! The rotary embedding (Hugging Face's "rotate half" layout) through Candle's fused rope kernel (CPU, CUDA, Metal)
//! or our WGSL kernel under `--kernels wgsl` (metal/),
//! and the partial rotary of phi3 (only the leading dimensions of a head turn).

use candle_core::{Result, Tensor, D};

use super::kernel_choice::metal_dtypes;
use super::metal;

/// Rotary embedding, "rotate half" layout as in Hugging Face Llama. `x`: (b, heads, t, head_dim);
/// `cos`/`sin`: (t, rotary_dim / 2), or (b, t, rotary_dim / 2) for packed rows. Partial rotary (phi3): only the leading `rotary_dim` dimensions of each
/// head turn, the rest pass through.
pub fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    metal_dtypes("rope", &[x, cos, sin])?;
    on_rotary_dims(x, cos, |x| {
        if metal::takes(&[x, cos, sin]) && metal::rope_fits(x, cos, sin) {
            return metal::rope(x, cos, sin);
        }
        candle_nn::rotary_emb::rope(&x.contiguous()?, cos, sin)
    })
}

/// `f` applied to the leading `2 * cos.dim(1)` dimensions of `x`'s last axis, the rest passed through: the
/// partial rotary of the rope forward and backward.
pub(crate) fn on_rotary_dims(x: &Tensor, cos: &Tensor, f: impl FnOnce(&Tensor) -> Result<Tensor>) -> Result<Tensor> {
    let (dim, rotary) = (x.dim(D::Minus1)?, 2 * cos.dim(D::Minus1)?);
    if rotary >= dim {
        return f(x);
    }
    let turned = f(&x.narrow(D::Minus1, 0, rotary)?.contiguous()?)?;
    Tensor::cat(&[&turned, &x.narrow(D::Minus1, rotary, dim - rotary)?], D::Minus1)?.contiguous()
}
