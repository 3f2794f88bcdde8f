//! The rollout of a deployment's revision (hash of model + engine build), canary first.
//!
//! A new revision goes to ONE replica (the canary) and continues to the rest only once the
//! canary serves, is Ready and passed its threshold test, and has stayed so for
//! `min_ready_s`. A canary that fails, stalls, restarts beyond a bound, fails its test or
//! misses `progressDeadlineSeconds` is rolled back: it returns to the previous revision and the
//! status says why. That revision is not tried again until the desired revision changes.
//! After the canary the rest follow one at a time (maxUnavailable 1): never fewer than
//! `replicas - 1` serve. The canary is judged on the revision, so once it passed, a replica
//! that fails later in the rollout stops the rollout (and says so) instead of rolling back.
//!
//! Pure: the controller passes the previous `RolloutStatus`, the replicas and `now_s`; it
//! writes the status, recreates the listed replicas, creates new replicas at
//! `new_replica_revision`, records the condition and the Events, and requeues after
//! `recheck_in_s`. Deadlines count from when a replica got its revision (the creation of the
//! recreated `ModelReplica`), so an operator restart neither resets nor loses them.

use std::collections::BTreeMap;
use std::fmt;

use brink_api::crd::{ConditionStatus, ConditionType, ReplicaPhase, RolloutPhase, RolloutStatus, RolloutStrategy};

/// What the deployment asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RolloutSpec {
    /// Hash of the model and engine build the deployment asks for.
    pub desired_revision: String,
    pub strategy: RolloutStrategy,
    /// `spec.rollout.progressDeadlineSeconds`.
    pub progress_deadline_s: u64,
    /// `spec.replicas`.
    pub replicas: u64,
}

/// Bounds that are the operator's, not the user's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RolloutPolicy {
    /// A canary that restarted more often than this has failed, even if it serves now.
    pub max_canary_restarts: u32,
    /// How long a replica must have served (and passed) before it counts: a canary that
    /// serves for a moment between crashes proves nothing.
    pub min_ready_s: u64,
}

impl Default for RolloutPolicy {
    fn default() -> RolloutPolicy {
        RolloutPolicy { max_canary_restarts: 2, min_ready_s: 30 }
    }
}

/// The replica's own threshold test (its `Qualified` condition).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ThresholdTest {
    /// Not run yet, or running.
    Pending,
    Passed,
    /// Failed; the text names the failing case.
    Failed(String),
}

/// One existing replica of the deployment, as the rollout sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RolloutReplica {
    pub name: String,
    pub node: String,
    /// The node is schedulable with a fresh heartbeat: a canary there fails for the revision's
    /// sake, not the node's.
    pub node_healthy: bool,
    pub revision: String,
    /// When the replica got its revision (its creation): deadlines count from here.
    pub revision_since_s: u64,
    pub phase: ReplicaPhase,
    /// When it entered `phase`.
    pub phase_since_s: u64,
    /// Its `Ready` condition is True.
    pub ready: bool,
    pub test: ThresholdTest,
    /// Engine restarts since it got its revision.
    pub restarts: u32,
}

impl RolloutReplica {
    /// Serves: Serving, Ready and passed its threshold test.
    fn serves(&self) -> bool {
        self.phase == ReplicaPhase::Serving && self.ready && self.test == ThresholdTest::Passed
    }
}

/// A replica to delete and create again, on the same node, at `revision`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recreate {
    pub replica: String,
    pub node: String,
    pub revision: String,
    pub why: String,
}

/// The deployment's `Progressing` condition, without its time (the controller adds `now`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RolloutCondition {
    pub type_: ConditionType,
    pub status: ConditionStatus,
    /// CamelCase, as the API server requires.
    pub reason: &'static str,
    pub message: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    Normal,
    Warning,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

/// An Event to record on the deployment: only on a step of the rollout, not on every pass.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RolloutEvent {
    pub type_: EventType,
    pub reason: &'static str,
    pub note: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RolloutDecision {
    pub status: RolloutStatus,
    pub recreate: Vec<Recreate>,
    /// The revision of replicas created now (scale-up, replacements): the previous one while a
    /// canary is out or after a rollback, so that they do not widen an unproven revision.
    pub new_replica_revision: String,
    pub condition: RolloutCondition,
    pub events: Vec<RolloutEvent>,
    /// Decide again after this many seconds (a deadline or `min_ready_s` ends then).
    pub recheck_in_s: Option<u64>,
}

/// Input the rollout cannot act on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RolloutError {
    DuplicateReplica(String),
    /// A revision that is empty: `field` names where it came from.
    EmptyRevision {
        field: String,
    },
    /// A `ModelReplica` without a field the rollout needs (an object not from the API server).
    MissingField {
        replica: String,
        field: String,
    },
}

impl fmt::Display for RolloutError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RolloutError::DuplicateReplica(r) => write!(f, "replica {r} listed twice"),
            RolloutError::EmptyRevision { field } => write!(f, "{field}: empty revision (a hash of the model and engine build)"),
            RolloutError::MissingField { replica, field } => write!(f, "ModelReplica {replica:?}: no {field}"),
        }
    }
}

impl std::error::Error for RolloutError {}

/// Decides the next step of the rollout of `spec.desired_revision` at `now_s`.
pub fn decide_rollout(
    spec: &RolloutSpec,
    previous: Option<&RolloutStatus>,
    replicas: &[RolloutReplica],
    now_s: u64,
    policy: &RolloutPolicy,
) -> Result<RolloutDecision, RolloutError> {
    if spec.desired_revision.is_empty() {
        return Err(RolloutError::EmptyRevision { field: "desired revision".into() });
    }
    let mut sorted: Vec<&RolloutReplica> = replicas.iter().collect();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    if let Some(w) = sorted.windows(2).find(|w| w[0].name == w[1].name) {
        return Err(RolloutError::DuplicateReplica(w[0].name.clone()));
    }
    if let Some(r) = sorted.iter().find(|r| r.revision.is_empty()) {
        return Err(RolloutError::EmptyRevision { field: format!("ModelReplica {} spec.revision", r.name) });
    }
    let ctx = Ctx { spec, replicas: sorted, now_s, policy };
    let desired = spec.desired_revision.as_str();
    let step = match previous {
        Some(p) if p.revision == desired => ctx.continue_rollout(p),
        // The desired revision changed: start over from what the replicas can fall back to.
        Some(p) => {
            let stable = match p.phase {
                RolloutPhase::Complete | RolloutPhase::Progressing => Some(p.revision.clone()),
                RolloutPhase::Canary | RolloutPhase::RolledBack => p.previous_revision.clone().or_else(|| ctx.most_common_other()),
            };
            let keep_canary = if p.phase == RolloutPhase::Canary { p.canary_replica.as_deref() } else { None };
            ctx.start(stable, keep_canary, None)
        }
        // No status: first creation, or a status that was lost (then the replicas say what ran).
        None => ctx.start(ctx.most_common_other(), None, None),
    };
    let events = events(previous, &step);
    Ok(RolloutDecision {
        status: step.status,
        recreate: step.recreate,
        new_replica_revision: step.new_replica_revision,
        condition: step.condition,
        events,
        recheck_in_s: step.recheck_in_s,
    })
}

/// A decision before its Events.
struct Step {
    status: RolloutStatus,
    recreate: Vec<Recreate>,
    new_replica_revision: String,
    condition: RolloutCondition,
    recheck_in_s: Option<u64>,
    /// The replica that stops a rollout past its canary (for a Warning Event): see [`Stuck`].
    stuck: Option<String>,
}

/// How a replica on the new revision stands.
enum Verdict {
    Proven,
    Waiting {
        state: String,
        recheck_in_s: u64,
    },
    Failed(String),
    /// Missed the progress deadline.
    TimedOut(String),
}

struct Ctx<'a> {
    spec: &'a RolloutSpec,
    /// Sorted by name.
    replicas: Vec<&'a RolloutReplica>,
    now_s: u64,
    policy: &'a RolloutPolicy,
}

impl Ctx<'_> {
    fn desired(&self) -> &str {
        &self.spec.desired_revision
    }

    /// The revision most replicas run other than the desired one (ties: the smallest).
    fn most_common_other(&self) -> Option<String> {
        let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
        for r in self.replicas.iter().filter(|r| r.revision != self.desired()) {
            *counts.entry(r.revision.as_str()).or_default() += 1;
        }
        // max_by_key keeps the last maximum; iterate in reverse so the smallest name wins ties.
        counts.into_iter().rev().max_by_key(|(_, n)| *n).map(|(rev, _)| rev.to_string())
    }

    fn find(&self, name: &str) -> Option<&RolloutReplica> {
        self.replicas.iter().find(|r| r.name == name).copied()
    }

    /// Starts the rollout of the desired revision from `stable` (what replicas fall back to).
    /// `keep_canary`: a canary of a superseded revision, reused since it is out of service
    /// anyway. `gone`: a canary that vanished, named in the message.
    fn start(&self, stable: Option<String>, keep_canary: Option<&str>, gone: Option<&str>) -> Step {
        let desired = self.desired().to_string();
        let all_desired = self.replicas.iter().all(|r| r.revision == desired);
        let canary = match stable.filter(|s| *s != desired) {
            Some(s) if self.spec.strategy == RolloutStrategy::Canary && !all_desired => self.pick_canary(keep_canary).map(|c| (s, c)),
            // First creation, a return to the running revision, no replicas, or AllAtOnce.
            other => return self.roll_forward(other, None, false),
        };
        let Some((stable, canary)) = canary else {
            return self.roll_forward(None, None, false);
        };
        let mut recreate = Vec::new();
        if canary.revision != desired {
            recreate.push(Recreate {
                replica: canary.name.clone(),
                node: canary.node.clone(),
                revision: desired.clone(),
                why: format!("canary of revision {desired}"),
            });
        }
        // A superseded canary not chosen again (its node turned unhealthy) must not keep
        // serving a revision nobody asked for.
        if let Some(old) = keep_canary.and_then(|k| self.find(k)).filter(|o| o.name != canary.name && o.revision != stable) {
            recreate.push(Recreate {
                replica: old.name.clone(),
                node: old.node.clone(),
                revision: stable.clone(),
                why: format!("superseded canary of revision {} returns to {stable}", old.revision),
            });
        }
        let lead = match gone {
            Some(g) => format!("canary {g} is gone; "),
            None => String::new(),
        };
        let message = format!(
            "{lead}canary {} on node {} starts revision {desired} (previous {stable}); the rest follow once it serves and passes its threshold test",
            canary.name, canary.node
        );
        Step {
            status: RolloutStatus {
                phase: RolloutPhase::Canary,
                revision: desired,
                previous_revision: Some(stable.clone()),
                canary_replica: Some(canary.name.clone()),
                message: Some(message.clone()),
            },
            recreate,
            new_replica_revision: stable,
            condition: progressing(ConditionStatus::True, "CanaryStarted", message),
            recheck_in_s: Some(self.spec.progress_deadline_s.saturating_add(1)),
            stuck: None,
        }
    }

    /// The canary: on a healthy node first; there, one that serves (its node is proven on the
    /// old revision, so a failure is the new revision's), unless taking a serving replica out
    /// would leave fewer than `replicas - 1` serving; then by name.
    fn pick_canary(&self, keep: Option<&str>) -> Option<&RolloutReplica> {
        if let Some(k) = keep.and_then(|k| self.find(k)).filter(|r| r.node_healthy) {
            return Some(k);
        }
        let serving = self.replicas.iter().filter(|r| r.serves()).count() as u64;
        let may_take_serving = serving > self.spec.replicas.saturating_sub(1);
        self.replicas.iter().copied().min_by_key(|r| {
            let costs_too_much = r.serves() && !may_take_serving;
            (!r.node_healthy, costs_too_much, !r.serves(), r.name.clone())
        })
    }

    fn continue_rollout(&self, p: &RolloutStatus) -> Step {
        match p.phase {
            RolloutPhase::Canary => self.canary_step(p),
            RolloutPhase::Progressing => self.roll_forward(p.previous_revision.clone(), p.canary_replica.clone(), false),
            RolloutPhase::Complete => self.roll_forward(p.previous_revision.clone(), p.canary_replica.clone(), true),
            RolloutPhase::RolledBack => self.hold_rollback(p),
        }
    }

    fn canary_step(&self, p: &RolloutStatus) -> Step {
        let desired = self.desired().to_string();
        let stable = p.previous_revision.clone().or_else(|| self.most_common_other());
        let Some(stable) = stable.filter(|s| *s != desired) else {
            return self.roll_forward(None, None, false);
        };
        let Some(canary) = p.canary_replica.as_deref().and_then(|c| self.find(c)) else {
            // Replaced (node drained or gone) or deleted: a new canary starts the clock again.
            return self.start(Some(stable), None, p.canary_replica.as_deref());
        };
        if canary.revision != desired {
            // The recreate has not happened yet (or was undone): ask for it again.
            return self.start(Some(stable), Some(&canary.name), None);
        }
        match self.judge(canary, true) {
            Verdict::Failed(why) | Verdict::TimedOut(why) => {
                let message = format!("canary {} on node {} rolled back to revision {stable}: {why}", canary.name, canary.node);
                Step {
                    status: RolloutStatus {
                        phase: RolloutPhase::RolledBack,
                        revision: desired.clone(),
                        previous_revision: Some(stable.clone()),
                        canary_replica: Some(canary.name.clone()),
                        message: Some(message.clone()),
                    },
                    recreate: vec![Recreate {
                        replica: canary.name.clone(),
                        node: canary.node.clone(),
                        revision: stable.clone(),
                        why: format!("rollback of revision {desired}: {why}"),
                    }],
                    new_replica_revision: stable,
                    condition: progressing(ConditionStatus::False, "RolledBack", message),
                    recheck_in_s: None,
                    stuck: None,
                }
            }
            Verdict::Waiting { state, recheck_in_s } => {
                let message = format!("canary {} on node {} of revision {desired}: {state}", canary.name, canary.node);
                Step {
                    status: RolloutStatus { message: Some(message.clone()), ..p.clone() },
                    recreate: vec![],
                    new_replica_revision: stable,
                    condition: progressing(ConditionStatus::True, "CanaryWaiting", message),
                    recheck_in_s: Some(recheck_in_s),
                    stuck: None,
                }
            }
            Verdict::Proven => {
                let mut step = self.roll_forward(Some(stable), Some(canary.name.clone()), false);
                let lead = format!("canary {} on node {} serves and passed its threshold test", canary.name, canary.node);
                let message = format!("{lead}; {}", step.status.message.as_deref().unwrap_or_default());
                step.status.message = Some(message.clone());
                step.condition.message = message;
                if step.condition.reason == "RollingOut" {
                    step.condition.reason = "CanaryPassed";
                }
                step
            }
        }
    }

    /// After a rollback: replicas return to the previous revision; the failed one is not retried.
    fn hold_rollback(&self, p: &RolloutStatus) -> Step {
        let failed = self.desired();
        let Some(stable) = p.previous_revision.clone().or_else(|| self.most_common_other()) else {
            // A status without a previous revision (written by hand?) and no replica on another
            // one: nothing to return to, and the failed revision is still not retried.
            let message = format!("revision {failed} was rolled back and there is no previous revision to return to");
            return Step {
                status: RolloutStatus { message: Some(message.clone()), ..p.clone() },
                recreate: vec![],
                new_replica_revision: failed.to_string(),
                condition: progressing(ConditionStatus::False, "RolledBack", message),
                recheck_in_s: None,
                stuck: None,
            };
        };
        let batch = self.batch(&stable, Some(failed), RolloutStrategy::Canary);
        // The status keeps the reason of the rollback as written; the condition adds the progress.
        let why = p.message.clone().unwrap_or_else(|| format!("revision {failed} was rolled back"));
        let message = match batch.recreate.is_empty() {
            true => why.clone(),
            false => format!("{why}; returning {} to revision {stable}", names(&batch.recreate)),
        };
        Step {
            status: RolloutStatus { message: Some(why), previous_revision: Some(stable.clone()), ..p.clone() },
            recreate: batch.recreate,
            new_replica_revision: stable,
            condition: progressing(ConditionStatus::False, "RolledBack", message),
            // Nothing here waits on a clock: the next change of a replica triggers the next pass.
            recheck_in_s: None,
            stuck: None,
        }
    }

    /// Moves every replica to the desired revision, a batch at a time (all at once under
    /// AllAtOnce), and says Complete when all serve it. `was_complete`: a finished rollout
    /// stays Complete while all replicas run the revision, however they fare (that is the
    /// lifecycle's business).
    fn roll_forward(&self, previous: Option<String>, canary: Option<String>, was_complete: bool) -> Step {
        let desired = self.desired().to_string();
        let previous = previous.filter(|p| *p != desired);
        let all_desired = self.replicas.iter().all(|r| r.revision == desired);
        let batch = self.batch(&desired, None, self.spec.strategy);
        let status = |phase, message: String| RolloutStatus {
            phase,
            revision: desired.clone(),
            previous_revision: previous.clone(),
            canary_replica: canary.clone(),
            message: Some(message),
        };
        let complete = (was_complete && all_desired) || batch.done;
        if complete {
            let message = format!("all {} replicas run revision {desired}", self.replicas.len());
            return Step {
                status: status(RolloutPhase::Complete, message.clone()),
                recreate: vec![],
                new_replica_revision: desired,
                condition: progressing(ConditionStatus::False, "RolloutComplete", message),
                recheck_in_s: None,
                stuck: None,
            };
        }
        let (cond_status, reason) = match &batch.stuck {
            Some(st) => (ConditionStatus::False, st.reason),
            None => (ConditionStatus::True, "RollingOut"),
        };
        let message = batch.message.clone();
        Step {
            status: status(RolloutPhase::Progressing, message.clone()),
            recreate: batch.recreate,
            new_replica_revision: desired,
            condition: progressing(cond_status, reason, message),
            recheck_in_s: batch.recheck_in_s,
            stuck: batch.stuck.map(|st| st.key),
        }
    }

    /// The next batch towards `target`. Replicas on `urgent` (a rolled-back revision) all go
    /// at once; the rest one at a time, and only when no replica on `target` is still
    /// starting and taking one out leaves `replicas - 1` serving.
    fn batch(&self, target: &str, urgent: Option<&str>, strategy: RolloutStrategy) -> Batch {
        let wanted = self.spec.replicas;
        let old: Vec<&RolloutReplica> = self.replicas.iter().copied().filter(|r| r.revision != target).collect();
        let starting: Vec<&RolloutReplica> = self.replicas.iter().copied().filter(|r| r.revision == target && !r.serves()).collect();
        let serving = self.replicas.iter().filter(|r| r.serves()).count() as u64;
        let existing = self.replicas.len() as u64;
        let recreate_at =
            |r: &RolloutReplica, why: String| Recreate { replica: r.name.clone(), node: r.node.clone(), revision: target.to_string(), why };

        let mut recreate: Vec<Recreate> = Vec::new();
        let mut waiting: Vec<String> = Vec::new();
        let mut stuck: Option<Stuck> = None;
        let mut recheck_in_s: Option<u64> = None;
        for r in &starting {
            let (reason, why) = match self.judge(r, false) {
                Verdict::Proven => continue,
                Verdict::Waiting { state, recheck_in_s: s } => {
                    waiting.push(format!("{} ({state})", r.name));
                    recheck_in_s = Some(recheck_in_s.map_or(s, |t: u64| t.min(s)));
                    continue;
                }
                Verdict::Failed(why) => ("ReplicaFailed", why),
                Verdict::TimedOut(why) => ("ProgressDeadlineExceeded", why),
            };
            let key = format!("{} on node {} at revision {target}:", r.name, r.node);
            waiting.push(format!("{key} {why}"));
            stuck.get_or_insert(Stuck { reason, key });
        }
        for r in old.iter().filter(|r| Some(r.revision.as_str()) == urgent) {
            recreate.push(recreate_at(r, format!("revision {} was rolled back", r.revision)));
        }
        let rest: Vec<&RolloutReplica> = old.iter().copied().filter(|r| Some(r.revision.as_str()) != urgent).collect();
        let mut held = None;
        if strategy == RolloutStrategy::AllAtOnce {
            recreate.extend(rest.iter().map(|r| recreate_at(r, format!("revision {target}, all at once"))));
        } else if starting.is_empty() {
            // One at a time: one that does not serve costs nothing; a serving one only if the
            // others keep `replicas - 1` serving.
            let min_serving = wanted.saturating_sub(1);
            let pick = rest.iter().find(|r| !r.serves()).or_else(|| rest.iter().find(|_| serving > min_serving));
            match pick {
                Some(r) => recreate.push(recreate_at(r, format!("revision {target}"))),
                None if !rest.is_empty() => held = Some(format!("{serving} of {wanted} replicas serve; maxUnavailable is 1")),
                None => {}
            }
        }
        let done = old.is_empty() && starting.is_empty() && existing >= wanted;
        let mut parts = Vec::new();
        if !recreate.is_empty() {
            parts.push(format!("moving {} to revision {target}", names(&recreate)));
        }
        if !waiting.is_empty() {
            parts.push(format!("waiting for {}", waiting.join(", ")));
        }
        if let Some(h) = held {
            parts.push(format!("holding: {h}"));
        }
        let left = rest.len() - recreate.iter().filter(|c| rest.iter().any(|r| r.name == c.replica)).count();
        if left > 0 {
            parts.push(format!("{left} more to go"));
        }
        if old.is_empty() && starting.is_empty() && existing < wanted {
            parts.push(format!("{existing} of {wanted} replicas exist"));
        }
        let served = format!("{serving}/{wanted} serve");
        let message = if parts.is_empty() { served } else { format!("{}; {served}", parts.join("; ")) };
        Batch { recreate, done, message, stuck, recheck_in_s }
    }

    /// How a replica on the new revision stands. `canary`: restarts beyond the bound fail it.
    /// Messages carry no running clock, so that a status rewritten each pass stays the same.
    fn judge(&self, r: &RolloutReplica, canary: bool) -> Verdict {
        // The failing case first: it says more than the phase it left the replica in.
        if let ThresholdTest::Failed(case) = &r.test {
            return Verdict::Failed(format!("threshold test failed: {case}"));
        }
        if matches!(r.phase, ReplicaPhase::Failed | ReplicaPhase::Stalled) {
            return Verdict::Failed(format!("phase {:?}", r.phase));
        }
        if canary && r.restarts > self.policy.max_canary_restarts {
            return Verdict::Failed(format!("{} restarts (more than {})", r.restarts, self.policy.max_canary_restarts));
        }
        let min_ready = self.policy.min_ready_s;
        if r.serves() {
            // The deadline is met once it serves; `min_ready_s` only guards against flapping.
            let served_s = self.now_s.saturating_sub(r.phase_since_s);
            if served_s >= min_ready {
                return Verdict::Proven;
            }
            return Verdict::Waiting { state: format!("serving; must keep serving for {min_ready}s"), recheck_in_s: min_ready - served_s };
        }
        let deadline = self.spec.progress_deadline_s;
        let elapsed = self.now_s.saturating_sub(r.revision_since_s);
        let test = match r.test {
            ThresholdTest::Pending => "threshold test pending",
            _ => "threshold test passed",
        };
        let ready = if r.ready { "Ready" } else { "not Ready" };
        let state = format!("phase {:?}, {ready}, {test}", r.phase);
        // Inclusive: at exactly `deadline` seconds the replica still has time.
        if elapsed > deadline {
            return Verdict::TimedOut(format!(
                "not serving with a passed threshold test after {elapsed}s (progressDeadlineSeconds {deadline}): {state}"
            ));
        }
        Verdict::Waiting { state, recheck_in_s: deadline - elapsed + 1 }
    }
}

/// Why a rollout past its canary cannot continue.
struct Stuck {
    /// The condition's reason.
    reason: &'static str,
    /// Names the replica, its node and revision: the same on every pass while it stays stuck
    /// (the detail after it may change), so an Event is recorded once.
    key: String,
}

struct Batch {
    recreate: Vec<Recreate>,
    /// Every replica runs the target and serves, and none are missing.
    done: bool,
    message: String,
    /// Set when a replica on the target failed or ran out of time.
    stuck: Option<Stuck>,
    recheck_in_s: Option<u64>,
}

fn names(recreate: &[Recreate]) -> String {
    recreate.iter().map(|r| r.replica.as_str()).collect::<Vec<_>>().join(", ")
}

fn progressing(status: ConditionStatus, reason: &'static str, message: String) -> RolloutCondition {
    RolloutCondition { type_: ConditionType::Progressing, status, reason, message }
}

/// The Events of a step: one per change of phase, revision or canary, and one when a rollout
/// past its canary gets stuck (the condition carries the detail on every pass).
fn events(previous: Option<&RolloutStatus>, step: &Step) -> Vec<RolloutEvent> {
    let s = &step.status;
    let msg = s.message.clone().unwrap_or_default();
    let mut out = Vec::new();
    let same_rollout = previous.is_some_and(|p| p.revision == s.revision);
    let phase_changed = previous.is_none_or(|p| p.phase != s.phase || p.revision != s.revision);
    let canary_changed = previous.is_none_or(|p| p.canary_replica != s.canary_replica);
    match s.phase {
        RolloutPhase::Canary if phase_changed || canary_changed => {
            out.push(RolloutEvent { type_: EventType::Normal, reason: "CanaryStarted", note: msg.clone() })
        }
        RolloutPhase::Progressing if phase_changed && same_rollout && previous.is_some_and(|p| p.phase == RolloutPhase::Canary) => {
            out.push(RolloutEvent { type_: EventType::Normal, reason: "CanaryPassed", note: msg.clone() })
        }
        RolloutPhase::Progressing if phase_changed => {
            out.push(RolloutEvent { type_: EventType::Normal, reason: "RolloutStarted", note: msg.clone() })
        }
        RolloutPhase::Complete if phase_changed => {
            out.push(RolloutEvent { type_: EventType::Normal, reason: "RolloutComplete", note: msg.clone() })
        }
        RolloutPhase::RolledBack if phase_changed => {
            out.push(RolloutEvent { type_: EventType::Warning, reason: "RolledBack", note: msg.clone() })
        }
        _ => {}
    }
    if let Some(key) = &step.stuck {
        let was_stuck = previous.and_then(|p| p.message.as_deref()).is_some_and(|m| m.contains(key.as_str()));
        if !was_stuck {
            out.push(RolloutEvent { type_: EventType::Warning, reason: "RolloutStuck", note: msg.clone() });
        }
    }
    out
}
