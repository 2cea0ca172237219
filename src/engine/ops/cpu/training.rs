//! CPU f32 kernels of the training pass, each one parallel pass over rows instead of the chain of element-wise
//! ops a composition makes: the RMS-norm, rotary and softmax input gradients, and attention's scaled, masked
//! softmax.

/// RMS norm's input gradient: dx = inv * (dy*w - xhat * mean(dy*w*xhat)), xhat = x * inv, per row of `w.len()`.
pub(in crate::engine::ops) fn rms_norm_backward_f32(xs: &[f32], dy: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
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

/// Rotary embedding of rows of `d` (position = row index modulo the sequence length `dims[-2]`); with
/// `sign` -1 the inverse rotation, which is its gradient.
pub(in crate::engine::ops) fn rope_cpu(x: &[f32], dims: &[usize], cos: &[f32], sin: &[f32], sign: f32) -> Vec<f32> {
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

/// Input gradient of `softmax(scale * x)` from its output `y`, rows of `d`: dx = scale * y * (dy - sum(dy * y)).
pub(in crate::engine::ops) fn softmax_backward_f32(ys: &[f32], dy: &[f32], d: usize, scale: f32) -> Vec<f32> {
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
pub(in crate::engine::ops) fn scaled_masked_softmax_f32(
    x: &[f32],
    scale: f32,
    mask: Option<&[f32]>,
    t: usize,
    d: usize,
) -> Vec<f32> {
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
