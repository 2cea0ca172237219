//! The output head with its loss, computed in chunks of rows so the (tokens x vocabulary) logits never exist whole:
//! over a dense head (dense.rs) and over a quantized one (quantized.rs), with the per-row loss and gradient of the
//! CPU path in row_loss.rs and the composed path's bf16 chunks in unshifted_bf16.rs.

pub(super) mod dense;
pub(super) mod quantized;
mod row_loss;
mod unshifted_bf16;
