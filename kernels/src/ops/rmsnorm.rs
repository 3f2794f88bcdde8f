//! RMS norm: `y = x · (1 / sqrt(mean(x²) + eps)) · w` over rows of `width` floats.
//!
//! Two uses in qwen3moe: the hidden norm (one row of 2048 per token) and the per-head Q/K norm
//! (one row of head_dim 128 per head, `tokens × heads` rows, the same weight for every head),
//! which runs in place. Narrow rows get a warp each, 8 per block; wide rows (over
//! [`WARP_ROW_MAX`]) a block of 256 each. Rows are on grid.x either way (`cuda/rmsnorm.cu`).
//! The twin repeats the device's arithmetic step by step (fused multiply-adds in the same
//! order, the warps' xor butterfly, IEEE division and square root), so they agree bit for bit.

use std::time::Instant;

use cudarc::driver::{CudaView, CudaViewMut, DevicePtr, DevicePtrMut, DeviceRepr, PushKernelArg};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::check::{Check, KernelFamily, Outcome, RelErr, Staged, sample_rows};
use crate::cuda::{Gpu, GpuError};
use crate::launch::{Cover, Launch, PlanError, bytes_of, require_bytes};
use crate::limits::DeviceLimits;
use crate::ops::testdata::{GUARD_WORDS, Guarded, fill_uniform, in_place_diff, note_in_place_diff};
use crate::sources::RMSNORM;
use crate::testdata::uniform_row;
use crate::thresholds::{Critical, overflow_point, tile_tails};

pub const KERNEL: &str = "rmsnorm";
/// One warp per row, [`WARPS`] rows per block.
pub const WARP_KERNEL: &str = "rmsnorm_warp_rows";
/// One block per row.
pub const BLOCK_KERNEL: &str = "rmsnorm_block_rows";
/// The twin repeats every rounding of the device (see the module doc): expected bit-exact. The
/// margin admits an ulp of the largest output, 1000x below what a wrong element costs.
pub const TOLERANCE: f64 = 1e-6;
/// Rows up to this width get one warp each; wider rows a block.
pub const WARP_ROW_MAX: u32 = 1024;
const THREADS: u32 = 256;
/// Warps per block (`RMS_WARPS`): rows per block of the warp kernel.
pub const WARPS: u32 = THREADS / 32;
const SAMPLE_ROWS: usize = 512;

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct RmsNormCase {
    /// Row width: the hidden size, or head_dim for the per-head Q/K norm.
    pub width: u32,
    /// Rows per token: 1 for the hidden norm, the head count for the Q/K norm.
    pub rows_per_token: u32,
    /// `attention.layer_norm_rms_epsilon` (1e-6 for qwen3).
    pub eps: f32,
}

impl RmsNormCase {
    pub(crate) fn warp_per_row(&self) -> bool {
        self.width <= WARP_ROW_MAX
    }

    /// Threads that share a row's sum of squares (the twin follows their order).
    fn threads_per_row(&self) -> usize {
        if self.warp_per_row() { 32 } else { THREADS as usize }
    }

    pub(crate) fn rows_per_block(&self) -> u64 {
        if self.warp_per_row() { WARPS as u64 } else { 1 }
    }

    pub(crate) fn rows(&self, tokens: u64) -> u64 {
        tokens * self.rows_per_token as u64
    }

    pub(crate) fn shape(&self, tokens: u64) -> String {
        format!("tokens={tokens} rows_per_token={} width={} eps={:e}", self.rows_per_token, self.width, self.eps)
    }

    pub(crate) fn unsupported(&self, tokens: u64) -> Option<String> {
        if tokens == 0 {
            Some("0 tokens".into())
        } else if self.width == 0 || self.width > i32::MAX as u32 {
            Some(format!("row width {} must be in 1..2^31", self.width))
        } else if self.rows_per_token == 0 {
            Some("0 rows per token".into())
        } else if tokens.checked_mul(self.rows_per_token as u64 * self.width as u64).is_none() {
            Some("tokens × rows per token × width overflows 64 bits".into())
        } else if !(self.eps >= 0.0 && self.eps.is_finite()) {
            Some(format!("eps {} must be finite and >= 0", self.eps))
        } else {
            None
        }
    }
}

/// Every launch one norm of `tokens` makes (one).
pub fn plans(tokens: u64, c: &RmsNormCase, limits: &DeviceLimits) -> Result<Vec<Launch>, PlanError> {
    Ok(vec![plan(tokens, c, limits)?])
}

/// grid = (ceil(rows / 8), 1, 1) with a warp per row, or (rows, 1, 1) with a block per row.
pub fn plan(tokens: u64, c: &RmsNormCase, limits: &DeviceLimits) -> Result<Launch, PlanError> {
    if let Some(what) = c.unsupported(tokens) {
        return Err(PlanError::Unsupported { kernel: KERNEL.into(), what, shape: c.shape(tokens) });
    }
    let (rows, per_block) = (c.rows(tokens), c.rows_per_block());
    Launch::checked(
        if c.warp_per_row() { WARP_KERNEL } else { BLOCK_KERNEL },
        c.shape(tokens),
        [rows.div_ceil(per_block), 1, 1],
        [THREADS, 1, 1],
        0,
        vec![Cover::Tiles { axis: 0, items: rows, per_block }],
        limits,
    )
}

/// `values` added as one warp's xor butterfly adds its 32 lanes.
fn butterfly(values: &[f32]) -> f32 {
    let mut lanes = [0.0f32; 32];
    lanes[..values.len()].copy_from_slice(values);
    for o in [16, 8, 4, 2, 1] {
        lanes = std::array::from_fn(|l| lanes[l] + lanes[l ^ o]);
    }
    lanes[0]
}

/// Σ x² as `threads` device threads form it: thread j accumulates columns j, j + threads, …
/// with fused multiply-adds, each warp adds its partials in the butterfly, the warps' sums are
/// added in order.
fn sum_squares(x: &[f32], threads: usize) -> f32 {
    let mut part = vec![0.0f32; threads];
    for (col, &v) in x.iter().enumerate() {
        let p = &mut part[col % threads];
        *p = v.mul_add(v, *p);
    }
    part.chunks(32).fold(0.0f32, |ss, warp| ss + butterfly(warp))
}

/// `1 / sqrt(mean(x²) + eps)` of one row, rounded as on the device.
fn row_scale(x: &[f32], c: &RmsNormCase) -> f32 {
    1.0 / (sum_squares(x, c.threads_per_row()) / c.width as f32 + c.eps).sqrt()
}

/// CPU twin of one row: `y = (x · scale) · w`.
pub fn rmsnorm_row_cpu(x: &[f32], w: &[f32], c: &RmsNormCase, y: &mut [f32]) {
    let scale = row_scale(x, c);
    for ((y, &x), &w) in y.iter_mut().zip(x).zip(w) {
        *y = x * scale * w;
    }
}

/// CPU twin over every row of `x` (`[rows, width]`).
pub fn rmsnorm_cpu(x: &[f32], w: &[f32], c: &RmsNormCase) -> Vec<f32> {
    let mut y = x.to_vec();
    rmsnorm_in_place_cpu(&mut y, w, c);
    y
}

/// CPU twin in place (the Q/K norm), rows in parallel.
pub fn rmsnorm_in_place_cpu(x: &mut [f32], w: &[f32], c: &RmsNormCase) {
    x.par_chunks_mut(c.width.max(1) as usize).for_each(|row| {
        let scale = row_scale(row, c);
        row.iter_mut().zip(w).for_each(|(v, &w)| *v = *v * scale * w);
    });
}

/// Normalises the `tokens · rows_per_token` rows of `x` into `y` (f32 bits; any element type).
pub fn launch<Y: DeviceRepr>(
    gpu: &Gpu,
    tokens: u64,
    c: &RmsNormCase,
    x: &CudaView<f32>,
    w: &CudaView<f32>,
    y: &mut CudaViewMut<Y>,
) -> Result<(), GpuError> {
    let (x_bytes, y_bytes) = (bytes_of(x.len(), 4), bytes_of(y.len(), size_of::<Y>()));
    let (x_ptr, _x_done) = x.device_ptr(gpu.stream());
    let (y_ptr, _y_done) = y.device_ptr_mut(gpu.stream());
    launch_ptrs(gpu, tokens, c, (x_ptr, x_bytes), (y_ptr, y_bytes), w)
}

/// Normalises the rows of `x` in place (the per-head Q/K norm).
pub fn launch_in_place(gpu: &Gpu, tokens: u64, c: &RmsNormCase, x: &mut CudaViewMut<f32>, w: &CudaView<f32>) -> Result<(), GpuError> {
    let bytes = bytes_of(x.len(), 4);
    let (ptr, _done) = x.device_ptr_mut(gpu.stream());
    launch_ptrs(gpu, tokens, c, (ptr, bytes), (ptr, bytes), w)
}

/// The launch behind both entry points: `x` and `y` as (device address, bytes) so that they may
/// be the same buffer; the callers hold the buffers' stream guards until it is queued.
fn launch_ptrs(gpu: &Gpu, tokens: u64, c: &RmsNormCase, x: (u64, u64), y: (u64, u64), w: &CudaView<f32>) -> Result<(), GpuError> {
    let p = plan(tokens, c, gpu.limits())?;
    let n = 4 * c.rows(tokens) * c.width as u64;
    require_bytes(&p, &[("x", x.1, n), ("y", y.1, n), ("w", bytes_of(w.len(), 4), 4 * c.width as u64)])?;
    let f = gpu.function(&RMSNORM, &p.kernel)?;
    let (rows, width, eps) = (c.rows(tokens), c.width as i32, c.eps);
    let warp = c.warp_per_row();
    gpu.launch(&p, &f, |b| {
        b.arg(&x.0).arg(&y.0).arg(w);
        if warp {
            b.arg(&rows);
        }
        b.arg(&width).arg(&eps);
    })?;
    Ok(())
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// Counts this plan makes critical: where `x/y[row·width + col]` passes 2^31 − 1, the token
/// counts whose last block mixes real and spare rows (warp kernel), and where the blocks on
/// grid.x pass 65,535 (legal on x; rows on y or z would fail there).
pub fn critical_counts(c: &RmsNormCase, limits: &DeviceLimits) -> Vec<Critical> {
    let (rpt, per_block) = (c.rows_per_token.max(1) as u64, c.rows_per_block());
    let mut v = vec![Critical::new(1, "single token")];
    v.extend(overflow_point(rpt * c.width as u64, "rmsnorm: x/y[row·width + col] passes 2^31 − 1"));
    let tile = per_block / gcd(per_block, rpt);
    if tile > 1 {
        v.extend(tile_tails(tile, true, &[1, 2], &format!("rmsnorm: {per_block} rows per block, {rpt} per token")));
    }
    let last = limits.max_grid_dim[1] as u64 * per_block / rpt;
    for t in [last, last + 1] {
        v.push(Critical::new(t, format!("rmsnorm: {} blocks on grid.x, around 65,535", (t * rpt).div_ceil(per_block))));
    }
    v
}

/// Input, weight and the guarded output of a self-test case.
pub fn device_bytes(tokens: u64, c: &RmsNormCase) -> u64 {
    let n = c.rows(tokens) * c.width as u64;
    4 * (n + c.width as u64 + n + GUARD_WORDS as u64)
}

const SEED_X: u64 = 0x50;
const SEED_W: u64 = 0x51;
const X_SCALE: f32 = 4.0;

/// The twin's rows `rows` of a case whose x comes from `(seed, scale)` and w from `w_seed`, as
/// the self-tests of this kernel and of `rmsnorm_q8_1` fill them.
pub(crate) fn twin_rows(c: &RmsNormCase, rows: &[u64], (x_seed, x_scale): (u64, f32), w_seed: u64) -> Vec<Vec<f32>> {
    let width = c.width as usize;
    let w_host = uniform_row(w_seed, 0, width, 1.0);
    rows.par_iter()
        .map(|&r| {
            let mut out = vec![0.0f32; width];
            rmsnorm_row_cpu(&uniform_row(x_seed, r * width as u64, width, x_scale), &w_host, c, &mut out);
            out
        })
        .collect()
}

/// Self-test: x and w from seeds, y poisoned; sampled rows compared with the twin; then the
/// in-place launch over x must reproduce y bit for bit on those rows.
pub fn run_case(gpu: &Gpu, tokens: u64, c: &RmsNormCase) -> Result<Outcome, GpuError> {
    stage_case(gpu, tokens, c).map(Staged::finish)
}

/// [`run_case`]'s GPU half: the fills, the kernel, the poison check, the sampled rows of y
/// (downloaded in runs), the in-place launch and its bit-for-bit difference from y on those
/// rows; the twin of the rows and the comparison are left to the host check.
pub fn stage_case(gpu: &Gpu, tokens: u64, c: &RmsNormCase) -> Result<Staged, GpuError> {
    plan(tokens, c, gpu.limits())?; // a bad shape is refused before anything is allocated
    let (width, rows) = (c.width as usize, c.rows(tokens));
    let n = rows as usize * width;
    let mut x = gpu.alloc::<f32>(n)?;
    let mut w = gpu.alloc::<f32>(width)?;
    fill_uniform(gpu, &mut x, n, SEED_X, X_SCALE)?;
    fill_uniform(gpu, &mut w, width, SEED_W, 1.0)?;
    let mut y = Guarded::new(gpu, n)?;
    gpu.synchronize()?;
    let start = Instant::now();
    launch(gpu, tokens, c, &x.as_view(), &w.as_view(), &mut y.buf.slice_mut(..n))?;
    gpu.synchronize()?;
    let kernel_ms = start.elapsed().as_secs_f64() * 1e3;
    let guard = y.check(gpu, 1)?;
    let sampled = sample_rows(rows, 64, SAMPLE_ROWS, rows);
    let got = y.read_rows_f32(gpu, &sampled, width)?;
    launch_in_place(gpu, tokens, c, &mut x.as_view_mut(), &w.as_view())?;
    let diff = in_place_diff(gpu, &sampled, width, &x, &y)?;
    let c = *c;
    Ok(Staged::Check(Box::new(move || {
        let want = twin_rows(&c, &sampled, (SEED_X, X_SCALE), SEED_W);
        let mut err = RelErr::default();
        for ((&r, want), got) in sampled.iter().zip(&want).zip(&got) {
            err.add_slice((r as usize * width) as u64, got, want);
        }
        let check = Check::of_floats(&err, TOLERANCE, guard, kernel_ms);
        Outcome::Ran(note_in_place_diff(check, diff))
    })))
}

/// The self-test's handle on this family (registered in `selftest::case`).
pub struct Family;

impl KernelFamily for Family {
    type Case = RmsNormCase;

    fn run(gpu: &Gpu, tokens: u64, c: &RmsNormCase) -> Result<Outcome, GpuError> {
        run_case(gpu, tokens, c)
    }

    fn stage(gpu: &Gpu, tokens: u64, c: &RmsNormCase) -> Result<Staged, GpuError> {
        stage_case(gpu, tokens, c)
    }

    fn plans(tokens: u64, c: &RmsNormCase, limits: &DeviceLimits) -> Result<Vec<Launch>, PlanError> {
        plans(tokens, c, limits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HIDDEN: RmsNormCase = RmsNormCase { width: 2048, rows_per_token: 1, eps: 1e-6 };
    const Q_NORM: RmsNormCase = RmsNormCase { width: 128, rows_per_token: 32, eps: 1e-6 };
    const K_NORM: RmsNormCase = RmsNormCase { width: 128, rows_per_token: 4, eps: 1e-6 };

    /// y = x / sqrt(Σx²/width + eps) · w, all in f64.
    fn scalar_row(x: &[f32], w: &[f32], eps: f32) -> Vec<f64> {
        let ms = x.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / x.len() as f64;
        let scale = 1.0 / (ms + eps as f64).sqrt();
        x.iter().zip(w).map(|(&x, &w)| x as f64 * scale * w as f64).collect()
    }

    #[test]
    fn twin_matches_f64_formula() {
        for (width, rpt) in [(2048, 1), (128, 3), (100, 2), (1, 5), (1025, 1), (4096, 1)] {
            for eps in [1e-6f32, 1e-5, 0.0] {
                let c = RmsNormCase { width, rows_per_token: rpt, eps };
                let n = (width * rpt) as usize;
                let x = uniform_row(1, 0, n, X_SCALE);
                let w = uniform_row(2, 0, width as usize, 1.0);
                let y = rmsnorm_cpu(&x, &w, &c);
                for (r, (xr, yr)) in x.chunks(width as usize).zip(y.chunks(width as usize)).enumerate() {
                    let want = scalar_row(xr, &w, eps);
                    let max = want.iter().fold(0f64, |m, v| m.max(v.abs()));
                    for (col, (g, r64)) in yr.iter().zip(&want).enumerate() {
                        assert!((*g as f64 - r64).abs() <= 2e-6 * max, "{c:?} row {r} col {col}: {g} vs {r64}");
                    }
                }
            }
        }
    }

    #[test]
    fn device_order_sum_matches_plain_sum() {
        let x = uniform_row(3, 0, 2048, X_SCALE);
        let plain: f64 = x.iter().map(|&v| v as f64 * v as f64).sum();
        for threads in [32, 256] {
            let s = sum_squares(&x, threads) as f64;
            assert!((s - plain).abs() <= 1e-6 * plain, "{threads}: {s} vs {plain}");
        }
        // One warp of 32 lanes, lane l holding l: the butterfly is an exact integer sum.
        let lanes: Vec<f32> = (0..32).map(|l| l as f32).collect();
        assert_eq!(butterfly(&lanes), 496.0);
    }

    #[test]
    fn in_place_and_row_twins_agree() {
        let x = uniform_row(4, 0, 128 * 6, X_SCALE);
        let w = uniform_row(5, 0, 128, 1.0);
        let y = rmsnorm_cpu(&x, &w, &K_NORM);
        for (xr, yr) in x.chunks(128).zip(y.chunks(128)) {
            let mut out = vec![0.0; 128];
            rmsnorm_row_cpu(xr, &w, &K_NORM, &mut out);
            assert_eq!(out, yr);
        }
    }

    #[test]
    fn plans_cover_every_row_once() {
        for limits in DeviceLimits::recorded() {
            for c in [HIDDEN, Q_NORM, K_NORM] {
                for tokens in (1..=256).chain([8191, 8192, 14_135, 1 << 20]) {
                    let p = plans(tokens, &c, &limits).unwrap_or_else(|e| panic!("{e}"));
                    assert_eq!(p.len(), 1);
                    let l = &p[0];
                    let rows = tokens * c.rows_per_token as u64;
                    let (kernel, blocks) = if c.width <= WARP_ROW_MAX { (WARP_KERNEL, rows.div_ceil(8)) } else { (BLOCK_KERNEL, rows) };
                    assert_eq!((l.kernel.as_str(), l.grid), (kernel, [blocks as u32, 1, 1]), "{l}");
                    l.check_cover().unwrap();
                    if tokens <= 256 {
                        assert!(l.simulate_cover(0).iter().all(|&h| h == 1), "{l}");
                    }
                }
            }
        }
    }

    #[test]
    fn bad_shapes_are_typed_errors() {
        let l = DeviceLimits::gb10();
        let bad = [
            (0, HIDDEN),
            (1, RmsNormCase { width: 0, ..HIDDEN }),
            (1, RmsNormCase { width: 1 << 31, ..HIDDEN }),
            (1, RmsNormCase { rows_per_token: 0, ..Q_NORM }),
            (1, RmsNormCase { eps: f32::NAN, ..HIDDEN }),
            (1, RmsNormCase { eps: -1e-6, ..HIDDEN }),
            (1, RmsNormCase { eps: f32::INFINITY, ..HIDDEN }),
        ];
        for (tokens, c) in bad {
            assert!(matches!(plans(tokens, &c, &l), Err(PlanError::Unsupported { .. })), "{c:?}");
        }
        // 2^31 row tiles do not fit grid.x: a typed error, not a wrapped grid.
        let huge = RmsNormCase { rows_per_token: u32::MAX, ..Q_NORM };
        assert!(matches!(plans(1 << 20, &huge, &l), Err(PlanError::GridDim { axis: 'x', .. })));
    }

    #[test]
    fn critical_counts_for_qwen3() {
        let l = DeviceLimits::h200();
        let counts = |c: &RmsNormCase| -> Vec<u64> { critical_counts(c, &l).iter().map(|c| c.tokens).collect() };
        // hidden: 2^31 / 2048; Q: 2^31 / 4096; K: 2^31 / 512 (elements per token).
        for (c, want) in [
            (HIDDEN, vec![1, 1_048_575, 1_048_576, 65_535, 65_536]),
            (Q_NORM, vec![524_287, 524_288, 16_383, 16_384]),
            (K_NORM, vec![4_194_303, 4_194_304, 131_070, 131_071, 1, 2, 3, 4, 5]),
        ] {
            let got = counts(&c);
            for t in want {
                assert!(got.contains(&t), "{c:?}: {t} missing from {got:?}");
            }
        }
        // 32 rows per token fill whole blocks of 8: no tails to test.
        assert!(!counts(&Q_NORM).contains(&3));
    }
}
