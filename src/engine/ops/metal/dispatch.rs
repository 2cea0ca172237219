//! Runs a [`Launch`] of our WGSL kernels on Candle's Metal device: naga's MSL (msl.rs) compiled once per
//! (device, kernel, precision, head size) with the Metal device, buffers bound at the slots the WGSL bindings
//! name, threadgroups dispatched as the WGSL `@workgroup_size` says, on Candle's own command encoder so the
//! kernel orders with Candle's ops. It goes through Candle's custom-op interface (`CustomOp1::metal_fwd`, the
//! first input as the op's argument, the others held by the op); further outputs are Metal buffers wrapped as
//! tensors beside the op's result. Never run by us: no Mac is available where this is developed; the kernels'
//! math is proven on Vulkan (tests/wgsl_kernels.rs) and this file type-checks for aarch64-apple-darwin.

use super::msl;
use super::wgsl::{self, Kernel, Launch, Precision};
use candle_core::backend::BackendStorage;
use candle_core::op::BackpropOp;
use candle_core::{CpuStorage, CustomOp1, Layout, MetalDevice, MetalStorage, Result, Shape, Storage, Tensor};
use candle_metal_kernels::metal::{Buffer, ComputeCommandEncoder, ComputePipeline};
use objc2_metal::{MTLCompileOptions, MTLLanguageVersion, MTLSize};
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

type PipelineKey = (candle_core::metal_backend::DeviceId, Kernel, Precision, u32, &'static str);

/// A compiled entry point and the layout of its buffer-sizes argument.
#[derive(Clone)]
struct Pipeline {
    state: ComputePipeline,
    sized_bindings: Vec<u32>,
}

fn metal_err(what: &str, e: impl std::fmt::Display) -> candle_core::Error {
    candle_core::Error::Msg(format!("WGSL kernel on Metal: {what}: {e}"))
}

fn pipeline(device: &MetalDevice, launch: &Launch, precision: Precision, head_dim: u32) -> Result<Pipeline> {
    static CACHE: OnceLock<Mutex<HashMap<PipelineKey, Pipeline>>> = OnceLock::new();
    let key = (device.id(), launch.kernel, precision, head_dim, launch.entry);
    let cache = CACHE.get_or_init(Default::default);
    if let Some(found) = cache.lock().map_err(|e| metal_err("pipeline cache", e))?.get(&key) {
        return Ok(found.clone());
    }
    let source = wgsl::source(launch.kernel, precision, head_dim);
    let translated = msl::translate(&source).map_err(|e| metal_err(launch.entry, e))?;
    let options = MTLCompileOptions::new();
    // The MSL version naga wrote for (msl::MSL_VERSION).
    options.setLanguageVersion(MTLLanguageVersion::Version2_4);
    let library =
        device.new_library_with_source(&translated.source, Some(&options)).map_err(|e| metal_err(launch.entry, e))?;
    let name = translated.function(launch.entry).ok_or_else(|| metal_err(launch.entry, "no such entry point"))?;
    let function = library.get_function(name, None).map_err(|e| metal_err(launch.entry, e))?;
    let state = device.new_compute_pipeline_state_with_function(&function).map_err(|e| metal_err(launch.entry, e))?;
    let found = Pipeline { state, sized_bindings: translated.sized_bindings };
    cache.lock().map_err(|e| metal_err("pipeline cache", e))?.insert(key, found.clone());
    Ok(found)
}

/// The custom op: `launch` with its first input as the argument, the other inputs held here, and the outputs
/// after the first left in `extra` for [`run`] to wrap.
struct WgslOp {
    launch: Launch,
    head_dim: u32,
    rest: Vec<Tensor>,
    extra: Mutex<Vec<MetalStorage>>,
}

impl CustomOp1 for WgslOp {
    fn name(&self) -> &'static str {
        self.launch.entry
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
        candle_core::bail!("{}: a WGSL kernel for Metal, called on the CPU", self.launch.entry)
    }

    fn metal_fwd(&self, storage: &MetalStorage, layout: &Layout) -> Result<(MetalStorage, Shape)> {
        let device = storage.device();
        let dtype = storage.dtype();
        let precision = Precision::for_dtype(dtype)
            .ok_or_else(|| metal_err(self.launch.entry, format!("{dtype:?} has no WGSL kernel (f32, f16, bf16 do)")))?;
        let guards: Vec<_> = self.rest.iter().map(|t| t.storage_and_layout()).collect();
        let mut inputs: Vec<(&Buffer, usize)> = vec![(storage.buffer(), layout.start_offset() * dtype.size_in_bytes())];
        for (guard, t) in guards.iter().zip(&self.rest) {
            match &*guard.0 {
                Storage::Metal(s) => inputs.push((s.buffer(), guard.1.start_offset() * t.dtype().size_in_bytes())),
                _ => candle_core::bail!("{}: every input must be on the Metal device", self.launch.entry),
            }
        }
        let mut outputs = Vec::new();
        for binding in self.launch.output_bindings() {
            let out_dtype = binding.elem.dtype(dtype);
            let buffer = device.new_buffer(binding.len, out_dtype, self.launch.entry)?;
            outputs.push(MetalStorage::new(buffer, device.clone(), binding.len, out_dtype));
        }
        let pipeline = pipeline(device, &self.launch, precision, self.head_dim)?;
        let mut sizes = vec![0u32; pipeline.sized_bindings.len().max(1)];
        for (slot, binding) in sizes.iter_mut().zip(&pipeline.sized_bindings) {
            if let Some(b) = self.launch.bindings.iter().find(|b| b.index == *binding) {
                *slot = (b.len * b.elem.dtype(dtype).size_in_bytes()) as u32;
            }
        }
        let guard = device.command_encoder()?;
        let encoder: &ComputeCommandEncoder = guard.as_ref();
        encoder.set_compute_pipeline_state(&pipeline.state);
        let params = &self.launch.params;
        encoder.set_bytes_directly(0, params.len() * 4, params.as_ptr() as *const std::ffi::c_void);
        for (binding, (buffer, offset)) in self.launch.inputs().iter().zip(inputs) {
            encoder.set_input_buffer(binding.index as usize, Some(buffer), offset);
        }
        for (binding, out) in self.launch.output_bindings().iter().zip(&outputs) {
            encoder.set_output_buffer(binding.index as usize, Some(out.buffer()), 0);
        }
        let slot = msl::BUFFER_SIZES_SLOT as usize;
        encoder.set_bytes_directly(slot, sizes.len() * 4, sizes.as_ptr() as *const std::ffi::c_void);
        let [x, y, z] = self.launch.groups.map(|g| g as usize);
        let threads = self.launch.kernel.workgroup_size() as usize;
        encoder.dispatch_thread_groups(
            MTLSize { width: x, height: y, depth: z },
            MTLSize { width: threads, height: 1, depth: 1 },
        );
        drop(guard);
        let mut outputs = outputs.into_iter();
        let first = outputs.next().ok_or_else(|| metal_err(self.launch.entry, "a launch without outputs"))?;
        *self.extra.lock().map_err(|e| metal_err("outputs", e))? = outputs.collect();
        let len = self.launch.output_bindings()[0].len;
        Ok((first, Shape::from(len)))
    }
}

/// `t`, copied when it is bf16 starting at an odd element: a bf16 kernel reads its buffer as u32 words
/// (element_access.rs), and Metal binds a buffer at an offset aligned to the element the kernel reads.
fn word_aligned(t: &Tensor) -> Result<Tensor> {
    if t.dtype() == candle_core::DType::BF16 && t.layout().start_offset() % 2 == 1 {
        t.force_contiguous()
    } else {
        Ok(t.clone())
    }
}

/// Runs `launch` on the Metal tensors `inputs` (one per input binding, in order, checked by `metal::run`; made
/// contiguous here) and returns its outputs reshaped to `shapes`. `head_dim` specialises the attention kernels.
pub fn run(launch: &Launch, head_dim: u32, inputs: &[&Tensor], shapes: &[Shape]) -> Result<Vec<Tensor>> {
    let contiguous: Vec<Tensor> = inputs.iter().map(|t| word_aligned(&t.contiguous()?)).collect::<Result<_>>()?;
    let op = WgslOp { launch: launch.clone(), head_dim, rest: contiguous[1..].to_vec(), extra: Mutex::new(Vec::new()) };
    let first = contiguous[0].apply_op1_no_bwd(&op)?;
    let extra = std::mem::take(&mut *op.extra.lock().map_err(|e| metal_err("outputs", e))?);
    let mut out = vec![first.reshape(shapes[0].clone())?];
    for (storage, shape) in extra.into_iter().zip(&shapes[1..]) {
        let t = Tensor::from_storage(Storage::Metal(storage), shape.clone(), BackpropOp::none(), false);
        out.push(t);
    }
    Ok(out)
}
