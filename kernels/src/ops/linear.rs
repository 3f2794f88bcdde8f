//! Dense projection `y[rows, N] = x[rows, K] · W[N, K]ᵀ` with q8_1 activations and weights in any
//! [`WeightType`]: the engine's attention q/k/v/o projections (and any dense FFN).
//!
//! A thin layer over the head's kernels (`cuda/output_head.cu`): the GEMV for at most
//! [`output_head::GEMV_MAX_ROWS`] rows (decode: each weight row read once for all of them), the
//! tiled dp4a GEMM above (row tiles on `grid.x`, they grow with tokens; column tiles of N on
//! `grid.y`, bounded). Every row of x is computed; errors name `linear` and the shape in N and K.
//! The activations come from `quantize` in its dense mode.

use cudarc::driver::{CudaSlice, DeviceRepr};
use serde::{Deserialize, Serialize};

use crate::check::{KernelFamily, Outcome, Staged};
use crate::cuda::{Gpu, GpuError};
use crate::launch::{Launch, PlanError};
use crate::limits::DeviceLimits;
use crate::ops::output_head::{self, Caller, HeadBuffers, HeadDims};
use crate::ops::testdata::GUARD_WORDS;
use crate::quant::{BLOCK_Q8_1_BYTES, BlockQ8_1, QK, WeightType};
use crate::thresholds::{Critical, overflow_point, tile_tails};

pub const KERNEL: &str = "linear";
/// The head's kernels and comparison: see [`output_head::TOLERANCE`].
pub const TOLERANCE: f64 = output_head::TOLERANCE;

const CALLER: Caller = Caller { family: KERNEL, input: "k", output: "n" };

/// A projection's shape (the self-test case and what the engine passes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinearCase {
    /// Output width N (rows of W).
    pub n: u32,
    /// Input width K (a multiple of 32; of 256 for the K-quants).
    pub k: u32,
    pub wtype: WeightType,
}

impl LinearCase {
    pub(crate) fn dims(&self) -> HeadDims {
        HeadDims { hidden: self.k, vocab: self.n, wtype: self.wtype }
    }
}

/// Every launch a projection of `tokens` rows makes (one).
pub fn plans(tokens: u64, c: &LinearCase, limits: &DeviceLimits) -> Result<Vec<Launch>, PlanError> {
    Ok(vec![plan(tokens, c, limits)?])
}

/// The GEMV (grid (N / 8 warps, 1, 1), 256 threads) for at most 8 rows, else the GEMM (grid
/// (row tiles of 64, column tiles of 64, 1), 256 threads, 21,504 B of shared memory).
pub fn plan(rows: u64, c: &LinearCase, limits: &DeviceLimits) -> Result<Launch, PlanError> {
    output_head::plan_for(&CALLER, rows, &c.dims(), limits)
}

/// CPU twin: `w` holds N rows of K weights, `x` `[rows, K/32]` q8_1 blocks; returns `y [rows, N]`
/// (the head's twin over every row: the kernels' block formulas in block order).
pub fn linear_cpu(w: &[u8], x: &[BlockQ8_1], c: &LinearCase) -> Vec<f32> {
    output_head::output_head_cpu(w, x, None, &c.dims())
}

/// `y [rows, N] = x [rows, K/32] · Wᵀ` on the device (`y` of any 4-byte element type: the kernels
/// write f32). Buffers too small for the shape are refused before the launch.
pub fn launch<Y: DeviceRepr>(
    gpu: &Gpu,
    rows: u64,
    c: &LinearCase,
    x: &CudaSlice<u8>,
    w: &CudaSlice<u8>,
    y: &mut CudaSlice<Y>,
) -> Result<(), GpuError> {
    output_head::launch_for(&CALLER, gpu, &c.dims(), rows, rows, HeadBuffers { x, rows: None, w, out: y })
}

/// Counts this plan makes critical: the 2^31 points of y and of x's block and word indexes, the
/// switch from the GEMV to the GEMM, the GEMM's row-tile tails.
pub fn critical_counts(c: &LinearCase, _limits: &DeviceLimits) -> Vec<Critical> {
    let nb = c.k as u64 / QK as u64;
    let mut v = vec![Critical::new(1, "linear: single token (decode)")];
    v.extend(overflow_point(c.n as u64, "linear: y[r·N + n] passes 2^31 − 1"));
    v.extend(overflow_point(nb, "linear: x block index r·(K/32) + b passes 2^31 − 1"));
    v.extend(overflow_point(nb * 9, "linear: x word index (r·(K/32) + b)·9 passes 2^31 − 1"));
    v.push(Critical::new(output_head::GEMV_MAX_ROWS, "linear: most rows on the GEMV path"));
    v.push(Critical::new(output_head::GEMV_MAX_ROWS + 1, "linear: fewest rows on the GEMM path"));
    v.extend(tile_tails(output_head::TILE_M, false, &[1, 2], "linear: 64-row tile"));
    v
}

/// x, W and the guarded y of a self-test case.
pub fn device_bytes(tokens: u64, c: &LinearCase) -> u64 {
    let x = tokens * (c.k as u64 / QK as u64) * BLOCK_Q8_1_BYTES as u64;
    let w = c.n as u64 * c.wtype.row_bytes(c.k as usize) as u64;
    x + w + 4 * (tokens * c.n as u64 + GUARD_WORDS as u64)
}

/// Self-test: the head's, over every row (x and W from seeds, y poisoned, every output checked
/// as written, sampled rows x columns against the twin).
pub fn run_case(gpu: &Gpu, tokens: u64, c: &LinearCase) -> Result<Outcome, GpuError> {
    plan(tokens, c, gpu.limits())?; // refuse a bad shape before allocating for it
    output_head::run_dense(&CALLER, gpu, tokens, &c.dims(), None)
}

/// The self-test's handle on this family (registered in `selftest::case`).
pub struct Family;

impl KernelFamily for Family {
    type Case = LinearCase;

    fn run(gpu: &Gpu, tokens: u64, c: &LinearCase) -> Result<Outcome, GpuError> {
        run_case(gpu, tokens, c)
    }

    fn stage(gpu: &Gpu, tokens: u64, c: &LinearCase) -> Result<Staged, GpuError> {
        plan(tokens, c, gpu.limits())?;
        output_head::stage_dense(&CALLER, gpu, tokens, &c.dims(), None)
    }

    fn plans(tokens: u64, c: &LinearCase, limits: &DeviceLimits) -> Result<Vec<Launch>, PlanError> {
        plans(tokens, c, limits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::dequantize_q8_1;
    use crate::testdata::{q8_1_row, weight_row};

    /// Qwen3-30B-A3B's q projection: hidden 2048 -> 32 heads of 128.
    const Q_PROJ: LinearCase = LinearCase { n: 4096, k: 2048, wtype: WeightType::Q4K };

    #[test]
    fn twin_matches_dequantized_f64_dot() {
        for wtype in WeightType::ALL {
            let k = 3 * wtype.block_size();
            let (n, rows, nb) = (21usize, 4u64, k / QK);
            let c = LinearCase { n: n as u32, k: k as u32, wtype };
            let w: Vec<Vec<u8>> = (0..n as u64).map(|r| weight_row(7, r, k, wtype)).collect();
            let x: Vec<BlockQ8_1> = (0..rows).flat_map(|r| q8_1_row(8, r, nb)).collect();
            let y = linear_cpu(&w.concat(), &x, &c);
            assert_eq!(y.len(), rows as usize * n);
            let (mut worst, mut scale) = (0f64, 0f64);
            for (r, xr) in x.chunks(nb).enumerate() {
                let xd = dequantize_q8_1(xr);
                for (col, wr) in w.iter().enumerate() {
                    let want: f64 = wtype.dequantize_row(wr).iter().zip(&xd).map(|(a, b)| *a as f64 * *b as f64).sum();
                    worst = worst.max((want - y[r * n + col] as f64).abs());
                    scale = scale.max(want.abs());
                }
            }
            // q4_0 folds its −8 offset through the f16 s = d·Σq: allow that rounding.
            assert!(worst <= 2e-3 * scale, "{wtype}: {worst} vs {scale}");
        }
    }

    #[test]
    fn plans_switch_from_gemv_to_gemm_and_cover_every_output() {
        for limits in DeviceLimits::recorded() {
            for rows in (1..=200u64).chain([8191, 8192, 524_287, 524_288, 1 << 20]) {
                let p = &plans(rows, &Q_PROJ, &limits).unwrap_or_else(|e| panic!("{e}"))[0];
                p.check_cover().unwrap_or_else(|e| panic!("{e}"));
                if rows <= output_head::GEMV_MAX_ROWS {
                    assert_eq!((p.kernel.as_str(), p.grid), (output_head::GEMV_KERNEL, [512, 1, 1]), "{p}");
                } else {
                    assert_eq!((p.kernel.as_str(), p.grid), (output_head::GEMM_KERNEL, [rows.div_ceil(64) as u32, 64, 1]), "{p}");
                }
            }
        }
    }

    /// Bad shapes are typed errors naming `linear` and the shape in N and K.
    #[test]
    fn bad_shapes_are_refused_by_name() {
        let l = DeviceLimits::gb10();
        for (rows, c) in [
            (0, Q_PROJ),
            (1, LinearCase { k: 2048 + 32, ..Q_PROJ }),
            (1, LinearCase { k: 96, wtype: WeightType::Q6K, ..Q_PROJ }),
            (1, LinearCase { k: 100, wtype: WeightType::Q8_0, ..Q_PROJ }),
            (1, LinearCase { n: 0, ..Q_PROJ }),
        ] {
            match plans(rows, &c, &l) {
                Err(PlanError::Unsupported { kernel, shape, .. }) => {
                    assert_eq!(kernel, KERNEL);
                    assert!(shape.contains(&format!("k={} n={}", c.k, c.n)), "{shape}");
                }
                other => panic!("{c:?} at {rows} rows: {other:?}"),
            }
        }
        assert!(plans(1, &LinearCase { k: 96, wtype: WeightType::Q8_0, ..Q_PROJ }, &l).is_ok());
    }

    #[test]
    fn critical_counts_for_the_q_projection() {
        let counts: Vec<u64> = critical_counts(&Q_PROJ, &DeviceLimits::h200()).iter().map(|c| c.tokens).collect();
        // y: (2^31 − 1) / 4096 = 524,287.9; x blocks: / 64; x words: / 576 = 3,728,270.2.
        for t in [1, 8, 9, 63, 64, 65, 127, 128, 129, 524_287, 524_288, 33_554_431, 33_554_432, 3_728_270, 3_728_271] {
            assert!(counts.contains(&t), "{t} missing from {counts:?}");
        }
    }
}
