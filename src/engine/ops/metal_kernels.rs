//! Our own Metal kernels, written once in WGSL (`metal/wgsl/*.wgsl`): the catalogue of kernels and launches
//! (every platform: tests/wgsl_kernels.rs runs them through wgpu on Vulkan), naga's translation to MSL, the
//! dispatch through Candle's Metal custom-op interface and the tensor functions (macOS only). Nothing in the
//! model calls them yet: wiring them into the portable graph is the seam's choice (ops/mod.rs).

#[path = "metal/wgsl.rs"]
pub mod wgsl;

#[cfg(target_os = "macos")]
#[path = "metal/msl.rs"]
pub mod msl;

#[cfg(target_os = "macos")]
#[path = "metal/dispatch.rs"]
mod dispatch;

#[cfg(target_os = "macos")]
#[path = "metal/kernels.rs"]
mod kernels;

#[cfg(target_os = "macos")]
pub use kernels::{
    attention, attention_backward, cross_entropy, lora_epilogue, rms_norm, rms_norm_backward, rope, rope_backward,
    silu_mul, silu_mul_backward,
};
