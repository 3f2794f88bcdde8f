//! The rollout's seams to the API objects: replica view, condition, Events (the revision is
//! `decide::revision`, tested there).

use brink_api::crd::{ConditionStatus, ConditionType, ModelReplica, ReplicaPhase};
use serde_json::json;

use super::*;
use crate::controllers::rollout_view;
use crate::decide::{EventType, RolloutCondition, RolloutEvent, ThresholdTest};

fn replica(conditions: serde_json::Value, created: Option<&str>) -> ModelReplica {
    let mut meta = json!({"name": "chat-0", "namespace": "ai"});
    if let Some(c) = created {
        meta["creationTimestamp"] = json!(c);
    }
    serde_json::from_value(json!({
        "apiVersion": "brink.dev/v1alpha1", "kind": "ModelReplica", "metadata": meta,
        "spec": {"deployment": "chat", "node": "spark-1", "model": "q", "revision": "7541f9f2a860f2fa",
                 "engine": {"image": "ghcr.io/brink/agent:0.2.0", "version": "0.2.0"},
                 "serving": {"context": 8192, "maxBatchTokens": 8192, "prefillChunk": 2048, "concurrency": 4, "kvFraction": 0.5}},
        "status": {"phase": "Serving", "restarts": 1, "conditions": conditions}
    }))
    .unwrap()
}

fn cond(type_: &str, status: &str, reason: &str, message: &str, at: &str) -> serde_json::Value {
    json!({"type": type_, "status": status, "reason": reason, "message": message, "lastTransitionTime": at})
}

#[test]
fn a_replica_as_the_rollout_sees_it() {
    let created = "2027-01-15T08:00:00Z";
    let base = k8s_openapi::jiff::Timestamp::from_second(0).unwrap();
    let secs = |s: &str| s.parse::<k8s_openapi::jiff::Timestamp>().unwrap().duration_since(base).as_secs() as u64;

    let r = rollout_replica(
        &replica(
            json!([
                cond("Ready", "True", "Serving", "", "2027-01-15T08:05:00Z"),
                cond("Qualified", "True", "Passed", "", "2027-01-15T08:04:00Z")
            ]),
            Some(created),
        ),
        true,
    )
    .unwrap();
    assert_eq!((r.name.as_str(), r.node.as_str(), r.revision.as_str()), ("chat-0", "spark-1", "7541f9f2a860f2fa"));
    assert_eq!(r.revision_since_s, secs(created));
    assert_eq!(r.phase_since_s, secs("2027-01-15T08:05:00Z"), "serving since Ready turned True");
    assert_eq!(
        (r.phase, r.ready, r.test.clone(), r.restarts, r.node_healthy),
        (ReplicaPhase::Serving, true, ThresholdTest::Passed, 1, true)
    );

    // A Ready that turned True before this replica existed (a copied status) counts from creation.
    let r = rollout_replica(&replica(json!([cond("Ready", "True", "Serving", "", "2027-01-15T07:00:00Z")]), Some(created)), false).unwrap();
    assert_eq!(r.phase_since_s, secs(created));
    assert_eq!(r.test, ThresholdTest::Pending, "no Qualified condition: still testing");
    assert!(!r.node_healthy);

    let r = rollout_replica(
        &replica(
            json!([
                cond("Ready", "False", "SelfTesting", "", created),
                cond("Qualified", "False", "ThresholdFailed", "moe_gemm tokens=8193", created)
            ]),
            Some(created),
        ),
        true,
    )
    .unwrap();
    assert_eq!(r.test, ThresholdTest::Failed("moe_gemm tokens=8193".into()));
    assert!(!r.ready);
    let r = rollout_replica(&replica(json!([cond("Qualified", "False", "ThresholdFailed", "", created)]), Some(created)), true).unwrap();
    assert_eq!(r.test, ThresholdTest::Failed("ThresholdFailed".into()), "an empty message falls back to the reason");
    let r = rollout_replica(&replica(json!([cond("Qualified", "Unknown", "Running", "", created)]), Some(created)), true).unwrap();
    assert_eq!(r.test, ThresholdTest::Pending);

    let err = rollout_replica(&replica(json!([]), None), true).unwrap_err();
    assert_eq!(err.to_string(), "ModelReplica \"chat-0\": no metadata.creationTimestamp");
}

#[test]
fn condition_and_events_for_the_api() {
    let c = RolloutCondition {
        type_: ConditionType::Progressing,
        status: ConditionStatus::False,
        reason: "RolledBack",
        message: "canary a rolled back".into(),
    };
    let now = brink_api::crd::conditions::Time(k8s_openapi::jiff::Timestamp::from_second(1_800_000_000).unwrap());
    let k = rollout_condition(&c, Some(3), now.clone()).unwrap();
    assert_eq!((k.type_.as_str(), k.status.as_str(), k.reason.as_str()), ("Progressing", "False", "RolledBack"));
    assert_eq!((k.observed_generation, k.last_transition_time), (Some(3), now.clone()));
    let bad = RolloutCondition { reason: "rolled back", ..c };
    assert!(rollout_condition(&bad, None, now).is_err());

    let e = kube_event(&RolloutEvent { type_: EventType::Warning, reason: "RolledBack", note: "short".into() });
    assert_eq!(e.type_, kube::runtime::events::EventType::Warning);
    assert_eq!((e.reason.as_str(), e.note.as_deref(), e.action.as_str()), ("RolledBack", Some("short"), "Rollout"));
    // A long note (many replica names; multi-byte text) is cut on a character boundary.
    let long = "é".repeat(600);
    let e = kube_event(&RolloutEvent { type_: EventType::Normal, reason: "CanaryStarted", note: long.clone() });
    let note = e.note.unwrap();
    assert!(note.len() <= rollout_view::MAX_NOTE_BYTES, "{}", note.len());
    assert!(note.len() > rollout_view::MAX_NOTE_BYTES - 4);
    assert!(note.ends_with('…') && long.starts_with(note.trim_end_matches('…')));
    let exact = "x".repeat(rollout_view::MAX_NOTE_BYTES);
    assert_eq!(kube_event(&RolloutEvent { type_: EventType::Normal, reason: "R", note: exact.clone() }).note, Some(exact));
}
