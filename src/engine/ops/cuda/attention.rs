//! Fused (flash-style) attention on CUDA (src/engine/ops/cuda/flash_attention.cuh): the training forward, its
//! backward and the prefill, without the (T x T) scores. The forward keeps the output and each row's
//! logsumexp; the backward recomputes the probabilities tile by tile from them. Memory is linear in T.
//!
//! Causal, grouped-query (dK/dV summed over the heads of a group), sliding window, packed rows (several examples
//! in one row of the batch, attention never crossing one: each query sees no key before its example's start, a
//! per-query lower bound the kernels use like the window's, in their loop bounds and tile tests too); head_dim
//! 16, 32, 64 or 128; f32, bf16 and f16 storage with f32 accumulation. bf16/f16 at head_dim 64 and 128 run on
//! tensor cores (flash_attention_mma.cuh; on an H100/H200 warpgroup MMA, flash_attention_wgmma.cuh); f32 and the
//! small heads on f32 FMAs (exact to rounding). [`applies`] says when; `ops::fused_attention` composes otherwise.

use candle_core::{DType, Device, Result, Tensor};

/// Head sizes the kernels are instantiated for.
const HEAD_DIMS: [usize; 4] = [16, 32, 64, 128];

/// Whether the fused attention takes queries of `dtype` with `head_dim` on `device` (and the runtime options
/// did not turn it off: `--no-fused-attention`).
pub fn applies(device: &Device, dtype: DType, head_dim: usize) -> bool {
    cfg!(feature = "cuda")
        && device.is_cuda()
        && matches!(dtype, DType::F32 | DType::BF16 | DType::F16)
        && HEAD_DIMS.contains(&head_dim)
        && crate::engine::ops::kernel_choice::native()
        && crate::engine::runtime::options().fused_attention
}

/// What the forward keeps for the backward besides its inputs and output: the per-row logsumexp
/// (b, heads, tq) in f32, in the base-2 domain the kernels use.
#[derive(Debug, Clone)]
pub struct Logsumexp(pub(crate) Tensor);

/// `softmax(q k^T * scale + causal/window mask) v` for `q` (b, heads, tq, d) at positions `q_offset..` and
/// `k`/`v` (b, kv_heads, tk, d) (rows of d contiguous; a KV cache view may be strided otherwise): the output
/// (b, tq, heads * d) and the logsumexp. `window` 0: none. `row_starts` (u32 (b, tq), `q_offset` 0 and tq == tk
/// only): packed rows, where query i of row r sees no key before `row_starts[r, i]` (its own example's start).
pub fn forward(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    scale: f64,
    q_offset: usize,
    window: usize,
    row_starts: Option<&Tensor>,
) -> Result<(Tensor, Logsumexp)> {
    let (q, k, v) = (&even(&q.contiguous()?)?, &even(k)?, &even(v)?);
    let (out, lse) = imp::forward(q, k, v, scale as f32, q_offset, window, row_starts)?;
    Ok((out, Logsumexp(lse)))
}

/// Gradients (dq (b, heads, t, d), dk and dv (b, kv_heads, t, d)) of the training forward (`q_offset` 0,
/// tq == tk) given `out` and `d_out` (b * t, heads * d); `row_starts` as the forward had them.
#[allow(clippy::too_many_arguments)]
pub fn backward(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    out: &Tensor,
    lse: &Logsumexp,
    d_out: &Tensor,
    scale: f64,
    window: usize,
    row_starts: Option<&Tensor>,
) -> Result<(Tensor, Tensor, Tensor)> {
    let c = |t: &Tensor| even(&t.contiguous()?);
    let t = [&c(q)?, &c(k)?, &c(v)?, &c(out)?, &c(d_out)?];
    imp::backward(t, &lse.0.contiguous()?, scale as f32, window, row_starts)
}

/// `x`, copied when its view starts at an odd element: the tensor-core kernels read 16-bit elements in pairs.
fn even(x: &Tensor) -> Result<Tensor> {
    if x.layout().start_offset() % 2 == 1 {
        x.copy()
    } else {
        Ok(x.clone())
    }
}

#[cfg(feature = "cuda")]
mod imp {
    use crate::engine::ops::cuda::launch::{device_address, int, load, on_cuda, output, sm90a, view, with_dtype, wrap};
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::driver::{CudaView, LaunchConfig, PushKernelArg};
    use candle_core::cuda_backend::{CudaDType, WrapErr};
    use candle_core::{bail, CudaDevice, CudaStorage, DType, Layout, Result, Tensor};

    /// Rows a block owns and elements of a row per thread (FA_ROWS, FA_SLICE in the kernels).
    const ROWS: usize = 64;
    const SLICE: usize = 16;
    /// Dynamic shared memory of the head_dim 128 dK/dV kernel in the sm_90a build (FA_WG_DKV128_SMEM in
    /// flash_attention_wgmma.cuh: its K and V tiles sit in shared memory, over the 48 KiB a static allocation may
    /// take).
    const WGMMA_DKV128_SMEM: u32 = 67_584;

    fn suffix(dtype: DType) -> Result<&'static str> {
        Ok(match dtype {
            DType::F32 => "f32",
            DType::BF16 => "bf16",
            DType::F16 => "f16",
            other => bail!("fused attention takes f32, bf16 or f16, not {other:?}"),
        })
    }

    /// A view of a strided (b, n, t, d) tensor whose rows of d are contiguous, and its batch and head strides.
    fn strided<'a, T: CudaDType>(s: &'a CudaStorage, l: &Layout, what: &str) -> Result<(CudaView<'a, T>, i64, i64)> {
        let (dims, st) = (l.dims(), l.stride());
        if dims.len() != 4 || st[3] != 1 || (dims[2] > 1 && st[2] != dims[3]) {
            bail!("fused attention: {what} {:?} (strides {st:?}) needs contiguous rows", l.shape());
        }
        let span = (0..3).map(|i| (dims[i].max(1) - 1) * st[i]).sum::<usize>() + dims[3];
        let start = l.start_offset();
        Ok((s.as_cuda_slice::<T>()?.slice(start..start + span), st[0] as i64, st[1] as i64))
    }

    /// The kernels' `starts` argument: the device address of packed rows' starts, a contiguous u32 (b, t) tensor
    /// on `q`'s device, or 0 (null) without packing. The tensor outlives the launch (the caller holds it), and
    /// work on one stream reads it in order.
    fn starts_address(row_starts: Option<&Tensor>, q: &Tensor, (b, t): (usize, usize)) -> Result<u64> {
        let Some(starts) = row_starts else { return Ok(0) };
        if starts.dtype() != DType::U32
            || starts.dims() != [b, t]
            || !starts.is_contiguous()
            || !starts.device().same_device(q.device())
        {
            bail!(
                "fused attention: packed rows' starts must be a contiguous u32 ({b}, {t}) tensor on the queries' \
                 device, not {:?} {:?} on {:?}",
                starts.dtype(),
                starts.shape(),
                starts.device().location()
            )
        }
        device_address::<u32>(starts, "packed rows' starts")
    }

    /// Whether the tensor-core kernels run (bf16/f16 at head_dim 64 and 128: FlashMma in the kernels).
    fn tensor_cores(d: usize, dtype: DType) -> bool {
        matches!(dtype, DType::BF16 | DType::F16) && matches!(d, 64 | 128)
    }

    /// Blocks of ROWS rows: 4 warps on the tensor-core kernels, d / SLICE threads a row on the others.
    fn grid(rows: usize, heads: usize, b: usize, d: usize, dtype: DType) -> LaunchConfig {
        LaunchConfig {
            grid_dim: (rows.div_ceil(ROWS) as u32, heads as u32, b as u32),
            block_dim: (if tensor_cores(d, dtype) { 128 } else { (ROWS * d / SLICE) as u32 }, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// The forward's and dQ's grid: on the mma.sync tensor-core kernels at head_dim 64 a warp owns two tiles of 16
    /// query rows, so a block owns 128 rows (R_MMA of FwdTiles and DqTiles in the kernels); otherwise, and on the
    /// sm_90a (wgmma) kernels, as [`grid`].
    fn query_grid(dev: &CudaDevice, rows: usize, heads: usize, b: usize, d: usize, dtype: DType) -> LaunchConfig {
        let mut cfg = grid(rows, heads, b, d, dtype);
        if tensor_cores(d, dtype) && d == 64 && !sm90a(dev) {
            cfg.grid_dim.0 = rows.div_ceil(2 * ROWS) as u32;
        }
        cfg
    }

    pub fn forward(
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        scale: f32,
        q_offset: usize,
        window: usize,
        row_starts: Option<&Tensor>,
    ) -> Result<(Tensor, Tensor)> {
        let (b, heads, tq, d) = q.dims4()?;
        let (kb, kv_heads, tk, kd) = k.dims4()?;
        if kb != b || kd != d || v.dims() != k.dims() || v.stride() != k.stride() || heads % kv_heads != 0 {
            bail!("fused attention: q {:?} against k {:?} / v {:?}", q.shape(), k.shape(), v.shape());
        }
        if q_offset + tq > tk || q.dtype() != k.dtype() || v.dtype() != k.dtype() {
            bail!("fused attention: {tq} queries at {q_offset} over {tk} keys ({:?}/{:?})", q.dtype(), k.dtype());
        }
        if row_starts.is_some() && (q_offset != 0 || tq != tk) {
            bail!(
                "fused attention: packed rows' starts are for training (queries from position 0 over as many \
                 keys), not {tq} queries at {q_offset} over {tk} keys"
            )
        }
        let starts = starts_address(row_starts, q, (b, tq))?;
        let ((qs, ql), (ks, kl), (vs, vl)) = (q.storage_and_layout(), k.storage_and_layout(), v.storage_and_layout());
        let (qs, ks, vs) = (on_cuda(&qs, "q")?, on_cuda(&ks, "k")?, on_cuda(&vs, "v")?);
        let dev = qs.device().clone();
        let f = load!(&dev, &format!("flash_forward_d{d}_{}", suffix(q.dtype())?))?;
        let lse = output::<f32>(&dev, b * heads * tq)?;
        let out = with_dtype!(qs, T, {
            let out = output::<T>(&dev, b * tq * heads * d)?;
            let qv = view::<T>(qs, ql, "q")?;
            let (kv, bs, hs) = strided::<T>(ks, kl, "k")?;
            let (vv, _, _) = strided::<T>(vs, vl, "v")?;
            let mut a = f.builder();
            a.arg(&qv);
            a.arg(&kv);
            a.arg(&vv);
            a.arg(&out);
            a.arg(&lse);
            candle_core::builder_arg!(a, int(heads), int(kv_heads), int(tq), int(tk), bs, hs, int(q_offset));
            candle_core::builder_arg!(a, int(window), starts, scale);
            // SAFETY: arguments match the kernel's signature; every view spans what the kernel indexes (`starts`:
            // null, or the address of a checked (b, tq) u32 tensor that outlives this call).
            unsafe { a.launch(query_grid(&dev, tq, heads, b, d, q.dtype())) }.w()?;
            wrap(out, &dev, (b, tq, heads * d))
        });
        Ok((out, wrap(lse, &dev, (b, heads, tq))))
    }

    /// `[q, k, v, out, d_out]`, all contiguous.
    pub fn backward(
        t: [&Tensor; 5],
        lse: &Tensor,
        scale: f32,
        window: usize,
        row_starts: Option<&Tensor>,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let [q, k, _, out, d_out] = t;
        let (b, heads, tq, d) = q.dims4()?;
        let (_, kv_heads, tk, _) = k.dims4()?;
        let rows = b * tq * heads;
        if tq != tk || out.elem_count() != rows * d || d_out.elem_count() != rows * d || lse.dtype() != DType::F32 {
            bail!("fused attention backward: q {:?}, k {:?}, out {:?}", q.shape(), k.shape(), out.shape());
        }
        let starts = starts_address(row_starts, q, (b, tq))?;
        let guards = t.map(|x| x.storage_and_layout());
        let st: Vec<&CudaStorage> = guards.iter().map(|(s, _)| on_cuda(s, "input")).collect::<Result<_>>()?;
        let (ls, ll) = lse.storage_and_layout();
        let ls = on_cuda(&ls, "logsumexp")?;
        let dev = st[0].device().clone();
        let sfx = suffix(q.dtype())?;
        let func = |name: String| load!(&dev, &name);
        let (f_dq, f_dkv) =
            (func(format!("flash_backward_dq_d{d}_{sfx}"))?, func(format!("flash_backward_dkv_d{d}_{sfx}"))?);
        // rowsum(dO * O) per (b, head, query): the dQ kernel writes it, the dK/dV kernel after it reads it.
        let delta = output::<f32>(&dev, b * heads * tq)?;
        let lv = view::<f32>(ls, ll, "logsumexp")?;
        let grads = with_dtype!(st[0], T, {
            let v: Vec<CudaView<'_, T>> = ["q", "k", "v", "out", "d_out"]
                .iter()
                .zip(st.iter().zip(&guards))
                .map(|(what, (s, (_, l)))| view::<T>(s, l, what))
                .collect::<Result<_>>()?;
            let dq = output::<T>(&dev, b * heads * tq * d)?;
            let mut a = f_dq.builder();
            for x in &v {
                a.arg(x);
            }
            a.arg(&lv);
            a.arg(&delta);
            a.arg(&dq);
            candle_core::builder_arg!(a, int(heads), int(kv_heads), int(tq), int(window), starts, scale);
            // SAFETY: arguments match the kernel's signature; buffers are sized above (`starts` as in the forward).
            unsafe { a.launch(query_grid(&dev, tq, heads, b, d, q.dtype())) }.w()?;
            let (dk, dv) = (output::<T>(&dev, b * kv_heads * tk * d)?, output::<T>(&dev, b * kv_heads * tk * d)?);
            let mut a = f_dkv.builder();
            a.arg(&v[0]);
            a.arg(&v[1]);
            a.arg(&v[2]);
            a.arg(&v[4]);
            a.arg(&lv);
            a.arg(&delta);
            a.arg(&dk);
            a.arg(&dv);
            candle_core::builder_arg!(a, int(heads), int(kv_heads), int(tq), int(window), starts, scale);
            let mut cfg = grid(tk, kv_heads, b, d, q.dtype());
            if d == 128 && tensor_cores(d, q.dtype()) && sm90a(&dev) {
                use candle_core::cuda_backend::cudarc::driver::sys::CUfunction_attribute_enum as Attr;
                let bytes = WGMMA_DKV128_SMEM as i32;
                f_dkv.set_attribute(Attr::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, bytes).w()?;
                cfg.shared_mem_bytes = WGMMA_DKV128_SMEM;
            }
            // SAFETY: as above (and the dynamic shared memory the sm_90a head_dim 128 kernel indexes is given).
            unsafe { a.launch(cfg) }.w()?;
            let kv_shape = (b, kv_heads, tk, d);
            (wrap(dq, &dev, (b, heads, tq, d)), wrap(dk, &dev, kv_shape), wrap(dv, &dev, kv_shape))
        });
        Ok(grads)
    }
}

/// Without CUDA [`applies`] is false and callers never get here.
#[cfg(not(feature = "cuda"))]
mod imp {
    use candle_core::{bail, Result, Tensor};

    pub fn forward(
        _: &Tensor,
        _: &Tensor,
        _: &Tensor,
        _: f32,
        _: usize,
        _: usize,
        _: Option<&Tensor>,
    ) -> Result<(Tensor, Tensor)> {
        bail!("fused attention runs on CUDA only")
    }

    pub fn backward(
        _: [&Tensor; 5],
        _: &Tensor,
        _: f32,
        _: usize,
        _: Option<&Tensor>,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        bail!("fused attention runs on CUDA only")
    }
}
