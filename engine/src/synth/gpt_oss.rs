//! The `gpt-oss` architecture as llama.cpp's converter writes it (conversion/gpt_oss.py,
//! `GptOssModel`) and loads it (src/models/openai-moe.cpp, `LLM_ARCH_OPENAI_MOE`): the shape, its
//! validation, the metadata keys, the tensors with their dimensions, types and the scale of their
//! random values, and the harmony vocabulary and chat template.
//!
//! What differs from qwen3moe: Q/K/V/O biases and per-head attention sinks; a
//! `post_attention_norm` before the MoE instead of `ffn_norm`; no Q/K norms; a router bias and a
//! bias per expert for gate, up and down; layers alternate a [`GptOssShape::sliding_window`]-token
//! window (even layers, llama.cpp's `set_swa_pattern(2)`) and full attention; YaRN RoPE scaling.
//! The expert matrices are MXFP4 and everything else q8_0 by default (the published
//! `ggml-org/gpt-oss-20b-GGUF`: 12.1 GB is what MXFP4 experts and q8_0 attention, embedding and
//! output weigh); norms, biases, sinks and the router are F32 in every scheme, as the converter
//! writes them.
//!
//! Scales follow qwen3moe's (see its module doc): activations stay O(1) through the layers and the
//! output logits have standard deviation [`LOGIT_STD`]. Biases are small ([`BIAS_STD`]) so the
//! matrices decide; sinks are logits of the attention scores' own scale ([`SINK_STD`]).
//!
//! ```no_run
//! use brink_engine::synth::gpt_oss::{self, GptOssSpec};
//! use brink_engine::synth::GptOssPreset;
//!
//! let spec = GptOssSpec::from_preset(GptOssPreset::Tiny);
//! gpt_oss::generate(&spec, "tiny-gpt-oss.gguf".as_ref(), |_, _| {}).unwrap();
//! ```

use std::path::Path;

use crate::gguf::{GgufError, GgufWriter};

use super::error::{ShapeField, SynthError};
use super::presets::GptOssPreset;
use super::qwen3moe::{Init, LOGIT_STD, Qwen3MoeShape, TensorPlan, dim_u32};
use super::scheme::{Matrix, QuantScheme};
use super::vocab::{Layout, TRAINED_TOKENS, Vocab};
use super::{ModelPlan, Report, check_storable, declare, write_plan};

pub const ARCH: &str = "gpt-oss";

/// Standard deviation of every bias (attention Q/K/V/O, router, expert gate/up/down).
pub const BIAS_STD: f32 = 0.1;
/// Standard deviation of the attention sinks (per-head logits beside the scores, which have
/// standard deviation ~1).
pub const SINK_STD: f32 = 1.0;
/// YaRN's ramp, as gpt-oss's config.json sets it (`rope_scaling.beta_fast`, `beta_slow`; also
/// llama.cpp's defaults).
pub const YARN_BETA_FAST: f32 = 32.0;
pub const YARN_BETA_SLOW: f32 = 1.0;

/// The harmony chat template: openai/gpt-oss-120b's `chat_template` (as llama.cpp's
/// models/templates/openai-gpt-oss-120b.jinja; Apache-2.0).
pub const CHAT_TEMPLATE: &str = include_str!("gpt_oss_chat_template.jinja");

/// o200k_harmony's special tokens the template and the harmony format use, in their real id
/// order (199998, 199999, 200002, 200003, 200005, 200006, 200007, 200008, 200012), without the
/// reserved ones between them.
pub const STARTOFTEXT: &str = "<|startoftext|>";
pub const ENDOFTEXT: &str = "<|endoftext|>";
pub const RETURN: &str = "<|return|>";
pub const CONSTRAIN: &str = "<|constrain|>";
pub const CHANNEL: &str = "<|channel|>";
pub const START: &str = "<|start|>";
pub const END: &str = "<|end|>";
pub const MESSAGE: &str = "<|message|>";
pub const CALL: &str = "<|call|>";
const SPECIALS: [&str; 9] = [STARTOFTEXT, ENDOFTEXT, RETURN, CONSTRAIN, CHANNEL, START, END, MESSAGE, CALL];

/// gpt-oss's tokenizer keys: BOS `<|startoftext|>`, EOS `<|return|>`, padding `<|endoftext|>`
/// (as the published GGUFs set them), the `gpt-4o` pre-tokenizer (o200k's split, which llama.cpp
/// and brink's tokenizer both implement) and the harmony template.
pub const HARMONY: Layout =
    Layout { specials: &SPECIALS, bos: STARTOFTEXT, eos: RETURN, pad: ENDOFTEXT, pre: "gpt-4o", chat_template: CHAT_TEMPLATE };

/// The hyperparameters of a gpt-oss model.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GptOssShape {
    pub layers: u32,
    /// `embedding_length`.
    pub hidden: u64,
    pub experts: u32,
    /// `expert_used_count`.
    pub top_k: u32,
    /// `expert_feed_forward_length` (= `feed_forward_length`): each expert's intermediate width.
    pub expert_ffn: u64,
    pub heads: u32,
    pub kv_heads: u32,
    /// `attention.key_length` = `attention.value_length` (and the rotated dimensions).
    pub head_dim: u64,
    pub vocab: u64,
    pub context: u32,
    pub rope_theta: f32,
    pub rms_eps: f32,
    /// `attention.sliding_window`: the window of the even layers.
    pub sliding_window: u32,
    /// `rope.scaling.factor` (YaRN).
    pub yarn_factor: f32,
    /// `rope.scaling.original_context_length`.
    pub yarn_original_context: u32,
}

impl GptOssShape {
    /// Checks every field against what the format and llama.cpp accept.
    pub fn validate(&self) -> Result<(), SynthError> {
        use ShapeField as F;
        let more_positive =
            [(F::SlidingWindow, u64::from(self.sliding_window)), (F::YarnOriginalContext, u64::from(self.yarn_original_context))];
        self.moe_fields().validate_moe(&more_positive, HARMONY)?;
        if !(self.yarn_factor.is_finite() && self.yarn_factor >= 1.0) {
            return Err(SynthError::bad_shape(F::YarnFactor, self.yarn_factor, "must be at least 1 (YaRN stretches the trained context)"));
        }
        let too_wide = |w: Option<u64>| w.is_none_or(|w| w > u32::MAX.into());
        if too_wide(Some(self.hidden)) {
            return Err(SynthError::bad_shape(F::Hidden, self.hidden, "does not fit in u32"));
        }
        if too_wide(Some(self.expert_ffn)) {
            return Err(SynthError::bad_shape(F::ExpertFfn, self.expert_ffn, "does not fit in u32"));
        }
        if too_wide(u64::from(self.heads).checked_mul(self.head_dim)) {
            return Err(SynthError::bad_shape(F::HeadDim, self.head_dim, format!("× {} heads does not fit in u32", self.heads)));
        }
        Ok(())
    }

    /// The fields qwen3moe's shape has too, for the checks they share.
    fn moe_fields(&self) -> Qwen3MoeShape {
        let GptOssShape {
            layers, hidden, experts, top_k, expert_ffn, heads, kv_heads, head_dim, vocab, context, rope_theta, rms_eps, ..
        } = *self;
        Qwen3MoeShape { layers, hidden, experts, top_k, expert_ffn, heads, kv_heads, head_dim, vocab, context, rope_theta, rms_eps }
    }

    /// `heads × head_dim`: the width of Q and of the attention output.
    pub fn q_width(&self) -> u64 {
        u64::from(self.heads) * self.head_dim
    }

    pub fn kv_width(&self) -> u64 {
        u64::from(self.kv_heads) * self.head_dim
    }

    /// Whether layer `layer` attends through the sliding window (llama.cpp's
    /// `set_swa_pattern(2)`: the even layers; the odd ones attend to the whole context).
    pub fn is_windowed(&self, layer: u32) -> bool {
        layer.is_multiple_of(2)
    }

    /// Tokens that are not padding: the trained ones and the special tokens.
    pub fn live_tokens(&self) -> u64 {
        self.vocab.min(TRAINED_TOKENS)
    }

    /// Every tensor, with the names and dimensions llama.cpp loads (`ffn_*_exps.bias` are
    /// `[width, experts]`).
    pub fn tensors(&self, scheme: QuantScheme) -> Vec<TensorPlan> {
        let (h, v, q, kv, f, e) = (self.hidden, self.vocab, self.q_width(), self.kv_width(), self.expert_ffn, u64::from(self.experts));
        let inv_sqrt = |k: u64| 1.0 / (k as f32).sqrt();
        let matrix = |m: Matrix, layer: u32, std: f32| Init::Matrix { ty: scheme.matrix_type(m, layer, self.layers), std };
        let plan = |name: String, dims: Vec<u64>, init: Init| TensorPlan { name, dims, init };
        let bias = Init::Bias { std: BIAS_STD };

        let mut out = vec![plan("token_embd.weight".into(), vec![h, v], matrix(Matrix::TokenEmbd, 0, 1.0))];
        for l in 0..self.layers {
            let w = |t: &str| format!("blk.{l}.{t}.weight");
            let b = |t: &str| format!("blk.{l}.{t}.bias");
            out.extend([
                plan(w("attn_norm"), vec![h], Init::Norm),
                plan(w("attn_q"), vec![h, q], matrix(Matrix::AttnQ, l, inv_sqrt(h))),
                plan(b("attn_q"), vec![q], bias),
                plan(w("attn_k"), vec![h, kv], matrix(Matrix::AttnK, l, inv_sqrt(h))),
                plan(b("attn_k"), vec![kv], bias),
                plan(w("attn_v"), vec![h, kv], matrix(Matrix::AttnV, l, inv_sqrt(h))),
                plan(b("attn_v"), vec![kv], bias),
                plan(w("attn_output"), vec![q, h], matrix(Matrix::AttnOutput, l, inv_sqrt(q))),
                plan(b("attn_output"), vec![h], bias),
                plan(w("attn_sinks"), vec![u64::from(self.heads)], Init::Bias { std: SINK_STD }),
                plan(w("post_attention_norm"), vec![h], Init::Norm),
                plan(w("ffn_gate_inp"), vec![h, e], Init::Router { std: inv_sqrt(h) }),
                plan(b("ffn_gate_inp"), vec![e], bias),
                plan(w("ffn_gate_exps"), vec![h, f, e], matrix(Matrix::FfnGateExps, l, inv_sqrt(h))),
                plan(b("ffn_gate_exps"), vec![f, e], bias),
                plan(w("ffn_up_exps"), vec![h, f, e], matrix(Matrix::FfnUpExps, l, inv_sqrt(h))),
                plan(b("ffn_up_exps"), vec![f, e], bias),
                plan(w("ffn_down_exps"), vec![f, h, e], matrix(Matrix::FfnDownExps, l, inv_sqrt(f))),
                plan(b("ffn_down_exps"), vec![h, e], bias),
            ]);
        }
        out.push(plan("output_norm.weight".into(), vec![h], Init::Norm));
        let head = Init::Head {
            ty: scheme.matrix_type(Matrix::Output, 0, self.layers),
            std: LOGIT_STD * inv_sqrt(h),
            live_rows: self.live_tokens(),
        };
        out.push(plan("output.weight".into(), vec![h, v], head));
        out
    }

    /// The shape fields a tensor's row length comes from, for errors about it (as qwen3moe's).
    pub fn row_fields(name: &str) -> &'static str {
        Qwen3MoeShape::row_fields(name)
    }

    /// Sets the `general.*` and `gpt-oss.*` keys the converter writes.
    pub fn write_metadata(&self, w: &mut GgufWriter, scheme: QuantScheme, name: &str) -> Result<(), GgufError> {
        let key = |k: &str| format!("{ARCH}.{k}");
        w.set("general.architecture", ARCH)?;
        w.set("general.type", "model")?;
        w.set("general.name", name)?;
        w.set(&key("block_count"), self.layers)?;
        w.set(&key("context_length"), self.context)?;
        w.set(&key("embedding_length"), dim_u32(self.hidden))?;
        // gpt-oss's intermediate_size is each expert's width; the converter writes it twice.
        w.set(&key("feed_forward_length"), dim_u32(self.expert_ffn))?;
        w.set(&key("attention.head_count"), self.heads)?;
        w.set(&key("attention.head_count_kv"), self.kv_heads)?;
        w.set(&key("rope.scaling.type"), "yarn")?;
        w.set(&key("rope.scaling.factor"), self.yarn_factor)?;
        w.set(&key("rope.scaling.original_context_length"), self.yarn_original_context)?;
        w.set(&key("rope.scaling.yarn_beta_fast"), YARN_BETA_FAST)?;
        w.set(&key("rope.scaling.yarn_beta_slow"), YARN_BETA_SLOW)?;
        w.set(&key("rope.freq_base"), self.rope_theta)?;
        w.set(&key("attention.layer_norm_rms_epsilon"), self.rms_eps)?;
        w.set(&key("expert_count"), self.experts)?;
        w.set(&key("expert_used_count"), self.top_k)?;
        w.set(&key("attention.key_length"), dim_u32(self.head_dim))?;
        w.set(&key("attention.value_length"), dim_u32(self.head_dim))?;
        w.set("general.file_type", scheme.file_type())?;
        w.set(&key("attention.sliding_window"), self.sliding_window)?;
        w.set(&key("expert_feed_forward_length"), dim_u32(self.expert_ffn))?;
        w.set("general.quantization_version", 2u32)?;
        Ok(())
    }
}

/// What to generate: a gpt-oss model.
#[derive(Clone, Debug, PartialEq)]
pub struct GptOssSpec {
    pub shape: GptOssShape,
    pub scheme: QuantScheme,
    pub seed: u64,
    /// The preset the shape started from (recorded in the file; flags may have changed it).
    pub preset: GptOssPreset,
}

impl GptOssSpec {
    /// The preset's shape in its default scheme (`mxfp4-moe`), seed 0.
    pub fn from_preset(preset: GptOssPreset) -> Self {
        GptOssSpec { shape: preset.shape(), scheme: preset.default_scheme(), seed: 0, preset }
    }

    /// `general.name`: what the file is, readable in any GGUF viewer.
    pub fn model_name(&self) -> String {
        format!("brink synthetic gpt-oss ({} shape, {}, seed {})", self.preset, self.scheme, self.seed)
    }

    /// Validates the shape and the types, builds the vocabulary and declares every key and
    /// tensor. Nothing is generated: a plan of the 120b shape costs its header only.
    pub fn plan(&self) -> Result<ModelPlan, SynthError> {
        self.shape.validate()?;
        let tensors = self.shape.tensors(self.scheme);
        check_storable(&tensors, self.scheme, GptOssShape::row_fields)?;
        let vocab = Vocab::build_for(self.shape.vocab, HARMONY);
        declare(tensors, &vocab, self.seed, self.preset.name(), |w| self.shape.write_metadata(w, self.scheme, &self.model_name()))
    }
}

/// Writes the model to `path` (through `path.partial`, renamed when complete), streaming the
/// tensor data: memory stays at one batch of chunks whatever the size. `progress(done, total)`
/// gets tensor-data bytes.
pub fn generate(spec: &GptOssSpec, path: &Path, progress: impl FnMut(u64, u64)) -> Result<Report, SynthError> {
    let start = std::time::Instant::now();
    write_plan(&spec.plan()?, path, start, progress)
}

#[cfg(test)]
mod tests {
    use super::*;
    use brink_kernels::quant::TensorType;

    #[test]
    fn tensor_list_matches_llama_cpp() {
        let s = GptOssPreset::Tiny.shape();
        let t = s.tensors(GptOssPreset::Tiny.default_scheme());
        assert_eq!(t.len(), 3 + 19 * s.layers as usize);
        let find = |n: &str| t.iter().find(|p| p.name == n).unwrap_or_else(|| panic!("{n} missing"));
        let (h, q, kv, f, e) = (s.hidden, s.q_width(), s.kv_width(), s.expert_ffn, u64::from(s.experts));
        assert_eq!(find("token_embd.weight").dims, [h, s.vocab]);
        assert_eq!(find("blk.1.attn_q.weight").dims, [h, q]);
        assert_eq!(find("blk.1.attn_q.bias").dims, [q]);
        assert_eq!(find("blk.1.attn_k.bias").dims, [kv]);
        assert_eq!(find("blk.0.attn_output.weight").dims, [q, h]);
        assert_eq!(find("blk.0.attn_output.bias").dims, [h]);
        assert_eq!(find("blk.0.attn_sinks.weight").dims, [u64::from(s.heads)]);
        assert_eq!(find("blk.0.post_attention_norm.weight").dims, [h]);
        assert_eq!(find("blk.0.ffn_gate_inp.bias").dims, [e]);
        assert_eq!(find("blk.0.ffn_gate_exps.weight").dims, [h, f, e]);
        assert_eq!(find("blk.0.ffn_up_exps.bias").dims, [f, e]);
        assert_eq!(find("blk.0.ffn_down_exps.weight").dims, [f, h, e]);
        assert_eq!(find("blk.0.ffn_down_exps.bias").dims, [h, e]);
        assert_eq!(find("output.weight").dims, [h, s.vocab]);
        assert!(!t.iter().any(|p| p.name.contains("attn_q_norm") || p.name.contains("ffn_norm")));
        for p in &t {
            let ty = p.init.tensor_type();
            let want = if p.name.contains("_exps.weight") {
                TensorType::MXFP4
            } else if p.dims.len() == 1 || p.name.ends_with(".bias") || p.name.contains("ffn_gate_inp") {
                TensorType::F32
            } else {
                TensorType::Q8_0
            };
            assert_eq!(ty, want, "{}", p.name);
        }
    }

    #[test]
    fn harmony_vocab_has_the_specials_after_the_bpe_tokens() {
        let v = Vocab::build_for(TRAINED_TOKENS, HARMONY);
        assert_eq!(v.len() as u64, TRAINED_TOKENS);
        assert_eq!(v.bpe_tokens as usize, TRAINED_TOKENS as usize - SPECIALS.len());
        assert_eq!(v.tokens[v.bos as usize], STARTOFTEXT);
        assert_eq!(v.tokens[v.eos as usize], RETURN);
        assert_eq!(v.tokens[v.pad as usize], ENDOFTEXT);
        assert_eq!(v.special(CALL), Some(v.bpe_tokens + 8));
        // The BPE part is Qwen's, cut shorter: the same first merges.
        let qwen = Vocab::build(TRAINED_TOKENS);
        assert_eq!(v.tokens[..v.bpe_tokens as usize], qwen.tokens[..v.bpe_tokens as usize]);
    }

    #[test]
    fn even_layers_are_windowed() {
        let s = GptOssPreset::GptOss20b.shape();
        assert!(s.is_windowed(0) && !s.is_windowed(1) && s.is_windowed(22) && !s.is_windowed(23));
    }

    #[test]
    fn validation_names_the_field() {
        let base = GptOssPreset::Tiny.shape();
        type Change = fn(&mut GptOssShape);
        let cases: [(Change, ShapeField); 8] = [
            (|s| s.layers = 0, ShapeField::Layers),
            (|s| s.top_k = 17, ShapeField::TopK),
            (|s| s.kv_heads = 3, ShapeField::KvHeads),
            (|s| s.vocab = 260, ShapeField::Vocab),
            (|s| s.sliding_window = 0, ShapeField::SlidingWindow),
            (|s| s.yarn_factor = 0.5, ShapeField::YarnFactor),
            (|s| s.yarn_original_context = 0, ShapeField::YarnOriginalContext),
            (|s| s.rms_eps = 0.0, ShapeField::RmsEps),
        ];
        for (change, field) in cases {
            let mut s = base;
            change(&mut s);
            match s.validate() {
                Err(SynthError::BadShape { field: f, .. }) => assert_eq!(f, field),
                other => panic!("{field}: {other:?}"),
            }
        }
        assert!(base.validate().is_ok());
    }
}
