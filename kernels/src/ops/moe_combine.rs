//! Weighted combine of the top-k routed-expert outputs back into one row per token.
//!
//! `out[t, n] = Σ_j w[t·k + j] · y[t·k + j, n]`, with `y` indexed by (token, slot) pair as the
//! routed GEMM/GEMV write it. Grid-stride over `tokens × n` with 64-bit indexes.

use serde::{Deserialize, Serialize};

use cudarc::driver::PushKernelArg;

use crate::check::{Check, KernelFamily, Outcome, RelErr, Staged, sample_rows};
use crate::cuda::{Gpu, GpuError};
use crate::launch::{Cover, Launch, PlanError, grid_stride_blocks};
use crate::limits::DeviceLimits;
use crate::ops::testdata::{Guarded, fill_uniform};
use crate::sources::MOE_COMBINE;
use crate::testdata::uniform_row;
use crate::thresholds::{Critical, overflow_point};

pub const KERNEL: &str = "moe_combine";
const THREADS: u32 = 256;
/// f32 products summed in slot order on both sides: only FMA contraction differs.
pub const TOLERANCE: f64 = 1e-6;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CombineCase {
    pub top_k: u32,
    /// Output width (the model's hidden size).
    pub n: u32,
}

/// Every launch a combine of `tokens` makes (one).
pub fn plans(tokens: u64, c: &CombineCase, limits: &DeviceLimits) -> Result<Vec<Launch>, PlanError> {
    Ok(vec![plan(tokens, c, limits)?])
}

pub fn plan(tokens: u64, c: &CombineCase, limits: &DeviceLimits) -> Result<Launch, PlanError> {
    let items = tokens * c.n as u64;
    let shape = format_args!("tokens={tokens} top_k={} n={}", c.top_k, c.n);
    if items == 0 {
        return Err(PlanError::Unsupported { kernel: KERNEL.into(), what: "empty problem".into(), shape: shape.to_string() });
    }
    let per_block = THREADS as u64;
    Launch::checked(
        KERNEL,
        shape,
        [grid_stride_blocks(items, per_block, limits), 1, 1],
        [THREADS, 1, 1],
        0,
        vec![Cover::GridStride { items, per_block }],
        limits,
    )
}

/// CPU twin: `y` is `[tokens·k, n]`, `w` is `[tokens·k]`.
pub fn combine_cpu(y: &[f32], w: &[f32], top_k: usize, n: usize) -> Vec<f32> {
    let tokens = w.len() / top_k;
    let mut out = vec![0.0f32; tokens * n];
    for t in 0..tokens {
        combine_row(&mut out[t * n..(t + 1) * n], |j| &y[(t * top_k + j) * n..(t * top_k + j + 1) * n], |j| w[t * top_k + j], top_k);
    }
    out
}

fn combine_row<'a>(out: &mut [f32], y: impl Fn(usize) -> &'a [f32], w: impl Fn(usize) -> f32, top_k: usize) {
    for (col, o) in out.iter_mut().enumerate() {
        let mut acc = 0.0f32;
        for j in 0..top_k {
            acc += w(j) * y(j)[col];
        }
        *o = acc;
    }
}

pub fn launch(
    gpu: &Gpu,
    tokens: u64,
    c: &CombineCase,
    y: &cudarc::driver::CudaSlice<f32>,
    w: &cudarc::driver::CudaSlice<f32>,
    out: &mut cudarc::driver::CudaSlice<u32>,
) -> Result<(), GpuError> {
    let p = plan(tokens, c, gpu.limits())?;
    let f = gpu.function(&MOE_COMBINE, KERNEL)?;
    let (k, n) = (c.top_k as i32, c.n as i32);
    gpu.launch(&p, &f, |b| {
        b.arg(y).arg(w).arg(out).arg(&tokens).arg(&k).arg(&n);
    })?;
    Ok(())
}

/// Token counts where this kernel's flattened indexes pass 2^31 − 1.
pub fn critical_counts(c: &CombineCase, _limits: &DeviceLimits) -> Vec<Critical> {
    let (k, n) = (c.top_k as u64, c.n as u64);
    let mut v = vec![Critical::new(1, "single token")];
    v.extend(overflow_point(k * n, "moe_combine: y[(t·k + j)·n + col] passes 2^31 − 1"));
    v.extend(overflow_point(n, "moe_combine: out[t·n + col] passes 2^31 − 1"));
    v
}

pub fn device_bytes(tokens: u64, c: &CombineCase) -> u64 {
    let pairs = tokens * c.top_k as u64;
    4 * (pairs * c.n as u64 + pairs + tokens * c.n as u64)
}

const SEED_Y: u64 = 0x10;
const SEED_W: u64 = 0x11;

/// Self-test: random `y` and weights from seeds, output compared on sampled rows.
pub fn run_case(gpu: &Gpu, tokens: u64, c: &CombineCase) -> Result<Outcome, GpuError> {
    stage_case(gpu, tokens, c).map(Staged::finish)
}

/// [`run_case`]'s GPU half: the fills, the kernel, the poison check and the sampled rows of the
/// output (downloaded in runs); the twin of those rows and the comparison are left to the host
/// check.
pub fn stage_case(gpu: &Gpu, tokens: u64, c: &CombineCase) -> Result<Staged, GpuError> {
    let (k, n) = (c.top_k as usize, c.n as usize);
    let pairs = tokens as usize * k;
    let mut y = gpu.alloc::<f32>(pairs * n)?;
    let mut w = gpu.alloc::<f32>(pairs)?;
    fill_uniform(gpu, &mut y, pairs * n, SEED_Y, 1.0)?;
    fill_uniform(gpu, &mut w, pairs, SEED_W, 1.0)?;
    let mut out = Guarded::new(gpu, tokens as usize * n)?;
    gpu.synchronize()?;
    let start = std::time::Instant::now();
    launch(gpu, tokens, c, &y, &w, &mut out.buf)?;
    gpu.synchronize()?;
    let kernel_ms = start.elapsed().as_secs_f64() * 1e3;
    let guard = out.check(gpu, 1)?;
    let sampled = sample_rows(tokens, 64, 512, tokens);
    let got = out.read_rows_f32(gpu, &sampled, n)?;
    Ok(Staged::Check(Box::new(move || {
        let mut err = RelErr::default();
        for (&t, got) in sampled.iter().zip(&got) {
            let t = t as usize;
            let ys: Vec<Vec<f32>> = (0..k).map(|j| uniform_row(SEED_Y, ((t * k + j) * n) as u64, n, 1.0)).collect();
            let ws = uniform_row(SEED_W, (t * k) as u64, k, 1.0);
            let mut want = vec![0.0; n];
            combine_row(&mut want, |j| &ys[j], |j| ws[j], k);
            err.add_slice((t * n) as u64, got, &want);
        }
        Outcome::Ran(Check::of_floats(&err, TOLERANCE, guard, kernel_ms))
    })))
}

/// The self-test's handle on this family (registered in `selftest::case`).
pub struct Family;

impl KernelFamily for Family {
    type Case = CombineCase;

    fn run(gpu: &Gpu, tokens: u64, c: &CombineCase) -> Result<Outcome, GpuError> {
        run_case(gpu, tokens, c)
    }

    fn stage(gpu: &Gpu, tokens: u64, c: &CombineCase) -> Result<Staged, GpuError> {
        stage_case(gpu, tokens, c)
    }

    fn plans(tokens: u64, c: &CombineCase, limits: &DeviceLimits) -> Result<Vec<Launch>, PlanError> {
        plans(tokens, c, limits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_twin_matches_scalar_formula() {
        let (t, k, n) = (3, 2, 4);
        let y: Vec<f32> = (0..t * k * n).map(|i| i as f32 * 0.5).collect();
        let w: Vec<f32> = (0..t * k).map(|i| 1.0 + i as f32).collect();
        let out = combine_cpu(&y, &w, k, n);
        for tt in 0..t {
            for col in 0..n {
                let want: f32 = (0..k).map(|j| w[tt * k + j] * y[(tt * k + j) * n + col]).sum();
                assert_eq!(out[tt * n + col], want);
            }
        }
    }

    #[test]
    fn overflow_points_for_qwen3_shape() {
        let c = CombineCase { top_k: 8, n: 2048 };
        let counts: Vec<u64> = critical_counts(&c, &DeviceLimits::h200()).iter().map(|c| c.tokens).collect();
        // (2^31 − 1) / (8 · 2048) = 131071.99 → 131071 still fits, 131072 does not.
        assert!(counts.contains(&131_071) && counts.contains(&131_072));
    }
}
