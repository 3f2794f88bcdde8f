//! Activation quantize to q8_1, fused with the gather by expert.
//!
//! The routed GEMM reads its activations as q8_1 rows in expert order: output row `r` of the
//! gathered quantize holds source row `sorted_ids[r] / rows_per_token` (padding rows of the
//! alignment are zeros). The dense mode quantizes rows in order (the latent projection's input,
//! the routed GEMV's `xq`). One warp per 32-value block in a grid-stride loop on `grid.x`:
//! padded rows x K passes 2^31 at large prefills, and the padded rows passed 65535 where the
//! failing engine put them on `grid.y`.

use std::fmt::Display;

use cudarc::driver::{CudaSlice, PushKernelArg};
use half::f16;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::check::{Check, KernelFamily, Outcome, RelErr, Staged, sample_rows};
use crate::cuda::{Gpu, GpuError};
use crate::launch::{Cover, Launch, PlanError, grid_stride_blocks};
use crate::limits::DeviceLimits;
use crate::ops::moe_align::{align_cpu, max_padded_rows};
use crate::ops::testdata::{GUARD_WORDS, Guarded, download_rows, fill_uniform};
use crate::quant::{BLOCK_Q8_1_BYTES, BlockQ8_1, QK, quantize_block_q8_1, quantize_row_q8_1};
use crate::routing::{Routing, route};
use crate::sources::QUANTIZE;
use crate::testdata::uniform_row;
use crate::thresholds::{Critical, I32_MAX, overflow_point};

pub const KERNEL: &str = "quantize";
/// Warps per block; each warp quantizes one 32-value block per trip.
const WARPS: u32 = 8;
/// 32-bit words per q8_1 block: the first holds (d, s), the word `Guarded::check` looks at.
pub(crate) const BLOCK_WORDS: usize = BLOCK_Q8_1_BYTES / 4;
/// Dequantized GPU values against the input: |d·q − x| <= d/2 (rounding) + 127·d·2^-11 (d
/// stored as f16) = 0.5625·amax/127 = 0.00443·amax, and max |x| compared is >= every amax.
pub const TOLERANCE: f64 = 0.0045;

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct QuantizeCase {
    /// Row width (hidden size), a multiple of 32.
    pub k: u32,
    pub experts: u32,
    pub top_k: u32,
    /// Row tile the alignment pads each expert's segment to.
    pub tile: u32,
    pub routing: Routing,
    /// Gather rows by expert (routed path) or quantize rows in order (dense path).
    pub gather: bool,
}

/// Where each output row comes from: `I` is `&CudaSlice<i32>` on the device, `&[i32]` on the CPU.
#[derive(Clone, Copy, Debug)]
pub enum Source<I> {
    /// Output row `r` quantizes row `r` of `x`.
    Dense,
    /// Output row `r` quantizes row `sorted_ids[r] / rows_per_token` of `x`; an id at or past
    /// `src_rows · rows_per_token` (the alignment's sentinel) is a padding row, written as zeros.
    /// `rows_per_token` is `top_k` for the gate/up input `[tokens, K]` and 1 for the down
    /// input, whose rows are already (token, slot) pairs.
    Gather { sorted_ids: I, rows_per_token: u32 },
}

fn unsupported(what: impl Into<String>, shape: &str) -> PlanError {
    PlanError::Unsupported { kernel: KERNEL.into(), what: what.into(), shape: shape.into() }
}

fn case_shape(tokens: u64, c: &QuantizeCase) -> String {
    let mode = if c.gather { "gather" } else { "dense" };
    format!("tokens={tokens} k={} experts={} top_k={} tile={} {mode}", c.k, c.experts, c.top_k, c.tile)
}

/// The shape constraints that do not depend on the token count.
fn check_case(c: &QuantizeCase, shape: &str) -> Result<(), PlanError> {
    check_width(c.k, shape)?;
    if c.gather && (c.experts == 0 || c.top_k == 0 || c.top_k > c.experts || c.tile == 0) {
        return Err(unsupported(format!("gather needs 1 <= top_k ({}) <= experts ({}) and tile >= 1", c.top_k, c.experts), shape));
    }
    Ok(())
}

fn check_width(k: u32, shape: &str) -> Result<(), PlanError> {
    if k == 0 || !k.is_multiple_of(QK as u32) || k > i32::MAX as u32 {
        return Err(unsupported(format!("row width K = {k} must be a positive multiple of {QK} below 2^31"), shape));
    }
    Ok(())
}

/// Output rows of one call: the padded rows of the alignment (gather) or the tokens (dense).
pub fn output_rows(tokens: u64, c: &QuantizeCase) -> u64 {
    if c.gather { max_padded_rows(tokens, c.top_k, c.experts, c.tile) } else { tokens }
}

/// Every launch a quantize of `tokens` makes (one).
pub fn plans(tokens: u64, c: &QuantizeCase, limits: &DeviceLimits) -> Result<Vec<Launch>, PlanError> {
    let shape = case_shape(tokens, c);
    check_case(c, &shape)?;
    if tokens == 0 {
        return Err(unsupported("no tokens", &shape));
    }
    // Sorted ids (and their sentinel tokens · top_k) are i32.
    if c.gather && tokens * c.top_k as u64 > I32_MAX {
        return Err(unsupported("tokens x top_k passes the i32 pair ids of the alignment", &shape));
    }
    Ok(vec![plan(output_rows(tokens, c), c.k, shape, limits)?])
}

/// The launch for `rows` output rows of width `k`, either mode: warps grid-stride over the
/// `rows · k/32` blocks on `grid.x`.
pub fn plan(rows: u64, k: u32, shape: impl Display, limits: &DeviceLimits) -> Result<Launch, PlanError> {
    let shape = shape.to_string();
    check_width(k, &shape)?;
    if rows == 0 {
        return Err(unsupported("no rows", &shape));
    }
    let items = rows * (k as u64 / QK as u64);
    Launch::checked(
        KERNEL,
        shape,
        [warp_grid(items, limits), 1, 1],
        [WARPS * 32, 1, 1],
        0,
        vec![Cover::GridStride { items, per_block: WARPS as u64 }],
        limits,
    )
}

/// Blocks for `items` warp-sized work items (`grid_stride_blocks` counts threads).
fn warp_grid(items: u64, limits: &DeviceLimits) -> u64 {
    grid_stride_blocks(items * 32, WARPS as u64 * 32, limits)
}

/// The source row of output id `id`, `None` for a padding row (the CPU side of the kernel's test).
pub fn source_row(id: i32, src_rows: u64, rows_per_token: u32) -> Option<u64> {
    let id = u64::try_from(id).ok()?;
    (id < src_rows * rows_per_token as u64).then(|| id / rows_per_token as u64)
}

const ZERO_BLOCK: BlockQ8_1 = BlockQ8_1 { d: f16::ZERO, s: f16::ZERO, qs: [0; QK] };

/// CPU twin: `x` is `[src_rows, k]`; returns `[rows, k/32]` blocks (rows = `src_rows` dense,
/// `sorted_ids.len()` gathered), padding rows zero.
pub fn quantize_cpu(x: &[f32], k: usize, source: Source<&[i32]>) -> Vec<BlockQ8_1> {
    let nb = k / QK;
    let src_rows = (x.len() / k) as u64;
    let rows = match source {
        Source::Dense => src_rows as usize,
        Source::Gather { sorted_ids, .. } => sorted_ids.len(),
    };
    let mut out = vec![ZERO_BLOCK; rows * nb];
    out.par_chunks_mut(nb).enumerate().for_each(|(r, o)| {
        let src = match source {
            Source::Dense => Some(r as u64),
            Source::Gather { sorted_ids, rows_per_token } => source_row(sorted_ids[r], src_rows, rows_per_token),
        };
        if let Some(s) = src {
            let s = s as usize;
            o.copy_from_slice(&quantize_row_q8_1(&x[s * k..(s + 1) * k]));
        }
    });
    out
}

/// Quantizes `rows` output rows of width `k` from `x` (`[src_rows, k]` f32) into `out`, q8_1
/// blocks `[rows, k/32]` (any element type: the kernel sees bytes). Buffers too small for the
/// shape are refused before the launch.
pub fn launch<O>(
    gpu: &Gpu,
    x: &CudaSlice<f32>,
    src_rows: u64,
    k: u32,
    rows: u64,
    source: Source<&CudaSlice<i32>>,
    out: &mut CudaSlice<O>,
) -> Result<(), GpuError> {
    let (ids, rows_per_token, mode) = match source {
        Source::Dense => (None, 1, "dense".to_string()),
        Source::Gather { sorted_ids, rows_per_token } => {
            (Some(sorted_ids), rows_per_token, format!("gather rows_per_token={rows_per_token}"))
        }
    };
    let shape = format!("rows={rows} src_rows={src_rows} k={k} {mode}");
    let p = plan(rows, k, &shape, gpu.limits())?;
    let out_bytes = (out.len() * size_of::<O>()) as u64;
    let need_out = rows * (k as u64 / QK as u64) * BLOCK_Q8_1_BYTES as u64;
    let ok = (x.len() as u64) >= src_rows * k as u64
        && out_bytes >= need_out
        && rows_per_token >= 1
        && match ids {
            None => rows <= src_rows,
            Some(ids) => src_rows >= 1 && ids.len() as u64 >= rows,
        };
    if !ok {
        let ids_len = ids.map_or(0, |i| i.len());
        let what = format!(
            "arguments do not fit the shape: x {} floats, out {out_bytes} B (needs {need_out}), sorted_ids {ids_len}, rows_per_token {rows_per_token} (dense needs rows <= src_rows)",
            x.len()
        );
        return Err(unsupported(what, &shape).into());
    }
    let f = gpu.function(&QUANTIZE, KERNEL)?;
    let (k, rows_per_token, null) = (k as i32, rows_per_token as i32, 0u64);
    gpu.launch(&p, &f, |b| {
        b.arg(x).arg(&src_rows).arg(&k);
        match ids {
            Some(ids) => b.arg(ids),
            None => b.arg(&null),
        };
        b.arg(&rows_per_token).arg(out).arg(&rows);
    })?;
    Ok(())
}

/// The count `t` where `past(t)` first holds (`past` monotone in tokens), and `t − 1`.
fn first_count(past: impl Fn(u64) -> bool, what: &str) -> Vec<Critical> {
    let (mut lo, mut hi) = (0u64, 1u64 << 40);
    if !past(hi) {
        return vec![];
    }
    // Invariant: !past(lo) (or lo = 0), past(hi).
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if past(mid) { hi = mid } else { lo = mid }
    }
    let mut v = vec![Critical::new(hi, format!("{what} (first count)"))];
    if lo > 0 {
        v.push(Critical::new(lo, format!("{what} (last count below)")));
    }
    v
}

/// Token counts where this plan's flattened indexes pass 2^31 − 1, where its rows would pass
/// the `grid.y` limit of the naive launch, and where the warps first loop a second time.
pub fn critical_counts(c: &QuantizeCase, limits: &DeviceLimits) -> Vec<Critical> {
    let mut v = vec![Critical::new(1, "single token")];
    if check_case(c, "").is_err() {
        return v;
    }
    let (k, nb) = (c.k as u64, c.k as u64 / QK as u64);
    let rows = |t: u64| output_rows(t, c);
    let what = if c.gather { "padded rows" } else { "rows" };
    v.extend(overflow_point(k, "quantize: x[t·K + i] passes 2^31 − 1"));
    v.extend(first_count(|t| rows(t) * k > I32_MAX, &format!("quantize: {what} x K quants pass 2^31 − 1")));
    v.extend(first_count(|t| rows(t) * nb > I32_MAX, &format!("quantize: {what} x K/32 blocks pass 2^31 − 1")));
    let y = limits.max_grid_dim[1] as u64;
    v.extend(first_count(|t| rows(t) > y, &format!("quantize: {what} pass {y}, where rows on grid.y (the failing engine's launch) die")));
    v.extend(first_count(
        |t| rows(t) * nb > warp_grid(rows(t) * nb, limits) * WARPS as u64,
        "quantize: warps take a second grid-stride trip",
    ));
    v
}

pub fn device_bytes(tokens: u64, c: &QuantizeCase) -> u64 {
    let rows = if check_case(c, "").is_ok() { output_rows(tokens, c) } else { tokens };
    let ids = if c.gather { 4 * rows } else { 0 };
    4 * tokens * c.k as u64 + ids + rows * (c.k as u64 / QK as u64) * BLOCK_Q8_1_BYTES as u64 + 4 * GUARD_WORDS as u64
}

const SEED_X: u64 = 0x20;
const SEED_ROUTE: u64 = 0x21;
/// Output rows compared with the twin when there are more (plus the tails `sample_rows` adds).
const SAMPLE_ROWS: usize = 256;

/// Self-test: x from a seed, the routing's alignment on the CPU (its sorted ids uploaded),
/// output poisoned; sampled rows compared block by block with the twin.
pub fn run_case(gpu: &Gpu, tokens: u64, c: &QuantizeCase) -> Result<Outcome, GpuError> {
    stage_case(gpu, tokens, c).map(Staged::finish)
}

/// [`run_case`]'s GPU half: the routing and alignment (the sorted ids the kernel reads), the
/// launch, the poison check and the sampled rows downloaded in runs; the twin and the block
/// comparison are the host check.
pub fn stage_case(gpu: &Gpu, tokens: u64, c: &QuantizeCase) -> Result<Staged, GpuError> {
    plans(tokens, c, gpu.limits())?;
    let (k, nb) = (c.k as usize, c.k as usize / QK);
    let rows = output_rows(tokens, c);
    let mut x = gpu.alloc::<f32>(tokens as usize * k)?;
    fill_uniform(gpu, &mut x, tokens as usize * k, SEED_X, 1.0)?;
    let sorted = c.gather.then(|| {
        let ids = route(c.routing, tokens as usize, c.experts as usize, c.top_k as usize, c.tile as usize, SEED_ROUTE);
        align_cpu(&ids, tokens, c.top_k, c.experts, c.tile).sorted_ids
    });
    let ids_dev = sorted.as_deref().map(|s| gpu.upload(s)).transpose()?;
    let source = match &ids_dev {
        Some(ids) => Source::Gather { sorted_ids: ids, rows_per_token: c.top_k },
        None => Source::Dense,
    };
    let mut out = Guarded::new(gpu, rows as usize * nb * BLOCK_WORDS)?;
    gpu.synchronize()?;
    let start = std::time::Instant::now();
    launch(gpu, &x, tokens, c.k, rows, source, &mut out.buf)?;
    gpu.synchronize()?;
    let kernel_ms = start.elapsed().as_secs_f64() * 1e3;
    let (unwritten, past_end) = out.check(gpu, BLOCK_WORDS)?;
    let sampled = sample_rows(rows, c.tile as u64, SAMPLE_ROWS, tokens);
    let got = download_rows(gpu, &out.buf, &sampled, nb * BLOCK_WORDS)?;
    let top_k = c.top_k;
    Ok(Staged::Check(Box::new(move || {
        let mut cmp = BlockCompare::default();
        for (&r, words) in sampled.iter().zip(&got) {
            let src = match &sorted {
                Some(s) => source_row(s[r as usize], tokens, top_k),
                None => Some(r),
            };
            let x_row = src.map(|s| uniform_row(SEED_X, s * k as u64, k, 1.0));
            cmp.row(r * k as u64, &blocks_of(words), x_row.as_deref());
        }
        Outcome::Ran(Check {
            max_rel_err: cmp.err.value(),
            tolerance: TOLERANCE,
            compared: cmp.err.compared,
            unwritten,
            past_end,
            int_mismatches: cmp.mismatches,
            kernel_ms,
            note: cmp.describe(),
        })
    })))
}

pub(crate) fn blocks_of(words: &[u32]) -> Vec<BlockQ8_1> {
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    bytes.chunks_exact(BLOCK_Q8_1_BYTES).map(BlockQ8_1::from_bytes).collect()
}

/// GPU q8_1 blocks against the twin: d bit-exact, s bit-exact to d·Σq of the GPU's own quants,
/// quants exact except a flip by one where x/d is a rounding tie (counted, not failed), and
/// the dequantized values within [`TOLERANCE`] of x.
#[derive(Default)]
pub(crate) struct BlockCompare {
    pub(crate) err: RelErr,
    pub(crate) mismatches: u64,
    tie_flips: u64,
    first: Option<String>,
}

impl BlockCompare {
    /// One row; `x` is its source row, `None` for a padding row (all zeros expected).
    pub(crate) fn row(&mut self, first_index: u64, gpu: &[BlockQ8_1], x: Option<&[f32]>) {
        for (b, g) in gpu.iter().enumerate() {
            let xs = x.map(|x| &x[b * QK..(b + 1) * QK]);
            self.block(first_index + (b * QK) as u64, g, xs);
        }
    }

    fn block(&mut self, at: u64, g: &BlockQ8_1, x: Option<&[f32]>) {
        let x = x.unwrap_or(&[0.0; QK]);
        let want = quantize_block_q8_1(x);
        let d = x.iter().fold(0.0f32, |m, v| m.max(v.abs())) / 127.0;
        let mut sum = 0i32;
        for (j, ((&gq, &wq), &xv)) in g.qs.iter().zip(&want.qs).zip(x).enumerate() {
            sum += gq as i32;
            let t = xv / d;
            match (gq as i32 - wq as i32).abs() {
                0 => {}
                1 if ((t.abs().fract() - 0.5).abs() < 1e-3) => self.tie_flips += 1,
                _ => self.mismatch(format!("quant {j} of the block at element {at}: gpu {gq} vs cpu {wq} (x/d = {t})")),
            }
            self.err.add(at + j as u64, g.d.to_f32() * gq as f32, xv);
        }
        let s = f16::from_f32(sum as f32 * d);
        if g.d.to_bits() != want.d.to_bits() || g.s.to_bits() != s.to_bits() {
            self.mismatch(format!("(d, s) at element {at}: gpu ({}, {}) vs cpu ({}, {s})", g.d, g.s, want.d));
        }
    }

    fn mismatch(&mut self, what: String) {
        self.mismatches += 1;
        self.first.get_or_insert(what);
    }

    pub(crate) fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(f) = &self.first {
            parts.push(format!("{} mismatches, first: {f}", self.mismatches));
        }
        if self.tie_flips > 0 {
            parts.push(format!("{} quants rounded the other way at a tie", self.tie_flips));
        }
        parts.push(self.err.describe());
        parts.retain(|p| !p.is_empty());
        parts.join("; ")
    }
}

/// The self-test's handle on this family (registered in `selftest::case`).
pub struct Family;

impl KernelFamily for Family {
    type Case = QuantizeCase;

    fn run(gpu: &Gpu, tokens: u64, c: &QuantizeCase) -> Result<Outcome, GpuError> {
        run_case(gpu, tokens, c)
    }

    fn stage(gpu: &Gpu, tokens: u64, c: &QuantizeCase) -> Result<Staged, GpuError> {
        stage_case(gpu, tokens, c)
    }

    fn plans(tokens: u64, c: &QuantizeCase, limits: &DeviceLimits) -> Result<Vec<Launch>, PlanError> {
        plans(tokens, c, limits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::dequantize_q8_1;
    use crate::testdata::uniform_f32;
    use crate::thresholds::TOP_K_SET;

    fn xs(rows: usize, k: usize) -> Vec<f32> {
        (0..rows * k).map(|i| uniform_f32(SEED_X, i as u64, 1.0 + (i / k) as f32)).collect()
    }

    #[test]
    fn dense_twin_is_rowwise_q8_1_within_half_a_step() {
        let (rows, k) = (5, 96);
        let x = xs(rows, k);
        let q = quantize_cpu(&x, k, Source::Dense);
        assert_eq!(q.len(), rows * 3);
        for r in 0..rows {
            let row = &x[r * k..(r + 1) * k];
            assert_eq!(&q[r * 3..(r + 1) * 3], quantize_row_q8_1(row).as_slice());
            let back = dequantize_q8_1(&q[r * 3..(r + 1) * 3]);
            for (b, chunk) in row.chunks(QK).enumerate() {
                let amax = chunk.iter().fold(0f32, |m, v| m.max(v.abs()));
                for (j, &v) in chunk.iter().enumerate() {
                    let err = (back[b * QK + j] - v).abs() as f64;
                    assert!(err <= TOLERANCE * amax as f64, "row {r} block {b}: {err} vs amax {amax}");
                }
            }
        }
    }

    /// Gathered rows are the dense rows of their token (rows_per_token = top_k) or of their
    /// pair (rows_per_token = 1); padding rows are all zeros.
    #[test]
    fn gather_twin_follows_sorted_ids_and_zeroes_padding() {
        let (tokens, experts, top_k, tile, k) = (7u64, 6u32, 2u32, 4u32, 64usize);
        let nb = k / QK;
        let ids = route(Routing::MaxPadding, tokens as usize, experts as usize, top_k as usize, tile as usize, 3);
        let a = align_cpu(&ids, tokens, top_k, experts, tile);
        let sentinel = (tokens * top_k as u64) as i32;
        assert!(a.sorted_ids.contains(&sentinel), "the case must have padding rows");
        for (src_rows, rpt) in [(tokens as usize, top_k), (tokens as usize * top_k as usize, 1)] {
            let x = xs(src_rows, k);
            let dense = quantize_cpu(&x, k, Source::Dense);
            let g = quantize_cpu(&x, k, Source::Gather { sorted_ids: &a.sorted_ids, rows_per_token: rpt });
            assert_eq!(g.len(), a.sorted_ids.len() * nb);
            for (r, &id) in a.sorted_ids.iter().enumerate() {
                let got = &g[r * nb..(r + 1) * nb];
                if id >= sentinel {
                    assert!(got.iter().all(|b| *b == ZERO_BLOCK), "padding row {r}");
                } else {
                    let s = id as usize / rpt as usize;
                    assert_eq!(got, &dense[s * nb..(s + 1) * nb], "row {r} id {id} rows_per_token {rpt}");
                }
            }
        }
        assert_eq!(source_row(-1, 7, 2), None);
        assert_eq!(source_row(13, 7, 2), Some(6));
        assert_eq!(source_row(14, 7, 2), None);
    }

    #[test]
    fn block_compare_accepts_exact_and_tie_flips_only() {
        // x/d = j - 15.5 for element j: every element but the amax ones is a tie.
        let mut x: Vec<f32> = (0..QK).map(|j| j as f32 - 15.5).collect();
        x[0] = 127.0;
        let good = quantize_block_q8_1(&x);
        let mut cmp = BlockCompare::default();
        cmp.block(0, &good, Some(&x));
        cmp.block(32, &ZERO_BLOCK, None);
        assert_eq!((cmp.mismatches, cmp.tie_flips), (0, 0));
        assert!(cmp.err.value() <= TOLERANCE, "{}", cmp.err.value());

        let mut flipped = good;
        flipped.qs[1] -= 1; // x/d = -14.5: a tie
        flipped.s = f16::from_f32((flipped.qs.iter().map(|&q| q as i32).sum::<i32>()) as f32);
        cmp.block(64, &flipped, Some(&x));
        assert_eq!((cmp.mismatches, cmp.tie_flips), (0, 1), "{}", cmp.describe());

        let mut wrong = good;
        wrong.qs[0] = 126; // x/d = 127: no tie
        cmp.block(96, &wrong, Some(&x));
        let mut bad_pad = ZERO_BLOCK;
        bad_pad.d = f16::ONE;
        cmp.block(128, &bad_pad, None);
        assert_eq!(cmp.mismatches, 3, "{}", cmp.describe()); // the quant, its s, the padding d
    }

    fn case(top_k: u32, gather: bool) -> QuantizeCase {
        QuantizeCase { k: 2048, experts: 128, top_k, tile: 64, routing: Routing::Uniform, gather }
    }

    #[test]
    fn plans_cover_every_block_for_all_counts_and_limits() {
        let counts: Vec<u64> = (1..=64).chain([8191, 8192, 8193, 65_535, 1 << 20]).collect();
        for limits in DeviceLimits::recorded() {
            for top_k in TOP_K_SET {
                for gather in [true, false] {
                    let c = case(top_k, gather);
                    for &t in &counts {
                        let p = plans(t, &c, &limits).unwrap_or_else(|e| panic!("{e}"));
                        assert_eq!(p.len(), 1);
                        p[0].check_cover().unwrap_or_else(|e| panic!("{e}"));
                        assert_eq!((p[0].grid[1], p[0].grid[2]), (1, 1));
                        assert_eq!(p[0].cover[0].items(), output_rows(t, &c) * 64);
                    }
                }
            }
        }
    }

    #[test]
    fn grid_stride_visits_each_block_once() {
        let limits = DeviceLimits::gb10();
        for t in [1, 3, 63] {
            let p = plans(t, &case(8, true), &limits).unwrap();
            assert!(p[0].simulate_cover(0).iter().all(|&h| h == 1));
        }
    }

    #[test]
    fn bad_shapes_are_refused() {
        let l = DeviceLimits::h200();
        let un = |r: Result<Vec<Launch>, PlanError>| matches!(r, Err(PlanError::Unsupported { .. }));
        assert!(un(plans(0, &case(8, true), &l)));
        assert!(un(plans(1, &QuantizeCase { k: 100, ..case(8, true) }, &l)));
        assert!(un(plans(1, &QuantizeCase { top_k: 129, ..case(8, true) }, &l)));
        assert!(un(plans(1, &QuantizeCase { tile: 0, ..case(8, true) }, &l)));
        assert!(un(plans(1 << 28, &case(8, true), &l)));
        assert_eq!(critical_counts(&QuantizeCase { tile: 0, ..case(8, true) }, &l).len(), 1);
    }

    #[test]
    fn critical_counts_bracket_each_boundary() {
        let l = DeviceLimits::h200();
        for c in [case(8, true), QuantizeCase { k: 2560, ..case(8, false) }] {
            let counts = critical_counts(&c, &l);
            let rows = |t| output_rows(t, &c);
            let has = |t: u64| counts.iter().any(|x| x.tokens == t);
            // The grid.y point: rows fit 65535 one count before, not at the count.
            let y = counts.iter().find(|x| x.reason.contains("grid.y") && x.reason.contains("first")).unwrap().tokens;
            assert!(rows(y - 1) <= 65_535 && rows(y) > 65_535 && has(y - 1));
            let q = counts.iter().find(|x| x.reason.contains("quants") && x.reason.contains("first")).unwrap().tokens;
            assert!(rows(q - 1) * c.k as u64 <= I32_MAX && rows(q) * c.k as u64 > I32_MAX);
            assert!(counts.iter().any(|x| x.reason.contains("second grid-stride trip")));
        }
        // Dense K = 2560: rows = tokens, so the points are exact quotients.
        let dense = critical_counts(&QuantizeCase { k: 2560, ..case(8, false) }, &l);
        assert!(dense.iter().any(|x| x.tokens == 65_536) && dense.iter().any(|x| x.tokens == 838_861));
    }
}
