//! The bench of the self-test's host costs: the host work of every case of the heavy families
//! (routing, sampling, CPU twins) without a device, timed per family. Run it with
//! `cargo test -p brink-kernels --lib host_bench -- --ignored --nocapture`; `HOST_BENCH_STRIDE=n`
//! runs every n-th case of each family (the cache of shared weights and twins then sees fewer
//! neighbours, so a strided run overstates the full run's cost), `HOST_BENCH_ONLY=s` the cases
//! whose id (`family/tag/tN`) contains `s`, `HOST_BENCH_TAGS=1` the CPU time per tag as well,
//! `HOST_BENCH_ALL=1` every case's times (not only those over 500 ms).

use std::collections::BTreeMap;
use std::time::Instant;

use super::case::OpCase;
use super::catalogue::{Options, derive};
use crate::limits::DeviceLimits;
use crate::ops::{attention, latent_proj, moe_gemm, moe_gemv_fused, output_head};
use crate::thresholds::{ModelShape, Serving};

/// CPU seconds this process has used so far (user and system, every thread), from
/// `/proc/self/stat`: other work on a small shared host slows the wall clock, not this.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after_name = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // Fields 14 and 15 of the line (utime, stime), counted from the state (field 3) here.
    let ticks: f64 = [11, 12].iter().filter_map(|&i| fields.get(i)?.parse::<f64>().ok()).sum();
    ticks / 100.0
}

/// The host work of one case, or `None` for a family the bench leaves out.
fn host_half(tokens: u64, op: &OpCase) -> Option<usize> {
    Some(match op {
        OpCase::MoeGemm(c) => moe_gemm::host_half(tokens, c),
        OpCase::MoeGemvSwiglu(c) => moe_gemv_fused::gate_up_host_half(tokens, c),
        OpCase::MoeGemvCombine(c) => moe_gemv_fused::combine_host_half(tokens, c),
        OpCase::LatentProj(c) => latent_proj::host_half(tokens, c),
        OpCase::OutputHead(c) => output_head::host_half(tokens, &c.dims(), c.sequences),
        OpCase::Linear(c) => output_head::host_half(tokens, &c.dims(), None),
        OpCase::Attention(c) => attention::host_half(tokens, c),
        _ => return None,
    })
}

#[test]
#[ignore = "a bench: minutes on a small host"]
fn host_costs_per_family() {
    let stride: usize = std::env::var("HOST_BENCH_STRIDE").ok().and_then(|s| s.parse().ok()).unwrap_or(1).max(1);
    let only = std::env::var("HOST_BENCH_ONLY").unwrap_or_default();
    let flag = |name: &str| std::env::var(name).is_ok_and(|v| v == "1");
    let (tags, all) = (flag("HOST_BENCH_TAGS"), flag("HOST_BENCH_ALL"));
    // Per tag (the case id without its count): (cases run, CPU ms).
    let mut per_tag: BTreeMap<String, (usize, f64)> = BTreeMap::new();
    let opts = Options { memory_budget_bytes: 70 << 30, negative_controls: false, max_tokens: Some(1 << 16) };
    let cat = derive(&ModelShape::qwen3_30b_a3b(), &Serving::default(), &DeviceLimits::h200(), &opts);
    // Per family: (cases run, wall ms, CPU ms).
    let mut per: BTreeMap<String, (usize, f64, f64)> = BTreeMap::new();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let start = Instant::now();
    for case in &cat.cases {
        if !case.id.contains(only.as_str()) {
            continue;
        }
        let n = seen.entry(case.kernel.clone()).or_default();
        *n += 1;
        if !(*n - 1).is_multiple_of(stride) {
            continue;
        }
        let (t, cpu) = (Instant::now(), cpu_seconds());
        let Some(_) = host_half(case.tokens, &case.params) else { continue };
        let ms = t.elapsed().as_secs_f64() * 1e3;
        let e = per.entry(case.kernel.clone()).or_default();
        e.0 += 1;
        e.1 += ms;
        let cpu_ms = (cpu_seconds() - cpu) * 1e3;
        e.2 += cpu_ms;
        let tag = case.id.rsplit_once('/').map_or(case.id.as_str(), |(tag, _)| tag);
        let t = per_tag.entry(tag.to_string()).or_default();
        t.0 += 1;
        t.1 += cpu_ms;
        if ms > 500.0 || all {
            eprintln!("  {} {:.0} ms (cpu {cpu_ms:.0} ms)", case.id, ms);
        }
    }
    for (k, &(ran, ms, cpu)) in &per {
        let cases = seen[k] as f64;
        let per_case = |v: f64| v / ran as f64;
        eprintln!(
            "{k:24} cases {cases:4} ran {ran:4}  wall {ms:8.0} ms ({:6.1} a case)  cpu {cpu:8.0} ms ({:6.1} a case, all cases ~{:6.1} s)",
            per_case(ms),
            per_case(cpu),
            per_case(cpu) * cases / 1e3
        );
    }
    if tags {
        for (tag, &(ran, cpu)) in &per_tag {
            eprintln!("  {tag:48} ran {ran:4}  cpu {cpu:8.0} ms");
        }
    }
    eprintln!("total {:.1} s on {} threads", start.elapsed().as_secs_f64(), rayon::current_num_threads());
}
