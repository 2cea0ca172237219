//! Single-row products against a frozen weight on CUDA (cuda/gemv.cuh): the decode step's projections and
//! head, `y = x W^T` for one row `x`, and the MLP's `swiglu(gate|up) W^T` with the SwiGLU done while the row
//! is staged. cuBLAS runs these as GEMMs with 8-wide tiles, well below the memory bandwidth that sets their
//! time; one warp per weight row with streaming 16-byte loads comes closer. Taken by `FrozenMatmul`
//! (frozen_matmul.rs) and `ops::swiglu_matmul_t` for f32 and bf16 rows that meet the kernel's alignment;
//! everything else, and `--no-gemv`, stays with cuBLAS. Built with the `cuda` feature only.

use crate::engine::ops::cuda::launch::{func, int, output, view, with_dtype};
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::WrapErr;
use candle_core::{CudaStorage, DType, Layout, Result, Shape, Storage, Tensor};

/// Warps (rows) per block.
const ROWS_PER_BLOCK: usize = 8;
/// The input row lives in shared memory; past the default limit Candle's launch would need an opt-in.
const MAX_ROW_BYTES: usize = 48 * 1024;

/// Whether the kernel takes the row of `layout` in `dtype` ((1, k), or with `gated` a gate|up row (1, 2k))
/// against `weight` (n, k): f32 or bf16 on both, contiguous 16-byte aligned rows, an input row that fits the
/// default shared memory, and the runtime options leave the kernel on (`--no-gemv` turns it off).
pub(in crate::engine::ops) fn takes(layout: &Layout, dtype: DType, weight: &Tensor, gated: bool) -> bool {
    let (Ok((rows, x_k)), Ok((_, k))) = (layout.shape().dims2(), weight.dims2()) else { return false };
    let size = dtype.size_in_bytes();
    let aligned = |l: &Layout| l.is_contiguous() && (l.start_offset() * size).is_multiple_of(16);
    rows == 1
        && x_k == if gated { 2 * k } else { k }
        && matches!(dtype, DType::F32 | DType::BF16)
        && weight.dtype() == dtype
        && (k * size).is_multiple_of(16)
        && k * size <= MAX_ROW_BYTES
        && aligned(layout)
        && aligned(weight.layout())
        && crate::engine::runtime::options().gemv
}

/// `x W^T` for the single row `x` (1, k) and `weight` (n, k), or None when the kernel does not take them.
pub(in crate::engine::ops) fn gemv_t(
    x: &CudaStorage,
    layout: &Layout,
    weight: &Tensor,
) -> Result<Option<(CudaStorage, Shape)>> {
    if !takes(layout, x.dtype(), weight, false) {
        return Ok(None);
    }
    launch(x, layout, weight, false).map(Some)
}

/// `silu(gate) * up` of one gate|up row (1, 2k) times `weight^T` (n, k): (1, n). Callers check [`takes`].
pub(in crate::engine::ops) struct SwigluGemv {
    pub weight: Tensor,
}

impl candle_core::CustomOp1 for SwigluGemv {
    fn name(&self) -> &'static str {
        "swiglu-gemv"
    }

    crate::engine::ops::cuda::refuse::refuse_cpu!(CustomOp1, "swiglu-gemv");

    fn cuda_fwd(&self, x: &CudaStorage, layout: &Layout) -> Result<(CudaStorage, Shape)> {
        if !takes(layout, x.dtype(), &self.weight, true) {
            candle_core::bail!(
                "swiglu-gemv: row {:?} and weight {:?} do not suit the kernel",
                layout.shape(),
                self.weight.shape()
            );
        }
        launch(x, layout, &self.weight, true)
    }
}

fn launch(x: &CudaStorage, layout: &Layout, weight: &Tensor, gated: bool) -> Result<(CudaStorage, Shape)> {
    let (n, k) = weight.dims2()?;
    let (w_storage, w_layout) = weight.storage_and_layout();
    let Storage::Cuda(w) = &*w_storage else { candle_core::bail!("gemv: the weight is not on the GPU") };
    let dev = x.device().clone();
    let f = func!(x, "gemv_rows")?;
    let slice = with_dtype!(x, T, {
        let out = output::<T>(&dev, n)?;
        let (xv, wv) = (view::<T>(x, layout, "gemv input")?, view::<T>(w, w_layout, "gemv weight")?);
        let mut b = f.builder();
        b.arg(&xv);
        b.arg(&wv);
        b.arg(&out);
        candle_core::builder_arg!(b, int(n), int(k), i32::from(gated));
        let cfg = LaunchConfig {
            grid_dim: (n.div_ceil(ROWS_PER_BLOCK) as u32, 1, 1),
            block_dim: (32 * ROWS_PER_BLOCK as u32, 1, 1),
            shared_mem_bytes: (k * x.dtype().size_in_bytes()) as u32,
        };
        // SAFETY: arguments match the kernel's signature; `takes` checked sizes and alignment.
        unsafe { b.launch(cfg) }.w()?;
        CudaStorage::wrap_cuda_slice(out, dev.clone())
    });
    Ok((slice, Shape::from((1, n))))
}
