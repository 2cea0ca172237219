//! Rotary position embeddings: cos/sin tables for every position up to the context length, with Llama 3,
//! linear and LongRoPE (phi3) scaling, over the leading `rotary_dim` dimensions of each head (phi3's partial
//! rotary; the rest pass through, see `ops::rope`); gemma3's sliding layers get tables of their own (their
//! base, no scaling).
//!
//! LongRoPE follows transformers' `longrope_frequency_update`: a forward whose last position + 1 exceeds
//! `original_max_position_embeddings` rotates all of its positions with the long factors, any other forward
//! with the short ones. A cached generation that runs past the original context recomputes its cache with the
//! long factors at that step ([`RotaryTables::restarts_cache`], `Transformer::forward_last_cached`), as
//! transformers' Phi3 generation does, so it equals one forward over the whole sequence.

use super::config::{ModelConfig, RopeScaling};
use crate::engine::ops;
use crate::engine::Result;
use candle_core::{DType, Device, Tensor};

/// Precomputed cos/sin tables for every position up to the context length.
#[derive(Debug, Clone)]
pub(crate) struct RotaryTables {
    cos: Tensor,
    sin: Tensor,
    /// LongRoPE's long-factor tables and the context length past which a forward uses them.
    long: Option<(Tensor, Tensor, usize)>,
    /// (positions, head_dim) rows of [cos | sin] in f32 for the fused CUDA decode kernels; None elsewhere, and
    /// for partial rotary or LongRoPE, which those kernels do not model (decoding then takes the composed path).
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
        let dim = cfg.rotary_dim;
        let base: Vec<f64> = (0..dim / 2).map(|i| 1.0 / theta.powf(2.0 * i as f64 / dim as f64)).collect();
        let mut inv_freq = base.clone();
        let mut position_scale = 1.0;
        let mut long = None;
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
            Some(RopeScaling::LongRope(s)) => {
                let scaled = |factors: &[f64]| -> Vec<f64> { base.iter().zip(factors).map(|(f, e)| f / e).collect() };
                inv_freq = scaled(&s.short_factor);
                let (cos, sin) = tables(&scaled(&s.long_factor), 1.0, s.attention_factor, cfg, device)?;
                long = Some((cos.to_dtype(dtype)?, sin.to_dtype(dtype)?, s.original_max_position_embeddings));
            }
            None => {}
        }
        let attention_factor = match scaling {
            Some(RopeScaling::LongRope(s)) => s.attention_factor,
            _ => 1.0,
        };
        let (cos, sin) = tables(&inv_freq, position_scale, attention_factor, cfg, device)?;
        let decode_table = if ops::cuda::decode::available(device, dtype) && long.is_none() && dim == cfg.head_dim {
            Some(Tensor::cat(&[&cos, &sin], 1)?.contiguous()?)
        } else {
            None
        };
        Ok(Self { cos: cos.to_dtype(dtype)?, sin: sin.to_dtype(dtype)?, long, decode_table })
    }

    /// Whether running `new` positions after `cached` ones crosses LongRoPE's original context while the cached
    /// keys were rotated with the short factors: the cache must then be recomputed with the long ones
    /// (transformers' Phi3 `prepare_inputs_for_generation` drops it at that step).
    pub(crate) fn restarts_cache(&self, cached: usize, new: usize) -> bool {
        matches!(&self.long, Some((_, _, original)) if cached > 0 && cached <= *original && cached + new > *original)
    }

    /// cos/sin (len, rotary_dim / 2) for positions `start..start + len` of one forward that starts at `start`:
    /// LongRoPE's long tables when `start + len` runs past the original context.
    pub(crate) fn slice(&self, start: usize, len: usize) -> Result<(Tensor, Tensor)> {
        let (cos, sin) = match &self.long {
            Some((cos, sin, original)) if start + len > *original => (cos, sin),
            _ => (&self.cos, &self.sin),
        };
        Ok((cos.narrow(0, start, len)?, sin.narrow(0, start, len)?))
    }
}

impl RotaryTables {
    /// cos/sin (b, t, rotary_dim / 2) for a packed batch whose token k sits at position `positions[k]` of its
    /// own example (b * t of them): the rows of one forward as long as the longest example, gathered.
    pub(crate) fn gather(
        &self,
        positions: &Tensor,
        (b, t): (usize, usize),
        longest: usize,
    ) -> Result<(Tensor, Tensor)> {
        let (cos, sin) = self.slice(0, longest.max(1))?;
        let half = cos.dim(1)?;
        let pick = |table: &Tensor| -> Result<Tensor> {
            Ok(table.contiguous()?.index_select(positions, 0)?.reshape((b, t, half))?)
        };
        Ok((pick(&cos)?, pick(&sin)?))
    }
}

/// f32 cos and sin of `position * position_scale * inv_freq` for every position, times `attention_factor`.
fn tables(
    inv_freq: &[f64],
    position_scale: f64,
    attention_factor: f64,
    cfg: &ModelConfig,
    device: &Device,
) -> Result<(Tensor, Tensor)> {
    let max_len = cfg.max_position_embeddings;
    let mut angles = Vec::with_capacity(max_len * inv_freq.len());
    for pos in 0..max_len {
        let p = pos as f64 * position_scale;
        angles.extend(inv_freq.iter().map(|f| (p * f) as f32));
    }
    let angles = Tensor::from_vec(angles, (max_len, inv_freq.len()), device)?;
    let (cos, sin) = (angles.cos()?, angles.sin()?);
    if attention_factor == 1.0 {
        return Ok((cos, sin));
    }
    Ok(((cos * attention_factor)?, (sin * attention_factor)?))
}
