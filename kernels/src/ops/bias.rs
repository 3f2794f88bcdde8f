//! Bias add: `x[t, i] += bias[i]` over `tokens × width` f32 values, in place (gpt-oss's q, k, v
//! and o projection biases, and the router's), or the picked expert's row,
//! `y[p, i] += bias[ids[p], i]` over the (token, slot) pairs' rows (its gate, up and down
//! biases). One thread per value in a grid-stride loop on `grid.x` (`cuda/glue.cu`,
//! `add_bias_f32`, `add_pick_bias_f32`), 64-bit indexes: tokens × 4096 passes 2^31 at 524,288
//! tokens. The twin is one IEEE addition per value (ggml_add broadcasting the bias row, and
//! llama.cpp's `ggml_add_id` for the picks): bit-exact.

use std::time::Instant;

use cudarc::driver::{CudaView, CudaViewMut, PushKernelArg};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::check::{Check, KernelFamily, Outcome, RelErr, sample_rows};
use crate::cuda::{Gpu, GpuError};
use crate::launch::{Cover, Launch, PlanError, bytes_of, grid_stride_blocks, require_bytes};
use crate::limits::DeviceLimits;
use crate::ops::testdata::{GUARD_WORDS, fill_uniform};
use crate::routing::{Routing, route};
use crate::sources::GLUE;
use crate::testdata::uniform_row;
use crate::thresholds::{Critical, overflow_point};

pub const KERNEL: &str = "bias";
/// The CUDA function.
pub const KERNEL_FN: &str = "add_bias_f32";
/// The CUDA function of the picked experts' biases.
pub const PICK_KERNEL_FN: &str = "add_pick_bias_f32";
/// One correctly rounded addition on both sides: exact.
pub const TOLERANCE: f64 = 0.0;
const THREADS: u32 = 256;
const SAMPLE_ROWS: usize = 512;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BiasCase {
    /// Values per row (the projection's output width; the bias's row).
    pub width: u32,
    /// The picked experts' biases (rows are the tokens' `top_k` pairs, the bias
    /// `[experts, width]`); absent: one bias row for every token's row.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub picks: Option<Picks>,
}

/// The routing of a picked-expert bias case.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Picks {
    pub experts: u32,
    pub top_k: u32,
}

impl BiasCase {
    /// Rows of `tokens`: the tokens, or their pairs.
    fn rows(&self, tokens: u64) -> u64 {
        tokens.saturating_mul(self.picks.map_or(1, |p| p.top_k as u64))
    }
}

fn describe(n: u64, width: u64) -> String {
    format!("values={n} width={width}")
}

/// Every launch a bias add over `tokens` makes (one).
pub fn plans(tokens: u64, c: &BiasCase, limits: &DeviceLimits) -> Result<Vec<Launch>, PlanError> {
    let n = c.rows(tokens).saturating_mul(c.width as u64);
    match c.picks {
        None => Ok(vec![plan(n, c.width as u64, limits)?]),
        Some(p) => {
            if p.experts == 0 || p.experts > i32::MAX as u32 || p.top_k == 0 || p.top_k > p.experts {
                let what = format!("{} experts, top_k {}: need 1 <= top_k <= experts < 2^31", p.experts, p.top_k);
                return Err(PlanError::Unsupported { kernel: KERNEL.into(), what, shape: describe(n, c.width as u64) });
            }
            Ok(vec![plan_fn(PICK_KERNEL_FN, n, c.width as u64, limits)?])
        }
    }
}

/// Threads grid-stride over the `n` values (rows of `width`), 256 a block, on `grid.x`.
pub fn plan(n: u64, width: u64, limits: &DeviceLimits) -> Result<Launch, PlanError> {
    plan_fn(KERNEL_FN, n, width, limits)
}

/// [`plan`] for either kernel (the picks' has the same geometry).
fn plan_fn(kernel_fn: &str, n: u64, width: u64, limits: &DeviceLimits) -> Result<Launch, PlanError> {
    let unsupported = |what: &str| PlanError::Unsupported { kernel: KERNEL.into(), what: what.into(), shape: describe(n, width) };
    if n == 0 || n > u64::MAX / 8 {
        return Err(unsupported("values must be in 1..2^61"));
    }
    if width == 0 || !n.is_multiple_of(width) {
        return Err(unsupported("the values must be whole rows of the bias's width"));
    }
    let per_block = THREADS as u64;
    Launch::checked(
        kernel_fn,
        describe(n, width),
        [grid_stride_blocks(n, per_block, limits), 1, 1],
        [THREADS, 1, 1],
        0,
        vec![Cover::GridStride { items: n, per_block }],
        limits,
    )
}

/// CPU twin: `x[t, i] + bias[i]` over whole rows.
pub fn add_bias_cpu(x: &[f32], bias: &[f32]) -> Vec<f32> {
    x.par_chunks(bias.len().max(1)).flat_map_iter(|row| row.iter().zip(bias).map(|(x, b)| x + b)).collect()
}

/// `x[t, i] += bias[i]` over the first `tokens` rows of `bias.len()` values.
pub fn launch(gpu: &Gpu, tokens: u64, x: &mut CudaViewMut<f32>, bias: &CudaView<f32>) -> Result<(), GpuError> {
    let width = bias.len() as u64;
    let n = tokens.saturating_mul(width);
    let p = plan(n, width, gpu.limits())?;
    require_bytes(&p, &[("x", bytes_of(x.len(), 4), 4 * n), ("bias", bytes_of(bias.len(), 4), 4 * width)])?;
    let f = gpu.function(&GLUE, KERNEL_FN)?;
    gpu.launch(&p, &f, |args| {
        args.arg(x).arg(bias).arg(&n).arg(&width);
    })?;
    Ok(())
}

/// CPU twin of the picks' biases: row p of `y` (`[ids.len(), width]`) gains row `ids[p]` of
/// `bias` (`[experts, width]`); an id outside the experts adds nothing.
pub fn add_pick_bias_cpu(y: &[f32], ids: &[i32], bias: &[f32], width: usize) -> Vec<f32> {
    let experts = bias.len() / width.max(1);
    y.par_chunks(width.max(1))
        .zip(ids)
        .flat_map_iter(|(row, &e)| {
            let b = (e >= 0 && (e as usize) < experts).then(|| &bias[e as usize * width..(e as usize + 1) * width]);
            row.iter().enumerate().map(move |(i, y)| b.map_or(*y, |b| y + b[i]))
        })
        .collect()
}

/// `y[p, i] += bias[ids[p], i]` over the first `pairs` rows of `width = bias.len() / experts`
/// (the picked experts' biases, `bias` `[experts, width]`).
pub fn launch_picks(
    gpu: &Gpu,
    pairs: u64,
    experts: u32,
    y: &mut CudaViewMut<f32>,
    ids: &CudaView<i32>,
    bias: &CudaView<f32>,
) -> Result<(), GpuError> {
    let width = if experts == 0 { 0 } else { bias.len() as u64 / experts as u64 };
    let n = pairs.saturating_mul(width);
    let p = plan_fn(PICK_KERNEL_FN, n, width, gpu.limits())?;
    if experts as u64 * width != bias.len() as u64 || experts > i32::MAX as u32 {
        let what = format!("a bias of {} values is not {experts} experts' rows", bias.len());
        return Err(PlanError::Unsupported { kernel: KERNEL.into(), what, shape: p.shape.clone() }.into());
    }
    require_bytes(&p, &[("y", bytes_of(y.len(), 4), 4 * n), ("ids", bytes_of(ids.len(), 4), 4 * pairs)])?;
    let f = gpu.function(&GLUE, PICK_KERNEL_FN)?;
    let e = experts as i32;
    gpu.launch(&p, &f, |args| {
        args.arg(y).arg(ids).arg(bias).arg(&pairs).arg(&width).arg(&e);
    })?;
    Ok(())
}

/// Counts this plan makes critical: where `rows × width` passes 2^31 − 1, and where the
/// grid-stride loop first takes a second trip.
pub fn critical_counts(c: &BiasCase, limits: &DeviceLimits) -> Vec<Critical> {
    let w = c.width.max(1) as u64 * c.picks.map_or(1, |p| p.top_k.max(1) as u64);
    let mut v = vec![Critical::new(1, "bias: single token")];
    v.extend(overflow_point(w, "bias: x[t·W + i] passes 2^31 − 1"));
    let per_trip = grid_stride_blocks(u64::MAX / 64, THREADS as u64, limits) * THREADS as u64;
    let first = per_trip / w + 1;
    v.push(Critical::new(first - 1, "bias: one grid-stride trip (last count)"));
    v.push(Critical::new(first, "bias: a second grid-stride trip"));
    v
}

/// x with its guard zone, the bias (and the picks' ids).
pub fn device_bytes(tokens: u64, c: &BiasCase) -> u64 {
    let n = c.rows(tokens) * c.width as u64;
    let (bias_rows, ids) = c.picks.map_or((1, 0), |p| (p.experts as u64, c.rows(tokens)));
    4 * (n + GUARD_WORDS as u64 + bias_rows * c.width as u64 + ids)
}

const SEED_X: u64 = 0x72;
const SEED_BIAS: u64 = 0x73;
const SEED_ROUTE: u64 = 0x74;

/// Self-test: x (and a guard zone past it) and the bias from seeds; `x += bias` in place,
/// sampled rows against the twin, the guard zone must keep its values.
pub fn run_case(gpu: &Gpu, tokens: u64, c: &BiasCase) -> Result<Outcome, GpuError> {
    plans(tokens, c, gpu.limits())?; // refuse a bad shape before allocating for it
    let rows = c.rows(tokens);
    let (w, n) = (c.width as usize, (rows * c.width as u64) as usize);
    let bias_len = w * c.picks.map_or(1, |p| p.experts as usize);
    let mut x = gpu.alloc::<f32>(n + GUARD_WORDS)?;
    let mut bias = gpu.alloc::<f32>(bias_len)?;
    fill_uniform(gpu, &mut x, n + GUARD_WORDS, SEED_X, 4.0)?;
    fill_uniform(gpu, &mut bias, bias_len, SEED_BIAS, 1.0)?;
    // The picks: a uniform routing of the tokens over the experts.
    let ids = c.picks.map(|p| route(Routing::Uniform, tokens as usize, p.experts as usize, p.top_k as usize, 64, SEED_ROUTE));
    let ids_dev = ids.as_deref().map(|i| gpu.upload(i)).transpose()?;
    gpu.synchronize()?;
    let start = Instant::now();
    match (c.picks, &ids_dev) {
        (Some(p), Some(ids)) => launch_picks(gpu, rows, p.experts, &mut x.slice_mut(..n), &ids.as_view(), &bias.as_view())?,
        _ => launch(gpu, tokens, &mut x.slice_mut(..n), &bias.as_view())?,
    }
    gpu.synchronize()?;
    let kernel_ms = start.elapsed().as_secs_f64() * 1e3;
    let guard = gpu.download_range(&x, n, GUARD_WORDS)?;
    let past_end = guard.iter().zip(uniform_row(SEED_X, n as u64, GUARD_WORDS, 4.0)).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
    let b = uniform_row(SEED_BIAS, 0, bias_len, 1.0);
    let sampled = sample_rows(rows, 64, SAMPLE_ROWS, rows);
    let want: Vec<Vec<f32>> = sampled
        .par_iter()
        .map(|&t| {
            let x = uniform_row(SEED_X, t * w as u64, w, 4.0);
            match &ids {
                Some(ids) => add_pick_bias_cpu(&x, &ids[t as usize..=t as usize], &b, w),
                None => add_bias_cpu(&x, &b),
            }
        })
        .collect();
    let mut err = RelErr::default();
    for (&t, want) in sampled.iter().zip(&want) {
        let at = t as usize * w;
        err.add_slice(at as u64, &gpu.download_range(&x, at, w)?, want);
    }
    // In place: every value is written, so nothing can be left unwritten.
    Ok(Outcome::Ran(Check::of_floats(&err, TOLERANCE, (0, past_end as u64), kernel_ms)))
}

/// The self-test's handle on this family (registered in `selftest::case`).
pub struct Family;

impl KernelFamily for Family {
    type Case = BiasCase;

    fn run(gpu: &Gpu, tokens: u64, c: &BiasCase) -> Result<Outcome, GpuError> {
        run_case(gpu, tokens, c)
    }

    fn plans(tokens: u64, c: &BiasCase, limits: &DeviceLimits) -> Result<Vec<Launch>, PlanError> {
        plans(tokens, c, limits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn twin_adds_the_bias_row_to_every_row() {
        let x = uniform_row(1, 0, 12, 4.0);
        let b = uniform_row(2, 0, 4, 1.0);
        let y = add_bias_cpu(&x, &b);
        assert!((0..12).all(|i| y[i].to_bits() == (x[i] + b[i % 4]).to_bits()));
    }

    #[test]
    fn pick_twin_adds_each_pairs_expert_row() {
        let (w, experts) = (3, 4);
        let bias: Vec<f32> = (0..w * experts).map(|i| i as f32).collect();
        let y = vec![0.5f32; 4 * w];
        let got = add_pick_bias_cpu(&y, &[2, 0, 3, -1], &bias, w);
        assert_eq!(got, [6.5, 7.5, 8.5, 0.5, 1.5, 2.5, 9.5, 10.5, 11.5, 0.5, 0.5, 0.5]);
    }

    /// gpt-oss-20b's picks: 4 of 32 experts, the gate/up bias rows 2880 wide.
    #[test]
    fn pick_plans_and_counts() {
        let c = BiasCase { width: 2880, picks: Some(Picks { experts: 32, top_k: 4 }) };
        for limits in DeviceLimits::recorded() {
            for t in [1u64, 2, 63, 64, 65, 8192, 186_413, 186_414] {
                let p = &plans(t, &c, &limits).unwrap()[0];
                p.check_cover().unwrap();
                assert_eq!((p.kernel.as_str(), p.cover[0].items()), (PICK_KERNEL_FN, t * 4 * 2880));
            }
        }
        let counts: Vec<u64> = critical_counts(&c, &DeviceLimits::h200()).iter().map(|c| c.tokens).collect();
        // Pairs x 2880 pass 2^31 − 1 at 186,414 tokens (745,656 pairs).
        assert!(counts.contains(&186_413) && counts.contains(&186_414), "{counts:?}");
        let bad = |experts, top_k| plans(1, &BiasCase { width: 8, picks: Some(Picks { experts, top_k }) }, &DeviceLimits::h200()).is_err();
        assert!(bad(0, 1) && bad(4, 5) && bad(4, 0) && !bad(4, 4));
    }

    #[test]
    fn plans_cover_every_value_once() {
        for limits in DeviceLimits::recorded() {
            for t in (1..=64u64).chain([8191, 8192, 524_287, 524_288, 1_048_576]) {
                let p = &plans(t, &BiasCase { width: 4096, picks: None }, &limits).unwrap()[0];
                p.check_cover().unwrap();
                assert_eq!((p.grid[1], p.grid[2], p.cover[0].items()), (1, 1, t * 4096));
            }
            assert!(plans(3, &BiasCase { width: 5, picks: None }, &limits).unwrap()[0].simulate_cover(0).iter().all(|&h| h == 1));
        }
    }

    #[test]
    fn bad_shapes_and_counts() {
        let l = DeviceLimits::h200();
        assert!(matches!(plans(0, &BiasCase { width: 512, picks: None }, &l), Err(PlanError::Unsupported { .. })));
        assert!(matches!(plans(1, &BiasCase { width: 0, picks: None }, &l), Err(PlanError::Unsupported { .. })));
        assert!(matches!(plan(10, 3, &l), Err(PlanError::Unsupported { .. })));
        let counts: Vec<u64> = critical_counts(&BiasCase { width: 4096, picks: None }, &l).iter().map(|c| c.tokens).collect();
        assert!(counts.contains(&524_287) && counts.contains(&524_288), "{counts:?}");
        let second = *counts.last().unwrap();
        let blocks = |t: u64| plans(t, &BiasCase { width: 4096, picks: None }, &l).unwrap()[0].blocks();
        assert!(blocks(second - 1) * 256 >= (second - 1) * 4096 && blocks(second) * 256 < second * 4096);
    }
}
