//! One node's verdict in a run: its self-test, each grid point's failures and hangs, and each
//! point's figures against the node's baseline with the sweep's tolerances.

use crate::crd::{Finding, NodeRunState, PointFigures, ResultState, SweepResultStatus, SweepVerdict, Tolerance};

/// A metric a grid point is judged on, and which way is worse.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Metric {
    OutputTokensPerS,
    TtftP50S,
    ItlP50S,
}

impl Metric {
    pub const ALL: [Metric; 3] = [Metric::OutputTokensPerS, Metric::TtftP50S, Metric::ItlP50S];

    pub fn name(self) -> &'static str {
        match self {
            Metric::OutputTokensPerS => "outputTokensPerS",
            Metric::TtftP50S => "ttftP50S",
            Metric::ItlP50S => "itlP50S",
        }
    }

    pub fn of(self, p: &PointFigures) -> Option<f64> {
        match self {
            Metric::OutputTokensPerS => p.output_tokens_per_s,
            Metric::TtftP50S => p.ttft_p50_s,
            Metric::ItlP50S => p.itl_p50_s,
        }
        .filter(|v| v.is_finite() && *v > 0.0)
    }

    /// Throughput is worse lower, latency worse higher.
    pub fn higher_is_better(self) -> bool {
        matches!(self, Metric::OutputTokensPerS)
    }

    fn tolerance_percent(self, t: &Tolerance) -> u32 {
        if self.higher_is_better() { t.throughput_percent } else { t.latency_percent }
    }
}

/// `(value - reference) / reference` in percent.
pub fn change_percent(value: f64, reference: f64) -> f64 {
    (value - reference) / reference * 100.0
}

/// Whether a change of `change` percent is worse than `tolerance` percent for `metric`.
pub fn beyond(metric: Metric, change: f64, tolerance: u32) -> bool {
    let tol = f64::from(tolerance);
    if metric.higher_is_better() { change < -tol } else { change > tol }
}

/// What the run knows about one node when judging it.
#[derive(Clone, Copy, Debug)]
pub struct NodeInput<'a> {
    pub node: &'a str,
    pub state: NodeRunState,
    /// Why the node ended as it did (timeouts, losses).
    pub message: Option<&'a str>,
    pub result: Option<&'a SweepResultStatus>,
    /// The node's result in its baseline run, if it has one.
    pub baseline: Option<&'a SweepResultStatus>,
    pub tolerance: Tolerance,
}

/// The node's verdict and what led to it (empty findings: `Pass`).
pub fn judge(n: &NodeInput<'_>) -> (SweepVerdict, Vec<Finding>) {
    let finding = |verdict, message: String| Finding {
        node: n.node.to_string(),
        verdict,
        point: None,
        metric: None,
        value: None,
        reference: None,
        change_percent: None,
        message,
    };
    let mut findings = Vec::new();
    match n.state {
        NodeRunState::Lost => findings.push(finding(SweepVerdict::Lost, n.message.unwrap_or("the node went away mid-sweep").into())),
        NodeRunState::TimedOut => {
            findings.push(finding(SweepVerdict::Hung, n.message.unwrap_or("no result before the node timeout").into()))
        }
        _ => {}
    }
    let Some(result) = n.result else {
        if findings.is_empty() && n.state == NodeRunState::Done {
            findings.push(finding(SweepVerdict::Failed, "the run records the node as done but its SweepResult is missing".into()));
        }
        return (worst(&findings), findings);
    };
    if result.state == ResultState::Failed {
        let why = result.error.as_deref().unwrap_or("the agent reported a failure without a reason");
        findings.push(finding(SweepVerdict::Failed, format!("could not finish: {why}")));
    }
    if let Some(st) = &result.self_test {
        let first =
            st.failing_cases.first().map(|c| format!(" (first: {} at {} tokens: {})", c.id, c.tokens, c.detail)).unwrap_or_default();
        if st.summary.hung > 0 {
            findings.push(finding(SweepVerdict::Hung, format!("self-test: {} case(s) hung{first}", st.summary.hung)));
        }
        if st.summary.failed > 0 {
            findings.push(finding(SweepVerdict::Failed, format!("self-test: {} case(s) failed{first}", st.summary.failed)));
        }
        if st.summary.negative_controls_missed > 0 {
            findings.push(finding(
                SweepVerdict::Failed,
                format!(
                    "self-test: {} negative control(s) not flagged: the self-test cannot be trusted",
                    st.summary.negative_controls_missed
                ),
            ));
        }
    }
    for p in &result.points {
        findings.extend(judge_point(n.node, p, n.baseline.and_then(|b| b.points.iter().find(|q| q.point == p.point)), &n.tolerance));
    }
    (worst(&findings), findings)
}

/// Failures and hangs of one point, then its figures against the baseline's same point.
fn judge_point(node: &str, p: &PointFigures, base: Option<&PointFigures>, tol: &Tolerance) -> Vec<Finding> {
    let mut out = Vec::new();
    let at = |verdict, metric: Option<Metric>, value, reference, change, message| Finding {
        node: node.to_string(),
        verdict,
        point: Some(p.point),
        metric: metric.map(|m: Metric| m.name().to_string()),
        value,
        reference,
        change_percent: change,
        message,
    };
    if p.timed_out > 0 {
        out.push(at(
            SweepVerdict::Hung,
            None,
            None,
            None,
            None,
            format!("{}: {} request(s) unanswered at the deadline", p.point, p.timed_out),
        ));
    }
    if p.failed > 0 {
        let kind = p.error.as_deref().unwrap_or("unknown error");
        out.push(at(SweepVerdict::Failed, None, None, None, None, format!("{}: {} request(s) failed ({kind})", p.point, p.failed)));
    }
    let Some(base) = base else { return out };
    for m in Metric::ALL {
        let (Some(v), Some(r)) = (m.of(p), m.of(base)) else { continue };
        let change = change_percent(v, r);
        let tolerance = m.tolerance_percent(tol);
        if beyond(m, change, tolerance) {
            let message = format!("{}: {} {v:.4} against {r:.4} ({change:+.1}%, tolerance {tolerance}%)", p.point, m.name());
            out.push(at(SweepVerdict::Regressed, Some(m), Some(v), Some(r), Some(change), message));
        }
    }
    out
}

/// The worst verdict among `findings`, `Pass` without any.
pub fn worst(findings: &[Finding]) -> SweepVerdict {
    findings.iter().map(|f| f.verdict).max().unwrap_or(SweepVerdict::Pass)
}
