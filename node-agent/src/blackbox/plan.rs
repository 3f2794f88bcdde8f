//! Which prompts the black-box qualification sends: derived from the model's shape and the
//! engine's limits, never chosen by hand. Pure: tested without an engine.
//!
//! The lengths are the kernel catalogue's critical counts (`qualify::cases::catalogue_counts`:
//! the grid limits of the model's top_k, tile tails, 32-bit overflow points, the batch and
//! chunk limits -1/0/+1), the longest prompt the context admits, and every residue mod 64 one
//! tile and one prefill chunk in (where a length-dependent tail bug shows). Each count of the
//! catalogue is also reached by concurrent requests whose prompts add up to it: four prompts
//! (a scheduler packing medium prompts into one step) and one prompt beside eight short ones
//! that are decoding (prefill mixed with decode). A request longer than the context cannot run:
//! it is listed as skipped with the reason.

use std::collections::BTreeMap;

use brink_api::ServingParams;
use brink_engine::qualify::cases::catalogue_counts;
use brink_kernels::limits::DeviceLimits;
use brink_kernels::thresholds::ModelShape;

/// Tokens each case's requests generate: one shows the prefill's logits gave a token, the
/// second that decoding after that prefill works too.
pub const GEN_TOKENS: u64 = 2;

/// Requests decoding beside the prefill of a mixed case (as `thresholds::compositions` builds it).
pub const DECODE_REQUESTS: u64 = 8;

/// Tokens each decoding request of a mixed case generates: enough that it is still decoding
/// while the long prompt's prefill runs.
pub const DECODE_GEN_TOKENS: u64 = 16;

/// Residues mod this tile are each tested (the GEMM row tile the kernels pad to).
pub const TAIL_TILE: u64 = 64;

/// How a case's prompts are sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Composition {
    /// One prompt.
    Single,
    /// Four prompts at once whose lengths sum to the count.
    FourConcurrent,
    /// A prompt of the count less the short prompts, sent while eight short prompts decode.
    MixedDecode,
}

impl Composition {
    /// The `kernel` column of the report.
    pub fn label(self) -> &'static str {
        match self {
            Composition::Single => "http/single",
            Composition::FourConcurrent => "http/4-concurrent",
            Composition::MixedDecode => "http/mixed-decode",
        }
    }
}

/// One request of a case.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    pub prompt_tokens: u64,
    pub max_tokens: u64,
}

/// A case: requests sent together, and why their lengths are critical.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpCase {
    /// e.g. `http/4-concurrent/t8192`.
    pub id: String,
    pub composition: Composition,
    /// The critical count: the prompts' total.
    pub count: u64,
    pub requests: Vec<Request>,
    pub reasons: Vec<String>,
}

impl HttpCase {
    /// The longest prompt (what a clamp would limit).
    pub fn longest(&self) -> u64 {
        self.requests.iter().map(|r| r.prompt_tokens).max().unwrap_or(0)
    }

    /// Prompt tokens the engine processes for the case.
    pub fn prompt_tokens(&self) -> u64 {
        self.requests.iter().map(|r| r.prompt_tokens).sum()
    }

    pub fn batch(&self) -> Vec<u64> {
        self.requests.iter().map(|r| r.prompt_tokens).collect()
    }

    /// One prompt of `tokens`.
    pub fn single(tokens: u64, reasons: Vec<String>) -> HttpCase {
        HttpCase {
            id: format!("{}/t{tokens}", Composition::Single.label()),
            composition: Composition::Single,
            count: tokens,
            requests: vec![Request { prompt_tokens: tokens, max_tokens: GEN_TOKENS }],
            reasons,
        }
    }
}

/// What the engine was started with, as far as the lengths go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Tokens per sequence, prompt and generated.
    pub context: u64,
    pub max_batch_tokens: u64,
    pub prefill_chunk: u64,
    /// The shortest prompt that can be built (a word and the engine's own tokens, e.g. a BOS).
    pub min_prompt: u64,
}

impl Limits {
    /// The longest prompt that leaves room for the case's generated tokens.
    pub fn max_prompt(&self) -> u64 {
        self.context.saturating_sub(GEN_TOKENS)
    }
}

/// Every derived case, smallest longest-prompt first, and those that cannot run.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// Distinct critical lengths, with their reasons.
    pub counts: Vec<(u64, Vec<String>)>,
    pub cases: Vec<HttpCase>,
    pub skipped: Vec<(HttpCase, String)>,
}

/// The cases for `shape` on an engine with `limits` (grid limits as on every CUDA device:
/// `limits_of_grid`).
pub fn derive(shape: &ModelShape, limits: &Limits, limits_of_grid: &DeviceLimits) -> Plan {
    let mut shape = shape.clone();
    // The context the engine runs with, not the one the model was trained for.
    shape.context = u32::try_from(limits.context).unwrap_or(u32::MAX);
    let serving = ServingParams {
        max_batch_tokens: limits.max_batch_tokens,
        prefill_chunk: limits.prefill_chunk,
        context: limits.context,
        full_window_kv: false,
    };
    let catalogue: BTreeMap<u64, Vec<String>> = catalogue_counts(&shape, &serving, limits_of_grid).into_iter().collect();

    let mut singles_only: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    let max_prompt = limits.max_prompt();
    if max_prompt >= 1 {
        singles_only.entry(max_prompt).or_default().push(format!("the longest prompt a context of {} admits", limits.context));
    }
    for (base, what) in
        [(TAIL_TILE, "one tile".to_string()), (limits.prefill_chunk, format!("one prefill chunk ({})", limits.prefill_chunk))]
    {
        // A whole number of tiles at or under `base` that still fits the 64 residues.
        let fit = max_prompt.saturating_sub(TAIL_TILE - 1).min(base) / TAIL_TILE * TAIL_TILE;
        if fit == 0 {
            continue;
        }
        for r in 0..TAIL_TILE {
            singles_only.entry(fit + r).or_default().push(format!("residue {r} mod {TAIL_TILE} near {what}: {fit} + {r}"));
        }
    }

    let mut counts: BTreeMap<u64, Vec<String>> = catalogue.clone();
    for (t, reasons) in &singles_only {
        let entry = counts.entry(*t).or_default();
        for r in reasons {
            if !entry.contains(r) {
                entry.push(r.clone());
            }
        }
    }

    let (mut cases, mut skipped) = (Vec::new(), Vec::new());
    let mut place = |case: HttpCase| match why_not(&case, limits) {
        Some(why) => skipped.push((case, why)),
        None => cases.push(case),
    };
    for (&count, reasons) in &counts {
        place(HttpCase::single(count, reasons.clone()));
        if catalogue.contains_key(&count) {
            for case in concurrent(count, reasons, limits.min_prompt) {
                place(case);
            }
        }
    }
    cases.sort_by_key(|c| (c.longest(), c.composition, c.count));
    Plan { counts: counts.into_iter().collect(), cases, skipped }
}

/// The concurrent compositions of `count` (those its size allows).
fn concurrent(count: u64, reasons: &[String], min_prompt: u64) -> Vec<HttpCase> {
    let mut v = Vec::new();
    let q = count / 4;
    if q >= min_prompt.max(1) {
        let lens = [q, q, q, count - 3 * q];
        v.push(HttpCase {
            id: format!("{}/t{count}", Composition::FourConcurrent.label()),
            composition: Composition::FourConcurrent,
            count,
            requests: lens.iter().map(|&p| Request { prompt_tokens: p, max_tokens: GEN_TOKENS }).collect(),
            reasons: reasons.iter().map(|r| format!("{r}; 4 prompts of {q}..{} tokens", count - 3 * q)).collect(),
        });
    }
    let short = min_prompt.max(1);
    let decode_total = DECODE_REQUESTS * short;
    if count >= decode_total + min_prompt.max(1) {
        let long = count - decode_total;
        let mut requests = vec![Request { prompt_tokens: long, max_tokens: GEN_TOKENS }];
        requests.extend((0..DECODE_REQUESTS).map(|_| Request { prompt_tokens: short, max_tokens: DECODE_GEN_TOKENS }));
        v.push(HttpCase {
            id: format!("{}/t{count}", Composition::MixedDecode.label()),
            composition: Composition::MixedDecode,
            count,
            requests,
            reasons: reasons
                .iter()
                .map(|r| format!("{r}; a {long}-token prompt beside {DECODE_REQUESTS} decoding requests of {short}"))
                .collect(),
        });
    }
    v
}

/// Why `case` cannot run on the engine, if it cannot.
fn why_not(case: &HttpCase, limits: &Limits) -> Option<String> {
    let too_long = case.requests.iter().find(|r| r.prompt_tokens + r.max_tokens > limits.context);
    if let Some(r) = too_long {
        return Some(format!(
            "above the engine's context: a {}-token prompt and {} generated tokens do not fit in {}",
            r.prompt_tokens, r.max_tokens, limits.context
        ));
    }
    let short = case.requests.iter().map(|r| r.prompt_tokens).min().unwrap_or(0);
    (short < limits.min_prompt).then(|| {
        format!("a {short}-token prompt is shorter than the shortest this engine's tokenizer allows ({} tokens)", limits.min_prompt)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full() -> Plan {
        let limits = Limits { context: 40_960, max_batch_tokens: 16_384, prefill_chunk: 4096, min_prompt: 1 };
        derive(&ModelShape::qwen3_30b_a3b(), &limits, &DeviceLimits::gb10())
    }

    fn ids(p: &Plan) -> Vec<&str> {
        p.cases.iter().map(|c| c.id.as_str()).collect()
    }

    #[test]
    fn full_shape_reaches_the_seed_thresholds_as_prompts() {
        let p = full();
        let singles: Vec<u64> = p.cases.iter().filter(|c| c.composition == Composition::Single).map(|c| c.count).collect();
        // top_k 8 on grid.z, the logits' 2^31 point at vocab 151,936, batch and chunk limits +-1,
        // the longest prompt of the context.
        for t in [8191, 8192, 14_134, 14_135, 16_383, 16_384, 16_385, 4095, 4096, 4097, 40_958] {
            assert!(singles.contains(&t), "{t} missing");
        }
        let reasons = &p.counts.iter().find(|(t, _)| *t == 8192).unwrap().1;
        assert!(reasons.iter().any(|r| r.contains("top_k 8 on grid.z")), "{reasons:?}");
        // Every residue mod 64 past one tile and past one prefill chunk.
        for base in [64, 4096] {
            let residues: std::collections::BTreeSet<u64> =
                singles.iter().filter(|&&t| t >= base && t < base + 64).map(|t| t % 64).collect();
            assert_eq!(residues.len(), 64, "past {base}");
        }
        // Sorted by the longest prompt; ids unique.
        assert!(p.cases.windows(2).all(|w| w[0].longest() <= w[1].longest()));
        let mut all = ids(&p);
        all.sort();
        all.dedup();
        assert_eq!(all.len(), p.cases.len());
    }

    #[test]
    fn concurrent_requests_sum_to_each_catalogue_count() {
        let p = full();
        let four = p.cases.iter().find(|c| c.id == "http/4-concurrent/t8192").unwrap();
        assert_eq!(four.batch(), vec![2048; 4]);
        let mixed = p.cases.iter().find(|c| c.id == "http/mixed-decode/t8192").unwrap();
        assert_eq!(mixed.batch(), [vec![8184], vec![1; 8]].concat());
        assert!(mixed.requests[1..].iter().all(|r| r.max_tokens == DECODE_GEN_TOKENS));
        for c in p.cases.iter().chain(p.skipped.iter().map(|(c, _)| c)) {
            assert_eq!(c.prompt_tokens(), c.count, "{}", c.id);
            assert!(!c.reasons.is_empty(), "{}", c.id);
        }
        // A count past the context is still reached by four prompts that each fit.
        let over = p.cases.iter().find(|c| c.composition == Composition::FourConcurrent && c.count > 40_960);
        assert!(over.is_some(), "no 4-prompt case above the context");
        // Residue counts are single prompts only.
        assert!(!ids(&p).contains(&"http/4-concurrent/t4133"));
    }

    #[test]
    fn prompts_past_the_context_are_skipped_with_the_reason() {
        let p = full();
        let (c, why) = p.skipped.iter().find(|(c, _)| c.id == "http/single/t65536").unwrap();
        assert_eq!(c.longest(), 65_536);
        assert!(why.contains("above the engine's context") && why.contains("40960"), "{why}");
        assert!(p.cases.iter().all(|c| c.requests.iter().all(|r| r.prompt_tokens + r.max_tokens <= 40_960)));
        assert!(!ids(&p).contains(&"http/single/t40959"), "leaves no room to generate");
    }

    #[test]
    fn a_small_engine_keeps_what_fits_and_the_shortest_prompt() {
        let limits = Limits { context: 1024, max_batch_tokens: 512, prefill_chunk: 256, min_prompt: 2 };
        let p = derive(&ModelShape::qwen3_30b_a3b(), &limits, &DeviceLimits::gb10());
        let singles: Vec<u64> = p.cases.iter().filter(|c| c.composition == Composition::Single).map(|c| c.count).collect();
        for t in [511, 512, 513, 255, 256, 257, 1022, 64, 127, 256 + 63] {
            assert!(singles.contains(&t), "{t} missing");
        }
        assert!(singles.iter().all(|&t| (2..=1022).contains(&t)));
        let (_, why) = p.skipped.iter().find(|(c, _)| c.id == "http/single/t1").unwrap();
        assert!(why.contains("shortest"), "{why}");
        // Mixed cases decode beside prompts of the shortest length.
        let mixed = p.cases.iter().find(|c| c.id == "http/mixed-decode/t512").unwrap();
        assert_eq!(mixed.batch(), [vec![496], vec![2; 8]].concat());
        // A context too short for a residue sweep past the chunk moves it under the context.
        let tiny = Limits { context: 200, max_batch_tokens: 512, prefill_chunk: 256, min_prompt: 1 };
        let p = derive(&ModelShape::qwen3_30b_a3b(), &tiny, &DeviceLimits::gb10());
        assert!(p.cases.iter().all(|c| c.longest() <= 198));
        let past_chunk = p.counts.iter().filter(|(_, r)| r.iter().any(|r| r.contains("near one prefill chunk"))).count();
        assert_eq!(past_chunk, 64);
    }
}
