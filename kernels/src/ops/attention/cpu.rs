//! The CPU twin: causal attention with an exact two-pass softmax in f32.
//!
//! Per (row, head): q scaled by `scale · log2(e)` (one f32 product, as the kernels stage it),
//! scores `q · k` in f32 over the cache's f16 keys converted to f32, for the keys the row sees
//! (`first_key(pos, window) ..= pos`), `m = max` (then `max(m, sink)` with a sink, the sink
//! taken to log2 units by one f32 product `sink · log2(e)` as the kernels do), `p = exp2(s − m)`,
//! `l = Σ p` (then `+ exp2(sink − m)`), `o = (Σ p · v) · (1 / l)`. The kernels differ in order
//! only: their dot products are one FMA chain over the head dimension (here 8 interleaved
//! partial sums, which vectorise), and their softmax is online over key tiles (prefill, the
//! sink first) or split over spans and merged (decode, the sink in the merge).

use half::f16;
use rayon::prelude::*;

use super::{AttentionSpec, Chunk, KERNEL, chunks_unsupported, first_key, physical_row};
use crate::launch::PlanError;

/// K and V of one sequence's positions `0..n` as f32, each position `n_kv · head_dim` wide
/// (gathered through its block table: contiguous here, whatever blocks they live in).
pub(super) struct Slab {
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    /// Floats per position.
    pub width: usize,
}

impl Slab {
    /// Positions `0..n` of the sequence with block table `table` from the caches, converted in
    /// parallel. The caller has checked that the table covers them (`chunks_unsupported`).
    pub(super) fn from_cache(k_cache: &[f16], v_cache: &[f16], table: &[u32], n: u64, spec: &AttentionSpec) -> Slab {
        let width = spec.kv_width() as usize;
        let convert = |c: &[f16]| {
            let mut out = vec![0.0f32; n as usize * width];
            out.par_chunks_mut(width).enumerate().for_each(|(pos, o)| {
                if let Some(row) = physical_row(table, pos as u32, spec) {
                    let at = row as usize * width;
                    o.iter_mut().zip(&c[at..at + width]).for_each(|(o, x)| *o = x.to_f32());
                }
            });
            out
        };
        Slab { k: convert(k_cache), v: convert(v_cache), width }
    }

    pub(super) fn key(&self, pos: usize, kvh: usize, d: usize) -> &[f32] {
        &self.k[pos * self.width + kvh * d..][..d]
    }

    pub(super) fn value(&self, pos: usize, kvh: usize, d: usize) -> &[f32] {
        &self.v[pos * self.width + kvh * d..][..d]
    }
}

/// `Σ a·b` in f32 over 8 interleaved partial sums (head dims are multiples of 8).
#[inline]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    for (ca, cb) in a.chunks_exact(8).zip(b.chunks_exact(8)) {
        // Fixed-size lanes: vectorised wherever the dot is inlined (the same operations per lane).
        let (ca, cb): (&[f32; 8], &[f32; 8]) = (ca.try_into().unwrap(), cb.try_into().unwrap());
        acc = std::array::from_fn(|i| acc[i] + ca[i] * cb[i]);
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]))
}

/// A sink logit (units of `scale · q·k`) in the log2 units of the scores, as the kernels take it.
pub(super) fn sink_log2(sink: f32) -> f32 {
    sink * std::f32::consts::LOG2_E
}

/// One query head `qs` (already scaled by `q_scale`) against positions `lo..n` of kv head
/// `kvh`, with the head's sink (log2 units, [`sink_log2`]) in the softmax if there is one.
pub(super) fn attend(qs: &[f32], slab: &Slab, kvh: usize, lo: usize, n: usize, sink: Option<f32>, out: &mut [f32]) {
    let d = qs.len();
    let mut p: Vec<f32> = (lo..n).map(|pos| dot(qs, slab.key(pos, kvh, d))).collect();
    let inv = softmax_weights(&mut p, sink);
    out.fill(0.0);
    for (pos, &w) in (lo..n).zip(&p) {
        for (o, &v) in out.iter_mut().zip(slab.value(pos, kvh, d)) {
            *o += w * v;
        }
    }
    out.iter_mut().for_each(|o| *o *= inv);
}

/// Turns the scores `p` (log2 units) into unnormalised weights 2^(p - m), m their maximum with
/// the sink's, and returns 1 / their sum (the sink's weight included): the output's scale.
fn softmax_weights(p: &mut [f32], sink: Option<f32>) -> f32 {
    let mut m = p.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if let Some(s) = sink {
        m = m.max(s);
    }
    let mut l = 0.0f32;
    for s in p.iter_mut() {
        *s = (*s - m).exp2();
        l += *s;
    }
    if let Some(s) = sink {
        l += (s - m).exp2();
    }
    1.0 / l
}

/// The output row of batch row `row` (query `i` of chunk `c`), every head, from a slab of `c`'s
/// sequence (positions from the row's first key on are read), with the heads' `sinks` if any.
pub(super) fn attend_row(q_row: &[f32], slab: &Slab, c: &Chunk, i: u32, spec: &AttentionSpec, sinks: Option<&[f32]>, out: &mut [f32]) {
    let (d, group) = (spec.head_dim as usize, spec.group() as usize);
    let pos = c.start_pos + i;
    let (lo, n) = (first_key(pos, spec.window) as usize, pos as usize + 1);
    let scale = spec.q_scale();
    // Heads in parallel: one long-context row is `n · n_head · head_dim` multiply-adds, too
    // much for one core; each head's arithmetic is the same in any order.
    q_row.par_chunks_exact(d).zip(out.par_chunks_exact_mut(d)).enumerate().for_each(|(h, (q, o))| {
        let qs: Vec<f32> = q.iter().map(|x| x * scale).collect();
        attend(&qs, slab, h / group, lo, n, sinks.map(|s| sink_log2(s[h])), o);
    });
}

/// Positions per tile of [`attend_rows`]: a kv head's 64 keys (or values) of up to 256 floats
/// are at most 64 KiB, which stay in the core's cache while every row and head reads them.
const TILE_POSITIONS: usize = 64;
/// Rows per task of [`attend_rows`]: each task reads its kv head's tiles for this many rows times
/// the query heads of the group; more tasks than kv heads keep the cores busy on a few rows.
const TASK_ROWS: usize = 4;

/// The output rows of queries `is` of chunk `c` (their Q rows `q_rows`, in the same order),
/// every head, from one slab of `c`'s sequence: per row and head the arithmetic of
/// [`attend_row`] in the same order (scores, max, `exp2`, sum and weighted values position by
/// position), so bit for bit its result; but a kv head's keys and values are read once per tile
/// of [`TILE_POSITIONS`] positions for every query head of its group and up to [`TASK_ROWS`]
/// rows, not once per row and head (a row per call spent its time waiting on memory: every
/// head streamed the whole slab).
pub(super) fn attend_rows(
    q_rows: &[&[f32]],
    is: &[u32],
    slab: &Slab,
    c: &Chunk,
    spec: &AttentionSpec,
    sinks: Option<&[f32]>,
) -> Vec<Vec<f32>> {
    let (d, group, rw) = (spec.head_dim as usize, spec.group() as usize, spec.row_width() as usize);
    let scale = spec.q_scale();
    // Keys `lo..n` of each row.
    let ranges: Vec<(usize, usize)> = is
        .iter()
        .map(|&i| {
            let pos = c.start_pos + i;
            (first_key(pos, spec.window) as usize, pos as usize + 1)
        })
        .collect();
    let blocks = is.len().div_ceil(TASK_ROWS);
    // Per (kv head, block of rows): per row of the block and head of the group, its output.
    let done: Vec<Vec<Vec<f32>>> = (0..spec.kv_heads as usize * blocks)
        .into_par_iter()
        .map(|task| {
            let (kvh, rows) = (task / blocks, (task % blocks) * TASK_ROWS..((task % blocks + 1) * TASK_ROWS).min(is.len()));
            // (row, head) pairs of the task, row-major, with their keys.
            let pairs: Vec<(usize, usize, (usize, usize))> =
                rows.flat_map(|r| (kvh * group..(kvh + 1) * group).map(move |h| (r, h))).map(|(r, h)| (r, h, ranges[r])).collect();
            let (first, end) = (pairs.iter().map(|p| p.2.0).min().unwrap_or(0), pairs.iter().map(|p| p.2.1).max().unwrap_or(0));
            let tiles = (first..end).step_by(TILE_POSITIONS).map(|t| (t, (t + TILE_POSITIONS).min(end)));
            let qs: Vec<Vec<f32>> = pairs.iter().map(|&(r, h, _)| q_rows[r][h * d..][..d].iter().map(|x| x * scale).collect()).collect();
            let mut p: Vec<Vec<f32>> = pairs.iter().map(|&(_, _, (lo, n))| vec![0.0f32; n - lo]).collect();
            // The tile's keys (then values) of this kv head, copied next to each other: in the
            // slab they lie a position's width apart (2 KiB for 4 kv heads of 128), on few
            // cache sets, and every pair of the task re-read them from farther caches.
            let mut tile = vec![0.0f32; TILE_POSITIONS * d];
            let gather = |tile: &mut [f32], t0: usize, t1: usize, part: fn(&Slab, usize, usize, usize) -> &[f32]| {
                for (dst, pos) in tile.chunks_exact_mut(d).zip(t0..t1) {
                    dst.copy_from_slice(part(slab, pos, kvh, d));
                }
            };
            for (t0, t1) in tiles.clone() {
                gather(&mut tile, t0, t1, Slab::key);
                for ((q, p), &(_, _, (lo, n))) in qs.iter().zip(&mut p).zip(&pairs) {
                    for pos in t0.max(lo)..t1.min(n) {
                        p[pos - lo] = dot(q, &tile[(pos - t0) * d..][..d]);
                    }
                }
            }
            let inv: Vec<f32> =
                p.iter_mut().zip(&pairs).map(|(p, &(_, h, _))| softmax_weights(p, sinks.map(|s| sink_log2(s[h])))).collect();
            let mut out: Vec<Vec<f32>> = pairs.iter().map(|_| vec![0.0f32; d]).collect();
            for (t0, t1) in tiles {
                gather(&mut tile, t0, t1, Slab::value);
                for ((o, p), &(_, _, (lo, n))) in out.iter_mut().zip(&p).zip(&pairs) {
                    for pos in t0.max(lo)..t1.min(n) {
                        let w = p[pos - lo];
                        for (o, &v) in o.iter_mut().zip(&tile[(pos - t0) * d..][..d]) {
                            *o += w * v;
                        }
                    }
                }
            }
            for (o, inv) in out.iter_mut().zip(inv) {
                o.iter_mut().for_each(|o| *o *= inv);
            }
            out
        })
        .collect();
    let mut rows = vec![vec![0.0f32; rw]; is.len()];
    for (task, out) in done.into_iter().enumerate() {
        let (kvh, first) = (task / blocks, (task % blocks) * TASK_ROWS);
        for (j, o) in out.into_iter().enumerate() {
            let (r, h) = (first + j / group, kvh * group + j % group);
            rows[r][h * d..][..d].copy_from_slice(&o);
        }
    }
    rows
}

/// CPU twin over plain slices: Q `[rows, n_head, head_dim]`, caches `[blocks, block_size, n_kv,
/// head_dim]` holding every position the chunks read, read through the chunks' block tables in
/// the flat `tables`, under the spec's window, with per-head `sinks` (`[n_head]`) or none.
/// Returns O `[rows, n_head, head_dim]`; rows no chunk covers are zero.
pub fn attention_cpu(
    q: &[f32],
    k_cache: &[f16],
    v_cache: &[f16],
    chunks: &[Chunk],
    tables: &[u32],
    spec: &AttentionSpec,
    sinks: Option<&[f32]>,
) -> Result<Vec<f32>, PlanError> {
    let rw = spec.row_width() as usize;
    let rows = q.len().checked_div(rw).unwrap_or(0) as u64;
    let need = spec.cache_elems();
    let what = spec.unsupported().or_else(|| {
        if !q.len().is_multiple_of(rw) {
            Some(format!("q holds {} floats, not whole rows of {rw}", q.len()))
        } else if (k_cache.len() as u64) < need || (v_cache.len() as u64) < need {
            Some(format!("caches of {} and {} elements, the spec needs {need}", k_cache.len(), v_cache.len()))
        } else if let Some(s) = sinks.filter(|s| (s.len() as u64) < spec.heads as u64) {
            Some(format!("{} sinks for {} heads", s.len(), spec.heads))
        } else {
            chunks_unsupported(chunks, tables, rows, spec)
        }
    });
    if let Some(what) = what {
        return Err(PlanError::Unsupported { kernel: KERNEL.into(), what, shape: format!("rows={rows} {}", spec.describe()) });
    }
    let mut out = vec![0.0f32; q.len()];
    for c in chunks {
        let slab = Slab::from_cache(k_cache, v_cache, &tables[c.table as usize..], c.end(), spec);
        let first = c.first_row as usize;
        out[first * rw..(first + c.n_tokens as usize) * rw].par_chunks_mut(rw).enumerate().for_each(|(i, o)| {
            attend_row(&q[(first + i) * rw..][..rw], &slab, c, i as u32, spec, sinks, o);
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::super::{DECODE_SPAN, MMA_TILE, TOLERANCE, decode_spans, prefill_tile};
    use super::*;
    use crate::check::RelErr;
    use crate::ops::kv_store::kv_store_cpu;
    use crate::testdata::uniform_row;

    /// A cache filled at every position from seeds, f16-rounded.
    fn random_cache(spec: &AttentionSpec, seed: u64) -> (Vec<f16>, Vec<f16>) {
        let n = spec.cache_elems() as usize;
        let conv = |s| uniform_row(s, 0, n, 1.0).into_iter().map(f16::from_f32).collect::<Vec<_>>();
        (conv(seed), conv(seed + 1))
    }

    /// Straightforward softmax attention in f64 with `exp`, position p of a chunk's sequence at
    /// block `table[p / block_size]`, row `p % block_size`; the query at `pos` sees key p when
    /// `p <= pos` and (with a window) `pos − p < window`, written as llama.cpp's mask is; a
    /// sink `z` adds `exp(z − m)` to the denominator, the max m taken over it too.
    fn reference_f64(
        q: &[f32],
        kc: &[f16],
        vc: &[f16],
        chunks: &[Chunk],
        tables: &[u32],
        spec: &AttentionSpec,
        sinks: Option<&[f32]>,
    ) -> Vec<f64> {
        let bs = spec.block_size as usize;
        let (d, rw, w, group) = (spec.head_dim as usize, spec.row_width() as usize, spec.kv_width() as usize, spec.group() as usize);
        let mut out = vec![0.0f64; q.len()];
        for c in chunks {
            for i in 0..c.n_tokens as usize {
                let row = c.first_row as usize + i;
                for h in 0..spec.heads as usize {
                    let qh = &q[row * rw + h * d..][..d];
                    let at = |cache: &[f16], pos: usize, j: usize| {
                        let block = tables[c.table as usize + pos / bs] as usize;
                        cache[(block * bs + pos % bs) * w + (h / group) * d + j].to_f64()
                    };
                    let pos = (c.start_pos as usize + i) as i64;
                    let masked = |p: i64| p > pos || (spec.window > 0 && pos - p >= spec.window as i64);
                    let seen: Vec<usize> = (0..=pos).filter(|&p| !masked(p)).map(|p| p as usize).collect();
                    let s: Vec<f64> =
                        seen.iter().map(|&p| (0..d).map(|j| qh[j] as f64 * at(kc, p, j)).sum::<f64>() * spec.scale as f64).collect();
                    let sink = sinks.map(|z| z[h] as f64);
                    let m = s.iter().copied().chain(sink).fold(f64::NEG_INFINITY, f64::max);
                    let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
                    let l: f64 = e.iter().sum::<f64>() + sink.map_or(0.0, |z| (z - m).exp());
                    for j in 0..d {
                        out[row * rw + h * d + j] = seen.iter().zip(&e).map(|(&p, e)| e * at(vc, p, j)).sum::<f64>() / l;
                    }
                }
            }
        }
        out
    }

    /// Sequence `slot`'s table starts at entry `slot · 32` of [`scrambled`] (blocks of 8, 256 positions).
    fn chunk(slot: u32, start_pos: u32, n_tokens: u32, first_row: u32) -> Chunk {
        Chunk { table: slot * 32, start_pos, n_tokens, first_row }
    }

    /// Tables of `slots` sequences of 32 blocks each, the blocks handed out in a scrambled
    /// order (a stride coprime to the count): no sequence's blocks are contiguous or in order.
    fn scrambled(slots: u32) -> Vec<u32> {
        let n = slots * 32;
        (0..n).map(|i| (i as u64 * 37 % n as u64) as u32).rev().collect()
    }

    fn spec(heads: u32, kv: u32, d: u32, slots: u32) -> AttentionSpec {
        AttentionSpec::new(heads, kv, d, slots * 32, 8)
    }

    /// GQA, a chunk continuing a sequence, a decode step with history, a single-token prompt,
    /// chunks ending on, before and after a block boundary, all through scrambled tables.
    /// The tiled twin of many rows is the twin of one row at a time, bit for bit: with and
    /// without a window and sinks, rows spread over a chunk continuing a sequence, with a
    /// group of 4 query heads per kv head and positions over several tiles.
    #[test]
    fn attend_rows_equals_attend_row_bit_for_bit() {
        for (window, with_sinks) in [(0, false), (0, true), (37, false), (100, true)] {
            let mut spec = spec(8, 2, 64, 16);
            spec = spec.with_window(window);
            let c = chunk(0, 150, 90, 3);
            let slab_len = c.end() as usize;
            let w = spec.kv_width() as usize;
            let slab = Slab { k: uniform_row(7, 0, slab_len * w, 1.0), v: uniform_row(8, 0, slab_len * w, 1.0), width: w };
            let rw = spec.row_width() as usize;
            let q = uniform_row(9, 0, 93 * rw, 4.0);
            let sinks = with_sinks.then(|| uniform_row(10, 0, 8, 4.0));
            let is: Vec<u32> = vec![0, 1, 17, 63, 64, 65, 89];
            let q_rows: Vec<&[f32]> = is.iter().map(|&i| &q[(3 + i as usize) * rw..][..rw]).collect();
            let got = attend_rows(&q_rows, &is, &slab, &c, &spec, sinks.as_deref());
            for (r, &i) in is.iter().enumerate() {
                let mut want = vec![0.0f32; rw];
                attend_row(q_rows[r], &slab, &c, i, &spec, sinks.as_deref(), &mut want);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got[r]), bits(&want), "window {window} sinks {with_sinks} row {i}");
            }
        }
    }

    #[test]
    fn twin_matches_f64_softmax_attention() {
        for (heads, kv, d) in [(4, 2, 64), (6, 2, 128), (2, 2, 256), (8, 1, 64)] {
            let spec = spec(heads, kv, d, 3);
            let tables = scrambled(3);
            let (kc, vc) = random_cache(&spec, 11);
            let chunks = [chunk(0, 0, 72, 0), chunk(0, 72, 7, 72), chunk(1, 250, 1, 79), chunk(2, 0, 1, 80), chunk(2, 1, 8, 81)];
            let rows = 89;
            let q = uniform_row(3, 0, rows * spec.row_width() as usize, 4.0);
            let got = attention_cpu(&q, &kc, &vc, &chunks, &tables, &spec, None).unwrap();
            let want = reference_f64(&q, &kc, &vc, &chunks, &tables, &spec, None);
            let mut err = RelErr::default();
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                err.add(i as u64, *g, *w as f32);
            }
            // f32 scores and sums over at most 251 keys: a few ulps of the largest output.
            assert!(err.value() < 2e-6, "{heads}/{kv}/{d}: {} {}", err.value(), err.describe());
        }
    }

    #[test]
    fn continuing_a_sequence_sees_the_earlier_chunk_exactly() {
        let (spec, tables) = (spec(4, 2, 64, 1), scrambled(1));
        let (kc, vc) = random_cache(&spec, 21);
        let q = uniform_row(5, 0, 50 * spec.row_width() as usize, 4.0);
        for (window, sinks) in [(0, None), (7, Some(&[0.5f32, -1.0, 2.0, 0.0][..]))] {
            let spec = spec.with_window(window);
            let whole = attention_cpu(&q, &kc, &vc, &[chunk(0, 0, 50, 0)], &tables, &spec, sinks).unwrap();
            let parts = [chunk(0, 0, 20, 0), chunk(0, 20, 29, 20), chunk(0, 49, 1, 49)];
            let split = attention_cpu(&q, &kc, &vc, &parts, &tables, &spec, sinks).unwrap();
            assert_eq!(whole, split, "window {window}");
        }
    }

    /// Two sequences whose tables share their first blocks see the same keys there: the same
    /// query gives the same output until the tables part.
    #[test]
    fn shared_prefix_blocks_are_read_by_both_tables() {
        let spec = spec(2, 1, 64, 2);
        let (kc, vc) = random_cache(&spec, 23);
        // Sequence B shares A's first 3 blocks (24 positions), then has blocks of its own.
        let a: Vec<u32> = vec![9, 4, 60, 2, 33];
        let b: Vec<u32> = vec![9, 4, 60, 17, 50];
        let tables: Vec<u32> = a.iter().chain(&b).copied().collect();
        let rw = spec.row_width() as usize;
        let q_one = uniform_row(7, 0, rw, 4.0);
        let q: Vec<f32> = q_one.iter().chain(&q_one).copied().collect();
        for (pos, same) in [(0u32, true), (23, true), (24, false), (39, false)] {
            let chunks = [
                Chunk { table: 0, start_pos: pos, n_tokens: 1, first_row: 0 },
                Chunk { table: 5, start_pos: pos, n_tokens: 1, first_row: 1 },
            ];
            let out = attention_cpu(&q, &kc, &vc, &chunks, &tables, &spec, None).unwrap();
            assert_eq!(out[..rw] == out[rw..], same, "position {pos}");
        }
    }

    #[test]
    fn future_positions_do_not_leak_into_a_row() {
        let (spec, tables) = (spec(2, 1, 64, 1), scrambled(1));
        let (mut kc, mut vc) = random_cache(&spec, 31);
        let q = uniform_row(6, 0, 40 * spec.row_width() as usize, 4.0);
        let before = attention_cpu(&q, &kc, &vc, &[chunk(0, 0, 40, 0)], &tables, &spec, None).unwrap();
        // Rewrite position 17 through the store: rows 0..17 must not change, row 17 must.
        let rows = uniform_row(9, 0, 64, 3.0);
        let dest = crate::ops::kv_store::destinations(&tables, [17], &spec);
        kv_store_cpu(&mut kc, &mut vc, &rows, &rows, &dest, &spec).unwrap();
        let after = attention_cpu(&q, &kc, &vc, &[chunk(0, 0, 40, 0)], &tables, &spec, None).unwrap();
        let rw = spec.row_width() as usize;
        assert_eq!(before[..17 * rw], after[..17 * rw]);
        assert_ne!(before[17 * rw..18 * rw], after[17 * rw..18 * rw]);
    }

    #[test]
    fn bad_inputs_are_typed_errors() {
        let spec = AttentionSpec::new(2, 1, 64, 2, 4);
        let (kc, vc) = random_cache(&spec, 1);
        let q = vec![0.0f32; 2 * 128];
        let t = [1, 0];
        assert!(attention_cpu(&q[..100], &kc, &vc, &[chunk(0, 0, 1, 0)], &t, &spec, None).is_err());
        assert!(attention_cpu(&q, &kc[..10], &vc, &[chunk(0, 0, 1, 0)], &t, &spec, None).is_err());
        assert!(attention_cpu(&q, &kc, &vc, &[chunk(0, 7, 2, 0)], &t, &spec, None).is_err());
        assert!(attention_cpu(&q, &kc, &vc, &[chunk(0, 0, 3, 0)], &t, &spec, None).is_err());
        assert!(attention_cpu(&q, &kc, &vc, &[chunk(0, 0, 2, 0)], &[2], &spec, None).is_err());
        assert!(attention_cpu(&q, &kc, &vc, &[chunk(0, 0, 2, 0)], &t, &AttentionSpec { head_dim: 32, ..spec }, None).is_err());
        assert!(attention_cpu(&q, &kc, &vc, &[chunk(0, 6, 2, 0)], &t, &spec, Some(&[0.0])).is_err(), "a sink per head");
        assert!(attention_cpu(&q, &kc, &vc, &[chunk(0, 6, 2, 0)], &t, &spec.with_window(1 << 31), None).is_err());
        assert!(attention_cpu(&q, &kc, &vc, &[chunk(0, 6, 2, 0)], &t, &spec, Some(&[0.0, 1.0])).is_ok());
        assert!(attention_cpu(&q, &kc, &vc, &[chunk(0, 6, 2, 0)], &t, &spec, None).is_ok());
    }

    /// Lanes combined by xor shuffles at `offsets`, as `__shfl_xor_sync` butterflies do.
    fn butterfly(mut lanes: Vec<f32>, offsets: &[usize], f: fn(f32, f32) -> f32) -> f32 {
        for &o in offsets {
            lanes = (0..lanes.len()).map(|l| f(lanes[l], lanes[l ^ o])).collect();
        }
        lanes[0]
    }

    /// The kernels' dot product: one FMA chain over the head dimension.
    fn fma_dot(a: &[f32], b: &[f32]) -> f32 {
        a.iter().zip(b).fold(0.0f32, |acc, (x, y)| x.mul_add(*y, acc))
    }

    /// `attn_prefill` for one row at position `pos` in a query tile whose first row is at
    /// `tile_first`: 64-key tiles from the one holding the first row's first key (`window`), keys
    /// j·8 + g on lane g, masked past `pos` and before the row's own first key, the online max /
    /// sum started at the sink (`m = sink, l = 1`) or at (−inf, 0), exponents against 0 while
    /// the max is −inf, 8-lane butterflies, P V as an FMA chain in key order.
    fn emulate_prefill(qs: &[f32], slab: &Slab, kvh: usize, pos: usize, window: u32, tile_first: usize, sink: Option<f32>) -> Vec<f32> {
        let d = qs.len();
        let bk = prefill_tile(d as u32).unwrap().keys as usize;
        let (tk, neg) = (bk / 8, f32::NEG_INFINITY);
        let (lo, kmin) = (first_key(pos as u32, window) as usize, first_key(tile_first as u32, window) as usize);
        let (mut m, mut l, mut o) = match sink {
            Some(z) => (z, 1.0f32, vec![0.0f32; d]),
            None => (neg, 0.0f32, vec![0.0f32; d]),
        };
        for k0 in (kmin / bk * bk..=pos).step_by(bk) {
            let key = |g: usize, j: usize| k0 + j * 8 + g;
            let seen = |k: usize| k <= pos && k >= lo;
            let mut s: Vec<Vec<f32>> = (0..8)
                .map(|g| (0..tk).map(|j| if seen(key(g, j)) { fma_dot(qs, slab.key(key(g, j), kvh, d)) } else { neg }).collect())
                .collect();
            let mx = butterfly(s.iter().map(|r| r.iter().copied().fold(neg, f32::max)).collect(), &[1, 2, 4], f32::max);
            let m_new = m.max(mx);
            let m_use = if m_new == neg { 0.0 } else { m_new };
            let alpha = (m - m_use).exp2();
            let sums: Vec<f32> = s
                .iter_mut()
                .map(|r| {
                    r.iter_mut().fold(0.0, |acc, x| {
                        *x = (*x - m_use).exp2();
                        acc + *x
                    })
                })
                .collect();
            l = l.mul_add(alpha, butterfly(sums, &[1, 2, 4], |a, b| a + b));
            m = m_new;
            o.iter_mut().for_each(|x| *x *= alpha);
            for j in 0..tk {
                for (g, sg) in s.iter().enumerate() {
                    let v = slab.value(key(g, j).clamp(kmin, pos), kvh, d);
                    o.iter_mut().zip(v).for_each(|(x, v)| *x = sg[j].mul_add(*v, *x));
                }
            }
        }
        let inv = 1.0 / l;
        o.iter().map(|x| x * inv).collect()
    }

    /// `attn_decode` + `attn_decode_combine` for one row at position `pos`: the plan's
    /// `DECODE_SPAN`-key spans (from the window's first key), an exact max and 32-lane sum each,
    /// merged with `exp2(m_s − M)` weights, the sink in M and, first, in the sum.
    fn emulate_decode(qs: &[f32], slab: &Slab, kvh: usize, pos: usize, window: u32, sink: Option<f32>) -> Vec<f32> {
        let (d, span, neg) = (qs.len(), DECODE_SPAN as usize, f32::NEG_INFINITY);
        let lo = first_key(pos as u32, window) as usize;
        let mut parts: Vec<(f32, f32, Vec<f32>)> = Vec::new();
        for k0 in decode_spans(pos as u32, window).map(|s| s as usize * span) {
            let seen = |k: usize| k <= pos && k >= lo;
            let mut s: Vec<f32> = (k0..k0 + span).map(|k| if seen(k) { fma_dot(qs, slab.key(k, kvh, d)) } else { neg }).collect();
            let mx = s.iter().copied().fold(neg, f32::max);
            assert!(mx > neg, "every span holds a key the row sees");
            s.iter_mut().for_each(|x| *x = (*x - mx).exp2());
            let lanes: Vec<f32> = (0..32).map(|lane| (0..span / 32).fold(0.0, |acc, i| acc + s[lane + 32 * i])).collect();
            let sum = butterfly(lanes, &[16, 8, 4, 2, 1], |a, b| a + b);
            let o: Vec<f32> = (0..d)
                .map(|j| s.iter().enumerate().fold(0.0f32, |acc, (kk, p)| p.mul_add(slab.value((k0 + kk).clamp(lo, pos), kvh, d)[j], acc)))
                .collect();
            parts.push((mx, sum, o));
        }
        let m = parts.iter().map(|p| p.0).fold(sink.unwrap_or(neg), f32::max);
        let l0 = sink.map_or(0.0, |z| (z - m).exp2());
        let l = parts.iter().fold(l0, |acc, p| p.1.mul_add((p.0 - m).exp2(), acc));
        let inv = 1.0 / l;
        (0..d).map(|j| parts.iter().fold(0.0f32, |acc, p| p.2[j].mul_add((p.0 - m).exp2(), acc)) * inv).collect()
    }

    /// The twin against f32 emulations of both kernels' orders, on the self-test's input scales
    /// (q in ±4, K/V in ±1): the measured error must leave TOLERANCE a wide margin.
    #[test]
    fn tolerance_covers_the_kernels_summation_orders() {
        // At 40,960 keys (qwen3's context) only for head_dim 128: the emulations are slow.
        for (d, ctx) in [(64u32, 4000), (128, 40_960), (256, 4000)] {
            let spec = AttentionSpec::new(2, 1, d, ctx / 16, 16);
            let (kc, vc) = random_cache(&spec, 41);
            let table: Vec<u32> = (0..ctx / 16).rev().collect();
            let slab = Slab::from_cache(&kc, &vc, &table, ctx as u64, &spec);
            let (mut pre, mut dec) = (RelErr::default(), RelErr::default());
            let last = ctx as usize - 1;
            for (r, pos) in [0usize, 1, 63, 64, 127, 128, 129, 1000, last / 2, last].into_iter().enumerate() {
                let qs: Vec<f32> = uniform_row(43, r as u64 * d as u64, d as usize, 4.0).iter().map(|x| x * spec.q_scale()).collect();
                let mut want = vec![0.0f32; d as usize];
                attend(&qs, &slab, 0, 0, pos + 1, None, &mut want);
                pre.add_slice(0, &emulate_prefill(&qs, &slab, 0, pos, 0, pos, None), &want);
                dec.add_slice(0, &emulate_decode(&qs, &slab, 0, pos, 0, None), &want);
            }
            eprintln!("d={d}: prefill order {:.2e}, decode order {:.2e}", pre.value(), dec.value());
            assert!(pre.value() < TOLERANCE / 10.0 && dec.value() < TOLERANCE / 10.0, "d={d}: {} {}", pre.value(), dec.value());
        }
    }

    /// The same with gpt-oss's window of 128 and sinks (gpt-oss's are a few units; ±4 here, and
    /// one far above every score): rows at the window's edges, past it, in a query tile whose
    /// first row's window starts tiles earlier than the row's own (the skipped-tile path).
    #[test]
    fn tolerance_covers_the_kernels_orders_with_a_window_and_sinks() {
        for d in [64u32, 128, 256] {
            let (mut pre, mut dec) = (RelErr::default(), RelErr::default());
            window_edge_rows(d, |qs, slab, pos, window, sink, want| {
                for tile_first in [pos, pos.saturating_sub(63), pos.saturating_sub(31)] {
                    pre.add_slice(0, &emulate_prefill(qs, slab, 0, pos, window, tile_first, sink), want);
                }
                dec.add_slice(0, &emulate_decode(qs, slab, 0, pos, window, sink), want);
            });
            eprintln!("d={d} window 128: prefill order {:.2e}, decode order {:.2e}", pre.value(), dec.value());
            assert!(pre.value() < TOLERANCE / 10.0 && dec.value() < TOLERANCE / 10.0, "d={d}: {} {}", pre.value(), dec.value());
        }
    }

    /// gpt-oss's window of 128 over a 4,000-key context with sinks (gpt-oss's are a few units;
    /// ±4 here, and one far above every score): `f(q, slab, pos, window, sink, want)` for rows at
    /// the window's edges and past it, `want` the twin's output.
    fn window_edge_rows(d: u32, mut f: impl FnMut(&[f32], &Slab, usize, u32, Option<f32>, &[f32])) {
        let window = 128u32;
        let ctx = 4000u32;
        let spec = AttentionSpec::new(2, 1, d, ctx / 16, 16).with_window(window);
        let (kc, vc) = random_cache(&spec, 47);
        let table: Vec<u32> = (0..ctx / 16).rev().collect();
        let slab = Slab::from_cache(&kc, &vc, &table, ctx as u64, &spec);
        let w = window as usize;
        let positions = [0usize, 1, w - 2, w - 1, w, w + 1, 2 * w - 1, 2 * w, 2 * w + 1, 1000, ctx as usize - 1];
        for (r, pos) in positions.into_iter().enumerate() {
            for (k, sink) in [None, Some(-4.0f32), Some(1.5), Some(4.0), Some(40.0)].into_iter().enumerate() {
                let qs: Vec<f32> =
                    uniform_row(53, (r * 8 + k) as u64 * d as u64, d as usize, 4.0).iter().map(|x| x * spec.q_scale()).collect();
                let sink = sink.map(sink_log2);
                let mut want = vec![0.0f32; d as usize];
                attend(&qs, &slab, 0, first_key(pos as u32, window) as usize, pos + 1, sink, &mut want);
                f(&qs, &slab, pos, window, sink, &want);
            }
        }
    }

    /// How an emulated `mma.sync` adds its 16 exact f16 x f16 products to the f32 accumulator.
    #[derive(Clone, Copy, Debug)]
    enum Accumulate {
        /// The exact sum, rounded to nearest once.
        Nearest,
        /// Every addend (accumulator included) truncated toward zero to the f32 grid of the
        /// largest one, summed, the sum truncated toward zero: no guard bits, worse than what
        /// is measured of tensor cores (their alignment keeps a few).
        Truncating,
    }

    /// `c + Σ terms` as one emulated mma step adds them (`terms`: exact products, in f64).
    fn mma_add(c: f32, terms: &[f64], how: Accumulate) -> f32 {
        match how {
            Accumulate::Nearest => (c as f64 + terms.iter().sum::<f64>()) as f32,
            Accumulate::Truncating => {
                let big = terms.iter().fold((c as f64).abs(), |m, x| m.max(x.abs()));
                if big == 0.0 {
                    return c;
                }
                let exp = ((big.to_bits() >> 52) & 0x7ff) as i32 - 1023;
                let ulp = 2f64.powi(exp - 23);
                let sum = terms.iter().fold((c as f64 / ulp).trunc() * ulp, |acc, x| acc + (x / ulp).trunc() * ulp);
                let r = sum as f32;
                // Toward zero: one step back where rounding to nearest went up in magnitude.
                if r != 0.0 && (r as f64).abs() > sum.abs() { f32::from_bits(r.to_bits() - 1) } else { r }
            }
        }
    }

    /// `x = hi + lo` in two f16 halves, as the kernel's `att_split_f16x2`: `hi = f16(x)`,
    /// `lo = f16(x − hi)` (round to nearest even, subnormals kept).
    fn split_f16(x: f32) -> (f32, f32) {
        let hi = f16::from_f32(x).to_f32();
        (hi, f16::from_f32(x - hi).to_f32())
    }

    /// `attn_prefill_mma` for one row at position `pos` in a query tile whose first row is at
    /// `tile_first`: Q split into f16 halves; per 64-key tile from the one holding the first
    /// row's first key, each score `S = Σ_ks (q_hi·k)_ks then (q_lo·k)_ks` (16 dims per mma step,
    /// hi before lo, `how`); the mask, max and 4-lane butterflies of the kernel (lane t holds keys
    /// 8nb + 2t + e, summed nb-major); `P · 2^15` split into halves, `O += P_hi V` then `P_lo V`
    /// per 16 keys; `o = O · 2^-15 · (1 / l)`.
    #[allow(clippy::too_many_arguments)]
    fn emulate_prefill_mma(
        qs: &[f32],
        slab: &Slab,
        kvh: usize,
        pos: usize,
        window: u32,
        tile_first: usize,
        sink: Option<f32>,
        how: Accumulate,
    ) -> Vec<f32> {
        let d = qs.len();
        let bk = MMA_TILE.keys as usize;
        let neg = f32::NEG_INFINITY;
        let (lo, kmin) = (first_key(pos as u32, window) as usize, first_key(tile_first as u32, window) as usize);
        let (qh, ql): (Vec<f32>, Vec<f32>) = qs.iter().map(|&x| split_f16(x)).unzip();
        let (mut m, mut l) = match sink {
            Some(z) => (z, 1.0f32),
            None => (neg, 0.0f32),
        };
        let mut o = vec![0.0f32; d];
        let mut terms = [0.0f64; 16];
        let score = |key: usize, terms: &mut [f64; 16]| -> f32 {
            let k = slab.key(key, kvh, d);
            let mut acc = 0.0f32;
            for ks in (0..d).step_by(16) {
                for half in [&qh, &ql] {
                    for (j, t) in terms.iter_mut().enumerate() {
                        *t = half[ks + j] as f64 * k[ks + j] as f64;
                    }
                    acc = mma_add(acc, terms, how);
                }
            }
            acc
        };
        for k0 in (kmin / bk * bk..=pos).step_by(bk) {
            let seen = |k: usize| k <= pos && k >= lo;
            let mut s: Vec<f32> = (k0..k0 + bk).map(|k| if seen(k) { score(k, &mut terms) } else { neg }).collect();
            let mx = s.iter().copied().fold(neg, f32::max);
            let m_new = m.max(mx);
            let m_use = if m_new == neg { 0.0 } else { m_new };
            let alpha = (m - m_use).exp2();
            s.iter_mut().for_each(|x| *x = (*x - m_use).exp2());
            // Lane t: keys 8nb + 2t + e, nb-major; then xor 1, 2.
            let lanes: Vec<f32> =
                (0..4).map(|t| (0..bk / 8).flat_map(|nb| [0, 1].map(|e| s[nb * 8 + 2 * t + e])).fold(0.0, |a, x| a + x)).collect();
            let sum = {
                let x: Vec<f32> = (0..4).map(|t| lanes[t] + lanes[t ^ 1]).collect();
                (0..4).map(|t| x[t] + x[t ^ 2]).collect::<Vec<f32>>()[0]
            };
            l = l.mul_add(alpha, sum);
            m = m_new;
            o.iter_mut().for_each(|x| *x *= alpha);
            let halves: Vec<(f32, f32)> = s.iter().map(|&p| split_f16(p * 32768.0)).collect();
            for kk in (0..bk).step_by(16) {
                for (j, oj) in o.iter_mut().enumerate() {
                    for part in [0, 1] {
                        for (i, t) in terms.iter_mut().enumerate() {
                            let key = k0 + kk + i;
                            let p = if part == 0 { halves[kk + i].0 } else { halves[kk + i].1 };
                            *t = if p == 0.0 { 0.0 } else { p as f64 * slab.value(key, kvh, d)[j] as f64 };
                        }
                        *oj = mma_add(*oj, &terms, how);
                    }
                }
            }
        }
        let inv = 1.0 / l;
        o.iter().map(|x| x * (1.0 / 32768.0) * inv).collect()
    }

    /// The split trick's arithmetic (the tensor-core prefill kernel) against the twin on the
    /// self-test's scales, over 40,960 keys at head_dim 128, with either accumulation model: Q
    /// and P taken to ~22 bits in two f16 halves are as good as f32 here, so the error stays
    /// within the f32 kernel's own (`tolerance_covers_the_kernels_summation_orders`), a wide
    /// margin below TOLERANCE. (Plain f16 Q and P would not: a 2^-12 relative error per score
    /// and weight, ~1e-3 of the outputs; [`split_f16`]'s `hi` alone shows it.)
    #[test]
    fn tolerance_covers_the_mma_kernels_split() {
        for (d, ctx) in [(64u32, 4000), (128, 40_960)] {
            let spec = AttentionSpec::new(2, 1, d, ctx / 16, 16);
            let (kc, vc) = random_cache(&spec, 41);
            let table: Vec<u32> = (0..ctx / 16).rev().collect();
            let slab = Slab::from_cache(&kc, &vc, &table, ctx as u64, &spec);
            let last = ctx as usize - 1;
            for how in [Accumulate::Nearest, Accumulate::Truncating] {
                let mut err = RelErr::default();
                for (r, pos) in [0usize, 1, 15, 16, 63, 64, 127, 128, 129, 1000, last / 2, last].into_iter().enumerate() {
                    let qs: Vec<f32> = uniform_row(43, r as u64 * d as u64, d as usize, 4.0).iter().map(|x| x * spec.q_scale()).collect();
                    let mut want = vec![0.0f32; d as usize];
                    attend(&qs, &slab, 0, 0, pos + 1, None, &mut want);
                    err.add_slice(0, &emulate_prefill_mma(&qs, &slab, 0, pos, 0, pos, None, how), &want);
                }
                eprintln!("d={d} ctx={ctx}: mma split ({how:?}) {:.2e}", err.value());
                assert!(err.value() < TOLERANCE / 10.0, "d={d} {how:?}: {} {}", err.value(), err.describe());
            }
        }
        // Without the split (Q's hi half alone) the error is far past TOLERANCE: the test sees it.
        let spec = AttentionSpec::new(2, 1, 128, 4000 / 16, 16);
        let (kc, vc) = random_cache(&spec, 41);
        let table: Vec<u32> = (0..4000 / 16).rev().collect();
        let slab = Slab::from_cache(&kc, &vc, &table, 4000, &spec);
        let qs: Vec<f32> = uniform_row(43, 0, 128, 4.0).iter().map(|x| x * spec.q_scale()).collect();
        let q16: Vec<f32> = qs.iter().map(|&x| split_f16(x).0).collect();
        let (mut want, mut plain) = (vec![0.0f32; 128], vec![0.0f32; 128]);
        attend(&qs, &slab, 0, 0, 3000, None, &mut want);
        attend(&q16, &slab, 0, 0, 3000, None, &mut plain);
        let mut err = RelErr::default();
        err.add_slice(0, &plain, &want);
        assert!(err.value() > TOLERANCE, "f16 Q alone: {}", err.value());
    }

    /// The same with gpt-oss's window of 128 and sinks: rows at the window's edges and past it,
    /// in query tiles whose first row's window starts tiles earlier (the skipped tiles).
    #[test]
    fn tolerance_covers_the_mma_kernels_split_with_a_window_and_sinks() {
        for d in [64u32, 128] {
            let (mut nearest, mut err) = (RelErr::default(), RelErr::default());
            window_edge_rows(d, |qs, slab, pos, window, sink, want| {
                for tile_first in [pos, pos.saturating_sub(63), pos.saturating_sub(16)] {
                    let got = emulate_prefill_mma(qs, slab, 0, pos, window, tile_first, sink, Accumulate::Truncating);
                    err.add_slice(0, &got, want);
                    let got = emulate_prefill_mma(qs, slab, 0, pos, window, tile_first, sink, Accumulate::Nearest);
                    nearest.add_slice(0, &got, want);
                }
            });
            eprintln!("d={d} window 128: mma split (Nearest) {:.2e}, (Truncating) {:.2e}", nearest.value(), err.value());
            for err in [nearest, err] {
                assert!(err.value() < TOLERANCE / 10.0, "d={d}: {} {}", err.value(), err.describe());
            }
        }
    }

    /// Sliding windows at and around their edges, chunks starting inside a window, decode steps
    /// past it, with and without sinks, through scrambled tables: the twin against f64.
    #[test]
    fn window_and_sinks_match_f64_softmax_attention() {
        for (heads, kv, d) in [(4, 2, 64), (2, 1, 128)] {
            let base = spec(heads, kv, d, 3);
            let tables = scrambled(3);
            let (kc, vc) = random_cache(&base, 13);
            for window in [1u32, 2, 7, 8, 9, 16, 17, 64, 100] {
                let w = window;
                // A prompt of 2w + 1 (edges w − 1, w, w + 1, 2w ± 1 in its rows), a chunk starting
                // inside a window (at w − 1) and one starting past it, decode steps at w − 2 ..= w + 1
                // and 2w − 1 ..= 2w + 1.
                let prompt = (2 * w + 2).min(200);
                let chunks = [
                    chunk(0, 0, prompt, 0),
                    chunk(1, w - 1, 5, prompt),
                    chunk(1, w + 4, 3, prompt + 5),
                    chunk(2, (2 * w + 1).min(250), 1, prompt + 8),
                    chunk(2, w.saturating_sub(2), 1, prompt + 9),
                    chunk(2, w, 1, prompt + 10),
                ];
                let rows = prompt as usize + 11;
                let q = uniform_row(3 + w as u64, 0, rows * base.row_width() as usize, 4.0);
                let sinks: Vec<f32> = uniform_row(17, 0, heads as usize, 3.0);
                for sinks in [None, Some(&sinks[..])] {
                    let spec = base.with_window(window);
                    let got = attention_cpu(&q, &kc, &vc, &chunks, &tables, &spec, sinks).unwrap();
                    let want = reference_f64(&q, &kc, &vc, &chunks, &tables, &spec, sinks);
                    let mut err = RelErr::default();
                    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                        err.add(i as u64, *g, *w as f32);
                    }
                    assert!(
                        err.value() < 2e-6,
                        "{heads}/{kv}/{d} window {window} sinks {}: {} {}",
                        sinks.is_some(),
                        err.value(),
                        err.describe()
                    );
                }
            }
        }
    }

    /// The options off take the plain arithmetic bit for bit: a window wider than every
    /// position seen, and sinks of −inf, change nothing. A window of 1 is each row's own value.
    #[test]
    fn options_off_change_nothing_and_a_window_of_one_is_the_own_value() {
        let (base, tables) = (spec(4, 2, 64, 1), scrambled(1));
        let (kc, vc) = random_cache(&base, 29);
        let rw = base.row_width() as usize;
        let q = uniform_row(8, 0, 60 * rw, 4.0);
        let chunks = [chunk(0, 0, 40, 0), chunk(0, 40, 19, 40), chunk(0, 59, 1, 59)];
        let plain = attention_cpu(&q, &kc, &vc, &chunks, &tables, &base, None).unwrap();
        let wide = attention_cpu(&q, &kc, &vc, &chunks, &tables, &base.with_window(60), None).unwrap();
        let minus_inf = [f32::NEG_INFINITY; 4];
        let no_sink = attention_cpu(&q, &kc, &vc, &chunks, &tables, &base, Some(&minus_inf)).unwrap();
        assert!(plain == wide && plain == no_sink);
        let narrow = attention_cpu(&q, &kc, &vc, &chunks, &tables, &base.with_window(59), None).unwrap();
        assert_eq!(plain[..59 * rw], narrow[..59 * rw]);
        assert_ne!(plain[59 * rw..], narrow[59 * rw..], "position 59 no longer sees key 0");
        let one = attention_cpu(&q, &kc, &vc, &chunks, &tables, &base.with_window(1), None).unwrap();
        let d = 64;
        for pos in 0..60usize {
            let row = physical_row(&tables, pos as u32, &base).unwrap() as usize;
            for h in 0..4 {
                let v: Vec<f32> = vc[(row * 2 + h / 2) * d..][..d].iter().map(|x| x.to_f32()).collect();
                assert_eq!(one[pos * rw + h * d..][..d], v[..], "position {pos} head {h}");
            }
        }
        // A sink far above every score takes (nearly) all the weight: the outputs shrink.
        let big = attention_cpu(&q, &kc, &vc, &chunks, &tables, &base, Some(&[30.0; 4])).unwrap();
        assert!(big.iter().zip(&plain).all(|(b, p)| b.abs() <= p.abs() * 1e-6 + 1e-30));
    }
}
