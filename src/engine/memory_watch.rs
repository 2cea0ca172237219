//! Memory used by one phase of work (a rank probe), measured where that work's tensors live: the peak in use
//! during the phase above what was in use when it began, so what differs between two phases (a bigger adapter,
//! its gradients and AdamW moments, more activations) is not drowned by what both share (the base weights).
//!
//! - CPU: Candle's tensors are heap allocations, so the process's global allocator (which calls the hooks here)
//!   counts the bytes allocated less those freed while a watch is open, and keeps their peak. The phase's total
//!   peak is the process's peak resident memory (Linux `VmHWM`, reset when the watch opens), which includes the
//!   memory-mapped weights.
//! - CUDA: Candle allocates device memory from the device's default stream-ordered pool, which keeps its own
//!   "in use" count and a resettable high-water mark (`CU_MEMPOOL_ATTR_USED_MEM_CURRENT` / `_HIGH`).
//! - Metal: the device's allocated size (`MTLDevice.currentAllocatedSize`, Candle's buffer pool included), read
//!   when the watch opens and at each [`MemoryWatch::sample`] (after each step): a peak between samples is missed.

use candle_core::Device;
use std::sync::atomic::{AtomicIsize, AtomicUsize, Ordering};

/// Watches open now; while none is, the allocator's hooks cost one relaxed load.
static OPEN_WATCHES: AtomicUsize = AtomicUsize::new(0);
/// Bytes allocated less bytes freed while a watch was open (it drifts between watches; only differences count).
static NET_BYTES: AtomicIsize = AtomicIsize::new(0);
/// The highest [`NET_BYTES`] since the last watch opened.
static PEAK_NET_BYTES: AtomicIsize = AtomicIsize::new(0);

/// Called by the process allocator for every allocation (and the growth of a reallocation).
#[inline]
pub(crate) fn on_heap_alloc(bytes: usize) {
    if OPEN_WATCHES.load(Ordering::Relaxed) != 0 {
        let bytes = bytes as isize;
        let now = NET_BYTES.fetch_add(bytes, Ordering::Relaxed) + bytes;
        PEAK_NET_BYTES.fetch_max(now, Ordering::Relaxed);
    }
}

/// Called by the process allocator for every free (and the shrinking of a reallocation).
#[inline]
pub(crate) fn on_heap_free(bytes: usize) {
    if OPEN_WATCHES.load(Ordering::Relaxed) != 0 {
        NET_BYTES.fetch_sub(bytes as isize, Ordering::Relaxed);
    }
}

/// What a [`PhaseMemory`] measured, which depends on where the tensors live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MemoryMeasure {
    /// Heap bytes of this process (CPU tensors); the total is the process's peak resident memory.
    Heap,
    /// Device memory from CUDA's stream-ordered pool, where Candle allocates.
    CudaPool,
    /// Metal's allocated size, sampled after each step.
    MetalAllocated,
    /// Nothing could be measured on this device (a CUDA context without pool allocation).
    Unmeasured,
}

impl MemoryMeasure {
    /// A short name for a column header or a CLI line.
    pub fn short_name(self) -> &'static str {
        match self {
            Self::Heap => "heap",
            Self::CudaPool => "GPU memory",
            Self::MetalAllocated => "Metal memory",
            Self::Unmeasured => "not measured",
        }
    }

    /// What the numbers mean, for a tooltip.
    pub fn explain(self) -> &'static str {
        match self {
            Self::Heap => {
                "CPU: \"added\" is the peak of heap memory in use during the probe above what was in use when it \
                 began (the adapter, its gradients and AdamW moments, the activations kept for the backward pass). \
                 \"Peak\" is the process's peak resident memory during the probe (Linux): base weights included, and \
                 memory the allocator kept from earlier work, so it changes little from rank to rank."
            }
            Self::CudaPool => {
                "CUDA: \"added\" is the peak of device memory in use from CUDA's memory pool during the probe above \
                 what was in use when it began; \"peak\" is the pool's high-water mark during the probe, base weights \
                 included."
            }
            Self::MetalAllocated => {
                "Metal: the device's allocated size (Candle's buffer pool included), sampled after each step: \
                 \"added\" is its highest sample above its size when the probe began, \"peak\" that highest sample. \
                 A peak inside a step is missed."
            }
            Self::Unmeasured => "This device reports no memory in use, so nothing was measured.",
        }
    }
}

/// The memory of one phase.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PhaseMemory {
    pub measure: MemoryMeasure,
    /// The peak in use during the phase above what was in use when it began.
    pub added_bytes: u64,
    /// The peak in use during the phase, all of it (see [`MemoryMeasure`]); None where not known.
    pub peak_bytes: Option<u64>,
}

impl Default for PhaseMemory {
    fn default() -> Self {
        Self { measure: MemoryMeasure::Unmeasured, added_bytes: 0, peak_bytes: None }
    }
}

/// An open measurement. One at a time gives exact numbers: watches share the allocator's peak, which each
/// opening resets.
pub struct MemoryWatch {
    measure: MemoryMeasure,
    /// Heap: [`NET_BYTES`] when opened. CUDA and Metal: bytes in use when opened.
    start: i128,
    /// Metal: the highest sample so far.
    sampled_peak: u64,
    device: Device,
}

impl MemoryWatch {
    /// Start measuring what runs on `device` from now.
    pub fn start(device: &Device) -> Self {
        let measure = match device {
            Device::Cpu => MemoryMeasure::Heap,
            Device::Cuda(_) if cuda_pool::in_use_bytes(device).is_some() => MemoryMeasure::CudaPool,
            Device::Metal(_) => MemoryMeasure::MetalAllocated,
            Device::Cuda(_) => MemoryMeasure::Unmeasured,
        };
        let start = match measure {
            MemoryMeasure::Heap => {
                OPEN_WATCHES.fetch_add(1, Ordering::SeqCst);
                crate::engine::device::reset_peak_rss();
                let now = NET_BYTES.load(Ordering::SeqCst);
                PEAK_NET_BYTES.store(now, Ordering::SeqCst);
                now as i128
            }
            MemoryMeasure::CudaPool => {
                cuda_pool::reset_high_water(device);
                cuda_pool::in_use_bytes(device).unwrap_or(0) as i128
            }
            MemoryMeasure::MetalAllocated => metal_allocated_bytes(device).unwrap_or(0) as i128,
            MemoryMeasure::Unmeasured => 0,
        };
        Self { measure, start, sampled_peak: start.max(0) as u64, device: device.clone() }
    }

    /// Read what can only be sampled (Metal's allocated size); call it after each step.
    pub fn sample(&mut self) {
        if self.measure == MemoryMeasure::MetalAllocated {
            if let Some(now) = metal_allocated_bytes(&self.device) {
                self.sampled_peak = self.sampled_peak.max(now);
            }
        }
    }

    /// The phase's memory so far (the watch stays open).
    pub fn read(&mut self) -> PhaseMemory {
        let start = self.start;
        let added = |peak: i128| (peak - start).max(0) as u64;
        match self.measure {
            MemoryMeasure::Heap => PhaseMemory {
                measure: self.measure,
                added_bytes: added(PEAK_NET_BYTES.load(Ordering::SeqCst) as i128),
                peak_bytes: crate::engine::device::peak_rss_bytes(),
            },
            MemoryMeasure::CudaPool => {
                let high = cuda_pool::high_water_bytes(&self.device).unwrap_or(0).max(self.start.max(0) as u64);
                PhaseMemory { measure: self.measure, added_bytes: added(high as i128), peak_bytes: Some(high) }
            }
            MemoryMeasure::MetalAllocated => {
                self.sample();
                PhaseMemory {
                    measure: self.measure,
                    added_bytes: added(self.sampled_peak as i128),
                    peak_bytes: Some(self.sampled_peak),
                }
            }
            MemoryMeasure::Unmeasured => PhaseMemory::default(),
        }
    }
}

impl Drop for MemoryWatch {
    fn drop(&mut self) {
        if self.measure == MemoryMeasure::Heap {
            OPEN_WATCHES.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// Metal's allocated size on `device` (None elsewhere).
fn metal_allocated_bytes(device: &Device) -> Option<u64> {
    match device {
        #[cfg(target_os = "macos")]
        Device::Metal(m) => Some(m.device().current_allocated_size() as u64),
        _ => None,
    }
}

/// The in-use count and high-water mark of the default memory pool of a CUDA device.
#[cfg(feature = "cuda")]
mod cuda_pool {
    use candle_core::cuda_backend::cudarc::driver::{result, sys};
    use candle_core::Device;

    fn default_pool(device: &Device) -> Option<sys::CUmemoryPool> {
        let Device::Cuda(cuda) = device else { return None };
        let stream = cuda.cuda_stream();
        let context = stream.context();
        if !context.has_async_alloc() {
            return None;
        }
        context.bind_to_thread().ok()?;
        // SAFETY: the device handle comes from a live context.
        unsafe { result::device::get_default_mem_pool(context.cu_device()).ok() }
    }

    fn attribute(device: &Device, attr: sys::CUmemPool_attribute) -> Option<u64> {
        let pool = default_pool(device)?;
        let mut value = 0u64;
        // SAFETY: the pool is the device's default pool; both usage attributes are cuuint64_t.
        unsafe { result::mem_pool::get_attribute(pool, attr, (&mut value as *mut u64).cast()).ok()? };
        Some(value)
    }

    pub fn in_use_bytes(device: &Device) -> Option<u64> {
        attribute(device, sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT)
    }

    pub fn high_water_bytes(device: &Device) -> Option<u64> {
        attribute(device, sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH)
    }

    /// Reset the high-water mark (CUDA allows resetting it to zero only; it then follows the use from now).
    pub fn reset_high_water(device: &Device) {
        let Some(pool) = default_pool(device) else { return };
        let mut zero = 0u64;
        // SAFETY: as above; zero is the one value this attribute may be set to.
        let _ = unsafe {
            result::mem_pool::set_attribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH,
                (&mut zero as *mut u64).cast(),
            )
        };
    }
}

/// Without CUDA support there is no CUDA device to read.
#[cfg(not(feature = "cuda"))]
mod cuda_pool {
    use candle_core::Device;

    pub fn in_use_bytes(_device: &Device) -> Option<u64> {
        None
    }

    pub fn high_water_bytes(_device: &Device) -> Option<u64> {
        None
    }

    pub fn reset_high_water(_device: &Device) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_heap_watch_sees_a_transient_peak_above_its_start_and_not_what_was_there_before() {
        // Held from before the watch: not part of what the phase added.
        let before = vec![1u8; 32 << 20];
        let mut watch = MemoryWatch::start(&Device::Cpu);
        assert_eq!(watch.read().measure, MemoryMeasure::Heap);
        {
            let transient = vec![2u8; 48 << 20];
            std::hint::black_box(&transient);
        }
        // Freeing what was held before the watch lowers use below the start; the peak stays.
        drop(before);
        let kept = vec![3u8; 8 << 20];
        let m = watch.read();
        // Other tests allocate in parallel, so only the lower bound is exact.
        assert!(m.added_bytes >= 48 << 20, "the 48 MiB peak is seen: {}", m.added_bytes);
        assert!(m.added_bytes < 4 << 30, "nothing near the process's whole memory: {}", m.added_bytes);
        std::hint::black_box(&kept);
        drop(watch);
        // A second watch starts from its own baseline: the earlier 48 MiB peak is not carried over.
        let mut second = MemoryWatch::start(&Device::Cpu);
        let small = vec![4u8; 1 << 20];
        std::hint::black_box(&small);
        assert!(second.read().added_bytes >= 1 << 20);
    }
}
