//! The driver's view through NVML (libnvidia-ml, loaded at run time by nvml-wrapper, so the
//! agent runs on machines without it): the kernel driver's version and the processes holding a
//! GPU. Thin I/O; what the answers mean is decided in `qualify::backend_truth`.

use nvml_wrapper::Nvml;
use nvml_wrapper::enums::device::UsedGpuMemory;

use crate::qualify::backend_truth::{GpuHolders, GpuProcess};

/// What NVML could not tell, naming the call (and the GPU) that failed.
#[derive(Debug, thiserror::Error)]
pub enum NvmlError {
    /// No libnvidia-ml, or no driver for it to attach to.
    #[error("NVML unavailable (libnvidia-ml): {0}")]
    Unavailable(#[source] nvml_wrapper::error::NvmlError),
    #[error("NVML has no device {uuid}: {source}")]
    NoDevice {
        uuid: String,
        #[source]
        source: nvml_wrapper::error::NvmlError,
    },
    /// `call`: the NVML function, with its argument where it has one.
    #[error("{call}: {source}")]
    Call {
        call: String,
        #[source]
        source: nvml_wrapper::error::NvmlError,
    },
}

/// NVML, loaded and attached to the driver (slow: callers that sample keep it).
pub fn init() -> Result<Nvml, NvmlError> {
    Nvml::init().map_err(NvmlError::Unavailable)
}

/// The kernel driver's version (e.g. `580.95.05`).
pub fn driver_version() -> Result<String, NvmlError> {
    init()?.sys_driver_version().map_err(|source| NvmlError::Call { call: "nvmlSystemGetDriverVersion".into(), source })
}

/// The processes running compute work on the GPU with NVML UUID `uuid` (`GPU-…`, as
/// `cuda::probe` spells the CUDA device's): matched by UUID, because CUDA ordinals and NVML
/// indices differ under `CUDA_VISIBLE_DEVICES` and `CUDA_DEVICE_ORDER`.
///
/// The PIDs are in the namespace of the driver (the host): inside a container without the host's
/// PID namespace they do not match the container's own; the node agent runs with `hostPID`.
pub fn gpu_holders(uuid: &str) -> GpuHolders {
    match compute_processes(uuid) {
        Ok(list) => GpuHolders::Listed(list),
        Err(e) => GpuHolders::Unavailable(e.to_string()),
    }
}

fn compute_processes(uuid: &str) -> Result<Vec<GpuProcess>, NvmlError> {
    let nvml = init()?;
    let device = nvml.device_by_uuid(uuid).map_err(|source| NvmlError::NoDevice { uuid: uuid.into(), source })?;
    match device.running_compute_processes() {
        Ok(list) => Ok(list
            .into_iter()
            .map(|p| GpuProcess {
                pid: p.pid,
                used_bytes: match p.used_gpu_memory {
                    UsedGpuMemory::Used(b) => Some(b),
                    UsedGpuMemory::Unavailable => None,
                },
            })
            .collect()),
        Err(source) => Err(NvmlError::Call { call: format!("nvmlDeviceGetComputeRunningProcesses({uuid})"), source }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_the_call_and_the_gpu() {
        let e = NvmlError::NoDevice { uuid: "GPU-0".into(), source: nvml_wrapper::error::NvmlError::NotFound };
        assert!(e.to_string().starts_with("NVML has no device GPU-0: "), "{e}");
        let e = NvmlError::Call { call: "nvmlSystemGetDriverVersion".into(), source: nvml_wrapper::error::NvmlError::Uninitialized };
        assert!(e.to_string().starts_with("nvmlSystemGetDriverVersion: "), "{e}");
        // Without NVML (or with it) the holders of a GPU that is nowhere are never a list.
        assert!(matches!(gpu_holders("GPU-00000000-0000-0000-0000-000000000000"), GpuHolders::Unavailable(_)));
    }
}
