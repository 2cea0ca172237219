//! Tensors parked in pinned host memory during a training pass (gradient checkpointing's saved layer inputs, with
//! `--checkpointing offload`): copied out on a second stream while the device computes, copied back on it before
//! they are needed, so the copies overlap the layers' work instead of adding to it.
//!
//! Candle issues all of a thread's work to one stream and this crate turns cudarc's event tracking off
//! (`device.rs`), so the ordering between the compute stream and the copy stream is made here with explicit
//! events:
//! - out: the copy stream waits for the compute stream's work so far (the tensor is written), copies, records
//!   `copied`; the device tensor is kept until the compute stream has been told to wait for `copied`, so that its
//!   memory (freed in the compute stream's order) is not handed to another tensor while the copy still reads it;
//! - back: a buffer is allocated in the compute stream's order, the copy stream waits for that, copies, records
//!   `loaded`; the compute stream waits for `loaded` before the tensor is used.
//!
//! The pinned buffers are kept for the next step in a pool (pinning gigabytes takes longer than a step); a buffer
//! returns to it once its tensor has been copied back, and the next copy out on the same copy stream is ordered
//! after that copy in.

#[cfg(feature = "cuda")]
mod imp {
    use crate::engine::ops::cuda::launch::{device_address, with_dtype};
    use candle_core::cuda_backend::cudarc::driver::{result, CudaEvent, CudaStream, PinnedHostSlice};
    use candle_core::{DType, Result, Shape, Tensor};
    use std::sync::{Arc, Mutex};

    /// Pinned buffers no parked tensor holds, for the next one of the same size.
    static POOL: Mutex<Vec<PinnedHostSlice<u8>>> = Mutex::new(Vec::new());

    fn driver(e: impl std::fmt::Display) -> candle_core::Error {
        candle_core::Error::Msg(format!("copying a checkpoint between the GPU and host memory: {e}"))
    }

    /// A pinned buffer of exactly `bytes` from the pool, or a new one.
    fn take_buffer(stream: &Arc<CudaStream>, bytes: usize) -> Result<PinnedHostSlice<u8>> {
        let mut pool = POOL.lock().map_err(|_| driver("the pinned buffer pool was poisoned"))?;
        if let Some(at) = pool.iter().position(|b| b.len() == bytes) {
            return Ok(pool.swap_remove(at));
        }
        drop(pool);
        // SAFETY: every byte is written by the copy out before the copy back reads it. Plain page-locked memory
        // (no write-combining: the copies are the device's DMA, never the CPU's reads).
        unsafe { stream.context().alloc_pinned_with_flags::<u8>(bytes, 0) }.map_err(|e| {
            driver(format!(
                "could not pin {:.2} GiB of host memory for an offloaded checkpoint ({e}); use --checkpointing on",
                bytes as f64 / (1u64 << 30) as f64
            ))
        })
    }

    /// Host bytes the pool holds now (parked tensors' buffers are not in it).
    pub fn pooled_bytes() -> usize {
        POOL.lock().map(|p| p.iter().map(|b| b.len()).sum()).unwrap_or(0)
    }

    /// A tensor's bytes in host memory (and, once [`Copier::prefetch`]ed, on their way back).
    pub struct HostCopy {
        buffer: Option<PinnedHostSlice<u8>>,
        shape: Shape,
        dtype: DType,
        back: Option<(Tensor, CudaEvent)>,
    }

    impl Drop for HostCopy {
        fn drop(&mut self) {
            if let (Some(buffer), Ok(mut pool)) = (self.buffer.take(), POOL.lock()) {
                pool.push(buffer);
            }
        }
    }

    /// The copy stream of one training pass, and the tensors whose copy out may still be reading them.
    pub struct Copier {
        device: candle_core::CudaDevice,
        compute: Arc<CudaStream>,
        copies: Arc<CudaStream>,
        leaving: Vec<(Tensor, CudaEvent)>,
    }

    impl Copier {
        pub fn new(device: &candle_core::CudaDevice) -> Result<Self> {
            let compute = device.cuda_stream();
            let copies = compute.context().new_stream().map_err(driver)?;
            Ok(Self { device: device.clone(), compute, copies, leaving: Vec::new() })
        }

        /// Start copying one layer's `tensors` out; the compute stream goes on at once. The previous layer's copies
        /// are settled first: the compute stream waits for them only after this layer's work, which they have had
        /// all of to finish (settling the layer's own would stall the device for a copy's length).
        pub fn park(&mut self, tensors: &[&Tensor]) -> Result<Vec<HostCopy>> {
            self.settle()?;
            let written = self.compute.record_event(None).map_err(driver)?;
            self.copies.wait(&written).map_err(driver)?;
            tensors.iter().map(|t| self.copy_out(t)).collect()
        }

        /// One tensor's copy out, the copy stream already ordered after its writing.
        fn copy_out(&mut self, t: &Tensor) -> Result<HostCopy> {
            let t = t.contiguous()?;
            let bytes = t.elem_count() * t.dtype().size_in_bytes();
            let mut buffer = take_buffer(&self.copies, bytes)?;
            let src = address(&t)?;
            let dst = buffer.as_mut_ptr().map_err(driver)?;
            // SAFETY: `dst` holds `bytes` bytes; `src` is `t`'s contiguous data, kept alive (in `leaving`) until the
            // compute stream is ordered after this copy.
            unsafe {
                let dst = std::slice::from_raw_parts_mut(dst, bytes);
                result::memcpy_dtoh_async(dst, src, self.copies.cu_stream()).map_err(driver)?;
            }
            let copied = self.copies.record_event(None).map_err(driver)?;
            self.leaving.push((t.clone(), copied));
            Ok(HostCopy { buffer: Some(buffer), shape: t.shape().clone(), dtype: t.dtype(), back: None })
        }

        /// Order the compute stream after every copy out started so far and let their device tensors go (in the
        /// compute stream's order: nothing waits on the host).
        pub fn settle(&mut self) -> Result<()> {
            for (tensor, copied) in self.leaving.drain(..) {
                self.compute.wait(&copied).map_err(driver)?;
                drop(tensor);
            }
            Ok(())
        }

        /// Start copying `host` back (no-op when started already).
        pub fn prefetch(&mut self, host: &mut HostCopy) -> Result<()> {
            if host.back.is_some() {
                return Ok(());
            }
            let Some(buffer) = host.buffer.as_ref() else {
                candle_core::bail!("offloaded checkpoint without its buffer")
            };
            let n = host.shape.elem_count();
            let t = with_dtype!(host, T, {
                // SAFETY: every element is written by the copy below before the compute stream reads it.
                let slice = unsafe { self.device.alloc::<T>(n) }?;
                crate::engine::ops::cuda::launch::wrap(slice, &self.device, host.shape.clone())
            });
            let allocated = self.compute.record_event(None).map_err(driver)?;
            self.copies.wait(&allocated).map_err(driver)?;
            let dst = address(&t)?;
            let src = buffer.as_ptr().map_err(driver)?;
            // SAFETY: the buffer holds the tensor's bytes (written by the copy out, earlier on this same stream).
            unsafe {
                let src = std::slice::from_raw_parts(src, buffer.len());
                result::memcpy_htod_async(dst, src, self.copies.cu_stream()).map_err(driver)?;
            }
            host.back = Some((t, self.copies.record_event(None).map_err(driver)?));
            Ok(())
        }

        /// The tensor back on the device, the compute stream ordered after its copy.
        pub fn fetch(&mut self, mut host: HostCopy) -> Result<Tensor> {
            self.prefetch(&mut host)?;
            let Some((t, loaded)) = host.back.take() else {
                candle_core::bail!("offloaded checkpoint not copied back")
            };
            self.compute.wait(&loaded).map_err(driver)?;
            Ok(t)
        }
    }

    impl Drop for Copier {
        /// The next pass copies on a new stream: its copies out into pooled buffers must come after this pass's
        /// copies back from them (done long before the pass ends, so this waits for nothing in practice).
        fn drop(&mut self) {
            let _ = self.settle();
            let _ = self.copies.synchronize();
        }
    }

    impl HostCopy {
        fn dtype(&self) -> DType {
            self.dtype
        }
    }

    /// `t`'s device address (contiguous, any of the dtypes the training pass uses).
    fn address(t: &Tensor) -> Result<u64> {
        with_dtype!(t, T, { device_address::<T>(t, "an offloaded checkpoint") })
    }
}

#[cfg(feature = "cuda")]
pub use imp::{pooled_bytes, Copier, HostCopy};
