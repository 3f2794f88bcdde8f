//! The ModelDeployment controller following the rollout decision, against a mocked API server:
//! each pass lists the exact requests one reconcile sends. A changed engine build goes to one
//! canary first (recreated in place), continues once the canary serves and passed its
//! threshold test, rolls back when it fails; AllAtOnce recreates every replica at once.

mod common;

use std::sync::Arc;
use std::time::Duration;

use brink_api::crd::{
    ConditionStatus, ConditionType, ModelDeployment, ModelDeploymentStatus, ModelReplica, ReplicaPhase, RolloutPhase, RolloutStrategy,
    condition,
};
use brink_operator::controllers::deployment;
use common::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::controller::Action;
use serde_json::{Value, json};

fn at(s: i64) -> Time {
    Time(Timestamp::from_second(s).expect("valid time"))
}

/// A replica as the API server and its agent leave it: created an hour ago; a Serving one
/// Ready and Qualified since `NOW_S - 3000`.
fn replica(name: &str, node: &str, phase: Option<ReplicaPhase>) -> ModelReplica {
    let mut r = common::replica(name, node, phase);
    r.metadata.creation_timestamp = Some(at(NOW_S - 3600));
    if phase == Some(ReplicaPhase::Serving) {
        serve_since(&mut r, NOW_S - 3000);
    }
    r
}

/// Marks `r` Serving, Ready and Qualified since `since`.
fn serve_since(r: &mut ModelReplica, since: i64) {
    let s = r.status.get_or_insert_default();
    s.phase = ReplicaPhase::Serving;
    s.conditions.clear();
    for (t, reason) in [(ConditionType::Ready, "Serving"), (ConditionType::Qualified, "ThresholdTestPassed")] {
        s.conditions.push(condition(t, ConditionStatus::True, reason, "", None, at(since)).expect("condition"));
    }
}

/// The deployment with a new engine build (0.3.0), and its revision.
fn upgraded(replicas: i32) -> (ModelDeployment, String) {
    let mut dep = deployment(replicas);
    dep.spec.engine =
        brink_api::crd::EngineBuild { image: "ghcr.io/brink/agent:0.3.0".into(), version: "0.3.0".into(), ..Default::default() };
    let rev = brink_operator::decide::revision(&model().spec, &dep.spec.engine);
    assert_ne!(rev, revision());
    (dep, rev)
}

/// Three replicas serving the old revision on spark-1..3.
fn three_serving() -> World {
    let mut world = World::qualified_fleet(3);
    world.replicas = (0..3).map(|i| replica(&format!("qwen-{i}"), &format!("spark-{}", i + 1), Some(ReplicaPhase::Serving))).collect();
    world
}

fn deleted_ok() -> Reply {
    Reply::Json(json!({ "apiVersion": "v1", "kind": "Status", "status": "Success", "code": 200 }))
}

/// The delete half of a recreate: only the replica the cache saw (its uid).
fn recreate_delete(name: &'static str) -> Expect {
    Expect::new("DELETE", format!("{REPLICAS}/{name}"))
        .check(move |b| assert_eq!(b, &json!({ "propagationPolicy": "Background", "preconditions": { "uid": format!("uid-{name}") } })))
        .reply(deleted_ok())
}

/// The create half of a recreate: same name and node, at `revision` with engine `version`.
fn recreate_create(name: &'static str, node: &'static str, revision: String, version: &'static str) -> Expect {
    Expect::new("POST", REPLICAS).query("fieldManager", "brink-operator").check(move |b| {
        assert_eq!(b["metadata"]["name"], name, "{b}");
        assert_eq!(b["metadata"]["labels"]["brink.dev/revision"], revision.as_str());
        assert_eq!(b["metadata"]["ownerReferences"][0]["uid"], "uid-dep");
        assert_eq!(b["metadata"]["annotations"]["brink.dev/memory-bytes"], REPLICA_BYTES.to_string());
        assert_eq!(b["spec"]["node"], node);
        assert_eq!(b["spec"]["revision"], revision.as_str());
        assert_eq!(b["spec"]["engine"]["version"], version);
        assert_eq!(b["spec"]["engine"]["image"], format!("ghcr.io/brink/agent:{version}"));
        assert_eq!(b["spec"]["serving"]["maxBatchTokens"], 8192);
    })
}

fn recreated_event(name: &'static str) -> Expect {
    recreated_event_note(name, |_| {})
}

/// A Recreated Event about replica `name`; `note` checks its note.
fn recreated_event_note(name: &'static str, note: impl Fn(&str) + Send + 'static) -> Expect {
    Expect::event("Recreated", "qwen").check(move |b| {
        assert_eq!(b["related"]["name"], name);
        assert_eq!(b["action"], "Rollout");
        note(b["note"].as_str().unwrap_or_default())
    })
}

fn rollout_event(reason: &'static str, type_: &'static str) -> Expect {
    rollout_event_note(reason, type_, |_| {})
}

/// A rollout step's Event on the deployment; `note` checks its note.
fn rollout_event_note(reason: &'static str, type_: &'static str, note: impl Fn(&str) + Send + 'static) -> Expect {
    Expect::event(reason, "qwen").check(move |b| {
        assert_eq!(b["action"], "Rollout", "{b}");
        assert_eq!(b["type"], type_, "{b}");
        assert!(b.get("related").is_none(), "{b}");
        note(b["note"].as_str().unwrap_or_default())
    })
}

fn status_apply(check: impl Fn(&Value) + Send + 'static) -> Expect {
    Expect::new("PATCH", STATUS)
        .query("fieldManager", "brink-operator")
        .query("force", "true")
        .check(move |b| {
            assert_eq!(b["kind"], "ModelDeployment");
            check(b)
        })
        .reply(Reply::EchoOnto(serde_json::to_value(deployment(1)).expect("JSON")))
}

/// The status a pass wrote, as the next pass reads it.
fn written(seen: &[Seen]) -> ModelDeploymentStatus {
    let last = seen.iter().rev().find(|s| s.path == STATUS).expect("a status write");
    serde_json::from_value(last.body["status"].clone()).expect("status")
}

/// The replica a pass created under `name`, as the API server would keep it.
fn created(seen: &[Seen], name: &str, created_at: i64) -> ModelReplica {
    let post = seen.iter().rev().find(|s| s.method == "POST" && s.path == REPLICAS && s.body["metadata"]["name"] == name).expect("created");
    let mut r: ModelReplica = serde_json::from_value(post.body.clone()).expect("replica");
    r.metadata.uid = Some(format!("uid-{name}"));
    r.metadata.creation_timestamp = Some(at(created_at));
    r
}

fn requeue(s: u64) -> String {
    format!("{:?}", Action::requeue(Duration::from_secs(s)))
}

fn names_in(seen: &[Seen]) -> Vec<String> {
    seen.iter()
        .filter(|s| s.path.starts_with(REPLICAS))
        .map(|s| format!("{} {}", s.method, s.body["metadata"]["name"].as_str().unwrap_or(&s.path)))
        .collect()
}

#[tokio::test]
async fn a_changed_engine_build_goes_to_one_canary_first_then_on_once_it_serves_and_passed() {
    let (mut dep, new_rev) = upgraded(3);
    let mut world = three_serving();
    let old_rev = revision();

    // Pass 1: exactly one canary, recreated in place; the other two untouched.
    let (ctx, handle) = context(&world);
    let (rev, old) = (new_rev.clone(), old_rev.clone());
    let script = vec![
        service_apply(),
        recreate_delete("qwen-0"),
        recreate_create("qwen-0", "spark-1", new_rev.clone(), "0.3.0"),
        recreated_event("qwen-0"),
        rollout_event_note("CanaryStarted", "Normal", |note| {
            assert!(note.starts_with("canary qwen-0 on node spark-1 starts revision "), "{note}");
        }),
        status_apply(move |b| {
            let r = &b["status"]["rollout"];
            assert_eq!(r["phase"], "Canary");
            assert_eq!(r["revision"], rev.as_str());
            assert_eq!(r["previousRevision"], old.as_str());
            assert_eq!(r["canaryReplica"], "qwen-0");
            assert_eq!((b["status"]["replicas"].as_i64(), b["status"]["updatedReplicas"].as_i64()), (Some(3), Some(1)));
            assert_eq!(b["status"]["readyReplicas"], 2);
            assert_eq!(cond(b, "Progressing")["status"], "True");
            assert_eq!(cond(b, "Progressing")["reason"], "CanaryStarted");
        }),
    ];
    let (r, seen) = scenario(handle, script, deployment::reconcile(Arc::new(dep.clone()), ctx)).await;
    assert_eq!(format!("{:?}", r.expect("pass 1")), requeue(20));
    assert_eq!(names_in(&seen), ["DELETE /apis/brink.dev/v1alpha1/namespaces/llm/modelreplicas/qwen-0", "POST qwen-0"]);
    dep.status = Some(written(&seen));

    // Pass 2: the canary serves for 25 s of the 30 it must: only the status, and a recheck
    // when the 30 s are up.
    let mut canary = created(&seen, "qwen-0", NOW_S - 120);
    serve_since(&mut canary, NOW_S - 25);
    world.replicas[0] = canary.clone();
    let (ctx, handle) = context(&world);
    let script = vec![
        service_apply(),
        status_apply(|b| {
            assert_eq!(b["status"]["rollout"]["phase"], "Canary");
            assert_eq!(cond(b, "Progressing")["reason"], "CanaryWaiting");
            let msg = cond(b, "Progressing")["message"].as_str().unwrap_or_default().to_string();
            assert!(msg.ends_with("serving; must keep serving for 30s"), "{msg}");
        }),
    ];
    let (r, seen) = scenario(handle, script, deployment::reconcile(Arc::new(dep.clone()), ctx)).await;
    assert_eq!(format!("{:?}", r.expect("pass 2")), requeue(5));
    dep.status = Some(written(&seen));

    // Pass 3: the canary has served (Ready, threshold test passed) for 60 s: the next replica.
    serve_since(&mut canary, NOW_S - 60);
    world.replicas[0] = canary;
    let (ctx, handle) = context(&world);
    let script = vec![
        service_apply(),
        recreate_delete("qwen-1"),
        recreate_create("qwen-1", "spark-2", new_rev.clone(), "0.3.0"),
        recreated_event("qwen-1"),
        rollout_event_note("CanaryPassed", "Normal", |note| {
            assert!(note.starts_with("canary qwen-0 on node spark-1 serves and passed its threshold test; moving qwen-1"), "{note}");
        }),
        status_apply(|b| {
            assert_eq!(b["status"]["rollout"]["phase"], "Progressing");
            assert_eq!(b["status"]["rollout"]["canaryReplica"], "qwen-0");
            assert_eq!(cond(b, "Progressing")["reason"], "CanaryPassed");
            assert_eq!((b["status"]["updatedReplicas"].as_i64(), b["status"]["readyReplicas"].as_i64()), (Some(2), Some(2)));
        }),
    ];
    let (r, seen) = scenario(handle, script, deployment::reconcile(Arc::new(dep), ctx)).await;
    r.expect("pass 3");
    // qwen-2 waits for qwen-1: never fewer than replicas - 1 serve.
    assert!(!names_in(&seen).iter().any(|n| n.contains("qwen-2")), "{:?}", names_in(&seen));
}

#[tokio::test]
async fn a_failed_canary_is_rolled_back_and_its_revision_not_retried() {
    let (mut dep, new_rev) = upgraded(3);
    let mut world = three_serving();
    let old_rev = revision();
    let (ctx, handle) = context(&world);
    let script = vec![
        service_apply(),
        recreate_delete("qwen-0"),
        recreate_create("qwen-0", "spark-1", new_rev.clone(), "0.3.0"),
        recreated_event("qwen-0"),
        rollout_event("CanaryStarted", "Normal"),
        status_apply(|_| {}),
    ];
    let (r, seen) = scenario(handle, script, deployment::reconcile(Arc::new(dep.clone()), ctx)).await;
    r.expect("pass 1");
    dep.status = Some(written(&seen));

    // The canary's threshold test fails: it returns to the previous revision (engine 0.2.0).
    let mut canary = created(&seen, "qwen-0", NOW_S - 300);
    let s = canary.status.get_or_insert_default();
    s.phase = ReplicaPhase::Failed;
    s.conditions = vec![
        condition(
            ConditionType::Qualified,
            ConditionStatus::False,
            "ThresholdTestFailed",
            "case moe-512: max abs err 0.31 > 0.05",
            None,
            at(NOW_S - 10),
        )
        .expect("condition"),
    ];
    world.replicas[0] = canary;
    let (ctx, handle) = context(&world);
    let why = "canary qwen-0 on node spark-1 rolled back to revision";
    let (old, old2) = (old_rev.clone(), old_rev.clone());
    let script = vec![
        service_apply(),
        recreate_delete("qwen-0"),
        recreate_create("qwen-0", "spark-1", old_rev.clone(), "0.2.0"),
        recreated_event_note("qwen-0", |note| {
            assert!(note.contains("rollback of revision") && note.contains("threshold test failed"), "{note}");
        }),
        rollout_event_note("RolledBack", "Warning", move |note| {
            assert_eq!(note, format!("{why} {old}: threshold test failed: case moe-512: max abs err 0.31 > 0.05"));
        }),
        status_apply(move |b| {
            let r = &b["status"]["rollout"];
            assert_eq!(r["phase"], "RolledBack");
            assert_eq!(r["previousRevision"], old2.as_str());
            let msg = r["message"].as_str().unwrap_or_default();
            assert!(msg.ends_with("threshold test failed: case moe-512: max abs err 0.31 > 0.05"), "{msg}");
            assert_eq!(cond(b, "Progressing")["status"], "False");
            assert_eq!(cond(b, "Progressing")["reason"], "RolledBack");
            assert_eq!(b["status"]["updatedReplicas"], 0);
        }),
    ];
    let (r, seen) = scenario(handle, script, deployment::reconcile(Arc::new(dep.clone()), ctx)).await;
    r.expect("rollback");
    dep.status = Some(written(&seen));

    // Back on the previous revision and serving: the failed revision is not tried again, and
    // no Event repeats.
    let mut back = created(&seen, "qwen-0", NOW_S - 200);
    serve_since(&mut back, NOW_S - 100);
    world.replicas[0] = back;
    let (ctx, handle) = context(&world);
    let script = vec![
        service_apply(),
        status_apply(|b| {
            assert_eq!(b["status"]["rollout"]["phase"], "RolledBack");
            assert_eq!(b["status"]["readyReplicas"], 3);
        }),
    ];
    let (r, seen) = scenario(handle, script, deployment::reconcile(Arc::new(dep.clone()), ctx)).await;
    r.expect("held");
    assert!(names_in(&seen).is_empty());
    assert_eq!(written(&seen).rollout.map(|r| r.phase), Some(RolloutPhase::RolledBack));
}

#[tokio::test]
async fn a_single_replica_rolls_back_to_the_engine_build_it_recorded() {
    // No other replica runs the old revision: the canary's own record is the way back.
    let (mut dep, new_rev) = upgraded(1);
    let mut world = World::qualified_fleet(1);
    world.replicas = vec![replica("qwen-0", "spark-1", Some(ReplicaPhase::Serving))];
    let (ctx, handle) = context(&world);
    let script = vec![
        service_apply(),
        recreate_delete("qwen-0"),
        recreate_create("qwen-0", "spark-1", new_rev, "0.3.0"),
        recreated_event("qwen-0"),
        rollout_event("CanaryStarted", "Normal"),
        status_apply(|_| {}),
    ];
    let (r, seen) = scenario(handle, script, deployment::reconcile(Arc::new(dep.clone()), ctx)).await;
    r.expect("pass 1");
    dep.status = Some(written(&seen));

    // It never serves: past progressDeadlineSeconds (900) it is rolled back.
    let mut canary = created(&seen, "qwen-0", NOW_S - 901);
    canary.status.get_or_insert_default().phase = ReplicaPhase::Loading;
    world.replicas = vec![canary];
    let (ctx, handle) = context(&world);
    let script = vec![
        service_apply(),
        recreate_delete("qwen-0"),
        recreate_create("qwen-0", "spark-1", revision(), "0.2.0"),
        recreated_event("qwen-0"),
        rollout_event_note("RolledBack", "Warning", |note| {
            assert!(note.contains("not serving with a passed threshold test after 901s (progressDeadlineSeconds 900)"), "{note}");
        }),
        status_apply(|b| assert_eq!(b["status"]["rollout"]["phase"], "RolledBack")),
    ];
    let (r, _) = scenario(handle, script, deployment::reconcile(Arc::new(dep), ctx)).await;
    r.expect("rollback");
}

#[tokio::test]
async fn all_at_once_recreates_every_replica() {
    let (mut dep, new_rev) = upgraded(3);
    dep.spec.rollout.strategy = RolloutStrategy::AllAtOnce;
    let world = three_serving();
    let (ctx, handle) = context(&world);
    let old = revision();
    let mut script = vec![service_apply()];
    for (name, node) in [("qwen-0", "spark-1"), ("qwen-1", "spark-2"), ("qwen-2", "spark-3")] {
        script.push(recreate_delete(name));
        script.push(recreate_create(name, node, new_rev.clone(), "0.3.0"));
        script.push(recreated_event_note(name, |note| assert!(note.ends_with(", all at once"), "{note}")));
    }
    script.push(rollout_event("RolloutStarted", "Normal"));
    script.push(status_apply(move |b| {
        let r = &b["status"]["rollout"];
        assert_eq!(r["phase"], "Progressing");
        assert_eq!(r["previousRevision"], old.as_str());
        assert!(r.get("canaryReplica").is_none(), "{b}");
        assert_eq!((b["status"]["updatedReplicas"].as_i64(), b["status"]["readyReplicas"].as_i64()), (Some(3), Some(0)));
        assert_eq!(cond(b, "Progressing")["reason"], "RollingOut");
    }));
    let (r, seen) = scenario(handle, script, deployment::reconcile(Arc::new(dep), ctx.clone())).await;
    r.expect("reconcile");
    assert_eq!(names_in(&seen).len(), 6);
    assert!(ctx.metrics.render().expect("metrics").contains("brink_operator_replica_deletions_total{reason=\"revision\"} 3"));
}

#[tokio::test]
async fn a_scale_up_during_the_canary_adds_replicas_of_the_previous_revision() {
    let (dep, new_rev) = upgraded(3);
    let mut world = World::qualified_fleet(3);
    world.replicas =
        vec![replica("qwen-0", "spark-1", Some(ReplicaPhase::Serving)), replica("qwen-1", "spark-2", Some(ReplicaPhase::Serving))];
    let (ctx, handle) = context(&world);
    let script = vec![
        service_apply(),
        // Not the unproven revision: the one the others run (engine 0.2.0).
        Expect::new("POST", REPLICAS).check(|b| {
            assert_eq!((b["metadata"]["name"].as_str(), b["spec"]["node"].as_str()), (Some("qwen-2"), Some("spark-3")));
            assert_eq!(b["spec"]["revision"], revision());
            assert_eq!(b["metadata"]["labels"]["brink.dev/revision"], revision());
            assert_eq!(b["spec"]["engine"]["version"], "0.2.0");
            assert_eq!(b["metadata"]["annotations"]["brink.dev/memory-bytes"], REPLICA_BYTES.to_string());
            assert!(b["metadata"]["annotations"].get("brink.dev/previous-template").is_none(), "{b}");
        }),
        Expect::event("Placed", "qwen"),
        recreate_delete("qwen-0"),
        recreate_create("qwen-0", "spark-1", new_rev, "0.3.0"),
        recreated_event("qwen-0"),
        rollout_event("CanaryStarted", "Normal"),
        status_apply(|b| {
            assert_eq!(b["status"]["replicas"], 3);
            assert_eq!(b["status"]["updatedReplicas"], 1);
            assert_eq!(b["status"]["rollout"]["canaryReplica"], "qwen-0");
        }),
    ];
    let (r, _) = scenario(handle, script, deployment::reconcile(Arc::new(dep), ctx)).await;
    r.expect("reconcile");
}

#[tokio::test]
async fn a_recreate_against_a_stale_cache_deletes_nothing_new_and_decides_again_soon() {
    let (dep, _) = upgraded(3);
    let world = three_serving();
    let (ctx, handle) = context(&world);
    let script = vec![
        service_apply(),
        // qwen-0 was recreated already (another uid): the precondition refuses the delete.
        recreate_delete("qwen-0")
            .reply(Reply::Fail(409, "Precondition failed: UID in precondition: uid-qwen-0, UID in object meta: uid-new")),
        rollout_event("CanaryStarted", "Normal"),
        status_apply(|b| assert_eq!(b["status"]["rollout"]["phase"], "Canary")),
    ];
    let (r, seen) = scenario(handle, script, deployment::reconcile(Arc::new(dep), ctx)).await;
    assert_eq!(format!("{:?}", r.expect("a stale cache is not an error")), requeue(1));
    assert!(!seen.iter().any(|s| s.method == "POST" && s.path == REPLICAS));
}

#[tokio::test]
async fn a_replica_without_a_creation_time_fails_the_reconcile_with_its_name() {
    let (dep, _) = upgraded(1);
    let mut world = World::qualified_fleet(1);
    world.replicas = vec![common::replica("qwen-0", "spark-1", Some(ReplicaPhase::Serving))];
    let (ctx, handle) = context(&world);
    let script = vec![
        service_apply(),
        Expect::event("ReconcileFailed", "qwen").check(|b| {
            assert_eq!(b["note"], "rollout of ModelDeployment llm/qwen: ModelReplica \"qwen-0\": no metadata.creationTimestamp");
        }),
    ];
    let (r, _) = scenario(handle, script, deployment::reconcile(Arc::new(dep), ctx)).await;
    assert!(r.is_err());
}

#[tokio::test]
async fn a_server_error_on_the_recreate_fails_the_reconcile_naming_the_revision() {
    let (dep, new_rev) = upgraded(3);
    let world = three_serving();
    let (ctx, handle) = context(&world);
    let script = vec![
        service_apply(),
        recreate_delete("qwen-0"),
        recreate_create("qwen-0", "spark-1", new_rev.clone(), "0.3.0").reply(Reply::Fail(500, "etcdserver: request timed out")),
        Expect::event("ReconcileFailed", "qwen").check(move |b| {
            let note = b["note"].as_str().unwrap_or_default();
            assert!(note.starts_with(&format!("recreating ModelReplica llm/qwen-0 at revision {new_rev}:")), "{note}");
            assert!(note.contains("etcdserver: request timed out"), "{note}");
        }),
    ];
    let (r, _) = scenario(handle, script, deployment::reconcile(Arc::new(dep), ctx)).await;
    assert!(r.is_err());
}

#[tokio::test]
async fn a_blocked_reconcile_keeps_the_rollout_status_it_cannot_decide() {
    // The apply owns status.rollout: one that left it out would remove it.
    let (mut dep, _) = upgraded(3);
    let mut world = three_serving();
    let (ctx, handle) = context(&world);
    let script = vec![
        service_apply(),
        recreate_delete("qwen-0"),
        recreate_create("qwen-0", "spark-1", upgraded(3).1, "0.3.0"),
        recreated_event("qwen-0"),
        rollout_event("CanaryStarted", "Normal"),
        status_apply(|_| {}),
    ];
    let (r, seen) = scenario(handle, script, deployment::reconcile(Arc::new(dep.clone()), ctx)).await;
    r.expect("pass 1");
    let before = written(&seen);
    dep.status = Some(before.clone());
    // The Model is gone: nothing can be decided.
    world.models.clear();
    let (ctx, handle) = context(&world);
    let rollout = serde_json::to_value(before.rollout.clone()).expect("JSON");
    let script = vec![
        service_apply(),
        status_apply(move |b| {
            assert_eq!(cond(b, "Progressing")["reason"], "ModelNotFound");
            assert_eq!(b["status"]["rollout"], rollout);
        }),
    ];
    let (r, _) = scenario(handle, script, deployment::reconcile(Arc::new(dep), ctx)).await;
    r.expect("blocked");
}
