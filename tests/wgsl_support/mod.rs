//! Runs the WGSL kernels of `engine::ops::metal::wgsl` through wgpu (Vulkan here: Mesa's lavapipe in CI,
//! a GPU's own driver elsewhere; Metal on a Mac) with exactly the launches the Metal glue uses, and compares with
//! reference tensors. The naga -> MSL translation is the engine's own file, compiled in here (it is macOS-only in
//! the library, where naga is a dependency).

#![allow(dead_code)]

#[path = "../../src/engine/ops/metal/msl.rs"]
pub mod msl;

use metal_candle::engine::ops::metal::wgsl::{self, Elem, Kernel, Launch, Precision};
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use wgpu::util::DeviceExt;

/// An open wgpu device and the pipelines built on it.
pub struct Gpu {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    /// Adapter name and backend, for messages.
    pub name: String,
    /// Whether f16 kernels can run (`SHADER_F16`).
    pub f16: bool,
    pipelines: Mutex<HashMap<(Kernel, Precision, u32, &'static str), wgpu::ComputePipeline>>,
}

/// The shared device, or `None` (with the reason printed) when no adapter exists. With
/// `METAL_CANDLE_REQUIRE_VULKAN=1` (CI), a missing adapter is a failure instead.
pub fn gpu_or_skip(test: &str) -> Option<&'static Gpu> {
    static GPU: OnceLock<Result<Gpu, String>> = OnceLock::new();
    match GPU.get_or_init(open) {
        Ok(gpu) => Some(gpu),
        Err(why) if std::env::var("METAL_CANDLE_REQUIRE_VULKAN").is_ok_and(|v| v == "1") => {
            panic!("{test}: METAL_CANDLE_REQUIRE_VULKAN=1 but {why} (install mesa-vulkan-drivers for lavapipe)")
        }
        Err(why) => {
            eprintln!("SKIPPED {test}: {why}; install mesa-vulkan-drivers (lavapipe) to run the WGSL kernels");
            None
        }
    }
}

fn open() -> Result<Gpu, String> {
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
    desc.backends = wgpu::Backends::VULKAN | wgpu::Backends::METAL;
    let instance = wgpu::Instance::new(desc);
    let options = wgpu::RequestAdapterOptions {
        power_preference: wgpu::PowerPreference::HighPerformance,
        force_fallback_adapter: false,
        compatible_surface: None,
        ..Default::default()
    };
    let adapter = pollster::block_on(instance.request_adapter(&options))
        .map_err(|e| format!("no Vulkan (or Metal) adapter found ({e})"))?;
    let info = adapter.get_info();
    let f16 = adapter.features().contains(wgpu::Features::SHADER_F16);
    let required_features = if f16 { wgpu::Features::SHADER_F16 } else { wgpu::Features::empty() };
    let desc = wgpu::DeviceDescriptor {
        label: Some("wgsl-kernels"),
        required_features,
        required_limits: adapter.limits(),
        ..Default::default()
    };
    let (device, queue) = pollster::block_on(adapter.request_device(&desc))
        .map_err(|e| format!("the adapter {} refused a device ({e})", info.name))?;
    let name = format!("{} ({:?}, {:?})", info.name, info.backend, info.device_type);
    Ok(Gpu { device, queue, name, f16, pipelines: Mutex::new(HashMap::new()) })
}

/// Bytes of `data` stored as `elem` at `precision`.
pub fn bytes_of(elem: Elem, precision: Precision, data: &[f32]) -> Vec<u8> {
    match (elem, precision) {
        (Elem::Et, Precision::F16) => data.iter().flat_map(|v| half::f16::from_f32(*v).to_le_bytes()).collect(),
        (Elem::I32, _) => data.iter().flat_map(|v| (*v as i32).to_le_bytes()).collect(),
        _ => data.iter().flat_map(|v| v.to_le_bytes()).collect(),
    }
}

fn floats_of(elem: Elem, precision: Precision, bytes: &[u8], len: usize) -> Vec<f32> {
    match (elem, precision) {
        (Elem::Et, Precision::F16) => {
            bytes.chunks_exact(2).take(len).map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32()).collect()
        }
        (Elem::I32, _) => {
            bytes.chunks_exact(4).take(len).map(|c| i32::from_le_bytes(c.try_into().unwrap()) as f32).collect()
        }
        _ => bytes.chunks_exact(4).take(len).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect(),
    }
}

fn byte_len(elem: Elem, precision: Precision, len: usize) -> u64 {
    let size = if elem == Elem::Et { precision.size_in_bytes() } else { 4 };
    ((len * size).div_ceil(4) * 4).max(4) as u64
}

/// A launch with its buffers on the device, ready to dispatch any number of times.
pub struct Prepared<'g> {
    gpu: &'g Gpu,
    launch: Launch,
    precision: Precision,
    pipeline: wgpu::ComputePipeline,
    bind_group: wgpu::BindGroup,
    outputs: Vec<wgpu::Buffer>,
}

impl Gpu {
    fn pipeline(&self, launch: &Launch, precision: Precision, head_dim: u32) -> wgpu::ComputePipeline {
        let key = (launch.kernel, precision, head_dim, launch.entry);
        let mut cache = self.pipelines.lock().unwrap();
        cache
            .entry(key)
            .or_insert_with(|| {
                let source = wgsl::source(launch.kernel, precision, head_dim);
                let module = self.device.create_shader_module(wgpu::ShaderModuleDescriptor {
                    label: Some(launch.entry),
                    source: wgpu::ShaderSource::Wgsl(source.into()),
                });
                self.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                    label: Some(launch.entry),
                    layout: None,
                    module: &module,
                    entry_point: Some(launch.entry),
                    compilation_options: Default::default(),
                    cache: None,
                })
            })
            .clone()
    }

    /// Uploads `inputs` (one per input binding, as f32 values) and makes the output buffers.
    pub fn prepare(&self, launch: &Launch, precision: Precision, head_dim: u32, inputs: &[&[f32]]) -> Prepared<'_> {
        assert_eq!(inputs.len(), launch.inputs().len(), "{}: inputs", launch.entry);
        let pipeline = self.pipeline(launch, precision, head_dim);
        let params: Vec<u8> = launch.params.iter().flat_map(|w| w.to_le_bytes()).collect();
        let uniform = self.device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("params"),
            contents: &params,
            usage: wgpu::BufferUsages::UNIFORM,
        });
        let mut buffers = Vec::new();
        for (binding, data) in launch.inputs().iter().zip(inputs) {
            assert_eq!(data.len(), binding.len, "{}: binding {} length", launch.entry, binding.index);
            let mut contents = bytes_of(binding.elem, precision, data);
            contents.resize(byte_len(binding.elem, precision, binding.len) as usize, 0);
            buffers.push(self.device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some("input"),
                contents: &contents,
                usage: wgpu::BufferUsages::STORAGE,
            }));
        }
        let mut outputs = Vec::new();
        for binding in launch.output_bindings() {
            outputs.push(self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("output"),
                size: byte_len(binding.elem, precision, binding.len),
                usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: false,
            }));
        }
        let mut entries = vec![wgpu::BindGroupEntry { binding: 0, resource: uniform.as_entire_binding() }];
        for (binding, buffer) in launch.bindings.iter().zip(buffers.iter().chain(&outputs)) {
            entries.push(wgpu::BindGroupEntry { binding: binding.index, resource: buffer.as_entire_binding() });
        }
        let bind_group = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(launch.entry),
            layout: &pipeline.get_bind_group_layout(0),
            entries: &entries,
        });
        Prepared { gpu: self, launch: launch.clone(), precision, pipeline, bind_group, outputs }
    }

    /// Runs `launch` once on `inputs` and returns its outputs as f32 values.
    pub fn run(&self, launch: &Launch, precision: Precision, head_dim: u32, inputs: &[&[f32]]) -> Vec<Vec<f32>> {
        let prepared = self.prepare(launch, precision, head_dim, inputs);
        prepared.dispatch(1);
        prepared.read()
    }
}

impl Prepared<'_> {
    /// Dispatches the launch `times` times in one submission and waits for the device.
    pub fn dispatch(&self, times: usize) {
        let mut encoder = self.gpu.device.create_command_encoder(&Default::default());
        {
            let mut pass = encoder.begin_compute_pass(&Default::default());
            pass.set_pipeline(&self.pipeline);
            pass.set_bind_group(0, &self.bind_group, &[]);
            let [x, y, z] = self.launch.groups;
            for _ in 0..times {
                pass.dispatch_workgroups(x, y, z);
            }
        }
        self.gpu.queue.submit([encoder.finish()]);
        self.gpu.device.poll(wgpu::PollType::Wait { submission_index: None, timeout: None }).expect("device poll");
    }

    /// Reads every output back as f32 values.
    pub fn read(&self) -> Vec<Vec<f32>> {
        let mut encoder = self.gpu.device.create_command_encoder(&Default::default());
        let mut staging = Vec::new();
        for out in &self.outputs {
            let buf = self.gpu.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("readback"),
                size: out.size(),
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            });
            encoder.copy_buffer_to_buffer(out, 0, &buf, 0, out.size());
            staging.push(buf);
        }
        self.gpu.queue.submit([encoder.finish()]);
        for buf in &staging {
            buf.map_async(wgpu::MapMode::Read, .., |r| r.expect("map readback"));
        }
        self.gpu.device.poll(wgpu::PollType::Wait { submission_index: None, timeout: None }).expect("device poll");
        staging
            .iter()
            .zip(self.launch.output_bindings())
            .map(|(buf, binding)| {
                let view = buf.get_mapped_range(..).expect("mapped range");
                floats_of(binding.elem, self.precision, &view, binding.len)
            })
            .collect()
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
