//! Device and dtype choice: Metal on a Mac, CUDA when built with it and a GPU is present, else the CPU.

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

/// Resolve a choice to a device. `Auto` never fails: it falls back to the CPU.
pub fn select_device(choice: DeviceChoice) -> Result<Device> {
    match choice {
        DeviceChoice::Cpu => Ok(Device::Cpu),
        DeviceChoice::Cuda => {
            if !candle_core::utils::cuda_is_available() {
                return Err(Error::Device("CUDA requested but this binary was built without `--features cuda`".into()));
            }
            Device::new_cuda(0).map_err(|e| Error::Device(format!("no usable CUDA GPU: {e}")))
        }
        DeviceChoice::Metal => {
            if !candle_core::utils::metal_is_available() {
                return Err(Error::Device("Metal requested but this binary was not built for macOS with Metal".into()));
            }
            Device::new_metal(0).map_err(|e| Error::Device(format!("no usable Metal GPU: {e}")))
        }
        DeviceChoice::Auto => {
            if candle_core::utils::metal_is_available() {
                if let Ok(d) = Device::new_metal(0) {
                    return Ok(d);
                }
            }
            if candle_core::utils::cuda_is_available() {
                if let Ok(d) = Device::new_cuda(0) {
                    return Ok(d);
                }
            }
            Ok(Device::Cpu)
        }
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

/// Parse a dtype name (`f32`, `f16`, `bf16`).
pub fn parse_dtype(s: &str) -> Result<DType> {
    match s.to_ascii_lowercase().as_str() {
        "f32" | "float32" => Ok(DType::F32),
        "f16" | "float16" => Ok(DType::F16),
        "bf16" | "bfloat16" => Ok(DType::BF16),
        other => Err(Error::InvalidSetting(format!("unknown dtype `{other}`; use f32, f16 or bf16"))),
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
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(key))?;
    line.split_whitespace().nth(1)?.parse().ok()
}
