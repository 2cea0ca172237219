//! The one seam for device-specific kernels. Callers (the model's blocks, the training pass) ask for an operation by
//! name (`ops::rms_norm`, `ops::fused_attention`, ...); the dispatcher of that operation picks the implementation
//! from the tensor's device, dtype and the kernel set in use (native or portable), and the device's room holds it:
//!
//! - `cpu/`: our CPU f32 kernels (parallel passes on the CPU team, BLAS products, matrix-vector and quantized
//!   matrix-vector kernels, half-precision products);
//! - `cuda/`: our fused CUDA kernels, each Rust launcher beside the `.cu`/`.cuh` sources it launches (compiled to PTX
//!   by build.rs), cuBLAS products with alpha/beta, graph capture of a decode step;
//! - `metal/`: what only Metal runs (Candle's fused sdpa for prefill and decode);
//! - everywhere else (Metal; CPU f16/bf16; the portable graph on any device): Candle's fused kernels where Candle has
//!   them (RMS norm, rotary, softmax), composed Candle ops otherwise; f64 (the finite-difference tests) composed so
//!   its arithmetic stays in f64.
//!
//! The dispatchers, one file per family of operations: norm.rs, rotary.rs, heads.rs, attention.rs, elementwise.rs,
//! products.rs, frozen_matmul.rs (products against frozen weights), quantized.rs (the quantized base), head/ (the
//! output head with its loss), backward.rs (the hand-written training backward), dropout.rs, scalar.rs, offload.rs
//! (where checkpointed layer inputs wait for the backward: the device, or pinned host memory on CUDA). What every
//! dispatcher asks first lives in kernel_choice.rs and precision.rs; report.rs says which implementation each
//! operation takes (`metal-candle doctor`). Adding a kernel means working in one device room plus one dispatch line in
//! the operation's dispatcher.
//!
//! No op here records an autograd graph: the training backward is written by hand from the `*_backward`
//! functions, and nothing on a GPU path creates an f64 tensor (Metal has none).

mod attention;
mod attention_masks;
mod backward;
mod blocked_attention;
mod cpu;
pub mod cuda;
mod dropout;
mod elementwise;
mod frozen_matmul;
mod gelu;
mod head;
mod heads;
pub(crate) mod kernel_choice;
#[cfg(test)]
mod kernel_tests;
pub mod metal;
mod norm;
mod offload;
mod precision;
mod products;
mod quantized;
mod report;
mod rotary;
mod scalar;
mod widened_products;

pub use attention::{
    blocked_attention_applies, fused_attention, fused_attention_applies, fused_attention_backward,
    scaled_masked_softmax, Logsumexp, NATIVE_CPU_BLOCKED_KEYS,
};
pub use backward::{
    gelu_tanh_mul_backward, rms_norm_backward, rms_norm_backward_add, rope_backward, silu_mul_backward,
    silu_mul_backward_with, silu_mul_remade, softmax_backward, SiluParts,
};
pub use blocked_attention::{
    block_size as attention_block_size, blocked_attention, blocked_attention_backward, BlockedStats,
};
pub use cuda::cast::cast_many;
pub use dropout::Dropout;
pub use elementwise::{add, add_scaled, gather_rows, gelu_tanh_mul, scatter_rows, silu_mul};
pub use frozen_matmul::{frozen_matmul, frozen_matmul_add, frozen_matmul_t, swiglu_matmul_t};
pub use head::dense::{head_nll, head_nll_rows, head_token_nll, logits_chunk_rows, HeadLoss};
pub use head::quantized::{dequantized_head_rows, kernel_takes_quantized_head, quantized_head_nll, QuantizedHead};
pub use heads::{merge_heads_backward, split_heads, split_query_heads};
pub use kernel_choice::{kernels, Kernels};
pub use metal::sdpa::sdpa;
pub use norm::{add_rms_norm, rms_norm};
pub use offload::{attention_fits_in_host, host_pin_budget, offload_applies, Offloader, Parked};
pub use precision::upcast;
pub use products::{lora_add, matmul, matmul_add, matmul_add_dropped, matmul_f32};
pub use quantized::{
    dequantize, dequantize_stacked, qtensor_to_device, quantize_rows, quantized_gemv_joined,
    quantized_gemv_joined_with, quantized_kernels_take, quantized_matmul, quantized_matmul_t, quantized_rows_on_device,
};
pub use report::implementations;
pub use rotary::rope;
pub use scalar::{sum_to_host, Scalar};
pub use widened_products::{forward_widening_pays, input_widening_pays, widened_forward, widened_input_grad};
