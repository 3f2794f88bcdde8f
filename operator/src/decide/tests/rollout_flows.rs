//! `decide_rollout` driven over time, as the controller would: each pass writes the status,
//! recreates the listed replicas, and the replicas then move through their phases according to
//! how their revision behaves. Checks the invariants on every pass (never fewer than
//! `replicas - 1` serving once all served; at most one replica off the old revision while a
//! canary is out; a rolled-back revision never comes back) and where each flow ends.

use std::collections::BTreeMap;

use brink_api::crd::{ReplicaPhase, RolloutPhase, RolloutStatus, RolloutStrategy};

use super::rollout_cases::{DEADLINE, POL, rep, spec};
use super::*;

/// How a replica on a revision behaves after it is (re)created.
#[derive(Clone, Copy, Debug)]
enum Behaviour {
    /// Loads for 60 s, self-tests for 60 s, then serves and passes.
    Good,
    /// Loads, then fails its threshold test at 120 s.
    FailsTest,
    /// Serves at 120 s for 20 s, then restarts (back to Loading for 20 s), and again: never
    /// Failed or Stalled when looked at, but its restarts climb.
    Flaps,
    /// Stays in Loading for ever.
    Hangs,
}

struct Sim {
    now: u64,
    replicas: Vec<RolloutReplica>,
    status: Option<RolloutStatus>,
    behaviour: BTreeMap<&'static str, Behaviour>,
    /// Revisions that were ever rolled back.
    rolled_back: Vec<String>,
}

impl Sim {
    fn new(n: usize, rev: &'static str) -> Sim {
        let replicas = (0..n).map(|i| rep(&format!("r{i}"), &format!("node-{i}"), rev)).collect();
        let behaviour = BTreeMap::from([(rev, Behaviour::Good)]);
        Sim { now: NOW, replicas, status: None, behaviour, rolled_back: vec![] }
    }

    /// Sets each replica's phase from its age on its revision.
    fn advance(&mut self, dt: u64) {
        self.now += dt;
        for r in &mut self.replicas {
            let age = self.now - r.revision_since_s;
            let b = self.behaviour.get(r.revision.as_str()).copied().unwrap_or(Behaviour::Good);
            let (phase, test, since, restarts) = match b {
                Behaviour::Good if age < 60 => (ReplicaPhase::Loading, ThresholdTest::Pending, r.revision_since_s, 0),
                Behaviour::Good if age < 120 => (ReplicaPhase::SelfTesting, ThresholdTest::Pending, r.revision_since_s + 60, 0),
                Behaviour::Good => (ReplicaPhase::Serving, ThresholdTest::Passed, r.revision_since_s + 120, 0),
                Behaviour::FailsTest if age < 120 => (ReplicaPhase::SelfTesting, ThresholdTest::Pending, r.revision_since_s, 0),
                Behaviour::FailsTest => {
                    (ReplicaPhase::Failed, ThresholdTest::Failed("case 8193 tokens".into()), r.revision_since_s + 120, 0)
                }
                Behaviour::Flaps if age < 120 => (ReplicaPhase::Loading, ThresholdTest::Pending, r.revision_since_s, 0),
                Behaviour::Flaps => {
                    let k = (age - 120) / 40;
                    let start = r.revision_since_s + 120 + 40 * k;
                    if (age - 120) % 40 < 20 {
                        (ReplicaPhase::Serving, ThresholdTest::Passed, start, k as u32)
                    } else {
                        (ReplicaPhase::Loading, ThresholdTest::Pending, start + 20, k as u32 + 1)
                    }
                }
                Behaviour::Hangs => (ReplicaPhase::Loading, ThresholdTest::Pending, r.revision_since_s, 0),
            };
            // Only a change of phase moves `phase_since_s` (a long-serving replica keeps its time).
            if r.phase != phase || age == 0 {
                r.phase_since_s = since.min(self.now);
            }
            r.phase = phase;
            r.ready = phase == ReplicaPhase::Serving;
            r.test = test;
            r.restarts = restarts;
        }
    }

    /// One reconcile pass.
    fn pass(&mut self, spec: &RolloutSpec) -> RolloutDecision {
        let d = decide_rollout(spec, self.status.as_ref(), &self.replicas, self.now, &POL).unwrap();
        for c in &d.recreate {
            let r = self.replicas.iter_mut().find(|r| r.name == c.replica).unwrap();
            assert_eq!(r.node, c.node);
            r.revision = c.revision.clone();
            r.revision_since_s = self.now;
            r.phase = ReplicaPhase::Pending;
            r.phase_since_s = self.now;
            r.ready = false;
            r.test = ThresholdTest::Pending;
            r.restarts = 0;
        }
        if d.status.phase == RolloutPhase::RolledBack && !self.rolled_back.contains(&d.status.revision) {
            self.rolled_back.push(d.status.revision.clone());
        }
        self.status = Some(d.status.clone());
        d
    }

    fn serving(&self) -> usize {
        self.replicas.iter().filter(|r| r.phase == ReplicaPhase::Serving && r.ready).count()
    }

    /// Runs passes every 10 s until the rollout settles (Complete or RolledBack with every
    /// replica serving) or `limit_s` passes; returns the final phase and the Events seen.
    fn run(&mut self, spec: &RolloutSpec, limit_s: u64) -> (RolloutPhase, Vec<&'static str>) {
        let start = self.now;
        let mut events = Vec::new();
        let n = self.replicas.len();
        loop {
            let d = self.pass(spec);
            events.extend(d.events.iter().map(|e| e.reason));
            // Invariants after the controller acted.
            let off_old = self.replicas.iter().filter(|r| Some(&r.revision) != d.status.previous_revision.as_ref()).count();
            if d.status.phase == RolloutPhase::Canary && spec.strategy == RolloutStrategy::Canary {
                assert!(off_old <= 1, "t={}: {off_old} replicas off the previous revision during the canary", self.now - start);
            }
            if spec.strategy == RolloutStrategy::Canary && n > 1 {
                assert!(self.serving() + 1 >= n, "t={}: only {} of {n} serve: {:#?}", self.now - start, self.serving(), self.replicas);
            }
            for bad in &self.rolled_back {
                if *bad != spec.desired_revision || d.status.phase == RolloutPhase::RolledBack {
                    let on_bad = self.replicas.iter().filter(|r| r.revision == *bad && r.revision_since_s == self.now).count();
                    assert_eq!(on_bad, 0, "t={}: revision {bad} was rolled back and is tried again", self.now - start);
                }
            }
            let settled = self.replicas.iter().all(|r| r.phase == ReplicaPhase::Serving) && d.recreate.is_empty();
            if settled && matches!(d.status.phase, RolloutPhase::Complete | RolloutPhase::RolledBack) {
                return (d.status.phase, events);
            }
            assert!(self.now - start < limit_s, "not settled after {limit_s}s: {:#?} {:#?}", d, self.replicas);
            self.advance(10);
        }
    }
}

#[test]
fn a_good_revision_rolls_out_canary_first_then_one_at_a_time() {
    for n in [1, 2, 3, 5] {
        let mut sim = Sim::new(n, "v1");
        assert_eq!(sim.run(&spec("v1", n as u64), 1_000).0, RolloutPhase::Complete);
        sim.behaviour.insert("v2", Behaviour::Good);
        let (phase, events) = sim.run(&spec("v2", n as u64), 10_000);
        assert_eq!(phase, RolloutPhase::Complete, "n={n}");
        assert!(sim.replicas.iter().all(|r| r.revision == "v2"), "n={n}");
        let want: &[&str] =
            if n == 1 { &["CanaryStarted", "RolloutComplete"] } else { &["CanaryStarted", "CanaryPassed", "RolloutComplete"] };
        assert_eq!(events, want, "n={n}");
    }
}

#[test]
fn a_revision_that_fails_its_test_rolls_back_and_is_not_retried() {
    let mut sim = Sim::new(3, "v1");
    sim.run(&spec("v1", 3), 1_000);
    sim.behaviour.insert("v2", Behaviour::FailsTest);
    let (phase, events) = sim.run(&spec("v2", 3), 10_000);
    assert_eq!(phase, RolloutPhase::RolledBack);
    assert_eq!(events, ["CanaryStarted", "RolledBack"]);
    let status = sim.status.clone().unwrap();
    assert!(status.message.as_deref().unwrap_or_default().contains("threshold test failed: case 8193 tokens"), "{status:?}");
    assert!(sim.replicas.iter().all(|r| r.revision == "v1"));
    // Many passes later with v2 still desired: nothing moves.
    for _ in 0..50 {
        sim.advance(60);
        let d = sim.pass(&spec("v2", 3));
        assert!(d.recreate.is_empty() && d.events.is_empty(), "{d:#?}");
        assert_eq!(d.status.phase, RolloutPhase::RolledBack);
    }
    // A new revision goes canary first again, from v1.
    sim.behaviour.insert("v3", Behaviour::Good);
    let (phase, events) = sim.run(&spec("v3", 3), 10_000);
    assert_eq!(phase, RolloutPhase::Complete);
    assert_eq!(events, ["CanaryStarted", "CanaryPassed", "RolloutComplete"]);
    assert_eq!(sim.status.unwrap().previous_revision.as_deref(), Some("v1"));
}

#[test]
fn a_flapping_or_hanging_canary_rolls_back() {
    for (b, why) in [(Behaviour::Flaps, "restarts (more than 2)"), (Behaviour::Hangs, "progressDeadlineSeconds 900")] {
        let mut sim = Sim::new(4, "v1");
        sim.run(&spec("v1", 4), 1_000);
        sim.behaviour.insert("v2", b);
        let (phase, _) = sim.run(&spec("v2", 4), 10_000);
        assert_eq!(phase, RolloutPhase::RolledBack, "{b:?}");
        let msg = sim.status.unwrap().message.unwrap_or_default();
        assert!(msg.contains(why), "{b:?}: {msg}");
        if let Behaviour::Hangs = b {
            assert!(msg.contains(&format!("after {}s", DEADLINE + 10)), "rolled back on the first pass past the deadline: {msg}");
        }
    }
}

#[test]
fn a_revision_changed_mid_canary_restarts_the_canary() {
    let mut sim = Sim::new(3, "v1");
    sim.run(&spec("v1", 3), 1_000);
    sim.behaviour.insert("v2", Behaviour::Good);
    sim.behaviour.insert("v3", Behaviour::Good);
    let d = sim.pass(&spec("v2", 3));
    let canary = d.status.canary_replica.clone().unwrap();
    sim.advance(50);
    sim.pass(&spec("v2", 3));
    sim.advance(50);
    let d = sim.pass(&spec("v3", 3));
    assert_eq!(d.status.phase, RolloutPhase::Canary);
    assert_eq!(d.status.canary_replica.as_deref(), Some(canary.as_str()), "the replica already out of service stays the canary");
    assert_eq!(d.status.previous_revision.as_deref(), Some("v1"));
    assert_eq!(sim.replicas.iter().filter(|r| r.revision == "v3").count(), 1);
    let (phase, _) = sim.run(&spec("v3", 3), 10_000);
    assert_eq!(phase, RolloutPhase::Complete);
    assert!(sim.replicas.iter().all(|r| r.revision == "v3"));
}

#[test]
fn all_at_once_replaces_every_replica_in_one_pass() {
    let mut sim = Sim::new(4, "v1");
    sim.run(&spec("v1", 4), 1_000);
    sim.behaviour.insert("v2", Behaviour::Good);
    let s = RolloutSpec { strategy: RolloutStrategy::AllAtOnce, ..spec("v2", 4) };
    let d = sim.pass(&s);
    assert_eq!(d.recreate.len(), 4);
    let (phase, _) = sim.run(&s, 1_000);
    assert_eq!(phase, RolloutPhase::Complete);
}
