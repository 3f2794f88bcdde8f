//! Device limits that launch plans are checked against.
//!
//! Plans never assume a card: they take a `DeviceLimits` read from the device at run time
//! (`cuda::Gpu::limits`) or one of the recorded sets below, which CI uses to check every plan
//! against the H200 we test on and the GB10 we ship to.

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceLimits {
    /// Human name of the device or the recorded set.
    pub name: String,
    /// Compute capability (major, minor).
    pub compute_capability: (u32, u32),
    pub sm_count: u32,
    pub warp_size: u32,
    pub max_threads_per_block: u32,
    pub max_block_dim: [u32; 3],
    pub max_grid_dim: [u32; 3],
    /// Shared memory a block gets without opting in (48 KiB on every current card).
    pub max_shared_mem_per_block: u32,
    /// Shared memory a block may use after `cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE)`.
    pub max_shared_mem_per_block_optin: u32,
    pub max_threads_per_sm: u32,
    /// Device memory in bytes (for GB10 the unified pool; the agent reads what is available
    /// from the OS, this is only the total).
    pub total_mem_bytes: u64,
}

impl DeviceLimits {
    /// NVIDIA H200 (sm_90), as read from the device on 2026-11-30.
    pub fn h200() -> Self {
        DeviceLimits {
            name: "NVIDIA H200 (recorded)".into(),
            compute_capability: (9, 0),
            sm_count: 132,
            warp_size: 32,
            max_threads_per_block: 1024,
            max_block_dim: [1024, 1024, 64],
            max_grid_dim: [2_147_483_647, 65_535, 65_535],
            max_shared_mem_per_block: 48 * 1024,
            max_shared_mem_per_block_optin: 227 * 1024,
            max_threads_per_sm: 2048,
            total_mem_bytes: 150_754_820_096,
        }
    }

    /// NVIDIA GB10 / DGX Spark (sm_121). From public reports of sm_12x parts: 48 SMs,
    /// ~99 KiB opt-in shared memory per block, 1536 threads per SM, 128 GB unified memory.
    /// To be confirmed on a real GB10; the agent always plans with the limits it reads.
    pub fn gb10() -> Self {
        DeviceLimits {
            name: "NVIDIA GB10 (recorded)".into(),
            compute_capability: (12, 1),
            sm_count: 48,
            warp_size: 32,
            max_threads_per_block: 1024,
            max_block_dim: [1024, 1024, 64],
            max_grid_dim: [2_147_483_647, 65_535, 65_535],
            max_shared_mem_per_block: 48 * 1024,
            max_shared_mem_per_block_optin: 99 * 1024,
            max_threads_per_sm: 1536,
            total_mem_bytes: 128_000_000_000,
        }
    }

    /// Every recorded set; CI checks each plan against all of them.
    pub fn recorded() -> Vec<Self> {
        vec![Self::h200(), Self::gb10()]
    }

    /// `sm_90`, `sm_121`, ...: the NVRTC target for this device's exact arch.
    pub fn arch(&self) -> String {
        format!("sm_{}{}", self.compute_capability.0, self.compute_capability.1)
    }

    /// Threads resident per SM in whole warps: the cap for grid-stride launches that aim to
    /// fill the device exactly once.
    pub fn resident_threads(&self) -> u64 {
        self.sm_count as u64 * self.max_threads_per_sm as u64
    }
}
