//! The routed experts' decode GEMVs with their glue fused into the epilogue (`cuda/moe_gemv.cu`):
//!
//! - [`GATE_UP_KERNEL`] (`moe_gemv_swiglu_q8_1`): gate and up GEMVs of a (token, slot) pair over
//!   a tile of 32 FFN columns, then the activation (`silu(gate)·up`, or gpt-oss's clamped one)
//!   quantized to that tile's q8_1 block, in one launch. It replaces `moe_gemv(gate)`,
//!   `moe_gemv(up)` and `swiglu_q8_1` (pair order): the per-row arithmetic is `moe_gemv`'s and the
//!   epilogue `swiglu_q8_1`'s, so the bytes equal that chain's bit for bit (the self-test runs
//!   both and counts differing blocks).
//! - [`COMBINE_KERNEL`] (`moe_gemv_combine`): the down GEMV of every slot of a token with the
//!   router-weighted sum over the slots in the epilogue, replacing `moe_gemv(down)` and
//!   `moe_combine`: each dot as `moe_gemv`'s, the sum as `moe_combine`'s (slot order, `acc += w·y`),
//!   so the output equals that chain's bit for bit.
//!
//! With an [`Epilogue`] that is `biased` (gpt-oss), each dot gains its expert's bias before the
//! activation or the combine, as the chain's `add_pick_bias_f32` adds it (one IEEE add).
//!
//! Geometry (both): the index that grows with tokens on `grid.x` (pairs for gate/up, tokens for
//! the combine), column tiles on `grid.y` (bounded by the weight shape: a typed error past the
//! device's `grid.y`), warps per block from the device's limits (at most 16). 64-bit indexes.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, DeviceRepr, PushKernelArg};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::check::{Check, KernelFamily, Outcome, RelErr, Staged, sample_rows};
use crate::cuda::{Gpu, GpuError};
use crate::launch::{Cover, Launch, PlanError, bytes_of, require_bytes};
use crate::limits::DeviceLimits;
use crate::ops::bias::{self, add_pick_bias_cpu};
use crate::ops::moe_align::GEMM_TILE_M;
use crate::ops::moe_combine::{self, CombineCase, combine_cpu};
use crate::ops::moe_gemv::{self, GemvBuffers, GemvDims, moe_gemv_cpu, pair_row};
use crate::ops::quantize::{self, Source};
use crate::ops::swiglu::{self, Act, GateUp, act_q8_1_cpu};
use crate::ops::testdata::{GUARD_WORDS, Guarded, download_rows, fill_uniform, fill_weights};
use crate::quant::{BLOCK_Q8_1_BYTES, BlockQ8_1, QK, WeightType, dequantize_q8_1, q8_1_bytes, quantize_row_q8_1};
use crate::routing::{Routing, route};
use crate::sources::MOE_GEMV;
use crate::testdata::{shared_twin_row, shared_weight_rows, uniform_row};
use crate::thresholds::{Critical, overflow_point};

pub const GATE_UP_KERNEL: &str = "moe_gemv_swiglu_q8_1";
pub const COMBINE_KERNEL: &str = "moe_gemv_combine";
/// Warps per block at most (`GEMV_FUSED_MAX_WARPS`, the kernels' `__launch_bounds__`).
pub const MAX_WARPS: u32 = 16;
/// FFN columns per gate/up block: one q8_1 block of the output.
pub const GATE_UP_TILE: u32 = QK as u32;
/// Against the twin (which sums each dot in a different order): the GEMV's tolerance, plus the
/// q8_1 step for gate/up. The exact check is against the device's unfused chain.
pub const COMBINE_TOLERANCE: f64 = moe_gemv::TOLERANCE;
pub const GATE_UP_TOLERANCE: f64 = swiglu::Q8_1_TOLERANCE + moe_gemv::TOLERANCE;
/// 32-bit words per q8_1 block.
const BLOCK_WORDS: usize = BLOCK_Q8_1_BYTES / 4;

/// Warps per block: as many as the device's block allows, at most [`MAX_WARPS`].
pub fn warps(limits: &DeviceLimits) -> u32 {
    (limits.max_threads_per_block / limits.warp_size.max(1)).clamp(1, MAX_WARPS)
}

/// Output rows per combine block: the block's warps shared among rows × top_k (row, slot) dots.
pub fn combine_rows(top_k: u32, limits: &DeviceLimits) -> u32 {
    (warps(limits) / top_k.max(1)).max(1)
}

fn unsupported(kernel: &str, what: impl Into<String>, shape: &str) -> PlanError {
    PlanError::Unsupported { kernel: kernel.into(), what: what.into(), shape: shape.into() }
}

/// The shape of a routed FFN block: `experts` experts of `ffn` columns over `hidden` inputs
/// (gate/up: N = ffn, K = hidden; down: N = hidden, K = ffn).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FfnDims {
    pub experts: u32,
    pub top_k: u32,
    pub hidden: u32,
    pub ffn: u32,
    pub wtype: WeightType,
}

impl FfnDims {
    /// The gate/up GEMVs' dims (`moe_gemv` with top_k slots per token).
    pub fn gate_up(&self) -> GemvDims {
        GemvDims { experts: self.experts, top_k: self.top_k, n: self.ffn, k: self.hidden, wtype: self.wtype }
    }

    /// The down GEMV's dims as `moe_gemv` runs it (one pair per "token").
    pub fn down(&self) -> GemvDims {
        GemvDims { experts: self.experts, top_k: 1, n: self.hidden, k: self.ffn, wtype: self.wtype }
    }
}

/// What the fused kernels do after the dots: the activation of gate and up, and whether each
/// dot gains its expert's bias first (gate, up and down: gpt-oss's experts carry all three).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Epilogue {
    pub act: Act,
    pub biased: bool,
}

impl Epilogue {
    /// The self-test tag of a non-plain epilogue (`biased-clamped`, ...); none for qwen3moe's.
    pub fn tag(&self) -> Option<String> {
        let parts: Vec<&str> =
            [(self.biased, "biased"), (!self.act.is_plain(), "clamped")].into_iter().filter_map(|(on, name)| on.then_some(name)).collect();
        (!parts.is_empty()).then(|| parts.join("-"))
    }
}

/// A self-test case of either fused kernel.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct FusedCase {
    pub dims: FfnDims,
    pub routing: Routing,
    #[serde(default)]
    pub epilogue: Epilogue,
}

fn describe(kernel: &str, tokens: u64, d: &FfnDims) -> String {
    format!("{kernel} tokens={tokens} experts={} top_k={} hidden={} ffn={} {}", d.experts, d.top_k, d.hidden, d.ffn, d.wtype)
}

/// Shape checks of both kernels: `moe_gemv`'s, with N of the GEMV and K checked for its format.
fn check_dims(kernel: &str, tokens: u64, d: &FfnDims, n: u32, k: u32, shape: &str) -> Result<(), PlanError> {
    let what = if tokens == 0 {
        "no tokens".to_string()
    } else if d.experts == 0 || d.top_k == 0 || d.top_k > d.experts {
        format!("needs 1 <= top_k ({}) <= experts ({})", d.top_k, d.experts)
    } else if n == 0 || n > i32::MAX as u32 {
        format!("output width N = {n} must be in 1..2^31")
    } else if let Some(what) = d.wtype.check_row_width(k as u64) {
        format!("input width: {what}")
    } else if tokens.checked_mul(d.top_k as u64).is_none_or(|p| p > u64::MAX / (2 * n as u64 + k as u64 + 64)) {
        "tokens × top_k × width overflows 64-bit indexes".to_string()
    } else {
        return Ok(());
    };
    Err(unsupported(kernel, what, shape))
}

/// Gate/up: pairs on `grid.x`, the `ffn / 32` column tiles on `grid.y`, [`warps`] warps.
/// Refuses an FFN width that is not a multiple of 32 (a tile is one q8_1 block).
pub fn gate_up_plan(tokens: u64, d: &FfnDims, limits: &DeviceLimits) -> Result<Launch, PlanError> {
    let shape = describe(GATE_UP_KERNEL, tokens, d);
    check_dims(GATE_UP_KERNEL, tokens, d, d.ffn, d.hidden, &shape)?;
    if !d.ffn.is_multiple_of(GATE_UP_TILE) {
        return Err(unsupported(
            GATE_UP_KERNEL,
            format!("ffn width {} must be a multiple of {GATE_UP_TILE} (one q8_1 block a tile)", d.ffn),
            &shape,
        ));
    }
    let pairs = tokens * d.top_k as u64;
    let tile = GATE_UP_TILE as u64;
    Launch::checked(
        GATE_UP_KERNEL,
        shape,
        [pairs, d.ffn as u64 / tile, 1],
        [warps(limits) * 32, 1, 1],
        0,
        vec![Cover::Tiles { axis: 0, items: pairs, per_block: 1 }, Cover::Tiles { axis: 1, items: d.ffn as u64, per_block: tile }],
        limits,
    )
}

/// Combine: tokens on `grid.x`, tiles of [`combine_rows`] hidden rows on `grid.y`, [`warps`]
/// warps; dynamic shared memory of rows × top_k floats (refused past the block's default).
pub fn combine_plan(tokens: u64, d: &FfnDims, limits: &DeviceLimits) -> Result<Launch, PlanError> {
    let shape = describe(COMBINE_KERNEL, tokens, d);
    check_dims(COMBINE_KERNEL, tokens, d, d.hidden, d.ffn, &shape)?;
    let rows = combine_rows(d.top_k, limits) as u64;
    let shared = 4 * rows * d.top_k as u64;
    if shared > limits.max_shared_mem_per_block as u64 {
        let what = format!("top_k {} needs {shared} B of shared memory, the block has {}", d.top_k, limits.max_shared_mem_per_block);
        return Err(unsupported(COMBINE_KERNEL, what, &shape));
    }
    let n = d.hidden as u64;
    Launch::checked(
        COMBINE_KERNEL,
        shape,
        [tokens, n.div_ceil(rows), 1],
        [warps(limits) * 32, 1, 1],
        shared,
        vec![Cover::Tiles { axis: 0, items: tokens, per_block: 1 }, Cover::Tiles { axis: 1, items: n, per_block: rows }],
        limits,
    )
}

/// One pair's q8_1 activation row `[ffn / 32]`, tile by tile as the kernel computes it:
/// `weight(r)` returns row `r = e·ffn + c` of the gate (`up` false) or up matrix; `bias` the
/// expert's gate and up bias rows `[ffn]` when the epilogue is biased.
pub fn gate_up_pair<R: AsRef<[u8]>>(
    weight: impl Fn(bool, u64) -> R,
    bias: Option<[&[f32]; 2]>,
    act: Act,
    x: &[BlockQ8_1],
    e: u64,
    d: &FfnDims,
) -> Vec<BlockQ8_1> {
    let ffn = d.ffn as u64;
    let biased = |v: f32, which: usize, c: u64| bias.map_or(v, |b| v + b[which][c as usize]);
    (0..ffn / QK as u64)
        .flat_map(|tile| {
            let v: Vec<f32> = (tile * QK as u64..(tile + 1) * QK as u64)
                .map(|c| {
                    let g = biased(d.wtype.dot_q8_1(weight(false, e * ffn + c).as_ref(), x), 0, c);
                    let u = biased(d.wtype.dot_q8_1(weight(true, e * ffn + c).as_ref(), x), 1, c);
                    act.value(g, u)
                })
                .collect();
            quantize_row_q8_1(&v)
        })
        .collect()
}

/// One token's output row `[hidden]`: `weight(r)` returns row `r = e·hidden + n` of the down
/// matrix, `act(j)` slot j's q8_1 row, `w(j)` its router weight, `bias(j)` its expert's down
/// bias row `[hidden]` when the epilogue is biased.
pub fn combine_token<'a, 'b, R: AsRef<[u8]>>(
    weight: impl Fn(u64) -> R,
    act: impl Fn(usize) -> &'a [BlockQ8_1],
    bias: impl Fn(usize) -> Option<&'b [f32]>,
    ids: &[i32],
    w: impl Fn(usize) -> f32,
    d: &FfnDims,
) -> Vec<f32> {
    let n = d.hidden as usize;
    let ys: Vec<Vec<f32>> = (0..d.top_k as usize)
        .map(|j| {
            let mut y = vec![0.0f32; n];
            pair_row(&weight, act(j), ids[j] as u64, &d.down(), &mut y);
            if let Some(b) = bias(j) {
                y.iter_mut().zip(b).for_each(|(y, b)| *y += b);
            }
            y
        })
        .collect();
    (0..n)
        .map(|col| {
            let mut acc = 0.0f32;
            for (j, y) in ys.iter().enumerate() {
                acc += w(j) * y[col];
            }
            acc
        })
        .collect()
}

/// The gate and up biases `[experts, ffn]` each, when the epilogue is biased.
pub type GateUpBias<'a, T> = Option<[&'a T; 2]>;

/// CPU twin of the gate/up kernel: `w_gate`, `w_up` hold `experts·ffn` rows, `xq` `[tokens,
/// hidden/32]`, `ids` `[tokens·top_k]`; returns the q8_1 activations `[tokens·top_k, ffn/32]`.
pub fn gate_up_cpu(
    w_gate: &[u8],
    w_up: &[u8],
    (bias, act): (GateUpBias<'_, [f32]>, Act),
    xq: &[BlockQ8_1],
    ids: &[i32],
    d: &FfnDims,
) -> Vec<BlockQ8_1> {
    let (nb, rb, ffn) = (d.hidden as usize / QK, d.wtype.row_bytes(d.hidden as usize), d.ffn as usize);
    let row = |up: bool, r: u64| {
        let w = if up { w_up } else { w_gate };
        &w[r as usize * rb..(r as usize + 1) * rb]
    };
    (0..ids.len())
        .into_par_iter()
        .flat_map_iter(|pair| {
            let (t, e) = (pair / d.top_k as usize, ids[pair] as usize);
            let rows = bias.map(|b| b.map(|b| &b[e * ffn..(e + 1) * ffn]));
            gate_up_pair(row, rows, act, &xq[t * nb..(t + 1) * nb], e as u64, d)
        })
        .collect()
}

/// CPU twin of the combine kernel: `w_down` `experts·hidden` rows, `act` `[tokens·top_k,
/// ffn/32]`, `ids` and `weights` `[tokens·top_k]`, `bias` `[experts, hidden]` when biased;
/// returns `[tokens, hidden]`.
pub fn combine_fused_cpu(w_down: &[u8], bias: Option<&[f32]>, act: &[BlockQ8_1], ids: &[i32], weights: &[f32], d: &FfnDims) -> Vec<f32> {
    let (k, nb, rb, n) = (d.top_k as usize, d.ffn as usize / QK, d.wtype.row_bytes(d.ffn as usize), d.hidden as usize);
    let row = |r: u64| &w_down[r as usize * rb..(r as usize + 1) * rb];
    (0..ids.len() / k)
        .into_par_iter()
        .flat_map_iter(|t| {
            let ids = &ids[t * k..(t + 1) * k];
            let act = |j: usize| &act[(t * k + j) * nb..(t * k + j + 1) * nb];
            let bias = |j: usize| bias.map(|b| &b[ids[j] as usize * n..(ids[j] as usize + 1) * n]);
            combine_token(row, act, bias, ids, |j| weights[t * k + j], d)
        })
        .collect()
}

/// The chains the kernels replace, from the existing twins (the unit tests hold the fused twins
/// to them).
pub fn gate_up_chain_cpu(
    w_gate: &[u8],
    w_up: &[u8],
    (bias, act): (GateUpBias<'_, [f32]>, Act),
    xq: &[BlockQ8_1],
    ids: &[i32],
    d: &FfnDims,
) -> Vec<BlockQ8_1> {
    let (mut gate, mut up) = (moe_gemv_cpu(w_gate, xq, ids, &d.gate_up()), moe_gemv_cpu(w_up, xq, ids, &d.gate_up()));
    if let Some([bg, bu]) = bias {
        gate = add_pick_bias_cpu(&gate, ids, bg, d.ffn as usize);
        up = add_pick_bias_cpu(&up, ids, bu, d.ffn as usize);
    }
    act_q8_1_cpu(&gate, &up, d.ffn as usize, Source::Dense, act)
}

pub fn combine_chain_cpu(w_down: &[u8], bias: Option<&[f32]>, act: &[BlockQ8_1], ids: &[i32], weights: &[f32], d: &FfnDims) -> Vec<f32> {
    let mut down = moe_gemv_cpu(w_down, act, ids, &d.down());
    if let Some(b) = bias {
        down = add_pick_bias_cpu(&down, ids, b, d.hidden as usize);
    }
    combine_cpu(&down, weights, d.top_k as usize, d.hidden as usize)
}

/// Device buffers of the gate/up kernel: weights `[experts·ffn]` rows each, xq q8_1 `[tokens,
/// hidden/32]`, ids `[tokens·top_k]`, out q8_1 `[tokens·top_k, ffn/32]` (any element types);
/// the gate and up biases `[experts, ffn]` when the epilogue is biased.
pub struct GateUpBuffers<'a, X, O> {
    pub w_gate: &'a CudaSlice<u8>,
    pub w_up: &'a CudaSlice<u8>,
    pub xq: &'a CudaSlice<X>,
    pub ids: &'a CudaSlice<i32>,
    pub out: &'a mut CudaSlice<O>,
    pub bias: GateUpBias<'a, CudaSlice<f32>>,
}

/// The fused gate/up GEMV on the device under `act`. Buffers too small for the shape are refused.
pub fn launch_gate_up<X: DeviceRepr, O: DeviceRepr>(
    gpu: &Gpu,
    tokens: u64,
    d: &FfnDims,
    act: Act,
    b: GateUpBuffers<'_, X, O>,
) -> Result<(), GpuError> {
    let p = gate_up_plan(tokens, d, gpu.limits())?;
    let pairs = tokens * d.top_k as u64;
    let w_bytes = d.experts as u64 * d.ffn as u64 * d.wtype.row_bytes(d.hidden as usize) as u64;
    let bias_bytes = 4 * d.experts as u64 * d.ffn as u64;
    let [b_gate, b_up] = b.bias.map_or([None, None], |[g, u]| [Some(g), Some(u)]);
    let mut need = vec![
        ("w_gate", b.w_gate.len() as u64, w_bytes),
        ("w_up", b.w_up.len() as u64, w_bytes),
        ("xq", bytes_of(b.xq.len(), size_of::<X>()), q8_1_bytes(tokens, d.hidden)),
        ("ids", bytes_of(b.ids.len(), 4), 4 * pairs),
        ("out", bytes_of(b.out.len(), size_of::<O>()), q8_1_bytes(pairs, d.ffn)),
    ];
    for (name, bias) in [("gate bias", b_gate), ("up bias", b_up)] {
        need.extend(bias.map(|v| (name, bytes_of(v.len(), 4), bias_bytes)));
    }
    require_bytes(&p, &need)?;
    let f = gpu.function(&MOE_GEMV, GATE_UP_KERNEL)?;
    let (wtype, top_k, n, k) = (d.wtype.code(), d.top_k as i32, d.ffn as i32, d.hidden as i32);
    let (clamped, alpha, limit) = act.args();
    let null = 0u64;
    gpu.launch(&p, &f, |a| {
        a.arg(b.w_gate).arg(b.w_up).arg(&wtype).arg(b.xq).arg(b.ids).arg(b.out).arg(&top_k).arg(&n).arg(&k);
        for bias in [b_gate, b_up] {
            match bias {
                Some(v) => a.arg(v),
                None => a.arg(&null),
            };
        }
        a.arg(&clamped).arg(&alpha).arg(&limit);
    })?;
    Ok(())
}

/// Device buffers of the combine kernel: down weights `[experts·hidden]` rows, act q8_1
/// `[tokens·top_k, ffn/32]`, ids and router weights `[tokens·top_k]`, out f32 `[tokens, hidden]`
/// (any 4-byte element type); the down bias `[experts, hidden]` when the epilogue is biased.
pub struct CombineBuffers<'a, A, O> {
    pub w_down: &'a CudaSlice<u8>,
    pub act: &'a CudaSlice<A>,
    pub ids: &'a CudaSlice<i32>,
    pub weights: &'a CudaSlice<f32>,
    pub out: &'a mut CudaSlice<O>,
    pub bias: Option<&'a CudaSlice<f32>>,
}

/// The fused down GEMV + weighted combine on the device. Buffers too small are refused.
pub fn launch_combine<A: DeviceRepr, O: DeviceRepr>(
    gpu: &Gpu,
    tokens: u64,
    d: &FfnDims,
    b: CombineBuffers<'_, A, O>,
) -> Result<(), GpuError> {
    let p = combine_plan(tokens, d, gpu.limits())?;
    let pairs = tokens * d.top_k as u64;
    let w_bytes = d.experts as u64 * d.hidden as u64 * d.wtype.row_bytes(d.ffn as usize) as u64;
    let out_elem = if size_of::<O>() == 4 { 0 } else { u64::MAX };
    let mut need = vec![
        ("w_down", b.w_down.len() as u64, w_bytes),
        ("act", bytes_of(b.act.len(), size_of::<A>()), q8_1_bytes(pairs, d.ffn)),
        ("ids", bytes_of(b.ids.len(), 4), 4 * pairs),
        ("weights", bytes_of(b.weights.len(), 4), 4 * pairs),
        ("out (4-byte elements)", bytes_of(b.out.len(), size_of::<O>()), (4 * tokens * d.hidden as u64).max(out_elem)),
    ];
    need.extend(b.bias.map(|v| ("down bias", bytes_of(v.len(), 4), 4 * d.experts as u64 * d.hidden as u64)));
    require_bytes(&p, &need)?;
    let f = gpu.function(&MOE_GEMV, COMBINE_KERNEL)?;
    let rows = combine_rows(d.top_k, gpu.limits()) as i32;
    let (wtype, top_k, n, k) = (d.wtype.code(), d.top_k as i32, d.hidden as i32, d.ffn as i32);
    let null = 0u64;
    gpu.launch(&p, &f, |a| {
        a.arg(b.w_down).arg(&wtype).arg(b.act).arg(b.ids).arg(b.weights).arg(b.out).arg(&top_k).arg(&n).arg(&k).arg(&rows);
        match b.bias {
            Some(v) => a.arg(v),
            None => a.arg(&null),
        };
    })?;
    Ok(())
}

/// Counts where the gate/up kernel's flattened indexes pass 2^31 − 1.
pub fn gate_up_critical_counts(c: &FusedCase, _limits: &DeviceLimits) -> Vec<Critical> {
    let d = c.dims;
    let (top_k, ffn, hidden) = (d.top_k as u64, d.ffn as u64, d.hidden as u64);
    let mut v = vec![Critical::new(1, "single token (one decode step)")];
    v.extend(overflow_point(top_k * (ffn / QK as u64), "moe_gemv_swiglu_q8_1: out block pair·(F/32) + tile passes 2^31 − 1"));
    v.extend(overflow_point(hidden / QK as u64, "moe_gemv_swiglu_q8_1: xq block t·(H/32) passes 2^31 − 1"));
    v
}

/// Counts where the combine kernel's flattened indexes pass 2^31 − 1.
pub fn combine_critical_counts(c: &FusedCase, _limits: &DeviceLimits) -> Vec<Critical> {
    let d = c.dims;
    let (top_k, ffn, hidden) = (d.top_k as u64, d.ffn as u64, d.hidden as u64);
    let mut v = vec![Critical::new(1, "single token (one decode step)")];
    v.extend(overflow_point(hidden, "moe_gemv_combine: out[t·H + n] passes 2^31 − 1"));
    v.extend(overflow_point(top_k * (ffn / QK as u64), "moe_gemv_combine: act block pair·(F/32) passes 2^31 − 1"));
    v
}

fn gate_up_w_bytes(d: &FfnDims) -> u64 {
    d.experts as u64 * d.ffn as u64 * d.wtype.row_bytes(d.hidden as usize) as u64
}

/// Gate/up self-test memory: ids, two weight tensors (and their biases), x and xq, the chain's
/// f32 gate and up, two guarded outputs.
pub fn gate_up_device_bytes(tokens: u64, c: &FusedCase) -> u64 {
    let d = c.dims;
    let pairs = tokens * d.top_k as u64;
    let biases = if c.epilogue.biased { 8 * d.experts as u64 * d.ffn as u64 } else { 0 };
    4 * pairs
        + biases
        + 2 * gate_up_w_bytes(&d)
        + 4 * tokens * d.hidden as u64
        + q8_1_bytes(tokens, d.hidden)
        + 8 * pairs * d.ffn as u64
        + 2 * (q8_1_bytes(pairs, d.ffn) + 4 * GUARD_WORDS as u64)
}

/// Combine self-test memory: ids, router weights, down weights (and bias), the pairs' f32 and
/// q8_1 activations, the chain's down output, two guarded outputs.
pub fn combine_device_bytes(tokens: u64, c: &FusedCase) -> u64 {
    let d = c.dims;
    let pairs = tokens * d.top_k as u64;
    let w = d.experts as u64 * d.hidden as u64 * d.wtype.row_bytes(d.ffn as usize) as u64;
    let bias = if c.epilogue.biased { 4 * d.experts as u64 * d.hidden as u64 } else { 0 };
    8 * pairs
        + bias
        + w
        + 4 * pairs * d.ffn as u64
        + q8_1_bytes(pairs, d.ffn)
        + 4 * pairs * d.hidden as u64
        + 2 * (4 * tokens * d.hidden as u64 + 4 * GUARD_WORDS as u64)
}

const SEED_X: u64 = 0x70;
const SEED_GATE: u64 = 0x71;
const SEED_UP: u64 = 0x72;
const SEED_DOWN: u64 = 0x73;
const SEED_ROUTE: u64 = 0x74;
const SEED_WEIGHTS: u64 = 0x75;
const SEED_BIAS_GATE: u64 = 0x76;
const SEED_BIAS_UP: u64 = 0x77;
const SEED_BIAS_DOWN: u64 = 0x78;
/// The biases' scale: the dots' own size at these inputs, so that biased values cross the
/// clamped activation's limits both ways.
const BIAS_SCALE: f32 = 8.0;
/// Rows (pairs or tokens) compared when there are more.
const SAMPLE: usize = 32;

/// Expert `e`'s bias row `[width]` of the self-test's bias `[experts, width]` made from `seed`.
fn bias_row(seed: u64, e: u64, width: usize) -> Vec<f32> {
    uniform_row(seed, e * width as u64, width, BIAS_SCALE)
}

/// The self-test's bias `[experts, width]` from `seed` on the device (equal to [`bias_row`]s).
fn bias_dev(gpu: &Gpu, seed: u64, experts: u32, width: u32) -> Result<CudaSlice<f32>, GpuError> {
    let n = experts as usize * width as usize;
    let mut b = gpu.alloc::<f32>(n)?;
    fill_uniform(gpu, &mut b, n, seed, BIAS_SCALE)?;
    Ok(b)
}

fn words_to_blocks(words: &[u32]) -> Vec<BlockQ8_1> {
    let bytes: Vec<u8> = words.iter().flat_map(|x| x.to_le_bytes()).collect();
    bytes.chunks_exact(BLOCK_Q8_1_BYTES).map(BlockQ8_1::from_bytes).collect()
}

/// Gate/up self-test: the fused kernel and the unfused device chain (`moe_gemv` ×2, the picks'
/// biases when the epilogue has them, `swiglu_q8_1` under its activation) on the same inputs; sampled pairs must match the chain byte for byte
/// (`int_mismatches` counts differing blocks) and the twin within [`GATE_UP_TOLERANCE`].
pub fn run_gate_up(gpu: &Gpu, tokens: u64, c: &FusedCase) -> Result<Outcome, GpuError> {
    stage_gate_up(gpu, tokens, c).map(Staged::finish)
}

/// [`run_gate_up`]'s GPU half: both launches, the poison check and the sampled pairs' fused and
/// unfused blocks downloaded and compared; the twin is the host check.
pub fn stage_gate_up(gpu: &Gpu, tokens: u64, c: &FusedCase) -> Result<Staged, GpuError> {
    let d = c.dims;
    gate_up_plan(tokens, &d, gpu.limits())?;
    let (k, top_k) = (d.hidden as usize, d.top_k as usize);
    let pairs = tokens as usize * top_k;
    let ids = route(c.routing, tokens as usize, d.experts as usize, top_k, GEMM_TILE_M as usize, SEED_ROUTE);
    let ids_dev = gpu.upload(&ids)?;
    let w_blocks = d.experts as usize * d.ffn as usize * d.wtype.blocks_per_row(k);
    let mut w_gate = gpu.alloc::<u8>(w_blocks * d.wtype.block_bytes())?;
    let mut w_up = gpu.alloc::<u8>(w_blocks * d.wtype.block_bytes())?;
    fill_weights(gpu, &mut w_gate, w_blocks, SEED_GATE, d.wtype)?;
    fill_weights(gpu, &mut w_up, w_blocks, SEED_UP, d.wtype)?;
    let ep = c.epilogue;
    let biases = if ep.biased {
        Some([bias_dev(gpu, SEED_BIAS_GATE, d.experts, d.ffn)?, bias_dev(gpu, SEED_BIAS_UP, d.experts, d.ffn)?])
    } else {
        None
    };
    let bias = biases.as_ref().map(|[g, u]| [g, u]);
    let mut xq = gpu.alloc::<u8>(q8_1_bytes(tokens, d.hidden) as usize)?;
    let mut x = gpu.alloc::<f32>(tokens as usize * k)?;
    fill_uniform(gpu, &mut x, tokens as usize * k, SEED_X, 1.0)?;
    quantize::launch(gpu, &x, tokens, d.hidden, tokens, Source::Dense, &mut xq)?;
    drop(x);
    let row_words = d.ffn as usize / QK * BLOCK_WORDS;
    let mut fused = Guarded::new(gpu, pairs * row_words)?;
    let mut chain = Guarded::new(gpu, pairs * row_words)?;
    gpu.synchronize()?;
    let start = std::time::Instant::now();
    let bufs = GateUpBuffers { w_gate: &w_gate, w_up: &w_up, xq: &xq, ids: &ids_dev, out: &mut fused.buf, bias };
    launch_gate_up(gpu, tokens, &d, ep.act, bufs)?;
    gpu.synchronize()?;
    let kernel_ms = start.elapsed().as_secs_f64() * 1e3;
    {
        let mut gate = gpu.alloc::<f32>(pairs * d.ffn as usize)?;
        let mut up = gpu.alloc::<f32>(pairs * d.ffn as usize)?;
        for (i, (w, y)) in [(&w_gate, &mut gate), (&w_up, &mut up)].into_iter().enumerate() {
            moe_gemv::launch(gpu, tokens, &d.gate_up(), GemvBuffers { w, xq: &xq, ids: &ids_dev, y: &mut *y })?;
            if let Some(b) = bias {
                bias::launch_picks(gpu, pairs as u64, d.experts, &mut y.as_view_mut(), &ids_dev.as_view(), &b[i].as_view())?;
            }
        }
        let input = GateUp::Separate { gate: &gate, up: &up };
        swiglu::launch_q8_1_act(gpu, (pairs as u64, d.ffn), input, ep.act, Source::Dense, pairs as u64, &mut chain.buf)?;
        gpu.synchronize()?;
    }
    let (unwritten, past_end) = fused.check(gpu, BLOCK_WORDS)?;
    let sampled = sample_rows(pairs as u64, top_k as u64, SAMPLE, tokens);
    // Downloads here; the twin (hashing every weight row of each sampled pair's expert) is the
    // host check, run beside the next cases' GPU halves.
    let mut differing = 0u64;
    let mut got = Vec::with_capacity(sampled.len());
    let unfused = download_rows(gpu, &chain.buf, &sampled, row_words)?;
    for ((&p, fused_row), unfused) in sampled.iter().zip(download_rows(gpu, &fused.buf, &sampled, row_words)?).zip(&unfused) {
        differing += fused_row.chunks(BLOCK_WORDS).zip(unfused.chunks(BLOCK_WORDS)).filter(|(a, b)| a != b).count() as u64;
        got.push((p, ids[p as usize] as u64, fused_row));
    }
    Ok(Staged::Check(Box::new(move || {
        let keys: Vec<(u64, u64)> = got.iter().map(|&(p, e, _)| (p, e)).collect();
        let want = gate_up_want(&d, ep, &keys);
        let mut err = RelErr::default();
        for ((p, _, got), want) in got.iter().zip(&want) {
            err.add_slice(p * d.ffn as u64, &dequantize_q8_1(&words_to_blocks(got)), want);
        }
        let mut check = Check::of_floats(&err, GATE_UP_TOLERANCE, (unwritten, past_end), kernel_ms);
        check.int_mismatches = differing;
        if differing > 0 {
            check.note = format!("{differing} q8_1 blocks differ from the unfused chain's; {}", check.note);
        }
        Outcome::Ran(check)
    })))
}

/// Combine self-test: the fused kernel and the unfused device chain (`moe_gemv` down, the picks'
/// down bias when the epilogue has it, `moe_combine`) on the same inputs; sampled tokens must match the chain bit for bit
/// (`int_mismatches` counts differing values) and the twin within [`COMBINE_TOLERANCE`].
pub fn run_combine(gpu: &Gpu, tokens: u64, c: &FusedCase) -> Result<Outcome, GpuError> {
    stage_combine(gpu, tokens, c).map(Staged::finish)
}

/// [`run_combine`]'s GPU half: both launches, the poison check and the sampled tokens' fused and
/// unfused outputs downloaded and compared; the twin is the host check.
pub fn stage_combine(gpu: &Gpu, tokens: u64, c: &FusedCase) -> Result<Staged, GpuError> {
    let d = c.dims;
    combine_plan(tokens, &d, gpu.limits())?;
    let (ffn, n, top_k) = (d.ffn as usize, d.hidden as usize, d.top_k as usize);
    let pairs = tokens as usize * top_k;
    let ids = route(c.routing, tokens as usize, d.experts as usize, top_k, GEMM_TILE_M as usize, SEED_ROUTE);
    let ids_dev = gpu.upload(&ids)?;
    let w_blocks = d.experts as usize * n * d.wtype.blocks_per_row(ffn);
    let mut w_down = gpu.alloc::<u8>(w_blocks * d.wtype.block_bytes())?;
    fill_weights(gpu, &mut w_down, w_blocks, SEED_DOWN, d.wtype)?;
    let biased = c.epilogue.biased;
    let bias = if biased { Some(bias_dev(gpu, SEED_BIAS_DOWN, d.experts, d.hidden)?) } else { None };
    let mut weights = gpu.alloc::<f32>(pairs)?;
    fill_uniform(gpu, &mut weights, pairs, SEED_WEIGHTS, 1.0)?;
    let mut act = gpu.alloc::<u8>(q8_1_bytes(pairs as u64, d.ffn) as usize)?;
    let mut x = gpu.alloc::<f32>(pairs * ffn)?;
    fill_uniform(gpu, &mut x, pairs * ffn, SEED_X, 1.0)?;
    quantize::launch(gpu, &x, pairs as u64, d.ffn, pairs as u64, Source::Dense, &mut act)?;
    drop(x);
    let mut fused = Guarded::new(gpu, tokens as usize * n)?;
    let mut chain = Guarded::new(gpu, tokens as usize * n)?;
    gpu.synchronize()?;
    let start = std::time::Instant::now();
    let bufs = CombineBuffers { w_down: &w_down, act: &act, ids: &ids_dev, weights: &weights, out: &mut fused.buf, bias: bias.as_ref() };
    launch_combine(gpu, tokens, &d, bufs)?;
    gpu.synchronize()?;
    let kernel_ms = start.elapsed().as_secs_f64() * 1e3;
    {
        let mut down = gpu.alloc::<f32>(pairs * n)?;
        moe_gemv::launch(gpu, pairs as u64, &d.down(), GemvBuffers { w: &w_down, xq: &act, ids: &ids_dev, y: &mut down })?;
        if let Some(b) = &bias {
            bias::launch_picks(gpu, pairs as u64, d.experts, &mut down.as_view_mut(), &ids_dev.as_view(), &b.as_view())?;
        }
        moe_combine::launch(gpu, tokens, &CombineCase { top_k: d.top_k, n: d.hidden }, &down, &weights, &mut chain.buf)?;
        gpu.synchronize()?;
    }
    let (unwritten, past_end) = fused.check(gpu, 1)?;
    let sampled = sample_rows(tokens, 1, SAMPLE, tokens);
    // Downloads here; the twin (every down row of each sampled token's experts) is the host check.
    let mut differing = 0u64;
    let mut got = Vec::with_capacity(sampled.len());
    let unfused = chain.read_rows_f32(gpu, &sampled, n)?;
    for ((&t, fused_row), unfused) in sampled.iter().zip(fused.read_rows_f32(gpu, &sampled, n)?).zip(&unfused) {
        differing += fused_row.iter().zip(unfused).filter(|(a, b)| a.to_bits() != b.to_bits()).count() as u64;
        got.push((t, ids[t as usize * top_k..(t as usize + 1) * top_k].to_vec(), fused_row));
    }
    Ok(Staged::Check(Box::new(move || {
        let keys: Vec<(u64, &[i32])> = got.iter().map(|(t, ids, _)| (*t, ids.as_slice())).collect();
        let want = combine_want(&d, biased, &keys);
        let mut err = RelErr::default();
        for ((t, _, got), want) in got.iter().zip(&want) {
            err.add_slice(t * n as u64, got, want);
        }
        let mut check = Check::of_floats(&err, COMBINE_TOLERANCE, (unwritten, past_end), kernel_ms);
        check.int_mismatches = differing;
        if differing > 0 {
            check.note = format!("{differing} values differ from the unfused chain's; {}", check.note);
        }
        Outcome::Ran(check)
    })))
}

/// The twin of the sampled pairs `(pair, expert)` of a gate/up case: each pair's q8_1 row,
/// dequantized (what is compared). A pair's row depends on its token and expert only: each is
/// computed once per process and shared with the family's other cases, from the expert's gate
/// and up rows generated once per process.
fn gate_up_want(d: &FfnDims, ep: Epilogue, pairs: &[(u64, u64)]) -> Vec<Arc<Vec<f32>>> {
    let (k, top_k, ffn, rb) = (d.hidden as usize, d.top_k as u64, d.ffn as u64, d.wtype.row_bytes(d.hidden as usize));
    pairs
        .par_iter()
        .map(|&(p, e)| {
            let what = format!("{GATE_UP_KERNEL} gate{SEED_GATE:#x} up{SEED_UP:#x} x{SEED_X:#x} {d:?} {ep:?} expert {e}");
            shared_twin_row(&what, p, || {
                let t = p / top_k;
                let xq = quantize_row_q8_1(&uniform_row(SEED_X, t * k as u64, k, 1.0));
                let gate = shared_weight_rows(SEED_GATE, d.wtype, k, e * ffn, ffn);
                let up = shared_weight_rows(SEED_UP, d.wtype, k, e * ffn, ffn);
                let row = |up_row: bool, r: u64| {
                    let at = (r - e * ffn) as usize * rb;
                    &(if up_row { &up } else { &gate })[at..at + rb]
                };
                let biases = ep.biased.then(|| [SEED_BIAS_GATE, SEED_BIAS_UP].map(|seed| bias_row(seed, e, ffn as usize)));
                let bias = biases.as_ref().map(|[g, u]| [g.as_slice(), u.as_slice()]);
                dequantize_q8_1(&gate_up_pair(row, bias, ep.act, &xq, e, d))
            })
        })
        .collect()
}

/// The twin of the sampled tokens `(token, its top_k expert ids)` of a combine case: each
/// token's output row. A token's row depends on the token and its experts only: each is
/// computed once per process and shared with the family's other cases, from the experts' down
/// rows generated once per process.
fn combine_want(d: &FfnDims, biased: bool, tokens: &[(u64, &[i32])]) -> Vec<Arc<Vec<f32>>> {
    let (ffn, top_k) = (d.ffn as usize, d.top_k as usize);
    tokens
        .par_iter()
        .map(|&(t, ids)| {
            let what = format!("{COMBINE_KERNEL} down{SEED_DOWN:#x} x{SEED_X:#x} w{SEED_WEIGHTS:#x} {d:?} biased {biased} experts {ids:?}");
            shared_twin_row(&what, t, || {
                let acts: Vec<Vec<BlockQ8_1>> = (0..top_k as u64)
                    .map(|j| quantize_row_q8_1(&uniform_row(SEED_X, (t * top_k as u64 + j) * ffn as u64, ffn, 1.0)))
                    .collect();
                let ws = uniform_row(SEED_WEIGHTS, t * top_k as u64, top_k, 1.0);
                let (hidden, rb) = (d.hidden as u64, d.wtype.row_bytes(ffn));
                let down: Vec<(u64, Arc<Vec<u8>>)> =
                    ids.iter().map(|&e| (e as u64, shared_weight_rows(SEED_DOWN, d.wtype, ffn, e as u64 * hidden, hidden))).collect();
                let row = |r: u64| {
                    let w = &down.iter().find(|(e, _)| *e == r / hidden).expect("a slot's expert").1;
                    let at = (r % hidden) as usize * rb;
                    &w[at..at + rb]
                };
                let bias: Vec<Vec<f32>> =
                    if biased { ids.iter().map(|&e| bias_row(SEED_BIAS_DOWN, e as u64, hidden as usize)).collect() } else { Vec::new() };
                combine_token(row, |j| &acts[j], |j| bias.get(j).map(Vec::as_slice), ids, |j| ws[j], d)
            })
        })
        .collect()
}

/// The host work of a gate/up case without the device (the bench of the self-test's host
/// costs): the routing, the sampling and the twin of the sampled pairs.
#[cfg(test)]
pub(crate) fn gate_up_host_half(tokens: u64, c: &FusedCase) -> usize {
    let d = c.dims;
    let ids = route(c.routing, tokens as usize, d.experts as usize, d.top_k as usize, GEMM_TILE_M as usize, SEED_ROUTE);
    let sampled = sample_rows(tokens * d.top_k as u64, d.top_k as u64, SAMPLE, tokens);
    let keys: Vec<(u64, u64)> = sampled.iter().map(|&p| (p, ids[p as usize] as u64)).collect();
    gate_up_want(&d, c.epilogue, &keys).len()
}

/// [`gate_up_host_half`] for a combine case.
#[cfg(test)]
pub(crate) fn combine_host_half(tokens: u64, c: &FusedCase) -> usize {
    let d = c.dims;
    let top_k = d.top_k as usize;
    let ids = route(c.routing, tokens as usize, d.experts as usize, top_k, GEMM_TILE_M as usize, SEED_ROUTE);
    let sampled = sample_rows(tokens, 1, SAMPLE, tokens);
    let keys: Vec<(u64, &[i32])> = sampled.iter().map(|&t| (t, &ids[t as usize * top_k..(t as usize + 1) * top_k])).collect();
    combine_want(&d, c.epilogue.biased, &keys).len()
}

/// The self-test's handle on the gate/up kernel (registered in `selftest::case`).
pub struct GateUpFamily;

impl KernelFamily for GateUpFamily {
    type Case = FusedCase;

    fn run(gpu: &Gpu, tokens: u64, c: &FusedCase) -> Result<Outcome, GpuError> {
        run_gate_up(gpu, tokens, c)
    }

    fn stage(gpu: &Gpu, tokens: u64, c: &FusedCase) -> Result<Staged, GpuError> {
        stage_gate_up(gpu, tokens, c)
    }

    fn plans(tokens: u64, c: &FusedCase, limits: &DeviceLimits) -> Result<Vec<Launch>, PlanError> {
        Ok(vec![gate_up_plan(tokens, &c.dims, limits)?])
    }
}

/// The self-test's handle on the combine kernel (registered in `selftest::case`).
pub struct CombineFamily;

impl KernelFamily for CombineFamily {
    type Case = FusedCase;

    fn run(gpu: &Gpu, tokens: u64, c: &FusedCase) -> Result<Outcome, GpuError> {
        run_combine(gpu, tokens, c)
    }

    fn stage(gpu: &Gpu, tokens: u64, c: &FusedCase) -> Result<Staged, GpuError> {
        stage_combine(gpu, tokens, c)
    }

    fn plans(tokens: u64, c: &FusedCase, limits: &DeviceLimits) -> Result<Vec<Launch>, PlanError> {
        Ok(vec![combine_plan(tokens, &c.dims, limits)?])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testdata::uniform_f32;
    use crate::testdata::weight_row;
    use crate::thresholds::TOP_K_SET;

    fn qwen(top_k: u32, wtype: WeightType) -> FfnDims {
        FfnDims { experts: 128, top_k, hidden: 2048, ffn: 768, wtype }
    }

    fn small(wtype: WeightType) -> FfnDims {
        let b = wtype.block_size() as u32;
        // hidden: 3 weight blocks; ffn: 2 q8_1 tiles, and a whole number of weight blocks.
        FfnDims { experts: 5, top_k: 3, hidden: 3 * b, ffn: 64u32.max(b), wtype }
    }

    fn rows(seed: u64, count: u64, k: usize, wtype: WeightType) -> Vec<u8> {
        (0..count).flat_map(|r| weight_row(seed, r, k, wtype)).collect()
    }

    fn q8_rows(seed: u64, rows: usize, k: usize) -> Vec<BlockQ8_1> {
        let x: Vec<f32> = (0..(rows * k) as u64).map(|i| uniform_f32(seed, i, 1.0)).collect();
        x.chunks(k).flat_map(quantize_row_q8_1).collect()
    }

    /// Every epilogue the engine runs: qwen3moe's plain SwiGLU, gpt-oss's biases and clamp.
    const EPILOGUES: [Epilogue; 4] = [
        Epilogue { act: Act::SwiGlu, biased: false },
        Epilogue { act: Act::SwiGlu, biased: true },
        Epilogue { act: Act::GPT_OSS, biased: false },
        Epilogue { act: Act::GPT_OSS, biased: true },
    ];

    #[test]
    fn gate_up_twin_equals_the_chain_of_twins() {
        for wtype in WeightType::ALL {
            for ep in EPILOGUES {
                let d = small(wtype);
                let tokens = 4;
                let (h, f) = (d.hidden as usize, d.ffn as usize);
                let w_gate = rows(SEED_GATE, (d.experts * d.ffn) as u64, h, wtype);
                let w_up = rows(SEED_UP, (d.experts * d.ffn) as u64, h, wtype);
                let xq = q8_rows(SEED_X, tokens, h);
                let ids = route(Routing::Uniform, tokens, d.experts as usize, d.top_k as usize, 64, SEED_ROUTE);
                let [bg, bu] = [SEED_BIAS_GATE, SEED_BIAS_UP].map(|seed| uniform_row(seed, 0, d.experts as usize * f, BIAS_SCALE));
                let bias = ep.biased.then_some([bg.as_slice(), bu.as_slice()]);
                let fused = gate_up_cpu(&w_gate, &w_up, (bias, ep.act), &xq, &ids, &d);
                let chain = gate_up_chain_cpu(&w_gate, &w_up, (bias, ep.act), &xq, &ids, &d);
                assert_eq!(fused.len(), tokens * d.top_k as usize * f / QK);
                assert!(fused == chain, "{wtype} {ep:?}: fused twin differs from moe_gemv x2 (+ biases) + swiglu_q8_1");
                if ep != EPILOGUES[0] {
                    let plain = gate_up_cpu(&w_gate, &w_up, (None, Act::SwiGlu), &xq, &ids, &d);
                    assert!(fused != plain, "{wtype} {ep:?}: the epilogue changed nothing");
                }
            }
        }
    }

    #[test]
    fn combine_twin_equals_the_chain_of_twins() {
        for wtype in WeightType::ALL {
            for biased in [false, true] {
                let d = FfnDims { hidden: 40, ffn: 3 * wtype.block_size() as u32, ..small(wtype) };
                let tokens = 4;
                let pairs = tokens * d.top_k as usize;
                let w_down = rows(SEED_DOWN, (d.experts * d.hidden) as u64, d.ffn as usize, wtype);
                let act = q8_rows(SEED_X, pairs, d.ffn as usize);
                let ids = route(Routing::Uniform, tokens, d.experts as usize, d.top_k as usize, 64, SEED_ROUTE);
                let weights = uniform_row(SEED_WEIGHTS, 0, pairs, 1.0);
                let b = uniform_row(SEED_BIAS_DOWN, 0, (d.experts * d.hidden) as usize, BIAS_SCALE);
                let bias = biased.then_some(b.as_slice());
                let fused = combine_fused_cpu(&w_down, bias, &act, &ids, &weights, &d);
                let chain = combine_chain_cpu(&w_down, bias, &act, &ids, &weights, &d);
                assert_eq!(fused.len(), tokens * d.hidden as usize);
                let same = fused.iter().zip(&chain).all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{wtype} biased {biased}: fused twin differs from the chain");
            }
        }
    }

    /// The shared-row twins the self-test compares with equal the whole-tensor twins, biases and
    /// clamp included (the device fills its biases from the same seeds).
    #[test]
    fn sampled_twins_equal_the_whole_twins_under_each_epilogue() {
        let wtype = WeightType::Q8_0;
        let d = small(wtype);
        let tokens = 3u64;
        let (h, f, k) = (d.hidden as usize, d.ffn as usize, d.top_k as usize);
        let ids = route(Routing::Uniform, tokens as usize, d.experts as usize, k, GEMM_TILE_M as usize, SEED_ROUTE);
        let xq: Vec<BlockQ8_1> = (0..tokens).flat_map(|t| quantize_row_q8_1(&uniform_row(SEED_X, t * h as u64, h, 1.0))).collect();
        let w_gate = rows(SEED_GATE, (d.experts * d.ffn) as u64, h, wtype);
        let w_up = rows(SEED_UP, (d.experts * d.ffn) as u64, h, wtype);
        for ep in EPILOGUES {
            let [bg, bu] = [SEED_BIAS_GATE, SEED_BIAS_UP].map(|seed| uniform_row(seed, 0, d.experts as usize * f, BIAS_SCALE));
            let bias = ep.biased.then_some([bg.as_slice(), bu.as_slice()]);
            let whole = dequantize_q8_1(&gate_up_cpu(&w_gate, &w_up, (bias, ep.act), &xq, &ids, &d));
            let keys: Vec<(u64, u64)> = (0..tokens * k as u64).map(|p| (p, ids[p as usize] as u64)).collect();
            for ((p, _), want) in keys.iter().zip(gate_up_want(&d, ep, &keys)) {
                assert_eq!(want.as_slice(), &whole[*p as usize * f..(*p as usize + 1) * f], "{ep:?} pair {p}");
            }
        }
    }

    #[test]
    fn plans_cover_every_item_for_all_counts_top_k_and_limits() {
        let counts: Vec<u64> = (1..=64).chain([8191, 8192, 8193, 65_535, 1 << 20]).collect();
        for limits in DeviceLimits::recorded() {
            assert_eq!(warps(&limits), 16, "{}", limits.name);
            for top_k in TOP_K_SET.into_iter().chain(1..=8).chain([32, 128]) {
                let d = qwen(top_k, WeightType::Q4_0);
                let rows = combine_rows(top_k, &limits) as u64;
                for &t in &counts {
                    let g = gate_up_plan(t, &d, &limits).unwrap_or_else(|e| panic!("{e}"));
                    g.check_cover().unwrap_or_else(|e| panic!("{e}"));
                    assert_eq!(g.grid, [(t * top_k as u64) as u32, 24, 1]);
                    let c = combine_plan(t, &d, &limits).unwrap_or_else(|e| panic!("{e}"));
                    c.check_cover().unwrap_or_else(|e| panic!("{e}"));
                    assert_eq!(c.grid, [t as u32, 2048u64.div_ceil(rows) as u32, 1]);
                    assert_eq!(c.shared_mem as u64, 4 * rows * top_k as u64);
                    if t <= 8 {
                        for p in [&g, &c] {
                            for i in 0..p.cover.len() {
                                assert!(p.simulate_cover(i).iter().all(|&h| h == 1), "{} t{t} k{top_k}", p.kernel);
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn combine_rows_split_the_warps_among_slots() {
        let l = DeviceLimits::gb10();
        assert_eq!(combine_rows(8, &l), 2);
        assert_eq!(combine_rows(1, &l), 16);
        assert_eq!(combine_rows(3, &l), 5);
        assert_eq!(combine_rows(32, &l), 1);
        // A hidden width with a tail tile: the last rows read row N - 1 and are masked.
        let d = FfnDims { hidden: 2049, ..qwen(3, WeightType::Q8_0) };
        let p = combine_plan(2, &d, &l).unwrap();
        assert_eq!(p.grid[1], 410);
        assert_eq!(p.simulate_cover(1).iter().filter(|&&h| h == 1).count(), 2049);
    }

    #[test]
    fn bad_shapes_are_refused() {
        let l = DeviceLimits::h200();
        let d = qwen(8, WeightType::Q8_0);
        let un = |r: Result<Launch, PlanError>| matches!(r, Err(PlanError::Unsupported { .. }));
        // The input width (K) is hidden for gate/up, ffn for the combine.
        type Plan = fn(u64, &FfnDims, &DeviceLimits) -> Result<Launch, PlanError>;
        for (plan, narrow) in [(gate_up_plan as Plan, FfnDims { hidden: 100, ..d }), (combine_plan as Plan, FfnDims { ffn: 100, ..d })] {
            assert!(un(plan(0, &d, &l)));
            assert!(un(plan(1, &FfnDims { top_k: 129, ..d }, &l)));
            assert!(un(plan(1, &FfnDims { top_k: 0, ..d }, &l)));
            assert!(un(plan(1, &narrow, &l)));
        }
        // gate/up: the FFN width is whole q8_1 blocks; K-quant inputs whole super-blocks.
        let e = gate_up_plan(1, &FfnDims { ffn: 770, ..d }, &l).unwrap_err();
        assert!(e.to_string().contains("multiple of 32"), "{e}");
        assert!(un(gate_up_plan(1, &FfnDims { hidden: 2048 + 32, wtype: WeightType::Q4K, ..d }, &l)));
        assert!(un(combine_plan(1, &FfnDims { ffn: 768 + 32, wtype: WeightType::Q4K, ..d }, &l)));
        // grid.y past the device: a typed error naming the axis.
        let wide = FfnDims { ffn: 32 * 65_536, ..d };
        assert!(matches!(gate_up_plan(1, &wide, &l), Err(PlanError::GridDim { axis: 'y', .. })));
        let wide = FfnDims { hidden: 2 * 65_535 + 1, ..d };
        assert!(matches!(combine_plan(1, &wide, &l), Err(PlanError::GridDim { axis: 'y', .. })));
        // Shared memory of the combine: rows x top_k floats.
        let many = FfnDims { experts: 20_000, top_k: 16_384, ..d };
        let e = combine_plan(1, &many, &l).unwrap_err();
        assert!(e.to_string().contains("shared memory"), "{e}");
    }

    #[test]
    fn overflow_points_for_qwen3_shape() {
        let c = FusedCase { dims: qwen(8, WeightType::Q4_0), routing: Routing::Uniform, epilogue: Epilogue::default() };
        let gu: Vec<u64> = gate_up_critical_counts(&c, &DeviceLimits::h200()).iter().map(|c| c.tokens).collect();
        // out blocks: (2^31 − 1) / (8 · 24) = 11184810.6.
        assert!(gu.contains(&11_184_810) && gu.contains(&11_184_811), "{gu:?}");
        let cb: Vec<u64> = combine_critical_counts(&c, &DeviceLimits::h200()).iter().map(|c| c.tokens).collect();
        // out: (2^31 − 1) / 2048 = 1048575.99.
        assert!(cb.contains(&1_048_575) && cb.contains(&1_048_576), "{cb:?}");
    }
}
