//! Which finished runs to delete: beyond `successfulRunsHistoryLimit` passing runs and
//! `failedRunsHistoryLimit` others, newest kept first; never an active run, and never a run that
//! is still some node's baseline (pruning it would silently change what the next run compares with).

use std::collections::BTreeSet;

use brink_api::crd::SweepVerdict;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FinishedRun {
    pub name: String,
    pub scheduled_s: i64,
    pub verdict: SweepVerdict,
}

/// Names of the runs to delete, oldest first.
pub fn prune(finished: &[FinishedRun], keep_passed: u32, keep_other: u32, baselines: &BTreeSet<String>) -> Vec<String> {
    let mut runs: Vec<&FinishedRun> = finished.iter().collect();
    runs.sort_by(|a, b| (b.scheduled_s, &b.name).cmp(&(a.scheduled_s, &a.name)));
    let (mut passed, mut other) = (0u32, 0u32);
    let mut delete = Vec::new();
    for r in runs {
        let kept = if r.verdict.passed() { &mut passed } else { &mut other };
        let limit = if r.verdict.passed() { keep_passed } else { keep_other };
        if *kept < limit {
            *kept += 1;
        } else if !baselines.contains(&r.name) {
            delete.push(r.name.clone());
        }
    }
    delete.reverse();
    delete
}
