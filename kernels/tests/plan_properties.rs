//! Property: for every token count 1..=2^20 and every top_k in the set, every launch plan of
//! every kernel family stays within the H200's and GB10's recorded limits, and its covers are
//! consistent (each work item owned exactly once, no idle block); for small counts the mapping
//! is simulated block by block and each item is visited exactly once.
//!
//! Configurations come from the self-test catalogue for the Qwen3-30B-A3B class, with top_k
//! varied over the whole set (routing and weight type do not change geometry, so one of each
//! distinct plan-relevant configuration is kept), and the attention of a gpt-oss-like class
//! (sinks on every layer, a sliding window of 128 on every other one).

use std::collections::BTreeMap;

use brink_kernels::limits::DeviceLimits;
use brink_kernels::selftest::case::{Case, OpCase};
use brink_kernels::selftest::catalogue::{Options, derive};
use brink_kernels::thresholds::{LayerSpec, ModelShape, Serving, TOP_K_SET};
use rayon::prelude::*;

const MAX_TOKENS: u64 = 1 << 20;
/// Counts up to which the mapping is simulated item by item.
const SIMULATE_UP_TO: u64 = 48;

/// One case per distinct plan-relevant configuration, for each top_k of the set.
fn configurations() -> Vec<Case> {
    let mut by_key: BTreeMap<String, Case> = BTreeMap::new();
    for &k in &TOP_K_SET {
        let mut shape = ModelShape::qwen3_30b_a3b();
        shape.top_k = k;
        let opts = Options { memory_budget_bytes: u64::MAX, negative_controls: false, max_tokens: None };
        for case in derive(&shape, &Serving::default(), &DeviceLimits::gb10(), &opts).cases {
            let key = plan_key(&case.params);
            by_key.entry(key).or_insert(case);
        }
    }
    let mut windowed = ModelShape::qwen3_30b_a3b();
    let kind = |w: Option<&str>| -> BTreeMap<String, String> {
        let gpt_oss = [("attention.sinks", "true"), ("attention.biases", "true"), ("ffn.biases", "true")];
        w.map(|w| ("attention.window".to_string(), w.to_string())).into_iter().chain(gpt_oss.map(|(k, v)| (k.into(), v.into()))).collect()
    };
    windowed.layers = vec![
        LayerSpec { count: 1, weights: BTreeMap::new(), kind: kind(Some("128")) },
        LayerSpec { count: 1, weights: BTreeMap::new(), kind: kind(None) },
    ];
    let opts = Options { memory_budget_bytes: u64::MAX, negative_controls: false, max_tokens: None };
    for case in derive(&windowed, &Serving::default(), &DeviceLimits::gb10(), &opts).cases {
        // Sinks change no plan: the windowed families only, and the biases' (gpt-oss's layers).
        if matches!(case.params, OpCase::Attention(c) if c.window > 0) || matches!(case.params, OpCase::Bias(_)) {
            by_key.entry(plan_key(&case.params)).or_insert(case);
        }
    }
    by_key.into_values().collect()
}

/// The parameters that can change a launch (not routing, not the data).
fn plan_key(p: &OpCase) -> String {
    match p {
        OpCase::Router(c) => format!("router e{} k{}", c.experts, c.top_k),
        OpCase::MoeAlign(c) => format!("align e{} k{} t{}", c.experts, c.top_k, c.tile),
        OpCase::Quantize(c) => format!("quantize k{} e{} top{} t{} g{}", c.k, c.experts, c.top_k, c.tile, c.gather),
        OpCase::MoeGemv(c) | OpCase::NegGemvGridZ(c) => format!("gemv e{} k{} n{} kk{} {}", c.experts, c.top_k, c.n, c.k, c.wtype),
        OpCase::MoeGemm(c) => format!("gemm e{} k{} n{} kk{} {}", c.experts, c.top_k, c.n, c.k, c.wtype),
        OpCase::MoeCombine(c) => format!("combine k{} n{}", c.top_k, c.n),
        // The weight format changes only which widths are refused, not the geometry.
        OpCase::MoeGemvSwiglu(c) => format!("gemv_swiglu e{} k{} h{} f{}", c.dims.experts, c.dims.top_k, c.dims.hidden, c.dims.ffn),
        OpCase::MoeGemvCombine(c) => format!("gemv_combine e{} k{} h{} f{}", c.dims.experts, c.dims.top_k, c.dims.hidden, c.dims.ffn),
        OpCase::LatentProj(c) | OpCase::NegLatentTailSkip(c) => format!("latent k{} w{} g{} {}", c.k, c.width, c.groups, c.wtype),
        OpCase::Embed(c) => format!("embed v{} h{} {}", c.vocab, c.hidden, c.table),
        OpCase::RmsNorm(c) => format!("rmsnorm w{} r{}", c.width, c.rows_per_token),
        OpCase::RmsNormQ8_1(c) => format!("rmsnorm_q8_1 w{} r{}", c.width, c.rows_per_token),
        OpCase::Rope(c) => format!("rope h{} d{}", c.heads, c.head_dim),
        OpCase::NormRope(c) => format!("norm_rope h{} d{}", c.heads, c.head_dim),
        OpCase::OutputHead(c) => format!("head h{} v{} {} s{:?}", c.hidden, c.vocab, c.wtype, c.sequences),
        OpCase::Sampling(c) => format!("sampling v{}", c.vocab),
        OpCase::Attention(c) => {
            let (h, kv, d, ctx, w) = (c.heads, c.kv_heads, c.head_dim, c.context, c.window);
            format!("attention h{h} kv{kv} d{d} ctx{ctx} {:?} {:?} w{w} sinks {}", c.layout, c.route, c.sinks)
        }
        OpCase::Linear(c) => format!("linear n{} k{} {}", c.n, c.k, c.wtype),
        OpCase::Qkv(c) => format!("qkv k{} n{:?} {:?}", c.k, c.n, c.wtype),
        OpCase::Swiglu(c) => format!("swiglu w{} r{} {:?} {:?}", c.width, c.rows_per_token, c.layout, c.output),
        OpCase::Add(c) => format!("add w{}", c.width),
        OpCase::Bias(c) => format!("bias w{} {:?}", c.width, c.picks),
        OpCase::DenseF32(c) => format!("dense_f32 n{} k{}", c.n, c.k),
    }
}

fn check(case: &Case, tokens: u64, limits: &DeviceLimits) -> Result<(), String> {
    // The case's own parameters at this count (no clone of the case per count: a million counts
    // per configuration).
    let launches = case.params.plans(tokens, limits).map_err(|e| format!("{} at {tokens} on {}: {e}", case.id, limits.name))?;
    if launches.is_empty() {
        return Err(format!("{} at {tokens}: no launch", case.id));
    }
    for l in &launches {
        l.check_cover().map_err(|e| format!("{} at {tokens} on {}: {e}", case.id, limits.name))?;
        if tokens <= SIMULATE_UP_TO {
            for i in 0..l.cover.len() {
                let hits = l.simulate_cover(i);
                if let Some(bad) = hits.iter().position(|&h| h != 1) {
                    return Err(format!("{} at {tokens}: {} item {bad} visited {} times", case.id, l.kernel, hits[bad]));
                }
            }
        }
    }
    Ok(())
}

#[test]
fn every_plan_fits_h200_and_gb10_for_every_count_to_2_pow_20() {
    let configs = configurations();
    assert!(configs.len() >= 7 * 5, "expected every family for every top_k, got {}", configs.len());
    let limits = DeviceLimits::recorded();
    let failures: Vec<String> = configs
        .par_iter()
        .flat_map_iter(|case| {
            let limits = &limits;
            (1..=MAX_TOKENS).filter_map(move |t| limits.iter().find_map(|l| check(case, t, l).err())).take(3)
        })
        .collect();
    assert!(
        failures.is_empty(),
        "{} failures, first ones:\n{}",
        failures.len(),
        failures.iter().take(20).cloned().collect::<Vec<_>>().join("\n")
    );
}

/// Every case the catalogue derives for a gpt-oss-20b-shaped class (hidden and expert width
/// 2,880: 90 blocks of 32, no K-quant fits; 64 heads of 64, 8 KV heads, 32 experts, top-4, a
/// vocabulary of 201,088; MXFP4 experts; windowed and full layers with sinks, biases, YaRN,
/// clamped SwiGLU)
/// plans at its own count on the H200 and the GB10, up to 2^20 tokens. A refusal at such a count
/// fails the node's self-test below its envelope and disqualifies it, as K-quant cases at
/// K = 2,880 once did on an H100 (a refusal far above, near 2^29 routed tokens, only caps the
/// envelope the verdict grants).
#[test]
fn every_case_derived_for_a_gpt_oss_shape_plans_at_its_count() {
    let mut shape = ModelShape::qwen3_30b_a3b();
    (shape.hidden, shape.expert_ffn, shape.experts, shape.top_k, shape.vocab, shape.context) = (2880, 2880, 32, 4, 201_088, 131_072);
    (shape.attention.heads, shape.attention.kv_heads, shape.attention.head_dim) = (64, 8, 64);
    let kind = |window: Option<&str>| -> BTreeMap<String, String> {
        let gpt_oss = [
            ("attention.sinks", "true"),
            ("attention.biases", "true"),
            ("attention.rope", "yarn(theta=150000,factor=32,orig_ctx=4096,beta_fast=32,beta_slow=1,attn_factor=1)"),
            ("ffn.biases", "true"),
            ("ffn.gating", "top_k_then_softmax(scale=none)"),
            ("ffn.activation", "clamped_swiglu(alpha=1.702,limit=7)"),
        ];
        window
            .map(|w| ("attention.window".to_string(), w.to_string()))
            .into_iter()
            .chain(gpt_oss.map(|(k, v)| (k.into(), v.into())))
            .collect()
    };
    // MXFP4 experts, as the published files: the MXFP4 cases are derived too.
    let weights: BTreeMap<String, String> = [("ffn_gate_exps.weight".to_string(), "mxfp4".to_string())].into();
    shape.layers =
        vec![LayerSpec { count: 1, weights: weights.clone(), kind: kind(Some("128")) }, LayerSpec { count: 1, weights, kind: kind(None) }];
    let limits = DeviceLimits::recorded();
    let opts = Options { memory_budget_bytes: u64::MAX, negative_controls: false, max_tokens: Some(MAX_TOKENS) };
    let mut failures = Vec::new();
    let (mut checked, mut mxfp4) = (0, 0);
    for l in &limits {
        for case in derive(&shape, &Serving::default(), l, &opts).cases {
            checked += 1;
            mxfp4 += usize::from(case.id.contains("mxfp4"));
            if let Err(e) = case.params.plans(case.tokens, l) {
                failures.push(format!("{} on {}: {e}", case.id, l.name));
            }
        }
    }
    assert!(checked > 1000, "only {checked} cases");
    assert!(mxfp4 > 0, "no MXFP4 case derived");
    assert!(failures.is_empty(), "{} cases cannot plan, first ones:\n{}", failures.len(), failures[..failures.len().min(20)].join("\n"));
}
