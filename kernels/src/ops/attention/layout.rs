//! The batches the self-test runs attention on: how `tokens` rows become chunks.
//!
//! A layout expands into [`Part`]s (runs of like chunks, in consecutive sequences and rows),
//! from which both the chunk list ([`chunks`]) and, in closed form, the counts the launches
//! depend on ([`counts`]) follow: the plan property tests walk every count to 2^20, where listing
//! the chunks of each would be quadratic.
//!
//! Every sequence gets a block table as long as it needs, the tables one after another in one
//! flat table whose blocks are handed out from the top of the cache down ([`scrambled_tables`]):
//! no sequence's blocks are ascending (a kernel that ignored the table would read other
//! positions' keys), the first sequence's first block is the highest block of the cache (read
//! by every layout: key 0 is visible to every query) and the last sequence ends in block 0.

use serde::{Deserialize, Serialize};

use super::{BatchCounts, Chunk, DecodeRoute, window_decode_splits};

/// How a batch of `tokens` rows is made (`context`: positions per slot of the test cache).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Layout {
    /// `sequences` prompts of near-equal length, each prefilled from position 0 in its own slot
    /// (more prompts when a share would pass the context).
    Prompts { sequences: u32 },
    /// Prompts of `len` tokens, the last one shorter: many short prompts in one batch.
    Runs { len: u32 },
    /// One chunk continuing a sequence that holds `cached` positions (chunked prefill).
    Continue { cached: u32 },
    /// Chunks that end their sequence at the last position of the context.
    ContextEnd,
    /// Every token a decode step of its own sequence, at [`decode_position`]s.
    Decode,
    /// A prompt of `tokens − 8` beside 8 decode steps of other sequences (fewer below 9 tokens).
    Mixed,
}

/// Runs of like chunks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// `count` chunks of `n_tokens` rows at positions `start..`.
    Same { count: u64, n_tokens: u64, start: u64 },
    /// `count` decode steps at [`decode_position`]`(i, count, context, window)`.
    Decodes { count: u64, context: u32, window: u32 },
}

/// Positions a run of decode steps cycles through (clamped to the context), so that split
/// counts of 1, 2 and 3 spans with 1 or all keys in the last one, and long contexts, all occur;
/// the run's last step is at the last position of the context (the highest slot reads the
/// farthest cache offset). With a window w, then steps that see w − 1, w and w + 1 keys (and
/// 2w ± 1: past the first window), whose window starts on a span's last and first key, and one
/// far past.
pub fn decode_table(context: u32, window: u32) -> Vec<u32> {
    let s = super::DECODE_SPAN as u32;
    let mut t = vec![0, 1, s - 1, s, s + 1, 2 * s - 1, 2 * s, context / 2, context.saturating_sub(2)];
    if window > 0 {
        let w = window;
        let edges = [w.saturating_sub(2), w - 1, w, w + s - 2, w + s - 1, 2 * w - 2, 2 * w - 1, 2 * w, 8 * w + 37];
        t.extend(edges);
    }
    t.into_iter().map(|p| p.min(context.saturating_sub(1))).collect()
}

/// Position of step `i` of a run of `count` decode steps.
pub fn decode_position(i: u64, count: u64, context: u32, window: u32) -> u32 {
    if i + 1 == count {
        return context.saturating_sub(1);
    }
    let t = decode_table(context, window);
    t[(i % t.len() as u64) as usize]
}

/// `Σ f(position)` over a run of `count` decode steps, in closed form over the cycle of
/// [`decode_table`] (the last step apart).
fn decode_run_sum(count: u64, context: u32, window: u32, f: impl Fn(u32) -> u64) -> u64 {
    if count == 0 {
        return 0;
    }
    let t = decode_table(context, window);
    let (cycled, period) = (count - 1, t.len() as u64);
    let per_cycle: u64 = t.iter().map(|&p| f(p)).sum();
    let rest: u64 = t[..(cycled % period) as usize].iter().map(|&p| f(p)).sum();
    cycled / period * per_cycle + rest + f(context.saturating_sub(1))
}

/// `tokens` over `n` chunks of near-equal length (the longer ones last), each starting at
/// `start(len)`.
fn balanced(tokens: u64, n: u64, start: impl Fn(u64) -> u64) -> Vec<Part> {
    let (len, longer) = (tokens / n, tokens % n);
    [(n - longer, len), (longer, len + 1)]
        .into_iter()
        .filter(|&(count, n_tokens)| count > 0 && n_tokens > 0)
        .map(|(count, n_tokens)| Part::Same { count, n_tokens, start: start(n_tokens) })
        .collect()
}

/// Prompts from position 0: at least `sequences`, at most `tokens`, none past `context`.
fn prompts(tokens: u64, sequences: u64, context: u32) -> Vec<Part> {
    let n = sequences.max(tokens.div_ceil(context.max(1) as u64)).clamp(1, tokens.max(1));
    balanced(tokens, n, |_| 0)
}

impl Layout {
    /// The parts of a batch of `tokens` in slots of `context` positions, under an attention
    /// `window` (0: none; it picks the decode steps' positions).
    pub fn parts(&self, tokens: u64, context: u32, window: u32) -> Vec<Part> {
        let ctx = context.max(1) as u64;
        match *self {
            Layout::Prompts { sequences } => prompts(tokens, sequences as u64, context),
            Layout::Runs { len } => {
                let len = len.max(1) as u64;
                let mut v = vec![Part::Same { count: tokens / len, n_tokens: len, start: 0 }];
                v.push(Part::Same { count: 1, n_tokens: tokens % len, start: 0 });
                v.retain(|p| matches!(p, Part::Same { count, n_tokens, .. } if *count > 0 && *n_tokens > 0));
                v
            }
            Layout::Continue { cached } => vec![Part::Same { count: 1, n_tokens: tokens, start: cached as u64 }],
            Layout::ContextEnd => balanced(tokens, tokens.div_ceil(ctx), |len| ctx - len),
            Layout::Decode => vec![Part::Decodes { count: tokens, context, window }],
            Layout::Mixed => {
                let steps = 8.min(tokens.saturating_sub(1));
                let mut v = prompts(tokens - steps, 1, context);
                if steps > 0 {
                    v.push(Part::Decodes { count: steps, context, window });
                }
                v
            }
        }
    }
}

/// Chunks (slots) in the parts.
pub fn slots(parts: &[Part]) -> u64 {
    parts
        .iter()
        .map(|p| match *p {
            Part::Same { count, .. } | Part::Decodes { count, .. } => count,
        })
        .sum()
}

/// Positions per slot the parts need: one past the last position any chunk reaches.
pub fn max_ctx(parts: &[Part]) -> u64 {
    parts
        .iter()
        .map(|p| match *p {
            Part::Same { n_tokens, start, .. } => start + n_tokens,
            Part::Decodes { context, .. } => context as u64,
        })
        .max()
        .unwrap_or(0)
}

/// Rows of history the parts need in the cache: the positions before each chunk.
pub fn history_rows(parts: &[Part]) -> u64 {
    parts
        .iter()
        .map(|p| match *p {
            Part::Same { count, start, .. } => count * start,
            Part::Decodes { count, context, window } => decode_run_sum(count, context, window, |p| p as u64),
        })
        .sum()
}

/// The counts [`super::BatchPlan::new`] would find for [`chunks`]`(parts)` under `window`, in closed form.
pub fn counts(parts: &[Part], tile_rows: u64, route: DecodeRoute, window: u32) -> BatchCounts {
    let mut n = BatchCounts::default();
    for p in parts {
        match *p {
            Part::Same { count, n_tokens, start } => {
                n.rows += count * n_tokens;
                if n_tokens == 1 && route == DecodeRoute::Split {
                    n.decode_chunks += count;
                    n.decode_splits += count * window_decode_splits(start as u32, window);
                } else {
                    n.prefill_tiles += count * n_tokens.div_ceil(tile_rows);
                }
            }
            Part::Decodes { count, context, window: w } => {
                n.rows += count;
                if route == DecodeRoute::Split {
                    n.decode_chunks += count;
                    n.decode_splits += decode_run_sum(count, context, w, |p| window_decode_splits(p, window));
                } else {
                    n.prefill_tiles += count;
                }
            }
        }
    }
    n
}

/// Blocks of `block_size` positions a sequence of `end` positions needs.
fn blocks_for(end: u64, block_size: u32) -> u64 {
    end.div_ceil(block_size.max(1) as u64)
}

/// Blocks of every sequence's table together (each as long as its sequence needs), in closed form.
pub fn total_blocks(parts: &[Part], block_size: u32) -> u64 {
    parts
        .iter()
        .map(|p| match *p {
            Part::Same { count, n_tokens, start } => count * blocks_for(start + n_tokens, block_size),
            Part::Decodes { count, context, window } => decode_run_sum(count, context, window, |p| blocks_for(p as u64 + 1, block_size)),
        })
        .sum()
}

/// The flat block table of a cache of `blocks` blocks, handed out from the top down: entry i
/// is block `blocks − 1 − i`. Callers keep the count within i32.
pub fn scrambled_tables(blocks: u64) -> Vec<u32> {
    (0..blocks).rev().map(|b| b as u32).collect()
}

/// Rows of the cache up to and including the farthest one any chunk reads: the first
/// sequence's first block is the cache's last one ([`scrambled_tables`]), read up to the first
/// chunk's end.
pub fn farthest_row(parts: &[Part], block_size: u32) -> u64 {
    let bs = block_size.max(1) as u64;
    let first_end = match parts.first() {
        Some(Part::Same { n_tokens, start, .. }) => start + n_tokens,
        Some(Part::Decodes { count, context, window }) => decode_position(0, *count, *context, *window) as u64 + 1,
        None => return 0,
    };
    total_blocks(parts, block_size).saturating_sub(1) * bs + first_end.min(bs)
}

/// The chunks of the parts, in consecutive rows, one sequence each, whose block tables follow
/// one another in the flat table (each as long as its sequence needs). Callers keep every index
/// within i32 (the plan checks the resulting chunks).
pub fn chunks(parts: &[Part], block_size: u32) -> Vec<Chunk> {
    let mut v = Vec::new();
    let (mut table, mut row) = (0u64, 0u32);
    let mut push = |start: u32, n: u32| {
        v.push(Chunk { table: table as u32, start_pos: start, n_tokens: n, first_row: row });
        table += blocks_for(start as u64 + n as u64, block_size);
        row += n;
    };
    for p in parts {
        match *p {
            Part::Same { count, n_tokens, start } => (0..count).for_each(|_| push(start as u32, n_tokens as u32)),
            Part::Decodes { count, context, window } => (0..count).for_each(|i| push(decode_position(i, count, context, window), 1)),
        }
    }
    v
}

/// One of every layout the self-test builds, for the tests of the plans over them.
#[cfg(test)]
pub(crate) const LAYOUTS: [Layout; 8] = [
    Layout::Prompts { sequences: 1 },
    Layout::Prompts { sequences: 4 },
    Layout::Runs { len: 61 },
    Layout::Continue { cached: 4133 },
    Layout::Continue { cached: 0 },
    Layout::ContextEnd,
    Layout::Decode,
    Layout::Mixed,
];

#[cfg(test)]
mod tests {
    use super::super::{AttentionSpec, BatchPlan};
    use super::*;

    /// The closed-form counts are what the real plan of the expanded chunks finds.
    #[test]
    fn closed_form_counts_match_the_plan_of_the_chunks() {
        for (layout, window) in LAYOUTS.iter().flat_map(|l| [(*l, 0u32), (*l, 128), (*l, 5)]) {
            for context in [300u32, 40_960] {
                for tokens in (1..=140).chain([255, 256, 257, 599, 600, 601, 4095, 8193]) {
                    let parts = layout.parts(tokens, context, window);
                    let c = chunks(&parts, 16);
                    assert_eq!(c.len() as u64, slots(&parts));
                    assert_eq!(c.iter().map(|c| c.n_tokens as u64).sum::<u64>(), tokens, "{layout:?} {tokens}");
                    let tables = scrambled_tables(total_blocks(&parts, 16));
                    let last = c.last().unwrap();
                    assert_eq!(last.table as u64 + last.end().div_ceil(16), tables.len() as u64, "the tables fill the cache");
                    let spec = AttentionSpec::new(8, 2, 128, tables.len() as u32, 16).with_window(window);
                    for route in [DecodeRoute::Split, DecodeRoute::Prefill] {
                        let plan = BatchPlan::new(&c, &tables, tokens, &spec, route).unwrap_or_else(|e| panic!("{layout:?} {tokens}: {e}"));
                        let what = format!("{layout:?} window {window} context {context} tokens {tokens} {route:?}");
                        assert_eq!(counts(&parts, 64, route, window), plan.counts(), "{what}");
                    }
                }
            }
        }
    }

    /// The tables are a permutation of the cache's blocks, no sequence's blocks are ascending
    /// and contiguous, and the highest block is read: it is the first block of the first sequence.
    #[test]
    fn tables_are_scrambled_and_reach_the_highest_block() {
        let t = scrambled_tables(5);
        assert_eq!(t, vec![4, 3, 2, 1, 0]);
        // Sequences of 20, 16 and 1 positions: tables of 2, 1 and 1 blocks from entries 0, 2, 3.
        let parts = [
            Part::Same { count: 1, n_tokens: 20, start: 0 },
            Part::Same { count: 1, n_tokens: 6, start: 10 },
            Part::Decodes { count: 1, context: 1, window: 0 },
        ];
        assert_eq!(chunks(&parts, 16).iter().map(|c| c.table).collect::<Vec<_>>(), vec![0, 2, 3]);
        assert_eq!(total_blocks(&parts, 16), 4);
        // 3 prompts of 20 positions in blocks of 16: 6 blocks; block 5 is read to its row 15.
        let parts = Layout::Runs { len: 20 }.parts(60, 40_960, 0);
        assert_eq!(farthest_row(&parts, 16), 5 * 16 + 16);
        // Decode steps: the first is at position 0, so the top block is read at its row 0 only.
        // Decode steps at 0, 1, 63 (a span less one) and 4095: 1 + 1 + 4 + 256 blocks; the first
        // step reads the top block at its row 0 only.
        let parts = Layout::Decode.parts(4, 4096, 0);
        assert_eq!(total_blocks(&parts, 16), 262);
        assert_eq!(farthest_row(&parts, 16), 261 * 16 + 1);
    }

    #[test]
    fn layouts_build_the_batches_they_name() {
        let chunks = |parts: &[Part]| chunks(parts, 16).into_iter().map(|c| Chunk { table: 0, ..c }).collect::<Vec<_>>();
        let c = chunks(&Layout::Prompts { sequences: 4 }.parts(10, 40_960, 0));
        assert_eq!(c.iter().map(|c| c.n_tokens).collect::<Vec<_>>(), vec![2, 2, 3, 3]);
        assert!(c.iter().all(|c| c.start_pos == 0));
        // A single prompt longer than the context becomes several.
        let c = chunks(&Layout::Prompts { sequences: 1 }.parts(701, 300, 0));
        assert_eq!(c.iter().map(|c| c.n_tokens).collect::<Vec<_>>(), vec![233, 234, 234]);
        let c = chunks(&Layout::ContextEnd.parts(64, 40_960, 0));
        assert_eq!((c[0].start_pos, c[0].end()), (40_896, 40_960));
        let c = chunks(&Layout::Continue { cached: 4133 }.parts(5, 40_960, 0));
        assert_eq!(c, vec![Chunk { table: 0, start_pos: 4133, n_tokens: 5, first_row: 0 }]);
        let c = chunks(&Layout::Mixed.parts(20, 40_960, 0));
        assert_eq!(c.len(), 9);
        assert_eq!((c[0].n_tokens, c[1].n_tokens, c[8].start_pos, c[8].first_row), (12, 1, 40_959, 19));
        let c = chunks(&Layout::Runs { len: 61 }.parts(130, 40_960, 0));
        assert_eq!(c.iter().map(|c| c.n_tokens).collect::<Vec<_>>(), vec![61, 61, 8]);
    }

    #[test]
    fn decode_positions_cover_span_edges_and_end_at_the_context() {
        let p: Vec<u32> = (0..10).map(|i| decode_position(i, 10, 40_960, 0)).collect();
        assert_eq!(p, vec![0, 1, 63, 64, 65, 127, 128, 20_480, 40_958, 40_959]);
        assert_eq!(decode_position(0, 1, 40_960, 0), 40_959);
        assert!((0..5).all(|i| decode_position(i, 5, 3, 0) < 3));
        // A window of 128 adds the steps seeing 127, 128 and 129 keys, 255 ..= 257, those whose
        // window starts on a span's last (63) and first (64) key, and one far past.
        let p: Vec<u32> = (0..19).map(|i| decode_position(i, 19, 40_960, 128)).collect();
        assert_eq!(p[..9], [0, 1, 63, 64, 65, 127, 128, 20_480, 40_958]);
        assert_eq!(p[9..], [126, 127, 128, 190, 191, 254, 255, 256, 1061, 40_959]);
        assert_eq!([190, 191].map(|p| super::super::first_key(p, 128)), [63, 64]);
    }
}
