//! `gpt-oss` (gpt-oss-20b, gpt-oss-120b), as llama.cpp's converter writes it
//! (`LLM_ARCH_OPENAI_MOE`, `llm_build_openai_moe_iswa`): pre-norm decoder layers of GQA
//! attention with biased Q/K/V/output projections, YaRN RoPE (no Q/K norm), per-head sinks, a
//! sliding window on alternating layers (llama.cpp's swa pattern 2: the even layers), then
//! routed experts (biased router, top-k of the logits then their softmax, biased MXFP4 experts,
//! clamped SwiGLU). The graph is the shared decoder's ([`super::decoder`]), driven by the specs
//! this file reads.

use crate::backend::{Backend, WeightRole};
use crate::ggml_cpu::ggml_exp::fma_f32;
use crate::gguf::{GgufFile, Metadata};
use crate::model::{
    Activation, AttentionConfig, AttentionLayer, FfnLayer, Gating, Hyper, LayerSpec, ModelConfig, ModelError, MoeConfig, Rope, TensorTypes,
};

use super::decoder::{Decoder, DecoderLayer, Loader};
use super::moe_keys::{AttentionDims, MAX_LAYERS, MAX_WIDTH, attention_dims, check_full_rotary, experts, rope_theta};

pub const ARCH: &str = "gpt-oss";

/// llama.cpp's `LLM_FFN_SWIGLU_OAI_MOE` constants (not read from the file).
pub const SWIGLU_ALPHA: f32 = 1.702;
pub const SWIGLU_LIMIT: f32 = 7.0;
/// llama.cpp's YaRN betas for gpt-oss: the hparams defaults (its loader reads no beta keys for
/// this architecture, so neither does brink).
const YARN_BETA_FAST: f32 = 32.0;
const YARN_BETA_SLOW: f32 = 1.0;
/// llama.cpp's default SWA pattern for gpt-oss: of every 2 layers, the first is windowed.
const DEFAULT_SWA_PATTERN: usize = 2;

/// Reads the hyperparameters and the per-layer specs; tensor shapes are checked against them
/// when the weights load.
pub fn config(file: &GgufFile) -> Result<ModelConfig, ModelError> {
    let meta = file.metadata();
    let h = Hyper::new(meta, ARCH);
    let AttentionDims { hidden, heads, kv_heads, head_dim } = attention_dims(&h)?;
    if head_dim == 0 || !head_dim.is_multiple_of(2) {
        return Err(h.bad(&h.key("attention.key_length"), head_dim, "must be even for RoPE"));
    }
    check_full_rotary(&h, head_dim)?;
    let (experts, top_k) = experts(&h)?;
    let expert_ffn = h.count("expert_feed_forward_length", MAX_WIDTH)?;
    let vocab = file.require_tensor("token_embd.weight")?.dims().get(1).copied().unwrap_or(0) as usize;
    let context = h.count("context_length", 1 << 24)?;
    let theta = rope_theta(&h)?;
    let rope = rope(&h, theta, context)?;
    let window = h.count("attention.sliding_window", 1 << 24)? as u32;
    let pattern = match meta.optional(&h.key("attention.sliding_window_pattern"), Metadata::get_u32)? {
        Some(p) => p as usize,
        None => DEFAULT_SWA_PATTERN,
    };
    let layers = h.count("block_count", MAX_LAYERS)?;
    let weights_scale = h.optional_f32("expert_weights_scale")?.filter(|&s| s != 0.0 && s != 1.0);
    // The plain (qwen3moe) layer of these dimensions, with what gpt-oss changes.
    let plain = LayerSpec::plain(heads, kv_heads, head_dim, theta, experts, top_k, expert_ffn);
    let spec = |il: usize| LayerSpec {
        attention: AttentionLayer {
            rope,
            qk_norm: false,
            biases: true,
            window: is_swa(il, pattern).then_some(window),
            sinks: true,
            ..plain.attention
        },
        ffn: FfnLayer {
            gating: Gating::TopKThenSoftmax { weights_scale },
            activation: Activation::ClampedSwiGlu { alpha: SWIGLU_ALPHA, limit: SWIGLU_LIMIT },
            biases: true,
            ..plain.ffn
        },
    };
    Ok(ModelConfig {
        arch: ARCH.to_string(),
        layers,
        hidden,
        vocab,
        context,
        attention: AttentionConfig { heads, kv_heads, head_dim, rope_theta: theta },
        moe: MoeConfig { experts, top_k, expert_ffn, norm_top_k: false, weights_scale },
        layer_specs: (0..layers).map(spec).collect(),
        norm_eps: h.positive("attention.layer_norm_rms_epsilon")?,
        weights: TensorTypes::of(file, layers),
    })
}

/// llama.cpp's `set_swa_pattern(n, dense_first = false)`: layer il is windowed when
/// `il % n < n - 1` (every layer when n is 0).
pub fn is_swa(il: usize, pattern: usize) -> bool {
    pattern == 0 || il % pattern < pattern - 1
}

/// The RoPE of every layer: YaRN when `rope.scaling.type` is `yarn`, plain NEOX when it is
/// absent or `none`; the magnitude factor as llama.cpp's context derives it.
fn rope(h: &Hyper<'_>, theta: f32, context: usize) -> Result<Rope, ModelError> {
    let type_key = h.key("rope.scaling.type");
    let kind = h.meta.optional(&type_key, Metadata::get_str)?;
    match kind {
        None | Some("none") => return Ok(Rope::Neox { theta }),
        Some("yarn") => {}
        Some(other) => return Err(h.bad(&type_key, other, "brink computes yarn or none for gpt-oss")),
    }
    let factor = match h.optional_f32("rope.scaling.factor")? {
        Some(f) if f > 0.0 => f,
        Some(f) => return Err(h.bad(&h.key("rope.scaling.factor"), f, "must be positive")),
        // llama.cpp: no factor is freq_scale 1.
        None => 1.0,
    };
    let orig_ctx = match h.optional_count("rope.scaling.original_context_length", 1 << 24)? {
        Some(n) => n as u32,
        None => context as u32,
    };
    let rope_attn_factor = match h.optional_f32("rope.scaling.attn_factor")? {
        Some(a) if a > 0.0 => a,
        Some(a) => return Err(h.bad(&h.key("rope.scaling.attn_factor"), a, "must be positive")),
        None => 1.0,
    };
    Ok(Rope::Yarn {
        theta,
        factor,
        orig_ctx,
        beta_fast: YARN_BETA_FAST,
        beta_slow: YARN_BETA_SLOW,
        attn_factor: yarn_attn_factor(factor, rope_attn_factor),
    })
}

/// llama.cpp's `cparams.yarn_attn_factor` for ext_factor 1 and no log multiplier: its mscale
/// `0.1·ln(s) + 1` (1 when s <= 1) times the inverse of ggml's own (which ggml's rope applies
/// again), times `rope.scaling.attn_factor`; in f32, with the FMA GCC makes of `a·b + c`.
pub fn yarn_attn_factor(factor: f32, rope_attn_factor: f32) -> f32 {
    let s = 1.0 / (1.0 / factor);
    let mscale = if s <= 1.0 { 1.0 } else { fma_f32(0.1, s.ln(), 1.0) };
    mscale * (1.0 / fma_f32(0.1, s.ln(), 1.0)) * rope_attn_factor
}

/// Reads every tensor (shape-checked against `config`, type-checked against the backend, each
/// layer's spec checked against the backend first) and loads it onto the backend.
pub fn load<B: Backend>(file: &GgufFile, config: ModelConfig, backend: &mut B) -> Result<Decoder<B>, ModelError> {
    let c = &config;
    let (hidden, vocab) = (c.hidden as u64, c.vocab as u64);
    let a = &c.attention;
    let (heads, q_w, kv_w) = (a.heads as u64, a.q_width() as u64, a.kv_width() as u64);
    let (e, f) = (c.moe.experts as u64, c.moe.expert_ffn as u64);
    let mut g = Loader::new(file, c, backend)?;
    let embd = g.get("token_embd.weight", &[hidden, vocab], WeightRole::Embedding)?;
    let mut layers = Vec::with_capacity(c.layers);
    for i in 0..c.layers {
        let w = |s: &str| format!("blk.{i}.{s}.weight");
        let b = |s: &str| format!("blk.{i}.{s}.bias");
        layers.push(DecoderLayer {
            attn_norm: g.get(&w("attn_norm"), &[hidden], WeightRole::Scale)?,
            q: g.get(&w("attn_q"), &[hidden, q_w], WeightRole::Matrix)?,
            k: g.get(&w("attn_k"), &[hidden, kv_w], WeightRole::Matrix)?,
            v: g.get(&w("attn_v"), &[hidden, kv_w], WeightRole::Matrix)?,
            o: g.get(&w("attn_output"), &[q_w, hidden], WeightRole::Matrix)?,
            qkvo_bias: Some([
                g.get(&b("attn_q"), &[q_w], WeightRole::Scale)?,
                g.get(&b("attn_k"), &[kv_w], WeightRole::Scale)?,
                g.get(&b("attn_v"), &[kv_w], WeightRole::Scale)?,
                g.get(&b("attn_output"), &[hidden], WeightRole::Scale)?,
            ]),
            qk_norm: None,
            sinks: Some(g.get(&w("attn_sinks"), &[heads], WeightRole::Scale)?),
            ffn_norm: g.get(&w("post_attention_norm"), &[hidden], WeightRole::Scale)?,
            router: g.get(&w("ffn_gate_inp"), &[hidden, e], WeightRole::Matrix)?,
            gate: g.get(&w("ffn_gate_exps"), &[hidden, f, e], WeightRole::Matrix)?,
            up: g.get(&w("ffn_up_exps"), &[hidden, f, e], WeightRole::Matrix)?,
            down: g.get(&w("ffn_down_exps"), &[f, hidden, e], WeightRole::Matrix)?,
            moe_bias: Some([
                g.get(&b("ffn_gate_inp"), &[e], WeightRole::Scale)?,
                g.get(&b("ffn_gate_exps"), &[f, e], WeightRole::Scale)?,
                g.get(&b("ffn_up_exps"), &[f, e], WeightRole::Scale)?,
                g.get(&b("ffn_down_exps"), &[hidden, e], WeightRole::Scale)?,
            ]),
        });
    }
    let out_norm = g.get("output_norm.weight", &[hidden], WeightRole::Scale)?;
    // llama.cpp requires output.weight for gpt-oss (no tied embedding).
    let output = Some(g.get("output.weight", &[hidden, vocab], WeightRole::Matrix)?);
    Ok(Decoder { config, embd, layers, out_norm, output })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_even_layers_are_windowed_as_llama_cpp_sets_the_pattern() {
        let swa: Vec<bool> = (0..6).map(|il| is_swa(il, 2)).collect();
        assert_eq!(swa, [true, false, true, false, true, false]);
        assert!((0..4).all(|il| is_swa(il, 0)), "pattern 0: every layer");
        assert_eq!((0..6).map(|il| is_swa(il, 3)).collect::<Vec<_>>(), [true, true, false, true, true, false]);
        assert!(!(0..4).any(|il| is_swa(il, 1)), "pattern 1: none");
    }

    #[test]
    fn yarn_attn_factor_cancels_ggmls_mscale() {
        assert_eq!(yarn_attn_factor(32.0, 1.0), 1.0);
        assert_eq!(yarn_attn_factor(1.0, 1.0), 1.0);
        assert_eq!(yarn_attn_factor(0.5, 2.0), (1.0 / fma_f32(0.1, 0.5f32.ln(), 1.0)) * 2.0);
    }
}

#[cfg(test)]
mod config_tests {
    use super::*;
    use crate::arch::test_files::{file, with};
    use crate::gguf::Value;

    fn gpt_oss_20b_like() -> Vec<(&'static str, Value)> {
        vec![
            ("block_count", Value::U32(4)),
            ("context_length", Value::U32(131_072)),
            ("embedding_length", Value::U32(2880)),
            ("feed_forward_length", Value::U32(2880)),
            ("expert_feed_forward_length", Value::U32(2880)),
            ("attention.head_count", Value::U32(64)),
            ("attention.head_count_kv", Value::U32(8)),
            ("attention.key_length", Value::U32(64)),
            ("attention.value_length", Value::U32(64)),
            ("attention.sliding_window", Value::U32(128)),
            ("attention.layer_norm_rms_epsilon", Value::F32(1e-5)),
            ("rope.freq_base", Value::F32(150_000.0)),
            ("rope.scaling.type", Value::from("yarn")),
            ("rope.scaling.factor", Value::F32(32.0)),
            ("rope.scaling.original_context_length", Value::U32(4096)),
            ("expert_count", Value::U32(32)),
            ("expert_used_count", Value::U32(4)),
        ]
    }

    fn read(entries: &[(&str, Value)]) -> Result<ModelConfig, ModelError> {
        let (_dir, f) = file(ARCH, entries, 64, 8);
        config(&f)
    }

    #[test]
    fn the_spec_list_of_a_gpt_oss_header() {
        let c = read(&gpt_oss_20b_like()).unwrap();
        assert_eq!((c.layers, c.hidden, c.vocab, c.context), (4, 2880, 8, 131_072));
        let windows: Vec<_> = c.layer_specs.iter().map(|l| l.attention.window).collect();
        assert_eq!(windows, [Some(128), None, Some(128), None]);
        let l = c.layer_specs[1];
        let yarn = Rope::Yarn { theta: 150_000.0, factor: 32.0, orig_ctx: 4096, beta_fast: 32.0, beta_slow: 1.0, attn_factor: 1.0 };
        let a = l.attention;
        assert_eq!((a.heads, a.kv_heads, a.head_dim, a.value_dim, a.scale), (64, 8, 64, 64, 0.125));
        assert_eq!(a.rope, yarn);
        assert!(!a.qk_norm && a.biases && a.sinks);
        let f = l.ffn;
        assert_eq!((f.experts, f.top_k, f.expert_ffn), (32, 4, 2880));
        assert_eq!(f.gating, Gating::TopKThenSoftmax { weights_scale: None });
        assert_eq!(f.activation, Activation::ClampedSwiGlu { alpha: 1.702, limit: 7.0 });
        assert!(f.biases);
        // A pattern key overrides llama.cpp's default of 2; no scaling type is plain NEOX.
        let c = read(&with(&gpt_oss_20b_like(), "attention.sliding_window", Some(Value::U32(64)))).unwrap();
        assert_eq!(c.layer_specs[0].attention.window, Some(64));
        let mut e = gpt_oss_20b_like();
        e.push(("attention.sliding_window_pattern", Value::U32(0)));
        assert!(read(&e).unwrap().layer_specs.iter().all(|l| l.attention.window == Some(128)));
        let c = read(&with(&gpt_oss_20b_like(), "rope.scaling.type", None)).unwrap();
        assert_eq!(c.layer_specs[0].attention.rope, Rope::Neox { theta: 150_000.0 });
    }

    #[test]
    fn bad_gpt_oss_keys_are_named() {
        let base = gpt_oss_20b_like();
        for (key, value, needle) in [
            ("attention.sliding_window", None, "gpt-oss.attention.sliding_window"),
            ("attention.sliding_window", Some(Value::U32(0)), "gpt-oss.attention.sliding_window"),
            ("rope.scaling.type", Some(Value::from("linear")), "gpt-oss.rope.scaling.type"),
            ("rope.scaling.factor", Some(Value::F32(-1.0)), "gpt-oss.rope.scaling.factor"),
            ("attention.value_length", Some(Value::U32(32)), "gpt-oss.attention.value_length"),
            ("attention.head_count_kv", Some(Value::U32(7)), "gpt-oss.attention.head_count_kv"),
            ("expert_used_count", Some(Value::U32(33)), "gpt-oss.expert_used_count"),
            ("expert_feed_forward_length", None, "gpt-oss.expert_feed_forward_length"),
            ("attention.layer_norm_rms_epsilon", Some(Value::F32(0.0)), "gpt-oss.attention.layer_norm_rms_epsilon"),
        ] {
            let e = read(&with(&base, key, value.clone())).unwrap_err().to_string();
            assert!(e.contains(needle) && e.contains("gpt-oss.gguf"), "{key} = {value:?}: {e}");
        }
    }
}
