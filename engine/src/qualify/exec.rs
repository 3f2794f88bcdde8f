//! Running one model-level case on a loaded engine (in the worker process): the decode
//! sequences' prompts first, then ONE step with every sequence's rows; then the streams the case
//! reads are extended as its [`ReferenceWork`] says ([`Streams`]), and the last-position logits
//! of the step are compared with the reference rows of the same positions.
//!
//! Sequence `i` of every case is a prefix of token stream `i` ([`prompt_tokens`]), so each
//! stream's reference is computed once per worker, alone and in chunks, and every case reads its
//! rows (see [`super::plan`]). The decode sequences (streams 1 to 8, six tokens each) are the
//! same in every mixed case: their rows are computed for the first and kept.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::cases::{ModelCase, REFERENCE_CHUNK, SeqPlan};
use super::plan::{Extension, ReferenceWork, Stream};
use crate::backend::Logits;
use crate::engine::{AnyEngine, StepItem};
use crate::model::ModelError;
use crate::parity;

/// Why a case (or a reference stream) could not be run to a comparison: each names the count,
/// the chunk or the stream at fault. The parent reports it as the case's error.
#[derive(Debug, thiserror::Error)]
pub enum CaseError {
    #[error("the case needs {need} more KV blocks, the pool has {free} free")]
    PoolShort { need: u64, free: usize },
    #[error("the case needs {need} more KV rings (one per sequence in the sliding-window layers), the pool has {free} free")]
    RingsShort { need: u64, free: usize },
    /// The engine refused or failed a step (its error names the backend, kernel or request).
    #[error(transparent)]
    Engine(#[from] ModelError),
    #[error("chunk {start}..{end} past the stream's {len} tokens")]
    ChunkPastStream { start: u64, end: u64, len: usize },
    #[error("chunk {start}..{end} returned {got} logits")]
    ChunkLogits { start: u64, end: u64, got: usize },
    #[error("stream {stream} holds {held} positions, its extension starts at {from}")]
    StreamFrontier { stream: Stream, held: u64, from: u64 },
    #[error("the reference logits hold NaN or infinity")]
    NonFiniteReference,
    #[error("the step returned {step} logits, the references {refs} (vocab {vocab})")]
    LogitCount { step: usize, refs: usize, vocab: usize },
}

/// What running a case found (judged against the tolerance by the parent).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum ModelOutcome {
    Compared {
        /// Worst sequence's `max |step - reference| / max |reference|`.
        max_err: f64,
        /// Sequence with that error.
        worst_seq: u64,
        /// Sequences whose step logits hold NaN or infinity.
        non_finite_rows: u64,
        argmax_mismatches: u64,
        /// Logits compared (sequences x vocab).
        compared: u64,
        /// The batched step alone.
        step_ms: f64,
        /// Tokens run for this case's references (stream chunks, sequences computed alone).
        #[serde(default)]
        reference_tokens: u64,
        #[serde(default)]
        reference_ms: f64,
    },
    /// The engine refused or failed a step (a typed error, not a hang).
    Error { error: String },
}

/// What the parent sends for each case. A bare case (no reference work) computes each of its
/// sequences alone.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CaseRequest {
    #[serde(flatten)]
    pub case: ModelCase,
    #[serde(default)]
    pub reference: ReferenceWork,
}

/// Ids handed out from the top down, so a sequence's table is not the identity map of
/// positions to ids that a bug could hide behind; `K` says what they index and names a
/// shortfall ([`BlockPool`], [`RingPool`]).
pub struct IdPool<K: PoolKind> {
    free: Vec<u32>,
    kind: std::marker::PhantomData<K>,
}

/// What a pool's ids index: the error a shortfall of them is.
pub trait PoolKind {
    fn short(need: u64, free: usize) -> CaseError;
}

/// KV blocks: cases draw their block tables from them.
pub struct Blocks;

impl PoolKind for Blocks {
    fn short(need: u64, free: usize) -> CaseError {
        CaseError::PoolShort { need, free }
    }
}

/// The rings of the sliding-window layers' KV (the window-only layout, as the node serves): each
/// sequence in a step, and each stream the worker holds, has one of its own; a stream keeps its
/// ring as long as its blocks, since its windowed layers' KV lives there. Without rings in the
/// engine (`full_window_kv`) the indexes are handed out all the same and not used.
pub struct Rings;

impl PoolKind for Rings {
    fn short(need: u64, free: usize) -> CaseError {
        CaseError::RingsShort { need, free }
    }
}

pub type BlockPool = IdPool<Blocks>;
pub type RingPool = IdPool<Rings>;

impl<K: PoolKind> IdPool<K> {
    pub fn new(ids: u32) -> Self {
        IdPool { free: (0..ids).collect(), kind: std::marker::PhantomData }
    }

    /// `n` distinct ids, or the kind's error naming the shortfall.
    pub fn take(&mut self, n: u64) -> Result<Vec<u32>, CaseError> {
        let free = self.free.len();
        let n = usize::try_from(n).ok().filter(|&k| k <= free).ok_or_else(|| K::short(n, free))?;
        Ok(self.free.split_off(free - n).into_iter().rev().collect())
    }

    pub fn give_back(&mut self, mut ids: Vec<u32>) {
        ids.reverse();
        self.free.extend(ids);
    }

    pub fn free(&self) -> usize {
        self.free.len()
    }
}

/// The first `len` token ids of stream `stream` (a SplitMix64 stream): a shorter prompt of a
/// stream is a prefix of a longer one, and every run sees the same prompts.
pub fn prompt_tokens(stream: Stream, len: u64, vocab: usize) -> Vec<u32> {
    let mut state = stream.wrapping_mul(0xD1B5_4A32_D192_ED03);
    (0..len)
        .map(|_| {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            ((z ^ (z >> 31)) % vocab.max(1) as u64) as u32
        })
        .collect()
}

/// Runs `tokens` of one sequence alone from position 0 in chunks of `chunk`, on `blocks` and
/// ring `ring`; the logits of its last position.
pub fn reference(engine: &mut dyn AnyEngine, blocks: &[u32], ring: u32, tokens: &[u32], chunk: usize) -> Result<Vec<f32>, CaseError> {
    let mut last = Vec::new();
    let n = tokens.len().div_ceil(chunk.max(1));
    for (i, c) in tokens.chunks(chunk.max(1)).enumerate() {
        let want = if i + 1 == n { Logits::Last } else { Logits::None };
        let item = StepItem { blocks, start_pos: (i * chunk) as u32, tokens: c, logits: want };
        last = engine.step_in_rings(&[item], &[ring])?;
    }
    Ok(last)
}

/// Runs `chunks` (`(start, end)` positions, in order) of `tokens` alone on `blocks` and ring
/// `ring`; the logit
/// rows of the positions `keep` (counted from 1: position `p` is the row of token `p - 1`).
/// A chunk whose only kept position is its last asks for that row alone, one with others for
/// all of its rows.
pub fn run_chunks(
    engine: &mut dyn AnyEngine,
    blocks: &[u32],
    ring: u32,
    tokens: &[u32],
    chunks: &[(u64, u64)],
    keep: &[u64],
) -> Result<Vec<(u64, Vec<f32>)>, CaseError> {
    let vocab = engine.config().vocab;
    let mut rows = Vec::with_capacity(keep.len());
    for &(start, end) in chunks {
        let inside: Vec<u64> = keep.iter().copied().filter(|&p| p > start && p <= end).collect();
        let want = match inside.as_slice() {
            [] => Logits::None,
            [p] if *p == end => Logits::Last,
            _ => Logits::All,
        };
        let slice = tokens.get(start as usize..end as usize).ok_or(CaseError::ChunkPastStream { start, end, len: tokens.len() })?;
        let item = StepItem { blocks, start_pos: start as u32, tokens: slice, logits: want };
        let logits = engine.step_in_rings(&[item], &[ring])?;
        for p in inside {
            let row = if want == Logits::Last { 0 } else { (p - start - 1) as usize };
            let r = logits.get(row * vocab..(row + 1) * vocab).ok_or(CaseError::ChunkLogits { start, end, got: logits.len() })?;
            rows.push((p, r.to_vec()));
        }
    }
    Ok(rows)
}

/// A stream the worker holds: its KV blocks, its ring and how many positions they hold.
struct Held {
    blocks: Vec<u32>,
    ring: u32,
    frontier: u64,
}

/// The worker's references: the streams being extended and the rows kept for later cases.
#[derive(Default)]
pub struct Streams {
    held: BTreeMap<Stream, Held>,
    rows: HashMap<(Stream, u64), Vec<f32>>,
}

impl Streams {
    /// Runs `e`'s chunks of its stream, keeping the rows it names; the tokens run.
    pub fn extend(
        &mut self,
        engine: &mut dyn AnyEngine,
        pool: &mut BlockPool,
        rings: &mut RingPool,
        e: &Extension,
    ) -> Result<u64, CaseError> {
        let Some(&(_, to)) = e.chunks.last() else { return Ok(0) };
        if !self.held.contains_key(&e.stream) {
            let ring = rings.take(1)?[0];
            self.held.insert(e.stream, Held { blocks: Vec::new(), ring, frontier: 0 });
        }
        let held = self.held.get_mut(&e.stream).expect("inserted above");
        if held.frontier != e.from {
            return Err(CaseError::StreamFrontier { stream: e.stream, held: held.frontier, from: e.from });
        }
        let need = to.div_ceil(engine.block_size() as u64).saturating_sub(held.blocks.len() as u64);
        held.blocks.extend(pool.take(need)?);
        let tokens = prompt_tokens(e.stream, to, engine.config().vocab);
        let rows = run_chunks(engine, &held.blocks, held.ring, &tokens, &e.chunks, &e.keep)?;
        held.frontier = to;
        self.rows.extend(rows.into_iter().map(|(p, r)| ((e.stream, p), r)));
        if e.done
            && let Some(h) = self.held.remove(&e.stream)
        {
            pool.give_back(h.blocks);
            rings.give_back(vec![h.ring]);
        }
        Ok(e.chunks.iter().map(|(start, end)| end - start).sum())
    }

    /// The kept logits of `stream` at position `pos`.
    pub fn row(&self, stream: Stream, pos: u64) -> Option<&[f32]> {
        self.rows.get(&(stream, pos)).map(Vec::as_slice)
    }

    pub fn release(&mut self, rows: &[(Stream, u64)]) {
        for r in rows {
            self.rows.remove(r);
        }
    }

    /// Drops every stream and row (after a failed case: its KV may be half written).
    pub fn clear(&mut self, pool: &mut BlockPool, rings: &mut RingPool) {
        for (_, h) in std::mem::take(&mut self.held) {
            pool.give_back(h.blocks);
            rings.give_back(vec![h.ring]);
        }
        self.rows.clear();
    }

    pub fn kept_rows(&self) -> usize {
        self.rows.len()
    }
}

/// Runs the case of `req` on `engine`, drawing block tables from `pool` and a ring per sequence
/// from `rings` (returned afterwards). After an error the streams are dropped: the parent's plan
/// starts them again.
pub fn run_case(
    engine: &mut dyn AnyEngine,
    pool: &mut BlockPool,
    rings: &mut RingPool,
    streams: &mut Streams,
    req: &CaseRequest,
) -> ModelOutcome {
    let case = &req.case;
    let seqs = case.sequences();
    let mut tables = Vec::with_capacity(seqs.len());
    let (seq_rings, mut out) = match rings.take(seqs.len() as u64) {
        Ok(r) => (r, None),
        Err(e) => (Vec::new(), Some(ModelOutcome::Error { error: e.to_string() })),
    };
    for s in seqs.iter().filter(|_| out.is_none()) {
        match pool.take(s.len().div_ceil(engine.block_size() as u64)) {
            Ok(t) => tables.push(t),
            Err(e) => {
                out = Some(ModelOutcome::Error { error: e.to_string() });
                break;
            }
        }
    }
    let out = out.unwrap_or_else(|| {
        run_with(engine, pool, rings, streams, req, &seqs, &tables, &seq_rings)
            .unwrap_or_else(|e| ModelOutcome::Error { error: e.to_string() })
    });
    tables.into_iter().rev().for_each(|t| pool.give_back(t));
    rings.give_back(seq_rings);
    match out {
        ModelOutcome::Error { .. } => streams.clear(pool, rings),
        _ => streams.release(&req.reference.release),
    }
    out
}

#[allow(clippy::too_many_arguments)]
fn run_with(
    engine: &mut dyn AnyEngine,
    pool: &mut BlockPool,
    rings: &mut RingPool,
    streams: &mut Streams,
    req: &CaseRequest,
    seqs: &[SeqPlan],
    tables: &[Vec<u32>],
    seq_rings: &[u32],
) -> Result<ModelOutcome, CaseError> {
    let case = &req.case;
    let vocab = engine.config().vocab;
    let tokens: Vec<Vec<u32>> = seqs.iter().enumerate().map(|(i, s)| prompt_tokens(i as u64, s.len(), vocab)).collect();
    // The decode sequences' prompts, prefilled together: their KV is in the cache when the step
    // under test decodes. No setup step has more rows than the case's count, so a failure that
    // starts at some row count is never charged to a smaller count.
    let (setup, setup_rings): (Vec<StepItem>, Vec<u32>) = seqs
        .iter()
        .zip(&tokens)
        .zip(tables)
        .zip(seq_rings)
        .filter(|(((s, _), _), _)| s.cached > 0)
        .map(|(((s, t), blocks), &ring)| (StepItem { blocks, start_pos: 0, tokens: &t[..s.cached as usize], logits: Logits::None }, ring))
        .unzip();
    let per_step = (case.tokens / seqs.iter().map(|s| s.cached).max().unwrap_or(1).max(1)).max(1) as usize;
    for (group, group_rings) in setup.chunks(per_step).zip(setup_rings.chunks(per_step)) {
        engine.step_in_rings(group, group_rings)?;
    }
    let items: Vec<StepItem> = seqs
        .iter()
        .zip(&tokens)
        .zip(tables)
        .map(|((s, t), blocks)| StepItem { blocks, start_pos: s.cached as u32, tokens: &t[s.cached as usize..], logits: Logits::Last })
        .collect();
    let t0 = Instant::now();
    let step = engine.step_in_rings(&items, seq_rings)?;
    let step_ms = t0.elapsed().as_secs_f64() * 1e3;
    // The references: each stream the case reads extended alone in chunks (on its own blocks
    // and ring, nothing of the step's), then each sequence's row read from them. A sequence whose
    // row was not kept is computed again from position 0 on its own blocks and ring, which it
    // rewrites before reading them (a chunk stores its K/V, then attends).
    let t1 = Instant::now();
    let mut reference_tokens = 0;
    for e in &req.reference.extend {
        reference_tokens += streams.extend(engine, pool, rings, e)?;
    }
    let mut refs = Vec::with_capacity(step.len());
    for (i, (((s, t), blocks), &ring)) in seqs.iter().zip(&tokens).zip(tables).zip(seq_rings).enumerate() {
        match streams.row(i as u64, s.len()) {
            Some(row) => refs.extend_from_slice(row),
            None => {
                refs.extend(reference(engine, blocks, ring, t, REFERENCE_CHUNK as usize)?);
                reference_tokens += s.len();
            }
        }
    }
    let reference_ms = t1.elapsed().as_secs_f64() * 1e3;
    if refs.iter().any(|x| !x.is_finite()) {
        return Err(CaseError::NonFiniteReference);
    }
    let d = parity::compare(&step, &refs, vocab).ok_or(CaseError::LogitCount { step: step.len(), refs: refs.len(), vocab })?;
    Ok(ModelOutcome::Compared {
        max_err: d.max_rel_err,
        worst_seq: d.worst_row as u64,
        non_finite_rows: d.non_finite_rows as u64,
        argmax_mismatches: d.argmax_mismatches as u64,
        compared: step.len() as u64,
        step_ms,
        reference_tokens,
        reference_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::qualify::cases::{Composition, DECODE_PROMPT, TOLERANCE, WORKER_RINGS, pool_blocks};
    use crate::qualify::plan::{Planner, case_needs};

    #[test]
    fn the_pool_hands_out_descending_tables_and_refuses_a_shortfall() {
        let mut p = BlockPool::new(10);
        let a = p.take(3).unwrap();
        assert_eq!(a, vec![9, 8, 7]);
        let b = p.take(7).unwrap();
        assert_eq!(b.len(), 7);
        let e = p.take(1).unwrap_err();
        assert!(matches!(e, CaseError::PoolShort { need: 1, free: 0 }), "{e:?}");
        assert_eq!(e.to_string(), "the case needs 1 more KV blocks, the pool has 0 free");
        assert!(matches!(p.take(u64::MAX), Err(CaseError::PoolShort { need: u64::MAX, free: 0 })));
        p.give_back(b);
        p.give_back(a);
        assert_eq!(p.take(10).unwrap().len(), 10);
    }

    #[test]
    fn prompts_are_deterministic_prefix_stable_streams_in_the_vocabulary() {
        let a = prompt_tokens(1, 100, 2000);
        assert_eq!(a, prompt_tokens(1, 100, 2000));
        assert_eq!(a, prompt_tokens(1, 300, 2000)[..100], "a shorter prompt is a prefix of a longer one");
        assert_ne!(a, prompt_tokens(2, 100, 2000));
        assert_ne!(prompt_tokens(0, 100, 2000), prompt_tokens(1, 100, 2000));
        assert!(a.iter().all(|&t| t < 2000));
        assert!(a.iter().collect::<std::collections::BTreeSet<_>>().len() > 50);
    }

    fn tiny_engine(context: usize) -> (tempfile::TempDir, Box<dyn AnyEngine>) {
        use crate::synth::{Preset, SynthSpec};
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("tiny.gguf");
        crate::synth::generate(&SynthSpec::from_preset(Preset::Tiny), &model, |_, _| {}).unwrap();
        let opts = crate::EngineOptions {
            context,
            slots: 8,
            prefill_chunk: 256,
            block_size: 0,
            full_window_kv: false,
            rings: WORKER_RINGS as usize,
        };
        let engine = crate::open(&model, crate::BackendKind::Cpu, opts).unwrap();
        (dir, engine)
    }

    fn case(tokens: u64, composition: Composition) -> ModelCase {
        let batch = brink_kernels::thresholds::compositions(tokens)
            .into_iter()
            .find(|b| {
                b.len()
                    == match composition {
                        Composition::Single => 1,
                        Composition::FourSeqs => 4,
                        Composition::MixedDecode => 9,
                    }
            })
            .unwrap();
        ModelCase { id: format!("{}/t{tokens}", composition.kernel()), composition, tokens, batch, reasons: vec![] }
    }

    /// Two mixed cases on the tiny model (CPU): both compare equal within the tolerance, and
    /// the eight decode sequences' references are computed once, for the first.
    #[test]
    fn mixed_cases_reuse_the_decode_references() {
        let (_dir, mut engine) = tiny_engine(256);
        let cases = vec![case(12, Composition::MixedDecode), case(40, Composition::MixedDecode)];
        let mut planner = Planner::new(&cases, usize::MAX);
        let mut pool = BlockPool::new(pool_blocks(64, engine.block_size() as u64) as u32);
        let mut rings = RingPool::new(WORKER_RINGS as u32);
        let mut streams = Streams::default();
        let mut spent = Vec::new();
        for (i, c) in cases.iter().enumerate() {
            assert_eq!(c.sequences()[1].cached, DECODE_PROMPT);
            let req = CaseRequest { case: c.clone(), reference: planner.work(i) };
            match run_case(engine.as_mut(), &mut pool, &mut rings, &mut streams, &req) {
                ModelOutcome::Compared { max_err, compared, non_finite_rows, reference_tokens, .. } => {
                    assert!(max_err <= TOLERANCE && non_finite_rows == 0, "{}: {max_err}", c.id);
                    assert_eq!(compared, 9 * engine.config().vocab as u64);
                    assert_eq!(reference_tokens, req.reference.tokens(c), "{}", c.id);
                    spent.push(reference_tokens);
                }
                other => panic!("{}: {other:?}", c.id),
            }
        }
        // t12: stream 0 to 4 and the eight decode streams to 6; t40: stream 0 from 4 to 32 alone.
        assert_eq!(spent, vec![4 + 8 * (DECODE_PROMPT + 1), 28]);
        assert_eq!(streams.kept_rows(), 0, "every row released after its last reader");
        assert!(pool.take(pool_blocks(64, engine.block_size() as u64)).is_ok(), "every block back in the pool");
    }

    /// The rows the shared streams give each case are bit-identical to computing that case's
    /// sequences alone on fresh blocks with the same chunks, and within rounding of computing
    /// them alone in plain reference chunks; for single, four-sequence and mixed cases at
    /// counts that are not chunk multiples, with rows kept across cases and a worker lost.
    #[test]
    fn shared_streams_give_each_case_the_rows_computed_alone() {
        let (_dir, mut engine) = tiny_engine(512);
        let bs = engine.block_size() as u64;
        let vocab = engine.config().vocab;
        let mut cases = Vec::new();
        for t in [1u64, 3, 4, 9, 13, 17, 40, 129, 131, 200, 260] {
            cases.push(case(t, Composition::Single));
            if t >= 4 {
                cases.push(case(t, Composition::FourSeqs));
            }
            if t >= 9 {
                cases.push(case(t, Composition::MixedDecode));
            }
        }
        let mut planner = Planner::new(&cases, usize::MAX);
        let mut pool = BlockPool::new((pool_blocks(260, bs) + 64) as u32);
        let mut rings = RingPool::new(WORKER_RINGS as u32);
        let mut streams = Streams::default();
        // Every extension run on each stream since the worker last lost its streams.
        let mut history: BTreeMap<Stream, Vec<Extension>> = BTreeMap::new();
        let mut checked = 0;
        for (i, c) in cases.iter().enumerate() {
            if c.id == "model/single/t129" {
                // As after a killed worker: streams start again from position 0.
                planner.lost();
                streams.clear(&mut pool, &mut rings);
                history.clear();
            }
            let work = planner.work(i);
            for e in &work.extend {
                streams.extend(engine.as_mut(), &mut pool, &mut rings, e).unwrap();
                history.entry(e.stream).or_default().push(e.clone());
            }
            for (seq, &(stream, pos)) in case_needs(c).iter().enumerate() {
                if work.alone.contains(&(seq as u64)) {
                    continue;
                }
                let shared = streams.row(stream, pos).unwrap_or_else(|| panic!("{} sequence {seq}: no row", c.id)).to_vec();
                let tokens = prompt_tokens(stream, pos, vocab);
                // Alone, on fresh blocks: the stream's chunks up to the extension that kept the row.
                let fresh = pool.take(history[&stream].last().unwrap().chunks.last().unwrap().1.div_ceil(bs)).unwrap();
                let ring = rings.take(1).unwrap();
                let mut alone = None;
                for e in &history[&stream] {
                    let all = prompt_tokens(stream, e.chunks.last().unwrap().1, vocab);
                    let rows = run_chunks(engine.as_mut(), &fresh, ring[0], &all, &e.chunks, &e.keep).unwrap();
                    if let Some((_, r)) = rows.into_iter().find(|(p, _)| *p == pos) {
                        alone = Some(r);
                        break;
                    }
                }
                let alone = alone.unwrap_or_else(|| panic!("{} sequence {seq}: row {pos} never kept", c.id));
                assert!(shared.iter().zip(&alone).all(|(a, b)| a.to_bits() == b.to_bits()), "{} sequence {seq}: not bit-identical", c.id);
                // The plain reference chunking of each case alone: the CPU backend's rows do not
                // depend on the chunking at these sizes, so it is bit-identical too.
                let plain = reference(engine.as_mut(), &fresh, ring[0], &tokens, REFERENCE_CHUNK as usize).unwrap();
                assert!(plain.iter().zip(&shared).all(|(a, b)| a.to_bits() == b.to_bits()), "{} sequence {seq}: plain chunks differ", c.id);
                pool.give_back(fresh);
                rings.give_back(ring);
                checked += 1;
            }
            streams.release(&work.release);
        }
        assert!(checked >= 100, "{checked} rows checked");
        assert_eq!(streams.kept_rows(), 0);
    }

    #[test]
    fn the_ring_pool_hands_out_distinct_rings_and_refuses_a_shortfall() {
        let mut r = RingPool::new(4);
        let a = r.take(3).unwrap();
        assert_eq!(a, vec![3, 2, 1], "from the top down, none alike");
        let e = r.take(2).unwrap_err();
        assert!(matches!(e, CaseError::RingsShort { need: 2, free: 1 }), "{e:?}");
        assert!(e.to_string().contains("needs 2 more KV rings") && e.to_string().contains("1 free"), "{e}");
        r.give_back(a);
        let all = r.take(4).unwrap();
        assert_eq!(all.iter().collect::<std::collections::BTreeSet<_>>().len(), 4);
        assert_eq!(r.free(), 0);
    }

    /// A held stream keeps its ring with its blocks (its windowed layers' KV is there) until its
    /// last extension or a clear; a case takes one ring per sequence and gives them back.
    #[test]
    fn streams_keep_their_rings_while_held_and_cases_give_theirs_back() {
        let (_dir, mut engine) = tiny_engine(256);
        let mut pool = BlockPool::new(64);
        let mut rings = RingPool::new(4);
        let mut streams = Streams::default();
        let e0 = Extension { stream: 0, from: 0, chunks: vec![(0, 8)], keep: vec![8], done: false };
        streams.extend(engine.as_mut(), &mut pool, &mut rings, &e0).unwrap();
        assert_eq!(rings.free(), 3, "stream 0 holds a ring");
        let e1 = Extension { stream: 1, from: 0, chunks: vec![(0, 4)], keep: vec![], done: true };
        streams.extend(engine.as_mut(), &mut pool, &mut rings, &e1).unwrap();
        assert_eq!(rings.free(), 3, "stream 1 gave its ring back with its blocks");
        let e0b = Extension { stream: 0, from: 8, chunks: vec![(0, 12)], keep: vec![12], done: false };
        streams.extend(engine.as_mut(), &mut pool, &mut rings, &e0b).unwrap();
        assert_eq!(rings.free(), 3, "stream 0 extended in the ring it holds");
        let req = CaseRequest { case: case(8, Composition::FourSeqs), reference: ReferenceWork::default() };
        assert!(matches!(run_case(engine.as_mut(), &mut pool, &mut rings, &mut streams, &req), ModelOutcome::Error { .. }));
        assert_eq!(rings.free(), 4, "a case short of rings fails and drops the streams with their rings, as any failed case");
        let req = CaseRequest { case: case(3, Composition::Single), reference: ReferenceWork::alone(&case(3, Composition::Single)) };
        assert!(matches!(run_case(engine.as_mut(), &mut pool, &mut rings, &mut streams, &req), ModelOutcome::Compared { .. }));
        assert_eq!(rings.free(), 4, "the case's ring back");
        streams.extend(engine.as_mut(), &mut pool, &mut rings, &e0).unwrap();
        assert_eq!(rings.free(), 3);
        streams.clear(&mut pool, &mut rings);
        assert_eq!(rings.free(), 4);
    }

    /// Negative control: a ring pool misused so that it hands one ring to two sequences of a
    /// step (a ring given back twice) is caught by the engine on the window-only layout, and the
    /// case fails with the reason instead of mixing two sequences' windowed KV.
    #[test]
    fn a_ring_handed_to_two_sequences_fails_the_case() {
        use crate::synth::gpt_oss::{self, GptOssSpec};
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("gpt-oss-tiny.gguf");
        gpt_oss::generate(&GptOssSpec::from_preset(crate::synth::GptOssPreset::Tiny), &model, |_, _| {}).unwrap();
        let opts = crate::EngineOptions { context: 512, slots: 2, prefill_chunk: 128, block_size: 0, full_window_kv: false, rings: 4 };
        let mut engine = crate::open(&model, crate::BackendKind::Cpu, opts).unwrap();
        assert!(engine.window_ring().is_some());
        let mut pool = BlockPool::new(64);
        let mut rings = RingPool::new(3);
        rings.give_back(vec![2]);
        let c = case(140, Composition::FourSeqs);
        let req = CaseRequest { case: c.clone(), reference: ReferenceWork::alone(&c) };
        let ModelOutcome::Error { error } = run_case(engine.as_mut(), &mut pool, &mut rings, &mut Streams::default(), &req) else {
            panic!("a shared ring ran")
        };
        assert!(error.contains("share the ring 2"), "{error}");
        let mut rings = RingPool::new(4);
        assert!(matches!(run_case(engine.as_mut(), &mut pool, &mut rings, &mut Streams::default(), &req), ModelOutcome::Compared { .. }));
    }
}
