//! What only Metal runs, and our own kernels written once in WGSL for it.
//!
//! - sdpa.rs: Candle's fused scaled-dot-product attention kernel for prefill from position 0 and decode.
//! - Our WGSL kernels (`wgsl/*.wgsl`): wgsl.rs is the catalogue of kernels and launches; kernels.rs holds them as
//!   tensor functions shaped like their portable counterparts; [`run`] sends a launch to its device's route:
//!   dispatch.rs on a Mac (naga's MSL from msl.rs, through Candle's Metal custom-op interface), vulkan.rs on CPU
//!   tensors in a build with the `wgpu-kernels` feature (wgpu on Vulkan: lavapipe in CI). The dispatchers in ops/
//!   take them under `--kernels wgsl` ([`takes`]), so the wiring a Mac runs is run and tested here through Vulkan.
//!
//! Everything else a Mac runs is the portable graph, composed in the dispatchers from Candle's ops.

#[cfg(target_os = "macos")]
mod dispatch;
mod element_access;
mod kernels;
#[cfg(target_os = "macos")]
pub mod msl;
pub(super) mod sdpa;
#[cfg(feature = "wgpu-kernels")]
pub mod vulkan;
pub mod wgsl;

use super::kernel_choice::{kernels, Kernels};
use candle_core::{DType, Device, Result, Shape, Tensor};
use std::collections::BTreeMap;
use std::sync::Mutex;
use wgsl::{Launch, Precision};

pub use kernels::{
    attention, attention_backward, cross_entropy, dropout_apply, lora_epilogue, lowrank_add, rms_norm,
    rms_norm_backward, rope, rope_backward, rope_fits, silu_mul, silu_mul_backward, AttentionMask,
};

/// Whether tensors on `device` have a route to the WGSL kernels in this build.
fn has_route(device: &Device) -> bool {
    match device {
        Device::Metal(_) => cfg!(target_os = "macos"),
        Device::Cpu => cfg!(feature = "wgpu-kernels"),
        _ => false,
    }
}

/// Whether ops on `dtype` tensors on `device` take our WGSL kernels: `--kernels wgsl`, a dtype the kernels store
/// (f32, f16, bf16) and a device with a route.
pub fn takes_on(device: &Device, dtype: DType) -> bool {
    kernels() == Kernels::Wgsl && Precision::for_dtype(dtype).is_some() && has_route(device)
}

/// Whether the kernels can write rows of `len` elements of `dtype`: any length but bf16's, which must be even (its
/// kernels write whole u32 words, two elements each, so an odd row would share a word with the next).
pub fn row_fits(dtype: DType, len: usize) -> bool {
    dtype != DType::BF16 || len.is_multiple_of(2)
}

/// Whether an op on `tensors` takes our WGSL kernel: [`takes_on`] for the first, the others of its dtype and
/// device, and every last dimension [`row_fits`].
pub fn takes(tensors: &[&Tensor]) -> bool {
    let Some(first) = tensors.first() else { return false };
    takes_on(first.device(), first.dtype())
        && tensors.iter().all(|t| {
            t.dtype() == first.dtype()
                && t.device().same_device(first.device())
                && row_fits(t.dtype(), t.dims().last().copied().unwrap_or(1))
        })
}

static LAUNCHES: Mutex<BTreeMap<&'static str, usize>> = Mutex::new(BTreeMap::new());

/// How many times each WGSL entry point ran in this process (what `--kernels wgsl` took).
pub fn launch_counts() -> BTreeMap<&'static str, usize> {
    LAUNCHES.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// Runs `launch` on `inputs` (one per input binding, in order) through their device's route and returns its
/// outputs reshaped to `shapes`. `head_dim` specialises the attention kernels (0 otherwise).
pub(crate) fn run(launch: &Launch, head_dim: u32, inputs: &[&Tensor], shapes: &[Shape]) -> Result<Vec<Tensor>> {
    if inputs.len() != launch.inputs().len() || shapes.len() != launch.outputs {
        candle_core::bail!(
            "{}: {} inputs and {} output shapes for this launch",
            launch.entry,
            inputs.len(),
            shapes.len()
        )
    }
    for (t, binding) in inputs.iter().zip(launch.inputs()) {
        if t.elem_count() != binding.len {
            let (entry, index, len) = (launch.entry, binding.index, binding.len);
            candle_core::bail!("{entry}: binding {index} has {} elements, expected {len}", t.elem_count())
        }
    }
    *LAUNCHES.lock().unwrap_or_else(|e| e.into_inner()).entry(launch.entry).or_default() += 1;
    match inputs[0].device() {
        #[cfg(target_os = "macos")]
        Device::Metal(_) => dispatch::run(launch, head_dim, inputs, shapes),
        #[cfg(feature = "wgpu-kernels")]
        Device::Cpu => vulkan::run(launch, head_dim, inputs, shapes),
        other => {
            // Only a route reads it; a build without one would warn.
            let _ = head_dim;
            candle_core::bail!(
                "{}: no route to the WGSL kernels for {:?} in this build",
                launch.entry,
                other.location()
            )
        }
    }
}
