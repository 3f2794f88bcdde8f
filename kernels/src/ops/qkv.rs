//! Up to three dense projections of the same q8_1 rows (the attention's q, k and v) as one
//! launch at decode: `outs[i][r, n] = dot(W_i[n, :], x[r, :])`.
//!
//! For at most [`output_head::GEMV_MAX_ROWS`] rows the column tiles of the matrices (8 W rows
//! each, one warp per W row, as `output_head_gemv`) follow each other on grid.x in one launch of
//! `output_head_gemv3` (`cuda/output_head.cu`): every output column is computed by the same code
//! on the same lanes as one `output_head_gemv` launch per matrix computes it, so the values are
//! those of [`crate::ops::linear`] bit for bit. Above that, each matrix is its own launch of the
//! dense kernels (the tiled GEMM), exactly as `linear` plans it. Each matrix has its own weight
//! type and width; they share the input width K. The twin is `linear`'s, once per matrix.

use std::time::Instant;

use cudarc::driver::{CudaSlice, DeviceRepr, PushKernelArg};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::check::{Check, KernelFamily, Outcome, RelErr, Staged, sample_rows};
use crate::cuda::{Gpu, GpuError};
use crate::launch::{Cover, Launch, PlanError, bytes_of, require_bytes};
use crate::limits::DeviceLimits;
use crate::ops::linear::{self, LinearCase};
use crate::ops::output_head::{GEMV_MAX_ROWS, GEMV_WARPS};
use crate::ops::testdata::{GUARD_WORDS, Guarded, fill_q8_1_rows, fill_weights};
use crate::quant::{BLOCK_Q8_1_BYTES, BlockQ8_1, QK, WeightType, q8_1_bytes};
use crate::sources::OUTPUT_HEAD;
use crate::testdata::{q8_1_row, weight_row};
use crate::thresholds::Critical;

pub const KERNEL: &str = "qkv";
/// The decode kernel: the column tiles of up to three matrices on grid.x.
pub const GEMV3_KERNEL: &str = "output_head_gemv3";
/// `linear`'s comparison with the twin; the fused launch must also equal `linear`'s launches
/// bit for bit (counted as mismatches).
pub const TOLERANCE: f64 = linear::TOLERANCE;
/// Most matrices one launch takes.
pub const MAX_MATRICES: usize = 3;

/// Three projections of one input (the self-test case; the engine passes any 1..=3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QkvCase {
    /// Input width K (a multiple of 32; of 256 for K-quant weights).
    pub k: u32,
    /// Output widths: q, k, v.
    pub n: [u32; 3],
    pub wtype: [WeightType; 3],
}

impl QkvCase {
    pub fn projections(&self) -> [LinearCase; 3] {
        std::array::from_fn(|i| LinearCase { n: self.n[i], k: self.k, wtype: self.wtype[i] })
    }
}

fn shape(rows: u64, ps: &[LinearCase]) -> String {
    let ns: Vec<String> = ps.iter().map(|p| format!("{}:{}", p.n, p.wtype)).collect();
    format!("rows={rows} k={} n=[{}]", ps.first().map_or(0, |p| p.k), ns.join(", "))
}

fn unsupported(what: impl Into<String>, rows: u64, ps: &[LinearCase]) -> PlanError {
    PlanError::Unsupported { kernel: KERNEL.into(), what: what.into(), shape: shape(rows, ps) }
}

/// Column tiles of one matrix on the fused grid.
fn tiles(n: u32) -> u64 {
    (n as u64).div_ceil(GEMV_WARPS as u64)
}

/// Every launch the projections of `tokens` rows make.
pub fn plans(tokens: u64, c: &QkvCase, limits: &DeviceLimits) -> Result<Vec<Launch>, PlanError> {
    plan(tokens, &c.projections(), limits)
}

/// At most 8 rows: one launch, grid (Σ ceil(n_i / 8), 1, 1) of 256 threads, each block one
/// column tile of one matrix. More rows: `linear`'s plan per matrix. Each matrix is first
/// checked as `linear` checks it (so the refusals are the same), and all must share K.
pub fn plan(rows: u64, ps: &[LinearCase], limits: &DeviceLimits) -> Result<Vec<Launch>, PlanError> {
    if ps.is_empty() || ps.len() > MAX_MATRICES {
        return Err(unsupported(format!("{} matrices: one launch takes 1 to {MAX_MATRICES}", ps.len()), rows, ps));
    }
    if ps.iter().any(|p| p.k != ps[0].k) {
        return Err(unsupported("the matrices must share the input width K", rows, ps));
    }
    let each = ps.iter().map(|p| linear::plan(rows, p, limits)).collect::<Result<Vec<_>, _>>()?;
    if rows > GEMV_MAX_ROWS {
        return Ok(each);
    }
    let total: u64 = ps.iter().map(|p| tiles(p.n)).sum();
    Ok(vec![Launch::checked(
        GEMV3_KERNEL,
        shape(rows, ps),
        [total, 1, 1],
        [GEMV_WARPS * 32, 1, 1],
        0,
        vec![Cover::Tiles { axis: 0, items: total, per_block: 1 }],
        limits,
    )?])
}

/// The (matrix, column tile) block `b` of the fused grid computes, as the kernel finds it:
/// the first tiles(n_0) blocks are matrix 0's, and so on.
pub fn block_tile(b: u64, ns: &[u32]) -> Option<(usize, u64)> {
    let mut t = b;
    for (i, &n) in ns.iter().enumerate() {
        if t < tiles(n) {
            return Some((i, t));
        }
        t -= tiles(n);
    }
    None
}

/// CPU twin: `linear`'s twin for each matrix (`ws[i]` its N_i rows of K weights).
pub fn qkv_cpu(ws: &[&[u8]], x: &[BlockQ8_1], ps: &[LinearCase]) -> Vec<Vec<f32>> {
    ws.iter().zip(ps).map(|(w, p)| linear::linear_cpu(w, x, p)).collect()
}

/// `outs[i] [rows, N_i] = x [rows, K/32] · W_iᵀ` for 1..=3 matrices: one launch at decode, one
/// per matrix above. Buffers too small for the shape are refused before any launch.
/// The outputs may be of any 4-byte element type (the kernels write f32 bits).
pub fn launch<Y: DeviceRepr>(
    gpu: &Gpu,
    rows: u64,
    ps: &[LinearCase],
    x: &CudaSlice<u8>,
    ws: &[&CudaSlice<u8>],
    outs: &mut [&mut CudaSlice<Y>],
) -> Result<(), GpuError> {
    let launches = plan(rows, ps, gpu.limits())?;
    if ws.len() != ps.len() || outs.len() != ps.len() {
        let what = format!("{} matrices, {} weights and {} outputs", ps.len(), ws.len(), outs.len());
        return Err(unsupported(what, rows, ps).into());
    }
    if rows > GEMV_MAX_ROWS {
        for ((p, w), out) in ps.iter().zip(ws).zip(outs.iter_mut()) {
            linear::launch(gpu, rows, p, x, w, &mut **out)?;
        }
        return Ok(());
    }
    let p = &launches[0];
    let nb = ps[0].k as u64 / QK as u64;
    let mut need = vec![("x", bytes_of(x.len(), 1), q8_1_bytes(rows, ps[0].k))];
    for ((c, w), out) in ps.iter().zip(ws).zip(outs.iter()) {
        need.push(("w", bytes_of(w.len(), 1), c.n as u64 * c.wtype.row_bytes(c.k as usize) as u64));
        need.push(("out", bytes_of(out.len(), size_of::<Y>()), 4 * rows * c.n as u64));
    }
    require_bytes(p, &need)?;
    let f = gpu.function(&OUTPUT_HEAD, GEMV3_KERNEL)?;
    let (n_rows, nb) = (rows as i32, nb as i32);
    // Absent matrices: no tiles (never reached), the first's type code, null buffers.
    let absent = 0u64;
    let code = |i: usize| ps.get(i).map_or(ps[0].wtype.code(), |c| c.wtype.code());
    let width = |i: usize| ps.get(i).map_or(0i32, |c| c.n as i32);
    let tile = |i: usize| ps.get(i).map_or(0u64, |c| tiles(c.n));
    let (codes, widths, tile_counts) = ([code(0), code(1), code(2)], [width(0), width(1), width(2)], [tile(0), tile(1), tile(2)]);
    let (w_ptrs, out_ptrs): (Vec<_>, Vec<_>) = (0..MAX_MATRICES)
        .map(|i| match (ws.get(i), outs.get(i)) {
            (Some(w), Some(o)) => (Some(*w), Some(&**o)),
            _ => (None, None),
        })
        .unzip();
    gpu.launch(p, &f, |a| {
        a.arg(x).arg(&n_rows).arg(&rows).arg(&nb);
        for i in 0..MAX_MATRICES {
            match w_ptrs[i] {
                Some(w) => a.arg(w),
                None => a.arg(&absent),
            };
            a.arg(&codes[i]);
            match out_ptrs[i] {
                Some(o) => a.arg(o),
                None => a.arg(&absent),
            };
            a.arg(&widths[i]);
            if i + 1 < MAX_MATRICES {
                a.arg(&tile_counts[i]);
            }
        }
    })?;
    Ok(())
}

/// `linear`'s critical counts for each matrix (the GEMV/GEMM switch at 8 and 9 rows among them).
pub fn critical_counts(c: &QkvCase, limits: &DeviceLimits) -> Vec<Critical> {
    let mut v: Vec<Critical> = c.projections().iter().flat_map(|p| linear::critical_counts(p, limits)).collect();
    v.extend((1..=GEMV_MAX_ROWS).map(|t| Critical::new(t, "qkv: decode rows (one fused launch)")));
    v
}

/// x, the three weights, the guarded outputs and `linear`'s outputs of a self-test case.
pub fn device_bytes(tokens: u64, c: &QkvCase) -> u64 {
    let x = q8_1_bytes(tokens, c.k);
    let per: u64 = c
        .projections()
        .iter()
        .map(|p| p.n as u64 * p.wtype.row_bytes(p.k as usize) as u64 + 2 * 4 * (tokens * p.n as u64 + GUARD_WORDS as u64))
        .sum();
    x + per
}

const SEED_X: u64 = 0x60;
const SEED_W: [u64; 3] = [0x61, 0x62, 0x63];
const SAMPLE_ROWS: usize = 16;
const SAMPLE_COLS: usize = 256;

/// Self-test: x and the three W from seeds, outputs poisoned; the fused launch, then `linear`'s
/// launch per matrix into second buffers: every output written, nothing past the ends, sampled
/// rows x columns against the twin, and the fused outputs equal to `linear`'s bit for bit.
pub fn run_case(gpu: &Gpu, tokens: u64, c: &QkvCase) -> Result<Outcome, GpuError> {
    stage_case(gpu, tokens, c).map(Staged::finish)
}

/// [`run_case`]'s GPU half: both runs, the poison checks and the sampled rows downloaded and
/// compared with linear's; the twin is the host check.
pub fn stage_case(gpu: &Gpu, tokens: u64, c: &QkvCase) -> Result<Staged, GpuError> {
    plans(tokens, c, gpu.limits())?; // refuse a bad shape before allocating for it
    let ps = c.projections();
    let nb = c.k as usize / QK;
    let mut x = gpu.alloc::<u8>(tokens as usize * nb * BLOCK_Q8_1_BYTES)?;
    fill_q8_1_rows(gpu, &mut x, tokens as usize, nb, SEED_X, None, tokens)?;
    let mut ws = Vec::with_capacity(3);
    let (mut fused, mut plain) = (Vec::with_capacity(3), Vec::with_capacity(3));
    for (i, p) in ps.iter().enumerate() {
        let mut w = gpu.alloc::<u8>(p.n as usize * p.wtype.row_bytes(p.k as usize))?;
        fill_weights(gpu, &mut w, p.n as usize * p.wtype.blocks_per_row(p.k as usize), SEED_W[i], p.wtype)?;
        ws.push(w);
        fused.push(Guarded::new(gpu, tokens as usize * p.n as usize)?);
        plain.push(Guarded::new(gpu, tokens as usize * p.n as usize)?);
    }
    gpu.synchronize()?;
    let start = Instant::now();
    {
        let w_refs: Vec<&CudaSlice<u8>> = ws.iter().collect();
        let mut outs: Vec<&mut CudaSlice<u32>> = fused.iter_mut().map(|g| &mut g.buf).collect();
        launch(gpu, tokens, &ps, &x, &w_refs, &mut outs)?;
    }
    gpu.synchronize()?;
    let kernel_ms = start.elapsed().as_secs_f64() * 1e3;
    for ((p, w), out) in ps.iter().zip(&ws).zip(plain.iter_mut()) {
        linear::launch(gpu, tokens, p, &x, w, &mut out.buf)?;
    }
    let (mut unwritten, mut past_end, mut differ) = (0, 0, 0u64);
    let sampled = sample_rows(tokens, 8, SAMPLE_ROWS, tokens);
    // Per projection: its sampled columns and, per sampled row, the device's values there.
    let mut got: Vec<(Vec<u64>, Vec<Vec<f32>>)> = Vec::with_capacity(ps.len());
    for (i, p) in ps.iter().enumerate() {
        let (u, e) = fused[i].check(gpu, 1)?;
        unwritten += u;
        past_end += e;
        let n = p.n as u64;
        let cols = sample_rows(n, GEMV_WARPS as u64, SAMPLE_COLS, SEED_W[i]);
        let mut rows = Vec::with_capacity(sampled.len());
        let base = plain[i].read_rows_f32(gpu, &sampled, n as usize)?;
        for (row, base) in fused[i].read_rows_f32(gpu, &sampled, n as usize)?.into_iter().zip(&base) {
            differ += row.iter().zip(base).filter(|(a, b)| a.to_bits() != b.to_bits()).count() as u64;
            rows.push(cols.iter().map(|&col| row[col as usize]).collect());
        }
        got.push((cols, rows));
    }
    // The twin (weight rows regenerated per sampled column) runs beside the next cases.
    Ok(Staged::Check(Box::new(move || {
        let x_rows: Vec<Vec<BlockQ8_1>> = sampled.par_iter().map(|&r| q8_1_row(SEED_X, r, nb)).collect();
        let mut err = RelErr::default();
        let mut offset = 0u64;
        for (i, (p, (cols, rows))) in ps.iter().zip(&got).enumerate() {
            let n = p.n as u64;
            let weights: Vec<Vec<u8>> = cols.par_iter().map(|&col| weight_row(SEED_W[i], col, p.k as usize, p.wtype)).collect();
            for ((&r, xr), row) in sampled.iter().zip(&x_rows).zip(rows) {
                for ((&col, w), &g) in cols.iter().zip(&weights).zip(row) {
                    err.add(offset + r * n + col, g, p.wtype.dot_q8_1(w, xr));
                }
            }
            offset += tokens * n;
        }
        let mut check = Check::of_floats(&err, TOLERANCE, (unwritten, past_end), kernel_ms);
        check.int_mismatches += differ;
        if differ > 0 {
            check.note = format!("{differ} sampled outputs differ from linear's launches; {}", check.note);
        }
        Outcome::Ran(check)
    })))
}

/// The self-test's handle on this family (registered in `selftest::case`).
pub struct Family;

impl KernelFamily for Family {
    type Case = QkvCase;

    fn run(gpu: &Gpu, tokens: u64, c: &QkvCase) -> Result<Outcome, GpuError> {
        run_case(gpu, tokens, c)
    }

    fn stage(gpu: &Gpu, tokens: u64, c: &QkvCase) -> Result<Staged, GpuError> {
        stage_case(gpu, tokens, c)
    }

    fn plans(tokens: u64, c: &QkvCase, limits: &DeviceLimits) -> Result<Vec<Launch>, PlanError> {
        plans(tokens, c, limits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Qwen3-30B-A3B's q, k and v: 32 heads and 4 KV heads of 128 over a hidden of 2048, v in
    /// another format (as Q4_K_M files have it).
    const QWEN3: QkvCase = QkvCase { k: 2048, n: [4096, 512, 512], wtype: [WeightType::Q4K, WeightType::Q4K, WeightType::Q6K] };

    #[test]
    fn fused_grid_computes_every_column_of_every_matrix_once() {
        for ns in [vec![4096u32, 512, 512], vec![4097, 1, 9], vec![8, 8], vec![13]] {
            let ps: Vec<LinearCase> = ns.iter().map(|&n| LinearCase { n, k: 256, wtype: WeightType::Q8_0 }).collect();
            for limits in DeviceLimits::recorded() {
                for rows in 1..=GEMV_MAX_ROWS {
                    let p = plan(rows, &ps, &limits).unwrap_or_else(|e| panic!("{e}"));
                    assert_eq!(p.len(), 1);
                    let l = &p[0];
                    assert_eq!(l.kernel, GEMV3_KERNEL);
                    l.check_cover().unwrap();
                    let mut hits: Vec<Vec<u32>> = ns.iter().map(|&n| vec![0; n as usize]).collect();
                    for b in 0..l.grid[0] as u64 {
                        let (m, tile) = block_tile(b, &ns).unwrap_or_else(|| panic!("block {b} of {l} has no tile"));
                        for warp in 0..GEMV_WARPS as u64 {
                            let col = tile * GEMV_WARPS as u64 + warp;
                            if col < ns[m] as u64 {
                                hits[m][col as usize] += 1;
                            }
                        }
                    }
                    assert!(hits.iter().flatten().all(|&h| h == 1), "{l}");
                    // No block without a real column: the last tile of each matrix starts inside it.
                    assert_eq!(l.grid[0] as u64, ns.iter().map(|&n| tiles(n)).sum::<u64>());
                }
            }
        }
    }

    #[test]
    fn more_rows_are_linears_launches() {
        let l = DeviceLimits::h200();
        for rows in [9, 64, 65, 8192, 1 << 20] {
            let got = plans(rows, &QWEN3, &l).unwrap();
            let want: Vec<Launch> = QWEN3.projections().iter().map(|p| linear::plan(rows, p, &l).unwrap()).collect();
            assert_eq!(got, want);
        }
        assert_eq!(plans(8, &QWEN3, &l).unwrap()[0].grid, [512 + 64 + 64, 1, 1]);
    }

    #[test]
    fn bad_shapes_are_typed_errors() {
        let l = DeviceLimits::gb10();
        let p = QWEN3.projections();
        let four = [p[0], p[1], p[2], p[0]];
        let mixed = [p[0], LinearCase { k: 4096, ..p[1] }];
        let zero = [p[0], LinearCase { n: 0, ..p[1] }];
        let odd_k = [LinearCase { k: 100, ..p[0] }];
        for (ps, rows) in [(&four[..], 1), (&[][..], 1), (&mixed[..], 1), (&zero[..], 1), (&odd_k[..], 1), (&p[..], 0)] {
            assert!(matches!(plan(rows, ps, &l), Err(PlanError::Unsupported { .. })), "{ps:?} rows {rows}");
        }
    }

    #[test]
    fn twin_is_linears_twin_per_matrix() {
        let ps = [LinearCase { n: 5, k: 64, wtype: WeightType::Q8_0 }, LinearCase { n: 3, k: 64, wtype: WeightType::Q4_0 }];
        let x: Vec<BlockQ8_1> = (0..3).flat_map(|r| q8_1_row(SEED_X, r, 2)).collect();
        let ws: Vec<Vec<u8>> =
            ps.iter().enumerate().map(|(i, p)| (0..p.n as u64).flat_map(|c| weight_row(SEED_W[i], c, 64, p.wtype)).collect()).collect();
        let w_refs: Vec<&[u8]> = ws.iter().map(|w| w.as_slice()).collect();
        let got = qkv_cpu(&w_refs, &x, &ps);
        for (i, p) in ps.iter().enumerate() {
            assert_eq!(got[i], linear::linear_cpu(&ws[i], &x, p));
            assert_eq!(got[i].len(), 3 * p.n as usize);
        }
    }
}
