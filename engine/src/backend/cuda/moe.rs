//! The routed-expert block: router logits, top-k, the experts' SwiGLU FFN, weighted combine.
//!
//! ```text
//! x [T, H] ─quantize─▶ xq ─dense (router)─▶ logits [T, E] ─router_topk─▶ ids, weights [T·k]
//! small T (GEMV):  xq ─moe_gemv_swiglu_q8_1─▶ act_q [T·k, F/32] ─moe_gemv_combine (weights)─▶ out [T, H]
//! large T (GEMM):  ids ─moe_align─▶ sorted rows; x ─quantize(gather)─▶ A ─moe_gemm─▶ gate, up
//!                  ─swiglu_q8_1(gather)─▶ act_q ─moe_gemm─▶ down [T·k, H]
//!                  down, weights ─moe_combine─▶ out [T, H]
//! ```
//!
//! The GEMV path's two fused kernels give the bytes of the unfused chain (`moe_gemv` gate and up,
//! `swiglu_q8_1`, `moe_gemv` down, `moe_combine`) bit for bit; the chain still runs where gate and
//! up differ in weight format (one fused launch reads both with one format).
//!
//! The router's F32 matrix runs through `dense_f32`, a quantized one through the dense q8_1
//! kernels (see `weights`).

use brink_kernels::cuda::{Gpu, GpuError};
use brink_kernels::launch::PlanError;
use brink_kernels::ops::bias;
use brink_kernels::ops::moe_align::{self, AlignedDevice};
use brink_kernels::ops::moe_combine::{self, CombineCase};
use brink_kernels::ops::moe_gemm::{self, GemmBuffers, GemmCase, GemmTile};
use brink_kernels::ops::moe_gemv::{self, GemvBuffers, GemvDims};
use brink_kernels::ops::moe_gemv_fused::{self, CombineBuffers, FfnDims, GateUpBuffers};
use brink_kernels::ops::quantize::{self, Source};
use brink_kernels::ops::router::{self, RouterSpec, Scoring};
use brink_kernels::ops::swiglu::Act;
use brink_kernels::quant::WeightType;
use brink_kernels::routing::Routing;
use brink_kernels::sources::MOE_COMBINE;
use cudarc::driver::{CudaSlice, PushKernelArg};

use super::buffers::{AllocCounter, CudaAct, Grow};
use super::dense::{dense_f32, project_q8_1, q8_1_bytes, quantize_rows};
use super::weights::{CudaWeight, WeightData};
use super::{fail, gpu_fail};
use crate::backend::{MoeSpec, MoeWeights};
use crate::model::{Activation, BackendError, Gating, MatrixDims};

/// Up to this many tokens the experts run as GEMVs (each pair reads its expert's rows once,
/// no alignment); above, as tiled GEMMs over tokens sorted by expert. llama.cpp switches at
/// the same count (`MMVQ_MAX_BATCH_SIZE`).
pub(crate) const ROUTED_GEMV_MAX_TOKENS: usize = 8;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RoutedPath {
    Gemv,
    Gemm,
}

pub(crate) fn routed_path(tokens: usize) -> RoutedPath {
    if tokens <= ROUTED_GEMV_MAX_TOKENS { RoutedPath::Gemv } else { RoutedPath::Gemm }
}

/// The block's scratch, sized by the largest batch so far.
pub(crate) struct MoeScratch {
    /// x as q8_1 `[T, H/32]`: the router's and the GEMV's input. Also the dense projections'
    /// q8_1 scratch (the backend's one), which the norm before this block may have filled with
    /// x's rows already: `route`'s `quantize_rows` then launches nothing (`dense::quantize_rows`).
    pub(crate) xq: Grow<u8>,
    logits: Grow<f32>,
    ids: Grow<i32>,
    weights: Grow<f32>,
    /// x gathered in expert order as q8_1 `[padded rows, H/32]` (GEMM).
    a: Grow<u8>,
    gate: Grow<f32>,
    up: Grow<f32>,
    /// silu(gate) · up as q8_1: `[T·k, F/32]` (GEMV) or gathered `[padded rows, F/32]` (GEMM).
    act_q: Grow<u8>,
    down: Grow<f32>,
    /// The GEMM path's alignment, reused across steps (replaced only by a larger batch).
    aligned: Option<AlignedDevice>,
}

impl MoeScratch {
    pub(crate) fn new(gpu: &Gpu, allocs: &AllocCounter) -> Result<Self, GpuError> {
        Ok(MoeScratch {
            xq: Grow::new(gpu, allocs)?,
            logits: Grow::new(gpu, allocs)?,
            ids: Grow::new(gpu, allocs)?,
            weights: Grow::new(gpu, allocs)?,
            a: Grow::new(gpu, allocs)?,
            gate: Grow::new(gpu, allocs)?,
            up: Grow::new(gpu, allocs)?,
            act_q: Grow::new(gpu, allocs)?,
            down: Grow::new(gpu, allocs)?,
            aligned: None,
        })
    }
}

/// The block's sizes, checked against every weight, and its activation.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Dims {
    tokens: usize,
    hidden: usize,
    ffn: usize,
    experts: usize,
    top_k: usize,
    act: Act,
}

impl Dims {
    fn pairs(&self) -> usize {
        self.tokens * self.top_k
    }
}

/// An expert tensor `[row_len, rows, experts]` in blocks the routed kernels read.
struct Experts<'a> {
    name: &'a str,
    wtype: WeightType,
    bytes: &'a CudaSlice<u8>,
}

impl Experts<'_> {
    /// A kernel error of `stage` with this tensor named.
    fn failed(&self, stage: &'static str) -> impl Fn(GpuError) -> BackendError + '_ {
        move |e| gpu_fail(format_args!("moe expert {stage} {}", self.name), &e)
    }
}

fn experts<'a>(w: &'a CudaWeight, (row_len, rows, experts): (usize, usize, usize)) -> Result<Experts<'a>, String> {
    if w.dims() != [row_len as u64, rows as u64, experts as u64] {
        return Err(format!("{} has dims {:?}, expected [{row_len}, {rows}, {experts}]", w.name(), w.dims()));
    }
    match &w.data {
        WeightData::Blocks { wtype, bytes } => Ok(Experts { name: w.name(), wtype: *wtype, bytes }),
        WeightData::F32(_) => Err(format!("{} is held as f32; the routed kernels read quantized blocks", w.name())),
    }
}

/// The router's scoring and whether the picked weights are renormalised.
type RouterChoice = (Scoring, bool);

/// The block's dimensions and its routing, or why the CUDA backend cannot compute it.
fn check(x: &CudaAct, w: &MoeWeights<'_, CudaWeight>, spec: &MoeSpec) -> Result<(Dims, RouterChoice), String> {
    let act = match spec.activation {
        Activation::SwiGlu => Act::SwiGlu,
        Activation::ClampedSwiGlu { alpha, limit } => Act::Clamped { alpha, limit },
    };
    let d = Dims { tokens: x.rows(), hidden: x.width(), ffn: spec.expert_ffn, experts: spec.experts, top_k: spec.top_k, act };
    if d.top_k == 0 || d.top_k > d.experts {
        return Err(format!("top_k {} must be in 1..={}", d.top_k, d.experts));
    }
    let routing = match spec.gating {
        // The combine applies the router's weights as they are; no kernel scales them yet.
        Gating::SoftmaxThenTopK { weights_scale: Some(s), .. } | Gating::TopKThenSoftmax { weights_scale: Some(s) } => {
            return Err(format!("expert_weights_scale {s} is not supported by the CUDA backend's combine"));
        }
        Gating::SoftmaxThenTopK { norm_top_k, weights_scale: None } => (Scoring::Softmax, norm_top_k),
        // The softmax over the picks: its weights sum to 1.
        Gating::TopKThenSoftmax { weights_scale: None } => (Scoring::TopKSoftmax, true),
    };
    if w.router.dims() != [d.hidden as u64, d.experts as u64] {
        return Err(format!("router {} has dims {:?}, expected [{}, {}]", w.router.name(), w.router.dims(), d.hidden, d.experts));
    }
    Ok((d, routing))
}

/// A block's biases as f32 values on the device: the router's `[E]`, each expert's gate and up
/// `[E, F]` and down `[E, H]`.
struct Biases<'a> {
    router: &'a CudaSlice<f32>,
    gate: &'a CudaSlice<f32>,
    up: &'a CudaSlice<f32>,
    down: &'a CudaSlice<f32>,
}

fn biases<'a>(w: &'a MoeWeights<'_, CudaWeight>, d: &Dims) -> Result<Option<Biases<'a>>, String> {
    let Some(b) = &w.biases else { return Ok(None) };
    let values = |t: &'a CudaWeight, len: usize| match &t.data {
        WeightData::F32(v) if v.len() == len => Ok(v),
        WeightData::F32(v) => Err(format!("bias {} holds {} values, expected {len}", t.name(), v.len())),
        WeightData::Blocks { .. } => Err(format!("bias {} must be held as f32 values", t.name())),
    };
    let e = d.experts;
    Ok(Some(Biases {
        router: values(b.router, e)?,
        gate: values(b.gate, e * d.ffn)?,
        up: values(b.up, e * d.ffn)?,
        down: values(b.down, e * d.hidden)?,
    }))
}

/// `y [pairs, width] += bias[ids[p]]`: the picked experts' bias rows.
fn add_pick_bias(gpu: &Gpu, s_ids: &Grow<i32>, d: &Dims, y: &mut Grow<f32>, bias: &CudaSlice<f32>) -> Result<(), GpuError> {
    let width = bias.len() / d.experts.max(1);
    let (pairs, ids) = (d.pairs(), s_ids.slice(0..d.pairs()));
    bias::launch_picks(gpu, pairs as u64, d.experts as u32, &mut y.slice_mut(0..pairs * width), &ids, &bias.as_view())
}

/// `out [T, H]` = the routed experts of `x [T, H]`.
pub(crate) fn moe(
    gpu: &Gpu,
    s: &mut MoeScratch,
    x: &CudaAct,
    w: &MoeWeights<'_, CudaWeight>,
    spec: &MoeSpec,
    out: &mut CudaAct,
) -> Result<(), BackendError> {
    let (d, routing) = check(x, w, spec).map_err(|why| fail(format!("moe: {why}")))?;
    let shapes = |e: String| fail(format!("moe: {e}"));
    let gate = experts(w.gate, (d.hidden, d.ffn, d.experts)).map_err(shapes)?;
    let up = experts(w.up, (d.hidden, d.ffn, d.experts)).map_err(shapes)?;
    let down = experts(w.down, (d.ffn, d.hidden, d.experts)).map_err(shapes)?;
    let biases = biases(w, &d).map_err(shapes)?;
    let failed = |e: GpuError| gpu_fail(format_args!("moe ({} tokens, {} experts, top {})", d.tokens, d.experts, d.top_k), &e);
    let path = routed_path(d.tokens);
    route(gpu, s, x, w.router, biases.as_ref().map(|b| b.router), &d, routing, path)?;
    match path {
        // The down GEMV's epilogue is the combine: it writes `out` itself.
        RoutedPath::Gemv => return experts_gemv(gpu, s, &d, [&gate, &up, &down], biases.as_ref(), out),
        RoutedPath::Gemm => {
            let (t, k, e) = (d.tokens as u64, d.top_k as u32, d.experts as u32);
            let tile = moe_gemm::configured_tile(t, k, e).map_err(|e| fail(format!("moe: {e}")))?;
            let aligned = match s.aligned.take() {
                Some(mut a) => moe_align::align_into(gpu, &s.ids, t, k, e, tile.m, &mut a).map(|()| a),
                None => moe_align::align_gpu(gpu, &s.ids, t, k, e, tile.m),
            }
            .map_err(failed)?;
            let done = experts_gemm(gpu, s, x, &d, &aligned, tile, [&gate, &up, &down], biases.as_ref());
            s.aligned = Some(aligned);
            done?;
        }
    }
    combine(gpu, s, &d, out).map_err(failed)
}

/// Router logits, then ids and weights `[T·k]`: top-k by logit, the weights the softmax over
/// every expert (renormalised when the model says so) or over the picks alone.
#[allow(clippy::too_many_arguments)]
fn route(
    gpu: &Gpu,
    s: &mut MoeScratch,
    x: &CudaAct,
    router: &CudaWeight,
    router_bias: Option<&CudaSlice<f32>>,
    d: &Dims,
    (scoring, renormalize): RouterChoice,
    path: RoutedPath,
) -> Result<(), BackendError> {
    let failed = |e: GpuError| gpu_fail(format_args!("moe router {}", router.name()), &e);
    let quantized_router = matches!(router.data, WeightData::Blocks { .. });
    if quantized_router || path == RoutedPath::Gemv {
        quantize_rows(gpu, x, d.tokens, d.hidden, &mut s.xq).map_err(failed)?;
    }
    s.logits.ensure(gpu, d.tokens * d.experts).map_err(failed)?;
    match &router.data {
        WeightData::Blocks { wtype, bytes } => {
            project_q8_1(gpu, &s.xq, d.tokens, (d.hidden, d.experts), (*wtype, bytes), &mut s.logits).map_err(failed)?
        }
        WeightData::F32(values) => dense_f32(gpu, &x.buf, (d.tokens, d.hidden), values, d.experts, &mut s.logits)?,
    }
    if let Some(b) = router_bias {
        let mut logits = s.logits.slice_mut(0..d.tokens * d.experts);
        bias::launch(gpu, d.tokens as u64, &mut logits, &b.as_view()).map_err(failed)?;
    }
    s.ids.ensure(gpu, d.pairs()).map_err(failed)?;
    s.weights.ensure(gpu, d.pairs()).map_err(failed)?;
    let spec = RouterSpec { experts: d.experts as u32, top_k: d.top_k as u32, scoring, renormalize };
    let logits = s.logits.slice(0..d.tokens * d.experts);
    let (mut ids, mut weights) = (s.ids.slice_mut(0..d.pairs()), s.weights.slice_mut(0..d.pairs()));
    router::launch(gpu, d.tokens as u64, &spec, &logits, &mut ids, &mut weights).map_err(failed)
}

fn ensure_ffn(gpu: &Gpu, s: &mut MoeScratch, d: &Dims, act_q_bytes: usize) -> Result<(), GpuError> {
    let (pf, ph) = (d.pairs() * d.ffn, d.pairs() * d.hidden);
    for g in [&mut s.gate, &mut s.up] {
        g.ensure(gpu, pf)?;
    }
    s.down.ensure(gpu, ph)?;
    s.act_q.ensure(gpu, act_q_bytes)
}

/// Per (token, slot) pair GEMVs in two launches: gate and up with the activation and q8_1 in
/// the epilogue (`moe_gemv_swiglu_q8_1`, reading the token's q8_1 row) into `act_q`, then down
/// with the router-weighted sum over the slots in the epilogue (`moe_gemv_combine`, reading the
/// pairs' rows) into `out`; the picked experts' biases (gpt-oss) are added in both epilogues.
/// Only `act_q` is scratch (grown once, so nothing allocates inside a captured step); gate and
/// up of different formats take the unfused gate/up chain.
fn experts_gemv(
    gpu: &Gpu,
    s: &mut MoeScratch,
    d: &Dims,
    [gate, up, down]: [&Experts<'_>; 3],
    biases: Option<&Biases<'_>>,
    out: &mut CudaAct,
) -> Result<(), BackendError> {
    let ffn =
        |wtype: WeightType| FfnDims { experts: d.experts as u32, top_k: d.top_k as u32, hidden: d.hidden as u32, ffn: d.ffn as u32, wtype };
    let t = d.tokens as u64;
    s.act_q.ensure(gpu, q8_1_bytes(d.pairs(), d.ffn)).map_err(gate.failed("GEMV"))?;
    if gate.wtype == up.wtype {
        let bias = biases.map(|b| [b.gate, b.up]);
        let bufs = GateUpBuffers { w_gate: gate.bytes, w_up: up.bytes, xq: &*s.xq, ids: &s.ids, out: &mut *s.act_q, bias };
        moe_gemv_fused::launch_gate_up(gpu, t, &ffn(gate.wtype), d.act, bufs).map_err(gate.failed("GEMV+SwiGLU"))?;
    } else {
        gate_up_unfused(gpu, s, d, [gate, up], biases)?;
    }
    let bufs = CombineBuffers {
        w_down: down.bytes,
        act: &*s.act_q,
        ids: &s.ids,
        weights: &s.weights,
        out: &mut out.buf,
        bias: biases.map(|b| b.down),
    };
    moe_gemv_fused::launch_combine(gpu, t, &ffn(down.wtype), bufs).map_err(down.failed("GEMV+combine"))
}

/// gate and up as two `moe_gemv`s (each with the picks' bias when the block has them), then
/// `swiglu_q8_1` into `act_q` (pair order): the chain the fused kernel replaces, for gate and up
/// of different weight formats.
fn gate_up_unfused(
    gpu: &Gpu,
    s: &mut MoeScratch,
    d: &Dims,
    [gate, up]: [&Experts<'_>; 2],
    biases: Option<&Biases<'_>>,
) -> Result<(), BackendError> {
    for g in [&mut s.gate, &mut s.up] {
        g.ensure(gpu, d.pairs() * d.ffn).map_err(gate.failed("GEMV"))?;
    }
    let t = d.tokens as u64;
    for (i, (e, y)) in [(gate, &mut s.gate), (up, &mut s.up)].into_iter().enumerate() {
        let dims = GemvDims { experts: d.experts as u32, top_k: d.top_k as u32, n: d.ffn as u32, k: d.hidden as u32, wtype: e.wtype };
        let bufs = GemvBuffers { w: e.bytes, xq: &*s.xq, ids: &s.ids, y: &mut **y };
        moe_gemv::launch(gpu, t, &dims, bufs).map_err(e.failed("GEMV"))?;
        if let Some(b) = biases {
            add_pick_bias(gpu, &s.ids, d, y, [b.gate, b.up][i]).map_err(e.failed("bias"))?;
        }
    }
    swiglu_q8_1(gpu, s, d, Source::Dense, d.pairs() as u64)
}

/// Tiled GEMMs over the rows sorted by expert (`al`, aligned to `tile`'s rows): x gathered per
/// (token, slot) for gate and up, the pairs' activations gathered for down; the picked experts'
/// biases added to gate, up and down (rows in pair order) when the block has them.
#[allow(clippy::too_many_arguments)]
fn experts_gemm(
    gpu: &Gpu,
    s: &mut MoeScratch,
    x: &CudaAct,
    d: &Dims,
    al: &AlignedDevice,
    tile: &GemmTile,
    [gate, up, down]: [&Experts<'_>; 3],
    biases: Option<&Biases<'_>>,
) -> Result<(), BackendError> {
    let rows = moe_align::max_padded_rows(d.tokens as u64, d.top_k as u32, d.experts as u32, tile.m);
    let rows_usize = usize::try_from(rows).map_err(|_| fail(format!("moe: {rows} padded rows")))?;
    ensure_ffn(gpu, s, d, q8_1_bytes(rows_usize, d.ffn)).map_err(gate.failed("GEMM"))?;
    s.a.ensure(gpu, q8_1_bytes(rows_usize, d.hidden)).map_err(gate.failed("GEMM"))?;
    let gather = |rows_per_token: usize| Source::Gather { sorted_ids: &al.sorted_ids, rows_per_token: rows_per_token as u32 };
    let (t, k) = (d.tokens as u64, d.top_k as u32);
    quantize::launch(gpu, &x.buf, t, d.hidden as u32, rows, gather(d.top_k), &mut *s.a).map_err(gate.failed("GEMM"))?;
    // `routing` only tells the self-test how to route; the launch ignores it.
    let case = |e: &Experts<'_>, n: usize, kk: usize| GemmCase {
        experts: d.experts as u32,
        top_k: k,
        n: n as u32,
        k: kk as u32,
        wtype: e.wtype,
        routing: Routing::Uniform,
    };
    for (e, y) in [(gate, &mut s.gate), (up, &mut s.up)] {
        let bufs = GemmBuffers { sorted_ids: &al.sorted_ids, tile_expert: &al.tile_expert, a: &s.a, w: e.bytes, y: &mut **y };
        moe_gemm::launch(gpu, t, &case(e, d.ffn, d.hidden), tile, bufs).map_err(e.failed("GEMM"))?;
    }
    if let Some(b) = biases {
        add_pick_bias(gpu, &s.ids, d, &mut s.gate, b.gate).map_err(gate.failed("bias"))?;
        add_pick_bias(gpu, &s.ids, d, &mut s.up, b.up).map_err(up.failed("bias"))?;
    }
    // The activations' rows are pairs: gathered one row per pair id.
    swiglu_q8_1(gpu, s, d, Source::Gather { sorted_ids: &al.sorted_ids, rows_per_token: 1 }, rows)?;
    let bufs = GemmBuffers { sorted_ids: &al.sorted_ids, tile_expert: &al.tile_expert, a: &s.act_q, w: down.bytes, y: &mut *s.down };
    moe_gemm::launch(gpu, t, &case(down, d.hidden, d.ffn), tile, bufs).map_err(down.failed("GEMM"))?;
    if let Some(b) = biases {
        add_pick_bias(gpu, &s.ids, d, &mut s.down, b.down).map_err(down.failed("bias"))?;
    }
    Ok(())
}

/// `act_q = q8_1(silu(gate) · up)` (llama.cpp's `ggml_swiglu_split`, or gpt-oss's clamped
/// `ggml_swiglu_oai`, then the down
/// projection's quantization) for the pairs' rows in one kernel: `out_rows` rows from `source`
/// (the pairs in order, or gathered into the alignment's expert order). The f32 activations are
/// never written; the quants equal `quantize` of them, bit for bit.
fn swiglu_q8_1(gpu: &Gpu, s: &mut MoeScratch, d: &Dims, source: Source<&CudaSlice<i32>>, out_rows: u64) -> Result<(), BackendError> {
    let input = brink_kernels::ops::swiglu::GateUp::Separate { gate: &s.gate, up: &s.up };
    brink_kernels::ops::swiglu::launch_q8_1_act(gpu, (d.pairs() as u64, d.ffn as u32), input, d.act, source, out_rows, &mut *s.act_q)
        .map_err(|e| gpu_fail("moe swiglu", &e))
}

/// `out[t] = Σ_j weights[t·k + j] · down[t·k + j]`. The `moe_combine` kernel through its own
/// plan and the checked launch; `moe_combine::launch` writes u32 words (the self-test's
/// poisoned buffers), this writes the f32 activation with the same arguments.
fn combine(gpu: &Gpu, s: &MoeScratch, d: &Dims, out: &mut CudaAct) -> Result<(), GpuError> {
    let c = CombineCase { top_k: d.top_k as u32, n: d.hidden as u32 };
    let tokens = d.tokens as u64;
    let p = moe_combine::plan(tokens, &c, gpu.limits())?;
    let short = [("down", s.down.len(), d.pairs() * d.hidden), ("weights", s.weights.len(), d.pairs()), ("out", out.buf.len(), out.len())]
        .into_iter()
        .find(|&(_, have, need)| have < need);
    if let Some((name, have, need)) = short {
        let what = format!("{name} holds {have} values, the launch needs {need}");
        return Err(PlanError::Unsupported { kernel: p.kernel.clone(), what, shape: p.shape.clone() }.into());
    }
    let f = gpu.function(&MOE_COMBINE, moe_combine::KERNEL)?;
    let (k, n) = (d.top_k as i32, d.hidden as i32);
    let out: &mut CudaSlice<f32> = &mut out.buf;
    gpu.launch(&p, &f, |b| {
        b.arg(&*s.down).arg(&*s.weights).arg(out).arg(&tokens).arg(&k).arg(&n);
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gemv_up_to_eight_tokens_then_gemm() {
        assert_eq!(routed_path(1), RoutedPath::Gemv);
        assert_eq!(routed_path(ROUTED_GEMV_MAX_TOKENS), RoutedPath::Gemv);
        assert_eq!(routed_path(ROUTED_GEMV_MAX_TOKENS + 1), RoutedPath::Gemm);
    }
}
