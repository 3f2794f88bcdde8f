//! What the agent discovered about the node's accelerator: the facts a person (or the operator)
//! needs to tell two nodes apart and to explain why one was qualified and the other not.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// One CUDA device, as the driver and the OS report it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeviceInfo {
    /// CUDA ordinal (after `CUDA_VISIBLE_DEVICES`).
    pub ordinal: u32,
    pub name: String,
    /// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, the form NVML and `nvidia-smi -L` print:
    /// the key that matches this device to NVML's, whatever the ordinals.
    pub uuid: String,
    /// e.g. `12.1`.
    pub compute_capability: String,
    pub sm_count: u32,
    /// Device memory as the driver reports it (on an integrated GPU: what CUDA may allocate).
    pub total_mem_bytes: u64,
    pub free_mem_bytes: u64,
    pub max_grid_dim: [u32; 3],
    /// The kernel driver's version (e.g. `580.95.05`), when NVML or `/proc/driver/nvidia/version` says.
    pub driver_version: Option<String>,
    /// The CUDA (driver API) version the driver supports, from `cuDriverGetVersion` (e.g. `13.0`).
    pub cuda_version: String,
    /// The NVRTC library's version (e.g. `13.0`), when the library is present.
    pub nvrtc_version: Option<String>,
    /// True when the GPU shares the host's memory (`CU_DEVICE_ATTRIBUTE_INTEGRATED`: GB10).
    pub integrated: bool,
    /// The shared memory as the OS sees it, on an integrated GPU.
    pub unified_memory: Option<UnifiedMemory>,
}

/// Host memory shared with an integrated GPU, from `/proc/meminfo`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UnifiedMemory {
    /// `MemTotal`, in bytes.
    pub total: u64,
    /// `MemAvailable`, in bytes: free memory plus what the kernel can reclaim (page cache).
    pub available: u64,
}

/// The answer of device discovery: a GPU, or none and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeviceReport {
    /// False when no CUDA device is usable (the engine runs on the CPU backend).
    pub gpu: bool,
    pub device: Option<DeviceInfo>,
    /// Why there is no GPU, when `gpu` is false.
    pub no_gpu_reason: Option<String>,
}

impl DeviceReport {
    pub fn found(device: DeviceInfo) -> DeviceReport {
        DeviceReport { gpu: true, device: Some(device), no_gpu_reason: None }
    }

    pub fn none(reason: impl Into<String>) -> DeviceReport {
        DeviceReport { gpu: false, device: None, no_gpu_reason: Some(reason.into()) }
    }
}
