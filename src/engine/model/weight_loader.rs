//! Reads a model's named tensors with the right shape, dtype and device, and builds projections from them,
//! concatenating the projections that read the same input (q|k|v, gate|up) into one weight of which each
//! projection holds a row view: the same layout on every device, one product for all of them when decoding.
//!
//! Quantized projections (QLoRA, [`BaseQuant`]) are not concatenated: quantized blocks cannot be viewed by
//! rows without a copy, so each keeps its own quantized matrix and there is no fused weight (the fused decode
//! kernels, which need one, are skipped for such a block and the per-projection path runs instead).

use super::linear::{BaseWeight, Linear};
use super::quant::BaseQuant;
use super::safetensors_weights::Weights;
use crate::engine::Result;
use candle_core::{DType, Device, Tensor};

/// Projections' weights concatenated along the output dimension, and their biases if they have them; None
/// when the projections are quantized.
pub(super) type FusedWeight = Option<(Tensor, Option<Tensor>)>;

/// Reads named tensors with the right shape, dtype and device.
pub(super) struct WeightLoader<'a> {
    pub(super) weights: &'a Weights,
    pub(super) dtype: DType,
    pub(super) device: &'a Device,
    /// How the decoder layers' projections are held.
    pub(super) quant: BaseQuant,
}

impl WeightLoader<'_> {
    pub(super) fn get(&self, name: &str, shape: &[usize]) -> Result<Tensor> {
        self.weights.get(name, shape, self.dtype, self.device)
    }

    pub(super) fn linear(&self, prefix: &str, in_features: usize, out_features: usize, bias: bool) -> Result<Linear> {
        let name = format!("{prefix}.weight");
        let weight =
            self.weights.base_weight(&name, &[out_features, in_features], self.quant, self.dtype, self.device)?;
        let bias = if bias { Some(self.get(&format!("{prefix}.bias"), &[out_features])?) } else { None };
        Ok(Linear::with_base(weight, bias))
    }

    /// Projections that read the same input: their weights (and biases) concatenated into one tensor,
    /// returned too, of which each linear holds a row view (no extra memory). Quantized projections stay
    /// apart and come with no fused weight.
    pub(super) fn fused_linears<const N: usize>(
        &self,
        prefixes: [&str; N],
        in_features: usize,
        out_features: [usize; N],
        bias: bool,
    ) -> Result<([Linear; N], FusedWeight)> {
        let linears = prefixes
            .iter()
            .zip(out_features)
            .map(|(p, out)| self.linear(p, in_features, out, bias))
            .collect::<Result<Vec<_>>>()?;
        let array = |v: Vec<Linear>| -> [Linear; N] { v.try_into().unwrap_or_else(|_| unreachable!("N linears")) };
        let dense: Option<Vec<&Tensor>> = linears
            .iter()
            .map(|l| match &l.weight {
                BaseWeight::Dense(w) => Some(w),
                BaseWeight::Quantized(_) => None,
            })
            .collect();
        let Some(dense) = dense else { return Ok((array(linears), None)) };
        let weight = Tensor::cat(&dense, 0)?;
        let biases: Option<Vec<&Tensor>> = linears.iter().map(|l| l.bias.as_ref()).collect();
        let bias = biases.map(|b| Tensor::cat(&b, 0)).transpose()?;
        let mut start = 0;
        let views = out_features
            .iter()
            .map(|&out| {
                let view = Linear::new(
                    weight.narrow(0, start, out)?,
                    bias.as_ref().map(|b| b.narrow(0, start, out)).transpose()?,
                );
                start += out;
                Ok(view)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok((array(views), Some((weight, bias))))
    }
}
