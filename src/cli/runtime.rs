//! The engine's runtime options as command-line flags, global to every subcommand and the studio, and the
//! environment variables older scripts use for them. This is the edge: the only place those variables are
//! read; the engine gets one [`RuntimeOptions`] value and reads (or writes) no environment at all.

use crate::engine::runtime::{BlasLibrary, BlasOptions, RuntimeOptions};
use clap::Args;
use std::ffi::OsString;
use std::path::PathBuf;

/// Kernel and BLAS switches (each also readable from a legacy `METAL_CANDLE_*` variable; a flag wins).
#[derive(Debug, Clone, Default, Args)]
pub struct RuntimeArgs {
    /// CPU BLAS library: auto (MKL, else OpenBLAS, when installed), off (Candle's GEMM), or a library path.
    /// Env: METAL_CANDLE_NO_BLAS=1 (off), METAL_CANDLE_BLAS_LIB=PATH.
    #[arg(long, global = true, value_name = "auto|off|PATH")]
    pub blas: Option<String>,
    /// Decode single rows with Candle's GEMM (cuBLAS on CUDA) instead of our matrix-vector kernels (A/B runs).
    /// Env: METAL_CANDLE_NO_GEMV=1.
    #[arg(long, global = true)]
    pub no_gemv: bool,
    /// CUDA: decode with the composed ops instead of the fused kernels (A/B runs).
    /// Env: METAL_CANDLE_NO_FUSED_DECODE=1.
    #[arg(long, global = true)]
    pub no_fused_decode: bool,
    /// CUDA: launch every decode op from the host instead of replaying a captured CUDA graph (A/B runs).
    #[arg(long, global = true)]
    pub no_cuda_graphs: bool,
    /// CUDA: attention through the composed ops (T x T scores) instead of the fused kernels (A/B runs).
    #[arg(long, global = true)]
    pub no_fused_attention: bool,
    /// Print each training pass's phase times (device synchronised) to stderr.
    /// Env: METAL_CANDLE_STEP_PHASES=1.
    #[arg(long, global = true)]
    pub step_phases: bool,
    /// native: our CPU and CUDA kernels where they apply; portable: only the op graph a Mac runs (Candle's
    /// kernels and composed ops, no f64), to test or measure that path on this machine; wgsl: the portable graph
    /// with our WGSL kernels for f32/f16/bf16 norms, rotary and SwiGLU (Metal on a Mac; CPU tensors through Vulkan in
    /// a build with the wgpu-kernels feature; refused elsewhere).
    #[arg(long, global = true, value_name = "native|portable|wgsl", default_value = "native")]
    pub kernels: crate::engine::runtime::Kernels,
    /// Metal: attention through the portable ops instead of Candle's fused sdpa kernel.
    #[arg(long, global = true)]
    pub no_metal_sdpa: bool,
    /// CUDA: decode a Q4_K base in bf16 on the FMA units instead of the tensor cores (the default's A/B
    /// partner, and the switch back if the tensor-core product misbehaves on some GPU).
    /// Env: METAL_CANDLE_NO_Q4K_TENSOR_CORES.
    #[arg(long, global = true)]
    pub no_q4k_tensor_cores: bool,
}

impl RuntimeArgs {
    /// The options these flags and this process's environment ask for.
    pub fn options(&self) -> RuntimeOptions {
        self.options_with(|name| std::env::var_os(name))
    }

    /// The options, with `var` standing for the environment. A variable counts when it is set at all, as it
    /// always has (`METAL_CANDLE_NO_GEMV=0` turns the kernel off too).
    fn options_with(&self, var: impl Fn(&str) -> Option<OsString>) -> RuntimeOptions {
        let set = |name: &str| var(name).is_some();
        let library = match self.blas.as_deref().map(str::trim) {
            Some(a) if a.eq_ignore_ascii_case("auto") => BlasLibrary::Auto,
            Some(o) if o.eq_ignore_ascii_case("off") || o.eq_ignore_ascii_case("none") => BlasLibrary::Off,
            Some(path) => BlasLibrary::Path(PathBuf::from(path)),
            None if set("METAL_CANDLE_NO_BLAS") => BlasLibrary::Off,
            None => var("METAL_CANDLE_BLAS_LIB").map_or(BlasLibrary::Auto, |p| BlasLibrary::Path(p.into())),
        };
        RuntimeOptions {
            blas: BlasOptions {
                library,
                // Read by the libraries themselves when they load; we only need to know the user chose.
                library_threads: ["OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS"].iter().any(|v| set(v)),
                mkl_threading_layer_chosen: set("MKL_THREADING_LAYER"),
            },
            gemv: !(self.no_gemv || set("METAL_CANDLE_NO_GEMV")),
            fused_decode: !(self.no_fused_decode || set("METAL_CANDLE_NO_FUSED_DECODE")),
            cuda_graphs: !self.no_cuda_graphs,
            fused_attention: !self.no_fused_attention,
            step_phases: self.step_phases || set("METAL_CANDLE_STEP_PHASES"),
            kernels: self.kernels,
            metal_sdpa: !self.no_metal_sdpa,
            q4k_tensor_cores: !(self.no_q4k_tensor_cores || set("METAL_CANDLE_NO_Q4K_TENSOR_CORES")),
        }
    }
}

/// Fix the engine's runtime options for this process and load the BLAS library; prints what a user should
/// know about it (OpenBLAS running slow kernels it could replace).
pub fn init(args: &RuntimeArgs) -> anyhow::Result<()> {
    crate::engine::runtime::init(args.options())?;
    crate::engine::blas::init()?;
    // Only when the user has not named a core type already (then the choice is theirs).
    if std::env::var_os("OPENBLAS_CORETYPE").is_none() {
        if let Some(advice) = crate::engine::blas::core_advice() {
            eprintln!("note: {advice}");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<OsString> + 'a {
        move |name| vars.iter().find(|(k, _)| *k == name).map(|(_, v)| OsString::from(v))
    }

    #[test]
    fn legacy_variables_still_switch_the_kernels() {
        let none = RuntimeArgs::default().options_with(env(&[]));
        assert_eq!(none, RuntimeOptions::default());
        let vars = [
            ("METAL_CANDLE_NO_BLAS", "1"),
            ("METAL_CANDLE_NO_GEMV", "1"),
            ("METAL_CANDLE_NO_FUSED_DECODE", "1"),
            ("METAL_CANDLE_STEP_PHASES", "1"),
            ("OPENBLAS_NUM_THREADS", "2"),
        ];
        let o = RuntimeArgs::default().options_with(env(&vars));
        assert_eq!(o.blas.library, BlasLibrary::Off);
        assert!(o.blas.library_threads && !o.blas.mkl_threading_layer_chosen);
        assert!(!o.gemv && !o.fused_decode && o.step_phases);
        let lib = RuntimeArgs::default().options_with(env(&[("METAL_CANDLE_BLAS_LIB", "/opt/libmkl_rt.so")]));
        assert_eq!(lib.blas.library, BlasLibrary::Path("/opt/libmkl_rt.so".into()));
    }

    #[test]
    fn flags_win_over_variables() {
        let args = RuntimeArgs { blas: Some("auto".into()), no_gemv: true, ..Default::default() };
        let o = args.options_with(env(&[("METAL_CANDLE_NO_BLAS", "1")]));
        assert_eq!(o.blas.library, BlasLibrary::Auto);
        assert!(!o.gemv && o.fused_decode);
        let off = RuntimeArgs { blas: Some("off".into()), ..Default::default() }.options_with(env(&[]));
        assert_eq!(off.blas.library, BlasLibrary::Off);
    }
}
