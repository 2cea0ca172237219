//! Runs a [`Launch`] of our WGSL kernels through wgpu on Vulkan (Mesa's lavapipe where there is no GPU): the
//! same kernels and launches the Metal glue (dispatch.rs) runs on a Mac. [`run`] takes CPU tensors, copies them
//! into storage buffers, dispatches and reads the outputs back as CPU tensors, so `--kernels wgsl` runs and is
//! tested end to end where no Mac is (feature `wgpu-kernels`); [`Gpu`] is also what tests/wgsl_kernels.rs
//! compares and times each kernel on.

use super::wgsl::{self, Elem, Kernel, Launch, Precision};
use candle_core::{DType, Device, Result, Shape, Tensor};
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use wgpu::util::DeviceExt;

/// What a compiled pipeline is kept by: kernel, precision, head size and entry point.
type PipelineKey = (Kernel, Precision, u32, &'static str);

/// An open wgpu device and the pipelines built on it.
pub struct Gpu {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    /// Adapter name and backend, for messages.
    pub name: String,
    /// Whether f16 kernels can run (`SHADER_F16`).
    pub f16: bool,
    pipelines: Mutex<HashMap<PipelineKey, wgpu::ComputePipeline>>,
}

/// The process's wgpu device, opened at first use, or why there is none.
pub fn gpu() -> std::result::Result<&'static Gpu, String> {
    static GPU: OnceLock<std::result::Result<Gpu, String>> = OnceLock::new();
    GPU.get_or_init(open).as_ref().map_err(Clone::clone)
}

fn open() -> std::result::Result<Gpu, String> {
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
        .map_err(|e| format!("no Vulkan adapter for the WGSL kernels ({e}); install mesa-vulkan-drivers (lavapipe)"))?;
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

/// Bytes a binding of `len` elements takes at `precision`, rounded up to whole 4-byte words.
fn byte_len(elem: Elem, precision: Precision, len: usize) -> u64 {
    let size = if elem == Elem::Et { precision.size_in_bytes() } else { 4 };
    ((len * size).div_ceil(4) * 4).max(4) as u64
}

/// A launch with its buffers on the device, ready to dispatch any number of times.
pub struct Prepared<'g> {
    gpu: &'g Gpu,
    launch: Launch,
    pipeline: wgpu::ComputePipeline,
    bind_group: wgpu::BindGroup,
    outputs: Vec<wgpu::Buffer>,
}

impl Gpu {
    fn pipeline(&self, launch: &Launch, precision: Precision, head_dim: u32) -> wgpu::ComputePipeline {
        let key = (launch.kernel, precision, head_dim, launch.entry);
        let mut cache = self.pipelines.lock().unwrap_or_else(|e| e.into_inner());
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

    /// Uploads `inputs` (one byte image per input binding, in its element type at `precision`) and makes the
    /// output buffers.
    pub fn prepare(&self, launch: &Launch, precision: Precision, head_dim: u32, inputs: &[Vec<u8>]) -> Prepared<'_> {
        let pipeline = self.pipeline(launch, precision, head_dim);
        let params: Vec<u8> = launch.params.iter().flat_map(|w| w.to_le_bytes()).collect();
        let uniform = self.device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("params"),
            contents: &params,
            usage: wgpu::BufferUsages::UNIFORM,
        });
        let mut buffers = Vec::new();
        for (binding, data) in launch.inputs().iter().zip(inputs) {
            let mut contents = data.clone();
            contents.resize(byte_len(binding.elem, precision, binding.len) as usize, 0);
            buffers.push(self.device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some("input"),
                contents: &contents,
                usage: wgpu::BufferUsages::STORAGE,
            }));
        }
        let outputs: Vec<wgpu::Buffer> = launch
            .output_bindings()
            .iter()
            .map(|binding| {
                self.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("output"),
                    size: byte_len(binding.elem, precision, binding.len),
                    usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
                    mapped_at_creation: false,
                })
            })
            .collect();
        let mut entries = vec![wgpu::BindGroupEntry { binding: 0, resource: uniform.as_entire_binding() }];
        for (binding, buffer) in launch.bindings.iter().zip(buffers.iter().chain(&outputs)) {
            entries.push(wgpu::BindGroupEntry { binding: binding.index, resource: buffer.as_entire_binding() });
        }
        let bind_group = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(launch.entry),
            layout: &pipeline.get_bind_group_layout(0),
            entries: &entries,
        });
        Prepared { gpu: self, launch: launch.clone(), pipeline, bind_group, outputs }
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
        let _ = self.gpu.device.poll(wgpu::PollType::Wait { submission_index: None, timeout: None });
    }

    /// Every output's bytes, in the binding's element type.
    pub fn read(&self) -> Vec<Vec<u8>> {
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
        let _ = self.gpu.device.poll(wgpu::PollType::Wait { submission_index: None, timeout: None });
        staging.iter().map(|buf| buf.get_mapped_range(..).expect("mapped range").to_vec()).collect()
    }
}

fn bytes_of(t: &Tensor) -> Result<Vec<u8>> {
    let t = t.flatten_all()?;
    Ok(match t.dtype() {
        DType::F16 => t.to_vec1::<half::f16>()?.iter().flat_map(|v| v.to_le_bytes()).collect(),
        DType::BF16 => t.to_vec1::<half::bf16>()?.iter().flat_map(|v| v.to_le_bytes()).collect(),
        DType::I32 => t.to_vec1::<i32>()?.iter().flat_map(|v| v.to_le_bytes()).collect(),
        DType::U32 => t.to_vec1::<u32>()?.iter().flat_map(|v| v.to_le_bytes()).collect(),
        _ => t.to_dtype(DType::F32)?.to_vec1::<f32>()?.iter().flat_map(|v| v.to_le_bytes()).collect(),
    })
}

fn tensor_of(bytes: &[u8], dtype: DType, len: usize, shape: &Shape) -> Result<Tensor> {
    let words = |n: usize| bytes.chunks_exact(n).take(len);
    let t = match dtype {
        DType::F16 => {
            Tensor::from_vec(words(2).map(|c| half::f16::from_le_bytes([c[0], c[1]])).collect(), len, &Device::Cpu)
        }
        DType::BF16 => {
            Tensor::from_vec(words(2).map(|c| half::bf16::from_le_bytes([c[0], c[1]])).collect(), len, &Device::Cpu)
        }
        DType::I32 => Tensor::from_vec(
            words(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
            len,
            &Device::Cpu,
        ),
        _ => Tensor::from_vec(
            words(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
            len,
            &Device::Cpu,
        ),
    }?;
    t.reshape(shape.clone())
}

/// Runs `launch` on the CPU tensors `inputs` (one per input binding, in order; the first in the kernel's element
/// type, f32, f16 or bf16) and returns its outputs reshaped to `shapes`, as CPU tensors.
pub fn run(launch: &Launch, head_dim: u32, inputs: &[&Tensor], shapes: &[Shape]) -> Result<Vec<Tensor>> {
    let gpu = gpu().map_err(|e| candle_core::Error::Msg(format!("{}: {e}", launch.entry)))?;
    let dtype = inputs[0].dtype();
    let precision = Precision::for_dtype(dtype)
        .ok_or_else(|| candle_core::Error::Msg(format!("{}: {dtype:?} has no WGSL kernel", launch.entry)))?;
    if precision == Precision::F16 && !gpu.f16 {
        candle_core::bail!("{}: the Vulkan device {} has no f16 shaders", launch.entry, gpu.name)
    }
    let bytes: Vec<Vec<u8>> = inputs.iter().map(|t| bytes_of(t)).collect::<Result<_>>()?;
    let prepared = gpu.prepare(launch, precision, head_dim, &bytes);
    prepared.dispatch(1);
    let outputs = prepared.read();
    launch
        .output_bindings()
        .iter()
        .zip(&outputs)
        .zip(shapes)
        .map(|((binding, data), shape)| tensor_of(data, binding.elem.dtype(dtype), binding.len, shape))
        .collect()
}
