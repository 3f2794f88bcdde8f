//! The paged KV cache on the device: per layer, K and V as f16 `[blocks, block_size, kv_heads,
//! head_dim]` (the layout `kv_store` writes and the attention kernels read through block tables).
//! Allocated once, zeroed, so a position never written reads as zeros rather than as a previous
//! process's bytes. A windowed layer of the window-only layout holds `window_blocks` blocks
//! ([`KvSpec::layer_blocks`]), read and written through the batch's window tables.

use brink_kernels::cuda::{Gpu, error_name};
use cudarc::driver::CudaSlice;

use super::fail;
use crate::backend::KvSpec;
use crate::model::BackendError;

/// K and V of one layer, f16 bits.
pub(crate) struct KvLayer {
    pub k: CudaSlice<u16>,
    pub v: CudaSlice<u16>,
}

pub(crate) struct KvCache {
    pub spec: KvSpec,
    pub layers: Vec<KvLayer>,
}

impl KvCache {
    pub(crate) fn alloc(gpu: &Gpu, spec: KvSpec) -> Result<KvCache, BackendError> {
        let what = format!(
            "KV cache of {} layers x {} blocks x {} positions x {} heads x {} (f16){}",
            spec.layers,
            spec.blocks,
            spec.block_size,
            spec.kv_heads,
            spec.head_dim,
            if spec.has_window_layers() { format!(", windowed layers {} blocks", spec.window_blocks) } else { String::new() }
        );
        if !spec.block_size.is_power_of_two() {
            return Err(fail(format!("{what}: the block size must be a power of two")));
        }
        let elements = (0..spec.layers)
            .map(|l| spec.elements(l).filter(|&n| n > 0))
            .collect::<Option<Vec<usize>>>()
            .filter(|e| !e.is_empty())
            .ok_or_else(|| fail(format!("{what}: empty or too large")))?;
        let bytes = elements
            .iter()
            .try_fold(0u64, |sum, &n| (n as u64).checked_mul(4).and_then(|b| sum.checked_add(b)))
            .ok_or_else(|| fail(format!("{what}: too large")))?;
        let free = gpu.free_mem().map_err(|e| fail(format!("{what}: {e}")))?;
        if bytes > free {
            return Err(fail(format!("{what} needs {bytes} bytes, the GPU has {free} free")));
        }
        let zeros = |part: &str, layer: usize| {
            let n = elements[layer];
            gpu.stream()
                .alloc_zeros::<u16>(n)
                .map_err(|e| fail(format!("{what}: allocating layer {layer}'s {part} ({} bytes): {}", 2 * n, error_name(&e))))
        };
        let layers = (0..spec.layers).map(|l| Ok(KvLayer { k: zeros("K", l)?, v: zeros("V", l)? })).collect::<Result<_, BackendError>>()?;
        Ok(KvCache { spec, layers })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layer_elements_checks_overflow() {
        let spec = KvSpec::full(48, 4 * 2560, 16, 4, 128);
        assert_eq!(spec.layer_elements(), Some(4 * 40_960 * 4 * 128));
        assert_eq!(spec.bytes(), 48 * 4 * 4 * 40_960 * 4 * 128);
        assert_eq!(KvSpec { blocks: usize::MAX, ..spec.clone() }.layer_elements(), None);
        assert_eq!(KvSpec { blocks: usize::MAX, ..spec }.bytes(), u64::MAX);
    }
}
