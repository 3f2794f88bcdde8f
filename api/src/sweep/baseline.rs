//! Which earlier result each node is compared with: its own result in the latest earlier run
//! where it passed (`LastPassing`), or its result in the run the user pinned (`Pinned`).

use crate::crd::{BaselineKind, SweepVerdict};

/// One node's judged result in an earlier run of the same sweep.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PastResult {
    pub run: String,
    pub scheduled_s: i64,
    pub node: String,
    /// The operator's verdict; `None` while the run was still being judged.
    pub verdict: Option<SweepVerdict>,
}

/// The run whose result for `node` is its baseline, for a run scheduled at `now_scheduled_s`.
/// `None`: no baseline yet (the node is judged only against the fleet).
pub fn baseline_run<'a>(
    policy: BaselineKind,
    pinned: Option<&'a str>,
    node: &str,
    now_scheduled_s: i64,
    history: &'a [PastResult],
) -> Option<&'a str> {
    match policy {
        BaselineKind::Pinned => {
            let pinned = pinned?;
            history.iter().find(|r| r.run == pinned && r.node == node).map(|r| r.run.as_str())
        }
        BaselineKind::LastPassing => history
            .iter()
            .filter(|r| r.node == node && r.scheduled_s < now_scheduled_s && r.verdict == Some(SweepVerdict::Pass))
            .max_by(|a, b| (a.scheduled_s, &a.run).cmp(&(b.scheduled_s, &b.run)))
            .map(|r| r.run.as_str()),
    }
}
