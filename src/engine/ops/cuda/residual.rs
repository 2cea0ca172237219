//! The residual stream's add and the RMS norm beside it, fused on CUDA (src/engine/ops/cuda/fused.cu): forward,
//! `(x + delta, rms_norm(x + delta) * weight)` in one pass, each result in its own buffer (the decode step and
//! the training forward keep the sum and use the normed rows); backward, the norm's input gradient with the
//! residual branch's gradient added in the same pass. A composed add then norm reads and writes the stream
//! twice as often. The plain RMS norm on CUDA is the same kernels without the add (`ops::rms_norm`,
//! `ops::rms_norm_backward`), so a norm recomputed from a saved sum gives the forward's bits. f32 and bf16 on CUDA ([`super::availability::available`]); `ops::add_rms_norm` and
//! `ops::rms_norm_backward` compose elsewhere.

use candle_core::{Result, Tensor};

/// `(x + delta, rms_norm(x + delta) * weight)` for x, delta (..., hidden) of one shape and weight (hidden).
pub fn add_rms_norm(x: &Tensor, delta: &Tensor, weight: &Tensor, eps: f64) -> Result<(Tensor, Tensor)> {
    let (sum, normed) =
        imp::add_rms_norm(&x.contiguous()?, Some(&delta.contiguous()?), &weight.contiguous()?, eps as f32)?;
    let sum = sum.ok_or_else(|| candle_core::Error::Msg("add-rms-norm: the kernel wrote no sum".into()))?;
    Ok((sum, normed))
}

/// `rms_norm(x) * weight`: the same kernel without the add, so a sum [`add_rms_norm`] returned is normed again to
/// the same bits (gradient checkpointing recomputes a layer from its saved input sum).
pub fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64) -> Result<Tensor> {
    Ok(imp::add_rms_norm(&x.contiguous()?, None, &weight.contiguous()?, eps as f32)?.1)
}

/// The input gradient of `rms_norm(x, weight, eps)` (frozen weight) for the output gradient `dy`, plus
/// `addend` when given (of x's shape).
pub fn rms_norm_backward(
    x: &Tensor,
    weight: &Tensor,
    eps: f64,
    dy: &Tensor,
    addend: Option<&Tensor>,
) -> Result<Tensor> {
    let addend = addend.map(|a| a.contiguous()).transpose()?;
    imp::rms_norm_backward(&x.contiguous()?, &weight.contiguous()?, eps as f32, &dy.contiguous()?, addend.as_ref())
}

#[cfg(feature = "cuda")]
mod imp {
    use crate::engine::ops::cuda::launch::{func, int, on_cuda, output, view, with_dtype, wrap};
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
    use candle_core::cuda_backend::WrapErr;
    use candle_core::{bail, Result, Tensor};

    /// (rows, cols) of `x` after checking that `others` share its shape and `weight` holds one row; one block per
    /// row, as many threads as the row has 16-byte groups (32 to 512).
    fn rows(what: &str, x: &Tensor, others: &[&Tensor], weight: &Tensor) -> Result<(usize, usize, LaunchConfig)> {
        let cols = x.dims().last().copied().unwrap_or(1).max(1);
        let rows = x.elem_count() / cols;
        if let Some(o) = others.iter().find(|o| o.shape() != x.shape()) {
            bail!("{what}: shapes {:?} and {:?} differ", x.shape(), o.shape());
        }
        if weight.elem_count() != cols {
            bail!("{what}: weight {:?} for rows of {cols}", weight.shape());
        }
        let groups = cols.div_ceil(16 / x.dtype().size_in_bytes());
        let threads = groups.next_multiple_of(32).clamp(32, 512) as u32;
        Ok((
            rows,
            cols,
            LaunchConfig { grid_dim: (rows as u32, 1, 1), block_dim: (threads, 1, 1), shared_mem_bytes: 0 },
        ))
    }

    /// The add and norm kernel; without `delta` it norms x and returns no sum.
    pub fn add_rms_norm(
        x: &Tensor,
        delta: Option<&Tensor>,
        weight: &Tensor,
        eps: f32,
    ) -> Result<(Option<Tensor>, Tensor)> {
        let others: Vec<&Tensor> = delta.into_iter().collect();
        let (rows, cols, cfg) = rows("add-rms-norm", x, &others, weight)?;
        let ((xg, xl), (wg, wl)) = (x.storage_and_layout(), weight.storage_and_layout());
        let added = delta.map(|d| d.storage_and_layout());
        let (xs, ws) = (on_cuda(&xg, "x")?, on_cuda(&wg, "weight")?);
        let dev = xs.device().clone();
        let f = func!(xs, "add_rms_norm")?;
        with_dtype!(xs, T, {
            let sum = if delta.is_some() { Some(output::<T>(&dev, rows * cols)?) } else { None };
            let normed = output::<T>(&dev, rows * cols)?;
            {
                let (xv, wv) = (view::<T>(xs, xl, "x")?, view::<T>(ws, wl, "weight")?);
                let dv = match &added {
                    Some((dg, dl)) => Some(view::<T>(on_cuda(dg, "delta")?, dl, "delta")?),
                    None => None,
                };
                let null = 0u64; // the kernel reads no delta and writes no sum through null pointers
                let mut b = f.builder();
                b.arg(&xv);
                match &dv {
                    Some(dv) => b.arg(dv),
                    None => b.arg(&null),
                };
                b.arg(&wv);
                match &sum {
                    Some(sum) => b.arg(sum),
                    None => b.arg(&null),
                };
                b.arg(&normed);
                candle_core::builder_arg!(b, int(cols), eps);
                // SAFETY: arguments match the kernel's signature; the outputs hold rows * cols elements.
                unsafe { b.launch(cfg) }.w()?;
            }
            Ok((sum.map(|s| wrap(s, &dev, x.shape())), wrap(normed, &dev, x.shape())))
        })
    }

    pub fn rms_norm_backward(
        x: &Tensor,
        weight: &Tensor,
        eps: f32,
        dy: &Tensor,
        addend: Option<&Tensor>,
    ) -> Result<Tensor> {
        let others: Vec<&Tensor> = std::iter::once(dy).chain(addend).collect();
        let (rows, cols, cfg) = rows("rms-norm-backward", x, &others, weight)?;
        let ((xg, xl), (gg, gl), (wg, wl)) =
            (x.storage_and_layout(), dy.storage_and_layout(), weight.storage_and_layout());
        let added = addend.map(|a| a.storage_and_layout());
        let (xs, gs, ws) = (on_cuda(&xg, "x")?, on_cuda(&gg, "dy")?, on_cuda(&wg, "weight")?);
        let dev = xs.device().clone();
        let f = func!(xs, "rms_norm_backward")?;
        with_dtype!(xs, T, {
            let out = output::<T>(&dev, rows * cols)?;
            {
                let (xv, gv, wv) = (view::<T>(xs, xl, "x")?, view::<T>(gs, gl, "dy")?, view::<T>(ws, wl, "weight")?);
                let av = match &added {
                    Some((ag, al)) => Some(view::<T>(on_cuda(ag, "addend")?, al, "addend")?),
                    None => None,
                };
                let mut b = f.builder();
                b.arg(&xv);
                b.arg(&gv);
                b.arg(&wv);
                let null = 0u64; // the kernel reads no addend through a null pointer
                match &av {
                    Some(av) => b.arg(av),
                    None => b.arg(&null),
                };
                b.arg(&out);
                candle_core::builder_arg!(b, int(cols), eps);
                // SAFETY: arguments match the kernel's signature; the output holds rows * cols elements.
                unsafe { b.launch(cfg) }.w()?;
            }
            Ok(wrap(out, &dev, x.shape()))
        })
    }
}

/// Without CUDA the ops exist but refuse to run; `availability::available` is false, so callers never reach them.
#[cfg(not(feature = "cuda"))]
mod imp {
    use candle_core::{bail, Result, Tensor};

    pub fn add_rms_norm(_: &Tensor, _: Option<&Tensor>, _: &Tensor, _: f32) -> Result<(Option<Tensor>, Tensor)> {
        bail!("add-rms-norm runs on CUDA only (the fused kernels)")
    }
    pub fn rms_norm_backward(_: &Tensor, _: &Tensor, _: f32, _: &Tensor, _: Option<&Tensor>) -> Result<Tensor> {
        bail!("rms-norm-backward runs on CUDA only (the fused kernels)")
    }
}
