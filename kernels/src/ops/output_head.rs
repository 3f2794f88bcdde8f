//! The LM head: `logits[r, v] = dot(W[v, :], x[src(r), :])` for the rows the engine samples.
//!
//! `x [x_rows, K/32]` q8_1 holds the final hidden states, `W [V, K]` is in any [`WeightType`]
//! (K a multiple of 256 for the K-quants), the logits are f32 `[R, V]`. `src(r)` is `rows[r]` (prefill computes only the last position of
//! each sequence) or `r` (full logits, for the parity tests). Full logits pass 2^31 elements at
//! 14,135 tokens for the vocabulary of 151,936: every index is 64-bit on the device.
//!
//! Two kernels (`cuda/output_head.cu`), chosen by [`path`]: a tiled dp4a GEMM (row tiles on
//! `grid.x`, they grow with tokens; vocab tiles on `grid.y`, bounded, refused past the device's
//! limit; the K loop of `cuda/gemm_tile.cuh`, shared with the routed GEMM) and, for at most
//! [`GEMV_MAX_ROWS`] rows (decode), a GEMV that reads each weight row once for all rows (vocab
//! tiles on `grid.x`, the rows in a loop). The same kernels compute every dense projection of
//! the engine: [`crate::ops::linear`].

use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::{CudaSlice, DeviceRepr, PushKernelArg};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::check::{Check, KernelFamily, Outcome, RelErr, Staged, sample_rows};
use crate::cuda::{Gpu, GpuError};
use crate::launch::{Cover, Launch, PlanError, bytes_of, require_bytes};
use crate::limits::DeviceLimits;
use crate::ops::embed::{self, BadIds, EmbedCase, TableType};
use crate::ops::moe_gemm::tile_shared_bytes;
use crate::ops::testdata::{GUARD_WORDS, Guarded, fill_q8_1_rows, fill_weights, timed};
use crate::quant::{BLOCK_Q8_1_BYTES, BlockQ8_1, QK, WeightType};
use crate::sources::OUTPUT_HEAD;
use crate::testdata::{hash2, q8_1_row, shared_twin_row, shared_weight_rows};
use crate::thresholds::{Critical, I32_MAX, overflow_point, tile_tails};

/// The kernel family; its entry points are [`GEMM_KERNEL`] and [`GEMV_KERNEL`].
pub const KERNEL: &str = "output_head";
pub const GEMM_KERNEL: &str = "output_head_gemm";
pub const GEMV_KERNEL: &str = "output_head_gemv";
/// The same integer block sums and f32 block formulas as the twin: only the order of the f32
/// block sums (the GEMV's lane partials and butterfly) and FMA contraction differ, ~1e-6 of
/// the largest logit; for the K-quants also the grouping of their terms per 32-wide block, at
/// most 5.3e-7 (`quant::kquants` tests). A wrong block, scale or nibble moves a logit by more
/// than 1e-3.
pub const TOLERANCE: f64 = 1e-4;
/// Rows of a GEMM tile (`HEAD_BM`): the row tiles on `grid.x`.
pub const TILE_M: u64 = 64;
/// Vocab columns of a GEMM tile (`HEAD_BN`): the vocab tiles on `grid.y`.
pub const TILE_N: u64 = 64;
/// 32-wide K blocks staged per step (`HEAD_KB`).
const K_BLOCKS: u64 = 4;
const GEMM_THREADS: u32 = 256;
/// Dynamic shared memory of a GEMM block (`gemm_tile.cuh`; 21,504 B: within every card's
/// 48 KiB, no opt-in).
pub const GEMM_SHARED_BYTES: u64 = tile_shared_bytes(TILE_M, TILE_N, K_BLOCKS);
const _: () = assert!(GEMM_SHARED_BYTES <= 48 * 1024, "the GEMM tile must fit every card without opting in");
/// Up to this many rows the GEMV runs (`HEAD_GEMV_MAX_ROWS`): decode of a few sequences.
pub const GEMV_MAX_ROWS: u64 = 8;
/// Weight rows per GEMV block, one warp each (`HEAD_GEMV_WARPS`).
pub const GEMV_WARPS: u32 = 8;

/// A self-test case of the head.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeadCase {
    /// Input width K (the model's hidden size, a multiple of 32).
    pub hidden: u32,
    pub vocab: u32,
    pub wtype: WeightType,
    /// `None`: the logits of every position (`[tokens, vocab]`, as the parity tests need).
    /// `Some(s)`: the tokens are `s` sequences (split as [`last_positions`] does) and only the
    /// last position of each is computed, as prefill does.
    pub sequences: Option<u32>,
}

/// What the kernels need of the head's shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeadDims {
    pub hidden: u32,
    pub vocab: u32,
    pub wtype: WeightType,
}

impl HeadDims {
    fn blocks_per_row(&self) -> usize {
        self.hidden as usize / QK
    }

    fn row_bytes(&self) -> usize {
        self.wtype.row_bytes(self.hidden as usize)
    }
}

impl HeadCase {
    pub fn dims(&self) -> HeadDims {
        HeadDims { hidden: self.hidden, vocab: self.vocab, wtype: self.wtype }
    }

    /// Output rows for a batch of `tokens`: every position, or the last of each sequence.
    pub fn out_rows(&self, tokens: u64) -> u64 {
        self.sequences.map_or(tokens, |s| tokens.min(s as u64))
    }
}

/// The last position of each of `sequences` sequences that `tokens` positions are split into
/// (sequence `i` ends at `(i + 1)·T / S − 1`; fewer sequences when there are fewer tokens).
/// Callers keep `tokens` within i32 (the indexes the kernel takes).
pub fn last_positions(tokens: u64, sequences: u32) -> Vec<i32> {
    let s = tokens.min(sequences as u64);
    (1..=s).map(|i| (i * tokens / s - 1) as i32).collect()
}

/// Which kernel computes `rows` output rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeadPath {
    /// At most [`GEMV_MAX_ROWS`] rows: each weight row is read once for all of them.
    Gemv,
    Gemm,
}

pub fn path(rows: u64) -> HeadPath {
    if rows <= GEMV_MAX_ROWS { HeadPath::Gemv } else { HeadPath::Gemm }
}

/// Who runs the dense kernels, as errors name it: the head (hidden -> vocab) or a projection
/// (k -> n, [`crate::ops::linear`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Caller {
    pub family: &'static str,
    /// Names of the input width and of the output width.
    pub input: &'static str,
    pub output: &'static str,
}

pub(crate) const HEAD: Caller = Caller { family: KERNEL, input: "hidden", output: "vocab" };

impl Caller {
    fn describe(&self, rows: u64, d: &HeadDims) -> String {
        format!("rows={rows} {}={} {}={} {}", self.input, d.hidden, self.output, d.vocab, d.wtype)
    }

    fn unsupported(&self, what: impl Into<String>, shape: String) -> PlanError {
        PlanError::Unsupported { kernel: self.family.into(), what: what.into(), shape }
    }
}

/// Every launch the head makes for a batch of `tokens` (one).
pub fn plans(tokens: u64, c: &HeadCase, limits: &DeviceLimits) -> Result<Vec<Launch>, PlanError> {
    if c.sequences.is_some() && tokens > I32_MAX + 1 {
        return Err(HEAD.unsupported("row indices are i32: at most 2^31 tokens", HEAD.describe(tokens, &c.dims())));
    }
    Ok(vec![plan(c.out_rows(tokens), &c.dims(), limits)?])
}

/// The launch computing `rows` output rows: the GEMV (grid (vocab / 8 warps, 1, 1)) or the GEMM
/// (grid (row tiles of 64, vocab tiles of 64, 1), 256 threads, [`GEMM_SHARED_BYTES`]).
pub fn plan(rows: u64, d: &HeadDims, limits: &DeviceLimits) -> Result<Launch, PlanError> {
    plan_for(&HEAD, rows, d, limits)
}

/// [`plan`] with errors naming `caller`.
pub(crate) fn plan_for(caller: &Caller, rows: u64, d: &HeadDims, limits: &DeviceLimits) -> Result<Launch, PlanError> {
    let shape = caller.describe(rows, d);
    if rows == 0 {
        return Err(caller.unsupported("no rows", shape));
    }
    if let Some(what) = d.wtype.check_row_width(d.hidden as u64) {
        return Err(caller.unsupported(format!("{}: {what}", caller.input), shape));
    }
    if d.vocab == 0 || d.vocab as u64 > I32_MAX {
        return Err(caller.unsupported(format!("{} {} must be in 1..2^31", caller.output, d.vocab), shape));
    }
    let vocab = d.vocab as u64;
    match path(rows) {
        HeadPath::Gemv => {
            let per_block = GEMV_WARPS as u64;
            Launch::checked(
                GEMV_KERNEL,
                shape,
                [vocab.div_ceil(per_block), 1, 1],
                [GEMV_WARPS * 32, 1, 1],
                0,
                vec![Cover::Tiles { axis: 0, items: vocab, per_block }],
                limits,
            )
        }
        HeadPath::Gemm => Launch::checked(
            GEMM_KERNEL,
            shape,
            [rows.div_ceil(TILE_M), vocab.div_ceil(TILE_N), 1],
            [GEMM_THREADS, 1, 1],
            GEMM_SHARED_BYTES,
            vec![Cover::Tiles { axis: 0, items: rows, per_block: TILE_M }, Cover::Tiles { axis: 1, items: vocab, per_block: TILE_N }],
            limits,
        ),
    }
}

/// One output row: `out[v] = dot(W[v], x_row)`, the kernels' block formulas in block order.
fn head_row<R: AsRef<[u8]>>(out: &mut [f32], w_row: impl Fn(usize) -> R, x_row: &[BlockQ8_1], wtype: WeightType) {
    for (v, o) in out.iter_mut().enumerate() {
        *o = wtype.dot_q8_1(w_row(v).as_ref(), x_row);
    }
}

/// CPU twin over plain slices: `w` holds `vocab` rows of `hidden` weights, `x` `[x_rows,
/// hidden/32]` blocks, `rows` the x rows to compute (`None`: every x row). Returns the logits
/// `[rows, vocab]`; an index outside x gives a row of NaN, as on the device.
pub fn output_head_cpu(w: &[u8], x: &[BlockQ8_1], rows: Option<&[i32]>, d: &HeadDims) -> Vec<f32> {
    let (nb, rb, vocab) = (d.blocks_per_row(), d.row_bytes(), d.vocab as usize);
    let x_rows = x.len() / nb;
    let src: Vec<Option<usize>> = match rows {
        Some(r) => r.iter().map(|&s| usize::try_from(s).ok().filter(|&s| s < x_rows)).collect(),
        None => (0..x_rows).map(Some).collect(),
    };
    let mut out = vec![0.0f32; src.len() * vocab];
    out.par_chunks_mut(vocab).zip(&src).for_each(|(o, s)| match s {
        Some(s) => head_row(o, |v| &w[v * rb..(v + 1) * rb], &x[s * nb..(s + 1) * nb], d.wtype),
        None => o.fill(f32::NAN),
    });
    out
}

/// The device buffers of one head launch.
pub struct HeadBuffers<'a, Y> {
    /// `[x_rows, hidden/32]` q8_1 blocks.
    pub x: &'a CudaSlice<u8>,
    /// The x rows to compute (`None`: output row r is x row r).
    pub rows: Option<&'a CudaSlice<i32>>,
    /// `vocab` rows of `hidden` weights of `wtype`.
    pub w: &'a CudaSlice<u8>,
    /// `[out_rows, vocab]` f32 (any element type: the kernel writes f32 words).
    pub out: &'a mut CudaSlice<Y>,
}

/// `(name, have, need)` in bytes for [`require_bytes`], from the buffers' sizes in bytes `have`
/// (x, rows, w, out): what one launch reads and writes.
fn buffer_needs(d: &HeadDims, x_rows: u64, out_rows: u64, have: [u64; 4]) -> [(&'static str, u64, u64); 4] {
    [
        ("x", have[0], x_rows * (d.blocks_per_row() * BLOCK_Q8_1_BYTES) as u64),
        ("rows", have[1], 4 * out_rows),
        ("w", have[2], d.vocab as u64 * d.row_bytes() as u64),
        ("out", have[3], 4 * out_rows * d.vocab as u64),
    ]
}

/// Computes `out_rows` rows of logits from `x_rows` rows of x: row r from x row `rows[r]`, or
/// from x row r without an index list (then `out_rows <= x_rows`).
pub fn launch<Y: DeviceRepr>(gpu: &Gpu, d: &HeadDims, x_rows: u64, out_rows: u64, b: HeadBuffers<'_, Y>) -> Result<(), GpuError> {
    launch_for(&HEAD, gpu, d, x_rows, out_rows, b)
}

/// [`launch`] with errors naming `caller`.
pub(crate) fn launch_for<Y: DeviceRepr>(
    caller: &Caller,
    gpu: &Gpu,
    d: &HeadDims,
    x_rows: u64,
    out_rows: u64,
    b: HeadBuffers<'_, Y>,
) -> Result<(), GpuError> {
    let p = plan_for(caller, out_rows, d, gpu.limits())?;
    if b.rows.is_none() && out_rows > x_rows {
        let what = format!("{out_rows} output rows from {x_rows} rows of x without an index list");
        return Err(PlanError::Unsupported { kernel: p.kernel.clone(), what, shape: p.shape.clone() }.into());
    }
    let rows_bytes = b.rows.map_or(4 * out_rows, |r| bytes_of(r.len(), 4));
    let have = [bytes_of(b.x.len(), 1), rows_bytes, bytes_of(b.w.len(), 1), bytes_of(b.out.len(), size_of::<Y>())];
    require_bytes(&p, &buffer_needs(d, x_rows, out_rows, have))?;
    let (wtype, vocab, nb) = (d.wtype.code(), d.vocab as i32, d.blocks_per_row() as i32);
    let null: u64 = 0;
    match path(out_rows) {
        HeadPath::Gemv => {
            let f = gpu.function(&OUTPUT_HEAD, GEMV_KERNEL)?;
            let n = out_rows as i32;
            gpu.launch(&p, &f, |a| {
                a.arg(b.x);
                match b.rows {
                    Some(r) => a.arg(r),
                    None => a.arg(&null),
                };
                a.arg(&n).arg(&x_rows).arg(b.w).arg(&wtype).arg(b.out).arg(&vocab).arg(&nb);
            })?;
        }
        HeadPath::Gemm => {
            let f = gpu.function(&OUTPUT_HEAD, GEMM_KERNEL)?;
            gpu.launch(&p, &f, |a| {
                a.arg(b.x);
                match b.rows {
                    Some(r) => a.arg(r),
                    None => a.arg(&null),
                };
                a.arg(&out_rows).arg(&x_rows).arg(b.w).arg(&wtype).arg(b.out).arg(&vocab).arg(&nb);
            })?;
        }
    }
    Ok(())
}

/// Token counts this plan makes critical: the 2^31 points of the logits and of x, the switch
/// from the GEMV to the GEMM, the row-tile tails; with an index list, the sequence count.
pub fn critical_counts(c: &HeadCase, _limits: &DeviceLimits) -> Vec<Critical> {
    let nb = c.dims().blocks_per_row() as u64;
    let mut v = vec![Critical::new(1, "output_head: single token (decode)")];
    v.extend(overflow_point(nb, "output_head: x block index row·(K/32) + b passes 2^31 − 1"));
    v.extend(overflow_point(nb * (BLOCK_Q8_1_BYTES as u64 / 4), "output_head: x word index (row·(K/32) + b)·9 passes 2^31 − 1"));
    v.push(Critical::new(GEMV_MAX_ROWS, "output_head: most rows on the GEMV path"));
    v.push(Critical::new(GEMV_MAX_ROWS + 1, "output_head: fewest rows on the GEMM path"));
    match c.sequences {
        None => {
            v.extend(overflow_point(c.vocab as u64, "output_head: logits[r·V + v] passes 2^31 − 1"));
            v.extend(tile_tails(TILE_M, false, &[1, 2], "output_head: 64-row tile"));
        }
        Some(s) => {
            let s = s as u64;
            v.extend(
                [s.saturating_sub(1), s, s + 1]
                    .into_iter()
                    .filter(|&t| t > 0)
                    .map(|t| Critical::new(t, format!("output_head: {s} sequences, one token each around this count"))),
            );
        }
    }
    v
}

/// x, W, the index list and the guarded logits of a self-test case.
pub fn device_bytes(tokens: u64, c: &HeadCase) -> u64 {
    let d = c.dims();
    let rows = c.out_rows(tokens);
    let x = tokens * (d.blocks_per_row() * BLOCK_Q8_1_BYTES) as u64;
    let w = d.vocab as u64 * d.row_bytes() as u64;
    x + w + 4 * rows + 4 * (rows * d.vocab as u64 + GUARD_WORDS as u64)
}

const SEED_X: u64 = 0x40;
const SEED_W: u64 = 0x41;
const SEED_COLS: u64 = 0x42;
/// Rows compared with the twin beyond the first and last two tiles.
const SAMPLE_ROWS: usize = 64;
/// Vocab columns compared in each sampled row beyond the first and last two tiles: each costs
/// the CPU a K-long dot per row (every logit is still checked as written, through the poison).
const SAMPLE_COLS: usize = 384;

/// Self-test: x and W from seeds, logits poisoned, one launch, every logit checked as written
/// and sampled rows x sampled columns (both including the last two tiles) against the twin.
pub fn run_case(gpu: &Gpu, tokens: u64, c: &HeadCase) -> Result<Outcome, GpuError> {
    stage_case(gpu, tokens, c).map(Staged::finish)
}

/// [`run_case`]'s GPU half (see [`KernelFamily::stage`]).
pub fn stage_case(gpu: &Gpu, tokens: u64, c: &HeadCase) -> Result<Staged, GpuError> {
    plans(tokens, c, gpu.limits())?; // refuse a bad shape before allocating for it
    stage_dense(&HEAD, gpu, tokens, &c.dims(), c.sequences)
}

/// The self-test of the dense kernels on `tokens` rows of x, computing every row (`None`) or
/// the last of each of `sequences` sequences; `linear`'s self-test is this with every row.
pub(crate) fn run_dense(caller: &Caller, gpu: &Gpu, tokens: u64, d: &HeadDims, sequences: Option<u32>) -> Result<Outcome, GpuError> {
    stage_dense(caller, gpu, tokens, d, sequences).map(Staged::finish)
}

/// [`run_dense`]'s GPU half: up to the sampled logits downloaded; the twin is the host check.
pub(crate) fn stage_dense(caller: &Caller, gpu: &Gpu, tokens: u64, d: &HeadDims, sequences: Option<u32>) -> Result<Staged, GpuError> {
    let nb = d.blocks_per_row();
    let out_rows = sequences.map_or(tokens, |s| tokens.min(s as u64));
    let mut x = gpu.alloc::<u8>(tokens as usize * nb * BLOCK_Q8_1_BYTES)?;
    fill_q8_1_rows(gpu, &mut x, tokens as usize, nb, SEED_X, None, tokens)?;
    let mut w = gpu.alloc::<u8>(d.vocab as usize * d.row_bytes())?;
    fill_weights(gpu, &mut w, d.vocab as usize * d.wtype.blocks_per_row(d.hidden as usize), SEED_W, d.wtype)?;
    let rows = sequences.map(|s| last_positions(tokens, s));
    let rows_dev = rows.as_deref().map(|r| gpu.upload(r)).transpose()?;
    let mut out = Guarded::new(gpu, (out_rows * d.vocab as u64) as usize)?;
    gpu.synchronize()?;
    let start = Instant::now();
    launch_for(caller, gpu, d, tokens, out_rows, HeadBuffers { x: &x, rows: rows_dev.as_ref(), w: &w, out: &mut out.buf })?;
    gpu.synchronize()?;
    let kernel_ms = start.elapsed().as_secs_f64() * 1e3;
    let (unwritten, past_end) = out.check(gpu, 1)?;
    let (cols, sampled) =
        (sample_rows(d.vocab as u64, TILE_N, SAMPLE_COLS, SEED_COLS), sample_rows(out_rows, TILE_M, SAMPLE_ROWS, out_rows));
    let got = download(gpu, &out, &sampled, &cols, d.vocab as u64)?;
    let d = *d;
    Ok(Staged::Check(Box::new(move || {
        let err = compare(&got, &sampled, &cols, rows.as_deref(), &d);
        Outcome::Ran(Check::of_floats(&err, TOLERANCE, (unwritten, past_end), kernel_ms))
    })))
}

/// The device's logits at the sampled rows and columns, row by row (the sampled columns of
/// each): gathered on the device into one buffer of `sampled.len() × cols.len()` values and
/// downloaded in one copy, rather than every sampled row whole (for the head a vocabulary's
/// width of logits, 600 KiB and more, for up to a couple of hundred rows compared). The gather is the embed kernel over
/// an f32 "table" of single values ([`gather_chunks`]): a copy, bit for bit.
fn download(gpu: &Gpu, out: &Guarded, sampled: &[u64], cols: &[u64], vocab: u64) -> Result<Vec<Vec<f32>>, GpuError> {
    timed(gpu, "download", || gather(gpu, out, sampled, cols, vocab))
}

fn gather(gpu: &Gpu, out: &Guarded, sampled: &[u64], cols: &[u64], vocab: u64) -> Result<Vec<Vec<f32>>, GpuError> {
    let chunks = gather_chunks(sampled, cols, vocab);
    let ids: Vec<i32> = chunks.iter().flat_map(|c| c.ids.iter().copied()).collect();
    let ids_dev = gpu.upload(&ids)?;
    let mut gathered = gpu.alloc::<u32>(ids.len())?;
    let mut bad = BadIds::new(gpu)?;
    let mut at = 0;
    for c in &chunks {
        let n = c.ids.len();
        let first = (c.first_row * vocab) as usize;
        let table = out.buf.slice(first..first + c.elements as usize);
        let case = EmbedCase { vocab: c.elements as u32, hidden: 1, table: TableType::F32 };
        let mut o = gathered.slice_mut(at..at + n);
        embed::launch(gpu, n as u64, &case, &ids_dev.slice(at..at + n), &table, &mut o, &mut bad)?;
        at += n;
    }
    let words = gpu.download(&gathered)?;
    Ok(words.chunks(cols.len().max(1)).map(|row| row.iter().map(|&w| f32::from_bits(w)).collect()).collect())
}

/// One gather launch of [`download`]: the sampled rows from `first_row` on whose logits end
/// within 2^31 − 1 elements of its first (the ids and the table's length are i32), the
/// `elements` from that row's first to the chunk's last row's end, and the ids into them, row
/// by row, the sampled columns of each.
#[derive(Debug, PartialEq)]
struct GatherChunk {
    first_row: u64,
    elements: u64,
    ids: Vec<i32>,
}

/// [`download`]'s launches: the sampled rows (ascending) in order, split where a row would
/// end past 2^31 − 1 elements of its chunk (`vocab` at most 2^31 − 1: a row fits alone).
fn gather_chunks(sampled: &[u64], cols: &[u64], vocab: u64) -> Vec<GatherChunk> {
    let mut chunks: Vec<GatherChunk> = Vec::new();
    for &r in sampled {
        let open = chunks.last().is_some_and(|c| r >= c.first_row && (r - c.first_row + 1) * vocab <= I32_MAX);
        if !open {
            chunks.push(GatherChunk { first_row: r, elements: 0, ids: Vec::new() });
        }
        let c = chunks.last_mut().expect("a chunk was just opened");
        let base = (r - c.first_row) * vocab;
        c.elements = base + vocab;
        c.ids.extend(cols.iter().map(|&col| (base + col) as i32));
    }
    chunks
}

/// The twin's logits at sampled rows and columns (weights regenerated per sampled column)
/// against the device's (`got`, row by row, the sampled columns of each).
fn compare(got: &[Vec<f32>], sampled: &[u64], cols: &[u64], rows: Option<&[i32]>, d: &HeadDims) -> RelErr {
    let (k, nb, vocab) = (d.hidden as usize, d.blocks_per_row(), d.vocab as u64);
    // A row's sampled logits depend on its x row and the columns only: each is computed once
    // per process and shared with the other cases, from the columns' weight rows generated once
    // per process.
    let cols_print = cols.iter().fold(cols.len() as u64, |h, &c| hash2(h, c));
    let what = format!("output_head w{SEED_W:#x} x{SEED_X:#x} {d:?} cols {cols_print:#x}");
    let weights: Vec<Arc<Vec<u8>>> = cols.par_iter().map(|&col| shared_weight_rows(SEED_W, d.wtype, k, col, 1)).collect();
    let want: Vec<Arc<Vec<f32>>> = sampled
        .par_iter()
        .map(|&r| {
            let src = rows.map_or(r, |rs| rs[r as usize] as u64);
            shared_twin_row(&what, src, || {
                let x = q8_1_row(SEED_X, src, nb);
                let mut o = vec![0.0f32; cols.len()];
                head_row(&mut o, |i| weights[i].as_slice(), &x, d.wtype);
                o
            })
        })
        .collect();
    let mut err = RelErr::default();
    for ((&r, want), got) in sampled.iter().zip(&want).zip(got) {
        for ((&col, &wv), &g) in cols.iter().zip(want.iter()).zip(got) {
            err.add(r * vocab + col, g, wv);
        }
    }
    err
}

/// The host work of one dense case without the device (the bench of the self-test's host
/// costs): the sampling and the twin of the sampled logits.
#[cfg(test)]
pub(crate) fn host_half(tokens: u64, d: &HeadDims, sequences: Option<u32>) -> usize {
    let out_rows = sequences.map_or(tokens, |s| tokens.min(s as u64));
    let rows = sequences.map(|s| last_positions(tokens, s));
    let (cols, sampled) =
        (sample_rows(d.vocab as u64, TILE_N, SAMPLE_COLS, SEED_COLS), sample_rows(out_rows, TILE_M, SAMPLE_ROWS, out_rows));
    let got: Vec<Vec<f32>> = sampled.iter().map(|_| vec![0.0; cols.len()]).collect();
    compare(&got, &sampled, &cols, rows.as_deref(), d).compared as usize
}

/// The self-test's handle on this family (registered in `selftest::case`).
pub struct Family;

impl KernelFamily for Family {
    type Case = HeadCase;

    fn run(gpu: &Gpu, tokens: u64, c: &HeadCase) -> Result<Outcome, GpuError> {
        run_case(gpu, tokens, c)
    }

    fn stage(gpu: &Gpu, tokens: u64, c: &HeadCase) -> Result<Staged, GpuError> {
        stage_case(gpu, tokens, c)
    }

    fn plans(tokens: u64, c: &HeadCase, limits: &DeviceLimits) -> Result<Vec<Launch>, PlanError> {
        plans(tokens, c, limits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::dequantize_q8_1;
    use crate::testdata::weight_row;

    const QWEN: HeadCase = HeadCase { hidden: 2048, vocab: 151_936, wtype: WeightType::Q4_0, sequences: None };

    fn weights(d: &HeadDims) -> Vec<u8> {
        (0..d.vocab as u64).flat_map(|v| weight_row(SEED_W, v, d.hidden as usize, d.wtype)).collect()
    }

    fn x_rows(n: u64, nb: usize) -> Vec<BlockQ8_1> {
        (0..n).flat_map(|t| q8_1_row(SEED_X, t, nb)).collect()
    }

    /// Twin vs. dequantize-then-f64 dot, with and without an index list; a bad index gives NaN.
    #[test]
    fn twin_matches_dequantized_f64_dot() {
        for wtype in WeightType::ALL {
            // Three blocks per row: 96 weights, 768 for the K-quants.
            let hidden = 3 * wtype.block_size();
            let nb = hidden / QK;
            let d = HeadDims { hidden: hidden as u32, vocab: 37, wtype };
            let (w, x) = (weights(&d), x_rows(5, nb));
            let rb = d.row_bytes();
            for rows in [None, Some(vec![4, 0, 2])] {
                let got = output_head_cpu(&w, &x, rows.as_deref(), &d);
                let src: Vec<usize> = rows.clone().map_or((0..5).collect(), |r| r.iter().map(|&s| s as usize).collect());
                assert_eq!(got.len(), src.len() * 37);
                let (mut worst, mut scale) = (0f64, 0f64);
                for (r, &s) in src.iter().enumerate() {
                    let xd = dequantize_q8_1(&x[s * nb..(s + 1) * nb]);
                    for v in 0..37 {
                        let wd = wtype.dequantize_row(&w[v * rb..(v + 1) * rb]);
                        let want: f64 = wd.iter().zip(&xd).map(|(a, b)| *a as f64 * *b as f64).sum();
                        worst = worst.max((want - got[r * 37 + v] as f64).abs());
                        scale = scale.max(want.abs());
                    }
                }
                // q4_0 folds its −8 offset through the f16 s = d·Σq: allow that rounding.
                assert!(worst <= 2e-3 * scale, "{wtype}: {worst} vs {scale}");
            }
            let bad = output_head_cpu(&w, &x, Some(&[1, -1, 5]), &d);
            assert!(bad[..37].iter().all(|v| v.is_finite()) && bad[37..].iter().all(|v| v.is_nan()));
        }
    }

    /// The GEMV's order: lane l sums blocks l, l + 32, ..., then the xor butterfly (the K-quant
    /// terms grouped per 32-wide block: `device_order_dot`).
    fn gemv_order_dot(wtype: WeightType, w_row: &[u8], x: &[BlockQ8_1]) -> f32 {
        if wtype.is_k_quant() {
            return crate::quant::kquants::device_order_dot(wtype, w_row, x, 32);
        }
        let bb = wtype.block_bytes();
        let mut lanes = [0.0f32; 32];
        for (b, xb) in x.iter().enumerate() {
            let w = &w_row[b * bb..(b + 1) * bb];
            lanes[b % 32] += wtype.dot_q8_1(w, std::slice::from_ref(xb));
        }
        for o in [16, 8, 4, 2, 1] {
            lanes = std::array::from_fn(|l| lanes[l] + lanes[l ^ o]);
        }
        lanes[0]
    }

    /// At the model's K the summation order costs two orders of magnitude below the tolerance.
    #[test]
    fn tolerance_covers_summation_order_only() {
        for wtype in WeightType::ALL {
            let d = HeadDims { hidden: 2048, vocab: 64, wtype };
            let (w, x) = (weights(&d), x_rows(2, 64));
            let got = output_head_cpu(&w, &x, None, &d);
            let rb = d.row_bytes();
            let mut err = RelErr::default();
            for r in 0..2 {
                for v in 0..64 {
                    err.add(0, gemv_order_dot(wtype, &w[v * rb..(v + 1) * rb], &x[r * 64..(r + 1) * 64]), got[r * 64 + v]);
                }
            }
            assert!(err.value() < TOLERANCE / 100.0, "{wtype}: {}", err.value());
        }
    }

    #[test]
    fn plans_cover_every_row_and_vocab_entry_on_both_devices() {
        let counts = (1..=256u64).chain([8191, 8192, 14_134, 14_135, 1 << 20]);
        for limits in DeviceLimits::recorded() {
            for t in counts.clone() {
                for c in [QWEN, HeadCase { sequences: Some(4), ..QWEN }, HeadCase { sequences: Some(100), ..QWEN }] {
                    let p = plans(t, &c, &limits).unwrap_or_else(|e| panic!("t={t}: {e}"));
                    assert_eq!(p.len(), 1);
                    let l = &p[0];
                    l.check_cover().unwrap_or_else(|e| panic!("{e}"));
                    for i in 0..l.cover.len() {
                        assert!(l.simulate_cover(i).iter().all(|&h| h == 1), "{l} cover {i}");
                    }
                    let rows = c.out_rows(t);
                    if rows <= GEMV_MAX_ROWS {
                        assert_eq!((l.kernel.as_str(), l.grid), (GEMV_KERNEL, [18_992, 1, 1]), "{l}");
                    } else {
                        assert_eq!((l.kernel.as_str(), l.grid), (GEMM_KERNEL, [rows.div_ceil(64) as u32, 2374, 1]), "{l}");
                    }
                }
            }
        }
    }

    #[test]
    fn full_logits_pass_2_pow_31_at_14135_tokens() {
        let counts: Vec<u64> = critical_counts(&QWEN, &DeviceLimits::h200()).iter().map(|c| c.tokens).collect();
        // (2^31 − 1) / 151,936 = 14,134.1; x blocks / 64 = 33,554,431.98; x words / 576 = 3,728,270.2.
        for t in [1, 8, 9, 63, 64, 65, 127, 128, 129, 14_134, 14_135, 33_554_431, 33_554_432, 3_728_270, 3_728_271] {
            assert!(counts.contains(&t), "{t} missing from {counts:?}");
        }
        assert_eq!(14_134 * 151_936 + 151_935, 2_147_615_359u64, "the last logit of 14,135 tokens is past 2^31");
        let rows = HeadCase { sequences: Some(100), ..QWEN };
        let counts: Vec<u64> = critical_counts(&rows, &DeviceLimits::h200()).iter().map(|c| c.tokens).collect();
        assert!(counts.contains(&99) && counts.contains(&100) && counts.contains(&101) && !counts.contains(&14_135));
    }

    /// The gather's ids name exactly the sampled logits, row by row, the sampled columns of each,
    /// within i32 of their chunk's first row; a chunk ends before 2^31 elements.
    #[test]
    fn gather_chunks_name_the_sampled_logits() {
        for (out_rows, vocab) in [(1u64, 151_936u64), (300, 151_936), (20_000, 151_936), (3, I32_MAX), (50, 7)] {
            let cols = sample_rows(vocab, TILE_N, SAMPLE_COLS, SEED_COLS);
            let sampled = sample_rows(out_rows, TILE_M, SAMPLE_ROWS, out_rows);
            let chunks = gather_chunks(&sampled, &cols, vocab);
            let mut named = Vec::new();
            for c in &chunks {
                assert!(c.elements <= I32_MAX && c.elements.is_multiple_of(vocab) && !c.ids.is_empty(), "{c:?}");
                assert!(c.ids.iter().all(|&id| id >= 0 && (id as u64) < c.elements));
                named.extend(c.ids.iter().map(|&id| c.first_row * vocab + id as u64));
            }
            let want: Vec<u64> = sampled.iter().flat_map(|&r| cols.iter().map(move |&col| r * vocab + col)).collect();
            assert_eq!(named, want, "rows={out_rows} vocab={vocab}");
            assert_eq!(chunks.len() > 1, sampled.last().unwrap() * vocab + vocab > I32_MAX, "rows={out_rows} vocab={vocab}");
        }
    }

    #[test]
    fn last_positions_end_each_sequence() {
        assert_eq!(last_positions(10, 4), vec![1, 4, 6, 9]);
        assert_eq!(last_positions(3, 4), vec![0, 1, 2]);
        assert_eq!(last_positions(8192, 1), vec![8191]);
        let p = last_positions(14_135, 100);
        assert_eq!(p.len(), 100);
        assert!(p.windows(2).all(|w| w[0] < w[1]) && *p.last().unwrap() == 14_134);
    }

    #[test]
    fn bad_shapes_are_typed_errors() {
        let l = DeviceLimits::gb10();
        for (t, c) in [
            (0, QWEN),
            (1, HeadCase { hidden: 2047, ..QWEN }),
            (1, HeadCase { hidden: 0, ..QWEN }),
            (1, HeadCase { vocab: 0, ..QWEN }),
            (1, HeadCase { hidden: 2048 + 32, wtype: WeightType::Q6K, ..QWEN }),
            ((1 << 31) + 1, HeadCase { sequences: Some(4), ..QWEN }),
        ] {
            assert!(matches!(plans(t, &c, &l), Err(PlanError::Unsupported { .. })), "t={t} {c:?}");
        }
        // The vocab tiles are on grid.y: past 65535 tiles of 64 the plan refuses, typed.
        let wide = HeadCase { vocab: 65_535 * 64 + 1, ..QWEN };
        assert!(matches!(plans(100, &wide, &l), Err(PlanError::GridDim { axis: 'y', .. })));
        assert!(plans(100, &HeadCase { vocab: 65_535 * 64, ..QWEN }, &l).is_ok());
    }

    #[test]
    fn buffers_too_small_are_refused() {
        let d = HeadDims { hidden: 64, vocab: 10, wtype: WeightType::Q8_0 };
        let p = plan(3, &d, &DeviceLimits::h200()).unwrap();
        let ok = [3 * 72, 12, 680, 120];
        assert!(require_bytes(&p, &buffer_needs(&d, 3, 3, ok)).is_ok());
        for i in 0..4 {
            let mut short = ok;
            short[i] -= 1;
            assert!(require_bytes(&p, &buffer_needs(&d, 3, 3, short)).is_err(), "buffer {i}");
        }
    }

    /// The Rust tile constants are the ones `output_head.cu` and `gemm_tile.cuh` define.
    #[test]
    fn constants_match_the_cuda_source() {
        let define_in = |code: &str, name: &str| -> u64 {
            let line = code.lines().find(|l| l.starts_with(&format!("#define {name} "))).unwrap();
            line.split_whitespace().nth(2).unwrap().parse().unwrap()
        };
        let define = |name: &str| define_in(OUTPUT_HEAD.code, name);
        assert_eq!([define("HEAD_BM"), define("HEAD_BN"), define("HEAD_KB")], [TILE_M, TILE_N, K_BLOCKS]);
        assert_eq!(define_in(crate::sources::GEMM_TILE.code, "GEMM_QS"), crate::ops::moe_gemm::STAGED_INTS);
        assert_eq!(define("HEAD_TM") * define("HEAD_TN") * GEMM_THREADS as u64, TILE_M * TILE_N);
        let [bm, bn, tm, tn] = ["HEAD_BM", "HEAD_BN", "HEAD_TM", "HEAD_TN"].map(|n| define(n) as u32);
        assert!(crate::ops::moe_gemm::tests::mma_subtiles_cover(bm, bn, tm, tn));
        assert_eq!([define("HEAD_GEMV_WARPS"), define("HEAD_GEMV_MAX_ROWS")], [GEMV_WARPS as u64, GEMV_MAX_ROWS]);
    }
}
