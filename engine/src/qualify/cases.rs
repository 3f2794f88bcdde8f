//! Which forward passes the model-level threshold test runs, derived, never chosen by hand.
//!
//! The counts are the kernel catalogue's critical counts for the model's shape class, the
//! serving envelope and the device's limits (the union over every kernel), kept where a forward
//! pass can reach them: at most `max_batch_tokens` rows, since the scheduler never runs more
//! in one step. Each count runs in each batch composition of `thresholds::compositions`
//! (one prompt; four sequences; a prefill beside eight decode rows), so a packed batch hits
//! the count as a single prompt does. Pure: tested without a model.

use std::collections::BTreeMap;
use std::time::Duration;

use brink_api::ServingParams;
use brink_kernels::limits::DeviceLimits;
use brink_kernels::selftest::catalogue;
use brink_kernels::thresholds::{ModelShape, Serving, compositions};
use serde::{Deserialize, Serialize};

/// Tokens each decode sequence holds before the step that decodes one more: long enough that
/// its decode row attends over a cache, short enough to cost nothing.
pub const DECODE_PROMPT: u64 = 5;

/// Decode rows beside the prefill in a mixed batch (as `thresholds::compositions` builds it).
pub const DECODE_ROWS: u64 = 8;

/// Largest chunk of the reference computation: each sequence alone, in chunks of at most 128
/// tokens (and at most the case's count; see `plan`). A full multiple of the 64-row tiles, far
/// below every grid and index limit, and itself a count the test covers; a different batch
/// geometry from the step under test, which is the point.
pub const REFERENCE_CHUNK: u64 = 128;

/// Largest normalised max abs difference (`max |step - reference| / max |reference|` over a
/// sequence's last-position logits) that passes. Both sides run on the same backend with the
/// same per-row quantization; only the batch shape differs (tile tails, GEMV vs GEMM, attention
/// split), which reorders sums: ~1e-6 on the CPU, ~1e-3 on CUDA. A near-tie in a router's top-k
/// can still send one token to another expert and move its row by ~0.1 (as in the parity
/// tests), while a broken tail, an overflowed index or a dropped tile moves it by O(1): 0.3
/// sits between. NaN or infinity always fails.
pub const TOLERANCE: f64 = 0.3;

/// How a case's count is split into sequences.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Composition {
    /// One prompt of `count` tokens.
    Single,
    /// Four prompts whose lengths sum to `count` (a scheduler packing medium prompts).
    FourSeqs,
    /// A prefill chunk of `count - 8` tokens beside 8 decode rows of other sequences.
    MixedDecode,
}

impl Composition {
    /// The `kernel` column of the report.
    pub fn kernel(self) -> &'static str {
        match self {
            Composition::Single => "model/single",
            Composition::FourSeqs => "model/4-seqs",
            Composition::MixedDecode => "model/mixed-decode",
        }
    }
}

/// One forward pass to test: the step's rows per sequence, and why the count is critical.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelCase {
    /// e.g. `model/4-seqs/t8192`.
    pub id: String,
    pub composition: Composition,
    /// Rows of the step: the critical count.
    pub tokens: u64,
    /// Rows each sequence puts in the step (decode sequences: 1).
    pub batch: Vec<u64>,
    pub reasons: Vec<String>,
}

/// A sequence of a case: positions already cached before the step, and rows in the step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SeqPlan {
    pub cached: u64,
    pub rows: u64,
}

impl SeqPlan {
    pub fn len(&self) -> u64 {
        self.cached + self.rows
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl ModelCase {
    pub fn sequences(&self) -> Vec<SeqPlan> {
        self.batch
            .iter()
            .enumerate()
            .map(|(i, &rows)| {
                let decode = self.composition == Composition::MixedDecode && i > 0;
                SeqPlan { cached: if decode { DECODE_PROMPT } else { 0 }, rows }
            })
            .collect()
    }

    /// KV blocks of `block_size` positions the case's sequences hold at once.
    pub fn blocks_needed(&self, block_size: u64) -> u64 {
        self.sequences().iter().map(|s| s.len().div_ceil(block_size)).sum()
    }

    /// Tokens the worker runs through the model for this case's step: the decode sequences'
    /// prompts and the step itself (the references come on top: `plan::ReferenceWork::tokens`).
    pub fn step_tokens(&self) -> u64 {
        self.sequences().iter().map(|s| s.cached + s.rows).sum()
    }

    /// The longest sequence (it must fit in the context).
    pub fn longest(&self) -> u64 {
        self.sequences().iter().map(SeqPlan::len).max().unwrap_or(0)
    }
}

/// Every derived case, and the critical counts behind them.
#[derive(Clone, Debug, PartialEq)]
pub struct Derivation {
    /// Distinct counts a step can reach, with their reasons.
    pub counts: Vec<(u64, Vec<String>)>,
    /// Distinct counts of the kernel catalogue above `max_batch_tokens` (no step runs them).
    pub unreachable: u64,
    /// Cases to run, smallest count first.
    pub cases: Vec<ModelCase>,
    /// Derived cases that will not run, and why.
    pub skipped: Vec<(ModelCase, String)>,
}

/// Every distinct critical count of the kernel catalogue for `shape` on `limits` (overflow
/// points far above any batch included), smallest first, each with its reasons (`reason
/// [kernel, ...]`). The model-level test keeps those a forward pass can reach; the black-box
/// qualification (`brink-agent qualify --url`) those a prompt can reach.
pub fn catalogue_counts(shape: &ModelShape, serving: &ServingParams, limits: &DeviceLimits) -> Vec<(u64, Vec<String>)> {
    let kernel_serving = Serving { max_batch_tokens: serving.max_batch_tokens, prefill_chunk: serving.prefill_chunk };
    // Every derived count, whatever the memory or a cap would let the kernel test run.
    let opts = catalogue::Options { memory_budget_bytes: u64::MAX, negative_controls: false, max_tokens: None };
    let cat = catalogue::derive(shape, &kernel_serving, limits, &opts);
    let mut by_count: BTreeMap<u64, Vec<(String, Vec<String>)>> = BTreeMap::new();
    for case in cat.cases.iter().chain(cat.skipped.iter().map(|(c, _)| c)) {
        let reasons = by_count.entry(case.tokens).or_default();
        for r in &case.reasons {
            match reasons.iter_mut().find(|(text, _)| text == r) {
                Some((_, kernels)) if kernels.contains(&case.kernel) => {}
                Some((_, kernels)) => kernels.push(case.kernel.clone()),
                None => reasons.push((r.clone(), vec![case.kernel.clone()])),
            }
        }
    }
    by_count
        .into_iter()
        .filter(|&(t, _)| t >= 1)
        .map(|(t, reasons)| (t, reasons.into_iter().map(|(text, kernels)| format!("{text} [{}]", kernels.join(", "))).collect()))
        .collect()
}

/// The catalogue's critical counts for `shape` on `limits`, each with its reasons (`reason
/// [kernel, ...]`), split into those `<= max_batch_tokens` and the number above.
pub fn critical_counts(shape: &ModelShape, serving: &ServingParams, limits: &DeviceLimits) -> (Vec<(u64, Vec<String>)>, u64) {
    let (counts, above): (Vec<_>, Vec<_>) =
        catalogue_counts(shape, serving, limits).into_iter().partition(|&(t, _)| t <= serving.max_batch_tokens);
    (counts, above.len() as u64)
}

fn composition_of(batch: &[u64]) -> Composition {
    // `compositions` builds one prompt, four sequences, then a prefill and 8 decode rows.
    match batch.len() {
        1 => Composition::Single,
        4 => Composition::FourSeqs,
        _ => Composition::MixedDecode,
    }
}

/// Every case for the counts of [`critical_counts`]: count x composition. Cases above
/// `max_tokens`, or with a sequence longer than `context`, are listed as skipped with the reason.
pub fn derive(shape: &ModelShape, serving: &ServingParams, limits: &DeviceLimits, max_tokens: Option<u64>, context: u64) -> Derivation {
    let (counts, unreachable) = critical_counts(shape, serving, limits);
    let (mut cases, mut skipped) = (Vec::new(), Vec::new());
    for (tokens, reasons) in &counts {
        for batch in compositions(*tokens) {
            let composition = composition_of(&batch);
            let case = ModelCase {
                id: format!("{}/t{tokens}", composition.kernel()),
                composition,
                tokens: *tokens,
                batch,
                reasons: reasons.clone(),
            };
            if let Some(max) = max_tokens.filter(|&m| *tokens > m) {
                skipped.push((case, format!("above the model test's cap of {max} tokens (--model-max-tokens)")));
            } else if case.longest() > context {
                let why = format!("a sequence of {} tokens does not fit the context of {context}", case.longest());
                skipped.push((case, why));
            } else {
                cases.push(case);
            }
        }
    }
    Derivation { counts, unreachable, cases, skipped }
}

/// The most tokens a derived case can hold, known before the cases are (the worker's pool is
/// sized from it): at most `max_batch_tokens` and the test's cap, and with no sequence past
/// `context`, at most four sequences of `context` each (the four-sequence composition; a mixed
/// batch's prefill is at most `context` plus its decode rows). Not `context` itself: four
/// sequences of 2048 make a case of 8192 tokens in a context of 4096.
pub fn largest_case_tokens(max_batch_tokens: u64, max_tokens: Option<u64>, context: u64) -> u64 {
    max_batch_tokens.min(max_tokens.unwrap_or(u64::MAX)).min(context.saturating_mul(4))
}

/// The KV blocks the worker's pool needs for every case up to `max_count` tokens: the largest
/// case is a mixed batch (a prefill plus 8 decode sequences) or 4 sequences, each rounding up;
/// beside it, the reference streams the worker holds (`plan`): stream 0 up to the largest
/// count, streams 1 to 3 up to a quarter of it (the four-sequence cases' last sequence is up to
/// 3 longer) or a decode sequence, and the other decode streams.
pub fn pool_blocks(max_count: u64, block_size: u64) -> u64 {
    let decode = (DECODE_PROMPT + 1).div_ceil(block_size);
    let case = max_count.div_ceil(block_size) + 4 + DECODE_ROWS * decode;
    let quarter = (max_count / 4 + 3).max(DECODE_PROMPT + 1).div_ceil(block_size);
    let streams = max_count.div_ceil(block_size) + 3 * quarter + (DECODE_ROWS - 3) * decode;
    case + streams
}

/// KV rings of the sliding-window layers the worker's engine holds: one per sequence of a case
/// (at most a prefill beside `DECODE_ROWS` decode rows) and one per reference stream held beside
/// them (streams 0 to `DECODE_ROWS`). Known before the cases are; a plan's own peak
/// (`plan::Planner::rings_needed`) is never above it.
pub const WORKER_RINGS: u64 = 2 * (1 + DECODE_ROWS);

/// The prefill chunk the worker's engine sizes its rings for: the serving one, and at least a
/// reference chunk, so the references' chunks always fit a ring.
pub fn worker_prefill_chunk(serving_prefill_chunk: u64) -> u64 {
    serving_prefill_chunk.max(REFERENCE_CHUNK)
}

/// Moves the cases with a sequence of more than `max_chunk` rows in its step to `d.skipped`:
/// the sliding-window layers' rings serve no longer chunk of one sequence, so serving never runs
/// one (the scheduler chunks prompts at the prefill chunk); the same count runs as four
/// sequences.
pub fn skip_past_ring(d: &mut Derivation, max_chunk: u64) {
    let (fit, past): (Vec<_>, Vec<_>) = std::mem::take(&mut d.cases).into_iter().partition(|c| c.batch.iter().all(|&r| r <= max_chunk));
    d.cases = fit;
    for c in past {
        let rows = c.batch.iter().copied().max().unwrap_or(0);
        let why = format!(
            "a sequence of {rows} rows in one step: the sliding-window layers' KV rings serve chunks of at most {max_chunk} \
             (the scheduler never runs more of one sequence; --full-window-kv runs it)"
        );
        d.skipped.push((c, why));
    }
}

/// A case's deadline: `floor + factor x` the time its work takes at the calibrated throughput.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeadlinePolicy {
    pub factor: f64,
    pub floor: Duration,
}

impl Default for DeadlinePolicy {
    /// Factor 10 over a calibration that already runs the slowest path (small reference chunks):
    /// a large step runs faster per token, and attention's growth with the count up to the
    /// envelope stays well inside 10x on the models served. The 10 s floor absorbs scheduling
    /// noise, first-touch allocation and a cold cache on small cases; a hang is still caught in
    /// seconds.
    fn default() -> Self {
        DeadlinePolicy { factor: 10.0, floor: Duration::from_secs(10) }
    }
}

impl DeadlinePolicy {
    /// The deadline of a case whose step and references run `work_tokens` tokens.
    pub fn deadline(&self, work_tokens: u64, tokens_per_s: f64) -> Duration {
        let tps = if tokens_per_s.is_finite() && tokens_per_s > 0.0 { tokens_per_s } else { 1.0 };
        let work = Duration::from_secs_f64((work_tokens as f64 / tps * self.factor).min(86_400.0));
        self.floor + work
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn serving(max_batch_tokens: u64) -> ServingParams {
        ServingParams { max_batch_tokens, prefill_chunk: 4096, context: 40_960, full_window_kv: false }
    }

    #[test]
    fn counts_are_the_catalogues_within_the_batch_envelope() {
        let shape = ModelShape::qwen3_30b_a3b();
        let limits = DeviceLimits::gb10();
        let (counts, unreachable) = critical_counts(&shape, &serving(16_384), &limits);
        let opts = catalogue::Options { memory_budget_bytes: u64::MAX, negative_controls: false, max_tokens: None };
        let cat = catalogue::derive(&shape, &Serving { max_batch_tokens: 16_384, prefill_chunk: 4096 }, &limits, &opts);
        let all: std::collections::BTreeSet<u64> = cat.cases.iter().chain(cat.skipped.iter().map(|(c, _)| c)).map(|c| c.tokens).collect();
        let ours: Vec<u64> = counts.iter().map(|(t, _)| *t).collect();
        let expect: Vec<u64> = all.iter().copied().filter(|&t| t <= 16_384).collect();
        assert_eq!(ours, expect);
        assert_eq!(unreachable as usize, all.len() - expect.len());
        assert!(unreachable > 0, "the 2^31 overflow points lie far above any batch");
        for t in [1, 63, 64, 65, 4095, 4096, 4097, 8191, 8192, 16_383, 16_384] {
            assert!(ours.contains(&t), "{t} missing");
        }
        assert!(!ours.contains(&16_385), "max batch tokens + 1 is never a step");
        let reasons = &counts.iter().find(|(t, _)| *t == 8192).unwrap().1;
        assert!(reasons.iter().any(|r| r.contains("top_k 8 on grid.z")), "{reasons:?}");
    }

    #[test]
    fn every_composition_sums_to_its_count_and_caps_skip_with_a_reason() {
        let shape = ModelShape::qwen3_30b_a3b();
        let d = derive(&shape, &serving(16_384), &DeviceLimits::gb10(), Some(1024), 40_960);
        assert!(!d.cases.is_empty() && !d.skipped.is_empty());
        for c in d.cases.iter().chain(d.skipped.iter().map(|(c, _)| c)) {
            assert_eq!(c.batch.iter().sum::<u64>(), c.tokens, "{}", c.id);
            assert!(c.tokens <= 16_384);
            assert!(!c.reasons.is_empty(), "{}", c.id);
        }
        assert!(d.cases.iter().all(|c| c.tokens <= 1024));
        assert!(d.skipped.iter().all(|(c, why)| c.tokens > 1024 && why.contains("cap of 1024")));
        // Each count in each composition its size allows.
        let at = |t: u64| d.cases.iter().filter(|c| c.tokens == t).map(|c| c.composition).collect::<Vec<_>>();
        assert_eq!(at(1), vec![Composition::Single]);
        assert_eq!(at(64), vec![Composition::Single, Composition::FourSeqs, Composition::MixedDecode]);
        let mixed = d.cases.iter().find(|c| c.id == "model/mixed-decode/t64").unwrap();
        assert_eq!(mixed.batch, [vec![56], vec![1; 8]].concat());
        assert_eq!(mixed.sequences()[1], SeqPlan { cached: DECODE_PROMPT, rows: 1 });
        assert_eq!(d.cases.len() + d.skipped.len(), d.counts.iter().map(|(t, _)| compositions(*t).len()).sum::<usize>());
    }

    #[test]
    fn a_short_context_skips_what_does_not_fit_and_the_pool_holds_the_largest_case() {
        let shape = ModelShape::qwen3_30b_a3b();
        let d = derive(&shape, &serving(16_384), &DeviceLimits::gb10(), None, 4096);
        let single = d.skipped.iter().find(|(c, _)| c.id == "model/single/t8192").unwrap();
        assert!(single.1.contains("context of 4096"), "{}", single.1);
        // 4 x 2048 fits.
        assert!(d.cases.iter().any(|c| c.id == "model/4-seqs/t8192"));
        let most = d.cases.iter().map(|c| c.blocks_needed(16)).max().unwrap();
        let streams = crate::qualify::plan::Planner::stream_blocks(&d.cases, 16);
        assert!(most + streams <= pool_blocks(16_384, 16), "{most} + {streams}");
        // The pool a session sizes before deriving holds every case with the streams up to it,
        // for contexts shorter and longer than a quarter of the batch (an H100's `up` on a
        // context of 4096 once sized it by the context and ran short at 4 x 2048).
        for (max_batch, context) in [(8192, 4096), (16_384, 4096), (8192, 1024), (8192, 40_960), (16_384, 3000)] {
            let d = derive(&shape, &serving(max_batch), &DeviceLimits::gb10(), None, context);
            let pool = pool_blocks(largest_case_tokens(max_batch, None, context).max(2 * REFERENCE_CHUNK), 16);
            for (i, c) in d.cases.iter().enumerate() {
                assert!(c.tokens <= largest_case_tokens(max_batch, None, context), "{}", c.id);
                let held = crate::qualify::plan::Planner::stream_blocks(&d.cases[..=i], 16);
                assert!(c.blocks_needed(16) + held <= pool, "{} at batch {max_batch}, context {context}", c.id);
            }
        }
        for (i, c) in d.cases.iter().enumerate() {
            // Every case with the streams of the cases up to it held.
            let held = crate::qualify::plan::Planner::stream_blocks(&d.cases[..=i], 16);
            assert!(c.blocks_needed(16) + held <= pool_blocks(c.tokens, 16), "{}", c.id);
        }
    }

    #[test]
    fn cases_past_the_ring_are_skipped_with_the_reason_and_each_count_still_runs() {
        let shape = ModelShape::qwen3_30b_a3b();
        let mut d = derive(&shape, &serving(16_384), &DeviceLimits::gb10(), None, 40_960);
        let (cases, skipped) = (d.cases.len(), d.skipped.len());
        skip_past_ring(&mut d, 4096 + 15);
        assert_eq!(d.cases.len() + d.skipped.len(), cases + skipped);
        assert!(d.cases.iter().all(|c| c.batch.iter().all(|&r| r <= 4111)));
        assert!(d.cases.iter().any(|c| c.id == "model/single/t4096") && d.cases.iter().any(|c| c.id == "model/4-seqs/t16384"));
        let (_, why) = d.skipped.iter().find(|(c, _)| c.id == "model/single/t8192").unwrap();
        assert!(why.contains("8192 rows") && why.contains("at most 4111"), "{why}");
        // Every count still runs in some composition.
        for (t, _) in &d.counts {
            assert!(d.cases.iter().any(|c| c.tokens == *t), "count {t} lost");
        }
        assert_eq!(worker_prefill_chunk(32), REFERENCE_CHUNK);
        assert_eq!(worker_prefill_chunk(4096), 4096);
    }

    #[test]
    fn deadlines_grow_with_the_work_above_a_floor() {
        let p = DeadlinePolicy { factor: 10.0, floor: Duration::from_secs(2) };
        let case = |t: u64| ModelCase { id: String::new(), composition: Composition::Single, tokens: t, batch: vec![t], reasons: vec![] };
        // 100 tokens stepped + 100 of reference at 100 tok/s = 2 s of work, x10, + 2 s.
        assert_eq!(p.deadline(case(100).step_tokens() + 100, 100.0), Duration::from_secs(22));
        assert!(p.deadline(1000, 100.0) > p.deadline(200, 100.0));
        assert_eq!(p.deadline(2, f64::NAN), Duration::from_secs(22));
        let mixed = ModelCase { batch: [vec![56], vec![1; 8]].concat(), composition: Composition::MixedDecode, ..case(64) };
        assert_eq!(mixed.step_tokens(), 64 + 8 * DECODE_PROMPT, "the decode prompts are set up before the step");
    }
}
