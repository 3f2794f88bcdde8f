//! Where each case's expected logits come from, planned without a model (pure).
//!
//! Sequence `i` of every case is a prefix of one deterministic token stream, stream `i`, so a
//! shorter case's sequence is a prefix of a longer case's. Each stream's reference is computed
//! once per worker, alone and in chunks, and only as far as the cases run so far need: before a
//! case, every stream it reads is extended from where it stopped ([`extension`]) to the longest
//! of the case's sequences in it, and the logit rows of every position some case compares are
//! kept until their last reader has run. The reference then costs about the longest case per
//! stream, not the sum of all cases.
//!
//! Three rules keep the comparison as strict as computing each case alone:
//! - A chunk holds at most `min(REFERENCE_CHUNK, case count)` rows and reaches no position past
//!   the case's own sequences, so a failure that starts at some row count or position is never
//!   charged to a smaller case.
//! - Each sequence is computed alone in chunks, whatever the step under test batches: a bug that
//!   depends on the row count cannot hit both sides the same way.
//! - No chunk has fewer than [`MIN_REFERENCE_CHUNK`] rows unless it starts at position 0: a
//!   short remainder is pulled back over positions already computed instead. Below that size a
//!   step takes the decode paths, and a bug there would otherwise corrupt the stream for every
//!   later case rather than fail the cases at its own counts.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::{Deserialize, Serialize};

use super::cases::{ModelCase, REFERENCE_CHUNK};

/// A token stream: sequence `i` of every case reads the first positions of stream `i`.
pub type Stream = u64;

/// The smallest reference chunk that does not start at position 0: the decode batch sizes
/// (the GEMV range) lie below it.
pub const MIN_REFERENCE_CHUNK: u64 = 16;

/// Host memory the kept logit rows may take between cases. A row is `vocab x 4` bytes (about
/// 0.6 MiB for a 152k vocabulary, so ~1700 rows); the case's own rows (at most nine) and one
/// chunk's rows come on top. Rows over the bound are not kept: their readers compute their
/// sequences alone, as every case did before the streams were shared.
pub const MAX_KEPT_BYTES: u64 = 1 << 30;

/// Rows of `vocab` logits [`MAX_KEPT_BYTES`] holds.
pub fn max_kept_rows(vocab: u64) -> usize {
    usize::try_from(MAX_KEPT_BYTES / (vocab.max(1) * 4)).unwrap_or(usize::MAX)
}

/// The rows a case compares: each sequence's stream and length (its last position, counted
/// from 1, is the row whose logits are compared).
pub fn case_needs(case: &ModelCase) -> Vec<(Stream, u64)> {
    case.sequences().iter().enumerate().map(|(i, s)| (i as u64, s.len())).collect()
}

/// The rows a reference chunk of `case` may hold.
pub fn chunk_rows(case: &ModelCase) -> u64 {
    REFERENCE_CHUNK.min(case.tokens).max(1)
}

/// Chunks `(start, end)` (positions `start..end`) that bring a stream computed up to `frontier`
/// to `to`: `chunk` rows each, the last ending at `to`. The first, the remainder, is pulled
/// back to `min(MIN_REFERENCE_CHUNK, chunk)` rows where it would be smaller, recomputing
/// positions already computed, unless it starts at position 0.
pub fn extension(frontier: u64, to: u64, chunk: u64) -> Vec<(u64, u64)> {
    let chunk = chunk.max(1);
    if to <= frontier {
        return Vec::new();
    }
    let k = (to - frontier).div_ceil(chunk);
    let least = MIN_REFERENCE_CHUNK.min(chunk);
    (0..k)
        .map(|i| {
            let end = to - (k - 1 - i) * chunk;
            let start = if i == 0 { frontier.min(end.saturating_sub(least)) } else { end - chunk };
            (start, end)
        })
        .collect()
}

/// The chunks to run for one stream before a case.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Extension {
    pub stream: Stream,
    /// Positions of the stream the worker holds before (it checks it holds exactly these).
    pub from: u64,
    /// `(start, end)`, in order.
    pub chunks: Vec<(u64, u64)>,
    /// Positions (counted from 1) whose logit rows are kept: this case's, and later cases'.
    pub keep: Vec<u64>,
    /// No case extends the stream further: its KV blocks go back to the pool.
    pub done: bool,
}

/// What the worker does for a case's references.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReferenceWork {
    pub extend: Vec<Extension>,
    /// Sequences of the case whose rows are not kept (over [`MAX_KEPT_BYTES`]): computed alone.
    pub alone: Vec<u64>,
    /// Kept rows `(stream, position)` no case after this one reads: dropped after it.
    pub release: Vec<(Stream, u64)>,
}

impl ReferenceWork {
    /// A bare case's work (no shared streams): every one of its sequences computed alone.
    pub fn alone(case: &ModelCase) -> Self {
        ReferenceWork { alone: (0..case.sequences().len() as u64).collect(), ..ReferenceWork::default() }
    }

    /// Tokens the worker runs for this work (the chunks, then the sequences computed alone).
    pub fn tokens(&self, case: &ModelCase) -> u64 {
        let chunks: u64 = self.extend.iter().flat_map(|e| &e.chunks).map(|(s, e)| e - s).sum();
        let seqs = case.sequences();
        chunks + self.alone.iter().filter_map(|&i| seqs.get(i as usize)).map(|s| s.len()).sum::<u64>()
    }
}

/// Tokens a whole run computes, per phase.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    /// Rows of the steps under test.
    pub step: u64,
    /// The decode sequences' prompts, cached before their steps.
    pub setup: u64,
    /// The references (stream chunks and sequences computed alone).
    pub reference: u64,
}

/// The parent's model of what the worker holds: where each stream stops and which rows are
/// kept. It hands out each case's [`ReferenceWork`]; [`Planner::lost`] after the worker was
/// killed, died or failed a case (a fresh worker, or one that dropped its streams, holds none).
pub struct Planner {
    needs: Vec<Vec<(Stream, u64)>>,
    chunk: Vec<u64>,
    /// Cases reading each row, ascending.
    readers: HashMap<(Stream, u64), Vec<usize>>,
    /// Positions some case compares, per stream.
    positions: BTreeMap<Stream, BTreeSet<u64>>,
    frontier: BTreeMap<Stream, u64>,
    kept: BTreeSet<(Stream, u64)>,
    max_kept: usize,
}

impl Planner {
    /// For `cases` in the order they run, keeping at most `max_kept` rows for later cases.
    pub fn new(cases: &[ModelCase], max_kept: usize) -> Planner {
        let needs: Vec<_> = cases.iter().map(case_needs).collect();
        let mut readers: HashMap<(Stream, u64), Vec<usize>> = HashMap::new();
        let mut positions: BTreeMap<Stream, BTreeSet<u64>> = BTreeMap::new();
        for (i, n) in needs.iter().enumerate() {
            for &(s, p) in n {
                let r = readers.entry((s, p)).or_default();
                if r.last() != Some(&i) {
                    r.push(i);
                }
                positions.entry(s).or_default().insert(p);
            }
        }
        Planner {
            needs,
            chunk: cases.iter().map(chunk_rows).collect(),
            readers,
            positions,
            frontier: BTreeMap::new(),
            kept: BTreeSet::new(),
            max_kept,
        }
    }

    /// The worker holds no stream and no row.
    pub fn lost(&mut self) {
        self.frontier.clear();
        self.kept.clear();
    }

    /// Positions of `stream` the worker holds.
    pub fn frontier(&self, stream: Stream) -> u64 {
        self.frontier.get(&stream).copied().unwrap_or(0)
    }

    /// The work for case `index` (cases run in ascending order; some may be left out).
    pub fn work(&mut self, index: usize) -> ReferenceWork {
        let Some(needs) = self.needs.get(index).cloned() else { return ReferenceWork::default() };
        let mut to: BTreeMap<Stream, u64> = BTreeMap::new();
        for &(s, p) in &needs {
            let t = to.entry(s).or_default();
            *t = (*t).max(p);
        }
        let mut work = ReferenceWork::default();
        for (s, to) in to {
            let from = self.frontier(s);
            let chunks = extension(from, to, self.chunk[index]);
            if chunks.is_empty() {
                continue;
            }
            let mut keep = Vec::new();
            let first_time = self.positions.get(&s).map(|ps| ps.range(from + 1..=to).copied().collect::<Vec<_>>()).unwrap_or_default();
            for p in first_time {
                let readers = self.readers.get(&(s, p)).map(Vec::as_slice).unwrap_or(&[]);
                let own = readers.contains(&index);
                let later = readers.last().is_some_and(|&j| j > index);
                if own || (later && self.kept.len() < self.max_kept) {
                    keep.push(p);
                    self.kept.insert((s, p));
                }
            }
            let longest = self.positions.get(&s).and_then(|ps| ps.last()).copied().unwrap_or(0);
            self.frontier.insert(s, to);
            work.extend.push(Extension { stream: s, from, chunks, keep, done: to >= longest });
        }
        work.alone = needs.iter().enumerate().filter(|(_, n)| !self.kept.contains(*n)).map(|(i, _)| i as u64).collect();
        let done_with = |r: &(Stream, u64), readers: &HashMap<(Stream, u64), Vec<usize>>| {
            readers.get(r).and_then(|v| v.last()).is_none_or(|&j| j <= index)
        };
        work.release = self.kept.iter().filter(|r| done_with(r, &self.readers)).copied().collect();
        for r in &work.release {
            self.kept.remove(r);
        }
        // This case's own rows were kept whatever the bound; over it, later readers of them
        // compute their sequences alone.
        let over: Vec<_> =
            needs.iter().filter(|n| self.kept.contains(*n)).copied().take(self.kept.len().saturating_sub(self.max_kept)).collect();
        for r in over {
            self.kept.remove(&r);
            work.release.push(r);
        }
        work
    }

    /// Tokens of running every case of `cases` once, in order, with nothing lost.
    pub fn totals(cases: &[ModelCase], max_kept: usize) -> Totals {
        let mut planner = Planner::new(cases, max_kept);
        let mut t = Totals::default();
        for (i, case) in cases.iter().enumerate() {
            t.step += case.tokens;
            t.setup += case.sequences().iter().map(|s| s.cached).sum::<u64>();
            t.reference += planner.work(i).tokens(case);
        }
        t
    }

    /// KV rings the worker needs at most at once for `cases` run in order (the sliding-window
    /// layers' KV of each sequence in a step and of each stream held lives in a ring of its own):
    /// a case's sequences hold theirs through its step and references, a stream from its first
    /// extension to its last, which gives it back at once. A lost worker holds none, so fewer.
    pub fn rings_needed(cases: &[ModelCase]) -> u64 {
        let mut planner = Planner::new(cases, usize::MAX);
        let mut held = BTreeSet::new();
        let mut peak = 0;
        for (i, case) in cases.iter().enumerate() {
            let seqs = case.sequences().len();
            peak = peak.max(seqs + held.len());
            for e in planner.work(i).extend {
                held.insert(e.stream);
                peak = peak.max(seqs + held.len());
                if e.done {
                    held.remove(&e.stream);
                }
            }
        }
        peak as u64
    }

    /// KV blocks of `block_size` positions the streams hold at most at once (each stream is
    /// held until its last extension).
    pub fn stream_blocks(cases: &[ModelCase], block_size: u64) -> u64 {
        let planner = Planner::new(cases, 0);
        planner.positions.values().filter_map(|ps| ps.last()).map(|l| l.div_ceil(block_size.max(1))).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::qualify::cases::{Composition, DECODE_PROMPT};

    fn case(tokens: u64, composition: Composition) -> ModelCase {
        let batch = brink_kernels::thresholds::compositions(tokens)
            .into_iter()
            .find(|b| match composition {
                Composition::Single => b.len() == 1,
                Composition::FourSeqs => b.len() == 4,
                Composition::MixedDecode => b.len() == 9,
            })
            .unwrap();
        ModelCase { id: format!("{composition:?}/t{tokens}"), composition, tokens, batch, reasons: vec![] }
    }

    /// Every count of `counts` in each composition it allows, smallest count first.
    fn cases(counts: &[u64]) -> Vec<ModelCase> {
        let mut v = Vec::new();
        for &t in counts {
            v.push(case(t, Composition::Single));
            if t >= 4 {
                v.push(case(t, Composition::FourSeqs));
            }
            if t >= 9 {
                v.push(case(t, Composition::MixedDecode));
            }
        }
        v
    }

    #[test]
    fn extensions_end_at_the_target_in_chunks_no_larger_than_asked() {
        let c = REFERENCE_CHUNK;
        #[rustfmt::skip]
        let table: &[(u64, u64, u64, &[(u64, u64)])] = &[
            // Nothing to do.
            (5, 5, c, &[]),
            (9, 5, c, &[]),
            // From position 0: the first chunk is the remainder, however short.
            (0, 1, c, &[(0, 1)]),
            (0, 2, 1, &[(0, 1), (1, 2)]),
            (0, 128, c, &[(0, 128)]),
            (0, 129, c, &[(0, 1), (1, 129)]),
            (0, 300, c, &[(0, 44), (44, 172), (172, 300)]),
            (0, 256, c, &[(0, 128), (128, 256)]),
            // Exact multiples from a multiple: no position computed twice.
            (128, 256, c, &[(128, 256)]),
            (128, 384, c, &[(128, 256), (256, 384)]),
            // Adjacent positions: one new position, pulled back to 16 rows.
            (64, 65, c, &[(49, 65)]),
            (127, 128, c, &[(112, 128)]),
            (128, 129, c, &[(113, 129)]),
            // A remainder of 16 or more stays as it is.
            (100, 116, c, &[(100, 116)]),
            (100, 115, c, &[(99, 115)]),
            // Near the start the pull-back stops at position 0.
            (3, 4, c, &[(0, 4)]),
            // Small cases: chunks of their own count, pulled back to at most that.
            (3, 4, 4, &[(0, 4)]),
            (5, 6, 9, &[(0, 6)]),
            (10, 30, 12, &[(6, 18), (18, 30)]),
            (10, 34, 12, &[(10, 22), (22, 34)]),
            (17, 30, 12, &[(6, 18), (18, 30)]),
        ];
        for &(from, to, chunk, want) in table {
            assert_eq!(extension(from, to, chunk), want, "extension({from}, {to}, {chunk})");
        }
        // Properties over a grid: contiguous, ending at `to`, covering `from..to`, sizes bounded.
        for chunk in [1, 3, 9, 16, 17, 64, 128] {
            for from in 0..300 {
                for to in [from + 1, from + 2, from + 15, from + 16, from + 127, from + 128, from + 129, 8192.max(from + 1)] {
                    let ch = extension(from, to, chunk);
                    assert_eq!(ch.last().unwrap().1, to);
                    assert!(ch[0].0 <= from, "{from}..{to} by {chunk}: {ch:?}");
                    assert!(ch.windows(2).all(|w| w[0].1 == w[1].0));
                    for &(s, e) in &ch {
                        assert!(e > s && e - s <= chunk, "{from}..{to} by {chunk}: {ch:?}");
                        assert!(s == 0 || e - s >= MIN_REFERENCE_CHUNK.min(chunk), "{from}..{to} by {chunk}: {ch:?}");
                    }
                    assert!(from - ch[0].0 < MIN_REFERENCE_CHUNK.min(chunk), "recomputes less than a short chunk");
                }
            }
        }
    }

    /// Replays a planner over `cases` checking every rule: each compared row is computed by a
    /// chunk of the stream while its reader runs or kept from an earlier chunk, chunks stay
    /// within the case's count and positions, and rows go once no later case reads them.
    fn check_plan(cases: &[ModelCase], max_kept: usize) -> Totals {
        check_plan_peak(cases, max_kept).0
    }

    /// [`check_plan`], and the most rows kept at once.
    fn check_plan_peak(cases: &[ModelCase], max_kept: usize) -> (Totals, usize) {
        let mut peak = 0;
        let mut planner = Planner::new(cases, max_kept);
        let mut kept: BTreeSet<(Stream, u64)> = BTreeSet::new();
        let mut frontier: BTreeMap<Stream, u64> = BTreeMap::new();
        let mut totals = Totals::default();
        for (i, case) in cases.iter().enumerate() {
            let w = planner.work(i);
            let needs = case_needs(case);
            for e in &w.extend {
                assert_eq!(e.from, frontier.get(&e.stream).copied().unwrap_or(0), "{}", case.id);
                let own_end = needs.iter().filter(|n| n.0 == e.stream).map(|n| n.1).max().unwrap();
                assert_eq!(e.chunks.last().unwrap().1, own_end, "{}: ends at the case's own longest sequence", case.id);
                for &(s, end) in &e.chunks {
                    assert!(end - s <= REFERENCE_CHUNK.min(case.tokens), "{}: chunk {s}..{end}", case.id);
                }
                for &p in &e.keep {
                    assert!(p > e.from && p <= own_end, "{}: keeps {p}", case.id);
                    assert!(kept.insert((e.stream, p)), "{}: kept twice: {p}", case.id);
                }
                frontier.insert(e.stream, own_end);
            }
            for (seq, n) in needs.iter().enumerate() {
                assert_eq!(kept.contains(n), !w.alone.contains(&(seq as u64)), "{}: sequence {seq}", case.id);
                assert!(frontier.get(&n.0).copied().unwrap_or(0) >= n.1, "{}: sequence {seq} beyond the stream", case.id);
            }
            for r in &w.release {
                assert!(kept.remove(r), "{}: releases {r:?}", case.id);
                // Under the bound a row goes once no later case reads it; over it, earlier.
                let read_later = cases[i + 1..].iter().any(|c| case_needs(c).contains(r));
                assert!(!read_later || kept.len() + 1 >= max_kept, "{}: {r:?} is read later", case.id);
            }
            assert!(kept.len() <= max_kept.saturating_add(9), "{}: {} rows kept", case.id, kept.len());
            peak = peak.max(kept.len() + w.release.len());
            totals.step += case.tokens;
            totals.setup += case.sequences().iter().map(|s| s.cached).sum::<u64>();
            totals.reference += w.tokens(case);
        }
        assert!(kept.is_empty(), "every row released after its last reader: {kept:?}");
        assert_eq!(totals, Planner::totals(cases, max_kept));
        (totals, peak)
    }

    #[test]
    fn every_compared_row_is_computed_once_and_kept_until_its_last_reader() {
        let counts: Vec<u64> = (1..=40).chain([63, 64, 65, 127, 128, 129, 255, 256, 257, 1000]).collect();
        let cs = cases(&counts);
        let t = check_plan(&cs, usize::MAX);
        // Nothing is computed alone: one pass per stream, plus short pull-backs.
        let longest: u64 = [1000, 250 + 1000 % 4, 250, 250].iter().sum::<u64>() + 5 * (DECODE_PROMPT + 1);
        assert!(t.reference >= longest && t.reference < longest + 15 * 4 * cs.len() as u64, "{t:?}");
        // A tight bound computes the rest alone, and still releases everything.
        let tight = check_plan(&cs, 3);
        assert!(tight.reference > t.reference && tight.step == t.step, "{tight:?}");
    }

    #[test]
    fn a_lost_worker_starts_its_streams_again() {
        let cs = cases(&[1, 2, 4, 9, 12]);
        let mut p = Planner::new(&cs, usize::MAX);
        for i in 0..4 {
            p.work(i);
        }
        assert_eq!(p.frontier(0), 4);
        p.lost();
        // Single t9: stream 0 from position 0, in chunks of at most 9 rows.
        let w = p.work(4);
        assert_eq!(w.extend.len(), 1);
        assert_eq!((w.extend[0].from, w.extend[0].chunks.clone()), (0, vec![(0, 9)]));
        assert!(w.alone.is_empty());
        // Rows an earlier case kept for later ones are computed again on the way.
        assert!(w.extend[0].keep.contains(&1), "{w:?}");
    }

    /// The default class (the 30B-shaped model at the agent's default serving envelope on the
    /// H200's limits): the derivation is the cases' own (none dropped, every derived case
    /// planned), no row is computed alone under the memory bound, and the references cost a
    /// fraction of the steps.
    #[test]
    fn the_default_class_plans_every_case_with_references_below_its_steps() {
        use brink_api::ServingParams;
        use brink_kernels::limits::DeviceLimits;
        use brink_kernels::thresholds::{ModelShape, compositions};
        let shape = ModelShape::qwen3_30b_a3b();
        let serving = ServingParams { max_batch_tokens: 8192, prefill_chunk: 2048, context: 40_960, full_window_kv: false };
        let d = crate::qualify::cases::derive(&shape, &serving, &DeviceLimits::h200(), None, 40_960);
        assert!(d.skipped.is_empty());
        assert_eq!(d.cases.len(), d.counts.iter().map(|(t, _)| compositions(*t).len()).sum::<usize>());
        let max_kept = max_kept_rows(shape.vocab as u64);
        let (t, peak) = check_plan_peak(&d.cases, max_kept);
        assert!(peak <= max_kept, "{peak} rows kept at once, bound {max_kept}");
        let alone = Planner::totals(&d.cases, usize::MAX);
        assert_eq!(t, alone, "nothing computed alone under the bound");
        let ratio = t.reference as f64 / t.step as f64;
        eprintln!(
            "default class: {} counts, {} cases; step {} (+{} decode prompts), reference {} ({ratio:.3}x), {peak} rows kept at most ({} MiB)",
            d.counts.len(),
            d.cases.len(),
            t.step,
            t.setup,
            t.reference,
            (peak as u64 * shape.vocab as u64 * 4) >> 20
        );
        assert!(ratio <= 1.2, "{t:?}");
        // Computing each case's sequences alone, as before the streams, costs every case's length.
        let each_alone: u64 = d.cases.iter().flat_map(|c| c.sequences()).map(|s| s.len()).sum();
        assert!(t.reference * 4 < each_alone, "{} vs {each_alone}", t.reference);
    }

    /// The worker's rings hold every derived plan's peak: a case's sequences beside the streams
    /// held, for short and long contexts and batch envelopes.
    #[test]
    fn the_worker_rings_hold_every_plans_peak() {
        use crate::qualify::cases::{WORKER_RINGS, derive};
        use brink_api::ServingParams;
        use brink_kernels::limits::DeviceLimits;
        use brink_kernels::thresholds::ModelShape;
        let shape = ModelShape::qwen3_30b_a3b();
        for (max_batch, context, cap) in [(8192, 40_960, None), (16_384, 4096, None), (512, 1024, Some(16)), (64, 128, None)] {
            let serving = ServingParams { max_batch_tokens: max_batch, prefill_chunk: 2048, context, full_window_kv: false };
            let d = derive(&shape, &serving, &DeviceLimits::h200(), cap, context);
            let need = Planner::rings_needed(&d.cases);
            assert!(need <= WORKER_RINGS, "batch {max_batch}, context {context}: {need} rings");
            // A mixed case holds nine sequences, with stream 0 and the decode stream it extends.
            assert!(need >= 11, "batch {max_batch}, context {context}: {need} rings");
        }
        let single = |t: u64| ModelCase { id: String::new(), composition: Composition::Single, tokens: t, batch: vec![t], reasons: vec![] };
        // One sequence and stream 0 (held until its longest case).
        assert_eq!(Planner::rings_needed(&[single(3), single(5)]), 2);
        assert_eq!(Planner::rings_needed(&[]), 0);
    }
}
