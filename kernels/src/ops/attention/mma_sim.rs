//! A lane-by-lane simulation of `attn_prefill_mma` on the CPU: every index expression of the
//! kernel (Q's fragments in shared memory, K's 32-bit B loads, S's C layout and its mask, the
//! 4-lane butterflies, P's A fragments taken from S's registers, ldmatrix .trans on V, O's
//! store) written as the kernel writes it, over an `mma.sync` m16n8k16 and an `ldmatrix`
//! implemented from their fragment definitions (PTX ISA):
//!   A (16 x 16): a0 = (row g, k 2t..2t+1), a1 = (row g+8, k 2t..), a2 = (row g, k 2t+8..),
//!                a3 = (row g+8, k 2t+8..)
//!   B (16 x 8):  b0 = (k 2t..2t+1, n g), b1 = (k 2t+8..2t+9, n g)
//!   C (16 x 8):  c0, c1 = (row g, n 2t, 2t+1), c2, c3 = (row g+8, n 2t, 2t+1)
//!   ldmatrix .x4: lanes 8i..8i+7 address the 8 rows of matrix i; without .trans lane (g, t)
//!   gets (row g, cols 2t, 2t+1) of each, with .trans (rows 2t, 2t+1, col g).
//! (g = lane >> 2, t = lane & 3, the lower k or column in a register's lower half.) A block
//! of one chunk's tile is run warp by warp against the twin: an index off by one row, key or
//! lane would move outputs by far more than TOLERANCE.
// Lanes are indexed as the kernel indexes them.
#![allow(clippy::needless_range_loop)]

use half::f16;

use super::cpu::{Slab, attend, sink_log2};
use super::{MMA_PAD_HALFS, MMA_TILE, TOLERANCE, first_key};
use crate::check::RelErr;
use crate::testdata::uniform_row;

type Lanes<T> = [T; 32];

fn bits(x: f32) -> u16 {
    f16::from_f32(x).to_bits()
}

fn val(h: u16) -> f64 {
    f16::from_bits(h).to_f64()
}

fn lo_hi(r: u32) -> (f64, f64) {
    (val(r as u16), val((r >> 16) as u16))
}

/// `att_split_f16x2`.
fn split(x0: f32, x1: f32) -> (u32, u32) {
    let (h0, h1) = (bits(x0), bits(x1));
    let (l0, l1) = (bits(x0 - f16::from_bits(h0).to_f32()), bits(x1 - f16::from_bits(h1).to_f32()));
    (h0 as u32 | (h1 as u32) << 16, l0 as u32 | (l1 as u32) << 16)
}

/// `mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32` from the fragment definitions: the
/// matrices rebuilt from the lanes' registers, `C += A B` (exact sums, rounded once), written
/// back to the lanes.
fn mma(c: &mut Lanes<[f32; 4]>, a: &Lanes<[u32; 4]>, b0: &Lanes<u32>, b1: &Lanes<u32>) {
    let (mut am, mut bm) = ([[0.0f64; 16]; 16], [[0.0f64; 8]; 16]);
    for lane in 0..32 {
        let (g, t) = (lane >> 2, lane & 3);
        for (reg, (row, k)) in a[lane].iter().zip([(g, 2 * t), (g + 8, 2 * t), (g, 2 * t + 8), (g + 8, 2 * t + 8)]) {
            (am[row][k], am[row][k + 1]) = lo_hi(*reg);
        }
        (bm[2 * t][g], bm[2 * t + 1][g]) = lo_hi(b0[lane]);
        (bm[2 * t + 8][g], bm[2 * t + 9][g]) = lo_hi(b1[lane]);
    }
    let mut cm = [[0.0f32; 8]; 16];
    for lane in 0..32 {
        let (g, t) = (lane >> 2, lane & 3);
        cm[g][2 * t] = c[lane][0];
        cm[g][2 * t + 1] = c[lane][1];
        cm[g + 8][2 * t] = c[lane][2];
        cm[g + 8][2 * t + 1] = c[lane][3];
    }
    for (row, crow) in cm.iter_mut().enumerate() {
        for (n, cv) in crow.iter_mut().enumerate() {
            *cv = (*cv as f64 + (0..16).map(|k| am[row][k] * bm[k][n]).sum::<f64>()) as f32;
        }
    }
    for lane in 0..32 {
        let (g, t) = (lane >> 2, lane & 3);
        c[lane] = [cm[g][2 * t], cm[g][2 * t + 1], cm[g + 8][2 * t], cm[g + 8][2 * t + 1]];
    }
}

/// `ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16`: lane l addresses row l % 8 of matrix l / 8
/// (8 halfs from `addr[l]` of `smem`); lane (g, t) gets rows 2t, 2t + 1 of column g of each.
fn ldsm_x4_trans(smem: &[u16], addr: &Lanes<usize>) -> Lanes<[u32; 4]> {
    let mut r = [[0u32; 4]; 32];
    for (lane, out) in r.iter_mut().enumerate() {
        let (g, t) = (lane >> 2, lane & 3);
        for (i, reg) in out.iter_mut().enumerate() {
            let row = |j: usize| addr[8 * i + j];
            *reg = smem[row(2 * t) + g] as u32 | (smem[row(2 * t + 1) + g] as u32) << 16;
        }
    }
    r
}

/// `__shfl_xor_sync(FULL_MASK, x, m)` for every lane.
fn shfl_xor(x: &Lanes<f32>, m: usize) -> Lanes<f32> {
    std::array::from_fn(|l| x[l ^ m])
}

/// One block of `attn_prefill_mma` for head 0 (kv head 0): a chunk at `start_pos` whose rows
/// `q0 .. q0 + nq` this tile holds (`nq` up to 64), Q rows `q` (scaled), K/V from `slab`.
/// Returns the `nq` output rows.
#[allow(clippy::too_many_arguments)]
fn block(q: &[Vec<f32>], slab: &Slab, d: usize, start_pos: i32, q0: i32, nq: i32, window: i32, sink: Option<f32>) -> Vec<Vec<f32>> {
    let (bq, bk) = (MMA_TILE.rows as i32, MMA_TILE.keys as i32);
    let ldh = d + MMA_PAD_HALFS as usize;
    let (ks_n, nb_n, kk_n, nd_n) = (d / 16, bk as usize / 8, bk as usize / 16, d / 8);
    let neg = f32::NEG_INFINITY;
    let (mut sk, mut sv) = (vec![0u16; bk as usize * ldh], vec![0u16; bk as usize * ldh]);
    let (mut sqh, mut sql) = (vec![0u16; bq as usize * ldh], vec![0u16; bq as usize * ldh]);
    let mut out = vec![vec![f32::NAN; d]; nq as usize];
    let kmax = start_pos + q0 + nq - 1;
    let kmin = if window > 0 { 0.max(start_pos + q0 - window + 1) } else { 0 };
    let (n_kt, kt0) = (kmax / bk + 1, kmin / bk);
    for warp in 0..4usize {
        let w0 = warp as i32 * 16;
        let row_of = |lane: usize, i: usize| (w0 + (lane >> 2) as i32 + 8 * i as i32).min(nq - 1);
        // Q staging: lane (g, t) writes dims c + 2t, +1 of rows w0 + g, w0 + g + 8.
        for lane in 0..32 {
            let (g, t) = (lane >> 2, lane & 3);
            for (i, row) in [w0 as usize + g, w0 as usize + g + 8].into_iter().enumerate() {
                let qr = &q[(q0 + row_of(lane, i)) as usize];
                for c in (0..d).step_by(8) {
                    let (h, l) = split(qr[c + 2 * t], qr[c + 2 * t + 1]);
                    let at = row * ldh + 2 * t + c;
                    (sqh[at], sqh[at + 1], sql[at], sql[at + 1]) = (h as u16, (h >> 16) as u16, l as u16, (l >> 16) as u16);
                }
            }
        }
        let mut m: Lanes<[f32; 2]> = [[sink.unwrap_or(neg); 2]; 32];
        let mut l: Lanes<[f32; 2]> = [[if sink.is_some() { 1.0 } else { 0.0 }; 2]; 32];
        let lim = |lane: usize, i: usize| start_pos + q0 + row_of(lane, i);
        let lo = |lane: usize, i: usize| if window > 0 { lim(lane, i) - window + 1 } else { 0 };
        let mut o: Vec<Lanes<[f32; 4]>> = vec![[[0.0; 4]; 32]; nd_n];
        let warp_idle = w0 >= nq;
        let wlast = start_pos + q0 + (w0 + 15).min(nq - 1);
        let wfirst = if window > 0 { start_pos + q0 + w0.min(nq - 1) - window + 1 } else { 0 };
        for kt in kt0..n_kt {
            let k0 = kt * bk;
            for r in 0..bk as usize {
                let key = (k0 + r as i32).clamp(kmin, kmax) as usize;
                for c in 0..d {
                    sk[r * ldh + c] = bits(slab.key(key, 0, d)[c]);
                    sv[r * ldh + c] = bits(slab.value(key, 0, d)[c]);
                }
            }
            if warp_idle || k0 > wlast || k0 + bk - 1 < wfirst {
                continue;
            }
            let mut s: Vec<Lanes<[f32; 4]>> = vec![[[0.0; 4]; 32]; nb_n];
            for ks in 0..ks_n {
                let (mut qh, mut ql) = ([[0u32; 4]; 32], [[0u32; 4]; 32]);
                for lane in 0..32 {
                    let (g, t) = (lane >> 2, lane & 3);
                    let qa = (w0 as usize + g) * ldh + ks * 16 + 2 * t;
                    let qb = qa + 8 * ldh;
                    let w = |v: &[u16], at: usize| v[at] as u32 | (v[at + 1] as u32) << 16;
                    qh[lane] = [w(&sqh, qa), w(&sqh, qb), w(&sqh, qa + 8), w(&sqh, qb + 8)];
                    ql[lane] = [w(&sql, qa), w(&sql, qb), w(&sql, qa + 8), w(&sql, qb + 8)];
                }
                for (nb, snb) in s.iter_mut().enumerate() {
                    let (mut b0, mut b1) = ([0u32; 32], [0u32; 32]);
                    for lane in 0..32 {
                        let (g, t) = (lane >> 2, lane & 3);
                        let kr = (nb * 8 + g) * ldh + ks * 16 + 2 * t;
                        b0[lane] = sk[kr] as u32 | (sk[kr + 1] as u32) << 16;
                        b1[lane] = sk[kr + 8] as u32 | (sk[kr + 9] as u32) << 16;
                    }
                    mma(snb, &qh, &b0, &b1);
                    mma(snb, &ql, &b0, &b1);
                }
            }
            for i in 0..2 {
                let mut mx: Lanes<f32> = [neg; 32];
                for lane in 0..32 {
                    let t = (lane & 3) as i32;
                    for (nb, snb) in s.iter_mut().enumerate() {
                        for e in 0..2 {
                            let key = k0 + nb as i32 * 8 + 2 * t + e as i32;
                            if key > lim(lane, i) || key < lo(lane, i) {
                                snb[lane][2 * i + e] = neg;
                            }
                            mx[lane] = mx[lane].max(snb[lane][2 * i + e]);
                        }
                    }
                }
                for msk in [1, 2] {
                    let other = shfl_xor(&mx, msk);
                    mx.iter_mut().zip(other).for_each(|(a, b)| *a = a.max(b));
                }
                let mut sum: Lanes<f32> = [0.0; 32];
                let mut alpha: Lanes<f32> = [0.0; 32];
                let mut m_use: Lanes<f32> = [0.0; 32];
                for lane in 0..32 {
                    let m_new = m[lane][i].max(mx[lane]);
                    m_use[lane] = if m_new == neg { 0.0 } else { m_new };
                    alpha[lane] = (m[lane][i] - m_use[lane]).exp2();
                    m[lane][i] = m_new;
                    for snb in s.iter_mut() {
                        for e in 0..2 {
                            snb[lane][2 * i + e] = (snb[lane][2 * i + e] - m_use[lane]).exp2();
                            sum[lane] += snb[lane][2 * i + e];
                        }
                    }
                }
                for msk in [1, 2] {
                    let other = shfl_xor(&sum, msk);
                    sum.iter_mut().zip(other).for_each(|(a, b)| *a += b);
                }
                for lane in 0..32 {
                    l[lane][i] = l[lane][i].mul_add(alpha[lane], sum[lane]);
                    for ond in o.iter_mut() {
                        ond[lane][2 * i] *= alpha[lane];
                        ond[lane][2 * i + 1] *= alpha[lane];
                    }
                }
            }
            for kk in 0..kk_n {
                let (mut ph, mut pl) = ([[0u32; 4]; 32], [[0u32; 4]; 32]);
                for lane in 0..32 {
                    let sc = 32768.0f32;
                    let (a, b) = (&s[2 * kk][lane], &s[2 * kk + 1][lane]);
                    for (j, (x0, x1)) in [(a[0], a[1]), (a[2], a[3]), (b[0], b[1]), (b[2], b[3])].into_iter().enumerate() {
                        (ph[lane][j], pl[lane][j]) = split(x0 * sc, x1 * sc);
                    }
                }
                let vr: Lanes<usize> = std::array::from_fn(|lane| (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * ldh + (lane >> 4) * 8);
                for nd in (0..nd_n).step_by(2) {
                    let addr: Lanes<usize> = std::array::from_fn(|lane| vr[lane] + nd * 8);
                    let b = ldsm_x4_trans(&sv, &addr);
                    let reg = |j: usize| -> Lanes<u32> { std::array::from_fn(|lane| b[lane][j]) };
                    let (lo_nd, hi_nd) = o.split_at_mut(nd + 1);
                    mma(&mut lo_nd[nd], &ph, &reg(0), &reg(1));
                    mma(&mut lo_nd[nd], &pl, &reg(0), &reg(1));
                    mma(&mut hi_nd[0], &ph, &reg(2), &reg(3));
                    mma(&mut hi_nd[0], &pl, &reg(2), &reg(3));
                }
            }
        }
        for lane in 0..32 {
            let (g, t) = (lane >> 2, lane & 3);
            for i in 0..2 {
                let r = w0 + g as i32 + 8 * i as i32;
                if r < nq {
                    let inv = 1.0 / l[lane][i];
                    for (nd, ond) in o.iter().enumerate() {
                        out[r as usize][nd * 8 + 2 * t] = ond[lane][2 * i] * (1.0 / 32768.0) * inv;
                        out[r as usize][nd * 8 + 2 * t + 1] = ond[lane][2 * i + 1] * (1.0 / 32768.0) * inv;
                    }
                }
            }
        }
    }
    out
}

/// The simulated kernel against the twin: full and partial tiles (rows past the end, idle
/// warps), a tile deep in a chunk (causally skipped tiles), windows whose edges cut tiles and
/// warp slices, sinks; head dims 64 and 128. Every output row is written and within the
/// f32 kernel's own error of the twin.
#[test]
fn simulated_mma_kernel_matches_the_twin() {
    use crate::ops::attention::AttentionSpec;
    for d in [64usize, 128] {
        let ctx = 512u32;
        let spec = AttentionSpec::new(1, 1, d as u32, ctx / 16, 16);
        let n = spec.cache_elems() as usize;
        let conv = |s| uniform_row(s, 0, n, 1.0).into_iter().map(f16::from_f32).collect::<Vec<_>>();
        let (kc, vc) = (conv(61), conv(62));
        let table: Vec<u32> = (0..ctx / 16).collect();
        let slab = super::cpu::Slab::from_cache(&kc, &vc, &table, ctx as u64, &spec);
        let mut err = RelErr::default();
        // (chunk start, tile's first query, rows, window, sink)
        let cases = [
            (0, 0, 64, 0, None),
            (0, 0, 1, 0, None),
            (0, 0, 17, 0, Some(1.5f32)),
            (0, 64, 50, 0, None),
            (100, 128, 64, 0, Some(-2.0)),
            (37, 192, 33, 0, None),
            (0, 128, 64, 40, None),
            (0, 192, 64, 70, Some(0.5)),
            (11, 256, 47, 9, None),
            (0, 300, 16, 1, None),
        ];
        for (ci, (start, q0, nq, window, sink)) in cases.into_iter().enumerate() {
            let rows = (q0 + nq) as usize;
            let q: Vec<Vec<f32>> = (0..rows)
                .map(|r| uniform_row(67 + ci as u64, (r * d) as u64, d, 4.0).iter().map(|x| x * spec.q_scale()).collect())
                .collect();
            let sink2 = sink.map(sink_log2);
            let got = block(&q, &slab, d, start, q0, nq, window, sink2);
            for (r, got) in got.iter().enumerate() {
                let pos = (start + q0) as u32 + r as u32;
                let mut want = vec![0.0f32; d];
                attend(&q[q0 as usize + r], &slab, 0, first_key(pos, window as u32) as usize, pos as usize + 1, sink2, &mut want);
                assert!(got.iter().all(|x| x.is_finite()), "d={d} case {ci} row {r}: {got:?}");
                let mut one = RelErr::default();
                one.add_slice(0, got, &want);
                assert!(one.value() < TOLERANCE / 10.0, "d={d} case {ci} row {r}: {} {}", one.value(), one.describe());
                err.add_slice(0, got, &want);
            }
        }
        eprintln!("d={d}: simulated mma kernel {:.2e}", err.value());
    }
}
