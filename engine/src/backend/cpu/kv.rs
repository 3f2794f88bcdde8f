//! The CPU backend's KV cache: per layer, K and V as f16 `[slots, context, kv_heads, head_dim]`
//! (llama.cpp's default cache type, so attention sees the same rounded values).

use half::f16;

use crate::backend::{BackendError, KvSpec};

pub struct KvCache {
    pub spec: KvSpec,
    k: Vec<Vec<f16>>,
    v: Vec<Vec<f16>>,
}

impl KvCache {
    pub fn new(spec: KvSpec) -> Result<Self, BackendError> {
        let per_layer = spec
            .slots
            .checked_mul(spec.context)
            .and_then(|n| n.checked_mul(spec.kv_heads * spec.head_dim))
            .ok_or_else(|| BackendError::new("cpu", format!("KV cache of {spec:?} overflows")))?;
        let alloc = || -> Result<Vec<Vec<f16>>, BackendError> {
            (0..spec.layers)
                .map(|_| {
                    let mut v = Vec::new();
                    v.try_reserve_exact(per_layer)
                        .map_err(|_| BackendError::new("cpu", format!("cannot allocate the KV cache ({} bytes)", spec.bytes())))?;
                    v.resize(per_layer, f16::ZERO);
                    Ok(v)
                })
                .collect()
        };
        Ok(KvCache { spec, k: alloc()?, v: alloc()? })
    }

    fn row_width(&self) -> usize {
        self.spec.kv_heads * self.spec.head_dim
    }

    fn offset(&self, slot: u32, pos: u32) -> usize {
        (slot as usize * self.spec.context + pos as usize) * self.row_width()
    }

    /// Stores one row of K and V (`kv_heads × head_dim` each), rounded to f16.
    pub fn store(&mut self, layer: usize, slot: u32, pos: u32, k: &[f32], v: &[f32]) {
        let o = self.offset(slot, pos);
        let w = self.row_width();
        for (dst, &x) in self.k[layer][o..o + w].iter_mut().zip(k) {
            *dst = f16::from_f32(x);
        }
        for (dst, &x) in self.v[layer][o..o + w].iter_mut().zip(v) {
            *dst = f16::from_f32(x);
        }
    }

    /// Positions `0..len` of a slot: K and V, `[len, kv_heads, head_dim]`.
    pub fn prefix(&self, layer: usize, slot: u32, len: usize) -> (&[f16], &[f16]) {
        let o = self.offset(slot, 0);
        let n = len * self.row_width();
        (&self.k[layer][o..o + n], &self.v[layer][o..o + n])
    }
}
