//! The driver's view through NVML (libnvidia-ml, loaded at run time by nvml-wrapper, so the
//! agent runs on machines without it): the kernel driver's version and the processes holding a
//! GPU. Thin I/O; what the answers mean is decided in `qualify::backend_truth`.

use nvml_wrapper::Nvml;
use nvml_wrapper::enums::device::UsedGpuMemory;

use crate::qualify::backend_truth::{GpuHolders, GpuProcess};

fn init() -> Result<Nvml, String> {
    Nvml::init().map_err(|e| format!("NVML unavailable (libnvidia-ml): {e}"))
}

/// The kernel driver's version (e.g. `580.95.05`).
pub fn driver_version() -> Result<String, String> {
    init()?.sys_driver_version().map_err(|e| format!("nvmlSystemGetDriverVersion: {e}"))
}

/// The processes running compute work on the GPU with NVML UUID `uuid` (`GPU-…`, as
/// `cuda::probe` spells the CUDA device's): matched by UUID, because CUDA ordinals and NVML
/// indices differ under `CUDA_VISIBLE_DEVICES` and `CUDA_DEVICE_ORDER`.
///
/// The PIDs are in the namespace of the driver (the host): inside a container without the host's
/// PID namespace they do not match the container's own; the node agent runs with `hostPID`.
pub fn gpu_holders(uuid: &str) -> GpuHolders {
    let nvml = match init() {
        Ok(n) => n,
        Err(e) => return GpuHolders::Unavailable(e),
    };
    let device = match nvml.device_by_uuid(uuid) {
        Ok(d) => d,
        Err(e) => return GpuHolders::Unavailable(format!("NVML has no device {uuid}: {e}")),
    };
    match device.running_compute_processes() {
        Ok(list) => GpuHolders::Listed(
            list.into_iter()
                .map(|p| GpuProcess {
                    pid: p.pid,
                    used_bytes: match p.used_gpu_memory {
                        UsedGpuMemory::Used(b) => Some(b),
                        UsedGpuMemory::Unavailable => None,
                    },
                })
                .collect(),
        ),
        Err(e) => GpuHolders::Unavailable(format!("nvmlDeviceGetComputeRunningProcesses({uuid}): {e}")),
    }
}
