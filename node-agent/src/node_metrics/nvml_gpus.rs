//! Reads every GPU's sensors through NVML (thin I/O; the conversion to gauges is
//! [`super::gpu::scalars`]). NVML is initialised once: `nvmlInit` loads the library and attaches
//! to the driver, far too slow to repeat per scrape.

use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::{Clock, TemperatureSensor};

use super::gpu::GpuSample;
use crate::device::nvml::{self, NvmlError};

pub struct NvmlGpus {
    nvml: Nvml,
}

impl NvmlGpus {
    /// NVML, or why it is not there (no libnvidia-ml, no driver).
    pub fn init() -> Result<NvmlGpus, NvmlError> {
        nvml::init().map(|nvml| NvmlGpus { nvml })
    }

    /// One sample of every GPU NVML lists. A reading NVML refuses (not supported on this GPU, or
    /// an error) is `None`, so the gauge is absent rather than a false 0.
    pub fn sample(&self) -> Vec<GpuSample> {
        let count = self.nvml.device_count().unwrap_or(0);
        (0..count)
            .filter_map(|i| {
                let d = self.nvml.device_by_index(i).ok()?;
                let util = d.utilization_rates().ok();
                Some(GpuSample {
                    // UUIDs are what the qualification and `device` name a GPU by; an index is the
                    // fallback label when even that is refused.
                    uuid: d.uuid().unwrap_or_else(|_| format!("nvml-index-{i}")),
                    name: d.name().unwrap_or_else(|_| "unknown".into()),
                    temperature_celsius: d.temperature(TemperatureSensor::Gpu).ok(),
                    power_milliwatts: d.power_usage().ok(),
                    power_limit_milliwatts: d.enforced_power_limit().ok(),
                    sm_clock_mhz: d.clock_info(Clock::SM).ok(),
                    memory_clock_mhz: d.clock_info(Clock::Memory).ok(),
                    gpu_utilization_percent: util.as_ref().map(|u| u.gpu),
                    memory_utilization_percent: util.as_ref().map(|u| u.memory),
                })
            })
            .collect()
    }
}
