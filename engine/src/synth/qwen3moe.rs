//! The `qwen3moe` architecture as llama.cpp loads it (src/models/qwen3moe.cpp and the generic
//! hyperparameters of llama-model.cpp): the shape, its validation, the metadata keys, and the
//! tensors with their dimensions, types and the scale of their random values.
//!
//! Scales keep activations O(1) through the layers: a matrix with K inputs gets standard
//! deviation 1/sqrt(K), so each output has variance ~1 when its input has; RMSNorm weights are
//! near 1; the router gives logits of standard deviation ~1 (spread-out expert weights); the
//! output head gives logits of standard deviation [`LOGIT_STD`], large enough that the top two
//! logits are usually far apart (greedy decoding is stable across implementations) and small
//! enough that the argmax follows the context (decoding is not one repeated token).

use brink_kernels::quant::TensorType;

use crate::gguf::{GgufError, GgufWriter};

use super::error::{ShapeField, SynthError};
use super::scheme::{Matrix, QuantScheme};
use super::vocab::{Layout, QWEN, TRAINED_TOKENS};

pub const ARCH: &str = "qwen3moe";

/// Standard deviation of the output logits.
pub const LOGIT_STD: f32 = 4.0;
/// Norm weights are uniform in 1 ± this.
pub const NORM_SPREAD: f32 = 0.1;

/// llama.cpp's limits (llama-hparams.h `LLAMA_MAX_LAYERS`, `LLAMA_MAX_EXPERTS`).
pub const MAX_LAYERS: u32 = 512;
pub const MAX_EXPERTS: u32 = 1024;

/// The hyperparameters of a qwen3moe model.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Qwen3MoeShape {
    pub layers: u32,
    /// `embedding_length`.
    pub hidden: u64,
    pub experts: u32,
    /// `expert_used_count`.
    pub top_k: u32,
    /// `expert_feed_forward_length`: each expert's intermediate width.
    pub expert_ffn: u64,
    pub heads: u32,
    pub kv_heads: u32,
    /// `attention.key_length` = `attention.value_length`.
    pub head_dim: u64,
    pub vocab: u64,
    pub context: u32,
    pub rope_theta: f32,
    pub rms_eps: f32,
}

/// How a tensor's values are drawn.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Init {
    /// A weight matrix: zero-mean values of this standard deviation, in `ty`.
    Matrix { ty: TensorType, std: f32 },
    /// An RMSNorm weight vector (always F32): uniform in 1 ± [`NORM_SPREAD`].
    Norm,
    /// The router (F32, as llama-quantize leaves `ffn_gate_inp`).
    Router { std: f32 },
    /// A bias or another F32 vector (gpt-oss's attention sinks): zero-mean values of this
    /// standard deviation.
    Bias { std: f32 },
    /// The output head: rows of the vocabulary's `[PAD]` tokens (`live_rows..`) get
    /// [`PAD_ROW_SCALE`] of the standard deviation, as untrained rows of a real checkpoint stay
    /// near their small initial values, so greedy decoding picks real tokens.
    Head { ty: TensorType, std: f32, live_rows: u64 },
}

/// How much smaller the output rows of padding tokens are than the others.
pub const PAD_ROW_SCALE: f32 = 1.0 / 16.0;

impl Init {
    pub fn tensor_type(self) -> TensorType {
        match self {
            Init::Matrix { ty, .. } | Init::Head { ty, .. } => ty,
            Init::Norm | Init::Router { .. } | Init::Bias { .. } => TensorType::F32,
        }
    }
}

/// One tensor of the model.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorPlan {
    pub name: String,
    /// ggml order: `dims[0]` is the row length.
    pub dims: Vec<u64>,
    pub init: Init,
}

impl TensorPlan {
    pub fn elements(&self) -> u64 {
        self.dims.iter().product()
    }
}

impl Qwen3MoeShape {
    /// Checks every field against what the format and llama.cpp accept.
    pub fn validate(&self) -> Result<(), SynthError> {
        use ShapeField as F;
        self.validate_moe(&[], QWEN)?;
        // Widths llama.cpp reads as u32 keys (and Q's width, a tensor dimension) must fit in u32;
        // the writer checks each tensor's total size.
        let too_wide = |w: Option<u64>| w.is_none_or(|w| w > u32::MAX.into());
        if too_wide(Some(self.hidden)) {
            return Err(SynthError::bad_shape(F::Hidden, self.hidden, "does not fit in u32"));
        }
        if too_wide(u64::from(self.heads).checked_mul(self.head_dim)) {
            return Err(SynthError::bad_shape(F::HeadDim, self.head_dim, format!("× {} heads does not fit in u32", self.heads)));
        }
        if too_wide(self.expert_ffn.checked_mul(self.top_k.into())) {
            let problem = format!("× {} (--top-k) is feed_forward_length and does not fit in u32", self.top_k);
            return Err(SynthError::bad_shape(F::ExpertFfn, self.expert_ffn, problem));
        }
        Ok(())
    }

    /// The checks of every MoE transformer shape here (qwen3moe's, and gpt-oss's through its
    /// fields of the same names), in this order: every count and width (and each of
    /// `more_positive`, after them) is at least 1; layers and experts within llama.cpp's limits;
    /// top-k, KV heads and the head width consistent; the vocabulary holds `layout`'s tokens;
    /// RoPE's base and the RMS epsilon in range. The widths that must fit in u32 are the caller's.
    pub(super) fn validate_moe(&self, more_positive: &[(ShapeField, u64)], layout: Layout) -> Result<(), SynthError> {
        use ShapeField as F;
        let positive = [
            (F::Layers, u64::from(self.layers)),
            (F::Hidden, self.hidden),
            (F::Experts, u64::from(self.experts)),
            (F::TopK, u64::from(self.top_k)),
            (F::ExpertFfn, self.expert_ffn),
            (F::Heads, u64::from(self.heads)),
            (F::KvHeads, u64::from(self.kv_heads)),
            (F::HeadDim, self.head_dim),
            (F::Context, u64::from(self.context)),
        ];
        if let Some((field, _)) = positive.iter().chain(more_positive).find(|(_, v)| *v == 0) {
            return Err(SynthError::bad_shape(*field, 0, "must be at least 1"));
        }
        if self.layers > MAX_LAYERS {
            return Err(SynthError::bad_shape(F::Layers, self.layers, format!("llama.cpp loads at most {MAX_LAYERS} layers")));
        }
        if self.experts > MAX_EXPERTS {
            return Err(SynthError::bad_shape(F::Experts, self.experts, format!("llama.cpp loads at most {MAX_EXPERTS} experts")));
        }
        if self.top_k > self.experts {
            return Err(SynthError::bad_shape(F::TopK, self.top_k, format!("more than the {} experts (--experts)", self.experts)));
        }
        if !self.heads.is_multiple_of(self.kv_heads) {
            let problem = format!("must divide the {} query heads (--heads) for grouped-query attention", self.heads);
            return Err(SynthError::bad_shape(F::KvHeads, self.kv_heads, problem));
        }
        if !self.head_dim.is_multiple_of(2) {
            return Err(SynthError::bad_shape(F::HeadDim, self.head_dim, "must be even: RoPE rotates pairs of dimensions"));
        }
        let min_vocab = layout.min_vocab();
        if self.vocab < min_vocab || self.vocab > i32::MAX as u64 {
            let specials = layout.specials.len();
            let problem = format!("must be in {min_vocab}..={} (256 byte tokens and {specials} special tokens; ids are i32)", i32::MAX);
            return Err(SynthError::bad_shape(F::Vocab, self.vocab, problem));
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 0.0) {
            return Err(SynthError::bad_shape(F::RopeTheta, self.rope_theta, "must be a positive number"));
        }
        if !(self.rms_eps.is_finite() && self.rms_eps > 0.0 && self.rms_eps < 1.0) {
            return Err(SynthError::bad_shape(F::RmsEps, self.rms_eps, "must be in (0, 1)"));
        }
        Ok(())
    }

    /// `heads × head_dim`: the width of Q and of the attention output.
    pub fn q_width(&self) -> u64 {
        u64::from(self.heads) * self.head_dim
    }

    pub fn kv_width(&self) -> u64 {
        u64::from(self.kv_heads) * self.head_dim
    }

    /// Tokens that are not padding: the trained ones and the special tokens.
    pub fn live_tokens(&self) -> u64 {
        self.vocab.min(TRAINED_TOKENS)
    }

    /// Every tensor, in the order llama.cpp's converter writes them.
    pub fn tensors(&self, scheme: QuantScheme) -> Vec<TensorPlan> {
        let (h, v, q, kv, f, e) = (self.hidden, self.vocab, self.q_width(), self.kv_width(), self.expert_ffn, u64::from(self.experts));
        let inv_sqrt = |k: u64| 1.0 / (k as f32).sqrt();
        let matrix = |m: Matrix, layer: u32, std: f32| Init::Matrix { ty: scheme.matrix_type(m, layer, self.layers), std };
        let plan = |name: String, dims: Vec<u64>, init: Init| TensorPlan { name, dims, init };

        let mut out = vec![plan("token_embd.weight".into(), vec![h, v], matrix(Matrix::TokenEmbd, 0, 1.0))];
        for l in 0..self.layers {
            let n = |t: &str| format!("blk.{l}.{t}.weight");
            out.extend([
                plan(n("attn_norm"), vec![h], Init::Norm),
                plan(n("attn_q"), vec![h, q], matrix(Matrix::AttnQ, l, inv_sqrt(h))),
                plan(n("attn_k"), vec![h, kv], matrix(Matrix::AttnK, l, inv_sqrt(h))),
                plan(n("attn_v"), vec![h, kv], matrix(Matrix::AttnV, l, inv_sqrt(h))),
                plan(n("attn_output"), vec![q, h], matrix(Matrix::AttnOutput, l, inv_sqrt(q))),
                plan(n("attn_q_norm"), vec![self.head_dim], Init::Norm),
                plan(n("attn_k_norm"), vec![self.head_dim], Init::Norm),
                plan(n("ffn_norm"), vec![h], Init::Norm),
                plan(n("ffn_gate_inp"), vec![h, e], Init::Router { std: inv_sqrt(h) }),
                plan(n("ffn_gate_exps"), vec![h, f, e], matrix(Matrix::FfnGateExps, l, inv_sqrt(h))),
                plan(n("ffn_up_exps"), vec![h, f, e], matrix(Matrix::FfnUpExps, l, inv_sqrt(h))),
                plan(n("ffn_down_exps"), vec![f, h, e], matrix(Matrix::FfnDownExps, l, inv_sqrt(f))),
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

    /// The shape fields a tensor's row length comes from, for errors about it.
    pub fn row_fields(name: &str) -> &'static str {
        if name.ends_with("attn_output.weight") {
            "--heads × --head-dim"
        } else if name.ends_with("ffn_down_exps.weight") {
            "--expert-ffn"
        } else {
            "--hidden"
        }
    }

    /// Sets the `general.*` and `qwen3moe.*` keys.
    pub fn write_metadata(&self, w: &mut GgufWriter, scheme: QuantScheme, name: &str) -> Result<(), GgufError> {
        let key = |k: &str| format!("{ARCH}.{k}");
        w.set("general.architecture", ARCH)?;
        w.set("general.type", "model")?;
        w.set("general.name", name)?;
        w.set("general.file_type", scheme.file_type())?;
        w.set("general.quantization_version", 2u32)?;
        w.set(&key("context_length"), self.context)?;
        w.set(&key("embedding_length"), dim_u32(self.hidden))?;
        w.set(&key("block_count"), self.layers)?;
        // Qwen3 has no dense FFN; its converter writes intermediate_size, which for
        // Qwen3-30B-A3B equals expert width × top_k (6144 = 768 × 8), llama.cpp's fallback rule.
        w.set(&key("feed_forward_length"), dim_u32(self.expert_ffn * u64::from(self.top_k)))?;
        w.set(&key("expert_feed_forward_length"), dim_u32(self.expert_ffn))?;
        w.set(&key("attention.head_count"), self.heads)?;
        w.set(&key("attention.head_count_kv"), self.kv_heads)?;
        w.set(&key("attention.key_length"), dim_u32(self.head_dim))?;
        w.set(&key("attention.value_length"), dim_u32(self.head_dim))?;
        w.set(&key("rope.freq_base"), self.rope_theta)?;
        w.set(&key("attention.layer_norm_rms_epsilon"), self.rms_eps)?;
        w.set(&key("expert_count"), self.experts)?;
        w.set(&key("expert_used_count"), self.top_k)?;
        Ok(())
    }
}

/// A width for a u32 key: `validate` has checked that every one fits.
pub(super) fn dim_u32(v: u64) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synth::presets::Preset;

    #[test]
    fn tensor_list_matches_llama_cpp() {
        let s = Preset::Tiny.shape();
        let t = s.tensors(QuantScheme::Uniform(TensorType::Q8_0));
        assert_eq!(t.len(), 3 + 12 * s.layers as usize);
        let find = |n: &str| t.iter().find(|p| p.name == n).unwrap_or_else(|| panic!("{n} missing"));
        assert_eq!(find("token_embd.weight").dims, [256, 2000]);
        assert_eq!(find("blk.1.attn_q.weight").dims, [256, 256]);
        assert_eq!(find("blk.1.attn_k.weight").dims, [256, 128]);
        assert_eq!(find("blk.0.attn_output.weight").dims, [256, 256]);
        assert_eq!(find("blk.0.attn_k_norm.weight").dims, [64]);
        assert_eq!(find("blk.0.ffn_gate_inp.weight").dims, [256, 16]);
        assert_eq!(find("blk.0.ffn_gate_exps.weight").dims, [256, 256, 16]);
        assert_eq!(find("blk.0.ffn_down_exps.weight").dims, [256, 256, 16]);
        assert_eq!(find("output.weight").dims, [256, 2000]);
        assert_eq!(find("blk.0.ffn_gate_inp.weight").init.tensor_type(), TensorType::F32);
        assert_eq!(find("blk.0.attn_norm.weight").init, Init::Norm);
    }

    #[test]
    fn validation_names_the_field() {
        let base = Preset::Tiny.shape();
        type Change = fn(&mut Qwen3MoeShape);
        let cases: [(Change, ShapeField); 9] = [
            (|s| s.layers = 0, ShapeField::Layers),
            (|s| s.layers = 513, ShapeField::Layers),
            (|s| s.top_k = 17, ShapeField::TopK),
            (|s| s.kv_heads = 3, ShapeField::KvHeads),
            (|s| s.head_dim = 63, ShapeField::HeadDim),
            (|s| s.vocab = 100, ShapeField::Vocab),
            (|s| s.experts = 2000, ShapeField::Experts),
            (|s| s.rope_theta = f32::NAN, ShapeField::RopeTheta),
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
