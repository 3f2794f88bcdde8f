//! Latent dense projection with a grouped RMS norm epilogue: the kernel class of the third
//! failure of the design (a warp deadlock on a partly filled last row tile).
//!
//! `y[t, c] = Σ_b dot(w[c, block b], x[t, block b])` with q8_1 activations `x [T, K/32]` and
//! q8_0/q4_0 weights `w [W, K]`; then the `W` outputs of each row are split into `groups`
//! groups, each scaled by `rsqrt(mean(y²) + 1e-6)`. Geometry: 64-row tiles on `grid.x` (they
//! grow with tokens), groups on `grid.y` (bounded), 256 threads = 8 warps × 8 rows × 4 lanes.
//! Spare rows of the last tile compute on row `T − 1` and join every shuffle; only their
//! stores are masked. `cuda/neg_latent_tailskip.cu` is the broken twin that skips the shuffles.

use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::{CudaSlice, DeviceRepr, PushKernelArg};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::check::{Check, KernelFamily, Outcome, RelErr, Staged, sample_rows};
use crate::cuda::{Gpu, GpuError};
use crate::launch::{Cover, Launch, PlanError};
use crate::limits::DeviceLimits;
use crate::ops::testdata::{GUARD_WORDS, Guarded, fill_q8_1_rows, fill_weights};
use crate::quant::{BLOCK_Q8_1_BYTES, BlockQ8_1, QK, WeightType};
use crate::sources::{KernelSource, LATENT_PROJ, NEG_LATENT_TAILSKIP};
use crate::testdata::{q8_1_row, shared_twin_row, shared_weight_rows};
use crate::thresholds::{Critical, overflow_point, tile_tails};

pub const KERNEL: &str = "latent_proj";
/// The negative control's kernel (`cuda/neg_latent_tailskip.cu`): hangs when T % 8 != 0.
pub const TAILSKIP_KERNEL: &str = "latent_proj_tailskip_broken";
/// The integer block dots are exact on both sides; only the f32 summation order of the sums of
/// squares, FMA contraction and the approximate `rsqrtf`/`__fdividef` differ (~1e-6 relative).
pub const TOLERANCE: f64 = 1e-4;
/// Rows per block (`LP_TILE_M`); the kernel's 8 warps hold 8 rows each.
pub const TILE_M: u64 = 64;
/// Rows one warp holds: a warp mixes real and spare rows when `T % ROWS_PER_WARP != 0`.
pub const ROWS_PER_WARP: u64 = 8;
const THREADS: u32 = 256;
const EPS: f32 = 1e-6;
/// Rows compared with the twin: all up to this, else `sample_rows` (tails included).
const SAMPLE_ROWS: usize = 256;

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct LatentCase {
    /// Input width K (a multiple of 32).
    pub k: u32,
    /// Output (latent) width W.
    pub width: u32,
    /// Groups the W outputs of a row are split into, each RMS-normalised on its own.
    pub groups: u32,
    pub wtype: WeightType,
}

impl LatentCase {
    /// Columns per group.
    pub fn group_width(&self) -> usize {
        (self.width / self.groups.max(1)) as usize
    }

    fn blocks_per_row(&self) -> usize {
        self.k as usize / QK
    }

    fn shape(&self, tokens: u64) -> String {
        format!("tokens={tokens} k={} width={} groups={} wtype={}", self.k, self.width, self.groups, self.wtype)
    }

    /// Why the kernel cannot take this problem, if it cannot.
    fn unsupported(&self, tokens: u64) -> Option<String> {
        let max = i32::MAX as u32;
        if tokens == 0 {
            Some("0 tokens".into())
        } else if !self.wtype.is_legacy() {
            Some(format!("{} weights: the latent projection takes q8_0 and q4_0", self.wtype))
        } else if self.k == 0 || !(self.k as usize).is_multiple_of(QK) || self.k > max {
            Some(format!("K = {} is not a positive multiple of {QK} below 2^31", self.k))
        } else if self.groups == 0 || self.width == 0 || !self.width.is_multiple_of(self.groups) || self.width > max {
            Some(format!("width {} does not split into {} equal groups (or passes 2^31)", self.width, self.groups))
        } else {
            None
        }
    }
}

/// Every launch one projection of `tokens` rows makes (one).
pub fn plans(tokens: u64, c: &LatentCase, limits: &DeviceLimits) -> Result<Vec<Launch>, PlanError> {
    Ok(vec![plan(tokens, c, limits)?])
}

/// grid = (ceil(T / 64) row tiles, groups, 1), block = 256.
pub fn plan(tokens: u64, c: &LatentCase, limits: &DeviceLimits) -> Result<Launch, PlanError> {
    if let Some(what) = c.unsupported(tokens) {
        return Err(PlanError::Unsupported { kernel: KERNEL.into(), what, shape: c.shape(tokens) });
    }
    let groups = c.groups as u64;
    Launch::checked(
        KERNEL,
        c.shape(tokens),
        [tokens.div_ceil(TILE_M), groups, 1],
        [THREADS, 1, 1],
        0,
        vec![Cover::Tiles { axis: 0, items: tokens, per_block: TILE_M }, Cover::Tiles { axis: 1, items: groups, per_block: 1 }],
        limits,
    )
}

/// CPU twin of one output row: `w` holds the `width` weight rows back to back, `x` the row's
/// `K/32` activation blocks. Same block formulas and block order as the kernel.
pub fn latent_row_cpu(w: &[u8], x: &[BlockQ8_1], c: &LatentCase) -> Vec<f32> {
    let mut y: Vec<f32> = w.chunks_exact(c.wtype.row_bytes(c.k as usize)).map(|wr| c.wtype.dot_q8_1(wr, x)).collect();
    y.chunks_exact_mut(c.group_width()).for_each(rms_norm_group);
    y
}

/// `y *= 1 / sqrt(mean(y²) + 1e-6)` over one group, in f32 as on the GPU.
fn rms_norm_group(g: &mut [f32]) {
    let ss: f32 = g.iter().map(|v| v * v).sum();
    let scale = 1.0 / (ss / g.len() as f32 + EPS).sqrt();
    g.iter_mut().for_each(|v| *v *= scale);
}

/// CPU twin over a whole batch: `x` is `[tokens, K/32]` blocks; returns `[tokens, width]`.
pub fn latent_proj_cpu(w: &[u8], x: &[BlockQ8_1], c: &LatentCase) -> Vec<f32> {
    x.par_chunks_exact(c.blocks_per_row()).flat_map_iter(|xr| latent_row_cpu(w, xr, c)).collect()
}

/// Launches the projection: `w` `[width, K]` weight blocks, `x` `[tokens, K/32]` q8_1 blocks,
/// `y` `[tokens, width]` f32 (any 4-byte element type holding f32 bits).
pub fn launch<Y: DeviceRepr>(
    gpu: &Gpu,
    tokens: u64,
    c: &LatentCase,
    w: &CudaSlice<u8>,
    x: &CudaSlice<u8>,
    y: &mut CudaSlice<Y>,
) -> Result<(), GpuError> {
    launch_variant(gpu, Variant::Fixed, tokens, c, w, x, y)
}

/// The fixed kernel, or the negative control built on the same plan.
#[derive(Clone, Copy)]
enum Variant {
    Fixed,
    TailSkip,
}

impl Variant {
    fn kernel(self) -> (&'static KernelSource, &'static str) {
        match self {
            Variant::Fixed => (&LATENT_PROJ, KERNEL),
            Variant::TailSkip => (&NEG_LATENT_TAILSKIP, TAILSKIP_KERNEL),
        }
    }
}

fn launch_variant<Y: DeviceRepr>(
    gpu: &Gpu,
    variant: Variant,
    tokens: u64,
    c: &LatentCase,
    w: &CudaSlice<u8>,
    x: &CudaSlice<u8>,
    y: &mut CudaSlice<Y>,
) -> Result<(), GpuError> {
    let (source, name) = variant.kernel();
    let mut p = plan(tokens, c, gpu.limits())?;
    p.kernel = name.into();
    check_buffers(&p, tokens, c, w.len(), x.len(), y.len() * size_of::<Y>())?;
    let f = gpu.function(source, name)?;
    let (code, nb, width, gw) = (c.wtype.code(), c.blocks_per_row() as i32, c.width as i32, c.group_width() as i32);
    gpu.launch(&p, &f, |b| {
        b.arg(w).arg(&code).arg(x).arg(y).arg(&tokens).arg(&nb).arg(&width).arg(&gw);
    })?;
    Ok(())
}

/// Refuses buffers smaller than the launch reads or writes: a launch never goes out of bounds.
fn check_buffers(p: &Launch, tokens: u64, c: &LatentCase, w: usize, x: usize, y: usize) -> Result<(), PlanError> {
    let need = [
        ("w", w as u64, c.width as u64 * c.wtype.row_bytes(c.k as usize) as u64),
        ("x", x as u64, tokens * (c.blocks_per_row() * BLOCK_Q8_1_BYTES) as u64),
        ("y", y as u64, tokens * c.width as u64 * 4),
    ];
    match need.iter().find(|(_, have, want)| have < want) {
        Some((name, have, want)) => Err(PlanError::Unsupported {
            kernel: p.kernel.clone(),
            what: format!("buffer {name} holds {have} B, the launch needs {want} B"),
            shape: p.shape.clone(),
        }),
        None => Ok(()),
    }
}

/// Counts this kernel's plan makes critical: where its flattened indexes pass 2^31 − 1, the
/// tails of its 64-row tiles, and of the 8-row warps (a warp holding real and spare rows).
pub fn critical_counts(c: &LatentCase, _limits: &DeviceLimits) -> Vec<Critical> {
    let mut v = vec![Critical::new(1, "single token: 1 real row, 63 spare")];
    v.extend(overflow_point(c.width as u64, "latent_proj: y[row·W + col] passes 2^31 − 1"));
    v.extend(overflow_point(c.blocks_per_row() as u64, "latent_proj: x block index row·(K/32) + b passes 2^31 − 1"));
    v.extend(tile_tails(TILE_M, false, &[1, 2], "latent_proj: 64-row tile"));
    v.extend(tile_tails(ROWS_PER_WARP, false, &[1, 2], "latent_proj: 8 rows per warp"));
    v
}

/// Weights, activations and the guarded output of a self-test case.
pub fn device_bytes(tokens: u64, c: &LatentCase) -> u64 {
    let w = c.width as u64 * c.wtype.row_bytes(c.k as usize) as u64;
    let x = tokens * (c.blocks_per_row() * BLOCK_Q8_1_BYTES) as u64;
    w + x + 4 * (tokens * c.width as u64 + GUARD_WORDS as u64)
}

const SEED_W: u64 = 0x30;
const SEED_X: u64 = 0x31;

/// Self-test: weights and activations from seeds, output poisoned, compared with the twin on
/// all rows (T <= 256) or on sampled rows that include the last two tiles.
pub fn run_case(gpu: &Gpu, tokens: u64, c: &LatentCase) -> Result<Outcome, GpuError> {
    run_variant(gpu, Variant::Fixed, tokens, c)
}

/// Negative control: the same case through the kernel whose spare-row lanes `continue` past
/// the shuffles. It hangs when a warp holds real and spare rows (the runner kills the worker at
/// the deadline); with `tokens` a multiple of 64 it must pass like `run_case`.
pub fn run_negative_tailskip(gpu: &Gpu, tokens: u64, c: &LatentCase) -> Result<Outcome, GpuError> {
    run_variant(gpu, Variant::TailSkip, tokens, c)
}

/// Fault injection for the engine's watchdog tests: queues the tail-skip kernel on a shape
/// that deadlocks (5 rows: one warp holds real and spare rows) and returns without waiting.
/// Everything queued after it on the stream waits forever; only ending the process frees the
/// device. The buffers are freed in stream order, so after the kernel that never ends.
pub fn queue_hang(gpu: &Gpu) -> Result<(), GpuError> {
    const HANG: LatentCase = LatentCase { k: 256, width: 24, groups: 3, wtype: WeightType::Q8_0 };
    const ROWS: u64 = 5;
    let nb = HANG.blocks_per_row();
    let mut w = gpu.alloc::<u8>(HANG.width as usize * HANG.wtype.row_bytes(HANG.k as usize))?;
    let mut x = gpu.alloc::<u8>(ROWS as usize * nb * BLOCK_Q8_1_BYTES)?;
    fill_weights(gpu, &mut w, HANG.width as usize * nb, SEED_W, HANG.wtype)?;
    fill_q8_1_rows(gpu, &mut x, ROWS as usize, nb, SEED_X, None, ROWS)?;
    let mut y = gpu.alloc::<f32>(ROWS as usize * HANG.width as usize)?;
    launch_variant(gpu, Variant::TailSkip, ROWS, &HANG, &w, &x, &mut y)
}

fn run_variant(gpu: &Gpu, variant: Variant, tokens: u64, c: &LatentCase) -> Result<Outcome, GpuError> {
    stage_variant(gpu, variant, tokens, c).map(Staged::finish)
}

/// [`run_variant`]'s GPU half: up to the sampled rows downloaded; the twin is the host check.
fn stage_variant(gpu: &Gpu, variant: Variant, tokens: u64, c: &LatentCase) -> Result<Staged, GpuError> {
    plan(tokens, c, gpu.limits())?; // refuse a bad shape before allocating for it
    let nb = c.blocks_per_row();
    let width = c.width as usize;
    let rows = tokens as usize;
    let mut w = gpu.alloc::<u8>(width * c.wtype.row_bytes(c.k as usize))?;
    let mut x = gpu.alloc::<u8>(rows * nb * BLOCK_Q8_1_BYTES)?;
    fill_weights(gpu, &mut w, width * nb, SEED_W, c.wtype)?;
    fill_q8_1_rows(gpu, &mut x, rows, nb, SEED_X, None, tokens)?;
    let mut y = Guarded::new(gpu, rows * width)?;
    gpu.synchronize()?;
    let start = Instant::now();
    launch_variant(gpu, variant, tokens, c, &w, &x, &mut y.buf)?;
    gpu.synchronize()?;
    let kernel_ms = start.elapsed().as_secs_f64() * 1e3;
    let (unwritten, past_end) = y.check(gpu, 1)?;
    let rows = sample_rows(tokens, TILE_M, SAMPLE_ROWS, tokens);
    // One copy per run of nearby rows (the first and last tiles are runs), not one per row.
    let got = y.read_rows_f32(gpu, &rows, width)?;
    let c = *c;
    Ok(Staged::Check(Box::new(move || {
        let err = compare(&got, &rows, &c);
        Outcome::Ran(Check::of_floats(&err, TOLERANCE, (unwritten, past_end), kernel_ms))
    })))
}

/// The twin's rows (computed in parallel from the seeds) against the GPU's (`got`, the sampled
/// `rows` in order).
fn compare(got: &[Vec<f32>], rows: &[u64], c: &LatentCase) -> RelErr {
    let (k, nb, width) = (c.k as usize, c.blocks_per_row(), c.width as usize);
    // Row t depends on the shape and t only: each is computed once per process and shared with
    // the family's other cases (they all compare the first tile, neighbouring counts most of
    // their tails), from weights generated once per process.
    let what = format!("latent_proj w{SEED_W:#x} x{SEED_X:#x} {c:?}");
    let want: Vec<Arc<Vec<f32>>> = rows
        .par_iter()
        .map(|&t| {
            shared_twin_row(&what, t, || {
                let weights = shared_weight_rows(SEED_W, c.wtype, k, 0, c.width as u64);
                latent_row_cpu(&weights, &q8_1_row(SEED_X, t, nb), c)
            })
        })
        .collect();
    let mut err = RelErr::default();
    for ((&t, want), got) in rows.iter().zip(&want).zip(got) {
        err.add_slice((t as usize * width) as u64, got, want);
    }
    err
}

/// The host work of one case without the device (the bench of the self-test's host costs).
#[cfg(test)]
pub(crate) fn host_half(tokens: u64, c: &LatentCase) -> usize {
    let rows = sample_rows(tokens, TILE_M, SAMPLE_ROWS, tokens);
    let got: Vec<Vec<f32>> = rows.iter().map(|_| vec![0.0; c.width as usize]).collect();
    compare(&got, &rows, c).compared as usize
}

/// The self-test's handle on this family (registered in `selftest::case`).
pub struct Family;

impl KernelFamily for Family {
    type Case = LatentCase;

    fn run(gpu: &Gpu, tokens: u64, c: &LatentCase) -> Result<Outcome, GpuError> {
        run_case(gpu, tokens, c)
    }

    fn stage(gpu: &Gpu, tokens: u64, c: &LatentCase) -> Result<Staged, GpuError> {
        stage_variant(gpu, Variant::Fixed, tokens, c)
    }

    fn plans(tokens: u64, c: &LatentCase, limits: &DeviceLimits) -> Result<Vec<Launch>, PlanError> {
        plans(tokens, c, limits)
    }
}

/// The negative control whose tail lanes skip the epilogue's shuffles; plans as its fixed twin.
pub struct NegTailSkip;

impl KernelFamily for NegTailSkip {
    type Case = LatentCase;
    const NEGATIVE_CONTROL: bool = true;

    fn run(gpu: &Gpu, tokens: u64, c: &LatentCase) -> Result<Outcome, GpuError> {
        run_negative_tailskip(gpu, tokens, c)
    }

    fn plans(tokens: u64, c: &LatentCase, limits: &DeviceLimits) -> Result<Vec<Launch>, PlanError> {
        plans(tokens, c, limits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::dequantize_q8_1;
    use crate::testdata::weight_row;

    const QWEN: LatentCase = LatentCase { k: 2560, width: 1792, groups: 8, wtype: WeightType::Q4_0 };

    /// Dequantize, dot in f64, RMS-normalise each group in f64.
    fn scalar_row(w: &[Vec<u8>], x: &[BlockQ8_1], c: &LatentCase) -> Vec<f64> {
        let xd = dequantize_q8_1(x);
        let y: Vec<f64> = w.iter().map(|wr| c.wtype.dequantize_row(wr).iter().zip(&xd).map(|(a, b)| *a as f64 * *b as f64).sum()).collect();
        y.chunks(c.group_width())
            .flat_map(|g| {
                let scale = 1.0 / (g.iter().map(|v| v * v).sum::<f64>() / g.len() as f64 + 1e-6).sqrt();
                g.iter().map(move |v| v * scale)
            })
            .collect()
    }

    #[test]
    fn cpu_twin_matches_dequantized_f64_formula() {
        for wtype in WeightType::LEGACY {
            let c = LatentCase { k: 256, width: 24, groups: 3, wtype };
            let nb = c.blocks_per_row();
            let rows: Vec<Vec<u8>> = (0..c.width as u64).map(|r| weight_row(5, r, c.k as usize, wtype)).collect();
            let x: Vec<BlockQ8_1> = (0..4).flat_map(|t| q8_1_row(6, t, nb)).collect();
            let got = latent_proj_cpu(&rows.concat(), &x, &c);
            assert_eq!(got.len(), 4 * c.width as usize);
            for (t, xr) in x.chunks(nb).enumerate() {
                let want = scalar_row(&rows, xr, &c);
                for (col, (g, r)) in got[t * c.width as usize..].iter().zip(&want).enumerate() {
                    // Outputs are RMS-normalised (~1); q4_0 goes through the f16 s = d·Σq.
                    assert!((*g as f64 - r).abs() < 5e-3, "{wtype} row {t} col {col}: {g} vs {r}");
                }
            }
        }
    }

    #[test]
    fn each_group_has_unit_rms() {
        let c = LatentCase { k: 64, width: 16, groups: 4, wtype: WeightType::Q8_0 };
        let w: Vec<u8> = (0..16).flat_map(|r| weight_row(1, r, 64, c.wtype)).collect();
        let y = latent_row_cpu(&w, &q8_1_row(2, 0, 2), &c);
        for g in y.chunks(4) {
            let ms = g.iter().map(|v| (v * v) as f64).sum::<f64>() / 4.0;
            assert!((ms - 1.0).abs() < 1e-3, "{ms}");
        }
    }

    #[test]
    fn plans_cover_every_row_tile_and_group_once() {
        for limits in DeviceLimits::recorded() {
            for tokens in (1..=256).chain([8191, 8192, 1 << 20]) {
                let p = plans(tokens, &QWEN, &limits).unwrap();
                assert_eq!(p.len(), 1);
                let l = &p[0];
                assert_eq!(l.grid, [tokens.div_ceil(64) as u32, 8, 1], "{l}");
                assert_eq!(l.threads_per_block(), 64 * 4);
                l.check_cover().unwrap();
                if tokens <= 256 {
                    for i in 0..l.cover.len() {
                        assert!(l.simulate_cover(i).iter().all(|&h| h == 1), "{l} cover {i}");
                    }
                }
            }
        }
    }

    #[test]
    fn bad_shapes_are_typed_errors() {
        let l = DeviceLimits::gb10();
        let bad = [
            (0, QWEN),
            (5, LatentCase { k: 2561, ..QWEN }),
            (5, LatentCase { k: 0, ..QWEN }),
            (5, LatentCase { groups: 0, ..QWEN }),
            (5, LatentCase { groups: 9, ..QWEN }),
            (5, LatentCase { width: 0, ..QWEN }),
            (5, LatentCase { k: 2560, wtype: WeightType::Q4K, ..QWEN }),
        ];
        for (tokens, c) in bad {
            assert!(matches!(plans(tokens, &c, &l), Err(PlanError::Unsupported { .. })), "{c:?}");
        }
        let many = LatentCase { width: 65_536 * 4, groups: 65_536, ..QWEN };
        assert!(matches!(plans(1, &many, &l), Err(PlanError::GridDim { axis: 'y', .. })));
    }

    #[test]
    fn critical_counts_for_the_failing_shape() {
        let counts: Vec<u64> = critical_counts(&QWEN, &DeviceLimits::gb10()).iter().map(|c| c.tokens).collect();
        // y: (2^31 − 1) / 1792 = 1,198,372.6; x blocks: (2^31 − 1) / 80 = 26,843,545.6.
        for t in [1_198_372, 1_198_373, 26_843_545, 26_843_546, 63, 64, 65, 127, 128, 129, 7, 8, 9] {
            assert!(counts.contains(&t), "{t} missing from {counts:?}");
        }
    }

    #[test]
    fn buffers_too_small_are_refused() {
        let c = LatentCase { k: 64, width: 16, groups: 2, wtype: WeightType::Q8_0 };
        let p = plan(3, &c, &DeviceLimits::h200()).unwrap();
        let (w, x, y) = (16 * 68, 3 * 2 * 36, 3 * 16 * 4);
        assert!(check_buffers(&p, 3, &c, w, x, y).is_ok());
        assert!(check_buffers(&p, 3, &c, w - 1, x, y).is_err());
        assert!(check_buffers(&p, 3, &c, w, x - 1, y).is_err());
        assert!(check_buffers(&p, 3, &c, w, x, y - 4).is_err());
    }
}
