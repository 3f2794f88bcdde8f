//! The ModelReplica controller against a mocked API server: the exact Pod a replica gets, a
//! Pod recreated when it differs, the phase taken from the Pod only while the agent has not
//! written one, and API errors.

mod common;

use std::sync::Arc;
use std::time::Duration;

use brink_api::crd::{ModelReplica, PodFailures, ReplicaPhase};
use brink_operator::controllers::{Error, replica};
use common::*;
use k8s_openapi::api::core::v1::{Pod, PodCondition, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, Time};
use k8s_openapi::jiff::Timestamp;
use kube::runtime::controller::Action;
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
                "--served-model-name", "qwen",
                "--backend", "cuda", "--model-test", "--qualification-dir", "/var/lib/brink/node"
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
                { "name": "state", "mountPath": "/var/lib/brink/state" },
                { "name": "node-state", "mountPath": "/var/lib/brink/node" }
            ]
        }],
        "volumes": [
            { "name": "model-cache", "hostPath": { "path": "/var/lib/brink/cache", "type": "Directory" } },
            { "name": "state", "emptyDir": {} },
            { "name": "node-state", "hostPath": { "path": "/var/lib/brink/state", "type": "DirectoryOrCreate" } }
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
            assert_eq!(b["metadata"]["labels"]["brink.dev/model"], "qwen");
            assert_eq!(b["metadata"]["labels"]["app.kubernetes.io/name"], "brink-replica");
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
    pod.metadata.uid = Some("pod-1".into());
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
        failure_apply("Failed", Some(failures(1, NOW_S, "pod-1", "container engine: ImagePullBackOff: manifest unknown"))),
        Expect::event("PodFailed", "qwen-0").check(|b| {
            assert_eq!(b["type"], "Warning");
            assert_eq!(
                b["note"],
                "Pod qwen-0 on node spark-1 failed: container engine: ImagePullBackOff: manifest unknown; failure 1 in a row, a new Pod in 10 s"
            );
        }),
    ];
    let (r, _) = scenario(handle, script, replica::reconcile(Arc::new(reported), ctx)).await;
    assert_eq!(format!("{:?}", r.expect("reconcile")), format!("{:?}", Action::requeue(Duration::from_secs(10))));
}

/// `status.podFailures` as the operator writes it.
fn failures(count: u32, at_s: i64, uid: &str, message: &str) -> PodFailures {
    PodFailures {
        count,
        last_failure_time: Time(Timestamp::from_second(at_s).expect("valid time")),
        pod_uid: uid.into(),
        message: message.into(),
    }
}

/// The status apply of `phase` with exactly `record` (absent: the record is cleared).
fn failure_apply(phase: &'static str, record: Option<PodFailures>) -> Expect {
    Expect::new("PATCH", REPLICA_STATUS)
        .query("fieldManager", "brink-operator")
        .query("force", "true")
        .check(move |b| {
            let mut want = json!({ "phase": phase });
            if let Some(r) = &record {
                want["podFailures"] = serde_json::to_value(r).expect("JSON");
            }
            assert_eq!(b["status"], want);
        })
        .reply(Reply::EchoOnto(serde_json::to_value(replica("qwen-0", "spark-1", None)).expect("JSON")))
}

/// The created Pod (uid `pod-1`) with `status`.
async fn pod_with(status: Value) -> Value {
    let mut pod = created_pod().await;
    pod.metadata.uid = Some("pod-1".into());
    pod.status = Some(serde_json::from_value(status).expect("PodStatus"));
    serde_json::to_value(&pod).expect("JSON")
}

fn evicted() -> Value {
    json!({ "phase": "Failed", "reason": "Evicted", "message": "The node was low on resource: memory." })
}

fn with_record(phase: ReplicaPhase, record: PodFailures) -> ModelReplica {
    let mut r = replica("qwen-0", "spark-1", Some(phase));
    if let Some(s) = r.status.as_mut() {
        s.pod_failures = Some(record);
    }
    r
}

#[tokio::test]
async fn an_evicted_pod_is_recorded_and_replaced_after_a_growing_backoff() {
    let world = World::qualified_fleet(1);
    let pod = pod_with(evicted()).await;
    let why = "Evicted: The node was low on resource: memory.";

    // Seen for the first time after two earlier Pods failed: the third in a row, 40 s.
    let (ctx, handle) = context(&world);
    let earlier = with_record(ReplicaPhase::Pending, failures(2, NOW_S - 300, "pod-0", "OOMKilled"));
    let script = vec![
        Expect::new("GET", POD).reply(Reply::Json(pod.clone())),
        failure_apply("Failed", Some(failures(3, NOW_S, "pod-1", why))),
        Expect::event("PodFailed", "qwen-0")
            .check(|b| assert!(b["note"].as_str().unwrap_or_default().ends_with("failure 3 in a row, a new Pod in 40 s"))),
    ];
    let (r, _) = scenario(handle, script, replica::reconcile(Arc::new(earlier), ctx)).await;
    assert_eq!(format!("{:?}", r.expect("reconcile")), format!("{:?}", Action::requeue(Duration::from_secs(40))));

    // Within its backoff: nothing is written, the reconcile comes back when it ends.
    let (ctx, handle) = context(&world);
    let waiting = with_record(ReplicaPhase::Failed, failures(3, NOW_S - 15, "pod-1", why));
    let (r, seen) =
        scenario(handle, vec![Expect::new("GET", POD).reply(Reply::Json(pod.clone()))], replica::reconcile(Arc::new(waiting), ctx)).await;
    assert_eq!(format!("{:?}", r.expect("reconcile")), format!("{:?}", Action::requeue(Duration::from_secs(25))));
    assert_eq!(seen.len(), 1);

    // The backoff is over: the failed Pod (that uid only) goes, the replica is Pending again
    // with its record kept, and the next reconcile creates the new Pod.
    let (ctx, handle) = context(&world);
    let due = with_record(ReplicaPhase::Failed, failures(3, NOW_S - 40, "pod-1", why));
    let script = vec![
        Expect::new("GET", POD).reply(Reply::Json(pod.clone())),
        Expect::new("DELETE", POD)
            .check(|b| {
                assert_eq!(b["propagationPolicy"], "Background");
                assert_eq!(b["preconditions"]["uid"], "pod-1");
            })
            .reply(Reply::Json(pod.clone())),
        failure_apply("Pending", Some(failures(3, NOW_S - 40, "pod-1", why))),
        Expect::event("PodReplaced", "qwen-0").check(|b| assert_eq!(b["type"], "Normal")),
    ];
    let (r, _) = scenario(handle, script, replica::reconcile(Arc::new(due), ctx)).await;
    assert_eq!(format!("{:?}", r.expect("reconcile")), format!("{:?}", Action::requeue(Duration::from_secs(1))));

    // A Pod of that name that is not the failed one (409 on the uid precondition): decide again.
    let (ctx, handle) = context(&world);
    let due = with_record(ReplicaPhase::Failed, failures(3, NOW_S - 40, "pod-1", why));
    let script = vec![
        Expect::new("GET", POD).reply(Reply::Json(pod)),
        Expect::new("DELETE", POD).reply(Reply::Fail(409, "Precondition failed: UID in precondition: pod-1, UID in object meta: pod-2")),
    ];
    let (r, seen) = scenario(handle, script, replica::reconcile(Arc::new(due), ctx)).await;
    assert_eq!(format!("{:?}", r.expect("reconcile")), format!("{:?}", Action::requeue(Duration::from_secs(1))));
    assert_eq!(seen.len(), 2);
}

#[tokio::test]
async fn a_pod_not_ready_long_after_serving_has_failed() {
    let world = World::qualified_fleet(1);
    let not_ready_since = |age_s: i64| {
        json!({ "phase": "Running", "conditions": [{ "type": "Ready", "status": "False",
                "lastTransitionTime": Timestamp::from_second(NOW_S - age_s).expect("time").to_string() }] })
    };
    // 130 s not ready after it served (threshold 120 s): failed.
    let (ctx, handle) = context(&world);
    let script = vec![
        Expect::new("GET", POD).reply(Reply::Json(pod_with(not_ready_since(130)).await)),
        failure_apply("Failed", Some(failures(1, NOW_S, "pod-1", "not ready for 130 s after it served"))),
        Expect::event("PodFailed", "qwen-0"),
    ];
    let (r, _) =
        scenario(handle, script, replica::reconcile(Arc::new(replica("qwen-0", "spark-1", Some(ReplicaPhase::Serving))), ctx)).await;
    r.expect("reconcile");

    // 100 s is within the threshold; and a replica that never served is still loading.
    for (age, phase) in [(100, ReplicaPhase::Serving), (1000, ReplicaPhase::Loading)] {
        let (ctx, handle) = context(&world);
        let (r, seen) = scenario(
            handle,
            vec![Expect::new("GET", POD).reply(Reply::Json(pod_with(not_ready_since(age)).await))],
            replica::reconcile(Arc::new(replica("qwen-0", "spark-1", Some(phase))), ctx),
        )
        .await;
        r.expect("reconcile");
        assert_eq!(seen.len(), 1, "{age} s, {phase:?}");
    }
}

#[tokio::test]
async fn a_pod_that_serves_for_ten_minutes_clears_the_record() {
    let world = World::qualified_fleet(1);
    let ready_since = |age_s: i64| {
        json!({ "phase": "Running", "conditions": [{ "type": "Ready", "status": "True",
                "lastTransitionTime": Timestamp::from_second(NOW_S - age_s).expect("time").to_string() }] })
    };
    let record = failures(4, NOW_S - 3600, "pod-0", "OOMKilled");
    let (ctx, handle) = context(&world);
    let script = vec![Expect::new("GET", POD).reply(Reply::Json(pod_with(ready_since(600)).await)), failure_apply("Serving", None)];
    let (r, _) = scenario(handle, script, replica::reconcile(Arc::new(with_record(ReplicaPhase::Serving, record.clone())), ctx)).await;
    r.expect("reconcile");

    // Serving for less: the record stays, and a phase written meanwhile carries it (an apply
    // without it would remove it).
    let (ctx, handle) = context(&world);
    let script =
        vec![Expect::new("GET", POD).reply(Reply::Json(pod_with(ready_since(30)).await)), failure_apply("Serving", Some(record.clone()))];
    let (r, _) = scenario(handle, script, replica::reconcile(Arc::new(with_record(ReplicaPhase::Pending, record)), ctx)).await;
    r.expect("reconcile");
}

#[tokio::test]
async fn the_deployments_scheduling_reaches_the_pod() {
    let world = World::qualified_fleet(1);
    let (ctx, handle) = context(&world);
    let mut r = replica("qwen-0", "spark-1", None);
    let scheduling = json!({
        "tolerations": [{ "key": "dedicated", "operator": "Equal", "value": "inference", "effect": "NoSchedule" },
                        { "key": "brink.dev/maintenance", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300 }],
        "nodeSelector": { "pool": "inference" },
        "priorityClassName": "inference-high"
    });
    r.metadata.annotations.get_or_insert_default().insert("brink.dev/pod-scheduling".into(), scheduling.to_string());
    let want = scheduling.clone();
    let script = vec![
        Expect::new("GET", POD).reply(Reply::NotFound),
        Expect::new("POST", PODS).check(move |b| {
            assert_eq!(b["spec"]["tolerations"], want["tolerations"]);
            assert_eq!(b["spec"]["nodeSelector"], want["nodeSelector"]);
            assert_eq!(b["spec"]["priorityClassName"], "inference-high");
            assert_eq!(b["spec"]["nodeName"], "spark-1");
            assert_eq!(b["metadata"]["labels"]["brink.dev/model"], "qwen");
        }),
        phase_apply("Pending"),
    ];
    let (res, _) = scenario(handle, script, replica::reconcile(Arc::new(r.clone()), ctx)).await;
    res.expect("reconcile");

    // An annotation that is not a scheduling record is an error naming it, not a Pod without it.
    r.metadata.annotations.get_or_insert_default().insert("brink.dev/pod-scheduling".into(), "{\"tolerations\": 3}".into());
    let (ctx, handle) = context(&world);
    let script = vec![Expect::event("ReconcileFailed", "qwen-0")];
    let (res, _) = scenario(handle, script, replica::reconcile(Arc::new(r), ctx)).await;
    let err = res.expect_err("bad annotation");
    assert!(err.to_string().contains("annotation brink.dev/pod-scheduling is not a scheduling record"), "{err}");
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

/// A replica on another engine publishes its engine's API as `podIP:port` of its leader Pod (a
/// deployment's sweep measures it there); brink's own replicas and Pods without an IP do not.
#[test]
fn another_engines_replica_publishes_its_leader_pods_address_and_engine_port() {
    let config = brink_operator::controllers::Config::default();
    let replica = |kind: &str, port: Option<u16>| -> ModelReplica {
        let mut engine = serde_json::json!({ "image": "img:1", "version": "1", "kind": kind });
        if let Some(p) = port {
            engine["port"] = p.into();
        }
        serde_json::from_value(serde_json::json!({
            "apiVersion": "brink.dev/v1alpha1", "kind": "ModelReplica",
            "metadata": { "name": "d-0", "namespace": "llm" },
            "spec": {
                "deployment": "d", "node": "spark-1", "model": "m", "revision": "r1", "engine": engine,
                "serving": { "context": 4096, "maxBatchTokens": 8192, "prefillChunk": 2048, "concurrency": 4, "kvFraction": 0.5 }
            }
        }))
        .expect("replica")
    };
    let pod =
        |ip: Option<&str>| Pod { status: Some(PodStatus { pod_ip: ip.map(str::to_string), ..PodStatus::default() }), ..Pod::default() };
    let cases = [
        (replica("vllm", None), Some(pod(Some("10.1.2.3"))), Some("10.1.2.3:8000")),
        (replica("sglang", None), Some(pod(Some("10.1.2.3"))), Some("10.1.2.3:30000")),
        (replica("llamacpp", Some(9090)), Some(pod(Some("fd00::7"))), Some("[fd00::7]:9090")),
        (replica("llamacpp", None), Some(pod(None)), None),
        (replica("llamacpp", None), Some(pod(Some(""))), None),
        (replica("vllm", None), None, None),
        (replica("brink", None), Some(pod(Some("10.1.2.3"))), None),
    ];
    for (r, p, want) in cases {
        let kind = r.spec.engine.kind;
        assert_eq!(replica::engine_endpoint(&r, p.as_ref(), &config).as_deref(), want, "{kind:?}");
    }
}
