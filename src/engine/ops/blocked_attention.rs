//! Attention without the (T x T) matrix, built only from Candle ops that its Metal backend has (matmul, the
//! fused last-dimension softmax, broadcast arithmetic and comparisons, narrow/cat, casts). Queries go in blocks
//! of [`block_size`] rows; each block's scores cover every key one of its queries sees, so one fused
//! `softmax_last_dim` normalises them (no online softmax: no running maximum, sum or rescaled accumulator, each
//! a pass over the scores through Candle's element-wise kernels) and the block's output is one product. The
//! backward recomputes each block's probabilities by the same softmax, so no block of scores outlives its step
//! and the extra memory is O(block x T x heads) besides the linear-in-T inputs and gradients.
//!
//! Grouped-query heads are never repeated: the query heads that share a KV head are folded into the rows of a
//! block, (b, kv_heads, rep * block, d), and the key/value gradients sum over them in the products. A block's
//! keys start at the first any of its queries sees (the causal start, a sliding window's edge or, for packed
//! rows, the earliest example start among them), rounded down to a multiple of the block. Blocks that some query
//! does not see whole are masked (attention_masks.rs) on the columns some query does not see, in place: causal and
//! window masks as a view of one relative mask kept between calls, packed rows' example starts per block on the
//! device.

use super::attention_masks;
use super::kernel_choice::metal_dtypes;
use super::precision::{filled, upcast};
use super::products::{matmul, row_dots};
use candle_core::{DType, Device, Result, Tensor};

/// The most queries per block.
pub const BLOCK: usize = 512;

/// The fewest queries per block.
const MIN_BLOCK: usize = 16;

/// Columns appended to the head size in the backward's `[dO, D..] [V, -1/8..]^T` product: eight, so that the inner
/// size stays a multiple of 8 (half-precision products align on it).
const CENTRING: usize = 8;

/// The most scores of one block over all batch rows and heads (32 Mi: 64 MiB in bf16, 128 MiB in f32); a handful
/// of such temporaries are alive at once, whatever T.
const BLOCK_SCORES: usize = 1 << 25;

/// The most queries per block, as a multiple of the head size (see [`block_size`]).
const BLOCK_PER_HEAD_DIM: usize = 4;

/// Queries per block for `b` sequences of `heads` query heads of `head_dim` against `keys` keys, a key no older
/// than `window` positions back: the largest power of two from [`MIN_BLOCK`] to [`BLOCK`], and to
/// [`BLOCK_PER_HEAD_DIM`] times the head size, whose (b * heads, block, keys a block sees) scores fit
/// [`BLOCK_SCORES`]. The bound by the head size keeps a block's scores within four times the size of the queries
/// (b * heads * T * head_dim), so a small model's attention memory stays as linear in T as the rest of its
/// activations. Llama-3.2-1B (32 heads of 64) at 4 x 1024 or 1 x 4096: 256. Fewer, larger blocks cost fewer
/// dispatches and fewer partial sums of the key gradients, more causal waste and a larger masked corner each; on a
/// lent H200 the portable step took 0.244 s at 1 x 4096 with 256 against 0.276 s with 128, and 0.160 against 0.164 s
/// at 4 x 1024 (blocks of 512 in an earlier build: 0.243 s and 0.185 s; BENCHMARKS.md, fortieth session).
pub fn block_size(b: usize, heads: usize, head_dim: usize, keys: usize, window: Option<usize>) -> usize {
    let mut block = BLOCK;
    let seen = |block: usize| keys.min(window.unwrap_or(usize::MAX).saturating_add(2 * block));
    while block > MIN_BLOCK && (block > BLOCK_PER_HEAD_DIM * head_dim || b * heads * block * seen(block) > BLOCK_SCORES)
    {
        block /= 2;
    }
    block
}

/// What the backward of [`blocked_attention`] needs besides its inputs and output: the geometry it used (the
/// probabilities are recomputed, not kept).
#[derive(Debug, Clone)]
pub struct BlockedStats {
    q_offset: usize,
    block: usize,
}

/// The keys one query block sees: `len` keys from `start`, and whether some of them are hidden from some of its
/// queries (then a mask is added).
#[derive(Clone, Copy, Debug, PartialEq)]
struct KeySpan {
    start: usize,
    len: usize,
    masked: bool,
}

impl KeySpan {
    /// These keys of `x` (b, kv, tk, d): a view.
    fn of(self, x: &Tensor) -> Result<Tensor> {
        x.narrow(2, self.start, self.len)
    }
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
        if kb != b || kd != d || kv == 0 || heads % kv != 0 || q_offset + tq != tk {
            candle_core::bail!("blocked attention: q {:?} at {q_offset} does not fit k {:?}", q.dims(), k.dims());
        }
        if starts.is_some_and(|s| s.len() != b * tq || q_offset != 0) {
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

    /// The keys rows `qs..qs + bq` see, from a multiple of the block to the last query's own position (a key j is
    /// seen from position p when j <= p, p - j < window and j is not before p's example start). Every query sees
    /// its own key, so the span is never empty; the spans' starts and ends grow with `qs`.
    fn key_span(&self, (qs, bq): (usize, usize)) -> KeySpan {
        let (q_lo, q_hi) = (self.q_offset + qs, self.q_offset + qs + bq - 1);
        let (first_start, last_start) = self.start_bounds((qs, bq));
        let window_edge = (q_lo + 1).saturating_sub(self.window);
        let start = window_edge.max(first_start) / self.block * self.block;
        let end = (q_hi + 1).min(self.tk);
        let all_seen = end - 1 <= q_lo && q_hi - start < self.window && start >= last_start;
        KeySpan { start, len: end - start, masked: !all_seen }
    }

    /// Rows `qs..qs + bq` of `x` (b, heads, tq, d), of any strides (any d), times `scale` when given (in the same pass
    /// as the copy), the heads of a KV head folded into the rows: (b, kv, rep * bq, d) contiguous. One strided copy
    /// per block, so the queries may come as a view of the rotated rows (`ops::split_query_heads`) and the output
    /// gradient as a view of its row layout: turning either to (b, heads, tq, d) first would be one more pass.
    fn query_block(&self, x: &Tensor, (qs, bq): (usize, usize), scale: Option<f64>) -> Result<Tensor> {
        let rows = x.narrow(2, qs, bq)?;
        let rows = match scale {
            Some(scale) => rows.affine(scale, 0.0)?,
            None => rows.contiguous()?,
        };
        rows.reshape((self.b, self.kv, self.rep * bq, x.dim(3)?))
    }

    /// The columns of `span`'s scores that some query of block `rows` does not see, as (first, end) ranges: on the
    /// left, keys before the window's edge or a packed row's start; on the right, keys after the block's first
    /// query. The keys between are seen by every query and need no mask; ranges that meet become one.
    fn hidden_columns(&self, (qs, bq): (usize, usize), span: KeySpan) -> Vec<(usize, usize)> {
        let (q_lo, q_hi) = (self.q_offset + qs, self.q_offset + qs + bq - 1);
        let (_, last_start) = self.start_bounds((qs, bq));
        let left = (q_hi + 1).saturating_sub(self.window).max(last_start).saturating_sub(span.start).min(span.len);
        let right = (q_lo + 1).saturating_sub(span.start).min(span.len);
        if left >= right {
            return vec![(0, span.len)];
        }
        [(0, left), (right, span.len)].into_iter().filter(|(first, end)| first < end).collect()
    }

    /// `s` (b, kv, rep * bq, len), the scores of query block `rows` against `span`, with the keys each query does
    /// not see hidden. Only the [`hidden_columns`](Self::hidden_columns) are masked, in place: a causal block's
    /// mask covers its last `bq` keys, not all it sees. Unpacked, those columns' scores come again from `scores`
    /// (first column, count: the product against just those keys, contiguous, where reading them out of `s` is a
    /// strided copy; `s` itself when they are all its columns), are added to the kept expanded mask (two
    /// contiguous tensors) and written back.
    fn masked(
        &self,
        s: Tensor,
        rows: (usize, usize),
        span: KeySpan,
        starts: Option<&Tensor>,
        scores: impl Fn(usize, usize) -> Result<Tensor>,
    ) -> Result<Tensor> {
        let shape = s.shape().clone();
        let s = s.reshape((self.b, self.kv * self.rep, rows.1, span.len))?;
        let hidden = self.hidden_columns(rows, span);
        let add = |first: usize, n: usize| {
            let keys = (span.start + first, n);
            let mask = match starts {
                None => self.expanded_mask(rows, keys, &s)?,
                Some(_) => None,
            };
            match (mask, n == span.len) {
                (Some(mask), true) => s.clone() + mask,
                (Some(mask), false) => scores(first, n)?.reshape(mask.shape())? + mask,
                (None, _) => self.add_mask(&s.narrow(3, first, n)?, rows, keys, starts),
            }
        };
        if hidden == [(0, span.len)] {
            return add(0, span.len)?.reshape(shape);
        }
        for (first, end) in hidden {
            s.slice_set(&add(first, end - first)?, 3, first)?;
        }
        s.reshape(shape)
    }

    /// The causal/window mask of query block `(qs, bq)` against `keys` (first, count), (b, heads, bq, count) in the
    /// dtype and on the device of `like`, contiguous and kept (`attention_masks::causal_expanded`; None when too
    /// large to keep).
    fn expanded_mask(&self, (qs, bq): (usize, usize), keys: (usize, usize), like: &Tensor) -> Result<Option<Tensor>> {
        let queries = (self.q_offset + qs, bq);
        let bh = (self.b, self.kv * self.rep);
        attention_masks::causal_expanded(queries, keys, (self.window, self.tk), bh, like.dtype(), like.device())
    }

    /// `s` (b, heads, bq, keys), scores of query block `(qs, bq)` against `keys` (first, count), plus their mask:
    /// the causal/window mask as a view of the kept relative mask and, for packed rows, the keys before each
    /// query's example start.
    fn add_mask(
        &self,
        s: &Tensor,
        (qs, bq): (usize, usize),
        keys: (usize, usize),
        starts: Option<&Tensor>,
    ) -> Result<Tensor> {
        let queries = (self.q_offset + qs, bq);
        let causal = attention_masks::causal(queries, keys, (self.window, self.tk), s.dtype(), s.device())?;
        let mask = match starts {
            None => causal.unsqueeze(0)?,
            Some(starts) => {
                attention_masks::before_starts(starts, (qs, bq), keys, s.dtype())?.broadcast_add(&causal)?
            }
        };
        s.broadcast_add(&mask.unsqueeze(1)?)
    }
}

/// The packed rows' starts on the device, (b, tq) in f32 (exact below 2^24), for their masks.
fn starts_on_device(g: &Geometry, device: &Device) -> Result<Option<Tensor>> {
    let floats = |s: &[u32]| s.iter().map(|&x| x as f32).collect::<Vec<_>>();
    g.starts.map(|s| Tensor::from_vec(floats(s), (g.b, g.tq), device)).transpose()
}

/// The probabilities (b, kv, rep * bq, len) of query block `rows` (scaled queries `q_blk`) over the keys of
/// `span` (`k_span`: those keys), in the inputs' dtype: one product, the mask where the span needs one, one fused
/// softmax. Candle's CPU softmax sums in its input's dtype, so half precision goes through f32 there (its CUDA and
/// Metal kernels accumulate in f32 themselves).
fn probabilities(
    g: &Geometry,
    q_blk: &Tensor,
    k_span: &Tensor,
    rows: (usize, usize),
    span: KeySpan,
    starts: Option<&Tensor>,
) -> Result<Tensor> {
    let mut s = matmul(q_blk, &k_span.t()?)?;
    if span.masked {
        let scores = |first: usize, n: usize| matmul(q_blk, &k_span.narrow(2, first, n)?.t()?);
        s = g.masked(s, rows, span, starts, scores)?;
    }
    if s.device().is_cpu() && matches!(s.dtype(), DType::F16 | DType::BF16) {
        return candle_nn::ops::softmax_last_dim(&upcast(&s)?)?.to_dtype(s.dtype());
    }
    candle_nn::ops::softmax_last_dim(&s)
}

/// `softmax(scale * q k^T + causal/window mask) v` for `q` (b, heads, tq, d) at positions `q_offset..` against
/// `k`/`v` (b, kv_heads, q_offset + tq, d) at positions `0..`, a key no older than `window` positions back and,
/// for packed rows, none before `row_starts[r * tq + i]` (query i of row r; training, `q_offset` 0): the output
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
    let (b, heads, _, head_dim) = q.dims4()?;
    let block = block_size(b, heads, head_dim, k.dim(2)?, window);
    blocked_attention_in(q, k, v, scale, (q_offset, window), block, row_starts)
}

/// [`blocked_attention`] with blocks of `block` queries.
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
    let starts = starts_on_device(&g, q.device())?;
    let mut outs = Vec::new();
    for rows in g.query_blocks() {
        let span = g.key_span(rows);
        let (k_span, v_span) = (span.of(k)?, span.of(v)?);
        let p = probabilities(&g, &g.query_block(q, rows, Some(scale))?, &k_span, rows, span, starts.as_ref())?;
        let out = matmul(&p, &v_span)?;
        outs.push(out.reshape((g.b, g.kv, g.rep, rows.1, g.d))?);
    }
    let heads = g.kv * g.rep;
    let out = Tensor::cat(&outs, 3)?.reshape((g.b, heads, g.tq, g.d))?.transpose(1, 2)?;
    let out = out.reshape((g.b, g.tq, heads * g.d))?;
    Ok((out, BlockedStats { q_offset, block: g.block }))
}

/// The key/value gradients of every key, summed over the query blocks that see it. The blocks go last to first;
/// their spans end at or before the previous block's end and start at or before its start, so the running sum
/// covers `start..end` and a block's part covers `its start..end'` with `end' <= end`: keys from `end'` on get no
/// more parts and are final.
struct KeyGradients {
    /// The running sum, (b * kv, end - start, d) in the accumulators' dtype.
    sum: Option<(Tensor, usize, usize)>,
    /// Final pieces, (first key, (b * kv, keys, d)), in decreasing order of first key.
    done: Vec<(usize, Tensor)>,
}

impl KeyGradients {
    fn new() -> Self {
        Self { sum: None, done: Vec::new() }
    }

    /// Adds `part` (b, kv, span.len, d) for the keys of `span`.
    fn add(&mut self, part: &Tensor, span: KeySpan) -> Result<()> {
        let (b, kv, len, d) = part.dims4()?;
        let part = upcast(part)?.reshape((b * kv, len, d))?;
        let (start, end) = (span.start, span.start + span.len);
        let sum = match self.sum.take() {
            None => part,
            Some((sum, s0, e0)) => {
                if end < e0 {
                    let keep = end.max(s0);
                    // A copy of just these keys: a view (or Candle's `copy`) would keep the whole running sum's
                    // buffer alive to the end, O(T^2) over the blocks.
                    self.done.push((keep, sum.narrow(1, keep - s0, e0 - keep)?.force_contiguous()?));
                }
                if end <= s0 {
                    part
                } else {
                    let overlap = sum.narrow(1, 0, end - s0)?;
                    let shared = (part.narrow(1, s0 - start, end - s0)? + overlap)?;
                    match s0 - start {
                        0 => shared,
                        left => Tensor::cat(&[&part.narrow(1, 0, left)?, &shared], 1)?,
                    }
                }
            }
        };
        self.sum = Some((sum, start, end));
        Ok(())
    }

    /// Every key's gradient, (b, kv, tk, d) in `like`'s dtype; keys no query sees get zeros.
    fn finish(mut self, like: &Tensor) -> Result<Tensor> {
        let (b, kv, tk, d) = like.dims4()?;
        if let Some((sum, start, _)) = self.sum.take() {
            self.done.push((start, sum));
        }
        let zeros = |keys: usize| Tensor::zeros((b * kv, keys, d), like.dtype(), like.device());
        let mut pieces = Vec::new();
        let mut at = 0;
        for (start, piece) in self.done.into_iter().rev() {
            if start > at {
                pieces.push(zeros(start - at)?);
            }
            at = start + piece.dim(1)?;
            pieces.push(piece.to_dtype(like.dtype())?);
        }
        if at < tk {
            pieces.push(zeros(tk - at)?);
        }
        Tensor::cat(&pieces, 1)?.reshape((b, kv, tk, d))
    }
}

/// Gradients `(dq (b, heads, tq, d), dk, dv (b, kv_heads, tk, d))` of [`blocked_attention`] for the output
/// gradient `d_out` (b * tq, heads * d) or (b, tq, heads * d); `out` is its output, `stats` what it returned,
/// `row_starts` what it was given. Each block's probabilities are recomputed by the forward's softmax;
/// `ds = p (dp - D)` with D = rowsum(dO O) (FlashAttention-2's backward), `dp - D` as one product of the output
/// gradient and the values each widened by [`CENTRING`] columns (D against -1/8), summed in the product's
/// accumulator and rounded once.
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
    let starts = starts_on_device(&g, q.device())?;
    let heads = g.kv * g.rep;
    // D = rowsum(dO O) for every query at once from the row layout (no copy of the output by heads), as row dots
    // summed in f32, kept in the inputs' dtype: (b, tq, heads, 1).
    let by_heads = |x: &Tensor| x.reshape((g.b, g.tq, heads, g.d));
    let d_out_rows = by_heads(d_out)?;
    let delta = row_dots(&d_out_rows, &by_heads(out)?)?.to_dtype(q.dtype())?;
    // dp - D out of one product: [dO, D x 8] against [V, -1/8 x 8] (no pass over the scores to subtract D, and one
    // rounding of the difference, not two; the eight D/8 sum exactly in the product's accumulator).
    let tail = delta.broadcast_as((g.b, g.tq, heads, CENTRING))?.contiguous()?;
    // Kept in the row layout (b, tq, heads, d + 8), seen by heads: each block gathers its rows itself.
    let d_out = Tensor::cat(&[&d_out_rows, &tail], 3)?.transpose(1, 2)?;
    let minus_eighths = filled(-1.0 / CENTRING as f64, (g.b, g.kv, g.tk, CENTRING), v.dtype(), v.device())?;
    let v_centring = Tensor::cat(&[v, &minus_eighths], 3)?;
    // Each block's queries are scaled as they are copied out: they give the scores and, against the unscaled ds,
    // dk whole; dq takes the scale from the keys, scaled once for every block (a pass over the keys, where scaling
    // each block's dq was a pass over the queries' size per block).
    let k_scaled = (k * scale)?;
    let (mut dk, mut dv) = (KeyGradients::new(), KeyGradients::new());
    let mut dq = Vec::new();
    for rows in g.query_blocks().into_iter().rev() {
        let span = g.key_span(rows);
        let k_span = span.of(k)?;
        let q_blk = g.query_block(q, rows, Some(scale))?;
        let do_blk = g.query_block(&d_out, rows, None)?;
        let p = probabilities(&g, &q_blk, &k_span, rows, span, starts.as_ref())?;
        dv.add(&matmul(&p.t()?, &do_blk)?.narrow(3, 0, g.d)?, span)?;
        let ds = (&p * matmul(&do_blk, &span.of(&v_centring)?.t()?)?)?;
        let dq_blk = matmul(&ds, &span.of(&k_scaled)?)?;
        dq.push(dq_blk.reshape((g.b, g.kv, g.rep, rows.1, g.d))?);
        dk.add(&matmul(&ds.t()?, &q_blk)?, span)?;
    }
    dq.reverse();
    let dq = Tensor::cat(&dq, 3)?.reshape((g.b, heads, g.tq, g.d))?;
    Ok((dq, dk.finish(k)?, dv.finish(v)?))
}

#[cfg(test)]
#[path = "blocked_attention_tests.rs"]
mod tests;
