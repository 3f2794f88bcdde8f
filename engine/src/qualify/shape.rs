//! A loaded model's configuration as the kernels see it: the shape class the kernel self-test
//! and the model-level test derive their critical counts from.

use brink_kernels::thresholds::{AttentionShape, LayerSpec, ModelShape};

use crate::model::ModelConfig;

/// The kernel shape of `c`: the one place a model's qualification key is derived (from the
/// config `arch::config` reads from the GGUF header). Its `name` is `c.shape_label()`; its
/// key is `c.shape_class()`, so both tests report one key.
pub fn kernel_shape(c: &ModelConfig) -> ModelShape {
    // Dimensions are validated (and far below 2^32) when the model loads; saturate rather than
    // wrap should a caller build a config by hand.
    let u = |v: usize| u32::try_from(v).unwrap_or(u32::MAX);
    let mut layers: Vec<LayerSpec> = Vec::new();
    let plain = c.plain_layer();
    for (i, weights) in c.weights.layers.iter().enumerate() {
        // Each layer's kind: how its spec differs from the plain layer (none for qwen3moe).
        let kind = c.layer_specs.get(i).map(|s| s.kind(&plain)).unwrap_or_default();
        match layers.last_mut() {
            Some(last) if last.weights == *weights && last.kind == kind => last.count += 1,
            _ => layers.push(LayerSpec { count: 1, weights: weights.clone(), kind }),
        }
    }
    ModelShape {
        name: c.shape_label(),
        hidden: u(c.hidden),
        experts: u(c.moe.experts),
        top_k: u(c.moe.top_k),
        expert_ffn: u(c.moe.expert_ffn),
        vocab: u(c.vocab),
        context: u(c.context),
        attention: AttentionShape {
            heads: u(c.attention.heads),
            kv_heads: u(c.attention.kv_heads),
            head_dim: u(c.attention.head_dim),
            rope_theta: c.attention.rope_theta,
            norm_eps: c.norm_eps,
        },
        // No architecture brink loads has a latent projection, but the class keeps the one of
        // `qwen3_30b_a3b()`: its cases carry the tail-skip negative control (a self-test that
        // cannot fail proves nothing), and that kernel's tails stay qualified on every node.
        latent: ModelShape::qwen3_30b_a3b().latent,
        weights: c.weights.global.clone(),
        layers,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    use crate::model::{AttentionConfig, MoeConfig, TensorTypes};

    fn q8(roles: &[&str]) -> BTreeMap<String, String> {
        roles.iter().map(|r| (r.to_string(), "q8_0".to_string())).collect()
    }

    #[test]
    fn qwen3_30b_config_maps_to_the_self_tests_default_class() {
        let c = ModelConfig {
            arch: "qwen3moe".into(),
            layers: 48,
            hidden: 2048,
            vocab: 151_936,
            context: 40_960,
            attention: AttentionConfig { heads: 32, kv_heads: 4, head_dim: 128, rope_theta: 1_000_000.0 },
            moe: MoeConfig { experts: 128, top_k: 8, expert_ffn: 768, norm_top_k: true, weights_scale: None },
            layer_specs: Vec::new(),
            norm_eps: 1e-6,
            weights: TensorTypes { global: q8(&["token_embd.weight"]), layers: vec![q8(&["attn_q.weight"]); 48] },
        };
        let s = kernel_shape(&c);
        assert_eq!(s.key(), c.shape_class());
        assert_eq!(s.name, c.shape_label());
        // The dimensions are the built-in class's; the weight types are the file's, so the key
        // is not the built-in one (that has none).
        let mut builtin = ModelShape::qwen3_30b_a3b();
        assert_eq!(s.name, builtin.name);
        assert_ne!(s.key(), builtin.key());
        builtin.weights = q8(&["token_embd.weight"]);
        builtin.layers = vec![LayerSpec { count: 48, weights: q8(&["attn_q.weight"]), kind: BTreeMap::new() }];
        assert_eq!(s, builtin);
    }

    #[test]
    fn layers_that_differ_get_their_own_entries() {
        let mut layers = vec![q8(&["attn_q.weight"]); 4];
        layers[2].insert("ffn_down_exps.weight".into(), "q6_k".into());
        let c = ModelConfig { weights: TensorTypes { global: BTreeMap::new(), layers }, ..qwen_like() };
        let counts: Vec<u32> = kernel_shape(&c).layers.iter().map(|l| l.count).collect();
        assert_eq!(counts, [2, 1, 1]);
    }

    #[test]
    fn layer_kinds_are_in_the_key_and_a_plain_spec_list_changes_nothing() {
        let mut c =
            ModelConfig { weights: TensorTypes { global: BTreeMap::new(), layers: vec![q8(&["attn_q.weight"]); 4] }, ..qwen_like() };
        let before = kernel_shape(&c);
        c.layer_specs = vec![c.plain_layer(); 4];
        assert_eq!(kernel_shape(&c), before, "plain layers have no kind");
        // gpt-oss's alternation: a window on even layers makes four entries of one layer.
        for (i, l) in c.layer_specs.iter_mut().enumerate() {
            l.attention.sinks = true;
            l.attention.window = (i % 2 == 0).then_some(128);
        }
        let s = kernel_shape(&c);
        assert_eq!(s.layers.iter().map(|l| l.count).collect::<Vec<_>>(), [1, 1, 1, 1]);
        assert_eq!(s.layers[0].kind.get("attention.window").map(String::as_str), Some("128"));
        assert_eq!(s.layers[1].kind.get("attention.window"), None);
        assert_ne!(s.key(), before.key());
        let mut other = c.clone();
        other.layer_specs[3].ffn.activation = crate::model::Activation::ClampedSwiGlu { alpha: 1.702, limit: 7.0 };
        assert_eq!(
            s.changed_fields(&kernel_shape(&other)),
            vec!["layers[3].kind.ffn.activation: - -> \"clamped_swiglu(alpha=1.702,limit=7)\"".to_string()]
        );
    }

    fn qwen_like() -> ModelConfig {
        ModelConfig {
            arch: "qwen3moe".into(),
            layers: 4,
            hidden: 256,
            vocab: 1000,
            context: 4096,
            attention: AttentionConfig { heads: 4, kv_heads: 2, head_dim: 64, rope_theta: 1_000_000.0 },
            moe: MoeConfig { experts: 16, top_k: 4, expert_ffn: 256, norm_top_k: true, weights_scale: None },
            layer_specs: Vec::new(),
            norm_eps: 1e-6,
            weights: TensorTypes::default(),
        }
    }
}
