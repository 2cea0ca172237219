//! Reads a model's named tensors with the right shape, dtype and device, and builds projections from them,
//! concatenating the projections that read the same input (q|k|v, gate|up) into one weight of which each
//! projection holds a row view: the same layout on every device, one product for all of them when decoding.

use super::linear::Linear;
use super::safetensors_weights::Weights;
use crate::engine::Result;
use candle_core::{DType, Device, Tensor};

/// Projections' weights concatenated along the output dimension, and their biases if they have them.
pub(super) type FusedWeight = (Tensor, Option<Tensor>);

/// Reads named tensors with the right shape, dtype and device.
pub(super) struct WeightLoader<'a> {
    pub(super) weights: &'a Weights,
    pub(super) dtype: DType,
    pub(super) device: &'a Device,
}

impl WeightLoader<'_> {
    pub(super) fn get(&self, name: &str, shape: &[usize]) -> Result<Tensor> {
        self.weights.get(name, shape, self.dtype, self.device)
    }

    pub(super) fn linear(&self, prefix: &str, in_features: usize, out_features: usize, bias: bool) -> Result<Linear> {
        let weight = self.get(&format!("{prefix}.weight"), &[out_features, in_features])?;
        let bias = if bias { Some(self.get(&format!("{prefix}.bias"), &[out_features])?) } else { None };
        Ok(Linear::new(weight, bias))
    }

    /// Projections that read the same input: their weights (and biases) concatenated into one tensor,
    /// returned too, of which each linear holds a row view (no extra memory).
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
        let weight = Tensor::cat(&linears.iter().map(|l| &l.weight).collect::<Vec<_>>(), 0)?;
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
        Ok((array(views), (weight, bias)))
    }
}
