//! The per-layer spec list: what each decoder layer computes, as an architecture reads it from
//! the GGUF header. The backends are driven by these specs, never by the architecture's name,
//! and every feature a kernel sees is part of the qualification key ([`LayerSpec::kind`]).

use std::collections::BTreeMap;

/// The rotary embedding of Q and K (NEOX pairing: dims i and i + head_dim/2).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Rope {
    Neox {
        /// `<arch>.rope.freq_base`.
        theta: f32,
    },
    /// YaRN scaling (`<arch>.rope.scaling.type = yarn`), with the values llama.cpp hands
    /// `ggml_rope_ext` (ext_factor 1).
    Yarn {
        theta: f32,
        /// `rope.scaling.factor`: freq_scale is its inverse.
        factor: f32,
        /// `rope.scaling.original_context_length`.
        orig_ctx: u32,
        beta_fast: f32,
        beta_slow: f32,
        /// The magnitude factor as llama.cpp's context derives it (its mscale, cancelled
        /// against ggml's own, times `rope.scaling.attn_factor`).
        attn_factor: f32,
    },
}

impl Rope {
    pub fn theta(&self) -> f32 {
        match *self {
            Rope::Neox { theta } | Rope::Yarn { theta, .. } => theta,
        }
    }
}

/// The attention of one layer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionLayer {
    pub heads: usize,
    pub kv_heads: usize,
    /// Q and K head width.
    pub head_dim: usize,
    /// V head width.
    pub value_dim: usize,
    /// Multiplier of the scores (`kq_scale`).
    pub scale: f32,
    pub rope: Rope,
    /// Per-head RMS norm of Q and K before RoPE (qwen3).
    pub qk_norm: bool,
    /// Biases on the Q, K, V and output projections.
    pub biases: bool,
    /// Sliding window: a query at position p sees keys p − w < j <= p.
    pub window: Option<u32>,
    /// One sink logit per query head in the softmax (`attn_sinks`).
    pub sinks: bool,
}

impl AttentionLayer {
    pub fn q_width(&self) -> usize {
        self.heads * self.head_dim
    }
    pub fn kv_width(&self) -> usize {
        self.kv_heads * self.head_dim
    }
}

/// How the router turns logits into picked experts and their weights.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Gating {
    /// Softmax over all experts, then the top k (qwen3moe); weights optionally renormalised.
    SoftmaxThenTopK { norm_top_k: bool, weights_scale: Option<f32> },
    /// The top k logits, then the softmax of those (gpt-oss, llama.cpp's `SOFTMAX_WEIGHT`).
    TopKThenSoftmax { weights_scale: Option<f32> },
}

/// The activation between an expert's gate/up and down projections.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Activation {
    /// silu(gate) · up.
    SwiGlu,
    /// gpt-oss's `swiglu_oai`: min(gate, limit) · σ(alpha · gate) · (clamp(up, ±limit) + 1).
    ClampedSwiGlu { alpha: f32, limit: f32 },
}

/// The routed-expert FFN of one layer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FfnLayer {
    pub experts: usize,
    pub top_k: usize,
    /// Width of one expert's gate/up projection.
    pub expert_ffn: usize,
    pub gating: Gating,
    pub activation: Activation,
    /// Biases on the router and on every expert's gate, up and down projections.
    pub biases: bool,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LayerSpec {
    pub attention: AttentionLayer,
    pub ffn: FfnLayer,
}

impl LayerSpec {
    /// Every property as `(name, value)`, the names those of the qualification key's entries.
    pub fn fields(&self) -> Vec<(&'static str, String)> {
        let (a, f) = (&self.attention, &self.ffn);
        let rope = match a.rope {
            Rope::Neox { theta } => format!("neox(theta={theta})"),
            Rope::Yarn { theta, factor, orig_ctx, beta_fast, beta_slow, attn_factor } => format!(
                "yarn(theta={theta},factor={factor},orig_ctx={orig_ctx},beta_fast={beta_fast},beta_slow={beta_slow},attn_factor={attn_factor})"
            ),
        };
        let gating = match f.gating {
            Gating::SoftmaxThenTopK { norm_top_k, weights_scale } => {
                format!("softmax_then_top_k(norm={norm_top_k},scale={})", opt(weights_scale))
            }
            Gating::TopKThenSoftmax { weights_scale } => format!("top_k_then_softmax(scale={})", opt(weights_scale)),
        };
        let activation = match f.activation {
            Activation::SwiGlu => "swiglu".to_string(),
            Activation::ClampedSwiGlu { alpha, limit } => format!("clamped_swiglu(alpha={alpha},limit={limit})"),
        };
        vec![
            ("attention.heads", a.heads.to_string()),
            ("attention.kv_heads", a.kv_heads.to_string()),
            ("attention.head_dim", a.head_dim.to_string()),
            ("attention.value_dim", a.value_dim.to_string()),
            ("attention.scale", a.scale.to_string()),
            ("attention.rope", rope),
            ("attention.qk_norm", a.qk_norm.to_string()),
            ("attention.biases", a.biases.to_string()),
            ("attention.window", a.window.map_or("none".to_string(), |w| w.to_string())),
            ("attention.sinks", a.sinks.to_string()),
            ("ffn.experts", f.experts.to_string()),
            ("ffn.top_k", f.top_k.to_string()),
            ("ffn.expert_ffn", f.expert_ffn.to_string()),
            ("ffn.gating", gating),
            ("ffn.activation", activation),
            ("ffn.biases", f.biases.to_string()),
        ]
    }

    /// The properties in which this layer differs from `plain` (the qwen3moe-style layer of the
    /// model's shared dimensions, [`LayerSpec::plain`]): the layer's part of the qualification
    /// key. A qwen3moe layer has none, so its key is the one it had before layers had kinds.
    pub fn kind(&self, plain: &LayerSpec) -> BTreeMap<String, String> {
        let base: BTreeMap<_, _> = plain.fields().into_iter().collect();
        self.fields().into_iter().filter(|(k, v)| base.get(k) != Some(v)).map(|(k, v)| (k.to_string(), v)).collect()
    }

    /// The qwen3moe layer of these dimensions: full attention with per-head Q/K norm and NEOX
    /// RoPE, no biases or sinks, softmax-then-top-k routing with renormalised weights, SwiGLU.
    pub fn plain(heads: usize, kv_heads: usize, head_dim: usize, theta: f32, experts: usize, top_k: usize, expert_ffn: usize) -> LayerSpec {
        LayerSpec {
            attention: AttentionLayer {
                heads,
                kv_heads,
                head_dim,
                value_dim: head_dim,
                scale: 1.0 / (head_dim as f32).sqrt(),
                rope: Rope::Neox { theta },
                qk_norm: true,
                biases: false,
                window: None,
                sinks: false,
            },
            ffn: FfnLayer {
                experts,
                top_k,
                expert_ffn,
                gating: Gating::SoftmaxThenTopK { norm_top_k: true, weights_scale: None },
                activation: Activation::SwiGlu,
                biases: false,
            },
        }
    }

    /// The features a backend must implement beyond the plain layer, by name (what a backend
    /// that lacks one names when it refuses the model).
    pub fn features(&self) -> Vec<&'static str> {
        let (a, f) = (&self.attention, &self.ffn);
        let mut out = Vec::new();
        if a.window.is_some() {
            out.push("sliding-window attention");
        }
        if a.sinks {
            out.push("attention sinks");
        }
        if matches!(a.rope, Rope::Yarn { .. }) {
            out.push("YaRN RoPE");
        }
        if a.biases {
            out.push("attention biases");
        }
        if !a.qk_norm {
            out.push("attention without Q/K norm");
        }
        if a.value_dim != a.head_dim {
            out.push("a V head width unlike the Q/K one");
        }
        if matches!(f.gating, Gating::TopKThenSoftmax { .. }) {
            out.push("top-k-then-softmax routing");
        }
        if matches!(f.activation, Activation::ClampedSwiGlu { .. }) {
            out.push("clamped SwiGLU");
        }
        if f.biases {
            out.push("expert biases");
        }
        out
    }
}

fn opt(v: Option<f32>) -> String {
    v.map_or("none".to_string(), |v| v.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn qwen() -> LayerSpec {
        LayerSpec::plain(32, 4, 128, 1e6, 128, 8, 768)
    }

    fn gpt_oss(window: Option<u32>) -> LayerSpec {
        let mut l = LayerSpec::plain(64, 8, 64, 150_000.0, 32, 4, 2880);
        l.attention.rope = Rope::Yarn { theta: 150_000.0, factor: 32.0, orig_ctx: 4096, beta_fast: 32.0, beta_slow: 1.0, attn_factor: 1.0 };
        l.attention.qk_norm = false;
        l.attention.biases = true;
        l.attention.window = window;
        l.attention.sinks = true;
        l.ffn.gating = Gating::TopKThenSoftmax { weights_scale: None };
        l.ffn.activation = Activation::ClampedSwiGlu { alpha: 1.702, limit: 7.0 };
        l.ffn.biases = true;
        l
    }

    #[test]
    fn a_plain_layer_has_no_kind_and_no_features() {
        assert!(qwen().kind(&qwen()).is_empty());
        assert!(qwen().features().is_empty());
    }

    #[test]
    fn each_feature_is_a_kind_entry_and_a_named_feature() {
        let plain = qwen();
        let mut yarn = plain;
        yarn.attention.rope = Rope::Yarn { theta: 1e6, factor: 4.0, orig_ctx: 4096, beta_fast: 32.0, beta_slow: 1.0, attn_factor: 1.0 };
        let mut window = plain;
        window.attention.window = Some(128);
        let mut sinks = plain;
        sinks.attention.sinks = true;
        let mut biases = plain;
        biases.attention.biases = true;
        let mut no_norm = plain;
        no_norm.attention.qk_norm = false;
        let mut gating = plain;
        gating.ffn.gating = Gating::TopKThenSoftmax { weights_scale: None };
        let mut scaled = plain;
        scaled.ffn.gating = Gating::SoftmaxThenTopK { norm_top_k: true, weights_scale: Some(2.5) };
        let mut act = plain;
        act.ffn.activation = Activation::ClampedSwiGlu { alpha: 1.702, limit: 7.0 };
        let mut ebias = plain;
        ebias.ffn.biases = true;
        for (l, key, value, feature) in [
            (
                yarn,
                "attention.rope",
                "yarn(theta=1000000,factor=4,orig_ctx=4096,beta_fast=32,beta_slow=1,attn_factor=1)",
                Some("YaRN RoPE"),
            ),
            (window, "attention.window", "128", Some("sliding-window attention")),
            (sinks, "attention.sinks", "true", Some("attention sinks")),
            (biases, "attention.biases", "true", Some("attention biases")),
            (no_norm, "attention.qk_norm", "false", Some("attention without Q/K norm")),
            (gating, "ffn.gating", "top_k_then_softmax(scale=none)", Some("top-k-then-softmax routing")),
            (scaled, "ffn.gating", "softmax_then_top_k(norm=true,scale=2.5)", None),
            (act, "ffn.activation", "clamped_swiglu(alpha=1.702,limit=7)", Some("clamped SwiGLU")),
            (ebias, "ffn.biases", "true", Some("expert biases")),
        ] {
            let kind = l.kind(&plain);
            assert_eq!(kind, BTreeMap::from([(key.to_string(), value.to_string())]), "{key}");
            assert_eq!(l.features(), feature.into_iter().collect::<Vec<_>>(), "{key}");
        }
    }

    #[test]
    fn gpt_oss_layers_differ_by_their_window_only() {
        let plain = LayerSpec::plain(64, 8, 64, 150_000.0, 32, 4, 2880);
        let (swa, full) = (gpt_oss(Some(128)).kind(&plain), gpt_oss(None).kind(&plain));
        assert_eq!(swa.len(), 8, "{swa:?}");
        let differ: Vec<_> = swa.keys().filter(|k| swa.get(*k) != full.get(*k)).collect();
        assert_eq!(differ, ["attention.window"]);
        assert!(!full.contains_key("attention.window"));
        assert_eq!(gpt_oss(Some(128)).features().len(), 8);
    }
}
