//! The report a user pastes into a bug report: build, OS, each device with the dtype it would compute in and
//! why, memory, the BLAS library, the runtime options, and which implementation each operation takes. The CLI's
//! `metal-candle doctor` prints it; the studio's Help window shows the same text.

use crate::engine::device::{self, DTypeChoice, DeviceChoice};
use crate::engine::{blas, cpu_team, ops, runtime};

/// Sections of `(name, value)` lines.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Report {
    pub sections: Vec<(String, Vec<(String, String)>)>,
}

/// Gather the report (probes each device once; cheap).
pub fn report() -> Report {
    let mut sections = vec![("build".to_string(), build_lines()), ("memory".to_string(), memory_lines())];
    for choice in [DeviceChoice::Cpu, DeviceChoice::Cuda, DeviceChoice::Metal] {
        let name = format!("device: {choice:?}").to_lowercase();
        let lines = match device::setup(choice, DTypeChoice::Auto) {
            Ok(p) => {
                let mut lines = vec![(
                    "compute dtype".to_string(),
                    format!("{} ({})", device::dtype_name(p.dtype), p.dtype_reason),
                )];
                if let Some(bytes) = device::memory_budget_bytes(&p.device) {
                    lines.push(("memory for a run".into(), gib(bytes)));
                }
                lines.extend(ops::implementations(&p.device, p.dtype).into_iter().map(|(k, v)| (k.to_string(), v)));
                lines
            }
            Err(e) => vec![("unavailable".to_string(), e.to_string())],
        };
        sections.push((name, lines));
    }
    Report { sections }
}

fn build_lines() -> Vec<(String, String)> {
    let on = |b: bool| if b { "on" } else { "off" }.to_string();
    let o = runtime::options();
    vec![
        ("metal-candle".into(), env!("CARGO_PKG_VERSION").into()),
        ("os / arch".into(), format!("{} / {}", std::env::consts::OS, std::env::consts::ARCH)),
        ("studio".into(), on(cfg!(feature = "studio"))),
        ("cuda".into(), on(cfg!(feature = "cuda"))),
        ("metal".into(), on(cfg!(target_os = "macos"))),
        ("BLAS".into(), blas::library_name().unwrap_or("none: Candle's GEMM").to_string()),
        ("BLAS advice".into(), blas::core_advice().unwrap_or_else(|| "none".into())),
        ("CPU threads".into(), cpu_team::threads().to_string()),
        (
            "runtime options".into(),
            format!(
                "kernels {:?}, gemv {}, q4k tensor cores {}, fused decode {}, cuda graphs {}, fused attention {}, \
                 metal sdpa {}, step phases {}",
                o.kernels,
                o.gemv,
                o.q4k_tensor_cores,
                o.fused_decode,
                o.cuda_graphs,
                o.fused_attention,
                o.metal_sdpa,
                o.step_phases
            )
            .to_lowercase(),
        ),
    ]
}

fn memory_lines() -> Vec<(String, String)> {
    let mut lines = Vec::new();
    if let Some(total) = device::total_memory_bytes() {
        lines.push(("RAM".to_string(), gib(total)));
    }
    if let Some(rss) = device::current_rss_bytes() {
        lines.push(("this process".to_string(), format!("{:.0} MiB", rss as f64 / (1u64 << 20) as f64)));
    }
    lines
}

fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (section, lines) in &self.sections {
            writeln!(f, "{section}")?;
            for (name, value) in lines {
                writeln!(f, "  {name:<48} {value}")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_report_names_the_cpu_and_every_op() {
        let text = super::report().to_string();
        for needle in ["metal-candle", "device: cpu", "compute dtype", "RMS norm", "attention", "decode step"] {
            assert!(text.contains(needle), "missing {needle}:\n{text}");
        }
    }
}
