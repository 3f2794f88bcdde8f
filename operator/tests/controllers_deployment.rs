//! The ModelDeployment controller against a mocked API server: each scenario lists the exact
//! requests one reconcile sends (method, path, query, body essentials) and what the server
//! answers, API errors and conflicts included.

mod common;

use std::sync::Arc;
use std::time::Duration;

use brink_api::crd::{ConditionStatus, ConditionType, ModelDeploymentStatus, ModelReplica, ReplicaPhase, condition};
use brink_operator::controllers::{Error, deployment, retry_after};
use common::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

fn at(s: i64) -> Time {
    Time(Timestamp::from_second(s).expect("valid time"))
}

/// A replica as the API server and its agent leave it (shadows `common::replica`): created an
/// hour ago; a Serving one Ready and Qualified for the last 50 minutes, so that the rollout
/// counts it as proven.
fn replica(name: &str, node: &str, phase: Option<ReplicaPhase>) -> ModelReplica {
    let mut r = common::replica(name, node, phase);
    r.metadata.creation_timestamp = Some(at(NOW_S - 3600));
    if let Some(s) = r.status.as_mut().filter(|s| s.phase == ReplicaPhase::Serving) {
        for (t, reason) in [(ConditionType::Ready, "Serving"), (ConditionType::Qualified, "ThresholdTestPassed")] {
            s.conditions.push(condition(t, ConditionStatus::True, reason, "", None, at(NOW_S - 3000)).expect("condition"));
        }
    }
    r
}

fn replica_create(name: &'static str, node: &'static str) -> Expect {
    Expect::new("POST", REPLICAS).query("fieldManager", "brink-operator").check(move |b| {
        assert_eq!(b["kind"], "ModelReplica");
        assert_eq!(b["metadata"]["name"], name);
        assert_eq!(b["metadata"]["namespace"], NS);
        assert_eq!(b["metadata"]["labels"]["brink.dev/deployment"], "qwen");
        assert_eq!(b["metadata"]["annotations"]["brink.dev/memory-bytes"], REPLICA_BYTES.to_string());
        assert_eq!(b["metadata"]["ownerReferences"][0]["uid"], "uid-dep");
        assert_eq!(b["metadata"]["ownerReferences"][0]["kind"], "ModelDeployment");
        assert_eq!(b["spec"]["node"], node);
        assert_eq!(b["spec"]["deployment"], "qwen");
        assert_eq!(b["spec"]["model"], "qwen");
        assert_eq!(b["spec"]["revision"], revision());
        assert_eq!(b["spec"]["engine"]["image"], "ghcr.io/brink/agent:0.2.0");
        assert_eq!(b["spec"]["serving"]["maxBatchTokens"], 8192);
        assert_eq!(b["spec"]["serving"]["prefillChunk"], 2048);
    })
}

/// A rollout Event on the deployment.
fn rollout_event(reason: &'static str, type_: &'static str) -> Expect {
    Expect::event(reason, "qwen").check(move |b| {
        assert_eq!(b["action"], "Rollout", "{b}");
        assert_eq!(b["type"], type_, "{b}");
    })
}

fn status_apply(check: impl Fn(&Value) + Send + 'static) -> Expect {
    Expect::new("PATCH", STATUS)
        .query("fieldManager", "brink-operator")
        .query("force", "true")
        .check(move |b| {
            assert_eq!(b["kind"], "ModelDeployment");
            assert_eq!(b["metadata"]["name"], "qwen");
            assert_eq!(b["status"]["selector"], "brink.dev/deployment=qwen");
            assert_eq!(b["status"]["observedGeneration"], 1);
            check(b)
        })
        .reply(Reply::EchoOnto(serde_json::to_value(deployment(1)).expect("JSON")))
}

#[tokio::test]
async fn two_replicas_on_three_qualified_nodes() {
    let world = World::qualified_fleet(3);
    let (ctx, handle) = context(&world);
    let script = vec![
        service_apply(),
        replica_create("qwen-0", "spark-1"),
        Expect::event("Placed", "qwen").check(|b| {
            assert_eq!(b["related"]["name"], "qwen-0");
            assert_eq!(b["note"], "replica qwen-0 on node spark-1");
            assert_eq!(b["type"], "Normal");
        }),
        replica_create("qwen-1", "spark-2"),
        Expect::event("Placed", "qwen").check(|b| assert_eq!(b["related"]["name"], "qwen-1")),
        // The first rollout of the revision: nothing ran before, so no canary.
        Expect::event("RolloutStarted", "qwen").check(|b| {
            assert_eq!((b["type"].as_str(), b["action"].as_str()), (Some("Normal"), Some("Rollout")));
            assert_eq!(b["note"], "0 of 2 replicas exist; 0/2 serve");
        }),
        status_apply(|b| {
            assert_eq!(b["status"]["replicas"], 2);
            assert_eq!(b["status"]["readyReplicas"], 0);
            assert_eq!(b["status"]["updatedReplicas"], 2);
            assert_eq!(cond(b, "Ready")["status"], "False");
            assert_eq!(cond(b, "Progressing")["status"], "True");
            assert_eq!(cond(b, "Progressing")["reason"], "RollingOut");
            assert_eq!(b["status"]["rollout"]["phase"], "Progressing");
            assert_eq!(b["status"]["rollout"]["revision"], revision());
            assert!(b["status"]["rollout"].get("previousRevision").is_none(), "{b}");
            assert_eq!(cond(b, "Degraded")["status"], "False");
        }),
    ];
    let (action, seen) = scenario(handle, script, deployment::reconcile(Arc::new(deployment(2)), ctx.clone())).await;
    let action = action.expect("reconcile");
    assert_eq!(format!("{action:?}"), format!("{:?}", kube::runtime::controller::Action::requeue(Duration::from_secs(20))));
    assert_eq!(seen.len(), 7);
    let metrics = ctx.metrics.render().expect("metrics");
    assert!(metrics.contains("brink_operator_placements_total{namespace=\"llm\"} 2"), "{metrics}");
    assert!(metrics.contains("brink_operator_unplaced_replicas{deployment=\"qwen\",namespace=\"llm\"} 0"), "{metrics}");
}

#[tokio::test]
async fn a_settled_deployment_writes_nothing_but_its_service() {
    let mut world = World::qualified_fleet(3);
    world.replicas =
        vec![replica("qwen-0", "spark-1", Some(ReplicaPhase::Serving)), replica("qwen-1", "spark-2", Some(ReplicaPhase::Serving))];
    // The status this reconcile would write, already there: no status request.
    let (ctx, handle) = context(&world);
    let script = vec![
        service_apply(),
        rollout_event("RolloutComplete", "Normal"),
        status_apply(|b| {
            assert_eq!(b["status"]["readyReplicas"], 2);
            assert_eq!(cond(b, "Ready")["status"], "True");
            assert_eq!(cond(b, "Progressing")["reason"], "RolloutComplete");
            assert_eq!(cond(b, "Progressing")["status"], "False");
            assert_eq!(b["status"]["rollout"]["phase"], "Complete");
        }),
    ];
    let (r, seen) = scenario(handle, script, deployment::reconcile(Arc::new(deployment(2)), ctx.clone())).await;
    r.expect("reconcile");
    let written: ModelDeploymentStatus = serde_json::from_value(seen[2].body["status"].clone()).expect("status");
    let mut settled = deployment(2);
    settled.status = Some(written);
    let (ctx, handle) = context(&world);
    let (r, _) = scenario(handle, vec![service_apply()], deployment::reconcile(Arc::new(settled), ctx)).await;
    r.expect("second reconcile");
}

#[tokio::test]
async fn a_cordoned_node_gets_its_replica_replaced_then_removed_once_the_new_one_serves() {
    let mut world = World::qualified_fleet(3);
    world.nodes[0] = cordoned("spark-1");
    world.replicas =
        vec![replica("qwen-0", "spark-1", Some(ReplicaPhase::Serving)), replica("qwen-1", "spark-2", Some(ReplicaPhase::Serving))];
    let (ctx, handle) = context(&world);
    let script = vec![
        service_apply(),
        replica_create("qwen-2", "spark-3"),
        Expect::event("Placed", "qwen"),
        Expect::event("Replacing", "qwen").check(|b| {
            assert_eq!(b["related"]["name"], "qwen-0");
            assert_eq!(b["note"], "replica qwen-0 on node spark-1: cordoned");
        }),
        rollout_event("RolloutComplete", "Normal"),
        // qwen-0 still serves: it stays until its replacement does.
        status_apply(|b| {
            assert_eq!(b["status"]["replicas"], 3);
            assert_eq!(b["status"]["readyReplicas"], 2);
            assert_eq!(cond(b, "Ready")["status"], "True");
            assert_eq!(cond(b, "Progressing")["status"], "True");
        }),
    ];
    let (r, _) = scenario(handle, script, deployment::reconcile(Arc::new(deployment(2)), ctx)).await;
    r.expect("first reconcile");

    // The replacement serves: the cordoned node's replica goes.
    world.replicas.push(replica("qwen-2", "spark-3", Some(ReplicaPhase::Serving)));
    let (ctx, handle) = context(&world);
    let script = vec![
        service_apply(),
        Expect::new("DELETE", format!("{REPLICAS}/qwen-0")).check(|b| assert_eq!(b["propagationPolicy"], "Background")).reply(Reply::Json(
            json!({
                "apiVersion": "v1", "kind": "Status", "status": "Success", "code": 200
            }),
        )),
        Expect::event("Deleted", "qwen").check(|b| assert_eq!(b["related"]["name"], "qwen-0")),
        rollout_event("RolloutComplete", "Normal"),
        status_apply(|b| {
            assert_eq!(b["status"]["replicas"], 2);
            assert_eq!(b["status"]["readyReplicas"], 2);
            assert_eq!(cond(b, "Progressing")["status"], "True");
        }),
    ];
    let (r, _) = scenario(handle, script, deployment::reconcile(Arc::new(deployment(2)), ctx.clone())).await;
    r.expect("second reconcile");
    assert!(ctx.metrics.render().expect("metrics").contains("brink_operator_replica_deletions_total{reason=\"lifecycle\"} 1"));
}

#[tokio::test]
async fn a_lost_heartbeat_replaces_and_removes_without_waiting() {
    // The heartbeat of spark-1 expired 200 s ago (grace 60 s): lost on the first read.
    let mut world = World::qualified_fleet(3);
    world.leases[0] = lease("spark-1", 240);
    world.replicas = vec![replica("qwen-0", "spark-1", Some(ReplicaPhase::Serving))];
    let (ctx, handle) = context(&world);
    let script = vec![
        service_apply(),
        replica_create("qwen-1", "spark-2"),
        Expect::event("Placed", "qwen"),
        Expect::event("Replacing", "qwen").check(|b| {
            let note = b["note"].as_str().unwrap_or_default();
            assert!(note.starts_with("replica qwen-0 on node spark-1: heartbeat expired 200 s ago"), "{note}");
        }),
        rollout_event("RolloutComplete", "Normal"),
        // qwen-0 reports Serving, but from a node that lost its heartbeat that is not believed.
        status_apply(|b| {
            assert_eq!(b["status"]["replicas"], 2);
            assert_eq!(b["status"]["readyReplicas"], 0);
        }),
    ];
    let (r, _) = scenario(handle, script, deployment::reconcile(Arc::new(deployment(1)), ctx)).await;
    r.expect("first reconcile");

    // The replacement is still loading; the lost node's replica goes anyway (it serves no one).
    let mut loading = replica("qwen-1", "spark-2", Some(ReplicaPhase::Loading));
    loading.metadata.creation_timestamp = Some(at(NOW_S - 10));
    world.replicas.push(loading);
    let (ctx, handle) = context(&world);
    let script = vec![
        service_apply(),
        Expect::new("DELETE", format!("{REPLICAS}/qwen-0"))
            .reply(Reply::Json(json!({ "apiVersion": "v1", "kind": "Status", "status": "Success", "code": 200 }))),
        Expect::event("Deleted", "qwen"),
        // (A fresh status: the rollout waits for the loading replica, within its deadline.)
        rollout_event("RolloutStarted", "Normal"),
        status_apply(|b| {
            assert_eq!(b["status"]["replicas"], 1);
            assert_eq!(b["status"]["readyReplicas"], 0);
            assert_eq!(cond(b, "Ready")["status"], "False");
            let msg = b["status"]["rollout"]["message"].as_str().unwrap_or_default().to_string();
            assert!(msg.starts_with("waiting for qwen-1 (phase Loading, not Ready, threshold test pending)"), "{msg}");
        }),
    ];
    let (r, _) = scenario(handle, script, deployment::reconcile(Arc::new(deployment(1)), ctx)).await;
    r.expect("second reconcile");
}

#[tokio::test]
async fn no_qualified_node_asks_for_qualification_and_says_why() {
    let mut world = World::qualified_fleet(2);
    world.spark_nodes = vec![spark("spark-1", None), spark("spark-2", None)];
    let (ctx, handle) = context(&world);
    let qualify = |node: &'static str| {
        Expect::new("PATCH", format!("/apis/brink.dev/v1alpha1/sparknodes/{node}")).query("fieldManager", "brink-operator").check(
            move |b| {
                assert_eq!(b["kind"], "SparkNode");
                assert_eq!(b["metadata"]["name"], node);
                assert_eq!(b["spec"]["shapeClasses"], json!([CLASS]));
            },
        )
    };
    let script = vec![
        service_apply(),
        qualify("spark-1"),
        qualify("spark-2"),
        rollout_event("RolloutStarted", "Normal"),
        Expect::event("Unplaced", "qwen").check(|b| assert_eq!(b["type"], "Warning")),
        status_apply(|b| {
            assert_eq!(b["status"]["replicas"], 0);
            let degraded = cond(b, "Degraded");
            assert_eq!(degraded["status"], "True");
            assert_eq!(degraded["reason"], "Unplaced");
            assert_eq!(degraded["message"], format!("2 of 2 replicas cannot be placed; 0/2 nodes available: 2 not qualified for {CLASS}"));
            assert_eq!(cond(b, "Progressing")["reason"], "Unplaceable");
        }),
    ];
    let (r, seen) = scenario(handle, script, deployment::reconcile(Arc::new(deployment(2)), ctx.clone())).await;
    r.expect("reconcile");
    // Not forced: a conflict names the other writer instead of taking its field.
    assert!(!seen[1].query.contains_key("force"));
    assert!(ctx.metrics.render().expect("metrics").contains("brink_operator_unplaced_replicas{deployment=\"qwen\",namespace=\"llm\"} 2"));

    // Once asked, the class counts as being qualified: not asked again.
    world.spark_nodes.iter_mut().for_each(|s| s.spec.shape_classes = vec![CLASS.into()]);
    let (ctx, handle) = context(&world);
    let script = vec![
        service_apply(),
        rollout_event("RolloutStarted", "Normal"),
        Expect::event("Unplaced", "qwen"),
        status_apply(|b| {
            let msg = cond(b, "Degraded")["message"].as_str().unwrap_or_default().to_string();
            assert!(msg.ends_with(&format!("2 not qualified for {CLASS}")), "{msg}");
        }),
    ];
    let (r, _) = scenario(handle, script, deployment::reconcile(Arc::new(deployment(2)), ctx)).await;
    r.expect("second reconcile");
}

#[tokio::test]
async fn a_conflict_on_the_qualification_request_is_surfaced_and_retried() {
    let mut world = World::qualified_fleet(1);
    world.spark_nodes = vec![spark("spark-1", None)];
    let (ctx, handle) = context(&world);
    let script = vec![
        service_apply(),
        Expect::new("PATCH", "/apis/brink.dev/v1alpha1/sparknodes/spark-1")
            .reply(Reply::Fail(409, "Apply failed with 1 conflict: conflict with \"someone\": .spec.shapeClasses")),
        Expect::event("ReconcileFailed", "qwen").check(|b| {
            assert_eq!(b["type"], "Warning");
            let note = b["note"].as_str().unwrap_or_default();
            assert!(
                note.starts_with(&format!("asking SparkNode spark-1 to qualify {CLASS}: conflict with another field manager:")),
                "{note}"
            );
            assert!(note.contains("someone"), "{note}");
        }),
    ];
    let (r, _) = scenario(handle, script, deployment::reconcile(Arc::new(deployment(1)), ctx.clone())).await;
    let err = r.expect_err("a conflict fails the reconcile");
    assert!(matches!(err, Error::Conflict { .. }), "{err:?}");
    assert_eq!(retry_after(&err), Duration::from_secs(5));
    assert!(ctx.metrics.render().expect("metrics").contains("kind=\"conflict\""));
}

#[tokio::test]
async fn a_server_error_on_create_fails_the_reconcile_for_a_retry() {
    let world = World::qualified_fleet(2);
    let (ctx, handle) = context(&world);
    let script = vec![
        service_apply(),
        replica_create("qwen-0", "spark-1").reply(Reply::Fail(500, "etcdserver: request timed out")),
        Expect::event("ReconcileFailed", "qwen").check(|b| {
            let note = b["note"].as_str().unwrap_or_default();
            assert!(note.starts_with("creating ModelReplica llm/qwen-0:") && note.contains("etcdserver: request timed out"), "{note}");
        }),
    ];
    let (r, _) = scenario(handle, script, deployment::reconcile(Arc::new(deployment(2)), ctx.clone())).await;
    let err = r.expect_err("a 500 fails the reconcile");
    assert!(matches!(err, Error::Kube { .. }), "{err:?}");
    assert_eq!(retry_after(&err), Duration::from_secs(15));
    let m = ctx.metrics.render().expect("metrics");
    assert!(m.contains("brink_operator_reconcile_errors_total{controller=\"modeldeployment\",kind=\"api\"} 1"), "{m}");
}

#[tokio::test]
async fn a_name_taken_by_a_replica_the_cache_has_not_seen_stops_and_requeues_soon() {
    let world = World::qualified_fleet(2);
    let (ctx, handle) = context(&world);
    let script = vec![
        service_apply(),
        replica_create("qwen-0", "spark-1").reply(Reply::Fail(409, "modelreplicas.brink.dev \"qwen-0\" already exists")),
        rollout_event("RolloutStarted", "Normal"),
        status_apply(|b| assert_eq!(b["status"]["replicas"], 0)),
    ];
    let (r, _) = scenario(handle, script, deployment::reconcile(Arc::new(deployment(2)), ctx)).await;
    let action = r.expect("a stale cache is not an error");
    assert_eq!(format!("{action:?}"), format!("{:?}", kube::runtime::controller::Action::requeue(Duration::from_secs(1))));
}

#[tokio::test]
async fn scale_down_removes_the_surplus() {
    let mut world = World::qualified_fleet(3);
    world.replicas = vec![
        replica("qwen-0", "spark-1", Some(ReplicaPhase::Serving)),
        replica("qwen-1", "spark-2", Some(ReplicaPhase::Serving)),
        replica("qwen-2", "spark-3", Some(ReplicaPhase::Serving)),
    ];
    let (ctx, handle) = context(&world);
    let delete = |name: &'static str| {
        Expect::new("DELETE", format!("{REPLICAS}/{name}"))
            .reply(Reply::Json(json!({ "apiVersion": "v1", "kind": "Status", "status": "Success", "code": 200 })))
    };
    let script = vec![
        service_apply(),
        delete("qwen-0"),
        Expect::event("Deleted", "qwen").check(|b| assert_eq!(b["related"]["name"], "qwen-0")),
        delete("qwen-1"),
        Expect::event("Deleted", "qwen").check(|b| assert_eq!(b["related"]["name"], "qwen-1")),
        rollout_event("RolloutComplete", "Normal"),
        status_apply(|b| {
            assert_eq!(b["status"]["replicas"], 1);
            assert_eq!(b["status"]["readyReplicas"], 1);
            assert_eq!(cond(b, "Ready")["status"], "True");
        }),
    ];
    let (r, _) = scenario(handle, script, deployment::reconcile(Arc::new(deployment(1)), ctx)).await;
    r.expect("reconcile");
}

#[tokio::test]
async fn a_changed_engine_build_recreates_the_only_replica_in_place_as_the_canary() {
    let mut world = World::qualified_fleet(2);
    world.replicas = vec![replica("qwen-0", "spark-1", Some(ReplicaPhase::Serving))];
    let mut dep = deployment(1);
    dep.spec.engine.version = "0.3.0".into();
    dep.spec.engine.image = "ghcr.io/brink/agent:0.3.0".into();
    let new_rev = brink_operator::decide::revision(&model().spec, &dep.spec.engine);
    assert_ne!(new_rev, revision());
    let (ctx, handle) = context(&world);
    let rev = new_rev.clone();
    let rev2 = new_rev.clone();
    let script = vec![
        service_apply(),
        // Recreated, not edited, and not moved: deleted (only the replica the cache saw) and
        // created again under its name on its node.
        Expect::new("DELETE", format!("{REPLICAS}/qwen-0"))
            .check(|b| assert_eq!(b, &json!({ "propagationPolicy": "Background", "preconditions": { "uid": "uid-qwen-0" } })))
            .reply(Reply::Json(json!({ "apiVersion": "v1", "kind": "Status", "status": "Success", "code": 200 }))),
        Expect::new("POST", REPLICAS).query("fieldManager", "brink-operator").check(move |b| {
            assert_eq!(b["metadata"]["name"], "qwen-0");
            assert!(b["metadata"].get("uid").is_none() && b["metadata"].get("resourceVersion").is_none(), "{b}");
            assert_eq!(b["metadata"]["labels"]["brink.dev/revision"], rev.as_str());
            assert_eq!(b["spec"]["node"], "spark-1");
            assert_eq!(b["spec"]["revision"], rev.as_str());
            assert_eq!(b["spec"]["engine"]["version"], "0.3.0");
            assert!(b.get("status").is_none(), "{b}");
            // The way back, kept on the replica itself: no other replica runs the old revision.
            let record: Value =
                serde_json::from_str(b["metadata"]["annotations"]["brink.dev/previous-template"].as_str().expect("record")).expect("JSON");
            assert_eq!(record["revision"], revision());
            assert_eq!(record["engine"]["version"], "0.2.0");
        }),
        Expect::event("Recreated", "qwen").check(|b| assert_eq!(b["related"]["name"], "qwen-0")),
        rollout_event("CanaryStarted", "Normal"),
        status_apply(move |b| {
            assert_eq!(b["status"]["replicas"], 1);
            assert_eq!(b["status"]["updatedReplicas"], 1);
            assert_eq!(b["status"]["readyReplicas"], 0);
            let r = &b["status"]["rollout"];
            assert_eq!((r["phase"].as_str(), r["canaryReplica"].as_str()), (Some("Canary"), Some("qwen-0")));
            assert_eq!((r["revision"].as_str(), r["previousRevision"].as_str()), (Some(rev2.as_str()), Some(revision().as_str())));
            assert_eq!(cond(b, "Progressing")["reason"], "CanaryStarted");
        }),
    ];
    let (r, seen) = scenario(handle, script, deployment::reconcile(Arc::new(dep.clone()), ctx.clone())).await;
    let action = r.expect("first reconcile");
    // Decided again once the progress deadline (900 s) could have passed: sooner, at the resync.
    assert_eq!(format!("{action:?}"), format!("{:?}", kube::runtime::controller::Action::requeue(Duration::from_secs(20))));
    assert!(ctx.metrics.render().expect("metrics").contains("brink_operator_replica_deletions_total{reason=\"revision\"} 1"));

    // The canary serves and passed its test for long enough: the rollout is complete.
    let mut canary = replica("qwen-0", "spark-1", Some(ReplicaPhase::Serving));
    canary.spec.revision = new_rev;
    world.replicas = vec![canary];
    dep.status = Some(serde_json::from_value(seen[5].body["status"].clone()).expect("status"));
    let (ctx, handle) = context(&world);
    let script = vec![
        service_apply(),
        rollout_event("RolloutComplete", "Normal"),
        status_apply(|b| {
            assert_eq!(b["status"]["rollout"]["phase"], "Complete");
            assert_eq!(b["status"]["readyReplicas"], 1);
            assert_eq!(cond(b, "Progressing")["reason"], "RolloutComplete");
        }),
    ];
    let (r, _) = scenario(handle, script, deployment::reconcile(Arc::new(dep), ctx)).await;
    r.expect("second reconcile");
}

#[tokio::test]
async fn a_missing_model_blocks_with_a_condition() {
    let mut world = World::qualified_fleet(1);
    world.models.clear();
    let (ctx, handle) = context(&world);
    let script = vec![
        service_apply(),
        status_apply(|b| {
            assert_eq!(cond(b, "Degraded")["reason"], "ModelNotFound");
            assert_eq!(cond(b, "Degraded")["message"], "Model llm/qwen does not exist");
        }),
    ];
    let (r, _) = scenario(handle, script, deployment::reconcile(Arc::new(deployment(1)), ctx)).await;
    r.expect("reconcile");

    let mut world = World::qualified_fleet(1);
    world.models[0].status.as_mut().expect("status").kv_bytes_per_token = None;
    let (ctx, handle) = context(&world);
    let script = vec![
        service_apply(),
        status_apply(|b| {
            assert_eq!(cond(b, "Degraded")["reason"], "ModelNotReady");
            let msg = cond(b, "Degraded")["message"].as_str().unwrap_or_default().to_string();
            assert!(msg.contains("status.kvBytesPerToken"), "{msg}");
        }),
    ];
    let (r, _) = scenario(handle, script, deployment::reconcile(Arc::new(deployment(1)), ctx)).await;
    r.expect("reconcile");
}

#[tokio::test]
async fn a_node_change_requeues_its_deployments_and_the_unplaced_ones() {
    use brink_operator::controllers::nodes;
    use kube::runtime::reflector::ObjectRef;

    let mut world = World::qualified_fleet(2);
    let mut other = replica("other-0", "spark-2", Some(ReplicaPhase::Serving));
    other.spec.deployment = "other".into();
    world.replicas = vec![replica("qwen-0", "spark-1", Some(ReplicaPhase::Serving)), other];
    let (ctx, _handle) = context(&world);
    let qwen = ObjectRef::new("qwen").within(NS);
    let other = ObjectRef::new("other").within(NS);
    assert_eq!(nodes::requeue_for_node("spark-1", &ctx), vec![qwen.clone()]);
    assert_eq!(nodes::requeue_for_node("spark-2", &ctx), vec![other.clone()]);
    assert!(nodes::requeue_for_node("spark-9", &ctx).is_empty());
    // A deployment with unplaced replicas hears of every node.
    let stuck = ObjectRef::new("stuck").within(NS);
    ctx.mark_unplaced(stuck.clone(), true);
    assert_eq!(nodes::requeue_for_node("spark-9", &ctx), vec![stuck.clone()]);
    assert_eq!(nodes::requeue_for_node("spark-1", &ctx), vec![qwen, stuck.clone()]);
    ctx.mark_unplaced(stuck, false);
    assert!(nodes::requeue_for_node("spark-9", &ctx).is_empty());
    assert_eq!(nodes::lease_node("brink-node-spark-2").map(|n| nodes::requeue_for_node(n, &ctx)), Some(vec![other]));
}

/// A node a sweep drains (`drainReplicas`): its serving replica gets a replacement on another
/// node first and is deleted once that one serves, so the sweep measures an idle node.
#[tokio::test]
async fn a_node_a_sweep_drains_gets_its_replica_moved_surge_first() {
    let mut world = World::qualified_fleet(2);
    world.replicas = vec![replica("qwen-0", "spark-1", Some(ReplicaPhase::Serving))];
    world.sweep_runs = vec![draining_run("nightly-1", &[("spark-1", "Draining"), ("spark-2", "Waiting")])];
    let (ctx, handle) = context(&world);
    let script = vec![
        service_apply(),
        replica_create("qwen-1", "spark-2"),
        Expect::event("Placed", "qwen"),
        Expect::event("Replacing", "qwen").check(|b| {
            assert_eq!(b["related"]["name"], "qwen-0");
            assert_eq!(b["note"], "replica qwen-0 on node spark-1: sweep in progress: SweepRun llm/nightly-1 drains the node");
        }),
        rollout_event("RolloutComplete", "Normal"),
        // qwen-0 still serves until its replacement does.
        status_apply(|b| {
            assert_eq!((b["status"]["replicas"].as_i64(), b["status"]["readyReplicas"].as_i64()), (Some(2), Some(1)));
            assert_eq!(cond(b, "Ready")["status"], "True");
        }),
    ];
    let (r, _) = scenario(handle, script, deployment::reconcile(Arc::new(deployment(1)), ctx)).await;
    r.expect("first reconcile");

    // The replacement serves: the drained node's replica goes, and nothing new is placed on it.
    world.replicas.push(replica("qwen-1", "spark-2", Some(ReplicaPhase::Serving)));
    let (ctx, handle) = context(&world);
    let script = vec![
        service_apply(),
        Expect::new("DELETE", format!("{REPLICAS}/qwen-0"))
            .reply(Reply::Json(json!({ "apiVersion": "v1", "kind": "Status", "status": "Success", "code": 200 }))),
        Expect::event("Deleted", "qwen").check(|b| assert_eq!(b["related"]["name"], "qwen-0")),
        rollout_event("RolloutComplete", "Normal"),
        status_apply(|b| assert_eq!((b["status"]["replicas"].as_i64(), b["status"]["readyReplicas"].as_i64()), (Some(1), Some(1)))),
    ];
    let (r, _) = scenario(handle, script, deployment::reconcile(Arc::new(deployment(1)), ctx)).await;
    r.expect("second reconcile");

    // Once the run is past the node (Done), the node takes replicas again: a scale-up may use it.
    world.replicas.retain(|r| r.metadata.name.as_deref() != Some("qwen-0"));
    world.sweep_runs = vec![draining_run("nightly-1", &[("spark-1", "Done"), ("spark-2", "Draining")])];
    let (ctx, handle) = context(&world);
    let script = vec![
        service_apply(),
        replica_create("qwen-0", "spark-1"),
        Expect::event("Placed", "qwen"),
        Expect::event("Replacing", "qwen").check(|b| assert_eq!(b["related"]["name"], "qwen-1")),
        rollout_event("RolloutComplete", "Normal"),
        status_apply(|_| {}),
    ];
    let (r, _) = scenario(handle, script, deployment::reconcile(Arc::new(deployment(1)), ctx)).await;
    r.expect("third reconcile");
}

/// With no room elsewhere the sweep does not wait: the replica is deleted at once, with a
/// Warning saying so, and the deployment is Degraded until the node is back.
#[tokio::test]
async fn a_drained_replica_with_no_room_elsewhere_is_deleted_and_said_so() {
    let mut world = World::qualified_fleet(2);
    world.nodes[1] = cordoned("spark-2");
    world.replicas = vec![replica("qwen-0", "spark-1", Some(ReplicaPhase::Serving))];
    world.sweep_runs = vec![draining_run("nightly-1", &[("spark-1", "Running")])];
    let (ctx, handle) = context(&world);
    let script = vec![
        service_apply(),
        Expect::event("DrainedWithoutReplacement", "qwen").check(|b| {
            assert_eq!(b["type"], "Warning");
            assert_eq!(
                b["note"],
                "replica qwen-0 on node spark-1 deleted without a replacement: no other node has room, and SweepRun llm/nightly-1 must not wait for one"
            );
        }),
        Expect::new("DELETE", format!("{REPLICAS}/qwen-0"))
            .reply(Reply::Json(json!({ "apiVersion": "v1", "kind": "Status", "status": "Success", "code": 200 }))),
        Expect::event("Deleted", "qwen"),
        rollout_event("RolloutComplete", "Normal"),
        Expect::event("Unplaced", "qwen"),
        status_apply(|b| {
            assert_eq!(b["status"]["replicas"], 0);
            assert_eq!(cond(b, "Degraded")["reason"], "Unplaced");
            assert_eq!(
                cond(b, "Degraded")["message"],
                "1 of 1 replicas cannot be placed; 0/2 nodes available: 1 already hosts a replica (one per node), 1 cordoned, 1 sweep in progress"
            );
        }),
    ];
    let (r, _) = scenario(handle, script, deployment::reconcile(Arc::new(deployment(1)), ctx)).await;
    r.expect("reconcile");

    // A run without drainReplicas leaves the node's replicas alone (the run skips the node).
    let mut run = draining_run("nightly-1", &[("spark-1", "Running")]);
    run.spec.drain_replicas = false;
    world.sweep_runs = vec![run];
    let (ctx, handle) = context(&world);
    let script =
        vec![service_apply(), rollout_event("RolloutComplete", "Normal"), status_apply(|b| assert_eq!(b["status"]["readyReplicas"], 1))];
    let (r, _) = scenario(handle, script, deployment::reconcile(Arc::new(deployment(1)), ctx)).await;
    r.expect("reconcile without drain");
}

/// Tolerations admit a tainted node, and the replica records them (with the node selector and
/// priority class) for its Pod.
#[tokio::test]
async fn tolerations_admit_a_tainted_node_and_travel_with_the_replica() {
    let mut world = World::qualified_fleet(2);
    world.nodes[0] = tainted("spark-1", "dedicated", "NoExecute");
    world.nodes[1] = tainted("spark-2", "maintenance", "NoSchedule");
    let mut dep = deployment(1);
    dep.spec.placement.tolerations = vec![k8s_openapi::api::core::v1::Toleration {
        key: Some("dedicated".into()),
        operator: Some("Exists".into()),
        effect: Some("NoExecute".into()),
        ..Default::default()
    }];
    dep.spec.placement.priority_class_name = Some("inference-high".into());
    let (ctx, handle) = context(&world);
    let script = vec![
        service_apply(),
        replica_create("qwen-0", "spark-1").check(|b| {
            assert_eq!(b["spec"]["node"], "spark-1");
            let recorded: Value =
                serde_json::from_str(b["metadata"]["annotations"]["brink.dev/pod-scheduling"].as_str().unwrap_or_default()).expect("JSON");
            assert_eq!(
                recorded,
                json!({ "tolerations": [{ "key": "dedicated", "operator": "Exists", "effect": "NoExecute" }], "priorityClassName": "inference-high" })
            );
        }),
        Expect::event("Placed", "qwen"),
        rollout_event("RolloutStarted", "Normal"),
        status_apply(|b| assert_eq!(b["status"]["replicas"], 1)),
    ];
    let (r, _) = scenario(handle, script, deployment::reconcile(Arc::new(dep.clone()), ctx)).await;
    r.expect("reconcile");

    // Without the toleration neither node is eligible, each for its own taint.
    dep.spec.placement.tolerations.clear();
    let (ctx, handle) = context(&world);
    let script = vec![
        service_apply(),
        rollout_event("RolloutStarted", "Normal"),
        Expect::event("Unplaced", "qwen"),
        status_apply(|b| {
            assert_eq!(
                cond(b, "Degraded")["message"],
                "1 of 1 replicas cannot be placed; 0/2 nodes available: 1 taint dedicated:NoExecute, 1 taint maintenance:NoSchedule"
            );
        }),
    ];
    let (r, _) = scenario(handle, script, deployment::reconcile(Arc::new(dep), ctx)).await;
    r.expect("reconcile without tolerations");
}
