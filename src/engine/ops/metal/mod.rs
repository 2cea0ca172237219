//! What only Metal runs.
//!
//! - sdpa.rs: Candle's fused scaled-dot-product attention kernel for prefill from position 0 and decode.
//! - Our own kernels, written once in WGSL (`wgsl/*.wgsl`): wgsl.rs is the catalogue of kernels and launches (every
//!   platform: tests/wgsl_kernels.rs runs them through wgpu on Vulkan, Mesa's lavapipe in CI); msl.rs is naga's
//!   translation to Metal Shading Language (MSL 2.4, at first use on the Mac); dispatch.rs runs them through
//!   Candle's Metal custom-op interface and kernels.rs holds the tensor functions (macOS only). Nothing in the model
//!   calls them yet: a dispatcher in ops/ takes one by adding its line.
//!
//! Everything else a Mac runs is the portable graph, composed in the dispatchers from Candle's ops.

#[cfg(target_os = "macos")]
mod dispatch;
#[cfg(target_os = "macos")]
mod kernels;
#[cfg(target_os = "macos")]
pub mod msl;
pub(super) mod sdpa;
pub mod wgsl;

#[cfg(target_os = "macos")]
pub use kernels::{
    attention, attention_backward, cross_entropy, lora_epilogue, rms_norm, rms_norm_backward, rope, rope_backward,
    silu_mul, silu_mul_backward,
};
