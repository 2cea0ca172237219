//! Rotary position embeddings: cos/sin tables for every position up to the context length, with Llama 3 and
//! linear rope scaling; gemma3's sliding layers get tables of their own (their base, no scaling).

use super::config::{ModelConfig, RopeScaling};
use crate::engine::ops;
use crate::engine::Result;
use candle_core::{DType, Device, Tensor};

/// Precomputed cos/sin tables for every position up to the context length.
#[derive(Debug, Clone)]
pub(crate) struct RotaryTables {
    cos: Tensor,
    sin: Tensor,
    /// (positions, head_dim) rows of [cos | sin] in f32 for the fused CUDA decode kernels; None elsewhere.
    pub(crate) decode_table: Option<Tensor>,
}

impl RotaryTables {
    /// The tables of the model's (global) layers: `rope_theta` and `rope_scaling`.
    pub(crate) fn new(cfg: &ModelConfig, dtype: DType, device: &Device) -> Result<Self> {
        Self::with_base(cfg, cfg.rope_theta, cfg.rope_scaling.as_ref(), dtype, device)
    }

    /// The sliding layers' tables when they rotate with a base of their own (gemma3's `rope_local_base_freq`,
    /// unscaled as transformers does); None otherwise.
    pub(crate) fn local(cfg: &ModelConfig, dtype: DType, device: &Device) -> Result<Option<Self>> {
        cfg.local_rope_theta.map(|theta| Self::with_base(cfg, theta, None, dtype, device)).transpose()
    }

    fn with_base(
        cfg: &ModelConfig,
        theta: f64,
        scaling: Option<&RopeScaling>,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        let dim = cfg.head_dim;
        let mut inv_freq: Vec<f64> = (0..dim / 2).map(|i| 1.0 / theta.powf(2.0 * i as f64 / dim as f64)).collect();
        let mut position_scale = 1.0;
        match scaling {
            Some(RopeScaling::Llama3(s)) => {
                let low_wavelen = s.original_max_position_embeddings as f64 / s.low_freq_factor;
                let high_wavelen = s.original_max_position_embeddings as f64 / s.high_freq_factor;
                for f in inv_freq.iter_mut() {
                    let wavelen = 2.0 * std::f64::consts::PI / *f;
                    *f = if wavelen < high_wavelen {
                        *f
                    } else if wavelen > low_wavelen {
                        *f / s.factor
                    } else {
                        let smooth = (s.original_max_position_embeddings as f64 / wavelen - s.low_freq_factor)
                            / (s.high_freq_factor - s.low_freq_factor);
                        (1.0 - smooth) * *f / s.factor + smooth * *f
                    };
                }
            }
            Some(RopeScaling::Linear { factor }) => position_scale = 1.0 / factor,
            None => {}
        }
        let max_len = cfg.max_position_embeddings;
        let mut angles = Vec::with_capacity(max_len * dim / 2);
        for pos in 0..max_len {
            let p = pos as f64 * position_scale;
            angles.extend(inv_freq.iter().map(|f| (p * f) as f32));
        }
        let angles = Tensor::from_vec(angles, (max_len, dim / 2), device)?;
        let (cos, sin) = (angles.cos()?, angles.sin()?);
        let decode_table = if ops::cuda_decode::available(device, dtype) {
            Some(Tensor::cat(&[&cos, &sin], 1)?.contiguous()?)
        } else {
            None
        };
        Ok(Self { cos: cos.to_dtype(dtype)?, sin: sin.to_dtype(dtype)?, decode_table })
    }

    pub(crate) fn slice(&self, start: usize, len: usize) -> Result<(Tensor, Tensor)> {
        Ok((self.cos.narrow(0, start, len)?, self.sin.narrow(0, start, len)?))
    }
}
