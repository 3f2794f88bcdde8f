//! The model-level test's table: one row per batch composition, then anything that failed or
//! hung, the skipped cases, the phases and the verdict.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use brink_api::ModelTestReport;
use brink_api::selftest::{CaseReport, CaseResult, Verdict};

pub fn render(r: &ModelTestReport) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "model    {} ({}) on {}, counts for {} limits, max batch {} / chunk {} / context {}",
        r.model,
        if r.shape_class.is_empty() { "?" } else { &r.shape_class },
        r.backend,
        if r.limits.is_empty() { "?" } else { &r.limits },
        r.serving.max_batch_tokens,
        r.serving.prefill_chunk,
        r.serving.context
    );
    let _ = writeln!(
        s,
        "counts   {} critical counts a step can reach ({} more lie above max batch tokens); cap {}; calibration {}; tolerance {:.0e}",
        r.counts_derived,
        r.counts_unreachable,
        r.max_tokens.map_or("none".into(), |m| m.to_string()),
        r.calibration_tokens_per_s.map_or("-".into(), |t| format!("{t:.0} tok/s")),
        r.tolerance
    );
    let _ = writeln!(s);
    let _ = writeln!(
        s,
        "{:<22} {:>7} {:>8} {:>6} {:>6} {:>5} {:>7} {:>10} {:>10}",
        "case", "derived", "executed", "passed", "failed", "hung", "skipped", "max err", "max ms"
    );
    let mut by_kind: BTreeMap<&str, Vec<&CaseReport>> = BTreeMap::new();
    for c in &r.cases {
        by_kind.entry(c.kernel.as_str()).or_default().push(c);
    }
    for (kind, cases) in &by_kind {
        let n = |x: CaseResult| cases.iter().filter(|c| c.result == x).count();
        let max = |v: Vec<f64>| v.into_iter().fold(None, |m: Option<f64>, e| Some(m.map_or(e, |m| m.max(e))));
        let err = max(cases.iter().filter_map(|c| c.max_rel_err).collect());
        let ms = max(cases.iter().filter(|c| c.result != CaseResult::Skipped).map(|c| c.wall_ms).collect());
        let _ = writeln!(
            s,
            "{:<22} {:>7} {:>8} {:>6} {:>6} {:>5} {:>7} {:>10} {:>10}",
            kind,
            cases.len(),
            cases.len() - n(CaseResult::Skipped),
            n(CaseResult::Passed),
            n(CaseResult::Failed),
            n(CaseResult::Hung),
            n(CaseResult::Skipped),
            err.map_or("-".into(), |e| format!("{e:.1e}")),
            ms.map_or("-".into(), |m| format!("{m:.1}")),
        );
    }
    let _ =
        writeln!(s, "{:<22} {:>7} {:>8} {:>6} {:>6} {:>5} {:>7}", "total", r.derived, r.executed, r.passed, r.failed, r.hung, r.skipped);
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
    let skipped: Vec<&CaseReport> = r.cases.iter().filter(|c| c.result == CaseResult::Skipped).collect();
    if let Some(first) = skipped.first() {
        let _ = writeln!(s, "\nskipped ({}), e.g. {}: {}", skipped.len(), first.id, first.detail);
    }
    let _ = writeln!(s, "\nphases:  {}", r.phases.iter().map(|p| format!("{} {:.2}s", p.name, p.seconds)).collect::<Vec<_>>().join(", "));
    if r.step_tokens > 0 {
        let _ = writeln!(
            s,
            "tokens:  steps under test {} (+ {} decode prompts), references {} ({:.2}x the steps)",
            r.step_tokens,
            r.setup_tokens,
            r.reference_tokens,
            r.reference_tokens as f64 / r.step_tokens as f64
        );
    }
    let _ = writeln!(
        s,
        "verdict: {}",
        match &r.verdict {
            Verdict::Qualified { max_tokens } => format!("QUALIFIED (every executed forward pass matched, up to {max_tokens} tokens)"),
            Verdict::Clamped { max_tokens, first_failure } => {
                format!("CLAMPED: serve with batch and chunk <= {max_tokens} tokens (first failure at {first_failure})")
            }
            Verdict::Disqualified { reason } => format!("DISQUALIFIED: {reason}"),
            Verdict::NotQualified { reason } => format!("NOT QUALIFIED: {reason}"),
            Verdict::ProofIncomplete { reason } => format!("PROOF INCOMPLETE (not qualified): {reason}"),
        }
    );
    s
}
