//! The interface every backend implements, and the backends: `cpu` (the reference) and
//! `cuda`.
//!
//! An architecture's graph (`crate::arch`) is written once against [`Backend`]; the ops are
//! coarse (a whole MoE block is one call) so a backend is free to fuse and schedule inside
//! them. Activations are `[rows, width]` f32 matrices that live wherever the backend keeps
//! them; weights are loaded once from [`HostTensor`]s.

pub mod batch;
pub mod cpu;
pub mod cuda;

pub use batch::{Batch, Chunk, Logits};

use std::sync::Arc;

use crate::gguf::GgmlType;
use crate::model::{Activation, BackendError, Gating, HostTensor, LayerSpec, Rope};
use crate::monitor::{Monitor, Op};

/// What a weight is used for, so a backend can say which tensor types it computes with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightRole {
    /// Rows looked up by token id.
    Embedding,
    /// A matrix multiplied with activations (projections, experts, the LM head, the router).
    Matrix,
    /// Per-channel values held as f32: norm weights, biases and sinks (a vector), or one such
    /// vector per expert (the routed experts' biases, `[width, experts]`).
    Scale,
}

impl WeightRole {
    pub fn name(self) -> &'static str {
        match self {
            WeightRole::Embedding => "an embedding table",
            WeightRole::Matrix => "a matrix",
            WeightRole::Scale => "per-channel values",
        }
    }
}

/// Shape of the paged KV cache a model needs: per layer, K and V as `[blocks, block_size,
/// kv_heads, head_dim]`; sequences own blocks through their block tables.
///
/// With the window-only layout, the layers of `window_layers` (sliding-window attention) hold
/// `window_blocks` blocks instead: a ring of [`ring_blocks`] blocks per sequence, addressed
/// through the batch's window tables ([`Batch::window_tables`]). Every other layer holds
/// `blocks`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvSpec {
    pub layers: usize,
    /// Blocks each full layer's cache holds.
    pub blocks: usize,
    /// Positions per block: a power of two.
    pub block_size: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Blocks each windowed layer's cache holds (the rings of all sequences).
    pub window_blocks: usize,
    /// Which layers keep only a ring of blocks per sequence (indexed by layer; missing or false:
    /// a full layer). Empty for models without windowed layers or with the full layout.
    pub window_layers: Vec<bool>,
}

impl KvSpec {
    /// A spec where every layer holds `blocks` (no window-only layers).
    pub fn full(layers: usize, blocks: usize, block_size: usize, kv_heads: usize, head_dim: usize) -> KvSpec {
        KvSpec { layers, blocks, block_size, kv_heads, head_dim, window_blocks: 0, window_layers: Vec::new() }
    }

    /// Whether `layer` keeps only a ring of blocks per sequence (its cache has `window_blocks`).
    pub fn is_windowed(&self, layer: usize) -> bool {
        self.window_layers.get(layer).copied().unwrap_or(false)
    }

    /// Whether the attention of `spec` reads its layer's ring (the window tables), or why the
    /// cache cannot serve it: a ring kept for a layer without a window. Both backends ask this
    /// before storing a layer's K and V.
    pub fn ring_layer(&self, spec: &AttentionSpec) -> std::result::Result<bool, String> {
        let windowed = self.is_windowed(spec.layer);
        if windowed && spec.window.is_none() {
            return Err(format!("attention (layer {}): the KV cache keeps a ring for a layer without a window", spec.layer));
        }
        Ok(windowed)
    }

    /// Whether any layer is windowed: batches then carry window tables.
    pub fn has_window_layers(&self) -> bool {
        self.window_layers.iter().any(|&w| w)
    }

    /// Blocks of `layer`'s cache.
    pub fn layer_blocks(&self, layer: usize) -> usize {
        if self.is_windowed(layer) { self.window_blocks } else { self.blocks }
    }

    /// Positions (rows) of one full layer's K (or V), or `None` when the product overflows.
    pub fn rows(&self) -> Option<usize> {
        self.blocks.checked_mul(self.block_size)
    }

    /// Elements of one full layer's K (or V), or `None` when the product overflows.
    pub fn layer_elements(&self) -> Option<usize> {
        self.elements_of(self.blocks)
    }

    /// Elements of `layer`'s K (or V), or `None` when the product overflows.
    pub fn elements(&self, layer: usize) -> Option<usize> {
        self.elements_of(self.layer_blocks(layer))
    }

    fn elements_of(&self, blocks: usize) -> Option<usize> {
        [self.block_size, self.kv_heads, self.head_dim].into_iter().try_fold(blocks, |n, d| n.checked_mul(d))
    }

    /// Bytes of K and V over all layers at f16 (saturating).
    pub fn bytes(&self) -> u64 {
        (0..self.layers).fold(0u64, |sum, l| sum.saturating_add((self.elements(l).unwrap_or(usize::MAX) as u64).saturating_mul(4)))
    }
}

/// Blocks of the ring a windowed layer keeps per sequence: enough that a chunk of `max_chunk`
/// tokens never overwrites a key a query of that chunk still reads (a window of `window` keys,
/// itself included), at most `context_blocks` (the full table: no ring then).
///
/// Logical block i of a sequence lives in ring slot i mod R, so position p lives in ring row
/// p mod (R · bs): the ring is a ring of R · bs positions. A chunk of L tokens from position s
/// stores all its keys (up to s + L − 1) before any of its queries attend, and its first query
/// reads from s − w + 1 on: safe iff no two of those L + w − 1 positions share a row, i.e.
/// R · bs >= L + w − 1. Later chunks' queries start later, so every chunk of at most L is safe.
pub fn ring_blocks(window: usize, max_chunk: usize, block_size: usize, context_blocks: usize) -> usize {
    let reach = (max_chunk.max(1) + window.max(1)).saturating_sub(1);
    reach.div_ceil(block_size.max(1)).min(context_blocks)
}

/// The longest chunk of one sequence a ring of `ring` blocks serves for a window of `window`
/// keys ([`ring_blocks`]'s rule solved for L: R · bs + 1 − w); 0 when none does.
pub fn ring_max_chunk(ring: usize, window: usize, block_size: usize) -> usize {
    (ring.saturating_mul(block_size) + 1).saturating_sub(window.max(1))
}

/// The attention of one layer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionSpec {
    pub layer: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub scale: f32,
    /// Sliding window: a query at position p sees keys p − w < j <= p (`None`: all before it).
    pub window: Option<u32>,
}

/// The routed-expert block of one layer.
pub struct MoeWeights<'a, W> {
    /// `[experts, hidden]` router (`ffn_gate_inp`).
    pub router: &'a W,
    /// `[experts][expert_ffn, hidden]`.
    pub gate: &'a W,
    pub up: &'a W,
    /// `[experts][hidden, expert_ffn]`.
    pub down: &'a W,
    /// The router's and each expert's biases, when the layer has them.
    pub biases: Option<MoeBiases<'a, W>>,
}

/// Biases of a routed-expert block (gpt-oss), F32.
pub struct MoeBiases<'a, W> {
    /// `[experts]`, added to the router logits.
    pub router: &'a W,
    /// `[experts][expert_ffn]`, added to each pick's gate and up projections.
    pub gate: &'a W,
    pub up: &'a W,
    /// `[experts][hidden]`, added to each pick's down projection before its weight.
    pub down: &'a W,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MoeSpec {
    pub experts: usize,
    pub top_k: usize,
    pub expert_ffn: usize,
    pub gating: Gating,
    pub activation: Activation,
}

pub type Result<T> = std::result::Result<T, BackendError>;

/// The ops a model graph is made of. Every op works on the rows of the current batch
/// ([`Backend::begin_batch`]).
pub trait Backend {
    /// Activations: `[rows, width]` f32.
    type Act;
    /// A weight resident on the backend.
    type Weight;

    fn name(&self) -> &'static str;
    /// Refuses, naming the feature, a layer this backend cannot compute (a sliding window,
    /// sinks, YaRN, ...): called for every layer when a model loads, before any weight.
    fn check_layer(&self, layer: usize, spec: &LayerSpec) -> Result<()>;
    /// Tensor types this backend computes with in `role`.
    fn supported_types(&self, role: WeightRole) -> &'static [GgmlType];
    fn load_weight(&mut self, t: HostTensor, role: WeightRole) -> Result<Self::Weight>;
    /// Allocates the KV cache (once, before the first batch): per layer, `spec.layer_blocks`.
    fn alloc_kv(&mut self, spec: KvSpec) -> Result<()>;
    /// Makes `batch` current: its tokens, positions, chunks and block tables.
    fn begin_batch(&mut self, batch: &Batch) -> Result<()>;
    /// After a failed forward pass: true when the failure belongs to a graph the backend was
    /// capturing or replaying (nothing of the step ran, or not all of it), so the caller runs
    /// the step again, which the backend then runs eagerly.
    fn abandon_graph(&mut self) -> bool {
        false
    }
    /// Where progress is reported and which test fault is armed (`crate::monitor`).
    fn set_monitor(&mut self, monitor: Arc<Monitor>);
    /// The graph enters `op` (of `layer`): progress for the watchdog; fires an armed fault
    /// (a hang blocks here, or on the device; a fail is an error).
    fn mark(&mut self, layer: Option<u32>, op: Op) -> Result<()>;

    /// Rows of `table` for the batch's tokens.
    fn embed(&mut self, table: &Self::Weight) -> Result<Self::Act>;
    /// RMS norm of each `w.len()`-wide group of `x` (whole rows, or heads for Q/K norm),
    /// scaled by `w`.
    fn rms_norm(&mut self, x: &Self::Act, w: &Self::Weight, eps: f32) -> Result<Self::Act>;
    /// `x · Wᵀ`.
    fn linear(&mut self, x: &Self::Act, w: &Self::Weight) -> Result<Self::Act>;
    /// `x · Wᵢᵀ` for each of several weights applied to the same input (q, k and v), each the
    /// values `linear` gives: a backend that quantizes its input does it once for all of them.
    fn linear_each<const N: usize>(&mut self, x: &Self::Act, ws: [&Self::Weight; N]) -> Result<[Self::Act; N]> {
        let mut out = Vec::with_capacity(N);
        for w in ws {
            out.push(self.linear(x, w)?);
        }
        let name = self.name();
        out.try_into().map_err(|_| BackendError::new(name, format!("linear_each: not {N} outputs")))
    }
    /// NEOX rotary embedding (`rope`: plain or YaRN) of each `head_dim` group of `x` at the
    /// batch's positions.
    fn rope(&mut self, x: &mut Self::Act, head_dim: usize, rope: &Rope) -> Result<()>;
    /// `rope(rms_norm(x, w, eps))` over each `head_dim` group (Qwen3's per-head Q/K norm, then
    /// the rotation): the values those two ops give, which a backend may compute in one pass.
    fn norm_rope(&mut self, x: &Self::Act, w: &Self::Weight, eps: f32, head_dim: usize, rope: &Rope) -> Result<Self::Act> {
        let mut y = self.rms_norm(x, w, eps)?;
        self.rope(&mut y, head_dim, rope)?;
        Ok(y)
    }
    /// Stores the batch's K and V at their positions' cache rows (through the chunks' block
    /// tables), then causal attention of Q over each sequence's positions (within
    /// `spec.window`), with one sink logit per head from `sinks` when given.
    fn attention(
        &mut self,
        q: &Self::Act,
        k: &Self::Act,
        v: &Self::Act,
        sinks: Option<&Self::Weight>,
        spec: &AttentionSpec,
    ) -> Result<Self::Act>;
    /// Routed experts: the router (`spec.gating`), the picked experts' gate and up, the
    /// activation, down, the weighted combine; biases where `w.biases` has them.
    fn moe(&mut self, x: &Self::Act, w: &MoeWeights<'_, Self::Weight>, spec: &MoeSpec) -> Result<Self::Act>;
    /// `x += y`.
    fn add(&mut self, x: &mut Self::Act, y: &Self::Act) -> Result<()>;
    /// `x[r] += bias` for every row r (an F32 vector as wide as `x`).
    fn add_bias(&mut self, x: &mut Self::Act, bias: &Self::Weight) -> Result<()>;
    /// The batch's logit rows of `x` (`Batch::logit_rows`), in that order.
    fn select_logit_rows(&mut self, x: &Self::Act) -> Result<Self::Act>;
    /// `x · Wᵀ` copied to the host: `[rows, vocab]`.
    fn logits(&mut self, x: &Self::Act, w: &Self::Weight) -> Result<Vec<f32>>;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs a sequence through a ring of `ring` blocks of `bs` positions (position p in ring row
    /// p mod ring · bs): a first chunk of `first` tokens, then chunks of `chunk` up to `len`
    /// positions, each stored whole before its queries read their windows. False when a query
    /// would read a row that holds another position.
    fn ring_serves(window: usize, chunk: usize, bs: usize, ring: usize, first: usize, len: usize) -> bool {
        let rows = ring * bs;
        let mut held = vec![usize::MAX; rows];
        let mut s = 0;
        while s < len {
            let l = if s == 0 { first } else { chunk }.min(len - s);
            for p in s..s + l {
                held[p % rows] = p;
            }
            for q in s..s + l {
                if ((q + 1).saturating_sub(window)..=q).any(|j| held[j % rows] != j) {
                    return false;
                }
            }
            s += l;
        }
        true
    }

    #[test]
    fn ring_sizes() {
        // (window, max chunk, block size, context blocks) -> ring.
        let table = [
            ((128, 2048, 16, 8192), 136), // (2048 + 127) / 16 = 135.9 -> 136
            ((128, 512, 16, 8192), 40),
            ((128, 1, 16, 8192), 8), // decode only: the window itself
            ((128, 2, 16, 8192), 9),
            ((128, 3, 16, 8192), 9),
            ((1, 1, 16, 100), 1),
            ((16, 1, 16, 100), 1),
            ((16, 2, 16, 100), 2),
            ((128, 2048, 16, 100), 100), // capped at the whole table
            ((128, 100, 16, 32), 15),
        ];
        for ((w, l, bs, n), want) in table {
            assert_eq!(ring_blocks(w, l, bs, n), want, "window {w}, chunk {l}, blocks of {bs}");
            if want < n {
                assert!(ring_max_chunk(want, w, bs) >= l && ring_max_chunk(want - 1, w, bs) < l);
            }
        }
        assert_eq!(ring_max_chunk(136, 128, 16), 2049);
        assert_eq!((ring_max_chunk(0, 128, 16), ring_max_chunk(7, 128, 16), ring_max_chunk(8, 128, 16)), (0, 0, 1));
    }

    /// The rule against a brute-force run over every alignment of the chunks to the blocks:
    /// the ring it gives serves them, one block fewer does not.
    #[test]
    fn ring_blocks_is_the_smallest_ring_that_serves_every_chunking() {
        for bs in [1, 2, 4, 8] {
            for w in [1, 2, 3, 5, 8, 13] {
                for l in [1, 2, 3, 4, 7, 9, 16] {
                    let r = ring_blocks(w, l, bs, usize::MAX);
                    let len = (r + 3) * bs + l + w;
                    let all = |ring: usize| (1..=l).all(|first| ring_serves(w, l, bs, ring, first, len));
                    assert!(all(r), "window {w}, chunk {l}, blocks of {bs}: a ring of {r} fails");
                    if r > 1 {
                        assert!(!all(r - 1), "window {w}, chunk {l}, blocks of {bs}: a ring of {} serves", r - 1);
                    }
                    // Shorter chunks (decode after a prefill) are served too.
                    assert!((1..l).all(|short| ring_serves(w, short, bs, r, l, len)));
                }
            }
        }
    }

    #[test]
    fn bytes_count_each_layers_blocks() {
        let full = KvSpec::full(4, 100, 16, 8, 64);
        assert_eq!(full.bytes(), 4 * 4 * 100 * 16 * 8 * 64);
        let ring = KvSpec { window_blocks: 10, window_layers: vec![true, false, true, false], ..full.clone() };
        assert_eq!(ring.bytes(), 4 * (2 * 100 + 2 * 10) * 16 * 8 * 64);
        assert_eq!((ring.layer_blocks(0), ring.layer_blocks(1), ring.layer_blocks(9)), (10, 100, 100));
        assert!(ring.has_window_layers() && !full.has_window_layers());
        assert_eq!(KvSpec { window_blocks: usize::MAX, ..ring }.bytes(), u64::MAX);
    }
}
