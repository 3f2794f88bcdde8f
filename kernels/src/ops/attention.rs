//! Attention over the f16 KV cache: causal prefill (flash-attention style) and decode
//! (flash-decoding), for any GQA ratio and head_dim 64, 128 or 256.
//!
//! The engine keeps, per layer, K and V as a paged f16 cache `[blocks, block_size, n_kv,
//! head_dim]` (vLLM's PagedAttention): a sequence's positions live in the blocks its block table
//! lists, position p in row `p % block_size` of block `table[p / block_size]`, so sequences that
//! share a prompt prefix can share its blocks. A batch is a list of [`Chunk`]s and one flat table
//! of block ids: chunk c's tokens are rows `first_row..` of Q `[rows, n_head, head_dim]` f32
//! (normed, RoPE'd) at positions `start_pos..` of the sequence whose table starts at entry
//! `table` of the flat table, and query i of the chunk attends to positions `0 ..= start_pos + i`
//! (a later chunk of a sequence sees the earlier ones: chunked prefill). The chunk's own K/V rows
//! are written first ([`super::kv_store`], to rows [`physical_row`]). O is `[rows, n_head,
//! head_dim]` f32.
//!
//! Kernels (`cuda/attention.cu`), chosen per chunk by [`BatchPlan`]:
//! - `attn_prefill_d{D}`: grid (query tiles of every chunk, n_head), 128 threads; a tile is
//!   [`PrefillTile::rows`] query rows of one chunk against key tiles of [`PrefillTile::keys`]
//!   staged in shared memory (f16 -> f32), online softmax in f32. The tile -> (chunk, first
//!   query) map is a device array built here, so tiles grow on grid.x only.
//! - `attn_prefill_mma_d{D}` (D 64, 128; compute capability 8.0+): the same tiles, arguments and
//!   grid on tensor cores (`mma.sync` m16n8k16, f16 x f16 -> f32). K and V are f16 already; Q and
//!   the probabilities P are split into two f16 halves each (`hi = f16(x)`, `lo = f16(x − hi)`),
//!   both multiplied in, so the result stays within f32 rounding of the f32 kernel's (see
//!   [`TOLERANCE`]). Which of the two runs: [`select_prefill`], the tensor-core kernel where
//!   it exists unless [`PREFILL_ENV`] forces f32 ([`BatchPlan::prefill_kernel`]); the self-test
//!   runs the same one.
//! - `attn_decode_d{D}` + `attn_decode_combine`: a 1-token chunk's context is cut into spans of
//!   [`DECODE_SPAN`] keys; grid (spans of every decode chunk, n_head / heads per block): each
//!   block scores one span for up to [`DECODE_MAX_HEADS`] heads sharing a kv head and writes a
//!   partial (max, sum, o) to a workspace; the combine (grid (decode chunks, n_head)) merges them.
//!   One sequence at 32k context thus spreads over 256 x n_kv blocks.
//!
//! Scores are in log2 units: Q is scaled once by `scale · log2(e)` and softmax uses `exp2`. The CPU
//! twin ([`attention_cpu`]) takes an exact two-pass softmax in f32 over the same f16-rounded K/V;
//! [`TOLERANCE`] bounds what the kernels' online / split summation orders and dot orders differ by.
//!
//! Two options of the attention (gpt-oss; none for qwen3moe), taking exactly the plain causal
//! arithmetic when off:
//! - a sliding window [`AttentionSpec::window`] (llama.cpp's `LLAMA_SWA_TYPE_STANDARD`): a query
//!   at position q sees key p only when `q − p < window` ([`first_key`]). The plan lists only
//!   the decode spans from the window's first key ([`decode_spans`]); the prefill kernel skips
//!   key tiles before its first row's window.
//! - per-head sinks ([`AttentionIo::sinks`], `ggml_soft_max_ext` with sinks): one logit per
//!   query head, in the units of `scale · q·k`, that enters the softmax's max and denominator and
//!   adds no value; the decode combine adds it once per (sequence, head), not per span.

mod cpu;
mod layout;
#[cfg(test)]
mod mma_sim;
mod selftest;

use cudarc::driver::{CudaSlice, CudaView, CudaViewMut, DevicePtr, DevicePtrMut, DeviceRepr, PushKernelArg};
use serde::{Deserialize, Serialize};

use crate::cuda::{Gpu, GpuError};
use crate::launch::{Cover, Launch, PlanError, bytes_of, require_bytes};
use crate::limits::DeviceLimits;
use crate::sources::ATTENTION;
use crate::thresholds::I32_MAX;

pub use cpu::attention_cpu;
pub use layout::{Layout, decode_position, scrambled_tables};
#[cfg(test)]
pub(crate) use selftest::host_half;
pub use selftest::{AttentionCase, Family, critical_counts, device_bytes, plans, run_case, stage_case};

/// The family's name in the self-test (its kernels are named per head_dim, see the module doc).
pub const KERNEL: &str = "attention";
pub const COMBINE_KERNEL: &str = "attn_decode_combine";
/// Relative to the largest output compared. The twin differs from the kernels in summation
/// order only: against f32 emulations of both kernels' orders (one FMA chain per dot product,
/// online tiles or spans merged; `cpu::tests::tolerance_covers_the_kernels_summation_orders`) it
/// is within 3e-7 up to 40,960 keys, relative to the summands; the device's exp2f (2 ulp) adds
/// as much again. Outputs averaged over many keys shrink (|o| ~ 0.03 at 40,960 keys at the
/// self-test's input scales) while those rounding errors do not, so relative to the largest
/// output they reach ~1e-5: the H200 measured 1.05e-5 on 4 long-context cases (2026-11-30).
/// One key too many or too few moves an output by its softmax weight times |v − o|, ~1e-5
/// absolute among 40,960 keys, i.e. ~3e-4 relative to such outputs, and 1e-3 and more below
/// 1,000 keys where tile tails live: 3e-5 still separates the two by 10x. The tensor-core
/// prefill kernel is held to the same bound: its split f16 halves of Q and P carry ~22 bits,
/// and an emulation of its arithmetic (`cpu::tests::tolerance_covers_the_mma_kernels_split`,
/// even with tensor cores that truncate every addend) stays within 2e-6 up to 40,960 keys.
pub const TOLERANCE: f64 = 3e-5;
/// Threads of every attention block (`ATT_THREADS`).
pub const THREADS: u32 = 128;
/// Keys per decode split (`DEC_SPAN`). 64 rather than 128: a decode step at a short context
/// then has twice the blocks, each with half the serial work (the H200 timed `attn_decode_d128`
/// at 31 us per layer at position ~140 with 128, the largest kernel of a decode step).
pub const DECODE_SPAN: u64 = 64;
/// Heads one decode block serves at most (`DEC_MAX_HB`): they share its K/V loads.
pub const DECODE_MAX_HEADS: u32 = 8;
/// Keys x head_dim staged at once by the decode kernel (`DEC_TILE_FLOATS`).
const DECODE_TILE_FLOATS: u64 = 8192;
/// Floats of padding after each staged row (`ATT_PAD`).
const PAD: u64 = 4;
/// Supported head dimensions (the kernels are instantiated for these).
pub const HEAD_DIMS: [u32; 3] = [64, 128, 256];

/// Largest block size: the kernels build `(1 << shift) - 1` in an i32.
pub const MAX_BLOCK_SIZE: u32 = 1 << 30;
/// Positions per cache block the engine uses unless told otherwise (vLLM's default too), and
/// the self-test's: a 24k-token prompt is 1,500 blocks, a shared prefix is reused to within 15.
pub const DEFAULT_BLOCK_SIZE: u32 = 16;

/// What the kernels need to know of a model's attention and of its cache.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct AttentionSpec {
    pub heads: u32,
    pub kv_heads: u32,
    pub head_dim: u32,
    /// Blocks the cache holds (its first dimension).
    pub blocks: u32,
    /// Positions per block: a power of two (the kernels take it as a shift).
    pub block_size: u32,
    /// Softmax scale, `1 / sqrt(head_dim)` for qwen3.
    pub scale: f32,
    /// Sliding window: a query at position q sees key p only when `q − p < window`; 0: every
    /// key up to q (plain causal attention).
    #[serde(default)]
    pub window: u32,
}

impl AttentionSpec {
    /// A spec with the usual scale `1 / sqrt(head_dim)`.
    pub fn new(heads: u32, kv_heads: u32, head_dim: u32, blocks: u32, block_size: u32) -> AttentionSpec {
        AttentionSpec { heads, kv_heads, head_dim, blocks, block_size, scale: 1.0 / (head_dim as f32).sqrt(), window: 0 }
    }

    /// This spec with a sliding window of `window` keys (0: none).
    pub fn with_window(self, window: u32) -> AttentionSpec {
        AttentionSpec { window, ..self }
    }

    /// Why the kernels cannot run this spec, if they cannot.
    pub fn unsupported(&self) -> Option<String> {
        let fits = |v: u32| v >= 1 && v as u64 <= I32_MAX;
        if !HEAD_DIMS.contains(&self.head_dim) {
            Some(format!("head_dim {} is not one of {HEAD_DIMS:?}", self.head_dim))
        } else if !fits(self.heads) || !fits(self.kv_heads) {
            Some(format!("{} heads / {} kv heads: both must be in 1..2^31", self.heads, self.kv_heads))
        } else if !self.heads.is_multiple_of(self.kv_heads) {
            Some(format!("{} heads are not a multiple of {} kv heads (GQA groups must be whole)", self.heads, self.kv_heads))
        } else if !fits(self.blocks) {
            Some(format!("cache of {} blocks: must be in 1..2^31", self.blocks))
        } else if !self.block_size.is_power_of_two() || self.block_size > MAX_BLOCK_SIZE {
            Some(format!("block size {} must be a power of two up to 2^30", self.block_size))
        } else if self.row_width() > I32_MAX {
            Some(format!("{} heads x {} dims: a row must stay below 2^31 elements", self.heads, self.head_dim))
        } else if self.cache_rows().checked_mul(2 * self.kv_width()).is_none() {
            Some(format!(
                "a cache of {} blocks x {} positions x {} overflows 64-bit byte offsets",
                self.blocks,
                self.block_size,
                self.kv_width()
            ))
        } else if !(self.scale.is_finite() && self.scale > 0.0) {
            Some(format!("scale {} must be finite and > 0", self.scale))
        } else if self.window as u64 > I32_MAX {
            Some(format!("window {}: the kernels take it as an i32", self.window))
        } else {
            None
        }
    }

    fn check(&self) -> Result<(), PlanError> {
        match self.unsupported() {
            Some(what) => Err(unsupported(what, self.describe())),
            None => Ok(()),
        }
    }

    /// Query heads per kv head.
    pub fn group(&self) -> u32 {
        self.heads / self.kv_heads.max(1)
    }

    /// Floats of one row of Q or O: `n_head · head_dim`.
    pub fn row_width(&self) -> u64 {
        self.heads as u64 * self.head_dim as u64
    }

    /// Elements of one cache position: `n_kv · head_dim`.
    pub fn kv_width(&self) -> u64 {
        self.kv_heads as u64 * self.head_dim as u64
    }

    /// Rows (positions) of one layer's K (or V) cache: `blocks · block_size`.
    pub fn cache_rows(&self) -> u64 {
        self.blocks as u64 * self.block_size as u64
    }

    /// Elements of one layer's K (or V) cache.
    pub fn cache_elems(&self) -> u64 {
        self.cache_rows().saturating_mul(self.kv_width())
    }

    /// `log2(block_size)`, as the kernels take it.
    pub fn block_shift(&self) -> u32 {
        self.block_size.max(1).trailing_zeros()
    }

    /// Table entries a sequence of `end` positions needs.
    pub fn blocks_for(&self, end: u64) -> u64 {
        end.div_ceil(self.block_size.max(1) as u64)
    }

    /// The factor Q is multiplied by: scores come out in log2 units for `exp2`.
    pub fn q_scale(&self) -> f32 {
        self.scale * std::f32::consts::LOG2_E
    }

    /// Heads one decode block serves: the largest divisor of the GQA group up to
    /// [`DECODE_MAX_HEADS`], so a block's heads share one kv head.
    pub fn decode_heads_per_block(&self) -> u32 {
        (1..=DECODE_MAX_HEADS.min(self.group().max(1))).rev().find(|d| self.group().is_multiple_of(*d)).unwrap_or(1)
    }

    /// Heads a decode block serves in a grid of `splits` spans on a device of `sm_count` SMs:
    /// the most (up to [`Self::decode_heads_per_block`], a divisor of the group) that still
    /// gives every SM a block. Long contexts share each staged K/V tile among the whole group;
    /// short ones (3 spans at 129 keys: 12 blocks of 8 heads) spread the heads over more blocks.
    /// Each head's arithmetic is the same for any choice.
    pub fn decode_heads_for(&self, splits: u64, sm_count: u32) -> u32 {
        let (most, group) = (self.decode_heads_per_block(), self.group());
        (1..=most).rev().filter(|d| group.is_multiple_of(*d)).find(|&d| splits * (self.heads / d) as u64 >= sm_count as u64).unwrap_or(1)
    }

    pub fn describe(&self) -> String {
        let window = if self.window > 0 { format!(" window={}", self.window) } else { String::new() };
        format!(
            "heads={} kv_heads={} head_dim={} blocks={} block_size={} scale={}{window}",
            self.heads, self.kv_heads, self.head_dim, self.blocks, self.block_size, self.scale
        )
    }
}

fn unsupported(what: impl Into<String>, shape: String) -> PlanError {
    PlanError::Unsupported { kernel: KERNEL.into(), what: what.into(), shape }
}

/// The prefill kernel's tile for a head_dim: query rows per block, keys per staged tile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrefillTile {
    pub rows: u64,
    pub keys: u64,
}

/// The tile of `attn_prefill_d{head_dim}` (`ATT_PREFILL(D, TQ, TK)`: 16·TQ rows, 8·TK keys).
/// Its rows are the batch's tile map ([`BatchPlan`]) for either prefill kernel: the tensor-core
/// kernel's tiles have as many rows ([`PrefillKernel::tile`]).
pub fn prefill_tile(head_dim: u32) -> Option<PrefillTile> {
    match head_dim {
        64 | 128 => Some(PrefillTile { rows: 64, keys: 64 }),
        256 => Some(PrefillTile { rows: 32, keys: 32 }),
        _ => None,
    }
}

/// The tile of `attn_prefill_mma_d{64,128}` (`MMA_BQ` rows: 16 per warp, `MMA_BK` keys).
pub const MMA_TILE: PrefillTile = PrefillTile { rows: 64, keys: 64 };
/// Halfs of padding after each staged f16 row of the tensor-core kernel (`MMA_PADH`).
const MMA_PAD_HALFS: u64 = 8;
/// Head dims the tensor-core prefill kernel is instantiated for.
pub const MMA_HEAD_DIMS: [u32; 2] = [64, 128];
/// Compute capability `mma.sync` m16n8k16 on f16 needs.
pub const MMA_MIN_CAPABILITY: (u32, u32) = (8, 0);
/// The environment variable that forces a prefill kernel: `f32` or `mma` ([`parse_prefill`]).
pub const PREFILL_ENV: &str = "BRINK_ATTN_PREFILL";

/// The two prefill kernels (module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PrefillKernel {
    /// `attn_prefill_d{D}`: f32 FMA on CUDA cores; every head dim, every device.
    F32,
    /// `attn_prefill_mma_d{D}`: tensor cores, split f16 halves; [`MMA_HEAD_DIMS`] on devices of
    /// compute capability [`MMA_MIN_CAPABILITY`] and later.
    Mma,
}

impl PrefillKernel {
    pub fn kernel(self, head_dim: u32) -> String {
        match self {
            PrefillKernel::F32 => format!("attn_prefill_d{head_dim}"),
            PrefillKernel::Mma => format!("attn_prefill_mma_d{head_dim}"),
        }
    }

    /// Whether this kernel exists for `head_dim` on a device of compute capability `cc`.
    pub fn supports(self, head_dim: u32, cc: (u32, u32)) -> bool {
        match self {
            PrefillKernel::F32 => HEAD_DIMS.contains(&head_dim),
            PrefillKernel::Mma => MMA_HEAD_DIMS.contains(&head_dim) && cc >= MMA_MIN_CAPABILITY,
        }
    }

    /// Its tile: the rows are [`prefill_tile`]'s for every head dim it supports.
    pub fn tile(self, head_dim: u32) -> Option<PrefillTile> {
        match self {
            PrefillKernel::F32 => prefill_tile(head_dim),
            PrefillKernel::Mma => MMA_HEAD_DIMS.contains(&head_dim).then_some(MMA_TILE),
        }
    }

    /// Dynamic shared memory of one block: [`prefill_shared_bytes`] for the f32 kernel; for the
    /// tensor-core one a K and a V tile and Q's two f16 halves, f16 rows of `head_dim + 8`.
    pub fn shared_bytes(self, head_dim: u32) -> u64 {
        match (self, self.tile(head_dim)) {
            (PrefillKernel::F32, _) => prefill_shared_bytes(head_dim),
            (PrefillKernel::Mma, Some(t)) => 2 * (2 * t.keys + 2 * t.rows) * (head_dim as u64 + MMA_PAD_HALFS),
            (PrefillKernel::Mma, None) => 0,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            PrefillKernel::F32 => "f32",
            PrefillKernel::Mma => "mma",
        }
    }
}

/// [`PREFILL_ENV`]'s value as a forced kernel: unset or empty forces none; `f32` or `mma` (any
/// case, spaces trimmed) that kernel; anything else is refused, naming the variable.
pub fn parse_prefill(value: Option<&str>) -> Result<Option<PrefillKernel>, String> {
    match value.map(|v| v.trim().to_ascii_lowercase()).as_deref() {
        None | Some("") => Ok(None),
        Some("f32") => Ok(Some(PrefillKernel::F32)),
        Some("mma") => Ok(Some(PrefillKernel::Mma)),
        Some(other) => Err(format!("{PREFILL_ENV}={other:?}: expected f32 or mma")),
    }
}

/// The prefill kernel forced by [`PREFILL_ENV`], read once per process: the one place the
/// environment is consulted.
pub fn prefill_override() -> Result<Option<PrefillKernel>, String> {
    static FORCED: std::sync::OnceLock<Result<Option<PrefillKernel>, String>> = std::sync::OnceLock::new();
    FORCED.get_or_init(|| parse_prefill(std::env::var(PREFILL_ENV).ok().as_deref())).clone()
}

/// The prefill kernel for `head_dim` on a device of compute capability `cc`: the `forced` one
/// where it exists, else the tensor-core one where it exists (head dims 64 and 128, compute
/// capability 8.0+), else the f32 one. Pure. The tensor-core kernel measured +58% prefill at
/// 8192 tokens on an H100 against the f32 one (docs/perf-notes.md, entry 13).
pub fn select_prefill(head_dim: u32, cc: (u32, u32), forced: Option<PrefillKernel>) -> PrefillKernel {
    let want = forced.unwrap_or(PrefillKernel::Mma);
    if want.supports(head_dim, cc) { want } else { PrefillKernel::F32 }
}

fn decode_kernel(head_dim: u32) -> String {
    format!("attn_decode_d{head_dim}")
}

/// Dynamic shared memory of a prefill block: the Q tile and one K/V tile, f32, padded rows.
pub fn prefill_shared_bytes(head_dim: u32) -> u64 {
    prefill_tile(head_dim).map_or(0, |t| 4 * (t.rows + t.keys) * (head_dim as u64 + PAD))
}

/// Static shared memory of a block: `att_stage`'s (or, for the tensor-core prefill kernel,
/// `att_stage_kv_f16`'s: as many) block ids of the staged key rows (i32 each), beside the
/// dynamic bytes; a launch needs both within the device's limit.
pub fn static_shared_bytes(head_dim: u32, decode: bool) -> u64 {
    let rows = if decode { decode_tile_keys(head_dim) } else { prefill_tile(head_dim).map_or(0, |t| t.keys) };
    4 * rows
}

/// Dynamic shared memory of a decode block: Q of its heads, their span of scores, a K/V tile.
pub fn decode_shared_bytes(head_dim: u32) -> u64 {
    let d = head_dim as u64;
    let m = DECODE_MAX_HEADS as u64;
    4 * (m * d + m * DECODE_SPAN + decode_tile_keys(head_dim) * (d + PAD))
}

/// Keys the decode kernel stages at once (`KT`): a tile of [`DECODE_TILE_FLOATS`], at most a span.
fn decode_tile_keys(head_dim: u32) -> u64 {
    (DECODE_TILE_FLOATS / (head_dim as u64).max(1)).min(DECODE_SPAN)
}

/// One chunk of a batch: `n_tokens` rows from `first_row` at positions `start_pos..` of the
/// sequence whose block table starts at entry `table` of the batch's flat table (and holds at
/// least [`AttentionSpec::blocks_for`]`(end)` entries).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Chunk {
    pub table: u32,
    pub start_pos: u32,
    pub n_tokens: u32,
    pub first_row: u32,
}

impl Chunk {
    /// One past the last position the chunk writes and reads.
    pub fn end(&self) -> u64 {
        self.start_pos as u64 + self.n_tokens as u64
    }

    fn rows(&self) -> std::ops::Range<u64> {
        self.first_row as u64..self.first_row as u64 + self.n_tokens as u64
    }
}

/// How 1-token chunks (decode steps) run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DecodeRoute {
    /// Through the split-context decode kernels: many blocks per sequence.
    Split,
    /// Through the prefill kernel like every other chunk: one block per (sequence, head).
    Prefill,
}

/// The cache row of position `pos` of a sequence with block table `table`, or `None` when the
/// table does not reach `pos` (the kernels' `att_page_row`, and where kv_store writes).
pub fn physical_row(table: &[u32], pos: u32, spec: &AttentionSpec) -> Option<u64> {
    let shift = spec.block_shift();
    let block = *table.get((pos >> shift) as usize)?;
    Some(((block as u64) << shift) | (pos as u64 & (spec.block_size.max(1) as u64 - 1)))
}

/// Why chunk `c`'s block table (in the flat `tables`) cannot serve it, if it cannot: it must
/// list every block up to the chunk's end, each inside the cache.
fn table_unsupported(c: &Chunk, tables: &[u32], spec: &AttentionSpec) -> Option<String> {
    let need = spec.blocks_for(c.end());
    let (first, end) = (c.table as u64, c.table as u64 + need);
    if end > tables.len() as u64 {
        return Some(format!(
            "needs {need} block table entries from {first} for positions up to {} (blocks of {}), the batch's table has {}",
            c.end(),
            spec.block_size,
            tables.len()
        ));
    }
    let own = &tables[first as usize..end as usize];
    own.iter()
        .position(|&b| b >= spec.blocks)
        .map(|j| format!("block table entry {} is block {}, past the cache's {} blocks", first + j as u64, own[j], spec.blocks))
}

/// Why `chunks` and their flat block `tables` cannot be a batch of `rows` rows for `spec`, if
/// they cannot: every chunk non-empty, its positions inside i32 and covered by its block table,
/// every block it reads inside the cache, its rows inside Q, no two chunks sharing a row.
pub fn chunks_unsupported(chunks: &[Chunk], tables: &[u32], rows: u64, spec: &AttentionSpec) -> Option<String> {
    if chunks.is_empty() {
        return Some("a batch needs at least one chunk".into());
    }
    if rows > I32_MAX {
        return Some(format!("{rows} rows: row indices are i32"));
    }
    if chunks.len() as u64 > I32_MAX || tables.len() as u64 > I32_MAX {
        return Some(format!("{} chunks and {} block table entries: indices are i32", chunks.len(), tables.len()));
    }
    for (i, c) in chunks.iter().enumerate() {
        let what = if c.n_tokens == 0 {
            "has no tokens".to_string()
        } else if c.end() > I32_MAX {
            format!("positions {}..{} pass 2^31 − 1 (positions are i32)", c.start_pos, c.end())
        } else if let Some(why) = table_unsupported(c, tables, spec) {
            why
        } else if c.rows().end > rows {
            format!("rows {}..{} pass the batch's {rows} rows", c.first_row, c.rows().end)
        } else {
            continue;
        };
        return Some(format!("chunk {i} {what}"));
    }
    let mut by_row: Vec<&Chunk> = chunks.iter().collect();
    by_row.sort_by_key(|c| c.first_row);
    by_row
        .windows(2)
        .find(|w| w[0].rows().end > w[1].first_row as u64)
        .map(|w| format!("chunks at rows {}..{} and {}..{} overlap", w[0].first_row, w[0].rows().end, w[1].first_row, w[1].rows().end))
}

/// What a batch's launches depend on: rows, prefill tiles, decode chunks and their splits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BatchCounts {
    pub rows: u64,
    pub prefill_tiles: u64,
    pub decode_chunks: u64,
    pub decode_splits: u64,
}

impl BatchCounts {
    /// Floats of decode workspace: a partial o and (max, sum) per split and head.
    pub fn workspace_floats(&self, spec: &AttentionSpec) -> u64 {
        self.decode_splits * spec.heads as u64 * (spec.head_dim as u64 + 2)
    }
}

/// Splits of a decode step at `pos` without a window: it attends to `pos + 1` keys.
pub fn decode_splits(pos: u32) -> u64 {
    (pos as u64 + 1).div_ceil(DECODE_SPAN)
}

/// The first key a query at `pos` sees under `window` (0: none): `max(0, pos − window + 1)`
/// (llama.cpp masks key p when `pos − p >= window`).
pub fn first_key(pos: u32, window: u32) -> u32 {
    if window == 0 { 0 } else { (pos as u64 + 1).saturating_sub(window as u64) as u32 }
}

/// The decode spans a step at `pos` runs under `window` (0: none): from the span holding its
/// first key to the span holding `pos`. Each holds at least one key the step sees.
pub fn decode_spans(pos: u32, window: u32) -> std::ops::Range<u64> {
    first_key(pos, window) as u64 / DECODE_SPAN..pos as u64 / DECODE_SPAN + 1
}

/// Splits of a decode step at `pos` under `window`: [`decode_splits`] without one.
pub fn window_decode_splits(pos: u32, window: u32) -> u64 {
    let r = decode_spans(pos, window);
    r.end - r.start
}

/// The launches of one attention call, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttentionLaunches {
    pub prefill: Option<Launch>,
    /// The split kernel and the combine.
    pub decode: Option<(Launch, Launch)>,
}

impl AttentionLaunches {
    pub fn all(self) -> Vec<Launch> {
        let mut v: Vec<Launch> = self.prefill.into_iter().collect();
        if let Some((split, combine)) = self.decode {
            v.extend([split, combine]);
        }
        v
    }
}

/// Plans the launches for a batch with these counts: `prefill`'s kernel on grid (tiles, n_head)
/// with [`PrefillKernel::shared_bytes`] (a kernel the head dim has no instance of is refused);
/// decode grid (splits, n_head / heads per block) with
/// [`decode_shared_bytes`]; combine grid (decode chunks, n_head). 128 threads each.
pub fn launches(
    n: &BatchCounts,
    spec: &AttentionSpec,
    limits: &DeviceLimits,
    prefill: PrefillKernel,
) -> Result<AttentionLaunches, PlanError> {
    spec.check()?;
    let shape = format!(
        "rows={} tiles={} decode_chunks={} splits={} {}",
        n.rows,
        n.prefill_tiles,
        n.decode_chunks,
        n.decode_splits,
        spec.describe()
    );
    if n.rows == 0 || n.prefill_tiles + n.decode_chunks == 0 {
        return Err(unsupported("empty batch", shape));
    }
    if n.rows > I32_MAX || n.decode_splits > I32_MAX {
        return Err(unsupported("rows and decode splits are i32 indices: at most 2^31 − 1", shape));
    }
    let heads = spec.heads as u64;
    let block = [THREADS, 1, 1];
    if n.prefill_tiles > 0 && !prefill.supports(spec.head_dim, limits.compute_capability) {
        let what = format!(
            "prefill kernel {} on {} (compute capability {:?})",
            prefill.kernel(spec.head_dim),
            limits.name,
            limits.compute_capability
        );
        return Err(unsupported(what, shape));
    }
    let prefill = (n.prefill_tiles > 0)
        .then(|| {
            Launch::checked(
                &prefill.kernel(spec.head_dim),
                &shape,
                [n.prefill_tiles, heads, 1],
                block,
                prefill.shared_bytes(spec.head_dim),
                vec![Cover::Tiles { axis: 0, items: n.prefill_tiles, per_block: 1 }, Cover::Tiles { axis: 1, items: heads, per_block: 1 }],
                limits,
            )
        })
        .transpose()?;
    let decode = (n.decode_chunks > 0)
        .then(|| -> Result<(Launch, Launch), PlanError> {
            let hb = spec.decode_heads_for(n.decode_splits, limits.sm_count) as u64;
            let split = Launch::checked(
                &decode_kernel(spec.head_dim),
                &shape,
                [n.decode_splits, heads / hb, 1],
                block,
                decode_shared_bytes(spec.head_dim),
                vec![Cover::Tiles { axis: 0, items: n.decode_splits, per_block: 1 }, Cover::Tiles { axis: 1, items: heads, per_block: hb }],
                limits,
            )?;
            let combine = Launch::checked(
                COMBINE_KERNEL,
                &shape,
                [n.decode_chunks, heads, 1],
                block,
                0,
                vec![Cover::Tiles { axis: 0, items: n.decode_chunks, per_block: 1 }, Cover::Tiles { axis: 1, items: heads, per_block: 1 }],
                limits,
            )?;
            Ok((split, combine))
        })
        .transpose()?;
    Ok(AttentionLaunches { prefill, decode })
}

/// A batch split between the kernels, with the index arrays they read: the flat block tables;
/// prefill chunks and their tiles `(chunk, first query)`; decode chunks, their splits `(chunk,
/// split)` and each chunk's first split (`offsets`, one more than chunks). Pure; [`DeviceBatch`]
/// uploads it. It keeps the spec its chunks and tables were checked against: launches use that
/// one, never another cache's. Its prefill kernel is chosen at launch ([`Self::prefill_kernel`]):
/// the tile map is the same for both.
#[derive(Clone, Debug, PartialEq)]
pub struct BatchPlan {
    spec: AttentionSpec,
    /// A prefill kernel forced on this plan (the self-test's), else `None`: the engine's choice.
    forced: Option<PrefillKernel>,
    rows: u64,
    tables: Vec<u32>,
    prefill: Vec<Chunk>,
    tiles: Vec<[i32; 2]>,
    decode: Vec<Chunk>,
    work: Vec<[i32; 2]>,
    offsets: Vec<i32>,
}

impl BatchPlan {
    /// Validates `chunks` and their flat block `tables` against `spec` and a Q of `rows` rows, and
    /// routes each chunk: 1-token chunks to the decode kernels under [`DecodeRoute::Split`],
    /// everything else to prefill.
    pub fn new(chunks: &[Chunk], tables: &[u32], rows: u64, spec: &AttentionSpec, route: DecodeRoute) -> Result<BatchPlan, PlanError> {
        spec.check()?;
        if let Some(what) = chunks_unsupported(chunks, tables, rows, spec) {
            let shape = format!("rows={rows} chunks={} table_entries={} {}", chunks.len(), tables.len(), spec.describe());
            return Err(unsupported(what, shape));
        }
        let tile = prefill_tile(spec.head_dim).map_or(1, |t| t.rows);
        let mut p = BatchPlan {
            spec: *spec,
            forced: None,
            rows,
            tables: tables.to_vec(),
            prefill: vec![],
            tiles: vec![],
            decode: vec![],
            work: vec![],
            offsets: vec![0],
        };
        for c in chunks {
            if c.n_tokens == 1 && route == DecodeRoute::Split {
                let idx = p.decode.len() as i32;
                p.decode.push(*c);
                p.work.extend(decode_spans(c.start_pos, spec.window).map(|s| [idx, s as i32]));
                if p.work.len() as u64 > I32_MAX {
                    return Err(unsupported("more than 2^31 − 1 decode splits", spec.describe()));
                }
                p.offsets.push(p.work.len() as i32);
            } else {
                let idx = p.prefill.len() as i32;
                p.prefill.push(*c);
                p.tiles.extend((0..c.n_tokens as u64).step_by(tile as usize).map(|q0| [idx, q0 as i32]));
            }
        }
        Ok(p)
    }

    /// Pads the decode work list with idle entries (`[-1, -1]`, which the split kernel skips
    /// before any barrier) to `splits`: a captured graph keeps one grid while the contexts grow
    /// within its bucket. Refuses fewer splits than the batch has.
    pub fn pad_decode_splits(&mut self, splits: u64) -> Result<(), PlanError> {
        let have = self.work.len() as u64;
        if self.decode.is_empty() || splits < have || splits > I32_MAX {
            let what = format!("cannot pad {have} decode splits of {} chunks to {splits}", self.decode.len());
            return Err(unsupported(what, self.spec.describe()));
        }
        self.work.resize(splits as usize, [-1, -1]);
        Ok(())
    }

    /// Decode splits that do work (the padding aside).
    pub fn busy_decode_splits(&self) -> u64 {
        self.offsets.last().copied().unwrap_or(0) as u64
    }

    pub fn counts(&self) -> BatchCounts {
        BatchCounts {
            rows: self.rows,
            prefill_tiles: self.tiles.len() as u64,
            decode_chunks: self.decode.len() as u64,
            decode_splits: self.work.len() as u64,
        }
    }

    pub fn spec(&self) -> &AttentionSpec {
        &self.spec
    }

    /// This plan with `kernel` forced for its prefill chunks (`None`: the engine's choice).
    pub fn with_prefill(self, kernel: Option<PrefillKernel>) -> BatchPlan {
        BatchPlan { forced: kernel, ..self }
    }

    /// The prefill kernel this plan runs on `limits`' device: the one forced on the plan, else
    /// the one [`PREFILL_ENV`] forces ([`prefill_override`]; a bad value is a typed error), through
    /// [`select_prefill`] (a forced kernel the device or head dim lacks gives way to f32).
    pub fn prefill_kernel(&self, limits: &DeviceLimits) -> Result<PrefillKernel, PlanError> {
        let forced = match self.forced {
            Some(k) => Some(k),
            None => prefill_override().map_err(|what| unsupported(what, self.spec.describe()))?,
        };
        Ok(select_prefill(self.spec.head_dim, limits.compute_capability, forced))
    }

    pub fn launches(&self, limits: &DeviceLimits) -> Result<AttentionLaunches, PlanError> {
        launches(&self.counts(), &self.spec, limits, self.prefill_kernel(limits)?)
    }

    /// Floats the decode workspace must hold for this batch.
    pub fn workspace_floats(&self) -> u64 {
        self.counts().workspace_floats(&self.spec)
    }
}

fn flat_chunks(chunks: &[Chunk]) -> Vec<i32> {
    chunks.iter().flat_map(|c| [c.table as i32, c.start_pos as i32, c.n_tokens as i32, c.first_row as i32]).collect()
}

/// A [`BatchPlan`] on the device: made once per batch, used by every layer.
pub struct DeviceBatch {
    plan: BatchPlan,
    tables: CudaSlice<i32>,
    prefill: CudaSlice<i32>,
    tiles: CudaSlice<i32>,
    decode: CudaSlice<i32>,
    work: CudaSlice<i32>,
    offsets: CudaSlice<i32>,
}

impl DeviceBatch {
    pub fn upload(gpu: &Gpu, plan: BatchPlan) -> Result<DeviceBatch, GpuError> {
        let a = plan_arrays(&plan);
        Ok(DeviceBatch {
            tables: gpu.upload(&a.tables)?,
            prefill: gpu.upload(&a.prefill)?,
            tiles: gpu.upload(&a.tiles)?,
            decode: gpu.upload(&a.decode)?,
            work: gpu.upload(&a.work)?,
            offsets: gpu.upload(&a.offsets)?,
            plan,
        })
    }

    pub fn plan(&self) -> &BatchPlan {
        &self.plan
    }

    /// As [`DeviceBatch::upload`], with room in every index array for `room` times its length
    /// (plus a little), so that later batches of the same counts can be written in place
    /// ([`DeviceBatch::rewrite`]): the buffers a captured graph reads keep their addresses.
    pub fn upload_with_room(gpu: &Gpu, plan: BatchPlan, room: usize) -> Result<DeviceBatch, GpuError> {
        let up = |v: Vec<i32>| -> Result<CudaSlice<i32>, GpuError> {
            let mut buf = gpu.alloc::<i32>(v.len() * room.max(1) + 64)?;
            gpu.write(&v, &mut buf)?;
            Ok(buf)
        };
        let a = plan_arrays(&plan);
        Ok(DeviceBatch {
            tables: up(a.tables)?,
            prefill: up(a.prefill)?,
            tiles: up(a.tiles)?,
            decode: up(a.decode)?,
            work: up(a.work)?,
            offsets: up(a.offsets)?,
            plan,
        })
    }

    /// Writes `plan` into these buffers when its launch counts equal the current plan's and
    /// every array fits; returns false (nothing written) otherwise.
    pub fn rewrite(&mut self, gpu: &Gpu, plan: BatchPlan) -> Result<bool, GpuError> {
        let a = plan_arrays(&plan);
        let fits = [
            (a.tables.len(), self.tables.len()),
            (a.prefill.len(), self.prefill.len()),
            (a.tiles.len(), self.tiles.len()),
            (a.decode.len(), self.decode.len()),
            (a.work.len(), self.work.len()),
            (a.offsets.len(), self.offsets.len()),
        ]
        .iter()
        .all(|(need, have)| need <= have);
        if !fits || plan.counts() != self.plan.counts() || plan.spec != self.plan.spec {
            return Ok(false);
        }
        gpu.write(&a.tables, &mut self.tables)?;
        gpu.write(&a.prefill, &mut self.prefill)?;
        gpu.write(&a.tiles, &mut self.tiles)?;
        gpu.write(&a.decode, &mut self.decode)?;
        gpu.write(&a.work, &mut self.work)?;
        gpu.write(&a.offsets, &mut self.offsets)?;
        self.plan = plan;
        Ok(true)
    }
}

/// A plan's index arrays as the kernels read them (an empty list still gets a never-read word:
/// the device has no zero-sized buffers).
struct PlanArrays {
    tables: Vec<i32>,
    prefill: Vec<i32>,
    tiles: Vec<i32>,
    decode: Vec<i32>,
    work: Vec<i32>,
    offsets: Vec<i32>,
}

fn plan_arrays(plan: &BatchPlan) -> PlanArrays {
    let nonempty = |v: Vec<i32>| if v.is_empty() { vec![0] } else { v };
    PlanArrays {
        // Block ids are below the spec's blocks (< 2^31): checked by the plan.
        tables: nonempty(plan.tables.iter().map(|&b| b as i32).collect()),
        prefill: nonempty(flat_chunks(&plan.prefill)),
        tiles: nonempty(plan.tiles.iter().flatten().copied().collect()),
        decode: nonempty(flat_chunks(&plan.decode)),
        work: nonempty(plan.work.iter().flatten().copied().collect()),
        offsets: nonempty(plan.offsets.clone()),
    }
}

/// The buffers of one attention call.
pub struct AttentionIo<'a, Y> {
    /// `[rows, n_head, head_dim]` f32.
    pub q: CudaView<'a, f32>,
    /// `[blocks, block_size, n_kv, head_dim]` f16 bits, holding every position the chunks read.
    pub k_cache: CudaView<'a, u16>,
    pub v_cache: CudaView<'a, u16>,
    /// `[rows, n_head, head_dim]` f32 (any element type: the kernels write f32 words). Rows no
    /// chunk covers are left as they are.
    pub out: CudaViewMut<'a, Y>,
    /// Decode partials: at least [`BatchPlan::workspace_floats`] floats (any size without decode chunks).
    pub workspace: CudaViewMut<'a, f32>,
    /// Per-head sinks, `[n_head]` f32 logits in the units of `scale · q·k` (gpt-oss's
    /// `attn_sinks`), or `None` for a softmax over the keys alone.
    pub sinks: Option<CudaView<'a, f32>>,
}

/// Refuses a buffer the kernels' 16-byte loads and stores cannot use.
fn require_aligned(p: &Launch, buffers: &[(&str, u64)]) -> Result<(), PlanError> {
    match buffers.iter().find(|(_, addr)| addr % 16 != 0) {
        Some((name, addr)) => Err(PlanError::Unsupported {
            kernel: p.kernel.clone(),
            what: format!("buffer {name} at {addr:#x} is not 16-byte aligned"),
            shape: p.shape.clone(),
        }),
        None => Ok(()),
    }
}

/// Attention for `batch`: the prefill kernel over its prefill chunks, the split kernel and the
/// combine over its decode chunks. The chunks' own K/V must be in the cache already.
pub fn launch<Y: DeviceRepr>(gpu: &Gpu, batch: &DeviceBatch, mut io: AttentionIo<'_, Y>) -> Result<(), GpuError> {
    let (plan, spec) = (&batch.plan, &batch.plan.spec);
    let l = plan.launches(gpu.limits())?;
    let Some(first) = l.prefill.as_ref().or(l.decode.as_ref().map(|d| &d.0)) else {
        return Err(unsupported("empty batch", spec.describe()).into());
    };
    let rows_bytes = 4 * plan.rows * spec.row_width();
    let ws_floats = plan.workspace_floats();
    require_bytes(
        first,
        &[
            ("q", bytes_of(io.q.len(), 4), rows_bytes),
            ("out", bytes_of(io.out.len(), size_of::<Y>()), rows_bytes),
            ("k_cache", bytes_of(io.k_cache.len(), 2), 2 * spec.cache_elems()),
            ("v_cache", bytes_of(io.v_cache.len(), 2), 2 * spec.cache_elems()),
            ("workspace", bytes_of(io.workspace.len(), 4), 4 * ws_floats),
            ("sinks", io.sinks.as_ref().map_or(4 * spec.heads as u64, |s| bytes_of(s.len(), 4)), 4 * spec.heads as u64),
        ],
    )?;
    let stream = gpu.stream();
    let (q, _q) = io.q.device_ptr(stream);
    let (k, _k) = io.k_cache.device_ptr(stream);
    let (v, _v) = io.v_cache.device_ptr(stream);
    let (out, _o) = io.out.device_ptr_mut(stream);
    let (ws, _w) = io.workspace.device_ptr_mut(stream);
    // A null pointer without sinks: the kernels test it.
    let sinks_view = io.sinks.as_ref().map(|s| s.device_ptr(stream));
    let sinks: u64 = sinks_view.as_ref().map_or(0, |(p, _)| *p);
    require_aligned(first, &[("q", q), ("k_cache", k), ("v_cache", v), ("out", out)])?;
    let (n_head, n_kv, shift, d) = (spec.heads as i32, spec.kv_heads as i32, spec.block_shift() as i32, spec.head_dim as i32);
    let (qscale, window) = (spec.q_scale(), spec.window as i32);
    if let Some(p) = &l.prefill {
        let f = gpu.function(&ATTENTION, &p.kernel)?;
        gpu.launch(p, &f, |b| {
            b.arg(&q).arg(&k).arg(&v).arg(&out).arg(&batch.prefill).arg(&batch.tiles).arg(&batch.tables);
            b.arg(&n_head).arg(&n_kv).arg(&shift).arg(&qscale).arg(&window).arg(&sinks);
        })?;
    }
    if let Some((split, combine)) = &l.decode {
        // The workspace: partial o of every (split, head), then their (max, sum) pairs.
        let part_ml = ws + 4 * plan.counts().decode_splits * spec.row_width();
        // The heads per block the plan chose (grid.y = heads / hb).
        let hb = (spec.heads / split.grid[1]) as i32;
        let f = gpu.function(&ATTENTION, &split.kernel)?;
        gpu.launch(split, &f, |b| {
            b.arg(&q).arg(&k).arg(&v).arg(&ws).arg(&part_ml).arg(&batch.decode).arg(&batch.work).arg(&batch.tables);
            b.arg(&n_head).arg(&n_kv).arg(&shift).arg(&hb).arg(&qscale).arg(&window);
        })?;
        let f = gpu.function(&ATTENTION, COMBINE_KERNEL)?;
        gpu.launch(combine, &f, |b| {
            b.arg(&ws).arg(&part_ml).arg(&batch.decode).arg(&batch.offsets).arg(&out).arg(&n_head).arg(&d).arg(&sinks);
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 8 sequences of 40,960 positions in blocks of 16.
    const QWEN: AttentionSpec =
        AttentionSpec { heads: 32, kv_heads: 4, head_dim: 128, blocks: 8 * 2560, block_size: 16, scale: 0.088_388_35, window: 0 };
    const QWEN_SLOT_BLOCKS: u32 = 2560;

    /// A cache of `slots` sequences of `ctx` positions (a multiple of 16) in blocks of 16.
    fn paged(heads: u32, kv: u32, d: u32, slots: u32, ctx: u32) -> AttentionSpec {
        AttentionSpec::new(heads, kv, d, slots * ctx / 16, 16)
    }

    /// Every block, handed out in reverse: sequence s's table starts at entry `s · blocks/slots`.
    fn reversed(spec: &AttentionSpec) -> Vec<u32> {
        (0..spec.blocks).rev().collect()
    }

    fn chunk(slot: u32, start_pos: u32, n_tokens: u32, first_row: u32) -> Chunk {
        Chunk { table: slot * QWEN_SLOT_BLOCKS, start_pos, n_tokens, first_row }
    }

    fn chunk_in(table: u32, start_pos: u32, n_tokens: u32, first_row: u32) -> Chunk {
        Chunk { table, start_pos, n_tokens, first_row }
    }

    #[test]
    fn prefill_plan_geometry_for_every_head_dim() {
        use PrefillKernel::{F32, Mma};
        // f32: Q and a K/V tile, f32 rows of d + 4; mma: K, V and Q's two halves, f16 rows of d + 8.
        let geometry = [
            (F32, 64, 64, 4 * 128 * 68),
            (F32, 128, 64, 4 * 128 * 132),
            (F32, 256, 32, 4 * 64 * 260),
            (Mma, 64, 64, 2 * 256 * 72),
            (Mma, 128, 64, 2 * 256 * 136),
        ];
        for limits in DeviceLimits::recorded() {
            for (kernel, d, rows_per_tile, smem) in geometry {
                let spec = paged(16, 4, d, 2, 4096);
                let chunks = [chunk_in(0, 0, 100, 0), chunk_in(256, 37, 1, 100), chunk_in(256, 38, 5, 101)];
                let plan = BatchPlan::new(&chunks, &reversed(&spec), 106, &spec, DecodeRoute::Prefill).unwrap().with_prefill(Some(kernel));
                let tiles = 100u64.div_ceil(rows_per_tile) + 2;
                assert_eq!(plan.tiles.len() as u64, tiles);
                assert_eq!(kernel.tile(d).unwrap().rows, rows_per_tile);
                let l = plan.launches(&limits).unwrap();
                let p = l.prefill.as_ref().unwrap();
                assert_eq!(
                    (p.kernel.as_str(), p.grid, p.block, p.shared_mem),
                    (&*kernel.kernel(d), [tiles as u32, 16, 1], [128, 1, 1], smem)
                );
                assert_eq!(p.shared_mem as u64, kernel.shared_bytes(d));
                assert!(p.shared_mem as u64 + static_shared_bytes(d, false) <= limits.max_shared_mem_per_block_optin as u64, "{p}");
                p.check_cover().unwrap();
                assert!(l.decode.is_none());
            }
        }
        // The tile map: (chunk, first query), chunk by chunk.
        let spec = paged(8, 8, 128, 2, 400);
        let plan =
            BatchPlan::new(&[chunk_in(0, 0, 130, 0), chunk_in(25, 200, 2, 130)], &reversed(&spec), 132, &spec, DecodeRoute::Split).unwrap();
        assert_eq!(plan.tiles, vec![[0, 0], [0, 64], [0, 128], [1, 0]]);
    }

    #[test]
    fn decode_plan_splits_each_context_into_spans() {
        let spec = QWEN;
        // Positions 0, 63, 64 and 40,959: 1, 1, 2 and 640 spans of 64 keys.
        let chunks = [chunk(0, 0, 1, 0), chunk(1, 63, 1, 1), chunk(2, 64, 1, 2), chunk(3, 40_959, 1, 3)];
        let plan = BatchPlan::new(&chunks, &reversed(&spec), 4, &spec, DecodeRoute::Split).unwrap();
        assert_eq!(plan.offsets, vec![0, 1, 2, 4, 644]);
        assert_eq!(plan.work[2..4], [[2, 0], [2, 1]]);
        assert_eq!(plan.work[643], [3, 639]);
        assert_eq!(plan.workspace_floats(), 644 * 32 * 130);
        for limits in DeviceLimits::recorded() {
            let l = plan.launches(&limits).unwrap();
            assert!(l.prefill.is_none());
            let (split, combine) = l.decode.unwrap();
            // 8 heads per block share kv head h / 8: grid.y = 32 / 8.
            assert_eq!(
                (split.kernel.as_str(), split.grid, split.shared_mem),
                ("attn_decode_d128", [644, 4, 1], 4 * (1024 + 512 + 64 * 132))
            );
            assert_eq!((combine.grid, combine.shared_mem), ([4, 32, 1], 0));
            assert!(split.shared_mem <= limits.max_shared_mem_per_block, "decode fits without opting in: {split}");
            split.check_cover().unwrap();
            combine.check_cover().unwrap();
        }
    }

    /// llama.cpp's `is_masked_swa` (STANDARD): key p is masked for the query at q when
    /// `q − p >= window`, so the first key seen is `q − window + 1`.
    #[test]
    fn windowed_decode_plans_list_only_the_spans_in_the_window() {
        assert_eq!([0, 126, 127, 128, 190, 191, 255].map(|p| first_key(p, 128)), [0, 0, 0, 1, 63, 64, 128]);
        assert_eq!([5, u32::MAX >> 1].map(|p| first_key(p, 0)), [0, 0]);
        assert_eq!(first_key(40_959, 1), 40_959);
        // Positions 127 (keys 0..=127: spans 0, 1), 190 (63..=190: spans 0..=2, span 0 holds one
        // key), 191 (64..=191: spans 1, 2), 40,959 (40,832..=40,959: spans 638, 639).
        for (pos, spans) in [(127u32, 0..2u64), (190, 0..3), (191, 1..3), (40_959, 638..640)] {
            assert_eq!(decode_spans(pos, 128), spans, "{pos}");
            assert_eq!(window_decode_splits(pos, 128), spans.end - spans.start);
            // Every span holds a key the step sees.
            for s in spans {
                let (k0, k1) = (s * DECODE_SPAN, s * DECODE_SPAN + DECODE_SPAN - 1);
                assert!(k0 <= pos as u64 && k1 >= first_key(pos, 128) as u64, "{pos} span {s}");
            }
        }
        assert_eq!(
            (0..=40_959).map(|p| window_decode_splits(p, 0)).collect::<Vec<_>>(),
            (0..=40_959).map(decode_splits).collect::<Vec<_>>()
        );
        let spec = QWEN.with_window(128);
        let chunks = [chunk(0, 0, 1, 0), chunk(1, 190, 1, 1), chunk(2, 40_959, 1, 2)];
        let plan = BatchPlan::new(&chunks, &reversed(&spec), 3, &spec, DecodeRoute::Split).unwrap();
        assert_eq!(plan.offsets, vec![0, 1, 4, 6]);
        assert_eq!(plan.work, vec![[0, 0], [1, 0], [1, 1], [1, 2], [2, 638], [2, 639]]);
        assert_eq!(plan.workspace_floats(), 6 * 32 * 130);
        assert!(spec.describe().ends_with(" window=128") && !QWEN.describe().contains("window"));
        // Another window is another plan: a device batch is not rewritten across them.
        let plain = BatchPlan::new(&chunks, &reversed(&QWEN), 3, &QWEN, DecodeRoute::Split).unwrap();
        assert_eq!(plain.busy_decode_splits(), 1 + 3 + 640);
        assert!(AttentionSpec { window: 1 << 31, ..QWEN }.unsupported().is_some());
    }

    #[test]
    fn padded_decode_plans_keep_their_work_and_idle_the_rest() {
        let spec = QWEN;
        let chunks = [chunk(0, 63, 1, 0), chunk(1, 64, 1, 1)];
        let mut plan = BatchPlan::new(&chunks, &reversed(&spec), 2, &spec, DecodeRoute::Split).unwrap();
        let busy = plan.clone();
        assert_eq!(plan.busy_decode_splits(), 3);
        plan.pad_decode_splits(8).unwrap();
        assert_eq!(plan.work[..3], busy.work[..]);
        assert!(plan.work[3..].iter().all(|w| *w == [-1, -1]), "idle entries name no chunk");
        assert_eq!((plan.offsets.clone(), plan.busy_decode_splits()), (busy.offsets.clone(), 3));
        assert_eq!(plan.counts().decode_splits, 8);
        assert_eq!(plan.workspace_floats(), 8 * 32 * 130);
        let (split, combine) = plan.launches(&DeviceLimits::h200()).unwrap().decode.unwrap();
        // 8 spans on 132 SMs: a head a block (decode_heads_for).
        assert_eq!((split.grid, combine.grid), ([8, 32, 1], [2, 32, 1]));
        // Never fewer than the batch has, never for a batch without decode chunks.
        assert!(plan.clone().pad_decode_splits(2).is_err());
        let mut prefill = BatchPlan::new(&[chunk(0, 0, 5, 0)], &reversed(&spec), 5, &spec, DecodeRoute::Split).unwrap();
        assert!(prefill.pad_decode_splits(8).is_err());
    }

    #[test]
    fn short_contexts_spread_heads_over_more_decode_blocks() {
        let spec = QWEN;
        // 3 spans (129 keys): 8 heads a block would be 12 blocks.
        for (limits, hb) in [(DeviceLimits::h200(), 1), (DeviceLimits::gb10(), 2)] {
            assert_eq!(spec.decode_heads_for(3, limits.sm_count), hb, "{}", limits.name);
            let chunks = [chunk(0, 128, 1, 0)];
            let plan = BatchPlan::new(&chunks, &reversed(&spec), 1, &spec, DecodeRoute::Split).unwrap();
            let (split, _) = plan.launches(&limits).unwrap().decode.unwrap();
            assert_eq!(split.grid, [3, 32 / hb, 1], "{}", limits.name);
            split.check_cover().unwrap();
        }
        // Enough spans for every SM: the whole group shares each K/V tile.
        assert_eq!(spec.decode_heads_for(33, 132), 8);
        assert_eq!(spec.decode_heads_for(32, 132), 4);
        assert_eq!(spec.decode_heads_for(12, 48), 8);
        // Always a divisor of the group.
        let odd = AttentionSpec::new(12, 2, 128, 1, 16);
        for splits in 1..64 {
            let hb = odd.decode_heads_for(splits, 132);
            assert!(odd.group().is_multiple_of(hb), "{splits}: {hb}");
        }
    }

    #[test]
    fn decode_heads_per_block_divide_the_group() {
        for (heads, kv, want) in [(32, 4, 8), (32, 32, 1), (64, 4, 8), (12, 1, 6), (6, 2, 3), (40, 4, 5), (7, 1, 7), (22, 1, 2)] {
            let s = AttentionSpec::new(heads, kv, 128, 1, 16);
            assert_eq!(s.decode_heads_per_block(), want, "{heads}/{kv}");
            assert!(s.group().is_multiple_of(want));
        }
    }

    #[test]
    fn mixed_batches_split_between_the_kernels() {
        let chunks = [chunk(0, 0, 70, 0), chunk(1, 500, 1, 70), chunk(2, 4133, 3, 71)];
        let tables = reversed(&QWEN);
        let plan = BatchPlan::new(&chunks, &tables, 74, &QWEN, DecodeRoute::Split).unwrap();
        // The decode row at position 500 sees 501 keys: 8 spans of 64.
        assert_eq!(plan.counts(), BatchCounts { rows: 74, prefill_tiles: 3, decode_chunks: 1, decode_splits: 8 });
        assert_eq!(plan.launches(&DeviceLimits::gb10()).unwrap().all().len(), 3);
        let all_prefill = BatchPlan::new(&chunks, &tables, 74, &QWEN, DecodeRoute::Prefill).unwrap();
        assert_eq!(all_prefill.counts(), BatchCounts { rows: 74, prefill_tiles: 4, decode_chunks: 0, decode_splits: 0 });
    }

    #[test]
    fn bad_specs_and_chunks_are_typed_errors() {
        let bad_specs = [
            AttentionSpec { head_dim: 96, ..QWEN },
            AttentionSpec { head_dim: 0, ..QWEN },
            AttentionSpec { kv_heads: 5, ..QWEN },
            AttentionSpec { kv_heads: 0, ..QWEN },
            AttentionSpec { heads: 0, ..QWEN },
            AttentionSpec { blocks: 0, ..QWEN },
            AttentionSpec { block_size: 0, ..QWEN },
            AttentionSpec { block_size: 24, ..QWEN },
            AttentionSpec { block_size: 1 << 31, ..QWEN },
            AttentionSpec { scale: f32::NAN, ..QWEN },
            AttentionSpec { scale: 0.0, ..QWEN },
            AttentionSpec { heads: 1 << 24, kv_heads: 1, ..QWEN },
            AttentionSpec { blocks: i32::MAX as u32, block_size: 1 << 30, kv_heads: 1 << 20, heads: 1 << 20, head_dim: 64, ..QWEN },
        ];
        let ok = [chunk(0, 0, 4, 0)];
        let tables = reversed(&QWEN);
        for s in bad_specs {
            assert!(matches!(BatchPlan::new(&ok, &tables, 4, &s, DecodeRoute::Split), Err(PlanError::Unsupported { .. })), "{s:?}");
        }
        let bad_chunks: [(&[Chunk], u64, &str); 8] = [
            (&[], 4, "at least one chunk"),
            (&[chunk(0, 0, 0, 0)], 4, "no tokens"),
            (&[chunk(8, 0, 4, 0)], 4, "needs 1 block table entries from 20480"),
            (&[chunk(7, 40_957, 4, 0)], 4, "needs 2561 block table entries from 17920 for positions up to 40961"),
            (&[chunk(0, 0, 4, 1)], 4, "rows 1..5"),
            (&[chunk(0, 0, 3, 0), chunk(1, 0, 2, 2)], 4, "overlap"),
            (&[chunk(0, 0, 4, 0)], 1 << 31, "row indices"),
            (&[chunk(0, u32::MAX - 3, 2, 0)], 4, "pass 2^31"),
        ];
        for (chunks, rows, why) in bad_chunks {
            let e = BatchPlan::new(chunks, &tables, rows, &QWEN, DecodeRoute::Split).unwrap_err();
            assert!(matches!(e, PlanError::Unsupported { .. }) && e.to_string().contains(why), "{chunks:?}: {e}");
        }
        // An entry past the cache is refused when a chunk reads it, named with its index.
        let mut bad = tables.clone();
        bad[2560 + 2] = QWEN.blocks;
        let e = BatchPlan::new(&[chunk(1, 40, 9, 0)], &bad, 9, &QWEN, DecodeRoute::Split).unwrap_err().to_string();
        assert!(e.contains("entry 2562 is block 20480, past the cache's 20480 blocks"), "{e}");
        assert!(BatchPlan::new(&[chunk(1, 0, 32, 0)], &bad, 32, &QWEN, DecodeRoute::Split).is_ok(), "entries past the end are not read");
        // The end of a chunk on a block boundary needs exactly end / 16 entries.
        let short: Vec<u32> = tables[..3].to_vec();
        assert!(BatchPlan::new(&[chunk_in(0, 40, 8, 0)], &short, 8, &QWEN, DecodeRoute::Split).is_ok());
        assert!(BatchPlan::new(&[chunk_in(0, 40, 9, 0)], &short, 9, &QWEN, DecodeRoute::Split).is_err());
        assert!(BatchPlan::new(&[chunk(0, 40_956, 4, 0), chunk(7, 0, 1, 4)], &tables, 5, &QWEN, DecodeRoute::Split).is_ok());
    }

    #[test]
    fn physical_rows_go_through_the_table() {
        let spec = AttentionSpec::new(2, 1, 64, 8, 4);
        let table = [5, 0, 7];
        let rows: Vec<Option<u64>> = [0, 3, 4, 5, 11, 12].iter().map(|&p| physical_row(&table, p, &spec)).collect();
        assert_eq!(rows, vec![Some(20), Some(23), Some(0), Some(1), Some(31), None]);
        assert_eq!(spec.block_shift(), 2);
        assert_eq!((spec.blocks_for(8), spec.blocks_for(9)), (2, 3));
    }

    #[test]
    fn heads_past_grid_y_are_refused() {
        // Heads go on grid.y (65,535): one more is a typed grid error, not a launch failure.
        let wide = AttentionSpec::new(65_536, 1, 64, 1, 16);
        let plan = BatchPlan::new(&[chunk(0, 0, 2, 0)], &[0], 2, &wide, DecodeRoute::Split).unwrap();
        assert!(matches!(plan.launches(&DeviceLimits::h200()), Err(PlanError::GridDim { axis: 'y', .. })));
        let fits = AttentionSpec::new(65_535, 1, 64, 1, 16);
        let plan = BatchPlan::new(&[chunk(0, 0, 2, 0)], &[0], 2, &fits, DecodeRoute::Split).unwrap();
        assert!(plan.launches(&DeviceLimits::h200()).is_ok());
    }

    #[test]
    fn prefill_shared_memory_needs_opt_in_but_fits_gb10() {
        let gb10 = DeviceLimits::gb10();
        for d in HEAD_DIMS {
            // The block-id array of the staged keys comes on top of the dynamic bytes.
            let (prefill, decode) =
                (prefill_shared_bytes(d) + static_shared_bytes(d, false), decode_shared_bytes(d) + static_shared_bytes(d, true));
            for limits in DeviceLimits::recorded() {
                assert!(prefill <= limits.max_shared_mem_per_block_optin as u64, "d={d} {}", limits.name);
                assert!(decode <= limits.max_shared_mem_per_block as u64, "d={d} {}", limits.name);
            }
        }
        assert_eq!((static_shared_bytes(128, false), static_shared_bytes(64, true), static_shared_bytes(256, true)), (256, 256, 128));
        assert!(prefill_shared_bytes(128) > gb10.max_shared_mem_per_block as u64);
        // The tensor-core kernel: 36 KiB at d = 64, 68 KiB at d = 128 (blk[] as the f32 kernel's).
        for d in MMA_HEAD_DIMS {
            let mma = PrefillKernel::Mma.shared_bytes(d) + 4 * MMA_TILE.keys;
            assert_eq!(4 * MMA_TILE.keys, static_shared_bytes(d, false));
            for limits in DeviceLimits::recorded() {
                assert!(mma <= limits.max_shared_mem_per_block_optin as u64, "d={d} {}", limits.name);
            }
        }
        assert_eq!((PrefillKernel::Mma.shared_bytes(64), PrefillKernel::Mma.shared_bytes(128)), (36_864, 69_632));
    }

    /// The selection table: the tensor-core kernel where it exists (head dims 64 and 128 on a
    /// device that runs mma.sync m16n8k16, 8.0+) unless f32 is forced; f32 everywhere else.
    #[test]
    fn prefill_selection_table() {
        use PrefillKernel::{F32, Mma};
        let (turing, ampere, h200, gb10) = ((7, 5), (8, 0), (9, 0), (12, 1));
        type Row = (u32, (u32, u32), Option<PrefillKernel>, PrefillKernel);
        let table: [Row; 18] = [
            (128, h200, None, Mma),
            (64, h200, None, Mma),
            (256, h200, None, F32),
            (128, gb10, None, Mma),
            (64, gb10, None, Mma),
            (256, gb10, None, F32),
            (128, ampere, None, Mma),
            (128, ampere, Some(Mma), Mma),
            (64, gb10, Some(Mma), Mma),
            (128, turing, None, F32),
            (64, turing, None, F32),
            (128, h200, Some(F32), F32),
            (64, gb10, Some(F32), F32),
            (128, h200, Some(Mma), Mma),
            (256, h200, Some(Mma), F32),
            (128, turing, Some(Mma), F32),
            (256, turing, Some(F32), F32),
            (96, h200, None, F32),
        ];
        for (d, cc, forced, want) in table {
            assert_eq!(select_prefill(d, cc, forced), want, "d={d} cc={cc:?} forced={forced:?}");
        }
        for limits in DeviceLimits::recorded() {
            assert_eq!(select_prefill(128, limits.compute_capability, None), Mma, "{}", limits.name);
            assert_eq!(select_prefill(128, limits.compute_capability, Some(Mma)), Mma, "{}", limits.name);
        }
        // The environment's values.
        for (value, want) in [
            (None, Ok(None)),
            (Some(""), Ok(None)),
            (Some("f32"), Ok(Some(F32))),
            (Some(" MMA "), Ok(Some(Mma))),
            (Some("mma"), Ok(Some(Mma))),
        ] {
            assert_eq!(parse_prefill(value), want, "{value:?}");
        }
        let e = parse_prefill(Some("tensor")).unwrap_err();
        assert!(e.contains(PREFILL_ENV) && e.contains("f32 or mma"), "{e}");
    }

    /// A plan forced to a kernel runs it where it exists; the tensor-core kernel is refused as a
    /// launch where the device or head dim lacks it (the plan's selection never asks for that).
    #[test]
    fn forced_prefill_kernels_and_their_limits() {
        let spec = paged(8, 2, 128, 1, 256);
        let plan = BatchPlan::new(&[chunk_in(0, 0, 70, 0)], &reversed(&spec), 70, &spec, DecodeRoute::Split).unwrap();
        for (forced, want) in [(Some(PrefillKernel::F32), "attn_prefill_d128"), (Some(PrefillKernel::Mma), "attn_prefill_mma_d128")] {
            let p = plan.clone().with_prefill(forced);
            assert_eq!(p.launches(&DeviceLimits::gb10()).unwrap().prefill.unwrap().kernel, want);
        }
        let turing = DeviceLimits { compute_capability: (7, 5), ..DeviceLimits::h200() };
        let p = plan.clone().with_prefill(Some(PrefillKernel::Mma));
        assert_eq!(p.prefill_kernel(&turing).unwrap(), PrefillKernel::F32);
        assert_eq!(p.launches(&turing).unwrap().prefill.unwrap().kernel, "attn_prefill_d128");
        let e = launches(&plan.counts(), &spec, &turing, PrefillKernel::Mma).unwrap_err().to_string();
        assert!(e.contains("attn_prefill_mma_d128"), "{e}");
        let d256 = AttentionSpec { head_dim: 256, ..spec };
        assert!(launches(&plan.counts(), &d256, &DeviceLimits::h200(), PrefillKernel::Mma).is_err());
        // Decode-only batches launch no prefill kernel, whichever is asked for.
        let decode = BatchPlan::new(&[chunk_in(0, 5, 1, 0)], &reversed(&spec), 1, &spec, DecodeRoute::Split).unwrap();
        assert!(launches(&decode.counts(), &d256, &turing, PrefillKernel::Mma).unwrap().prefill.is_none());
        // The tile map is the same for both kernels: the rows agree wherever mma exists.
        for d in MMA_HEAD_DIMS {
            assert_eq!(PrefillKernel::Mma.tile(d).unwrap().rows, prefill_tile(d).unwrap().rows);
        }
    }

    /// The Rust constants are the ones `attention.cu` defines, and the tiles its instantiations use.
    #[test]
    fn constants_match_the_cuda_source() {
        let define = |name: &str| -> u64 {
            let line = ATTENTION.code.lines().find(|l| l.starts_with(&format!("#define {name} "))).unwrap();
            line.split_whitespace().nth(2).unwrap().parse().unwrap()
        };
        assert_eq!(
            [define("ATT_THREADS"), define("ATT_PAD"), define("DEC_SPAN"), define("DEC_MAX_HB"), define("DEC_TILE_FLOATS")],
            [THREADS as u64, PAD, DECODE_SPAN, DECODE_MAX_HEADS as u64, DECODE_TILE_FLOATS]
        );
        for d in HEAD_DIMS {
            let line = ATTENTION.code.lines().find(|l| l.starts_with(&format!("ATT_PREFILL({d},"))).unwrap();
            let nums: Vec<u64> =
                line.trim_start_matches("ATT_PREFILL(").trim_end_matches(')').split(',').map(|s| s.trim().parse().unwrap()).collect();
            let t = prefill_tile(d).unwrap();
            assert_eq!((16 * nums[1], 8 * nums[2]), (t.rows, t.keys), "d={d}");
            assert!(ATTENTION.code.contains(&format!("ATT_DECODE({d})")));
        }
        assert_eq!([define("MMA_BQ"), define("MMA_BK"), define("MMA_PADH")], [MMA_TILE.rows, MMA_TILE.keys, MMA_PAD_HALFS]);
        for d in MMA_HEAD_DIMS {
            assert!(ATTENTION.code.lines().any(|l| l == format!("ATT_PREFILL_MMA({d})")), "d={d}");
        }
    }
}
