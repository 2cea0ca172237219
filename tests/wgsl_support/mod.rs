//! Runs the WGSL kernels of `engine::ops::metal::wgsl` through the library's own wgpu runner
//! (`engine::ops::metal::vulkan`: Vulkan here, Mesa's lavapipe in CI) with exactly the launches the Metal glue
//! uses, on f32 values, and compares with reference tensors. The naga -> MSL translation is the engine's own file,
//! compiled in here (it is macOS-only in the library, where naga is a dependency).

#![allow(dead_code)]

#[path = "../../src/engine/ops/metal/msl.rs"]
pub mod msl;

pub use metal_candle::engine::ops::metal::vulkan::{Gpu, Prepared};
use metal_candle::engine::ops::metal::{
    vulkan,
    wgsl::{Elem, Launch, Precision},
};

/// The shared device, or `None` (with the reason printed) when no adapter exists. With
/// `METAL_CANDLE_REQUIRE_VULKAN=1` (CI), a missing adapter is a failure instead.
pub fn gpu_or_skip(test: &str) -> Option<&'static Gpu> {
    match vulkan::gpu() {
        Ok(gpu) => Some(gpu),
        Err(why) if std::env::var("METAL_CANDLE_REQUIRE_VULKAN").is_ok_and(|v| v == "1") => {
            panic!("{test}: METAL_CANDLE_REQUIRE_VULKAN=1 but {why}")
        }
        Err(why) => {
            eprintln!("SKIPPED {test}: {why}");
            None
        }
    }
}

/// Bytes of `data` stored as `elem` at `precision`.
pub fn bytes_of(elem: Elem, precision: Precision, data: &[f32]) -> Vec<u8> {
    match (elem, precision) {
        (Elem::Et, Precision::F16) => data.iter().flat_map(|v| half::f16::from_f32(*v).to_le_bytes()).collect(),
        (Elem::Et, Precision::Bf16) => data.iter().flat_map(|v| half::bf16::from_f32(*v).to_le_bytes()).collect(),
        (Elem::I32, _) => data.iter().flat_map(|v| (*v as i32).to_le_bytes()).collect(),
        (Elem::U32, _) => data.iter().flat_map(|v| (*v as u32).to_le_bytes()).collect(),
        _ => data.iter().flat_map(|v| v.to_le_bytes()).collect(),
    }
}

fn floats_of(elem: Elem, precision: Precision, bytes: &[u8], len: usize) -> Vec<f32> {
    match (elem, precision) {
        (Elem::Et, Precision::F16) => {
            bytes.chunks_exact(2).take(len).map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32()).collect()
        }
        (Elem::Et, Precision::Bf16) => {
            bytes.chunks_exact(2).take(len).map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect()
        }
        (Elem::I32, _) => {
            bytes.chunks_exact(4).take(len).map(|c| i32::from_le_bytes(c.try_into().unwrap()) as f32).collect()
        }
        (Elem::U32, _) => {
            bytes.chunks_exact(4).take(len).map(|c| u32::from_le_bytes(c.try_into().unwrap()) as f32).collect()
        }
        _ => bytes.chunks_exact(4).take(len).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect(),
    }
}

/// Launches on f32 values: each input converted to its binding's element type, each output back to f32.
pub trait Values {
    /// Uploads `inputs` (one per input binding) and makes the output buffers.
    fn prepare_values(&self, launch: &Launch, precision: Precision, head_dim: u32, inputs: &[&[f32]]) -> Prepared<'_>;
    /// Runs `launch` once on `inputs` and returns its outputs as f32 values.
    fn run(&self, launch: &Launch, precision: Precision, head_dim: u32, inputs: &[&[f32]]) -> Vec<Vec<f32>>;
}

impl Values for Gpu {
    fn prepare_values(&self, launch: &Launch, precision: Precision, head_dim: u32, inputs: &[&[f32]]) -> Prepared<'_> {
        assert_eq!(inputs.len(), launch.inputs().len(), "{}: inputs", launch.entry);
        let bytes: Vec<Vec<u8>> = launch
            .inputs()
            .iter()
            .zip(inputs)
            .map(|(binding, data)| {
                assert_eq!(data.len(), binding.len, "{}: binding {} length", launch.entry, binding.index);
                bytes_of(binding.elem, precision, data)
            })
            .collect();
        self.prepare(launch, precision, head_dim, &bytes)
    }

    fn run(&self, launch: &Launch, precision: Precision, head_dim: u32, inputs: &[&[f32]]) -> Vec<Vec<f32>> {
        let prepared = self.prepare_values(launch, precision, head_dim, inputs);
        prepared.dispatch(1);
        let outputs = prepared.read();
        launch.output_bindings().iter().zip(&outputs).map(|(b, out)| floats_of(b.elem, precision, out, b.len)).collect()
    }
}

/// Largest error of `got` against `want`, relative to max(|want_i|, mean |want|) (the mean keeps near-zero
/// entries from dominating), with the index where it occurs.
pub fn max_rel_err(got: &[f32], want: &[f32]) -> (f32, usize) {
    assert_eq!(got.len(), want.len());
    let mean = want.iter().map(|v| v.abs()).sum::<f32>() / want.len().max(1) as f32;
    let mut worst = (0.0f32, 0);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let err = (g - w).abs() / w.abs().max(mean).max(f32::MIN_POSITIVE);
        if !(err <= worst.0) {
            worst = (err, i);
        }
    }
    worst
}

/// Panics naming `what` when `got` is not within `tol` of `want` by [`max_rel_err`].
pub fn assert_close(what: &str, got: &[f32], want: &[f32], tol: f32) {
    let (err, i) = max_rel_err(got, want);
    assert!(err <= tol, "{what}: relative error {err:e} > {tol:e} at {i} (got {}, want {})", got[i], want[i]);
    eprintln!("{what}: max relative error {err:e} (tolerance {tol:e})");
}
