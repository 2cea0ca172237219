//! Element-wise CPU f32 kernels: a gate `act(gate) * up` and `a + scale * b`, each one parallel pass over the
//! elements on the CPU team instead of a chain of Candle ops. None when the tensors are not CPU f32 of one shape
//! under the native kernels: the caller composes.

use candle_core::{Result, Tensor};

use super::host::f32_of;
use crate::engine::ops::kernel_choice::is_cpu_f32;

/// `act(gate) * up` in one parallel pass when both are CPU f32 tensors of one shape; None otherwise.
pub(in crate::engine::ops) fn gated_product(
    gate: &Tensor,
    up: &Tensor,
    act: impl Fn(f32) -> f32 + Sync,
) -> Result<Option<Tensor>> {
    if !(is_cpu_f32(gate) && is_cpu_f32(up) && gate.shape() == up.shape()) {
        return Ok(None);
    }
    let (g, u) = (f32_of(gate)?, f32_of(up)?);
    let (g, u): (&[f32], &[f32]) = (&g, &u);
    let chunk = crate::engine::cpu_pool::ELEMENTS_PER_TASK;
    let out = crate::engine::cpu_pool::new_f32(g.len(), chunk, |i, dst| {
        let (g, u) = (&g[i * chunk..], &u[i * chunk..]);
        for (j, o) in dst.iter_mut().enumerate() {
            *o = act(g[j]) * u[j];
        }
    });
    Ok(Some(Tensor::from_vec(out, gate.shape(), gate.device())?))
}

/// `a + scale * b` in one parallel pass for CPU f32 tensors of one shape (the training pass's residuals, adapter
/// outputs and gradient sums); None otherwise.
pub(in crate::engine::ops) fn add_scaled(a: &Tensor, b: &Tensor, scale: f64) -> Result<Option<Tensor>> {
    if !(is_cpu_f32(a) && is_cpu_f32(b) && a.shape() == b.shape()) {
        return Ok(None);
    }
    let (x, y) = (f32_of(a)?, f32_of(b)?);
    let (x, y): (&[f32], &[f32]) = (&x, &y);
    let (s, chunk) = (scale as f32, crate::engine::cpu_pool::ELEMENTS_PER_TASK);
    let out = crate::engine::cpu_pool::new_f32(x.len(), chunk, |i, dst| {
        let (x, y) = (&x[i * chunk..], &y[i * chunk..]);
        for (j, o) in dst.iter_mut().enumerate() {
            *o = x[j] + s * y[j];
        }
    });
    Ok(Some(Tensor::from_vec(out, a.shape(), a.device())?))
}
