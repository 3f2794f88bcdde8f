//! The qualification report as a person reads it at a glance. Pure: the JSON is the same
//! `QualificationReport`, serialised.

use std::fmt::Write as _;

use brink_api::{BackendCheck, QualificationReport, SuiteResult, Verdict};

/// One line for a verdict.
pub fn verdict_line(v: &Verdict) -> String {
    match v {
        Verdict::Qualified { max_tokens } => format!("QUALIFIED up to {max_tokens} tokens"),
        Verdict::Clamped { max_tokens, first_failure } => format!("CLAMPED to {max_tokens} tokens (first failure at {first_failure})"),
        Verdict::Disqualified { reason } => format!("DISQUALIFIED: {reason}"),
        Verdict::NotQualified { reason } => format!("NOT QUALIFIED: {reason}"),
        Verdict::ProofIncomplete { reason } => format!("PROOF INCOMPLETE (not qualified): {reason}"),
    }
}

fn suite_row(s: &mut String, name: &str, r: &SuiteResult) {
    let c = &r.summary;
    let _ = writeln!(
        s,
        "{name:<12} {:>8} {:>9} {:>7} {:>7} {:>5} {:>8}  {}",
        c.derived,
        c.executed,
        c.passed,
        c.failed,
        c.hung,
        c.skipped,
        verdict_line(&r.verdict)
    );
}

pub fn render(r: &QualificationReport) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "brink up: qualification of this node (agent {})", r.agent_version);
    match &r.device.device {
        Some(d) => {
            let _ = writeln!(
                s,
                "device       {} (sm_{}, {} SMs, {:.1} GiB), driver {}, CUDA {}, NVRTC {}",
                d.name,
                d.compute_capability.replace('.', ""),
                d.sm_count,
                d.total_mem_bytes as f64 / (1u64 << 30) as f64,
                d.driver_version.as_deref().unwrap_or("?"),
                d.cuda_version,
                d.nvrtc_version.as_deref().unwrap_or("-")
            );
        }
        None => {
            let _ = writeln!(s, "device       NO GPU: {}", r.device.no_gpu_reason.as_deref().unwrap_or("none found"));
        }
    }
    let m = &r.model;
    let _ = writeln!(
        s,
        "model        {}{} ({}, {} layers, {} experts, top-{}, context {})",
        m.path,
        if m.demo { " [built-in demo]" } else { "" },
        m.arch,
        m.layers,
        m.experts,
        m.top_k,
        m.context
    );
    let _ = writeln!(s, "class        {}   backend {}", m.shape_class, r.backend);
    let _ = writeln!(s, "cache        {}", r.cache);
    let _ = writeln!(s);
    let _ = writeln!(
        s,
        "{:<12} {:>8} {:>9} {:>7} {:>7} {:>5} {:>8}  verdict",
        "suite", "derived", "executed", "passed", "failed", "hung", "skipped"
    );
    suite_row(&mut s, "kernels", &r.kernels);
    suite_row(&mut s, "model test", &r.model_test);
    let _ = writeln!(s, "{:<12} {:>56}  {}", "node", "", verdict_line(&r.verdict));
    let _ = writeln!(s);
    match &r.envelope {
        Some(e) if e.validated => {
            let _ = writeln!(
                s,
                "envelope     max batch tokens {}, prefill chunk {} (validated up to {} tokens{})",
                e.max_batch_tokens,
                e.prefill_chunk,
                e.validated_tokens.unwrap_or(0),
                e.first_failure.map(|f| format!("; first failure at {f}")).unwrap_or_default()
            );
        }
        Some(e) => {
            let _ = writeln!(
                s,
                "envelope     max batch tokens {}, prefill chunk {} (not validated on a GPU: nothing clamped)",
                e.max_batch_tokens, e.prefill_chunk
            );
        }
        None => {
            let _ = writeln!(s, "envelope     none: this node may not serve the class");
        }
    }
    match &r.bench {
        Some(b) => {
            let _ = writeln!(
                s,
                "bench        prefill {:.1} tok/s ({}-token prompt, TTFT p50 {:.3} s), decode {:.1} tok/s (from the time per output token; ITL p50 {:.1} ms); {} streams {:.1} tok/s; {} requests, {} failed",
                b.prefill_tokens_per_s,
                b.prompt_tokens,
                b.ttft_p50_s,
                b.decode_tokens_per_s,
                b.itl_p50_s * 1e3,
                b.concurrency,
                b.aggregate_output_tokens_per_s,
                b.requests,
                b.failed
            );
        }
        None => {
            let _ = writeln!(s, "bench        not run");
        }
    }
    let truth = match &r.backend_truth {
        BackendCheck::Pass { detail } => format!("PASS: {detail}"),
        BackendCheck::Fail { reasons } => format!("FAIL: {}", reasons.join("; ")),
        BackendCheck::Unverified { reason } => format!("UNVERIFIED: {reason}"),
        BackendCheck::NotRun { reason } => format!("not run: {reason}"),
    };
    let _ = writeln!(s, "backend      {truth}");
    let phases: Vec<String> = r.phases.iter().map(|p| format!("{} {:.1}s", p.name, p.seconds)).collect();
    let _ = writeln!(s, "phases       {}", phases.join(", "));
    match (&r.refusal, &r.url) {
        (Some(why), _) => {
            let _ = writeln!(s, "result       REFUSED: {why}");
        }
        (None, Some(url)) => {
            let _ = writeln!(s, "result       SERVING at {url} (OpenAI /v1/chat/completions, /v1/completions; Anthropic /v1/messages)");
        }
        (None, None) => {
            let _ = writeln!(s, "result       may serve (not serving: --no-serve)");
        }
    }
    s
}
