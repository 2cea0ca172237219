//! Fused CUDA kernels for the hand-written training pass (src/engine/ops/cuda/fused.cu): attention
//! probabilities, the split into heads with the rotary embedding (and back), the SwiGLU gate, scattering the
//! head's row gradients back, the head's cross-entropy, and the input gradients of softmax and the SwiGLU gate
//! (RMS norm's, with the residual add, in residual.rs). Composed from Candle ops
//! each is 5-15 launches and, in bf16, f32 copies of (tokens x width) or (heads x T x T) tensors; here one
//! pass. f32 and bf16 on CUDA ([`super::availability::available`]); the callers in ops/ compose otherwise.

use candle_core::{Result, Tensor};

/// `softmax(scale * scores + mask[row % t])` over the last dimension; `mask` (t, cols) in f32.
pub fn masked_softmax(scores: &Tensor, scale: f64, mask: Option<&Tensor>) -> Result<Tensor> {
    let mask = mask.map(|m| m.to_dtype(candle_core::DType::F32)?.contiguous()).transpose()?;
    scores.contiguous()?.apply_op1_no_bwd(&imp::MaskedSoftmax { scale: scale as f32, mask })
}

/// `scale * p * (dp - sum(dp * p))` per row: the input gradient of a scaled softmax from its output `p`.
pub fn softmax_backward(p: &Tensor, dp: &Tensor, scale: f64) -> Result<Tensor> {
    p.contiguous()?.apply_op2_no_bwd(&dp.contiguous()?, &imp::SoftmaxBackward { scale: scale as f32 })
}

/// Cross-entropy of each row of `logits` (rows, vocab) against `targets` (rows, u32, on the device): the
/// negative log-likelihood per row (rows, f32) and, with `grad_scale`, the logits' gradient
/// `grad_scale * (softmax - onehot)` in the logits' dtype, written over the logits (a chunk of a 128k vocabulary
/// is hundreds of megabytes: no second buffer) and returned as the same tensor. The caller hands over logits that
/// nothing else reads (a fresh product). One pass per row; no f32 copy of the logits.
pub fn cross_entropy_rows(
    logits: Tensor,
    targets: &Tensor,
    grad_scale: Option<f64>,
) -> Result<(Tensor, Option<Tensor>)> {
    imp::cross_entropy_rows(logits.contiguous()?, &targets.contiguous()?, grad_scale.map(|s| s as f32))
}

/// (b * t, n * d) rows -> (b, n, t, d) heads, rotated by the rope tables (cos, sin) (t, d / 2) when given; with
/// `backward`, (b, n, t, d) -> (b * t, n * d) rotated back (the gradient of the former). One pass either way.
pub fn heads_rope(
    x: &Tensor,
    (b, t, n, d): (usize, usize, usize, usize),
    rope: Option<(&Tensor, &Tensor)>,
    backward: bool,
) -> Result<Tensor> {
    let x = x.contiguous()?;
    let op = imp::HeadsRope { b, t, n, d, rotate: rope.is_some(), backward };
    match rope {
        Some((cos, sin)) => x.apply_op3_no_bwd(&cos.contiguous()?, &sin.contiguous()?, &op),
        None => x.apply_op3_no_bwd(&x, &x, &op),
    }
}

/// Gradients of `silu(gate) * up` with respect to gate and up.
pub fn silu_mul_backward(gate: &Tensor, up: &Tensor, dm: &Tensor) -> Result<(Tensor, Tensor)> {
    let both = gate.contiguous()?.apply_op3_no_bwd(&up.contiguous()?, &dm.contiguous()?, &imp::SiluMulBackward)?;
    Ok((both.get(0)?, both.get(1)?))
}

/// `silu(gate) * up` in one pass.
pub fn silu_mul(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    gate.contiguous()?.apply_op2_no_bwd(&up.contiguous()?, &imp::SiluMul)
}

/// A (rows, cols) tensor of zeros but for row `index[i]`, which is row i of `src` (n, cols); `index` (n) u32
/// on the device, distinct values.
pub fn scatter_rows(src: &Tensor, index: &Tensor, rows: usize) -> Result<Tensor> {
    let (n, cols) = src.dims2()?;
    if index.dims1()? != n || index.dtype() != candle_core::DType::U32 {
        candle_core::bail!("scatter-rows: index {:?} does not list the {n} source rows", index.shape());
    }
    let out = Tensor::zeros((rows, cols), src.dtype(), src.device())?;
    out.inplace_op3(&src.contiguous()?, &index.contiguous()?, &imp::ScatterRows)?;
    Ok(out)
}

/// Row `index[i]` of `src` (rows, cols) as row i of the result (n, cols); `index` (n) u32 on the device. Candle's
/// index_select moves an element per thread; this moves 16 bytes (the embedding's lookup and the head's target
/// rows at 1 x 4096 in bf16: 73 -> 11 us each on the lent H100).
pub fn gather_rows(src: &Tensor, index: &Tensor) -> Result<Tensor> {
    src.contiguous()?.apply_op2_no_bwd(&index.contiguous()?, &imp::GatherRows)
}

/// `x` times the dropout mask of `ops::dropout`'s generator from `base` (kept below `threshold`, kept values
/// `scale`), the mask never written (one pass).
pub fn dropout_apply(x: &Tensor, base: u64, threshold: u32, scale: f32) -> Result<Tensor> {
    x.contiguous()?.apply_op1_no_bwd(&imp::DropoutApply { base, threshold, scale })
}

#[cfg(feature = "cuda")]
mod imp {
    use crate::engine::ops::cuda::launch::{func, grid_stride, int, output, view, with_dtype, wrap};
    use crate::engine::ops::cuda::refuse::refuse_cpu;
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
    use candle_core::cuda_backend::WrapErr;
    use candle_core::{bail, CudaStorage, Layout, Result, Shape, Tensor};

    /// One block of 256 threads for each of `rows` rows.
    fn block_per_row(rows: usize) -> LaunchConfig {
        LaunchConfig { grid_dim: (rows as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 }
    }

    /// [`block_per_row`] over the rows of `cols` (the last dimension) of `layout`: (rows, cols, launch).
    fn per_row(layout: &Layout) -> (usize, usize, LaunchConfig) {
        let cols = layout.shape().dims().last().copied().unwrap_or(1).max(1);
        let rows = layout.shape().elem_count() / cols;
        (rows, cols, block_per_row(rows))
    }

    fn same_shape(a: &Layout, b: &Layout, what: &str) -> Result<()> {
        if a.shape() != b.shape() {
            bail!("{what}: shapes {:?} and {:?} differ", a.shape(), b.shape());
        }
        Ok(())
    }

    pub struct MaskedSoftmax {
        pub scale: f32,
        pub mask: Option<Tensor>,
    }

    impl candle_core::CustomOp1 for MaskedSoftmax {
        fn name(&self) -> &'static str {
            "masked-softmax"
        }

        refuse_cpu!(CustomOp1, "masked-softmax");

        fn cuda_fwd(&self, x: &CudaStorage, layout: &Layout) -> Result<(CudaStorage, Shape)> {
            let (rows, cols, cfg) = per_row(layout);
            let dev = x.device().clone();
            let f = func!(x, "masked_softmax")?;
            let mask = self.mask.as_ref().map(|m| m.storage_and_layout());
            let t = match &self.mask {
                Some(m) => {
                    let (t, mask_cols) = m.dims2()?;
                    if mask_cols != cols || rows % t != 0 {
                        bail!("masked-softmax: mask {:?} does not fit scores {:?}", m.shape(), layout.shape());
                    }
                    t
                }
                None => 1,
            };
            let slice = with_dtype!(x, T, {
                let out = output::<T>(&dev, rows * cols)?;
                let input = view::<T>(x, layout, "scores")?;
                let mut b = f.builder();
                b.arg(&input);
                let mask_view = match &mask {
                    Some((storage, l)) => match &**storage {
                        candle_core::Storage::Cuda(s) => Some(view::<f32>(s, l, "mask")?),
                        _ => bail!("masked-softmax: the mask is not on the GPU"),
                    },
                    None => None,
                };
                let null: u64 = 0;
                match &mask_view {
                    Some(v) => b.arg(v),
                    None => b.arg(&null),
                };
                b.arg(&out);
                candle_core::builder_arg!(b, int(cols), int(t), self.scale);
                // SAFETY: arguments match the kernel's signature; buffers are sized above.
                unsafe { b.launch(cfg) }.w()?;
                CudaStorage::wrap_cuda_slice(out, dev.clone())
            });
            Ok((slice, layout.shape().clone()))
        }
    }

    pub struct SoftmaxBackward {
        pub scale: f32,
    }

    impl candle_core::CustomOp2 for SoftmaxBackward {
        fn name(&self) -> &'static str {
            "softmax-backward"
        }

        refuse_cpu!(CustomOp2, "softmax-backward");

        fn cuda_fwd(
            &self,
            p: &CudaStorage,
            pl: &Layout,
            dp: &CudaStorage,
            dl: &Layout,
        ) -> Result<(CudaStorage, Shape)> {
            same_shape(pl, dl, "softmax-backward")?;
            let (rows, cols, cfg) = per_row(pl);
            let dev = p.device().clone();
            let f = func!(p, "softmax_backward")?;
            let slice = with_dtype!(p, T, {
                let out = output::<T>(&dev, rows * cols)?;
                let (pv, dv) = (view::<T>(p, pl, "p")?, view::<T>(dp, dl, "dp")?);
                let mut b = f.builder();
                b.arg(&pv);
                b.arg(&dv);
                b.arg(&out);
                candle_core::builder_arg!(b, int(cols), self.scale);
                // SAFETY: arguments match the kernel's signature; buffers are sized above.
                unsafe { b.launch(cfg) }.w()?;
                CudaStorage::wrap_cuda_slice(out, dev.clone())
            });
            Ok((slice, pl.shape().clone()))
        }
    }

    pub fn cross_entropy_rows(
        logits: Tensor,
        targets: &Tensor,
        scale: Option<f32>,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let (rows, vocab) = logits.dims2()?;
        if targets.dims1()? != rows || targets.dtype() != candle_core::DType::U32 {
            bail!("cross-entropy: {:?} targets for logits {:?}", targets.shape(), logits.shape());
        }
        let nll = {
            let ((ls, ll), (ts, tl)) = (logits.storage_and_layout(), targets.storage_and_layout());
            let (candle_core::Storage::Cuda(ls), candle_core::Storage::Cuda(ts)) = (&*ls, &*ts) else {
                bail!("cross-entropy: logits and targets must be on the GPU")
            };
            let dev = ls.device().clone();
            let f = func!(ls, "cross_entropy_rows")?;
            let nll = output::<f32>(&dev, rows)?;
            let cfg = LaunchConfig { grid_dim: (rows as u32, 1, 1), block_dim: (1024, 1, 1), shared_mem_bytes: 0 };
            with_dtype!(ls, T, {
                let (x, t) = (view::<T>(ls, ll, "logits")?, view::<u32>(ts, tl, "targets")?);
                let mut b = f.builder();
                b.arg(&x);
                b.arg(&t);
                let null: u64 = 0;
                // The gradient goes over the logits (the caller's tensor, which nothing else reads).
                match scale {
                    Some(_) => b.arg(&x),
                    None => b.arg(&null),
                };
                b.arg(&nll);
                candle_core::builder_arg!(b, int(vocab), scale.unwrap_or(0.0));
                // SAFETY: arguments match the kernel's signature; `nll` holds one value per row, and the kernel may
                // write its gradient over the logits (each element read before it is written, by the same thread).
                unsafe { b.launch(cfg) }.w()?;
            });
            wrap(nll, &dev, rows)
        };
        Ok((nll, scale.map(|_| logits)))
    }

    pub struct SiluMul;

    impl candle_core::CustomOp2 for SiluMul {
        fn name(&self) -> &'static str {
            "silu-mul"
        }

        refuse_cpu!(CustomOp2, "silu-mul");

        fn cuda_fwd(&self, g: &CudaStorage, gl: &Layout, u: &CudaStorage, ul: &Layout) -> Result<(CudaStorage, Shape)> {
            same_shape(gl, ul, "silu-mul")?;
            let n = gl.shape().elem_count();
            let dev = g.device().clone();
            let f = func!(g, "silu_mul")?;
            let slice = with_dtype!(g, T, {
                let out = output::<T>(&dev, n)?;
                let (gv, uv) = (view::<T>(g, gl, "gate")?, view::<T>(u, ul, "up")?);
                let mut b = f.builder();
                b.arg(&gv);
                b.arg(&uv);
                b.arg(&out);
                candle_core::builder_arg!(b, n as u64);
                // SAFETY: arguments match the kernel's signature; buffers are sized above.
                unsafe { b.launch(grid_stride(n)) }.w()?;
                CudaStorage::wrap_cuda_slice(out, dev.clone())
            });
            Ok((slice, gl.shape().clone()))
        }
    }

    pub struct GatherRows;

    impl candle_core::CustomOp2 for GatherRows {
        fn name(&self) -> &'static str {
            "gather-rows"
        }

        refuse_cpu!(CustomOp2, "gather-rows");

        fn cuda_fwd(&self, s: &CudaStorage, sl: &Layout, i: &CudaStorage, il: &Layout) -> Result<(CudaStorage, Shape)> {
            let (rows, cols) = sl.shape().dims2()?;
            let n = il.shape().dims1()?;
            let dev = s.device().clone();
            let f = func!(s, "gather_rows")?;
            let idx = view::<u32>(i, il, "index")?;
            let slice = with_dtype!(s, T, {
                let out = output::<T>(&dev, n * cols)?;
                if n > 0 {
                    let sv = view::<T>(s, sl, "source rows")?;
                    let mut b = f.builder();
                    b.arg(&sv);
                    b.arg(&idx);
                    b.arg(&out);
                    candle_core::builder_arg!(b, int(cols), rows as u32);
                    // SAFETY: arguments match the kernel's signature; `out` holds n rows, and the kernel stops on an
                    // index past `rows`.
                    unsafe { b.launch(block_per_row(n)) }.w()?;
                }
                CudaStorage::wrap_cuda_slice(out, dev.clone())
            });
            Ok((slice, Shape::from((n, cols))))
        }
    }

    pub struct DropoutApply {
        pub base: u64,
        pub threshold: u32,
        pub scale: f32,
    }

    impl candle_core::CustomOp1 for DropoutApply {
        fn name(&self) -> &'static str {
            "dropout-apply"
        }

        refuse_cpu!(CustomOp1, "dropout-apply");

        fn cuda_fwd(&self, x: &CudaStorage, xl: &Layout) -> Result<(CudaStorage, Shape)> {
            let n = xl.shape().elem_count();
            let dev = x.device().clone();
            let f = func!(x, "dropout_apply")?;
            let slice = with_dtype!(x, T, {
                let out = output::<T>(&dev, n.max(1))?;
                let xv = view::<T>(x, xl, "input")?;
                let mut b = f.builder();
                b.arg(&xv);
                b.arg(&out);
                candle_core::builder_arg!(b, n as u64, self.base, self.threshold, self.scale);
                // SAFETY: arguments match the kernel's signature; `out` holds the n values it writes.
                unsafe { b.launch(grid_stride(n)) }.w()?;
                CudaStorage::wrap_cuda_slice(out, dev.clone())
            });
            Ok((slice, xl.shape().clone()))
        }
    }

    pub struct ScatterRows;

    impl candle_core::InplaceOp3 for ScatterRows {
        fn name(&self) -> &'static str {
            "scatter-rows"
        }

        refuse_cpu!(InplaceOp3, "scatter-rows");

        fn cuda_fwd(
            &self,
            out: &mut CudaStorage,
            ol: &Layout,
            src: &CudaStorage,
            sl: &Layout,
            index: &CudaStorage,
            il: &Layout,
        ) -> Result<()> {
            let (n, cols) = sl.shape().dims2()?;
            if ol.shape().dims2()?.1 != cols || ol.contiguous_offsets().is_none() {
                bail!("scatter-rows: output {:?} does not take rows of {cols}", ol.shape());
            }
            if n == 0 {
                return Ok(());
            }
            let f = func!(src, "scatter_rows")?;
            let idx = view::<u32>(index, il, "index")?;
            with_dtype!(src, T, {
                let sv = view::<T>(src, sl, "source rows")?;
                let (start, end) = ol.contiguous_offsets().expect("checked above");
                let mut ov = out.as_cuda_slice_mut::<T>()?.slice_mut(start..end);
                let mut b = f.builder();
                b.arg(&sv);
                b.arg(&idx);
                b.arg(&mut ov);
                candle_core::builder_arg!(b, int(cols));
                // SAFETY: arguments match the kernel's signature; every index is a row of `out` (the caller's
                // positions within the batch).
                unsafe { b.launch(block_per_row(n)) }.w()?;
            });
            Ok(())
        }
    }

    pub struct HeadsRope {
        pub b: usize,
        pub t: usize,
        pub n: usize,
        pub d: usize,
        pub rotate: bool,
        pub backward: bool,
    }

    impl candle_core::CustomOp3 for HeadsRope {
        fn name(&self) -> &'static str {
            "heads-rope"
        }

        refuse_cpu!(CustomOp3, "heads-rope");

        fn cuda_fwd(
            &self,
            x: &CudaStorage,
            xl: &Layout,
            cos: &CudaStorage,
            cl: &Layout,
            sin: &CudaStorage,
            sl: &Layout,
        ) -> Result<(CudaStorage, Shape)> {
            let Self { b, t, n, d, rotate, backward } = *self;
            let count = b * t * n * d;
            if xl.shape().elem_count() != count || !d.is_multiple_of(2) {
                bail!("heads-rope: {:?} is not {b} x {t} rows of {n} heads of {d}", xl.shape());
            }
            if rotate && (cl.shape().dims() != [t, d / 2] || sl.shape() != cl.shape()) {
                bail!("heads-rope: rope tables {:?} / {:?} for {t} positions of {d}", cl.shape(), sl.shape());
            }
            if count == 0 {
                bail!("heads-rope: nothing to split");
            }
            let dev = x.device().clone();
            let f = func!(x, "heads_rope")?;
            let slice = with_dtype!(x, T, {
                let out = output::<T>(&dev, count)?;
                let xv = view::<T>(x, xl, "rows")?;
                let (cv, sv) = (view::<T>(cos, cl, "cos")?, view::<T>(sin, sl, "sin")?);
                let mut lb = f.builder();
                lb.arg(&xv);
                lb.arg(&cv);
                lb.arg(&sv);
                lb.arg(&out);
                candle_core::builder_arg!(lb, int(b), int(t), int(n), int(d), rotate as i32, backward as i32);
                // Threads for the kernel's units: 16-byte groups of pairs where the half-head splits into them.
                let group = 16 / std::mem::size_of::<T>();
                let units = if (d / 2) % group == 0 { count / 2 / group } else { count / 2 };
                // SAFETY: arguments match the kernel's signature; `out` holds `count` elements and the tables
                // (t, d / 2) were checked above (unread without `rotate`).
                unsafe { lb.launch(grid_stride(units)) }.w()?;
                CudaStorage::wrap_cuda_slice(out, dev.clone())
            });
            let shape = if backward { Shape::from((b * t, n * d)) } else { Shape::from((b, n, t, d)) };
            Ok((slice, shape))
        }
    }

    pub struct SiluMulBackward;

    impl candle_core::CustomOp3 for SiluMulBackward {
        fn name(&self) -> &'static str {
            "silu-mul-backward"
        }

        refuse_cpu!(CustomOp3, "silu-mul-backward");

        fn cuda_fwd(
            &self,
            g: &CudaStorage,
            gl: &Layout,
            u: &CudaStorage,
            ul: &Layout,
            d: &CudaStorage,
            dl: &Layout,
        ) -> Result<(CudaStorage, Shape)> {
            same_shape(gl, ul, "silu-mul-backward")?;
            same_shape(gl, dl, "silu-mul-backward")?;
            let n = gl.shape().elem_count();
            let dev = g.device().clone();
            let f = func!(g, "silu_mul_backward")?;
            let slice = with_dtype!(g, T, {
                let out = output::<T>(&dev, 2 * n)?;
                let (gv, uv, dv) = (view::<T>(g, gl, "gate")?, view::<T>(u, ul, "up")?, view::<T>(d, dl, "grad")?);
                let mut b = f.builder();
                b.arg(&gv);
                b.arg(&uv);
                b.arg(&dv);
                b.arg(&out);
                candle_core::builder_arg!(b, n as u64);
                // SAFETY: arguments match the kernel's signature; buffers are sized above.
                unsafe { b.launch(grid_stride(n)) }.w()?;
                CudaStorage::wrap_cuda_slice(out, dev.clone())
            });
            let mut dims = vec![2];
            dims.extend_from_slice(gl.shape().dims());
            Ok((slice, Shape::from(dims)))
        }
    }
}

/// Without CUDA the ops exist but refuse to run; `available` is false, so callers never reach them.
#[cfg(not(feature = "cuda"))]
mod imp {
    use crate::engine::ops::cuda::refuse::cpu_only_op;

    #[allow(dead_code)]
    pub struct MaskedSoftmax {
        pub scale: f32,
        pub mask: Option<candle_core::Tensor>,
    }
    #[allow(dead_code)]
    pub struct SoftmaxBackward {
        pub scale: f32,
    }
    #[allow(dead_code)]
    pub struct HeadsRope {
        pub b: usize,
        pub t: usize,
        pub n: usize,
        pub d: usize,
        pub rotate: bool,
        pub backward: bool,
    }
    pub struct SiluMulBackward;
    pub struct SiluMul;
    pub struct ScatterRows;
    pub struct GatherRows;
    #[allow(dead_code)]
    pub struct DropoutApply {
        pub base: u64,
        pub threshold: u32,
        pub scale: f32,
    }
    cpu_only_op!(DropoutApply, CustomOp1, "dropout-apply");
    cpu_only_op!(HeadsRope, CustomOp3, "heads-rope");
    cpu_only_op!(SiluMul, CustomOp2, "silu-mul");
    cpu_only_op!(ScatterRows, InplaceOp3, "scatter-rows");
    cpu_only_op!(GatherRows, CustomOp2, "gather-rows");
    cpu_only_op!(MaskedSoftmax, CustomOp1, "masked-softmax");
    cpu_only_op!(SoftmaxBackward, CustomOp2, "softmax-backward");
    cpu_only_op!(SiluMulBackward, CustomOp3, "silu-mul-backward");

    pub fn cross_entropy_rows(
        _: candle_core::Tensor,
        _: &candle_core::Tensor,
        _: Option<f32>,
    ) -> candle_core::Result<(candle_core::Tensor, Option<candle_core::Tensor>)> {
        candle_core::bail!("cross-entropy rows run on CUDA only (the fused kernels)")
    }
}
