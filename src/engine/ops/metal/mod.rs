//! What only Metal runs: Candle's fused scaled-dot-product attention kernel for prefill from position 0 and decode.
//! Everything else a Mac runs is the portable graph, composed in the dispatchers from Candle's ops.

pub(super) mod sdpa;
