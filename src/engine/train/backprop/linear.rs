//! Forward and backward of one projection `y = x W^T + b + scale * dropout(x) A B` with a frozen `W` (and
//! bias) and a trainable adapter (A, B).
//!
//! Backward, for `dy`: the input gradient `dy W + (scale * dy B^T) A^T` (masked by the dropout where it
//! flows through the adapter), `dB = scale * (x A)^T dy` and `dA = x^T (scale * dy B^T)`. Nothing is spent
//! on the frozen weight.

use super::Gradients;
use crate::engine::model::linear::Linear;
use crate::engine::ops;
use candle_core::{DType, Result, Tensor};

/// What the backward pass needs from one projection's forward, beyond its input.
pub(super) struct LinearTape {
    /// Dropout mask applied to the adapter's input (None without dropout).
    mask: Option<Tensor>,
    /// `dropout(x) A` (rows, r), None when the projection has no active adapter.
    xa: Option<Tensor>,
}

/// The adapter's matrices in the compute dtype, when one is attached and enabled.
fn active_adapter(linear: &Linear, dtype: DType) -> Result<Option<(Tensor, Tensor, f64)>> {
    match &linear.adapter {
        Some(adapter) if linear.adapter_enabled => {
            let (a, b) = (adapter.a.as_tensor().detach(), adapter.b.as_tensor().detach());
            Ok(Some((a.to_dtype(dtype)?, b.to_dtype(dtype)?, adapter.scale)))
        }
        _ => Ok(None),
    }
}

/// `x`: (rows, in) -> (rows, out).
pub(super) fn forward(linear: &Linear, x: &Tensor, train: bool) -> Result<(Tensor, LinearTape)> {
    let mut y = ops::frozen_matmul_t(x, &linear.weight)?;
    if let Some(bias) = &linear.bias {
        y = y.broadcast_add(bias)?;
    }
    let Some((a, b, scale)) = active_adapter(linear, x.dtype())? else {
        return Ok((y, LinearTape { mask: None, xa: None }));
    };
    let adapter = linear.adapter.as_ref().expect("active adapter");
    let mask = if train && adapter.dropout > 0.0 { Some(adapter.dropout_mask(x)?) } else { None };
    let xa = match &mask {
        Some(mask) => ops::matmul(&(x * mask)?, &a)?,
        None => ops::matmul(x, &a)?,
    };
    let y = ops::add_scaled(&y, &ops::matmul(&xa, &b)?, scale)?;
    Ok((y, LinearTape { mask, xa: Some(xa) }))
}

/// Accumulates the adapter's gradients into `grads` and returns the input gradient when `need_input_grad`.
pub(super) fn backward(
    linear: &Linear,
    x: &Tensor,
    tape: &LinearTape,
    dy: &Tensor,
    grads: &mut Gradients,
    need_input_grad: bool,
) -> Result<Option<Tensor>> {
    let mut dx = if need_input_grad { Some(ops::frozen_matmul(dy, &linear.weight)?) } else { None };
    if let (Some((a, b, scale)), Some(xa)) = (active_adapter(linear, x.dtype())?, &tape.xa) {
        let adapter = linear.adapter.as_ref().expect("active adapter");
        let dxa = (ops::matmul(dy, &b.t()?)? * scale)?; // (rows, r)
        grads.add(adapter.b.as_tensor(), &(ops::matmul(&xa.t()?, dy)? * scale)?)?;
        let x_in = match &tape.mask {
            Some(mask) => (x * mask)?,
            None => x.clone(),
        };
        grads.add(adapter.a.as_tensor(), &ops::matmul(&x_in.t()?, &dxa)?)?;
        if let Some(dx) = dx.as_mut() {
            let mut through_adapter = ops::matmul(&dxa, &a.t()?)?;
            if let Some(mask) = &tape.mask {
                through_adapter = (through_adapter * mask)?;
            }
            *dx = ops::add(dx, &through_adapter)?;
        }
    }
    Ok(dx)
}
