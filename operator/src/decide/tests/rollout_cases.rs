//! `decide_rollout`: one table of single steps, each case also run with the replicas in every
//! rotation of both orders (the decision must not depend on the order the cache lists them in).

use brink_api::crd::{ConditionStatus, ReplicaPhase, RolloutPhase, RolloutStatus, RolloutStrategy};

use super::*;

pub const DEADLINE: u64 = 900;
pub const POL: RolloutPolicy = RolloutPolicy { max_canary_restarts: 2, min_ready_s: 30 };

/// A replica on a healthy node that has served revision `rev` for a long time.
pub fn rep(name: &str, node: &str, rev: &str) -> RolloutReplica {
    RolloutReplica {
        name: name.into(),
        node: node.into(),
        node_healthy: true,
        revision: rev.into(),
        revision_since_s: NOW - 10_000,
        phase: ReplicaPhase::Serving,
        phase_since_s: NOW - 5_000,
        ready: true,
        test: ThresholdTest::Passed,
        restarts: 0,
    }
}

/// A replica that got `rev` `age_s` seconds ago and is in `phase` (not ready, test pending).
pub fn starting(name: &str, node: &str, rev: &str, age_s: u64, phase: ReplicaPhase) -> RolloutReplica {
    RolloutReplica {
        revision_since_s: NOW - age_s,
        phase,
        phase_since_s: NOW - age_s.min(10),
        ready: false,
        test: ThresholdTest::Pending,
        ..rep(name, node, rev)
    }
}

/// A replica that got `rev` `age_s` ago and has served (and passed) for `serving_s`.
pub fn serving_for(name: &str, node: &str, rev: &str, age_s: u64, serving_s: u64) -> RolloutReplica {
    RolloutReplica { revision_since_s: NOW - age_s, phase_since_s: NOW - serving_s, ..rep(name, node, rev) }
}

pub fn edit(mut r: RolloutReplica, f: impl FnOnce(&mut RolloutReplica)) -> RolloutReplica {
    f(&mut r);
    r
}

pub fn status(phase: RolloutPhase, rev: &str, prev: Option<&str>, canary: Option<&str>) -> RolloutStatus {
    RolloutStatus {
        phase,
        revision: rev.into(),
        previous_revision: prev.map(Into::into),
        canary_replica: canary.map(Into::into),
        message: Some("earlier".into()),
    }
}

pub fn spec(rev: &str, replicas: u64) -> RolloutSpec {
    RolloutSpec { desired_revision: rev.into(), strategy: RolloutStrategy::Canary, progress_deadline_s: DEADLINE, replicas }
}

struct Case {
    name: &'static str,
    spec: RolloutSpec,
    previous: Option<RolloutStatus>,
    replicas: Vec<RolloutReplica>,
    phase: RolloutPhase,
    /// (previous revision, canary) expected in the status.
    previous_revision: Option<&'static str>,
    canary: Option<&'static str>,
    /// (replica, revision), in any order.
    recreate: Vec<(&'static str, &'static str)>,
    new_rev: &'static str,
    cond: (ConditionStatus, &'static str),
    /// Texts the status message must contain.
    says: Vec<&'static str>,
    /// Event reasons, in order.
    events: Vec<&'static str>,
    recheck: Option<u64>,
}

fn case(name: &'static str, spec: RolloutSpec, previous: Option<RolloutStatus>, replicas: Vec<RolloutReplica>) -> Case {
    Case {
        name,
        spec,
        previous,
        replicas,
        phase: RolloutPhase::Complete,
        previous_revision: None,
        canary: None,
        recreate: vec![],
        new_rev: "",
        cond: (ConditionStatus::False, "RolloutComplete"),
        says: vec![],
        events: vec![],
        recheck: None,
    }
}

impl Case {
    fn expect(mut self, phase: RolloutPhase, prev: Option<&'static str>, canary: Option<&'static str>, new_rev: &'static str) -> Case {
        self.phase = phase;
        self.previous_revision = prev;
        self.canary = canary;
        self.new_rev = new_rev;
        self
    }
    fn recreate(mut self, r: &[(&'static str, &'static str)]) -> Case {
        self.recreate = r.to_vec();
        self
    }
    fn cond(mut self, status: ConditionStatus, reason: &'static str) -> Case {
        self.cond = (status, reason);
        self
    }
    fn says(mut self, texts: &[&'static str]) -> Case {
        self.says = texts.to_vec();
        self
    }
    fn events(mut self, reasons: &[&'static str]) -> Case {
        self.events = reasons.to_vec();
        self
    }
    fn recheck(mut self, s: u64) -> Case {
        self.recheck = Some(s);
        self
    }
    fn strategy(mut self, s: RolloutStrategy) -> Case {
        self.spec.strategy = s;
        self
    }
}

/// Three replicas a, b, c on nodes n-a.. serving `rev`.
fn three(rev: &str) -> Vec<RolloutReplica> {
    vec![rep("a", "n-a", rev), rep("b", "n-b", rev), rep("c", "n-c", rev)]
}

/// Canary `a` on r2 in `state`, b and c serving r1.
fn canary_with(a: RolloutReplica) -> Vec<RolloutReplica> {
    vec![a, rep("b", "n-b", "r1"), rep("c", "n-c", "r1")]
}

fn canary_status() -> Option<RolloutStatus> {
    Some(status(RolloutPhase::Canary, "r2", Some("r1"), Some("a")))
}

fn cases() -> Vec<Case> {
    use ConditionStatus::{False, True};
    use ReplicaPhase::*;
    use RolloutPhase::*;
    let prog = || Some(status(Progressing, "r2", Some("r1"), Some("a")));
    vec![
        // --- first creation and steady states
        case("first creation, all serving", spec("r1", 3), None, three("r1"))
            .expect(Complete, None, None, "r1")
            .says(&["all 3 replicas run revision r1"])
            .events(&["RolloutComplete"]),
        case(
            "first creation, one still loading: nothing to canary",
            spec("r1", 2),
            None,
            vec![rep("a", "n-a", "r1"), starting("b", "n-b", "r1", 100, Loading)],
        )
        .expect(Progressing, None, None, "r1")
        .cond(True, "RollingOut")
        .says(&["waiting for b (phase Loading, not Ready, threshold test pending)", "1/2 serve"])
        .events(&["RolloutStarted"])
        .recheck(DEADLINE - 100 + 1),
        case("first creation, replicas not yet created", spec("r1", 2), None, vec![rep("a", "n-a", "r1")])
            .expect(Progressing, None, None, "r1")
            .cond(True, "RollingOut")
            .says(&["1 of 2 replicas exist"])
            .events(&["RolloutStarted"]),
        case("0 replicas: complete at once", spec("r2", 0), Some(status(Complete, "r1", None, None)), vec![])
            .expect(Complete, Some("r1"), None, "r2")
            .says(&["all 0 replicas run revision r2"])
            .events(&["RolloutComplete"]),
        case("complete stays complete, no events", spec("r1", 3), Some(status(Complete, "r1", None, None)), three("r1"))
            .expect(Complete, None, None, "r1"),
        case(
            "complete stays complete while a replica restarts (the lifecycle's business)",
            spec("r1", 3),
            Some(status(Complete, "r1", None, None)),
            vec![rep("a", "n-a", "r1"), starting("b", "n-b", "r1", 5_000, Stalled), rep("c", "n-c", "r1")],
        )
        .expect(Complete, None, None, "r1"),
        case(
            "complete with a stray replica on another revision: moved back",
            spec("r1", 3),
            Some(status(Complete, "r1", None, None)),
            vec![rep("a", "n-a", "r1"), rep("b", "n-b", "r0"), rep("c", "n-c", "r1")],
        )
        .expect(Progressing, None, None, "r1")
        .recreate(&[("b", "r1")])
        .cond(True, "RollingOut")
        .events(&["RolloutStarted"]),
        // --- a new revision starts a canary
        case("new revision: canary on the first serving replica", spec("r2", 3), Some(status(Complete, "r1", None, None)), three("r1"))
            .expect(Canary, Some("r1"), Some("a"), "r1")
            .recreate(&[("a", "r2")])
            .cond(True, "CanaryStarted")
            .says(&["canary a on node n-a starts revision r2 (previous r1)"])
            .events(&["CanaryStarted"])
            .recheck(DEADLINE + 1),
        case(
            "canary prefers a healthy node",
            spec("r2", 3),
            Some(status(Complete, "r1", None, None)),
            vec![edit(rep("a", "n-a", "r1"), |r| r.node_healthy = false), rep("b", "n-b", "r1"), rep("c", "n-c", "r1")],
        )
        .expect(Canary, Some("r1"), Some("b"), "r1")
        .recreate(&[("b", "r2")])
        .cond(True, "CanaryStarted")
        .events(&["CanaryStarted"])
        .recheck(DEADLINE + 1),
        case(
            "canary prefers a serving replica (its node is proven)",
            spec("r2", 2),
            Some(status(Complete, "r1", None, None)),
            vec![rep("a", "n-a", "r1"), rep("b", "n-b", "r1"), rep("c", "n-c", "r1"), starting("d", "n-d", "r1", 50, Loading)],
        )
        .expect(Canary, Some("r1"), Some("a"), "r1")
        .recreate(&[("a", "r2")])
        .cond(True, "CanaryStarted")
        .events(&["CanaryStarted"])
        .recheck(DEADLINE + 1),
        case(
            "canary takes a non-serving replica when taking a serving one would leave fewer than replicas-1",
            spec("r2", 3),
            Some(status(Complete, "r1", None, None)),
            vec![rep("a", "n-a", "r1"), starting("b", "n-b", "r1", 50, Loading), rep("c", "n-c", "r1")],
        )
        .expect(Canary, Some("r1"), Some("b"), "r1")
        .recreate(&[("b", "r2")])
        .cond(True, "CanaryStarted")
        .events(&["CanaryStarted"])
        .recheck(DEADLINE + 1),
        case("1 replica: it is the canary", spec("r2", 1), Some(status(Complete, "r1", None, None)), vec![rep("a", "n-a", "r1")])
            .expect(Canary, Some("r1"), Some("a"), "r1")
            .recreate(&[("a", "r2")])
            .cond(True, "CanaryStarted")
            .events(&["CanaryStarted"])
            .recheck(DEADLINE + 1),
        case("lost status: the replicas say what ran", spec("r2", 3), None, three("r1"))
            .expect(Canary, Some("r1"), Some("a"), "r1")
            .recreate(&[("a", "r2")])
            .cond(True, "CanaryStarted")
            .events(&["CanaryStarted"])
            .recheck(DEADLINE + 1),
        case("AllAtOnce replaces all", spec("r2", 3), Some(status(Complete, "r1", None, None)), three("r1"))
            .strategy(RolloutStrategy::AllAtOnce)
            .expect(Progressing, Some("r1"), None, "r2")
            .recreate(&[("a", "r2"), ("b", "r2"), ("c", "r2")])
            .cond(True, "RollingOut")
            .says(&["moving a, b, c to revision r2"])
            .events(&["RolloutStarted"]),
        // --- the canary's verdicts
        case("canary not yet recreated: asked again, no new event", spec("r2", 3), canary_status(), three("r1"))
            .expect(Canary, Some("r1"), Some("a"), "r1")
            .recreate(&[("a", "r2")])
            .cond(True, "CanaryStarted")
            .recheck(DEADLINE + 1),
        case("canary loading: wait", spec("r2", 3), canary_status(), canary_with(starting("a", "n-a", "r2", 100, Loading)))
            .expect(Canary, Some("r1"), Some("a"), "r1")
            .cond(True, "CanaryWaiting")
            .says(&["canary a on node n-a of revision r2: phase Loading, not Ready, threshold test pending"])
            .recheck(DEADLINE - 100 + 1),
        case(
            "canary serving but test pending: wait",
            spec("r2", 3),
            canary_status(),
            canary_with(edit(serving_for("a", "n-a", "r2", 200, 100), |r| r.test = ThresholdTest::Pending)),
        )
        .expect(Canary, Some("r1"), Some("a"), "r1")
        .cond(True, "CanaryWaiting")
        .says(&["phase Serving, Ready, threshold test pending"])
        .recheck(DEADLINE - 200 + 1),
        case(
            "canary serving, passed, not Ready: wait",
            spec("r2", 3),
            canary_status(),
            canary_with(edit(serving_for("a", "n-a", "r2", 200, 100), |r| r.ready = false)),
        )
        .expect(Canary, Some("r1"), Some("a"), "r1")
        .cond(True, "CanaryWaiting")
        .says(&["phase Serving, not Ready, threshold test passed"])
        .recheck(DEADLINE - 200 + 1),
        case(
            "canary serving 10 s of 30: wait for min ready",
            spec("r2", 3),
            canary_status(),
            canary_with(serving_for("a", "n-a", "r2", 200, 10)),
        )
        .expect(Canary, Some("r1"), Some("a"), "r1")
        .cond(True, "CanaryWaiting")
        .says(&["serving; must keep serving for 30s"])
        .recheck(20),
        case(
            "canary serving past the deadline but not yet min ready: the deadline was met",
            spec("r2", 3),
            canary_status(),
            canary_with(serving_for("a", "n-a", "r2", DEADLINE + 50, 5)),
        )
        .expect(Canary, Some("r1"), Some("a"), "r1")
        .cond(True, "CanaryWaiting")
        .recheck(25),
        case("canary proven: first batch follows", spec("r2", 3), canary_status(), canary_with(serving_for("a", "n-a", "r2", 200, 30)))
            .expect(Progressing, Some("r1"), Some("a"), "r2")
            .recreate(&[("b", "r2")])
            .cond(True, "CanaryPassed")
            .says(&["canary a on node n-a serves and passed its threshold test", "moving b to revision r2", "1 more to go"])
            .events(&["CanaryPassed"]),
        case("1 replica: canary proven completes", spec("r2", 1), canary_status(), vec![serving_for("a", "n-a", "r2", 200, 60)])
            .expect(Complete, Some("r1"), Some("a"), "r2")
            .events(&["RolloutComplete"]),
        case("canary Failed: rolled back", spec("r2", 3), canary_status(), canary_with(starting("a", "n-a", "r2", 100, Failed)))
            .expect(RolledBack, Some("r1"), Some("a"), "r1")
            .recreate(&[("a", "r1")])
            .cond(False, "RolledBack")
            .says(&["canary a on node n-a rolled back to revision r1: phase Failed"])
            .events(&["RolledBack"]),
        case("canary Stalled: rolled back", spec("r2", 3), canary_status(), canary_with(starting("a", "n-a", "r2", 100, Stalled)))
            .expect(RolledBack, Some("r1"), Some("a"), "r1")
            .recreate(&[("a", "r1")])
            .cond(False, "RolledBack")
            .says(&["phase Stalled"])
            .events(&["RolledBack"]),
        case(
            "canary failed its threshold test: rolled back naming the case",
            spec("r2", 3),
            canary_status(),
            canary_with(edit(starting("a", "n-a", "r2", 100, SelfTesting), |r| {
                r.test = ThresholdTest::Failed("moe_gemm tokens=8193: max abs err 0.41 > 0.02".into())
            })),
        )
        .expect(RolledBack, Some("r1"), Some("a"), "r1")
        .recreate(&[("a", "r1")])
        .cond(False, "RolledBack")
        .says(&["threshold test failed: moe_gemm tokens=8193: max abs err 0.41 > 0.02"])
        .events(&["RolledBack"]),
        case(
            "flapping canary: serving now, but 3 restarts > 2",
            spec("r2", 3),
            canary_status(),
            canary_with(edit(serving_for("a", "n-a", "r2", 600, 200), |r| r.restarts = 3)),
        )
        .expect(RolledBack, Some("r1"), Some("a"), "r1")
        .recreate(&[("a", "r1")])
        .cond(False, "RolledBack")
        .says(&["3 restarts (more than 2)"])
        .events(&["RolledBack"]),
        case(
            "flapping canary: 2 restarts, back to Serving 5 s ago: not yet proven",
            spec("r2", 3),
            canary_status(),
            canary_with(edit(serving_for("a", "n-a", "r2", 600, 5), |r| r.restarts = 2)),
        )
        .expect(Canary, Some("r1"), Some("a"), "r1")
        .cond(True, "CanaryWaiting")
        .recheck(25),
        case(
            "flapping canary: 2 restarts, now Loading again: wait",
            spec("r2", 3),
            canary_status(),
            canary_with(edit(starting("a", "n-a", "r2", 600, Loading), |r| r.restarts = 2)),
        )
        .expect(Canary, Some("r1"), Some("a"), "r1")
        .cond(True, "CanaryWaiting")
        .recheck(DEADLINE - 600 + 1),
        case(
            "deadline exactly at the boundary: still has time",
            spec("r2", 3),
            canary_status(),
            canary_with(starting("a", "n-a", "r2", DEADLINE, SelfTesting)),
        )
        .expect(Canary, Some("r1"), Some("a"), "r1")
        .cond(True, "CanaryWaiting")
        .recheck(1),
        case(
            "deadline one second past: rolled back",
            spec("r2", 3),
            canary_status(),
            canary_with(starting("a", "n-a", "r2", DEADLINE + 1, SelfTesting)),
        )
        .expect(RolledBack, Some("r1"), Some("a"), "r1")
        .recreate(&[("a", "r1")])
        .cond(False, "RolledBack")
        .says(&["after 901s (progressDeadlineSeconds 900): phase SelfTesting"])
        .events(&["RolledBack"]),
        case(
            "serving exactly at the deadline with min ready met: proven",
            spec("r2", 1),
            canary_status(),
            vec![serving_for("a", "n-a", "r2", DEADLINE, 30)],
        )
        .expect(Complete, Some("r1"), Some("a"), "r2")
        .events(&["RolloutComplete"]),
        case(
            "canary gone (node drained): a new canary",
            spec("r2", 3),
            canary_status(),
            vec![rep("b", "n-b", "r1"), rep("c", "n-c", "r1"), rep("d", "n-d", "r1")],
        )
        .expect(Canary, Some("r1"), Some("b"), "r1")
        .recreate(&[("b", "r2")])
        .cond(True, "CanaryStarted")
        .says(&["canary a is gone; canary b on node n-b starts revision r2"])
        .events(&["CanaryStarted"])
        .recheck(DEADLINE + 1),
        // --- mid-rollout changes
        case(
            "desired revision changes mid-canary: the canary restarts with the new one",
            spec("r3", 3),
            canary_status(),
            canary_with(starting("a", "n-a", "r2", 100, Loading)),
        )
        .expect(Canary, Some("r1"), Some("a"), "r1")
        .recreate(&[("a", "r3")])
        .cond(True, "CanaryStarted")
        .says(&["canary a on node n-a starts revision r3 (previous r1)"])
        .events(&["CanaryStarted"])
        .recheck(DEADLINE + 1),
        case(
            "desired revision changes mid-canary, the canary's node unhealthy: a new canary, the old one returns",
            spec("r3", 3),
            canary_status(),
            canary_with(edit(starting("a", "n-a", "r2", 100, Loading), |r| r.node_healthy = false)),
        )
        .expect(Canary, Some("r1"), Some("b"), "r1")
        .recreate(&[("a", "r1"), ("b", "r3")])
        .cond(True, "CanaryStarted")
        .events(&["CanaryStarted"])
        .recheck(DEADLINE + 1),
        case(
            "desired revision changes mid-canary back to the previous: no canary needed",
            spec("r1", 3),
            canary_status(),
            canary_with(starting("a", "n-a", "r2", 100, Loading)),
        )
        .expect(Progressing, None, None, "r1")
        .recreate(&[("a", "r1")])
        .cond(True, "RollingOut")
        .events(&["RolloutStarted"]),
        case(
            "desired revision changes mid-progress: the partly rolled-out revision is the fallback",
            spec("r3", 3),
            prog(),
            vec![serving_for("a", "n-a", "r2", 500, 400), serving_for("b", "n-b", "r2", 100, 50), rep("c", "n-c", "r1")],
        )
        .expect(Canary, Some("r2"), Some("a"), "r2")
        .recreate(&[("a", "r3")])
        .cond(True, "CanaryStarted")
        .events(&["CanaryStarted"])
        .recheck(DEADLINE + 1),
        // --- after the canary
        case(
            "progressing: batch in flight, wait",
            spec("r2", 3),
            prog(),
            vec![serving_for("a", "n-a", "r2", 500, 400), starting("b", "n-b", "r2", 60, Downloading), rep("c", "n-c", "r1")],
        )
        .expect(Progressing, Some("r1"), Some("a"), "r2")
        .cond(True, "RollingOut")
        .says(&["waiting for b (phase Downloading", "1 more to go", "2/3 serve"])
        .recheck(DEADLINE - 60 + 1),
        case(
            "progressing: next batch once the last serves",
            spec("r2", 3),
            prog(),
            vec![serving_for("a", "n-a", "r2", 500, 400), serving_for("b", "n-b", "r2", 100, 50), rep("c", "n-c", "r1")],
        )
        .expect(Progressing, Some("r1"), Some("a"), "r2")
        .recreate(&[("c", "r2")])
        .cond(True, "RollingOut"),
        case(
            "progressing: a non-serving old replica goes first (costs nothing)",
            spec("r2", 4),
            prog(),
            vec![
                serving_for("a", "n-a", "r2", 500, 400),
                rep("b", "n-b", "r1"),
                starting("c", "n-c", "r1", 3_000, Loading),
                rep("d", "n-d", "r1"),
            ],
        )
        .expect(Progressing, Some("r1"), Some("a"), "r2")
        .recreate(&[("c", "r2")])
        .cond(True, "RollingOut"),
        case(
            "progressing: holds when taking one out leaves fewer than replicas-1 serving",
            spec("r2", 4),
            prog(),
            vec![serving_for("a", "n-a", "r2", 500, 400), rep("b", "n-b", "r1"), rep("c", "n-c", "r1")],
        )
        .expect(Progressing, Some("r1"), Some("a"), "r2")
        .cond(True, "RollingOut")
        .says(&["holding: 3 of 4 replicas serve; maxUnavailable is 1"]),
        case(
            "progressing: a replica that fails after the canary stops the rollout (no rollback)",
            spec("r2", 3),
            prog(),
            vec![serving_for("a", "n-a", "r2", 500, 400), starting("b", "n-b", "r2", 60, Failed), rep("c", "n-c", "r1")],
        )
        .expect(Progressing, Some("r1"), Some("a"), "r2")
        .cond(False, "ReplicaFailed")
        .says(&["b on node n-b at revision r2: phase Failed"])
        .events(&["RolloutStuck"]),
        case(
            "progressing: a replica past the deadline stops the rollout",
            spec("r2", 3),
            prog(),
            vec![serving_for("a", "n-a", "r2", 5_000, 4_000), starting("b", "n-b", "r2", DEADLINE + 1, Loading), rep("c", "n-c", "r1")],
        )
        .expect(Progressing, Some("r1"), Some("a"), "r2")
        .cond(False, "ProgressDeadlineExceeded")
        .says(&["b on node n-b at revision r2: not serving"])
        .events(&["RolloutStuck"]),
        case(
            "progressing: all on the revision and serving: complete",
            spec("r2", 3),
            prog(),
            vec![serving_for("a", "n-a", "r2", 500, 400), serving_for("b", "n-b", "r2", 300, 250), serving_for("c", "n-c", "r2", 100, 50)],
        )
        .expect(Complete, Some("r1"), Some("a"), "r2")
        .says(&["all 3 replicas run revision r2"])
        .events(&["RolloutComplete"]),
        // --- after a rollback
        case(
            "rolled back: the revision is not retried",
            spec("r2", 3),
            Some(status(RolledBack, "r2", Some("r1"), Some("a"))),
            vec![starting("a", "n-a", "r1", 20, Loading), rep("b", "n-b", "r1"), rep("c", "n-c", "r1")],
        )
        .expect(RolledBack, Some("r1"), Some("a"), "r1")
        .cond(False, "RolledBack")
        .says(&["earlier"]),
        case(
            "rolled back: a canary still on the failed revision is returned",
            spec("r2", 3),
            Some(status(RolledBack, "r2", Some("r1"), Some("a"))),
            canary_with(starting("a", "n-a", "r2", 2_000, Failed)),
        )
        .expect(RolledBack, Some("r1"), Some("a"), "r1")
        .recreate(&[("a", "r1")])
        .cond(False, "RolledBack"),
        case(
            "rolled back without a previous revision (hand-written status): nothing moves",
            spec("r2", 2),
            Some(status(RolledBack, "r2", None, Some("a"))),
            vec![starting("a", "n-a", "r2", 2_000, Failed), rep("b", "n-b", "r2")],
        )
        .expect(RolledBack, None, Some("a"), "r2")
        .cond(False, "RolledBack")
        .says(&["no previous revision to return to"]),
        case(
            "rollback then a new revision: a new canary from the previous",
            spec("r3", 3),
            Some(status(RolledBack, "r2", Some("r1"), Some("a"))),
            vec![serving_for("a", "n-a", "r1", 600, 500), rep("b", "n-b", "r1"), rep("c", "n-c", "r1")],
        )
        .expect(Canary, Some("r1"), Some("a"), "r1")
        .recreate(&[("a", "r3")])
        .cond(True, "CanaryStarted")
        .says(&["starts revision r3 (previous r1)"])
        .events(&["CanaryStarted"])
        .recheck(DEADLINE + 1),
        case(
            "rollback then back to the previous revision: complete",
            spec("r1", 3),
            Some(status(RolledBack, "r2", Some("r1"), Some("a"))),
            three("r1"),
        )
        .expect(Complete, None, None, "r1")
        .events(&["RolloutComplete"]),
    ]
}

fn check(c: &Case, replicas: &[RolloutReplica]) {
    let d = decide_rollout(&c.spec, c.previous.as_ref(), replicas, NOW, &POL).unwrap_or_else(|e| panic!("{}: {e}", c.name));
    let ctx = format!("{}: {d:#?}", c.name);
    assert_eq!(d.status.phase, c.phase, "{ctx}");
    assert_eq!(d.status.revision, c.spec.desired_revision, "{ctx}");
    assert_eq!(d.status.previous_revision.as_deref(), c.previous_revision, "{ctx}");
    assert_eq!(d.status.canary_replica.as_deref(), c.canary, "{ctx}");
    let mut got: Vec<(&str, &str)> = d.recreate.iter().map(|r| (r.replica.as_str(), r.revision.as_str())).collect();
    got.sort();
    let mut want = c.recreate.clone();
    want.sort();
    assert_eq!(got, want, "{ctx}");
    for r in &d.recreate {
        let on = replicas.iter().find(|x| x.name == r.replica).map(|x| x.node.as_str());
        assert_eq!(on, Some(r.node.as_str()), "{ctx}: a replica is recreated on its own node");
        assert!(!r.why.is_empty(), "{ctx}");
    }
    assert_eq!(d.new_replica_revision, c.new_rev, "{ctx}");
    assert_eq!((d.condition.status, d.condition.reason), c.cond, "{ctx}");
    assert_eq!(d.condition.type_, brink_api::crd::ConditionType::Progressing, "{ctx}");
    let message = d.status.message.as_deref().unwrap_or_default();
    for s in &c.says {
        assert!(message.contains(s) || d.condition.message.contains(s), "{ctx}\nmessage lacks {s:?}");
    }
    // The condition's reason is one the API server accepts.
    brink_api::crd::condition(d.condition.type_, d.condition.status, d.condition.reason, d.condition.message.clone(), None, at0())
        .unwrap_or_else(|e| panic!("{ctx}: {e}"));
    let reasons: Vec<&str> = d.events.iter().map(|e| e.reason).collect();
    assert_eq!(reasons, c.events, "{ctx}");
    assert_eq!(d.recheck_in_s, c.recheck, "{ctx}");
}

fn at0() -> brink_api::crd::conditions::Time {
    brink_api::crd::conditions::Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)
}

#[test]
fn rollout_table() {
    let cases = cases();
    assert!(cases.len() >= 40, "{} cases", cases.len());
    for c in &cases {
        for order in orders(&c.replicas) {
            check(c, &order);
        }
    }
}

#[test]
fn bad_input_is_a_typed_error() {
    let e = decide_rollout(&spec("", 1), None, &[], NOW, &POL).unwrap_err();
    assert_eq!(e, RolloutError::EmptyRevision { field: "desired revision".into() });
    let e = decide_rollout(&spec("r1", 2), None, &[rep("a", "n-a", "r1"), rep("a", "n-b", "r1")], NOW, &POL).unwrap_err();
    assert_eq!(e.to_string(), "replica a listed twice");
    let e = decide_rollout(&spec("r1", 1), None, &[rep("a", "n-a", "")], NOW, &POL).unwrap_err();
    assert!(e.to_string().contains("ModelReplica a spec.revision: empty revision"), "{e}");
}

#[test]
fn a_stuck_rollout_warns_once() {
    let replicas =
        vec![serving_for("a", "n-a", "r2", 500, 400), starting("b", "n-b", "r2", 60, ReplicaPhase::Failed), rep("c", "n-c", "r1")];
    let prev = status(RolloutPhase::Progressing, "r2", Some("r1"), Some("a"));
    let first = decide_rollout(&spec("r2", 3), Some(&prev), &replicas, NOW, &POL).unwrap();
    assert_eq!(first.events.len(), 1);
    assert_eq!(first.events[0].type_, EventType::Warning);
    // The next pass, later, with the same replica stuck: the status is unchanged, no new Event.
    let again = decide_rollout(&spec("r2", 3), Some(&first.status), &replicas, NOW + 300, &POL).unwrap();
    assert!(again.events.is_empty(), "{again:#?}");
    assert_eq!(again.status, first.status);
}
