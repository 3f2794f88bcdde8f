//! The seams between the rollout decision and the API objects, pure: a `ModelReplica` as the
//! rollout sees it, and the decision's condition and Events as the controller records them. They
//! live with the controllers because they take kube's types; `decide` takes none.

use brink_api::crd::conditions::Time;
use brink_api::crd::{BadReason, Condition, ConditionType, ModelReplica, condition, find_condition};
use kube::runtime::events::{Event, EventType as KubeEventType};

use crate::decide::{EventType, RolloutCondition, RolloutError, RolloutEvent, RolloutReplica, ThresholdTest};

/// A `ModelReplica` for the rollout. `node_healthy`: its node is schedulable with a fresh
/// heartbeat (the lifecycle decision knows). The conventions the agent writes by:
/// `Ready` True once it serves (its transition time is when serving began); `Qualified` True
/// when its threshold test passed, False when it failed (the message names the case), absent
/// or Unknown while it runs. A replica's revision is fixed at its creation (the rollout
/// recreates replicas), so the deadline counts from `creationTimestamp`.
pub fn rollout_replica(r: &ModelReplica, node_healthy: bool) -> Result<RolloutReplica, RolloutError> {
    let name = r.metadata.name.clone().unwrap_or_default();
    let missing = |field: &str| RolloutError::MissingField { replica: name.clone(), field: field.to_string() };
    if name.is_empty() {
        return Err(missing("metadata.name"));
    }
    let created = r.metadata.creation_timestamp.as_ref().ok_or_else(|| missing("metadata.creationTimestamp"))?;
    let revision_since_s = seconds(&created.0);
    let status = r.status.clone().unwrap_or_default();
    let ready = find_condition(&status.conditions, ConditionType::Ready);
    let is_ready = ready.is_some_and(|c| c.status == "True");
    let phase_since_s = match ready {
        Some(c) if is_ready => seconds(&c.last_transition_time.0).max(revision_since_s),
        _ => revision_since_s,
    };
    let test = match find_condition(&status.conditions, ConditionType::Qualified) {
        Some(c) if c.status == "True" => ThresholdTest::Passed,
        Some(c) if c.status == "False" => ThresholdTest::Failed(if c.message.is_empty() { c.reason.clone() } else { c.message.clone() }),
        _ => ThresholdTest::Pending,
    };
    Ok(RolloutReplica {
        name,
        node: r.spec.node.clone(),
        node_healthy,
        revision: r.spec.revision.clone(),
        revision_since_s,
        phase: status.phase,
        phase_since_s,
        ready: is_ready,
        test,
        restarts: status.restarts,
    })
}

fn seconds(t: &k8s_openapi::jiff::Timestamp) -> u64 {
    u64::try_from(t.as_second()).unwrap_or(0)
}

/// The deployment's `Progressing` condition at `now`.
pub fn rollout_condition(c: &RolloutCondition, observed_generation: Option<i64>, now: Time) -> Result<Condition, BadReason> {
    condition(c.type_, c.status, c.reason, c.message.clone(), observed_generation, now)
}

/// The API server's limit on an Event's note.
pub const MAX_NOTE_BYTES: usize = 1024;

/// A rollout Event for kube's recorder (`action` Rollout), its note cut to the API's 1 kB.
pub fn kube_event(e: &RolloutEvent) -> Event {
    let type_ = match e.type_ {
        EventType::Normal => KubeEventType::Normal,
        EventType::Warning => KubeEventType::Warning,
    };
    Event { type_, reason: e.reason.to_string(), note: Some(truncate(&e.note, MAX_NOTE_BYTES)), action: "Rollout".into(), secondary: None }
}

/// `s` cut to at most `max` bytes on a character boundary, marked with `…` when cut.
fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let ellipsis = "…";
    let mut end = max - ellipsis.len();
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{ellipsis}", &s[..end])
}

#[cfg(test)]
mod tests;
