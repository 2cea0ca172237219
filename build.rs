//! Compiles the fused CUDA kernels (decoding and training; src/engine/ops/cuda/fused.cu and the files it includes) to
//! PTX when the `cuda` feature is on, with the same nvcc and `CUDA_COMPUTE_CAP` that Candle's own kernels use. Other
//! builds do nothing.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    // The kernels: fused.cu and every file it includes.
    println!("cargo:rerun-if-changed=src/engine/ops/cuda");
    println!("cargo:rerun-if-env-changed=CUDA_COMPUTE_CAP");
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    let out_dir = std::path::PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let cap = std::env::var("CUDA_COMPUTE_CAP").unwrap_or_else(|_| "80".to_string());
    let nvcc = std::env::var_os("CUDA_HOME")
        .map(|home| std::path::PathBuf::from(home).join("bin").join("nvcc"))
        .filter(|p| p.exists())
        .unwrap_or_else(|| "nvcc".into());
    let compile = |arch: &str, file: &str| {
        let status = std::process::Command::new(&nvcc)
            .args(["-ptx", "-O3", &format!("-arch={arch}"), "src/engine/ops/cuda/fused.cu", "-o"])
            .arg(out_dir.join(file))
            .status()
            .unwrap_or_else(|e| panic!("could not run {}: {e} (the cuda feature needs nvcc)", nvcc.display()));
        assert!(status.success(), "nvcc failed on src/engine/ops/cuda/fused.cu for {arch}");
    };
    compile(&format!("compute_{cap}"), "fused.ptx");
    // Compute capability 9.0 (H100, H200) also gets the architecture-specific target (compute_90a): its warpgroup MMA
    // runs the attention backward (flash_attention_wgmma.cuh). That PTX loads on 9.0 devices only, so the portable one
    // stays for the rest (`cuda_kernels::launch::ptx`); other builds leave the second file empty.
    let sm90a = out_dir.join("fused_sm90a.ptx");
    if cap == "90" {
        compile("compute_90a", "fused_sm90a.ptx");
    } else {
        std::fs::write(&sm90a, "").expect("write an empty fused_sm90a.ptx");
    }
}
