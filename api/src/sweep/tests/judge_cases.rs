//! A node's verdict against its baseline: each metric at, just inside and just beyond its
//! tolerance in the worse and the better direction; failures, hangs, lost and timed-out nodes.

use crate::crd::{FailingCase, NodeRunState, ResultState, SelfTestOutcome, SweepResultStatus, SweepVerdict, Tolerance};
use crate::qualification::ReportSummary;

use super::fig;
use crate::sweep::judge::{NodeInput, judge};

const TOL: Tolerance = Tolerance { throughput_percent: 10, latency_percent: 20 };

fn result(points: Vec<crate::crd::PointFigures>) -> SweepResultStatus {
    SweepResultStatus { state: ResultState::Done, points, ..SweepResultStatus::default() }
}

fn node<'a>(result: Option<&'a SweepResultStatus>, baseline: Option<&'a SweepResultStatus>) -> NodeInput<'a> {
    NodeInput { node: "spark-01", state: NodeRunState::Done, message: None, result, baseline, tolerance: TOL }
}

#[test]
fn each_metric_against_its_tolerance() {
    let base = result(vec![fig(512, 1, 100.0, 0.200, 0.010)]);
    // (throughput, ttft, itl) -> verdict, metrics flagged
    let cases: [((f64, f64, f64), SweepVerdict, &[&str]); 12] = [
        ((100.0, 0.200, 0.010), SweepVerdict::Pass, &[]),
        ((90.0, 0.200, 0.010), SweepVerdict::Pass, &[]), // exactly -10%: within
        ((89.9, 0.200, 0.010), SweepVerdict::Regressed, &["outputTokensPerS"]),
        ((150.0, 0.200, 0.010), SweepVerdict::Pass, &[]), // faster is never a regression
        ((100.0, 0.240, 0.010), SweepVerdict::Pass, &[]), // exactly +20%
        ((100.0, 0.2401, 0.010), SweepVerdict::Regressed, &["ttftP50S"]),
        ((100.0, 0.100, 0.010), SweepVerdict::Pass, &[]),
        ((100.0, 0.200, 0.0121), SweepVerdict::Regressed, &["itlP50S"]),
        ((100.0, 0.200, 0.0119), SweepVerdict::Pass, &[]),
        ((50.0, 0.400, 0.020), SweepVerdict::Regressed, &["outputTokensPerS", "ttftP50S", "itlP50S"]),
        ((f64::NAN, 0.200, 0.010), SweepVerdict::Pass, &[]), // an unmeasured figure is not compared
        ((0.0, 0.200, 0.010), SweepVerdict::Pass, &[]),
    ];
    for ((tps, ttft, itl), want, metrics) in cases {
        let r = result(vec![fig(512, 1, tps, ttft, itl)]);
        let (verdict, findings) = judge(&node(Some(&r), Some(&base)));
        assert_eq!(verdict, want, "{tps} {ttft} {itl}: {findings:?}");
        let got: Vec<&str> = findings.iter().filter_map(|f| f.metric.as_deref()).collect();
        assert_eq!(got, metrics, "{tps} {ttft} {itl}");
    }
    let r = result(vec![fig(512, 1, 80.0, 0.2, 0.01)]);
    let (_, f) = judge(&node(Some(&r), Some(&base)));
    assert_eq!((f[0].value, f[0].reference), (Some(80.0), Some(100.0)));
    assert!((f[0].change_percent.unwrap() + 20.0).abs() < 1e-9);
    assert!(f[0].message.contains("p512xc1xg64: outputTokensPerS") && f[0].message.contains("-20.0%, tolerance 10%"), "{}", f[0].message);
}

#[test]
fn without_a_baseline_or_its_point_only_failures_count() {
    let r = result(vec![fig(512, 1, 1.0, 9.0, 9.0), fig(8192, 1, 1.0, 9.0, 9.0)]);
    assert_eq!(judge(&node(Some(&r), None)).0, SweepVerdict::Pass);
    // The baseline ran another grid: only the shared point is compared.
    let base = result(vec![fig(8192, 1, 100.0, 0.2, 0.01)]);
    let (v, f) = judge(&node(Some(&r), Some(&base)));
    assert_eq!(v, SweepVerdict::Regressed);
    assert!(f.iter().all(|f| f.point.map(|p| p.prompt_tokens) == Some(8192)), "{f:?}");
}

#[test]
fn failures_and_hangs_outrank_regressions() {
    let base = result(vec![fig(512, 1, 100.0, 0.2, 0.01)]);
    let mut failed = fig(512, 1, 50.0, 0.2, 0.01);
    failed.failed = 3;
    failed.error = Some("503".into());
    let (v, f) = judge(&node(Some(&result(vec![failed.clone()])), Some(&base)));
    assert_eq!(v, SweepVerdict::Failed);
    assert!(f.iter().any(|f| f.message.contains("3 request(s) failed (503)")), "{f:?}");
    let mut hung = failed;
    hung.timed_out = 1;
    assert_eq!(judge(&node(Some(&result(vec![hung])), Some(&base))).0, SweepVerdict::Hung);
}

#[test]
fn the_self_test_decides_before_the_grid() {
    let summary = |failed, hung, missed| ReportSummary {
        derived: 10,
        executed: 10,
        passed: 10 - failed - hung,
        failed,
        hung,
        skipped: 0,
        negative_controls_missed: missed,
    };
    let case = FailingCase { id: "moe_gemm/t63".into(), kernel: "moe_gemm".into(), tokens: 63, detail: "max rel err 0.9".into() };
    for (failed, hung, missed, want) in [
        (0, 0, 0, SweepVerdict::Pass),
        (1, 0, 0, SweepVerdict::Failed),
        (0, 1, 0, SweepVerdict::Hung),
        (2, 1, 0, SweepVerdict::Hung),
        (0, 0, 1, SweepVerdict::Failed),
    ] {
        let mut r = result(vec![fig(512, 1, 100.0, 0.2, 0.01)]);
        r.self_test = Some(SelfTestOutcome {
            summary: summary(failed, hung, missed),
            failing_cases: if failed + hung > 0 { vec![case.clone()] } else { vec![] },
            negative_controls_ran: true,
        });
        let (v, f) = judge(&node(Some(&r), None));
        assert_eq!(v, want, "{failed} {hung} {missed}: {f:?}");
        if failed + hung > 0 {
            assert!(f.iter().any(|f| f.message.contains("moe_gemm/t63 at 63 tokens")), "{f:?}");
        }
    }
}

#[test]
fn lost_timed_out_failed_and_missing_results_say_so() {
    let r =
        SweepResultStatus { state: ResultState::Failed, error: Some("engine did not start: out of memory".into()), ..Default::default() };
    let (v, f) = judge(&node(Some(&r), None));
    assert_eq!(v, SweepVerdict::Failed);
    assert!(f[0].message.contains("could not finish: engine did not start"), "{f:?}");

    let mut n = node(None, None);
    n.state = NodeRunState::Lost;
    n.message = Some("heartbeat expired 95 s ago");
    let (v, f) = judge(&n);
    assert_eq!((v, f[0].message.as_str()), (SweepVerdict::Lost, "heartbeat expired 95 s ago"));

    n.state = NodeRunState::TimedOut;
    n.message = None;
    assert_eq!(judge(&n).0, SweepVerdict::Hung);

    // Timed out with a partial result: the hang and what the partial result shows.
    let mut slow = result(vec![fig(512, 1, 10.0, 0.2, 0.01)]);
    slow.state = ResultState::Running;
    let base = result(vec![fig(512, 1, 100.0, 0.2, 0.01)]);
    let mut n = node(Some(&slow), Some(&base));
    n.state = NodeRunState::TimedOut;
    let (v, f) = judge(&n);
    assert_eq!(v, SweepVerdict::Hung);
    assert!(f.iter().any(|f| f.verdict == SweepVerdict::Regressed), "{f:?}");

    let done_without_result = node(None, None);
    assert_eq!(judge(&done_without_result).0, SweepVerdict::Failed);
}
