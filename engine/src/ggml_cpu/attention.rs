//! Causal GQA attention for one sequence, as llama.cpp computes it without flash attention
//! (`build_attn_mha`: kq = mul_mat(K, Q); soft_max_ext(kq, mask, scale); kqv = mul_mat(Vᵀ, kq)):
//!
//! - K is f16, so Q is rounded to f16 (K's vec_dot_type) and each score is an f16·f16 dot with
//!   exact products summed in f32;
//! - softmax of score · scale over the visible keys (the causal mask drops the others; adding
//!   −inf to them gives exp = 0 in ggml), see [`super::softmax`];
//! - the probabilities are rounded to f16 (Vᵀ is f16) and each output value is the f32 sum
//!   over positions of f16 p · f16 v, exact products.
//!
//! gpt-oss adds two things ([`AttnExt`], [`attention_ext`]): a sliding window on alternate
//! layers (llama.cpp's `LLAMA_SWA_TYPE_STANDARD`: key j is masked for query p when p − j >=
//! window, so a query sees `window` keys, itself included), and a per-head sink logit in the
//! softmax ([`super::softmax`]). Masked keys before the window still sit in ggml's row: the
//! softmax's vectors of 8 are counted from key 0, so the visible part starts on that grid.
//!
//! Query head h reads KV head h / (n_head / n_kv), as ggml's broadcast of src0 over src1 does.
//! Both matmuls sum in ggml's AVX2 order ([`super::float_dot`]): `ggml_vec_dot_f16` for a batch
//! of one token (decode), llamafile's sgemm for more (prefill); with ggml's vector expf in the
//! softmax, the outputs are llama.cpp's bit for bit (checked against its ggml on x86 AVX2, both
//! cases, KV length 256; gpt-oss's window of 128 at its edge, sinks, and a wrapped cache).

use half::f16;
use rayon::prelude::*;

use super::act_quant::{f16_to_f32, round_f16};
use super::float_dot::{self, SumOrder};
use super::ggml_exp::VECTOR;
use super::softmax::soft_max_visible_in_place;

/// gpt-oss's additions to [`attention_in_batch`]; the default adds nothing (qwen3moe).
#[derive(Clone, Copy, Debug, Default)]
pub struct AttnExt<'a> {
    /// Sliding window: a query at position p sees keys at p − window < j <= p.
    pub window: Option<u32>,
    /// One sink logit per query head (`ggml_soft_max_add_sinks`), not multiplied by the scale.
    pub sinks: Option<&'a [f32]>,
}

/// Attention of `q` (`[n_q, n_head, d]`) over `k`, `v` (`[n_kv_pos, n_kv, d]`, f16) into `out`
/// (`[n_q, n_head, d]`); query i sees keys `0..=q_pos[i]`; scores are multiplied by `scale`.
/// Sums as llama.cpp does for a batch of `n_q` tokens ([`attention_in_batch`] with `n_q`).
///
/// # Panics
/// If the lengths disagree with the shapes, `n_head` is not a multiple of `n_kv`, or a query's
/// position is past the keys: the graph sizes these from the checked config and the KV cache.
#[allow(clippy::too_many_arguments)]
pub fn attention(q: &[f32], k: &[f16], v: &[f16], q_pos: &[u32], n_head: usize, n_kv: usize, d: usize, scale: f32, out: &mut [f32]) {
    attention_in_batch(q, k, v, q_pos, n_head, n_kv, d, scale, q_pos.len(), out);
}

/// [`attention`] for the queries of one sequence inside a llama.cpp batch of `batch_tokens`
/// tokens (all sequences together): that count, not this sequence's, picks ggml's summation
/// order — `ggml_vec_dot_f16` for a batch of one (decode), llamafile's sgemm for more, where
/// its shapes allow (head_dim a multiple of 8 for the scores, of 4 for the output).
#[allow(clippy::too_many_arguments)]
pub fn attention_in_batch(
    q: &[f32],
    k: &[f16],
    v: &[f16],
    q_pos: &[u32],
    n_head: usize,
    n_kv: usize,
    d: usize,
    scale: f32,
    batch_tokens: usize,
    out: &mut [f32],
) {
    attention_ext(q, k, v, q_pos, n_head, n_kv, d, scale, batch_tokens, AttnExt::default(), out);
}

/// [`attention_in_batch`] with a sliding window and/or sinks ([`AttnExt`]).
///
/// # Panics
/// As [`attention`], and if the window is 0 or the sinks are not one per query head.
#[allow(clippy::too_many_arguments)]
pub fn attention_ext(
    q: &[f32],
    k: &[f16],
    v: &[f16],
    q_pos: &[u32],
    n_head: usize,
    n_kv: usize,
    d: usize,
    scale: f32,
    batch_tokens: usize,
    ext: AttnExt<'_>,
    out: &mut [f32],
) {
    check_shapes(q, k, v, q_pos.len(), n_head, n_kv, d, ext, out);
    let n_pos = k.len() / (n_kv * d);
    if let Some(&p) = q_pos.iter().find(|&&p| p as usize >= n_pos) {
        panic!("attention: a query at position {p} over {n_pos} cached positions");
    }
    // Keys first..=p of each query, from the start of first's vector of 8.
    let first = |p: u32| ext.window.map_or(0, |w| (p as usize + 1).saturating_sub(w as usize));
    let spans: Vec<(usize, usize)> = q_pos.iter().map(|&p| (first(p) / VECTOR * VECTOR, p as usize + 1)).collect();
    attend(q, k, v, n_head, n_kv, d, scale, batch_tokens, ext.sinks, &spans, &|i, j| j >= first(q_pos[i]), out);
}

/// [`attention_ext`] over a KV cache whose cells are not in position order, as llama.cpp's
/// sliding-window cache reuses the cells of keys out of every window: cell c holds the key at
/// `cell_pos[c]` (`None`: empty). A query sees the cells at positions it sees (causal, and in
/// the window); ggml's softmax vectors and output lanes follow the cells, not the positions.
///
/// # Panics
/// As [`attention_ext`], if `cell_pos` is not one per cell, or a query sees no cell (its own
/// key is always cached before it attends).
#[allow(clippy::too_many_arguments)]
pub fn attention_cells(
    q: &[f32],
    k: &[f16],
    v: &[f16],
    cell_pos: &[Option<u32>],
    q_pos: &[u32],
    n_head: usize,
    n_kv: usize,
    d: usize,
    scale: f32,
    batch_tokens: usize,
    ext: AttnExt<'_>,
    out: &mut [f32],
) {
    check_shapes(q, k, v, q_pos.len(), n_head, n_kv, d, ext, out);
    assert_eq!(cell_pos.len() * n_kv * d, k.len(), "attention: {} cell positions for {} values of k", cell_pos.len(), k.len());
    // llama_hparams::is_masked_swa (standard): masked when p − j >= window.
    let sees = |p: u32, c: usize| cell_pos[c].is_some_and(|j| j <= p && ext.window.is_none_or(|w| p - j < w));
    let spans: Vec<(usize, usize)> = q_pos
        .iter()
        .map(|&p| {
            let lo = (0..cell_pos.len()).find(|&c| sees(p, c));
            let hi = (0..cell_pos.len()).rfind(|&c| sees(p, c));
            match (lo, hi) {
                (Some(lo), Some(hi)) => (lo / VECTOR * VECTOR, hi + 1),
                _ => panic!("attention: the query at position {p} sees no cached cell"),
            }
        })
        .collect();
    attend(q, k, v, n_head, n_kv, d, scale, batch_tokens, ext.sinks, &spans, &|i, c| sees(q_pos[i], c), out);
}

#[allow(clippy::too_many_arguments)]
fn check_shapes(q: &[f32], k: &[f16], v: &[f16], n_q: usize, n_head: usize, n_kv: usize, d: usize, ext: AttnExt<'_>, out: &[f32]) {
    assert!(ext.window != Some(0), "attention: a sliding window of 0 keys");
    if let Some(s) = ext.sinks {
        assert_eq!(s.len(), n_head, "attention: {} sinks for {n_head} query heads", s.len());
    }
    assert!(d > 0 && n_kv > 0 && n_head.is_multiple_of(n_kv), "attention: {n_head} query heads over {n_kv} KV heads of {d}");
    assert_eq!(q.len(), n_q * n_head * d, "attention: q of {} values for {n_q} queries x {n_head} heads x {d}", q.len());
    assert_eq!(out.len(), q.len(), "attention: out of {} values for q of {}", out.len(), q.len());
    assert!(
        k.len() == v.len() && k.len().is_multiple_of(n_kv * d),
        "attention: k {} and v {} values in rows of {n_kv} x {d}",
        k.len(),
        v.len()
    );
}

/// The attention of every (query, head) over cells `spans[i].0..spans[i].1` (the start on the
/// softmax's 8-grid), `visible(i, cell)` saying which of them query i sees.
#[allow(clippy::too_many_arguments)]
fn attend(
    q: &[f32],
    k: &[f16],
    v: &[f16],
    n_head: usize,
    n_kv: usize,
    d: usize,
    scale: f32,
    batch_tokens: usize,
    sinks: Option<&[f32]>,
    spans: &[(usize, usize)],
    visible: &(dyn Fn(usize, usize) -> bool + Sync),
    out: &mut [f32],
) {
    let group = n_head / n_kv;
    // llamafile's sgemm takes two or more rows when the row length is a multiple of 8 and the
    // row count of 4: scores have length d and n_kv rows (llama.cpp pads n_kv to 256), outputs
    // length n_kv and d rows.
    let pick = |ok: bool| if batch_tokens >= 2 && ok { SumOrder::Sgemm } else { SumOrder::VecDot };
    let (qk_order, pv_order) = (pick(d.is_multiple_of(8)), pick(d.is_multiple_of(4)));
    // K and V widened to f32 once for every query and head (the conversion is exact, so the
    // sums below see the same values): prefill over a long cache is O(n²), its conversions
    // need not be.
    let kf: Vec<f32> = k.par_iter().map(|&h| widen(h)).collect();
    let vf: Vec<f32> = v.par_iter().map(|&h| widen(h)).collect();
    let lanes = if pv_order == SumOrder::VecDot { float_dot::VEC_DOT_LANES } else { float_dot::SGEMM_LANES };
    out.par_chunks_exact_mut(d).enumerate().for_each(|(qh, o)| {
        let (i, h) = (qh / n_head, qh % n_head);
        let kvh = h / group;
        let (start, end) = spans[i];
        let qr: Vec<f32> = q[qh * d..(qh + 1) * d].iter().map(|&x| round_f16(x)).collect();
        let mut p: Vec<f32> = (start..end)
            .map(|j| {
                if visible(i, j) {
                    float_dot::dot(qk_order, &kf[(j * n_kv + kvh) * d..][..d], &qr, |x| x) * scale
                } else {
                    f32::NEG_INFINITY // masked: exp 0
                }
            })
            .collect();
        soft_max_visible_in_place(&mut p, 1.0, sinks.map(|s| s[h]));
        // Each output value is the dot of a Vᵀ row with the f16 probabilities over llama.cpp's
        // KV length (a multiple of 256: no tail), position j in its lane, masked ones adding 0.
        // Accumulators are lane-major ([lane][d]) so the inner loop runs over contiguous dims;
        // every (dim, lane) accumulator still sums its positions in order.
        let mut acc = vec![0.0f32; lanes * d];
        for (j, &pj) in (start..).zip(&p) {
            let pj = round_f16(pj);
            if pj == 0.0 {
                continue; // adds exactly 0 to every lane it would touch
            }
            let lane = j % lanes;
            for (a, vv) in acc[lane * d..(lane + 1) * d].iter_mut().zip(&vf[(j * n_kv + kvh) * d..][..d]) {
                *a += pj * vv;
            }
        }
        for (c, o) in o.iter_mut().enumerate() {
            *o = match pv_order {
                SumOrder::Sgemm => float_dot::hsum8(&std::array::from_fn(|l| acc[l * d + c])),
                _ => float_dot::reduce_vec_dot(&std::array::from_fn(|l| acc[l * d + c])),
            };
        }
    });
}

fn widen(h: f16) -> f32 {
    f16_to_f32(h.to_bits())
}

#[cfg(test)]
mod tests {
    use super::*;
    use brink_kernels::testdata::uniform_pm1;

    fn f16s(seed: u64, n: usize, scale: f32) -> Vec<f16> {
        (0..n as u64).map(|i| f16::from_f32(uniform_pm1(seed, i) * scale)).collect()
    }

    /// f64 attention over the same f16 K, V and f16-rounded Q: the only differences are f32 sums
    /// of the scores (relative 2^-24 per term, times the score's size before exp), the f16
    /// rounding of the probabilities (2^-11 relative) and the f32 sum of the outputs.
    #[allow(clippy::too_many_arguments)]
    fn reference(q: &[f32], k: &[f16], v: &[f16], q_pos: &[u32], n_head: usize, n_kv: usize, d: usize, scale: f32) -> Vec<f64> {
        reference_ext(q, k, v, q_pos, n_head, n_kv, d, scale, AttnExt::default())
    }

    /// [`reference`] with a window (keys first..=pos) and sinks (in the max and the total).
    #[allow(clippy::too_many_arguments)]
    fn reference_ext(
        q: &[f32],
        k: &[f16],
        v: &[f16],
        q_pos: &[u32],
        n_head: usize,
        n_kv: usize,
        d: usize,
        scale: f32,
        ext: AttnExt,
    ) -> Vec<f64> {
        let mut out = vec![0.0; q.len()];
        for (i, &pos) in q_pos.iter().enumerate() {
            for h in 0..n_head {
                let kvh = h / (n_head / n_kv);
                let qr: Vec<f64> = q[(i * n_head + h) * d..][..d].iter().map(|&x| f16::from_f32(x).to_f64()).collect();
                let first = ext.window.map_or(0, |w| (pos + 1).saturating_sub(w)) as usize;
                let keys = first..=pos as usize;
                let s: Vec<f64> = keys
                    .clone()
                    .map(|j| k[(j * n_kv + kvh) * d..][..d].iter().zip(&qr).map(|(a, b)| a.to_f64() * b).sum::<f64>() * scale as f64)
                    .collect();
                let sink = ext.sinks.map_or(f64::NEG_INFINITY, |s| s[h] as f64);
                let m = s.iter().cloned().fold(sink, f64::max);
                let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
                let z: f64 = e.iter().sum::<f64>() + (sink - m).exp();
                for c in 0..d {
                    out[(i * n_head + h) * d + c] = keys.clone().zip(&e).map(|(j, e)| e / z * v[(j * n_kv + kvh) * d + c].to_f64()).sum();
                }
            }
        }
        out
    }

    #[test]
    fn matches_f64_attention_with_gqa_and_causality() {
        // 6 query heads over 2 KV heads of 64; a prefill of 5 tokens at 0..5, and decode queries.
        let (n_head, n_kv, d, n_pos) = (6, 2, 64, 40);
        let k = f16s(1, n_pos * n_kv * d, 1.0);
        let v = f16s(2, n_pos * n_kv * d, 1.0);
        let scale = 1.0 / (d as f32).sqrt();
        for q_pos in [vec![0u32, 1, 2, 3, 4], vec![39], vec![17, 39, 0]] {
            let q: Vec<f32> = (0..(q_pos.len() * n_head * d) as u64).map(|i| uniform_pm1(3, i) * 2.0).collect();
            let mut out = vec![f32::NAN; q.len()];
            attention(&q, &k, &v, &q_pos, n_head, n_kv, d, scale, &mut out);
            let exact = reference(&q, &k, &v, &q_pos, n_head, n_kv, d, scale);
            // Each output is a convex mix of |v| <= 1: f16 probabilities are off by 2^-11 relative
            // each, so the mix moves by at most 2^-11 (plus f32 sums).
            for (i, (&got, &e)) in out.iter().zip(&exact).enumerate() {
                assert!((got as f64 - e).abs() <= 2f64.powi(-11) + 1e-5, "q_pos {q_pos:?} value {i}: {got} vs {e}");
            }
        }
    }

    /// The batch size, not the queries passed, picks the summation order: queries attended one
    /// at a time inside a batch of 3 equal the three attended together.
    #[test]
    fn batch_size_picks_the_order() {
        let (n_head, n_kv, d, n_pos) = (4, 2, 64, 50);
        let k = f16s(11, n_pos * n_kv * d, 2.0);
        let v = f16s(12, n_pos * n_kv * d, 1.0);
        let q_pos = [20u32, 33, 49];
        let q: Vec<f32> = (0..(3 * n_head * d) as u64).map(|i| uniform_pm1(13, i) * 3.0).collect();
        let mut together = vec![0.0; q.len()];
        attention(&q, &k, &v, &q_pos, n_head, n_kv, d, 0.125, &mut together);
        let row = n_head * d;
        for (i, &p) in q_pos.iter().enumerate() {
            let mut one = vec![0.0; row];
            attention_in_batch(&q[i * row..(i + 1) * row], &k, &v, &[p], n_head, n_kv, d, 0.125, 3, &mut one);
            assert_eq!(one, together[i * row..(i + 1) * row], "query {i}");
        }
    }

    /// A decode query past 2^16 positions, over a cache that long: indexes and sums hold up.
    #[test]
    fn long_context_past_2_16() {
        let (n_head, n_kv, d, n_pos) = (2, 1, 32, 70_001);
        let k = f16s(21, n_pos * n_kv * d, 1.0);
        let v = f16s(22, n_pos * n_kv * d, 1.0);
        let q: Vec<f32> = (0..(n_head * d) as u64).map(|i| uniform_pm1(23, i) * 2.0).collect();
        let q_pos = [70_000u32];
        let mut out = vec![f32::NAN; q.len()];
        attention(&q, &k, &v, &q_pos, n_head, n_kv, d, 0.2, &mut out);
        let exact = reference(&q, &k, &v, &q_pos, n_head, n_kv, d, 0.2);
        // As above: f16 probabilities move a convex mix of |v| <= 1 by at most 2^-11; the f32
        // sums over 70,001 positions stay well inside 1e-4 of it.
        for (i, (&got, &e)) in out.iter().zip(&exact).enumerate() {
            assert!((got as f64 - e).abs() <= 2f64.powi(-11) + 1e-4, "value {i}: {got} vs {e}");
        }
    }

    #[test]
    fn first_position_sees_only_itself() {
        let (n_head, n_kv, d) = (2, 1, 32);
        let k = f16s(4, 3 * d, 1.0);
        let v = f16s(5, 3 * d, 1.0);
        let q: Vec<f32> = (0..(n_head * d) as u64).map(|i| uniform_pm1(6, i)).collect();
        let mut out = vec![0.0; q.len()];
        attention(&q, &k, &v, &[0], n_head, n_kv, d, 0.3, &mut out);
        // One visible key: probability 1, output = v[0] exactly, for both heads.
        for h in 0..n_head {
            assert!(out[h * d..(h + 1) * d].iter().zip(&v[..d]).all(|(o, v)| *o == v.to_f32()));
        }
    }

    #[test]
    fn kv_head_mapping_is_h_over_group() {
        // Two KV heads with constant, different values: query heads 0..2 read head 0, 2..4 head 1.
        let (n_head, n_kv, d) = (4, 2, 32);
        let k = vec![f16::from_f32(0.0); 2 * n_kv * d];
        let v: Vec<f16> = (0..2 * n_kv * d).map(|i| f16::from_f32(if (i / d) % n_kv == 0 { 1.0 } else { -2.0 })).collect();
        let q = vec![0.5; n_head * d];
        let mut out = vec![0.0; q.len()];
        attention(&q, &k, &v, &[1], n_head, n_kv, d, 1.0, &mut out);
        for h in 0..n_head {
            let want = if h < 2 { 1.0 } else { -2.0 };
            assert!(out[h * d..(h + 1) * d].iter().all(|&o| o == want), "head {h}");
        }
    }

    /// Window and sinks against f64, queries at the window's edge (the window is 16 keys:
    /// positions 15, 16 and 17 are the last that see key 0, the first that do not, and the next)
    /// and far past it; a decode and a prefill batch, so both summation orders.
    #[test]
    fn window_and_sinks_match_f64() {
        let (n_head, n_kv, d, n_pos, w) = (4, 2, 64, 60, 16u32);
        let k = f16s(31, n_pos * n_kv * d, 1.0);
        let v = f16s(32, n_pos * n_kv * d, 1.0);
        let sinks = [-1.0f32, 0.0, 2.5, f32::NEG_INFINITY];
        for q_pos in [vec![14u32, 15, 16, 17, 18, 59], vec![16], vec![41]] {
            let q: Vec<f32> = (0..(q_pos.len() * n_head * d) as u64).map(|i| uniform_pm1(33, i) * 2.0).collect();
            for ext in [
                AttnExt { window: Some(w), sinks: None },
                AttnExt { window: Some(w), sinks: Some(&sinks) },
                AttnExt { window: None, sinks: Some(&sinks) },
            ] {
                let mut out = vec![f32::NAN; q.len()];
                attention_ext(&q, &k, &v, &q_pos, n_head, n_kv, d, 0.125, q_pos.len(), ext, &mut out);
                let exact = reference_ext(&q, &k, &v, &q_pos, n_head, n_kv, d, 0.125, ext);
                // As matches_f64_attention_with_gqa_and_causality (a sink only shrinks the mix).
                for (i, (&got, &e)) in out.iter().zip(&exact).enumerate() {
                    assert!((got as f64 - e).abs() <= 2f64.powi(-11) + 1e-5, "q_pos {q_pos:?} {ext:?} value {i}: {got} vs {e}");
                }
            }
        }
    }

    /// A window covering every key is full attention, and −inf sinks are none, bit for bit; a
    /// window of one key returns that key's value (its probability is exactly 1).
    #[test]
    fn wide_window_and_neg_inf_sinks_change_nothing() {
        let (n_head, n_kv, d, n_pos) = (4, 2, 64, 40);
        let k = f16s(41, n_pos * n_kv * d, 1.0);
        let v = f16s(42, n_pos * n_kv * d, 1.0);
        let q_pos = [0u32, 9, 31, 39];
        let q: Vec<f32> = (0..(q_pos.len() * n_head * d) as u64).map(|i| uniform_pm1(43, i) * 3.0).collect();
        let mut full = vec![0.0; q.len()];
        attention(&q, &k, &v, &q_pos, n_head, n_kv, d, 0.125, &mut full);
        let none = [f32::NEG_INFINITY; 4];
        for ext in [AttnExt { window: Some(40), sinks: None }, AttnExt { window: Some(1 << 20), sinks: Some(&none) }] {
            let mut got = vec![0.0; q.len()];
            attention_ext(&q, &k, &v, &q_pos, n_head, n_kv, d, 0.125, q_pos.len(), ext, &mut got);
            assert_eq!(got, full, "{ext:?}");
        }
        // A window of 39 keys is not full attention for the query at 39.
        let mut got = vec![0.0; q.len()];
        attention_ext(&q, &k, &v, &q_pos, n_head, n_kv, d, 0.125, q_pos.len(), AttnExt { window: Some(39), sinks: None }, &mut got);
        let last = 3 * n_head * d;
        assert_eq!(got[..last], full[..last]);
        assert_ne!(got[last..], full[last..]);
        attention_ext(&q, &k, &v, &q_pos, n_head, n_kv, d, 0.125, q_pos.len(), AttnExt { window: Some(1), sinks: None }, &mut got);
        for (i, &p) in q_pos.iter().enumerate() {
            for h in 0..n_head {
                let want = &v[(p as usize * n_kv + h / 2) * d..][..d];
                assert!(got[(i * n_head + h) * d..][..d].iter().zip(want).all(|(o, v)| *o == v.to_f32()), "query {i} head {h}");
            }
        }
    }

    /// Cells in position order are [`attention_ext`] bit for bit; a ring of cells (positions
    /// 24..64 in 40 cells, wrapped at cell 24) matches f64 over the same keys; an empty cell, or
    /// one holding a key out of every window, changes nothing however large its key and value.
    #[test]
    fn cells_in_any_order() {
        let (n_head, n_kv, d, w) = (4, 2, 64, 16u32);
        let sinks = [0.5f32, -2.0, 1.0, 3.0];
        let ext = AttnExt { window: Some(w), sinks: Some(&sinks) };
        let k = f16s(51, 64 * n_kv * d, 1.0);
        let v = f16s(52, 64 * n_kv * d, 1.0);
        let q_pos = [15u32, 16, 17, 40];
        let q: Vec<f32> = (0..(q_pos.len() * n_head * d) as u64).map(|i| uniform_pm1(53, i) * 2.0).collect();
        let (mut lin, mut cel) = (vec![0.0; q.len()], vec![0.0; q.len()]);
        let in_order: Vec<Option<u32>> = (0..41).map(Some).collect();
        let kv = 41 * n_kv * d;
        attention_ext(&q, &k[..kv], &v[..kv], &q_pos, n_head, n_kv, d, 0.125, 4, ext, &mut lin);
        attention_cells(&q, &k[..kv], &v[..kv], &in_order, &q_pos, n_head, n_kv, d, 0.125, 4, ext, &mut cel);
        assert_eq!(lin, cel);

        // Ring: cell c holds position 24 + (c + 16) % 40, so positions 24..64 sit in cells 24..40, 0..24.
        let ring_pos: Vec<Option<u32>> = (0..40).map(|c| Some(24 + (c + 16) % 40)).collect();
        let row = n_kv * d;
        let mut rk = vec![f16::ZERO; 40 * row];
        let mut rv = rk.clone();
        for (c, p) in ring_pos.iter().enumerate() {
            let p = p.unwrap() as usize;
            rk[c * row..][..row].copy_from_slice(&k[p * row..][..row]);
            rv[c * row..][..row].copy_from_slice(&v[p * row..][..row]);
        }
        // 41 is the first query whose window (26..=41) is all in the ring, and misses 24 and 25.
        let q_pos = [41u32, 42, 43, 63];
        let mut got = vec![0.0; q.len()];
        attention_cells(&q, &rk, &rv, &ring_pos, &q_pos, n_head, n_kv, d, 0.125, 4, ext, &mut got);
        let exact = reference_ext(&q, &k, &v, &q_pos, n_head, n_kv, d, 0.125, ext);
        for (i, (&g, &e)) in got.iter().zip(&exact).enumerate() {
            assert!((g as f64 - e).abs() <= 2f64.powi(-11) + 1e-5, "value {i}: {g} vs {e}");
        }
        // Replace the cells of positions 24 and 25 (out of every window here) with huge garbage,
        // once as empty cells and once as still holding those positions: the same bits.
        let (mut gk, mut gv) = (rk.clone(), rv.clone());
        gk[24 * row..26 * row].iter_mut().chain(&mut gv[24 * row..26 * row]).for_each(|x| *x = f16::from_f32(3e4));
        let mut empty = ring_pos.clone();
        empty[24] = None;
        empty[25] = None;
        for pos in [&ring_pos, &empty] {
            let mut again = vec![0.0; q.len()];
            attention_cells(&q, &gk, &gv, pos, &q_pos, n_head, n_kv, d, 0.125, 4, ext, &mut again);
            assert_eq!(again, got);
        }
    }

    #[test]
    #[should_panic(expected = "sees no cached cell")]
    fn a_query_with_no_cell_panics() {
        let k = vec![f16::ZERO; 2 * 32];
        attention_cells(
            &[0.0; 32],
            &k,
            &k,
            &[Some(0), None],
            &[5],
            1,
            1,
            32,
            1.0,
            1,
            AttnExt { window: Some(4), sinks: None },
            &mut [0.0; 32],
        );
    }

    #[test]
    #[should_panic(expected = "position 3 over 3 cached")]
    fn query_past_the_cache_panics() {
        let k = vec![f16::ZERO; 3 * 32];
        attention(&[0.0; 32], &k, &k, &[3], 1, 1, 32, 1.0, &mut [0.0; 32]);
    }
}
