//! Pure conversions from what the agent measured into the `SweepResult` wire types, and the
//! result as a table or CSV for people.

use brink_api::crd::{FailingCase, GridPoint, Judgement, PointFigures, SelfTestOutcome, SweepResultStatus, failing_cases};
use brink_api::{BlackBoxReport, CaseResult, ReportSummary, SelfTestReport};

use crate::http_bench::stats::PointResult;

/// A grid point's figures from the HTTP benchmark's result.
pub fn point_figures(point: GridPoint, r: &PointResult) -> PointFigures {
    let failed: u64 = r.failed.values().sum::<u64>() + r.rejected;
    let first_error = r.failed.iter().max_by_key(|(_, n)| **n).map(|(kind, n)| format!("{kind} x{n}"));
    PointFigures {
        point,
        requests: r.requests,
        failed,
        timed_out: 0,
        output_tokens_per_s: (r.requests > 0).then_some(r.output_tokens_per_s),
        ttft_p50_s: r.ttft_s.map(|s| s.p50),
        ttft_p99_s: r.ttft_s.map(|s| s.p99),
        itl_p50_s: r.itl_s.map(|s| s.p50),
        itl_p99_s: r.itl_s.map(|s| s.p99),
        error: first_error.or_else(|| (r.rejected > 0).then(|| format!("rejected x{}", r.rejected))),
    }
}

/// A point that did not finish before its deadline: every request counts as unanswered.
pub fn timed_out(point: GridPoint, requests: u64) -> PointFigures {
    PointFigures {
        point,
        requests: 0,
        failed: 0,
        timed_out: requests,
        output_tokens_per_s: None,
        ttft_p50_s: None,
        ttft_p99_s: None,
        itl_p50_s: None,
        itl_p99_s: None,
        error: Some("point deadline".into()),
    }
}

/// The self-test's part of a result: the counts, the smallest failures, and whether any
/// negative control actually ran (asked for is not enough: without a GPU none executes).
pub fn self_test_outcome(report: &SelfTestReport) -> SelfTestOutcome {
    let failing: Vec<FailingCase> = failing_cases(report, 16);
    let nc = &report.negative_controls;
    SelfTestOutcome { summary: ReportSummary::from(report), failing_cases: failing, negative_controls_ran: nc.flagged + nc.missed > 0 }
}

/// The black-box qualification in the self-test's place (an external engine): its counts and
/// smallest failures; it has no negative controls of its own (the stand-in tests are its).
pub fn black_box_outcome(report: &BlackBoxReport) -> SelfTestOutcome {
    let mut failing: Vec<FailingCase> = report
        .cases
        .iter()
        .filter(|c| matches!(c.result, CaseResult::Failed | CaseResult::Hung))
        .map(|c| FailingCase { id: c.id.clone(), kernel: c.kernel.clone(), tokens: c.tokens, detail: c.detail.clone() })
        .collect();
    failing.sort_by(|a, b| (a.tokens, &a.id).cmp(&(b.tokens, &b.id)));
    failing.truncate(16);
    SelfTestOutcome { summary: ReportSummary::from(report), failing_cases: failing, negative_controls_ran: false }
}

fn num(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.digits$}"))
}

/// The result as a table: the self-test line, one row per grid point, then the verdict and
/// its findings.
pub fn table(node: &str, run: &str, r: &SweepResultStatus) -> String {
    let mut out = format!("sweep {run} on {node}: {:?}\n", r.state);
    if let Some(st) = &r.self_test {
        let s = &st.summary;
        out += &format!(
            "self-test    derived {} executed {} passed {} failed {} hung {} skipped {}{}\n",
            s.derived,
            s.executed,
            s.passed,
            s.failed,
            s.hung,
            s.skipped,
            if st.negative_controls_ran { "" } else { " (negative controls not run)" }
        );
    }
    out += &format!(
        "{:>8} {:>5} {:>6} {:>5} {:>5} {:>9} {:>11} {:>11} {:>10} {:>10}\n",
        "prompt", "conc", "gen", "reqs", "fail", "out tok/s", "TTFT p50 s", "TTFT p99 s", "ITL p50 ms", "ITL p99 ms"
    );
    for p in &r.points {
        out += &format!(
            "{:>8} {:>5} {:>6} {:>5} {:>5} {:>9} {:>11} {:>11} {:>10} {:>10}\n",
            p.point.prompt_tokens,
            p.point.concurrency,
            p.point.generated_tokens,
            p.requests,
            p.failed + p.timed_out,
            num(p.output_tokens_per_s, 1),
            num(p.ttft_p50_s, 3),
            num(p.ttft_p99_s, 3),
            num(p.itl_p50_s.map(|s| s * 1e3), 2),
            num(p.itl_p99_s.map(|s| s * 1e3), 2),
        );
    }
    if let Some(e) = &r.error {
        out += &format!("error        {e}\n");
    }
    if let Some(j) = &r.judgement {
        out += &judgement_lines(j);
    }
    out
}

fn judgement_lines(j: &Judgement) -> String {
    let against = j.baseline_run.as_deref().map_or_else(|| "no baseline yet".to_string(), |b| format!("against {b}"));
    let mut out = format!("verdict      {:?} ({against})\n", j.verdict);
    for f in &j.findings {
        out += &format!("  {:?}: {}\n", f.verdict, f.message);
    }
    out
}

/// The points as CSV, one row per (run, node, point); `rows` are (run, node, result).
pub fn csv(rows: &[(String, String, &SweepResultStatus)]) -> String {
    let mut out = String::from(
        "run,node,prompt_tokens,concurrency,generated_tokens,requests,failed,timed_out,output_tokens_per_s,ttft_p50_s,ttft_p99_s,itl_p50_s,itl_p99_s,verdict\n",
    );
    let cell = |v: Option<f64>| v.map_or_else(String::new, |v| format!("{v}"));
    for (run, node, r) in rows {
        let verdict = r.judgement.as_ref().map_or_else(String::new, |j| format!("{:?}", j.verdict));
        for p in &r.points {
            out += &format!(
                "{run},{node},{},{},{},{},{},{},{},{},{},{},{},{verdict}\n",
                p.point.prompt_tokens,
                p.point.concurrency,
                p.point.generated_tokens,
                p.requests,
                p.failed,
                p.timed_out,
                cell(p.output_tokens_per_s),
                cell(p.ttft_p50_s),
                cell(p.ttft_p99_s),
                cell(p.itl_p50_s),
                cell(p.itl_p99_s),
            );
        }
    }
    out
}

/// A node's trend over runs (oldest first): per grid point, output tokens/s and TTFT in each run.
pub fn trend(node: &str, runs: &[(String, &SweepResultStatus)]) -> String {
    let mut points: Vec<GridPoint> = runs.iter().flat_map(|(_, r)| r.points.iter().map(|p| p.point)).collect();
    points.sort();
    points.dedup();
    let mut out = format!("trend of {node} over {} run(s): output tok/s (TTFT p50 s)\n{:<18}", runs.len(), "point");
    for (run, r) in runs {
        let v = r.judgement.as_ref().map_or_else(|| "?".into(), |j| format!("{:?}", j.verdict));
        out += &format!(" {:>22}", format!("{run} {v}"));
    }
    out.push('\n');
    for point in points {
        out += &format!("{:<18}", point.to_string());
        for (_, r) in runs {
            let cell = r
                .points
                .iter()
                .find(|p| p.point == point)
                .map_or_else(|| "-".into(), |p| format!("{} ({})", num(p.output_tokens_per_s, 1), num(p.ttft_p50_s, 3)));
            out += &format!(" {cell:>22}");
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::http_bench::stats::Summary;

    const P: GridPoint = GridPoint { prompt_tokens: 512, concurrency: 4, generated_tokens: 64 };

    fn result(requests: u64, failed: &[(&str, u64)], rejected: u64) -> PointResult {
        let s = |v: f64| Summary { mean: v, p50: v, p90: v * 1.5, p99: v * 2.0 };
        PointResult {
            prompt_tokens: 512,
            concurrency: 4,
            max_tokens: 64,
            requests,
            rejected,
            failed: failed.iter().map(|(k, n)| (k.to_string(), *n)).collect::<BTreeMap<_, _>>(),
            duration_s: 2.0,
            mean_prompt_tokens: Some(512.0),
            mean_output_tokens: Some(64.0),
            request_throughput: 1.0,
            output_tokens_per_s: 120.0,
            total_tokens_per_s: 1.0,
            ttft_s: (requests > 0).then(|| s(0.2)),
            itl_s: (requests > 0).then(|| s(0.01)),
            e2e_s: None,
        }
    }

    #[test]
    fn bench_results_become_point_figures() {
        let f = point_figures(P, &result(8, &[], 0));
        assert_eq!((f.requests, f.failed, f.timed_out, f.error), (8, 0, 0, None));
        assert_eq!((f.output_tokens_per_s, f.ttft_p50_s, f.ttft_p99_s, f.itl_p99_s), (Some(120.0), Some(0.2), Some(0.4), Some(0.02)));
        let f = point_figures(P, &result(5, &[("503", 1), ("stream", 2)], 1));
        assert_eq!((f.requests, f.failed, f.error.as_deref()), (5, 4, Some("stream x2")));
        // Nothing succeeded: no throughput figure rather than a zero that reads as a regression.
        let f = point_figures(P, &result(0, &[], 3));
        assert_eq!((f.output_tokens_per_s, f.ttft_p50_s, f.failed, f.error.as_deref()), (None, None, 3, Some("rejected x3")));
        let t = timed_out(P, 16);
        assert_eq!((t.requests, t.timed_out, t.output_tokens_per_s), (0, 16, None));
    }

    #[test]
    fn tables_and_csv_show_every_point_and_the_verdict() {
        let mut s = SweepResultStatus { points: vec![point_figures(P, &result(8, &[], 0)), timed_out(P, 4)], ..Default::default() };
        s.judgement = Some(Judgement { verdict: brink_api::crd::SweepVerdict::Hung, baseline_run: Some("r0".into()), findings: vec![] });
        let t = table("n1", "r1", &s);
        assert!(t.contains("sweep r1 on n1") && t.contains("verdict      Hung (against r0)"), "{t}");
        assert_eq!(t.lines().filter(|l| l.trim_start().starts_with("512")).count(), 2, "{t}");
        let c = csv(&[("r1".into(), "n1".into(), &s)]);
        let rows: Vec<&str> = c.lines().collect();
        assert_eq!(rows.len(), 3);
        assert_eq!(rows[2], "r1,n1,512,4,64,0,0,4,,,,,,Hung");
    }

    #[test]
    fn the_grid_flags_are_bounded_like_the_crd() {
        use crate::sweep::grid;
        assert_eq!(grid(&[128], &[1, 4], &[32], 8).unwrap().points().len(), 2);
        assert!(grid(&[], &[1], &[1], 1).unwrap_err().to_string().starts_with("--prompt-tokens: give 1 to 16 values"));
        assert!(grid(&[1 << 21], &[1], &[1], 1).unwrap_err().to_string().contains("outside 1..=1048576"));
        assert!(grid(&[1], &[2000], &[1], 1).unwrap_err().to_string().starts_with("--concurrency"));
        assert!(grid(&[1], &[1], &[0], 1).unwrap_err().to_string().starts_with("--generated-tokens"));
        assert!(grid(&[1], &[1], &[1], 0).unwrap_err().to_string().starts_with("--requests-per-point"));
    }
}
