//! f32 dense product `y[t, n] = Σ_k W[n, k] · x[t, k]`: the MoE router's logits from
//! `ffn_gate_inp` (F32 in real qwen3moe GGUFs; N = experts, K = hidden).
//!
//! `cuda/glue.cu` (`dense_f32`): one warp per item — a tile of [`TOKENS_PER_TILE`] tokens and
//! one output `n`, items = tiles × n — in a warp grid-stride loop on `grid.x`, [`WARPS`] warps a
//! block. Each W row is read once for all of a tile's tokens, and at decode (one tile) the rows
//! spread over many SMs (one block streaming the whole router matrix took half of decode).
//! Lane l accumulates `k = l, l + 32, …` with fused multiply-adds, then the warp's xor
//! butterfly; where K is a multiple of 4 it loads 16 bytes at a time instead (lane l: the float4s
//! `l, l + 32, …`, each one's four values in order), which gives the decode's 128 warps four
//! times the bytes in flight (the router was latency-bound). The twin repeats either order, so
//! the two agree bit for bit. Spare tokens of the last tile read the last token and store nothing.

use std::time::Instant;

use cudarc::driver::{CudaView, CudaViewMut, DevicePtr, DevicePtrMut, DeviceRepr, PushKernelArg};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::check::{Check, KernelFamily, Outcome, RelErr, Staged, sample_rows};
use crate::cuda::{Gpu, GpuError};
use crate::launch::{Cover, Launch, PlanError, bytes_of, grid_stride_blocks, require_bytes};
use crate::limits::DeviceLimits;
use crate::ops::testdata::{GUARD_WORDS, Guarded, fill_uniform};
use crate::sources::GLUE;
use crate::testdata::uniform_row;
use crate::thresholds::{Critical, I32_MAX, overflow_point, tile_tails};

pub const KERNEL: &str = "dense_f32";
/// The twin repeats every rounding of the device (see the module doc): expected bit-exact. The
/// margin admits an ulp of the largest output, far below what a wrong term costs.
pub const TOLERANCE: f64 = 1e-6;
/// Tokens per item (`DENSE_TOKENS`).
pub const TOKENS_PER_TILE: u64 = 8;
/// Warps per block: few, so that the decode's handful of items (one per router row) lands on
/// many SMs rather than on a few full blocks.
pub const WARPS: u32 = 4;
const THREADS: u32 = WARPS * 32;
const SAMPLE_ROWS: usize = 256;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DenseF32Case {
    /// Outputs per token (the expert count).
    pub n: u32,
    /// Inputs per token (the hidden size).
    pub k: u32,
}

impl DenseF32Case {
    fn describe(&self, tokens: u64) -> String {
        format!("tokens={tokens} n={} k={}", self.n, self.k)
    }
}

/// Every launch a product over `tokens` rows makes (one).
pub fn plans(tokens: u64, c: &DenseF32Case, limits: &DeviceLimits) -> Result<Vec<Launch>, PlanError> {
    Ok(vec![plan(tokens, c, limits)?])
}

/// A warp grid-stride loop over `ceil(tokens / 8) × n` items, 128 threads a block.
pub fn plan(tokens: u64, c: &DenseF32Case, limits: &DeviceLimits) -> Result<Launch, PlanError> {
    let what = if tokens == 0 {
        Some("0 tokens".to_string())
    } else if c.n == 0 || c.k == 0 || c.n as u64 > I32_MAX || c.k as u64 > I32_MAX {
        Some(format!("n = {} and k = {} must be in 1..2^31", c.n, c.k))
    } else {
        None
    };
    if let Some(what) = what {
        return Err(PlanError::Unsupported { kernel: KERNEL.into(), what, shape: c.describe(tokens) });
    }
    let items = items(tokens, c);
    Launch::checked(
        KERNEL,
        c.describe(tokens),
        [grid_stride_blocks(items * 32, THREADS as u64, limits), 1, 1],
        [THREADS, 1, 1],
        0,
        vec![Cover::GridStride { items, per_block: WARPS as u64 }],
        limits,
    )
}

/// Warp items: (tile of 8 tokens, output) pairs.
fn items(tokens: u64, c: &DenseF32Case) -> u64 {
    tokens.div_ceil(TOKENS_PER_TILE) * c.n as u64
}

/// Whether the kernel takes K in 16-byte loads (its rows are then 16-byte aligned too).
pub fn vectorised(k: u64) -> bool {
    k.is_multiple_of(4)
}

/// The lane that accumulates element `k` of a row (see the module doc).
fn lane_of(k: usize, vector: bool) -> usize {
    if vector { k / 4 % 32 } else { k % 32 }
}

/// One output: `w_row · x_row` summed as a warp does (each lane its elements in order with FMAs,
/// then the xor butterfly).
fn warp_dot(w_row: &[f32], x_row: &[f32]) -> f32 {
    let vector = vectorised(w_row.len() as u64);
    let mut lanes = [0.0f32; 32];
    for (k, (&w, &x)) in w_row.iter().zip(x_row).enumerate() {
        let l = lane_of(k, vector);
        lanes[l] = w.mul_add(x, lanes[l]);
    }
    for o in [16, 8, 4, 2, 1] {
        lanes = std::array::from_fn(|l| lanes[l] + lanes[l ^ o]);
    }
    lanes[0]
}

/// CPU twin of one token: `w` is `[n, k]`, `x_row` `[k]`; returns `[n]`.
pub fn dense_f32_row_cpu(w: &[f32], x_row: &[f32]) -> Vec<f32> {
    w.chunks_exact(x_row.len().max(1)).map(|w_row| warp_dot(w_row, x_row)).collect()
}

/// CPU twin: `w` `[n, k]`, `x` `[tokens, k]`; returns `y [tokens, n]`.
pub fn dense_f32_cpu(w: &[f32], x: &[f32], k: usize) -> Vec<f32> {
    x.par_chunks(k.max(1)).flat_map_iter(|x_row| dense_f32_row_cpu(w, x_row)).collect()
}

/// `y [tokens, n] = x [tokens, k] · wᵀ` (`y`: f32 bits, any 4-byte element type). Buffers too
/// small for the shape are refused before the launch.
pub fn launch<Y: DeviceRepr>(
    gpu: &Gpu,
    tokens: u64,
    c: &DenseF32Case,
    w: &CudaView<f32>,
    x: &CudaView<f32>,
    y: &mut CudaViewMut<Y>,
) -> Result<(), GpuError> {
    let p = plan(tokens, c, gpu.limits())?;
    let (n, k) = (c.n as u64, c.k as u64);
    let y_bytes = bytes_of(y.len(), size_of::<Y>());
    require_bytes(
        &p,
        &[("w", bytes_of(w.len(), 4), 4 * n * k), ("x", bytes_of(x.len(), 4), 4 * tokens * k), ("y", y_bytes, 4 * tokens * n)],
    )?;
    if vectorised(k) {
        for (name, at) in [("w", w.device_ptr(gpu.stream()).0), ("x", x.device_ptr(gpu.stream()).0)] {
            if at % 16 != 0 {
                return Err(PlanError::Unsupported {
                    kernel: KERNEL.into(),
                    what: format!("{name} at {at:#x} is not 16-byte aligned (k a multiple of 4 takes 16-byte loads)"),
                    shape: c.describe(tokens),
                }
                .into());
            }
        }
    }
    let f = gpu.function(&GLUE, KERNEL)?;
    let (y_ptr, _y_done) = y.device_ptr_mut(gpu.stream());
    let (n, k) = (c.n as i32, c.k as i32);
    gpu.launch(&p, &f, |b| {
        b.arg(w).arg(x).arg(&y_ptr).arg(&tokens).arg(&n).arg(&k);
    })?;
    Ok(())
}

/// Counts this plan makes critical: the 2^31 points of x and y, every tail of
/// the first two 8-token tiles, and 65,535 tiles (where the earlier tile-per-block plan would
/// have failed on grid.y or grid.z; kept so a regression to it is caught).
pub fn critical_counts(c: &DenseF32Case, limits: &DeviceLimits) -> Vec<Critical> {
    let mut v = vec![Critical::new(1, "dense_f32: single token")];
    v.extend(overflow_point(c.k as u64, "dense_f32: x[t·K + k] passes 2^31 − 1"));
    v.extend(overflow_point(c.n as u64, "dense_f32: y[t·N + n] passes 2^31 − 1"));
    v.extend(tile_tails(TOKENS_PER_TILE, true, &[1, 2], "dense_f32: 8-token tile"));
    let last = limits.max_grid_dim[1] as u64 * TOKENS_PER_TILE;
    for t in [last, last + 1] {
        v.push(Critical::new(t, format!("dense_f32: {} tiles, around 65,535", t.div_ceil(TOKENS_PER_TILE))));
    }
    v
}

/// W, x and the guarded y.
pub fn device_bytes(tokens: u64, c: &DenseF32Case) -> u64 {
    let (n, k) = (c.n as u64, c.k as u64);
    4 * (n * k + tokens * k + tokens * n + GUARD_WORDS as u64)
}

const SEED_W: u64 = 0x80;
const SEED_X: u64 = 0x81;
/// Router weights are small; the hidden state is O(1) after the norm.
const W_SCALE: f32 = 0.05;
const X_SCALE: f32 = 2.0;

/// Self-test: W and x from seeds, y poisoned; sampled tokens (all n) against the twin.
pub fn run_case(gpu: &Gpu, tokens: u64, c: &DenseF32Case) -> Result<Outcome, GpuError> {
    stage_case(gpu, tokens, c).map(Staged::finish)
}

/// [`run_case`]'s GPU half: the fills, the kernel, the poison check and the sampled tokens' rows
/// of y (downloaded in runs); the host W, the twin of the rows and the comparison are left to
/// the host check.
pub fn stage_case(gpu: &Gpu, tokens: u64, c: &DenseF32Case) -> Result<Staged, GpuError> {
    plan(tokens, c, gpu.limits())?; // refuse a bad shape before allocating for it
    let (n, k) = (c.n as usize, c.k as usize);
    let mut w = gpu.alloc::<f32>(n * k)?;
    let mut x = gpu.alloc::<f32>(tokens as usize * k)?;
    fill_uniform(gpu, &mut w, n * k, SEED_W, W_SCALE)?;
    fill_uniform(gpu, &mut x, tokens as usize * k, SEED_X, X_SCALE)?;
    let mut y = Guarded::new(gpu, tokens as usize * n)?;
    gpu.synchronize()?;
    let start = Instant::now();
    launch(gpu, tokens, c, &w.as_view(), &x.as_view(), &mut y.buf.slice_mut(..tokens as usize * n))?;
    gpu.synchronize()?;
    let kernel_ms = start.elapsed().as_secs_f64() * 1e3;
    let guard = y.check(gpu, 1)?;
    let sampled = sample_rows(tokens, TOKENS_PER_TILE, SAMPLE_ROWS, tokens);
    let got = y.read_rows_f32(gpu, &sampled, n)?;
    Ok(Staged::Check(Box::new(move || {
        let w_host = uniform_row(SEED_W, 0, n * k, W_SCALE);
        let want: Vec<Vec<f32>> =
            sampled.par_iter().map(|&t| dense_f32_row_cpu(&w_host, &uniform_row(SEED_X, t * k as u64, k, X_SCALE))).collect();
        let mut err = RelErr::default();
        for ((&t, want), got) in sampled.iter().zip(&want).zip(&got) {
            err.add_slice((t as usize * n) as u64, got, want);
        }
        Outcome::Ran(Check::of_floats(&err, TOLERANCE, guard, kernel_ms))
    })))
}

/// The self-test's handle on this family (registered in `selftest::case`).
pub struct Family;

impl KernelFamily for Family {
    type Case = DenseF32Case;

    fn run(gpu: &Gpu, tokens: u64, c: &DenseF32Case) -> Result<Outcome, GpuError> {
        run_case(gpu, tokens, c)
    }

    fn stage(gpu: &Gpu, tokens: u64, c: &DenseF32Case) -> Result<Staged, GpuError> {
        stage_case(gpu, tokens, c)
    }

    fn plans(tokens: u64, c: &DenseF32Case, limits: &DeviceLimits) -> Result<Vec<Launch>, PlanError> {
        plans(tokens, c, limits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROUTER: DenseF32Case = DenseF32Case { n: 128, k: 2048 };

    /// The warp's order against an f64 sum: within a few ulp of Σ|w·x|.
    #[test]
    fn twin_matches_f64_dot() {
        for (n, k) in [(128usize, 2048usize), (5, 33), (3, 1), (512, 4096)] {
            let w = uniform_row(1, 0, n * k, W_SCALE);
            let x = uniform_row(2, 0, 3 * k, X_SCALE);
            let y = dense_f32_cpu(&w, &x, k);
            assert_eq!(y.len(), 3 * n);
            for (t, xr) in x.chunks(k).enumerate() {
                for (j, wr) in w.chunks(k).enumerate() {
                    let exact: f64 = wr.iter().zip(xr).map(|(a, b)| *a as f64 * *b as f64).sum();
                    let mag: f64 = wr.iter().zip(xr).map(|(a, b)| (*a as f64 * *b as f64).abs()).sum();
                    let bound = (k as f64 / 32.0 + 6.0) * 2f64.powi(-24) * mag;
                    assert!((y[t * n + j] as f64 - exact).abs() <= bound, "n={n} k={k} ({t}, {j})");
                }
            }
        }
    }

    /// The twin's lane assignment against the kernel's loops written out (the float4 loop where
    /// K is a multiple of 4, the 4-byte one otherwise): the same bits.
    #[test]
    fn twin_follows_the_kernels_loops() {
        for k in [2048usize, 4096, 132, 8, 33, 7, 1] {
            let w = uniform_row(3, 0, k, W_SCALE);
            let x = uniform_row(4, 0, k, X_SCALE);
            let mut lanes = [0.0f32; 32];
            for (lane, acc) in lanes.iter_mut().enumerate() {
                if k % 4 == 0 {
                    for q in (lane..k / 4).step_by(32) {
                        for c in 4 * q..4 * q + 4 {
                            *acc = w[c].mul_add(x[c], *acc);
                        }
                    }
                } else {
                    for c in (lane..k).step_by(32) {
                        *acc = w[c].mul_add(x[c], *acc);
                    }
                }
            }
            for o in [16, 8, 4, 2, 1] {
                lanes = std::array::from_fn(|l| lanes[l] + lanes[l ^ o]);
            }
            assert_eq!(warp_dot(&w, &x).to_bits(), lanes[0].to_bits(), "k={k}");
            assert_eq!(vectorised(k as u64), k % 4 == 0);
        }
    }

    #[test]
    fn plans_cover_every_token_once() {
        for limits in DeviceLimits::recorded() {
            for t in (1..=100u64).chain([524_279, 524_280, 524_281, 1 << 20]) {
                let p = &plans(t, &ROUTER, &limits).unwrap()[0];
                p.check_cover().unwrap();
                assert_eq!(p.block, [128, 1, 1]);
                if t <= 100 {
                    assert!(p.simulate_cover(0).iter().all(|&h| h == 1));
                }
            }
        }
    }

    /// The decode's one tile of 128 router rows runs on 32 blocks, not one.
    #[test]
    fn decode_spreads_the_router_over_many_blocks() {
        for limits in DeviceLimits::recorded() {
            let p = plan(1, &ROUTER, &limits).unwrap();
            assert_eq!(p.grid, [32, 1, 1], "{}", limits.name);
            assert!(p.simulate_cover(0).iter().all(|&h| h == 1));
        }
    }

    #[test]
    fn bad_shapes_and_counts() {
        let l = DeviceLimits::gb10();
        for (t, c) in [(0, ROUTER), (1, DenseF32Case { n: 0, ..ROUTER }), (1, DenseF32Case { k: 0, ..ROUTER })] {
            assert!(matches!(plans(t, &c, &l), Err(PlanError::Unsupported { .. })), "{c:?}");
        }
        let counts: Vec<u64> = critical_counts(&ROUTER, &l).iter().map(|c| c.tokens).collect();
        // x: (2^31 − 1) / 2048 = 1,048,575.99; y: / 128 = 16,777,215.99; tails 1..15; 65,535 tiles.
        for t in [1, 7, 9, 15, 1_048_575, 1_048_576, 16_777_215, 16_777_216, 524_280, 524_281] {
            assert!(counts.contains(&t), "{t} missing from {counts:?}");
        }
    }
}
