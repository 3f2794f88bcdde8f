//! Residual add: `out = a + b` over `tokens × width` f32 values, in place (`x += y`, the
//! residual stream) or into another buffer. One thread per value in a grid-stride loop on
//! `grid.x` (`cuda/glue.cu`, `add_f32`), 64-bit indexes: tokens × 2048 passes 2^31 at 1,048,576
//! tokens. The twin is one IEEE addition per value: bit-exact.

use std::time::Instant;

use cudarc::driver::{CudaView, CudaViewMut, DevicePtr, DevicePtrMut, DeviceRepr, PushKernelArg};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::check::{Check, KernelFamily, Outcome, RelErr, Staged, sample_rows};
use crate::cuda::{Gpu, GpuError};
use crate::launch::{Cover, Launch, PlanError, bytes_of, grid_stride_blocks, require_bytes};
use crate::limits::DeviceLimits;
use crate::ops::testdata::{GUARD_WORDS, Guarded, fill_uniform, in_place_diff, note_in_place_diff};
use crate::sources::GLUE;
use crate::testdata::uniform_row;
use crate::thresholds::{Critical, overflow_point};

pub const KERNEL: &str = "add";
/// The CUDA function.
pub const KERNEL_FN: &str = "add_f32";
/// One correctly rounded addition on both sides: exact.
pub const TOLERANCE: f64 = 0.0;
const THREADS: u32 = 256;
const SAMPLE_ROWS: usize = 512;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AddCase {
    /// Values per token (the hidden size).
    pub width: u32,
}

fn describe(n: u64) -> String {
    format!("values={n}")
}

/// Every launch an add over `tokens` rows makes (one).
pub fn plans(tokens: u64, c: &AddCase, limits: &DeviceLimits) -> Result<Vec<Launch>, PlanError> {
    Ok(vec![plan(tokens.saturating_mul(c.width as u64), limits)?])
}

/// Threads grid-stride over the `n` values, 256 a block, on `grid.x`.
pub fn plan(n: u64, limits: &DeviceLimits) -> Result<Launch, PlanError> {
    if n == 0 || n > u64::MAX / 8 {
        return Err(PlanError::Unsupported { kernel: KERNEL.into(), what: "values must be in 1..2^61".into(), shape: describe(n) });
    }
    let per_block = THREADS as u64;
    Launch::checked(
        KERNEL_FN,
        describe(n),
        [grid_stride_blocks(n, per_block, limits), 1, 1],
        [THREADS, 1, 1],
        0,
        vec![Cover::GridStride { items: n, per_block }],
        limits,
    )
}

/// CPU twin: `a + b`, elementwise.
pub fn add_cpu(a: &[f32], b: &[f32]) -> Vec<f32> {
    a.par_iter().zip(b).map(|(a, b)| a + b).collect()
}

/// `out = a + b` over the first `n` values (`out`: f32 bits, any 4-byte element type).
pub fn launch<Y: DeviceRepr>(gpu: &Gpu, n: u64, a: &CudaView<f32>, b: &CudaView<f32>, out: &mut CudaViewMut<Y>) -> Result<(), GpuError> {
    let (a_bytes, out_bytes) = (bytes_of(a.len(), 4), bytes_of(out.len(), size_of::<Y>()));
    let (a_ptr, _a_done) = a.device_ptr(gpu.stream());
    let (out_ptr, _out_done) = out.device_ptr_mut(gpu.stream());
    launch_ptrs(gpu, n, (a_ptr, a_bytes), b, (out_ptr, out_bytes))
}

/// `x += y` over the first `n` values (the residual stream).
pub fn launch_in_place(gpu: &Gpu, n: u64, x: &mut CudaViewMut<f32>, y: &CudaView<f32>) -> Result<(), GpuError> {
    let bytes = bytes_of(x.len(), 4);
    let (ptr, _done) = x.device_ptr_mut(gpu.stream());
    launch_ptrs(gpu, n, (ptr, bytes), y, (ptr, bytes))
}

/// The launch behind both entry points: `a` and `out` as (device address, bytes) so that they
/// may be the same buffer; the callers hold the buffers' stream guards until it is queued.
fn launch_ptrs(gpu: &Gpu, n: u64, a: (u64, u64), b: &CudaView<f32>, out: (u64, u64)) -> Result<(), GpuError> {
    let p = plan(n, gpu.limits())?;
    require_bytes(&p, &[("a", a.1, 4 * n), ("b", bytes_of(b.len(), 4), 4 * n), ("out", out.1, 4 * n)])?;
    let f = gpu.function(&GLUE, KERNEL_FN)?;
    gpu.launch(&p, &f, |args| {
        args.arg(&a.0).arg(b).arg(&out.0).arg(&n);
    })?;
    Ok(())
}

/// Counts this plan makes critical: where `tokens × width` passes 2^31 − 1, and where the
/// grid-stride loop first takes a second trip.
pub fn critical_counts(c: &AddCase, limits: &DeviceLimits) -> Vec<Critical> {
    let w = c.width.max(1) as u64;
    let mut v = vec![Critical::new(1, "add: single token")];
    v.extend(overflow_point(w, "add: x[t·W + i] passes 2^31 − 1"));
    let per_trip = grid_stride_blocks(u64::MAX / 64, THREADS as u64, limits) * THREADS as u64;
    let first = per_trip / w + 1;
    v.push(Critical::new(first - 1, "add: one grid-stride trip (last count)"));
    v.push(Critical::new(first, "add: a second grid-stride trip"));
    v
}

/// a, b and the guarded output.
pub fn device_bytes(tokens: u64, c: &AddCase) -> u64 {
    let n = tokens * c.width as u64;
    4 * (3 * n + GUARD_WORDS as u64)
}

const SEED_A: u64 = 0x70;
const SEED_B: u64 = 0x71;

/// Self-test: a and b from seeds; `out = a + b` into a poisoned buffer, sampled rows against
/// the twin; then `a += b` in place must give the same bits.
pub fn run_case(gpu: &Gpu, tokens: u64, c: &AddCase) -> Result<Outcome, GpuError> {
    stage_case(gpu, tokens, c).map(Staged::finish)
}

/// [`run_case`]'s GPU half: both launches, the poison check, the in-place difference and the
/// sampled rows downloaded in runs; the twin and the comparison are the host check.
pub fn stage_case(gpu: &Gpu, tokens: u64, c: &AddCase) -> Result<Staged, GpuError> {
    plans(tokens, c, gpu.limits())?; // refuse a bad shape before allocating for it
    let (w, n) = (c.width as usize, tokens * c.width as u64);
    let mut a = gpu.alloc::<f32>(n as usize)?;
    let mut b = gpu.alloc::<f32>(n as usize)?;
    fill_uniform(gpu, &mut a, n as usize, SEED_A, 4.0)?;
    fill_uniform(gpu, &mut b, n as usize, SEED_B, 1.0)?;
    let mut out = Guarded::new(gpu, n as usize)?;
    gpu.synchronize()?;
    let start = Instant::now();
    launch(gpu, n, &a.as_view(), &b.as_view(), &mut out.buf.slice_mut(..n as usize))?;
    gpu.synchronize()?;
    let kernel_ms = start.elapsed().as_secs_f64() * 1e3;
    let (unwritten, past_end) = out.check(gpu, 1)?;
    let sampled = sample_rows(tokens, 64, SAMPLE_ROWS, tokens);
    let got = out.read_rows_f32(gpu, &sampled, w)?;
    launch_in_place(gpu, n, &mut a.as_view_mut(), &b.as_view())?;
    let diff = in_place_diff(gpu, &sampled, w, &a, &out)?;
    Ok(Staged::Check(Box::new(move || {
        let want: Vec<Vec<f32>> = sampled
            .par_iter()
            .map(|&t| add_cpu(&uniform_row(SEED_A, t * w as u64, w, 4.0), &uniform_row(SEED_B, t * w as u64, w, 1.0)))
            .collect();
        let mut err = RelErr::default();
        for ((&t, want), got) in sampled.iter().zip(&want).zip(&got) {
            err.add_slice(t * w as u64, got, want);
        }
        let check = Check::of_floats(&err, TOLERANCE, (unwritten, past_end), kernel_ms);
        Outcome::Ran(note_in_place_diff(check, diff))
    })))
}

/// The self-test's handle on this family (registered in `selftest::case`).
pub struct Family;

impl KernelFamily for Family {
    type Case = AddCase;

    fn run(gpu: &Gpu, tokens: u64, c: &AddCase) -> Result<Outcome, GpuError> {
        run_case(gpu, tokens, c)
    }

    fn stage(gpu: &Gpu, tokens: u64, c: &AddCase) -> Result<Staged, GpuError> {
        stage_case(gpu, tokens, c)
    }

    fn plans(tokens: u64, c: &AddCase, limits: &DeviceLimits) -> Result<Vec<Launch>, PlanError> {
        plans(tokens, c, limits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn twin_is_elementwise_sum() {
        let a = uniform_row(1, 0, 1000, 4.0);
        let b = uniform_row(2, 0, 1000, 1.0);
        let s = add_cpu(&a, &b);
        assert!(
            s.iter().zip(a.iter().zip(&b)).all(|(s, (a, b))| (*s as f64 - (*a as f64 + *b as f64)).abs() <= 2e-7 * a.abs().max(1.0) as f64)
        );
    }

    #[test]
    fn plans_cover_every_value_once() {
        for limits in DeviceLimits::recorded() {
            for t in (1..=64u64).chain([8191, 8192, 1_048_575, 1_048_576]) {
                let p = &plans(t, &AddCase { width: 2048 }, &limits).unwrap()[0];
                p.check_cover().unwrap();
                assert_eq!((p.grid[1], p.grid[2], p.cover[0].items()), (1, 1, t * 2048));
            }
            assert!(plans(3, &AddCase { width: 5 }, &limits).unwrap()[0].simulate_cover(0).iter().all(|&h| h == 1));
        }
    }

    #[test]
    fn bad_shapes_and_counts() {
        let l = DeviceLimits::h200();
        assert!(matches!(plans(0, &AddCase { width: 2048 }, &l), Err(PlanError::Unsupported { .. })));
        assert!(matches!(plans(1, &AddCase { width: 0 }, &l), Err(PlanError::Unsupported { .. })));
        let counts: Vec<u64> = critical_counts(&AddCase { width: 2048 }, &l).iter().map(|c| c.tokens).collect();
        assert!(counts.contains(&1_048_575) && counts.contains(&1_048_576), "{counts:?}");
        let second = *counts.last().unwrap();
        let blocks = |t: u64| plans(t, &AddCase { width: 2048 }, &l).unwrap()[0].blocks();
        assert!(blocks(second - 1) * 256 >= (second - 1) * 2048 && blocks(second) * 256 < second * 2048);
    }
}
