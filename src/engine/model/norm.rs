//! An RMS norm as a model applies it: the weight its checkpoint stores, and the factor that multiplies the
//! normalised input, `offset + w` (gemma3 stores its norm weights with the 1 taken out: offset 1; every other
//! family: offset 0, the stored weight itself). This file owns the norm's inference forward and its backward;
//! the kernels are `ops::rms_norm` and `ops::rms_norm_backward`, which see only the factor.
//!
//! The factor is computed once at load, in f32 and then cast to the model dtype. transformers' gemma3 adds the
//! 1 in f32 at every call and multiplies in f32: in f32 the two agree exactly; in bf16/f16 ours rounds the
//! factor to the model dtype once (a difference of the order of that dtype's precision).

use crate::engine::ops;
use crate::engine::Result;
use candle_core::Tensor;

/// One RMS norm: its stored weight (what exports write) and its applied factor.
#[derive(Debug, Clone)]
pub struct RmsNorm {
    /// Hugging Face name inside its block, e.g. `post_feedforward_layernorm` or `q_norm`.
    pub name: &'static str,
    /// The weight as the checkpoint stores it.
    pub weight: Tensor,
    /// What multiplies the normalised input when it is not the weight itself: `offset + weight`, times the
    /// output scale of [`Self::scaled`].
    offset_factor: Option<Tensor>,
    pub eps: f64,
}

impl RmsNorm {
    /// A norm whose stored `weight` applies as `offset + weight`.
    pub fn new(name: &'static str, weight: Tensor, offset: f64, eps: f64) -> Result<Self> {
        let offset_factor = if offset == 0.0 {
            None
        } else {
            // Half precision adds the offset in f32 (f32 and the f64 test models keep their own precision).
            Some((ops::upcast(&weight)? + offset)?.to_dtype(weight.dtype())?)
        };
        Ok(Self { name, weight, offset_factor, eps })
    }

    /// The same norm with its output multiplied by `scale` (granite's final norm carries `1 / logits_scaling`:
    /// the head is linear, so the logits come out divided, in inference, scoring and the training loss and its
    /// backward, with no step of their own). The stored weight, what exports write, stays as it was.
    pub fn scaled(mut self, scale: f64) -> Result<Self> {
        if scale != 1.0 {
            // f16/bf16 scale in f32; f32 and the tests' f64 stay (no f64 tensor on a GPU path).
            let factor = (ops::upcast(self.factor())? * scale)?.to_dtype(self.weight.dtype())?;
            self.offset_factor = Some(factor);
        }
        Ok(self)
    }

    /// The factor that multiplies the normalised input (`(offset + weight) * scale`).
    pub fn factor(&self) -> &Tensor {
        self.offset_factor.as_ref().unwrap_or(&self.weight)
    }

    /// `x / rms(x) * factor` over the last dimension.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(ops::rms_norm(x, self.factor(), self.eps)?)
    }

    /// The gradient of the input `x` of [`Self::forward`] for the output gradient `dy` (the weight is frozen).
    pub fn backward(&self, x: &Tensor, dy: &Tensor) -> Result<Tensor> {
        Ok(ops::rms_norm_backward(x, self.factor(), self.eps, dy)?)
    }

    /// `(x + delta, forward(x + delta))`: the residual add before the norm, fused with it where a kernel does both.
    pub fn add_forward(&self, x: &Tensor, delta: &Tensor) -> Result<(Tensor, Tensor)> {
        Ok(ops::add_rms_norm(x, delta, self.factor(), self.eps)?)
    }

    /// `addend + backward(x, dy)`, in one pass where a kernel does both.
    pub fn backward_add(&self, x: &Tensor, dy: &Tensor, addend: &Tensor) -> Result<Tensor> {
        Ok(ops::rms_norm_backward_add(x, self.factor(), self.eps, dy, addend)?)
    }

    /// Bytes the norm holds (the factor counted when it is a tensor of its own).
    pub fn size_in_bytes(&self) -> u64 {
        let bytes = |t: &Tensor| (t.elem_count() * t.dtype().size_in_bytes()) as u64;
        bytes(&self.weight) + self.offset_factor.as_ref().map_or(0, bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn offset_norm_multiplies_by_one_plus_the_weight() {
        let x = Tensor::new(&[[3f32, 4.0]], &Device::Cpu).unwrap();
        let w = Tensor::new(&[0.5f32, -0.25], &Device::Cpu).unwrap();
        let y = RmsNorm::new("n", w, 1.0, 0.0).unwrap().forward(&x).unwrap();
        let rms = (12.5f32).sqrt();
        let got: Vec<f32> = y.flatten_all().unwrap().to_vec1().unwrap();
        let want = [3.0 / rms * 1.5, 4.0 / rms * 0.75];
        assert!(got.iter().zip(want).all(|(g, w)| (g - w).abs() < 1e-5), "{got:?} vs {want:?}");
    }
}
