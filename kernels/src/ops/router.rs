//! MoE router: top-k experts per token from the router logits `[tokens, experts]`.
//!
//! Softmax (qwen3moe): `p = exp(l − max) / Σ exp(l − max)` over all experts, the top_k largest
//! picked, weight `p`. Sigmoid (DeepSeek-style): `s = 1 / (1 + exp(−l))`, weight `s`. Either
//! optionally renormalised so the picks sum to 1. Picks in descending score order, ties to the
//! lowest expert id; ranking is by the logit itself (both scorings are strictly increasing in
//! it), so ids are bit-exact between device and CPU twin. A NaN logit ranks as −inf.
//!
//! One warp per token, [`WARPS`] tokens per block, tokens on grid.x (`cuda/router.cu`);
//! experts up to [`MAX_EXPERTS`] (registers of one warp), top_k up to [`MAX_TOP_K`].

use cudarc::driver::{CudaView, CudaViewMut, PushKernelArg};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::check::{Check, KernelFamily, Outcome, RelErr, Staged, sample_rows};
use crate::cuda::{Gpu, GpuError};
use crate::launch::{Cover, Launch, PlanError};
use crate::limits::DeviceLimits;
use crate::ops::testdata::{GUARD_WORDS, Guarded, download_rows, fill_uniform};
use crate::sources::ROUTER;
use crate::testdata::uniform_row;
use crate::thresholds::{Critical, overflow_point, tile_tails};

pub const KERNEL: &str = "router";
/// The CUDA function.
pub const KERNEL_FN: &str = "router_topk";
/// Relative to the largest weight: the device's `expf` (≤ 2 ulp) against the host's `exp`;
/// sums run in the same order on both sides, so nothing else differs. Ids compare exactly.
pub const TOLERANCE: f64 = 1e-5;
/// Experts one lane keeps in registers (`ROUTER_PER_LANE` in router.cu).
pub const PER_LANE: u32 = 16;
pub const MAX_EXPERTS: u32 = 32 * PER_LANE;
/// Lane j of the token's warp keeps pick j.
pub const MAX_TOP_K: u32 = 32;
/// Tokens per block, one warp each (`ROUTER_WARPS` in router.cu).
pub const WARPS: u32 = 8;

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct RouterCase {
    pub experts: u32,
    pub top_k: u32,
    pub scoring: Scoring,
    pub renormalize: bool,
    /// All logits equal: ties broken by the lowest expert id (and every token then routes to the same experts).
    pub ties: bool,
}

impl RouterCase {
    pub fn spec(&self) -> RouterSpec {
        RouterSpec { experts: self.experts, top_k: self.top_k, scoring: self.scoring, renormalize: self.renormalize }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scoring {
    Softmax,
    Sigmoid,
    /// The top_k by logit, then the softmax over the picks alone (gpt-oss); needs `renormalize`.
    TopKSoftmax,
}

impl Scoring {
    /// `SCORING_*` in router.cu.
    fn code(self) -> i32 {
        match self {
            Scoring::Softmax => 0,
            Scoring::Sigmoid => 1,
            Scoring::TopKSoftmax => 2,
        }
    }
}

/// What the engine configures a router with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouterSpec {
    pub experts: u32,
    pub top_k: u32,
    pub scoring: Scoring,
    pub renormalize: bool,
}

/// Every launch a routing of `tokens` makes (one).
pub fn plans(tokens: u64, c: &RouterCase, limits: &DeviceLimits) -> Result<Vec<Launch>, PlanError> {
    Ok(vec![plan(tokens, &c.spec(), limits)?])
}

pub fn plan(tokens: u64, s: &RouterSpec, limits: &DeviceLimits) -> Result<Launch, PlanError> {
    let shape = format!("tokens={tokens} experts={} top_k={} scoring={:?}", s.experts, s.top_k, s.scoring);
    let reject = |what: String| Err(PlanError::Unsupported { kernel: KERNEL.into(), what, shape: shape.clone() });
    if tokens == 0 {
        return reject("no tokens".into());
    }
    if s.experts == 0 || s.experts > MAX_EXPERTS {
        return reject(format!("{} experts: supported 1..={MAX_EXPERTS} ({PER_LANE} per lane of one warp)", s.experts));
    }
    if s.top_k == 0 || s.top_k > s.experts.min(MAX_TOP_K) {
        return reject(format!("top_k {} must be in 1..={} (at most the experts, one pick per lane)", s.top_k, s.experts.min(MAX_TOP_K)));
    }
    if s.scoring == Scoring::TopKSoftmax && !s.renormalize {
        return reject("top-k-then-softmax weights are the picks' softmax: renormalize must be set".into());
    }
    let per_block = WARPS as u64;
    Launch::checked(
        KERNEL_FN,
        shape.as_str(),
        [tokens.div_ceil(per_block), 1, 1],
        [WARPS * 32, 1, 1],
        0,
        vec![Cover::Tiles { axis: 0, items: tokens, per_block }],
        limits,
    )
}

/// Routes `tokens` rows of `logits` (`[tokens, experts]`) into `ids` and `weights`
/// (`[tokens · top_k]`, token-major), on the GPU's stream.
pub fn launch(
    gpu: &Gpu,
    tokens: u64,
    s: &RouterSpec,
    logits: &CudaView<f32>,
    ids: &mut CudaViewMut<i32>,
    weights: &mut CudaViewMut<f32>,
) -> Result<(), GpuError> {
    let p = plan(tokens, s, gpu.limits())?;
    let (pairs, cells) = (tokens * s.top_k as u64, tokens * s.experts as u64);
    for (what, have, need) in [("logits", logits.len(), cells), ("ids", ids.len(), pairs), ("weights", weights.len(), pairs)] {
        if (have as u64) < need {
            return Err(PlanError::Unsupported {
                kernel: KERNEL.into(),
                what: format!("{what} holds {have}, needs {need}"),
                shape: p.shape,
            }
            .into());
        }
    }
    let f = gpu.function(&ROUTER, KERNEL_FN)?;
    let (e, k, scoring, renorm) = (s.experts as i32, s.top_k as i32, s.scoring.code(), s.renormalize as i32);
    gpu.launch(&p, &f, |b| {
        b.arg(logits).arg(&tokens).arg(&e).arg(&k).arg(&scoring).arg(&renorm).arg(ids).arg(weights);
    })?;
    Ok(())
}

// ---- CPU twin ----

/// One token: `logits` of `experts` values into `ids`/`weights` (both `top_k <= experts`
/// long), with the device's arithmetic (same ranking, same summation order; only `exp` is
/// the host's).
pub fn route_row(logits: &[f32], s: &RouterSpec, ids: &mut [i32], weights: &mut [f32]) {
    let keys: Vec<f32> = logits.iter().map(|&l| if l.is_nan() { f32::NEG_INFINITY } else { l }).collect();
    let (m, denom) = match s.scoring {
        Scoring::Softmax => {
            let m = keys.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
            let exps: Vec<f32> = keys.iter().map(|&k| (k - m).exp()).collect();
            (m, lane_tree_sum(&exps))
        }
        Scoring::Sigmoid | Scoring::TopKSoftmax => (0.0, 1.0),
    };
    let mut top = 0.0f32;
    let mut taken = vec![false; keys.len()];
    let mut wsum = 0.0f32;
    for (j, (id, w)) in ids.iter_mut().zip(weights.iter_mut()).enumerate() {
        // Ascending ids with a strict comparison: ties stay with the lowest id.
        let best = (0..keys.len()).filter(|&e| !taken[e]).reduce(|b, e| if keys[e] > keys[b] { e } else { b }).expect("top_k <= experts");
        taken[best] = true;
        if j == 0 {
            top = keys[best]; // the largest logit: the picks' softmax max
        }
        *id = best as i32;
        *w = match s.scoring {
            Scoring::Softmax => (keys[best] - m).exp() / denom,
            Scoring::Sigmoid => 1.0 / (1.0 + (-keys[best]).exp()),
            Scoring::TopKSoftmax => (keys[best] - top).exp(),
        };
        wsum += *w;
    }
    if s.renormalize {
        weights.iter_mut().for_each(|w| *w /= wsum);
    }
}

/// `values[e]` summed as one warp does: lane `l` adds experts `l, l + 32, …` in turn, then
/// the xor butterfly adds lane pairs (every lane ends with the same bits).
fn lane_tree_sum(values: &[f32]) -> f32 {
    let mut lanes = [0.0f32; 32];
    for (e, v) in values.iter().enumerate() {
        lanes[e % 32] += v;
    }
    for o in [16, 8, 4, 2, 1] {
        lanes = std::array::from_fn(|l| lanes[l] + lanes[l ^ o]);
    }
    lanes[0]
}

/// Every token of `logits` (`[tokens, experts]`): `(ids, weights)`, token-major.
pub fn router_cpu(logits: &[f32], s: &RouterSpec) -> (Vec<i32>, Vec<f32>) {
    let (e, k) = (s.experts as usize, s.top_k as usize);
    let tokens = logits.len() / e;
    let (mut ids, mut weights) = (vec![0i32; tokens * k], vec![0.0f32; tokens * k]);
    logits.par_chunks(e).zip(ids.par_chunks_mut(k).zip(weights.par_chunks_mut(k))).for_each(|(l, (i, w))| route_row(l, s, i, w));
    (ids, weights)
}

/// Token counts this plan makes critical.
pub fn critical_counts(c: &RouterCase, limits: &DeviceLimits) -> Vec<Critical> {
    let mut v = vec![Critical::new(1, "single token")];
    v.extend(overflow_point(c.experts as u64, "router: logits[t·E + e] passes 2^31 − 1"));
    v.extend(overflow_point(c.top_k as u64, "router: ids/weights[t·k + j] passes 2^31 − 1"));
    v.extend(tile_tails(WARPS as u64, true, &[], "router: tokens per block (a warp each)"));
    let y = limits.max_grid_dim[1] as u64;
    for t in [y * WARPS as u64, y * WARPS as u64 + 1] {
        v.push(Critical::new(
            t,
            format!("router: {} blocks on grid.x, around {y} (legal on x; tokens on y/z would fail)", t.div_ceil(WARPS as u64)),
        ));
    }
    v
}

pub fn device_bytes(tokens: u64, c: &RouterCase) -> u64 {
    4 * (tokens * c.experts as u64 + 2 * (tokens * c.top_k as u64 + GUARD_WORDS as u64))
}

const SEED_LOGITS: u64 = 0x30;
/// Logits in [−4, 4): spread enough for clear winners, distinct at f32 resolution.
const LOGIT_SCALE: f32 = 4.0;

/// Self-test: logits from a seed (all ±0 for `ties`), ids and weights into poisoned buffers,
/// sampled tokens compared with [`route_row`].
pub fn run_case(gpu: &Gpu, tokens: u64, c: &RouterCase) -> Result<Outcome, GpuError> {
    stage_case(gpu, tokens, c).map(Staged::finish)
}

/// [`run_case`]'s GPU half: the launch, the poison checks and the sampled tokens' ids and
/// weights downloaded in runs; the twin ([`route_row`]) and the comparison are the host check.
pub fn stage_case(gpu: &Gpu, tokens: u64, c: &RouterCase) -> Result<Staged, GpuError> {
    let s = c.spec();
    plan(tokens, &s, gpu.limits())?; // a bad shape is rejected before anything is allocated
    let (e, k) = (c.experts as usize, c.top_k as usize);
    let scale = if c.ties { 0.0 } else { LOGIT_SCALE };
    let cells = tokens as usize * e;
    let mut logits = gpu.alloc::<f32>(cells)?;
    fill_uniform(gpu, &mut logits, cells, SEED_LOGITS, scale)?;
    let mut ids = Guarded::new(gpu, tokens as usize * k)?;
    let mut weights = Guarded::new(gpu, tokens as usize * k)?;
    gpu.synchronize()?;
    let start = std::time::Instant::now();
    launch(gpu, tokens, &s, &logits.as_view(), &mut words_as(&mut ids)?, &mut words_as(&mut weights)?)?;
    gpu.synchronize()?;
    let kernel_ms = start.elapsed().as_secs_f64() * 1e3;
    let (u_ids, p_ids) = ids.check(gpu, 1)?;
    let (u_w, p_w) = weights.check(gpu, 1)?;
    let sampled = sample_rows(tokens, WARPS as u64, 512, tokens);
    let got_ids = download_rows(gpu, &ids.buf, &sampled, k)?;
    let got_w = weights.read_rows_f32(gpu, &sampled, k)?;
    Ok(Staged::Check(Box::new(move || {
        let mut err = RelErr::default();
        let (mut mismatches, mut note) = (0u64, String::new());
        let (mut want_ids, mut want_w) = (vec![0i32; k], vec![0.0f32; k]);
        for ((&t, got), got_w) in sampled.iter().zip(&got_ids).zip(&got_w) {
            let at = t as usize * k;
            route_row(&uniform_row(SEED_LOGITS, t * e as u64, e, scale), &s, &mut want_ids, &mut want_w);
            for (j, (&g, w)) in got.iter().zip(&want_ids).enumerate() {
                let g = g as i32;
                if g != *w {
                    mismatches += 1;
                    if note.is_empty() {
                        note = format!("token {t} pick {j}: gpu expert {g} vs ref {w}");
                    }
                }
            }
            err.add_slice(at as u64, got_w, &want_w);
        }
        if note.is_empty() {
            note = err.describe();
        }
        Outcome::Ran(Check {
            max_rel_err: err.value(),
            tolerance: TOLERANCE,
            compared: 2 * err.compared,
            unwritten: u_ids + u_w,
            past_end: p_ids + p_w,
            int_mismatches: mismatches,
            kernel_ms,
            note,
        })
    })))
}

/// The words of a poisoned buffer as the 32-bit values a kernel writes.
fn words_as<T>(g: &mut Guarded) -> Result<CudaViewMut<'_, T>, GpuError> {
    let words = g.words;
    debug_assert_eq!(std::mem::size_of::<T>(), 4);
    // SAFETY: only used with i32 and f32: 4 bytes, every bit pattern valid.
    unsafe { g.buf.transmute_mut::<T>(words) }
        .ok_or_else(|| GpuError::Driver { call: "transmute_mut".into(), error: format!("{words} words past the buffer") })
}

/// The self-test's handle on this family (registered in `selftest::case`).
pub struct Family;

impl KernelFamily for Family {
    type Case = RouterCase;

    fn run(gpu: &Gpu, tokens: u64, c: &RouterCase) -> Result<Outcome, GpuError> {
        run_case(gpu, tokens, c)
    }

    fn stage(gpu: &Gpu, tokens: u64, c: &RouterCase) -> Result<Staged, GpuError> {
        stage_case(gpu, tokens, c)
    }

    fn plans(tokens: u64, c: &RouterCase, limits: &DeviceLimits) -> Result<Vec<Launch>, PlanError> {
        plans(tokens, c, limits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Straightforward reference in f64: score every expert, sort by (score desc, id asc).
    fn reference(logits: &[f32], s: &RouterSpec) -> (Vec<i32>, Vec<f64>) {
        let l: Vec<f64> = logits.iter().map(|&x| x as f64).collect();
        let scores: Vec<f64> = match s.scoring {
            Scoring::Softmax => {
                let m = l.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let sum: f64 = l.iter().map(|x| (x - m).exp()).sum();
                l.iter().map(|x| (x - m).exp() / sum).collect()
            }
            Scoring::Sigmoid => l.iter().map(|x| 1.0 / (1.0 + (-x).exp())).collect(),
            // Ranked by logit; the weights are the picks' softmax (the renormalisation below).
            Scoring::TopKSoftmax => l.iter().map(|x| x.exp()).collect(),
        };
        let mut order: Vec<usize> = (0..l.len()).collect();
        order.sort_by(|&a, &b| scores[b].partial_cmp(&scores[a]).unwrap().then(a.cmp(&b)));
        let picks = &order[..s.top_k as usize];
        let mut w: Vec<f64> = picks.iter().map(|&e| scores[e]).collect();
        if s.renormalize {
            let sum: f64 = w.iter().sum();
            w.iter_mut().for_each(|x| *x /= sum);
        }
        (picks.iter().map(|&e| e as i32).collect(), w)
    }

    fn specs(experts: u32, top_k: u32) -> Vec<RouterSpec> {
        let mut v = Vec::new();
        for scoring in [Scoring::Softmax, Scoring::Sigmoid] {
            for renormalize in [false, true] {
                v.push(RouterSpec { experts, top_k, scoring, renormalize });
            }
        }
        v.push(RouterSpec { experts, top_k, scoring: Scoring::TopKSoftmax, renormalize: true });
        v
    }

    #[test]
    fn twin_matches_sort_based_formula() {
        for &(e, k) in &[(1, 1), (3, 2), (40, 7), (128, 8), (160, 6), (512, 16), (64, 32), (32, 32)] {
            for s in specs(e, k) {
                let tokens = 9;
                let logits: Vec<f32> = uniform_row(5, 0, tokens * e as usize, LOGIT_SCALE);
                let (ids, w) = router_cpu(&logits, &s);
                for t in 0..tokens {
                    let (want_ids, want_w) = reference(&logits[t * e as usize..(t + 1) * e as usize], &s);
                    let r = t * k as usize..(t + 1) * k as usize;
                    assert_eq!(ids[r.clone()], want_ids[..], "{s:?} token {t}");
                    for (g, w) in w[r].iter().zip(&want_w) {
                        assert!((*g as f64 - w).abs() <= 1e-5 * w.abs(), "{s:?} token {t}: {g} vs {w}");
                    }
                }
            }
        }
    }

    #[test]
    fn equal_logits_pick_the_lowest_ids() {
        // fill_uniform at scale 0 gives +0 and −0: still all equal.
        for (e, k) in [(128u32, 8u32), (37, 5), (512, 32)] {
            let logits = uniform_row(1, 0, e as usize, 0.0);
            assert!(logits.iter().any(|x| x.is_sign_negative()));
            for s in specs(e, k) {
                let (mut ids, mut w) = (vec![0; k as usize], vec![0.0; k as usize]);
                route_row(&logits, &s, &mut ids, &mut w);
                assert_eq!(ids, (0..k as i32).collect::<Vec<_>>(), "{s:?}");
                let want = match (s.renormalize, s.scoring) {
                    (true, _) => 1.0 / k as f32,
                    (false, Scoring::Softmax) => 1.0 / e as f32,
                    (false, Scoring::Sigmoid) => 0.5,
                    (false, Scoring::TopKSoftmax) => unreachable!("refused by the plan"),
                };
                assert!(w.iter().all(|&x| (x - want).abs() <= 1e-6 * want), "{s:?}: {w:?}");
                assert_eq!(reference(&logits, &s).0, ids);
            }
        }
    }

    #[test]
    fn nan_and_infinite_logits_still_give_distinct_valid_ids() {
        let s = RouterSpec { experts: 6, top_k: 6, scoring: Scoring::Softmax, renormalize: true };
        let logits = [f32::NAN, 1.0, f32::NEG_INFINITY, f32::NAN, 2.0, f32::NEG_INFINITY];
        let (mut ids, mut w) = (vec![0; 6], vec![0.0; 6]);
        route_row(&logits, &s, &mut ids, &mut w);
        assert_eq!(ids, vec![4, 1, 0, 2, 3, 5]);
        assert_eq!(&w[2..], &[0.0; 4]);
        assert!((w[0] + w[1] - 1.0).abs() < 1e-6);
    }

    #[test]
    fn lane_tree_sum_is_a_sum() {
        let v: Vec<f32> = (0..100).map(|i| i as f32).collect();
        assert_eq!(lane_tree_sum(&v), 4950.0);
        assert_eq!(lane_tree_sum(&[2.5]), 2.5);
    }

    #[test]
    fn plans_fit_both_devices_and_cover_once() {
        let c = RouterCase { experts: 128, top_k: 8, scoring: Scoring::Softmax, renormalize: true, ties: false };
        for limits in DeviceLimits::recorded() {
            for tokens in [1u64, 63, 64, 65, 8191, 8192, 1 << 20] {
                let p = plans(tokens, &c, &limits).unwrap();
                assert_eq!(p.len(), 1);
                let l = &p[0];
                l.check_cover().unwrap();
                assert_eq!(l.grid, [tokens.div_ceil(WARPS as u64) as u32, 1, 1]);
                if tokens <= 8192 {
                    assert!(l.simulate_cover(0).iter().all(|&h| h == 1), "{l}");
                }
            }
        }
    }

    #[test]
    fn bad_shapes_are_unsupported() {
        let l = DeviceLimits::gb10();
        let bad = |t: u64, e: u32, k: u32| {
            let s = RouterSpec { experts: e, top_k: k, scoring: Scoring::Sigmoid, renormalize: false };
            matches!(plan(t, &s, &l), Err(PlanError::Unsupported { .. }))
        };
        assert!(bad(0, 128, 8));
        assert!(bad(5, 0, 1));
        assert!(bad(5, MAX_EXPERTS + 1, 8));
        assert!(bad(5, 8, 9));
        assert!(bad(5, 8, 0));
        assert!(bad(5, 64, MAX_TOP_K + 1));
        assert!(!bad(5, MAX_EXPERTS, MAX_TOP_K));
        let topk = |renormalize| RouterSpec { experts: 32, top_k: 4, scoring: Scoring::TopKSoftmax, renormalize };
        assert!(matches!(plan(5, &topk(false), &l), Err(PlanError::Unsupported { .. })));
        assert!(plan(5, &topk(true), &l).is_ok());
    }

    /// gpt-oss's gating: the top 4 of 32 by logit, weights the softmax of those 4 logits.
    #[test]
    fn top_k_then_softmax_is_the_softmax_of_the_picks() {
        let s = RouterSpec { experts: 32, top_k: 4, scoring: Scoring::TopKSoftmax, renormalize: true };
        let mut logits = vec![-3.0f32; 32];
        for (e, v) in [(7, 2.0), (30, 1.5), (3, 0.5), (12, 0.25), (20, 0.0)] {
            logits[e] = v;
        }
        let (mut ids, mut w) = (vec![0; 4], vec![0.0; 4]);
        route_row(&logits, &s, &mut ids, &mut w);
        assert_eq!(ids, [7, 30, 3, 12]);
        let picked = [2.0f64, 1.5, 0.5, 0.25];
        let sum: f64 = picked.iter().map(|x| (x - 2.0).exp()).sum();
        for (g, l) in w.iter().zip(picked) {
            assert!((*g as f64 - (l - 2.0).exp() / sum).abs() < 1e-6, "{w:?}");
        }
    }

    #[test]
    fn critical_counts_for_qwen3_shape() {
        let c = RouterCase { experts: 128, top_k: 8, scoring: Scoring::Softmax, renormalize: true, ties: false };
        let counts: Vec<u64> = critical_counts(&c, &DeviceLimits::h200()).iter().map(|x| x.tokens).collect();
        // Logits [T, 128] pass 2^31 − 1 elements at 16,777,216 tokens; ids [T, 8] at 268,435,456.
        for t in [16_777_215, 16_777_216, 268_435_455, 268_435_456, 524_280, 524_281] {
            assert!(counts.contains(&t), "{t}");
        }
        assert!((1..2 * WARPS as u64).all(|t| counts.contains(&t)));
    }
}
