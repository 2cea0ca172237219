//! Our fused CUDA kernels, each Rust launcher beside the CUDA source it launches: fused.cu includes the `.cuh` files
//! of this folder and build.rs compiles it to PTX (the `cuda` feature; without it the op types exist and refuse to
//! run). Taken under the native kernel set in f32 and bf16 ([`availability::available`]).
//!
//! - training.rs (training.cuh, heads.cuh): the training pass's softmax, heads and rotary, SwiGLU, row gathers and
//!   scatters, cross-entropy, dropout; residual.rs: the residual add fused with the RMS norm, forward and backward;
//! - attention.rs (flash_attention*.cuh, flash_*_ops.cuh): flash attention, training forward/backward and prefill;
//! - decode.rs, gemv.rs (gemv.cuh) and qgemv.rs (qgemv.cuh: quantized weights): token-by-token decoding; graph.rs: a
//!   decode step captured as a CUDA graph; dequantize.rs (dequantize.cuh): a quantized weight made dense for the
//!   many-row products;
//! - gemm.rs: cuBLAS products with alpha and beta; cast.rs: many casts in one launch; optimizer.rs: the AdamW step;
//! - offload.rs: checkpoints parked in pinned host memory, copied on a second stream;
//! - nccl.rs (the `nccl` feature): NCCL's all-reduce, summing gradients over the ranks of a data-parallel run;
//! - launch.rs, availability.rs, refuse.rs: the plumbing they share.

pub(super) mod attention;
pub(crate) mod availability;
pub(super) mod cast;
pub mod decode;
#[cfg(feature = "cuda")]
pub(super) mod dequantize;
pub(super) mod gemm;
#[cfg(feature = "cuda")]
pub(super) mod gemv;
pub mod graph;
#[cfg(feature = "cuda")]
pub(crate) mod launch;
#[cfg(feature = "nccl")]
pub mod nccl;
pub mod offload;
pub mod optimizer;
#[cfg(feature = "cuda")]
pub(super) mod qgemv;
pub(crate) mod refuse;
pub(super) mod residual;
pub(super) mod training;
