//! Qwen3's per-head Q/K RMS norm fused with the NEOX rotary embedding: `y = rope(rmsnorm(x))`
//! over `[tokens, heads, head_dim]`, bit for bit [`rmsnorm`] (its warp-per-row geometry) then
//! [`rope`], in one launch instead of two.
//!
//! `rmsnorm_rope_neox` (`cuda/rmsnorm.cu`): a warp per (token, head) row, 8 rows per block,
//! rows on grid.x; the warp's sum of squares and scale are `rmsnorm_warp_rows`'; then lane l
//! normalises and rotates the pairs (i, i + d/2), i = l, l + 32, … with `rope_neox`'s angle and
//! products. So head_dim must be a row the plain norm gives a warp (at most
//! [`rmsnorm::WARP_ROW_MAX`]) and even. The twin is the composition of the two existing twins;
//! the self-test also runs the two existing kernels and counts any differing output.

use std::time::Instant;

use cudarc::driver::{CudaView, CudaViewMut, DevicePtr, DevicePtrMut, DeviceRepr, PushKernelArg};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::check::{Check, KernelFamily, Outcome, RelErr, Staged, sample_rows};
use crate::cuda::{Gpu, GpuError};
use crate::launch::{Cover, Launch, PlanError, bytes_of, require_bytes};
use crate::limits::DeviceLimits;
use crate::ops::rmsnorm::{self, RmsNormCase, WARP_ROW_MAX, WARPS};
use crate::ops::rope::{self, RopeSpec, RopeTable};
use crate::ops::testdata::{GUARD_WORDS, Guarded, download_rows, fill_uniform, in_place_diff, note_in_place_diff};
use crate::sources::RMSNORM;
use crate::testdata::uniform_row;
use crate::thresholds::{Critical, overflow_point, tile_tails};

pub const KERNEL: &str = "norm_rope";
pub const KERNEL_FN: &str = "rmsnorm_rope_neox";
/// Against the twin: rope's ([`rope::TOLERANCE`]: the device's sincosf against the host's); against
/// the two existing kernels: bit for bit (differences counted as mismatches).
pub const TOLERANCE: f64 = rope::TOLERANCE;
const THREADS: u32 = 256;
const SAMPLE_ROWS: usize = 256;

/// A per-head norm + RoPE of one tensor (Q: `heads` = n_head; K: n_kv).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct NormRopeCase {
    pub heads: u32,
    pub head_dim: u32,
    /// `attention.layer_norm_rms_epsilon`.
    pub eps: f32,
    /// `rope.freq_base`.
    pub theta: f32,
    /// Sequences the self-test's batch is split into (positions restart in each).
    pub sequences: u32,
}

impl NormRopeCase {
    /// The plain norm this fuses (one row per head).
    pub fn norm(&self) -> RmsNormCase {
        RmsNormCase { width: self.head_dim, rows_per_token: self.heads, eps: self.eps }
    }

    pub fn spec(&self) -> RopeSpec {
        RopeSpec { head_dim: self.head_dim, theta: self.theta }
    }

    fn shape(&self, tokens: u64) -> String {
        format!("tokens={tokens} heads={} head_dim={} eps={:e} theta={}", self.heads, self.head_dim, self.eps, self.theta)
    }
}

/// Every launch one tensor's norm + RoPE of `tokens` makes (one).
pub fn plans(tokens: u64, c: &NormRopeCase, limits: &DeviceLimits) -> Result<Vec<Launch>, PlanError> {
    Ok(vec![plan(tokens, c, limits)?])
}

/// grid = (ceil(tokens · heads / 8), 1, 1), 256 threads: the plain norm's warp-per-row grid.
/// Refused: what the norm or the rotation refuses, an odd head_dim, and a head_dim above
/// [`WARP_ROW_MAX`] (the plain norm's block-per-row rows: the engine then runs the two kernels).
pub fn plan(tokens: u64, c: &NormRopeCase, limits: &DeviceLimits) -> Result<Launch, PlanError> {
    let norm = c.norm();
    let what = norm.unsupported(tokens).or_else(|| {
        if !c.head_dim.is_multiple_of(2) || c.head_dim > WARP_ROW_MAX {
            Some(format!("head_dim {} must be even and at most {WARP_ROW_MAX} (a warp per row)", c.head_dim))
        } else if !(c.theta > 0.0 && c.theta.is_finite()) {
            Some(format!("theta {} must be finite and > 0", c.theta))
        } else {
            None
        }
    });
    if let Some(what) = what {
        return Err(PlanError::Unsupported { kernel: KERNEL.into(), what, shape: c.shape(tokens) });
    }
    let (rows, per_block) = (norm.rows(tokens), WARPS as u64);
    Launch::checked(
        KERNEL_FN,
        c.shape(tokens),
        [rows.div_ceil(per_block), 1, 1],
        [THREADS, 1, 1],
        0,
        vec![Cover::Tiles { axis: 0, items: rows, per_block }],
        limits,
    )
}

/// CPU twin: [`rmsnorm::rmsnorm_cpu`] then [`rope::rope_cpu`] of `x` `[positions.len(), heads,
/// head_dim]`.
pub fn norm_rope_cpu(x: &[f32], w: &[f32], positions: &[i32], c: &NormRopeCase) -> Vec<f32> {
    let mut y = rmsnorm::rmsnorm_cpu(x, w, &c.norm());
    rope::rope_cpu(&mut y, positions, c.heads as usize, &c.spec());
    y
}

/// Normalises and rotates `x` into `y` (f32 bits; any element type; `y` may be `x`'s buffer,
/// see [`launch_in_place`]) at `positions` (`[tokens]`), with `table`'s frequencies.
#[allow(clippy::too_many_arguments)]
pub fn launch<Y: DeviceRepr>(
    gpu: &Gpu,
    tokens: u64,
    c: &NormRopeCase,
    table: &RopeTable,
    positions: &CudaView<i32>,
    w: &CudaView<f32>,
    x: &CudaView<f32>,
    y: &mut CudaViewMut<Y>,
) -> Result<(), GpuError> {
    let (x_bytes, y_bytes) = (bytes_of(x.len(), 4), bytes_of(y.len(), size_of::<Y>()));
    let (x_ptr, _x_done) = x.device_ptr(gpu.stream());
    let (y_ptr, _y_done) = y.device_ptr_mut(gpu.stream());
    launch_ptrs(gpu, tokens, c, table, positions, w, (x_ptr, x_bytes), (y_ptr, y_bytes))
}

/// Normalises and rotates `x` in place.
pub fn launch_in_place(
    gpu: &Gpu,
    tokens: u64,
    c: &NormRopeCase,
    table: &RopeTable,
    positions: &CudaView<i32>,
    w: &CudaView<f32>,
    x: &mut CudaViewMut<f32>,
) -> Result<(), GpuError> {
    let bytes = bytes_of(x.len(), 4);
    let (ptr, _done) = x.device_ptr_mut(gpu.stream());
    launch_ptrs(gpu, tokens, c, table, positions, w, (ptr, bytes), (ptr, bytes))
}

#[allow(clippy::too_many_arguments)]
fn launch_ptrs(
    gpu: &Gpu,
    tokens: u64,
    c: &NormRopeCase,
    table: &RopeTable,
    positions: &CudaView<i32>,
    w: &CudaView<f32>,
    x: (u64, u64),
    y: (u64, u64),
) -> Result<(), GpuError> {
    let p = plan(tokens, c, gpu.limits())?;
    if table.spec() != c.spec() || table.yarn().is_some() {
        let yarn = if table.yarn().is_some() { " with YaRN (the fused kernel rotates plain NEOX only)" } else { "" };
        let what = format!("the RoPE table is for head_dim {} theta {}{yarn}", table.spec().head_dim, table.spec().theta);
        return Err(PlanError::Unsupported { kernel: p.kernel.clone(), what, shape: p.shape.clone() }.into());
    }
    let rows = c.norm().rows(tokens);
    let n = 4 * rows * c.head_dim as u64;
    require_bytes(
        &p,
        &[
            ("x", x.1, n),
            ("y", y.1, n),
            ("w", bytes_of(w.len(), 4), 4 * c.head_dim as u64),
            ("positions", bytes_of(positions.len(), 4), 4 * tokens),
        ],
    )?;
    let f = gpu.function(&RMSNORM, KERNEL_FN)?;
    let (heads, half, eps) = (c.heads as i32, (c.head_dim / 2) as i32, c.eps);
    gpu.launch(&p, &f, |b| {
        b.arg(&x.0).arg(&y.0).arg(w).arg(positions).arg(table.freqs()).arg(&rows).arg(&heads).arg(&half).arg(&eps);
    })?;
    Ok(())
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// Counts this plan makes critical: where `x/y[row·d + i]` passes 2^31 − 1, the token counts
/// whose last block mixes real and spare rows, and where the blocks on grid.x pass 65,535.
pub fn critical_counts(c: &NormRopeCase, limits: &DeviceLimits) -> Vec<Critical> {
    let (rpt, per_block) = (c.heads.max(1) as u64, WARPS as u64);
    let mut v = vec![Critical::new(1, "single token")];
    v.extend(overflow_point(rpt * c.head_dim as u64, "norm_rope: x/y[row·d + i] passes 2^31 − 1"));
    let tile = per_block / gcd(per_block, rpt);
    if tile > 1 {
        v.extend(tile_tails(tile, true, &[1, 2], &format!("norm_rope: {per_block} rows per block, {rpt} per token")));
    }
    let last = limits.max_grid_dim[1] as u64 * per_block / rpt;
    for t in [last, last + 1] {
        v.push(Critical::new(t, format!("norm_rope: {} blocks on grid.x, around 65,535", (t * rpt).div_ceil(per_block))));
    }
    v
}

/// Input, weight, positions, frequencies, the guarded output and the two-kernel reference.
pub fn device_bytes(tokens: u64, c: &NormRopeCase) -> u64 {
    let n = tokens * c.heads as u64 * c.head_dim as u64;
    4 * (n + c.head_dim as u64 + tokens + c.head_dim as u64 / 2 + n + GUARD_WORDS as u64 + n)
}

const SEED_X: u64 = 0x68;
const SEED_W: u64 = 0x69;
const X_SCALE: f32 = 4.0;

/// Self-test: x, w and a batch of sequences' positions; the fused launch into a poisoned y;
/// then `rmsnorm` and `rope` (the two existing kernels) into a second buffer, which y must equal
/// bit for bit; sampled tokens of y against the twin; the in-place launch over x must equal y.
pub fn run_case(gpu: &Gpu, tokens: u64, c: &NormRopeCase) -> Result<Outcome, GpuError> {
    stage_case(gpu, tokens, c).map(Staged::finish)
}

/// [`run_case`]'s GPU half: the three launches, the poison check, the in-place difference and
/// the sampled tokens of y and of the two-kernel reference downloaded in runs; the twin and
/// both comparisons are the host check.
pub fn stage_case(gpu: &Gpu, tokens: u64, c: &NormRopeCase) -> Result<Staged, GpuError> {
    plan(tokens, c, gpu.limits())?; // a bad shape is refused before anything is allocated
    let c = *c;
    let table = RopeTable::new(gpu, c.spec())?;
    let (d, row) = (c.head_dim as usize, c.heads as usize * c.head_dim as usize);
    let n = tokens as usize * row;
    let mut x = gpu.alloc::<f32>(n)?;
    let mut w = gpu.alloc::<f32>(d)?;
    fill_uniform(gpu, &mut x, n, SEED_X, X_SCALE)?;
    fill_uniform(gpu, &mut w, d, SEED_W, 1.0)?;
    let positions = rope::test_positions(tokens, c.sequences);
    let pos_dev = gpu.upload(&positions)?;
    let mut y = Guarded::new(gpu, n)?;
    gpu.synchronize()?;
    let start = Instant::now();
    launch(gpu, tokens, &c, &table, &pos_dev.as_view(), &w.as_view(), &x.as_view(), &mut y.buf.slice_mut(..n))?;
    gpu.synchronize()?;
    let kernel_ms = start.elapsed().as_secs_f64() * 1e3;
    let (unwritten, past_end) = y.check(gpu, 1)?;
    // The two kernels this replaces.
    let mut chain = gpu.alloc::<f32>(n)?;
    rmsnorm::launch(gpu, tokens, &c.norm(), &x.as_view(), &w.as_view(), &mut chain.as_view_mut())?;
    rope::launch(gpu, tokens, c.heads, &table, &pos_dev.as_view(), &mut chain.as_view_mut())?;
    let sampled = sample_rows(tokens, 64, SAMPLE_ROWS, tokens);
    let got = y.read_rows_f32(gpu, &sampled, row)?;
    let base = download_rows(gpu, &chain, &sampled, row)?;
    launch_in_place(gpu, tokens, &c, &table, &pos_dev.as_view(), &w.as_view(), &mut x.as_view_mut())?;
    let in_place = in_place_diff(gpu, &sampled, row, &x, &y)?;
    Ok(Staged::Check(Box::new(move || {
        let w_host = uniform_row(SEED_W, 0, d, 1.0);
        let want: Vec<Vec<f32>> = sampled
            .par_iter()
            .map(|&t| norm_rope_cpu(&uniform_row(SEED_X, t * row as u64, row, X_SCALE), &w_host, &positions[t as usize..=t as usize], &c))
            .collect();
        let (mut err, mut differ) = (RelErr::default(), 0u64);
        for (((&t, want), got), base) in sampled.iter().zip(&want).zip(&got).zip(&base) {
            let at = t as usize * row;
            differ += got.iter().zip(base).filter(|(a, b)| a.to_bits() != b.to_bits()).count() as u64;
            err.add_slice(at as u64, got, want);
        }
        let mut check = Check::of_floats(&err, TOLERANCE, (unwritten, past_end), kernel_ms);
        check.int_mismatches += differ;
        if differ > 0 {
            check.note = format!("{differ} sampled values differ from rmsnorm then rope; {}", check.note);
        }
        Outcome::Ran(note_in_place_diff(check, in_place))
    })))
}

/// The self-test's handle on this family (registered in `selftest::case`).
pub struct Family;

impl KernelFamily for Family {
    type Case = NormRopeCase;

    fn run(gpu: &Gpu, tokens: u64, c: &NormRopeCase) -> Result<Outcome, GpuError> {
        run_case(gpu, tokens, c)
    }

    fn stage(gpu: &Gpu, tokens: u64, c: &NormRopeCase) -> Result<Staged, GpuError> {
        stage_case(gpu, tokens, c)
    }

    fn plans(tokens: u64, c: &NormRopeCase, limits: &DeviceLimits) -> Result<Vec<Launch>, PlanError> {
        plans(tokens, c, limits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const Q: NormRopeCase = NormRopeCase { heads: 32, head_dim: 128, eps: 1e-6, theta: 1e6, sequences: 4 };
    const K: NormRopeCase = NormRopeCase { heads: 4, head_dim: 128, eps: 1e-6, theta: 1e6, sequences: 4 };

    #[test]
    fn twin_is_the_norm_then_the_rotation() {
        for c in [Q, K, NormRopeCase { heads: 3, head_dim: 6, ..K }] {
            let row = (c.heads * c.head_dim) as usize;
            let positions = [0, 7, 40_000];
            let x = uniform_row(1, 0, row * positions.len(), X_SCALE);
            let w = uniform_row(2, 0, c.head_dim as usize, 1.0);
            let mut want = rmsnorm::rmsnorm_cpu(&x, &w, &c.norm());
            rope::rope_cpu(&mut want, &positions, c.heads as usize, &c.spec());
            assert_eq!(norm_rope_cpu(&x, &w, &positions, &c), want);
        }
    }

    #[test]
    fn plans_are_the_plain_norms_warp_grid() {
        for limits in DeviceLimits::recorded() {
            for c in [Q, K] {
                for tokens in (1..=64).chain([8191, 8192, 1 << 20]) {
                    let p = plan(tokens, &c, &limits).unwrap_or_else(|e| panic!("{e}"));
                    let plain = rmsnorm::plan(tokens, &c.norm(), &limits).unwrap();
                    assert_eq!((p.grid, p.block), (plain.grid, plain.block), "{p}");
                    p.check_cover().unwrap();
                    if tokens <= 64 {
                        assert!(p.simulate_cover(0).iter().all(|&h| h == 1), "{p}");
                    }
                }
            }
        }
    }

    #[test]
    fn bad_shapes_are_typed_errors() {
        let l = DeviceLimits::gb10();
        for (tokens, c) in [
            (0, Q),
            (1, NormRopeCase { head_dim: 127, ..Q }),
            (1, NormRopeCase { head_dim: 2048, ..Q }),
            (1, NormRopeCase { head_dim: 0, ..Q }),
            (1, NormRopeCase { heads: 0, ..Q }),
            (1, NormRopeCase { theta: 0.0, ..Q }),
            (1, NormRopeCase { theta: f32::NAN, ..Q }),
            (1, NormRopeCase { eps: -1.0, ..Q }),
        ] {
            assert!(matches!(plans(tokens, &c, &l), Err(PlanError::Unsupported { .. })), "{c:?} at {tokens}");
        }
        let huge = NormRopeCase { heads: u32::MAX, ..Q };
        assert!(matches!(plans(1 << 20, &huge, &l), Err(PlanError::GridDim { axis: 'x', .. })));
    }

    #[test]
    fn critical_counts_for_qwen3() {
        let l = DeviceLimits::h200();
        let counts = |c: &NormRopeCase| -> Vec<u64> { critical_counts(c, &l).iter().map(|c| c.tokens).collect() };
        for (c, want) in [(Q, vec![1, 524_287, 524_288, 16_383, 16_384]), (K, vec![4_194_303, 4_194_304, 1, 2, 3])] {
            let got = counts(&c);
            for t in want {
                assert!(got.contains(&t), "{c:?}: {t} missing from {got:?}");
            }
        }
    }
}
