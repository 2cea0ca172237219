//! What `metal-candle doctor` reports: which implementation each operation takes on a device in a dtype, from the
//! same predicates the dispatchers use.

use candle_core::DType;

use super::attention::{blocked_attention_applies, NATIVE_CPU_BLOCKED_KEYS};
use super::cuda::{attention as cuda_attention, availability::available as cuda_available, decode as cuda_decode};
use super::kernel_choice::{kernels, our_cpu_kernels};
use super::precision::composed_in_f64;

/// Where `--kernels wgsl` runs its kernels for tensors on `device`.
fn wgsl_route(device: &candle_core::Device) -> &'static str {
    if device.is_metal() {
        "Metal, MSL by naga"
    } else {
        "Vulkan through wgpu"
    }
}

/// Which implementation each operation takes on `device` in `dtype`, from the same predicates the ops use:
/// what `metal-candle doctor` reports.
pub fn implementations(device: &candle_core::Device, dtype: DType) -> Vec<(&'static str, String)> {
    let ours_cpu = our_cpu_kernels(device, dtype);
    let ours_cuda = cuda_available(device, dtype);
    let blas = crate::engine::blas::library_name().filter(|_| ours_cpu);
    let options = crate::engine::runtime::options();
    let candle = |what: &str| format!("Candle's {what}");
    let products = match blas {
        Some(lib) if options.gemv => format!("{lib}, split over our CPU team; single rows: our matrix-vector kernel"),
        Some(lib) => format!("{lib}, split over our CPU team"),
        None => candle("matmul"),
    };
    let element_wise = if ours_cpu {
        "our CPU f32 kernels".to_string()
    } else if ours_cuda {
        "our fused CUDA kernels".into()
    } else {
        candle("composed ops")
    };
    let batched = blas.map(|lib| format!("{lib}, split over our CPU team")).unwrap_or_else(|| candle("matmul"));
    let attention = if cuda_attention::applies(device, dtype, 64) {
        "our fused CUDA flash attention (training forward/backward, prefill; head_dim 16/32/64/128)".to_string()
    } else if device.is_metal() && options.metal_sdpa {
        format!(
            "{} (prefill from position 0, decode); training and other prefills in blocks",
            candle("fused sdpa kernel")
        )
    } else if blocked_attention_applies(device, dtype, 64, 2) {
        format!(
            "in blocks of queries against the keys they see, one fused softmax, no T x T scores (products: {batched})"
        )
    } else {
        format!(
            "scores and values: {batched}; scaled masked softmax: {element_wise}; from {NATIVE_CPU_BLOCKED_KEYS} keys \
             in blocks (no T x T scores)"
        )
    };
    let decode_layer = if cuda_decode::enabled(device, dtype) {
        "fused CUDA decoder layer (10 launches; layers with adapters on q/k/v/gate/up or q/k norms: composed)"
    } else {
        "composed from the ops above"
    };
    // `--kernels wgsl` on a device and dtype with a route to our WGSL kernels (the same test the dispatchers make).
    let wgsl = super::metal::takes_on(device, dtype);
    let ours_wgsl = |what: &str| format!("our WGSL {what} kernel, forward and backward ({})", wgsl_route(device));
    let attention = if wgsl {
        let head_dims = super::metal::wgsl::ATTENTION_HEAD_DIMS.map(|d| d.to_string()).join("/");
        format!(
            "{} (causal, from position 0 or after a cache, with sliding windows and packed rows, head_dim \
             {head_dims}); other shapes: {attention}",
            ours_wgsl("flash attention")
        )
    } else {
        attention
    };
    let norm = if wgsl {
        ours_wgsl("RMS-norm")
    } else if composed_in_f64(dtype) {
        "composed in f64".to_string()
    } else {
        candle("fused RMS-norm kernel")
    };
    let head_loss = if wgsl {
        format!("chunked; loss and gradient: our WGSL cross-entropy kernel ({})", wgsl_route(device))
    } else if ours_cpu && blas.is_some() {
        "chunked, through BLAS".into()
    } else if ours_cuda {
        "chunked; loss and gradient: our CUDA cross-entropy kernel".into()
    } else {
        candle("ops, chunked")
    };
    let rotary = if wgsl { ours_wgsl("rope") } else { candle("fused rope kernel") };
    let swiglu =
        if wgsl { format!("{}; residual adds: {element_wise}", ours_wgsl("SwiGLU")) } else { element_wise.clone() };
    let mut rows = vec![
        ("kernel set", format!("{:?}", kernels()).to_lowercase()),
        (
            "frozen and adapter products",
            if wgsl {
                format!(
                    "{products}; an adapter's update: our WGSL LoRA epilogue kernel at inference, our WGSL low-rank \
                     add in training (forward and the input gradient)"
                )
            } else {
                products
            },
        ),
        ("RMS norm", norm),
        ("rotary embedding", rotary),
        ("attention", attention),
        ("SwiGLU, residual adds", swiglu),
        (
            "GeGLU (gemma3) and its backward",
            if ours_cpu { "our CPU f32 kernels".into() } else { candle("gelu kernel and composed ops") },
        ),
        (
            "training backward (norm, rope, softmax, SwiGLU)",
            if wgsl { format!("norm, rope, SwiGLU: as above; softmax: {element_wise}") } else { element_wise.clone() },
        ),
        ("head + loss", head_loss),
        ("decode step", decode_layer.to_string()),
    ];
    if wgsl && dtype == DType::BF16 {
        rows.push((
            "WGSL kernels in bf16",
            "rows of even width (a word holds two bf16); a tensor whose last dimension is odd (such as a 517-word \
             vocabulary's logits) takes Candle's ops for that operation"
                .into(),
        ));
    }
    rows
}
