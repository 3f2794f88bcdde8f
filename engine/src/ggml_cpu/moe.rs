//! The MoE router and the expert combine of llama.cpp's `build_moe_ffn` (softmax gating):
//!
//! - probs = soft_max(router logits) per token ([`super::softmax`]);
//! - the selected experts are the first top_k of `argsort(probs, desc)` ([`super::argsort`]:
//!   libstdc++'s order, so ties pick what llama.cpp picks), in that slot order;
//! - weights = the selected probs; with `norm_topk_prob` (qwen3moe) divided by their sum (summed
//!   in f64 and rounded to f32 as `ggml_sum_rows`, clamped below at 2^-14 as llama.cpp does);
//! - gpt-oss gates the other way round ([`route_softmax_weight`], llama.cpp's
//!   `LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX_WEIGHT`): the first top_k of `argsort(logits, desc)`
//!   (the router's bias already added, [`super::bias`]), then weights = soft_max over those
//!   top_k logits alone, in slot order (a row of top_k: libm's expf below 8);
//! - output = Σ over slots, in slot order, of expert_out · weight: f32 products, then f32 adds
//!   `((e0·w0 + e1·w1) + e2·w2) + …`, as the graph's chain of `ggml_add`.

use super::argsort::argsort_desc;
use super::error::CpuError;
use super::softmax::soft_max;

/// llama.cpp's floor for the sum of the selected probabilities: 6.103515625e-5 = 2^-14, the
/// smallest normal f16.
const WEIGHT_SUM_MIN: f32 = 1.0 / 16384.0;

/// Experts and weights per token: slot s of token t at `t · top_k + s`.
#[derive(Clone, Debug, PartialEq)]
pub struct Routing {
    pub n_expert: usize,
    pub top_k: usize,
    pub experts: Vec<u32>,
    pub weights: Vec<f32>,
}

/// Checks a router shape from model metadata: 1 <= top_k <= n_expert.
pub fn check_moe_shape(n_expert: usize, top_k: usize) -> Result<(), CpuError> {
    if top_k == 0 || top_k > n_expert {
        return Err(CpuError::MoeShape { n_expert, top_k });
    }
    Ok(())
}

/// Routes each token of `logits` (`[n_tokens, n_expert]`).
///
/// # Panics
/// If the shape fails [`check_moe_shape`] (the model loader checks it first) or `logits` is not
/// whole rows of `n_expert`.
pub fn route(logits: &[f32], n_expert: usize, top_k: usize, norm_topk_prob: bool) -> Routing {
    if let Err(e) = check_moe_shape(n_expert, top_k) {
        panic!("route: {e}");
    }
    assert!(logits.len().is_multiple_of(n_expert), "route: {} logits in rows of {n_expert}", logits.len());
    let n_tokens = logits.len() / n_expert;
    let mut experts = Vec::with_capacity(n_tokens * top_k);
    let mut weights = Vec::with_capacity(n_tokens * top_k);
    let mut probs = vec![0.0; n_expert];
    for row in logits.chunks_exact(n_expert) {
        soft_max(row, 1.0, &mut probs);
        let picked = &argsort_desc(&probs)[..top_k];
        let w: Vec<f32> = picked.iter().map(|&e| probs[e as usize]).collect();
        if norm_topk_prob {
            let sum = (w.iter().map(|&v| v as f64).sum::<f64>() as f32).max(WEIGHT_SUM_MIN);
            weights.extend(w.iter().map(|&v| v / sum));
        } else {
            weights.extend(w);
        }
        experts.extend_from_slice(picked);
    }
    Routing { n_expert, top_k, experts, weights }
}

/// Routes each token of `logits` (`[n_tokens, n_expert]`) by gpt-oss's gating: the top_k
/// logits, then their softmax as the weights.
///
/// # Panics
/// As [`route`].
pub fn route_softmax_weight(logits: &[f32], n_expert: usize, top_k: usize) -> Routing {
    if let Err(e) = check_moe_shape(n_expert, top_k) {
        panic!("route_softmax_weight: {e}");
    }
    assert!(logits.len().is_multiple_of(n_expert), "route_softmax_weight: {} logits in rows of {n_expert}", logits.len());
    let n_tokens = logits.len() / n_expert;
    let mut experts = Vec::with_capacity(n_tokens * top_k);
    let mut weights = vec![0.0; n_tokens * top_k];
    for (row, w) in logits.chunks_exact(n_expert).zip(weights.chunks_exact_mut(top_k)) {
        let picked = &argsort_desc(row)[..top_k];
        let l: Vec<f32> = picked.iter().map(|&e| row[e as usize]).collect();
        soft_max(&l, 1.0, w);
        experts.extend_from_slice(picked);
    }
    Routing { n_expert, top_k, experts, weights }
}

impl Routing {
    pub fn n_tokens(&self) -> usize {
        self.experts.len() / self.top_k
    }

    /// For each expert, the (token, slot) pairs routed to it, tokens in increasing order (the
    /// rows to gather for that expert's matmuls).
    pub fn by_expert(&self) -> Vec<Vec<(u32, u32)>> {
        let mut out = vec![Vec::new(); self.n_expert];
        for (i, &e) in self.experts.iter().enumerate() {
            out[e as usize].push(((i / self.top_k) as u32, (i % self.top_k) as u32));
        }
        out
    }
}

/// `out[t] = Σ_s expert_out[t, s] · weights[t · top_k + s]` in slot order, for `expert_out` of
/// `[n_tokens, top_k, hidden]` (each slot's down-projection output).
///
/// # Panics
/// If the lengths disagree.
pub fn combine(expert_out: &[f32], weights: &[f32], top_k: usize, hidden: usize, out: &mut [f32]) {
    assert!(top_k > 0 && hidden > 0, "combine: top_k {top_k}, hidden {hidden}");
    let n_tokens = out.len() / hidden;
    assert!(
        out.len() == n_tokens * hidden && expert_out.len() == n_tokens * top_k * hidden && weights.len() == n_tokens * top_k,
        "combine: {} expert values and {} weights for {} outputs (top_k {top_k}, hidden {hidden})",
        expert_out.len(),
        weights.len(),
        out.len()
    );
    for ((o, e), w) in out.chunks_exact_mut(hidden).zip(expert_out.chunks_exact(top_k * hidden)).zip(weights.chunks_exact(top_k)) {
        for (i, o) in o.iter_mut().enumerate() {
            let mut acc = e[i] * w[0];
            for s in 1..top_k {
                acc += e[s * hidden + i] * w[s];
            }
            *o = acc;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use brink_kernels::testdata::uniform_pm1;

    #[test]
    fn routes_top_k_by_probability_and_renormalises() {
        let n_expert = 16;
        let logits: Vec<f32> = (0..(3 * n_expert) as u64).map(|i| uniform_pm1(1, i) * 4.0).collect();
        for norm in [false, true] {
            let r = route(&logits, n_expert, 4, norm);
            assert_eq!((r.n_tokens(), r.experts.len(), r.weights.len()), (3, 12, 12));
            for t in 0..3 {
                let row = &logits[t * n_expert..(t + 1) * n_expert];
                let m = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
                let z: f64 = row.iter().map(|&v| (v as f64 - m).exp()).sum();
                let p = |e: u32| (row[e as usize] as f64 - m).exp() / z;
                let mut order: Vec<u32> = (0..n_expert as u32).collect();
                order.sort_by(|&a, &b| row[b as usize].total_cmp(&row[a as usize]));
                assert_eq!(&r.experts[t * 4..t * 4 + 4], &order[..4], "token {t}: top experts in descending order");
                let picked_sum: f64 = order[..4].iter().map(|&e| p(e)).sum();
                for (s, &e) in order[..4].iter().enumerate() {
                    let want = if norm { p(e) / picked_sum } else { p(e) };
                    assert!((r.weights[t * 4 + s] as f64 - want).abs() <= 1e-6 * want, "token {t} slot {s}");
                }
                if norm {
                    assert!((r.weights[t * 4..t * 4 + 4].iter().sum::<f32>() - 1.0).abs() < 1e-6);
                }
            }
        }
    }

    /// gpt-oss gating: the same experts as softmax gating (softmax keeps the order), weights the
    /// softmax of the picked logits (checked in f64), summing to 1; ties and top_k 1.
    #[test]
    fn softmax_weight_gating() {
        let (n_expert, top_k) = (32, 4);
        let logits: Vec<f32> = (0..(5 * n_expert) as u64).map(|i| uniform_pm1(7, i) * 6.0).collect();
        let r = route_softmax_weight(&logits, n_expert, top_k);
        assert_eq!(r.experts, route(&logits, n_expert, top_k, true).experts);
        for t in 0..5 {
            let picked: Vec<f64> = r.experts[t * top_k..][..top_k].iter().map(|&e| logits[t * n_expert + e as usize] as f64).collect();
            assert!(picked.windows(2).all(|p| p[0] >= p[1]), "token {t}: slots in descending logit order");
            let z: f64 = picked.iter().map(|l| (l - picked[0]).exp()).sum();
            for (s, l) in picked.iter().enumerate() {
                let want = (l - picked[0]).exp() / z;
                assert!((r.weights[t * top_k + s] as f64 - want).abs() <= 1e-6 * want, "token {t} slot {s}");
            }
            assert!((r.weights[t * top_k..][..top_k].iter().sum::<f32>() - 1.0).abs() < 1e-6);
        }
        // Equal logits: experts in index order, equal weights; one expert: weight 1.
        let r = route_softmax_weight(&[2.0; 8], 8, 4);
        assert_eq!((r.experts, r.weights), (vec![0, 1, 2, 3], vec![0.25; 4]));
        assert_eq!(route_softmax_weight(&[1.0, -3.0, 9.0], 3, 1).weights, vec![1.0]);
    }

    #[test]
    fn equal_logits_pick_libstdcxx_order() {
        // 8 experts, all equal: the insertion sort is stable, so experts 0..top_k in order.
        let r = route(&[0.5; 8], 8, 3, true);
        assert_eq!(r.experts, vec![0, 1, 2]);
        assert!(r.weights.iter().all(|&w| (w - 1.0 / 3.0).abs() < 1e-7));
        // top_k = n_expert and top_k = 1.
        assert_eq!(route(&[1.0, 3.0, 2.0], 3, 3, false).experts, vec![1, 2, 0]);
        assert_eq!(route(&[1.0, 3.0, 2.0], 3, 1, true).weights, vec![1.0]);
    }

    #[test]
    fn by_expert_inverts_the_routing() {
        let n_expert = 128;
        let logits: Vec<f32> = (0..(5 * n_expert) as u64).map(|i| uniform_pm1(9, i)).collect();
        let r = route(&logits, n_expert, 8, true);
        let groups = r.by_expert();
        assert_eq!(groups.iter().map(Vec::len).sum::<usize>(), 5 * 8);
        for (e, g) in groups.iter().enumerate() {
            assert!(g.windows(2).all(|w| w[0].0 < w[1].0), "each token picks an expert once");
            for &(t, s) in g {
                assert_eq!(r.experts[(t * 8 + s) as usize], e as u32);
            }
        }
    }

    #[test]
    fn combine_sums_in_slot_order() {
        // Slot order matters in f32: (1e8 − 1e8) + 1 is 1, (1 + 1e8) − 1e8 is 0.
        let (top_k, hidden) = (3, 1);
        let e = [1e8f32, -1e8, 1.0];
        let mut out = [0.0];
        combine(&e, &[1.0, 1.0, 1.0], top_k, hidden, &mut out);
        assert_eq!(out, [1.0]);
        combine(&[1.0, 1e8, -1e8], &[1.0, 1.0, 1.0], top_k, hidden, &mut out);
        assert_eq!(out, [0.0]);
        // Two tokens, hidden 2.
        let e = [1.0, 2.0, 3.0, 4.0, /* token 1 */ 5.0, 6.0, 7.0, 8.0];
        let mut out = [0.0; 4];
        combine(&e, &[0.5, 0.25, 1.0, 2.0], 2, 2, &mut out);
        assert_eq!(out, [0.5 + 0.75, 1.0 + 1.0, 5.0 + 14.0, 6.0 + 16.0]);
    }

    #[test]
    fn bad_shapes_are_errors() {
        assert_eq!(check_moe_shape(8, 0), Err(CpuError::MoeShape { n_expert: 8, top_k: 0 }));
        assert!(check_moe_shape(8, 9).unwrap_err().to_string().contains("top_k 9"));
        assert!(check_moe_shape(128, 8).is_ok());
    }
}
