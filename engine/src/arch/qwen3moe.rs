//! `qwen3moe` (Qwen3-30B-A3B, Qwen3-235B-A22B, Qwen3-Coder-30B-A3B): pre-norm decoder layers of
//! GQA attention with per-head RMS-normed Q and K and NEOX RoPE, then routed SwiGLU experts
//! (softmax router, top-k, renormalised weights). The graph follows llama.cpp's
//! `llm_build_qwen3moe` op for op, so the CPU backend can match it token for token.

use crate::backend::{Backend, WeightRole};
use crate::gguf::GgufFile;
use crate::model::{AttentionConfig, Gating, Hyper, ModelConfig, ModelError, MoeConfig, TensorTypes};

use super::decoder::{Decoder, DecoderLayer, Loader};
use super::moe_keys::{AttentionDims, MAX_LAYERS, MAX_WIDTH, attention_dims, check_full_rotary, experts, rope_theta};

pub const ARCH: &str = "qwen3moe";

/// Reads the hyperparameters; tensor shapes are checked against them when the weights load.
pub fn config(file: &GgufFile) -> Result<ModelConfig, ModelError> {
    let meta = file.metadata();
    let h = Hyper::new(meta, ARCH);
    let AttentionDims { hidden, heads, kv_heads, head_dim } = attention_dims(&h)?;
    // Unlike gpt-oss's, this check lets a head width of 0 through (no key_length and fewer
    // hidden units than heads).
    if !head_dim.is_multiple_of(2) {
        return Err(h.bad(&h.key("attention.key_length"), head_dim, "must be even for RoPE"));
    }
    check_full_rotary(&h, head_dim)?;
    let (experts, top_k) = experts(&h)?;
    let expert_ffn = match h.optional_count("expert_feed_forward_length", MAX_WIDTH)? {
        Some(f) => f,
        // llama.cpp's fallback for files without the key.
        None => h.count("feed_forward_length", MAX_WIDTH)? / top_k,
    };
    let vocab = file.require_tensor("token_embd.weight")?.dims().get(1).copied().unwrap_or(0) as usize;
    let rope_theta = rope_theta(&h)?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::test_files::{file, with};
    use crate::gguf::Value;
    use crate::model::{Activation, Rope};

    fn qwen3_30b_like() -> Vec<(&'static str, Value)> {
        vec![
            ("block_count", Value::U32(3)),
            ("context_length", Value::U32(40_960)),
            ("embedding_length", Value::U32(2048)),
            ("expert_feed_forward_length", Value::U32(768)),
            ("attention.head_count", Value::U32(32)),
            ("attention.head_count_kv", Value::U32(4)),
            ("attention.key_length", Value::U32(128)),
            ("attention.layer_norm_rms_epsilon", Value::F32(1e-6)),
            ("rope.freq_base", Value::F32(1e6)),
            ("expert_count", Value::U32(128)),
            ("expert_used_count", Value::U32(8)),
        ]
    }

    fn read(entries: &[(&str, Value)]) -> Result<ModelConfig, ModelError> {
        let (_dir, f) = file(ARCH, entries, 64, 8);
        config(&f)
    }

    #[test]
    fn every_qwen3moe_layer_is_the_plain_layer() {
        let c = read(&qwen3_30b_like()).unwrap();
        assert_eq!(c.layer_specs, vec![c.plain_layer(); 3]);
        let l = c.layer_specs[2];
        assert_eq!(l.attention.rope, Rope::Neox { theta: 1e6 });
        assert_eq!((l.attention.heads, l.attention.kv_heads, l.attention.head_dim, l.attention.window), (32, 4, 128, None));
        assert!(l.attention.qk_norm && !l.attention.sinks && !l.attention.biases && !l.ffn.biases);
        assert_eq!(l.ffn.gating, Gating::SoftmaxThenTopK { norm_top_k: true, weights_scale: None });
        assert_eq!(l.ffn.activation, Activation::SwiGlu);
        let mut e = qwen3_30b_like();
        e.push(("expert_weights_scale", Value::F32(2.5)));
        let c = read(&e).unwrap();
        assert_eq!(c.layer_specs[0].ffn.gating, Gating::SoftmaxThenTopK { norm_top_k: true, weights_scale: Some(2.5) });
        assert_eq!(c.layer_specs[0].kind(&c.plain_layer()).len(), 1, "the scale is part of the key");
    }

    #[test]
    fn bad_qwen3moe_keys_are_named() {
        let base = qwen3_30b_like();
        for (key, value, needle) in [
            ("attention.head_count_kv", Some(Value::U32(5)), "qwen3moe.attention.head_count_kv"),
            ("expert_used_count", Some(Value::U32(129)), "qwen3moe.expert_used_count"),
            ("block_count", None, "qwen3moe.block_count"),
            ("rope.freq_base", Some(Value::F32(-1.0)), "qwen3moe.rope.freq_base"),
        ] {
            let e = read(&with(&base, key, value.clone())).unwrap_err().to_string();
            assert!(e.contains(needle) && e.contains("qwen3moe.gguf"), "{key} = {value:?}: {e}");
        }
    }
}
