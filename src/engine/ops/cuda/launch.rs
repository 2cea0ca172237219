//! Launch plumbing of our fused CUDA kernels (fused.cu beside this file, compiled to PTX by build.rs): the PTX per
//! device, kernel names per dtype, contiguous views of storages, output buffers and tensors over them, and the
//! macros that load a kernel and bind a Rust element type. Every launcher in this folder uses it; built with the
//! `cuda` feature only.

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{CudaView, DeviceRepr};
use candle_core::cuda_backend::CudaDType;
use candle_core::{bail, CudaStorage, DType, Layout, Result};

const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/fused.ptx"));
/// The same kernels for compute capability 9.0 exactly (compute_90a: warpgroup MMA); empty unless the build
/// targets 9.0 (build.rs).
const PTX_SM90A: &str = include_str!(concat!(env!("OUT_DIR"), "/fused_sm90a.ptx"));

/// Whether `dev` runs the sm_90a build of our kernels: a compute capability 9.0 device, and this build has it
/// (a build for 9.0 run on a later GPU loads the portable one). Each device's answer is kept.
pub fn sm90a(dev: &candle_core::CudaDevice) -> bool {
    if PTX_SM90A.is_empty() {
        return false;
    }
    static SM90: std::sync::Mutex<Vec<(usize, bool)>> = std::sync::Mutex::new(Vec::new());
    let context = dev.cuda_stream().context().clone();
    let ordinal = context.ordinal();
    let mut known = SM90.lock().unwrap_or_else(|e| e.into_inner());
    match known.iter().find(|(o, _)| *o == ordinal) {
        Some(&(_, sm90)) => sm90,
        None => {
            let sm90 = context.compute_capability().is_ok_and(|cc| cc == (9, 0));
            known.push((ordinal, sm90));
            sm90
        }
    }
}

/// The PTX of our kernels for `dev` (see [`sm90a`]).
pub fn ptx(dev: &candle_core::CudaDevice) -> &'static str {
    if sm90a(dev) {
        PTX_SM90A
    } else {
        PTX
    }
}

pub fn kernel_name(storage: &CudaStorage, name: &str) -> Result<String> {
    match storage.dtype() {
        DType::F32 => Ok(format!("{name}_f32")),
        DType::BF16 => Ok(format!("{name}_bf16")),
        other => bail!("fused kernels take f32 or bf16, not {other:?}"),
    }
}

/// Our kernel `name` on the CUDA device `dev`, from the module of our PTX loaded once per device (Candle's
/// function handle type is not nameable here, hence macros).
macro_rules! load {
    ($dev:expr, $name:expr) => {
        $dev.get_or_load_custom_func($name, "metal_candle_fused", $crate::engine::ops::cuda::launch::ptx($dev))
    };
}

/// The kernel `name` for `storage`'s dtype.
macro_rules! func {
    ($storage:expr, $name:literal) => {
        $crate::engine::ops::cuda::launch::load!(
            $storage.device(),
            &$crate::engine::ops::cuda::launch::kernel_name($storage, $name)?
        )
    };
}

/// The CUDA storage under a tensor's read guard, or an error naming `what`.
pub fn on_cuda<'a>(storage: &'a candle_core::Storage, what: &str) -> Result<&'a CudaStorage> {
    match storage {
        candle_core::Storage::Cuda(s) => Ok(s),
        _ => bail!("fused kernel: {what} is not on the CUDA device"),
    }
}

pub fn view<'a, T: CudaDType>(storage: &'a CudaStorage, layout: &Layout, what: &str) -> Result<CudaView<'a, T>> {
    let Some((start, end)) = layout.contiguous_offsets() else { bail!("fused kernel: {what} must be contiguous") };
    Ok(storage.as_cuda_slice::<T>()?.slice(start..end))
}

/// The device address of `t`'s first element, its storage of element type `T` (`what` names it in errors):
/// for kernels that take addresses by value (the multi-tensor kernels' chunks, the decode's position). The
/// address stays valid while `t` lives.
pub fn device_address<T: CudaDType>(t: &candle_core::Tensor, what: &str) -> Result<u64> {
    use candle_core::cuda_backend::cudarc::driver::DevicePtr;
    let (storage, layout) = t.storage_and_layout();
    let slice = on_cuda(&storage, what)?.as_cuda_slice::<T>()?;
    let (ptr, _sync) = slice.device_ptr(slice.stream());
    Ok(ptr + (layout.start_offset() * std::mem::size_of::<T>()) as u64)
}

/// OPT_TENSORS of fused.cu: tensors a multi-tensor kernel (the optimizer's, the batched cast) takes per launch,
/// their addresses passed by value.
pub const MULTI_TENSORS: usize = 24;

pub fn int(v: usize) -> i32 {
    v as i32
}

/// Blocks of 256 threads for a grid-stride loop over `n` elements (at most 8,192 blocks).
pub fn grid_stride(n: usize) -> candle_core::cuda_backend::cudarc::driver::LaunchConfig {
    let blocks = n.div_ceil(256).clamp(1, 8192) as u32;
    candle_core::cuda_backend::cudarc::driver::LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Run `$body` with `$t` bound to the Rust element type of `$storage`.
macro_rules! with_dtype {
    ($storage:expr, $t:ident, $body:block) => {
        match $storage.dtype() {
            candle_core::DType::F32 => {
                type $t = f32;
                $body
            }
            candle_core::DType::BF16 => {
                type $t = half::bf16;
                $body
            }
            candle_core::DType::F16 => {
                type $t = half::f16;
                $body
            }
            other => candle_core::bail!("fused kernels take f32, bf16 or f16, not {other:?}"),
        }
    };
}

pub fn output<T: CudaDType + DeviceRepr>(
    dev: &candle_core::CudaDevice,
    len: usize,
) -> Result<candle_core::cuda_backend::cudarc::driver::CudaSlice<T>> {
    // SAFETY: every element is written by the kernel that follows.
    unsafe { dev.alloc::<T>(len) }
}
/// A tensor (no autograd) over a buffer a kernel filled, in `shape`'s contiguous layout.
pub fn wrap<T: CudaDType>(
    slice: candle_core::cuda_backend::cudarc::driver::CudaSlice<T>,
    dev: &candle_core::CudaDevice,
    shape: impl Into<candle_core::Shape>,
) -> candle_core::Tensor {
    let storage = candle_core::Storage::Cuda(CudaStorage::wrap_cuda_slice(slice, dev.clone()));
    candle_core::Tensor::from_storage(storage, shape, candle_core::op::BackpropOp::none(), false)
}
pub(crate) use {func, load, with_dtype};
