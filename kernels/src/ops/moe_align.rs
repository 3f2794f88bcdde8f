//! Expert alignment: the (token, slot) pairs sorted by expert, each expert's segment padded to
//! a multiple of the routed GEMM's row tile, plus the expert of every row tile.
//!
//! Three launches (`cuda/moe_align.cu`) after zeroing the per-expert counts: count (grid-stride
//! over pairs), offsets (one block, a thread per expert: padded prefix sum, tile experts,
//! sentinel padding), scatter (grid-stride over pairs). Everything that grows with tokens is on
//! grid.x or in a grid-stride loop; the row tiles the GEMM later launches are only *counted*
//! here, and where they pass 65535 is a critical count (a GEMM with tiles on grid.y fails there).

use cudarc::driver::{CudaSlice, CudaView, CudaViewMut, PushKernelArg};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::check::{Check, KernelFamily, Outcome};
use crate::cuda::{Gpu, GpuError, error_name};
use crate::launch::{Cover, Launch, PlanError, grid_stride_blocks};
use crate::limits::DeviceLimits;
use crate::ops::testdata::{GUARD_WORDS, Guarded};
use crate::routing::{Routing, expert_counts, route};
use crate::sources::MOE_ALIGN;
use crate::thresholds::{Critical, I32_MAX, overflow_point};

pub const KERNEL: &str = "moe_align";
/// Row tile the routed GEMM pads expert segments to (the alignment's `tile` in the catalogue).
pub const GEMM_TILE_M: u32 = 64;
pub const KERNEL_COUNT: &str = "moe_align_count";
pub const KERNEL_OFFSETS: &str = "moe_align_offsets";
pub const KERNEL_SCATTER: &str = "moe_align_scatter";
/// Integer outputs, compared exactly (segments as sets: the scatter's order is arbitrary).
pub const TOLERANCE: f64 = 0.0;
/// One thread per expert in the offsets block (and the kernels' shared arrays).
pub const MAX_EXPERTS: u32 = 1024;
const THREADS: u32 = 256;
const OFFSETS_THREADS: u32 = 1024;

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct AlignCase {
    pub experts: u32,
    pub top_k: u32,
    /// Row tile of the routed GEMM that segments are padded to.
    pub tile: u32,
    pub routing: Routing,
}

/// A validated problem: every row index and the sentinel fit in i32.
#[derive(Clone, Copy, Debug)]
struct Geometry {
    tokens: u64,
    top_k: u32,
    experts: u32,
    tile: u32,
    pairs: u64,
    max_rows: u64,
}

impl Geometry {
    fn new(tokens: u64, top_k: u32, experts: u32, tile: u32) -> Result<Geometry, PlanError> {
        let shape = format!("tokens={tokens} top_k={top_k} experts={experts} tile={tile}");
        let reject = |what: String| Err(PlanError::Unsupported { kernel: KERNEL.into(), what, shape: shape.clone() });
        if tokens == 0 {
            return reject("no tokens".into());
        }
        if experts == 0 || experts > MAX_EXPERTS {
            return reject(format!("{experts} experts: supported 1..={MAX_EXPERTS} (one thread per expert in the offsets block)"));
        }
        if top_k == 0 || top_k > experts {
            return reject(format!("top_k {top_k} must be in 1..={experts}"));
        }
        if tile == 0 {
            return reject("row tile 0".into());
        }
        let max_rows = max_padded_rows(tokens, top_k, experts, tile);
        if max_rows > I32_MAX {
            return reject(format!("{max_rows} padded rows (tokens x top_k + padding) do not fit i32"));
        }
        Ok(Geometry { tokens, top_k, experts, tile, pairs: tokens * top_k as u64, max_rows })
    }

    fn shape(&self) -> String {
        format!("tokens={} top_k={} experts={} tile={}", self.tokens, self.top_k, self.experts, self.tile)
    }

    fn tiles(&self) -> u64 {
        self.max_rows / self.tile as u64
    }

    fn pair_plan(&self, kernel: &str, limits: &DeviceLimits) -> Result<Launch, PlanError> {
        let per_block = THREADS as u64;
        Launch::checked(
            kernel,
            self.shape(),
            [grid_stride_blocks(self.pairs, per_block, limits), 1, 1],
            [THREADS, 1, 1],
            0,
            vec![Cover::GridStride { items: self.pairs, per_block }],
            limits,
        )
    }

    fn offsets_plan(&self, limits: &DeviceLimits) -> Result<Launch, PlanError> {
        Launch::checked(
            KERNEL_OFFSETS,
            self.shape(),
            [1, 1, 1],
            [OFFSETS_THREADS, 1, 1],
            0,
            vec![Cover::SingleBlock { items: self.experts as u64 }, Cover::SingleBlock { items: self.tiles() }],
            limits,
        )
    }
}

/// Every launch one alignment makes, in order: count, offsets, scatter (the counts are zeroed
/// by a memset before them).
pub fn plans(tokens: u64, c: &AlignCase, limits: &DeviceLimits) -> Result<Vec<Launch>, PlanError> {
    let g = Geometry::new(tokens, c.top_k, c.experts, c.tile)?;
    Ok(vec![g.pair_plan(KERNEL_COUNT, limits)?, g.offsets_plan(limits)?, g.pair_plan(KERNEL_SCATTER, limits)?])
}

/// The alignment on the device. Row and tile buffers are sized by [`max_padded_rows`]; the
/// real padded count stays on the device (`padded_rows`, also `offsets[experts]`).
pub struct AlignedDevice {
    /// `[max_padded_rows]`: pair index of each row, [`sentinel`] for padding and past the end.
    pub sorted_ids: CudaSlice<i32>,
    /// `[max_padded_rows / tile]`: expert of each row tile, −1 past `padded_rows`.
    pub tile_expert: CudaSlice<i32>,
    /// `[experts + 1]`: start row of each expert's segment; the last is `padded_rows`.
    pub offsets: CudaSlice<i32>,
    /// One element: rows after padding.
    pub padded_rows: CudaSlice<i32>,
    /// `[experts]`: pairs routed to each expert (the scatter's cursors end at the counts).
    pub counts: CudaSlice<i32>,
}

impl AlignedDevice {
    fn for_geometry(gpu: &Gpu, g: &Geometry) -> Result<AlignedDevice, GpuError> {
        Ok(AlignedDevice {
            sorted_ids: gpu.alloc(g.max_rows as usize)?,
            tile_expert: gpu.alloc(g.tiles() as usize)?,
            offsets: gpu.alloc(g.experts as usize + 1)?,
            padded_rows: gpu.alloc(1)?,
            counts: gpu.alloc(g.experts as usize)?,
        })
    }

    /// Whether the buffers are long enough for an alignment of this geometry.
    fn holds(&self, g: &Geometry) -> bool {
        self.sorted_ids.len() as u64 >= g.max_rows
            && self.tile_expert.len() as u64 >= g.tiles()
            && self.offsets.len() > g.experts as usize
            && self.counts.len() >= g.experts as usize
    }

    fn outputs(&mut self) -> Outputs<'_> {
        Outputs {
            sorted_ids: self.sorted_ids.as_view_mut(),
            tile_expert: self.tile_expert.as_view_mut(),
            offsets: self.offsets.as_view_mut(),
            padded_rows: self.padded_rows.as_view_mut(),
            counts: self.counts.as_view_mut(),
        }
    }
}

/// Aligns `ids` (`[tokens · top_k]`, token-major) on the GPU's stream; no host synchronisation.
pub fn align_gpu(gpu: &Gpu, ids: &CudaSlice<i32>, tokens: u64, top_k: u32, experts: u32, tile: u32) -> Result<AlignedDevice, GpuError> {
    let g = Geometry::new(tokens, top_k, experts, tile)?;
    let mut a = AlignedDevice::for_geometry(gpu, &g)?;
    launch_all(gpu, &ids.as_view(), &g, &mut a.outputs())?;
    Ok(a)
}

/// As [`align_gpu`], into `a`'s buffers, which are replaced by larger ones only when this shape
/// needs more: a steady stream of batches allocates nothing. Buffers longer than the shape
/// needs are fine: the alignment writes every row and tile up to this shape's
/// [`max_padded_rows`], and every reader (quantize gather, GEMM) is planned for the same shape,
/// so the stale tail of a larger earlier batch is never read.
pub fn align_into(
    gpu: &Gpu,
    ids: &CudaSlice<i32>,
    tokens: u64,
    top_k: u32,
    experts: u32,
    tile: u32,
    a: &mut AlignedDevice,
) -> Result<(), GpuError> {
    let g = Geometry::new(tokens, top_k, experts, tile)?;
    if !a.holds(&g) {
        *a = AlignedDevice::for_geometry(gpu, &g)?;
    }
    launch_all(gpu, &ids.as_view(), &g, &mut a.outputs())
}

/// Where one alignment writes (views, so the self-test can hand in poisoned words).
struct Outputs<'a> {
    sorted_ids: CudaViewMut<'a, i32>,
    tile_expert: CudaViewMut<'a, i32>,
    offsets: CudaViewMut<'a, i32>,
    padded_rows: CudaViewMut<'a, i32>,
    counts: CudaViewMut<'a, i32>,
}

impl Outputs<'_> {
    /// A buffer shorter than the plan needs would be written past its end: refuse instead.
    fn check_lengths(&self, ids: usize, g: &Geometry) -> Result<(), PlanError> {
        let e = g.experts as u64;
        for (what, have, need) in [
            ("ids", ids as u64, g.pairs),
            ("sorted_ids", self.sorted_ids.len() as u64, g.max_rows),
            ("tile_expert", self.tile_expert.len() as u64, g.tiles()),
            ("offsets", self.offsets.len() as u64, e + 1),
            ("padded_rows", self.padded_rows.len() as u64, 1),
            ("counts", self.counts.len() as u64, e),
        ] {
            if have < need {
                return Err(PlanError::Unsupported {
                    kernel: KERNEL.into(),
                    what: format!("{what} holds {have}, needs {need}"),
                    shape: g.shape(),
                });
            }
        }
        Ok(())
    }
}

fn launch_all(gpu: &Gpu, ids: &CudaView<i32>, g: &Geometry, out: &mut Outputs) -> Result<(), GpuError> {
    out.check_lengths(ids.len(), g)?;
    let limits = gpu.limits();
    let (count, offsets, scatter) = (g.pair_plan(KERNEL_COUNT, limits)?, g.offsets_plan(limits)?, g.pair_plan(KERNEL_SCATTER, limits)?);
    let (pairs, experts, tile, max_rows) = (g.pairs, g.experts as i32, g.tile as i32, g.max_rows);
    let sentinel = sentinel(g.tokens, g.top_k);
    gpu.stream()
        .memset_zeros(&mut out.counts)
        .map_err(|e| GpuError::Driver { call: format!("cuMemsetD8Async(moe_align counts) [{}]", g.shape()), error: error_name(&e) })?;
    let f = gpu.function(&MOE_ALIGN, KERNEL_COUNT)?;
    gpu.launch(&count, &f, |b| {
        b.arg(ids).arg(&pairs).arg(&experts).arg(&mut out.counts);
    })?;
    let f = gpu.function(&MOE_ALIGN, KERNEL_OFFSETS)?;
    gpu.launch(&offsets, &f, |b| {
        b.arg(&mut out.counts).arg(&experts).arg(&tile).arg(&max_rows).arg(&sentinel);
        b.arg(&mut out.offsets).arg(&mut out.padded_rows).arg(&mut out.tile_expert).arg(&mut out.sorted_ids);
    })?;
    let f = gpu.function(&MOE_ALIGN, KERNEL_SCATTER)?;
    gpu.launch(&scatter, &f, |b| {
        b.arg(ids).arg(&pairs).arg(&experts).arg(&mut out.offsets).arg(&mut out.counts).arg(&mut out.sorted_ids);
    })?;
    Ok(())
}

/// Token counts this plan makes critical.
pub fn critical_counts(c: &AlignCase, limits: &DeviceLimits) -> Vec<Critical> {
    let (k, tile) = (c.top_k as u64, c.tile as u64);
    if k == 0 || tile == 0 {
        return vec![];
    }
    let pad = c.experts as u64 * (tile - 1);
    let mut v = vec![Critical::new(1, "single token")];
    // max_padded_rows / tile = ceil((T·k + pad) / tile) <= L  ⟺  T·k + pad <= L·tile.
    let y = limits.max_grid_dim[1] as u64;
    v.extend(last_fitting(y * tile, pad, k, &format!("moe_align: row tiles (max_padded_rows / tile) vs grid.y limit {y}")));
    // max_padded_rows <= 2^31 − 1  ⟺  T·k + pad <= floor((2^31 − 1) / tile)·tile. Past it the plan rejects.
    v.extend(last_fitting(I32_MAX / tile * tile, pad, k, "moe_align: sorted_ids rows (max_padded_rows) vs 2^31 − 1"));
    v.extend(overflow_point(k, "moe_align: ids[t·k + j] passes 2^31 − 1"));
    // Pairs crossing the row tile, the count/scatter block, and the grid-stride wrap (where
    // every worker of the capped grid takes a second pair).
    let wrap = grid_stride_blocks(I32_MAX, THREADS as u64, limits) * THREADS as u64;
    for (pairs, what) in [
        (tile, "one row tile of pairs"),
        (2 * tile, "two row tiles of pairs"),
        (THREADS as u64, "one count/scatter block of pairs"),
        (2 * THREADS as u64, "two count/scatter blocks of pairs"),
        (wrap, "count/scatter grid-stride loop wraps"),
    ] {
        let first = pairs.div_ceil(k);
        for t in [first - 1, first, first + 1] {
            if t > 0 {
                v.push(Critical::new(t, format!("moe_align: {what} ({pairs} pairs at top_k {k})")));
            }
        }
    }
    v
}

/// The last token count with `T·k + pad <= budget`, and the next one.
fn last_fitting(budget: u64, pad: u64, k: u64, what: &str) -> Vec<Critical> {
    if budget < pad + k {
        return vec![];
    }
    let last = (budget - pad) / k;
    vec![Critical::new(last, format!("{what}: last count that fits")), Critical::new(last + 1, format!("{what}: first count past it"))]
}

pub fn device_bytes(tokens: u64, c: &AlignCase) -> u64 {
    if c.tile == 0 {
        return 0;
    }
    let rows = max_padded_rows(tokens, c.top_k, c.experts, c.tile);
    let e = c.experts as u64;
    let guarded =
        (rows + GUARD_WORDS as u64) + (rows / c.tile as u64 + GUARD_WORDS as u64) + (e + 1 + GUARD_WORDS as u64) + (1 + GUARD_WORDS as u64);
    4 * (tokens * c.top_k as u64 + guarded + e)
}

const SEED_ROUTING: u64 = 0x20;

/// Self-test: a routing from `routing::route`, uploaded, aligned on the device into poisoned
/// buffers, compared with [`align_cpu`] (segments as sorted sets).
pub fn run_case(gpu: &Gpu, tokens: u64, c: &AlignCase) -> Result<Outcome, GpuError> {
    let g = Geometry::new(tokens, c.top_k, c.experts, c.tile)?;
    let (k, e) = (c.top_k as usize, c.experts as usize);
    let ids_host = route(c.routing, tokens as usize, e, k, c.tile as usize, SEED_ROUTING);
    let ids = gpu.upload(&ids_host)?;
    let mut sorted = Guarded::new(gpu, g.max_rows as usize)?;
    let mut tiles = Guarded::new(gpu, g.tiles() as usize)?;
    let mut offsets = Guarded::new(gpu, e + 1)?;
    let mut padded = Guarded::new(gpu, 1)?;
    let mut counts = gpu.alloc::<i32>(e)?;
    gpu.synchronize()?;
    let start = std::time::Instant::now();
    {
        let mut out = Outputs {
            sorted_ids: words_as_i32(&mut sorted)?,
            tile_expert: words_as_i32(&mut tiles)?,
            offsets: words_as_i32(&mut offsets)?,
            padded_rows: words_as_i32(&mut padded)?,
            counts: counts.as_view_mut(),
        };
        launch_all(gpu, &ids.as_view(), &g, &mut out)?;
    }
    gpu.synchronize()?;
    let kernel_ms = start.elapsed().as_secs_f64() * 1e3;
    let (mut unwritten, mut past_end) = (0, 0);
    for buf in [&sorted, &tiles, &offsets, &padded] {
        let (u, p) = buf.check(gpu, 1)?;
        unwritten += u;
        past_end += p;
    }
    let mut got = Aligned {
        sorted_ids: sorted.read_i32(gpu, 0, sorted.words)?,
        tile_expert: tiles.read_i32(gpu, 0, tiles.words)?,
        offsets: offsets.read_i32(gpu, 0, e + 1)?,
        padded_rows: padded.read_i32(gpu, 0, 1)?[0] as u64,
    };
    let got_counts = gpu.download(&counts)?;
    let want = align_cpu(&ids_host, tokens, c.top_k, c.experts, c.tile);
    let want_counts: Vec<i32> = expert_counts(&ids_host, e).into_iter().map(|n| n as i32).collect();
    let mut tally = compare(&want, &mut got);
    tally.ints("counts", &got_counts, &want_counts);
    Ok(Outcome::Ran(Check {
        max_rel_err: 0.0,
        tolerance: TOLERANCE,
        compared: tally.compared,
        unwritten,
        past_end,
        int_mismatches: tally.mismatches,
        kernel_ms,
        note: tally.note,
    }))
}

/// The words of a poisoned buffer as the i32 outputs the kernels write.
fn words_as_i32(g: &mut Guarded) -> Result<CudaViewMut<'_, i32>, GpuError> {
    let words = g.words;
    // SAFETY: i32 and u32 have the same size and every bit pattern is valid for both.
    unsafe { g.buf.transmute_mut::<i32>(words) }
        .ok_or_else(|| GpuError::Driver { call: "transmute_mut".into(), error: format!("{words} words past the buffer") })
}

/// Exact comparison results of integer outputs.
#[derive(Debug, Default)]
struct Tally {
    compared: u64,
    mismatches: u64,
    /// The first mismatch found.
    note: String,
}

impl Tally {
    fn ints(&mut self, what: &str, got: &[i32], want: &[i32]) {
        self.compared += want.len() as u64;
        let wrong = got.len().abs_diff(want.len()) as u64 + got.iter().zip(want).filter(|(g, w)| g != w).count() as u64;
        if wrong > 0 && self.note.is_empty() {
            self.note = match got.iter().zip(want).position(|(g, w)| g != w) {
                Some(i) => format!("{what}[{i}]: gpu {} vs ref {}", got[i], want[i]),
                None => format!("{what}: gpu has {} items, ref {}", got.len(), want.len()),
            };
        }
        self.mismatches += wrong;
    }
}

/// Compares a device alignment with the CPU one. The device's order inside a segment is
/// arbitrary; the sentinel is larger than any pair, so sorting each of its padded segments
/// (cut at the reference's offsets) must give the reference exactly, padding included.
fn compare(want: &Aligned, got: &mut Aligned) -> Tally {
    let mut t = Tally::default();
    t.ints("offsets", &got.offsets, &want.offsets);
    t.ints("padded_rows", &[got.padded_rows as i32], &[want.padded_rows as i32]);
    t.ints("tile_expert", &got.tile_expert, &want.tile_expert);
    if got.sorted_ids.len() == want.sorted_ids.len() {
        sort_segments(&mut got.sorted_ids, &want.offsets);
    }
    t.ints("sorted_ids (segments sorted)", &got.sorted_ids, &want.sorted_ids);
    t
}

fn sort_segments(rows: &mut [i32], offsets: &[i32]) {
    let mut rest = rows;
    let mut segments = Vec::with_capacity(offsets.len());
    for w in offsets.windows(2) {
        let (seg, tail) = std::mem::take(&mut rest).split_at_mut((w[1] - w[0]) as usize);
        segments.push(seg);
        rest = tail;
    }
    segments.par_iter_mut().for_each(|s| s.sort_unstable());
}

// ---- CPU twin (the routed GEMM's self-test uses it to build its inputs) ----

/// The sentinel id of a padding row: one past the last (token, slot) pair.
pub fn sentinel(tokens: u64, top_k: u32) -> i32 {
    (tokens * top_k as u64) as i32
}

/// Upper bound of rows after padding every expert's segment to `tile`: the buffers are sized
/// by it (the real count is only known on the device).
pub fn max_padded_rows(tokens: u64, top_k: u32, experts: u32, tile: u32) -> u64 {
    let pairs = tokens * top_k as u64;
    (pairs + experts as u64 * (tile as u64 - 1)).div_ceil(tile as u64) * tile as u64
}

/// Tokens sorted by expert, each expert's segment padded to a multiple of `tile`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Aligned {
    /// `[max_padded_rows]`: the (token·top_k + slot) pair of each row, [`sentinel`] for padding
    /// (and for rows past `padded_rows`).
    pub sorted_ids: Vec<i32>,
    /// `[max_padded_rows / tile]`: the expert of each row tile, −1 past `padded_rows`.
    pub tile_expert: Vec<i32>,
    /// `[experts + 1]`: start row of each expert's padded segment; the last is `padded_rows`.
    pub offsets: Vec<i32>,
    pub padded_rows: u64,
}

/// CPU twin of the alignment kernels. Within a segment, pairs are in increasing order (the GPU
/// scatter uses atomics, so its order within a segment is arbitrary and compared as a set).
pub fn align_cpu(ids: &[i32], tokens: u64, top_k: u32, experts: u32, tile: u32) -> Aligned {
    let (e, tile_u) = (experts as usize, tile as u64);
    let max_rows = max_padded_rows(tokens, top_k, experts, tile) as usize;
    let mut offsets = Vec::with_capacity(e + 1);
    let mut at = 0u64;
    for c in expert_counts(ids, e) {
        offsets.push(at as i32);
        at += (c as u64).div_ceil(tile_u) * tile_u;
    }
    offsets.push(at as i32);
    let mut sorted_ids = vec![sentinel(tokens, top_k); max_rows];
    let mut cursor: Vec<usize> = offsets[..e].iter().map(|&o| o as usize).collect();
    for (pair, &x) in ids.iter().enumerate() {
        sorted_ids[cursor[x as usize]] = pair as i32;
        cursor[x as usize] += 1;
    }
    let mut tile_expert = vec![-1i32; max_rows / tile as usize];
    for (ex, w) in offsets.windows(2).enumerate() {
        tile_expert[w[0] as usize / tile as usize..w[1] as usize / tile as usize].fill(ex as i32);
    }
    Aligned { sorted_ids, tile_expert, offsets, padded_rows: at }
}

/// The self-test's handle on this family (registered in `selftest::case`).
pub struct Family;

impl KernelFamily for Family {
    type Case = AlignCase;

    fn run(gpu: &Gpu, tokens: u64, c: &AlignCase) -> Result<Outcome, GpuError> {
        run_case(gpu, tokens, c)
    }

    fn plans(tokens: u64, c: &AlignCase, limits: &DeviceLimits) -> Result<Vec<Launch>, PlanError> {
        plans(tokens, c, limits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROUTINGS: [Routing; 3] = [Routing::Uniform, Routing::OneExpert, Routing::MaxPadding];

    fn case(routing: Routing) -> AlignCase {
        AlignCase { experts: 128, top_k: 8, tile: 64, routing }
    }

    #[test]
    fn align_cpu_invariants_for_every_routing() {
        for routing in ROUTINGS {
            for &(t, e, k, tile) in &[(1u64, 128u32, 8u32, 64u32), (63, 128, 8, 64), (1000, 128, 8, 64), (37, 16, 4, 16), (9, 10, 10, 8)] {
                let ids = route(routing, t as usize, e as usize, k as usize, tile as usize, 3);
                let a = align_cpu(&ids, t, k, e, tile);
                let pairs = (t * k as u64) as usize;
                let sent = sentinel(t, k);
                assert_eq!(a.sorted_ids.len() as u64, max_padded_rows(t, k, e, tile));
                assert_eq!(a.tile_expert.len(), a.sorted_ids.len() / tile as usize);
                assert_eq!(a.offsets.len(), e as usize + 1);
                assert_eq!(a.offsets[0], 0);
                assert_eq!(*a.offsets.last().unwrap() as u64, a.padded_rows);
                // Every pair exactly once, in its expert's segment, in increasing order.
                let mut seen = vec![0u32; pairs];
                for (ex, w) in a.offsets.windows(2).enumerate() {
                    assert!(w[0] <= w[1] && (w[1] - w[0]) % tile as i32 == 0, "{routing:?} segment {ex}: {w:?}");
                    let seg = &a.sorted_ids[w[0] as usize..w[1] as usize];
                    let real: Vec<i32> = seg.iter().copied().take_while(|&p| p != sent).collect();
                    assert!(seg[real.len()..].iter().all(|&p| p == sent), "padding after the pairs");
                    assert!(seg.len() - real.len() < tile as usize, "less than a tile of padding");
                    assert!(real.windows(2).all(|p| p[0] < p[1]));
                    for &p in &real {
                        assert_eq!(ids[p as usize], ex as i32);
                        seen[p as usize] += 1;
                    }
                    for r in (w[0]..w[1]).step_by(tile as usize) {
                        assert_eq!(a.tile_expert[r as usize / tile as usize], ex as i32);
                    }
                }
                assert!(seen.iter().all(|&s| s == 1), "{routing:?} t={t}: every pair exactly once");
                assert!(a.sorted_ids[a.padded_rows as usize..].iter().all(|&p| p == sent));
                assert!(a.tile_expert[(a.padded_rows / tile as u64) as usize..].iter().all(|&x| x == -1));
            }
        }
    }

    #[test]
    fn compare_accepts_any_order_within_segments_only() {
        let (t, e, k, tile) = (300u64, 16u32, 4u32, 16u32);
        let ids = route(Routing::Uniform, t as usize, e as usize, k as usize, tile as usize, 9);
        let want = align_cpu(&ids, t, k, e, tile);
        let mut got = want.clone();
        for w in got.offsets.clone().windows(2) {
            got.sorted_ids[w[0] as usize..w[1] as usize].reverse();
        }
        let tally = compare(&want, &mut got);
        assert_eq!((tally.mismatches, tally.note.as_str()), (0, ""));
        // A pair moved into another expert's segment, and a padding row left unwritten.
        let mut moved = want.clone();
        let (a, b) = (want.offsets[0] as usize, want.offsets[1] as usize);
        moved.sorted_ids.swap(a, b);
        assert!(compare(&want, &mut moved).mismatches >= 2);
        let mut poisoned = want.clone();
        *poisoned.sorted_ids.last_mut().unwrap() = -1;
        assert_eq!(compare(&want, &mut poisoned).mismatches, 1);
    }

    #[test]
    fn plans_fit_both_devices_and_cover_once() {
        for limits in DeviceLimits::recorded() {
            for routing in ROUTINGS {
                for tokens in [1u64, 63, 64, 65, 8191, 8192, 1 << 20] {
                    let c = case(routing);
                    let p = plans(tokens, &c, &limits).unwrap_or_else(|e| panic!("{tokens}: {e}"));
                    assert_eq!(p.len(), 3);
                    let names: Vec<&str> = p.iter().map(|l| l.kernel.as_str()).collect();
                    assert_eq!(names, [KERNEL_COUNT, KERNEL_OFFSETS, KERNEL_SCATTER]);
                    for l in &p {
                        l.check_cover().unwrap();
                        assert!(l.grid[1] == 1 && l.grid[2] == 1, "{l}: nothing on y/z");
                        if tokens <= 8192 {
                            for i in 0..l.cover.len() {
                                assert!(l.simulate_cover(i).iter().all(|&h| h == 1), "{l} cover {i}");
                            }
                        }
                    }
                    assert_eq!(p[0].cover[0].items(), tokens * 8);
                    assert_eq!(p[1].cover[1].items(), max_padded_rows(tokens, 8, 128, 64) / 64);
                }
            }
        }
    }

    #[test]
    fn bad_shapes_are_unsupported() {
        let l = DeviceLimits::gb10();
        let bad = |t: u64, e: u32, k: u32, tile: u32| {
            let c = AlignCase { experts: e, top_k: k, tile, routing: Routing::Uniform };
            matches!(plans(t, &c, &l), Err(PlanError::Unsupported { .. }))
        };
        assert!(bad(0, 128, 8, 64));
        assert!(bad(10, 1025, 8, 64));
        assert!(bad(10, 0, 1, 64));
        assert!(bad(10, 8, 9, 64));
        assert!(bad(10, 8, 0, 64));
        assert!(bad(10, 128, 8, 0));
        assert!(!bad(10, 1024, 8, 64));
    }

    #[test]
    fn plan_rejects_exactly_past_the_sorted_ids_overflow_point() {
        let l = DeviceLimits::h200();
        let c = case(Routing::Uniform);
        let counts: Vec<u64> = critical_counts(&c, &l).iter().filter(|x| x.reason.contains("sorted_ids rows")).map(|x| x.tokens).collect();
        assert_eq!(counts.len(), 2);
        assert!(max_padded_rows(counts[0], 8, 128, 64) <= I32_MAX);
        assert!(plans(counts[0], &c, &l).is_ok());
        assert!(matches!(plans(counts[1], &c, &l), Err(PlanError::Unsupported { .. })));
    }

    #[test]
    fn row_tiles_pass_grid_y_at_the_derived_count() {
        let l = DeviceLimits::gb10();
        let c = case(Routing::MaxPadding);
        let counts: Vec<u64> = critical_counts(&c, &l).iter().filter(|x| x.reason.contains("grid.y")).map(|x| x.tokens).collect();
        // (65535·64 − 128·63) / 8 = 523,272.
        assert_eq!(counts, vec![523_272, 523_273]);
        let tiles = |t| max_padded_rows(t, 8, 128, 64) / 64;
        assert!(tiles(counts[0]) <= 65_535 && tiles(counts[1]) > 65_535);
        // The alignment itself still plans there: its own grid never carries the tiles on y.
        assert!(plans(counts[1], &c, &l).is_ok());
    }

    #[test]
    fn pair_tails_and_grid_stride_wrap() {
        let l = DeviceLimits::h200();
        let counts: Vec<u64> = critical_counts(&case(Routing::Uniform), &l).iter().map(|x| x.tokens).collect();
        for t in [7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65] {
            assert!(counts.contains(&t), "{t}");
        }
        // H200: 132 SMs x 2048 threads / 256 x 4 = 4224 blocks of 256 = 1,081,344 pairs.
        assert!(counts.contains(&135_168) && counts.contains(&135_169));
        assert!(counts.contains(&268_435_455) && counts.contains(&268_435_456));
    }
}
