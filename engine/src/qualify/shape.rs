//! A loaded model's configuration as the kernels see it: the shape class the kernel self-test
//! and the model-level test derive their critical counts from.

use brink_kernels::thresholds::{AttentionShape, ModelShape};

use crate::model::ModelConfig;

/// The kernel shape of `c`; its `name` is `c.shape_class()`, so both tests report one class.
pub fn kernel_shape(c: &ModelConfig) -> ModelShape {
    // Dimensions are validated (and far below 2^32) when the model loads; saturate rather than
    // wrap should a caller build a config by hand.
    let u = |v: usize| u32::try_from(v).unwrap_or(u32::MAX);
    ModelShape {
        name: c.shape_class(),
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
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{AttentionConfig, MoeConfig};

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
            norm_eps: 1e-6,
        };
        let s = kernel_shape(&c);
        assert_eq!(s.name, c.shape_class());
        assert_eq!(s, ModelShape::qwen3_30b_a3b());
    }
}
