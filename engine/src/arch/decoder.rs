//! The pre-norm MoE decoder every architecture so far is: per layer, RMS norm, Q/K/V
//! projections (+ biases), optional per-head Q/K norm, RoPE, attention (window, sinks), the
//! output projection (+ bias), the residual; RMS norm, the routed experts, the residual. Driven
//! by the config's layer specs ([`crate::model::LayerSpec`]), never by the architecture's
//! name; a qwen3moe layer runs exactly the ops it ran before layers had specs
//! (llama.cpp's `llm_build_qwen3moe`), a gpt-oss layer those of `llm_build_openai_moe_iswa`.

use crate::backend::{AttentionSpec, Backend, Batch, MoeBiases, MoeSpec, MoeWeights, WeightRole};
use crate::gguf::GgufFile;
use crate::model::{BackendError, ModelConfig, ModelError, TensorReader};
use crate::monitor::Op;

use super::{Loaded, check_type};

/// One layer's weights; the optional ones are present exactly when its spec says so.
pub struct DecoderLayer<W> {
    pub attn_norm: W,
    pub q: W,
    pub k: W,
    pub v: W,
    pub o: W,
    /// `[q, k, v, o]` biases.
    pub qkvo_bias: Option<[W; 4]>,
    /// Per-head Q and K norm weights.
    pub qk_norm: Option<[W; 2]>,
    /// One sink logit per query head.
    pub sinks: Option<W>,
    /// The norm before the FFN (`ffn_norm`, gpt-oss's `post_attention_norm`).
    pub ffn_norm: W,
    pub router: W,
    pub gate: W,
    pub up: W,
    pub down: W,
    /// `[router, gate, up, down]` biases.
    pub moe_bias: Option<[W; 4]>,
}

pub struct Decoder<B: Backend> {
    pub config: ModelConfig,
    pub embd: B::Weight,
    pub layers: Vec<DecoderLayer<B::Weight>>,
    pub out_norm: B::Weight,
    /// `output.weight`, or the embedding table when the file ties them.
    pub output: Option<B::Weight>,
}

/// Reads tensors by name, shape-checked against what the caller expects and type-checked
/// against the backend, and loads each onto the backend as it is read (the host never holds
/// the whole model).
pub struct Loader<'a, B: Backend> {
    file: &'a GgufFile,
    reader: TensorReader<'a>,
    pub backend: &'a mut B,
}

impl<'a, B: Backend> Loader<'a, B> {
    /// A loader for `config`'s model; refuses, naming the layer and feature, any layer spec the
    /// backend cannot compute before a tensor is read.
    pub fn new(file: &'a GgufFile, config: &ModelConfig, backend: &'a mut B) -> Result<Self, ModelError> {
        if config.layer_specs.len() != config.layers {
            return Err(ModelError::Request(format!("{} layer specs for {} layers", config.layer_specs.len(), config.layers)));
        }
        for (i, spec) in config.layer_specs.iter().enumerate() {
            backend.check_layer(i, spec)?;
        }
        Ok(Loader { file, reader: TensorReader::new(file), backend })
    }

    pub fn get(&mut self, name: &str, dims: &[u64], role: WeightRole) -> Result<B::Weight, ModelError> {
        let t = self.reader.read(name, dims)?;
        check_type(self.file, self.backend, &t, role)?;
        Ok(self.backend.load_weight(t, role)?)
    }

    pub fn has(&self, name: &str) -> bool {
        self.reader.has(name)
    }
}

impl<B: Backend> Loaded<B> for Decoder<B> {
    fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn forward(&self, b: &mut B, batch: &Batch) -> Result<Vec<f32>, BackendError> {
        let c = &self.config;
        b.begin_batch(batch)?;
        b.mark(None, Op::Embed)?;
        let mut x = b.embed(&self.embd)?;
        let last = self.layers.len() - 1;
        for (i, (l, spec)) in self.layers.iter().zip(&c.layer_specs).enumerate() {
            let (a, f) = (&spec.attention, &spec.ffn);
            let layer = Some(i as u32);
            b.mark(layer, Op::AttnNorm)?;
            let h = b.rms_norm(&x, &l.attn_norm, c.norm_eps)?;
            b.mark(layer, Op::QkvProj)?;
            let [mut q, mut k, mut v] = b.linear_each(&h, [&l.q, &l.k, &l.v])?;
            if let Some([qb, kb, vb, _]) = &l.qkvo_bias {
                b.add_bias(&mut q, qb)?;
                b.add_bias(&mut k, kb)?;
                b.add_bias(&mut v, vb)?;
            }
            b.mark(layer, Op::Rope)?;
            let (q, k) = match &l.qk_norm {
                Some([qn, kn]) => {
                    (b.norm_rope(&q, qn, c.norm_eps, a.head_dim, &a.rope)?, b.norm_rope(&k, kn, c.norm_eps, a.head_dim, &a.rope)?)
                }
                None => {
                    b.rope(&mut q, a.head_dim, &a.rope)?;
                    b.rope(&mut k, a.head_dim, &a.rope)?;
                    (q, k)
                }
            };
            let attn_spec =
                AttentionSpec { layer: i, heads: a.heads, kv_heads: a.kv_heads, head_dim: a.head_dim, scale: a.scale, window: a.window };
            b.mark(layer, Op::Attention)?;
            let attn = b.attention(&q, &k, &v, l.sinks.as_ref(), &attn_spec)?;
            b.mark(layer, Op::AttnOut)?;
            let mut attn = b.linear(&attn, &l.o)?;
            if let Some([_, _, _, ob]) = &l.qkvo_bias {
                b.add_bias(&mut attn, ob)?;
            }
            if i == last {
                // Only the rows whose logits are wanted go on (llama.cpp's inp_out_ids): the
                // remaining ops work row by row, so this changes no value.
                attn = b.select_logit_rows(&attn)?;
                x = b.select_logit_rows(&x)?;
            }
            b.add(&mut attn, &x)?;
            let ffn_in = attn;
            b.mark(layer, Op::FfnNorm)?;
            let h = b.rms_norm(&ffn_in, &l.ffn_norm, c.norm_eps)?;
            b.mark(layer, Op::Moe)?;
            let biases = l.moe_bias.as_ref().map(|[router, gate, up, down]| MoeBiases { router, gate, up, down });
            let w = MoeWeights { router: &l.router, gate: &l.gate, up: &l.up, down: &l.down, biases };
            let moe = MoeSpec { experts: f.experts, top_k: f.top_k, expert_ffn: f.expert_ffn, gating: f.gating, activation: f.activation };
            let mut y = b.moe(&h, &w, &moe)?;
            b.add(&mut y, &ffn_in)?;
            x = y;
        }
        b.mark(None, Op::OutputNorm)?;
        let h = b.rms_norm(&x, &self.out_norm, c.norm_eps)?;
        b.mark(None, Op::Logits)?;
        b.logits(&h, self.output.as_ref().unwrap_or(&self.embd))
    }
}
