//! `/proc/meminfo` → the unified memory of an integrated GPU.
//!
//! On GB10 the GPU allocates from host memory. NVML reports its memory as "not supported", and
//! `cuMemGetInfo`'s free figure leaves out page cache the kernel would hand back on demand (it
//! can read tens of GiB low after a model file was read). The OS's `MemAvailable` counts that
//! cache as available, so it is the figure to plan a model's memory against.

use brink_api::UnifiedMemory;

#[derive(thiserror::Error, Debug, Clone, PartialEq, Eq)]
pub enum MeminfoError {
    #[error("{file}: no {field} line")]
    Missing { file: String, field: &'static str },
    #[error("{file}: {field}: cannot read {line:?} (expected `{field}: <number> kB`)")]
    Malformed { file: String, field: &'static str, line: String },
    #[error("{file}: MemAvailable ({available} bytes) exceeds MemTotal ({total} bytes)")]
    Inconsistent { file: String, total: u64, available: u64 },
}

/// Reads `MemTotal` and `MemAvailable` from the text of `/proc/meminfo` (`file` names it in
/// errors). Values are in KiB (the kernel writes `kB`); returned in bytes.
pub fn parse_meminfo(text: &str, file: &str) -> Result<UnifiedMemory, MeminfoError> {
    let total = field(text, file, "MemTotal")?;
    let available = field(text, file, "MemAvailable")?;
    if available > total {
        return Err(MeminfoError::Inconsistent { file: file.into(), total, available });
    }
    Ok(UnifiedMemory { total, available })
}

/// The node's memory as its gauges show it (bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeMemory {
    pub total: u64,
    pub available: u64,
    /// The kernel's page cache (`Cached`): file pages it hands back on demand. On GB10 this is
    /// what `cuMemGetInfo` leaves out of its free figure after a model file was read.
    pub page_cache: u64,
}

/// [`parse_meminfo`] plus the page cache.
pub fn parse_node_memory(text: &str, file: &str) -> Result<NodeMemory, MeminfoError> {
    let UnifiedMemory { total, available } = parse_meminfo(text, file)?;
    Ok(NodeMemory { total, available, page_cache: field(text, file, "Cached")? })
}

fn field(text: &str, file: &str, name: &'static str) -> Result<u64, MeminfoError> {
    let line = text
        .lines()
        .find(|l| l.split_once(':').is_some_and(|(k, _)| k.trim() == name))
        .ok_or_else(|| MeminfoError::Missing { file: file.into(), field: name })?;
    let malformed = || MeminfoError::Malformed { file: file.into(), field: name, line: line.into() };
    let value = line.split_once(':').map(|(_, v)| v).unwrap_or_default();
    let mut parts = value.split_whitespace();
    let kib: u64 = parts.next().and_then(|n| n.parse().ok()).ok_or_else(malformed)?;
    match (parts.next(), parts.next()) {
        (Some("kB"), None) => kib.checked_mul(1024).ok_or_else(malformed),
        _ => Err(malformed()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const F: &str = "/proc/meminfo";

    // The head of a GB10's /proc/meminfo (128 GB LPDDR5x).
    const GB10: &str = "MemTotal:       128452436 kB\nMemFree:        96342208 kB\nMemAvailable:   119803584 kB\n\
                        Buffers:          123456 kB\nCached:         21000000 kB\nHugePages_Total:       0\n";

    #[test]
    fn reads_total_and_available_in_bytes() {
        let m = parse_meminfo(GB10, F).unwrap();
        assert_eq!(m, UnifiedMemory { total: 128_452_436 * 1024, available: 119_803_584 * 1024 });
    }

    #[test]
    fn order_and_spacing_do_not_matter() {
        let text = "MemAvailable: 10 kB\nSwapTotal: 0 kB\nMemTotal:20 kB\n";
        assert_eq!(parse_meminfo(text, F).unwrap(), UnifiedMemory { total: 20 * 1024, available: 10 * 1024 });
    }

    #[test]
    fn bad_texts_name_the_file_and_field() {
        let cases: [(&str, &str); 8] = [
            ("", "/proc/meminfo: no MemTotal line"),
            // Kernels before 3.14 have no MemAvailable.
            ("MemTotal: 1024 kB\nMemFree: 512 kB\n", "/proc/meminfo: no MemAvailable line"),
            ("MemTotal: lots kB\nMemAvailable: 1 kB\n", "/proc/meminfo: MemTotal: cannot read \"MemTotal: lots kB\""),
            ("MemTotal: 1024\nMemAvailable: 1 kB\n", "MemTotal: cannot read"),
            ("MemTotal: 1024 MB\nMemAvailable: 1 kB\n", "MemTotal: cannot read"),
            ("MemTotal: 1024 kB extra\nMemAvailable: 1 kB\n", "MemTotal: cannot read"),
            ("MemTotal: 99999999999999999999 kB\nMemAvailable: 1 kB\n", "MemTotal: cannot read"),
            ("MemTotal: 1 kB\nMemAvailable: 2 kB\n", "MemAvailable (2048 bytes) exceeds MemTotal (1024 bytes)"),
        ];
        for (text, want) in cases {
            let err = parse_meminfo(text, F).unwrap_err().to_string();
            assert!(err.contains(want), "{text:?}: {err}");
        }
    }

    #[test]
    fn overflow_of_the_byte_count_is_an_error() {
        // Fits u64 in KiB, not in bytes.
        let text = format!("MemTotal: {} kB\nMemAvailable: 1 kB\n", u64::MAX / 512);
        assert!(matches!(parse_meminfo(&text, F), Err(MeminfoError::Malformed { field: "MemTotal", .. })));
    }

    #[test]
    fn node_memory_adds_the_page_cache_not_swap_cached() {
        let m = parse_node_memory(&format!("SwapCached: 7 kB\n{GB10}"), F).unwrap();
        assert_eq!(m, NodeMemory { total: 128_452_436 * 1024, available: 119_803_584 * 1024, page_cache: 21_000_000 * 1024 });
        let e = parse_node_memory("MemTotal: 8 kB\nMemAvailable: 4 kB\nSwapCached: 1 kB\n", F).unwrap_err();
        assert_eq!(e.to_string(), "/proc/meminfo: no Cached line");
    }

    #[test]
    fn a_field_whose_name_only_starts_alike_is_not_taken() {
        let text = "MemTotalX: 5 kB\nMemTotal: 8 kB\nMemAvailable: 4 kB\n";
        assert_eq!(parse_meminfo(text, F).unwrap().total, 8 * 1024);
    }
}
