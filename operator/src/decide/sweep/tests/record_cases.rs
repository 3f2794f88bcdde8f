//! History pruning, the run summary and stall shapes as next cases.

use std::collections::BTreeSet;

use brink_api::crd::conditions::Time;
use brink_api::crd::{NodeRunState, StallReport, SweepVerdict};

use crate::decide::sweep::history::{FinishedRun, prune};
use crate::decide::sweep::summary::{NodeOutcome, counts, message, stall_cases, top_findings, verdict};

#[test]
fn pruning_keeps_the_newest_and_every_baseline() {
    use SweepVerdict::*;
    let runs: Vec<FinishedRun> = [(1, Pass), (2, Regressed), (3, Pass), (4, Pass), (5, Failed), (6, Hung), (7, Pass)]
        .iter()
        .map(|&(t, v)| FinishedRun { name: format!("r{t}"), scheduled_s: t, verdict: v })
        .collect();
    let none = BTreeSet::new();
    assert_eq!(prune(&runs, 2, 1, &none), ["r1", "r2", "r3", "r5"]);
    assert_eq!(prune(&runs, 10, 10, &none), Vec::<String>::new());
    assert_eq!(prune(&runs, 0, 0, &none), ["r1", "r2", "r3", "r4", "r5", "r6", "r7"]);
    let baselines: BTreeSet<String> = ["r1".to_string()].into();
    assert_eq!(prune(&runs, 2, 1, &baselines), ["r2", "r3", "r5"]);
    // Input order does not matter.
    let mut shuffled = runs.clone();
    shuffled.reverse();
    assert_eq!(prune(&shuffled, 2, 1, &none), prune(&runs, 2, 1, &none));
}

#[test]
fn the_run_summary_counts_and_ranks() {
    use SweepVerdict::*;
    let outcome = |state, verdict| NodeOutcome { state, verdict };
    let nodes = [
        outcome(NodeRunState::Done, Some(Pass)),
        outcome(NodeRunState::Done, Some(Regressed)),
        outcome(NodeRunState::Done, Some(Outlier)),
        outcome(NodeRunState::Lost, Some(Lost)),
        outcome(NodeRunState::Skipped, None),
    ];
    let c = counts(&nodes);
    assert_eq!((c.nodes, c.passed, c.regressed, c.outliers, c.lost, c.skipped, c.failed), (5, 1, 1, 1, 1, 1, 0));
    assert_eq!(verdict(&nodes), Some(Lost));
    assert_eq!(message(&c), "1 passed, 1 outlier, 1 regressed, 1 lost, 1 skipped of 5 nodes");
    assert_eq!(verdict(&nodes[..1]), Some(Pass));
    assert_eq!(verdict(&nodes[4..]), None);
    assert_eq!(message(&counts(&nodes[4..])), "1 skipped of 1 nodes");
    assert_eq!(message(&counts(&[])), "no node swept of 0");

    let f = |node: &str, v, change: Option<f64>| brink_api::crd::Finding {
        node: node.into(),
        verdict: v,
        point: None,
        metric: None,
        value: None,
        reference: None,
        change_percent: change,
        message: String::new(),
    };
    let mut many: Vec<_> = (0..40).map(|i| f(&format!("n{i:02}"), Regressed, Some(-(i as f64)))).collect();
    many.push(f("z", Hung, None));
    many.push(f("y", Outlier, Some(-90.0)));
    let top = top_findings(many);
    assert_eq!(top.len(), brink_api::crd::MAX_FINDINGS);
    assert_eq!((top[0].node.as_str(), top[1].node.as_str()), ("z", "n39"));
    assert!(top.iter().all(|f| f.verdict != Outlier), "regressions outrank outliers; the cut drops the outlier");
}

#[test]
fn recent_distinct_stall_shapes_become_cases() {
    let stall = |tokens, seqs, at_s| StallReport {
        at: Time(jiff::Timestamp::from_second(at_s).unwrap()),
        stage: "kernel moe_gemm".into(),
        batch_tokens: tokens,
        sequences: seqs,
        message: None,
    };
    let stalls = vec![
        ("serving/a".to_string(), stall(8193, 3, 500)),
        ("serving/b".to_string(), stall(8193, 3, 600)),
        ("serving/c".to_string(), stall(63, 1, 700)),
        ("serving/d".to_string(), stall(4097, 2, 50)), // before the last run
    ];
    let cases = stall_cases(&stalls, 100, 8);
    let shapes: Vec<(u64, u32, &str)> = cases.iter().map(|c| (c.tokens, c.sequences, c.source.as_str())).collect();
    assert_eq!(shapes, [(63, 1, "serving/c (kernel moe_gemm)"), (8193, 3, "serving/b (kernel moe_gemm)")]);
    assert_eq!(stall_cases(&stalls, 100, 1).len(), 1);
    assert!(stall_cases(&stalls, 1000, 8).is_empty());
}
