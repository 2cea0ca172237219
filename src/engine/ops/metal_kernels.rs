//! Our own Metal kernels, written once in WGSL (`metal/wgsl/*.wgsl`): the catalogue of kernels and launches
//! (every platform: the wgpu tests run them on Vulkan), naga's translation to MSL and the dispatch through
//! Candle's Metal custom-op interface (macOS only). Off unless `RuntimeOptions::wgsl_kernels` is set; nothing in
//! the model calls these yet.

#[path = "metal/wgsl.rs"]
pub mod wgsl;

#[cfg(target_os = "macos")]
#[path = "metal/msl.rs"]
pub mod msl;
