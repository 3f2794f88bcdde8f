//! CUDA graphs for decode steps. A decode step is ~28 small kernels a layer; launched one by
//! one, the host's launch time and the gaps between kernels cost as much as the kernels. A
//! step whose chunks are all single tokens is captured once into a graph per [`GraphKey`] and
//! then replayed with one launch: its inputs (ids, positions, cache rows, the attention's
//! index arrays) are written into the same device buffers before the replay, the kernels and
//! their plans are the ones the eager step launched (captured through the same checked
//! launches), and the logits come from the buffer the graph writes.
//!
//! The key is the batch's rows and its decode splits rounded up to a bucket
//! ([`splits_bucket`]): the attention's grid is padded to the bucket with idle blocks, so one
//! graph serves every step until the contexts grow past it. A key is captured the second time
//! it is seen (the first, eager, step sizes the pools and scratch so the capture allocates
//! nothing), and a graph is replayed only while no buffer has been freed since its capture
//! (`AllocCounter::frees`): a freed buffer's address may be reused, and the graph still holds it.
//!
//! Graphs are off with `BRINK_SYNC_LAUNCHES=1` (every launch synchronised, to attribute a fault)
//! or `BRINK_CUDA_GRAPHS=0`, under test fault injection, and where device progress needs host
//! callbacks; any failure while capturing or replaying turns them off for the backend and the
//! step runs again eagerly.

use std::collections::HashMap;

use brink_kernels::cuda::StepGraph;
use brink_kernels::ops::attention::{DeviceBatch, decode_splits};

use super::buffers::CudaAct;
use super::moe::ROUTED_GEMV_MAX_TOKENS;
use crate::backend::Batch;

/// Largest batch captured: up to here the routed experts are GEMVs, whose scratch is sized by
/// the batch alone (the GEMM path's alignment buffers are replaced as batches grow).
pub(crate) const GRAPH_MAX_ROWS: usize = ROUTED_GEMV_MAX_TOKENS;
/// Graphs kept at once; the least recently replayed goes first.
const MAX_GRAPHS: usize = 32;
/// Failed captures after which graphs are turned off for the backend.
const MAX_CAPTURE_FAILURES: u64 = 4;

/// What a decode graph is specific to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct GraphKey {
    pub rows: usize,
    /// Decode splits of the attention grid, padded ([`splits_bucket`]).
    pub splits: u64,
}

/// The splits a graph is captured for: at least 8 (512 keys of one sequence), then rounded up
/// to a multiple of a quarter of the power of two below: at most a quarter of the blocks idle,
/// and a new graph only each time the contexts grow by a quarter.
pub(crate) fn splits_bucket(splits: u64) -> u64 {
    let splits = splits.max(1);
    let floor_pow2 = 1u64 << (63 - splits.leading_zeros());
    let step = (floor_pow2 / 4).max(8);
    splits.div_ceil(step) * step
}

/// The key of `batch` when it is a decode step a graph can serve: every chunk one token, every
/// row's logits wanted, at most [`GRAPH_MAX_ROWS`] rows.
pub(crate) fn decode_key(batch: &Batch) -> Option<GraphKey> {
    let rows = batch.rows();
    let decode_only = batch.chunks.iter().all(|c| c.len == 1);
    let all_logits = batch.logit_rows.len() == rows && batch.logit_rows.iter().enumerate().all(|(i, &r)| r as usize == i);
    if rows == 0 || rows > GRAPH_MAX_ROWS || !decode_only || !all_logits {
        return None;
    }
    let splits: u64 = batch.chunks.iter().map(|c| decode_splits(c.start_pos)).sum();
    Some(GraphKey { rows, splits: splits_bucket(splits) })
}

/// How the ops of the current step run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Launched one by one.
    Eager,
    /// Launched into a capture for this key; `logits` ends it and replays it.
    Capture(GraphKey),
    /// The ops only allocate their outputs; `logits` replays graph `n`.
    Replay(usize),
}

/// A captured decode step.
pub(crate) struct Entry {
    pub key: GraphKey,
    pub graph: StepGraph,
    /// The attention's index arrays the graph reads, one set per attention spec of the model
    /// (`AttnMaps::padded_plans`' order), rewritten before each replay.
    pub attn: Vec<DeviceBatch>,
    /// The logits the graph writes, `[rows, vocab]`.
    pub out: CudaAct,
    last_used: u64,
}

/// Counts for the bench and the tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GraphStats {
    pub captured: u64,
    pub replayed: u64,
    /// Captures or replays that failed (each step ran again eagerly).
    pub failed: u64,
    /// Kernel-to-kernel edges made programmatic over all captures (`BRINK_GRAPH_OVERLAP`).
    pub programmatic_edges: u64,
}

pub(crate) struct Graphs {
    enabled: bool,
    pub mode: Mode,
    entries: Vec<Entry>,
    /// Keys seen once (captured on the second sighting).
    seen: HashMap<GraphKey, u32>,
    /// `AllocCounter::frees` when the entries were captured.
    frees: u64,
    clock: u64,
    pub stats: GraphStats,
    /// A graph failed in this step: the engine runs it again.
    retry: bool,
    /// The next step runs eagerly (the re-run of a failed one).
    eager_once: bool,
}

impl Graphs {
    /// On unless `BRINK_CUDA_GRAPHS=0` or diagnostic launches.
    pub(crate) fn new(diagnostic: bool) -> Graphs {
        let off = std::env::var("BRINK_CUDA_GRAPHS").is_ok_and(|v| v == "0");
        Graphs {
            enabled: !off && !diagnostic,
            mode: Mode::Eager,
            entries: Vec::new(),
            seen: HashMap::new(),
            frees: 0,
            clock: 0,
            stats: GraphStats::default(),
            retry: false,
            eager_once: false,
        }
    }

    pub(crate) fn enabled(&self) -> bool {
        self.enabled
    }

    /// A capture of `key` failed. Usually a buffer the step needed was not pooled yet (the
    /// eager re-run allocates it): captured again at the key's next sighting; graphs are turned
    /// off after [`MAX_CAPTURE_FAILURES`].
    pub(crate) fn capture_failed(&mut self, key: GraphKey, why: &str) {
        self.stats.failed += 1;
        self.mode = Mode::Eager;
        self.seen.insert(key, 1);
        if self.stats.failed >= MAX_CAPTURE_FAILURES {
            self.disable(&format!("{} failed captures, the last: {why}", self.stats.failed));
        }
    }

    /// Turns graphs off after a failure, dropping every graph.
    pub(crate) fn disable(&mut self, why: &str) {
        if self.enabled {
            eprintln!("brink: CUDA graphs turned off: {why}");
        }
        self.enabled = false;
        self.mode = Mode::Eager;
        self.entries.clear();
    }

    /// The step failed because of a graph: the engine should run it again, eagerly.
    pub(crate) fn retry_eagerly(&mut self) {
        self.retry = true;
        self.eager_once = true;
    }

    /// The step is answered (the engine runs it again): only its eager re-run remains.
    pub(crate) fn next_step_eager(&mut self) {
        self.retry = false;
        self.eager_once = true;
    }

    /// Whether a graph failed in this step (cleared by reading).
    pub(crate) fn take_retry(&mut self) -> bool {
        std::mem::take(&mut self.retry)
    }

    /// Whether this step must run eagerly (cleared by reading).
    pub(crate) fn take_eager_once(&mut self) -> bool {
        std::mem::take(&mut self.eager_once)
    }

    pub(crate) fn replaying(&self) -> bool {
        matches!(self.mode, Mode::Replay(_))
    }

    /// What to do with a step of `key` when `frees` buffers have been freed so far: replay an
    /// entry, capture, or run eagerly (the key's first sighting).
    pub(crate) fn choose(&mut self, key: GraphKey, frees: u64) -> Mode {
        if frees != self.frees {
            // A buffer some graph may hold was freed: none is safe to replay.
            self.entries.clear();
            self.frees = frees;
        }
        if let Some(i) = self.entries.iter().position(|e| e.key == key) {
            return Mode::Replay(i);
        }
        let seen = self.seen.entry(key).or_insert(0);
        *seen += 1;
        if *seen >= 2 { Mode::Capture(key) } else { Mode::Eager }
    }

    /// Drops entry `i` (its index arrays no longer fit the batch).
    pub(crate) fn forget(&mut self, i: usize) -> Entry {
        self.entries.swap_remove(i)
    }

    pub(crate) fn entry(&mut self, i: usize) -> &mut Entry {
        self.clock += 1;
        let e = &mut self.entries[i];
        e.last_used = self.clock;
        e
    }

    /// Keeps a captured graph, dropping the least recently used one past [`MAX_GRAPHS`];
    /// returns its index.
    pub(crate) fn insert(&mut self, key: GraphKey, graph: StepGraph, attn: Vec<DeviceBatch>, out: CudaAct) -> usize {
        if self.entries.len() >= MAX_GRAPHS {
            if let Some(old) = self.entries.iter().enumerate().min_by_key(|(_, e)| e.last_used).map(|(i, _)| i) {
                self.entries.swap_remove(old);
            }
        }
        self.clock += 1;
        self.stats.captured += 1;
        self.stats.programmatic_edges += graph.programmatic_edges as u64;
        self.entries.push(Entry { key, graph, attn, out, last_used: self.clock });
        self.entries.len() - 1
    }

    /// After a freed buffer outside the counters' view (the KV cache replaced).
    pub(crate) fn clear(&mut self) {
        self.entries.clear();
        self.seen.clear();
        self.mode = Mode::Eager;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Logits;

    #[test]
    fn buckets_are_at_least_eight_then_quarters_of_a_power_of_two() {
        let table = [
            (0, 8),
            (1, 8),
            (8, 8),
            (9, 16),
            (16, 16),
            (17, 24),
            (31, 32),
            (32, 32),
            (33, 40),
            (40, 40),
            (63, 64),
            (64, 64),
            (65, 80),
            (100, 112),
            (129, 160),
            (3000, 3072),
            (3073, 3584),
        ];
        for (splits, want) in table {
            assert_eq!(splits_bucket(splits), want, "{splits} splits");
        }
        for s in 1..5000u64 {
            let b = splits_bucket(s);
            assert!(b >= s && (b - s) * 4 <= b.max(32), "{s} -> {b}: more than a quarter idle");
        }
    }

    fn decode(positions: &[u32]) -> Batch {
        let mut b = Batch::new(16).unwrap();
        for (i, &p) in positions.iter().enumerate() {
            let blocks: Vec<u32> = (0..p / 16 + 1).map(|j| (i as u32) * 1000 + j).collect();
            b.push(&blocks, p, &[7], Logits::Last).unwrap();
        }
        b
    }

    #[test]
    fn decode_steps_get_keys_by_rows_and_bucketed_splits() {
        // 1 sequence at position 0 (1 split) and at 511 (8 splits): one bucket.
        assert_eq!(decode_key(&decode(&[0])), Some(GraphKey { rows: 1, splits: 8 }));
        assert_eq!(decode_key(&decode(&[511])), Some(GraphKey { rows: 1, splits: 8 }));
        assert_eq!(decode_key(&decode(&[512])), Some(GraphKey { rows: 1, splits: 16 }));
        // 8 sequences at 128: 3 splits each.
        assert_eq!(decode_key(&decode(&[128; 8])), Some(GraphKey { rows: 8, splits: 24 }));
    }

    #[test]
    fn prefill_partial_logits_and_large_batches_get_no_graph() {
        let mut b = Batch::new(16).unwrap();
        b.push(&[1], 0, &[7, 8], Logits::Last).unwrap();
        assert_eq!(decode_key(&b), None, "a two-token chunk");
        let mut b = Batch::new(16).unwrap();
        b.push(&[1], 3, &[7], Logits::None).unwrap();
        assert_eq!(decode_key(&b), None, "no logits wanted");
        assert_eq!(decode_key(&decode(&[5; GRAPH_MAX_ROWS + 1])), None);
        assert!(decode_key(&decode(&[5; GRAPH_MAX_ROWS])).is_some());
    }
}
