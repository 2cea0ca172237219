//! Runtime options: the process-wide kernel and BLAS choices (which CPU matrix library, whether single-row
//! products use our matrix-vector kernel, whether CUDA decodes with the fused kernels, our kernels or the
//! portable op graph, Candle's Metal attention kernel, whether the training pass prints its phase times). The engine never reads or writes environment variables for them: a front end
//! builds one [`RuntimeOptions`] value (the CLI from its flags, reading the legacy `METAL_CANDLE_*` variables
//! only at the edge; the studio through the same binary's start-up) and hands it to [`init`].
//!
//! Why a one-time [`init`] instead of a value threaded through every call: the switches pick kernels deep
//! inside `ops` (a frozen product, a decode step, a BLAS multiply), reached from model loading, generation,
//! scoring, training and benchmarks alike. Passing the value down would add a parameter to nearly every
//! signature of the model and ops layers for choices that are, by nature, fixed for the life of the process
//! (a BLAS library cannot be unloaded). So the value is set once, before the engine first reads it, and is
//! immutable afterwards; a process that never calls [`init`] (tests, library users) gets
//! [`RuntimeOptions::default`], which is what a plain `metal-candle` run does.

use crate::engine::{Error, Result};
use std::path::PathBuf;
use std::sync::OnceLock;

/// Which CPU BLAS library to use for large f32 products.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum BlasLibrary {
    /// The first of Intel MKL (`libmkl_rt`) and OpenBLAS the loader finds; Candle's GEMM when neither is there.
    #[default]
    Auto,
    /// Never load one: Candle's GEMM for every product.
    Off,
    /// This library (a path or a file name the loader resolves).
    Path(PathBuf),
}

/// How the BLAS library is loaded and threaded.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BlasOptions {
    pub library: BlasLibrary,
    /// The user configured the library's own threads (`OPENBLAS_NUM_THREADS`, `MKL_NUM_THREADS` or
    /// `OMP_NUM_THREADS`, which the library reads itself): it keeps its own threads and we do not split
    /// multiplies over our CPU team. When false, the library is made single-threaded through its API and each
    /// multiply is split over the team.
    pub library_threads: bool,
    /// The user chose MKL's threading layer (`MKL_THREADING_LAYER`, read by MKL itself). When false we select
    /// GNU OpenMP through MKL's API (its default layer needs Intel's OpenMP runtime).
    pub mkl_threading_layer_chosen: bool,
}

/// Whether this build can run our WGSL kernels anywhere (Metal on a Mac, CPU tensors through Vulkan with the
/// `wgpu-kernels` feature): `--kernels wgsl` is refused otherwise.
pub const WGSL_ROUTE_BUILT: bool = cfg!(any(target_os = "macos", feature = "wgpu-kernels"));

/// Which kernels the ops may pick (`ops::kernels`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Kernels {
    /// Our own kernels where they apply (CPU f32 kernels, BLAS, CUDA fused kernels), Candle's elsewhere.
    #[default]
    Native,
    /// Only what a device without our kernels runs, Metal today: Candle's own kernels and composed ops. On
    /// the CPU or CUDA this runs the Mac's op graph, and every op checks that its tensors have a dtype Candle's
    /// Metal backend implements, so the portable graph is tested where Metal is not.
    Portable,
    /// The portable graph with our WGSL kernels where they apply (f32, f16 and bf16: RMS norm, rotary, SwiGLU,
    /// attention, the loss and the LoRA update, forward and backward): through Metal on a Mac; on CPU tensors through wgpu (Vulkan) in a build with the
    /// `wgpu-kernels` feature, which is how it is tested where no Mac is.
    Wgsl,
}

impl std::str::FromStr for Kernels {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "native" => Ok(Self::Native),
            "portable" => Ok(Self::Portable),
            "wgsl" => Ok(Self::Wgsl),
            other => Err(format!("unknown kernel set `{other}`; use native, portable or wgsl")),
        }
    }
}

/// Every process-wide engine switch, set once by a front end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeOptions {
    pub blas: BlasOptions,
    /// Single-row products (token-by-token decoding) use our matrix-vector kernels: f32 on the CPU
    /// (`ops/cpu/gemv.rs`), f32 and bf16 on CUDA (`ops/cuda/gemv.rs`); false falls back to Candle's GEMM and
    /// cuBLAS, for A/B measurements.
    pub gemv: bool,
    /// CUDA decoding uses the fused decoder-layer kernels (`ops/cuda/decode.rs`); false keeps the composed
    /// ops, for A/B comparisons.
    pub fused_decode: bool,
    /// CUDA decoding captures the single-token step as a CUDA graph and replays it (model/decode_graph.rs);
    /// false launches every op from the host each token, for A/B comparisons.
    pub cuda_graphs: bool,
    /// CUDA attention (training forward/backward, prefill) uses the fused flash-style kernels
    /// (`ops/cuda/attention.rs`); false keeps the composed attention with its (T x T) scores, for A/B
    /// comparisons.
    pub fused_attention: bool,
    /// The training pass prints the time of each of its phases (device synchronised) to stderr: a profile
    /// for devices where no profiler runs.
    pub step_phases: bool,
    /// Our kernels, or the portable op graph everywhere.
    pub kernels: Kernels,
    /// On Metal, attention runs through Candle's fused `sdpa` kernel where it applies; false keeps the portable
    /// attention (the switch back if that kernel misbehaves on some Mac).
    pub metal_sdpa: bool,
    /// CUDA decoding with a Q4_K base and bf16 activations runs its single-row products on the tensor cores
    /// (`ops/cuda/qgemv_mma.cuh`) instead of the FMA units (`qgemv.cuh`). On by default: on a lent H200 an 8B
    /// Q4_K base decodes at 1.48x its bf16 base with it and 1.28x without (BENCHMARKS.md, 2026-11-30).
    pub q4k_tensor_cores: bool,
}

impl Default for RuntimeOptions {
    fn default() -> Self {
        Self {
            blas: BlasOptions::default(),
            gemv: true,
            fused_decode: true,
            cuda_graphs: true,
            fused_attention: true,
            step_phases: false,
            kernels: Kernels::Native,
            metal_sdpa: true,
            q4k_tensor_cores: true,
        }
    }
}

static OPTIONS: OnceLock<RuntimeOptions> = OnceLock::new();

/// Fix the options for the life of the process. Call it once, before loading a model; it fails when the
/// engine has already started with other options (they cannot change under running kernels).
pub fn init(options: RuntimeOptions) -> Result<()> {
    if options.kernels == Kernels::Wgsl && !WGSL_ROUTE_BUILT {
        return Err(Error::InvalidSetting(
            "--kernels wgsl runs our WGSL kernels through Metal on a Mac, or on the CPU through Vulkan in a build with \
             the `wgpu-kernels` feature; this build has neither (use native or portable)"
                .into(),
        ));
    }
    let current = OPTIONS.get_or_init(|| options.clone());
    if *current != options {
        return Err(Error::InvalidSetting(format!(
            "runtime options are already fixed ({current:?}); set them once, before the engine starts"
        )));
    }
    Ok(())
}

/// The options in force: those given to [`init`], else the defaults (which are then fixed).
pub fn options() -> &'static RuntimeOptions {
    OPTIONS.get_or_init(RuntimeOptions::default)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_enable_every_fast_path() {
        let o = RuntimeOptions::default();
        assert!(o.gemv && o.fused_decode && o.cuda_graphs && !o.step_phases);
        assert_eq!(o.blas.library, BlasLibrary::Auto);
        assert!(!o.blas.library_threads);
    }

    #[test]
    fn init_accepts_the_same_options_again_and_refuses_others() {
        // The test binary never sets other options, so the defaults are (or become) the fixed value.
        assert!(init(RuntimeOptions::default()).is_ok());
        assert_eq!(options(), &RuntimeOptions::default());
        let other = RuntimeOptions { step_phases: true, ..RuntimeOptions::default() };
        assert!(init(other).is_err());
    }
}
