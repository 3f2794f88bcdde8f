//! The ModelReplica controller against a mocked API server: the exact Pod a replica gets, a
//! Pod recreated when it differs, the phase taken from the Pod only while the agent has not
//! written one, and API errors.

mod common;

use std::sync::Arc;

use brink_api::crd::ReplicaPhase;
use brink_operator::controllers::{Error, replica};
use common::*;
use k8s_openapi::api::core::v1::{Pod, PodCondition, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
use serde_json::{Value, json};

const POD: &str = "/api/v1/namespaces/llm/pods/qwen-0";
const PODS: &str = "/api/v1/namespaces/llm/pods";
const REPLICA_STATUS: &str = "/apis/brink.dev/v1alpha1/namespaces/llm/modelreplicas/qwen-0/status";

/// The Pod body `qwen-0` on spark-1 must create, field by field.
fn expected_pod_spec() -> Value {
    let probe = |path: &str, period: i32, failures: i32| json!({ "httpGet": { "path": path, "port": "http" }, "periodSeconds": period, "failureThreshold": failures, "timeoutSeconds": 5 });
    json!({
        "nodeName": "spark-1",
        "runtimeClassName": "nvidia",
        "terminationGracePeriodSeconds": 45,
        "containers": [{
            "name": "engine",
            "image": "ghcr.io/brink/agent:0.2.0",
            "command": [
                "brink-agent", "serve",
                "--model", format!("/var/lib/brink/cache/models/{}.gguf", "ab".repeat(32)),
                "--host", "0.0.0.0", "--port", "8080",
                "--context", "32768", "--max-batch-tokens", "8192", "--prefill-chunk", "2048", "--slots", "4",
                "--served-model-name", "qwen"
            ],
            "ports": [{ "name": "http", "containerPort": 8080 }],
            "env": [
                { "name": "POD_NAME", "valueFrom": { "fieldRef": { "fieldPath": "metadata.name" } } },
                { "name": "POD_NAMESPACE", "valueFrom": { "fieldRef": { "fieldPath": "metadata.namespace" } } },
                { "name": "NODE_NAME", "valueFrom": { "fieldRef": { "fieldPath": "spec.nodeName" } } },
                { "name": "BRINK_REPLICA", "value": "qwen-0" },
                { "name": "BRINK_STATE_DIR", "value": "/var/lib/brink/state" },
                { "name": "NVIDIA_VISIBLE_DEVICES", "value": "all" },
                { "name": "NVIDIA_DRIVER_CAPABILITIES", "value": "compute,utility" }
            ],
            "resources": { "requests": { "memory": REPLICA_BYTES.to_string() } },
            "startupProbe": probe("/ready", 10, 180),
            "readinessProbe": probe("/ready", 5, 2),
            "livenessProbe": probe("/live", 10, 6),
            "volumeMounts": [
                { "name": "model-cache", "mountPath": "/var/lib/brink/cache", "readOnly": true },
                { "name": "state", "mountPath": "/var/lib/brink/state" }
            ]
        }],
        "volumes": [
            { "name": "model-cache", "hostPath": { "path": "/var/lib/brink/cache", "type": "Directory" } },
            { "name": "state", "emptyDir": {} }
        ]
    })
}

fn phase_apply(phase: &'static str) -> Expect {
    Expect::new("PATCH", REPLICA_STATUS)
        .query("fieldManager", "brink-operator")
        .query("force", "true")
        .check(move |b| {
            assert_eq!(b["kind"], "ModelReplica");
            // Only the phase: every other status field is the agent's.
            assert_eq!(b["status"], json!({ "phase": phase }));
        })
        .reply(Reply::EchoOnto(serde_json::to_value(replica("qwen-0", "spark-1", None)).expect("JSON")))
}

/// The Pod the controller created for `qwen-0`, as the server would return it.
async fn created_pod() -> Pod {
    let world = World::qualified_fleet(1);
    let (ctx, handle) = context(&world);
    let script = vec![Expect::new("GET", POD).reply(Reply::NotFound), Expect::new("POST", PODS), phase_apply("Pending")];
    let (r, seen) = scenario(handle, script, replica::reconcile(Arc::new(replica("qwen-0", "spark-1", None)), ctx)).await;
    r.expect("reconcile");
    serde_json::from_value(seen[1].body.clone()).expect("a Pod")
}

#[tokio::test]
async fn a_replica_gets_exactly_its_pod() {
    let world = World::qualified_fleet(1);
    let (ctx, handle) = context(&world);
    let script = vec![
        Expect::new("GET", POD).reply(Reply::NotFound),
        Expect::new("POST", PODS).query("fieldManager", "brink-operator").check(|b| {
            assert_eq!(b["kind"], "Pod");
            assert_eq!(b["metadata"]["name"], "qwen-0");
            assert_eq!(b["metadata"]["labels"]["brink.dev/deployment"], "qwen");
            assert_eq!(b["metadata"]["labels"]["brink.dev/replica"], "qwen-0");
            assert_eq!(b["metadata"]["labels"]["brink.dev/revision"], revision());
            let owner = &b["metadata"]["ownerReferences"][0];
            assert_eq!(
                (owner["kind"].as_str(), owner["name"].as_str(), owner["uid"].as_str()),
                (Some("ModelReplica"), Some("qwen-0"), Some("uid-qwen-0"))
            );
            assert_eq!(owner["controller"], true);
            assert_eq!(b["metadata"]["annotations"]["brink.dev/pod-spec-hash"].as_str().map(str::len), Some(16));
            assert_eq!(b["spec"], expected_pod_spec(), "pod spec: {}", serde_json::to_string_pretty(&b["spec"]).unwrap_or_default());
        }),
        phase_apply("Pending"),
    ];
    let (r, _) = scenario(handle, script, replica::reconcile(Arc::new(replica("qwen-0", "spark-1", None)), ctx)).await;
    r.expect("reconcile");
}

#[tokio::test]
async fn a_clamped_replica_serves_under_its_own_limits() {
    let world = World::qualified_fleet(1);
    let (ctx, handle) = context(&world);
    let mut clamped = replica("qwen-0", "spark-1", None);
    clamped.spec.serving.max_batch_tokens = 4096;
    clamped.spec.serving.prefill_chunk = 1024;
    let script = vec![
        Expect::new("GET", POD).reply(Reply::NotFound),
        Expect::new("POST", PODS).check(|b| {
            let cmd: Vec<&str> = b["spec"]["containers"][0]["command"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
            let after = |flag: &str| cmd.iter().position(|a| *a == flag).and_then(|i| cmd.get(i + 1)).copied();
            assert_eq!((after("--max-batch-tokens"), after("--prefill-chunk")), (Some("4096"), Some("1024")), "{cmd:?}");
        }),
        phase_apply("Pending"),
    ];
    let (r, _) = scenario(handle, script, replica::reconcile(Arc::new(clamped), ctx)).await;
    r.expect("reconcile");
}

#[tokio::test]
async fn a_pod_that_differs_is_deleted_for_recreation() {
    let mut old = created_pod().await;
    old.metadata.annotations = Some([("brink.dev/pod-spec-hash".to_string(), "0000000000000000".to_string())].into());
    let world = World::qualified_fleet(1);
    let (ctx, handle) = context(&world);
    let script = vec![
        Expect::new("GET", POD).reply(Reply::Json(serde_json::to_value(&old).expect("JSON"))),
        Expect::new("DELETE", POD)
            .check(|b| assert_eq!(b["propagationPolicy"], "Foreground"))
            .reply(Reply::Json(serde_json::to_value(&old).expect("JSON"))),
        Expect::event("PodRecreated", "qwen-0"),
    ];
    let (r, _) =
        scenario(handle, script, replica::reconcile(Arc::new(replica("qwen-0", "spark-1", Some(ReplicaPhase::Pending))), ctx)).await;
    r.expect("reconcile");
}

#[tokio::test]
async fn a_ready_pod_makes_the_replica_serving_unless_the_agent_reports() {
    let mut pod = created_pod().await;
    pod.status = Some(PodStatus {
        phase: Some("Running".into()),
        conditions: Some(vec![PodCondition { type_: "Ready".into(), status: "True".into(), ..PodCondition::default() }]),
        ..PodStatus::default()
    });
    let pod_json = serde_json::to_value(&pod).expect("JSON");

    let world = World::qualified_fleet(1);
    let (ctx, handle) = context(&world);
    let script = vec![Expect::new("GET", POD).reply(Reply::Json(pod_json.clone())), phase_apply("Serving")];
    let (r, _) =
        scenario(handle, script, replica::reconcile(Arc::new(replica("qwen-0", "spark-1", Some(ReplicaPhase::Pending))), ctx)).await;
    r.expect("reconcile");

    // The agent wrote `SelfTesting` (its own manager on the status): the Pod's readiness does not override it.
    let mut reported = replica("qwen-0", "spark-1", Some(ReplicaPhase::SelfTesting));
    reported.metadata.managed_fields = Some(vec![ManagedFieldsEntry {
        manager: Some("brink-agent".into()),
        operation: Some("Apply".into()),
        subresource: Some("status".into()),
        ..ManagedFieldsEntry::default()
    }]);
    let (ctx, handle) = context(&world);
    let (r, seen) =
        scenario(handle, vec![Expect::new("GET", POD).reply(Reply::Json(pod_json))], replica::reconcile(Arc::new(reported), ctx)).await;
    r.expect("reconcile");
    assert_eq!(seen.len(), 1);
}

#[tokio::test]
async fn a_pod_that_cannot_pull_its_image_fails_the_replica() {
    let mut pod = created_pod().await;
    pod.status = Some(
        serde_json::from_value(json!({
            "phase": "Running",
            "containerStatuses": [{
                "name": "engine", "ready": false, "restartCount": 0, "image": "x", "imageID": "",
                "state": { "waiting": { "reason": "ImagePullBackOff", "message": "manifest unknown" } }
            }]
        }))
        .expect("PodStatus"),
    );
    let world = World::qualified_fleet(1);
    let (ctx, handle) = context(&world);
    let mut reported = replica("qwen-0", "spark-1", Some(ReplicaPhase::Downloading));
    reported.metadata.managed_fields = Some(vec![ManagedFieldsEntry {
        manager: Some("brink-agent".into()),
        subresource: Some("status".into()),
        ..ManagedFieldsEntry::default()
    }]);
    let script = vec![
        Expect::new("GET", POD).reply(Reply::Json(serde_json::to_value(&pod).expect("JSON"))),
        phase_apply("Failed"),
        Expect::event("Failed", "qwen-0").check(|b| assert_eq!(b["note"], "container engine: ImagePullBackOff: manifest unknown")),
    ];
    let (r, _) = scenario(handle, script, replica::reconcile(Arc::new(reported), ctx)).await;
    r.expect("reconcile");
}

#[tokio::test]
async fn a_foreign_pod_of_the_same_name_is_left_alone_and_reported() {
    let mut pod = created_pod().await;
    pod.metadata.owner_references = None;
    let world = World::qualified_fleet(1);
    let (ctx, handle) = context(&world);
    let script = vec![
        Expect::new("GET", POD).reply(Reply::Json(serde_json::to_value(&pod).expect("JSON"))),
        Expect::event("ReconcileFailed", "qwen-0").check(|b| {
            let note = b["note"].as_str().unwrap_or_default();
            assert!(note.contains("a Pod named qwen-0 exists and is not controlled by this replica"), "{note}");
        }),
    ];
    let (r, _) = scenario(handle, script, replica::reconcile(Arc::new(replica("qwen-0", "spark-1", None)), ctx)).await;
    assert!(matches!(r, Err(Error::InvalidSpec { .. })), "{r:?}");
}

#[tokio::test]
async fn a_server_error_on_pod_create_fails_the_reconcile() {
    let world = World::qualified_fleet(1);
    let (ctx, handle) = context(&world);
    let script = vec![
        Expect::new("GET", POD).reply(Reply::NotFound),
        Expect::new("POST", PODS).reply(Reply::Fail(500, "admission webhook timed out")),
        Expect::event("ReconcileFailed", "qwen-0"),
    ];
    let (r, _) = scenario(handle, script, replica::reconcile(Arc::new(replica("qwen-0", "spark-1", None)), ctx.clone())).await;
    let err = r.expect_err("a 500 fails");
    assert!(err.to_string().starts_with("creating Pod llm/qwen-0:") && err.to_string().contains("admission webhook timed out"), "{err}");
    assert!(
        ctx.metrics
            .render()
            .expect("metrics")
            .contains("brink_operator_reconcile_errors_total{controller=\"modelreplica\",kind=\"api\"} 1")
    );
}
