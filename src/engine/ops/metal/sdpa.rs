//! Attention through Candle's fused Metal kernel (`candle_nn::ops::sdpa`, Metal-only in Candle), for inference
//! on a Mac: the prefill of a fresh sequence (causal, no cache before it) and the single-token decode step. The
//! inputs are the same grouped-query tensors the portable path multiplies (tests/portable.rs checks that path
//! on the CPU); anything the kernel does not model (a cache offset during prefill, a sliding window that
//! cuts, an unsupported head size) returns `None` and takes the portable path. `RuntimeOptions::metal_sdpa` (the CLI's
//! `--no-metal-sdpa`) switches it off. Never run by us: no Mac is available where this is developed.

use candle_core::{Result, Tensor};

/// `softmax(q k^T * scale) v` for `q` (b, heads, t, d) at positions `start_pos..` against `k`/`v`
/// (b, kv_heads, total, d), causal, through Candle's Metal kernel: `Some((b, heads, t, d))` when it applies.
pub fn sdpa(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    scale: f64,
    start_pos: usize,
    window: Option<usize>,
) -> Result<Option<Tensor>> {
    if !applies(q, k, start_pos, window)? {
        return Ok(None);
    }
    let run = |q: &Tensor, k: &Tensor, v: &Tensor, causal: bool| {
        candle_nn::ops::sdpa(&q.contiguous()?, &k.contiguous()?, &v.contiguous()?, None, causal, scale as f32, 1.0)
    };
    let t = q.dim(2)?;
    Ok(Some(run(q, k, v, t > 1)?))
}

fn applies(q: &Tensor, k: &Tensor, start_pos: usize, window: Option<usize>) -> Result<bool> {
    if !cfg!(target_os = "macos") || !q.device().is_metal() || !crate::engine::runtime::options().metal_sdpa {
        return Ok(false);
    }
    let (t, total, d) = (q.dim(2)?, k.dim(2)?, q.dim(3)?);
    let head_dim_supported = matches!(d, 32 | 64 | 72 | 80 | 96 | 128 | 256);
    let window_covers = window.is_none_or(|w| total <= w);
    // A single query sees every cached key; a fresh square prefill is plain causal attention.
    let shape_supported = t == 1 || (start_pos == 0 && t == total);
    Ok(head_dim_supported && window_covers && shape_supported)
}
