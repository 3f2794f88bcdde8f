//! Rotary position embedding, NEOX style as qwen3 uses it: within each head of `d` floats the
//! pairs `(i, i + d/2)` rotate by `pos · freq[i]`, `freq[i] = theta^(-2i/d)`.
//!
//! Applied in place to Q `[tokens, n_head, d]` and K `[tokens, n_kv, d]`, one launch per tensor
//! ([`launch`]); positions `[tokens]` i32 restart per sequence of the batch. The frequencies are
//! computed in f32 as llama.cpp's CUDA backend does (`powf(powf(theta, -2/d), i)`), once per
//! model on the host ([`RopeTable`]: d/2 floats, nothing that grows with tokens); the angle is
//! the f32 product `pos · freq[i]`. Geometry: a grid-stride loop over (token, head, i) items,
//! one rotated pair each (`cuda/rope.cu`), so a single decode token still spreads over the GPU.
//!
//! Accuracy: the twin repeats the device's f32 angle and rotation exactly; only the device's
//! `sincosf` (2 ulp) differs from the host's sine and cosine, hence [`TOLERANCE`]. Against an
//! f64 rotation with exact angles, the f32 angle itself is off by ~1e-7 · pos radians (the f32
//! frequencies and product; llama.cpp's error too: 4e-3 rad at position 40,960), which the unit
//! tests bound.

use std::time::Instant;

use cudarc::driver::{CudaSlice, CudaView, CudaViewMut, DevicePtr, DevicePtrMut, DeviceRepr, PushKernelArg};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::check::{Check, KernelFamily, Outcome, RelErr, sample_rows};
use crate::cuda::{Gpu, GpuError};
use crate::launch::{Cover, Launch, PlanError, bytes_of, grid_stride_blocks, require_bytes};
use crate::limits::DeviceLimits;
use crate::ops::testdata::{GUARD_WORDS, Guarded, fill_uniform, with_in_place_diff};
use crate::sources::ROPE;
use crate::testdata::{hash2, uniform_row};
use crate::thresholds::{Critical, overflow_point, tile_tails};

pub const KERNEL: &str = "rope";
/// The CUDA function.
pub const KERNEL_FN: &str = "rope_neox";
/// Relative to the largest output: sin and cos differ by at most ~2.5 ulp (sincosf's 2 ulp and
/// the host's rounding), i.e. 1.5e-7 each, which moves an output by at most (|x0| + |x1|)·1.5e-7
/// plus an ulp of rounding: under 5e-7 of the largest. A swapped pair or a wrong position is
/// off by O(1).
pub const TOLERANCE: f64 = 2e-6;
const THREADS: u32 = 256;
const SAMPLE_ROWS: usize = 512;

/// What a rotation depends on besides the positions: one table per model.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct RopeSpec {
    /// Rotated width: the whole head (`rope.dimension_count` = head_dim for qwen3).
    pub head_dim: u32,
    /// `rope.freq_base` (1,000,000 for qwen3).
    pub theta: f32,
}

impl RopeSpec {
    fn half(&self) -> usize {
        self.head_dim as usize / 2
    }

    fn unsupported(&self) -> Option<String> {
        if self.head_dim == 0 || !self.head_dim.is_multiple_of(2) || self.head_dim > i32::MAX as u32 {
            Some(format!("head_dim {} must be even, positive and below 2^31", self.head_dim))
        } else if !(self.theta > 0.0 && self.theta.is_finite()) {
            Some(format!("theta {} must be finite and > 0", self.theta))
        } else {
            None
        }
    }

    /// `freq[i] = (theta^(-2/d))^i` in f32, as llama.cpp's CUDA backend computes it.
    pub fn freqs(&self) -> Vec<f32> {
        let scale = self.theta.powf(-2.0 / self.head_dim as f32);
        (0..self.half()).map(|i| scale.powf(i as f32)).collect()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct RopeCase {
    /// Heads of the rotated tensor: n_head for Q, n_kv for K.
    pub heads: u32,
    pub head_dim: u32,
    pub theta: f32,
    /// Sequences the self-test's batch is split into (positions restart in each).
    pub sequences: u32,
}

impl RopeCase {
    pub fn spec(&self) -> RopeSpec {
        RopeSpec { head_dim: self.head_dim, theta: self.theta }
    }
}

fn shape(tokens: u64, heads: u32, s: &RopeSpec) -> String {
    format!("tokens={tokens} heads={heads} head_dim={} theta={}", s.head_dim, s.theta)
}

/// Every launch one tensor's rotation of `tokens` makes (one).
pub fn plans(tokens: u64, c: &RopeCase, limits: &DeviceLimits) -> Result<Vec<Launch>, PlanError> {
    Ok(vec![plan(tokens, c.heads, &c.spec(), limits)?])
}

/// Grid-stride over the `tokens · heads · d/2` (token, head, i) items, 256 threads a block, grid.x capped to
/// fill the device a few times.
pub fn plan(tokens: u64, heads: u32, s: &RopeSpec, limits: &DeviceLimits) -> Result<Launch, PlanError> {
    let what = if tokens == 0 {
        Some("0 tokens".into())
    } else if heads == 0 || heads > i32::MAX as u32 {
        Some(format!("{heads} heads: must be in 1..2^31"))
    } else if tokens.checked_mul(heads as u64 * s.head_dim as u64).is_none() {
        Some("tokens × heads × head_dim overflows 64 bits".into())
    } else {
        s.unsupported()
    };
    if let Some(what) = what {
        return Err(PlanError::Unsupported { kernel: KERNEL.into(), what, shape: shape(tokens, heads, s) });
    }
    let (items, per_block) = (tokens * heads as u64 * s.half() as u64, THREADS as u64);
    Launch::checked(
        KERNEL_FN,
        shape(tokens, heads, s),
        [grid_stride_blocks(items, per_block, limits), 1, 1],
        [THREADS, 1, 1],
        0,
        vec![Cover::GridStride { items, per_block }],
        limits,
    )
}

/// The frequencies of a model on the device, made once by the engine and passed to every launch.
pub struct RopeTable {
    spec: RopeSpec,
    freqs: CudaSlice<f32>,
}

impl RopeTable {
    pub fn new(gpu: &Gpu, spec: RopeSpec) -> Result<RopeTable, GpuError> {
        if let Some(what) = spec.unsupported() {
            let shape = format!("head_dim={} theta={}", spec.head_dim, spec.theta);
            return Err(PlanError::Unsupported { kernel: KERNEL.into(), what, shape }.into());
        }
        Ok(RopeTable { spec, freqs: gpu.upload(&spec.freqs())? })
    }

    pub fn spec(&self) -> RopeSpec {
        self.spec
    }

    /// The `head_dim / 2` frequencies on the device (the fused norm + RoPE reads them too).
    pub(crate) fn freqs(&self) -> &CudaSlice<f32> {
        &self.freqs
    }
}

/// `(sin, cos)` of the f32 angle `pos · freq`, rounded from f64.
fn rotation(pos: i32, freq: f32) -> (f32, f32) {
    let angle = (pos as f32 * freq) as f64;
    (angle.sin() as f32, angle.cos() as f32)
}

/// CPU twin of one token: `x` holds its heads (`[heads, d]`), rotated in place.
pub fn rope_token_cpu(x: &mut [f32], pos: i32, freqs: &[f32]) {
    let half = freqs.len();
    for (i, &freq) in freqs.iter().enumerate() {
        let (s, c) = rotation(pos, freq);
        for head in x.chunks_exact_mut(2 * half) {
            let (x0, x1) = (head[i], head[i + half]);
            head[i] = x0 * c - x1 * s;
            head[i + half] = x0 * s + x1 * c;
        }
    }
}

/// CPU twin over a batch: `x` `[positions.len(), heads, d]` in place, tokens in parallel.
pub fn rope_cpu(x: &mut [f32], positions: &[i32], heads: usize, s: &RopeSpec) {
    let freqs = s.freqs();
    x.par_chunks_mut((heads * s.head_dim as usize).max(1)).zip(positions).for_each(|(row, &pos)| rope_token_cpu(row, pos, &freqs));
}

/// Rotates `x` (`[tokens, heads, d]`: Q or K) in place at `positions` (`[tokens]`).
pub fn launch(
    gpu: &Gpu,
    tokens: u64,
    heads: u32,
    table: &RopeTable,
    positions: &CudaView<i32>,
    x: &mut CudaViewMut<f32>,
) -> Result<(), GpuError> {
    let bytes = bytes_of(x.len(), 4);
    let (ptr, _done) = x.device_ptr_mut(gpu.stream());
    launch_ptrs(gpu, tokens, heads, table, positions, (ptr, bytes), (ptr, bytes))
}

/// Rotates `x` into `y` (f32 bits; any element type): the self-test's poisoned output.
pub fn launch_into<Y: DeviceRepr>(
    gpu: &Gpu,
    tokens: u64,
    heads: u32,
    table: &RopeTable,
    positions: &CudaView<i32>,
    x: &CudaView<f32>,
    y: &mut CudaViewMut<Y>,
) -> Result<(), GpuError> {
    let (x_bytes, y_bytes) = (bytes_of(x.len(), 4), bytes_of(y.len(), size_of::<Y>()));
    let (x_ptr, _x_done) = x.device_ptr(gpu.stream());
    let (y_ptr, _y_done) = y.device_ptr_mut(gpu.stream());
    launch_ptrs(gpu, tokens, heads, table, positions, (x_ptr, x_bytes), (y_ptr, y_bytes))
}

/// The launch behind both entry points: `x` and `y` as (device address, bytes) so that they may
/// be the same buffer; the callers hold the buffers' stream guards until it is queued.
fn launch_ptrs(
    gpu: &Gpu,
    tokens: u64,
    heads: u32,
    table: &RopeTable,
    positions: &CudaView<i32>,
    x: (u64, u64),
    y: (u64, u64),
) -> Result<(), GpuError> {
    let p = plan(tokens, heads, &table.spec, gpu.limits())?;
    let n = 4 * tokens * heads as u64 * table.spec.head_dim as u64;
    require_bytes(&p, &[("x", x.1, n), ("y", y.1, n), ("positions", bytes_of(positions.len(), 4), 4 * tokens)])?;
    let f = gpu.function(&ROPE, KERNEL_FN)?;
    let (heads, half) = (heads as i32, table.spec.half() as i32);
    gpu.launch(&p, &f, |b| {
        b.arg(&x.0).arg(&y.0).arg(positions).arg(&table.freqs).arg(&tokens).arg(&heads).arg(&half);
    })?;
    Ok(())
}

/// Counts this plan makes critical: where `x[t·heads·d + …]` and the item index
/// `(t·heads + h)·d/2 + i` pass 2^31 − 1, where the grid-stride loop starts a second round (the grid is capped by the
/// device), and the tails of the tokens one block holds.
pub fn critical_counts(c: &RopeCase, limits: &DeviceLimits) -> Vec<Critical> {
    let per_token = (c.heads as u64 * (c.head_dim / 2) as u64).max(1);
    let mut v = vec![Critical::new(1, "single token")];
    v.extend(overflow_point(c.heads as u64 * c.head_dim as u64, "rope: x[t·heads·d + h·d + i] passes 2^31 − 1"));
    v.extend(overflow_point(per_token, "rope: item (t·heads + h)·d/2 + i passes 2^31 − 1"));
    let per_block = THREADS as u64;
    let cap = grid_stride_blocks(u64::MAX, per_block, limits);
    let last = cap * per_block / per_token;
    v.push(Critical::new(last, format!("rope: {cap} blocks hold every item in one round (grid capped)")));
    v.push(Critical::new(last + 1, format!("rope: first count whose grid-stride loop takes a second round ({cap} blocks)")));
    if per_block.is_multiple_of(per_token) && per_block / per_token > 1 {
        v.extend(tile_tails(per_block / per_token, true, &[], &format!("rope: {} tokens per block", per_block / per_token)));
    }
    v
}

/// Input, positions, frequencies and the guarded output of a self-test case.
pub fn device_bytes(tokens: u64, c: &RopeCase) -> u64 {
    let n = tokens * c.heads as u64 * c.head_dim as u64;
    4 * (n + tokens + c.head_dim as u64 / 2 + n + GUARD_WORDS as u64)
}

const SEED_X: u64 = 0x60;
const SEED_POS: u64 = 0x61;
/// Sequences after the first start as if this much context came before them (qwen3's context).
const MAX_START: u64 = 40_960;

/// Positions of the self-test batch: `sequences` sequences (fewer if there are fewer tokens)
/// of equal length, the remainder in the last; positions restart in each, the first at 0, the
/// others at a pseudo-random offset below [`MAX_START`] (a sequence resuming with context).
pub(crate) fn test_positions(tokens: u64, sequences: u32) -> Vec<i32> {
    let seqs = (sequences as u64).clamp(1, tokens);
    let len = tokens / seqs;
    (0..tokens)
        .map(|t| {
            let s = (t / len).min(seqs - 1);
            let start = if s == 0 { 0 } else { hash2(SEED_POS, s) % MAX_START };
            (start + t - s * len) as i32
        })
        .collect()
}

/// Self-test: x from a seed and a batch of sequences' positions, rotated into a poisoned y;
/// sampled tokens compared with the twin; then the in-place launch over x must reproduce y bit
/// for bit on those tokens.
pub fn run_case(gpu: &Gpu, tokens: u64, c: &RopeCase) -> Result<Outcome, GpuError> {
    let spec = c.spec();
    plan(tokens, c.heads, &spec, gpu.limits())?; // a bad shape is refused before anything is allocated
    let table = RopeTable::new(gpu, spec)?;
    let row = c.heads as usize * c.head_dim as usize;
    let n = tokens as usize * row;
    let mut x = gpu.alloc::<f32>(n)?;
    fill_uniform(gpu, &mut x, n, SEED_X, 1.0)?;
    let positions = test_positions(tokens, c.sequences);
    let pos_dev = gpu.upload(&positions)?;
    let mut y = Guarded::new(gpu, n)?;
    gpu.synchronize()?;
    let start = Instant::now();
    launch_into(gpu, tokens, c.heads, &table, &pos_dev.as_view(), &x.as_view(), &mut y.buf.slice_mut(..n))?;
    gpu.synchronize()?;
    let kernel_ms = start.elapsed().as_secs_f64() * 1e3;
    let (unwritten, past_end) = y.check(gpu, 1)?;
    let freqs = spec.freqs();
    let sampled = sample_rows(tokens, 64, SAMPLE_ROWS, tokens);
    let want: Vec<Vec<f32>> = sampled
        .par_iter()
        .map(|&t| {
            let mut r = uniform_row(SEED_X, t * row as u64, row, 1.0);
            rope_token_cpu(&mut r, positions[t as usize], &freqs);
            r
        })
        .collect();
    let mut err = RelErr::default();
    for (&t, want) in sampled.iter().zip(&want) {
        let at = t as usize * row;
        err.add_slice(at as u64, &y.read_f32(gpu, at, row)?, want);
    }
    launch(gpu, tokens, c.heads, &table, &pos_dev.as_view(), &mut x.as_view_mut())?;
    let check = Check::of_floats(&err, TOLERANCE, (unwritten, past_end), kernel_ms);
    Ok(Outcome::Ran(with_in_place_diff(gpu, &sampled, row, &x, &y, check)?))
}

/// The self-test's handle on this family (registered in `selftest::case`).
pub struct Family;

impl KernelFamily for Family {
    type Case = RopeCase;

    fn run(gpu: &Gpu, tokens: u64, c: &RopeCase) -> Result<Outcome, GpuError> {
        run_case(gpu, tokens, c)
    }

    fn plans(tokens: u64, c: &RopeCase, limits: &DeviceLimits) -> Result<Vec<Launch>, PlanError> {
        plans(tokens, c, limits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const Q: RopeCase = RopeCase { heads: 32, head_dim: 128, theta: 1e6, sequences: 4 };
    const K: RopeCase = RopeCase { heads: 4, ..Q };

    /// Rotation with the angle pos · theta^(-2i/d) in f64.
    fn scalar_token(x: &[f32], pos: i32, s: &RopeSpec) -> Vec<f64> {
        let (d, half) = (s.head_dim as usize, s.half());
        let mut out: Vec<f64> = x.iter().map(|&v| v as f64).collect();
        for head in out.chunks_exact_mut(d) {
            for i in 0..half {
                let angle = pos as f64 * (s.theta as f64).powf(-2.0 * i as f64 / d as f64);
                let (x0, x1) = (head[i], head[i + half]);
                head[i] = x0 * angle.cos() - x1 * angle.sin();
                head[i + half] = x0 * angle.sin() + x1 * angle.cos();
            }
        }
        out
    }

    #[test]
    fn twin_matches_f64_rotation_within_the_f32_angle_error() {
        for spec in [RopeSpec { head_dim: 128, theta: 1e6 }, RopeSpec { head_dim: 64, theta: 1e4 }, RopeSpec { head_dim: 2, theta: 1e6 }] {
            let heads = 3;
            let row = heads * spec.head_dim as usize;
            let positions = [0, 1, 2, 7, 100, 4095, 40_959, 300_000, -5];
            let mut x = uniform_row(7, 0, positions.len() * row, 1.0);
            let orig = x.clone();
            rope_cpu(&mut x, &positions, heads, &spec);
            for (t, &pos) in positions.iter().enumerate() {
                let want = scalar_token(&orig[t * row..(t + 1) * row], pos, &spec);
                // The f32 angle is off by ~1e-7·|pos| rad (measured up to 9e-8·|pos| here, see
                // the module doc); sin and cos by ~1e-7.
                let bound = 2e-7 * pos.unsigned_abs() as f64 + 1e-6;
                for (j, (g, w)) in x[t * row..(t + 1) * row].iter().zip(&want).enumerate() {
                    assert!((*g as f64 - w).abs() <= bound, "{spec:?} pos {pos} elem {j}: {g} vs {w}");
                }
            }
            // Position 0 is the identity, bit for bit.
            assert_eq!(x[..row], orig[..row]);
        }
    }

    #[test]
    fn rotates_neox_pairs_of_each_head() {
        // One head of 4: pairs (0, 2) and (1, 3); freq = [1, theta^(-1/2)].
        let s = RopeSpec { head_dim: 4, theta: 100.0 };
        assert_eq!(s.freqs(), vec![1.0, 0.1]);
        let mut x = vec![1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0];
        rope_cpu(&mut x, &[1, 10], 1, &s);
        let sc = |a: f32| ((a as f64).sin() as f32, (a as f64).cos() as f32);
        // Position 1: pair (0, 2) by 1 rad, pair (1, 3) by 0.1 rad.
        let ((s1, c1), (s01, c01)) = (sc(1.0), sc(0.1));
        assert_eq!(x[..4], [c1, -s01, s1, c01]);
        // Position 10: by 10 rad and by 10 · 0.1 = 1 rad (in f32).
        let (s10, c10) = sc(10.0);
        assert_eq!(x[4..], [c10, -s1, s10, c1]);
    }

    #[test]
    fn freqs_follow_llama_cpp() {
        let s = Q.spec();
        let f = s.freqs();
        assert_eq!(f.len(), 64);
        assert_eq!(f[0], 1.0);
        assert_eq!(f[1], 1e6f32.powf(-2.0 / 128.0));
        assert!(f.windows(2).all(|w| w[1] < w[0]));
        let exact = 1e6f64.powf(-126.0 / 128.0);
        assert!((f[63] as f64 - exact).abs() <= 1e-5 * exact, "{} vs {exact}", f[63]);
    }

    #[test]
    fn positions_restart_per_sequence() {
        let p = test_positions(10, 4);
        let starts: Vec<i32> = (1..4).map(|s| (hash2(SEED_POS, s) % MAX_START) as i32).collect();
        let want = [0, 1, starts[0], starts[0] + 1, starts[1], starts[1] + 1, starts[2], starts[2] + 1, starts[2] + 2, starts[2] + 3];
        assert_eq!(p, want);
        assert_eq!(test_positions(3, 4), vec![0, starts[0], starts[1]]);
        assert_eq!(test_positions(5, 1), vec![0, 1, 2, 3, 4]);
    }

    #[test]
    fn plans_cover_every_item_once() {
        for limits in DeviceLimits::recorded() {
            for c in [Q, K] {
                for tokens in (1..=256).chain([8191, 8192, 14_135, 16_896, 16_897, 1 << 20]) {
                    let p = plans(tokens, &c, &limits).unwrap_or_else(|e| panic!("{e}"));
                    assert_eq!(p.len(), 1);
                    p[0].check_cover().unwrap_or_else(|e| panic!("{e}"));
                    if tokens <= 256 {
                        assert!(p[0].simulate_cover(0).iter().all(|&h| h == 1), "{}", p[0]);
                    }
                }
            }
        }
    }

    #[test]
    fn bad_shapes_are_typed_errors() {
        let l = DeviceLimits::gb10();
        let bad = [
            (0, Q),
            (1, RopeCase { heads: 0, ..Q }),
            (1, RopeCase { head_dim: 0, ..Q }),
            (1, RopeCase { head_dim: 127, ..Q }),
            (1, RopeCase { theta: 0.0, ..Q }),
            (1, RopeCase { theta: f32::NAN, ..Q }),
            (1, RopeCase { theta: -1e4, ..Q }),
            (u64::MAX / 2, Q),
        ];
        for (tokens, c) in bad {
            assert!(matches!(plans(tokens, &c, &l), Err(PlanError::Unsupported { .. })), "{c:?}");
        }
    }

    #[test]
    fn critical_counts_for_qwen3() {
        let counts = |c: &RopeCase, l: &DeviceLimits| -> Vec<u64> { critical_counts(c, l).iter().map(|c| c.tokens).collect() };
        let h200 = DeviceLimits::h200();
        // Q: 2^31 / (32·128) = 524,287.99; items 2^31 / (32·64) = 1,048,575.99; K: 2^31 / (4·128).
        for t in [1, 524_287, 524_288, 1_048_575, 1_048_576] {
            assert!(counts(&Q, &h200).contains(&t), "{t}");
        }
        assert!(counts(&K, &h200).contains(&4_194_303) && counts(&K, &h200).contains(&4_194_304));
        // Grid capped at 132·2048/256·4 = 4224 blocks of 256 threads: 4224·256/2048 = 528 tokens of Q.
        assert!(counts(&Q, &h200).contains(&528) && counts(&Q, &h200).contains(&529));
        // GB10: 48·1536/256·4 = 1152 blocks: 144 tokens.
        assert!(counts(&Q, &DeviceLimits::gb10()).contains(&145));
        // A token is 2,048 items of Q and 256 of K: no block holds a whole second token, no tails.
        assert!(!counts(&Q, &h200).contains(&7) && !counts(&K, &h200).contains(&3));
    }
}
