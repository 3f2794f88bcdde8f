//! Which earlier run each node is compared with.

use crate::crd::{BaselineKind, SweepVerdict};
use crate::sweep::baseline::{PastResult, baseline_run};

fn past(run: &str, t: i64, node: &str, v: Option<SweepVerdict>) -> PastResult {
    PastResult { run: run.into(), scheduled_s: t, node: node.into(), verdict: v }
}

#[test]
fn last_passing_is_per_node_and_skips_bad_and_unjudged_runs() {
    use SweepVerdict::*;
    let h = vec![
        past("r1", 100, "a", Some(Pass)),
        past("r1", 100, "b", Some(Pass)),
        past("r2", 200, "a", Some(Regressed)),
        past("r2", 200, "b", Some(Pass)),
        past("r3", 300, "a", None),
        past("r3", 300, "b", Some(Outlier)),
        past("r4", 400, "a", Some(Pass)), // scheduled after the run being judged
    ];
    let at = |node, now| baseline_run(BaselineKind::LastPassing, None, node, now, &h);
    assert_eq!(at("a", 350), Some("r1"));
    assert_eq!(at("b", 350), Some("r2"));
    assert_eq!(at("a", 500), Some("r4"));
    assert_eq!(at("c", 500), None, "a new node has no baseline");
    assert_eq!(at("a", 100), None, "not its own run");
    // Pinned: that run's result, whatever its verdict; none if the node was not in it.
    assert_eq!(baseline_run(BaselineKind::Pinned, Some("r2"), "a", 350, &h), Some("r2"));
    assert_eq!(baseline_run(BaselineKind::Pinned, Some("r9"), "a", 350, &h), None);
    assert_eq!(baseline_run(BaselineKind::Pinned, None, "a", 350, &h), None);
}
