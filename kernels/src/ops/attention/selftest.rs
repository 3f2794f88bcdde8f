//! The attention self-test: a batch laid out by a [`Layout`], its K/V stored through
//! `kv_store` (earlier context included), attention launched, sampled rows compared with the twin.
//!
//! Inputs are pure functions of seeds: Q in ±[`Q_AMPLITUDE`] (softmax peaked enough that each
//! output depends on particular keys), the batch's K/V rows in ±1, and the context before each
//! chunk ("history") in ±1, generated in pieces of at most [`PIECE_FLOATS`] floats and stored
//! through the same kernel. The twin regenerates exactly the keys a sampled row reads. Attention
//! costs the CPU `keys × n_head × head_dim` per row, so the rows compared are chosen within a
//! budget, tails and the farthest cache slots first.

use std::time::Instant;

use cudarc::driver::CudaSlice;
use half::f16;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use super::layout::{self, Layout, Part};
use super::{
    AttentionIo, AttentionSpec, BatchCounts, BatchPlan, Chunk, DecodeRoute, DeviceBatch, KERNEL, TOLERANCE, cpu, launch, launches,
    prefill_tile,
};
use crate::cuda::{Gpu, GpuError};
use crate::launch::{Launch, PlanError};
use crate::limits::DeviceLimits;
use crate::ops::kv_store::{self, KvRows, cache_offset};
use crate::ops::testdata::{GUARD_WORDS, Guarded, fill_uniform};
use crate::selftest::case::{Check, Outcome};
use crate::selftest::verify::{RelErr, sample_rows};
use crate::testdata::{uniform_f32, uniform_row};
use crate::thresholds::{Critical, I32_MAX, overflow_point, tile_tails};

/// A self-test case: a model's attention shape, a batch layout and how decode steps run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttentionCase {
    pub heads: u32,
    pub kv_heads: u32,
    pub head_dim: u32,
    /// Positions per slot the layouts may use (the model's context).
    pub context: u32,
    /// How the batch's rows become chunks.
    pub layout: Layout,
    /// Which kernels its 1-token chunks run through.
    pub route: DecodeRoute,
}

const SEED_Q: u64 = 0x90;
const SEED_K: u64 = 0x91;
const SEED_V: u64 = 0x92;
/// History pieces take seeds `base + piece`: far apart so that K and V never share one.
const SEED_K_HISTORY: u64 = 0x9300_0000;
const SEED_V_HISTORY: u64 = 0x9400_0000;
/// Q in ±4: scores spread over a few units, so the softmax is peaked rather than an average.
pub const Q_AMPLITUDE: f32 = 4.0;
/// Floats of K (and of V) history generated per piece on the device.
const PIECE_FLOATS: u64 = 1 << 25;
/// CPU budget of the comparison: multiply-adds of the twin, and K/V elements regenerated.
/// (2^32 and 2^28: the twin's share of the whole self-test's wall time stays a few seconds;
/// the tails, first and last rows and farthest slots are taken before the budget applies.)
const FMA_BUDGET: u64 = 1 << 32;
const GEN_BUDGET: u64 = 1 << 28;
/// Candidate rows drawn at random beyond the tails and chunk edges.
const SAMPLE_ROWS: usize = 48;
/// Chunks whose first and last rows are candidates (spread over the batch).
const EDGE_CHUNKS: usize = 24;
/// Stored rows compared word for word with kv_store's twin.
const STORED_ROWS: usize = 64;

impl AttentionCase {
    fn tile_rows(&self) -> u64 {
        prefill_tile(self.head_dim).map_or(1, |t| t.rows)
    }

    /// The test cache for a batch of `tokens` (one slot per chunk, positions up to what the
    /// layout reaches) and the layout's parts.
    pub fn spec(&self, tokens: u64) -> Result<(AttentionSpec, Vec<Part>), PlanError> {
        let parts = self.layout.parts(tokens, self.context);
        let (slots, max_ctx) = (layout::slots(&parts), layout::max_ctx(&parts));
        let spec = AttentionSpec::new(self.heads, self.kv_heads, self.head_dim, slots.min(I32_MAX) as u32, max_ctx.min(I32_MAX) as u32);
        if tokens == 0 || tokens > I32_MAX || slots > I32_MAX || max_ctx > I32_MAX || self.context == 0 {
            let what = format!("{tokens} tokens over {slots} slots of {max_ctx} positions (context {}): each in 1..2^31", self.context);
            return Err(PlanError::Unsupported { kernel: KERNEL.into(), what, shape: format!("{:?} {}", self.layout, spec.describe()) });
        }
        Ok((spec, parts))
    }

    /// The spec and the counts the launches depend on, in closed form.
    pub fn counts(&self, tokens: u64) -> Result<(AttentionSpec, BatchCounts), PlanError> {
        let (spec, parts) = self.spec(tokens)?;
        Ok((spec, layout::counts(&parts, self.tile_rows(), self.route)))
    }
}

/// Every launch a case of `tokens` makes: the batch's kv_store, then attention's.
pub fn plans(tokens: u64, c: &AttentionCase, limits: &DeviceLimits) -> Result<Vec<Launch>, PlanError> {
    let (spec, n) = c.counts(tokens)?;
    let mut v = vec![kv_store::plan(tokens, &spec, limits)?];
    v.extend(launches(&n, &spec, limits)?.all());
    Ok(v)
}

/// Counts this case's plans make critical (the catalogue adds the serving envelope): the query
/// tile's tails, per layout the 2^31 points of Q/O `(row·n_head + h)·head_dim` and of the cache
/// offset `((slot·max_ctx + pos)·n_kv + kvh)·head_dim`, and the decode batches whose steps cover
/// every kind of split (see `layout::decode_position`).
pub fn critical_counts(c: &AttentionCase, _limits: &DeviceLimits) -> Vec<Critical> {
    let bq = c.tile_rows();
    let (rw, kvw) = (c.heads as u64 * c.head_dim as u64, c.kv_heads as u64 * c.head_dim as u64);
    let tile = format!("attention: {bq}-row query tile");
    let around = |n: u64, why: &str| {
        [n.saturating_sub(1), n, n + 1].into_iter().filter(|&t| t > 0).map(|t| Critical::new(t, why)).collect::<Vec<_>>()
    };
    let mut v = vec![Critical::new(1, "attention: a single token")];
    match c.layout {
        Layout::Prompts { sequences: 1 } => v.extend(tile_tails(bq, true, &[2, 128], &tile)),
        Layout::Prompts { sequences } => {
            let s = sequences as u64;
            v.extend(tile_tails(s * bq, false, &[1, 2, 32], &format!("{tile} in each of {s} prompts")));
            v.extend(around(s + 1, &format!("attention: {s} prompts of 1 or 2 tokens")));
        }
        Layout::Runs { len } => {
            let len = len as u64;
            v.extend(overflow_point(rw, "attention: Q/O offset (row·n_head + h)·head_dim passes 2^31 − 1"));
            v.extend(overflow_point(
                kvw,
                &format!("attention: cache offset passes 2^31 − 1 near here (one slot of {len} positions per prompt)"),
            ));
            v.extend(around(len, &format!("attention: prompts of {len} tokens")));
            v.extend(around(2 * len, &format!("attention: prompts of {len} tokens")));
        }
        Layout::Continue { cached } => {
            v.extend(tile_tails(bq, false, &[1, 2], &format!("{tile} after {cached} cached positions")));
            v.extend((2..=3).map(|t| Critical::new(t, "attention: a few tokens continuing a sequence")));
        }
        Layout::ContextEnd => {
            v.push(Critical::new(2, "attention: the last 2 positions of the context"));
            v.extend(around(bq, &format!("{tile} ending at the context")));
        }
        Layout::Decode => {
            match c.route {
                DecodeRoute::Split => {
                    v.extend((2..=16).map(|t| Critical::new(t, "attention: decode batch (steps cycle through every split shape)")))
                }
                DecodeRoute::Prefill => v.extend([2, 9, 10].map(|t| Critical::new(t, "attention: decode steps as 1-row prefill tiles"))),
            }
            v.extend(overflow_point(
                c.context as u64 * kvw,
                &format!("attention: cache offset of the last decode slot passes 2^31 − 1 ({} positions per slot)", c.context),
            ));
        }
        Layout::Mixed => {
            v.extend((2..=10).map(|t| Critical::new(t, "attention: a prompt beside up to 8 decode steps")));
            v.extend(around(bq + 8, &format!("{tile} of a prompt beside 8 decode steps")));
        }
    }
    v
}

fn piece_rows(spec: &AttentionSpec) -> u64 {
    (PIECE_FLOATS / spec.kv_width().max(1)).max(1)
}

/// All device memory a case allocates: Q, the guarded O, K/V rows with their (slot, pos), both
/// caches, a history piece, the batch's index arrays and the decode workspace.
pub fn device_bytes(tokens: u64, c: &AttentionCase) -> u64 {
    let (Ok((spec, parts)), Ok((_, n))) = (c.spec(tokens), c.counts(tokens)) else {
        return 0;
    };
    let (rw, kvw) = (spec.row_width(), spec.kv_width());
    let history = layout::history_rows(&parts).min(piece_rows(&spec));
    let chunks = layout::slots(&parts);
    4 * tokens * rw
        + 4 * (tokens * rw + GUARD_WORDS as u64)
        + 2 * 4 * tokens * kvw
        + 8 * tokens
        + 2 * 2 * spec.cache_elems()
        + history * (2 * 4 * kvw + 8)
        + 4 * (4 * chunks + 2 * n.prefill_tiles + 2 * n.decode_splits + chunks + 1)
        + 4 * n.workspace_floats(&spec)
}

/// The value every cache position of the case holds, regenerated for the twin: the batch's own
/// rows, or history piece by piece.
struct Inputs<'a> {
    spec: AttentionSpec,
    chunks: &'a [Chunk],
    /// First history row of each chunk.
    history_at: Vec<u64>,
}

impl<'a> Inputs<'a> {
    fn new(spec: AttentionSpec, chunks: &'a [Chunk]) -> Inputs<'a> {
        let history_at = chunks
            .iter()
            .scan(0u64, |acc, c| {
                let at = *acc;
                *acc += c.start_pos as u64;
                Some(at)
            })
            .collect();
        Inputs { spec, chunks, history_at }
    }

    /// Elements `[0, width)` of K and V at `pos` of chunk `c`'s slot, f16-rounded.
    fn position(&self, c: usize, pos: u64, k: &mut [f32], v: &mut [f32]) {
        let ch = &self.chunks[c];
        let w = self.spec.kv_width();
        let (seeds, first) = if pos < ch.start_pos as u64 {
            let g = self.history_at[c] + pos;
            let piece = g / piece_rows(&self.spec);
            ((SEED_K_HISTORY + piece, SEED_V_HISTORY + piece), (g % piece_rows(&self.spec)) * w)
        } else {
            ((SEED_K, SEED_V), (ch.first_row as u64 + pos - ch.start_pos as u64) * w)
        };
        for (e, (k, v)) in k.iter_mut().zip(v.iter_mut()).enumerate() {
            *k = f16::from_f32(uniform_f32(seeds.0, first + e as u64, 1.0)).to_f32();
            *v = f16::from_f32(uniform_f32(seeds.1, first + e as u64, 1.0)).to_f32();
        }
    }

    /// Positions `0..n` of chunk `c`'s slot, as the twin reads them.
    fn slab(&self, c: usize, n: u64) -> cpu::Slab {
        let w = self.spec.kv_width() as usize;
        let (mut k, mut v) = (vec![0.0f32; n as usize * w], vec![0.0f32; n as usize * w]);
        k.par_chunks_mut(w).zip(v.par_chunks_mut(w)).enumerate().for_each(|(pos, (k, v))| self.position(c, pos as u64, k, v));
        cpu::Slab { k, v, width: w }
    }

    /// (slot, pos) of every history row, in order: chunk by chunk, positions `0..start_pos`.
    fn history(&self) -> impl Iterator<Item = (i32, i32)> + '_ {
        self.chunks.iter().flat_map(|c| (0..c.start_pos as i32).map(move |p| (c.slot as i32, p)))
    }
}

/// Stores the history through kv_store, piece by piece (K and V rows from the pieces' seeds).
fn store_history(gpu: &Gpu, inputs: &Inputs, kc: &mut CudaSlice<u16>, vc: &mut CudaSlice<u16>) -> Result<(), GpuError> {
    let spec = &inputs.spec;
    let total: u64 = inputs.chunks.iter().map(|c| c.start_pos as u64).sum();
    if total == 0 {
        return Ok(());
    }
    let (rows_per_piece, w) = (piece_rows(spec).min(total) as usize, spec.kv_width() as usize);
    let mut k = gpu.alloc::<f32>(rows_per_piece * w)?;
    let mut v = gpu.alloc::<f32>(rows_per_piece * w)?;
    let mut rows = inputs.history();
    for piece in 0.. {
        let (slots, positions): (Vec<i32>, Vec<i32>) = rows.by_ref().take(rows_per_piece).unzip();
        if slots.is_empty() {
            break;
        }
        let n = slots.len();
        fill_uniform(gpu, &mut k, n * w, SEED_K_HISTORY + piece, 1.0)?;
        fill_uniform(gpu, &mut v, n * w, SEED_V_HISTORY + piece, 1.0)?;
        let (slots, positions) = (gpu.upload(&slots)?, gpu.upload(&positions)?);
        let src = KvRows { k: k.slice(..n * w), v: v.slice(..n * w), slots: slots.as_view(), positions: positions.as_view() };
        kv_store::launch(gpu, spec, n as u64, &src, &mut kc.as_view_mut(), &mut vc.as_view_mut())?;
        gpu.synchronize()?; // the piece buffers are refilled next round
    }
    Ok(())
}

/// Stores the batch's own K/V rows at their chunks' positions, as the engine does before attention.
fn store_batch(gpu: &Gpu, inputs: &Inputs, tokens: u64, kc: &mut CudaSlice<u16>, vc: &mut CudaSlice<u16>) -> Result<(), GpuError> {
    let (spec, n) = (&inputs.spec, tokens as usize * inputs.spec.kv_width() as usize);
    let (mut k, mut v) = (gpu.alloc::<f32>(n)?, gpu.alloc::<f32>(n)?);
    fill_uniform(gpu, &mut k, n, SEED_K, 1.0)?;
    fill_uniform(gpu, &mut v, n, SEED_V, 1.0)?;
    let (slots, positions): (Vec<i32>, Vec<i32>) =
        inputs.chunks.iter().flat_map(|c| (0..c.n_tokens).map(move |i| (c.slot as i32, (c.start_pos + i) as i32))).unzip();
    let (slots, positions) = (gpu.upload(&slots)?, gpu.upload(&positions)?);
    let src = KvRows { k: k.as_view(), v: v.as_view(), slots: slots.as_view(), positions: positions.as_view() };
    kv_store::launch(gpu, spec, tokens, &src, &mut kc.as_view_mut(), &mut vc.as_view_mut())?;
    gpu.synchronize()
}

/// A batch row to compare: its index, its chunk and its query index in the chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Row {
    row: u64,
    chunk: usize,
    i: u32,
}

/// Rows to compare, within the CPU budget: the last and first rows, the edges of chunks spread
/// over the batch (the last chunks hold the farthest slots), the tails of the query tiles and
/// random rows. The first candidate is always taken. Sorted by chunk, so slabs are made once.
fn select_rows(chunks: &[Chunk], tokens: u64, spec: &AttentionSpec, tile_rows: u64) -> Vec<Row> {
    let mut candidates = vec![tokens - 1, 0];
    let step = chunks.len().div_ceil(EDGE_CHUNKS).max(1);
    for c in chunks.iter().rev().step_by(step).chain(chunks.first()) {
        candidates.extend([c.first_row as u64 + c.n_tokens as u64 - 1, c.first_row as u64]);
    }
    candidates.extend(sample_rows(tokens, tile_rows, SAMPLE_ROWS, tokens).into_iter().rev());
    let (mut fma, mut generated) = (0u64, 0u64);
    let mut made: Vec<usize> = Vec::new();
    let mut rows: Vec<Row> = Vec::new();
    for row in candidates {
        if rows.iter().any(|r| r.row == row) {
            continue;
        }
        let chunk = chunks.partition_point(|c| c.first_row as u64 <= row) - 1;
        let c = &chunks[chunk];
        let i = (row - c.first_row as u64) as u32;
        let cost = (c.start_pos as u64 + i as u64 + 1) * spec.row_width() * 2;
        let gen_cost = if made.contains(&chunk) { 0 } else { c.end() * spec.kv_width() * 2 };
        if !rows.is_empty() && (fma + cost > FMA_BUDGET || generated + gen_cost > GEN_BUDGET) {
            continue;
        }
        fma += cost;
        generated += gen_cost;
        if gen_cost > 0 {
            made.push(chunk);
        }
        rows.push(Row { row, chunk, i });
    }
    rows.sort_by_key(|r| (r.chunk, r.i));
    rows
}

/// Sampled output rows against the twin over regenerated inputs.
fn compare_outputs(gpu: &Gpu, inputs: &Inputs, rows: &[Row], out: &Guarded) -> Result<RelErr, GpuError> {
    let (spec, rw) = (&inputs.spec, inputs.spec.row_width() as usize);
    let mut err = RelErr::default();
    for group in rows.chunk_by(|a, b| a.chunk == b.chunk) {
        let c = &inputs.chunks[group[0].chunk];
        let n = group.iter().map(|r| c.start_pos as u64 + r.i as u64 + 1).max().unwrap_or(1);
        let slab = inputs.slab(group[0].chunk, n);
        let want: Vec<Vec<f32>> = group
            .par_iter()
            .map(|r| {
                let mut o = vec![0.0f32; rw];
                cpu::attend_row(&uniform_row(SEED_Q, r.row * rw as u64, rw, Q_AMPLITUDE), &slab, c, r.i, spec, &mut o);
                o
            })
            .collect();
        for (r, want) in group.iter().zip(&want) {
            let at = r.row as usize * rw;
            err.add_slice(at as u64, &out.read_f32(gpu, at, rw)?, want);
        }
    }
    Ok(err)
}

/// Cache words of sampled batch rows that differ from kv_store's twin (K and V).
fn compare_stored(gpu: &Gpu, inputs: &Inputs, rows: &[Row], kc: &CudaSlice<u16>, vc: &CudaSlice<u16>) -> Result<u64, GpuError> {
    let w = inputs.spec.kv_width() as usize;
    let mut bad = 0u64;
    for r in rows.iter().take(STORED_ROWS) {
        let c = &inputs.chunks[r.chunk];
        let at = cache_offset(c.slot, c.start_pos + r.i, &inputs.spec) as usize;
        for (cache, seed) in [(kc, SEED_K), (vc, SEED_V)] {
            let got = gpu.download_range(cache, at, w)?;
            let want = (0..w).map(|e| f16::from_f32(uniform_f32(seed, r.row * w as u64 + e as u64, 1.0)).to_bits());
            bad += got.iter().zip(want).filter(|(g, w)| **g != *w).count() as u64;
        }
    }
    Ok(bad)
}

/// Self-test: history and batch K/V stored, Q from a seed, O poisoned; attention timed; every
/// output written, nothing past the end, sampled rows against the twin, stored rows bit for bit.
pub fn run_case(gpu: &Gpu, tokens: u64, c: &AttentionCase) -> Result<Outcome, GpuError> {
    let (spec, parts) = c.spec(tokens)?;
    let chunks = layout::chunks(&parts);
    let plan = BatchPlan::new(&chunks, tokens, &spec, c.route)?;
    plan.launches(gpu.limits())?; // a bad shape is refused before anything is allocated
    kv_store::plan(tokens, &spec, gpu.limits())?;
    let inputs = Inputs::new(spec, &chunks);
    let cache = spec.cache_elems() as usize;
    let (mut kc, mut vc) = (gpu.alloc::<u16>(cache)?, gpu.alloc::<u16>(cache)?);
    store_history(gpu, &inputs, &mut kc, &mut vc)?;
    store_batch(gpu, &inputs, tokens, &mut kc, &mut vc)?;
    let n = tokens as usize * spec.row_width() as usize;
    let mut q = gpu.alloc::<f32>(n)?;
    fill_uniform(gpu, &mut q, n, SEED_Q, Q_AMPLITUDE)?;
    let mut out = Guarded::new(gpu, n)?;
    let mut workspace = gpu.alloc::<f32>(plan.workspace_floats().max(1) as usize)?;
    let batch = DeviceBatch::upload(gpu, plan)?;
    gpu.synchronize()?;
    let start = Instant::now();
    let io = AttentionIo {
        q: q.as_view(),
        k_cache: kc.as_view(),
        v_cache: vc.as_view(),
        out: out.buf.slice_mut(..n),
        workspace: workspace.as_view_mut(),
    };
    launch(gpu, &batch, io)?;
    gpu.synchronize()?;
    let kernel_ms = start.elapsed().as_secs_f64() * 1e3;
    let (unwritten, past_end) = out.check(gpu, 1)?;
    let rows = select_rows(&chunks, tokens, &spec, c.tile_rows());
    let stored = compare_stored(gpu, &inputs, &rows, &kc, &vc)?;
    let err = compare_outputs(gpu, &inputs, &rows, &out)?;
    let mut check = Check::of_floats(&err, TOLERANCE, (unwritten, past_end), kernel_ms);
    if stored > 0 {
        check.int_mismatches += stored;
        check.note = format!("{stored} stored cache words differ from kv_store's twin; {}", check.note);
    }
    Ok(Outcome::Ran(check))
}

#[cfg(test)]
mod tests {
    use super::*;

    const QWEN: AttentionCase = AttentionCase {
        heads: 32,
        kv_heads: 4,
        head_dim: 128,
        context: 40_960,
        layout: Layout::Prompts { sequences: 1 },
        route: DecodeRoute::Split,
    };

    fn counts(c: &AttentionCase) -> Vec<u64> {
        critical_counts(c, &DeviceLimits::h200()).iter().map(|c| c.tokens).collect()
    }

    #[test]
    fn critical_counts_for_qwen3() {
        // Every tail of the 64-row tile, and around 2 and 128 tiles.
        let single = counts(&QWEN);
        assert!((1..128).all(|t| single.contains(&t)) && [8191, 8192, 8193].iter().all(|t| single.contains(t)));
        // Q/O: 2^31 / (32 · 128) = 524,288; cache with one slot per 61-token prompt: 2^31 / 512.
        let runs = counts(&AttentionCase { layout: Layout::Runs { len: 61 }, ..QWEN });
        for t in [524_287, 524_288, 4_194_303, 4_194_304, 60, 61, 62, 121, 122, 123] {
            assert!(runs.contains(&t), "{t}");
        }
        // Decode: 102 slots of 40,960 positions x 512 stay below 2^31, 103 pass it.
        let decode = counts(&AttentionCase { layout: Layout::Decode, ..QWEN });
        assert!(decode.contains(&102) && decode.contains(&103) && (1..=16).all(|t| decode.contains(&t)));
        assert_eq!(102 * 40_960 * 512 + 40_960 * 512 - 1, 2_160_066_559u64, "the last element of slot 102 is past 2^31");
    }

    #[test]
    fn plans_cover_every_item_once_for_every_layout() {
        for limits in DeviceLimits::recorded() {
            for layout in super::layout::LAYOUTS {
                for route in [DecodeRoute::Split, DecodeRoute::Prefill] {
                    let c = AttentionCase { layout, route, ..QWEN };
                    for t in (1..=130).chain([8191, 8193, 40_960, 524_288, 1 << 20]) {
                        let p = plans(t, &c, &limits).unwrap_or_else(|e| panic!("{layout:?} {t}: {e}"));
                        for l in &p {
                            l.check_cover().unwrap_or_else(|e| panic!("{e}"));
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn history_rows_in_closed_form() {
        for layout in [Layout::Decode, Layout::Mixed, Layout::Continue { cached: 4133 }, Layout::ContextEnd, Layout::Runs { len: 5 }] {
            for t in (1..=40).chain([102, 103, 1000]) {
                let parts = layout.parts(t, 40_960);
                let listed: u64 = layout::chunks(&parts).iter().map(|c| c.start_pos as u64).sum();
                assert_eq!(layout::history_rows(&parts), listed, "{layout:?} {t}");
            }
        }
    }

    #[test]
    fn device_bytes_count_the_caches() {
        // 103 decode steps: two caches of 103 x 40,960 x 512 f16 dominate.
        let c = AttentionCase { layout: Layout::Decode, ..QWEN };
        let caches = 2 * 2 * 103 * 40_960 * 512u64;
        let b = device_bytes(103, &c);
        assert!(b > caches && b < caches + (1 << 30), "{b}");
        assert_eq!(device_bytes(0, &c), 0);
    }

    #[test]
    fn selected_rows_stay_within_budget_and_start_with_the_tails() {
        let c = AttentionCase { layout: Layout::Decode, ..QWEN };
        let (spec, parts) = c.spec(103).unwrap();
        let chunks = layout::chunks(&parts);
        let rows = select_rows(&chunks, 103, &spec, 64);
        assert!(rows.iter().any(|r| r.row == 102) && rows.iter().any(|r| r.row == 0));
        let fma: u64 = rows.iter().map(|r| (chunks[r.chunk].start_pos as u64 + r.i as u64 + 1) * spec.row_width() * 2).sum();
        assert!(fma <= FMA_BUDGET, "{fma}");
        let (spec, parts) = QWEN.spec(16_385).unwrap();
        let rows = select_rows(&layout::chunks(&parts), 16_385, &spec, 64);
        assert!(rows.iter().any(|r| r.row == 16_384) && rows.len() > 32, "{}", rows.len());
    }
}
