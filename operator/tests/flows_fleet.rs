//! Whole flows of the operator: the real controllers (`controllers::run`)
//! against the in-memory API server, the test playing the kubelet, the node agents and the
//! admin. Each flow asserts the exact objects the controllers leave: which replicas exist, on
//! which nodes, their Pods, the deployment's status and conditions.
//!
//! Placement ties break by node name (equal load), so with three empty qualified nodes a
//! two-replica deployment lands on spark-1 and spark-2, and spark-3 is the spare.

mod common;
mod flows;

use std::collections::BTreeMap;

use brink_api::Verdict;
use brink_api::crd::{Model, ModelReplica, NodeRunState, ReplicaPhase, SparkNode, SweepRun};
use common::{CLASS, NOW_S, NS};
use flows::{Fleet, NodeSetup, Snapshot};
use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;

fn three_nodes(qualified: bool) -> [NodeSetup; 3] {
    [NodeSetup { name: "spark-1", qualified }, NodeSetup { name: "spark-2", qualified }, NodeSetup { name: "spark-3", qualified }]
}

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

/// Waits until `count` replicas exist, then returns where they are (the caller asserts exactly).
async fn placed(fleet: &Fleet, what: &str, count: usize, within_s: u64) -> BTreeMap<String, String> {
    fleet.until(what, within_s, |s: &Snapshot| (s.placed().len() >= count).then(|| s.placed())).await
}

/// Waits until every live replica has its Pod, pinned to the replica's node.
async fn pods_pinned(fleet: &Fleet, what: &str, want: &BTreeMap<String, String>) {
    fleet.until(what, 60, |s: &Snapshot| (s.pod_nodes() == *want && s.placed() == *want).then_some(())).await;
}

/// Deploys two replicas on three qualified nodes and brings them to serving: the state flows
/// 2, 3 and 5 start from (flow 1 asserts each step of it).
async fn serving_pair(fleet: &Fleet) {
    fleet.deploy(2).await;
    let want = map(&[("qwen-0", "spark-1"), ("qwen-1", "spark-2")]);
    assert_eq!(placed(fleet, "two replicas placed", 2, 60).await, want);
    pods_pinned(fleet, "replica Pods created", &want).await;
    for pod in want.keys() {
        fleet.mark_ready(pod).await;
    }
    fleet.until("both replicas serving", 60, |s: &Snapshot| s.settled(2, 2, "True").then_some(())).await;
}

/// Flow 1: a deployment of 2 on 3 qualified nodes → 2 replicas on distinct nodes → 2 pinned
/// Pods → Pods Ready → replicas Serving → status 2 ready, Ready True; the Service selects them.
#[tokio::test(start_paused = true)]
async fn a_deployment_is_placed_served_and_selected() {
    let fleet = Fleet::start(&three_nodes(true));
    fleet.deploy(2).await;

    let want = map(&[("qwen-0", "spark-1"), ("qwen-1", "spark-2")]);
    assert_eq!(placed(&fleet, "two replicas placed", 2, 30).await, want);
    pods_pinned(&fleet, "each replica's Pod on its node", &want).await;

    // Pods not ready yet: the replicas are Pending, nothing serves.
    let snap = fleet.until("status counts two replicas, none ready", 30, |s: &Snapshot| s.settled(2, 0, "False").then(|| s.placed())).await;
    assert_eq!(snap, want);
    let s = fleet.snapshot().await;
    for r in want.keys() {
        assert_eq!(s.phase(r), Some(ReplicaPhase::Pending), "{}", s.describe());
    }
    assert_eq!(s.condition("Degraded").map(|c| (c.status.as_str(), c.reason.as_str())), Some(("False", "AsExpected")));

    // Resyncs come and go: the controllers create nothing more.
    fleet.let_pass(90).await;
    let s = fleet.snapshot().await;
    assert_eq!((s.placed(), s.pod_nodes()), (want.clone(), want.clone()), "{}", s.describe());

    fleet.mark_ready("qwen-0").await;
    fleet
        .until("one replica serving", 30, |s: &Snapshot| {
            (s.settled(2, 1, "False") && s.phase("qwen-0") == Some(ReplicaPhase::Serving)).then_some(())
        })
        .await;
    fleet.mark_ready("qwen-1").await;
    let s = fleet
        .until("both serving, deployment Ready", 30, |s: &Snapshot| {
            (s.settled(2, 2, "True") && s.phase("qwen-1") == Some(ReplicaPhase::Serving)).then(|| s.condition("Ready").cloned())
        })
        .await;
    let ready = s.expect("Ready condition");
    assert_eq!((ready.reason.as_str(), ready.message.as_str()), ("AllReplicasReady", "2 of 2 replicas serving"));

    // The Service selects exactly the replica Pods, on their named port.
    let services: Api<Service> = Api::namespaced(fleet.double.client(), NS);
    let svc = services.get("qwen").await.expect("the deployment's Service");
    let spec = svc.spec.expect("Service spec");
    let selector = spec.selector.expect("Service selector");
    assert_eq!(selector, map(&[("brink.dev/deployment", "qwen")]));
    let port = &spec.ports.expect("ports")[0];
    assert_eq!(
        (port.port, port.target_port.clone()),
        (80, Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String("http".into())))
    );
    let label_selector = selector.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",");
    let selected = fleet.pods().list(&ListParams::default().labels(&label_selector)).await.expect("list Pods by the Service's selector");
    let names: Vec<String> = selected.items.iter().map(|p| p.name_any()).collect();
    assert_eq!(names, ["qwen-0", "qwen-1"]);
    fleet.stop().await;
}

/// Flow 2: the node of a replica is cordoned → a replacement on the spare node; the old
/// replica keeps serving until the replacement serves, then it is deleted with its Pod.
#[tokio::test(start_paused = true)]
async fn a_cordoned_nodes_replica_moves_once_its_replacement_serves() {
    let fleet = Fleet::start(&three_nodes(true));
    serving_pair(&fleet).await;

    fleet.cordon("spark-1").await;
    let moving = map(&[("qwen-0", "spark-1"), ("qwen-1", "spark-2"), ("qwen-2", "spark-3")]);
    assert_eq!(placed(&fleet, "a replacement placed", 3, 30).await, moving);
    pods_pinned(&fleet, "the replacement's Pod on the spare node", &moving).await;

    // The replacement loads: the cordoned replica still serves and is not deleted.
    fleet.let_pass(90).await;
    let s = fleet.snapshot().await;
    assert_eq!(s.placed(), moving, "{}", s.describe());
    assert_eq!(s.counts(), Some((3, 2)), "{}", s.describe());

    fleet.mark_ready("qwen-2").await;
    let moved = map(&[("qwen-1", "spark-2"), ("qwen-2", "spark-3")]);
    fleet
        .until("the cordoned replica deleted with its Pod", 30, |s: &Snapshot| {
            (s.placed() == moved && s.pod_nodes() == moved && s.replicas.len() == 2 && s.settled(2, 2, "True")).then_some(())
        })
        .await;
    fleet.stop().await;
}

/// Flow 3: a node's heartbeat Lease expires. Within the grace its replica is held (Degraded
/// says so); past it, the replica is replaced on the spare node and deleted at once (it no
/// longer counts as serving).
#[tokio::test(start_paused = true)]
async fn a_replica_on_a_node_whose_heartbeat_is_lost_is_replaced() {
    let fleet = Fleet::start(&three_nodes(true));
    serving_pair(&fleet).await;
    let pair = map(&[("qwen-0", "spark-1"), ("qwen-1", "spark-2")]);

    // 60 s on: spark-1's agent stopped renewing (its lease of 40 s expired 20 s ago); the
    // others renewed first, so they are never seen expired. No event says so: the
    // controllers' resync finds it.
    let t1 = NOW_S + 60;
    fleet.renew("spark-2", t1).await;
    fleet.renew("spark-3", t1).await;
    fleet.set_clock(t1);
    let held = fleet
        .until("the replica held within the grace", 30, |s: &Snapshot| {
            s.condition("Degraded").filter(|c| c.status == "True" && c.reason == "HeartbeatExpired").cloned()
        })
        .await;
    assert!(held.message.contains("qwen-0"), "{}", held.message);
    fleet.let_pass(30).await;
    let s = fleet.snapshot().await;
    assert_eq!((s.placed(), s.counts()), (pair.clone(), Some((2, 2))), "{}", s.describe());

    // 200 s on: expired 160 s ago, past the 60 s grace.
    let t2 = NOW_S + 200;
    fleet.renew("spark-2", t2).await;
    fleet.renew("spark-3", t2).await;
    fleet.set_clock(t2);
    let replaced = map(&[("qwen-1", "spark-2"), ("qwen-2", "spark-3")]);
    fleet
        .until("the lost node's replica replaced and deleted", 60, |s: &Snapshot| {
            (s.placed() == replaced && s.pod_nodes() == replaced && s.replicas.len() == 2).then_some(())
        })
        .await;
    let s = fleet.until("one of two serving", 30, |s: &Snapshot| s.settled(2, 1, "False").then(|| s.condition("Degraded").cloned())).await;
    assert_eq!(s.map(|c| c.status), Some("False".to_string()));

    fleet.mark_ready("qwen-2").await;
    fleet.until("the replacement serving", 30, |s: &Snapshot| s.settled(2, 2, "True").then_some(())).await;
    fleet.stop().await;
}

/// Flow 4: no node is qualified for the model's class → every node is asked to qualify it
/// (`spec.shapeClasses`) and the deployment is Degraded, saying why; as agents report
/// results, replicas are placed on the qualified nodes.
#[tokio::test(start_paused = true)]
async fn unqualified_nodes_are_asked_to_qualify_and_then_used() {
    let fleet = Fleet::start(&three_nodes(false));
    fleet.deploy(2).await;

    let degraded =
        fleet.until("Degraded: unplaced", 30, |s: &Snapshot| s.condition("Degraded").filter(|c| c.status == "True").cloned()).await;
    assert_eq!(degraded.reason, "Unplaced");
    assert_eq!(degraded.message, format!("2 of 2 replicas cannot be placed; 0/3 nodes available: 3 not qualified for {CLASS}"));
    let sparks: Api<SparkNode> = Api::all(fleet.double.client());
    for spark in sparks.list(&ListParams::default()).await.expect("list SparkNodes").items {
        assert_eq!(spark.spec.shape_classes, [CLASS], "{} was not asked to qualify", spark.name_any());
    }
    let s = fleet.snapshot().await;
    assert!(s.placed().is_empty(), "{}", s.describe());
    assert_eq!(s.condition("Progressing").map(|c| (c.status.as_str(), c.reason.as_str())), Some(("False", "Unplaceable")));

    fleet.report_qualified("spark-2", Verdict::Qualified { max_tokens: 16_384 }).await;
    assert_eq!(placed(&fleet, "a replica on the first qualified node", 1, 30).await, map(&[("qwen-0", "spark-2")]));
    let degraded = fleet
        .until("still Degraded for the second replica", 30, |s: &Snapshot| {
            s.condition("Degraded").filter(|c| c.message.starts_with("1 of 1 ")).cloned()
        })
        .await;
    assert_eq!(degraded.status, "True");
    assert!(degraded.message.contains(&format!("2 not qualified for {CLASS}")), "{}", degraded.message);

    // Clamped: placed with the validated batch size.
    fleet.report_qualified("spark-3", Verdict::Clamped { max_tokens: 4096, first_failure: 8192 }).await;
    let both = map(&[("qwen-0", "spark-2"), ("qwen-1", "spark-3")]);
    assert_eq!(placed(&fleet, "the second replica on the second qualified node", 2, 30).await, both);
    let s = fleet
        .until("Degraded cleared", 30, |s: &Snapshot| s.condition("Degraded").filter(|c| c.status == "False").map(|_| s.replicas.clone()))
        .await;
    let tokens: BTreeMap<String, u64> = s.iter().map(|r: &ModelReplica| (r.name_any(), r.spec.serving.max_batch_tokens)).collect();
    assert_eq!(tokens, BTreeMap::from([("qwen-0".to_string(), 8192), ("qwen-1".to_string(), 4096)]));
    fleet.stop().await;
}

/// Two models with one readable label (the second differs only in a weight type, so its shape
/// key's hash differs): nodes qualified only for the first are not used for the second, they
/// are asked to qualify its key, and nothing is placed until one reports it.
#[tokio::test(start_paused = true)]
async fn nodes_qualified_for_one_model_are_not_used_for_another_with_the_same_label() {
    let fleet = Fleet::start(&three_nodes(true));
    let other = format!("{CLASS}-0d94c3b8e1f7a256");
    let models: Api<Model> = Api::namespaced(fleet.double.client(), NS);
    models
        .patch_status("qwen", &PatchParams::default(), &Patch::Merge(json!({ "status": { "shapeClass": other } })))
        .await
        .expect("patch the Model's facts");
    fleet.deploy(2).await;
    let degraded =
        fleet.until("Degraded: unplaced", 30, |s: &Snapshot| s.condition("Degraded").filter(|c| c.status == "True").cloned()).await;
    assert_eq!(degraded.message, format!("2 of 2 replicas cannot be placed; 0/3 nodes available: 3 not qualified for {other}"));
    let sparks: Api<SparkNode> = Api::all(fleet.double.client());
    for spark in sparks.list(&ListParams::default()).await.expect("list SparkNodes").items {
        assert_eq!(spark.spec.shape_classes, [other.clone()], "{} was not asked to qualify the second key", spark.name_any());
    }
    assert!(fleet.snapshot().await.placed().is_empty());
    fleet.stop().await;
}

/// Flow 5: scaled to 1 through the `/scale` subresource → one replica (and its Pod) removed.
#[tokio::test(start_paused = true)]
async fn scaling_down_through_the_scale_subresource_removes_one_replica() {
    let fleet = Fleet::start(&three_nodes(true));
    serving_pair(&fleet).await;

    let scale = fleet
        .deployments()
        .patch_scale("qwen", &PatchParams::default(), &Patch::Merge(json!({ "spec": { "replicas": 1 } })))
        .await
        .expect("patch /scale");
    assert_eq!(scale.spec.and_then(|s| s.replicas), Some(1));

    // Equal nodes and both serving: the lowest name goes.
    let one = map(&[("qwen-1", "spark-2")]);
    fleet
        .until("scaled to one", 30, |s: &Snapshot| {
            (s.placed() == one && s.pod_nodes() == one && s.replicas.len() == 1 && s.settled(1, 1, "True")).then_some(())
        })
        .await;
    // And it stays one.
    fleet.let_pass(90).await;
    let s = fleet.snapshot().await;
    assert_eq!((s.placed(), s.counts()), (one, Some((1, 1))), "{}", s.describe());
    fleet.stop().await;
}

/// Flow 6: API faults on the controllers' writes (a 500 and a 409 on the replica create, a 500
/// on the Pod create and on the status write): the controllers retry and the flow converges to
/// the same state as without faults, with no duplicate replica.
#[tokio::test(start_paused = true)]
async fn the_flow_converges_through_injected_api_faults() {
    let fleet = Fleet::start(&three_nodes(true));
    let post = Some(http::Method::POST);
    fleet.double.fail_next(post.clone(), "/modelreplicas", 1, 500);
    fleet.double.fail_next(post.clone(), "/modelreplicas", 1, 409);
    fleet.double.fail_next(post, "/pods", 1, 500);
    fleet.double.fail_next(Some(http::Method::PATCH), "/modeldeployments/qwen/status", 1, 500);

    // 15 s is the controllers' wait after an API error: the budget allows a few of them.
    fleet.deploy(2).await;
    let want = map(&[("qwen-0", "spark-1"), ("qwen-1", "spark-2")]);
    assert_eq!(placed(&fleet, "two replicas placed despite the faults", 2, 120).await, want);
    pods_pinned(&fleet, "Pods created despite a failed create", &want).await;
    for pod in want.keys() {
        fleet.mark_ready(pod).await;
    }
    fleet.until("both serving", 120, |s: &Snapshot| s.settled(2, 2, "True").then_some(())).await;
    let s = fleet.snapshot().await;
    assert_eq!(s.replicas.len(), 2, "{}", s.describe());

    // The faults were met and retried: qwen-0's create was sent at least three times (500,
    // 409, success), a Pod create once more than there are Pods, the status write again.
    let log = fleet.double.requests();
    let creates_of = |plural: &str, name: &str| {
        log.iter()
            .filter(|r| r.method == http::Method::POST && r.path.ends_with(&format!("/namespaces/{NS}/{plural}")))
            .filter(|r| r.body.as_ref().and_then(|b| b.pointer("/metadata/name")).and_then(|n| n.as_str()) == Some(name))
            .count()
    };
    assert!(creates_of("modelreplicas", "qwen-0") >= 3, "{:#?}", fleet.double.request_lines());
    assert!(creates_of("pods", "qwen-0") + creates_of("pods", "qwen-1") >= 3, "{:#?}", fleet.double.request_lines());
    let status_writes = log.iter().filter(|r| r.method == http::Method::PATCH && r.path.ends_with("/modeldeployments/qwen/status")).count();
    assert!(status_writes >= 2, "{status_writes}");
    fleet.stop().await;
}

/// Deleting the deployment takes its replicas, their Pods and its Service with it (owner
/// references, as the API server's garbage collector follows them), and nothing is recreated.
#[tokio::test(start_paused = true)]
async fn deleting_the_deployment_removes_everything_it_made() {
    let fleet = Fleet::start(&three_nodes(true));
    serving_pair(&fleet).await;
    let services: Api<Service> = Api::namespaced(fleet.double.client(), NS);
    assert!(services.get_opt("qwen").await.expect("get Service").is_some());

    fleet.deployments().delete("qwen", &Default::default()).await.expect("delete ModelDeployment");
    fleet
        .until("replicas and Pods gone", 30, |s: &Snapshot| {
            (s.deployment.is_none() && s.replicas.is_empty() && s.pods.is_empty()).then_some(())
        })
        .await;
    fleet.let_pass(90).await;
    let s = fleet.snapshot().await;
    assert!(s.deployment.is_none() && s.replicas.is_empty() && s.pods.is_empty(), "{}", s.describe());
    assert!(services.get_opt("qwen").await.expect("get Service").is_none(), "the Service outlived its deployment");
    fleet.stop().await;
}

/// A node removed from the cluster: its replica is replaced on the spare node and deleted at
/// once (a replica on a node that is gone serves nobody).
#[tokio::test(start_paused = true)]
async fn a_replica_on_a_removed_node_is_replaced() {
    let fleet = Fleet::start(&three_nodes(true));
    serving_pair(&fleet).await;

    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(fleet.double.client());
    nodes.delete("spark-1", &Default::default()).await.expect("delete Node");
    let replaced = map(&[("qwen-1", "spark-2"), ("qwen-2", "spark-3")]);
    fleet
        .until("the gone node's replica replaced and deleted", 30, |s: &Snapshot| {
            (s.placed() == replaced && s.pod_nodes() == replaced && s.replicas.len() == 2 && s.settled(2, 1, "False")).then_some(())
        })
        .await;
    fleet.mark_ready("qwen-2").await;
    fleet.until("the replacement serving", 30, |s: &Snapshot| s.settled(2, 2, "True").then_some(())).await;
    fleet.stop().await;
}

/// Flow: a new engine build goes to one node first; its threshold test fails there, so the
/// canary is rolled back to the previous build and the other replica is never touched.
#[tokio::test(start_paused = true)]
async fn a_canary_that_fails_its_threshold_test_is_rolled_back() {
    let fleet = Fleet::start(&three_nodes(true));
    serving_pair(&fleet).await;
    let before = fleet.snapshot().await;
    let uid = |s: &Snapshot, name: &str| s.replicas.iter().find(|r| r.name_any() == name).and_then(|r| r.metadata.uid.clone());
    let revision = |s: &Snapshot, name: &str| s.replicas.iter().find(|r| r.name_any() == name).map(|r| r.spec.revision.clone());
    let old_revision = revision(&before, "qwen-0").expect("qwen-0");
    assert_eq!(revision(&before, "qwen-1").as_ref(), Some(&old_revision));
    let untouched = uid(&before, "qwen-1");

    // The admin rolls out a new engine build.
    let patch = json!({"spec": {"engine": {"image": "ghcr.io/brink/agent:0.3.0", "version": "0.3.0"}}});
    fleet.deployments().patch("qwen", &PatchParams::default(), &Patch::Merge(&patch)).await.expect("new engine build");

    // Exactly one replica is recreated at the new revision: the canary.
    let canary = fleet
        .until("a canary at the new revision", 60, |s: &Snapshot| {
            let new: Vec<&ModelReplica> =
                s.replicas.iter().filter(|r| r.metadata.deletion_timestamp.is_none() && r.spec.revision != old_revision).collect();
            (new.len() == 1).then(|| new[0].name_any())
        })
        .await;
    let s = fleet.snapshot().await;
    let rollout = s.deployment.as_ref().and_then(|d| d.status.as_ref()).and_then(|st| st.rollout.clone()).expect("status.rollout");
    assert_eq!((format!("{:?}", rollout.phase), rollout.canary_replica.as_deref()), ("Canary".to_string(), Some(canary.as_str())));
    assert_eq!(rollout.previous_revision.as_deref(), Some(old_revision.as_str()));
    let other = if canary == "qwen-0" { "qwen-1" } else { "qwen-0" };
    assert_eq!(revision(&s, other).as_ref(), Some(&old_revision), "{}", s.describe());
    let canary_uid = uid(&s, &canary);

    // The canary's engine starts and its replica's threshold test fails (the agent says so).
    let replicas: Api<ModelReplica> = Api::namespaced(fleet.double.client(), NS);
    let status = json!({
        "apiVersion": "brink.dev/v1alpha1", "kind": "ModelReplica", "metadata": {"name": canary},
        "status": {"conditions": [{"type": "Qualified", "status": "False", "reason": "ThresholdFailed",
                                   "message": "moe_gemm fails at 63 tokens", "lastTransitionTime": "2026-11-30T20:00:00Z"}]}
    });
    replicas.patch_status(&canary, &PatchParams::apply("brink-agent").force(), &Patch::Apply(&status)).await.expect("agent status");

    // Rolled back: the canary is recreated at the previous revision, the status says why.
    let s = fleet
        .until("the canary rolled back", 120, |s: &Snapshot| {
            let r = s.deployment.as_ref()?.status.as_ref()?.rollout.as_ref()?;
            (format!("{:?}", r.phase) == "RolledBack"
                && revision(s, &canary).as_ref() == Some(&old_revision)
                && uid(s, &canary) != canary_uid)
                .then(|| r.message.clone().unwrap_or_default())
        })
        .await;
    assert!(s.contains("moe_gemm fails at 63 tokens"), "{s}");
    let after = fleet.snapshot().await;
    assert_eq!(uid(&after, other), untouched, "the replica off the canary's node was never recreated: {}", after.describe());
    assert_eq!(after.placed().len(), 2, "{}", after.describe());
    // A rolled-back revision is not tried again while the spec asks for it.
    fleet.let_pass(120).await;
    let later = fleet.snapshot().await;
    assert!(later.replicas.iter().all(|r| r.spec.revision == old_revision), "{}", later.describe());
    fleet.stop().await;
}

/// The kubelet fails `pod`: phase `Failed` with its reason and message (an eviction, say).
async fn fail_pod(fleet: &Fleet, pod: &str, reason: &str, message: &str) {
    let status = json!({ "status": { "phase": "Failed", "reason": reason, "message": message,
                                     "conditions": [{ "type": "Ready", "status": "False" }] } });
    fleet.pods().patch_status(pod, &PatchParams::default(), &Patch::Merge(&status)).await.expect("Pod status");
}

fn pod_uid(s: &Snapshot, pod: &str) -> Option<String> {
    s.pods.iter().find(|p| p.name_any() == pod).and_then(|p| p.metadata.uid.clone())
}

/// Flow: the kubelet evicts a replica's Pod on a healthy node. The replica is marked Failed
/// and the deployment says why (Degraded, PodsFailing); after the 10 s backoff the failed Pod is
/// deleted and a new one created for the same replica on the same node; once it is ready the
/// deployment is back to its ready count and the failure record stays for the next backoff.
#[tokio::test(start_paused = true)]
async fn a_failed_replica_pod_is_replaced_and_the_deployment_recovers() {
    let fleet = Fleet::start(&three_nodes(true));
    serving_pair(&fleet).await;
    let pair = map(&[("qwen-0", "spark-1"), ("qwen-1", "spark-2")]);
    let first = pod_uid(&fleet.snapshot().await, "qwen-0").expect("qwen-0's Pod");

    fail_pod(&fleet, "qwen-0", "Evicted", "The node was low on resource: memory.").await;
    let degraded = fleet
        .until("the failure recorded and reported", 30, |s: &Snapshot| {
            (s.phase("qwen-0") == Some(ReplicaPhase::Failed) && s.settled(2, 1, "False"))
                .then(|| s.condition("Degraded").filter(|c| c.status == "True").cloned())
                .flatten()
        })
        .await;
    assert_eq!(degraded.reason, "PodsFailing");
    assert!(
        degraded.message.contains("qwen-0 (1 failed Pods in a row, last: Evicted: The node was low on resource: memory.)"),
        "{}",
        degraded.message
    );
    // Within the backoff the failed Pod stays (the controllers' clock has not moved), and the
    // replica is not moved: its node is healthy.
    fleet.let_pass(60).await;
    let s = fleet.snapshot().await;
    assert_eq!((pod_uid(&s, "qwen-0"), s.placed()), (Some(first.clone()), pair.clone()), "{}", s.describe());

    // Past the backoff: a new Pod for the same replica, on the same node.
    fleet.set_clock(NOW_S + 11);
    let second = fleet
        .until("a new Pod for qwen-0", 60, |s: &Snapshot| {
            pod_uid(s, "qwen-0").filter(|uid| *uid != first && s.pod_nodes() == pair && s.placed() == pair)
        })
        .await;
    assert_eq!(fleet.snapshot().await.phase("qwen-0"), Some(ReplicaPhase::Pending));
    fleet.mark_ready("qwen-0").await;
    let s = fleet
        .until("back to two ready", 30, |s: &Snapshot| {
            (s.settled(2, 2, "True") && s.condition("Degraded").is_some_and(|c| c.status == "False")).then(|| s.replicas.clone())
        })
        .await;
    let record = s.iter().find(|r| r.name_any() == "qwen-0").and_then(|r| r.status.as_ref()).and_then(|st| st.pod_failures.clone());
    let record = record.expect("the failure record stays until the Pod has served for a while");
    assert_eq!((record.count, record.pod_uid.as_str()), (1, first.as_str()));
    assert_eq!(pod_uid(&fleet.snapshot().await, "qwen-0"), Some(second));
    fleet.stop().await;
}

/// Flow (drainReplicas): two nodes, one replica on spark-1, and a SweepRun that drains
/// spark-1. The replacement is placed on spark-2 and serves before the drained replica is
/// deleted; spark-1 ends with no replica, and the run controller (running too) sees the node
/// empty and moves it from Draining to Running.
#[tokio::test(start_paused = true)]
async fn a_node_a_sweep_drains_hands_its_replica_to_another_node_first() {
    let fleet = Fleet::start(&[NodeSetup { name: "spark-1", qualified: true }, NodeSetup { name: "spark-2", qualified: true }]);
    fleet.deploy(1).await;
    let on_a = map(&[("qwen-0", "spark-1")]);
    assert_eq!(placed(&fleet, "one replica on spark-1", 1, 30).await, on_a);
    pods_pinned(&fleet, "its Pod", &on_a).await;
    fleet.mark_ready("qwen-0").await;
    fleet.until("serving", 30, |s: &Snapshot| s.settled(1, 1, "True").then_some(())).await;

    // The run starts draining spark-1 (its status as the run controller writes it).
    let runs: Api<SweepRun> = Api::namespaced(fleet.double.client(), NS);
    let run = common::draining_run("nightly-1", &[("spark-1", "Draining"), ("spark-2", "Waiting")]);
    let status = json!({ "status": run.status.clone() });
    let mut fresh = run.clone();
    fresh.metadata.uid = None;
    fresh.status = None;
    runs.create(&Default::default(), &fresh).await.expect("create SweepRun");
    runs.patch_status("nightly-1", &PatchParams::default(), &Patch::Merge(&status)).await.expect("SweepRun status");

    // Surge first: the replacement on spark-2, the drained replica still serving meanwhile.
    let both = map(&[("qwen-0", "spark-1"), ("qwen-1", "spark-2")]);
    assert_eq!(placed(&fleet, "a replacement on spark-2", 2, 30).await, both);
    pods_pinned(&fleet, "the replacement's Pod", &both).await;
    fleet.let_pass(60).await;
    let s = fleet.snapshot().await;
    assert_eq!((s.placed(), s.counts()), (both, Some((2, 1))), "{}", s.describe());

    fleet.mark_ready("qwen-1").await;
    let on_b = map(&[("qwen-1", "spark-2")]);
    fleet
        .until("the drained replica deleted once the replacement serves", 30, |s: &Snapshot| {
            (s.placed() == on_b && s.pod_nodes() == on_b && s.replicas.len() == 1 && s.settled(1, 1, "True")).then_some(())
        })
        .await;
    let started = tokio::time::Instant::now();
    loop {
        let run = runs.get("nightly-1").await.expect("get SweepRun");
        let node = run.status.as_ref().and_then(|s| s.nodes.iter().find(|n| n.node == "spark-1").map(|n| n.state));
        if node == Some(NodeRunState::Running) {
            break;
        }
        assert!(started.elapsed() < std::time::Duration::from_secs(120), "spark-1 stays {node:?}: {run:?}");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    // Swept: spark-1 takes no replica while the run is on it.
    fleet.let_pass(60).await;
    let s = fleet.snapshot().await;
    assert_eq!(s.placed(), on_b, "{}", s.describe());
    fleet.stop().await;
}
