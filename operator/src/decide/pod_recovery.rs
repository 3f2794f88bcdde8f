//! What to do with a replica whose Pod failed on a node that is healthy by every node check
//! (those are `lifecycle`'s and move the replica): the Pod is replaced in place, same replica,
//! same node, after an exponential backoff per replica. In place, because the replica's
//! placement (memory, spread, the envelope it was clamped to) is still valid, and because a
//! model or build that fails at once everywhere must not walk the fleet: its replicas stay
//! put and retry ever more slowly, while the deployment's status says why.
//!
//! A failure is counted once per Pod (by uid). The count is cleared once a Pod has served for
//! `stable_s`, so that a replica that failed last week starts again from the shortest wait.

/// The backoff and the thresholds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecoveryPolicy {
    /// The wait after the first failure; it doubles with each failure in a row.
    pub base_s: u64,
    /// The longest wait.
    pub cap_s: u64,
    /// Serving this long clears the count.
    pub stable_s: u64,
    /// A Pod that served and has been not ready this long has failed (its liveness probe did
    /// not restart it, or restarts do not help).
    pub not_ready_s: u64,
}

impl Default for RecoveryPolicy {
    fn default() -> RecoveryPolicy {
        // As the kubelet's container backoff: 10 s doubling to 5 minutes.
        RecoveryPolicy { base_s: 10, cap_s: 300, stable_s: 600, not_ready_s: 120 }
    }
}

impl RecoveryPolicy {
    /// The wait before the Pod of a replica with `count` failures in a row is replaced.
    pub fn backoff_s(&self, count: u32) -> u64 {
        let doublings = count.saturating_sub(1).min(63);
        self.base_s.saturating_mul(1u64 << doublings).min(self.cap_s)
    }
}

/// The operator's record of a replica's failed Pods (`status.podFailures`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FailureRecord {
    pub count: u32,
    pub last_failure_s: u64,
    pub pod_uid: String,
    pub message: String,
}

/// The replica's current Pod as recovery sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PodState {
    /// No Pod, or one being deleted: the replica controller creates the next one.
    Absent,
    /// Starting, or serving since `ready_for_s` (None: not ready).
    Up { uid: String, ready_for_s: Option<u64> },
    /// Failed, for `why`.
    Failed { uid: String, why: String },
}

/// What the replica controller does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Recovery {
    Nothing,
    /// A new failure: record it (the replica is `Failed`) and come back after the backoff.
    Record {
        record: FailureRecord,
        replace_in_s: u64,
    },
    /// A recorded failure still in its backoff.
    Wait {
        for_s: u64,
    },
    /// The backoff is over: delete the failed Pod, this uid only (the replica goes back to
    /// `Pending` and gets a new one), keeping the record.
    Replace {
        pod_uid: String,
    },
    /// The Pod has served for `stable_s`: clear the record.
    Clear,
}

pub fn recover(pod: &PodState, record: Option<&FailureRecord>, now_s: u64, policy: &RecoveryPolicy) -> Recovery {
    match pod {
        PodState::Absent => Recovery::Nothing,
        PodState::Up { ready_for_s, .. } => match (record, ready_for_s) {
            (Some(_), Some(up)) if *up >= policy.stable_s => Recovery::Clear,
            _ => Recovery::Nothing,
        },
        PodState::Failed { uid, why } => match record {
            Some(r) if r.pod_uid == *uid => {
                let due = r.last_failure_s.saturating_add(policy.backoff_s(r.count));
                if now_s >= due { Recovery::Replace { pod_uid: uid.clone() } } else { Recovery::Wait { for_s: due - now_s } }
            }
            _ => {
                let count = record.map_or(0, |r| r.count).saturating_add(1);
                let record = FailureRecord { count, last_failure_s: now_s, pod_uid: uid.clone(), message: why.clone() };
                Recovery::Record { record, replace_in_s: policy.backoff_s(count) }
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: RecoveryPolicy = RecoveryPolicy { base_s: 10, cap_s: 300, stable_s: 600, not_ready_s: 120 };

    fn rec(count: u32, at: u64, uid: &str) -> FailureRecord {
        FailureRecord { count, last_failure_s: at, pod_uid: uid.into(), message: "Evicted".into() }
    }

    fn failed(uid: &str) -> PodState {
        PodState::Failed { uid: uid.into(), why: "OOMKilled".into() }
    }

    #[test]
    fn the_backoff_doubles_and_is_capped() {
        let waits: Vec<u64> = (0..=8).map(|n| P.backoff_s(n)).collect();
        assert_eq!(waits, [10, 10, 20, 40, 80, 160, 300, 300, 300]);
        assert_eq!(P.backoff_s(u32::MAX), 300);
        let huge = RecoveryPolicy { base_s: u64::MAX / 2, ..P };
        assert_eq!(huge.backoff_s(10), 300, "no overflow past the cap");
    }

    #[test]
    fn recovery_table() {
        let up = |ready: Option<u64>| PodState::Up { uid: "p2".into(), ready_for_s: ready };
        let new = |count: u32, wait: u64| Recovery::Record {
            record: FailureRecord { count, last_failure_s: 1000, pod_uid: "p2".into(), message: "OOMKilled".into() },
            replace_in_s: wait,
        };
        // (what, pod, record, now) -> recovery
        let cases: Vec<(&str, PodState, Option<FailureRecord>, u64, Recovery)> = vec![
            ("no Pod yet", PodState::Absent, None, 1000, Recovery::Nothing),
            ("no Pod, a record kept", PodState::Absent, Some(rec(3, 900, "p1")), 1000, Recovery::Nothing),
            ("a healthy Pod, nothing recorded", up(Some(5000)), None, 1000, Recovery::Nothing),
            ("a first failure: recorded, 10 s", failed("p2"), None, 1000, new(1, 10)),
            ("the next Pod fails too: 20 s", failed("p2"), Some(rec(1, 900, "p1")), 1000, new(2, 20)),
            ("the sixth in a row: 5 minutes", failed("p2"), Some(rec(5, 900, "p1")), 1000, new(6, 300)),
            ("past the cap it stays 5 minutes", failed("p2"), Some(rec(40, 900, "p1")), 1000, new(41, 300)),
            ("the same Pod seen again within its wait", failed("p1"), Some(rec(2, 990, "p1")), 1000, Recovery::Wait { for_s: 10 }),
            ("the wait is over on the second", failed("p1"), Some(rec(2, 980, "p1")), 1000, Recovery::Replace { pod_uid: "p1".into() }),
            ("long over", failed("p1"), Some(rec(1, 10, "p1")), 1000, Recovery::Replace { pod_uid: "p1".into() }),
            ("the new Pod starts: the record stays", up(None), Some(rec(2, 980, "p1")), 1000, Recovery::Nothing),
            ("serving briefly: the record stays", up(Some(599)), Some(rec(2, 0, "p1")), 1000, Recovery::Nothing),
            ("serving for the stable time: cleared", up(Some(600)), Some(rec(2, 0, "p1")), 1000, Recovery::Clear),
        ];
        for (what, pod, record, now, want) in cases {
            assert_eq!(recover(&pod, record.as_ref(), now, &P), want, "{what}");
        }
    }

    /// A replica whose every Pod fails at once: over an hour, the Pods replaced stay few.
    #[test]
    fn a_replica_that_always_fails_is_replaced_ever_more_slowly() {
        let mut record: Option<FailureRecord> = None;
        let mut replaced = 0;
        let mut pod = 0u32;
        for now in 0..3600u64 {
            let state = failed(&format!("p{pod}"));
            match recover(&state, record.as_ref(), now, &P) {
                Recovery::Record { record: r, .. } => record = Some(r),
                Recovery::Replace { pod_uid } => {
                    assert_eq!(pod_uid, format!("p{pod}"));
                    replaced += 1;
                    pod += 1;
                }
                Recovery::Wait { .. } => {}
                other => panic!("{other:?} at {now}"),
            }
        }
        // 10+20+40+80+160 s, then one per 300 s: 5 + (3600 - 310) / 300 = 15.
        assert_eq!(replaced, 15);
        assert_eq!(record.map(|r| r.count), Some(16));
    }
}
