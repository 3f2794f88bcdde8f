//! The deployment controller's pure steps between the decisions and the writes: which removals
//! may happen now without dropping serving capacity, the names and objects of new replicas,
//! and the deployment's status. Which replicas change revision is the rollout's (see
//! [`super::rollout`]).

use std::collections::{BTreeMap, BTreeSet};

use brink_api::crd::{
    Condition, ConditionStatus, ConditionType, ModelDeployment, ModelDeploymentStatus, ModelReplica, ModelReplicaSpec, QualificationMethod,
    ReplicaGang, ReplicaPhase, RolloutPhase, RolloutStatus, condition, set_condition,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::{Resource, ResourceExt};

use super::error::{Error, Result};
use super::names::{DEPLOYMENT_LABEL, REVISION_LABEL, SCHEDULING_ANNOTATION, label_value, replica_name, selector};
use super::pod::PodScheduling;
use super::rollout::Template;
use super::views::MEMORY_ANNOTATION;
use crate::decide::Assignment;

/// Which of `candidates` (scale-down victims in the decided order, replaced replicas) may be
/// deleted now. An unhealthy one goes at once; a healthy one only while the replicas that
/// serve stay at `min(desired, serving now)`: a replaced replica leaves once its replacement
/// serves.
pub fn removable(candidates: &[String], healthy: &BTreeSet<String>, desired: u64) -> Vec<String> {
    let mut serving = healthy.len() as u64;
    let floor = desired.min(serving);
    let mut out: Vec<String> = candidates.iter().filter(|c| !healthy.contains(*c)).cloned().collect();
    for c in candidates.iter().filter(|c| healthy.contains(*c)) {
        if serving > floor {
            serving -= 1;
            out.push(c.clone());
        }
    }
    let mut seen = BTreeSet::new();
    out.retain(|c| seen.insert(c.clone()));
    out
}

/// The lowest `count` slots whose names are free among `taken` (a deployment's replicas, also
/// those being deleted): a replica created twice from a stale cache collides (409) instead of
/// doubling.
pub fn free_names(deployment: &str, taken: &BTreeSet<String>, count: usize) -> Vec<String> {
    (0u64..).map(|slot| replica_name(deployment, slot)).filter(|n| !taken.contains(n)).take(count).collect()
}

/// A new replica of `dep` at `template`'s revision where `assignment` put it, serving under the
/// clamped limits.
pub fn new_replica(dep: &ModelDeployment, name: &str, assignment: &Assignment, template: &Template) -> Result<ModelReplica> {
    let owner = dep.controller_owner_ref(&()).ok_or_else(|| Error::MissingField {
        kind: "ModelDeployment",
        name: dep.name_any(),
        field: "metadata.uid",
    })?;
    let mut annotations =
        BTreeMap::from([(MEMORY_ANNOTATION.to_string(), template.memory_bytes.unwrap_or(assignment.memory_bytes).to_string())]);
    if let Some(scheduling) = PodScheduling::from_placement(&dep.spec.placement).annotation()? {
        annotations.insert(SCHEDULING_ANNOTATION.to_string(), scheduling);
    }
    let mut serving = dep.spec.serving;
    serving.max_batch_tokens = assignment.limits.max_batch_tokens;
    serving.prefill_chunk = assignment.limits.prefill_chunk;
    Ok(ModelReplica {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: dep.namespace(),
            labels: Some(BTreeMap::from([
                (DEPLOYMENT_LABEL.to_string(), label_value(&dep.name_any())),
                (REVISION_LABEL.to_string(), template.revision.clone()),
            ])),
            annotations: Some(annotations),
            owner_references: Some(vec![owner]),
            ..ObjectMeta::default()
        },
        spec: ModelReplicaSpec {
            deployment: dep.name_any(),
            node: assignment.node.clone(),
            model: template.model.clone(),
            revision: template.revision.clone(),
            engine: template.engine.clone(),
            serving,
            gang: assignment.gang.as_ref().map(|g| ReplicaGang {
                workers: g.workers.clone(),
                fabric: g.fabric.clone(),
                rdma: g.rdma,
                network: Some(dep.spec.gang.clone().unwrap_or_default()),
            }),
        },
        status: None,
    })
}

/// What the status is computed from.
#[derive(Debug, Default)]
pub struct Outcome {
    /// The deployment's replicas after this reconcile's writes (created ones included, deleted
    /// ones not).
    pub replicas: Vec<ReplicaState>,
    pub created: usize,
    pub deleted: usize,
    /// Why replicas cannot be placed, when some cannot.
    pub unplaced: Option<String>,
    /// Why nothing can be decided (no Model, or one without its facts): `(reason, message)`.
    pub blocked: Option<(&'static str, String)>,
    /// Replicas kept on a node whose heartbeat expired within the grace.
    pub held: Vec<String>,
    /// Replicas whose Pods failed on a healthy node, described (name, count, last failure).
    pub failing: Vec<String>,
    /// Replicas their own qualification holds not ready (a model-level case failing below a
    /// passing count, backend truth), each `name: why` as its status reports it.
    pub not_qualified: Vec<String>,
    /// Replicas that passed their qualification clamped, as their status reports it.
    pub clamped: Vec<ClampedReplica>,
    /// The rollout's status, written as is (the previous one while nothing is decided: an
    /// apply that left it out would remove it).
    pub rollout: Option<RolloutStatus>,
    /// The rollout's `Progressing` condition, when it decided.
    pub rollout_condition: Option<Condition>,
}

/// A replica whose qualification passed clamped (and does not hold it not ready): what its
/// status says the verdict admits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClampedReplica {
    pub name: String,
    pub method: Option<QualificationMethod>,
    /// The longest prompt admitted (a black-box verdict's; brink's model-level test counts a
    /// step's tokens and leaves it out).
    pub admitted_prompt_tokens: Option<u64>,
    pub first_failure_tokens: Option<u64>,
    /// The verdict in a line, as the report says it.
    pub message: String,
}

impl ClampedReplica {
    /// `r`'s clamp, when its status reports one.
    pub fn of(r: &ModelReplica) -> Option<ClampedReplica> {
        let q = r.status.as_ref()?.qualification.as_ref().filter(|q| q.is_clamped() && q.held.is_none())?;
        Some(ClampedReplica {
            name: r.name_any(),
            method: q.method,
            admitted_prompt_tokens: q.admitted_prompt_tokens,
            first_failure_tokens: q.first_failure_tokens,
            message: q.model_test_message.clone(),
        })
    }
}

/// The deployment's `Clamped` condition, `(reason, message)`, when any replica passed its
/// qualification clamped; `None` when none did (the condition is then absent). The message
/// names each clamped replica and what it admits against the deployment's `context` (the
/// longest prompt an engine admits, from its black-box qualification), replicas in name order.
pub fn clamped_condition(clamped: &[ClampedReplica], context: u64) -> Option<(&'static str, String)> {
    if clamped.is_empty() {
        return None;
    }
    let mut sorted: Vec<&ClampedReplica> = clamped.iter().collect();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    let below = sorted.iter().any(|c| c.admitted_prompt_tokens.is_some_and(|t| t < context));
    let parts: Vec<String> = sorted
        .iter()
        .map(|c| match (c.method, c.admitted_prompt_tokens) {
            (_, Some(admitted)) => {
                let first = c.first_failure_tokens.map(|f| format!(", first failure at {f}")).unwrap_or_default();
                let how = match c.method {
                    Some(QualificationMethod::ModelTest) => "model-level threshold test",
                    _ => "black-box qualification of its engine",
                };
                format!("{} admits prompts up to {admitted} tokens of the requested context {context} ({how}{first})", c.name)
            }
            (Some(QualificationMethod::BlackBox), None) => format!("{}: black-box qualification {}", c.name, c.message),
            (_, None) => format!("{}: serves with its batch limits clamped ({})", c.name, c.message),
        })
        .collect();
    let reason = if below { "PromptsBelowContext" } else { "ReplicaClamped" };
    Some((reason, format!("{} of the replicas passed qualification clamped: {}", sorted.len(), parts.join("; "))))
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaState {
    pub name: String,
    pub serving: bool,
    pub updated: bool,
}

impl ReplicaState {
    pub fn of(r: &ModelReplica, revision: Option<&str>) -> ReplicaState {
        ReplicaState {
            name: r.name_any(),
            serving: r.status.as_ref().is_some_and(|s| s.phase == ReplicaPhase::Serving),
            updated: revision.is_some_and(|rev| r.spec.revision == rev),
        }
    }
}

fn count(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// The deployment's status after `outcome`, conditions merged into the current ones (their
/// transition times kept while their status holds).
pub fn status(dep: &ModelDeployment, outcome: &Outcome, now: Time) -> Result<ModelDeploymentStatus> {
    let current = dep.status.clone().unwrap_or_default();
    let generation = dep.metadata.generation;
    let desired = dep.spec.replicas.max(0);
    let replicas = count(outcome.replicas.len());
    let ready = count(outcome.replicas.iter().filter(|r| r.serving).count());
    let updated = count(outcome.replicas.iter().filter(|r| r.updated).count());
    let c = |t, s: bool, reason: &str, msg: String| condition(t, ConditionStatus::from(s), reason, msg, generation, now.clone());

    let ready_cond = if ready >= desired {
        c(ConditionType::Ready, true, "AllReplicasReady", format!("{ready} of {desired} replicas serving"))?
    } else {
        c(ConditionType::Ready, false, "ReplicasNotReady", format!("{ready} of {desired} replicas serving"))?
    };
    let changing = outcome.created > 0 || outcome.deleted > 0 || replicas != desired || updated < replicas || ready < replicas;
    // A rollout under way (or rolled back) says how it stands, unless nothing can be placed;
    // once it is complete, replica churn (scale, replacements) shows first.
    let rollout_active = outcome.rollout.as_ref().is_some_and(|r| r.phase != RolloutPhase::Complete);
    let progressing = match (&outcome.blocked, &outcome.unplaced, outcome.rollout_condition.clone()) {
        (Some((reason, msg)), _, _) => c(ConditionType::Progressing, false, reason, msg.clone())?,
        // Nothing can move: that says more than any step the rollout waits for.
        (None, Some(msg), _) if outcome.created == 0 && outcome.deleted == 0 => {
            c(ConditionType::Progressing, false, "Unplaceable", msg.clone())?
        }
        (None, _, Some(rc)) if rollout_active => rc,
        _ if changing => c(
            ConditionType::Progressing,
            true,
            "ReplicasChanging",
            format!(
                "{replicas} replicas ({updated} updated, {ready} serving) of {desired} wanted; {} created, {} deleted",
                outcome.created, outcome.deleted
            ),
        )?,
        (_, _, Some(rc)) => rc,
        _ => c(ConditionType::Progressing, false, "Complete", format!("{desired} replicas serving the current revision"))?,
    };
    let degraded = match (&outcome.blocked, &outcome.unplaced, outcome.held.is_empty(), outcome.failing.is_empty()) {
        (Some((reason, msg)), _, _, _) => c(ConditionType::Degraded, true, reason, msg.clone())?,
        (None, Some(msg), _, _) => c(ConditionType::Degraded, true, "Unplaced", msg.clone())?,
        (None, None, false, _) => c(
            ConditionType::Degraded,
            true,
            "HeartbeatExpired",
            format!("replicas {} are on nodes whose heartbeat expired (kept within the grace)", outcome.held.join(", ")),
        )?,
        (None, None, true, false) => c(
            ConditionType::Degraded,
            true,
            "PodsFailing",
            format!("replica Pods failed on healthy nodes and are replaced with a backoff: {}", outcome.failing.join("; ")),
        )?,
        (None, None, true, true) if !outcome.not_qualified.is_empty() => c(
            ConditionType::Degraded,
            true,
            "ReplicaNotQualified",
            format!("replicas held not ready by their own qualification: {}", outcome.not_qualified.join("; ")),
        )?,
        (None, None, true, true) => c(ConditionType::Degraded, false, "AsExpected", "every wanted replica is placed".to_string())?,
    };
    let mut conditions: Vec<Condition> = current.conditions.clone();
    for cond in [ready_cond, progressing, degraded] {
        set_condition(&mut conditions, cond);
    }
    match clamped_condition(&outcome.clamped, dep.spec.serving.context) {
        Some((reason, msg)) => {
            set_condition(&mut conditions, c(ConditionType::Clamped, true, reason, msg)?);
        }
        None => conditions.retain(|k| k.type_ != ConditionType::Clamped.as_str()),
    }
    Ok(ModelDeploymentStatus {
        observed_generation: generation,
        replicas,
        ready_replicas: ready,
        updated_replicas: updated,
        selector: Some(selector(&dep.name_any())),
        rollout: outcome.rollout.clone(),
        conditions,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn removals_keep_serving_capacity() {
        // (candidates, healthy, desired) -> deleted now
        type Case<'a> = (&'a [&'a str], &'a [&'a str], u64, &'a [&'a str]);
        let cases: &[Case] = &[
            // Nothing serves: every candidate goes (none of them carries traffic).
            (&["a", "b"], &[], 1, &["a", "b"]),
            // Scale 3 -> 1, all serving: two go.
            (&["a", "b"], &["a", "b", "c"], 1, &["a", "b"]),
            // A replaced replica that serves waits while its replacement does not.
            (&["old"], &["old"], 1, &[]),
            // ...and goes once the replacement serves.
            (&["old"], &["old", "new"], 1, &["old"]),
            // Unhealthy candidates go first, whatever the floor.
            (&["x", "old"], &["old"], 1, &["x"]),
            // Scale to zero: everything goes.
            (&["a", "b"], &["a", "b"], 0, &["a", "b"]),
            // Two retired revisions, one new replica serving of two wanted: one old one stays.
            (&["o1", "o2"], &["o1", "o2", "n1"], 2, &["o1"]),
            // A candidate listed twice (scale-down and revision) is deleted once.
            (&["a", "a"], &[], 1, &["a"]),
        ];
        for (candidates, healthy, desired, want) in cases {
            assert_eq!(removable(&names(candidates), &set(healthy), *desired), names(want), "{candidates:?} {healthy:?} {desired}");
        }
    }

    #[test]
    fn new_names_fill_the_lowest_free_slots() {
        assert_eq!(free_names("qwen", &set(&[]), 2), ["qwen-0", "qwen-1"]);
        assert_eq!(free_names("qwen", &set(&["qwen-0", "qwen-2"]), 2), ["qwen-1", "qwen-3"]);
        assert!(free_names("qwen", &set(&["qwen-0"]), 0).is_empty());
    }

    fn dep(replicas: i32) -> ModelDeployment {
        use brink_api::crd::{EngineBuild, ModelDeploymentSpec, ModelRef, Placement, Rollout, Serving};
        let mut d = ModelDeployment::new(
            "qwen",
            ModelDeploymentSpec {
                model_ref: ModelRef { name: "qwen".into() },
                served_model_names: Vec::new(),
                replicas,
                engine: EngineBuild { image: "i".into(), version: "v".into(), ..Default::default() },
                serving: Serving { context: 1024, max_batch_tokens: 512, prefill_chunk: 256, concurrency: 1, kv_fraction: 0.5 },
                nodes_per_replica: 1,
                gang: None,
                placement: Placement::default(),
                on_self_test_failure: Default::default(),
                rollout: Rollout::default(),
            },
        );
        d.metadata.namespace = Some("ns".into());
        d.metadata.generation = Some(3);
        d
    }

    fn state(name: &str, serving: bool, updated: bool) -> ReplicaState {
        ReplicaState { name: name.into(), serving, updated }
    }

    fn t(s: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(s).expect("time"))
    }

    fn clamp(name: &str, method: Option<QualificationMethod>, admitted: Option<u64>, first: Option<u64>) -> ClampedReplica {
        ClampedReplica {
            name: name.into(),
            method,
            admitted_prompt_tokens: admitted,
            first_failure_tokens: first,
            message: "CLAMPED to 7068 tokens (first failure at 7069)".into(),
        }
    }

    #[test]
    fn the_clamped_condition_names_each_replica_and_what_it_admits() {
        use QualificationMethod::{BlackBox, ModelTest};
        struct Case {
            what: &'static str,
            clamped: Vec<ClampedReplica>,
            want: Option<(&'static str, &'static str)>,
        }
        let cases = [
            Case { what: "none clamped: no condition", clamped: vec![], want: None },
            Case {
                what: "a black-box clamp below the context",
                clamped: vec![clamp("chat-0", Some(BlackBox), Some(7068), Some(7069))],
                want: Some((
                    "PromptsBelowContext",
                    "1 of the replicas passed qualification clamped: chat-0 admits prompts up to 7068 tokens of the requested context 8192 \
                     (black-box qualification of its engine, first failure at 7069)",
                )),
            },
            Case {
                what: "several, in name order, one without a first failure",
                clamped: vec![clamp("chat-1", Some(BlackBox), Some(4000), None), clamp("chat-0", Some(BlackBox), Some(7068), Some(7069))],
                want: Some((
                    "PromptsBelowContext",
                    "2 of the replicas passed qualification clamped: chat-0 admits prompts up to 7068 tokens of the requested context 8192 \
                     (black-box qualification of its engine, first failure at 7069); chat-1 admits prompts up to 4000 tokens of the \
                     requested context 8192 (black-box qualification of its engine)",
                )),
            },
            Case {
                what: "a clamp at or above the context admits every prompt the deployment asks for",
                clamped: vec![clamp("chat-0", Some(BlackBox), Some(8192), Some(8300))],
                want: Some((
                    "ReplicaClamped",
                    "1 of the replicas passed qualification clamped: chat-0 admits prompts up to 8192 tokens of the requested context 8192 \
                     (black-box qualification of its engine, first failure at 8300)",
                )),
            },
            Case {
                what: "brink's model-level clamp (a step's tokens, no prompt count)",
                clamped: vec![clamp("chat-0", Some(ModelTest), None, None)],
                want: Some((
                    "ReplicaClamped",
                    "1 of the replicas passed qualification clamped: chat-0: serves with its batch limits clamped \
                     (CLAMPED to 7068 tokens (first failure at 7069))",
                )),
            },
            Case {
                what: "an older agent's report (no method, no counts)",
                clamped: vec![clamp("chat-0", None, None, None)],
                want: Some((
                    "ReplicaClamped",
                    "1 of the replicas passed qualification clamped: chat-0: serves with its batch limits clamped \
                     (CLAMPED to 7068 tokens (first failure at 7069))",
                )),
            },
            Case {
                what: "a black-box clamp whose report lacks the count",
                clamped: vec![clamp("chat-0", Some(BlackBox), None, None)],
                want: Some((
                    "ReplicaClamped",
                    "1 of the replicas passed qualification clamped: chat-0: black-box qualification CLAMPED to 7068 tokens (first failure at 7069)",
                )),
            },
        ];
        for case in cases {
            let got = clamped_condition(&case.clamped, 8192);
            assert_eq!(got.as_ref().map(|(r, m)| (*r, m.as_str())), case.want, "{}", case.what);
        }
    }

    #[test]
    fn a_clamp_sets_the_condition_and_its_end_removes_it() {
        let clamped = Outcome {
            replicas: vec![state("a", true, true)],
            clamped: vec![clamp("a", Some(QualificationMethod::BlackBox), Some(700), Some(701))],
            ..Outcome::default()
        };
        let s = status(&dep(1), &clamped, t(100)).expect("status");
        let c = s.conditions.iter().find(|c| c.type_ == "Clamped").expect("Clamped");
        assert_eq!((c.status.as_str(), c.reason.as_str()), ("True", "PromptsBelowContext"));
        assert!(c.message.contains("a admits prompts up to 700 tokens of the requested context 1024"), "{}", c.message);
        let mut d = dep(1);
        d.status = Some(s);
        let passed = Outcome { replicas: vec![state("a", true, true)], ..Outcome::default() };
        let s2 = status(&d, &passed, t(200)).expect("status");
        assert!(s2.conditions.iter().all(|c| c.type_ != "Clamped"), "{:?}", s2.conditions);
    }

    #[test]
    fn status_conditions_follow_the_outcome() {
        let ready = Outcome { replicas: vec![state("a", true, true), state("b", true, true)], ..Outcome::default() };
        let s = status(&dep(2), &ready, t(100)).expect("status");
        assert_eq!((s.replicas, s.ready_replicas, s.updated_replicas, s.observed_generation), (2, 2, 2, Some(3)));
        let reasons: Vec<(&str, &str, &str)> =
            s.conditions.iter().map(|c| (c.type_.as_str(), c.status.as_str(), c.reason.as_str())).collect();
        assert_eq!(
            reasons,
            [("Ready", "True", "AllReplicasReady"), ("Progressing", "False", "Complete"), ("Degraded", "False", "AsExpected")]
        );

        // Later, a replica is lost and cannot be placed: Ready flips (new transition time),
        // Degraded says why; Progressing stays False (nothing moves) with the reason.
        let mut d = dep(2);
        d.status = Some(s);
        let lost = Outcome {
            replicas: vec![state("a", true, true)],
            unplaced: Some("1 of 1 replicas cannot be placed; ...".into()),
            ..Outcome::default()
        };
        let s2 = status(&d, &lost, t(200)).expect("status");
        let get = |ty: &str| s2.conditions.iter().find(|c| c.type_ == ty).expect("condition").clone();
        assert_eq!((get("Ready").status.as_str(), get("Ready").last_transition_time.clone()), ("False", t(200)));
        assert_eq!(
            (get("Degraded").reason.as_str(), get("Degraded").message.as_str()),
            ("Unplaced", "1 of 1 replicas cannot be placed; ...")
        );
        assert_eq!(get("Progressing").reason, "Unplaceable");
        // Progressing stayed False: its transition time is the first one.
        assert_eq!(get("Progressing").last_transition_time, t(100));

        let held = Outcome { replicas: vec![state("a", true, true)], held: vec!["a".into()], ..Outcome::default() };
        let s3 = status(&dep(1), &held, t(300)).expect("status");
        assert!(
            s3.conditions
                .iter()
                .any(|c| c.type_ == "Degraded" && c.status == "True" && c.reason == "HeartbeatExpired" && c.message.contains("a"))
        );

        let not_qualified = Outcome {
            replicas: vec![state("a", false, true)],
            not_qualified: vec!["a: model-level threshold test disqualified (first failing case model/single/t1 at 1 tokens)".into()],
            ..Outcome::default()
        };
        let s5 = status(&dep(1), &not_qualified, t(350)).expect("status");
        assert!(s5.conditions.iter().any(|c| c.type_ == "Degraded"
            && c.status == "True"
            && c.reason == "ReplicaNotQualified"
            && c.message.contains("model/single/t1")));

        let blocked = Outcome { blocked: Some(("ModelNotFound", "Model ns/qwen does not exist".into())), ..Outcome::default() };
        let s4 = status(&dep(1), &blocked, t(400)).expect("status");
        assert!(s4.conditions.iter().any(|c| c.type_ == "Degraded" && c.reason == "ModelNotFound"));
        assert!(s4.conditions.iter().any(|c| c.type_ == "Progressing" && c.status == "False" && c.reason == "ModelNotFound"));
        assert_eq!(s4.selector.as_deref(), Some("brink.dev/deployment=qwen"));
    }
}
