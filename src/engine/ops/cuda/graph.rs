//! CUDA graphs on Candle's stream: capture a sequence of ops once, then replay it with one launch. Used for
//! token-by-token decoding (model/decode_graph.rs), where the host's ~160 launches per token, not the GPU,
//! set the pace.
//!
//! What a replay needs, and where it comes from:
//! - Fixed addresses: every buffer a replay reads or writes outside the graph is allocated before the
//!   capture (the KV cache, the step's inputs, its output); the buffers Candle allocates during the capture
//!   become the graph's own (stream-ordered allocations), and are freed inside it.
//! - No host traffic inside: Candle uploads small parameter vectors (shapes, strides) for some kernels; in
//!   [`with_param_cache`] it serves them from a cache that an eager run of the same step fills first.
//! - Changing values (the token, its position) live in device buffers written before each replay
//!   ([`write_u32s`]) and read by the kernels when they run.
//!
//! Capture uses the thread-local mode: other threads' CUDA calls neither join nor break it.

use candle_core::{Device, Result, Tensor};

/// Whether graphs can be captured on `device` (CUDA, in a build with the `cuda` feature).
pub fn supported(device: &Device) -> bool {
    cfg!(feature = "cuda") && device.is_cuda()
}

/// Run `f` with Candle's parameter-upload cache on (see the module docs): the run fills the cache, and a
/// capture inside it takes the uploads from there.
pub fn with_param_cache<R>(device: &Device, f: impl FnOnce() -> R) -> R {
    #[cfg(feature = "cuda")]
    let _cache = match device {
        Device::Cuda(cuda) => Some(cuda.enable_cuda_graph_htod_cache()),
        _ => None,
    };
    #[cfg(not(feature = "cuda"))]
    let _ = device;
    f()
}

/// Overwrite a contiguous u32 tensor on the device with `values`, in place (its address stays the same).
pub fn write_u32s(tensor: &Tensor, values: &[u32]) -> Result<()> {
    if tensor.dtype() != candle_core::DType::U32 || tensor.elem_count() != values.len() || !tensor.is_contiguous() {
        candle_core::bail!(
            "write_u32s: {} values into a {:?} {:?} tensor",
            values.len(),
            tensor.dtype(),
            tensor.shape()
        );
    }
    tensor.inplace_op1(&WriteU32s(values.to_vec()))
}

/// The values [`write_u32s`] copies in.
struct WriteU32s(Vec<u32>);

impl candle_core::InplaceOp1 for WriteU32s {
    fn name(&self) -> &'static str {
        "write-u32s"
    }

    fn cpu_fwd(&self, storage: &mut candle_core::CpuStorage, layout: &candle_core::Layout) -> Result<()> {
        let candle_core::CpuStorage::U32(data) = storage else { candle_core::bail!("write-u32s: not a u32 tensor") };
        data[layout.start_offset()..layout.start_offset() + self.0.len()].copy_from_slice(&self.0);
        Ok(())
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(&self, storage: &mut candle_core::CudaStorage, layout: &candle_core::Layout) -> Result<()> {
        use candle_core::backend::BackendStorage;
        use candle_core::cuda_backend::WrapErr;
        let stream = storage.device().cuda_stream();
        let start = layout.start_offset();
        let mut slice = storage.as_cuda_slice_mut::<u32>()?.slice_mut(start..start + self.0.len());
        stream.memcpy_htod(&self.0, &mut slice).w()
    }
}

/// A captured, instantiated graph, replayed on the stream it was captured on.
pub struct Graph {
    #[cfg(feature = "cuda")]
    graph: candle_core::cuda_backend::cudarc::driver::CudaGraph,
}

impl Graph {
    /// Capture what `record` enqueues on `device`'s stream (nothing runs), and instantiate it. When `record`
    /// or the capture fails, the capture is ended, any error it left in the driver's state is cleared, and
    /// the error is returned: the device stays usable for eager work.
    pub fn capture(device: &Device, record: impl FnOnce() -> crate::engine::Result<()>) -> crate::engine::Result<Self> {
        imp::capture(device, record)
    }

    /// Enqueue one replay (asynchronous, like any launch).
    pub fn launch(&self) -> Result<()> {
        #[cfg(feature = "cuda")]
        {
            use candle_core::cuda_backend::WrapErr;
            self.graph.launch().w()
        }
        #[cfg(not(feature = "cuda"))]
        candle_core::bail!("CUDA graphs need a build with the cuda feature")
    }
}

#[cfg(feature = "cuda")]
mod imp {
    use crate::engine::ops::cuda::graph::Graph;
    use candle_core::cuda_backend::cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
    use candle_core::cuda_backend::WrapErr;
    use candle_core::Device;

    pub fn capture(
        device: &Device,
        record: impl FnOnce() -> crate::engine::Result<()>,
    ) -> crate::engine::Result<Graph> {
        let Device::Cuda(cuda) = device else {
            return Err(candle_core::Error::Msg("CUDA graphs capture CUDA work only".into()).into());
        };
        let stream = cuda.cuda_stream();
        stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).w()?;
        let recorded = record();
        // Always end the capture, even after a failed record: the stream is unusable until then.
        let ended = stream.end_capture(CUgraphInstantiate_flags(0));
        let outcome = match (recorded, ended) {
            (Ok(()), Ok(Some(graph))) => return Ok(Graph { graph }),
            (Err(e), _) => Err(e),
            (Ok(()), Ok(None)) => Err(candle_core::Error::Msg("the captured graph is empty".into()).into()),
            (Ok(()), Err(e)) => Err(candle_core::Error::Msg(format!("CUDA graph capture failed: {e}")).into()),
        };
        // Frees and launches refused while the capture was invalid left their error in cudarc's state, where
        // the next op would report it: clear it.
        let _ = stream.context().check_err();
        outcome
    }
}

#[cfg(not(feature = "cuda"))]
mod imp {
    use crate::engine::ops::cuda::graph::Graph;
    use candle_core::Device;

    pub fn capture(_: &Device, _: impl FnOnce() -> crate::engine::Result<()>) -> crate::engine::Result<Graph> {
        Err(candle_core::Error::Msg("CUDA graphs need a build with the cuda feature".into()).into())
    }
}
