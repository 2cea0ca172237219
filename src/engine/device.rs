//! Device and dtype choice: Metal on a Mac, CUDA when built with it and a GPU is present, else the CPU; the
//! compute dtype, checked against what the device can run; memory figures of this process.
//!
//! [`setup`] is the one function every front end calls to turn the user's `--device`/`--dtype` into a device
//! and a dtype. It never crashes: `Device::new_metal` panics when Metal lists no GPU (candle issue 3566), so
//! that panic is caught and `Auto` falls back to the CPU, saying why. On a GPU each dtype is probed once with a
//! tiny operation before it is used (Metal's bf16 kernels need Metal 3.1 / macOS 14), falling back to f16,
//! then f32, with the reason in [`Placement::dtype_reason`].

use crate::engine::{Error, Result};
use candle_core::{DType, Device};

/// What the user asked for with `--device`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceChoice {
    #[default]
    Auto,
    Cpu,
    Cuda,
    Metal,
}

impl std::str::FromStr for DeviceChoice {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(Self::Auto),
            "cpu" => Ok(Self::Cpu),
            "cuda" | "gpu" => Ok(Self::Cuda),
            "metal" | "mps" => Ok(Self::Metal),
            other => Err(format!("unknown device `{other}`; use auto, cpu, cuda or metal")),
        }
    }
}

impl std::fmt::Display for DeviceChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = match self {
            Self::Auto => "auto",
            Self::Cpu => "cpu",
            Self::Cuda => "cuda",
            Self::Metal => "metal",
        };
        f.write_str(s)
    }
}

/// What the user asked for with `--dtype`: a compute dtype, or `Auto` (f32 on the CPU, bf16 on GPUs that have
/// it). Parsed at the edges ([`FromStr`](std::str::FromStr), serde); the engine resolves it in [`setup`].
///
/// Serialized as run.json always stored it: `null` for `Auto`, else the dtype's name ("f32", "f16", "bf16");
/// reading also accepts "auto" and the long names ("float32", "bfloat16", ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DTypeChoice {
    #[default]
    Auto,
    F32,
    F16,
    Bf16,
}

impl DTypeChoice {
    /// The dtype asked for, or None for `Auto`.
    pub fn dtype(self) -> Option<DType> {
        match self {
            Self::Auto => None,
            Self::F32 => Some(DType::F32),
            Self::F16 => Some(DType::F16),
            Self::Bf16 => Some(DType::BF16),
        }
    }

    /// The short name ("auto", "f32", "f16", "bf16").
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::F32 => "f32",
            Self::F16 => "f16",
            Self::Bf16 => "bf16",
        }
    }
}

impl std::str::FromStr for DTypeChoice {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(Self::Auto),
            "f32" | "float32" => Ok(Self::F32),
            "f16" | "float16" => Ok(Self::F16),
            "bf16" | "bfloat16" => Ok(Self::Bf16),
            other => Err(format!("unknown dtype `{other}`; use auto, f32, f16 or bf16")),
        }
    }
}

impl std::fmt::Display for DTypeChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl serde::Serialize for DTypeChoice {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        self.dtype().map(|_| self.as_str()).serialize(serializer)
    }
}

impl<'de> serde::Deserialize<'de> for DTypeChoice {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        match Option::<String>::deserialize(deserializer)? {
            None => Ok(Self::Auto),
            Some(s) => s.parse().map_err(serde::de::Error::custom),
        }
    }
}

/// The device and compute dtype a model runs on, and why: what [`setup`] resolved from the user's choices.
#[derive(Debug, Clone)]
pub struct Placement {
    pub device: Device,
    pub dtype: DType,
    /// Why this device when it is not the one asked for (e.g. Metal listed no GPU, so the CPU), for the user.
    pub device_note: Option<String>,
    /// Why this dtype.
    pub dtype_reason: DTypeReason,
}

/// Why a [`Placement`] has its dtype; `Display` says it in words for the user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DTypeReason {
    /// The user named it.
    Chosen,
    /// `auto` on this device ("cpu", "cuda", "metal").
    Default { device: &'static str },
    /// The device could not run the dtype(s) before it: each with the error its probe gave.
    Fallback { refused: Vec<(DType, String)> },
}

impl std::fmt::Display for DTypeReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Chosen => f.write_str("chosen"),
            Self::Default { device } => write!(f, "default on {device}"),
            Self::Fallback { refused } => {
                let reasons: Vec<String> =
                    refused.iter().map(|(d, e)| format!("{} does not run on this GPU ({e})", dtype_name(*d))).collect();
                f.write_str(&reasons.join("; "))
            }
        }
    }
}

/// Resolve the user's device and dtype choices: the one place every front end turns `--device`/`--dtype` into a
/// device and a dtype. `Auto` never fails (it falls back to the CPU with [`Placement::device_note`] saying why);
/// a dtype the device cannot run (bf16 before Metal 3.1) falls back with [`Placement::dtype_reason`] saying so.
pub fn setup(device: DeviceChoice, dtype: DTypeChoice) -> Result<Placement> {
    setup_on(device, dtype, 0)
}

/// [`setup`] on GPU number `ordinal` of this host (a data-parallel rank's `LOCAL_RANK`; the CPU has one).
pub fn setup_on(device: DeviceChoice, dtype: DTypeChoice, ordinal: usize) -> Result<Placement> {
    let (device, device_note) = select_device_with_note(device, ordinal)?;
    let (dtype, dtype_reason) = resolve_dtype(&device, dtype);
    Ok(Placement { device, dtype, device_note, dtype_reason })
}

/// Resolve a choice to a device. `Auto` never fails: it falls back to the CPU.
pub fn select_device(choice: DeviceChoice) -> Result<Device> {
    select_device_with_note(choice, 0).map(|(device, _)| device)
}

/// [`select_device`], plus why `Auto` did not get a GPU it tried.
fn select_device_with_note(choice: DeviceChoice, ordinal: usize) -> Result<(Device, Option<String>)> {
    match choice {
        DeviceChoice::Cpu => Ok((Device::Cpu, None)),
        DeviceChoice::Cuda => {
            if !candle_core::utils::cuda_is_available() {
                return Err(Error::Device("CUDA requested but this binary was built without `--features cuda`".into()));
            }
            let device =
                new_cuda(ordinal).map_err(|e| Error::Device(format!("no usable CUDA GPU number {ordinal}: {e}")))?;
            Ok((device, None))
        }
        DeviceChoice::Metal => {
            if !candle_core::utils::metal_is_available() {
                return Err(Error::Device("Metal requested but this binary was not built for macOS with Metal".into()));
            }
            let device = new_metal().map_err(|e| Error::Device(format!("no usable Metal GPU: {e}")))?;
            Ok((device, None))
        }
        DeviceChoice::Auto => {
            let mut notes = Vec::new();
            if candle_core::utils::metal_is_available() {
                match new_metal() {
                    Ok(d) => return Ok((d, None)),
                    Err(e) => notes.push(format!("Metal unavailable ({e})")),
                }
            }
            if candle_core::utils::cuda_is_available() {
                match new_cuda(ordinal) {
                    Ok(d) => return Ok((d, None)),
                    Err(e) => notes.push(format!("CUDA unavailable ({e})")),
                }
            }
            let note = (!notes.is_empty()).then(|| format!("{}: using the CPU", notes.join("; ")));
            Ok((Device::Cpu, note))
        }
    }
}

/// `Device::new_metal(0)`, which panics instead of failing when Metal lists no GPU (over SSH, under launchd,
/// in some sandboxes: candle issue 3566). The panic is caught and becomes an error carrying its message.
/// CUDA GPU number `ordinal`, without cudarc's per-allocation event tracking. Candle issues all work on the calling
/// thread's per-thread stream and never creates a second stream, so cudarc never waits on those events; it still
/// created and destroyed two CUDA events with every allocation, i.e. with nearly every op: host time that set
/// the pace of decoding.
fn new_cuda(ordinal: usize) -> candle_core::Result<Device> {
    let device = Device::new_cuda(ordinal)?;
    #[cfg(feature = "cuda")]
    if let Device::Cuda(cuda) = &device {
        // SAFETY: nothing was allocated on this device yet, and all its work goes to one stream per thread
        // (Candle's per-thread stream), the case in which cudarc's events never synchronise anything.
        unsafe { cuda.disable_event_tracking() };
        keep_freed_memory(cuda)?;
    }
    Ok(device)
}

/// The device's memory pool (which Candle's stream-ordered allocations come from) keeps what is freed for the
/// next allocations instead of handing it back to the driver at every synchronisation (its default release
/// threshold is 0). A training step frees its activations and allocates them again in the next step, and the
/// step synchronises several times (the loss, the gradient norm), so the memory was unmapped and mapped again
/// every step. PyTorch's caching allocator keeps its memory the same way; the process's GPU memory then stays
/// at its peak until it exits.
#[cfg(feature = "cuda")]
fn keep_freed_memory(cuda: &candle_core::CudaDevice) -> candle_core::Result<()> {
    use candle_core::cuda_backend::cudarc::driver::{result, sys};
    use candle_core::cuda_backend::WrapErr;
    let device = cuda.cuda_stream().context().cu_device();
    let mut threshold = u64::MAX;
    // SAFETY: `device` is the CUDA device this context was made for, and the release threshold attribute takes a
    // u64.
    unsafe {
        let pool = result::device::get_default_mem_pool(device).w()?;
        result::mem_pool::set_attribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            (&mut threshold as *mut u64).cast(),
        )
        .w()
    }
}

fn new_metal() -> std::result::Result<Device, String> {
    match std::panic::catch_unwind(|| Device::new_metal(0)) {
        Ok(Ok(device)) => Ok(device),
        Ok(Err(e)) => Err(e.to_string()),
        Err(panic) => Err(panic_message(panic.as_ref())),
    }
}

/// The message of a caught panic.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    let text = panic.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| panic.downcast_ref::<String>().cloned());
    format!("no Metal device is listed: {}", text.unwrap_or_else(|| "the Metal runtime panicked".into()))
}

/// The compute dtype for `choice` on `device`, and why (see [`setup`]).
fn resolve_dtype(device: &Device, choice: DTypeChoice) -> (DType, DTypeReason) {
    let (wanted, why) = match choice.dtype() {
        Some(dtype) => (dtype, DTypeReason::Chosen),
        None => (default_dtype(device), DTypeReason::Default { device: device_name(device) }),
    };
    if device.is_cpu() {
        return (wanted, why);
    }
    // GPUs: a dtype is used only once a tiny operation in it has run there (bf16 kernels need Metal 3.1).
    let mut refused = Vec::new();
    for dtype in [wanted, DType::F16, DType::F32] {
        if refused.iter().any(|(d, _)| *d == dtype) {
            continue;
        }
        match dtype_works(device, dtype) {
            Ok(()) if refused.is_empty() => return (dtype, why),
            Ok(()) => return (dtype, DTypeReason::Fallback { refused }),
            Err(e) => refused.push((dtype, e)),
        }
    }
    // Nothing ran (a broken device): keep the request and let the first real operation report the error.
    (wanted, why)
}

/// Whether a small product and a reduction in `dtype` run on `device` (probed once per device and dtype).
fn dtype_works(device: &Device, dtype: DType) -> std::result::Result<(), String> {
    type Probes = std::sync::Mutex<Vec<(candle_core::DeviceLocation, DType, std::result::Result<(), String>)>>;
    static PROBED: std::sync::OnceLock<Probes> = std::sync::OnceLock::new();
    let probed = PROBED.get_or_init(Default::default);
    let location = device.location();
    if let Ok(probed) = probed.lock() {
        if let Some((_, _, result)) = probed.iter().find(|(l, d, _)| *l == location && *d == dtype) {
            return result.clone();
        }
    }
    let result = probe(device, dtype);
    if let Ok(mut probed) = probed.lock() {
        probed.push((location, dtype, result.clone()));
    }
    result
}

/// Run a 2x2 product and a sum in `dtype` on `device`; a missing kernel is an error or, in some backends, a
/// panic, and both count as "does not run".
fn probe(device: &Device, dtype: DType) -> std::result::Result<(), String> {
    let run = || -> candle_core::Result<f32> {
        let x = candle_core::Tensor::new(&[[1f32, 2.], [3., 4.]], device)?.to_dtype(dtype)?;
        x.matmul(&x)?.sum_all()?.to_dtype(DType::F32)?.to_scalar::<f32>()
    };
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)) {
        Ok(Ok(sum)) if (sum - 54.0).abs() < 0.5 => Ok(()),
        Ok(Ok(sum)) => Err(format!("a test product gave {sum} instead of 54")),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("its kernels are missing".into()),
    }
}

/// A short human name for a device.
pub fn device_name(device: &Device) -> &'static str {
    match device {
        Device::Cpu => "cpu",
        Device::Cuda(_) => "cuda",
        Device::Metal(_) => "metal",
    }
}

/// The short name of a compute dtype ("f32", "bf16", ...).
pub fn dtype_name(dtype: DType) -> String {
    format!("{dtype:?}").to_lowercase()
}

/// Parse a dtype name (`f32`, `f16`, `bf16`).
pub fn parse_dtype(s: &str) -> Result<DType> {
    match s.parse::<DTypeChoice>().map_err(Error::InvalidSetting)? {
        DTypeChoice::Auto => Err(Error::InvalidSetting("`auto` is not a dtype here; use f32, f16 or bf16".into())),
        choice => Ok(choice.dtype().unwrap_or(DType::F32)),
    }
}

/// The compute dtype we default to: f32 on the CPU (no fast half kernels there), bf16 on GPUs.
pub fn default_dtype(device: &Device) -> DType {
    match device {
        Device::Cpu => DType::F32,
        _ => DType::BF16,
    }
}

/// Peak resident memory of this process in bytes (Linux `VmHWM`; elsewhere `ru_maxrss` is not read and
/// None is returned).
pub fn peak_rss_bytes() -> Option<u64> {
    proc_status_kib("VmHWM:").map(|k| k * 1024)
}

/// Current resident memory of this process in bytes (Linux).
pub fn current_rss_bytes() -> Option<u64> {
    proc_status_kib("VmRSS:").map(|k| k * 1024)
}

/// Reset the peak-RSS mark so the next [`peak_rss_bytes`] measures from now (Linux >= 4.0).
pub fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

fn proc_status_kib(key: &str) -> Option<u64> {
    proc_file_kib("/proc/self/status", key)
}

/// The value in KiB of the line that starts with `key` in a /proc file of `key: value kB` lines.
fn proc_file_kib(path: &str, key: &str) -> Option<u64> {
    let text = std::fs::read_to_string(path).ok()?;
    let line = text.lines().find(|l| l.starts_with(key))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Physical memory of this machine in bytes (Linux: /proc/meminfo; None where unknown).
pub fn total_memory_bytes() -> Option<u64> {
    proc_file_kib("/proc/meminfo", "MemTotal:").map(|kib| kib * 1024)
}

/// Memory the kernel estimates is available to a new allocation without swapping, in bytes (Linux: /proc/meminfo's
/// MemAvailable; None where unknown).
pub fn available_memory_bytes() -> Option<u64> {
    proc_file_kib("/proc/meminfo", "MemAvailable:").map(|kib| kib * 1024)
}

/// Memory a run on `device` can use before it swaps or fails: the machine's RAM on the CPU; on a Mac's GPU,
/// Metal's recommended working set (unified memory: more than that and macOS pages; Candle's buffer pool can
/// grow past RAM, candle issue 3464). None where not known (CUDA: not queried).
pub fn memory_budget_bytes(device: &Device) -> Option<u64> {
    match device {
        Device::Cpu => total_memory_bytes(),
        #[cfg(target_os = "macos")]
        Device::Metal(m) => Some(m.device().recommended_max_working_set_size() as u64),
        _ => None,
    }
}

/// What [`memory_budget_bytes`] measures on `device`, for messages.
pub fn memory_budget_name(device: &Device) -> &'static str {
    if device.is_metal() {
        "the GPU's recommended working set"
    } else {
        "this machine's RAM"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// run.json files written before the enum stored `null` or the name the user typed.
    #[test]
    fn dtype_choice_reads_what_run_json_always_stored() {
        let read = |json: &str| serde_json::from_str::<DTypeChoice>(json).unwrap();
        assert_eq!(read("null"), DTypeChoice::Auto);
        assert_eq!(read("\"bf16\""), DTypeChoice::Bf16);
        assert_eq!(read("\"f32\""), DTypeChoice::F32);
        assert_eq!(read("\"F16\""), DTypeChoice::F16);
        assert_eq!(read("\"bfloat16\""), DTypeChoice::Bf16);
        assert_eq!(read("\"auto\""), DTypeChoice::Auto);
        assert!(serde_json::from_str::<DTypeChoice>("\"f8\"").unwrap_err().to_string().contains("unknown dtype"));
        for choice in [DTypeChoice::Auto, DTypeChoice::F32, DTypeChoice::F16, DTypeChoice::Bf16] {
            let json = serde_json::to_string(&choice).unwrap();
            assert_eq!(read(&json), choice);
        }
        assert_eq!(serde_json::to_string(&DTypeChoice::Auto).unwrap(), "null");
        assert_eq!(serde_json::to_string(&DTypeChoice::Bf16).unwrap(), "\"bf16\"");
    }

    #[test]
    fn setup_on_the_cpu_says_why_it_chose_the_dtype() {
        let p = setup(DeviceChoice::Cpu, DTypeChoice::Auto).unwrap();
        assert!(p.device.is_cpu() && p.device_note.is_none());
        assert_eq!((p.dtype, p.dtype_reason.to_string().as_str()), (DType::F32, "default on cpu"));
        let p = setup(DeviceChoice::Cpu, DTypeChoice::Bf16).unwrap();
        assert_eq!((p.dtype, &p.dtype_reason), (DType::BF16, &DTypeReason::Chosen));
        let fallback = DTypeReason::Fallback { refused: vec![(DType::BF16, "no kernel".into())] };
        assert_eq!(fallback.to_string(), "bf16 does not run on this GPU (no kernel)");
        // Without a GPU build, auto lands on the CPU without a note (nothing was tried).
        if !candle_core::utils::metal_is_available() && !candle_core::utils::cuda_is_available() {
            let p = setup(DeviceChoice::Auto, DTypeChoice::Auto).unwrap();
            assert!(p.device.is_cpu() && p.device_note.is_none());
        }
        assert!(parse_dtype("auto").is_err());
        assert_eq!(parse_dtype("BF16").unwrap(), DType::BF16);
    }

    #[test]
    fn a_caught_panic_becomes_a_reason() {
        let panic = std::panic::catch_unwind(|| -> () { panic!("swap_remove index (is 0) should be < len (is 0)") });
        let message = panic_message(panic.unwrap_err().as_ref());
        assert!(message.contains("no Metal device") && message.contains("swap_remove"), "{message}");
    }

    #[test]
    fn the_dtype_probe_runs_on_the_cpu() {
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            assert_eq!(probe(&Device::Cpu, dtype), Ok(()), "{dtype:?}");
        }
    }
}

/// How many CUDA GPUs this host has (0 in a build without CUDA, or without a driver).
pub fn cuda_device_count() -> usize {
    #[cfg(feature = "cuda")]
    {
        candle_core::cuda_backend::cudarc::driver::CudaContext::device_count().map_or(0, |n| n.max(0) as usize)
    }
    #[cfg(not(feature = "cuda"))]
    0
}
