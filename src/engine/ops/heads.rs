//! Splitting a projection's rows into attention heads with the rotary embedding, and the gradient's way back.
//! One pass each on CUDA (`cuda/training.rs`, `heads_rope`); elsewhere a transpose and [`rope`] /
//! [`rope_backward`], which also cover a partial rotary (tables narrower than half a head).

use super::backward::rope_backward;
use super::cuda::{availability::available as cuda_available, training as cuda_training};
use super::rotary;
use candle_core::{Result, Tensor};

/// `x` (b, t, n * d) or (b * t, n * d) -> heads (b, n, t, d) contiguous, rotated by `rope` = (cos, sin) of the t
/// positions when given.
pub fn split_heads(
    x: &Tensor,
    (b, t, n, d): (usize, usize, usize, usize),
    rope: Option<(&Tensor, &Tensor)>,
) -> Result<Tensor> {
    if fused_applies(x, t, d, rope) {
        return cuda_training::heads_rope(x, (b, t, n, d), rope, false);
    }
    let heads = x.reshape((b, t, n, d))?.transpose(1, 2)?.contiguous()?;
    match rope {
        Some((cos, sin)) => rotary::rope(&heads, cos, sin),
        None => Ok(heads),
    }
}

/// [`split_heads`] for queries that only the blocked attention reads (it gathers each block whatever the strides):
/// (b, n, t, d) as a transposed view of the rotated rows (b, t, n, d), where Candle's `rope_thd` turns them in place
/// of layout. One pass, where the copy to heads and the rotation were two (the copy of a 4 x 1024 x 2048 bf16 query
/// 89 us on a lent H200, the rotation 20 us). For the portable graph's whole-head rotary with one table of positions;
/// [`split_heads`] (contiguous) elsewhere.
pub fn split_query_heads(
    x: &Tensor,
    (b, t, n, d): (usize, usize, usize, usize),
    rope: Option<(&Tensor, &Tensor)>,
) -> Result<Tensor> {
    let rotates_in_rows = |tables: (&Tensor, &Tensor)| {
        whole_head_tables(x, t, d, tables)
            && d.is_multiple_of(2)
            && !fused_applies(x, t, d, rope)
            && !super::metal::takes(&[x])
    };
    match rope.filter(|&tables| rotates_in_rows(tables)) {
        Some((cos, sin)) => {
            let rows = x.reshape((b, t, n, d))?.contiguous()?;
            candle_nn::rotary_emb::rope_thd(&rows, &cos.contiguous()?, &sin.contiguous()?)?.transpose(1, 2)
        }
        None => split_heads(x, (b, t, n, d), rope),
    }
}

/// The gradient of [`split_heads`]: `dy` (b, n, t, d) -> (b * t, n * d), rotated back when `rope` is given.
pub fn merge_heads_backward(dy: &Tensor, rope: Option<(&Tensor, &Tensor)>) -> Result<Tensor> {
    let (b, n, t, d) = dy.dims4()?;
    if fused_applies(dy, t, d, rope) {
        return cuda_training::heads_rope(dy, (b, t, n, d), rope, true);
    }
    let dy = match rope {
        Some((cos, sin)) => rope_backward(dy, cos, sin)?,
        None => dy.clone(),
    };
    dy.transpose(1, 2)?.reshape((b * t, n * d))
}

/// The fused kernel's case: CUDA f32/bf16, and tables (t, d / 2) in the tensor's dtype (a whole-head rotary).
fn fused_applies(x: &Tensor, t: usize, d: usize, rope: Option<(&Tensor, &Tensor)>) -> bool {
    d.is_multiple_of(2)
        && cuda_available(x.device(), x.dtype())
        && rope.is_none_or(|tables| whole_head_tables(x, t, d, tables))
}

/// Whether `(cos, sin)` are one (t, d / 2) table each in `x`'s dtype: a whole-head rotary with one table of
/// positions for every batch row.
fn whole_head_tables(x: &Tensor, t: usize, d: usize, (cos, sin): (&Tensor, &Tensor)) -> bool {
    cos.dims2().is_ok_and(|dims| dims == (t, d / 2))
        && sin.shape() == cos.shape()
        && cos.dtype() == x.dtype()
        && sin.dtype() == x.dtype()
}
