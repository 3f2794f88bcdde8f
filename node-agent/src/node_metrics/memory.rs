//! The node's memory from the OS (`/proc/meminfo`) → gauges (pure). On GB10 the GPU allocates
//! from this memory, so these are the GPU's memory figures too (NVML reports it unsupported there).

use brink_engine::server::telemetry::{Kind, Scalar};

use crate::device::meminfo::NodeMemory;

pub fn scalars(m: &NodeMemory) -> Vec<Scalar> {
    let gauge = |name, help, bytes: u64| Scalar { name, kind: Kind::Gauge, help, samples: vec![(Vec::new(), bytes as f64)] };
    vec![
        gauge("brink_node_memory_total_bytes", "The node's memory (MemTotal); on an integrated GPU (GB10) also the GPU's.", m.total),
        gauge(
            "brink_node_memory_available_bytes",
            "Memory the OS can give without swapping (MemAvailable, page cache included): what a model can still be planned against.",
            m.available,
        ),
        gauge(
            "brink_node_memory_page_cache_bytes",
            "The OS page cache (Cached): reclaimable, but left out of cudaMemGetInfo's free figure on GB10.",
            m.page_cache,
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_become_unlabelled_gauges() {
        let m = NodeMemory { total: 128 << 30, available: 100 << 30, page_cache: 20 << 30 };
        let got: Vec<(&str, Kind, f64, usize)> =
            scalars(&m).iter().map(|s| (s.name, s.kind, s.samples[0].1, s.samples[0].0.len())).collect();
        assert_eq!(
            got,
            [
                ("brink_node_memory_total_bytes", Kind::Gauge, (128u64 << 30) as f64, 0),
                ("brink_node_memory_available_bytes", Kind::Gauge, (100u64 << 30) as f64, 0),
                ("brink_node_memory_page_cache_bytes", Kind::Gauge, (20u64 << 30) as f64, 0),
            ]
        );
    }
}
