//! The output head with its loss, computed in chunks of rows so the (tokens x vocabulary) logits never exist whole:
//! over a dense head (dense.rs) and over a quantized one (quantized.rs), with the per-row loss and gradient of the
//! CPU path in row_loss.rs.

pub(super) mod dense;
pub(super) mod quantized;
mod row_loss;
