//! Fused CUDA kernels for decoding one token at a time (src/engine/ops/cuda/fused.cu): there each Candle op
//! is a kernel launch, and launches, not arithmetic, set the pace. A decoder layer takes ten launches with
//! these instead of about twenty-one composed ones.
//!
//! - [`add_rms_norm`]: residual add and the following RMS norm in one pass (both results returned).
//! - [`silu_mul_halves`]: SwiGLU on a fused gate|up product.
//! - [`kv_write`]: rotate the new keys and write keys and values into the layer's cache in place.
//! - [`attention`]: one query per head against the cache, rotating the query on the way in; the keys are cut
//!   into shares, a block each, and the shares merged by a second launch (flash-decoding), so the whole GPU
//!   works on it at any context length.
//! - [`argmax`]: the index of the largest of a row of f32 logits (greedy sampling reads back one id).
//!
//! The cache write and the attention take the token's position either as a number or, for a step captured in a
//! CUDA graph (model/decode_graph.rs) and replayed at every position, from a one-element u32 tensor on the device.
//!
//! Only f32 and bf16 on CUDA; [`available`] says when a caller may use them. Launch plumbing: launch.rs.

use candle_core::{Result, Tensor};

pub use super::availability::available;

/// Whether decoding on this device and dtype takes the fused kernels: they exist there and the runtime options
/// did not turn them off (`--no-fused-decode`, for A/B comparisons).
pub fn enabled(device: &candle_core::Device, dtype: candle_core::DType) -> bool {
    available(device, dtype) && crate::engine::runtime::options().fused_decode
}

/// Shapes of the attention for one decoded token.
#[derive(Debug, Clone, Copy)]
pub struct DecodeShape {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Position of the new token; the cache holds `pos + 1` positions after [`kv_write`]. With a device
    /// position (see [`kv_write`]) this is the position the host checks bounds with, not the one used.
    pub pos: usize,
    /// Sliding window: keys `window` or more positions back are not seen (0: no window).
    pub window: usize,
}

/// `(x + delta, rms_norm(x + delta) * weight)`: the residual add and the norm after it (residual.rs).
pub use super::residual::add_rms_norm;

/// `silu(gate) * up` for `gate_up` (..., 2 * inter) holding gate then up: (..., inter).
pub fn silu_mul_halves(gate_up: &Tensor) -> Result<Tensor> {
    gate_up.contiguous()?.apply_op1_no_bwd(&imp::SiluMulHalves)
}

/// Write the token's rotated keys and its values from `qkv` (b, 1, (heads + 2 kv) * d) into `cache`
/// (2, b, kv, capacity, d) at `shape.pos`, or at the value of `position` (a u32 tensor of one element on the
/// device) when given: the kernel then reads it when it runs, and the caller keeps it below the capacity and
/// the rotary table's length. `rope`: (positions, d) rows of [cos | sin] in f32.
pub fn kv_write(
    cache: &Tensor,
    qkv: &Tensor,
    rope: &Tensor,
    shape: DecodeShape,
    position: Option<&Tensor>,
) -> Result<()> {
    cache.inplace_op3(&qkv.contiguous()?, rope, &imp::KvWrite { shape, position: position.cloned() })
}

/// Attention output (b, 1, heads * d) of the token in `qkv` over the cache's first `pos + 1` positions
/// (`position` as in [`kv_write`]).
pub fn attention(
    qkv: &Tensor,
    cache: &Tensor,
    rope: &Tensor,
    shape: DecodeShape,
    position: Option<&Tensor>,
) -> Result<Tensor> {
    qkv.contiguous()?.apply_op3_no_bwd(cache, rope, &imp::Attention { shape, position: position.cloned() })
}

/// The index of the largest value of the f32 row `logits` (the first on ties; NaN never wins), read back to the
/// host. Two launches over the whole GPU; Candle's argmax reduces a row in one block (67 us for a 128k
/// vocabulary on an H100, as long as a layer's whole decode step).
pub fn argmax(logits: &Tensor) -> Result<u32> {
    let row = logits.flatten_all()?.contiguous()?;
    row.apply_op1_no_bwd(&imp::Argmax)?.to_scalar::<u32>()
}

#[cfg(feature = "cuda")]
mod imp {
    use crate::engine::ops::cuda::decode::DecodeShape;
    use crate::engine::ops::cuda::refuse::refuse_cpu;
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
    use candle_core::cuda_backend::WrapErr;
    use candle_core::{bail, CudaStorage, Layout, Result, Shape, Tensor};

    use crate::engine::ops::cuda::launch::{func, int, output, view, with_dtype};

    pub struct Argmax;

    impl candle_core::CustomOp1 for Argmax {
        fn name(&self) -> &'static str {
            "argmax-row"
        }

        refuse_cpu!(CustomOp1, "argmax-row");

        fn cuda_fwd(&self, x: &CudaStorage, layout: &Layout) -> Result<(CudaStorage, Shape)> {
            use candle_core::cuda_backend::cudarc::driver::CudaSlice;
            let n = layout.shape().elem_count();
            if x.dtype() != candle_core::DType::F32 || n == 0 {
                bail!("argmax-row: a non-empty f32 row, not {:?} {:?}", x.dtype(), layout.shape());
            }
            let dev = x.device().clone();
            let values = view::<f32>(x, layout, "logits")?;
            // ARGMAX_THREADS in fused.cu; a block per 4,096 values, at most 256.
            let parts = n.div_ceil(4096).clamp(1, 256);
            let (pmax, pidx): (CudaSlice<f32>, CudaSlice<u32>) = (output(&dev, parts)?, output(&dev, parts)?);
            let out = output::<u32>(&dev, 1)?;
            let threads = LaunchConfig { grid_dim: (parts as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
            let partial = func!(x, "argmax_partial")?;
            let mut b = partial.builder();
            b.arg(&values);
            candle_core::builder_arg!(b, int(n));
            b.arg(&pmax);
            b.arg(&pidx);
            // SAFETY: arguments match the kernel's signature; the partial buffers hold `parts` entries.
            unsafe { b.launch(threads) }.w()?;
            let last = func!(x, "argmax_final")?;
            let mut b = last.builder();
            b.arg(&pmax);
            b.arg(&pidx);
            candle_core::builder_arg!(b, int(parts));
            b.arg(&out);
            let one = LaunchConfig { grid_dim: (1, 1, 1), ..threads };
            // SAFETY: as above; one block reads the `parts` partials and writes one index.
            unsafe { b.launch(one) }.w()?;
            Ok((CudaStorage::wrap_cuda_slice(out, dev.clone()), Shape::from(())))
        }
    }

    pub struct SiluMulHalves;

    impl candle_core::CustomOp1 for SiluMulHalves {
        fn name(&self) -> &'static str {
            "silu-mul-halves"
        }

        refuse_cpu!(CustomOp1, "silu-mul-halves");

        fn cuda_fwd(&self, gu: &CudaStorage, layout: &Layout) -> Result<(CudaStorage, Shape)> {
            let dims = layout.shape().dims();
            let inter = dims[dims.len() - 1] / 2;
            let rows = layout.shape().elem_count() / (2 * inter).max(1);
            let dev = gu.device().clone();
            let f = func!(gu, "silu_mul_halves")?;
            let slice = with_dtype!(gu, T, {
                let out = output::<T>(&dev, rows * inter)?;
                let input = view::<T>(gu, layout, "gate_up")?;
                let mut b = f.builder();
                b.arg(&input);
                b.arg(&out);
                candle_core::builder_arg!(b, int(rows), int(inter));
                let blocks = (rows * inter).div_ceil(256).min(4096) as u32;
                let cfg = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
                // SAFETY: arguments match the kernel's signature; buffers are sized above.
                unsafe { b.launch(cfg) }.w()?;
                CudaStorage::wrap_cuda_slice(out, dev.clone())
            });
            let mut out_dims = dims.to_vec();
            *out_dims.last_mut().expect("non-empty shape") = inter;
            Ok((slice, Shape::from(out_dims)))
        }
    }

    /// Checks shared by the cache write and the attention: qkv (b, 1, (h + 2 kv) d), cache (2, b, kv, cap, d),
    /// rope (positions, d) f32. Returns (b, cap).
    fn check(shape: &DecodeShape, qkv: &Layout, cache: &Layout, rope: &Layout) -> Result<(usize, usize)> {
        let s = shape;
        let (two, b, kv, cap, d) = cache.shape().dims5()?;
        let width = (s.heads + 2 * s.kv_heads) * s.head_dim;
        if two != 2 || kv != s.kv_heads || d != s.head_dim || qkv.shape().elem_count() != b * width {
            bail!("fused decode: cache {:?} does not fit qkv {:?}", cache.shape(), qkv.shape());
        }
        if s.pos >= cap || rope.shape().dims2()?.1 != d || s.pos >= rope.shape().dims2()?.0 {
            bail!("fused decode: position {} outside the cache ({cap}) or rotary table {:?}", s.pos, rope.shape());
        }
        if d > 256 || d % 2 != 0 || !s.heads.is_multiple_of(s.kv_heads) || cache.contiguous_offsets().is_none() {
            bail!("fused decode: unsupported head layout (d={d}, heads={}, kv={})", s.heads, s.kv_heads);
        }
        Ok((b, cap))
    }

    /// The device address of a position tensor (see `kv_write`), or 0 (null: the kernel takes `pos`). The
    /// tensor outlives every launch that reads it: the op holds a clone, and a captured graph's owner keeps it.
    fn position_address(position: Option<&Tensor>) -> Result<u64> {
        let Some(position) = position else { return Ok(0) };
        if position.dtype() != candle_core::DType::U32 || position.elem_count() != 1 {
            bail!("fused decode: the position must be one u32, not {:?} {:?}", position.dtype(), position.shape());
        }
        crate::engine::ops::cuda::launch::device_address::<u32>(position, "the fused decode's position")
    }

    pub struct KvWrite {
        pub shape: DecodeShape,
        pub position: Option<Tensor>,
    }

    impl candle_core::InplaceOp3 for KvWrite {
        fn name(&self) -> &'static str {
            "kv-write"
        }

        refuse_cpu!(InplaceOp3, "kv-write");

        fn cuda_fwd(
            &self,
            cache: &mut CudaStorage,
            cl: &Layout,
            qkv: &CudaStorage,
            ql: &Layout,
            rope: &CudaStorage,
            rl: &Layout,
        ) -> Result<()> {
            let s = self.shape;
            let (b, cap) = check(&s, ql, cl, rl)?;
            if cache.dtype() != qkv.dtype() {
                bail!("kv-write: cache {:?} and qkv {:?} differ", cache.dtype(), qkv.dtype());
            }
            let f = func!(qkv, "kv_write")?;
            let rope_view = view::<f32>(rope, rl, "rope")?;
            let position = position_address(self.position.as_ref())?;
            let start = cl.start_offset();
            with_dtype!(qkv, T, {
                let q = view::<T>(qkv, ql, "qkv")?;
                let mut c = cache.as_cuda_slice_mut::<T>()?.slice_mut(start..);
                let mut b_ = f.builder();
                b_.arg(&q);
                b_.arg(&rope_view);
                b_.arg(&mut c);
                candle_core::builder_arg!(
                    b_,
                    int(s.heads),
                    int(s.kv_heads),
                    int(s.head_dim),
                    int(cap),
                    int(b),
                    position,
                    int(s.pos)
                );
                let cfg = LaunchConfig {
                    grid_dim: (s.kv_heads as u32, b as u32, 1),
                    block_dim: (s.head_dim as u32, 1, 1),
                    shared_mem_bytes: 0,
                };
                // SAFETY: arguments match the kernel's signature; `check` bounds every index.
                unsafe { b_.launch(cfg) }.w()?;
            });
            Ok(())
        }
    }

    /// Shares the keys of each (head, batch row) are cut into for the decode attention (attn_decode_part): about
    /// two blocks per SM over the `blocks` (head, row) pairs, at most 32, and none smaller than 32 keys of a full
    /// cache of `cap` positions. It depends on the device and the shapes only, never on the position, so a
    /// captured decode step replays at every position with the same launch.
    fn key_shares(dev: &candle_core::CudaDevice, blocks: usize, cap: usize) -> Result<usize> {
        use candle_core::cuda_backend::cudarc::driver::sys::CUdevice_attribute;
        let sms =
            dev.cuda_stream().context().attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT).w()?
                as usize;
        Ok((2 * sms).div_ceil(blocks.max(1)).clamp(1, 32).min(cap.div_ceil(32).max(1)))
    }

    pub struct Attention {
        pub shape: DecodeShape,
        pub position: Option<Tensor>,
    }

    impl candle_core::CustomOp3 for Attention {
        fn name(&self) -> &'static str {
            "decode-attention"
        }

        refuse_cpu!(CustomOp3, "decode-attention");

        fn cuda_fwd(
            &self,
            qkv: &CudaStorage,
            ql: &Layout,
            cache: &CudaStorage,
            cl: &Layout,
            rope: &CudaStorage,
            rl: &Layout,
        ) -> Result<(CudaStorage, Shape)> {
            let s = self.shape;
            let (b, cap) = check(&s, ql, cl, rl)?;
            let dev = qkv.device().clone();
            let (part_fn, merge_fn) = (func!(qkv, "attn_decode_part")?, func!(qkv, "attn_decode_merge")?);
            let rope_view = view::<f32>(rope, rl, "rope")?;
            let position = position_address(self.position.as_ref())?;
            let scale = 1.0 / (s.head_dim as f64).sqrt();
            let splits = key_shares(&dev, s.heads * b, cap)?;
            let part = output::<f32>(&dev, b * s.heads * splits * (s.head_dim + 2))?;
            let slice = with_dtype!(qkv, T, {
                let out = output::<T>(&dev, b * s.heads * s.head_dim)?;
                let (q, c) = (view::<T>(qkv, ql, "qkv")?, view::<T>(cache, cl, "cache")?);
                let mut b_ = part_fn.builder();
                b_.arg(&q);
                b_.arg(&rope_view);
                b_.arg(&c);
                b_.arg(&part);
                candle_core::builder_arg!(
                    b_,
                    int(s.heads),
                    int(s.kv_heads),
                    int(s.head_dim),
                    int(cap),
                    int(b),
                    position,
                    int(s.pos),
                    int(s.window),
                    scale as f32
                );
                let cfg = LaunchConfig {
                    grid_dim: (s.heads as u32, b as u32, splits as u32),
                    // DEC_THREADS in fused.cu.
                    block_dim: (256, 1, 1),
                    shared_mem_bytes: 0,
                };
                // SAFETY: arguments match the kernel's signature; `check` bounds every index; `part` holds
                // (b * heads * splits) rows of d + 2.
                unsafe { b_.launch(cfg) }.w()?;
                let mut b_ = merge_fn.builder();
                b_.arg(&part);
                b_.arg(&out);
                candle_core::builder_arg!(b_, int(s.heads), int(s.head_dim), int(splits));
                let cfg = LaunchConfig {
                    grid_dim: (s.heads as u32, b as u32, 1),
                    block_dim: (s.head_dim.next_multiple_of(32).min(256) as u32, 1, 1),
                    shared_mem_bytes: 0,
                };
                // SAFETY: as above; the merge reads the parts the launch before it wrote on the same stream.
                unsafe { b_.launch(cfg) }.w()?;
                CudaStorage::wrap_cuda_slice(out, dev.clone())
            });
            Ok((slice, Shape::from((b, 1, s.heads * s.head_dim))))
        }
    }
}

/// Without CUDA the ops exist but refuse to run; [`available`] is false, so callers never reach them.
#[cfg(not(feature = "cuda"))]
mod imp {
    use crate::engine::ops::cuda::decode::DecodeShape;
    use crate::engine::ops::cuda::refuse::cpu_only_op;

    pub struct Argmax;
    pub struct SiluMulHalves;
    #[allow(dead_code)]
    pub struct KvWrite {
        pub shape: DecodeShape,
        pub position: Option<candle_core::Tensor>,
    }
    #[allow(dead_code)]
    pub struct Attention {
        pub shape: DecodeShape,
        pub position: Option<candle_core::Tensor>,
    }
    cpu_only_op!(Argmax, CustomOp1, "argmax-row");
    cpu_only_op!(SiluMulHalves, CustomOp1, "silu-mul-halves");
    cpu_only_op!(KvWrite, InplaceOp3, "kv-write");
    cpu_only_op!(Attention, CustomOp3, "decode-attention");
}
