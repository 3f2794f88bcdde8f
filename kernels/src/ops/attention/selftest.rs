//! The attention self-test: a batch laid out by a [`Layout`] over a paged cache whose block
//! tables are scrambled (`layout::scrambled_tables`: the indirection is exercised, and the
//! highest block is read), its K/V stored through `kv_store` (earlier context included),
//! attention launched, sampled rows compared with the twin.
//!
//! Inputs are pure functions of seeds: Q in ±[`Q_AMPLITUDE`] (softmax peaked enough that each
//! output depends on particular keys), per-head sinks (when the case has them) in
//! ±[`SINK_AMPLITUDE`], the batch's K/V rows in ±1, and the context before each
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
    AttentionIo, AttentionSpec, BatchCounts, BatchPlan, Chunk, DecodeRoute, DeviceBatch, KERNEL, PrefillKernel, TOLERANCE, cpu, first_key,
    launch, launches, physical_row, prefill_tile, select_prefill,
};
use crate::check::{Check, KernelFamily, Outcome, RelErr, Staged, sample_rows, timing};
use crate::cuda::{Gpu, GpuError};
use crate::launch::{Launch, PlanError};
use crate::limits::DeviceLimits;
use crate::ops::kv_store::{self, KvRows, cache_offset};
use crate::ops::testdata::{GUARD_WORDS, Guarded, download_rows, fill_uniform};
use crate::testdata::{SharedCache, round_f16, uniform_f32, uniform_row};
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
    /// Positions per cache block (a power of two).
    pub block_size: u32,
    /// Sliding window (0: none), as [`AttentionSpec::window`].
    #[serde(default)]
    pub window: u32,
    /// Per-head sinks in the softmax.
    #[serde(default)]
    pub sinks: bool,
    /// The prefill kernel the case forces, or `None`: the device's default ([`select_prefill`]
    /// without an override; the self-test never reads the engine's environment variable).
    #[serde(default)]
    pub prefill: Option<PrefillKernel>,
}

const SEED_Q: u64 = 0x90;
const SEED_K: u64 = 0x91;
const SEED_V: u64 = 0x92;
const SEED_SINKS: u64 = 0x95;
/// History pieces take seeds `base + piece`: far apart so that K and V never share one.
const SEED_K_HISTORY: u64 = 0x9300_0000;
const SEED_V_HISTORY: u64 = 0x9400_0000;
/// Q in ±4: scores spread over a few units, so the softmax is peaked rather than an average.
pub const Q_AMPLITUDE: f32 = 4.0;
/// Sinks in ±4 (natural-log units, as scores): from negligible to taking most of the weight of
/// rows whose scores are low (gpt-oss's learned sinks are of this order).
pub const SINK_AMPLITUDE: f32 = 4.0;
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
    /// Rows of a prefill tile: the batch's tile map, the same for both prefill kernels.
    fn tile_rows(&self) -> u64 {
        prefill_tile(self.head_dim).map_or(1, |t| t.rows)
    }

    /// The prefill kernel the case runs on `limits`' device: the one the case forces, else the
    /// one the engine would run (`BRINK_ATTN_PREFILL`, else the default), where it exists there.
    pub fn prefill_kernel(&self, limits: &DeviceLimits) -> PrefillKernel {
        let forced = self.prefill.or_else(|| super::prefill_override().ok().flatten());
        select_prefill(self.head_dim, limits.compute_capability, forced)
    }

    /// The sinks the case runs with (one per head, from a seed), if it has them.
    pub fn sink_values(&self) -> Option<Vec<f32>> {
        self.sinks.then(|| uniform_row(SEED_SINKS, 0, self.heads as usize, SINK_AMPLITUDE))
    }

    /// The test cache for a batch of `tokens` (one sequence per chunk, each with a table of
    /// blocks for the positions the layout reaches) and the layout's parts.
    pub fn spec(&self, tokens: u64) -> Result<(AttentionSpec, Vec<Part>), PlanError> {
        let parts = self.layout.parts(tokens, self.context, self.window);
        let (slots, max_ctx) = (layout::slots(&parts), layout::max_ctx(&parts));
        let blocks = layout::total_blocks(&parts, self.block_size);
        let spec = AttentionSpec::new(self.heads, self.kv_heads, self.head_dim, blocks.min(I32_MAX) as u32, self.block_size)
            .with_window(self.window);
        if tokens == 0 || tokens > I32_MAX || blocks > I32_MAX || max_ctx > I32_MAX || self.context == 0 {
            let what = format!(
                "{tokens} tokens over {slots} sequences of {max_ctx} positions, {blocks} blocks of {} (context {}): each in 1..2^31",
                self.block_size, self.context
            );
            return Err(PlanError::Unsupported { kernel: KERNEL.into(), what, shape: format!("{:?} {}", self.layout, spec.describe()) });
        }
        Ok((spec, parts))
    }

    /// The batch's chunks and their flat, scrambled block tables.
    fn batch(&self, parts: &[Part]) -> (Vec<Chunk>, Vec<u32>) {
        (layout::chunks(parts, self.block_size), layout::scrambled_tables(layout::total_blocks(parts, self.block_size)))
    }

    /// The first token count at which the farthest cache element read passes 2^31 − 1, if one
    /// is below 2^31 (the farthest row only grows with the count).
    fn cache_overflow_count(&self) -> Option<u64> {
        let kvw = self.kv_heads as u64 * self.head_dim as u64;
        let passes = |t: u64| {
            layout::farthest_row(&self.layout.parts(t, self.context, self.window), self.block_size).saturating_mul(kvw) > I32_MAX + 1
        };
        let (mut lo, mut hi) = (1u64, I32_MAX);
        if !passes(hi) {
            return None;
        }
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if passes(mid) { hi = mid } else { lo = mid + 1 }
        }
        Some(lo)
    }

    /// The spec and the counts the launches depend on, in closed form.
    pub fn counts(&self, tokens: u64) -> Result<(AttentionSpec, BatchCounts), PlanError> {
        let (spec, parts) = self.spec(tokens)?;
        Ok((spec, layout::counts(&parts, self.tile_rows(), self.route, self.window)))
    }
}

/// Every launch a case of `tokens` makes: the batch's kv_store, then attention's.
pub fn plans(tokens: u64, c: &AttentionCase, limits: &DeviceLimits) -> Result<Vec<Launch>, PlanError> {
    let (spec, n) = c.counts(tokens)?;
    if !spec.block_size.is_power_of_two() {
        return Err(PlanError::Unsupported {
            kernel: KERNEL.into(),
            what: format!("block size {}", spec.block_size),
            shape: spec.describe(),
        });
    }
    let mut v = vec![kv_store::plan(tokens, &spec, limits)?];
    v.extend(launches(&n, &spec, limits, c.prefill_kernel(limits))?.all());
    Ok(v)
}

/// Counts this case's plans make critical (the catalogue adds the serving envelope): the query
/// tile's tails, chunks ending on a cache block's boundary ±1, per layout the 2^31 points of Q/O
/// `(row·n_head + h)·head_dim` and of the farthest cache element read `((block·block_size +
/// row)·n_kv + kvh)·head_dim`, and the decode batches whose steps cover every kind of split (see
/// `layout::decode_position`). With a window w, the window's edges: prompts and chunks of w ± 1
/// and 2w ± 1 tokens and one far past ([`window_counts`]), decode batches through every step
/// of the longer cycle. Where the case runs the tensor-core prefill kernel, its own edges too
/// ([`mma_counts`]).
pub fn critical_counts(c: &AttentionCase, limits: &DeviceLimits) -> Vec<Critical> {
    let bq = c.tile_rows();
    let (rw, bs) = (c.heads as u64 * c.head_dim as u64, c.block_size.max(1) as u64);
    let tile = format!("attention: {bq}-row query tile");
    let around = |n: u64, why: &str| {
        [n.saturating_sub(1), n, n + 1].into_iter().filter(|&t| t > 0).map(|t| Critical::new(t, why)).collect::<Vec<_>>()
    };
    let cache_overflow = |why: &str| {
        c.cache_overflow_count().map_or(vec![], |t| {
            vec![
                Critical::new(t - 1, format!("attention: {why}: farthest cache element read last below 2^31")),
                Critical::new(t, format!("attention: {why}: farthest cache element read first past 2^31")),
            ]
        })
    };
    let block = format!("attention: a chunk ending on a {bs}-position block boundary");
    let mut v = vec![Critical::new(1, "attention: a single token")];
    match c.layout {
        Layout::Prompts { sequences: 1 } => {
            v.extend(tile_tails(bq, true, &[2, 128], &tile));
            v.extend(around(bs, &block));
            v.extend(around(2 * bs, &block));
        }
        Layout::Prompts { sequences } => {
            let s = sequences as u64;
            v.extend(tile_tails(s * bq, false, &[1, 2, 32], &format!("{tile} in each of {s} prompts")));
            v.extend(around(s + 1, &format!("attention: {s} prompts of 1 or 2 tokens")));
        }
        Layout::Runs { len } => {
            let len = len as u64;
            v.extend(overflow_point(rw, "attention: Q/O offset (row·n_head + h)·head_dim passes 2^31 − 1"));
            v.extend(cache_overflow(&format!("prompts of {len} positions, {} blocks each", len.div_ceil(bs))));
            v.extend(around(len, &format!("attention: prompts of {len} tokens")));
            v.extend(around(2 * len, &format!("attention: prompts of {len} tokens")));
        }
        Layout::Continue { cached } => {
            v.extend(tile_tails(bq, false, &[1, 2], &format!("{tile} after {cached} cached positions")));
            v.extend((2..=3).map(|t| Critical::new(t, "attention: a few tokens continuing a sequence")));
            let to_boundary = bs - cached as u64 % bs;
            v.extend(around(to_boundary, &format!("{block} after {cached} cached positions")));
            v.extend(around(to_boundary + bs, &format!("{block} after {cached} cached positions")));
        }
        Layout::ContextEnd => {
            v.push(Critical::new(2, "attention: the last 2 positions of the context"));
            v.extend(around(bq, &format!("{tile} ending at the context")));
        }
        Layout::Decode => {
            match c.route {
                DecodeRoute::Split => {
                    // Every step of the cycle and the last one: 16 steps, 19 with a window.
                    let last = 16.max(layout::decode_table(c.context, c.window).len() as u64 + 1);
                    v.extend((2..=last).map(|t| Critical::new(t, "attention: decode batch (steps cycle through every split shape)")))
                }
                DecodeRoute::Prefill => {
                    v.extend([2, 9, 10].map(|t| Critical::new(t, "attention: decode steps as 1-row prefill tiles")));
                    if c.window > 0 {
                        let all = layout::decode_table(c.context, c.window).len() as u64 + 1;
                        v.push(Critical::new(all, "attention: decode steps as 1-row prefill tiles, every window edge"));
                    }
                }
            }
            v.extend(cache_overflow(&format!("decode steps over {} positions each", c.context)));
        }
        Layout::Mixed => {
            v.extend((2..=10).map(|t| Critical::new(t, "attention: a prompt beside up to 8 decode steps")));
            v.extend(around(bq + 8, &format!("{tile} of a prompt beside 8 decode steps")));
        }
    }
    v.extend(window_counts(c));
    if c.prefill_kernel(limits) == PrefillKernel::Mma {
        v.extend(mma_counts(c));
    }
    v
}

/// The tensor-core prefill kernel's own edges (its 64-row tile's tails are the f32 kernel's):
/// a warp's 16-row slice ending one row short of, at and one past the end of the chunk (the
/// chunk's last rows fall in the first or third warp, the others idle: `warp_idle`), and where
/// the chunk's last key ends a 64-key tile or starts the next (the diagonal tile a warp
/// skips, `k0 > wlast`), for the layouts whose chunks do not already take every count below
/// two tiles.
pub fn mma_counts(c: &AttentionCase) -> Vec<Critical> {
    let (rows, keys) = (super::MMA_TILE.rows, super::MMA_TILE.keys);
    let slices = |plus: u64, why: &str| -> Vec<Critical> {
        [15, 16, 17, 47, 48, 49]
            .into_iter()
            .map(|n| {
                Critical::new(n + plus, format!("attention (mma): {why}: a 16-row warp slice of the {rows}-row tile ending at the chunk"))
            })
            .collect()
    };
    let key_edges = |cached: u64, why: &str| -> Vec<Critical> {
        let to_edge = keys - cached % keys;
        [to_edge, to_edge + keys]
            .into_iter()
            .flat_map(|n| [n - 1, n, n + 1])
            .filter(|&t| t > 0)
            .map(|t| Critical::new(t, format!("attention (mma): {why}: the chunk's last key around a {keys}-key tile's edge")))
            .collect()
    };
    match c.layout {
        Layout::Continue { cached } => {
            let why = format!("after {cached} cached positions");
            let mut v = slices(0, &why);
            v.extend(key_edges(cached as u64, &why));
            v
        }
        Layout::ContextEnd => slices(0, "ending at the context"),
        Layout::Mixed => slices(8, "a prompt beside 8 decode steps"),
        Layout::Prompts { sequences } if sequences > 1 => {
            let s = sequences as u64;
            [16, 48]
                .into_iter()
                .map(|n| Critical::new(n * s, format!("attention (mma): {s} prompts of {n} rows: whole warp slices")))
                .collect()
        }
        Layout::Prompts { .. } | Layout::Runs { .. } | Layout::Decode => vec![],
    }
}

/// The window's edges for a case with one (none without): where the last row of a prompt (or
/// of a chunk continuing a sequence, whose first rows see the cached keys inside their window)
/// sees w − 1, w and w + 1 positions, the same past the first window (2w ± 1), and far past it
/// (8w + 37); for 4 prompts, each of them; beside 8 decode steps, the prompt.
pub fn window_counts(c: &AttentionCase) -> Vec<Critical> {
    if c.window == 0 {
        return vec![];
    }
    let w = c.window as u64;
    let edges = |per: u64, plus: u64, why: String| -> Vec<Critical> {
        [w - 1, w, w + 1, 2 * w - 1, 2 * w, 2 * w + 1, 8 * w + 37]
            .into_iter()
            .map(|n| n * per + plus)
            .filter(|&t| t > 0)
            .map(|t| Critical::new(t, why.clone()))
            .collect()
    };
    match c.layout {
        Layout::Prompts { sequences } => {
            let s = sequences.max(1) as u64;
            edges(s, 0, format!("attention: window {w}: prompts of w ± 1, 2w ± 1 tokens and far past ({s} prompts)"))
        }
        Layout::Continue { cached } => {
            edges(1, 0, format!("attention: window {w}: a chunk of w ± 1, 2w ± 1 tokens and far past after {cached} cached positions"))
        }
        Layout::Runs { .. } => vec![],
        Layout::ContextEnd => edges(1, 0, format!("attention: window {w}: chunks of w ± 1, 2w ± 1 tokens ending at the context")),
        Layout::Decode => vec![],
        Layout::Mixed => edges(1, 8, format!("attention: window {w}: a prompt of w ± 1, 2w ± 1 tokens and far past beside 8 decode steps")),
    }
}

fn piece_rows(spec: &AttentionSpec) -> u64 {
    piece_rows_of(spec.kv_width())
}

/// History rows per piece at kv width `w`.
fn piece_rows_of(w: u64) -> u64 {
    (PIECE_FLOATS / w.max(1)).max(1)
}

/// All device memory a case allocates: Q, the guarded O, K/V rows with their cache rows, both
/// caches, a history piece, the batch's index arrays (block tables included) and the decode
/// workspace.
pub fn device_bytes(tokens: u64, c: &AttentionCase) -> u64 {
    let (Ok((spec, parts)), Ok((_, n))) = (c.spec(tokens), c.counts(tokens)) else {
        return 0;
    };
    let (rw, kvw) = (spec.row_width(), spec.kv_width());
    let history = layout::history_rows(&parts).min(piece_rows(&spec));
    let chunks = layout::slots(&parts);
    let sinks = if c.sinks { 4 * c.heads as u64 } else { 0 };
    // poison_below_windows: the NaN rows (a piece at most) and their destinations.
    let poisoned = if c.window > 0 { chunks * POISON_ROWS as u64 } else { 0 };
    let poison = poisoned.min(piece_rows(&spec)) * 4 * kvw + 8 * poisoned;
    sinks
        + poison
        + 4 * tokens * rw
        + 4 * (tokens * rw + GUARD_WORDS as u64)
        + 2 * 4 * tokens * kvw
        + 8 * tokens
        + 2 * 2 * spec.cache_elems()
        + history * (2 * 4 * kvw + 8)
        + 4 * (4 * chunks + 2 * n.prefill_tiles + 2 * n.decode_splits + chunks + 1 + spec.blocks as u64)
        + 4 * n.workspace_floats(&spec)
}

/// Where a cache position's K/V come from: the history before every chunk, generated piece
/// by piece on the device (position g of all the chunks' histories in order), or the batch's
/// own rows (row r of the batch).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Stream {
    History,
    Batch,
}

/// Elements `[0, w)` of K and V at position `at` of `stream` for kv width `w`, f16-rounded: the
/// values `store_history` and `store_batch` fill on the device.
fn stream_position(stream: Stream, w: u64, at: u64, k: &mut [f32], v: &mut [f32]) {
    let (seeds, first) = match stream {
        Stream::History => {
            let rows = piece_rows_of(w);
            let piece = at / rows;
            ((SEED_K_HISTORY + piece, SEED_V_HISTORY + piece), (at % rows) * w)
        }
        Stream::Batch => ((SEED_K, SEED_V), at * w),
    };
    for (e, (k, v)) in k.iter_mut().zip(v.iter_mut()).enumerate() {
        *k = round_f16(uniform_f32(seeds.0, first + e as u64, 1.0));
        *v = round_f16(uniform_f32(seeds.1, first + e as u64, 1.0));
    }
}

/// Consecutive positions from `first` of `stream` at kv width `w` into `k` and `v` (whole rows).
fn stream_positions(stream: Stream, w: u64, first: u64, k: &mut [f32], v: &mut [f32]) {
    for (i, (k, v)) in k.chunks_exact_mut(w as usize).zip(v.chunks_exact_mut(w as usize)).enumerate() {
        stream_position(stream, w, first + i as u64, k, v);
    }
}

/// Positions per shared stream block: small, so a short chunk (a decode step at position 1)
/// generates few positions it does not read.
const STREAM_BLOCK: u64 = 64;
/// Bytes the shared stream blocks may hold; past it their cache starts over.
const STREAM_CACHE_BYTES: usize = 2 << 30;

/// K then V of positions `[b·STREAM_BLOCK, (b + 1)·STREAM_BLOCK)` of `stream` at kv width `w`,
/// generated once per process and shared: the cases of a family read the same history and
/// batch rows (a context-end chunk's 40k keys of history, a decode step's history beside the
/// previous count's), and the twin used to regenerate them for every case. Generated on the
/// caller's thread (see `testdata::shared_weight_rows`).
fn stream_block(stream: Stream, w: u64, b: u64) -> std::sync::Arc<Vec<f32>> {
    static CACHE: std::sync::OnceLock<SharedCache<(Stream, u64, u64), f32>> = std::sync::OnceLock::new();
    CACHE.get_or_init(|| SharedCache::new(STREAM_CACHE_BYTES)).get((stream, w, b), || {
        let half = (STREAM_BLOCK * w) as usize;
        let mut out = vec![0.0f32; 2 * half];
        let (k, v) = out.split_at_mut(half);
        stream_positions(stream, w, b * STREAM_BLOCK, k, v);
        out
    })
}

/// Whether a slab has read block `b` of `stream` at kv width `w` before (and notes that one
/// does now): the second read on makes the block shared. Forgets everything past
/// [`STREAM_SEEN_MAX`] blocks.
fn stream_block_seen(stream: Stream, w: u64, b: u64) -> bool {
    static SEEN: std::sync::Mutex<Option<std::collections::HashSet<(Stream, u64, u64)>>> = std::sync::Mutex::new(None);
    let mut seen = SEEN.lock().unwrap_or_else(|p| p.into_inner());
    let seen = seen.get_or_insert_with(Default::default);
    if seen.len() >= STREAM_SEEN_MAX {
        seen.clear();
    }
    !seen.insert((stream, w, b))
}

/// Blocks [`stream_block_seen`] remembers (a few tens of MiB).
const STREAM_SEEN_MAX: usize = 1 << 20;

/// The value every cache position of the case holds, regenerated for the twin: the batch's own
/// rows, or history piece by piece. Owns its chunks and tables, so the host check can take it.
struct Inputs {
    spec: AttentionSpec,
    sinks: Option<Vec<f32>>,
    chunks: Vec<Chunk>,
    tables: Vec<u32>,
    /// First history row of each chunk.
    history_at: Vec<u64>,
}

impl Inputs {
    fn new(spec: AttentionSpec, sinks: Option<Vec<f32>>, chunks: Vec<Chunk>, tables: Vec<u32>) -> Inputs {
        let history_at = chunks
            .iter()
            .scan(0u64, |acc, c| {
                let at = *acc;
                *acc += c.start_pos as u64;
                Some(at)
            })
            .collect();
        Inputs { spec, sinks, chunks, tables, history_at }
    }

    /// Elements `[0, width)` of K and V at `pos` of chunk `c`'s sequence, f16-rounded, made
    /// directly (the reference of [`Self::slab`]'s shared blocks).
    #[cfg(test)]
    fn position(&self, c: usize, pos: u64, k: &mut [f32], v: &mut [f32]) {
        let ch = &self.chunks[c];
        let (stream, at) = if pos < ch.start_pos as u64 {
            (Stream::History, self.history_at[c] + pos)
        } else {
            (Stream::Batch, ch.first_row as u64 + pos - ch.start_pos as u64)
        };
        stream_position(stream, self.spec.kv_width(), at, k, v);
    }

    /// Positions `0..n` of chunk `c`'s sequence, as the twin reads them: those from `lo` on
    /// (the history before `start_pos`, the batch's own rows after) regenerated, or copied from
    /// the shared stream blocks ([`stream_block`]) where an earlier slab read the same block;
    /// those before `lo` left zero (never read).
    fn slab(&self, c: usize, lo: u64, n: u64) -> cpu::Slab {
        let (w, ch) = (self.spec.kv_width() as usize, &self.chunks[c]);
        let (mut k, mut v) = (vec![0.0f32; n as usize * w], vec![0.0f32; n as usize * w]);
        let start = (ch.start_pos as u64).clamp(lo, n);
        // (stream, its first position, how many), filling the slab from `lo` on.
        let runs = [
            (Stream::History, self.history_at[c] + lo, start - lo),
            (Stream::Batch, ch.first_row as u64 + start.saturating_sub(ch.start_pos as u64), n - start),
        ];
        // The slab from `lo` split at the stream blocks' edges: (stream, block, offset in the
        // block, K rows, V rows).
        let (mut k_rest, mut v_rest) = (&mut k[lo as usize * w..], &mut v[lo as usize * w..]);
        let mut pieces = Vec::new();
        for (stream, first, count) in runs {
            let mut g = first;
            while g < first + count {
                let (b, off) = (g / STREAM_BLOCK, g % STREAM_BLOCK);
                let len = (STREAM_BLOCK - off).min(first + count - g) as usize;
                let (kp, kr) = std::mem::take(&mut k_rest).split_at_mut(len * w);
                let (vp, vr) = std::mem::take(&mut v_rest).split_at_mut(len * w);
                (k_rest, v_rest) = (kr, vr);
                pieces.push((stream, b, off as usize, kp, vp));
                g += len as u64;
            }
        }
        pieces.into_par_iter().for_each(|(stream, b, off, k, v)| {
            let len = k.len() / w;
            if stream_block_seen(stream, w as u64, b) {
                let block = stream_block(stream, w as u64, b);
                let half = STREAM_BLOCK as usize * w;
                k.copy_from_slice(&block[off * w..(off + len) * w]);
                v.copy_from_slice(&block[half + off * w..half + (off + len) * w]);
            } else {
                // A block no slab has read yet: most are read by one case only (a long decode
                // batch's histories), so it is made here, not copied from a shared one.
                stream_positions(stream, w as u64, b * STREAM_BLOCK + off as u64, k, v);
            }
        });
        cpu::Slab { k, v, width: w }
    }

    /// The cache row of position `pos` of chunk `c`'s sequence (-1 if its table misses it:
    /// the plan has checked that it does not).
    fn row(&self, c: &Chunk, pos: u32) -> i64 {
        physical_row(&self.tables[c.table as usize..], pos, &self.spec).map_or(-1, |r| r as i64)
    }

    /// The cache row of every history row, in order: chunk by chunk, positions `0..start_pos`.
    fn history(&self) -> impl Iterator<Item = i64> + '_ {
        self.chunks.iter().flat_map(move |c| (0..c.start_pos).map(move |p| self.row(c, p)))
    }

    /// What the twin's output of batch row `r` depends on, and nothing else: the model's shape,
    /// where the row's chunk takes its history and its own rows, and the query's place in it
    /// (Q row `first_row + i`). Not the cache's geometry or the route: the twin reads no cache.
    fn twin_key(&self, r: &Row) -> TwinKey {
        let c = &self.chunks[r.chunk];
        let s = &self.spec;
        TwinKey {
            shape: (s.heads, s.kv_heads, s.head_dim, s.scale.to_bits()),
            window: s.window,
            sinks: self.sinks.is_some(),
            history_at: self.history_at[r.chunk],
            start_pos: c.start_pos,
            first_row: c.first_row,
            i: r.i,
        }
    }
}

/// The inputs a twin output row is a pure function of ([`Inputs::twin_key`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct TwinKey {
    shape: (u32, u32, u32, u32),
    window: u32,
    /// The sinks are a function of the heads (one seed).
    sinks: bool,
    history_at: u64,
    start_pos: u32,
    first_row: u32,
    i: u32,
}

/// Twin output rows computed in this process, shared by the cases that compare the same row of
/// the same inputs (both decode routes of a layout; the short prompts and continuations whose
/// first rows every count repeats). Bounded: cleared when it would pass [`TWIN_CACHE_FLOATS`].
static TWIN_CACHE: std::sync::LazyLock<std::sync::Mutex<TwinCache>> = std::sync::LazyLock::new(Default::default);
/// 2^27 floats: 512 MiB of host memory at most.
const TWIN_CACHE_FLOATS: usize = 1 << 27;

#[derive(Default)]
struct TwinCache {
    rows: std::collections::HashMap<TwinKey, std::sync::Arc<Vec<f32>>>,
    floats: usize,
}

impl TwinCache {
    fn get(key: &TwinKey) -> Option<std::sync::Arc<Vec<f32>>> {
        TWIN_CACHE.lock().ok()?.rows.get(key).cloned()
    }

    fn put(key: TwinKey, row: std::sync::Arc<Vec<f32>>) {
        let Ok(mut cache) = TWIN_CACHE.lock() else { return };
        if cache.floats + row.len() > TWIN_CACHE_FLOATS {
            cache.rows.clear();
            cache.floats = 0;
        }
        cache.floats += row.len();
        if let Some(old) = cache.rows.insert(key, row) {
            cache.floats -= old.len();
        }
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
        let dest: Vec<i64> = rows.by_ref().take(rows_per_piece).collect();
        if dest.is_empty() {
            break;
        }
        let n = dest.len();
        fill_uniform(gpu, &mut k, n * w, SEED_K_HISTORY + piece, 1.0)?;
        fill_uniform(gpu, &mut v, n * w, SEED_V_HISTORY + piece, 1.0)?;
        let dest = gpu.upload(&dest)?;
        let src = KvRows { k: k.slice(..n * w), v: v.slice(..n * w), dest: dest.as_view() };
        kv_store::launch(gpu, spec, n as u64, &src, &mut kc.as_view_mut(), &mut vc.as_view_mut())?;
        gpu.synchronize()?; // the piece buffers are refilled next round
    }
    Ok(())
}

/// Positions below each chunk's first key (its first row's window) that are overwritten with
/// NaN: a kernel that loads one of them (a tile or span edge one off) turns its output NaN even
/// where the mask hides the score (p · v = 0 · NaN).
const POISON_ROWS: u32 = 256;

/// With a window, overwrites the last [`POISON_ROWS`] history positions before each chunk's
/// first key (which no row of the chunk sees) with NaN K and V, through kv_store.
fn poison_below_windows(gpu: &Gpu, inputs: &Inputs, kc: &mut CudaSlice<u16>, vc: &mut CudaSlice<u16>) -> Result<(), GpuError> {
    let spec = &inputs.spec;
    if spec.window == 0 {
        return Ok(());
    }
    let dest: Vec<i64> = inputs
        .chunks
        .iter()
        .flat_map(|c| {
            let lo = first_key(c.start_pos, spec.window);
            (lo.saturating_sub(POISON_ROWS)..lo).map(move |p| inputs.row(c, p))
        })
        .collect();
    if dest.is_empty() {
        return Ok(());
    }
    let w = spec.kv_width() as usize;
    let rows = dest.len().min(piece_rows(spec) as usize);
    let nan = gpu.upload(&vec![f32::NAN; rows * w])?;
    for piece in dest.chunks(rows) {
        let d = gpu.upload(piece)?;
        let src = KvRows { k: nan.slice(..piece.len() * w), v: nan.slice(..piece.len() * w), dest: d.as_view() };
        kv_store::launch(gpu, spec, piece.len() as u64, &src, &mut kc.as_view_mut(), &mut vc.as_view_mut())?;
        gpu.synchronize()?; // the piece's destinations are freed next round
    }
    Ok(())
}

/// Stores the batch's own K/V rows at their chunks' positions, as the engine does before attention.
fn store_batch(gpu: &Gpu, inputs: &Inputs, tokens: u64, kc: &mut CudaSlice<u16>, vc: &mut CudaSlice<u16>) -> Result<(), GpuError> {
    let (spec, n) = (&inputs.spec, tokens as usize * inputs.spec.kv_width() as usize);
    let (mut k, mut v) = (gpu.alloc::<f32>(n)?, gpu.alloc::<f32>(n)?);
    fill_uniform(gpu, &mut k, n, SEED_K, 1.0)?;
    fill_uniform(gpu, &mut v, n, SEED_V, 1.0)?;
    let dest: Vec<i64> = inputs.chunks.iter().flat_map(|c| (0..c.n_tokens).map(move |i| inputs.row(c, c.start_pos + i))).collect();
    let dest = gpu.upload(&dest)?;
    let src = KvRows { k: k.as_view(), v: v.as_view(), dest: dest.as_view() };
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

/// Rows to compare, within the CPU budget: the last and first rows (the first chunk reads the
/// highest block), the edges of chunks spread over the batch (the last chunks hold block 0 and
/// the blocks after it), the tails of the query tiles and random rows. The first candidate is always taken. Sorted by chunk, so slabs are made once.
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
        let pos = c.start_pos + i;
        let cost = (pos as u64 + 1 - first_key(pos, spec.window) as u64) * spec.row_width() * 2;
        let gen_cost = if made.contains(&chunk) { 0 } else { (c.end() - first_key(c.start_pos, spec.window) as u64) * spec.kv_width() * 2 };
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

/// The twin's output of every sampled row, over regenerated inputs: rows of every chunk at
/// once (one slab per chunk, its rows computed together by [`cpu::attend_rows`], which reads
/// each tile of the slab once for all of them), rows the process has already computed for the
/// same inputs taken from [`TWIN_CACHE`].
fn twin_rows(inputs: &Inputs, rows: &[Row]) -> Vec<std::sync::Arc<Vec<f32>>> {
    let (spec, rw) = (&inputs.spec, inputs.spec.row_width() as usize);
    let groups: Vec<&[Row]> = rows.chunk_by(|a, b| a.chunk == b.chunk).collect();
    groups
        .par_iter()
        .flat_map_iter(|group| {
            let c = &inputs.chunks[group[0].chunk];
            let mut want: Vec<Option<std::sync::Arc<Vec<f32>>>> = group.iter().map(|r| TwinCache::get(&inputs.twin_key(r))).collect();
            let uncached: Vec<&Row> = group.iter().zip(&want).filter(|(_, k)| k.is_none()).map(|(r, _)| r).collect();
            if let (Some(lo), Some(n)) = (
                uncached.iter().map(|r| first_key(c.start_pos + r.i, spec.window)).min(),
                uncached.iter().map(|r| (c.start_pos + r.i) as u64 + 1).max(),
            ) {
                let slab = inputs.slab(group[0].chunk, lo as u64, n);
                let q: Vec<Vec<f32>> = uncached.iter().map(|r| uniform_row(SEED_Q, r.row * rw as u64, rw, Q_AMPLITUDE)).collect();
                let q_rows: Vec<&[f32]> = q.iter().map(|q| q.as_slice()).collect();
                let is: Vec<u32> = uncached.iter().map(|r| r.i).collect();
                let made = cpu::attend_rows(&q_rows, &is, &slab, c, spec, inputs.sinks.as_deref());
                let mut made = uncached.iter().zip(made).map(|(r, o)| {
                    let o = std::sync::Arc::new(o);
                    TwinCache::put(inputs.twin_key(r), o.clone());
                    o
                });
                for w in want.iter_mut().filter(|w| w.is_none()) {
                    *w = made.next();
                }
            }
            want.into_iter().map(|w| w.expect("a twin row for every row not cached"))
        })
        .collect()
}

/// Sampled output rows (downloaded, in `rows`' order) against the twin.
fn compare_outputs(inputs: &Inputs, rows: &[Row], got: &[Vec<f32>]) -> RelErr {
    let rw = inputs.spec.row_width() as usize;
    let want = twin_rows(inputs, rows);
    let mut err = RelErr::default();
    for ((r, got), want) in rows.iter().zip(got).zip(&want) {
        err.add_slice(r.row * rw as u64, got, want);
    }
    err
}

/// Cache words of sampled batch rows that differ from kv_store's twin (K and V). The rows come
/// down with one copy per run of nearby cache rows ([`download_rows`]), not two copies a row.
fn compare_stored(gpu: &Gpu, inputs: &Inputs, rows: &[Row], kc: &CudaSlice<u16>, vc: &CudaSlice<u16>) -> Result<u64, GpuError> {
    let w = inputs.spec.kv_width() as usize;
    let mut bad = 0u64;
    // (batch row, cache row) of each sampled row its table holds.
    let mut stored: Vec<(u64, u64)> = Vec::new();
    for r in rows.iter().take(STORED_ROWS) {
        let c = &inputs.chunks[r.chunk];
        match u64::try_from(inputs.row(c, c.start_pos + r.i)) {
            Ok(row) => stored.push((r.row, cache_offset(row, &inputs.spec) / w as u64)),
            Err(_) => bad += 2 * w as u64, // a position its table misses: nothing could have been stored
        }
    }
    let at: Vec<u64> = stored.iter().map(|s| s.1).collect();
    for (cache, seed) in [(kc, SEED_K), (vc, SEED_V)] {
        let got = download_rows(gpu, cache, &at, w)?;
        for (&(row, _), got) in stored.iter().zip(&got) {
            let want = (0..w).map(|e| f16::from_f32(uniform_f32(seed, row * w as u64 + e as u64, 1.0)).to_bits());
            bad += got.iter().zip(want).filter(|(g, w)| **g != *w).count() as u64;
        }
    }
    Ok(bad)
}

/// Self-test: history and batch K/V stored, Q from a seed, O poisoned; attention timed; every
/// output written, nothing past the end, sampled rows against the twin, stored rows bit for bit.
pub fn run_case(gpu: &Gpu, tokens: u64, c: &AttentionCase) -> Result<Outcome, GpuError> {
    stage_case(gpu, tokens, c).map(Staged::finish)
}

/// [`run_case`]'s GPU half: everything up to the sampled output rows downloaded (the stored rows
/// are compared here, a few words each); the twin of the sampled rows is the host check.
pub fn stage_case(gpu: &Gpu, tokens: u64, c: &AttentionCase) -> Result<Staged, GpuError> {
    let (spec, parts) = c.spec(tokens)?;
    let (chunks, tables) = c.batch(&parts);
    let plan = BatchPlan::new(&chunks, &tables, tokens, &spec, c.route)?.with_prefill(Some(c.prefill_kernel(gpu.limits())));
    plan.launches(gpu.limits())?; // a bad shape is refused before anything is allocated
    kv_store::plan(tokens, &spec, gpu.limits())?;
    let inputs = Inputs::new(spec, c.sink_values(), chunks, tables);
    let cache = spec.cache_elems() as usize;
    timing::mark("plan");
    let (mut kc, mut vc) = (gpu.alloc::<u16>(cache)?, gpu.alloc::<u16>(cache)?);
    timing::mark("alloc caches");
    store_history(gpu, &inputs, &mut kc, &mut vc)?;
    timing::mark("history");
    poison_below_windows(gpu, &inputs, &mut kc, &mut vc)?;
    store_batch(gpu, &inputs, tokens, &mut kc, &mut vc)?;
    let sinks = inputs.sinks.as_ref().map(|s| gpu.upload(s)).transpose()?;
    let n = tokens as usize * spec.row_width() as usize;
    let mut q = gpu.alloc::<f32>(n)?;
    fill_uniform(gpu, &mut q, n, SEED_Q, Q_AMPLITUDE)?;
    let mut out = Guarded::new(gpu, n)?;
    let mut workspace = gpu.alloc::<f32>(plan.workspace_floats().max(1) as usize)?;
    let batch = DeviceBatch::upload(gpu, plan)?;
    gpu.synchronize()?;
    timing::mark("inputs");
    let start = Instant::now();
    let io = AttentionIo {
        q: q.as_view(),
        k_cache: kc.as_view(),
        v_cache: vc.as_view(),
        out: out.buf.slice_mut(..n),
        workspace: workspace.as_view_mut(),
        sinks: sinks.as_ref().map(|s| s.as_view()),
    };
    launch(gpu, &batch, io)?;
    gpu.synchronize()?;
    let kernel_ms = start.elapsed().as_secs_f64() * 1e3;
    timing::mark("kernel");
    let (unwritten, past_end) = out.check(gpu, 1)?;
    timing::mark("guard check");
    let rows = select_rows(&inputs.chunks, tokens, &spec, c.tile_rows());
    let stored = compare_stored(gpu, &inputs, &rows, &kc, &vc)?;
    timing::mark("stored rows");
    let rw = spec.row_width() as usize;
    let got = out.read_rows_f32(gpu, &rows.iter().map(|r| r.row).collect::<Vec<_>>(), rw)?;
    timing::mark("outputs");
    Ok(Staged::Check(Box::new(move || {
        let err = compare_outputs(&inputs, &rows, &got);
        let mut check = Check::of_floats(&err, TOLERANCE, (unwritten, past_end), kernel_ms);
        if stored > 0 {
            check.int_mismatches += stored;
            check.note = format!("{stored} stored cache words differ from kv_store's twin; {}", check.note);
        }
        Outcome::Ran(check)
    })))
}

/// The host work of one case without a device (`selftest::host_bench`): the rows the GPU half
/// would select and the twin's output of each, the slabs made as the host check makes them.
#[cfg(test)]
pub(crate) fn host_half(tokens: u64, c: &AttentionCase) -> usize {
    let Ok((spec, parts)) = c.spec(tokens) else { return 0 };
    let (chunks, tables) = c.batch(&parts);
    let inputs = Inputs::new(spec, c.sink_values(), chunks, tables);
    let rows = select_rows(&inputs.chunks, tokens, &spec, c.tile_rows());
    twin_rows(&inputs, &rows).len()
}

/// The self-test's handle on this family (registered in `selftest::case`).
pub struct Family;

impl KernelFamily for Family {
    type Case = AttentionCase;

    fn run(gpu: &Gpu, tokens: u64, c: &AttentionCase) -> Result<Outcome, GpuError> {
        run_case(gpu, tokens, c)
    }

    fn stage(gpu: &Gpu, tokens: u64, c: &AttentionCase) -> Result<Staged, GpuError> {
        stage_case(gpu, tokens, c)
    }

    fn plans(tokens: u64, c: &AttentionCase, limits: &DeviceLimits) -> Result<Vec<Launch>, PlanError> {
        plans(tokens, c, limits)
    }
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
        block_size: 16,
        window: 0,
        sinks: false,
        prefill: None,
    };

    fn counts(c: &AttentionCase) -> Vec<u64> {
        critical_counts(c, &DeviceLimits::h200()).iter().map(|c| c.tokens).collect()
    }

    #[test]
    fn critical_counts_for_qwen3() {
        // Every tail of the 64-row tile, and around 2 and 128 tiles.
        let single = counts(&QWEN);
        assert!((1..128).all(|t| single.contains(&t)) && [8191, 8192, 8193].iter().all(|t| single.contains(t)));
        // Q/O: 2^31 / (32 · 128) = 524,288. The cache: a 61-token prompt takes 4 blocks of 16 (64
        // rows), and the top block is read to its row 15, so 65,536 prompts read up to element
        // 65,536 · 64 · 512 − 1 = 2^31 − 1 and one more prompt (token 65,536 · 61 + 1) passes it.
        let runs = counts(&AttentionCase { layout: Layout::Runs { len: 61 }, ..QWEN });
        for t in [524_287, 524_288, 3_997_696, 3_997_697, 60, 61, 62, 121, 122, 123] {
            assert!(runs.contains(&t), "{t}");
        }
        // Decode: a step at position p holds ceil((p + 1) / 16) blocks (a cycle of 9 steps holds
        // 3,874, the last one 2,560); the top block is read at its row 0 only. 610 steps hold
        // 262,142 blocks and read below element 2^31, 611 hold 262,151 and read past it.
        let decode = counts(&AttentionCase { layout: Layout::Decode, ..QWEN });
        assert!(decode.contains(&610) && decode.contains(&611) && (1..=16).all(|t| decode.contains(&t)));
        assert_eq!(layout::total_blocks(&Layout::Decode.parts(611, 40_960, 0), 16), 262_151);
        // Blocks of 16: 4133 cached positions end a block after 11 and 27 more tokens.
        let cont = counts(&AttentionCase { layout: Layout::Continue { cached: 4133 }, ..QWEN });
        assert!([10, 11, 12, 26, 27, 28].iter().all(|t| cont.contains(t)), "{cont:?}");
        assert!([15, 16, 17, 31, 32, 33].iter().all(|t| single.contains(t)));
    }

    /// The exact point the search finds: one token less stays below 2^31, this one passes it.
    #[test]
    fn cache_overflow_count_is_exact() {
        for layout in [Layout::Runs { len: 61 }, Layout::Decode, Layout::Runs { len: 5 }] {
            let c = AttentionCase { layout, ..QWEN };
            let t = c.cache_overflow_count().unwrap();
            let far = |t| layout::farthest_row(&layout.parts(t, c.context, 0), 16) * 512;
            assert!(far(t - 1) <= 1 << 31 && far(t) > 1 << 31, "{layout:?} {t}");
        }
    }

    /// The tables the self-test runs on read every sequence through the right blocks: the twin
    /// over a cache filled through `kv_store`'s twin at the scrambled rows equals the twin over
    /// the same K/V laid out slot-contiguously.
    #[test]
    fn scrambled_tables_read_what_was_stored() {
        for (window, sinks) in [(0, false), (7, true)] {
            scrambled_tables_read_what_was_stored_with(window, sinks);
        }
    }

    /// The slab of a windowed row starts at its first key (zeros below): the twin reads no more.
    fn scrambled_tables_read_what_was_stored_with(window: u32, sinks: bool) {
        let c = AttentionCase { heads: 4, kv_heads: 2, head_dim: 64, context: 300, layout: Layout::Mixed, window, sinks, ..QWEN };
        let tokens = 40;
        let (spec, parts) = c.spec(tokens).unwrap();
        let (chunks, tables) = c.batch(&parts);
        let inputs = Inputs::new(spec, c.sink_values(), chunks.clone(), tables.clone());
        let w = spec.kv_width() as usize;
        let (mut kc, mut vc) = (vec![half::f16::ZERO; spec.cache_elems() as usize], vec![half::f16::ZERO; spec.cache_elems() as usize]);
        for (ci, ch) in chunks.iter().enumerate() {
            let (mut k, mut v) = (vec![0.0f32; ch.end() as usize * w], vec![0.0f32; ch.end() as usize * w]);
            for p in 0..ch.end() as usize {
                inputs.position(ci, p as u64, &mut k[p * w..][..w], &mut v[p * w..][..w]);
            }
            let dest = kv_store::destinations(&tables[ch.table as usize..], 0..ch.end() as u32, &spec);
            assert!(dest.iter().all(|&d| d >= 0));
            kv_store::kv_store_cpu(&mut kc, &mut vc, &k, &v, &dest, &spec).unwrap();
        }
        let rw = spec.row_width() as usize;
        let q = uniform_row(SEED_Q, 0, tokens as usize * rw, Q_AMPLITUDE);
        let got = cpu::attention_cpu(&q, &kc, &vc, &chunks, &tables, &spec, inputs.sinks.as_deref()).unwrap();
        for (ci, ch) in chunks.iter().enumerate() {
            let slab = inputs.slab(ci, first_key(ch.start_pos, window) as u64, ch.end());
            for i in 0..ch.n_tokens {
                let row = ch.first_row as usize + i as usize;
                let mut want = vec![0.0f32; rw];
                cpu::attend_row(&q[row * rw..][..rw], &slab, ch, i, &spec, inputs.sinks.as_deref(), &mut want);
                assert_eq!(got[row * rw..][..rw], want[..], "window {window}: chunk {ci} row {i}");
            }
        }
        assert_eq!(tables[0], spec.blocks - 1, "the first sequence starts in the top block");
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
                let parts = layout.parts(t, 40_960, 0);
                let listed: u64 = layout::chunks(&parts, 16).iter().map(|c| c.start_pos as u64).sum();
                assert_eq!(layout::history_rows(&parts), listed, "{layout:?} {t}");
            }
        }
    }

    #[test]
    fn device_bytes_count_the_caches() {
        // 611 decode steps: two caches of 262,151 blocks x 16 x 512 f16 dominate; the decode
        // workspace (a partial of 130 floats per span of 64 keys and head) adds about 1.1 GB.
        let c = AttentionCase { layout: Layout::Decode, ..QWEN };
        let caches = 2 * 2 * 262_151 * 16 * 512u64;
        let b = device_bytes(611, &c);
        assert!(b > caches + (1 << 30) && b < caches + (3 << 29), "{b}");
        assert_eq!(device_bytes(0, &c), 0);
    }

    /// Slabs made in place and copied from the shared stream blocks hold, bit for bit, the
    /// values generated position by position, and zeros below `lo`: ranges across block edges, across a chunk's
    /// start (history, then its own rows), across history pieces, at chunks after others.
    #[test]
    fn shared_stream_slabs_equal_the_generated_positions() {
        // kv width 2048: a history piece is 16,384 rows, crossed by the decode steps' history.
        let wide = AttentionCase { heads: 16, kv_heads: 8, head_dim: 256, layout: Layout::Decode, ..QWEN };
        let cases = [
            (wide, 3, vec![(2, 16_300, 16_500), (2, 32_700, 32_900), (2, 40_890, 40_960), (0, 0, 1), (1, 0, 2)]),
            (
                AttentionCase { layout: Layout::Continue { cached: 100 }, window: 37, ..QWEN },
                150,
                vec![(0, 63, 250), (0, 0, 100), (0, 99, 101)],
            ),
            (AttentionCase { layout: Layout::ContextEnd, context: 300, ..QWEN }, 700, vec![(0, 190, 300), (1, 5, 300), (2, 0, 300)]),
            (AttentionCase { layout: Layout::Prompts { sequences: 4 }, ..QWEN }, 401, vec![(3, 0, 101), (2, 17, 100)]),
        ];
        for (c, tokens, ranges) in cases {
            let (spec, parts) = c.spec(tokens).unwrap();
            let (chunks, tables) = c.batch(&parts);
            let inputs = Inputs::new(spec, None, chunks, tables);
            let w = spec.kv_width() as usize;
            for (chunk, lo, n) in ranges {
                assert!(n <= inputs.chunks[chunk].end(), "{:?} chunk {chunk}", c.layout);
                // The first read makes its blocks in place, the second copies them shared.
                let (first, slab) = (inputs.slab(chunk, lo, n), inputs.slab(chunk, lo, n));
                let (mut k, mut v) = (vec![0.0f32; n as usize * w], vec![0.0f32; n as usize * w]);
                for pos in lo..n {
                    let at = pos as usize * w..(pos as usize + 1) * w;
                    inputs.position(chunk, pos, &mut k[at.clone()], &mut v[at]);
                }
                let bits = |x: &[f32]| x.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                for slab in [first, slab] {
                    assert!(bits(&slab.k) == bits(&k) && bits(&slab.v) == bits(&v), "{:?} chunk {chunk} {lo}..{n}", c.layout);
                }
            }
        }
    }

    #[test]
    fn selected_rows_stay_within_budget_and_start_with_the_tails() {
        let c = AttentionCase { layout: Layout::Decode, ..QWEN };
        let (spec, parts) = c.spec(103).unwrap();
        let (chunks, _) = c.batch(&parts);
        let rows = select_rows(&chunks, 103, &spec, 64);
        assert!(rows.iter().any(|r| r.row == 102) && rows.iter().any(|r| r.row == 0));
        let fma: u64 = rows.iter().map(|r| (chunks[r.chunk].start_pos as u64 + r.i as u64 + 1) * spec.row_width() * 2).sum();
        assert!(fma <= FMA_BUDGET, "{fma}");
        let (spec, parts) = QWEN.spec(16_385).unwrap();
        let rows = select_rows(&c.batch(&parts).0, 16_385, &spec, 64);
        assert!(rows.iter().any(|r| r.row == 16_384) && rows.len() > 32, "{}", rows.len());
    }
}
