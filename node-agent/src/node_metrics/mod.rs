//! The node gauges the agent hands the server (`ServeOptions::node_metrics`), beside the
//! server's own: memory from the OS, GPU sensors through NVML, and the node's qualification.
//! Each module converts a reading to gauges without I/O; [`provider`] does the reading.
//!
//! | gauge | labels | from |
//! |---|---|---|
//! | `brink_node_memory_{total,available,page_cache}_bytes` | | `/proc/meminfo` ([`memory`]) |
//! | `brink_gpu_temperature_celsius`, `brink_gpu_power_watts`, `brink_gpu_power_limit_watts`, `brink_gpu_sm_clock_hertz`, `brink_gpu_memory_clock_hertz`, `brink_gpu_utilization_ratio`, `brink_gpu_memory_utilization_ratio` | `gpu_uuid`, `gpu_name` | NVML ([`gpu`]); absent without NVML |
//! | `brink_selftest_cases` | `result`, `suite` | the self-test report, model-test counts ([`qualification`]) |
//! | `brink_qualified` | `shape_class`, `state` | the verdict: 1 for the current state |
//! | `brink_envelope_max_batch_tokens` | `shape_class` | the verdict's validated batch limit |
//! | `brink_selftest_kernel_cases` | `shape_class`, `suite`, `kernel`, `result` | the self-test report's cases per kernel ([`kernel_cases`]) |

pub mod gpu;
pub mod kernel_cases;
pub mod memory;
pub mod nvml_gpus;
pub mod qualification;
pub mod throttle;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use brink_engine::server::telemetry::{NodeMetrics, Scalar};

use crate::device::meminfo;
use nvml_gpus::NvmlGpus;
// `CaseCounts` is for `up`, which passes the model-level test's counts.
#[allow(unused_imports)]
pub use qualification::{CaseCounts, QualificationMetrics};
use throttle::Throttled;

/// The sensors are read at most this often, however often the gauges are scraped.
pub const SAMPLE_INTERVAL: Duration = Duration::from_secs(1);

const MEMINFO: &str = "/proc/meminfo";

/// The readings that change: memory, and the GPUs when NVML is there.
struct Sensors {
    gpus: Option<NvmlGpus>,
    /// A memory read failed once and was said: not again at every scrape.
    memory_warned: AtomicBool,
}

impl Sensors {
    fn read(&self) -> Vec<Scalar> {
        let mem = std::fs::read_to_string(MEMINFO)
            .map_err(|e| format!("{MEMINFO}: {e}"))
            .and_then(|t| meminfo::parse_node_memory(&t, MEMINFO).map_err(|e| e.to_string()));
        let mut out = match mem {
            Ok(m) => memory::scalars(&m),
            Err(e) => {
                if !self.memory_warned.swap(true, Ordering::Relaxed) {
                    eprintln!("brink-agent: no memory gauges: {e}");
                }
                Vec::new()
            }
        };
        if let Some(g) = &self.gpus {
            out.extend(gpu::scalars(&g.sample()));
        }
        out
    }
}

/// The node gauges for the server: the sensors (read at most every [`SAMPLE_INTERVAL`]) and,
/// when given, the qualification (fixed for the server's life). Without NVML the GPU gauges are
/// absent, which it says once here.
pub fn provider(qualification: Option<QualificationMetrics>) -> NodeMetrics {
    let gpus = NvmlGpus::init().map_err(|e| eprintln!("brink-agent: no GPU gauges: {e}")).ok();
    let sensors = Sensors { gpus, memory_warned: AtomicBool::new(false) };
    let cache: Throttled<Vec<Scalar>> = Throttled::new(SAMPLE_INTERVAL);
    let fixed = qualification.map(|q| q.scalars()).unwrap_or_default();
    NodeMetrics::new(move || {
        let mut out = cache.get(Instant::now(), || sensors.read());
        out.extend(fixed.iter().cloned());
        out
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use brink_api::selftest::Verdict;

    #[test]
    fn the_provider_reads_memory_and_the_qualification_and_gpus_only_with_nvml() {
        let q = QualificationMetrics {
            shape_class: "qwen3moe-h64-e8-top2-ffn32".into(),
            verdict: Verdict::Qualified { max_tokens: 512 },
            kernel: CaseCounts { passed: 3, ..CaseCounts::default() },
            model: None,
            kernels: Default::default(),
        };
        let table = provider(Some(q)).read();
        let names: Vec<&str> = table.iter().map(|s| s.name).collect();
        for want in ["brink_selftest_cases", "brink_qualified", "brink_envelope_max_batch_tokens"] {
            assert!(names.contains(&want), "{want} not in {names:?}");
        }
        if cfg!(target_os = "linux") {
            let total = table.iter().find(|s| s.name == "brink_node_memory_total_bytes").expect("Linux has /proc/meminfo");
            assert!(total.samples[0].1 > 0.0);
        }
        // CI has no NVML: the GPU gauges are absent there, not zero.
        let gpu_gauges = names.iter().filter(|n| n.starts_with("brink_gpu_")).count();
        assert_eq!(gpu_gauges, if NvmlGpus::init().is_ok() { 7 } else { 0 }, "{names:?}");
        let mut unique = names.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), names.len(), "a name twice: {names:?}");
        assert!(provider(None).read().iter().all(|s| !s.name.starts_with("brink_selftest") && s.name != "brink_qualified"));
    }

    /// docs/metrics.md names every node gauge.
    #[test]
    fn every_node_gauge_is_documented() {
        let doc = include_str!("../../../docs/metrics.md");
        let q = QualificationMetrics {
            shape_class: "c".into(),
            verdict: Verdict::Qualified { max_tokens: 1 },
            kernel: CaseCounts::default(),
            model: Some(CaseCounts::default()),
            kernels: kernel_cases::KernelCases::from([("gemm".to_string(), CaseCounts::default())]),
        };
        let m = meminfo::NodeMemory { total: 2, available: 1, page_cache: 1 };
        let table = [gpu::scalars(&[]), memory::scalars(&m), q.scalars()].concat();
        assert_eq!(table.len(), 14);
        for s in table {
            assert!(doc.contains(&format!("`{}`", s.name)), "{} is not in docs/metrics.md", s.name);
        }
    }
}
