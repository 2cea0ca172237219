//! Which kernels an op may take: the kernel set in use (native or portable), whether our CPU f32 kernels apply to a
//! tensor, and the portable graph's refusal of dtypes Candle's Metal backend lacks. Every dispatcher in ops/ asks
//! these before it picks a device's room (cpu/, cuda/, metal/) or Candle's composed ops.

use candle_core::{DType, Result, Tensor};

pub use crate::engine::runtime::Kernels;

/// The kernels in use (the runtime options').
pub fn kernels() -> Kernels {
    crate::engine::runtime::options().kernels
}

/// In the portable graph, an error for a tensor whose dtype Candle's Metal backend lacks (f64: Metal has no
/// f64 at all), naming the op; nothing otherwise.
pub(super) fn metal_dtypes(op: &str, tensors: &[&Tensor]) -> Result<()> {
    if kernels() == Kernels::Native {
        return Ok(());
    }
    match tensors.iter().find(|t| matches!(t.dtype(), DType::F64)) {
        Some(t) => candle_core::bail!("{op}: a {:?} tensor on the portable (Metal) path; Metal has no f64", t.dtype()),
        None => Ok(()),
    }
}

/// Whether the native kernel set is in use (the portable graph takes none of our kernels).
pub(crate) fn native() -> bool {
    kernels() == Kernels::Native
}

/// Whether our CPU f32 kernels take this tensor (never in the portable graph).
pub(super) fn is_cpu_f32(x: &Tensor) -> bool {
    our_cpu_kernels(x.device(), x.dtype())
}

/// Whether our CPU f32 kernels take tensors of `dtype` on `device`.
pub(super) fn our_cpu_kernels(device: &candle_core::Device, dtype: DType) -> bool {
    device.is_cpu() && dtype == DType::F32 && kernels() == Kernels::Native
}
