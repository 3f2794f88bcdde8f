//! What the agent does about the operator's `SweepRun`s (pure): which run this node starts
//! next, or why it waits; and how the executor is set up for a run (the negative controls, the
//! serving slots and context the grid needs).

use std::collections::HashSet;

use std::time::Duration;

use brink_api::crd::{ModelReplica, NodeRunState, RunPhase, SweepRun, WorkloadGrid, result_name};
use kube::ResourceExt;
use thiserror::Error;

/// A run this node has a part in, by namespace and name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RunRef {
    pub namespace: String,
    pub name: String,
}

impl RunRef {
    pub fn of(run: &SweepRun) -> RunRef {
        RunRef { namespace: run.namespace().unwrap_or_default(), name: run.name_any() }
    }

    /// This node's `SweepResult` in the run (the operator's naming, `brink_api::crd::result_name`).
    pub fn result(&self, node: &str) -> String {
        result_name(&self.name, node)
    }
}

impl std::fmt::Display for RunRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// What the node is busy with now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Busy {
    /// A qualification round is in flight (it may hold the GPU).
    pub qualifying: bool,
    /// A sweep is running here.
    pub sweeping: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Start this run's part now.
    Start(RunRef),
    /// A run is due, but the node is busy: it starts once the node is free (queued, not lost).
    Wait { due: RunRef, why: WaitReason },
    /// Nothing is due on this node.
    Nothing,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitReason {
    Qualifying,
    Sweeping,
}

/// The run this node should start: one whose progress for `node` is `Running` (the operator gave
/// it a slot), that is itself running (not complete or cancelled, not being deleted), and for which
/// no `SweepResult` of this node exists (`results`: `(namespace, name)` of the results that
/// exist; a result in any state means an agent started it already, maybe before a restart).
/// The earliest scheduled first, then by namespace and name, so every agent picks the same.
pub fn decide(node: &str, runs: &[SweepRun], results: &HashSet<(String, String)>, busy: Busy) -> Decision {
    let mut due: Vec<(i64, RunRef)> = runs
        .iter()
        .filter(|r| r.metadata.deletion_timestamp.is_none())
        .filter(|r| r.spec.nodes.iter().any(|n| n == node))
        .filter(|r| r.status.as_ref().is_some_and(|s| s.phase == RunPhase::Running))
        .filter(|r| {
            let progress = r.status.as_ref().and_then(|s| s.nodes.iter().find(|p| p.node == node));
            progress.is_some_and(|p| p.state == NodeRunState::Running)
        })
        .map(|r| (r.spec.scheduled_time.0.as_second(), RunRef::of(r)))
        .filter(|(_, run)| !results.contains(&(run.namespace.clone(), run.result(node))))
        .collect();
    due.sort();
    let Some((_, first)) = due.into_iter().next() else { return Decision::Nothing };
    if busy.sweeping {
        Decision::Wait { due: first, why: WaitReason::Sweeping }
    } else if busy.qualifying {
        Decision::Wait { due: first, why: WaitReason::Qualifying }
    } else {
        Decision::Start(first)
    }
}

/// Whether the run's negative controls (deliberate hangs) may run: asked for, and no replica on
/// this node (its SparkNode's `status.replicas`). `Err`: why they are skipped, for the result.
pub fn negative_controls(asked: bool, hosted_replicas: usize) -> Result<bool, super::qualify_plan::ReplicasResident> {
    if !asked {
        return Ok(false);
    }
    super::qualify_plan::negative_controls(hosted_replicas).map(|()| true)
}

/// The black-box qualification's deadline floor per case when a sweep measures a deployment's
/// replica (as `brink-agent sweep --url`'s `--case-deadline-s` default).
pub const REPLICA_CASE_DEADLINE: Duration = Duration::from_secs(30);

/// Why this node cannot measure the replica of the deployment a run names.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum ReplicaTargetError {
    #[error("ModelDeployment {namespace}/{deployment} has no replica on node {node} (a gang's leader node serves its API)")]
    NoReplica { namespace: String, deployment: String, node: String },
    #[error("ModelReplica {namespace}/{replica} publishes no endpoint yet (status.endpoint: its engine's Pod has no IP)")]
    NoEndpoint { namespace: String, replica: String },
}

/// The replica of `deployment` (namespace `ns`) whose node (a gang's leader node) is `node`,
/// not being deleted, and the URL of its engine's API (its `status.endpoint`).
pub fn replica_target<'a>(
    replicas: &'a [ModelReplica],
    ns: &str,
    deployment: &str,
    node: &str,
) -> Result<(&'a ModelReplica, String), ReplicaTargetError> {
    let mut here: Vec<&ModelReplica> = replicas
        .iter()
        .filter(|r| r.namespace().as_deref() == Some(ns) && r.spec.deployment == deployment && r.spec.node == node)
        .filter(|r| r.metadata.deletion_timestamp.is_none())
        .collect();
    // Every agent and every round picks the same one.
    here.sort_by_key(|r| r.name_any());
    let replica = here.first().ok_or_else(|| ReplicaTargetError::NoReplica {
        namespace: ns.into(),
        deployment: deployment.into(),
        node: node.into(),
    })?;
    let endpoint = replica.status.as_ref().and_then(|s| s.endpoint.as_deref()).filter(|e| !e.is_empty());
    let endpoint = endpoint.ok_or_else(|| ReplicaTargetError::NoEndpoint { namespace: ns.into(), replica: replica.name_any() })?;
    Ok((replica, format!("http://{endpoint}")))
}

/// Serving slots and context for the grid: one slot per concurrent stream of the largest
/// point, and a context that holds the longest prompt plus its generated tokens (the model's
/// trained context can be far larger, and its KV for every slot would not fit), rounded up to
/// 256 positions, with room for the chat template's tokens around the prompt.
pub fn engine_shape(grid: &WorkloadGrid) -> (usize, usize) {
    const TEMPLATE_ROOM: u64 = 64;
    let slots = grid.concurrency.iter().copied().max().unwrap_or(1).max(1) as usize;
    let prompt = grid.prompt_tokens.iter().copied().max().unwrap_or(0);
    let generated = grid.generated_tokens.iter().copied().max().unwrap_or(0);
    let need = u64::from(prompt) + u64::from(generated) + TEMPLATE_ROOM;
    (slots, need.div_ceil(256).saturating_mul(256) as usize)
}

#[cfg(test)]
mod tests {
    use super::*;
    use brink_api::crd::{BaselinePolicy, NodeProgress, SweepRunSpec, SweepRunStatus, SweepSelfTest};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;

    fn run(ns: &str, name: &str, at: i64, nodes: &[(&str, NodeRunState)], phase: RunPhase) -> SweepRun {
        let mut r = SweepRun::new(
            name,
            SweepRunSpec {
                sweep: "nightly".into(),
                scheduled_time: Time(Timestamp::from_second(at).unwrap()),
                model: "m".into(),
                nodes: nodes.iter().map(|(n, _)| n.to_string()).collect(),
                deployment: None,
                workload: WorkloadGrid { prompt_tokens: vec![64], concurrency: vec![1], generated_tokens: vec![8], requests_per_point: 2 },
                self_test: SweepSelfTest { enabled: true, negative_controls: true },
                baseline: BaselinePolicy::default(),
                max_concurrent_nodes: 1,
                drain_replicas: false,
                node_timeout_seconds: 600,
                extra_cases: Vec::new(),
            },
        );
        r.metadata.namespace = Some(ns.into());
        r.status = Some(SweepRunStatus {
            phase,
            nodes: nodes
                .iter()
                .map(|(n, s)| NodeProgress { node: n.to_string(), state: *s, started_at: None, verdict: None, message: None })
                .collect(),
            ..SweepRunStatus::default()
        });
        r
    }

    fn rr(ns: &str, name: &str) -> RunRef {
        RunRef { namespace: ns.into(), name: name.into() }
    }

    const FREE: Busy = Busy { qualifying: false, sweeping: false };
    const QUALIFYING: Busy = Busy { qualifying: true, sweeping: false };
    const SWEEPING: Busy = Busy { qualifying: false, sweeping: true };
    const BOTH: Busy = Busy { qualifying: true, sweeping: true };

    #[test]
    fn decisions() {
        use NodeRunState::*;
        use RunPhase::{Cancelled, Complete, Pending, Running as Active};
        let mine = |state| run("ops", "r1", 100, &[("n1", state), ("n2", Running)], Active);
        let deleted = {
            let mut r = mine(Running);
            r.metadata.deletion_timestamp = Some(Time(Timestamp::from_second(200).unwrap()));
            r
        };
        let no_status = {
            let mut r = mine(Running);
            r.status = None;
            r
        };
        let result = |ns: &str, name: &str| (ns.to_string(), name.to_string());
        // What, the runs, the results that exist (namespace, name), how busy the node is, the decision.
        type Case = (&'static str, Vec<SweepRun>, Vec<(String, String)>, Busy, Decision);
        let cases: Vec<Case> = vec![
            ("no runs", vec![], vec![], FREE, Decision::Nothing),
            ("my slot, no result: start", vec![mine(Running)], vec![], FREE, Decision::Start(rr("ops", "r1"))),
            ("waiting for a slot", vec![mine(Waiting)], vec![], FREE, Decision::Nothing),
            ("being drained", vec![mine(Draining)], vec![], FREE, Decision::Nothing),
            ("already done", vec![mine(Done)], vec![], FREE, Decision::Nothing),
            ("timed out", vec![mine(TimedOut)], vec![], FREE, Decision::Nothing),
            ("lost", vec![mine(Lost)], vec![], FREE, Decision::Nothing),
            ("skipped", vec![mine(Skipped)], vec![], FREE, Decision::Nothing),
            ("a result exists (started before a restart)", vec![mine(Running)], vec![result("ops", "r1-n1")], FREE, Decision::Nothing),
            (
                "another node's result does not count",
                vec![mine(Running)],
                vec![result("ops", "r1-n2")],
                FREE,
                Decision::Start(rr("ops", "r1")),
            ),
            (
                "a same-named result in another namespace does not count",
                vec![mine(Running)],
                vec![result("dev", "r1-n1")],
                FREE,
                Decision::Start(rr("ops", "r1")),
            ),
            ("not one of the run's nodes", vec![run("ops", "r1", 100, &[("n2", Running)], Active)], vec![], FREE, Decision::Nothing),
            ("run complete", vec![run("ops", "r1", 100, &[("n1", Running)], Complete)], vec![], FREE, Decision::Nothing),
            ("run cancelled", vec![run("ops", "r1", 100, &[("n1", Running)], Cancelled)], vec![], FREE, Decision::Nothing),
            ("run pending", vec![run("ops", "r1", 100, &[("n1", Running)], Pending)], vec![], FREE, Decision::Nothing),
            ("run being deleted", vec![deleted], vec![], FREE, Decision::Nothing),
            ("run without status", vec![no_status], vec![], FREE, Decision::Nothing),
            (
                "qualifying: queued",
                vec![mine(Running)],
                vec![],
                QUALIFYING,
                Decision::Wait { due: rr("ops", "r1"), why: WaitReason::Qualifying },
            ),
            ("sweeping: queued", vec![mine(Running)], vec![], SWEEPING, Decision::Wait { due: rr("ops", "r1"), why: WaitReason::Sweeping }),
            (
                "both: the sweep is named",
                vec![mine(Running)],
                vec![],
                BOTH,
                Decision::Wait { due: rr("ops", "r1"), why: WaitReason::Sweeping },
            ),
            ("busy with nothing due", vec![mine(Done)], vec![], BOTH, Decision::Nothing),
            (
                "earliest scheduled first",
                vec![run("ops", "late", 300, &[("n1", Running)], Active), run("ops", "early", 200, &[("n1", Running)], Active)],
                vec![],
                FREE,
                Decision::Start(rr("ops", "early")),
            ),
            (
                "same time: by namespace then name",
                vec![
                    run("b", "r", 100, &[("n1", Running)], Active),
                    run("a", "z", 100, &[("n1", Running)], Active),
                    run("a", "y", 100, &[("n1", Running)], Active),
                ],
                vec![],
                FREE,
                Decision::Start(rr("a", "y")),
            ),
            (
                "the earliest has a result: the next one",
                vec![run("ops", "early", 200, &[("n1", Running)], Active), run("ops", "late", 300, &[("n1", Running)], Active)],
                vec![result("ops", "early-n1")],
                FREE,
                Decision::Start(rr("ops", "late")),
            ),
            (
                "only the running one of several",
                vec![
                    run("ops", "a", 100, &[("n1", Done)], Active),
                    run("ops", "b", 200, &[("n1", Waiting)], Active),
                    run("ops", "c", 300, &[("n1", Running)], Active),
                ],
                vec![],
                FREE,
                Decision::Start(rr("ops", "c")),
            ),
        ];
        let n = cases.len();
        for (what, runs, results, busy, want) in cases {
            let results: HashSet<(String, String)> = results.into_iter().collect();
            assert_eq!(decide("n1", &runs, &results, busy), want, "{what}");
        }
        assert!(n >= 25, "{n} cases");
    }

    #[test]
    fn negative_controls_only_without_replicas() {
        for (asked, hosted, want) in
            [(true, 0, Ok(true)), (false, 0, Ok(false)), (false, 3, Ok(false)), (true, 1, Err(1)), (true, 7, Err(7))]
        {
            let got = negative_controls(asked, hosted);
            match want {
                Ok(v) => assert_eq!(got, Ok(v), "{asked} {hosted}"),
                Err(n) => {
                    let why = got.expect_err("skipped").to_string();
                    assert!(why.contains(&format!("{n} replica(s) resident")), "{why}");
                }
            }
        }
    }

    #[test]
    fn the_engine_holds_the_largest_point() {
        let g = |p: Vec<u32>, c: Vec<u32>, gen_: Vec<u32>| WorkloadGrid {
            prompt_tokens: p,
            concurrency: c,
            generated_tokens: gen_,
            requests_per_point: 1,
        };
        for (grid, want) in [
            (g(vec![64], vec![1, 2], vec![8]), (2, 256)),
            (g(vec![512, 4096], vec![1, 8], vec![64]), (8, 4352)),
            (g(vec![192], vec![4], vec![0]), (4, 256)),
            (g(vec![193], vec![4], vec![0]), (4, 512)),
            (g(vec![1 << 20], vec![1024], vec![65_536]), (1024, 1_114_368)),
            (g(vec![], vec![], vec![]), (1, 256)),
        ] {
            assert_eq!(engine_shape(&grid), want, "{grid:?}");
        }
    }
}
