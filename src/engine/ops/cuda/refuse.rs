//! The CPU side of CUDA-only custom ops: `cpu_fwd` bodies that refuse with an error naming the op, and (without the
//! `cuda` feature) op types that exist so callers compile but refuse to run.

/// The `cpu_fwd` of a CUDA-only op: an error naming the op (callers check [`super::availability::available`] first).
macro_rules! refuse_cpu {
    (CustomOp1, $name:literal) => {
        fn cpu_fwd(
            &self,
            _: &candle_core::CpuStorage,
            _: &candle_core::Layout,
        ) -> candle_core::Result<(candle_core::CpuStorage, candle_core::Shape)> {
            candle_core::bail!(concat!($name, " runs on CUDA only (the fused kernels)"))
        }
    };
    (CustomOp2, $name:literal) => {
        fn cpu_fwd(
            &self,
            _: &candle_core::CpuStorage,
            _: &candle_core::Layout,
            _: &candle_core::CpuStorage,
            _: &candle_core::Layout,
        ) -> candle_core::Result<(candle_core::CpuStorage, candle_core::Shape)> {
            candle_core::bail!(concat!($name, " runs on CUDA only (the fused kernels)"))
        }
    };
    (CustomOp3, $name:literal) => {
        fn cpu_fwd(
            &self,
            _: &candle_core::CpuStorage,
            _: &candle_core::Layout,
            _: &candle_core::CpuStorage,
            _: &candle_core::Layout,
            _: &candle_core::CpuStorage,
            _: &candle_core::Layout,
        ) -> candle_core::Result<(candle_core::CpuStorage, candle_core::Shape)> {
            candle_core::bail!(concat!($name, " runs on CUDA only (the fused kernels)"))
        }
    };
    (InplaceOp3, $name:literal) => {
        fn cpu_fwd(
            &self,
            _: &mut candle_core::CpuStorage,
            _: &candle_core::Layout,
            _: &candle_core::CpuStorage,
            _: &candle_core::Layout,
            _: &candle_core::CpuStorage,
            _: &candle_core::Layout,
        ) -> candle_core::Result<()> {
            candle_core::bail!(concat!($name, " runs on CUDA only (the fused kernels)"))
        }
    };
}
pub(crate) use refuse_cpu;

/// Without the `cuda` feature: an op type that exists (so callers compile) but refuses to run.
#[cfg(not(feature = "cuda"))]
macro_rules! cpu_only_op {
    ($ty:ident, $trait:ident, $name:literal) => {
        impl candle_core::$trait for $ty {
            fn name(&self) -> &'static str {
                $name
            }
            $crate::engine::ops::cuda::refuse::refuse_cpu!($trait, $name);
        }
    };
}
#[cfg(not(feature = "cuda"))]
pub(crate) use cpu_only_op;
