//! Device discovery: what `brink-agent device` prints, and what the qualification fingerprint
//! is built from. No GPU is an answer (with the reason), not an error: the engine then runs on
//! the CPU backend.

pub mod driver_version;
pub mod meminfo;
pub mod nvml;

use brink_api::{DeviceInfo, DeviceReport};
use brink_kernels::cuda::GpuError;
use brink_kernels::cuda::probe::{self, format_cuda_version};

const MEMINFO: &str = "/proc/meminfo";
const PROC_DRIVER_VERSION: &str = "/proc/driver/nvidia/version";

/// What discovery found, with what it could not find out (printed as warnings).
pub struct Discovery {
    pub report: DeviceReport,
    pub warnings: Vec<String>,
}

/// Discovers CUDA device `ordinal`.
pub fn discover(ordinal: usize) -> Discovery {
    let mut warnings = Vec::new();
    let p = match probe::probe(ordinal) {
        Ok(p) => p,
        Err(e) => return Discovery { report: DeviceReport::none(no_gpu_reason(&e)), warnings },
    };
    let nvrtc_version = match &p.nvrtc_version {
        Ok((a, b)) => Some(format!("{a}.{b}")),
        Err(e) => {
            warnings.push(format!("{e}: kernels cannot be compiled on this machine"));
            None
        }
    };
    let unified_memory = if p.integrated {
        match std::fs::read_to_string(MEMINFO)
            .map_err(|e| format!("{MEMINFO}: {e}"))
            .and_then(|t| meminfo::parse_meminfo(&t, MEMINFO).map_err(|e| e.to_string()))
        {
            Ok(m) => Some(m),
            Err(e) => {
                warnings.push(format!("integrated GPU, but its unified memory is unknown: {e}"));
                None
            }
        }
    } else {
        None
    };
    let info = DeviceInfo {
        ordinal: u32::try_from(p.ordinal).unwrap_or(u32::MAX),
        name: p.name,
        uuid: p.uuid,
        compute_capability: format!("{}.{}", p.compute_capability.0, p.compute_capability.1),
        sm_count: p.sm_count,
        total_mem_bytes: p.total_mem_bytes,
        free_mem_bytes: p.free_mem_bytes,
        max_grid_dim: p.max_grid_dim,
        driver_version: kernel_driver_version(&mut warnings),
        cuda_version: format_cuda_version(p.cuda_driver_version),
        nvrtc_version,
        integrated: p.integrated,
        unified_memory,
    };
    Discovery { report: DeviceReport::found(info), warnings }
}

fn no_gpu_reason(e: &GpuError) -> String {
    match e {
        GpuError::NoDriver => "no CUDA driver (libcuda.so) on this machine: the engine runs on the CPU backend".into(),
        other => format!("{other}: the engine runs on the CPU backend"),
    }
}

/// NVML first; the proc file where NVML cannot be loaded.
fn kernel_driver_version(warnings: &mut Vec<String>) -> Option<String> {
    let nvml_err = match nvml::driver_version() {
        Ok(v) => return Some(v),
        Err(e) => e,
    };
    match std::fs::read_to_string(PROC_DRIVER_VERSION) {
        Ok(text) => driver_version::parse_proc_version(&text).or_else(|| {
            warnings.push(format!("driver version unknown: {nvml_err}; {PROC_DRIVER_VERSION} has no NVRM version line"));
            None
        }),
        Err(e) => {
            warnings.push(format!("driver version unknown: {nvml_err}; {PROC_DRIVER_VERSION}: {e}"));
            None
        }
    }
}

/// The report as a two-column table a person reads at a glance.
pub fn render(report: &DeviceReport) -> String {
    let gib = |b: u64| format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64);
    let mut rows: Vec<(&str, String)> = Vec::new();
    match &report.device {
        Some(d) => {
            rows.push(("gpu", format!("{} (ordinal {})", d.name, d.ordinal)));
            rows.push(("uuid", d.uuid.clone()));
            rows.push(("compute capability", d.compute_capability.clone()));
            rows.push(("SMs", d.sm_count.to_string()));
            rows.push(("device memory", format!("{} total, {} free (CUDA)", gib(d.total_mem_bytes), gib(d.free_mem_bytes))));
            if d.integrated {
                rows.push((
                    "unified memory",
                    match &d.unified_memory {
                        Some(m) => format!("{} total, {} available (OS)", gib(m.total), gib(m.available)),
                        None => "unknown".into(),
                    },
                ));
            }
            rows.push(("integrated", if d.integrated { "yes (shares host memory)" } else { "no" }.into()));
            rows.push(("max grid", format!("{} x {} x {}", d.max_grid_dim[0], d.max_grid_dim[1], d.max_grid_dim[2])));
            rows.push(("driver", d.driver_version.clone().unwrap_or_else(|| "unknown".into())));
            rows.push(("CUDA (driver API)", d.cuda_version.clone()));
            rows.push(("NVRTC", d.nvrtc_version.clone().unwrap_or_else(|| "missing".into())));
        }
        None => {
            rows.push(("gpu", "none".into()));
            rows.push(("reason", report.no_gpu_reason.clone().unwrap_or_default()));
        }
    }
    let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    rows.iter().map(|(k, v)| format!("{k:<width$}  {v}\n")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use brink_api::UnifiedMemory;

    fn gb10() -> DeviceInfo {
        DeviceInfo {
            ordinal: 0,
            name: "NVIDIA GB10".into(),
            uuid: "GPU-6b2d371a-0e4f-9910-abcd-00010203feff".into(),
            compute_capability: "12.1".into(),
            sm_count: 48,
            total_mem_bytes: 128 << 30,
            free_mem_bytes: 90 << 30,
            max_grid_dim: [2_147_483_647, 65_535, 65_535],
            driver_version: Some("580.95.05".into()),
            cuda_version: "13.0".into(),
            nvrtc_version: Some("13.0".into()),
            integrated: true,
            unified_memory: Some(UnifiedMemory { total: 128 << 30, available: 120 << 30 }),
        }
    }

    #[test]
    fn the_table_shows_every_fact() {
        let t = render(&DeviceReport::found(gb10()));
        for want in [
            "NVIDIA GB10 (ordinal 0)",
            "12.1",
            "48",
            "128.0 GiB total, 90.0 GiB free (CUDA)",
            "128.0 GiB total, 120.0 GiB available (OS)",
            "yes (shares host memory)",
            "2147483647 x 65535 x 65535",
            "580.95.05",
            "CUDA (driver API)   13.0",
        ] {
            assert!(t.contains(want), "{want:?} not in\n{t}");
        }
    }

    #[test]
    fn no_gpu_says_why() {
        let t = render(&DeviceReport::none("no CUDA driver (libcuda.so) on this machine"));
        assert!(t.contains("gpu     none") && t.contains("reason  no CUDA driver"), "{t}");
        let r = no_gpu_reason(&GpuError::NoDevice("CUDA_ERROR_NO_DEVICE".into()));
        assert!(r.contains("CUDA_ERROR_NO_DEVICE") && r.contains("CPU backend"), "{r}");
    }

    #[test]
    fn the_json_is_camel_case_with_gpu_false_when_none() {
        let v = serde_json::to_value(DeviceReport::none("why")).unwrap();
        assert_eq!(v["gpu"], false);
        assert_eq!(v["noGpuReason"], "why");
        let v = serde_json::to_value(DeviceReport::found(gb10())).unwrap();
        assert_eq!(v["device"]["unifiedMemory"]["available"], 120u64 << 30);
        assert_eq!(v["device"]["computeCapability"], "12.1");
    }
}
