//! The hyperparameters qwen3moe and gpt-oss read the same way: the attention's widths, the
//! experts and RoPE's base, with their consistency checks, and the bounds that keep a hostile
//! file from sizing huge allocations through metadata (real models sit far below them).

use crate::model::{Hyper, ModelError};

pub(super) const MAX_LAYERS: usize = 1024;
pub(super) const MAX_WIDTH: usize = 1 << 20;
pub(super) const MAX_HEADS: usize = 4096;
pub(super) const MAX_EXPERTS: usize = 1024;

/// The attention's widths.
pub(super) struct AttentionDims {
    pub hidden: usize,
    pub heads: usize,
    pub kv_heads: usize,
    /// `attention.key_length`, else `embedding_length / head_count`.
    pub head_dim: usize,
}

/// `embedding_length`, the head counts and the head width, checked: `attention.value_length`,
/// when present, equals the head width and the KV heads divide the query heads. Whether the head
/// width suits RoPE is the caller's check.
pub(super) fn attention_dims(h: &Hyper<'_>) -> Result<AttentionDims, ModelError> {
    let hidden = h.count("embedding_length", MAX_WIDTH)?;
    let heads = h.count("attention.head_count", MAX_HEADS)?;
    let kv_heads = h.count("attention.head_count_kv", MAX_HEADS)?;
    let head_dim = h.optional_count("attention.key_length", MAX_WIDTH)?.unwrap_or(hidden / heads);
    if let Some(v) = h.optional_count("attention.value_length", MAX_WIDTH)?
        && v != head_dim
    {
        return Err(h.bad(&h.key("attention.value_length"), v, format!("must equal attention.key_length ({head_dim})")));
    }
    if !heads.is_multiple_of(kv_heads) {
        return Err(h.bad(&h.key("attention.head_count_kv"), kv_heads, format!("must divide attention.head_count ({heads})")));
    }
    Ok(AttentionDims { hidden, heads, kv_heads, head_dim })
}

/// `rope.dimension_count`, when present, must be the head width: partial rotary embedding is
/// not supported.
pub(super) fn check_full_rotary(h: &Hyper<'_>, head_dim: usize) -> Result<(), ModelError> {
    if let Some(rot) = h.optional_count("rope.dimension_count", MAX_WIDTH)?
        && rot != head_dim
    {
        return Err(h.bad(&h.key("rope.dimension_count"), rot, format!("partial rotary embedding is not supported (head_dim {head_dim})")));
    }
    Ok(())
}

/// `expert_count` and `expert_used_count` (at most the former).
pub(super) fn experts(h: &Hyper<'_>) -> Result<(usize, usize), ModelError> {
    let experts = h.count("expert_count", MAX_EXPERTS)?;
    let top_k = h.count("expert_used_count", MAX_EXPERTS)?;
    if top_k > experts {
        return Err(h.bad(&h.key("expert_used_count"), top_k, format!("must not exceed expert_count ({experts})")));
    }
    Ok((experts, top_k))
}

/// `rope.freq_base`: positive; 10000 (llama.cpp's default) when absent.
pub(super) fn rope_theta(h: &Hyper<'_>) -> Result<f32, ModelError> {
    match h.optional_f32("rope.freq_base")? {
        Some(t) if t > 0.0 => Ok(t),
        Some(t) => Err(h.bad(&h.key("rope.freq_base"), t, "must be positive")),
        None => Ok(10_000.0),
    }
}
