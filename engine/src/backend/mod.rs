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
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvSpec {
    pub layers: usize,
    /// Blocks the cache holds.
    pub blocks: usize,
    /// Positions per block: a power of two.
    pub block_size: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

impl KvSpec {
    /// Positions (rows) of one layer's K (or V), or `None` when the product overflows.
    pub fn rows(&self) -> Option<usize> {
        self.blocks.checked_mul(self.block_size)
    }

    /// Elements of one layer's K (or V), or `None` when the product overflows.
    pub fn layer_elements(&self) -> Option<usize> {
        [self.kv_heads, self.head_dim].into_iter().try_fold(self.rows()?, |n, d| n.checked_mul(d))
    }

    /// Bytes of K and V over all layers at f16 (saturating).
    pub fn bytes(&self) -> u64 {
        (self.layer_elements().unwrap_or(usize::MAX) as u64).saturating_mul(4 * self.layers as u64)
    }
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
    /// Allocates the KV cache (once, before the first batch).
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
