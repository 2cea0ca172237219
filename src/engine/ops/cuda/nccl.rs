//! NCCL for data-parallel training (see engine/distributed): a communicator per rank, created from the unique id
//! the leader hands out, and in-place sums of f32 tensors over all ranks on a stream of their own beside Candle's.
//! Each sum waits for the work Candle's stream had queued when it was asked for (the backward of the layer whose
//! gradients it holds), so the layers below are differentiated while it travels; a [`StreamJoin`] then makes
//! Candle's stream wait for every sum asked for so far, before the update that reads them. No host wait anywhere.
//! Uses cudarc's raw NCCL calls rather than its `Comm`, whose communicator cannot be aborted from another thread:
//! the distributed watchdog aborts it when a peer dies, so a rank blocked in a sum returns with an error.
//! Candle links cudarc's libraries dynamically, so a build with `nccl` needs libnccl.so.2 at start-up, like the
//! CUDA libraries (the system's NCCL, or the folder of PyTorch's nvidia-nccl wheel on LD_LIBRARY_PATH).

use crate::engine::{Error, Result};
use candle_core::cuda_backend::cudarc::driver::{CudaStream, DriverError};
use candle_core::cuda_backend::cudarc::nccl::{result, sys};
use candle_core::{CudaStorage, DType, Device, Layout, Tensor};
use std::sync::{Arc, Mutex};

fn nccl_error(what: &str) -> impl Fn(result::NcclError) -> Error + '_ {
    move |e| Error::Distributed(format!("NCCL {what}: {}", describe(e)))
}

/// A CUDA driver call's failure around the sums (their stream, its events).
fn driver_error(e: DriverError) -> Error {
    Error::Distributed(format!("CUDA: {e}"))
}

/// NCCL's name and words for `error`, and its last error message (NCCL_DEBUG=WARN prints more).
fn describe(error: result::NcclError) -> String {
    let text = |p: *const std::ffi::c_char| match p.is_null() {
        true => String::new(),
        // SAFETY: NCCL returns NUL-terminated static or thread-local strings.
        false => unsafe { std::ffi::CStr::from_ptr(p) }.to_string_lossy().trim().to_string(),
    };
    // SAFETY: both take a result code or a null communicator and return a string NCCL owns.
    let (words, last) =
        unsafe { (text(sys::ncclGetErrorString(error.0)), text(sys::ncclGetLastError(std::ptr::null_mut()))) };
    let hint = match error.0 {
        sys::ncclResult_t::ncclInvalidUsage => {
            " (NCCL refuses two ranks on one GPU: give each rank its own LOCAL_RANK, or sum on the host with \
             --sum-on-host)"
        }
        _ => "",
    };
    match last.is_empty() {
        true => format!("{:?}, {words}{hint}", error.0),
        false => format!("{:?}, {words}: {last}{hint}", error.0),
    }
}

/// The raw communicator and whether it is gone (aborted, by the watchdog or at drop).
struct Raw {
    comm: sys::ncclComm_t,
    aborted: bool,
}

// SAFETY: the communicator is a handle NCCL lets any thread use; every use goes through the mutex, and abort is
// documented as callable from another thread while a collective is in flight.
unsafe impl Send for Raw {}

/// This rank's communicator, and the stream its sums run on.
pub struct NcclComm {
    raw: Arc<Mutex<Raw>>,
    sums: Arc<CudaStream>,
}

/// Aborts the communicator from another thread.
pub struct AbortHandle(Arc<Mutex<Raw>>);

impl AbortHandle {
    /// Abort every collective in flight (they return errors); later ones fail at once.
    pub fn abort(&self) {
        abort(&self.0);
    }
}

fn abort(raw: &Mutex<Raw>) {
    let Ok(mut raw) = raw.lock() else { return };
    if !raw.aborted {
        raw.aborted = true;
        // SAFETY: the communicator was initialised and is aborted once.
        let _ = unsafe { result::comm_abort(raw.comm) };
    }
}

impl NcclComm {
    /// A new unique id (the leader makes one and sends it to every rank).
    pub fn unique_id() -> Result<[u8; 128]> {
        let id = result::get_uniqueid().map_err(nccl_error("cannot make a unique id"))?;
        Ok(id.internal.map(|c| c as u8))
    }

    /// Join the communicator of `world` ranks as `rank`, on `device` (blocks until every rank has joined).
    pub fn init(device: &Device, rank: usize, world: usize, id: [u8; 128]) -> Result<Self> {
        let Device::Cuda(cuda) = device else {
            return Err(Error::Distributed("NCCL needs a CUDA device".into()));
        };
        // NCCL binds to the current device's context.
        cuda.cuda_stream().context().bind_to_thread().map_err(|e| Error::Distributed(format!("CUDA context: {e}")))?;
        let id = sys::ncclUniqueId { internal: id.map(|b| b as std::ffi::c_char) };
        let mut comm = std::mem::MaybeUninit::uninit();
        // SAFETY: `comm` is written by NCCL before it is read; world and rank were checked by the rendezvous.
        let comm = unsafe {
            result::comm_init_rank(comm.as_mut_ptr(), world as i32, id, rank as i32)
                .map_err(nccl_error("cannot join the communicator"))?;
            comm.assume_init()
        };
        let sums = cuda.cuda_stream().context().new_stream().map_err(driver_error)?;
        Ok(Self { raw: Arc::new(Mutex::new(Raw { comm, aborted: false })), sums })
    }

    pub fn abort_handle(&self) -> AbortHandle {
        AbortHandle(self.raw.clone())
    }

    /// Sum the contiguous f32 tensor `t` over all ranks, in place, on the sums' stream once the work queued so far
    /// on `t`'s device stream is done. Nothing may read or free `t` on that stream before [`StreamJoin::join`].
    pub fn all_reduce_sum_in_place(&self, t: &Tensor) -> Result<()> {
        if t.dtype() != DType::F32 || !t.is_contiguous() {
            return Err(Error::Distributed("the NCCL sum takes a contiguous f32 tensor".into()));
        }
        let Device::Cuda(cuda) = t.device() else {
            return Err(Error::Distributed("the NCCL sum takes a CUDA tensor".into()));
        };
        let written = cuda.cuda_stream().record_event(None).map_err(driver_error)?;
        self.sums.wait(&written).map_err(driver_error)?;
        t.inplace_op1(&AllReduce(self.raw.clone(), self.sums.clone()))?;
        Ok(())
    }

    /// What makes a device's stream wait for the sums.
    pub fn stream_join(&self) -> StreamJoin {
        StreamJoin(self.sums.clone())
    }
}

/// The sums' stream, for [`StreamJoin::join`].
pub struct StreamJoin(Arc<CudaStream>);

impl StreamJoin {
    /// Make `device`'s stream wait for every sum asked for so far: what it queues next sees them done.
    pub fn join(&self, device: &Device) -> Result<()> {
        let Device::Cuda(cuda) = device else { return Ok(()) };
        cuda.cuda_stream().join(&self.0).map_err(driver_error)
    }
}

impl Drop for NcclComm {
    fn drop(&mut self) {
        abort(&self.raw);
    }
}

/// The in-place sum on the communicator's stream (the second field).
struct AllReduce(Arc<Mutex<Raw>>, Arc<CudaStream>);

impl candle_core::InplaceOp1 for AllReduce {
    fn name(&self) -> &'static str {
        "nccl-all-reduce-sum"
    }

    fn cpu_fwd(&self, _: &mut candle_core::CpuStorage, _: &Layout) -> candle_core::Result<()> {
        candle_core::bail!("the NCCL sum runs on CUDA tensors only")
    }

    fn cuda_fwd(&self, storage: &mut CudaStorage, layout: &Layout) -> candle_core::Result<()> {
        use candle_core::cuda_backend::cudarc::driver::DevicePtrMut;
        let stream = &self.1;
        let (start, count) = (layout.start_offset(), layout.shape().elem_count());
        let mut slice = storage.as_cuda_slice_mut::<f32>()?.slice_mut(start..start + count);
        let raw =
            self.0.lock().map_err(|_| candle_core::Error::Msg("the NCCL communicator's lock is poisoned".into()))?;
        if raw.aborted {
            candle_core::bail!("the NCCL communicator was aborted (a rank is gone)");
        }
        let (ptr, _record) = slice.device_ptr_mut(stream);
        // SAFETY: `ptr` is `count` f32 on this stream's device; NCCL reads and writes it on that stream.
        unsafe {
            result::all_reduce(
                ptr as *const std::ffi::c_void,
                ptr as *mut std::ffi::c_void,
                count,
                sys::ncclDataType_t::ncclFloat32,
                sys::ncclRedOp_t::ncclSum,
                raw.comm,
                stream.cu_stream() as sys::cudaStream_t,
            )
        }
        .map_err(|e| candle_core::Error::Msg(format!("NCCL all-reduce: {}", describe(e))))?;
        Ok(())
    }
}
