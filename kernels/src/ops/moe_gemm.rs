//! Routed-expert GEMM for prefill: `y[sorted_ids[r], n] = dot(W[tile_expert[r / 64]][n, :], A[r, :])`.
//!
//! Inputs come from the alignment ([`moe_align::Aligned`]): activations gathered in sorted row
//! order as q8_1 (`A [max_padded_rows, K/32]`, padding rows zero), expert weights `W [E, N, K]`
//! in any [`WeightType`] (K a multiple of 256 for the K-quants). The output `y [tokens·top_k, N]` f32 is indexed by (token, slot) pair;
//! padding rows are computed but never stored. Row tiles (64 rows, one expert each) go on
//! `grid.x`, column tiles of N on `grid.y`; the tile shapes are data ([`TILES`]). The K loop is
//! `cuda/gemm_tile.cuh`, shared with the dense GEMM of `output_head`.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, DeviceRepr, PushKernelArg};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::check::{Check, KernelFamily, Outcome, RelErr, Staged, sample_rows};
use crate::cuda::{Gpu, GpuError};
use crate::launch::{Cover, Launch, PlanError};
use crate::limits::DeviceLimits;
use crate::ops::moe_align::{self, Aligned};
use crate::ops::testdata::{Guarded, fill_q8_1_rows, fill_weights, fill_words};
use crate::quant::{BLOCK_Q8_1_BYTES, BlockQ8_1, QK, WeightType};
use crate::routing::{Routing, route};
use crate::sources::MOE_GEMM;
use crate::testdata::{POISON, q8_1_row, shared_twin_row, shared_weight_rows};
use crate::thresholds::{Critical, I32_MAX, overflow_point, tile_tails};

/// The kernel family (each tile shape has its own entry point, [`GemmTile::kernel`]).
pub const KERNEL: &str = "moe_gemm";
/// Same integer block sums and f32 block formulas as the twin, blocks accumulated in the same
/// order: only FMA contraction differs (measured on the H200: ~1e-6 of max |ref|). The K-quant
/// terms are grouped per 32-wide block rather than per super-block: at most 5.3e-7 of max |ref|
/// at the model's widths (`quant::kquants` tests repeat the device's arithmetic exactly). A
/// wrong block, scale or nibble moves the result by more than 1e-3.
pub const TOLERANCE: f64 = 1e-4;
/// Most experts the plan accepts: a bound on the shapes qualified (current MoE models have at
/// most a few hundred), so a corrupt shape is rejected rather than launched.
pub const MAX_EXPERTS: u32 = 1024;

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct GemmCase {
    pub experts: u32,
    pub top_k: u32,
    /// Output width (columns of y, rows of each expert's weight matrix).
    pub n: u32,
    /// Input width (a multiple of 32).
    pub k: u32,
    pub wtype: WeightType,
    pub routing: Routing,
}

/// A block tile of the kernel: `m` sorted rows x `n` columns, `k_blocks` 32-wide K blocks
/// staged in shared memory per step, `threads` threads each computing a 4 x 4 sub-tile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemmTile {
    /// Entry point in `moe_gemm.cu` instantiated for this shape.
    pub kernel: &'static str,
    pub m: u32,
    pub n: u32,
    pub k_blocks: u32,
    pub threads: u32,
    /// Each next K step's global reads issued before the current step's mma loop
    /// (`gemm_tile_loop`'s PF): the same outputs bit for bit, one staged step more in registers.
    pub prefetch: bool,
    /// Steps held in shared memory (`gemm_tile_loop`'s STAGES): 2 stores the next step into
    /// the other stage after the current step's mma loop, one barrier a step instead of two.
    pub stages: u32,
}

/// Ints per staged block in shared memory: its 8 quant ints (`GEMM_QS`).
pub const STAGED_INTS: u64 = 8;

/// Dynamic shared memory of a `gemm_tile.cuh` block of `m` x `n` outputs staging `k_blocks`
/// 32-wide blocks per step: the staged quants of A and W, A's d and s (or Σ quants), W's d,
/// dmin and packed sub-block scales.
pub const fn tile_shared_bytes(m: u64, n: u64, k_blocks: u64) -> u64 {
    4 * k_blocks * ((m + n) * STAGED_INTS + 2 * m + 3 * n)
}

impl GemmTile {
    pub const fn shared_bytes(&self) -> u64 {
        tile_shared_bytes(self.m as u64, self.n as u64, self.k_blocks as u64) * self.stages as u64
    }
}

/// The default from 48 rows per expert on average ([`tile_for`]): 64 x 128 outputs, each thread
/// 4 x 8, 2 blocks of K a step (16,384 B of shared memory, within every card's 48 KiB without
/// opting in; 4 blocks spill at 255 registers), each next step's global reads issued during the
/// current step's mma loop. Per mma a warp loads fewer fragment and scale words from shared
/// memory than with 4 x 4: +6% / +5% prefill 2048 / 8192 over [`NARROW_TILE`] on an H100
/// (docs/perf-notes.md, entry 13).
pub const DEFAULT_TILE: GemmTile =
    GemmTile { kernel: "moe_gemm_m64n128k2_pf", m: 64, n: 128, k_blocks: 2, threads: 256, prefetch: true, stages: 1 };
/// 32 rows x 64 columns, 128 threads (4 warps), 2 blocks of K a step (4 spill at 255
/// registers on sm_121): expert segments padded to 32 rows instead of 64, for batches whose
/// experts average few rows ([`tile_for`]).
pub const SHORT_TILE: GemmTile = GemmTile { kernel: "moe_gemm_m32n64k2_pf", m: 32, n: 64, k_blocks: 2, threads: 128, ..DEFAULT_TILE };
/// 64 x 64 outputs, 4 blocks of K a step (21,504 B): the default of entries 11 and 12 (+43%
/// prefill over [`UNPIPELINED_TILE`] on an H100), kept to measure against
/// (`BRINK_MOE_GEMM_TILE=moe_gemm_m64n64k4_pf`).
pub const NARROW_TILE: GemmTile = GemmTile { kernel: "moe_gemm_m64n64k4_pf", n: 64, k_blocks: 4, ..DEFAULT_TILE };
/// The narrow tile staging each step item by item after the barrier: the default before entry
/// 11, kept to measure against (`BRINK_MOE_GEMM_TILE=moe_gemm_m64n64k4`).
pub const UNPIPELINED_TILE: GemmTile = GemmTile { kernel: "moe_gemm_m64n64k4", prefetch: false, ..NARROW_TILE };
/// The narrow tile with two stages of shared memory (43,008 B: still within 48 KiB), for
/// measuring (`BRINK_MOE_GEMM_TILE=moe_gemm_m64n64k4_pf2`; entry 12: slower).
pub const TWO_STAGE_TILE: GemmTile = GemmTile { kernel: "moe_gemm_m64n64k4_pf2", stages: 2, ..NARROW_TILE };
/// Every tile shape `moe_gemm.cu` instantiates.
pub const TILES: [GemmTile; 5] = [DEFAULT_TILE, SHORT_TILE, NARROW_TILE, UNPIPELINED_TILE, TWO_STAGE_TILE];

/// Rows per expert, on average over the batch, below which [`tile_for`] takes [`SHORT_TILE`].
/// Padding each segment to the row tile computes, for an expert of r rows, ceil(r / m) · m
/// rows: at 512 tokens of Qwen3-30B-A3B (4,096 pairs over 128 experts, 32 on average) the
/// 64-row tile computes about twice the real rows, the 32-row one about 1.5 times.
pub const SHORT_TILE_MAX_AVERAGE_ROWS: u64 = 48;

/// The tile for a batch of `tokens` routed to `top_k` of `experts` experts: [`SHORT_TILE`]
/// while the average expert segment (tokens · top_k / experts rows) is under
/// [`SHORT_TILE_MAX_AVERAGE_ROWS`], else [`DEFAULT_TILE`].
pub fn tile_for(tokens: u64, top_k: u32, experts: u32) -> &'static GemmTile {
    if tokens.saturating_mul(top_k as u64) < SHORT_TILE_MAX_AVERAGE_ROWS * experts as u64 { &SHORT_TILE } else { &DEFAULT_TILE }
}

/// The tile the engine's prefill uses for a batch: `BRINK_MOE_GEMM_TILE` (an entry point of
/// [`TILES`], read once per process) for measuring one tile everywhere, else [`tile_for`].
pub fn configured_tile(tokens: u64, top_k: u32, experts: u32) -> Result<&'static GemmTile, String> {
    static TILE: std::sync::OnceLock<Result<Option<&'static GemmTile>, String>> = std::sync::OnceLock::new();
    let named = TILE.get_or_init(|| match std::env::var("BRINK_MOE_GEMM_TILE") {
        Ok(name) => tile_named(&name).map(Some).map_err(|e| format!("BRINK_MOE_GEMM_TILE: {e}")),
        Err(_) => Ok(None),
    });
    Ok(named.clone()?.unwrap_or_else(|| tile_for(tokens, top_k, experts)))
}

/// The tile of `TILES` whose entry point is `kernel`, or an error listing them (for a tile
/// named in configuration, e.g. the CUDA backend's `BRINK_MOE_GEMM_TILE`).
pub fn tile_named(kernel: &str) -> Result<&'static GemmTile, String> {
    TILES.iter().find(|t| t.kernel == kernel).ok_or_else(|| {
        let names: Vec<&str> = TILES.iter().map(|t| t.kernel).collect();
        format!("no routed GEMM tile is named '{kernel}'; tiles: {}", names.join(", "))
    })
}

fn shape(tokens: u64, c: &GemmCase) -> String {
    format!("tokens={tokens} experts={} top_k={} n={} k={} {}", c.experts, c.top_k, c.n, c.k, c.wtype)
}

fn unsupported(kernel: &str, what: impl Into<String>, tokens: u64, c: &GemmCase) -> PlanError {
    PlanError::Unsupported { kernel: kernel.into(), what: what.into(), shape: shape(tokens, c) }
}

/// Rows a launch with `tile` covers: every expert segment padded to its rows, worst case.
pub fn max_padded_rows(tokens: u64, c: &GemmCase, tile: &GemmTile) -> u64 {
    moe_align::max_padded_rows(tokens, c.top_k, c.experts, tile.m)
}

/// The distinct row tiles of [`TILES`] (each needs its own alignment).
fn row_tiles() -> Vec<u32> {
    let mut m: Vec<u32> = TILES.iter().map(|t| t.m).collect();
    m.sort_unstable_by(|a, b| b.cmp(a));
    m.dedup();
    m
}

/// The launches of a routed GEMM of `tokens`: the default tile's, then the one [`tile_for`]
/// picks for the engine where that differs.
pub fn plans(tokens: u64, c: &GemmCase, limits: &DeviceLimits) -> Result<Vec<Launch>, PlanError> {
    let mut v = vec![plan(tokens, c, &DEFAULT_TILE, limits)?];
    let selected = tile_for(tokens, c.top_k, c.experts);
    if *selected != DEFAULT_TILE {
        v.push(plan(tokens, c, selected, limits)?);
    }
    Ok(v)
}

/// The launch of one routed GEMM with `tile`: grid (row tiles of the worst-case padded rows,
/// column tiles of N, 1), one block of `tile.threads`, `tile.shared_bytes()` dynamic.
pub fn plan(tokens: u64, c: &GemmCase, tile: &GemmTile, limits: &DeviceLimits) -> Result<Launch, PlanError> {
    let bad = |what: &str| Err(unsupported(tile.kernel, what, tokens, c));
    if tokens == 0 {
        return bad("0 tokens");
    }
    if let Some(what) = c.wtype.check_row_width(c.k as u64) {
        return bad(&what);
    }
    if c.n == 0 || c.n as u64 > I32_MAX {
        return bad("n must be in 1 ..= 2^31 - 1");
    }
    if c.experts == 0 || c.experts > MAX_EXPERTS {
        return bad(&format!("experts must be in 1 ..= {MAX_EXPERTS}"));
    }
    if c.top_k == 0 || c.top_k > c.experts {
        return bad("top_k must be in 1 ..= experts");
    }
    let rows = max_padded_rows(tokens, c, tile);
    // Pair ids, the sentinel and segment offsets are i32 in the alignment layout.
    if rows > I32_MAX {
        return bad("padded rows pass 2^31 - 1 (pair ids are i32)");
    }
    let (m, n) = (tile.m as u64, tile.n as u64);
    Launch::checked(
        tile.kernel,
        shape(tokens, c),
        [rows / m, (c.n as u64).div_ceil(n), 1],
        [tile.threads, 1, 1],
        tile.shared_bytes(),
        vec![Cover::Tiles { axis: 0, items: rows, per_block: m }, Cover::Tiles { axis: 1, items: c.n as u64, per_block: n }],
        limits,
    )
}

/// `out[col] = dot(W_e[col, :], a)` for one sorted row: the per-row formula of the kernel.
fn gemm_row<'a>(out: &mut [f32], w_row: impl Fn(usize) -> &'a [u8], a: &[BlockQ8_1], wtype: WeightType) {
    for (col, o) in out.iter_mut().enumerate() {
        *o = wtype.dot_q8_1(w_row(col), a);
    }
}

/// CPU twin over plain slices. `a_rows`: `sorted_ids.len()` rows of `k / 32` blocks in sorted
/// order; `weights`: `[experts · n]` rows of `k` weights of `wtype`. Returns `y [pairs, n]`;
/// rows of padding (ids outside `0..pairs`) and of tiles without an expert are not stored.
pub fn gemm_cpu(aligned: &Aligned, a_rows: &[BlockQ8_1], weights: &[u8], pairs: usize, n: usize, k: usize, wtype: WeightType) -> Vec<f32> {
    let (nb, rb) = (k / QK, wtype.row_bytes(k));
    let tile = aligned.sorted_ids.len() / aligned.tile_expert.len().max(1);
    let mut row_of = vec![None; pairs];
    for (r, &p) in aligned.sorted_ids.iter().enumerate() {
        if aligned.tile_expert[r / tile] >= 0 && (0..pairs as i64).contains(&(p as i64)) {
            row_of[p as usize] = Some(r);
        }
    }
    let mut y = vec![0.0f32; pairs * n];
    y.par_chunks_mut(n.max(1)).zip(&row_of).for_each(|(out, row)| {
        if let Some(r) = *row {
            let e = aligned.tile_expert[r / tile] as usize;
            gemm_row(out, |col| &weights[(e * n + col) * rb..][..rb], &a_rows[r * nb..][..nb], wtype);
        }
    });
    y
}

/// Output words of y: f32 for the engine, u32 for the self-test's poisoned buffers.
pub trait OutputWord: DeviceRepr {}
impl OutputWord for f32 {}
impl OutputWord for u32 {}

/// Device buffers of one routed GEMM, as the alignment and the gather leave them.
pub struct GemmBuffers<'a, Y: OutputWord> {
    /// `[max_padded_rows]` i32.
    pub sorted_ids: &'a CudaSlice<i32>,
    /// `[max_padded_rows / tile rows]` i32.
    pub tile_expert: &'a CudaSlice<i32>,
    /// `[max_padded_rows, k / 32]` q8_1 blocks.
    pub a: &'a CudaSlice<u8>,
    /// `[experts · n]` rows of `k` weights of `wtype`.
    pub w: &'a CudaSlice<u8>,
    /// `[tokens · top_k, n]` f32.
    pub y: &'a mut CudaSlice<Y>,
}

/// Rejects buffers smaller than the plan reads or writes (a short buffer would fault).
fn check_sizes<Y: OutputWord>(tokens: u64, c: &GemmCase, tile: &GemmTile, b: &GemmBuffers<Y>) -> Result<(), PlanError> {
    let rows = max_padded_rows(tokens, c, tile);
    let (nb, n) = (c.k as u64 / QK as u64, c.n as u64);
    let need = [
        ("sorted_ids", b.sorted_ids.len() as u64, rows),
        ("tile_expert", b.tile_expert.len() as u64, rows / tile.m as u64),
        ("a", b.a.len() as u64, rows * nb * BLOCK_Q8_1_BYTES as u64),
        ("w", b.w.len() as u64, c.experts as u64 * n * c.wtype.row_bytes(c.k as usize) as u64),
        ("y", b.y.len() as u64, tokens * c.top_k as u64 * n),
    ];
    match need.iter().find(|(_, have, want)| have < want) {
        Some((name, have, want)) => {
            Err(unsupported(tile.kernel, format!("buffer {name} holds {have} elements, the launch needs {want}"), tokens, c))
        }
        None => Ok(()),
    }
}

/// Launches the routed GEMM of `tokens` with `tile` (checked plan, checked buffer sizes).
pub fn launch<Y: OutputWord>(gpu: &Gpu, tokens: u64, c: &GemmCase, tile: &GemmTile, b: GemmBuffers<Y>) -> Result<(), GpuError> {
    let p = plan(tokens, c, tile, gpu.limits())?;
    check_sizes(tokens, c, tile, &b)?;
    let f = gpu.function(&MOE_GEMM, tile.kernel)?;
    let pairs = tokens * c.top_k as u64;
    let (n, nb, experts, wtype) = (c.n as i32, (c.k / QK as u32) as i32, c.experts as i32, c.wtype.code());
    gpu.launch(&p, &f, |a| {
        a.arg(b.sorted_ids).arg(b.tile_expert).arg(b.a).arg(b.w).arg(b.y).arg(&pairs).arg(&n).arg(&nb).arg(&experts).arg(&wtype);
    })?;
    Ok(())
}

/// Token counts this kernel's plan makes critical.
pub fn critical_counts(c: &GemmCase, limits: &DeviceLimits) -> Vec<Critical> {
    let (k, n, nb, e) = (c.top_k as u64, c.n as u64, c.k as u64 / QK as u64, c.experts as u64);
    let mut v = vec![Critical::new(1, "moe_gemm: single token (top_k one-row tiles)")];
    if k == 0 {
        return v;
    }
    v.extend(overflow_point(k * n, "moe_gemm: y[pair·N + n] passes 2^31 − 1"));
    v.extend(overflow_point(k * nb, "moe_gemm: A block index row·(K/32) + kb passes 2^31 − 1 (padding ignored)"));
    v.extend(overflow_point(k * nb * 9, "moe_gemm: A u32 word index (row·(K/32) + kb)·9 passes 2^31 − 1 (padding ignored)"));
    // Where tile_for switches from the short tile to the default.
    let switch = (SHORT_TILE_MAX_AVERAGE_ROWS * e).div_ceil(k);
    v.extend(
        [switch.saturating_sub(1), switch]
            .into_iter()
            .filter(|&t| t > 0)
            .map(|t| Critical::new(t, format!("moe_gemm: around the switch to the {}-row tile", DEFAULT_TILE.m))),
    );
    // The row tiles' counts are the default's: the short tile's 32 rows divide them, so its
    // tails (multiples 2 and 4) are among them, and it runs at every count up to
    // OTHER_TILES_MAX_PAIRS pairs, past any count where tile_for takes it.
    let m = DEFAULT_TILE.m as u64;
    // Row tiles = ceil((t·k + E·(m − 1)) / m) with worst-case padding: where they pass what a
    // grid.y could hold (they are on grid.x).
    let y_max = limits.max_grid_dim[1] as u64;
    if let Some(room) = (y_max * m).checked_sub(e * (m - 1)) {
        let last = room / k;
        v.push(Critical::new(last, format!("moe_gemm: {y_max} row tiles of {m} (worst-case padding), the last count a grid.y could hold")));
        v.push(Critical::new(last + 1, format!("moe_gemm: {y_max} + 1 row tiles (worst-case padding): past grid.y, must pass on grid.x")));
    }
    // Uniform routing: an average expert segment of one row tile.
    let t = e * m / k;
    v.extend(
        [t.saturating_sub(1), t, t + 1]
            .into_iter()
            .filter(|&t| t > 0)
            .map(|t| Critical::new(t, "moe_gemm: average expert segment around one row tile")),
    );
    v.extend(tile_tails(m, false, &[1, 2], "moe_gemm row tile"));
    v
}

/// Device memory of a self-test case: per row tile its alignment tables and A, then W and y
/// with its guard.
pub fn device_bytes(tokens: u64, c: &GemmCase) -> u64 {
    let nb = c.k as u64 / QK as u64;
    let aligned: u64 = row_tiles()
        .into_iter()
        .map(|m| {
            let rows = moe_align::max_padded_rows(tokens, c.top_k, c.experts, m);
            4 * (rows + rows / m as u64) + rows * nb * BLOCK_Q8_1_BYTES as u64
        })
        .sum();
    let w = c.experts as u64 * c.n as u64 * c.wtype.row_bytes(c.k as usize) as u64;
    let y = 4 * (tokens * c.top_k as u64 * c.n as u64 + crate::ops::testdata::GUARD_WORDS as u64);
    aligned + w + y
}

const SEED_ROUTE: u64 = 0x30;
const SEED_A: u64 = 0x31;
const SEED_W: u64 = 0x32;
/// Cases up to this many pairs also run the other tiles the device takes. Their index
/// arithmetic is the default's template (only tile sizes differ), so the large counts would
/// add self-test time, not coverage.
const OTHER_TILES_MAX_PAIRS: u64 = 1 << 16;
// So the short tile runs in the self-test at every count where the engine takes it.
const _: () = assert!(SHORT_TILE_MAX_AVERAGE_ROWS * MAX_EXPERTS as u64 <= OTHER_TILES_MAX_PAIRS);
/// Pairs compared with the twin beyond the tails: each sampled pair costs the CPU N·K
/// multiply-adds, and each distinct expert N weight rows to regenerate.
const SAMPLE_PAIRS: usize = 64;

/// Reference rows of the sampled pairs. The weights of the experts they route to are
/// generated once per process and shared with the family's other cases (they depend on the
/// shape and the seed only).
fn reference(c: &GemmCase, ids: &[i32], pairs: &[u64]) -> Vec<(u64, Arc<Vec<f32>>)> {
    let (n, k, nb, rb) = (c.n as usize, c.k as usize, c.k as usize / QK, c.wtype.row_bytes(c.k as usize));
    // Pair p's row depends on its expert and p only (A row p, the expert's weights): each is
    // computed once per process and shared with the family's other cases.
    pairs
        .par_iter()
        .map(|&p| {
            let e = ids[p as usize] as u64;
            let what = format!("moe_gemm w{SEED_W:#x} a{SEED_A:#x} n{n} k{k} {} expert {e}", c.wtype);
            let row = shared_twin_row(&what, p, || {
                let w = shared_weight_rows(SEED_W, c.wtype, k, e * n as u64, n as u64);
                let mut out = vec![0.0f32; n];
                gemm_row(&mut out, |col| &w[col * rb..(col + 1) * rb], &q8_1_row(SEED_A, p, nb), c.wtype);
                out
            });
            (p, row)
        })
        .collect()
}

/// The self-test's device inputs of one row tile (the weights are shared by every tile).
struct Inputs<'w> {
    sorted_ids: CudaSlice<i32>,
    tile_expert: CudaSlice<i32>,
    a: CudaSlice<u8>,
    w: &'w CudaSlice<u8>,
}

/// What one tile's run leaves for the host check: (kernel ms, the sampled pairs' rows,
/// unwritten, past end).
type TileRun = (f64, Vec<Vec<f32>>, u64, u64);

/// One tile's run: poison y, launch, time it, then count unwritten / past-end words and
/// download the sampled pairs' rows.
fn run_tile(
    gpu: &Gpu,
    tokens: u64,
    c: &GemmCase,
    tile: &GemmTile,
    ins: &Inputs,
    y: &mut Guarded,
    pairs: &[u64],
) -> Result<TileRun, GpuError> {
    fill_words(gpu, &mut y.buf, POISON)?;
    gpu.synchronize()?;
    let start = std::time::Instant::now();
    let bufs = GemmBuffers { sorted_ids: &ins.sorted_ids, tile_expert: &ins.tile_expert, a: &ins.a, w: ins.w, y: &mut y.buf };
    launch(gpu, tokens, c, tile, bufs)?;
    gpu.synchronize()?;
    let ms = start.elapsed().as_secs_f64() * 1e3;
    let (unwritten, past_end) = y.check(gpu, 1)?;
    // One copy per run of nearby pairs (the sampled pairs' tails are runs), not one per pair.
    let got = y.read_rows_f32(gpu, pairs, c.n as usize)?;
    Ok((ms, got, unwritten, past_end))
}

/// Self-test: route, align on the CPU, gather A and fill W on the device from seeds, run the
/// default tile (its time is reported), then on small cases every other tile the device takes,
/// and compare sampled pairs.
pub fn run_case(gpu: &Gpu, tokens: u64, c: &GemmCase) -> Result<Outcome, GpuError> {
    stage_case(gpu, tokens, c).map(Staged::finish)
}

/// [`run_case`]'s GPU half: every tile run and its sampled pairs downloaded; the twin of the
/// sampled pairs (weights regenerated for the experts they route to) is the host check.
pub fn stage_case(gpu: &Gpu, tokens: u64, c: &GemmCase) -> Result<Staged, GpuError> {
    plan(tokens, c, &DEFAULT_TILE, gpu.limits())?;
    let (e, k, n, nb) = (c.experts as usize, c.top_k as usize, c.n as usize, c.k as usize / QK);
    let pairs = tokens as usize * k;
    let ids = route(c.routing, tokens as usize, e, k, DEFAULT_TILE.m as usize, SEED_ROUTE);
    let mut w = gpu.alloc::<u8>(e * n * c.wtype.row_bytes(c.k as usize))?;
    fill_weights(gpu, &mut w, e * n * c.wtype.blocks_per_row(c.k as usize), SEED_W, c.wtype)?;
    let mut y = Guarded::new(gpu, pairs * n)?;
    let sampled = sample_rows(pairs as u64, k as u64, SAMPLE_PAIRS, tokens);

    // The default tile, the one the engine takes at this count, and on small cases every
    // other tile the device takes; grouped by row tile, each group on its own alignment (A
    // gathered in its sorted order: row values depend on the pair only).
    let selected = tile_for(tokens, c.top_k, c.experts);
    let runs: Vec<&GemmTile> = TILES
        .iter()
        .filter(|t| **t == DEFAULT_TILE || *t == selected || pairs as u64 <= OTHER_TILES_MAX_PAIRS)
        .filter(|t| plan(tokens, c, t, gpu.limits()).is_ok())
        .collect();
    // Per tile run: (kernel, is the default, ms, downloaded rows, unwritten, past end).
    let mut tiles = Vec::new();
    for m in row_tiles() {
        let group: Vec<&GemmTile> = runs.iter().copied().filter(|t| t.m == m).collect();
        if group.is_empty() {
            continue;
        }
        let aligned = moe_align::align_cpu(&ids, tokens, c.top_k, c.experts, m);
        let rows = aligned.sorted_ids.len();
        let sorted_ids = gpu.upload(&aligned.sorted_ids)?;
        let mut a = gpu.alloc::<u8>(rows * nb * BLOCK_Q8_1_BYTES)?;
        fill_q8_1_rows(gpu, &mut a, rows, nb, SEED_A, Some(&sorted_ids), pairs as u64)?;
        let ins = Inputs { sorted_ids, tile_expert: gpu.upload(&aligned.tile_expert)?, a, w: &w };
        for tile in group {
            let (ms, got, unwritten, past_end) = run_tile(gpu, tokens, c, tile, &ins, &mut y, &sampled)?;
            tiles.push((tile.kernel, *tile == DEFAULT_TILE, ms, got, unwritten, past_end));
        }
    }
    let c = *c;
    Ok(Staged::Check(Box::new(move || {
        let want = reference(&c, &ids, &sampled);
        let mut check = Check {
            max_rel_err: 0.0,
            tolerance: TOLERANCE,
            compared: 0,
            unwritten: 0,
            past_end: 0,
            int_mismatches: 0,
            kernel_ms: 0.0,
            note: String::new(),
        };
        let mut notes = Vec::new();
        for (kernel, default, ms, got, unwritten, past_end) in tiles {
            let mut err = RelErr::default();
            for ((p, w), got) in want.iter().zip(&got) {
                err.add_slice(*p * c.n as u64, got, w);
            }
            if default {
                check.kernel_ms = ms;
            }
            check.max_rel_err = check.max_rel_err.max(err.value());
            check.compared += err.compared;
            check.unwritten += unwritten;
            check.past_end += past_end;
            notes.push(format!("{kernel}: {}", err.describe()));
        }
        check.note = notes.join("; ");
        Outcome::Ran(check)
    })))
}

/// The host work of one case without the device (the bench of the self-test's host costs): the
/// routing, the alignment, the sampling and the twin of the sampled pairs.
#[cfg(test)]
pub(crate) fn host_half(tokens: u64, c: &GemmCase) -> usize {
    let ids = route(c.routing, tokens as usize, c.experts as usize, c.top_k as usize, DEFAULT_TILE.m as usize, SEED_ROUTE);
    let aligned = moe_align::align_cpu(&ids, tokens, c.top_k, c.experts, DEFAULT_TILE.m);
    let pairs = tokens * c.top_k as u64;
    let sampled = sample_rows(pairs, c.top_k as u64, SAMPLE_PAIRS, tokens);
    aligned.sorted_ids.len() + reference(c, &ids, &sampled).len()
}

/// The self-test's handle on this family (registered in `selftest::case`).
pub struct Family;

impl KernelFamily for Family {
    type Case = GemmCase;

    fn run(gpu: &Gpu, tokens: u64, c: &GemmCase) -> Result<Outcome, GpuError> {
        run_case(gpu, tokens, c)
    }

    fn stage(gpu: &Gpu, tokens: u64, c: &GemmCase) -> Result<Staged, GpuError> {
        stage_case(gpu, tokens, c)
    }

    fn plans(tokens: u64, c: &GemmCase, limits: &DeviceLimits) -> Result<Vec<Launch>, PlanError> {
        plans(tokens, c, limits)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::quant::dequantize_q8_1;
    use crate::testdata::weight_row;
    use crate::thresholds::TOP_K_SET;

    fn case(top_k: u32, n: u32, k: u32, wtype: WeightType, routing: Routing) -> GemmCase {
        GemmCase { experts: 128, top_k, n, k, wtype, routing }
    }

    /// Twin vs. dequantize-then-f64 dot, looked up by each pair's routed expert (not the tiles).
    #[test]
    fn cpu_twin_matches_dequantized_f64() {
        let (experts, top_k, n) = (8u32, 2u32, 40usize);
        for wtype in WeightType::ALL {
            // Three blocks: 96 weights, or 768 for the 256-wide K-quant super-blocks.
            let k = 3 * wtype.block_size();
            let nb = k / QK;
            let weights: Vec<u8> = (0..experts as u64 * n as u64).flat_map(|r| weight_row(SEED_W, r, k, wtype)).collect();
            for routing in [Routing::Uniform, Routing::OneExpert, Routing::MaxPadding] {
                for tokens in [1u64, 5, 33, 70] {
                    let pairs = (tokens * top_k as u64) as usize;
                    let ids = route(routing, tokens as usize, experts as usize, top_k as usize, DEFAULT_TILE.m as usize, 1);
                    let al =
                        moe_align::align_cpu(&ids, tokens, top_k, experts, if tokens % 2 == 0 { SHORT_TILE.m } else { DEFAULT_TILE.m });
                    let zero = BlockQ8_1 { d: half::f16::ZERO, s: half::f16::ZERO, qs: [0; QK] };
                    let a_rows: Vec<BlockQ8_1> = al
                        .sorted_ids
                        .iter()
                        .flat_map(|&p| if (p as usize) < pairs { q8_1_row(SEED_A, p as u64, nb) } else { vec![zero; nb] })
                        .collect();
                    let y = gemm_cpu(&al, &a_rows, &weights, pairs, n, k, wtype);
                    let mut worst = 0.0f64;
                    let mut scale = 0.0f64;
                    for p in 0..pairs {
                        let x = dequantize_q8_1(&q8_1_row(SEED_A, p as u64, nb));
                        for col in 0..n {
                            let rb = wtype.row_bytes(k);
                            let row = ids[p] as usize * n + col;
                            let wd = wtype.dequantize_row(&weights[row * rb..][..rb]);
                            let want: f64 = wd.iter().zip(&x).map(|(a, b)| *a as f64 * *b as f64).sum();
                            worst = worst.max((want - y[p * n + col] as f64).abs());
                            scale = scale.max(want.abs());
                        }
                    }
                    // q4_0 goes through the f16 s = d·Σq of each activation block.
                    assert!(worst <= 2e-3 * scale.max(1e-3), "{wtype} {routing:?} t={tokens}: {worst} vs scale {scale}");
                }
            }
        }
    }

    #[test]
    fn plans_cover_every_tile_on_both_devices() {
        let counts = (1..=200u64).chain([8191, 8192, 8193, 600_000, 1 << 20]);
        for limits in DeviceLimits::recorded() {
            for t in counts.clone() {
                for &tk in &TOP_K_SET {
                    for (n, k) in [(768, 2048), (2048, 768)] {
                        let c = case(tk, n, k, WeightType::Q4_0, Routing::Uniform);
                        let p = plans(t, &c, &limits).unwrap_or_else(|e| panic!("t={t} k={tk}: {e}"));
                        assert_eq!(p.len(), if tile_for(t, tk, c.experts) == &DEFAULT_TILE { 1 } else { 2 });
                        p.iter().for_each(|p| p.check_cover().unwrap());
                        assert_eq!(p[0].grid[0] as u64 * 64, max_padded_rows(t, &c, &DEFAULT_TILE));
                        assert_eq!(p[0].grid[1], n.div_ceil(DEFAULT_TILE.n));
                    }
                }
            }
        }
    }

    #[test]
    fn row_tiles_past_65535_stay_on_grid_x() {
        let c = case(8, 768, 2048, WeightType::Q8_0, Routing::MaxPadding);
        let p = &plans(600_000, &c, &DeviceLimits::gb10()).unwrap()[0];
        assert!(p.grid[0] > 65_535 && p.grid[1] == 768 / DEFAULT_TILE.n && p.grid[2] == 1, "{p}");
    }

    #[test]
    fn short_tile_below_48_rows_per_expert_on_average() {
        // (tokens, top_k, experts, rows of the tile): Qwen3-30B-A3B is top-8 of 128 experts,
        // so 768 tokens average 48 rows.
        for (t, k, e, m) in [
            (1, 8, 128, 32),
            (512, 8, 128, 32),
            (767, 8, 128, 32),
            (768, 8, 128, 64),
            (2048, 8, 128, 64),
            (96, 4, 8, 64),
            (95, 4, 8, 32),
            (u64::MAX, 8, 128, 64),
        ] {
            assert_eq!(tile_for(t, k, e).m, m, "t={t} k={k} e={e}");
        }
        let c = case(8, 768, 2048, WeightType::Q4_0, Routing::Uniform);
        let counts: Vec<u64> = critical_counts(&c, &DeviceLimits::h200()).iter().map(|c| c.tokens).collect();
        assert!(counts.contains(&767) && counts.contains(&768), "the switch is a critical count: {counts:?}");
    }

    #[test]
    fn tiles_are_found_by_name() {
        for t in &TILES {
            assert_eq!(tile_named(t.kernel), Ok(t));
        }
        let e = tile_named("moe_gemm_m1").unwrap_err();
        assert!(e.contains("'moe_gemm_m1'") && e.contains("moe_gemm_m64n64k4_pf, moe_gemm_m64n64k4"), "{e}");
    }

    #[test]
    fn every_tile_fits_both_devices_without_opting_in() {
        let c = case(8, 768, 2048, WeightType::Q4_0, Routing::Uniform);
        assert_eq!((DEFAULT_TILE.shared_bytes(), NARROW_TILE.shared_bytes()), (16_384, 21_504));
        for t in TILES {
            assert!(t.shared_bytes() <= 48 * 1024, "{t:?}");
            for limits in [DeviceLimits::h200(), DeviceLimits::gb10()] {
                assert!(plan(4096, &c, &t, &limits).is_ok(), "{t:?} {}", limits.name);
            }
        }
    }

    /// The table matches the entry points `moe_gemm.cu` instantiates (a block of other than
    /// `threads` threads would leave staged blocks unloaded).
    #[test]
    fn tiles_match_the_cuda_instantiations() {
        let inst: Vec<Vec<&str>> = MOE_GEMM
            .code
            .lines()
            .filter_map(|l| l.strip_prefix("MOE_GEMM_KERNEL(")?.strip_suffix(')'))
            .map(|args| args.split(',').map(str::trim).collect())
            .collect();
        assert_eq!(inst.len(), TILES.len());
        for t in TILES {
            let args = inst.iter().find(|a| a[0] == t.kernel).unwrap_or_else(|| panic!("{} not instantiated", t.kernel));
            let num: Vec<u32> = args[1..].iter().map(|a| a.parse().unwrap()).collect();
            assert_eq!((num[0], num[1], num[2]), (t.m, t.n, t.k_blocks), "{t:?}");
            assert_eq!(t.threads, num[0] / num[3] * (num[1] / num[4]), "{t:?}");
            assert_eq!((t.prefetch, t.stages), (num[5] == 1, num[6]), "{t:?}");
            assert!(mma_subtiles_cover(num[0], num[1], num[3], num[4]), "{t:?}: warps' 16 x 8 mma sub-tiles");
        }
    }

    /// `gemm_tile.cuh`'s warps tile a block with 16 x 8 mma.sync sub-tiles, each thread taking
    /// TM / 2 x TN / 2 of them: TM and TN even, BM a multiple of 8 TM and BN of 4 TN.
    pub(crate) fn mma_subtiles_cover(bm: u32, bn: u32, tm: u32, tn: u32) -> bool {
        tm.is_multiple_of(2) && tn.is_multiple_of(2) && bm.is_multiple_of(8 * tm) && bn.is_multiple_of(4 * tn)
    }

    #[test]
    fn mma_cover_rule_rejects_uncoverable_tiles() {
        assert!(mma_subtiles_cover(64, 64, 4, 4));
        assert!(!mma_subtiles_cover(64, 64, 3, 4));
        assert!(!mma_subtiles_cover(48, 64, 4, 4));
        assert!(!mma_subtiles_cover(64, 24, 4, 4));
    }

    #[test]
    fn bad_shapes_are_unsupported() {
        let l = DeviceLimits::gb10();
        let ok = case(8, 768, 2048, WeightType::Q8_0, Routing::Uniform);
        for (t, c) in [
            (0, ok),
            (1, GemmCase { k: 100, ..ok }),
            (1, GemmCase { k: 0, ..ok }),
            (1, GemmCase { n: 0, ..ok }),
            (1, GemmCase { top_k: 0, ..ok }),
            (1, GemmCase { experts: 4, ..ok }),
            (1, GemmCase { experts: MAX_EXPERTS + 1, ..ok }),
            (1, GemmCase { k: 768 + 32, wtype: WeightType::Q6K, ..ok }),
            (1, GemmCase { k: 128, wtype: WeightType::Q4K, ..ok }),
            (1 << 29, ok),
        ] {
            assert!(matches!(plans(t, &c, &l), Err(PlanError::Unsupported { .. })), "t={t} {c:?}");
        }
        let wide = GemmCase { n: 65_536 * 64, ..ok };
        assert!(matches!(plans(1, &wide, &l), Err(PlanError::GridDim { axis: 'y', .. })));
    }

    #[test]
    fn critical_counts_bracket_65535_row_tiles() {
        for limits in DeviceLimits::recorded() {
            for &tk in &TOP_K_SET {
                let c = case(tk, 768, 2048, WeightType::Q4_0, Routing::MaxPadding);
                let tiles = |t: u64| max_padded_rows(t, &c, &DEFAULT_TILE) / 64;
                let counts: Vec<u64> = critical_counts(&c, &limits).iter().map(|c| c.tokens).collect();
                let last = counts.iter().copied().find(|&t| tiles(t) == 65_535 || (tiles(t) <= 65_535 && tiles(t + 1) > 65_535));
                let last = last.unwrap_or_else(|| panic!("top_k {tk}: no 65535-tile count in {counts:?}"));
                assert!(tiles(last) <= 65_535 && tiles(last + 1) > 65_535 && counts.contains(&(last + 1)));
                assert!(plans(last + 1, &c, &limits).is_ok());
            }
        }
        // Qwen3-30B-A3B, top-8: (65535·64 − 128·63) / 8 = 523,272 tokens still fit 65535 tiles.
        let c = case(8, 768, 2048, WeightType::Q4_0, Routing::MaxPadding);
        let counts: Vec<u64> = critical_counts(&c, &DeviceLimits::h200()).iter().map(|c| c.tokens).collect();
        assert!(counts.contains(&523_272) && counts.contains(&523_273), "{counts:?}");
        // y width 8·768: 349,525 fits, 349,526 passes 2^31 − 1.
        assert!(counts.contains(&349_525) && counts.contains(&349_526));
    }
}
