//! Batched matrix products of activations (attention scores and values, LoRA factors) through OpenBLAS on
//! the CPU, reading transposed views in place instead of copying them.

use candle_core::{Layout, Result, Tensor};

use crate::engine::ops::kernel_choice::is_cpu_f32;

/// `a (..., m, k) · b (..., k, n)`, same batch dimensions, through BLAS; None off the CPU, for other dtypes,
/// without BLAS, in the portable graph and for shapes that are not one batch of matrices: the caller composes.
pub(in crate::engine::ops) fn matmul(a: &Tensor, b: &Tensor) -> Result<Option<Tensor>> {
    if !is_cpu_f32(a) || !is_cpu_f32(b) || !crate::engine::blas::available() {
        return Ok(None);
    }
    let (a_dims, b_dims) = (a.dims(), b.dims());
    let rank = a_dims.len();
    if rank < 2
        || b_dims.len() != rank
        || a_dims[..rank - 2] != b_dims[..rank - 2]
        || a_dims[rank - 1] != b_dims[rank - 2]
    {
        return Ok(None);
    }
    let (m, k, n) = (a_dims[rank - 2], a_dims[rank - 1], b_dims[rank - 1]);
    let batch: usize = a_dims[..rank - 2].iter().product();
    let a = as_batched_matrix(a)?;
    let b = as_batched_matrix(b)?;
    let (a_storage, a_layout) = a.0.storage_and_layout();
    let (b_storage, b_layout) = b.0.storage_and_layout();
    let (
        candle_core::Storage::Cpu(candle_core::CpuStorage::F32(a_data)),
        candle_core::Storage::Cpu(candle_core::CpuStorage::F32(b_data)),
    ) = (&*a_storage, &*b_storage)
    else {
        candle_core::bail!("matmul: expected CPU f32 storage")
    };
    let mut out: Vec<f32> = Vec::with_capacity(batch * m * n);
    for i in 0..batch {
        let a_op = a.operand(a_data, a_layout, i);
        let b_op = b.operand(b_data, b_layout, i);
        // SAFETY: `out` has capacity batch * m * n; each product writes its own m * n block.
        let ok = unsafe { crate::engine::blas::sgemm_operands(a_op, b_op, out.as_mut_ptr().add(i * m * n), m, n, k) };
        if !ok {
            candle_core::bail!("matmul: BLAS rejected a ({m}, {k}) x ({k}, {n}) product");
        }
    }
    // SAFETY: every block of batch * m * n elements was written above.
    unsafe { out.set_len(batch * m * n) };
    let mut dims = a_dims.to_vec();
    dims[rank - 1] = n;
    Tensor::from_vec(out, dims, a.0.device()).map(Some)
}

/// A tensor whose matrices (last two dimensions) are row-major or transposed with one stride between
/// consecutive matrices: (tensor, transposed, leading dimension, batch stride).
struct BatchedMatrix(Tensor, bool, usize, usize);

fn as_batched_matrix(t: &Tensor) -> Result<BatchedMatrix> {
    if let Some(m) = batched_layout(t.layout()) {
        return Ok(BatchedMatrix(t.clone(), m.0, m.1, m.2));
    }
    let t = t.contiguous()?;
    let m = batched_layout(t.layout()).expect("a contiguous tensor is a batched matrix");
    Ok(BatchedMatrix(t, m.0, m.1, m.2))
}

/// (transposed, leading dimension, batch stride) when the layout is a uniform batch of plain or transposed
/// matrices.
fn batched_layout(layout: &Layout) -> Option<(bool, usize, usize)> {
    let (dims, strides) = (layout.dims(), layout.stride());
    let rank = dims.len();
    let (rows, cols) = (dims[rank - 2], dims[rank - 1]);
    let (s_row, s_col) = (strides[rank - 2], strides[rank - 1]);
    let (transposed, ld) = if s_col == 1 && (s_row >= cols || rows <= 1) {
        (false, s_row.max(cols))
    } else if s_row == 1 && (s_col >= rows || cols <= 1) {
        (true, s_col.max(rows))
    } else {
        return None;
    };
    // Batch dimensions must collapse into one stride.
    let mut batch_stride = None;
    let mut expected = None;
    for i in (0..rank - 2).rev() {
        if dims[i] == 1 {
            continue;
        }
        match expected {
            None => {
                batch_stride = Some(strides[i]);
                expected = Some(strides[i] * dims[i]);
            }
            Some(e) if strides[i] == e => expected = Some(e * dims[i]),
            Some(_) => return None,
        }
    }
    Some((transposed, ld, batch_stride.unwrap_or(0)))
}

impl BatchedMatrix {
    fn operand<'a>(&self, data: &'a [f32], layout: &Layout, index: usize) -> crate::engine::blas::Operand<'a> {
        let start = layout.start_offset() + index * self.3;
        crate::engine::blas::Operand { data: &data[start..], transposed: self.1, ld: self.2 }
    }
}
