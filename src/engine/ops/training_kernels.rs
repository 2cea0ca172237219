//! CPU training kernels with backward passes: RMS norm, rotary embedding and softmax, each one fused pass
//! forward and one backward instead of the chain of element-wise ops (and their gradients) a composition makes.

use super::{f32_data, f32_of};
use candle_core::{Result, Tensor};

/// Fused CPU RMS norm whose backward is one fused pass too (the weight is frozen: no gradient for it).
pub(super) struct RmsNormOp {
    pub(super) weight: Tensor,
    pub(super) eps: f32,
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
            for ((o, &v), &g) in dst.iter_mut().zip(row).zip(w.iter()) {
                *o = v * inv * g;
            }
        }
        Ok((candle_core::CpuStorage::F32(out), layout.shape().clone()))
    }

    fn bwd(&self, x: &Tensor, _y: &Tensor, grad_y: &Tensor) -> Result<Option<Tensor>> {
        let dx = rms_norm_backward_f32(&f32_of(x)?, &f32_of(grad_y)?, &f32_of(&self.weight)?, self.eps);
        Ok(Some(Tensor::from_vec(dx, x.shape(), x.device())?))
    }
}

/// RMS norm's input gradient: dx = inv * (dy*w - xhat * mean(dy*w*xhat)), xhat = x * inv, per row of `w.len()`.
pub(super) fn rms_norm_backward_f32(xs: &[f32], dy: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let d = w.len();
    crate::engine::cpu_pool::new_f32_rows(xs.len(), d, |r, out| {
        let (row, drow) = (&xs[r * d..(r + 1) * d], &dy[r * d..(r + 1) * d]);
        let mean_sq = row.iter().map(|v| v * v).sum::<f32>() / d as f32;
        let inv = 1.0 / (mean_sq + eps).sqrt();
        let dot = row.iter().zip(drow).zip(w).map(|((&v, &g), &wv)| g * wv * v * inv).sum::<f32>() / d as f32;
        for (((o, &v), &g), &wv) in out.iter_mut().zip(row).zip(drow).zip(w) {
            *o = inv * (g * wv - v * inv * dot);
        }
    })
}

/// Rope on the CPU with a backward pass (the inverse rotation).
pub(super) struct RopeOp {
    pub(super) cos: Tensor,
    pub(super) sin: Tensor,
}

pub(super) fn rope_cpu(x: &[f32], dims: &[usize], cos: &[f32], sin: &[f32], sign: f32) -> Vec<f32> {
    let d = dims[dims.len() - 1];
    let t = dims[dims.len() - 2];
    let half = d / 2;
    crate::engine::cpu_pool::new_f32_rows(x.len(), d, |r, dst| {
        let (src, pos) = (&x[r * d..(r + 1) * d], r % t);
        let (c, s) = (&cos[pos * half..(pos + 1) * half], &sin[pos * half..(pos + 1) * half]);
        for j in 0..half {
            let (x1, x2) = (src[j], src[j + half]);
            let sj = sign * s[j];
            dst[j] = x1 * c[j] - x2 * sj;
            dst[j + half] = x2 * c[j] + x1 * sj;
        }
    })
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
pub(super) struct SoftmaxOp;

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
        let out = scaled_masked_softmax_f32(x, 1.0, None, 1, d);
        Ok((candle_core::CpuStorage::F32(out), layout.shape().clone()))
    }

    fn bwd(&self, x: &Tensor, y: &Tensor, grad_y: &Tensor) -> Result<Option<Tensor>> {
        let d = x.dims().last().copied().unwrap_or(1).max(1);
        let dx = softmax_backward_f32(&f32_of(y)?, &f32_of(grad_y)?, d, 1.0);
        Ok(Some(Tensor::from_vec(dx, x.shape(), x.device())?))
    }
}

/// Input gradient of `softmax(scale * x)` from its output `y`, rows of `d`: dx = scale * y * (dy - sum(dy * y)).
pub(super) fn softmax_backward_f32(ys: &[f32], dy: &[f32], d: usize, scale: f32) -> Vec<f32> {
    crate::engine::cpu_pool::new_f32_rows(ys.len(), d, |r, out| {
        let (yr, gr) = (&ys[r * d..(r + 1) * d], &dy[r * d..(r + 1) * d]);
        let dot: f32 = yr.iter().zip(gr).map(|(a, b)| a * b).sum();
        for ((o, &yv), &g) in out.iter_mut().zip(yr).zip(gr) {
            *o = scale * yv * (g - dot);
        }
    })
}

/// `softmax(scale * x + mask[row % t])` over rows of `d` = `mask`'s width, where `mask` is (t, d) and a row's
/// query position is its index modulo `t`: attention's scaling, masking and softmax in one pass.
pub(super) fn scaled_masked_softmax_f32(x: &[f32], scale: f32, mask: Option<&[f32]>, t: usize, d: usize) -> Vec<f32> {
    crate::engine::cpu_pool::new_f32_rows(x.len(), d, |r, dst| {
        let row = &x[r * d..(r + 1) * d];
        match mask {
            Some(mask) => {
                let m = &mask[(r % t) * d..(r % t + 1) * d];
                dst.iter_mut().zip(row).zip(m).for_each(|((o, &v), &mv)| *o = v * scale + mv);
            }
            None => dst.iter_mut().zip(row).for_each(|(o, &v)| *o = v * scale),
        }
        let max = dst.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0f32;
        for o in dst.iter_mut() {
            *o = (*o - max).exp();
            sum += *o;
        }
        let inv = 1.0 / sum;
        dst.iter_mut().for_each(|o| *o *= inv);
    })
}
