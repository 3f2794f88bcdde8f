//! Bytes of KV cache a model's sequences take, as the engine allocates them: per layer, K and
//! V, each `kv_heads x head width` elements of the cache's element type per position. The CUDA
//! backend (engine/src/backend/cuda/kv.rs, `KvSpec::bytes`) stores both as f16, so an element
//! is 2 bytes. The engine gives every layer whole blocks of positions, and a sliding-window
//! layer only a ring of `ring_blocks` blocks per sequence (engine/src/engine.rs, the
//! window-only layout), so a windowed layer's bytes stop growing with the context.
//!
//! The operator sizes a replica's memory request from two facts ([`KvFacts`]), multiplied by
//! its context and concurrency; they must match what the engine really allocates.

use brink_api::crd::KV_WINDOW_PREFILL_CHUNK;
use brink_engine::EngineOptions;
use brink_engine::backend::ring_blocks;
use brink_engine::model::LayerSpec;

/// Bytes of one KV-cache element: f16, as the CUDA backend stores K and V.
pub const KV_ELEMENT_BYTES: u64 = 2;

/// One layer's KV cache: heads, the K and V head widths, and its sliding window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayerKv {
    pub kv_heads: u64,
    pub k_dim: u64,
    pub v_dim: u64,
    /// Keys a query sees (None: full attention).
    pub window: Option<u64>,
}

impl LayerKv {
    pub fn of(spec: &LayerSpec) -> LayerKv {
        let a = &spec.attention;
        LayerKv { kv_heads: a.kv_heads as u64, k_dim: a.head_dim as u64, v_dim: a.value_dim as u64, window: a.window.map(u64::from) }
    }

    /// Bytes one position takes: `kv_heads x (k_dim + v_dim) x KV_ELEMENT_BYTES`; None when
    /// zero (no KV cache to size: a broken header, not a free layer) or on overflow.
    fn bytes_per_position(&self) -> Option<u64> {
        let bytes = self.k_dim.checked_add(self.v_dim)?.checked_mul(self.kv_heads)?.checked_mul(KV_ELEMENT_BYTES)?;
        (bytes > 0).then_some(bytes)
    }
}

/// The engine settings the sizes depend on: positions per block and the longest prefill chunk
/// (a windowed layer's ring holds a window plus a chunk).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    pub block_size: u64,
    pub prefill_chunk: u64,
}

impl Geometry {
    /// The engine's defaults ([`EngineOptions::default`]).
    pub fn engine_default() -> Geometry {
        let o = EngineOptions::default();
        Geometry { block_size: o.block_size as u64, prefill_chunk: o.prefill_chunk as u64 }
    }

    /// What the Model status's facts are sized at: the engine's block size and the prefill
    /// chunk the operator scales the window bytes from ([`KV_WINDOW_PREFILL_CHUNK`], the
    /// engine's default: tested below).
    pub fn status() -> Geometry {
        Geometry { prefill_chunk: KV_WINDOW_PREFILL_CHUNK, ..Geometry::engine_default() }
    }

    /// Blocks of a windowed layer's ring per sequence with `context_blocks` blocks of context,
    /// by the engine's own rule (one ring, sized for the widest window, for every windowed
    /// layer); None without windowed layers or when a value does not fit usize.
    fn ring_blocks(&self, layers: &[LayerKv], context_blocks: u64) -> Option<u64> {
        let window = layers.iter().filter_map(|l| l.window).max()?;
        let us = |v: u64| usize::try_from(v).ok();
        let ring = ring_blocks(us(window)?, us(self.prefill_chunk)?, us(self.block_size)?, us(context_blocks).unwrap_or(usize::MAX));
        Some(ring as u64)
    }
}

/// Bytes of KV cache one sequence of `context` positions takes, as the engine allocates it: a
/// full layer holds `ceil(context / block_size)` blocks, a windowed layer the ring (at most
/// that many). None for no layers, a zero-sized layer, a zero context or block size, or
/// overflow.
pub fn sequence_bytes(layers: &[LayerKv], context: u64, g: Geometry) -> Option<u64> {
    if layers.is_empty() || context == 0 || g.block_size == 0 {
        return None;
    }
    let blocks = context.div_ceil(g.block_size);
    let full = blocks.checked_mul(g.block_size)?;
    let ring = g.ring_blocks(layers, blocks).unwrap_or(blocks).checked_mul(g.block_size)?;
    layers.iter().try_fold(0u64, |sum, l| {
        let positions = if l.window.is_some() { ring } else { full };
        sum.checked_add(l.bytes_per_position()?.checked_mul(positions)?)
    })
}

/// What the operator needs of the KV cache, without knowing architectures: one sequence of
/// `context` positions takes `bytes_per_token x context + window_bytes_per_sequence`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvFacts {
    /// Bytes per position of the full-attention layers.
    pub bytes_per_token: u64,
    /// Bytes of the windowed layers' rings of one sequence at `g`'s prefill chunk and block
    /// size (0 without windowed layers). An upper bound: a context shorter than the ring takes
    /// less.
    pub window_bytes_per_sequence: u64,
}

/// The [`KvFacts`] of `layers` under `g`; None for no layers, a zero-sized layer, a zero block
/// size, or overflow. Against [`sequence_bytes`] the estimate is short only of the full layers'
/// rounding up to a whole block (under one block per sequence).
pub fn kv_facts(layers: &[LayerKv], g: Geometry) -> Option<KvFacts> {
    if layers.is_empty() || g.block_size == 0 {
        return None;
    }
    let ring = g.ring_blocks(layers, u64::MAX).unwrap_or(0).checked_mul(g.block_size)?;
    let (mut bytes_per_token, mut window_bytes_per_sequence) = (0u64, 0u64);
    for l in layers {
        let b = l.bytes_per_position()?;
        if l.window.is_some() {
            window_bytes_per_sequence = window_bytes_per_sequence.checked_add(b.checked_mul(ring)?)?;
        } else {
            bytes_per_token = bytes_per_token.checked_add(b)?;
        }
    }
    Some(KvFacts { bytes_per_token, window_bytes_per_sequence })
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: Geometry = Geometry { block_size: 16, prefill_chunk: KV_WINDOW_PREFILL_CHUNK };

    fn full(layers: usize, kv_heads: u64, dim: u64) -> Vec<LayerKv> {
        vec![LayerKv { kv_heads, k_dim: dim, v_dim: dim, window: None }; layers]
    }

    /// gpt-oss-20b: 24 layers of 8 KV heads of 64 dims, a window of 128 on the even layers.
    fn gpt_oss_20b() -> Vec<LayerKv> {
        (0..24).map(|i| LayerKv { kv_heads: 8, k_dim: 64, v_dim: 64, window: (i % 2 == 0).then_some(128) }).collect()
    }

    #[test]
    fn the_engine_defaults_are_blocks_of_16_and_chunks_of_2048() {
        // The operator takes a deployment's chunk as the engine's default when it has none.
        assert_eq!(Geometry::engine_default(), G);
        assert_eq!(Geometry::status(), G);
    }

    #[test]
    fn the_operators_scaled_window_bytes_cover_the_rings_at_any_chunk() {
        use brink_api::crd::kv_window_bytes_at_chunk;
        let narrow = LayerKv { kv_heads: 4, k_dim: 64, v_dim: 64, window: Some(1) };
        let wide = LayerKv { window: Some(4096), ..narrow };
        for layers in [gpt_oss_20b(), vec![narrow], vec![wide, LayerKv { window: None, ..narrow }]] {
            let published = kv_facts(&layers, G).unwrap().window_bytes_per_sequence;
            for chunk in [1, 16, 2047, 2048, 2049, 4095, 4096, 4097, 8192, 10_000, 65_536] {
                let engine = kv_facts(&layers, Geometry { prefill_chunk: chunk, ..G }).unwrap().window_bytes_per_sequence;
                let asked = kv_window_bytes_at_chunk(published, Some(chunk)).unwrap();
                assert!(engine <= asked, "chunk {chunk}: the engine's {engine} > {asked}");
            }
        }
        // gpt-oss-20b at 8192: a ring of 8,320 positions, asked as 4 x 2,176.
        let oss = gpt_oss_20b();
        let at = |chunk| kv_facts(&oss, Geometry { prefill_chunk: chunk, ..G }).unwrap().window_bytes_per_sequence;
        assert_eq!((at(8192), kv_window_bytes_at_chunk(at(2048), Some(8192))), (12 * 2048 * 8320, Some(12 * 2048 * 4 * 2176)));
    }

    #[test]
    fn qwen3_30b_a3b_takes_96_kib_per_token_and_no_window() {
        // 48 layers, 4 KV heads of 128 dims: 48 x 4 x (128 + 128) x 2 bytes.
        let qwen = full(48, 4, 128);
        assert_eq!(kv_facts(&qwen, G), Some(KvFacts { bytes_per_token: 98_304, window_bytes_per_sequence: 0 }));
        // A 32k context for 4 sequences: 12 GiB, the figure a replica's memory request carries.
        assert_eq!(sequence_bytes(&qwen, 32_768, G).map(|b| b * 4), Some(12 << 30));
        // Qwen3-235B-A22B: 94 layers, 4 KV heads of 128 dims.
        assert_eq!(kv_facts(&full(94, 4, 128), G).map(|f| f.bytes_per_token), Some(192_512));
    }

    #[test]
    fn gpt_oss_20b_keeps_a_ring_on_half_its_layers() {
        let oss = gpt_oss_20b();
        // A position of one layer: 8 x (64 + 64) x 2 = 2 KiB. The ring: ceil((2048 + 128 - 1)
        // / 16) = 136 blocks, 2176 positions.
        let facts = kv_facts(&oss, G).unwrap();
        assert_eq!(facts, KvFacts { bytes_per_token: 12 * 2048, window_bytes_per_sequence: 12 * 2048 * 2176 });
        // Every layer at every position (the estimate before rings): twice the full part.
        let all_layers = kv_facts(&full(24, 8, 64), G).unwrap().bytes_per_token;
        assert_eq!(all_layers, 2 * facts.bytes_per_token);
        for (context, want) in [
            // Shorter than the ring: the windowed layers hold the whole (block-rounded) context.
            (1, 24 * 2048 * 16),
            (1000, 24 * 2048 * 1008),
            (2176, 24 * 2048 * 2176),
            // Longer: they stop at the ring.
            (2177, 12 * 2048 * (2192 + 2176)),
            (32_768, 12 * 2048 * (32_768 + 2176)),
            (131_072, 12 * 2048 * (131_072 + 2176)),
        ] {
            let got = sequence_bytes(&oss, context, G).unwrap();
            assert_eq!(got, want, "context {context}");
            // The facts' estimate covers it but for the full layers' last partial block.
            let estimate = facts.bytes_per_token * context.next_multiple_of(16) + facts.window_bytes_per_sequence;
            assert!(got <= estimate, "context {context}: {got} > {estimate}");
            assert!(got <= all_layers * context.next_multiple_of(16));
        }
        // At 128k the facts ask for about 51% of the all-layers figure.
        let (est, old) = (facts.bytes_per_token * 131_072 + facts.window_bytes_per_sequence, all_layers * 131_072);
        assert!(est * 100 < old * 52, "{est} vs {old}");
    }

    #[test]
    fn k_and_v_widths_and_heads_are_per_layer() {
        let layers = [
            LayerKv { kv_heads: 2, k_dim: 192, v_dim: 128, window: None },
            LayerKv { kv_heads: 4, k_dim: 64, v_dim: 64, window: Some(512) },
        ];
        let ring = (2048 + 512 - 1u64).div_ceil(16) * 16;
        assert_eq!(kv_facts(&layers, G), Some(KvFacts { bytes_per_token: 2 * 320 * 2, window_bytes_per_sequence: 4 * 128 * 2 * ring }));
        // Windows of several widths share one ring, sized for the widest (as the engine does).
        let mixed = [LayerKv { window: Some(128), ..layers[1] }, layers[1]];
        assert_eq!(kv_facts(&mixed, G).unwrap().window_bytes_per_sequence, 2 * 4 * 128 * 2 * ring);
        // A larger prefill chunk makes a larger ring.
        let wide = Geometry { prefill_chunk: 4096, ..G };
        assert_eq!(kv_facts(&layers, wide).unwrap().window_bytes_per_sequence, 4 * 128 * 2 * (4096 + 512 - 1u64).div_ceil(16) * 16);
        // A model of windowed layers only has no per-token part.
        assert_eq!(kv_facts(&layers[1..], G).map(|f| f.bytes_per_token), Some(0));
    }

    #[test]
    fn zero_and_overflow_give_none() {
        let one = LayerKv { kv_heads: 4, k_dim: 128, v_dim: 128, window: None };
        assert_eq!(kv_facts(&[], G), None);
        assert_eq!(kv_facts(&[LayerKv { kv_heads: 0, ..one }], G), None);
        assert_eq!(kv_facts(&[LayerKv { k_dim: 0, v_dim: 0, ..one }], G), None);
        assert_eq!(kv_facts(&[one], Geometry { block_size: 0, ..G }), None);
        assert_eq!(kv_facts(&[LayerKv { kv_heads: u64::MAX / 2, ..one }], G), None);
        assert_eq!(kv_facts(&[LayerKv { kv_heads: u64::MAX / 1024, ..one }; 4], G), None, "the sum overflows");
        assert_eq!(kv_facts(&[LayerKv { kv_heads: u64::MAX / 1024, window: Some(128), ..one }], G), None, "the ring overflows");
        assert_eq!(kv_facts(&[LayerKv { kv_heads: 1, k_dim: 1, v_dim: 1, window: None }], G).map(|f| f.bytes_per_token), Some(4));
        assert_eq!(sequence_bytes(&[], 10, G), None);
        assert_eq!(sequence_bytes(&[one], 0, G), None);
        assert_eq!(sequence_bytes(&[one], u64::MAX, G), None);
        assert_eq!(sequence_bytes(&[LayerKv { kv_heads: 0, ..one }], 10, G), None);
    }
}
