//! Qualification bookkeeping around the self-tests: the fingerprint of what is being qualified,
//! the cache that reuses a result while the fingerprint holds, backend truth (the engine is
//! where it says it is, and fast enough), the suites as `up` runs them and the verdict of both
//! together.

pub mod backend_truth;
pub mod cache;
pub mod controls;
pub mod kernels;
pub mod model_test;
pub mod replica;
pub mod store;
pub mod verdict;

use std::time::SystemTime;

use brink_api::{DeviceInfo, Fingerprint, ServingParams};

use brink_api::BackendCheck;

use backend_truth::{ClaimedBackend, Evidence, GpuHolders, ThroughputFloor};

/// The fingerprint of qualifying `shape_class` with `serving` on `device` with this build.
/// `None`: the engine runs on the CPU, which uses no GPU, so the GPU's place says `cpu`.
pub fn fingerprint(device: Option<&DeviceInfo>, shape_class: &str, serving: ServingParams) -> Fingerprint {
    Fingerprint {
        gpu_name: device.map_or_else(|| "cpu".into(), |d| d.name.clone()),
        compute_capability: device.map_or_else(|| "-".into(), |d| d.compute_capability.clone()),
        driver_version: device.and_then(|d| d.driver_version.clone()),
        cuda_version: device.map_or_else(|| "-".into(), |d| d.cuda_version.clone()),
        nvrtc_version: device.and_then(|d| d.nvrtc_version.clone()),
        agent_version: env!("CARGO_PKG_VERSION").into(),
        kernel_sources_hash: brink_kernels::sources::sources_hash(),
        shape_class: shape_class.into(),
        serving,
    }
}

/// Backend truth for the engine `engine_pid` that claims `claimed`, on the GPU discovery found
/// (`None`: no GPU): asks NVML who holds that GPU, then [`backend_truth::judge`]s.
pub fn check_backend(
    device: Option<&DeviceInfo>,
    claimed: ClaimedBackend,
    engine_pid: u32,
    tokens_per_s: f64,
    floor: ThroughputFloor,
) -> BackendCheck {
    let holders = match (claimed, device) {
        (ClaimedBackend::Cpu, _) => GpuHolders::Listed(Vec::new()),
        // CUDA found no device: nobody can hold one, whatever NVML would say.
        (ClaimedBackend::Cuda { .. }, None) => GpuHolders::Listed(Vec::new()),
        (ClaimedBackend::Cuda { .. }, Some(d)) => crate::device::nvml::gpu_holders(&d.uuid),
    };
    backend_truth::judge(&Evidence { claimed, engine_pid, holders, tokens_per_s, floor })
}

/// `t` as RFC 3339 UTC to the second, the form of `Qualification::qualified_at`.
pub fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn timestamps_are_rfc3339_utc() {
        assert_eq!(rfc3339(UNIX_EPOCH + Duration::from_secs(1_796_068_092)), "2026-11-30T19:48:12Z");
    }

    #[test]
    fn an_unknown_gpu_is_never_confirmed() {
        // No NVML here, and no GPU has the nil UUID where there is: either way, not a pass.
        let mut d = device();
        d.uuid = "GPU-00000000-0000-0000-0000-000000000000".into();
        let floor = ThroughputFloor::new(1.0).unwrap();
        let t = check_backend(Some(&d), ClaimedBackend::Cuda { ordinal: 0 }, std::process::id(), 50.0, floor);
        assert!(matches!(&t, BackendCheck::Unverified { reason } if reason.contains("cannot confirm")), "{t:?}");
        // Claiming CUDA where discovery found no GPU fails outright.
        let t = check_backend(None, ClaimedBackend::Cuda { ordinal: 0 }, 7, 50.0, floor);
        assert!(
            matches!(&t, BackendCheck::Fail { reasons } if reasons[0].starts_with("claims cuda but pid 7 does not hold GPU 0")),
            "{t:?}"
        );
        assert!(check_backend(None, ClaimedBackend::Cpu, 7, 50.0, floor).passed());
    }

    fn device() -> DeviceInfo {
        DeviceInfo {
            ordinal: 0,
            name: "NVIDIA H200".into(),
            uuid: "GPU-0".into(),
            compute_capability: "9.0".into(),
            sm_count: 132,
            total_mem_bytes: 1,
            free_mem_bytes: 1,
            max_grid_dim: [1, 1, 1],
            driver_version: None,
            cuda_version: "13.0".into(),
            nvrtc_version: Some("13.0".into()),
            integrated: false,
            unified_memory: None,
        }
    }

    #[test]
    fn the_fingerprint_takes_the_device_and_this_build() {
        let device = device();
        let serving = ServingParams { max_batch_tokens: 16_384, prefill_chunk: 4096, context: 32_768, full_window_kv: false };
        let fp = fingerprint(Some(&device), "qwen3moe-h2048-e128-top8-ffn768", serving);
        assert_eq!((fp.gpu_name.as_str(), fp.compute_capability.as_str(), fp.driver_version.as_deref()), ("NVIDIA H200", "9.0", None));
        assert_eq!(fp.agent_version, env!("CARGO_PKG_VERSION"));
        assert_eq!(fp.kernel_sources_hash, brink_kernels::sources::sources_hash());
        assert_eq!(fp.serving, serving);
    }
}
