//! The CPU backend's paged KV cache: per layer, K and V as f16 `[blocks, block_size, kv_heads,
//! head_dim]` in one vec each (llama.cpp's default cache type, so attention sees the same rounded
//! values). Rows are addressed by their physical row `block · block_size + pos % block_size`;
//! attention reads a sequence's positions through its block table (in place when its blocks are
//! consecutive, else gathered into contiguous scratch), so its arithmetic is that of an unpaged
//! cache.
//!
//! A windowed layer of the window-only layout holds `window_blocks` blocks ([`KvSpec`]) and is
//! addressed through the batch's window tables: its positions before the window read whatever
//! the ring slot holds, which the attention masks (never reads) — see `CpuBackend::attend`.

use half::f16;

use crate::backend::{BackendError, KvSpec};

pub struct KvCache {
    pub spec: KvSpec,
    k: Vec<Vec<f16>>,
    v: Vec<Vec<f16>>,
}

impl KvCache {
    pub fn new(spec: KvSpec) -> Result<Self, BackendError> {
        if !spec.block_size.is_power_of_two() {
            return Err(BackendError::new("cpu", format!("KV block size {} is not a power of two", spec.block_size)));
        }
        let alloc = || -> Result<Vec<Vec<f16>>, BackendError> {
            (0..spec.layers)
                .map(|l| {
                    let per_layer = spec.elements(l).ok_or_else(|| BackendError::new("cpu", format!("KV cache of {spec:?} overflows")))?;
                    let mut v = Vec::new();
                    v.try_reserve_exact(per_layer)
                        .map_err(|_| BackendError::new("cpu", format!("cannot allocate the KV cache ({} bytes)", spec.bytes())))?;
                    v.resize(per_layer, f16::ZERO);
                    Ok(v)
                })
                .collect()
        };
        let (k, v) = (alloc()?, alloc()?);
        Ok(KvCache { spec, k, v })
    }

    fn row_width(&self) -> usize {
        self.spec.kv_heads * self.spec.head_dim
    }

    /// Why `table` cannot hold positions `0..len` of `layer`, if it cannot: too short, or a block
    /// past the layer's cache.
    pub fn table_unsupported(&self, layer: usize, table: &[u32], len: usize) -> Option<String> {
        let blocks = self.spec.layer_blocks(layer);
        let need = len.div_ceil(self.spec.block_size);
        if table.len() < need {
            return Some(format!("a block table of {} blocks for {len} positions in blocks of {}", table.len(), self.spec.block_size));
        }
        table[..need].iter().find(|&&b| b as usize >= blocks).map(|b| format!("block {b} is outside the KV cache's {blocks} blocks"))
    }

    /// Stores one row of K and V (`kv_heads × head_dim` each) at cache row `row`, rounded to f16.
    /// The caller has checked the row against the cache (`table_unsupported`).
    pub fn store(&mut self, layer: usize, row: u64, k: &[f32], v: &[f32]) {
        let w = self.row_width();
        let o = row as usize * w;
        for (dst, &x) in self.k[layer][o..o + w].iter_mut().zip(k) {
            *dst = f16::from_f32(x);
        }
        for (dst, &x) in self.v[layer][o..o + w].iter_mut().zip(v) {
            *dst = f16::from_f32(x);
        }
    }

    /// Positions `0..len` of the sequence with block table `table` as K and V `[len, kv_heads,
    /// head_dim]`: borrowed from the cache when the blocks are consecutive (the fixed per-slot
    /// tables), else gathered block by block into the scratch `k` and `v`. The caller has
    /// checked the table (`table_unsupported`).
    pub fn positions<'a>(
        &'a self,
        layer: usize,
        table: &[u32],
        len: usize,
        k: &'a mut Vec<f16>,
        v: &'a mut Vec<f16>,
    ) -> (&'a [f16], &'a [f16]) {
        let (w, bs) = (self.row_width(), self.spec.block_size);
        let blocks = &table[..len.div_ceil(bs)];
        if let Some(&first) = blocks.first().filter(|_| blocks.windows(2).all(|p| p[1] == p[0] + 1)) {
            let o = first as usize * bs * w;
            return (&self.k[layer][o..o + len * w], &self.v[layer][o..o + len * w]);
        }
        k.clear();
        v.clear();
        for (i, &block) in blocks.iter().enumerate() {
            let n = bs.min(len - i * bs) * w;
            let o = block as usize * bs * w;
            k.extend_from_slice(&self.k[layer][o..o + n]);
            v.extend_from_slice(&self.v[layer][o..o + n]);
        }
        (k, v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_stored_through_a_table_gather_back_in_position_order() {
        let spec = KvSpec::full(2, 5, 2, 1, 2);
        let mut kv = KvCache::new(spec.clone()).unwrap();
        let table = [4, 0, 3];
        for pos in 0..5u64 {
            let row = table[pos as usize / 2] as u64 * 2 + pos % 2;
            let x = pos as f32;
            kv.store(1, row, &[x, x + 0.5], &[-x, -x - 0.5]);
        }
        let (mut ks, mut vs) = (Vec::new(), Vec::new());
        let want: Vec<f16> = (0..5).flat_map(|p| [p as f32, p as f32 + 0.5]).map(f16::from_f32).collect();
        let (k, v) = kv.positions(1, &table, 5, &mut ks, &mut vs);
        assert_eq!(k, want);
        assert_eq!(v, want.iter().map(|x| -*x).collect::<Vec<_>>());
        let (k, _) = kv.positions(0, &table, 3, &mut ks, &mut vs);
        assert!(k.len() == 6 && k.iter().all(|x| *x == f16::ZERO), "layer 0 untouched");
        // Consecutive blocks are read in place: the same values as a gather.
        let mut kv = KvCache::new(spec.clone()).unwrap();
        for pos in 0..6u64 {
            kv.store(1, 4 + pos, &[pos as f32, pos as f32 + 0.5], &[0.0, 0.0]);
        }
        let (k, _) = kv.positions(1, &[2, 3, 4], 5, &mut ks, &mut vs);
        assert_eq!(k, want);
        assert!(kv.table_unsupported(1, &table, 6).is_none());
        assert!(kv.table_unsupported(1, &table, 7).unwrap().contains("3 blocks for 7 positions"));
        assert!(kv.table_unsupported(0, &[5], 1).unwrap().contains("block 5 is outside"));
        assert!(KvCache::new(KvSpec { block_size: 3, ..spec.clone() }).is_err());
        // A windowed layer holds its own count of blocks.
        let ring = KvSpec { window_blocks: 2, window_layers: vec![true, false], ..spec };
        let kv = KvCache::new(ring).unwrap();
        assert_eq!((kv.k[0].len(), kv.k[1].len()), (2 * 2 * 2, 5 * 2 * 2));
        assert!(kv.table_unsupported(0, &[1, 2], 3).unwrap().contains("block 2 is outside the KV cache's 2 blocks"));
        assert!(kv.table_unsupported(1, &[1, 2], 3).is_none());
    }
}
