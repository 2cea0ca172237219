//! Compiles the fused CUDA kernels (decoding and training; src/engine/ops/cuda/fused.cu and the files it includes) to
//! PTX when the `cuda` feature is on, with the same nvcc and `CUDA_COMPUTE_CAP` that Candle's own kernels use. Other
//! builds do nothing.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=src/engine/ops/cuda/fused.cu");
    println!("cargo:rerun-if-changed=src/engine/ops/cuda/flash_attention.cuh");
    println!("cargo:rerun-if-changed=src/engine/ops/cuda/gemv.cuh");
    println!("cargo:rerun-if-changed=src/engine/ops/cuda/heads.cuh");
    println!("cargo:rerun-if-changed=src/engine/ops/cuda/training.cuh");
    println!("cargo:rerun-if-changed=src/engine/ops/cuda/flash_attention_mma.cuh");
    println!("cargo:rerun-if-changed=src/engine/ops/cuda/flash_mma_ops.cuh");
    println!("cargo:rerun-if-changed=src/engine/ops/cuda/flash_attention_wgmma.cuh");
    println!("cargo:rerun-if-env-changed=CUDA_COMPUTE_CAP");
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("fused.ptx");
    let cap = std::env::var("CUDA_COMPUTE_CAP").unwrap_or_else(|_| "80".to_string());
    let nvcc = std::env::var_os("CUDA_HOME")
        .map(|home| std::path::PathBuf::from(home).join("bin").join("nvcc"))
        .filter(|p| p.exists())
        .unwrap_or_else(|| "nvcc".into());
    // Compute capability 9.0 (H100, H200) gets the architecture-specific target (compute_90a): its warpgroup MMA
    // instructions run attention kernels (flash_attention_wgmma.cuh); PTX for it loads on 9.0 devices only, which
    // is what this build is for.
    let arch = if cap == "90" { "compute_90a".to_string() } else { format!("compute_{cap}") };
    let status = std::process::Command::new(&nvcc)
        .args(["-ptx", "-O3", &format!("-arch={arch}"), "src/engine/ops/cuda/fused.cu", "-o"])
        .arg(&out)
        .status()
        .unwrap_or_else(|e| panic!("could not run {}: {e} (the cuda feature needs nvcc)", nvcc.display()));
    assert!(status.success(), "nvcc failed on src/engine/ops/cuda/fused.cu");
}
