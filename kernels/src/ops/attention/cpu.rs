//! The CPU twin: causal attention with an exact two-pass softmax in f32.
//!
//! Per (row, head): q scaled by `scale · log2(e)` (one f32 product, as the kernels stage it),
//! scores `q · k` in f32 over the cache's f16 keys converted to f32, `m = max`, `p = exp2(s − m)`,
//! `l = Σ p`, `o = (Σ p · v) · (1 / l)`. The kernels differ in order only: their dot products are
//! one FMA chain over the head dimension (here 8 interleaved partial sums, which vectorise), and
//! their softmax is online over key tiles (prefill) or split over spans and merged (decode).

use half::f16;
use rayon::prelude::*;

use super::{AttentionSpec, Chunk, KERNEL, chunks_unsupported, physical_row};
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
    fn from_cache(k_cache: &[f16], v_cache: &[f16], table: &[u32], n: u64, spec: &AttentionSpec) -> Slab {
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

    fn key(&self, pos: usize, kvh: usize, d: usize) -> &[f32] {
        &self.k[pos * self.width + kvh * d..][..d]
    }

    fn value(&self, pos: usize, kvh: usize, d: usize) -> &[f32] {
        &self.v[pos * self.width + kvh * d..][..d]
    }
}

/// `Σ a·b` in f32 over 8 interleaved partial sums (head dims are multiples of 8).
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    for (ca, cb) in a.chunks_exact(8).zip(b.chunks_exact(8)) {
        for i in 0..8 {
            acc[i] += ca[i] * cb[i];
        }
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]))
}

/// One query head `qs` (already scaled by `q_scale`) against positions `0..n` of kv head `kvh`.
pub(super) fn attend(qs: &[f32], slab: &Slab, kvh: usize, n: usize, out: &mut [f32]) {
    let d = qs.len();
    let mut p: Vec<f32> = (0..n).map(|pos| dot(qs, slab.key(pos, kvh, d))).collect();
    let m = p.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut l = 0.0f32;
    for s in p.iter_mut() {
        *s = (*s - m).exp2();
        l += *s;
    }
    out.fill(0.0);
    for (pos, &w) in p.iter().enumerate() {
        for (o, &v) in out.iter_mut().zip(slab.value(pos, kvh, d)) {
            *o += w * v;
        }
    }
    let inv = 1.0 / l;
    out.iter_mut().for_each(|o| *o *= inv);
}

/// The output row of batch row `row` (query `i` of chunk `c`), every head, from a slab of `c`'s sequence.
pub(super) fn attend_row(q_row: &[f32], slab: &Slab, c: &Chunk, i: u32, spec: &AttentionSpec, out: &mut [f32]) {
    let (d, group) = (spec.head_dim as usize, spec.group() as usize);
    let n = c.start_pos as usize + i as usize + 1;
    let scale = spec.q_scale();
    // Heads in parallel: one long-context row is `n · n_head · head_dim` multiply-adds, too
    // much for one core; each head's arithmetic is the same in any order.
    q_row.par_chunks_exact(d).zip(out.par_chunks_exact_mut(d)).enumerate().for_each(|(h, (q, o))| {
        let qs: Vec<f32> = q.iter().map(|x| x * scale).collect();
        attend(&qs, slab, h / group, n, o);
    });
}

/// CPU twin over plain slices: Q `[rows, n_head, head_dim]`, caches `[blocks, block_size, n_kv,
/// head_dim]` holding every position the chunks read, read through the chunks' block tables in
/// the flat `tables`. Returns O `[rows, n_head, head_dim]`; rows no chunk covers are zero.
pub fn attention_cpu(
    q: &[f32],
    k_cache: &[f16],
    v_cache: &[f16],
    chunks: &[Chunk],
    tables: &[u32],
    spec: &AttentionSpec,
) -> Result<Vec<f32>, PlanError> {
    let rw = spec.row_width() as usize;
    let rows = q.len().checked_div(rw).unwrap_or(0) as u64;
    let need = spec.cache_elems();
    let what = spec.unsupported().or_else(|| {
        if !q.len().is_multiple_of(rw) {
            Some(format!("q holds {} floats, not whole rows of {rw}", q.len()))
        } else if (k_cache.len() as u64) < need || (v_cache.len() as u64) < need {
            Some(format!("caches of {} and {} elements, the spec needs {need}", k_cache.len(), v_cache.len()))
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
            attend_row(&q[(first + i) * rw..][..rw], &slab, c, i as u32, spec, o);
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::super::{DECODE_SPAN, TOLERANCE, prefill_tile};
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
    /// block `table[p / block_size]`, row `p % block_size`.
    fn reference_f64(q: &[f32], kc: &[f16], vc: &[f16], chunks: &[Chunk], tables: &[u32], spec: &AttentionSpec) -> Vec<f64> {
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
                    let n = c.start_pos as usize + i + 1;
                    let s: Vec<f64> =
                        (0..n).map(|p| (0..d).map(|j| qh[j] as f64 * at(kc, p, j)).sum::<f64>() * spec.scale as f64).collect();
                    let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
                    let l: f64 = e.iter().sum();
                    for j in 0..d {
                        out[row * rw + h * d + j] = (0..n).map(|p| e[p] * at(vc, p, j)).sum::<f64>() / l;
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
    #[test]
    fn twin_matches_f64_softmax_attention() {
        for (heads, kv, d) in [(4, 2, 64), (6, 2, 128), (2, 2, 256), (8, 1, 64)] {
            let spec = spec(heads, kv, d, 3);
            let tables = scrambled(3);
            let (kc, vc) = random_cache(&spec, 11);
            let chunks = [chunk(0, 0, 72, 0), chunk(0, 72, 7, 72), chunk(1, 250, 1, 79), chunk(2, 0, 1, 80), chunk(2, 1, 8, 81)];
            let rows = 89;
            let q = uniform_row(3, 0, rows * spec.row_width() as usize, 4.0);
            let got = attention_cpu(&q, &kc, &vc, &chunks, &tables, &spec).unwrap();
            let want = reference_f64(&q, &kc, &vc, &chunks, &tables, &spec);
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
        let whole = attention_cpu(&q, &kc, &vc, &[chunk(0, 0, 50, 0)], &tables, &spec).unwrap();
        let split = attention_cpu(&q, &kc, &vc, &[chunk(0, 0, 20, 0), chunk(0, 20, 29, 20), chunk(0, 49, 1, 49)], &tables, &spec).unwrap();
        assert_eq!(whole, split);
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
            let out = attention_cpu(&q, &kc, &vc, &chunks, &tables, &spec).unwrap();
            assert_eq!(out[..rw] == out[rw..], same, "position {pos}");
        }
    }

    #[test]
    fn future_positions_do_not_leak_into_a_row() {
        let (spec, tables) = (spec(2, 1, 64, 1), scrambled(1));
        let (mut kc, mut vc) = random_cache(&spec, 31);
        let q = uniform_row(6, 0, 40 * spec.row_width() as usize, 4.0);
        let before = attention_cpu(&q, &kc, &vc, &[chunk(0, 0, 40, 0)], &tables, &spec).unwrap();
        // Rewrite position 17 through the store: rows 0..17 must not change, row 17 must.
        let rows = uniform_row(9, 0, 64, 3.0);
        let dest = crate::ops::kv_store::destinations(&tables, [17], &spec);
        kv_store_cpu(&mut kc, &mut vc, &rows, &rows, &dest, &spec).unwrap();
        let after = attention_cpu(&q, &kc, &vc, &[chunk(0, 0, 40, 0)], &tables, &spec).unwrap();
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
        assert!(attention_cpu(&q[..100], &kc, &vc, &[chunk(0, 0, 1, 0)], &t, &spec).is_err());
        assert!(attention_cpu(&q, &kc[..10], &vc, &[chunk(0, 0, 1, 0)], &t, &spec).is_err());
        assert!(attention_cpu(&q, &kc, &vc, &[chunk(0, 7, 2, 0)], &t, &spec).is_err());
        assert!(attention_cpu(&q, &kc, &vc, &[chunk(0, 0, 3, 0)], &t, &spec).is_err());
        assert!(attention_cpu(&q, &kc, &vc, &[chunk(0, 0, 2, 0)], &[2], &spec).is_err());
        assert!(attention_cpu(&q, &kc, &vc, &[chunk(0, 0, 2, 0)], &t, &AttentionSpec { head_dim: 32, ..spec }).is_err());
        assert!(attention_cpu(&q, &kc, &vc, &[chunk(0, 6, 2, 0)], &t, &spec).is_ok());
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

    /// `attn_prefill` for one row at position `pos`: 64-key tiles, keys j·8 + g on lane g, the
    /// online max / sum with 8-lane butterflies, P V as an FMA chain in key order.
    fn emulate_prefill(qs: &[f32], slab: &Slab, kvh: usize, pos: usize) -> Vec<f32> {
        let d = qs.len();
        let bk = prefill_tile(d as u32).unwrap().keys as usize;
        let (tk, neg) = (bk / 8, f32::NEG_INFINITY);
        let (mut m, mut l, mut o) = (neg, 0.0f32, vec![0.0f32; d]);
        for k0 in (0..=pos).step_by(bk) {
            let key = |g: usize, j: usize| k0 + j * 8 + g;
            let mut s: Vec<Vec<f32>> = (0..8)
                .map(|g| (0..tk).map(|j| if key(g, j) > pos { neg } else { fma_dot(qs, slab.key(key(g, j), kvh, d)) }).collect())
                .collect();
            let mx = butterfly(s.iter().map(|r| r.iter().copied().fold(neg, f32::max)).collect(), &[1, 2, 4], f32::max);
            let m_new = m.max(mx);
            let alpha = (m - m_new).exp2();
            let sums: Vec<f32> = s
                .iter_mut()
                .map(|r| {
                    r.iter_mut().fold(0.0, |acc, x| {
                        *x = (*x - m_new).exp2();
                        acc + *x
                    })
                })
                .collect();
            l = l.mul_add(alpha, butterfly(sums, &[1, 2, 4], |a, b| a + b));
            m = m_new;
            o.iter_mut().for_each(|x| *x *= alpha);
            for j in 0..tk {
                for (g, sg) in s.iter().enumerate() {
                    let v = slab.value(key(g, j).min(pos), kvh, d);
                    o.iter_mut().zip(v).for_each(|(x, v)| *x = sg[j].mul_add(*v, *x));
                }
            }
        }
        let inv = 1.0 / l;
        o.iter().map(|x| x * inv).collect()
    }

    /// `attn_decode` + `attn_decode_combine` for one row at position `pos`: `DECODE_SPAN`-key spans with an
    /// exact max and 32-lane sum each, merged with `exp2(m_s − M)` weights.
    fn emulate_decode(qs: &[f32], slab: &Slab, kvh: usize, pos: usize) -> Vec<f32> {
        let (d, span, neg) = (qs.len(), DECODE_SPAN as usize, f32::NEG_INFINITY);
        let mut parts: Vec<(f32, f32, Vec<f32>)> = Vec::new();
        for k0 in (0..=pos).step_by(span) {
            let mut s: Vec<f32> = (k0..k0 + span).map(|k| if k > pos { neg } else { fma_dot(qs, slab.key(k, kvh, d)) }).collect();
            let mx = s.iter().copied().fold(neg, f32::max);
            s.iter_mut().for_each(|x| *x = (*x - mx).exp2());
            let lanes: Vec<f32> = (0..32).map(|lane| (0..span / 32).fold(0.0, |acc, i| acc + s[lane + 32 * i])).collect();
            let sum = butterfly(lanes, &[16, 8, 4, 2, 1], |a, b| a + b);
            let o: Vec<f32> = (0..d)
                .map(|j| s.iter().enumerate().fold(0.0f32, |acc, (kk, p)| p.mul_add(slab.value((k0 + kk).min(pos), kvh, d)[j], acc)))
                .collect();
            parts.push((mx, sum, o));
        }
        let m = parts.iter().map(|p| p.0).fold(neg, f32::max);
        let l = parts.iter().fold(0.0f32, |acc, p| p.1.mul_add((p.0 - m).exp2(), acc));
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
                attend(&qs, &slab, 0, pos + 1, &mut want);
                pre.add_slice(0, &emulate_prefill(&qs, &slab, 0, pos), &want);
                dec.add_slice(0, &emulate_decode(&qs, &slab, 0, pos), &want);
            }
            eprintln!("d={d}: prefill order {:.2e}, decode order {:.2e}", pre.value(), dec.value());
            assert!(pre.value() < TOLERANCE / 10.0 && dec.value() < TOLERANCE / 10.0, "d={d}: {} {}", pre.value(), dec.value());
        }
    }
}
