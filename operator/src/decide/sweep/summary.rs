//! A run's summary from its nodes' verdicts: counts, the run's verdict (the worst node's), the
//! findings a person should read first, and a one-line message.

use brink_api::crd::ExtraCase;
use brink_api::crd::{Finding, MAX_FINDINGS, NodeRunState, RunCounts, StallReport, SweepVerdict};

/// One node's outcome in the run.
#[derive(Clone, Debug)]
pub struct NodeOutcome {
    pub state: NodeRunState,
    /// `None` for a skipped node (it has no verdict).
    pub verdict: Option<SweepVerdict>,
}

pub fn counts(nodes: &[NodeOutcome]) -> RunCounts {
    let mut c = RunCounts { nodes: nodes.len() as u32, ..RunCounts::default() };
    for n in nodes {
        match (n.state, n.verdict) {
            (NodeRunState::Skipped, _) => c.skipped += 1,
            (_, Some(SweepVerdict::Pass)) => c.passed += 1,
            (_, Some(SweepVerdict::Outlier)) => c.outliers += 1,
            (_, Some(SweepVerdict::Regressed)) => c.regressed += 1,
            (_, Some(SweepVerdict::Failed)) => c.failed += 1,
            (_, Some(SweepVerdict::Hung)) => c.hung += 1,
            (_, Some(SweepVerdict::Lost)) => c.lost += 1,
            (_, None) => {}
        }
    }
    c
}

/// The run's verdict: the worst node verdict (`Pass` when every swept node passed; `None` when
/// no node was swept at all).
pub fn verdict(nodes: &[NodeOutcome]) -> Option<SweepVerdict> {
    nodes.iter().filter_map(|n| n.verdict).max()
}

/// The findings to show on the run: worst verdict first, then the largest change, at most
/// `MAX_FINDINGS`.
pub fn top_findings(mut all: Vec<Finding>) -> Vec<Finding> {
    all.sort_by(|a, b| {
        let size = |f: &Finding| f.change_percent.map_or(f64::INFINITY, f64::abs);
        b.verdict.cmp(&a.verdict).then(size(b).total_cmp(&size(a))).then(a.node.cmp(&b.node))
    });
    all.truncate(MAX_FINDINGS);
    all
}

/// "2 passed, 1 regressed, 1 lost of 4 nodes".
pub fn message(c: &RunCounts) -> String {
    let parts: Vec<String> = [
        (c.passed, "passed"),
        (c.outliers, "outlier"),
        (c.regressed, "regressed"),
        (c.failed, "failed"),
        (c.hung, "hung"),
        (c.lost, "lost"),
        (c.skipped, "skipped"),
    ]
    .iter()
    .filter(|(n, _)| *n > 0)
    .map(|(n, what)| format!("{n} {what}"))
    .collect();
    if parts.is_empty() { format!("no node swept of {}", c.nodes) } else { format!("{} of {} nodes", parts.join(", "), c.nodes) }
}

/// Self-test cases for the next run from the stalls seen in serving since the last run: one per
/// distinct (tokens, sequences) shape, most recent first, at most `limit`.
pub fn stall_cases(stalls: &[(String, StallReport)], since_s: i64, limit: usize) -> Vec<ExtraCase> {
    let at = |s: &StallReport| s.at.0.as_second();
    let mut recent: Vec<&(String, StallReport)> = stalls.iter().filter(|(_, s)| at(s) > since_s).collect();
    recent.sort_by(|a, b| at(&b.1).cmp(&at(&a.1)).then(a.0.cmp(&b.0)));
    let mut cases: Vec<ExtraCase> = Vec::new();
    for (replica, s) in recent {
        if cases.len() == limit {
            break;
        }
        if cases.iter().any(|c| c.tokens == s.batch_tokens && c.sequences == s.sequences) {
            continue;
        }
        cases.push(ExtraCase { tokens: s.batch_tokens, sequences: s.sequences, source: format!("{replica} ({})", s.stage) });
    }
    cases
}
