//! What a replica Pod proved before `/ready`, through the in-memory API double: the report its
//! `serve --model-test` keeps under the node's state directory (a model-level case failing
//! below a passing count, so the Pod is held not ready) is published in its `ModelReplica`'s
//! status with the failing case; the report of the Pod recreated on the node (which reused
//! the node's result) replaces it; a replica of another node is not touched; the download
//! progress the agent writes under its own manager leaves the report in place.

use brink_api::DeviceReport;
use brink_api::crd::{FailingCase, ModelReplica, ReplicaQualification};
use brink_kube_double::KubeDouble;
use k8s_openapi::jiff::Timestamp;
use serde_json::json;

use super::*;
use crate::model_cache::{CacheConfig, ModelCache};
use crate::qualify::replica;

fn seed_replica(double: &KubeDouble, name: &str, node: &str) {
    double
        .seed_value(json!({
            "apiVersion": "brink.dev/v1alpha1", "kind": "ModelReplica",
            "metadata": { "name": name, "namespace": "ai" },
            "spec": {
                "deployment": "chat", "node": node, "model": "m", "revision": "r1",
                "engine": { "image": "brink:1", "version": "0.1.0" },
                "serving": { "context": 4096, "maxBatchTokens": 8192, "prefillChunk": 2048, "concurrency": 4, "kvFraction": 0.5 }
            }
        }))
        .unwrap();
}

fn held() -> ReplicaQualification {
    let case = FailingCase { id: "model/single/t1".into(), kernel: "model/single".into(), tokens: 1, detail: "injected failure".into() };
    ReplicaQualification {
        shape_class: "qwen3moe-h256-e16-top4-ffn256-0123456789abcdef".into(),
        model_test_state: "disqualified".into(),
        model_test_message: "DISQUALIFIED: model/single fails at 1 tokens but 12 tokens pass".into(),
        reused: false,
        failing_cases: vec![case],
        model_test_seconds: Some(4.5),
        held: Some("model-level threshold test disqualified: model/single fails at 1 tokens".into()),
        ready_check: Some("failed: model-level threshold test disqualified".into()),
        seconds_to_ready: None,
        ..ReplicaQualification::default()
    }
}

#[tokio::test]
async fn a_held_replicas_failing_case_reaches_its_status_and_a_recreated_pods_report_replaces_it() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let double = KubeDouble::new();
    double
        .seed_value(json!({ "apiVersion": "brink.dev/v1alpha1", "kind": "SparkNode", "metadata": { "name": "n1" }, "spec": {} }))
        .unwrap();
    double
        .seed_value(json!({
            "apiVersion": "brink.dev/v1alpha1", "kind": "Model",
            "metadata": { "name": "m", "namespace": "ai" },
            "spec": { "source": { "https": { "url": "http://127.0.0.1:9/m.gguf" } }, "sha256": "ab".repeat(32), "format": "gguf" }
        }))
        .unwrap();
    seed_replica(&double, "chat-0", "n1");
    seed_replica(&double, "chat-1", "n2");
    // Both Pods wrote reports on their nodes; n2's is in this directory too, as a stray file.
    replica::write_json(&replica::report_path(&state, "ai", "chat-0"), &held()).unwrap();
    replica::write_json(&replica::report_path(&state, "ai", "chat-1"), &held()).unwrap();

    let probes = Probes { now: Arc::new(|| Timestamp::from_second(NOW).unwrap()), memory: Arc::new(|| Some(memory())) };
    let node = NodeState::new(DeviceReport::none("no CUDA driver (libcuda.so) on this machine"), node_fingerprint(), None);
    let settings = Settings { replica_reports: Some(state.clone()), ..settings(std::path::Path::new("/mnt/pvc")) };
    let agent = Agent::new(double.client(), settings, probes, node);
    let replicas = || -> Vec<ModelReplica> { ["chat-0", "chat-1"].iter().map(|n| double.get(Some("ai"), n).unwrap()).collect() };

    agent.publish_replica_reports(&replicas()).await.unwrap();
    let status = |name: &str| double.get::<ModelReplica>(Some("ai"), name).unwrap().status.and_then(|s| s.qualification);
    let q = status("chat-0").expect("n1's replica has its report");
    assert_eq!((q.model_test_state.as_str(), q.failing_cases[0].id.as_str()), ("disqualified", "model/single/t1"));
    assert!(q.held.is_some());
    assert_eq!(status("chat-1"), None, "another node's replica is that node's agent's");

    // Unchanged: nothing written again.
    let rv = double.get::<ModelReplica>(Some("ai"), "chat-0").unwrap().metadata.resource_version;
    agent.publish_replica_reports(&replicas()).await.unwrap();
    assert_eq!(double.get::<ModelReplica>(Some("ai"), "chat-0").unwrap().metadata.resource_version, rv);

    // The Pod is recreated; its serve reused the node's result (the fault is gone) and is ready.
    let ready = ReplicaQualification {
        model_test_state: "qualified".into(),
        model_test_message: "QUALIFIED up to 12 tokens".into(),
        reused: true,
        failing_cases: vec![],
        model_test_seconds: None,
        held: None,
        ready_check: Some("passed: backend truth: cpu: pid 7 runs on the cpu backend, as asked".into()),
        seconds_to_ready: Some(1.5),
        ..held()
    };
    replica::write_json(&replica::report_path(&state, "ai", "chat-0"), &ready).unwrap();
    agent.publish_replica_reports(&replicas()).await.unwrap();
    assert_eq!(status("chat-0"), Some(ready.clone()));

    // The model-cache round writes the replica's download progress under the node's manager;
    // the report (another manager's) stays.
    let cache = ModelCache::open(CacheConfig::new(dir.path().join("cache"), 1 << 30)).unwrap();
    let _ = agent.sync_models(&cache).await;
    assert_eq!(status("chat-0"), Some(ready));
}
