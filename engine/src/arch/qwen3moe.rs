//! `qwen3moe` (Qwen3-30B-A3B, Qwen3-235B-A22B, Qwen3-Coder-30B-A3B): pre-norm decoder layers of
//! GQA attention with per-head RMS-normed Q and K and NEOX RoPE, then routed SwiGLU experts
//! (softmax router, top-k, renormalised weights). The graph follows llama.cpp's
//! `llm_build_qwen3moe` op for op, so the CPU backend can match it token for token.

use crate::backend::{AttentionSpec, Backend, Batch, MoeSpec, MoeWeights, WeightRole};
use crate::gguf::GgufFile;
use crate::model::{AttentionConfig, BackendError, Hyper, ModelConfig, ModelError, MoeConfig, TensorReader, TensorTypes};
use crate::monitor::Op;

use super::{Loaded, check_type};

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
    Ok(ModelConfig {
        arch: ARCH.to_string(),
        layers,
        hidden,
        vocab,
        context: h.count("context_length", 1 << 24)?,
        attention: AttentionConfig { heads, kv_heads, head_dim, rope_theta },
        moe: MoeConfig {
            experts,
            top_k,
            expert_ffn,
            norm_top_k: true,
            weights_scale: h.optional_f32("expert_weights_scale")?.filter(|&s| s != 0.0 && s != 1.0),
        },
        norm_eps: h.positive("attention.layer_norm_rms_epsilon")?,
        weights: TensorTypes::of(file, layers),
    })
}

struct Layer<W> {
    attn_norm: W,
    q: W,
    k: W,
    v: W,
    o: W,
    q_norm: W,
    k_norm: W,
    ffn_norm: W,
    router: W,
    gate: W,
    up: W,
    down: W,
}

pub struct Qwen3Moe<B: Backend> {
    config: ModelConfig,
    embd: B::Weight,
    layers: Vec<Layer<B::Weight>>,
    out_norm: B::Weight,
    /// `output.weight`, or the embedding table when the file ties them.
    output: Option<B::Weight>,
}

/// Reads every tensor (shape-checked against `config`, type-checked against the backend) and
/// loads it onto the backend, one tensor at a time so the host never holds the whole model.
pub fn load<B: Backend>(file: &GgufFile, config: ModelConfig, backend: &mut B) -> Result<Qwen3Moe<B>, ModelError> {
    let c = &config;
    let (hidden, vocab) = (c.hidden as u64, c.vocab as u64);
    let a = &c.attention;
    let (q_w, kv_w, d) = (a.q_width() as u64, a.kv_width() as u64, a.head_dim as u64);
    let (e, f) = (c.moe.experts as u64, c.moe.expert_ffn as u64);
    let mut r = TensorReader::new(file);
    let mut get = |name: String, dims: &[u64], role: WeightRole, b: &mut B| -> Result<B::Weight, ModelError> {
        let t = r.read(&name, dims)?;
        check_type(file, b, &t, role)?;
        Ok(b.load_weight(t, role)?)
    };
    let embd = get("token_embd.weight".into(), &[hidden, vocab], WeightRole::Embedding, backend)?;
    let mut layers = Vec::with_capacity(c.layers);
    for i in 0..c.layers {
        let n = |s: &str| format!("blk.{i}.{s}.weight");
        layers.push(Layer {
            attn_norm: get(n("attn_norm"), &[hidden], WeightRole::Scale, backend)?,
            q: get(n("attn_q"), &[hidden, q_w], WeightRole::Matrix, backend)?,
            k: get(n("attn_k"), &[hidden, kv_w], WeightRole::Matrix, backend)?,
            v: get(n("attn_v"), &[hidden, kv_w], WeightRole::Matrix, backend)?,
            o: get(n("attn_output"), &[q_w, hidden], WeightRole::Matrix, backend)?,
            q_norm: get(n("attn_q_norm"), &[d], WeightRole::Scale, backend)?,
            k_norm: get(n("attn_k_norm"), &[d], WeightRole::Scale, backend)?,
            ffn_norm: get(n("ffn_norm"), &[hidden], WeightRole::Scale, backend)?,
            router: get(n("ffn_gate_inp"), &[hidden, e], WeightRole::Matrix, backend)?,
            gate: get(n("ffn_gate_exps"), &[hidden, f, e], WeightRole::Matrix, backend)?,
            up: get(n("ffn_up_exps"), &[hidden, f, e], WeightRole::Matrix, backend)?,
            down: get(n("ffn_down_exps"), &[f, hidden, e], WeightRole::Matrix, backend)?,
        });
    }
    let out_norm = get("output_norm.weight".into(), &[hidden], WeightRole::Scale, backend)?;
    let output = match file.tensor("output.weight") {
        Some(_) => Some(get("output.weight".into(), &[hidden, vocab], WeightRole::Matrix, backend)?),
        None => None,
    };
    Ok(Qwen3Moe { config, embd, layers, out_norm, output })
}

impl<B: Backend> Loaded<B> for Qwen3Moe<B> {
    fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn forward(&self, b: &mut B, batch: &Batch) -> Result<Vec<f32>, BackendError> {
        let c = &self.config;
        let a = &c.attention;
        let moe = MoeSpec {
            experts: c.moe.experts,
            top_k: c.moe.top_k,
            expert_ffn: c.moe.expert_ffn,
            norm_top_k: c.moe.norm_top_k,
            weights_scale: c.moe.weights_scale,
        };
        b.begin_batch(batch)?;
        b.mark(None, Op::Embed)?;
        let mut x = b.embed(&self.embd)?;
        let last = self.layers.len() - 1;
        for (i, l) in self.layers.iter().enumerate() {
            let layer = Some(i as u32);
            b.mark(layer, Op::AttnNorm)?;
            let h = b.rms_norm(&x, &l.attn_norm, c.norm_eps)?;
            b.mark(layer, Op::QkvProj)?;
            let [q, k, v] = b.linear_each(&h, [&l.q, &l.k, &l.v])?;
            b.mark(layer, Op::Rope)?;
            let q = b.norm_rope(&q, &l.q_norm, c.norm_eps, a.head_dim, a.rope_theta)?;
            let k = b.norm_rope(&k, &l.k_norm, c.norm_eps, a.head_dim, a.rope_theta)?;
            let spec = AttentionSpec { layer: i, heads: a.heads, kv_heads: a.kv_heads, head_dim: a.head_dim, scale: a.scale() };
            b.mark(layer, Op::Attention)?;
            let attn = b.attention(&q, &k, &v, &spec)?;
            b.mark(layer, Op::AttnOut)?;
            let mut attn = b.linear(&attn, &l.o)?;
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
            let w = MoeWeights { router: &l.router, gate: &l.gate, up: &l.up, down: &l.down };
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
