//! The deployment controller's pure steps between the decisions and the writes: which replicas
//! are on an old revision (the rollout seam), which removals may happen now without dropping
//! serving capacity, the names and objects of new replicas, and the deployment's status.

use std::collections::{BTreeMap, BTreeSet};

use brink_api::crd::{
    Condition, ConditionStatus, ConditionType, ModelDeployment, ModelDeploymentStatus, ModelReplica, ModelReplicaSpec, ReplicaPhase,
    condition, set_condition,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::{Resource, ResourceExt};

use super::error::{Error, Result};
use super::names::{DEPLOYMENT_LABEL, REVISION_LABEL, label_value, replica_name, selector};
use super::views::MEMORY_ANNOTATION;
use crate::decide::Assignment;

/// The replicas to move to `target`, by name. Today every replica whose revision differs is
/// replaced at once (AllAtOnce): its replacement is placed like any new replica and it is
/// retired once enough replicas serve (see [`removable`]).
///
/// The rollout decision (`decide::rollout`: canary first, continue only when it serves and
/// passes its threshold test, else roll back) replaces this function.
pub fn revision_targets(replicas: &[&ModelReplica], target: &str) -> BTreeSet<String> {
    replicas.iter().filter(|r| r.spec.revision != target).map(|r| r.name_any()).collect()
}

/// Which of `candidates` (scale-down victims in the decided order, then retired revisions) may
/// be deleted now. An unhealthy one goes at once; a healthy one only while the replicas that
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

/// A new replica of `dep` where `assignment` put it, serving under the clamped limits.
pub fn new_replica(dep: &ModelDeployment, name: &str, assignment: &Assignment, revision: &str) -> Result<ModelReplica> {
    let owner = dep
        .controller_owner_ref(&())
        .ok_or_else(|| Error::MissingField { kind: "ModelDeployment", name: dep.name_any(), field: "metadata.uid" })?;
    let mut serving = dep.spec.serving;
    serving.max_batch_tokens = assignment.limits.max_batch_tokens;
    serving.prefill_chunk = assignment.limits.prefill_chunk;
    Ok(ModelReplica {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: dep.namespace(),
            labels: Some(BTreeMap::from([
                (DEPLOYMENT_LABEL.to_string(), label_value(&dep.name_any())),
                (REVISION_LABEL.to_string(), revision.to_string()),
            ])),
            annotations: Some(BTreeMap::from([(MEMORY_ANNOTATION.to_string(), assignment.memory_bytes.to_string())])),
            owner_references: Some(vec![owner]),
            ..ObjectMeta::default()
        },
        spec: ModelReplicaSpec {
            deployment: dep.name_any(),
            node: assignment.node.clone(),
            model: dep.spec.model_ref.name.clone(),
            revision: revision.to_string(),
            engine: dep.spec.engine.clone(),
            serving,
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
    let progressing = match (&outcome.blocked, &outcome.unplaced) {
        (Some((reason, msg)), _) => c(ConditionType::Progressing, false, reason, msg.clone())?,
        (None, Some(msg)) if outcome.created == 0 && outcome.deleted == 0 => c(ConditionType::Progressing, false, "Unplaceable", msg.clone())?,
        _ if changing => c(
            ConditionType::Progressing,
            true,
            "ReplicasChanging",
            format!("{replicas} replicas ({updated} updated, {ready} serving) of {desired} wanted; {} created, {} deleted", outcome.created, outcome.deleted),
        )?,
        _ => c(ConditionType::Progressing, false, "Complete", format!("{desired} replicas serving the current revision"))?,
    };
    let degraded = match (&outcome.blocked, &outcome.unplaced, outcome.held.is_empty()) {
        (Some((reason, msg)), _, _) => c(ConditionType::Degraded, true, reason, msg.clone())?,
        (None, Some(msg), _) => c(ConditionType::Degraded, true, "Unplaced", msg.clone())?,
        (None, None, false) => c(
            ConditionType::Degraded,
            true,
            "HeartbeatExpired",
            format!("replicas {} are on nodes whose heartbeat expired (kept within the grace)", outcome.held.join(", ")),
        )?,
        (None, None, true) => c(ConditionType::Degraded, false, "AsExpected", "every wanted replica is placed".to_string())?,
    };
    let mut conditions: Vec<Condition> = current.conditions.clone();
    for cond in [ready_cond, progressing, degraded] {
        set_condition(&mut conditions, cond);
    }
    Ok(ModelDeploymentStatus {
        observed_generation: generation,
        replicas,
        ready_replicas: ready,
        updated_replicas: updated,
        selector: Some(selector(&dep.name_any())),
        // Not ours: the rollout decision writes it (an apply that named it would take it over).
        rollout: None,
        conditions,
    })
}
