//! Multiplying by frozen weights: the forward product through BLAS (batches) or a threaded matrix-vector
//! product (decoding) on the CPU (bf16/f16 through f32 pieces of the weight: `cpu/half_products.rs`), Candle's
//! matmul elsewhere, and the plain product the backward pass needs
//! for the input gradient (nothing is ever computed for the frozen weight).

use candle_core::{Result, Tensor};

use super::kernel_choice::{metal_dtypes, native};

/// `x W^T` for a frozen weight `W` of shape (out, in); `x`: (..., in).
pub fn frozen_matmul_t(x: &Tensor, weight: &Tensor) -> Result<Tensor> {
    metal_dtypes("frozen_matmul_t", &[x, weight])?;
    let dims = x.dims().to_vec();
    let in_features = dims[dims.len() - 1];
    let rows = x.elem_count() / in_features.max(1);
    let x2 = x.reshape((rows, in_features))?;
    let y = x2.contiguous()?.apply_op1_no_bwd(&FrozenMatmul { weight: weight.clone(), transposed: true })?;
    let mut out_dims = dims;
    let last = out_dims.len() - 1;
    out_dims[last] = weight.dim(0)?;
    y.reshape(out_dims)
}

/// `x W` for a frozen weight `W` of shape (out, in) and `x`: (..., out): the input gradient of
/// [`frozen_matmul_t`], for the hand-written backward pass. Not differentiable itself.
pub fn frozen_matmul(x: &Tensor, weight: &Tensor) -> Result<Tensor> {
    metal_dtypes("frozen_matmul", &[x, weight])?;
    let dims = x.dims().to_vec();
    let out_features = dims[dims.len() - 1];
    let rows = x.elem_count() / out_features.max(1);
    let x2 = x.reshape((rows, out_features))?;
    let y = x2.contiguous()?.apply_op1_no_bwd(&FrozenMatmul { weight: weight.clone(), transposed: false })?;
    let mut out_dims = dims;
    let last = out_dims.len() - 1;
    out_dims[last] = weight.dim(1)?;
    y.reshape(out_dims)
}

/// `silu(gate) * up` of the single gate|up row `gate_up` (.., 2k) times `weight^T` (n, k), as one kernel that
/// does the SwiGLU while it stages the row (CUDA, `ops/cuda/gemv.rs`): (.., n), the same values as
/// `frozen_matmul_t(silu_mul_halves(gate_up), weight)`. None where that kernel does not run.
pub fn swiglu_matmul_t(gate_up: &Tensor, weight: &Tensor) -> Result<Option<Tensor>> {
    #[cfg(feature = "cuda")]
    if super::cuda::availability::available(gate_up.device(), gate_up.dtype()) {
        let row = gate_up.reshape((1, gate_up.elem_count()))?;
        if super::cuda::gemv::takes(row.layout(), row.dtype(), weight, true) {
            let y = row.apply_op1_no_bwd(&super::cuda::gemv::SwigluGemv { weight: weight.clone() })?;
            let mut dims = gate_up.dims().to_vec();
            *dims.last_mut().expect("a row has a last dimension") = weight.dim(0)?;
            return Ok(Some(y.reshape(dims)?));
        }
    }
    let _ = (gate_up, weight);
    Ok(None)
}

/// `acc + dy W` (or `dy W` without `acc`): one cuBLAS call writing into `acc` where [`super::products::matmul_add`] takes the
/// operands (CUDA), else [`frozen_matmul`] then an add.
pub fn frozen_matmul_add(acc: Option<Tensor>, dy: &Tensor, weight: &Tensor) -> Result<Tensor> {
    if dy.rank() == 2 && super::cuda::gemm::takes(acc.as_ref(), dy, weight) {
        return super::cuda::gemm::matmul_add(acc, dy, weight, 1.0);
    }
    let product = frozen_matmul(dy, weight)?;
    match acc {
        Some(acc) => super::elementwise::add(&acc, &product),
        None => Ok(product),
    }
}

/// `x W^T` (or `x W` when `transposed` is false), as an op that picks BLAS or the matrix-vector kernel on
/// the CPU and Candle's matmul on other backends.
struct FrozenMatmul {
    weight: Tensor,
    transposed: bool,
}

/// Multiply a contiguous f32 CPU input by the held weight through OpenBLAS when it is loaded.
/// Returns None to fall back to Candle's GEMM.
fn blas_frozen_matmul(
    weight: &Tensor,
    storage: &candle_core::CpuStorage,
    layout: &candle_core::Layout,
    weight_transposed: bool,
) -> Option<(candle_core::CpuStorage, candle_core::Shape)> {
    let (rows, k) = layout.shape().dims2().ok()?;
    if rows < crate::engine::blas::MIN_ROWS || !crate::engine::blas::available() {
        return None;
    }
    let (start, end) = layout.contiguous_offsets()?;
    let candle_core::CpuStorage::F32(x) = storage else { return None };
    let (w_storage, w_layout) = weight.storage_and_layout();
    let (w_start, w_end) = w_layout.contiguous_offsets()?;
    let candle_core::Storage::Cpu(candle_core::CpuStorage::F32(w)) = &*w_storage else { return None };
    let (d0, d1) = w_layout.shape().dims2().ok()?;
    let n = if weight_transposed { d0 } else { d1 };
    let w_k = if weight_transposed { d1 } else { d0 };
    if w_k != k {
        return None;
    }
    let out = crate::engine::blas::sgemm_to_vec(&x[start..end], &w[w_start..w_end], rows, n, k, weight_transposed)?;
    Some((candle_core::CpuStorage::F32(out), (rows, n).into()))
}

/// Token-by-token decoding multiplies one row by every weight matrix: a pass over the weights bound by
/// memory bandwidth, which one core cannot saturate: see [`super::cpu::gemv`].
fn gemv_frozen(
    weight: &Tensor,
    storage: &candle_core::CpuStorage,
    layout: &candle_core::Layout,
) -> Option<(candle_core::CpuStorage, candle_core::Shape)> {
    let (rows, k) = layout.shape().dims2().ok()?;
    if rows != 1 || gemv_disabled() {
        return None;
    }
    let (start, end) = layout.contiguous_offsets()?;
    let candle_core::CpuStorage::F32(x) = storage else { return None };
    let x = &x[start..end];
    let (w_storage, w_layout) = weight.storage_and_layout();
    let (w_start, w_end) = w_layout.contiguous_offsets()?;
    let candle_core::Storage::Cpu(candle_core::CpuStorage::F32(w)) = &*w_storage else { return None };
    let w = &w[w_start..w_end];
    let (n, w_k) = w_layout.shape().dims2().ok()?;
    if w_k != k {
        return None;
    }
    let out = super::cpu::gemv::gemv(w, x, n, k);
    Some((candle_core::CpuStorage::F32(out), (1, n).into()))
}

/// The runtime options turned the kernel off (`--no-gemv`): Candle's GEMM instead (for A/B measurements).
fn gemv_disabled() -> bool {
    !crate::engine::runtime::options().gemv
}

impl FrozenMatmul {
    fn check(&self, layout: &candle_core::Layout) -> Result<()> {
        let (_, k) = layout.shape().dims2()?;
        let (d0, d1) = self.weight.dims2()?;
        let k_w = if self.transposed { d1 } else { d0 };
        if k != k_w {
            candle_core::bail!("frozen matmul: input has {k} features, weight expects {k_w}");
        }
        Ok(())
    }
}

/// Candle's matmul of `storage` by the weight (transposed or not) on any backend.
macro_rules! backend_matmul {
    ($self:ident, $storage:ident, $layout:ident, $variant:ident) => {{
        use candle_core::backend::BackendStorage;
        $self.check($layout)?;
        let (rows, k) = $layout.shape().dims2()?;
        let (w_storage, w_layout) = $self.weight.storage_and_layout();
        let (rhs_layout, n) = if $self.transposed {
            (w_layout.transpose(0, 1)?, w_layout.shape().dims2()?.0)
        } else {
            (w_layout.clone(), w_layout.shape().dims2()?.1)
        };
        match &*w_storage {
            candle_core::Storage::$variant(w) => {
                Ok(($storage.matmul(w, (1, rows, n, k), $layout, &rhs_layout)?, (rows, n).into()))
            }
            _ => candle_core::bail!("frozen matmul: weight and input are on different devices"),
        }
    }};
}

impl candle_core::CustomOp1 for FrozenMatmul {
    fn name(&self) -> &'static str {
        "frozen-matmul"
    }

    fn cpu_fwd(
        &self,
        storage: &candle_core::CpuStorage,
        layout: &candle_core::Layout,
    ) -> Result<(candle_core::CpuStorage, candle_core::Shape)> {
        self.check(layout)?;
        if !native() {
            return backend_matmul!(self, storage, layout, Cpu);
        }
        if self.transposed {
            if let Some(out) = gemv_frozen(&self.weight, storage, layout) {
                return Ok(out);
            }
        }
        if let Some(out) = blas_frozen_matmul(&self.weight, storage, layout, self.transposed) {
            return Ok(out);
        }
        if let Some(out) = super::cpu::half_products::half_frozen_matmul(&self.weight, storage, layout, self.transposed)
        {
            return Ok(out);
        }
        backend_matmul!(self, storage, layout, Cpu)
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        storage: &candle_core::CudaStorage,
        layout: &candle_core::Layout,
    ) -> Result<(candle_core::CudaStorage, candle_core::Shape)> {
        // `gemv_t` takes only operands whose lengths agree; the rest, mismatches included, go to (and are
        // refused by) the checked matmul below.
        if self.transposed && native() {
            if let Some(out) = super::cuda::gemv::gemv_t(storage, layout, &self.weight)? {
                return Ok(out);
            }
        }
        backend_matmul!(self, storage, layout, Cuda)
    }

    #[cfg(target_os = "macos")]
    fn metal_fwd(
        &self,
        storage: &candle_core::MetalStorage,
        layout: &candle_core::Layout,
    ) -> Result<(candle_core::MetalStorage, candle_core::Shape)> {
        backend_matmul!(self, storage, layout, Metal)
    }
}
