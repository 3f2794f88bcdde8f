//! The catalogue: every self-test case for a model shape class on a device, derived from the
//! kernels' launch plans and the serving envelope (see `thresholds`), with the negative
//! controls. A case that cannot run (memory budget) stays in the catalogue and is reported as
//! skipped with its reason: derived vs. executed is part of the report.

use serde::{Deserialize, Serialize};

use super::case::{Case, Expect, OpCase};
use crate::limits::DeviceLimits;
use crate::ops::add::AddCase;
use crate::ops::attention::{self, AttentionCase, DecodeRoute, Layout};
use crate::ops::bias::{BiasCase, Picks};
use crate::ops::dense_f32::DenseF32Case;
use crate::ops::embed::{EmbedCase, TableType};
use crate::ops::latent_proj::LatentCase;
use crate::ops::linear::LinearCase;
use crate::ops::moe_align::{AlignCase, GEMM_TILE_M};
use crate::ops::moe_combine::CombineCase;
use crate::ops::moe_gemm::GemmCase;
use crate::ops::moe_gemv::GemvCase;
use crate::ops::moe_gemv_fused::{Epilogue, FfnDims, FusedCase};
use crate::ops::norm_rope::NormRopeCase;
use crate::ops::output_head::HeadCase;
use crate::ops::qkv::QkvCase;
use crate::ops::quantize::QuantizeCase;
use crate::ops::rmsnorm::RmsNormCase;
use crate::ops::rope::{RopeCase, RopeYarn};
use crate::ops::router::{RouterCase, Scoring};
use crate::ops::sampling::SamplingCase;
use crate::ops::swiglu::{self as swiglu_op, Act, Output, SwigluCase};
use crate::ops::{
    add, bias, dense_f32, embed, latent_proj, linear, moe_align, moe_combine, moe_gemm, moe_gemv, moe_gemv_fused, norm_rope, output_head,
    qkv, quantize, rmsnorm, rmsnorm_q8_1, rope, router, sampling, swiglu,
};
use crate::quant::WeightType;
use crate::routing::Routing;
use crate::thresholds::{self, Critical, ModelShape, Serving, compositions, envelope_counts, merge};

/// Above this count the routed families run fewer variants (see `BIG_COUNT_SKIP_*`): the
/// counts up to it run every routing and weight type.
pub const BIG_COUNT: u64 = 1 << 16;
const BIG_ROUTING_SKIP: &str = "above 65,536 tokens only uniform and max-padding routings run (one-expert runs at every smaller count)";
const BIG_TABLE_SKIP: &str = "above 65,536 tokens only the q4_0 embedding table runs (q8_0 and f32 share its row indexing)";
const BIG_WTYPE_SKIP: &str = "above 65,536 tokens only q4_0 runs (q8_0 shares the kernel template and its index arithmetic)";
/// The weight formats beyond q8_0/q4_0 (the K-quants) run their own staging, unpacking and block
/// formula, but the row, column and store arithmetic of the same kernels: they run up to the
/// prefill chunk + 1 (every tile tail and the GEMV/GEMM switch lie below), uniform routing.
pub const KQ_MAX_TOKENS: u64 = 4097;
const KQ_SKIP: &str = "K-quant weights run up to 4,097 tokens (above, their kernels' index arithmetic is the q4_0 cases')";
/// MXFP4 is 32 wide like q4_0 but has its own unpack and scale: the K-quants' treatment.
const MXFP4_SKIP: &str = "mxfp4 weights run up to 4,097 tokens (above, their kernels' index arithmetic is the q4_0 cases')";

/// Whether the class's file holds MXFP4 tensors (gpt-oss's experts): only then do the MXFP4
/// cases run. A format a node's models do not use cannot disqualify it (a qwen3moe fleet is not
/// held back by the MXFP4 kernels), and a class that uses it proves it at its own shape.
fn holds_mxfp4(shape: &ModelShape) -> bool {
    let mxfp4 = WeightType::MXFP4.name();
    shape.weights.values().chain(shape.layers.iter().flat_map(|l| l.weights.values())).any(|t| t == mxfp4)
}

/// Where a weight format's cases stop: the legacy formats (q8_0, q4_0) run every count, the
/// others (the K-quants, mxfp4) up to [`KQ_MAX_TOKENS`].
fn wtype_skip(wtype: WeightType) -> Option<(u64, &'static str)> {
    match wtype {
        w if w.is_legacy() => None,
        WeightType::MXFP4 => Some((KQ_MAX_TOKENS, MXFP4_SKIP)),
        _ => Some((KQ_MAX_TOKENS, KQ_SKIP)),
    }
}

/// Deadline of a hang negative control: a fixed case of that size finishes in milliseconds (the
/// fixed twin at 64 tokens: 61.5 ms of GPU half on the H100, its check inline then), and every
/// millisecond past that is the self-test's wall time, twice a run.
pub const HANG_DEADLINE_MS: u64 = 1_000;

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Options {
    /// Device memory the cases may use; bigger cases are skipped with the reason.
    pub memory_budget_bytes: u64,
    /// Run the negative controls (only when no replica is resident: they hang the GPU).
    pub negative_controls: bool,
    /// Skip counts above this (a quick run); `None` runs everything the budget allows.
    pub max_tokens: Option<u64>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Catalogue {
    pub shape: ModelShape,
    pub serving: Serving,
    pub device: String,
    /// Cases to run, in the order to run them (negative controls last).
    pub cases: Vec<Case>,
    /// Derived cases that will not run, and why.
    pub skipped: Vec<(Case, String)>,
}

/// Deadline for a fixed case: generous against the work, tight against a hang.
fn deadline_ms(device_bytes: u64) -> u64 {
    15_000 + device_bytes / 1_000_000 // +1 s per GB touched
}

struct Builder<'a> {
    opts: &'a Options,
    cases: Vec<Case>,
    skipped: Vec<(Case, String)>,
}

impl Builder<'_> {
    #[allow(clippy::too_many_arguments)]
    fn case(&self, kernel: &str, tag: &str, tokens: u64, reasons: Vec<String>, params: OpCase, expect: Expect, device_bytes: u64) -> Case {
        let hang = expect == Expect::Hang;
        Case {
            id: format!("{kernel}/{tag}/t{tokens}"),
            kernel: kernel.into(),
            tokens,
            batch: compositions(tokens).into_iter().next().unwrap_or_default(),
            reasons,
            params,
            expect,
            deadline_ms: if hang { HANG_DEADLINE_MS } else { deadline_ms(device_bytes) },
            device_bytes,
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn push(&mut self, kernel: &str, tag: &str, tokens: u64, reasons: Vec<String>, params: OpCase, expect: Expect, device_bytes: u64) {
        let case = self.case(kernel, tag, tokens, reasons, params, expect, device_bytes);
        if device_bytes > self.opts.memory_budget_bytes {
            let why = format!("needs {:.1} GiB of device memory, budget {:.1} GiB", gib(device_bytes), gib(self.opts.memory_budget_bytes));
            self.skipped.push((case, why));
        } else if let Some(max) = self.opts.max_tokens.filter(|&m| tokens > m) {
            self.skipped.push((case, format!("above --max-tokens {max}")));
        } else {
            self.cases.push(case);
        }
    }

    /// One case per merged count, for a family whose `device_bytes` depends on tokens.
    fn family(&mut self, kernel: &str, tag: &str, counts: Vec<Critical>, params: OpCase, bytes: impl Fn(u64) -> u64) {
        self.family_thinned(kernel, tag, counts, params, bytes, None);
    }

    /// As `family`, but counts above [`BIG_COUNT`] are listed as skipped with `big_skip`.
    fn family_thinned(
        &mut self,
        kernel: &str,
        tag: &str,
        counts: Vec<Critical>,
        params: OpCase,
        bytes: impl Fn(u64) -> u64,
        big_skip: Option<&str>,
    ) {
        self.family_up_to(kernel, tag, counts, params, bytes, big_skip.map(|why| (BIG_COUNT, why)));
    }

    /// As `family`, but counts above `skip.0` are listed as skipped with the reason `skip.1`.
    fn family_up_to(
        &mut self,
        kernel: &str,
        tag: &str,
        counts: Vec<Critical>,
        params: OpCase,
        bytes: impl Fn(u64) -> u64,
        skip: Option<(u64, &str)>,
    ) {
        // A weight format whose blocks cannot tile the case's K (a K-quant's 256 at gpt-oss's
        // 2,880): no matrix of this shape exists in that format, so no count can run.
        let no_such_matrix = weight_width_refusal(&params);
        for (tokens, reasons) in merge(counts) {
            if let Some(why) = &no_such_matrix {
                let case = self.case(kernel, tag, tokens, reasons, params.clone(), Expect::Pass, bytes(tokens));
                self.skipped.push((case, why.clone()));
                continue;
            }
            match skip {
                Some((max, why)) if tokens > max => {
                    let case = self.case(kernel, tag, tokens, reasons, params.clone(), Expect::Pass, bytes(tokens));
                    self.skipped.push((case, why.into()));
                }
                _ => self.push(kernel, tag, tokens, reasons, params.clone(), Expect::Pass, bytes(tokens)),
            }
        }
    }
}

/// Why no weight matrix of the case's shape can exist in its format, if none can: each weight
/// row of K values must be whole blocks of the format (`WeightType::check_row_width`).
fn weight_width_refusal(params: &OpCase) -> Option<String> {
    let rows: Vec<(WeightType, u32)> = match params {
        OpCase::MoeGemm(c) => vec![(c.wtype, c.k)],
        OpCase::MoeGemv(c) => vec![(c.wtype, c.k)],
        OpCase::MoeGemvSwiglu(c) | OpCase::MoeGemvCombine(c) => vec![(c.dims.wtype, c.dims.hidden), (c.dims.wtype, c.dims.ffn)],
        OpCase::OutputHead(c) => vec![(c.wtype, c.hidden)],
        OpCase::Linear(c) => vec![(c.wtype, c.k)],
        OpCase::Qkv(c) => c.wtype.iter().map(|&w| (w, c.k)).collect(),
        OpCase::LatentProj(c) => vec![(c.wtype, c.k)],
        _ => Vec::new(),
    };
    rows.into_iter()
        .find_map(|(w, k)| w.check_row_width(u64::from(k)))
        .map(|why| format!("no matrix of this shape exists in this format: {why}"))
}

fn gib(b: u64) -> f64 {
    b as f64 / (1u64 << 30) as f64
}

/// Derives every case for `shape` on a device with `limits`.
pub fn derive(shape: &ModelShape, serving: &Serving, limits: &DeviceLimits, opts: &Options) -> Catalogue {
    let mut b = Builder { opts, cases: Vec::new(), skipped: Vec::new() };
    let common = envelope_counts(serving, shape);
    let grid_counts = thresholds::routed_grid_counts(limits);
    let own_k_grid: Vec<Critical> = grid_counts.iter().filter(|(k, _)| *k == shape.top_k).flat_map(|(_, v)| v.clone()).collect();
    let tails = thresholds::tile_tails(GEMM_TILE_M as u64, false, &[1, 2, 128], "expert segment tile");
    let (e, k) = (shape.experts, shape.top_k);
    // The weight formats the families run: every kernel format, MXFP4 where the class holds it.
    let uses = |w: WeightType| w != WeightType::MXFP4 || holds_mxfp4(shape);
    let with = |own: Vec<Critical>| -> Vec<Critical> {
        let mut v = own;
        v.extend(common.iter().cloned());
        v.extend(own_k_grid.iter().cloned());
        v
    };
    // The routed families also cross the expert segments' tile tails.
    let routed = |own: Vec<Critical>| -> Vec<Critical> {
        let mut v = with(own);
        v.extend(tails.iter().cloned());
        v
    };

    // Router: softmax with renormalisation (qwen3moe), sigmoid without (DeepSeek-style), and
    // all-equal logits (ties: every token routes to the same experts).
    for (scoring, renormalize, ties, tag) in [
        (Scoring::Softmax, true, false, "softmax-renorm"),
        (Scoring::Sigmoid, false, false, "sigmoid"),
        (Scoring::Softmax, true, true, "softmax-ties"),
    ] {
        let c = RouterCase { experts: e, top_k: k, scoring, renormalize, ties };
        let counts = routed(router::critical_counts(&c, limits));
        b.family(router::KERNEL, &format!("k{k}/{tag}"), counts, OpCase::Router(c), |t| router::device_bytes(t, &c));
    }
    // Top-k-then-softmax (gpt-oss), where a layer routes so.
    if any_layer_with(shape, "ffn.gating", |g| g.starts_with("top_k_then_softmax")) {
        let c = RouterCase { experts: e, top_k: k, scoring: Scoring::TopKSoftmax, renormalize: true, ties: false };
        let counts = routed(router::critical_counts(&c, limits));
        b.family(router::KERNEL, &format!("k{k}/topk-softmax"), counts, OpCase::Router(c), |t| router::device_bytes(t, &c));
    }

    for routing in [Routing::Uniform, Routing::OneExpert, Routing::MaxPadding] {
        let r = routing.name();
        let thin_routing = (routing == Routing::OneExpert).then_some(BIG_ROUTING_SKIP);
        let c = AlignCase { experts: e, top_k: k, tile: GEMM_TILE_M, routing };
        let counts = routed(moe_align::critical_counts(&c, limits));
        b.family_thinned(
            moe_align::KERNEL,
            &format!("k{k}/{r}"),
            counts,
            OpCase::MoeAlign(c),
            |t| moe_align::device_bytes(t, &c),
            thin_routing,
        );

        let c = QuantizeCase { k: shape.hidden, experts: e, top_k: k, tile: GEMM_TILE_M, routing, gather: true };
        let counts = routed(quantize::critical_counts(&c, limits));
        b.family_thinned(
            quantize::KERNEL,
            &format!("gather/k{k}/{r}"),
            counts,
            OpCase::Quantize(c),
            |t| quantize::device_bytes(t, &c),
            thin_routing,
        );

        for wtype in WeightType::LEGACY {
            // Gate/up (hidden -> expert width) and down (expert width -> hidden).
            for (n, kk, proj) in [(shape.expert_ffn, shape.hidden, "up"), (shape.hidden, shape.expert_ffn, "down")] {
                let c = GemmCase { experts: e, top_k: k, n, k: kk, wtype, routing };
                let counts = routed(moe_gemm::critical_counts(&c, limits));
                let thin = thin_routing.or((wtype == WeightType::Q8_0).then_some(BIG_WTYPE_SKIP));
                b.family_thinned(
                    moe_gemm::KERNEL,
                    &format!("{wtype}/{proj}/k{k}/{r}"),
                    counts,
                    OpCase::MoeGemm(c),
                    |t| moe_gemm::device_bytes(t, &c),
                    thin,
                );
            }
        }
    }

    // The K-quant routed GEMM, uniform routing (the alignment is the legacy cases' business), in
    // the projections a Q4_K_M file puts them in: q4_K gate/up and down, q5_K gate/up, q6_K down
    // (K = 768: a partial K step of the 16-block tile); mxfp4 (gpt-oss's experts) both ways.
    let (up, down) = ((shape.expert_ffn, shape.hidden, "up"), (shape.hidden, shape.expert_ffn, "down"));
    for (wtype, (n, kk, proj)) in [
        (WeightType::Q4K, up),
        (WeightType::Q4K, down),
        (WeightType::Q5K, up),
        (WeightType::Q6K, down),
        (WeightType::MXFP4, up),
        (WeightType::MXFP4, down),
    ]
    .into_iter()
    .filter(|(w, _)| uses(*w))
    {
        let c = GemmCase { experts: e, top_k: k, n, k: kk, wtype, routing: Routing::Uniform };
        let counts = routed(moe_gemm::critical_counts(&c, limits));
        let (tag, bytes) = (format!("{wtype}/{proj}/k{k}/uniform"), |t| moe_gemm::device_bytes(t, &c));
        b.family_up_to(moe_gemm::KERNEL, &tag, counts, OpCase::MoeGemm(c), bytes, wtype_skip(wtype));
    }

    // The dense (non-gathered) quantize feeding the latent projection.
    if let Some(l) = shape.latent {
        let c = QuantizeCase { k: l.k, experts: e, top_k: k, tile: GEMM_TILE_M, routing: Routing::Uniform, gather: false };
        let mut counts = with(quantize::critical_counts(&c, limits));
        counts.extend(thresholds::tile_tails(64, false, &[1, 2], "row tile"));
        b.family(quantize::KERNEL, "dense", counts, OpCase::Quantize(c), |t| quantize::device_bytes(t, &c));
    }

    // Routed GEMV: decode sizes, plus every top_k's grid.z point at full shape (the fixed
    // kernel must pass where the naive one fails).
    for wtype in WeightType::ALL.into_iter().filter(|&w| uses(w)) {
        let c = GemvCase { experts: e, top_k: k, n: shape.expert_ffn, k: shape.hidden, wtype, routing: Routing::Uniform };
        let mut counts = with(moe_gemv::critical_counts(&c, limits));
        counts.extend((1..=16).map(|t| Critical::new(t, "decode batch")));
        let skip = wtype_skip(wtype);
        b.family_up_to(moe_gemv::KERNEL, &format!("{wtype}/k{k}"), counts, OpCase::MoeGemv(c), |t| moe_gemv::device_bytes(t, &c), skip);
    }
    for (tk, counts) in &grid_counts {
        if *tk == k || *tk > e {
            continue;
        }
        let c =
            GemvCase { experts: e, top_k: *tk, n: shape.expert_ffn, k: shape.hidden, wtype: WeightType::Q4_0, routing: Routing::Uniform };
        b.family(moe_gemv::KERNEL, &format!("q4_0/k{tk}"), counts.clone(), OpCase::MoeGemv(c), |t| moe_gemv::device_bytes(t, &c));
    }

    let c = CombineCase { top_k: k, n: shape.hidden };
    let counts = routed(moe_combine::critical_counts(&c, limits));
    b.family(moe_combine::KERNEL, &format!("k{k}"), counts, OpCase::MoeCombine(c), |t| moe_combine::device_bytes(t, &c));

    // The fused decode GEMVs (gate/up with the activation and q8_1 in the epilogue; down with the
    // weighted combine): the decode batches, their index points and the envelope, every weight
    // format (the K-quants up to KQ_MAX_TOKENS), under the epilogue the layers have (the experts'
    // biases and clamped SwiGLU of gpt-oss). Each case also runs the unfused chain and must match
    // it bit for bit.
    let epilogue = Epilogue { act: clamped_act(shape).unwrap_or_default(), biased: any_layer(shape, "ffn.biases", "true") };
    for wtype in WeightType::ALL.into_iter().filter(|&w| uses(w)) {
        let dims = FfnDims { experts: e, top_k: k, hidden: shape.hidden, ffn: shape.expert_ffn, wtype };
        let c = FusedCase { dims, routing: Routing::Uniform, epilogue };
        let skip = wtype_skip(wtype);
        let decode = || (1..=16).map(|t| Critical::new(t, "decode batch"));
        let mut counts = with(moe_gemv_fused::gate_up_critical_counts(&c, limits));
        counts.extend(decode());
        let tag = match epilogue.tag() {
            Some(ep) => format!("{wtype}/k{k}/{ep}"),
            None => format!("{wtype}/k{k}"),
        };
        let bytes = |t| moe_gemv_fused::gate_up_device_bytes(t, &c);
        b.family_up_to(moe_gemv_fused::GATE_UP_KERNEL, &tag, counts, OpCase::MoeGemvSwiglu(c), bytes, skip);
        let mut counts = with(moe_gemv_fused::combine_critical_counts(&c, limits));
        counts.extend(decode());
        let bytes = |t| moe_gemv_fused::combine_device_bytes(t, &c);
        b.family_up_to(moe_gemv_fused::COMBINE_KERNEL, &tag, counts, OpCase::MoeGemvCombine(c), bytes, skip);
    }

    // The dense per-token kernels: embedding lookup per table type, the hidden RMS norm and the
    // per-head Q/K norms, RoPE on Q and on K over a batch of 4 sequences (positions restart).
    for table in TableType::ALL {
        let c = EmbedCase { vocab: shape.vocab, hidden: shape.hidden, table };
        let thin = (table != TableType::Q4_0).then_some(BIG_TABLE_SKIP);
        let counts = with(embed::critical_counts(&c, limits));
        b.family_thinned(embed::KERNEL, &format!("{table}"), counts, OpCase::Embed(c), |t| embed::device_bytes(t, &c), thin);
    }
    let a = shape.attention;
    for (tag, width, rows_per_token) in [("hidden", shape.hidden, 1), ("q-heads", a.head_dim, a.heads), ("k-heads", a.head_dim, a.kv_heads)]
    {
        let c = RmsNormCase { width, rows_per_token, eps: a.norm_eps };
        b.family(rmsnorm::KERNEL, tag, with(rmsnorm::critical_counts(&c, limits)), OpCase::RmsNorm(c), |t| rmsnorm::device_bytes(t, &c));
    }
    // The hidden norm with its q8_1 quantization (attn_norm, ffn_norm): the plain norm's counts
    // and the blocks' 2^31 point.
    let c = RmsNormCase { width: shape.hidden, rows_per_token: 1, eps: a.norm_eps };
    b.family(rmsnorm_q8_1::KERNEL, "hidden", with(rmsnorm_q8_1::critical_counts(&c, limits)), OpCase::RmsNormQ8_1(c), |t| {
        rmsnorm_q8_1::device_bytes(t, &c)
    });
    for (tag, heads) in [("q", a.heads), ("k", a.kv_heads)] {
        let c = RopeCase { heads, head_dim: a.head_dim, theta: a.rope_theta, sequences: 4, yarn: None };
        b.family(rope::KERNEL, &format!("{tag}/seq4"), with(rope::critical_counts(&c, limits)), OpCase::Rope(c), |t| {
            rope::device_bytes(t, &c)
        });
    }
    // YaRN RoPE (gpt-oss), once per distinct scaling of the shape's layers, on Q and on K.
    let mut yarns: Vec<(f32, RopeYarn)> = Vec::new();
    for y in shape.layers.iter().filter_map(|l| l.kind.get("attention.rope").and_then(|v| RopeYarn::parse_kind(v))) {
        if !yarns.contains(&y) {
            yarns.push(y);
        }
    }
    for (theta, yarn) in yarns {
        for (tag, heads) in [("q", a.heads), ("k", a.kv_heads)] {
            let c = RopeCase { heads, head_dim: a.head_dim, theta, sequences: 4, yarn: Some(yarn) };
            let counts = with(rope::critical_counts(&c, limits));
            b.family(rope::KERNEL, &format!("yarn{}/{tag}/seq4", yarn.factor), counts, OpCase::Rope(c), |t| rope::device_bytes(t, &c));
        }
    }
    // The per-head Q/K norm fused with RoPE, on Q and on K (each case also runs rmsnorm and rope
    // and must match them bit for bit).
    for (tag, heads) in [("q", a.heads), ("k", a.kv_heads)] {
        let c = NormRopeCase { heads, head_dim: a.head_dim, eps: a.norm_eps, theta: a.rope_theta, sequences: 4 };
        let counts = with(norm_rope::critical_counts(&c, limits));
        b.family(norm_rope::KERNEL, &format!("{tag}/seq4"), counts, OpCase::NormRope(c), |t| norm_rope::device_bytes(t, &c));
    }

    // Output head: full logits [T, vocab] (the parity tests; at vocab 151,936 they pass 2^31
    // elements at 14,135 tokens) in both weight types, and the prefill mode that computes only
    // the last position of each sequence: 4 sequences (the GEMV path, with an index list) and
    // 100 (the GEMM path with an index list).
    // The K-quant heads (q6_K is the usual output.weight of a Q4_K_M file) and an mxfp4 one (both
    // paths: the GEMV and the GEMM tile) up to KQ_MAX_TOKENS.
    for (wtype, sequences, tag) in [
        (WeightType::Q8_0, None, "q8_0/full"),
        (WeightType::Q4_0, None, "q4_0/full"),
        (WeightType::Q4_0, Some(4), "q4_0/last-of-4"),
        (WeightType::Q8_0, Some(100), "q8_0/last-of-100"),
        (WeightType::Q6K, None, "q6_K/full"),
        (WeightType::Q4K, Some(4), "q4_K/last-of-4"),
        (WeightType::MXFP4, None, "mxfp4/full"),
    ]
    .into_iter()
    .filter(|(w, ..)| uses(*w))
    {
        let c = HeadCase { hidden: shape.hidden, vocab: shape.vocab, wtype, sequences };
        let mut counts = with(output_head::critical_counts(&c, limits));
        counts.extend(thresholds::tile_tails(output_head::TILE_M, false, &[1, 2, 128], "output_head row tile"));
        let skip = wtype_skip(wtype);
        b.family_up_to(output_head::KERNEL, tag, counts, OpCase::OutputHead(c), |t| output_head::device_bytes(t, &c), skip);
    }

    // Dense projections (the head's kernels under `linear`): q, k/v and o of the attention, in
    // the K-quant formats and mxfp4 (q8_0/q4_0 run the same kernels as the head's cases). q4_K on
    // the q projection runs every count.
    let (q_width, kv_width) = (a.heads * a.head_dim, a.kv_heads * a.head_dim);
    for (n, kk, wtype, tag) in [
        (q_width, shape.hidden, WeightType::Q4K, "q4_K/q"),
        (q_width, shape.hidden, WeightType::Q5K, "q5_K/q"),
        (q_width, shape.hidden, WeightType::Q6K, "q6_K/q"),
        (kv_width, shape.hidden, WeightType::Q6K, "q6_K/kv"),
        (shape.hidden, q_width, WeightType::Q4K, "q4_K/o"),
        (q_width, shape.hidden, WeightType::MXFP4, "mxfp4/q"),
    ]
    .into_iter()
    .filter(|(_, _, w, _)| uses(*w))
    {
        let c = LinearCase { n, k: kk, wtype };
        let mut counts = with(linear::critical_counts(&c, limits));
        counts.extend(thresholds::tile_tails(output_head::TILE_M, false, &[1, 2, 128], "linear row tile"));
        let skip = if tag == "q4_K/q" { None } else { wtype_skip(wtype) };
        b.family_up_to(linear::KERNEL, tag, counts, OpCase::Linear(c), |t| linear::device_bytes(t, &c), skip);
    }
    // q, k and v as one decode launch (`qkv`): the fused GEMV for 1..=8 rows (every count),
    // `linear`'s launches above; each case also runs `linear` per matrix and must match it bit
    // for bit. q8_0 everywhere, and the Q4_K_M mix (v in q6_K) up to KQ_MAX_TOKENS.
    for (wtype, tag) in [([WeightType::Q8_0; 3], "q8_0"), ([WeightType::Q4K, WeightType::Q4K, WeightType::Q6K], "q4_K-q6_K")] {
        let c = QkvCase { k: shape.hidden, n: [q_width, kv_width, kv_width], wtype };
        let skip = (wtype[0] != WeightType::Q8_0).then_some((KQ_MAX_TOKENS, KQ_SKIP));
        b.family_up_to(qkv::KERNEL, tag, with(qkv::critical_counts(&c, limits)), OpCase::Qkv(c), |t| qkv::device_bytes(t, &c), skip);
    }

    // Glue between the big ops: SwiGLU over the routed pairs (f32 from separate gate/up; q8_1
    // from a fused gate/up, gathered into expert order as the down projection's GEMM reads it, and
    // in pair order, which differs only by the gather), the residual add, the router's logits.
    for (layout, output, tag, skip) in [
        (swiglu_op::Layout::Separate, Output::F32, "f32", None),
        (swiglu_op::Layout::Fused, Output::Q8_1Sorted { experts: e }, "fused-q8_1-sorted", None),
        (
            swiglu_op::Layout::Separate,
            Output::Q8_1,
            "q8_1",
            Some((KQ_MAX_TOKENS, "pair-order q8_1 runs up to 4,097 tokens (the sorted cases share its kernel)")),
        ),
    ] {
        let c = SwigluCase { width: shape.expert_ffn, rows_per_token: k, layout, output, act: Act::SwiGlu };
        let counts = routed(swiglu::critical_counts(&c, limits));
        b.family_up_to(swiglu::KERNEL, &format!("{tag}/k{k}"), counts, OpCase::Swiglu(c), |t| swiglu::device_bytes(t, &c), skip);
    }
    // The clamped activation (gpt-oss), where a layer has it: the engine's two launches, q8_1 in
    // pair order (the GEMV path's unfused chain) and gathered into expert order (the GEMM path).
    if let Some(act) = clamped_act(shape) {
        for (output, tag) in [(Output::Q8_1, "clamped-q8_1"), (Output::Q8_1Sorted { experts: e }, "clamped-q8_1-sorted")] {
            let c = SwigluCase { width: shape.expert_ffn, rows_per_token: k, layout: swiglu_op::Layout::Separate, output, act };
            let counts = routed(swiglu::critical_counts(&c, limits));
            b.family(swiglu::KERNEL, &format!("{tag}/k{k}"), counts, OpCase::Swiglu(c), |t| swiglu::device_bytes(t, &c));
        }
    }
    let c = AddCase { width: shape.hidden };
    b.family(add::KERNEL, "hidden", with(add::critical_counts(&c, limits)), OpCase::Add(c), |t| add::device_bytes(t, &c));
    // The q, k/v and o projection biases, where a layer has them (gpt-oss).
    if any_layer(shape, "attention.biases", "true") {
        for (tag, width) in [("q", q_width), ("kv", kv_width), ("o", shape.hidden)] {
            let c = BiasCase { width, picks: None };
            b.family(bias::KERNEL, tag, with(bias::critical_counts(&c, limits)), OpCase::Bias(c), |t| bias::device_bytes(t, &c));
        }
    }
    // The router's and the picked experts' biases, where a layer has them (gpt-oss): a row of E
    // on the logits; gate/up rows of F and down rows of H by each pair's expert.
    if any_layer(shape, "ffn.biases", "true") {
        let c = BiasCase { width: e, picks: None };
        b.family(bias::KERNEL, "router", with(bias::critical_counts(&c, limits)), OpCase::Bias(c), |t| bias::device_bytes(t, &c));
        for (tag, width) in [("gate-up", shape.expert_ffn), ("down", shape.hidden)] {
            let c = BiasCase { width, picks: Some(Picks { experts: e, top_k: k }) };
            let counts = routed(bias::critical_counts(&c, limits));
            b.family(bias::KERNEL, &format!("{tag}/k{k}"), counts, OpCase::Bias(c), |t| bias::device_bytes(t, &c));
        }
    }
    let c = DenseF32Case { n: e, k: shape.hidden };
    let counts = with(dense_f32::critical_counts(&c, limits));
    b.family(dense_f32::KERNEL, "router-logits", counts, OpCase::DenseF32(c), |t| dense_f32::device_bytes(t, &c));

    // Sampling: one row per sampled position over the parameter table of `sampling::row_params`
    // (greedy, top-k, top-p). Spread 8: peaked and flat regions with natural ties; spread 0:
    // every logit equal, every choice by id order.
    for (spread, tag) in [(8.0, "spread8"), (0.0, "ties")] {
        let c = SamplingCase { vocab: shape.vocab, spread };
        let mut counts = with(sampling::critical_counts(&c, limits));
        counts.extend((1..=16).map(|t| Critical::new(t, "decode batch")));
        b.family(sampling::KERNEL, tag, counts, OpCase::Sampling(c), |t| sampling::device_bytes(t, &c));
    }

    attention_cases(&mut b, shape, serving, limits);

    // Latent projection: every tail of the first two 64-row tiles, and around larger ones.
    if let Some(l) = shape.latent {
        for wtype in WeightType::LEGACY {
            let c = LatentCase { k: l.k, width: l.width, groups: l.groups, wtype };
            let mut counts = with(latent_proj::critical_counts(&c, limits));
            counts.extend(thresholds::tile_tails(64, wtype == WeightType::Q4_0, &[1, 2, 128], "latent row tile"));
            b.family(latent_proj::KERNEL, &format!("{wtype}"), counts, OpCase::LatentProj(c), |t| latent_proj::device_bytes(t, &c));
        }
    }

    if opts.negative_controls {
        negative_controls(&mut b, shape, limits, &grid_counts);
    }
    let mut cases = b.cases;
    // Small first (a broken kernel shows up early), negative controls last (they hang).
    cases.sort_by_key(|c| (c.params.is_negative_control(), c.device_bytes));
    Catalogue { shape: shape.clone(), serving: *serving, device: limits.name.clone(), cases, skipped: b.skipped }
}

/// Attention over the KV cache (the batch's kv_store included) at the model's shape, one family
/// per batch layout: a prompt (every tail of the query tile), 4 prompts, many 61-token prompts
/// (Q/O offsets past 2^31), a chunk continuing a sequence, the chunk ending at the context, decode
/// steps through the split kernels and through the prefill kernel (cache offsets past 2^31 at 103
/// slots of 40,960), a prompt beside decode steps. Then the other head dims and a GQA group of 3
/// at a few counts, so that every kernel instance runs. Attention is quadratic in a sequence:
/// prompts stop at the serving envelope, the context is reached by a chunk continuing a sequence.
/// All of it once per attention variant of the shape's layers ([`attention_variants`]): a
/// sliding window adds its edges to every layout's counts and a chunk continuing a sequence
/// inside the first window; the plain variant's families keep their tags. Each runs the prefill
/// kernel the engine would (`AttentionCase::prefill_kernel`).
fn attention_cases(b: &mut Builder, shape: &ModelShape, serving: &Serving, limits: &DeviceLimits) {
    for (window, sinks) in attention_variants(shape) {
        attention_variant_cases(b, shape, serving, limits, window, sinks);
    }
}

/// The clamped activation of the shape's layers, if any has one.
fn clamped_act(shape: &ModelShape) -> Option<Act> {
    shape.layers.iter().filter_map(|l| l.kind.get("ffn.activation").and_then(|v| parse_clamped(v))).next()
}

/// The clamped activation of a layer kind's `ffn.activation` value,
/// `clamped_swiglu(alpha=…,limit=…)` (the engine's `LayerSpec::fields`).
fn parse_clamped(value: &str) -> Option<Act> {
    let body = value.strip_prefix("clamped_swiglu(")?.strip_suffix(')')?;
    let get = |key: &str| body.split(',').find_map(|kv| kv.strip_prefix(key)?.strip_prefix('=')?.parse::<f32>().ok());
    Some(Act::Clamped { alpha: get("alpha")?, limit: get("limit")? })
}

/// Whether any of the shape's layers has `value` at `key` in its kind (what differs from the
/// plain qwen3moe layer: gpt-oss's biases, gating, activation, RoPE).
fn any_layer(shape: &ModelShape, key: &str, value: &str) -> bool {
    any_layer_with(shape, key, |v| v == value)
}

/// Whether any of the shape's layers has a value at `key` in its kind that `pred` accepts.
fn any_layer_with(shape: &ModelShape, key: &str, pred: impl Fn(&str) -> bool) -> bool {
    shape.layers.iter().any(|l| l.kind.get(key).is_some_and(|v| pred(v)))
}

/// The distinct (sliding window, sinks) pairs of the shape's layers, from each layer's kind
/// (`attention.window`: a count or `none`; `attention.sinks`: `true`), in order; (0, false)
/// for a shape without layers or whose layers are all plain.
pub fn attention_variants(shape: &ModelShape) -> Vec<(u32, bool)> {
    let mut v: Vec<(u32, bool)> = shape
        .layers
        .iter()
        .map(|l| {
            let window = l.kind.get("attention.window").and_then(|w| w.parse::<u32>().ok()).unwrap_or(0);
            (window, l.kind.get("attention.sinks").is_some_and(|s| s == "true"))
        })
        .collect();
    v.sort_unstable();
    v.dedup();
    if v.is_empty() {
        v.push((0, false));
    }
    v
}

/// A variant's families, their tags prefixed with `w{window}` and `sinks` when it has them.
fn attention_variant_cases(b: &mut Builder, shape: &ModelShape, serving: &Serving, limits: &DeviceLimits, window: u32, sinks: bool) {
    let a = shape.attention;
    let prefix = match (window, sinks) {
        (0, false) => String::new(),
        (0, true) => "sinks/".to_string(),
        (w, false) => format!("w{w}/"),
        (w, true) => format!("w{w}-sinks/"),
    };
    let envelope: Vec<Critical> = [serving.prefill_chunk, serving.max_batch_tokens]
        .into_iter()
        .flat_map(|n| [n - 1, n, n + 1].map(|t| Critical::new(t, format!("serving envelope {n} -1/0/+1"))))
        .collect();
    let chunk = serving.prefill_chunk;
    let model = AttentionCase {
        heads: a.heads,
        kv_heads: a.kv_heads,
        head_dim: a.head_dim,
        context: shape.context,
        layout: Layout::Prompts { sequences: 1 },
        route: DecodeRoute::Split,
        block_size: attention::DEFAULT_BLOCK_SIZE,
        window,
        sinks,
        prefill: None,
    };
    // A chunk continuing a sequence inside its first window (the plain variant has none).
    let in_window = (window > 10).then(|| (Layout::Continue { cached: window / 2 + 5 }, DecodeRoute::Split, "continue-in-window", vec![]));
    for (layout, route, tag, extra) in [
        (Layout::Prompts { sequences: 1 }, DecodeRoute::Split, "prompt", envelope.clone()),
        (Layout::Prompts { sequences: 4 }, DecodeRoute::Split, "prompts4", envelope.clone()),
        (Layout::Runs { len: 61 }, DecodeRoute::Split, "runs61", vec![]),
        (Layout::Continue { cached: chunk as u32 + 37 }, DecodeRoute::Split, "continue", envelope[..3].to_vec()),
        (Layout::ContextEnd, DecodeRoute::Split, "context-end", vec![Critical::new(chunk, "a prefill chunk ending at the context")]),
        (Layout::Decode, DecodeRoute::Split, "decode", vec![]),
        (Layout::Decode, DecodeRoute::Prefill, "decode-via-prefill", vec![]),
        (Layout::Mixed, DecodeRoute::Split, "mixed", envelope.clone()),
    ]
    .into_iter()
    .chain(in_window)
    {
        let c = AttentionCase { layout, route, ..model };
        let mut counts = attention::critical_counts(&c, limits);
        counts.extend(extra);
        b.family(attention::KERNEL, &format!("{prefix}{tag}"), counts, OpCase::Attention(c), |t| attention::device_bytes(t, &c));
    }
    for (heads, kv_heads, head_dim) in [(8, 2, 64), (16, 2, 256), (12, 4, 128)] {
        let other = AttentionCase { heads, kv_heads, head_dim, context: 4096, ..model };
        let tile = attention::prefill_tile(head_dim).map_or(1, |t| t.rows);
        for (layout, counts) in
            [(Layout::Prompts { sequences: 1 }, vec![1, 2, tile - 1, tile, tile + 1, 2 * tile + 1, 1000]), (Layout::Decode, vec![1, 9, 10])]
        {
            let c = AttentionCase { layout, ..other };
            let tag = format!("h{heads}-kv{kv_heads}-d{head_dim}/{}", if c.layout == Layout::Decode { "decode" } else { "prompt" });
            let counts: Vec<Critical> = counts
                .into_iter()
                .map(|t| Critical::new(t, format!("head_dim {head_dim}, GQA group {}: every kernel instance runs", heads / kv_heads)))
                .collect();
            b.family(attention::KERNEL, &format!("{prefix}{tag}"), counts, OpCase::Attention(c), |t| attention::device_bytes(t, &c));
        }
    }
}

fn negative_controls(b: &mut Builder, shape: &ModelShape, limits: &DeviceLimits, grid_counts: &[(u32, Vec<Critical>)]) {
    let z = limits.max_grid_dim[2] as u64;
    // grid.z = tokens x top_k: passes at floor(65535 / top_k), rejected one token later.
    for (tk, counts) in grid_counts {
        if *tk > shape.experts {
            continue;
        }
        let c = GemvCase {
            experts: shape.experts,
            top_k: *tk,
            n: shape.expert_ffn,
            k: shape.hidden,
            wtype: WeightType::Q4_0,
            routing: Routing::Uniform,
        };
        for cr in counts {
            let expect =
                if cr.tokens * *tk as u64 > z { Expect::LaunchError { kernel: moe_gemv::NEG_GRIDZ_KERNEL.into() } } else { Expect::Pass };
            let bytes = moe_gemv::device_bytes(cr.tokens, &c);
            b.push("neg_gemv_gridz", &format!("q4_0/k{tk}"), cr.tokens, vec![cr.reason.clone()], OpCase::NegGemvGridZ(c), expect, bytes);
        }
    }
    // Tail lanes skipping the shuffles: hangs whenever a warp holds both real and spare rows;
    // a full tile has none and passes.
    if let Some(l) = shape.latent {
        let c = LatentCase { k: l.k, width: l.width, groups: l.groups, wtype: WeightType::Q8_0 };
        for (tokens, expect, why) in [
            (1, Expect::Hang, "1 real row in a 64-row tile"),
            (63, Expect::Hang, "63 real rows in a 64-row tile"),
            (64, Expect::Pass, "full tile: no tail lanes, so the broken epilogue is harmless"),
        ] {
            let bytes = latent_proj::device_bytes(tokens, &c);
            b.push("neg_latent_tailskip", "q8_0", tokens, vec![why.into()], OpCase::NegLatentTailSkip(c), expect, bytes);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::thresholds::LayerSpec;

    fn opts() -> Options {
        Options { memory_budget_bytes: u64::MAX, negative_controls: false, max_tokens: None }
    }

    fn layer(count: u32, kind: &[(&str, &str)]) -> LayerSpec {
        LayerSpec { count, weights: BTreeMap::new(), kind: kind.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect() }
    }

    /// (id, tokens) of every attention case, derived and skipped alike.
    fn attention_ids(shape: &ModelShape) -> Vec<(String, u64)> {
        let cat = derive(shape, &Serving::default(), &DeviceLimits::h200(), &opts());
        let mut v: Vec<(String, u64)> = cat
            .cases
            .iter()
            .chain(cat.skipped.iter().map(|(c, _)| c))
            .filter(|c| c.kernel == attention::KERNEL)
            .map(|c| (c.id.clone(), c.tokens))
            .collect();
        v.sort();
        v
    }

    /// MXFP4 runs, where the class holds MXFP4 tensors, in every weight-format family (the
    /// routed GEMV and GEMM, the fused decode GEMVs, the head and `linear`), uniform routing
    /// only, up to KQ_MAX_TOKENS (above, listed as skipped with its reason), at qwen3's widths
    /// and at gpt-oss's 2,880 alike (32-wide blocks tile it); the routed GEMM's routings and the
    /// latent projection stay q8_0/q4_0. A class without MXFP4 tensors derives no MXFP4 case.
    #[test]
    fn mxfp4_cases_run_up_to_the_k_quant_limit_in_every_weight_family() {
        let mxfp4_experts = || {
            let weights = [("ffn_gate_exps.weight".to_string(), "mxfp4".to_string())].into();
            vec![LayerSpec { count: 2, weights, kind: BTreeMap::new() }]
        };
        let mut qwen = ModelShape::qwen3_30b_a3b();
        qwen.layers = mxfp4_experts();
        let mut oss = qwen.clone();
        oss.hidden = 2880;
        oss.expert_ffn = 2880;
        let plain = derive(&ModelShape::qwen3_30b_a3b(), &Serving::default(), &DeviceLimits::h200(), &opts());
        assert!(plain.cases.iter().chain(plain.skipped.iter().map(|(c, _)| c)).all(|c| !c.id.contains("mxfp4")));
        for shape in [qwen, oss] {
            let cat = derive(&shape, &Serving::default(), &DeviceLimits::h200(), &opts());
            let mx = |id: &str| id.contains("/mxfp4/") || id.starts_with("output_head/mxfp4") || id.starts_with("linear/mxfp4");
            let run: Vec<&Case> = cat.cases.iter().filter(|c| mx(&c.id)).collect();
            for prefix in [
                "moe_gemv/mxfp4/k8/",
                "moe_gemm/mxfp4/up/k8/uniform/",
                "moe_gemm/mxfp4/down/k8/uniform/",
                "moe_gemv_swiglu_q8_1/mxfp4/k8/",
                "moe_gemv_combine/mxfp4/k8/",
                "output_head/mxfp4/full/",
                "linear/mxfp4/q/",
            ] {
                assert!(run.iter().any(|c| c.id.starts_with(prefix)), "no {prefix} case at hidden {}", shape.hidden);
            }
            assert!(run.iter().all(|c| c.tokens <= KQ_MAX_TOKENS && c.id.contains("mxfp4")));
            assert!(!run.iter().any(|c| c.id.contains("one-expert") || c.id.contains("max-padding") || c.kernel == latent_proj::KERNEL));
            let over: Vec<&(Case, String)> = cat.skipped.iter().filter(|(c, _)| mx(&c.id)).collect();
            assert!(!over.is_empty() && over.iter().all(|(c, why)| c.tokens > KQ_MAX_TOKENS && why == MXFP4_SKIP));
        }
    }

    /// gpt-oss's layer kinds add the bias, top-k-then-softmax router, YaRN rope and clamped
    /// SwiGLU families, under tags of their own; a qwen3moe shape derives none of them.
    #[test]
    fn gpt_oss_kinds_add_their_families_and_qwen_none() {
        let ids = |shape: &ModelShape| -> Vec<String> {
            let cat = derive(shape, &Serving::default(), &DeviceLimits::h200(), &opts());
            cat.cases.iter().chain(cat.skipped.iter().map(|(c, _)| c)).map(|c| c.id.clone()).collect()
        };
        let new = ["bias/", "topk-softmax", "yarn", "clamped-"];
        let qwen = ModelShape::qwen3_30b_a3b();
        assert!(ids(&qwen).iter().all(|id| !new.iter().any(|n| id.contains(n))));
        let mut oss = ModelShape::qwen3_30b_a3b();
        let kind = [
            ("attention.rope", "yarn(theta=150000,factor=32,orig_ctx=4096,beta_fast=32,beta_slow=1,attn_factor=1)"),
            ("attention.biases", "true"),
            ("ffn.gating", "top_k_then_softmax(scale=none)"),
            ("ffn.activation", "clamped_swiglu(alpha=1.702,limit=7)"),
            ("ffn.biases", "true"),
        ];
        oss.layers = vec![layer(2, &kind)];
        let got = ids(&oss);
        for family in [
            "bias/q/",
            "bias/kv/",
            "bias/o/",
            "bias/router/",
            "bias/gate-up/k8/",
            "bias/down/k8/",
            "router/k8/topk-softmax/",
            "rope/yarn32/q/seq4/",
            "rope/yarn32/k/seq4/",
            "swiglu/clamped-q8_1/k8/",
            "swiglu/clamped-q8_1-sorted/k8/",
            "moe_gemv_swiglu_q8_1/q8_0/k8/biased-clamped/",
            "moe_gemv_combine/q8_0/k8/biased-clamped/",
        ] {
            assert!(got.iter().any(|id| id.starts_with(family)), "{family} missing");
        }
        assert_eq!(parse_clamped("clamped_swiglu(alpha=1.702,limit=7)"), Some(Act::GPT_OSS));
        assert_eq!(parse_clamped("swiglu"), None);
    }

    /// At gpt-oss's hidden width (2,880 = 90 blocks of 32, not a multiple of 256) no K-quant
    /// matrix can exist: those cases are listed as skipped with the reason, every count of them,
    /// and none is left to run (on a GPU they were rejected by their plans and failed the node).
    /// The 32-wide formats still run; at qwen3's widths the K-quants still run.
    #[test]
    fn k_quant_cases_at_widths_no_k_quant_matrix_has_are_skipped_by_name() {
        let mut oss = ModelShape::qwen3_30b_a3b();
        oss.hidden = 2880;
        oss.expert_ffn = 2880;
        let cat = derive(&oss, &Serving::default(), &DeviceLimits::h200(), &opts());
        let k_quant = |id: &str| ["q4_K", "q5_K", "q6_K"].iter().any(|t| id.contains(t));
        // The o projection's K is the query width (32 heads x 128 = 4,096): it still runs.
        let left: Vec<&str> = cat.cases.iter().filter(|c| k_quant(&c.id)).map(|c| c.id.as_str()).collect();
        assert!(!left.is_empty() && left.iter().all(|id| id.starts_with("linear/q4_K/o/")), "{left:?}");
        let skipped: Vec<&(Case, String)> =
            cat.skipped.iter().filter(|(c, _)| k_quant(&c.id) && !c.id.starts_with("linear/q4_K/o/")).collect();
        for kernel in ["moe_gemm", "moe_gemv", "moe_gemv_swiglu_q8_1", "moe_gemv_combine", "output_head", "linear", "qkv"] {
            assert!(skipped.iter().any(|(c, _)| c.kernel == kernel), "{kernel}: no K-quant case listed");
        }
        assert!(skipped.iter().all(|(_, why)| why.starts_with("no matrix of this shape exists") && why.contains("K = 2880")));
        assert!(cat.cases.iter().any(|c| c.id.starts_with("moe_gemm/q4_0/") || c.id.starts_with("moe_gemv/q8_0/")));
        let qwen = derive(&ModelShape::qwen3_30b_a3b(), &Serving::default(), &DeviceLimits::h200(), &opts());
        assert!(qwen.cases.iter().any(|c| k_quant(&c.id)));
        assert!(qwen.skipped.iter().all(|(_, why)| !why.starts_with("no matrix of this shape exists")));
    }

    #[test]
    fn attention_variants_come_from_the_layers_kinds() {
        let mut shape = ModelShape::qwen3_30b_a3b();
        assert_eq!(attention_variants(&shape), [(0, false)]);
        shape.layers = vec![layer(48, &[])];
        assert_eq!(attention_variants(&shape), [(0, false)]);
        // gpt-oss: sinks everywhere, a window of 128 on every other layer.
        let (swa, full) = ([("attention.window", "128"), ("attention.sinks", "true")], [("attention.sinks", "true")]);
        shape.layers = (0..12).map(|i| if i % 2 == 0 { layer(1, &swa) } else { layer(1, &full) }).collect();
        assert_eq!(attention_variants(&shape), [(0, true), (128, true)]);
        shape.layers = vec![layer(2, &[("attention.window", "none")]), layer(1, &[("attention.window", "4096")])];
        assert_eq!(attention_variants(&shape), [(0, false), (4096, false)]);
    }

    /// Plain layers (or none listed) derive exactly the attention cases they did before windows.
    #[test]
    fn plain_layers_keep_the_attention_cases() {
        let plain = ModelShape::qwen3_30b_a3b();
        let ids = attention_ids(&plain);
        assert!(ids.iter().all(|(id, _)| !id.contains("sinks") && !id.contains("/w")), "{ids:?}");
        assert!(ids.iter().any(|(id, _)| id == "attention/prompt/t1"));
        let listed = ModelShape { layers: vec![layer(48, &[])], ..plain.clone() };
        assert_eq!(attention_ids(&listed), ids);
    }

    /// The attention families run the prefill kernel the engine runs (the tensor-core one where
    /// it exists unless `BRINK_ATTN_PREFILL` forces f32), once: no family of a kernel the engine
    /// would not run, whose failure would disqualify a node for nothing.
    #[test]
    fn attention_families_run_the_engines_prefill_kernel() {
        let shape = ModelShape::qwen3_30b_a3b();
        for limits in DeviceLimits::recorded() {
            let cat = derive(&shape, &Serving::default(), &limits, &opts());
            let attention: Vec<_> =
                cat.cases.iter().chain(cat.skipped.iter().map(|(c, _)| c)).filter(|c| c.kernel == attention::KERNEL).collect();
            assert!(!attention.is_empty() && attention.iter().all(|c| !c.id.contains("/f32/")));
            for c in attention {
                let OpCase::Attention(a) = &c.params else { unreachable!() };
                let engine = attention::select_prefill(a.head_dim, limits.compute_capability, attention::prefill_override().unwrap());
                assert_eq!(a.prefill_kernel(&limits), engine, "{} {}", limits.name, c.id);
            }
        }
    }

    /// A windowed variant runs every layout with the window's edges among its counts.
    #[test]
    fn windowed_layers_add_families_at_the_window_edges() {
        let shape = ModelShape {
            layers: vec![layer(1, &[("attention.window", "128"), ("attention.sinks", "true")]), layer(1, &[("attention.sinks", "true")])],
            ..ModelShape::qwen3_30b_a3b()
        };
        let ids = attention_ids(&shape);
        let tokens = |family: &str| -> Vec<u64> {
            ids.iter().filter(|(id, _)| id.starts_with(&format!("attention/{family}/t"))).map(|(_, t)| *t).collect()
        };
        for family in ["w128-sinks/prompt", "w128-sinks/continue", "w128-sinks/continue-in-window", "w128-sinks/context-end"] {
            let t = tokens(family);
            for edge in [127, 128, 129, 255, 256, 257, 1061] {
                assert!(t.contains(&edge), "{family} lacks {edge}: {t:?}");
            }
        }
        // 4 prompts: each at the edge; beside 8 decode steps: the prompt at the edge.
        assert!([508, 512, 516, 1020, 1024, 1028].iter().all(|e| tokens("w128-sinks/prompts4").contains(e)));
        assert!([135, 136, 137, 263, 264, 265].iter().all(|e| tokens("w128-sinks/mixed").contains(e)));
        // Decode batches through every step of the longer cycle, both routes.
        assert!((2..=19).all(|t| tokens("w128-sinks/decode").contains(&t)));
        assert!(tokens("w128-sinks/decode-via-prefill").contains(&19));
        // The full-attention layers with sinks: the plain families' counts under their own tags.
        let plain = attention_ids(&ModelShape::qwen3_30b_a3b());
        let sinks: Vec<(String, u64)> =
            ids.iter().filter_map(|(id, t)| id.strip_prefix("attention/sinks/").map(|rest| (format!("attention/{rest}"), *t))).collect();
        assert_eq!(sinks, plain);
        assert!(tokens("w128-sinks/h8-kv2-d64/prompt").contains(&65));
    }
}
