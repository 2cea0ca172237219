//! cuBLAS products with the two scalars Candle's matmul does not expose: `C = alpha * A B + beta * C`. With beta =
//! 1 a LoRA update lands in the frozen product it is added to (`y += scale * (x A) B`, `dx += dxa A^T`) and the
//! input gradients of projections that share an input sum in place, instead of a separate scale and add pass over
//! (tokens x width) each; with alpha the adapter gradients come out scaled. 2-D operands, row-major or
//! transposed views, in f32, bf16 or f16 on CUDA ([`takes`]); `ops::matmul_add` composes everywhere else.

use candle_core::{DType, Result, Tensor};

/// Whether [`matmul_add`] runs these operands: CUDA, the native kernels, one float dtype, 2-D shapes that chain,
/// each a plain or transposed matrix, and the accumulator (when given) contiguous of the product's shape.
pub fn takes(acc: Option<&Tensor>, a: &Tensor, b: &Tensor) -> bool {
    let dtype = a.dtype();
    let (Ok((m, k)), Ok((k2, n))) = (a.dims2(), b.dims2()) else { return false };
    cfg!(feature = "cuda")
        && a.device().is_cuda()
        && matches!(dtype, DType::F32 | DType::BF16 | DType::F16)
        && b.dtype() == dtype
        && crate::engine::ops::kernel_choice::native()
        && k == k2
        && operand(a).is_some()
        && operand(b).is_some()
        && acc.is_none_or(|c| c.dtype() == dtype && c.dims2().ok() == Some((m, n)) && c.is_contiguous())
}

/// `acc + alpha * a b` written into `acc` (which the caller owns alone: no other tensor may share its storage),
/// or `alpha * a b` in a new tensor. Callers check [`takes`] first.
pub fn matmul_add(acc: Option<Tensor>, a: &Tensor, b: &Tensor, alpha: f64) -> Result<Tensor> {
    let dtype = a.dtype();
    imp::matmul_add(acc, a, b, alpha, dtype)
}

/// `alpha * a b` in a new f32 tensor whatever the operands' float dtype (cuBLAS accumulates in f32 and writes it
/// as is): an adapter's gradient, which is kept in f32, without a product in the operands' dtype and a cast pass.
/// Callers check [`takes`] first (without an accumulator).
pub fn matmul_f32(a: &Tensor, b: &Tensor, alpha: f64) -> Result<Tensor> {
    imp::matmul_add(None, a, b, alpha, DType::F32)
}

/// `out[:, first..first + n] = a b` for `a` (m, k), `b` (k, n) and a contiguous (m, N) `out` of the operands' dtype,
/// written in place through cuBLAS's leading dimension (no product tensor and no copy into `out`): a product by a
/// block of a matrix's rows, landing in its columns of the whole product. The caller owns `out` alone. Callers check
/// [`takes`] for `a` and `b` first.
pub fn matmul_into_columns(out: &Tensor, first: usize, a: &Tensor, b: &Tensor) -> Result<()> {
    imp::matmul_into_columns(out, first, a, b)
}

/// `acc + alpha * a b` in f32 (or `alpha * a b` in a new f32 tensor without `acc`) whatever the operands' float
/// dtype: a sum of products over blocks of their inner dimension kept in f32 between the blocks, so a half-precision
/// sum is rounded once, at its end, as one product's would be. Callers check [`takes`] (without an accumulator).
pub fn matmul_add_f32(acc: Option<Tensor>, a: &Tensor, b: &Tensor, alpha: f64) -> Result<Tensor> {
    if let Some(acc) = &acc {
        let shape = (a.dim(0)?, b.dim(1)?);
        if acc.dtype() != DType::F32 || acc.dims2()? != shape || !acc.is_contiguous() {
            candle_core::bail!(
                "matmul_add_f32: an accumulator {:?} {:?} for a {shape:?} product",
                acc.dtype(),
                acc.layout()
            );
        }
    }
    imp::matmul_add(acc, a, b, alpha, DType::F32)
}

/// (transposed, leading dimension) of a 2-D matrix stored row-major or as the transposed view of one, its rows (or
/// columns) possibly further apart than their length: a window of columns of a wider matrix.
fn operand(t: &Tensor) -> Option<(bool, usize)> {
    let (rows, cols) = t.dims2().ok()?;
    let stride = t.stride();
    if (stride[1] == 1 || cols == 1) && (stride[0] >= cols || rows == 1) {
        Some((false, stride[0].max(cols)))
    } else if (stride[0] == 1 || rows == 1) && (stride[1] >= rows || cols == 1) {
        Some((true, stride[1].max(rows)))
    } else {
        None
    }
}

#[cfg(feature = "cuda")]
mod imp {
    use crate::engine::ops::cuda::gemm::operand;
    use crate::engine::ops::cuda::launch::{output, with_dtype, wrap};
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::cublas::{result::gemm_ex, sys};
    use candle_core::cuda_backend::cudarc::driver::DevicePtr;
    use candle_core::cuda_backend::{CudaDType, WrapErr};
    use candle_core::{bail, CudaStorage, DType, Result, Storage, Tensor};

    /// The device address of `t`'s first element.
    fn address<T: CudaDType>(
        storage: &CudaStorage,
        t: &Tensor,
        stream: &candle_core::cuda_backend::cudarc::driver::CudaStream,
    ) -> Result<u64> {
        let slice = storage.as_cuda_slice::<T>()?;
        let (ptr, _sync) = slice.device_ptr(stream);
        Ok(ptr + (t.layout().start_offset() * std::mem::size_of::<T>()) as u64)
    }

    fn data_type(dtype: DType) -> Result<sys::cudaDataType> {
        Ok(match dtype {
            DType::F32 => sys::cudaDataType::CUDA_R_32F,
            DType::BF16 => sys::cudaDataType::CUDA_R_16BF,
            DType::F16 => sys::cudaDataType::CUDA_R_16F,
            other => bail!("matmul_add takes f32, bf16 or f16, not {other:?}"),
        })
    }

    /// `acc + alpha * a b` (acc of `out_dtype`), or `alpha * a b` in a new `out_dtype` tensor.
    pub fn matmul_add(acc: Option<Tensor>, a: &Tensor, b: &Tensor, alpha: f64, out_dtype: DType) -> Result<Tensor> {
        let ((m, _), (_, n)) = (a.dims2()?, b.dims2()?);
        let dev = a.device().as_cuda_device()?;
        let (beta, c) = match acc {
            Some(c) => (1f32, c),
            // beta = 0: cuBLAS never reads C, so it needs no zeros.
            None if out_dtype == DType::F32 => (0f32, wrap(output::<f32>(dev, m * n)?, dev, (m, n))),
            None => (0f32, with_dtype!(a, T, { wrap(output::<T>(dev, m * n)?, dev, (m, n)) })),
        };
        if c.dtype() != out_dtype {
            bail!("matmul_add: a {:?} accumulator for a {out_dtype:?} product", c.dtype());
        }
        gemm(&c, (0, n), beta, a, b, alpha)?;
        Ok(c)
    }

    /// `out[:, first..first + n] = a b` (see `super::matmul_into_columns`).
    pub fn matmul_into_columns(out: &Tensor, first: usize, a: &Tensor, b: &Tensor) -> Result<()> {
        let ((m, _), (_, n), (rows, width)) = (a.dims2()?, b.dims2()?, out.dims2()?);
        if rows != m || first + n > width || !out.is_contiguous() || out.dtype() != a.dtype() {
            bail!(
                "matmul_into_columns: a ({m} x {n}) product into columns {first}.. of {:?} {:?}",
                out.dtype(),
                out.layout()
            );
        }
        gemm(out, (first, width), 0.0, a, b, 1.0)
    }

    /// `C = alpha * a b + beta * C` for C the (m, n) window of `c` from column `first` of rows `ldc` apart.
    fn gemm(c: &Tensor, (first, ldc): (usize, usize), beta: f32, a: &Tensor, b: &Tensor, alpha: f64) -> Result<()> {
        let ((m, k), (_, n)) = (a.dims2()?, b.dims2()?);
        let (Some((a_t, lda)), Some((b_t, ldb))) = (operand(a), operand(b)) else {
            bail!("matmul_add: operands {:?} x {:?} are not plain or transposed matrices", a.layout(), b.layout())
        };
        let (a_guard, _) = a.storage_and_layout();
        let (b_guard, _) = b.storage_and_layout();
        let (Storage::Cuda(a_s), Storage::Cuda(b_s)) = (&*a_guard, &*b_guard) else {
            bail!("matmul_add: operands are not all on the CUDA device")
        };
        let dev = a_s.device().clone();
        let (dtype, c_dtype) = (data_type(a.dtype())?, data_type(c.dtype())?);
        let (c_guard, _) = c.storage_and_layout();
        let Storage::Cuda(c_s) = &*c_guard else { bail!("matmul_add: the accumulator is not on the CUDA device") };
        let stream = dev.cuda_stream();
        let (pa, pb) = with_dtype!(a_s, T, { (address::<T>(a_s, a, &stream)?, address::<T>(b_s, b, &stream)?) });
        let pc = with_dtype!(c_s, T, { address::<T>(c_s, c, &stream)? + (first * std::mem::size_of::<T>()) as u64 });
        let op = |t: bool| if t { sys::cublasOperation_t::CUBLAS_OP_T } else { sys::cublasOperation_t::CUBLAS_OP_N };
        let alpha = alpha as f32;
        let blas = dev.cublas_handle();
        // Row-major C (m x n) is column-major C^T = B^T A^T: cuBLAS multiplies b's storage by a's.
        // SAFETY: the three addresses hold (k, n), (m, k) and (m, n) elements of `dtype` in the layouts given,
        // on the stream the handle is bound to; C is written in place (the caller owns it alone).
        unsafe {
            gemm_ex(
                *blas.handle(),
                op(b_t),
                op(a_t),
                n as i32,
                m as i32,
                k as i32,
                (&alpha) as *const f32 as *const _,
                pb as *const _,
                dtype,
                ldb as i32,
                pa as *const _,
                dtype,
                lda as i32,
                (&beta) as *const f32 as *const _,
                pc as *mut _,
                c_dtype,
                ldc as i32,
                sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
            .w()?;
        }
        drop((a_guard, b_guard, c_guard));
        Ok(())
    }
}

#[cfg(not(feature = "cuda"))]
mod imp {
    use candle_core::{bail, Result, Tensor};

    pub fn matmul_add(_: Option<Tensor>, _: &Tensor, _: &Tensor, _: f64, _: candle_core::DType) -> Result<Tensor> {
        bail!("matmul_add with scalars runs on CUDA only")
    }

    pub fn matmul_into_columns(_: &Tensor, _: usize, _: &Tensor, _: &Tensor) -> Result<()> {
        bail!("matmul_into_columns runs on CUDA only")
    }
}
