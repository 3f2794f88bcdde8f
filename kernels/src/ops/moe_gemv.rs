//! Routed-expert GEMV for small token counts (decode), and its negative control.
//!
//! `y[pair, n] = dot(W[ids[pair]][n, :], xq[pair / top_k, :])` for every (token, slot) pair,
//! W `[experts, N, K]` in any [`WeightType`] (K a multiple of 256 for the K-quants), xq dense
//! q8_1 `[tokens, K/32]`, y f32 `[tokens·top_k, N]`. With `top_k` 1 and the pairs as "tokens" it
//! takes one input row per pair (the down projection in decode).
//!
//! This is the kernel of the design's first failure: an engine launched it with the flat pair
//! index on `grid.z`, which the driver rejects from `tokens·top_k > 65535` (8192 tokens at
//! top_k 8). Here the pair is `grid.x` (limit 2^31 − 1) and `grid.y` carries only the column
//! tiles of N. The broken geometry is kept as a negative control ([`negative_gridz_plan`],
//! `cuda/neg_gemv_gridz.cu`): the self-test must see the driver reject it, named.

use cudarc::driver::{CudaSlice, PushKernelArg};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::check::{Check, KernelFamily, Outcome, RelErr, Staged, sample_rows};
use crate::cuda::{Gpu, GpuError};
use crate::launch::{Cover, Launch, PlanError};
use crate::limits::DeviceLimits;
use crate::ops::moe_align::GEMM_TILE_M;
use crate::ops::quantize;
use crate::ops::testdata::{GUARD_WORDS, Guarded, fill_uniform, fill_weights};
use crate::quant::{BLOCK_Q8_1_BYTES, BlockQ8_1, QK, WeightType, quantize_row_q8_1};
use crate::routing::{Routing, route};
use crate::sources::{KernelSource, MOE_GEMV, NEG_GEMV_GRIDZ};
use crate::testdata::{uniform_row, weight_row};
use crate::thresholds::{Critical, overflow_point};

pub const KERNEL: &str = "moe_gemv";
/// Negative control: the same GEMV launched with tokens x top_k on grid.z (kernel in `cuda/neg_gemv_gridz.cu`).
pub const NEG_GRIDZ_KERNEL: &str = "moe_gemv_gridz_broken";
/// Output rows per block, one warp each.
pub const ROWS_PER_BLOCK: u32 = 4;
/// Same block formula as the twin; only the f32 summation order over blocks (lane partials,
/// then the warp's butterfly) and FMA contraction differ: ~1e-6 of the largest output. The
/// K-quant terms are grouped per 32-wide block, not per super-block: at most 5.3e-7
/// (`quant::kquants` tests repeat the device's arithmetic).
pub const TOLERANCE: f64 = 1e-4;

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct GemvCase {
    pub experts: u32,
    pub top_k: u32,
    /// Output rows per expert.
    pub n: u32,
    /// Input width.
    pub k: u32,
    pub wtype: WeightType,
    /// How the self-test routes its tokens (the kernel takes any ids).
    pub routing: Routing,
}

/// What the kernel needs of a routed GEMV's shape (the case without its test routing).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemvDims {
    pub experts: u32,
    pub top_k: u32,
    pub n: u32,
    pub k: u32,
    pub wtype: WeightType,
}

impl GemvCase {
    pub fn dims(&self) -> GemvDims {
        GemvDims { experts: self.experts, top_k: self.top_k, n: self.n, k: self.k, wtype: self.wtype }
    }
}

/// The device buffers of one call: `w` `[experts·n]` weight rows, `xq` q8_1 `[tokens, k/32]`
/// (any element type: the kernel sees bytes), `ids` `[tokens·top_k]` expert ids, `y` f32
/// `[tokens·top_k, n]` (any 4-byte element type).
pub struct GemvBuffers<'a, X, Y> {
    pub w: &'a CudaSlice<u8>,
    pub xq: &'a CudaSlice<X>,
    pub ids: &'a CudaSlice<i32>,
    pub y: &'a mut CudaSlice<Y>,
}

fn describe(tokens: u64, d: &GemvDims) -> String {
    format!("tokens={tokens} experts={} top_k={} n={} k={} {}", d.experts, d.top_k, d.n, d.k, d.wtype)
}

fn unsupported(kernel: &str, what: impl Into<String>, shape: &str) -> PlanError {
    PlanError::Unsupported { kernel: kernel.into(), what: what.into(), shape: shape.into() }
}

/// Shape constraints of both variants (the device limits are the plan's business).
fn check_dims(kernel: &str, tokens: u64, d: &GemvDims, shape: &str) -> Result<(), PlanError> {
    let what = if tokens == 0 {
        "no tokens".to_string()
    } else if d.experts == 0 || d.top_k == 0 || d.top_k > d.experts {
        format!("needs 1 <= top_k ({}) <= experts ({})", d.top_k, d.experts)
    } else if d.n == 0 || d.n > i32::MAX as u32 {
        format!("output width N = {} must be in 1..2^31", d.n)
    } else if let Some(what) = d.wtype.check_row_width(d.k as u64) {
        format!("input width: {what}")
    } else {
        return Ok(());
    };
    Err(unsupported(kernel, what, shape))
}

/// Every launch a routed GEMV of `tokens` makes (one).
pub fn plans(tokens: u64, c: &GemvCase, limits: &DeviceLimits) -> Result<Vec<Launch>, PlanError> {
    Ok(vec![plan(tokens, &c.dims(), limits)?])
}

/// Pairs on `grid.x`, column tiles of `ROWS_PER_BLOCK` rows on `grid.y` (bounded by N: a
/// typed error past the device's `grid.y`), one warp per row.
pub fn plan(tokens: u64, d: &GemvDims, limits: &DeviceLimits) -> Result<Launch, PlanError> {
    let shape = describe(tokens, d);
    check_dims(KERNEL, tokens, d, &shape)?;
    let pairs = tokens * d.top_k as u64;
    let (n, rows) = (d.n as u64, ROWS_PER_BLOCK as u64);
    Launch::checked(
        KERNEL,
        shape,
        [pairs, n.div_ceil(rows), 1],
        [ROWS_PER_BLOCK * 32, 1, 1],
        0,
        vec![Cover::Tiles { axis: 0, items: pairs, per_block: 1 }, Cover::Tiles { axis: 1, items: n, per_block: rows }],
        limits,
    )
}

/// The failing engine's geometry, for the negative control only: grid = (1, column tiles,
/// tokens·top_k). Deliberately not built by `Launch::checked`, which would refuse it: the
/// point is that the driver rejects it and the self-test attributes that to this kernel.
pub fn negative_gridz_plan(tokens: u64, c: &GemvCase) -> Launch {
    let pairs = tokens * c.top_k as u64;
    Launch {
        kernel: NEG_GRIDZ_KERNEL.into(),
        grid: [1, c.n.div_ceil(ROWS_PER_BLOCK), u32::try_from(pairs).unwrap_or(u32::MAX)],
        block: [ROWS_PER_BLOCK * 32, 1, 1],
        shared_mem: 0,
        shape: describe(tokens, &c.dims()),
        cover: vec![
            Cover::Tiles { axis: 2, items: pairs, per_block: 1 },
            Cover::Tiles { axis: 1, items: c.n as u64, per_block: ROWS_PER_BLOCK as u64 },
        ],
    }
}

/// One pair's output row: `weight(r)` returns row `r = e·N + n` of W (the twin's per-pair step,
/// shared with the fused kernels' twins in `moe_gemv_fused`).
pub fn pair_row<R: AsRef<[u8]>>(weight: impl Fn(u64) -> R, x: &[BlockQ8_1], e: u64, d: &GemvDims, out: &mut [f32]) {
    for (n, o) in out.iter_mut().enumerate() {
        *o = d.wtype.dot_q8_1(weight(e * d.n as u64 + n as u64).as_ref(), x);
    }
}

/// CPU twin: `w` holds `experts·n` rows of `wtype.row_bytes(k)`, `xq` `[tokens, k/32]`, `ids`
/// `[tokens·top_k]`; returns y `[tokens·top_k, n]`.
pub fn moe_gemv_cpu(w: &[u8], xq: &[BlockQ8_1], ids: &[i32], d: &GemvDims) -> Vec<f32> {
    let (n, nb, rb) = (d.n as usize, d.k as usize / QK, d.wtype.row_bytes(d.k as usize));
    let mut y = vec![0.0f32; ids.len() * n];
    y.par_chunks_mut(n).enumerate().for_each(|(pair, out)| {
        let t = pair / d.top_k as usize;
        let weight = |r: u64| &w[r as usize * rb..(r as usize + 1) * rb];
        pair_row(weight, &xq[t * nb..(t + 1) * nb], ids[pair] as u64, d, out);
    });
    y
}

/// The routed GEMV on the device. Buffers too small for the shape are refused before launch.
pub fn launch<X, Y>(gpu: &Gpu, tokens: u64, d: &GemvDims, bufs: GemvBuffers<'_, X, Y>) -> Result<(), GpuError> {
    launch_as(gpu, &plan(tokens, d, gpu.limits())?, &MOE_GEMV, tokens, d, bufs)
}

/// Launches the kernel named by `plan` from `source` with the GEMV's arguments: the fixed
/// kernel and the negative control go through exactly this path.
fn launch_as<X, Y>(
    gpu: &Gpu,
    plan: &Launch,
    source: &KernelSource,
    tokens: u64,
    d: &GemvDims,
    b: GemvBuffers<'_, X, Y>,
) -> Result<(), GpuError> {
    let pairs = tokens * d.top_k as u64;
    let bytes = |len: usize, size: usize| (len * size) as u64;
    let need_w = d.experts as u64 * d.n as u64 * d.wtype.row_bytes(d.k as usize) as u64;
    let need_x = tokens * (d.k as u64 / QK as u64) * BLOCK_Q8_1_BYTES as u64;
    if bytes(b.w.len(), 1) < need_w
        || bytes(b.xq.len(), size_of::<X>()) < need_x
        || (b.ids.len() as u64) < pairs
        || bytes(b.y.len(), size_of::<Y>()) < pairs * d.n as u64 * 4
        || size_of::<Y>() != 4
    {
        let what = format!(
            "buffers too small: w {} B (needs {need_w}), xq {} B (needs {need_x}), ids {} (needs {pairs}), y {} B (4-byte elements)",
            b.w.len(),
            bytes(b.xq.len(), size_of::<X>()),
            b.ids.len(),
            bytes(b.y.len(), size_of::<Y>())
        );
        return Err(unsupported(&plan.kernel, what, &plan.shape).into());
    }
    let f = gpu.function(source, &plan.kernel)?;
    let (wtype, top_k, n, k) = (d.wtype.code(), d.top_k as i32, d.n as i32, d.k as i32);
    gpu.launch(plan, &f, |a| {
        a.arg(b.w).arg(&wtype).arg(b.xq).arg(b.ids).arg(b.y).arg(&top_k).arg(&n).arg(&k);
    })?;
    Ok(())
}

/// Token counts where this kernel's flattened indexes pass 2^31 − 1 (the catalogue adds the
/// grid.z points of the naive launch, where this one must keep passing).
pub fn critical_counts(c: &GemvCase, _limits: &DeviceLimits) -> Vec<Critical> {
    let (top_k, n, k) = (c.top_k as u64, c.n as u64, c.k as u64);
    let mut v = vec![Critical::new(1, "single token (one decode step)")];
    v.extend(overflow_point(top_k * n, "moe_gemv: y[pair·N + n] passes 2^31 − 1"));
    v.extend(overflow_point(k / QK as u64, "moe_gemv: block index t·K/32 of xq passes 2^31 − 1"));
    v
}

/// Peak device memory of the self-test: ids, weights, x and xq, y with its guard.
pub fn device_bytes(tokens: u64, c: &GemvCase) -> u64 {
    let (pairs, n, k) = (tokens * c.top_k as u64, c.n as u64, c.k as u64);
    let w = c.experts as u64 * n * c.wtype.row_bytes(c.k as usize) as u64;
    4 * pairs + w + 4 * tokens * k + tokens * (k / QK as u64) * BLOCK_Q8_1_BYTES as u64 + 4 * (pairs * n + GUARD_WORDS as u64)
}

const SEED_X: u64 = 0x30;
const SEED_W: u64 = 0x31;
const SEED_ROUTE: u64 = 0x32;
/// Pairs compared with the twin when there are more (plus the first and last tokens' pairs).
const SAMPLE_PAIRS: usize = 32;

/// Self-test of the fixed kernel.
pub fn run_case(gpu: &Gpu, tokens: u64, c: &GemvCase) -> Result<Outcome, GpuError> {
    stage_case(gpu, tokens, c).map(Staged::finish)
}

/// [`run_case`]'s GPU half ([`stage_plan`]).
pub fn stage_case(gpu: &Gpu, tokens: u64, c: &GemvCase) -> Result<Staged, GpuError> {
    let p = plan(tokens, &c.dims(), gpu.limits())?;
    stage_plan(gpu, tokens, c, &p, &MOE_GEMV)
}

/// The negative control: same inputs and check as [`run_case`], launched with the grid.z
/// geometry. Passes while tokens·top_k <= 65535; above, the driver rejects the launch and the
/// error (naming this kernel and its grid) comes back through `?`.
pub fn run_negative_gridz(gpu: &Gpu, tokens: u64, c: &GemvCase) -> Result<Outcome, GpuError> {
    stage_negative_gridz(gpu, tokens, c).map(Staged::finish)
}

/// [`run_negative_gridz`]'s GPU half ([`stage_plan`]).
pub fn stage_negative_gridz(gpu: &Gpu, tokens: u64, c: &GemvCase) -> Result<Staged, GpuError> {
    let p = negative_gridz_plan(tokens, c);
    check_dims(NEG_GRIDZ_KERNEL, tokens, &c.dims(), &p.shape)?;
    stage_plan(gpu, tokens, c, &p, &NEG_GEMV_GRIDZ)
}

/// Inputs from seeds (xq through the quantize kernel), y poisoned, one launch of `plan`, the
/// poison check and the sampled pairs' rows downloaded in runs; the twin of those pairs and the
/// comparison are the host check.
fn stage_plan(gpu: &Gpu, tokens: u64, c: &GemvCase, plan: &Launch, source: &KernelSource) -> Result<Staged, GpuError> {
    let d = c.dims();
    let (k, n, top_k) = (c.k as usize, c.n as usize, c.top_k as usize);
    let pairs = tokens as usize * top_k;
    let ids = route(c.routing, tokens as usize, c.experts as usize, top_k, GEMM_TILE_M as usize, SEED_ROUTE);
    let ids_dev = gpu.upload(&ids)?;
    let w_blocks = c.experts as usize * n * c.wtype.blocks_per_row(k);
    let mut w = gpu.alloc::<u8>(w_blocks * c.wtype.block_bytes())?;
    fill_weights(gpu, &mut w, w_blocks, SEED_W, c.wtype)?;
    let mut xq = gpu.alloc::<u8>(tokens as usize * (k / QK) * BLOCK_Q8_1_BYTES)?;
    let mut x = gpu.alloc::<f32>(tokens as usize * k)?;
    fill_uniform(gpu, &mut x, tokens as usize * k, SEED_X, 1.0)?;
    quantize::launch(gpu, &x, tokens, c.k, tokens, quantize::Source::Dense, &mut xq)?;
    let mut y = Guarded::new(gpu, pairs * n)?;
    gpu.synchronize()?;
    let start = std::time::Instant::now();
    launch_as(gpu, plan, source, tokens, &d, GemvBuffers { w: &w, xq: &xq, ids: &ids_dev, y: &mut y.buf })?;
    gpu.synchronize()?;
    let kernel_ms = start.elapsed().as_secs_f64() * 1e3;
    let (unwritten, past_end) = y.check(gpu, 1)?;
    let sampled = sample_rows(pairs as u64, top_k as u64, SAMPLE_PAIRS, tokens);
    let got = y.read_rows_f32(gpu, &sampled, n)?;
    let wtype = c.wtype;
    Ok(Staged::Check(Box::new(move || {
        let want: Vec<Vec<f32>> = sampled
            .par_iter()
            .map(|&p| {
                let t = p / top_k as u64;
                let xq = quantize_row_q8_1(&uniform_row(SEED_X, t * k as u64, k, 1.0));
                let mut out = vec![0.0f32; n];
                pair_row(|r| weight_row(SEED_W, r, k, wtype), &xq, ids[p as usize] as u64, &d, &mut out);
                out
            })
            .collect();
        let mut err = RelErr::default();
        for ((&p, want), got) in sampled.iter().zip(&want).zip(&got) {
            err.add_slice(p * n as u64, got, want);
        }
        Outcome::Ran(Check::of_floats(&err, TOLERANCE, (unwritten, past_end), kernel_ms))
    })))
}

/// The self-test's handle on this family (registered in `selftest::case`).
pub struct Family;

impl KernelFamily for Family {
    type Case = GemvCase;

    fn run(gpu: &Gpu, tokens: u64, c: &GemvCase) -> Result<Outcome, GpuError> {
        run_case(gpu, tokens, c)
    }

    fn stage(gpu: &Gpu, tokens: u64, c: &GemvCase) -> Result<Staged, GpuError> {
        stage_case(gpu, tokens, c)
    }

    fn plans(tokens: u64, c: &GemvCase, limits: &DeviceLimits) -> Result<Vec<Launch>, PlanError> {
        plans(tokens, c, limits)
    }
}

/// The negative control with tokens x top_k on grid.z; plans as its fixed twin.
pub struct NegGridZ;

impl KernelFamily for NegGridZ {
    type Case = GemvCase;
    const NEGATIVE_CONTROL: bool = true;

    fn run(gpu: &Gpu, tokens: u64, c: &GemvCase) -> Result<Outcome, GpuError> {
        run_negative_gridz(gpu, tokens, c)
    }

    fn stage(gpu: &Gpu, tokens: u64, c: &GemvCase) -> Result<Staged, GpuError> {
        stage_negative_gridz(gpu, tokens, c)
    }

    fn plans(tokens: u64, c: &GemvCase, limits: &DeviceLimits) -> Result<Vec<Launch>, PlanError> {
        plans(tokens, c, limits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::dequantize_q8_1;
    use crate::testdata::uniform_f32;
    use crate::thresholds::TOP_K_SET;

    fn case(top_k: u32, wtype: WeightType) -> GemvCase {
        GemvCase { experts: 128, top_k, n: 768, k: 2048, wtype, routing: Routing::Uniform }
    }

    /// Weights `[experts·n]` rows, x quantized `[tokens, k/32]`, routed ids.
    fn inputs(tokens: usize, d: &GemvDims) -> (Vec<u8>, Vec<BlockQ8_1>, Vec<i32>) {
        let k = d.k as usize;
        let w: Vec<u8> = (0..(d.experts * d.n) as u64).flat_map(|r| weight_row(SEED_W, r, k, d.wtype)).collect();
        let x: Vec<f32> = (0..(tokens * k) as u64).map(|i| uniform_f32(SEED_X, i, 1.0)).collect();
        let xq: Vec<BlockQ8_1> = x.chunks(k).flat_map(quantize_row_q8_1).collect();
        let ids = route(Routing::Uniform, tokens, d.experts as usize, d.top_k as usize, 64, SEED_ROUTE);
        (w, xq, ids)
    }

    /// Rows of 3 blocks (96 weights; 768 for the K-quants' 256-wide super-blocks).
    fn three_blocks(wtype: WeightType) -> u32 {
        3 * wtype.block_size() as u32
    }

    #[test]
    fn twin_matches_dequantized_f64_dot() {
        for wtype in WeightType::ALL {
            let k = three_blocks(wtype);
            let d = GemvDims { experts: 5, top_k: 3, n: 7, k, wtype };
            let tokens = 4;
            let (w, xq, ids) = inputs(tokens, &d);
            let y = moe_gemv_cpu(&w, &xq, &ids, &d);
            let (n, nb, rb) = (7, k as usize / QK, wtype.row_bytes(k as usize));
            let mut max_ref = 0f64;
            let mut max_diff = 0f64;
            for (pair, &e) in ids.iter().enumerate() {
                let xd = dequantize_q8_1(&xq[pair / 3 * nb..(pair / 3 + 1) * nb]);
                for col in 0..n {
                    let r = e as usize * n + col;
                    let wd = wtype.dequantize_row(&w[r * rb..(r + 1) * rb]);
                    let want: f64 = wd.iter().zip(&xd).map(|(a, b)| *a as f64 * *b as f64).sum();
                    max_ref = max_ref.max(want.abs());
                    max_diff = max_diff.max((want - y[pair * n + col] as f64).abs());
                }
            }
            // q4_0 folds its −8 offset through the f16 s = d·Σq: allow that rounding (the K-quant
            // twins are within f32 rounding, checked tightly in `quant::kquants`).
            assert!(max_diff <= 2e-3 * max_ref, "{wtype}: {max_diff} vs max {max_ref}");
        }
    }

    /// The GPU's arithmetic: lane l takes blocks l, l+32, ... and the compiler contracts each
    /// legacy block's formula into the lane's sum with FMAs (-fmad=true; the K-quant formula is
    /// spelled with _rn intrinsics: `device_order_dot`); then the xor butterfly.
    fn gpu_order_dot(wtype: WeightType, w_row: &[u8], x: &[BlockQ8_1]) -> f32 {
        if wtype.is_k_quant() {
            return crate::quant::kquants::device_order_dot(wtype, w_row, x, 32);
        }
        let bb = wtype.block_bytes();
        let mut lanes = [0.0f32; 32];
        for (b, xb) in x.iter().enumerate() {
            let w = &w_row[b * bb..(b + 1) * bb];
            let wd = half::f16::from_le_bytes([w[0], w[1]]).to_f32(); // q8_0, q4_0
            let xd = xb.d.to_f32();
            let acc = &mut lanes[b % 32];
            *acc = match wtype {
                WeightType::Q8_0 => {
                    let isum: i32 = w[2..].iter().zip(&xb.qs).map(|(&q, &x)| q as i8 as i32 * x as i32).sum();
                    (wd * xd).mul_add(isum as f32, *acc)
                }
                WeightType::Q4_0 => {
                    let isum: i32 =
                        (0..16).map(|j| (w[2 + j] & 15) as i32 * xb.qs[j] as i32 + (w[2 + j] >> 4) as i32 * xb.qs[j + 16] as i32).sum();
                    wd.mul_add(xd.mul_add(isum as f32, -8.0 * xb.s.to_f32()), *acc)
                }
                WeightType::MXFP4 => {
                    let d = crate::quant::mxfp4::e8m0_to_f32_half(w[0]);
                    let kv = |c: u8| crate::quant::mxfp4::KVALUES[c as usize] as i32;
                    let isum: i32 = (0..16).map(|j| kv(w[1 + j] & 15) * xb.qs[j] as i32 + kv(w[1 + j] >> 4) * xb.qs[j + 16] as i32).sum();
                    (d * xd).mul_add(isum as f32, *acc)
                }
                _ => unreachable!("handled above"),
            };
        }
        let mut o = 16;
        while o > 0 {
            let prev = lanes;
            for (l, v) in lanes.iter_mut().enumerate() {
                *v += prev[l ^ o];
            }
            o >>= 1;
        }
        lanes[0]
    }

    /// The tolerance is two orders of magnitude above what the summation order costs at the
    /// model's shape, and far below what one wrong block would.
    #[test]
    fn tolerance_covers_summation_order_only() {
        for wtype in WeightType::ALL {
            let d = GemvDims { experts: 2, top_k: 1, n: 64, k: 2048, wtype };
            let (w, xq, ids) = inputs(2, &d);
            let y = moe_gemv_cpu(&w, &xq, &ids, &d);
            let rb = wtype.row_bytes(2048);
            let mut err = RelErr::default();
            for (pair, &e) in ids.iter().enumerate() {
                for col in 0..64 {
                    let r = e as usize * 64 + col;
                    let g = gpu_order_dot(wtype, &w[r * rb..(r + 1) * rb], &xq[pair * 64..(pair + 1) * 64]);
                    err.add(0, g, y[pair * 64 + col]);
                }
            }
            assert!(err.value() < TOLERANCE / 100.0, "{wtype}: {}", err.value());
        }
    }

    #[test]
    fn plans_cover_every_pair_and_row_for_all_counts_and_limits() {
        let counts: Vec<u64> = (1..=64).chain([8191, 8192, 8193, 65_535, 1 << 20]).collect();
        for limits in DeviceLimits::recorded() {
            for top_k in TOP_K_SET {
                let c = case(top_k, WeightType::Q4_0);
                for &t in &counts {
                    let p = plans(t, &c, &limits).unwrap_or_else(|e| panic!("{e}"));
                    assert_eq!(p.len(), 1);
                    p[0].check_cover().unwrap_or_else(|e| panic!("{e}"));
                    assert_eq!(p[0].grid, [(t * top_k as u64) as u32, 192, 1]);
                }
            }
        }
    }

    #[test]
    fn column_tail_and_grid_y_bound() {
        let l = DeviceLimits::gb10();
        let p = plan(3, &GemvDims { n: 770, ..case(8, WeightType::Q8_0).dims() }, &l).unwrap();
        assert_eq!(p.grid[1], 193);
        p.check_cover().unwrap();
        assert_eq!(p.simulate_cover(1).iter().filter(|&&h| h == 1).count(), 770);
        let wide = GemvDims { n: 65_535 * ROWS_PER_BLOCK + 1, ..case(8, WeightType::Q8_0).dims() };
        assert!(matches!(plan(1, &wide, &l), Err(PlanError::GridDim { axis: 'y', .. })));
    }

    #[test]
    fn bad_shapes_are_refused() {
        let l = DeviceLimits::h200();
        let c = case(8, WeightType::Q8_0);
        let un = |r: Result<Vec<Launch>, PlanError>| matches!(r, Err(PlanError::Unsupported { .. }));
        assert!(un(plans(0, &c, &l)));
        assert!(un(plans(1, &GemvCase { k: 100, ..c }, &l)));
        assert!(un(plans(1, &GemvCase { top_k: 129, ..c }, &l)));
        assert!(un(plans(1, &GemvCase { n: 0, ..c }, &l)));
        // K-quant rows are whole 256-wide super-blocks.
        assert!(un(plans(1, &GemvCase { k: 2048 + 32, wtype: WeightType::Q4K, ..c }, &l)));
        assert!(plans(1, &GemvCase { k: 2048, wtype: WeightType::Q6K, ..c }, &l).is_ok());
        let e = plans(1, &GemvCase { k: 768 + 128, wtype: WeightType::Q5K, ..c }, &l).unwrap_err();
        assert!(e.to_string().contains("multiple of 256"), "{e}");
    }

    #[test]
    fn negative_plan_puts_pairs_on_grid_z() {
        let z = DeviceLimits::h200().max_grid_dim[2] as u64;
        for top_k in TOP_K_SET {
            let c = case(top_k, WeightType::Q4_0);
            for t in [1u64, 8191, 8192, 6553, 6554, 65_535] {
                let p = negative_gridz_plan(t, &c);
                assert_eq!(p.grid, [1, 192, (t * top_k as u64) as u32]);
                assert_eq!(p.kernel, NEG_GRIDZ_KERNEL);
                p.check_cover().unwrap();
            }
        }
        let first_past = |top_k| (1..).find(|&t| negative_gridz_plan(t, &case(top_k, WeightType::Q4_0)).grid[2] as u64 > z).unwrap();
        assert_eq!(first_past(8), 8192);
        assert_eq!(first_past(10), 6554);
        assert_eq!(first_past(1), 65_536);
        // The checked plan would have refused it; the fixed plan keeps it on grid.x.
        let c = case(8, WeightType::Q4_0);
        let p = negative_gridz_plan(8192, &c);
        assert!(Launch::checked(&p.kernel, &p.shape, p.grid.map(u64::from), p.block, 0, vec![], &DeviceLimits::h200()).is_err());
        assert_eq!(plan(8192, &c.dims(), &DeviceLimits::h200()).unwrap().grid, [65_536, 192, 1]);
    }

    #[test]
    fn overflow_points_for_qwen3_shape() {
        let counts: Vec<u64> = critical_counts(&case(8, WeightType::Q4_0), &DeviceLimits::h200()).iter().map(|c| c.tokens).collect();
        // y: (2^31 − 1) / (8 · 768) = 349525.3; xq blocks: / 64 = 33554431.98.
        for t in [1, 349_525, 349_526, 33_554_431, 33_554_432] {
            assert!(counts.contains(&t), "{t} missing from {counts:?}");
        }
    }
}
