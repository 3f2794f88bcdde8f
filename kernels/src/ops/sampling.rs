//! Sampling: one token id per row of logits `[R, vocab]`, with per-row [`SamplingParams`]:
//! greedy (argmax, ties to the lowest id) at temperature <= 0, otherwise temperature, top-k,
//! top-p (nucleus) and the inverse-CDF pick at the row's uniform number `u`.
//!
//! The arithmetic is integer where it decides (`cuda/sampling.cu` states it in full): each
//! candidate's mass is `trunc(exp((l − max) / T) · 2^32)` with an exp built from IEEE-rounded
//! operations only, and the top-p target and the pick are exact integer products of those
//! masses. So the CPU twin ([`sample_row`]) gives the same id as the device for every `u`, not
//! only away from CDF boundaries, and the self-test compares ids exactly. The twin sorts; the
//! device selects by radix over the 64-bit key `(orderable logit, !id)`, which ranks the same.
//!
//! One block per row, rows on `grid.x`; the vocabulary is streamed in block-stride loops.

use std::time::Instant;

use cudarc::driver::{CudaSlice, DeviceRepr, PushKernelArg};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::check::{Check, KernelFamily, Outcome, Staged, sample_rows};
use crate::cuda::{Gpu, GpuError};
use crate::launch::{Cover, Launch, PlanError, bytes_of, require_bytes};
use crate::limits::DeviceLimits;
use crate::ops::testdata::{GUARD_WORDS, Guarded, download_rows, fill_uniform};
use crate::sources::SAMPLING;
use crate::testdata::{uniform_pm1, uniform_row};
use crate::thresholds::{Critical, I32_MAX, overflow_point};

pub const KERNEL: &str = "sampling";
/// The CUDA function.
pub const KERNEL_FN: &str = "sampling_rows";
/// Threads of the block that samples one row (`SAMPLE_THREADS`).
pub const THREADS: u32 = 512;
/// Ids compare exactly: the twin repeats the device's arithmetic bit for bit.
pub const TOLERANCE: f64 = 0.0;

/// How one row is sampled; the layout of `SamplingParams` in sampling.cu.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct SamplingParams {
    /// <= 0 or NaN: greedy.
    pub temperature: f32,
    /// Keep the k best logits; <= 0 or >= vocab: all.
    pub top_k: i32,
    /// Keep the shortest prefix of the ranking holding this share of the top-k mass; >= 1 or
    /// NaN: no cut; <= 0: the best only.
    pub top_p: f32,
    /// The uniform number of the inverse-CDF pick, in [0, 1) (negative or NaN: 0; >= 1: the
    /// last candidate).
    pub u: f32,
}

// SAFETY: plain `repr(C)` data of four 4-byte fields, the layout the kernel reads.
unsafe impl DeviceRepr for SamplingParams {}

/// A self-test case: rows of random logits, parameters from a fixed table (see [`row_params`]).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct SamplingCase {
    pub vocab: u32,
    /// Logits uniform in `[-spread, spread)` (24-bit values: hundreds of ties per row at vocab
    /// 151,936); 0 makes every logit ±0, so every choice falls to the id order.
    pub spread: f32,
}

fn describe(rows: u64, vocab: u32) -> String {
    format!("rows={rows} vocab={vocab}")
}

/// Every launch sampling `tokens` rows makes (one).
pub fn plans(tokens: u64, c: &SamplingCase, limits: &DeviceLimits) -> Result<Vec<Launch>, PlanError> {
    Ok(vec![plan(tokens, c.vocab, limits)?])
}

/// grid = (rows, 1, 1), one block of [`THREADS`] per row.
pub fn plan(rows: u64, vocab: u32, limits: &DeviceLimits) -> Result<Launch, PlanError> {
    let shape = describe(rows, vocab);
    let what = if rows == 0 {
        "no rows".to_string()
    } else if vocab == 0 || vocab as u64 > I32_MAX {
        format!("vocab {vocab} must be in 1..2^31 (ids are i32)")
    } else {
        return Launch::checked(
            KERNEL_FN,
            shape,
            [rows, 1, 1],
            [THREADS, 1, 1],
            0,
            vec![Cover::Tiles { axis: 0, items: rows, per_block: 1 }],
            limits,
        );
    };
    Err(PlanError::Unsupported { kernel: KERNEL.into(), what, shape })
}

// ---- CPU twin: every step is the kernel's, in the same IEEE operations ----

/// The mass of the max logit.
const ONE: f32 = 4_294_967_296.0;
/// exp(-32) · 2^32 < 1: lower exponents have mass 0.
const MIN_Z: f32 = -32.0;

/// `sample_exp`: exp(z) for z in [-32, 0] from Cody–Waite reduction and a degree-7 Taylor
/// polynomial, every step a correctly rounded f32 operation (constants by their bits).
fn exp_twin(z: f32) -> f32 {
    let bits = f32::from_bits;
    let n = (z * bits(0x3fb8_aa3b)).round_ties_even() as i32;
    let fnn = n as f32;
    let r = fnn.mul_add(-bits(0x3f31_7200), z);
    let r = fnn.mul_add(-bits(0x35bf_be8e), r);
    let p = [0x3ab6_0b61, 0x3c08_8889, 0x3d2a_aaab, 0x3e2a_aaab].iter().fold(bits(0x3950_0d01), |p, &c| p.mul_add(r, bits(c)));
    let p = p.mul_add(r, 0.5).mul_add(r, 1.0).mul_add(r, 1.0);
    p * bits(((n + 127) as u32) << 23)
}

/// `sample_mass`: the fixed-point mass of logit `x` (2^32 for the max `m`).
fn mass(x: f32, m: f32, inv_t: f32) -> u64 {
    if x.is_nan() || x == f32::NEG_INFINITY {
        return 0;
    }
    if x == m {
        return 1 << 32;
    }
    let z = (x - m) * inv_t;
    if z.is_nan() || z < MIN_Z {
        return 0;
    }
    (exp_twin(z) * ONE) as u64
}

/// The ranking key: larger is better; distinct for every id; NaN ranks as −inf.
fn key(x: f32, id: u32) -> u64 {
    let b = if x.is_nan() { f32::NEG_INFINITY } else { x }.to_bits();
    let b = if b & 0x8000_0000 != 0 { !b } else { b | 0x8000_0000 };
    (b as u64) << 32 | (!id) as u64
}

fn key_logit(k: u64) -> f32 {
    let b = (k >> 32) as u32;
    f32::from_bits(if b & 0x8000_0000 != 0 { b & 0x7fff_ffff } else { !b })
}

fn key_id(k: u64) -> i32 {
    !(k as u32) as i32
}

/// `sample_scale`: `floor(f·z)` (or the ceiling), exactly, for f in [0, 1].
fn scale(f: f32, z: u64, round_up: bool) -> u64 {
    let bits = f.to_bits();
    let e = bits >> 23;
    let m = (bits & 0x7f_ffff) as u128 | if e != 0 { 0x80_0000 } else { 0 };
    let s = if e != 0 { 150 - e } else { 149 };
    let prod = m * z as u128;
    let (q, rem) = if s >= 128 { (0, prod) } else { ((prod >> s) as u64, prod & ((1u128 << s) - 1)) };
    q + (round_up && rem != 0) as u64
}

/// The id the kernel samples from one row of logits.
pub fn sample_row(logits: &[f32], p: &SamplingParams) -> i32 {
    let mut keys: Vec<u64> = logits.iter().enumerate().map(|(i, &x)| key(x, i as u32)).collect();
    let best = keys.iter().copied().max().unwrap_or(0);
    let m = key_logit(best);
    if p.temperature.is_nan() || p.temperature <= 0.0 || m == f32::NEG_INFINITY {
        return key_id(best);
    }
    let inv_t = 1.0 / p.temperature;
    keys.sort_unstable_by(|a, b| b.cmp(a));
    let k = if p.top_k <= 0 || p.top_k as usize >= keys.len() { keys.len() } else { p.top_k as usize };
    let masses: Vec<u64> = keys[..k].iter().map(|&c| mass(key_logit(c), m, inv_t)).collect();
    let cumulative: Vec<u64> = masses
        .iter()
        .scan(0u64, |acc, &q| {
            *acc += q;
            Some(*acc)
        })
        .collect();
    let mut z = cumulative[k - 1];
    if p.top_p < 1.0 {
        let t_p = scale(if p.top_p > 0.0 { p.top_p } else { 0.0 }, z, true).max(1);
        z = cumulative[cumulative.partition_point(|&c| c < t_p)];
    }
    let t = scale(if p.u > 0.0 { p.u.min(1.0) } else { 0.0 }, z, false).min(z - 1);
    key_id(keys[cumulative.partition_point(|&c| c <= t)])
}

/// The twin over a batch: `logits` `[rows, vocab]`, one parameter set per row.
pub fn sampling_cpu(logits: &[f32], vocab: usize, params: &[SamplingParams]) -> Vec<i32> {
    logits.par_chunks(vocab).zip(params).map(|(l, p)| sample_row(l, p)).collect()
}

/// Samples `rows` rows of `logits` (`[rows, vocab]` f32) into `ids` (`[rows]` i32; any element
/// type: the kernel writes 4-byte words), one parameter set per row.
pub fn launch<Y: DeviceRepr>(
    gpu: &Gpu,
    rows: u64,
    vocab: u32,
    logits: &CudaSlice<f32>,
    params: &CudaSlice<SamplingParams>,
    ids: &mut CudaSlice<Y>,
) -> Result<(), GpuError> {
    let p = plan(rows, vocab, gpu.limits())?;
    let param_bytes = size_of::<SamplingParams>();
    require_bytes(
        &p,
        &[
            ("logits", bytes_of(logits.len(), 4), 4 * rows * vocab as u64),
            ("params", bytes_of(params.len(), param_bytes), rows * param_bytes as u64),
            ("ids", bytes_of(ids.len(), size_of::<Y>()), 4 * rows),
        ],
    )?;
    let f = gpu.function(&SAMPLING, KERNEL_FN)?;
    let v = vocab as i32;
    gpu.launch(&p, &f, |b| {
        b.arg(logits).arg(&v).arg(params).arg(ids);
    })?;
    Ok(())
}

/// Row counts this plan makes critical: one row, and where the logits' flattened index passes
/// 2^31 − 1 (14,135 rows at vocab 151,936).
pub fn critical_counts(c: &SamplingCase, _limits: &DeviceLimits) -> Vec<Critical> {
    let mut v = vec![Critical::new(1, "sampling: one row (one sequence decoding)")];
    v.extend(overflow_point(c.vocab as u64, "sampling: logits[r·V + i] passes 2^31 − 1"));
    v
}

/// Logits, parameters and the guarded ids of a self-test case.
pub fn device_bytes(tokens: u64, c: &SamplingCase) -> u64 {
    4 * tokens * c.vocab as u64 + size_of::<SamplingParams>() as u64 * tokens + 4 * (tokens + GUARD_WORDS as u64)
}

const SEED_LOGITS: u64 = 0x50;
const SEED_U: u64 = 0x51;
/// Rows compared with the twin beyond the first and last two cycles of [`PARAMS`]: each costs
/// the CPU a sort of the vocabulary.
const SAMPLE_ROWS: usize = 48;

/// (temperature, top_k, top_p) of the self-test rows, in turn.
const PARAMS: [(f32, i32, f32); 10] = [
    (0.0, 0, 1.0),       // greedy
    (1.0, 0, 1.0),       // softmax over the whole vocabulary
    (0.6, 20, 0.95),     // Qwen3's generation config
    (0.8, 40, 0.95),     // llama.cpp's defaults
    (1.0, 1024, 1.0),    // the largest top-k the engine offers
    (1.5, 0, 0.9),       // nucleus over the whole vocabulary
    (1.0, 1, 1.0),       // top-1 through the sampling path
    (0.7, 5000, 0.5),    // top-k past a thousand, then a cut
    (2.0, 200_000, 0.3), // top_k past the vocabulary: all
    (1.0, -1, 0.0),      // negative top_k: all; top_p 0: the best only
];

/// The parameters of self-test row `r`: [`PARAMS`] in turn, `u` uniform in [0, 1) from a seed.
pub fn row_params(r: u64) -> SamplingParams {
    let (temperature, top_k, top_p) = PARAMS[(r % PARAMS.len() as u64) as usize];
    SamplingParams { temperature, top_k, top_p, u: (uniform_pm1(SEED_U, r) + 1.0) * 0.5 }
}

/// Self-test: logits from a seed, parameters from the table, ids poisoned, one launch, every id
/// checked as written and the sampled rows' ids compared exactly with the twin.
pub fn run_case(gpu: &Gpu, tokens: u64, c: &SamplingCase) -> Result<Outcome, GpuError> {
    stage_case(gpu, tokens, c).map(Staged::finish)
}

/// [`run_case`]'s GPU half: the launch, the poison check and the sampled rows' ids downloaded
/// in runs; the twin (a sort of the vocabulary per row) and the comparison are the host check.
pub fn stage_case(gpu: &Gpu, tokens: u64, c: &SamplingCase) -> Result<Staged, GpuError> {
    plan(tokens, c.vocab, gpu.limits())?; // refuse a bad shape before allocating for it
    let (rows, vocab) = (tokens as usize, c.vocab as usize);
    let mut logits = gpu.alloc::<f32>(rows * vocab)?;
    fill_uniform(gpu, &mut logits, rows * vocab, SEED_LOGITS, c.spread)?;
    let params: Vec<SamplingParams> = (0..tokens).map(row_params).collect();
    let params_dev = gpu.upload(&params)?;
    let mut ids = Guarded::new(gpu, rows)?;
    gpu.synchronize()?;
    let start = Instant::now();
    launch(gpu, tokens, c.vocab, &logits, &params_dev, &mut ids.buf)?;
    gpu.synchronize()?;
    let kernel_ms = start.elapsed().as_secs_f64() * 1e3;
    let (unwritten, past_end) = ids.check(gpu, 1)?;
    let sampled = sample_rows(tokens, PARAMS.len() as u64, SAMPLE_ROWS, tokens);
    let got: Vec<i32> = download_rows(gpu, &ids.buf, &sampled, 1)?.into_iter().map(|w| w[0] as i32).collect();
    let spread = c.spread;
    Ok(Staged::Check(Box::new(move || {
        let want: Vec<i32> = sampled
            .par_iter()
            .map(|&r| sample_row(&uniform_row(SEED_LOGITS, r * vocab as u64, vocab, spread), &params[r as usize]))
            .collect();
        let mismatches: Vec<String> = sampled
            .iter()
            .zip(&want)
            .zip(&got)
            .filter(|((_, w), g)| **g != **w)
            .map(|((r, w), g)| format!("row {r} {:?}: gpu {g} vs twin {w}", params[*r as usize]))
            .collect();
        Outcome::Ran(Check {
            max_rel_err: 0.0,
            tolerance: TOLERANCE,
            compared: sampled.len() as u64,
            unwritten,
            past_end,
            int_mismatches: mismatches.len() as u64,
            kernel_ms,
            note: mismatches.first().cloned().unwrap_or_default(),
        })
    })))
}

/// The self-test's handle on this family (registered in `selftest::case`).
pub struct Family;

impl KernelFamily for Family {
    type Case = SamplingCase;

    fn run(gpu: &Gpu, tokens: u64, c: &SamplingCase) -> Result<Outcome, GpuError> {
        run_case(gpu, tokens, c)
    }

    fn stage(gpu: &Gpu, tokens: u64, c: &SamplingCase) -> Result<Staged, GpuError> {
        stage_case(gpu, tokens, c)
    }

    fn plans(tokens: u64, c: &SamplingCase, limits: &DeviceLimits) -> Result<Vec<Launch>, PlanError> {
        plans(tokens, c, limits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(temperature: f32, top_k: i32, top_p: f32, u: f32) -> SamplingParams {
        SamplingParams { temperature, top_k, top_p, u }
    }

    #[test]
    fn params_have_the_kernel_layout() {
        assert_eq!(size_of::<SamplingParams>(), 16);
        assert_eq!(std::mem::offset_of!(SamplingParams, top_k), 4);
        assert_eq!(std::mem::offset_of!(SamplingParams, u), 12);
    }

    #[test]
    fn exp_twin_is_accurate_on_its_range() {
        let mut worst = 0f64;
        for i in 0..=320_000 {
            let z = -(i as f32) * 1e-4;
            let want = (z as f64).exp();
            worst = worst.max(((exp_twin(z) as f64) - want).abs() / want);
        }
        assert!(worst < 3e-7, "{worst}");
        assert_eq!(exp_twin(0.0), 1.0);
        assert_eq!(exp_twin(-0.0), 1.0);
    }

    #[test]
    fn keys_rank_by_logit_then_lowest_id() {
        assert!(key(1.0, 5) > key(0.5, 0));
        assert!(key(1.0, 2) > key(1.0, 3));
        assert!(key(0.0, 9) > key(-0.0, 1) && key(-0.0, 1) > key(-1e-30, 0));
        assert!(key(-1e30, 0) > key(f32::NEG_INFINITY, 0) && key(f32::NAN, 0) == key(f32::NEG_INFINITY, 0));
        for x in [1.5f32, -2.25, 0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY, 3e-40] {
            let k = key(x, 77);
            assert_eq!((key_logit(k).to_bits(), key_id(k)), (x.to_bits(), 77));
        }
    }

    #[test]
    fn scale_is_the_exact_floor_and_ceiling() {
        for (i, z) in [1u64, 2, 3, 1000, (1 << 32) + 17, (1 << 29) - 1].into_iter().enumerate() {
            for j in 0..2000u64 {
                let f = (uniform_pm1(9, j * 7 + i as u64) + 1.0) * 0.5;
                // f has 24 significant bits and z at most 33: the f64 product is exact.
                let exact = f as f64 * z as f64;
                assert_eq!(scale(f, z, false), exact.floor() as u64, "{f} * {z}");
                assert_eq!(scale(f, z, true), exact.ceil() as u64, "{f} * {z}");
            }
            assert_eq!(scale(1.0, z, false), z);
            assert_eq!(scale(0.0, z, true), 0);
            assert_eq!(scale(1e-45, z, true), 1);
        }
    }

    #[test]
    fn greedy_is_the_argmax_with_ties_to_the_lowest_id() {
        let l = [0.5, 2.0, f32::NAN, 2.0, -1.0];
        for t in [0.0, -1.0, f32::NAN] {
            assert_eq!(sample_row(&l, &params(t, 0, 1.0, 0.9)), 1);
        }
        assert_eq!(sample_row(&[f32::NEG_INFINITY, f32::NAN, f32::NEG_INFINITY], &params(1.0, 0, 1.0, 0.7)), 0);
        // top_k 1 and top_p 0 keep only the best, whatever u.
        for u in [0.0, 0.5, 0.999] {
            assert_eq!(sample_row(&l, &params(1.0, 1, 1.0, u)), 1);
            assert_eq!(sample_row(&l, &params(1.0, 0, 0.0, u)), 1);
        }
    }

    /// The straightforward formula in f64: softmax of logit / T, the k best (ties to the lowest
    /// id), the shortest prefix reaching top_p of their mass; the probability of each id.
    fn reference_probs(l: &[f32], p: &SamplingParams) -> Vec<f64> {
        let mut order: Vec<usize> = (0..l.len()).collect();
        order.sort_by(|&a, &b| l[b].partial_cmp(&l[a]).unwrap().then(a.cmp(&b)));
        let m = l[order[0]] as f64;
        let k = if p.top_k <= 0 { l.len() } else { (p.top_k as usize).min(l.len()) };
        let w: Vec<f64> = order[..k].iter().map(|&i| ((l[i] as f64 - m) / p.temperature as f64).exp()).collect();
        let total: f64 = w.iter().sum();
        let mut n = k;
        if p.top_p < 1.0 {
            let mut acc = 0.0;
            n = w
                .iter()
                .position(|q| {
                    acc += q;
                    acc >= p.top_p as f64 * total
                })
                .unwrap()
                + 1;
        }
        let kept: f64 = w[..n].iter().sum();
        let mut probs = vec![0.0; l.len()];
        order[..n].iter().zip(&w).for_each(|(&i, q)| probs[i] = q / kept);
        probs
    }

    /// Over a fine grid of u, the twin picks each id with the reference probability.
    #[test]
    fn twin_samples_the_reference_distribution() {
        let l: Vec<f32> = [1.0, 3.0, 2.5, -4.0, 3.0, 0.25, 2.0, -1.0, 2.75, 1.5].to_vec();
        for (t, k, tp) in [(1.0, 0, 1.0), (0.7, 3, 1.0), (1.3, 0, 0.8), (1.0, 5, 0.6), (2.0, 20, 0.95), (0.5, -2, 0.999)] {
            let reference = reference_probs(&l, &params(t, k, tp, 0.0));
            let steps = 200_000;
            let mut hits = vec![0u32; l.len()];
            for s in 0..steps {
                hits[sample_row(&l, &params(t, k, tp, s as f32 / steps as f32)) as usize] += 1;
            }
            for (i, (&h, &want)) in hits.iter().zip(&reference).enumerate() {
                let got = h as f64 / steps as f64;
                assert!((got - want).abs() < 1e-4, "T={t} k={k} p={tp} id {i}: {got} vs {want}");
            }
        }
    }

    #[test]
    fn pick_walks_the_ranking_in_order() {
        // Equal logits: uniform over the candidates, ranked by id.
        let l = [0.0f32; 8];
        for (u, id) in [(0.0, 0), (0.124, 0), (0.125, 1), (0.5, 4), (0.999, 7), (1.0, 7), (2.0, 7), (-1.0, 0), (f32::NAN, 0)] {
            assert_eq!(sample_row(&l, &params(1.0, 0, 1.0, u)), id, "u={u}");
        }
        // top_k 3 of them: thirds.
        assert_eq!(sample_row(&l, &params(1.0, 3, 1.0, 0.5)), 1);
        assert_eq!(sample_row(&l, &params(1.0, 3, 1.0, 0.9)), 2);
        // top_p 0.5 of 8 equal masses: 4 kept.
        assert_eq!(sample_row(&l, &params(1.0, 0, 0.5, 0.99)), 3);
    }

    #[test]
    fn batch_twin_is_row_by_row() {
        let vocab = 1000;
        let logits: Vec<f32> = uniform_row(SEED_LOGITS, 0, 4 * vocab, 8.0);
        let ps: Vec<SamplingParams> = (0..4).map(row_params).collect();
        let ids = sampling_cpu(&logits, vocab, &ps);
        for (r, id) in ids.iter().enumerate() {
            assert_eq!(*id, sample_row(&logits[r * vocab..(r + 1) * vocab], &ps[r]));
        }
        assert_eq!(ids[0], sample_row(&logits[..vocab], &params(0.0, 0, 1.0, 0.0)));
    }

    #[test]
    fn plans_put_rows_on_grid_x_for_every_count_on_both_devices() {
        let c = SamplingCase { vocab: 151_936, spread: 8.0 };
        for limits in DeviceLimits::recorded() {
            for t in (1..=256u64).chain([8191, 8192, 14_134, 14_135, 1 << 20]) {
                let p = plans(t, &c, &limits).unwrap_or_else(|e| panic!("{e}"));
                assert_eq!(p.len(), 1);
                assert_eq!(p[0].grid, [t as u32, 1, 1]);
                p[0].check_cover().unwrap();
                assert!(p[0].simulate_cover(0).iter().all(|&h| h == 1));
            }
        }
    }

    #[test]
    fn overflow_point_of_the_logits() {
        let counts: Vec<u64> =
            critical_counts(&SamplingCase { vocab: 151_936, spread: 8.0 }, &DeviceLimits::gb10()).iter().map(|c| c.tokens).collect();
        assert_eq!(counts, vec![1, 14_134, 14_135]);
    }

    #[test]
    fn bad_shapes_are_typed_errors() {
        let l = DeviceLimits::h200();
        assert!(matches!(plan(0, 10, &l), Err(PlanError::Unsupported { .. })));
        assert!(matches!(plan(1, 0, &l), Err(PlanError::Unsupported { .. })));
        assert!(matches!(plan(1, 1 << 31, &l), Err(PlanError::Unsupported { .. })));
        assert!(plan(1, i32::MAX as u32, &l).is_ok());
    }
}
