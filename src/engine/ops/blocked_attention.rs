//! Attention without the (T x T) matrix, built only from Candle ops that its Metal backend has (matmul,
//! broadcast arithmetic, exp/log, max/sum over the last dimension, narrow/cat, casts): FlashAttention-2's
//! algorithm written with tensors. Queries and keys go in blocks of [`block_size`]; the forward keeps a running
//! row maximum and sum (an online softmax) in f32 (f64 stays f64) and returns each row's logsumexp; the
//! backward recomputes each block's probabilities from it, so no block of scores outlives its step and the
//! extra memory is O(block^2 x heads) besides the linear-in-T inputs and gradients.
//!
//! Grouped-query heads are never repeated: the query heads that share a KV head are folded into the rows of a
//! block, (b, kv_heads, rep * block, d), and the key/value gradients sum over them in the products. Causal and
//! sliding-window masks are made per block from positions, and only for blocks the diagonal or the window's
//! edge cuts: blocks no query of the block may see are skipped, blocks every query sees take no mask. Packed
//! rows (`row_starts`: where each query's own example begins) add a lower bound per query, so their blocks are
//! skipped, left unmasked or masked per batch row the same way.

use super::kernel_choice::metal_dtypes;
use super::precision::upcast;
use super::products::matmul;
use candle_core::{DType, Device, Result, Tensor, D};
use std::collections::HashMap;

/// The most queries and keys per block. Every block costs a dozen ops whatever its size (a dispatch each on
/// Metal); on the CPU a 4-layer d=64 model's training step at T = 4096 took 3x the CPU time with blocks of 128
/// as with 512 (1024: no faster), so blocks are as large as [`BLOCK_SCORES`] allows.
pub const BLOCK: usize = 512;

/// The fewest queries and keys per block.
const MIN_BLOCK: usize = 64;

/// The most scores of one block over all batch rows and heads (8 Mi: 32 MiB in f32); a handful of such
/// temporaries are alive at once, whatever T.
const BLOCK_SCORES: usize = 1 << 23;

/// Queries and keys per block for `b` sequences of `heads` query heads: the largest power of two from
/// [`MIN_BLOCK`] to [`BLOCK`] whose (b * heads, block, block) scores fit [`BLOCK_SCORES`]. Llama-3.2-1B (32
/// heads) at batch 4: 256; SmolLM2-135M (9 heads) at batch 1: 512.
pub fn block_size(b: usize, heads: usize) -> usize {
    let mut block = BLOCK;
    while block > MIN_BLOCK && b * heads * block * block > BLOCK_SCORES {
        block /= 2;
    }
    block
}

/// What the backward of [`blocked_attention`] needs besides its inputs and output: each row's logsumexp,
/// (b, kv_heads, rep * rows, 1) per query block, in the accumulators' dtype (f32 for half precision).
#[derive(Debug, Clone)]
pub struct BlockedStats {
    lse: Vec<Tensor>,
    q_offset: usize,
    block: usize,
}

/// The sizes one call works on.
#[derive(Clone, Copy)]
struct Geometry<'a> {
    b: usize,
    kv: usize,
    rep: usize,
    tq: usize,
    tk: usize,
    d: usize,
    q_offset: usize,
    window: usize,
    block: usize,
    /// Packed rows: (b * tq) starts, query i of row r seeing no key before `starts[r * tq + i]`.
    starts: Option<&'a [u32]>,
}

impl<'a> Geometry<'a> {
    fn new(
        q: &Tensor,
        k: &Tensor,
        (q_offset, window): (usize, Option<usize>),
        block: usize,
        starts: Option<&'a [u32]>,
    ) -> Result<Self> {
        let (b, heads, tq, d) = q.dims4()?;
        let (kb, kv, tk, kd) = k.dims4()?;
        if kb != b || kd != d || kv == 0 || heads % kv != 0 {
            candle_core::bail!("blocked attention: q {:?} does not fit k {:?}", q.dims(), k.dims());
        }
        if starts.is_some_and(|s| s.len() != b * tq || q_offset != 0 || tq != tk) {
            candle_core::bail!("blocked attention: packed rows need one start per query of a training pass");
        }
        // Some(0) sees nothing; treat it as no window, as the fused kernels do.
        let window = window.filter(|&w| w > 0).unwrap_or(usize::MAX);
        Ok(Self { b, kv, rep: heads / kv, tq, tk, d, q_offset, window, block: block.max(1), starts })
    }

    /// The smallest start among the first queries of the block and the largest among its last (the starts
    /// grow along a row): (0, 0) unpacked.
    fn start_bounds(&self, (qs, bq): (usize, usize)) -> (usize, usize) {
        let Some(starts) = self.starts else { return (0, 0) };
        let at = |i: usize| (0..self.b).map(move |r| starts[r * self.tq + i] as usize);
        (at(qs).min().unwrap_or(0), at(qs + bq - 1).max().unwrap_or(0))
    }

    /// (first row, rows) of each query block.
    fn query_blocks(&self) -> Vec<(usize, usize)> {
        (0..self.tq).step_by(self.block).map(|s| (s, self.block.min(self.tq - s))).collect()
    }

    /// (first key, keys, needs a mask) of each key block that some query of rows `qs..qs + bq` sees: a key j is
    /// seen from position p when j <= p and p - j < window.
    fn key_blocks(&self, (qs, bq): (usize, usize)) -> Vec<(usize, usize, bool)> {
        let (q_lo, q_hi) = (self.q_offset + qs, self.q_offset + qs + bq - 1);
        let (first_start, last_start) = self.start_bounds((qs, bq));
        (0..self.tk)
            .step_by(self.block)
            .filter_map(|ks| {
                let ke = (ks + self.block).min(self.tk) - 1;
                let hidden = ks > q_hi || q_lo - ke.min(q_lo) >= self.window || ke < first_start;
                let all_seen = ke <= q_lo && q_hi - ks < self.window && ks >= last_start;
                (!hidden).then_some((ks, ke + 1 - ks, !all_seen))
            })
            .collect()
    }

    /// Rows `qs..qs + bq` of `x` (b, heads, tq, d), the heads of a KV head folded into the rows:
    /// (b, kv, rep * bq, d) contiguous.
    fn query_block(&self, x: &Tensor, (qs, bq): (usize, usize)) -> Result<Tensor> {
        let x = x.reshape((self.b, self.kv, self.rep, self.tq, self.d))?;
        x.narrow(3, qs, bq)?.contiguous()?.reshape((self.b, self.kv, self.rep * bq, self.d))
    }

    /// Keys `ks..ks + bk` of `x` (b, kv, tk, d), contiguous.
    fn key_block(&self, x: &Tensor, (ks, bk): (usize, usize)) -> Result<Tensor> {
        x.narrow(2, ks, bk)?.contiguous()
    }
}

/// The additive masks (bq, bk) of the cut blocks, made once per distinct (first query position - first key,
/// bq, bk): along a causal diagonal every block has the same one. Packed rows' masks (b, 1, bq, bk) differ per
/// block and batch row: made once per (first query, first key).
struct Masks<'a> {
    made: HashMap<(i64, usize, usize), Tensor>,
    window: usize,
    dtype: DType,
    device: Device,
    starts: Option<&'a [u32]>,
    b: usize,
    t: usize,
}

impl<'a> Masks<'a> {
    fn new(g: &Geometry<'a>, dtype: DType, device: &Device) -> Self {
        let (starts, b, t) = (g.starts, g.b, g.tq);
        Self { made: HashMap::new(), window: g.window, dtype, device: device.clone(), starts, b, t }
    }

    fn get(&mut self, q_pos: usize, ks: usize, bq: usize, bk: usize) -> Result<&Tensor> {
        if let Some(starts) = self.starts {
            return self.packed(starts, (q_pos, bq), (ks, bk));
        }
        let delta = q_pos as i64 - ks as i64;
        if !self.made.contains_key(&(delta, bq, bk)) {
            let mut values = vec![0f32; bq * bk];
            for i in 0..bq {
                for j in 0..bk {
                    let back = delta + i as i64 - j as i64;
                    if back < 0 || back as u64 >= self.window as u64 {
                        values[i * bk + j] = f32::NEG_INFINITY;
                    }
                }
            }
            let mask = Tensor::from_vec(values, (bq, bk), &self.device)?.to_dtype(self.dtype)?;
            self.made.insert((delta, bq, bk), mask);
        }
        Ok(&self.made[&(delta, bq, bk)])
    }

    /// The mask (b, 1, bq, bk) of queries `qs..qs + bq` against keys `ks..ks + bk` of packed rows (training:
    /// query positions are row indices).
    fn packed(&mut self, starts: &[u32], (qs, bq): (usize, usize), (ks, bk): (usize, usize)) -> Result<&Tensor> {
        let key = (qs as i64, ks, usize::MAX);
        if !self.made.contains_key(&key) {
            let mut values = vec![0f32; self.b * bq * bk];
            for r in 0..self.b {
                for i in 0..bq {
                    let (pos, start) = (qs + i, starts[r * self.t + qs + i] as usize);
                    for j in 0..bk {
                        let kpos = ks + j;
                        if kpos > pos || kpos < start || pos - kpos >= self.window {
                            values[(r * bq + i) * bk + j] = f32::NEG_INFINITY;
                        }
                    }
                }
            }
            let mask = Tensor::from_vec(values, (self.b, 1, bq, bk), &self.device)?.to_dtype(self.dtype)?;
            self.made.insert(key, mask);
        }
        Ok(&self.made[&key])
    }
}

/// `q_blk k_blk^T` (b, kv, rep * bq, bk) in the accumulators' dtype, masked when `masked`; the queries come
/// scaled (one pass over (T, d) instead of one over every block of scores).
fn block_scores(
    g: &Geometry,
    masks: &mut Masks,
    q_blk: &Tensor,
    k_blk: &Tensor,
    (qs, bq): (usize, usize),
    (ks, bk, masked): (usize, usize, bool),
) -> Result<Tensor> {
    let s = upcast(&matmul(q_blk, &k_blk.t()?)?)?;
    if !masked {
        return Ok(s);
    }
    let mask = masks.get(g.q_offset + qs, ks, bq, bk)?;
    // Flattened (see [`per_row`]): a mask per batch row (packed) or one for all rows.
    let masked = match g.starts {
        Some(_) => s.reshape((g.b, g.kv * g.rep, bq * bk))?.broadcast_add(&mask.reshape((g.b, 1, bq * bk))?)?,
        None => s.reshape((g.b * g.kv * g.rep, bq * bk))?.broadcast_add(&mask.reshape((1, bq * bk))?)?,
    };
    masked.reshape((g.b, g.kv, g.rep * bq, bk))
}

/// `op(x, stat)` for `x` (.., n) and a per-row `stat` (.., 1), on 2-D views of both: Candle's kernels (CUDA
/// and Metal alike) index a broadcast operand with a division and a remainder per dimension per element, which
/// made the 4-D broadcasts over score blocks several times slower than the memory allows (158 us for a 33.5 MB
/// subtraction on an H200). Both must be contiguous (the reshape is then a view).
fn per_row(x: &Tensor, stat: &Tensor, op: fn(&Tensor, &Tensor) -> Result<Tensor>) -> Result<Tensor> {
    let n = x.dim(D::Minus1)?;
    let rows = x.elem_count() / n.max(1);
    op(&x.reshape((rows, n))?, &stat.reshape((rows, 1))?)?.reshape(x.shape())
}

/// What the sums and statistics are kept in: f32 for half precision, the input's own dtype otherwise.
fn accumulator_dtype(dtype: DType) -> DType {
    match dtype {
        DType::F16 | DType::BF16 => DType::F32,
        other => other,
    }
}

/// A running maximum's start: finite, so a row that a cut block hides entirely gets exp(-inf - floor) = 0
/// rather than exp(-inf + inf) = NaN.
const MAX_FLOOR: f32 = -1e30;

/// `softmax(scale * q k^T + causal/window mask) v` for `q` (b, heads, tq, d) at positions `q_offset..` against
/// `k`/`v` (b, kv_heads, tk, d) at positions `0..`, a key no older than `window` positions back and, for packed
/// rows, none before `row_starts[r * tq + i]` (query i of row r; training, `q_offset` 0): the output
/// (b, tq, heads * d) in q's dtype and what [`blocked_attention_backward`] needs.
pub fn blocked_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    scale: f64,
    q_offset: usize,
    window: Option<usize>,
    row_starts: Option<&[u32]>,
) -> Result<(Tensor, BlockedStats)> {
    let (b, heads, _, _) = q.dims4()?;
    blocked_attention_in(q, k, v, scale, (q_offset, window), block_size(b, heads), row_starts)
}

/// [`blocked_attention`] with blocks of `block` queries and keys.
pub(crate) fn blocked_attention_in(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    scale: f64,
    (q_offset, window): (usize, Option<usize>),
    block: usize,
    row_starts: Option<&[u32]>,
) -> Result<(Tensor, BlockedStats)> {
    metal_dtypes("blocked_attention", &[q, k, v])?;
    let g = Geometry::new(q, k, (q_offset, window), block, row_starts)?;
    let acc_dtype = accumulator_dtype(q.dtype());
    let mut masks = Masks::new(&g, acc_dtype, q.device());
    let q = &(q * scale)?;
    let key_blocks: Vec<(Tensor, Tensor)> = (0..g.tk)
        .step_by(g.block)
        .map(|ks| {
            let span = (ks, g.block.min(g.tk - ks));
            Ok((g.key_block(k, span)?, g.key_block(v, span)?))
        })
        .collect::<Result<_>>()?;
    let (mut outs, mut lse) = (Vec::new(), Vec::new());
    for rows in g.query_blocks() {
        let q_blk = g.query_block(q, rows)?;
        let r = g.rep * rows.1;
        let stat = |value: f32| Tensor::full(value, (g.b, g.kv, r, 1), q.device())?.to_dtype(acc_dtype);
        let (mut m, mut l) = (stat(MAX_FLOOR)?, stat(0.0)?);
        let mut acc = Tensor::zeros((g.b, g.kv, r, g.d), acc_dtype, q.device())?;
        for keys in g.key_blocks(rows) {
            let (k_blk, v_blk) = &key_blocks[keys.0 / g.block];
            let s = block_scores(&g, &mut masks, &q_blk, k_blk, rows, keys)?;
            let m_new = m.maximum(&s.max_keepdim(D::Minus1)?)?;
            let p = per_row(&s, &m_new, Tensor::broadcast_sub)?.exp()?;
            let alpha = (m - &m_new)?.exp()?;
            l = ((l * &alpha)? + p.sum_keepdim(D::Minus1)?)?;
            let pv = upcast(&matmul(&p.to_dtype(v.dtype())?, v_blk)?)?;
            acc = (per_row(&acc, &alpha, Tensor::broadcast_mul)? + pv)?;
            m = m_new;
        }
        let out = per_row(&acc, &l, Tensor::broadcast_div)?.to_dtype(q.dtype())?;
        outs.push(out.reshape((g.b, g.kv, g.rep, rows.1, g.d))?);
        lse.push((m + l.log()?)?);
    }
    let heads = g.kv * g.rep;
    let out = Tensor::cat(&outs, 3)?.reshape((g.b, heads, g.tq, g.d))?.transpose(1, 2)?;
    let out = out.reshape((g.b, g.tq, heads * g.d))?;
    Ok((out, BlockedStats { lse, q_offset, block: g.block }))
}

/// Gradients `(dq (b, heads, tq, d), dk, dv (b, kv_heads, tk, d))` of [`blocked_attention`] for the output
/// gradient `d_out` (b * tq, heads * d) or (b, tq, heads * d); `out` is its output, `stats` what it returned,
/// `row_starts` what it was given.
/// Each block's probabilities are recomputed from the logsumexp (FlashAttention-2's backward, D = rowsum(dO O)).
#[allow(clippy::too_many_arguments)]
pub fn blocked_attention_backward(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    out: &Tensor,
    stats: &BlockedStats,
    d_out: &Tensor,
    scale: f64,
    window: Option<usize>,
    row_starts: Option<&[u32]>,
) -> Result<(Tensor, Tensor, Tensor)> {
    metal_dtypes("blocked_attention_backward", &[q, k, v, out, d_out])?;
    let g = Geometry::new(q, k, (stats.q_offset, window), stats.block, row_starts)?;
    let heads = g.kv * g.rep;
    let acc_dtype = accumulator_dtype(q.dtype());
    let mut masks = Masks::new(&g, acc_dtype, q.device());
    // (b * tq, heads * d) -> (b, heads, tq, d), the layout query_block reads.
    let as_heads = |x: &Tensor| x.reshape((g.b, g.tq, heads, g.d))?.transpose(1, 2);
    let (out, d_out) = (as_heads(out)?, as_heads(d_out)?);
    // Scaled queries give the scores and, against the unscaled ds = p (dp - D), dk whole; dq takes the scale
    // once per query block.
    let q_scaled = (q * scale)?;
    let key_spans: Vec<(usize, usize)> = (0..g.tk).step_by(g.block).map(|ks| (ks, g.block.min(g.tk - ks))).collect();
    let key_blocks: Vec<(Tensor, Tensor)> =
        key_spans.iter().map(|&span| Ok((g.key_block(k, span)?, g.key_block(v, span)?))).collect::<Result<_>>()?;
    let mut dk: Vec<Option<Tensor>> = vec![None; key_spans.len()];
    let mut dv: Vec<Option<Tensor>> = vec![None; key_spans.len()];
    let mut dq = Vec::new();
    let add = |acc: Option<Tensor>, x: Tensor| -> Result<Tensor> {
        match acc {
            Some(acc) => acc + x,
            None => Ok(x),
        }
    };
    for (rows, lse) in g.query_blocks().into_iter().zip(&stats.lse) {
        let q_blk = g.query_block(&q_scaled, rows)?;
        let do_blk = g.query_block(&d_out, rows)?;
        let delta = (upcast(&do_blk)? * upcast(&g.query_block(&out, rows)?)?)?.sum_keepdim(D::Minus1)?;
        let mut dq_blk: Option<Tensor> = None;
        for keys in g.key_blocks(rows) {
            let j = keys.0 / g.block;
            let (k_blk, v_blk) = &key_blocks[j];
            let s = block_scores(&g, &mut masks, &q_blk, k_blk, rows, keys)?;
            let p = per_row(&s, lse, Tensor::broadcast_sub)?.exp()?;
            let dv_j = upcast(&matmul(&p.to_dtype(v.dtype())?.t()?, &do_blk)?)?;
            dv[j] = Some(add(dv[j].take(), dv_j)?);
            let dp = upcast(&matmul(&do_blk, &v_blk.t()?)?)?;
            let ds = (p * per_row(&dp, &delta, Tensor::broadcast_sub)?)?.to_dtype(q.dtype())?;
            dq_blk = Some(add(dq_blk, upcast(&matmul(&ds, k_blk)?)?)?);
            let dk_j = upcast(&matmul(&ds.t()?, &q_blk)?)?;
            dk[j] = Some(add(dk[j].take(), dk_j)?);
        }
        let dq_blk = match dq_blk {
            Some(x) => (x * scale)?.to_dtype(q.dtype())?,
            None => Tensor::zeros((g.b, g.kv, g.rep * rows.1, g.d), q.dtype(), q.device())?,
        };
        dq.push(dq_blk.reshape((g.b, g.kv, g.rep, rows.1, g.d))?);
    }
    let dq = Tensor::cat(&dq, 3)?.reshape((g.b, heads, g.tq, g.d))?;
    let finish = |parts: Vec<Option<Tensor>>, like: &Tensor| -> Result<Tensor> {
        let parts = parts
            .into_iter()
            .zip(&key_spans)
            .map(|(part, &(_, bk))| match part {
                Some(x) => x.to_dtype(like.dtype()),
                None => Tensor::zeros((g.b, g.kv, bk, g.d), like.dtype(), like.device()),
            })
            .collect::<Result<Vec<_>>>()?;
        Tensor::cat(&parts, 2)
    };
    Ok((dq, finish(dk, k)?, finish(dv, v)?))
}

#[cfg(test)]
#[path = "blocked_attention_tests.rs"]
mod tests;
