//! `qwen3moe` (Qwen3-30B-A3B, Qwen3-235B-A22B, Qwen3-Coder-30B-A3B): pre-norm decoder layers of
//! GQA attention with per-head RMS-normed Q and K and NEOX RoPE, then routed SwiGLU experts
//! (softmax router, top-k, renormalised weights). The graph follows llama.cpp's
//! `llm_build_qwen3moe` op for op, so the CPU backend can match it token for token.

use crate::backend::{Backend, WeightRole};
use crate::gguf::GgufFile;
use crate::model::{AttentionConfig, Gating, Hyper, ModelConfig, ModelError, MoeConfig, TensorTypes};

use super::decoder::{Decoder, DecoderLayer, Loader};

pub const ARCH: &str = "qwen3moe";

/// Upper bounds that keep a hostile file from sizing huge allocations through metadata; real
/// models sit far below them.
const MAX_LAYERS: usize = 1024;
const MAX_WIDTH: usize = 1 << 20;
const MAX_HEADS: usize = 4096;
const MAX_EXPERTS: usize = 1024;

/// Reads the hyperparameters; tensor shapes are checked against them when the weights load.
pub fn config(file: &GgufFile) -> Result<ModelConfig, ModelError> {
    let meta = file.metadata();
    let h = Hyper::new(meta, ARCH);
    let hidden = h.count("embedding_length", MAX_WIDTH)?;
    let heads = h.count("attention.head_count", MAX_HEADS)?;
    let kv_heads = h.count("attention.head_count_kv", MAX_HEADS)?;
    let head_dim = match h.optional_count("attention.key_length", MAX_WIDTH)? {
        Some(d) => d,
        None => hidden / heads,
    };
    if let Some(v) = h.optional_count("attention.value_length", MAX_WIDTH)?
        && v != head_dim
    {
        return Err(h.bad(&h.key("attention.value_length"), v, format!("must equal attention.key_length ({head_dim})")));
    }
    if !heads.is_multiple_of(kv_heads) {
        return Err(h.bad(&h.key("attention.head_count_kv"), kv_heads, format!("must divide attention.head_count ({heads})")));
    }
    if !head_dim.is_multiple_of(2) {
        return Err(h.bad(&h.key("attention.key_length"), head_dim, "must be even for RoPE"));
    }
    if let Some(rot) = h.optional_count("rope.dimension_count", MAX_WIDTH)?
        && rot != head_dim
    {
        return Err(h.bad(&h.key("rope.dimension_count"), rot, format!("partial rotary embedding is not supported (head_dim {head_dim})")));
    }
    let experts = h.count("expert_count", MAX_EXPERTS)?;
    let top_k = h.count("expert_used_count", MAX_EXPERTS)?;
    if top_k > experts {
        return Err(h.bad(&h.key("expert_used_count"), top_k, format!("must not exceed expert_count ({experts})")));
    }
    let expert_ffn = match h.optional_count("expert_feed_forward_length", MAX_WIDTH)? {
        Some(f) => f,
        // llama.cpp's fallback for files without the key.
        None => h.count("feed_forward_length", MAX_WIDTH)? / top_k,
    };
    let vocab = file.require_tensor("token_embd.weight")?.dims().get(1).copied().unwrap_or(0) as usize;
    let rope_theta = match h.optional_f32("rope.freq_base")? {
        Some(t) if t > 0.0 => t,
        Some(t) => return Err(h.bad(&h.key("rope.freq_base"), t, "must be positive")),
        None => 10_000.0,
    };
    let layers = h.count("block_count", MAX_LAYERS)?;
    let weights_scale = h.optional_f32("expert_weights_scale")?.filter(|&s| s != 0.0 && s != 1.0);
    let mut config = ModelConfig {
        arch: ARCH.to_string(),
        layers,
        hidden,
        vocab,
        context: h.count("context_length", 1 << 24)?,
        attention: AttentionConfig { heads, kv_heads, head_dim, rope_theta },
        moe: MoeConfig { experts, top_k, expert_ffn, norm_top_k: true, weights_scale },
        layer_specs: Vec::new(),
        norm_eps: h.positive("attention.layer_norm_rms_epsilon")?,
        weights: TensorTypes::of(file, layers),
    };
    // Every layer is the plain one: full attention with Q/K norm, NEOX RoPE, softmax-then-top-k
    // routing with renormalised (and possibly scaled) weights, SwiGLU.
    let mut layer = config.plain_layer();
    layer.ffn.gating = Gating::SoftmaxThenTopK { norm_top_k: true, weights_scale };
    config.layer_specs = vec![layer; layers];
    Ok(config)
}

/// Reads every tensor (shape-checked against `config`, type-checked against the backend) and
/// loads it onto the backend, one tensor at a time so the host never holds the whole model.
pub fn load<B: Backend>(file: &GgufFile, config: ModelConfig, backend: &mut B) -> Result<Decoder<B>, ModelError> {
    let c = &config;
    let (hidden, vocab) = (c.hidden as u64, c.vocab as u64);
    let a = &c.attention;
    let (q_w, kv_w, d) = (a.q_width() as u64, a.kv_width() as u64, a.head_dim as u64);
    let (e, f) = (c.moe.experts as u64, c.moe.expert_ffn as u64);
    let mut g = Loader::new(file, c, backend)?;
    let embd = g.get("token_embd.weight", &[hidden, vocab], WeightRole::Embedding)?;
    let mut layers = Vec::with_capacity(c.layers);
    for i in 0..c.layers {
        let n = |s: &str| format!("blk.{i}.{s}.weight");
        layers.push(DecoderLayer {
            attn_norm: g.get(&n("attn_norm"), &[hidden], WeightRole::Scale)?,
            q: g.get(&n("attn_q"), &[hidden, q_w], WeightRole::Matrix)?,
            k: g.get(&n("attn_k"), &[hidden, kv_w], WeightRole::Matrix)?,
            v: g.get(&n("attn_v"), &[hidden, kv_w], WeightRole::Matrix)?,
            o: g.get(&n("attn_output"), &[q_w, hidden], WeightRole::Matrix)?,
            qkvo_bias: None,
            qk_norm: Some([g.get(&n("attn_q_norm"), &[d], WeightRole::Scale)?, g.get(&n("attn_k_norm"), &[d], WeightRole::Scale)?]),
            sinks: None,
            ffn_norm: g.get(&n("ffn_norm"), &[hidden], WeightRole::Scale)?,
            router: g.get(&n("ffn_gate_inp"), &[hidden, e], WeightRole::Matrix)?,
            gate: g.get(&n("ffn_gate_exps"), &[hidden, f, e], WeightRole::Matrix)?,
            up: g.get(&n("ffn_up_exps"), &[hidden, f, e], WeightRole::Matrix)?,
            down: g.get(&n("ffn_down_exps"), &[f, hidden, e], WeightRole::Matrix)?,
            moe_bias: None,
        });
    }
    let out_norm = g.get("output_norm.weight", &[hidden], WeightRole::Scale)?;
    let output = match g.has("output.weight") {
        true => Some(g.get("output.weight", &[hidden, vocab], WeightRole::Matrix)?),
        false => None,
    };
    Ok(Decoder { config, embd, layers, out_norm, output })
}
