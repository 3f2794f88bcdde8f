//! The black-box report as a person reads it: the engine, the limits and how prompts were
//! sized, one row per composition, what failed, what was skipped, the phases and the verdict.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use brink_api::blackbox::BlackBoxReport;
use brink_api::selftest::{CaseReport, CaseResult, Verdict};

pub fn render(r: &BlackBoxReport) -> String {
    let mut s = String::new();
    let l = &r.limits;
    let _ = writeln!(s, "engine   {} model {}", r.url, r.model);
    let _ = writeln!(s, "class    {} (top_k {})", r.shape_class, r.top_k);
    let _ = writeln!(
        s,
        "limits   context {} (from {}), max batch tokens {}, prefill chunk {}",
        l.context, l.context_source, l.max_batch_tokens, l.prefill_chunk
    );
    let _ = writeln!(s, "sizing   {}", r.sizing);
    let _ = writeln!(s, "checks   5xx, deadline, dropped connection, dead engine, empty answer; {}", r.finite_check);
    if let Some(tps) = r.calibration_tokens_per_s {
        let _ = writeln!(s, "speed    {tps:.0} prompt tokens/s on the calibration request");
    }
    let _ = writeln!(s);
    let _ = writeln!(
        s,
        "{:<20} {:>7} {:>8} {:>6} {:>6} {:>5} {:>7} {:>9} {:>9}",
        "case", "derived", "executed", "passed", "failed", "hung", "skipped", "longest", "max ms"
    );
    let mut by_kind: BTreeMap<&str, Vec<&CaseReport>> = BTreeMap::new();
    for c in &r.cases {
        by_kind.entry(c.kernel.as_str()).or_default().push(c);
    }
    for (kind, cases) in &by_kind {
        let n = |x: CaseResult| cases.iter().filter(|c| c.result == x).count();
        let ran = cases.iter().filter(|c| c.result != CaseResult::Skipped);
        let longest = ran.clone().map(|c| c.tokens).max();
        let ms = ran.map(|c| c.wall_ms).fold(0.0f64, f64::max);
        let _ = writeln!(
            s,
            "{:<20} {:>7} {:>8} {:>6} {:>6} {:>5} {:>7} {:>9} {:>9.0}",
            kind,
            cases.len(),
            cases.len() - n(CaseResult::Skipped),
            n(CaseResult::Passed),
            n(CaseResult::Failed),
            n(CaseResult::Hung),
            n(CaseResult::Skipped),
            longest.map_or("-".into(), |t| t.to_string()),
            ms
        );
    }
    let _ =
        writeln!(s, "{:<20} {:>7} {:>8} {:>6} {:>6} {:>5} {:>7}", "total", r.derived, r.executed, r.passed, r.failed, r.hung, r.skipped);
    if r.length_mismatches > 0 {
        let _ = writeln!(s, "\nlength mismatches: {} request(s) counted by the engine at another length than built", r.length_mismatches);
    }
    let problems: Vec<&CaseReport> = r.cases.iter().filter(|c| matches!(c.result, CaseResult::Failed | CaseResult::Hung)).collect();
    if !problems.is_empty() {
        let _ = writeln!(s, "\nproblems:");
        for c in problems.iter().take(20) {
            let _ = writeln!(s, "  {:?} {}: {}", c.result, c.id, c.detail);
        }
        if problems.len() > 20 {
            let _ = writeln!(s, "  ... and {} more (see --json)", problems.len() - 20);
        }
    }
    if let Some(d) = &r.engine_died {
        let _ = writeln!(s, "\nengine died: {d}");
    }
    let skipped: Vec<&CaseReport> = r.cases.iter().filter(|c| c.result == CaseResult::Skipped).collect();
    if !skipped.is_empty() {
        let _ = writeln!(s, "\nskipped ({}), first ones:", skipped.len());
        for c in skipped.iter().take(5) {
            let _ = writeln!(s, "  {}: {}", c.id, c.detail);
        }
    }
    let _ = writeln!(s, "\nphases:  {}", r.phases.iter().map(|p| format!("{} {:.1}s", p.name, p.seconds)).collect::<Vec<_>>().join(", "));
    let _ = writeln!(s, "verdict: {}", verdict_line(&r.verdict));
    s
}

pub fn verdict_line(v: &Verdict) -> String {
    match v {
        Verdict::Qualified { max_tokens } => format!("PASS (every case passed; prompts up to {max_tokens} tokens)"),
        Verdict::Clamped { max_tokens, first_failure } => {
            format!("CLAMP: admit prompts of at most {max_tokens} tokens (every failure lies above; the first at {first_failure})")
        }
        Verdict::Disqualified { reason } => format!("REFUSE: {reason}"),
        Verdict::NotQualified { reason } => format!("REFUSE (nothing run): {reason}"),
        Verdict::ProofIncomplete { reason } => format!("REFUSE (proof incomplete): {reason}"),
    }
}
