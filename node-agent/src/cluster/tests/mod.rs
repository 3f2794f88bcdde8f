//! The agent's Kubernetes I/O against a mocked API server (kube-rs's controller-rs pattern:
//! `tower_test::mock::pair` behind a real `kube::Client`). Each scenario lists the exact
//! requests the agent must send (method, path and query, the body's essentials) and answers
//! them; a missing request fails after a timeout instead of hanging, and a request the scenario
//! does not expect fails the test.

mod download;
mod facts;
mod facts_flow;
mod lease_renew;
mod model_reuse_flow;
mod qualify;
mod replica_report_flow;
mod run_loop;
mod start;

use std::sync::Arc;
use std::time::Duration;

use brink_api::crd::NodeFingerprint;
use brink_api::{DeviceReport, UnifiedMemory};
use http::{Request, Response};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::client::Body;
use serde_json::{Value, json};

use super::agent::{Agent, Probes, Settings};
use super::node_status::NodeState;

pub const URL: &str = "https://k8s.test:6443";
/// The fixed clock: 2027-01-15T08:00:00Z.
pub const NOW: i64 = 1_800_000_000;
pub const NOW_TEXT: &str = "2027-01-15T08:00:00Z";

type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

/// The mocked API server's side.
pub struct ApiServer(Handle);

/// A request as the agent sent it.
pub struct Seen {
    pub content_type: Option<String>,
    pub body: Value,
}

impl ApiServer {
    /// Waits for the next request, checks its method and path with query, answers `status`
    /// with `answer`, and returns what was sent.
    pub async fn expect(&mut self, method: &str, path_and_query: &str, status: u16, answer: Value) -> Seen {
        let (request, send) = tokio::time::timeout(Duration::from_secs(10), self.0.next_request())
            .await
            .unwrap_or_else(|_| panic!("timed out waiting for {method} {path_and_query}"))
            .unwrap_or_else(|| panic!("the client was dropped before {method} {path_and_query}"));
        let got = format!("{} {}", request.method(), request.uri().path_and_query().map(|p| p.as_str()).unwrap_or(""));
        assert_eq!(got, format!("{method} {path_and_query}"), "unexpected request");
        let content_type = request.headers().get(http::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).map(String::from);
        let bytes = request.into_body().collect_bytes().await.unwrap();
        let body = if bytes.is_empty() { Value::Null } else { serde_json::from_slice(&bytes).unwrap() };
        send.send_response(Response::builder().status(status).body(Body::from(serde_json::to_vec(&answer).unwrap())).unwrap());
        Seen { content_type, body }
    }

    /// Fails the next request with a transport error (the API server cannot be reached).
    pub async fn fail_transport(&mut self, method: &str, path_and_query: &str) {
        let (request, send) = tokio::time::timeout(Duration::from_secs(10), self.0.next_request()).await.unwrap().unwrap();
        assert_eq!(format!("{} {}", request.method(), request.uri().path_and_query().unwrap()), format!("{method} {path_and_query}"));
        send.send_error(std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "tcp connect error: Connection refused (os error 111)"));
    }
}

/// A status object as the API server sends it with an error code.
pub fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({ "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message, "reason": reason, "code": code })
}

pub fn node_fingerprint() -> NodeFingerprint {
    NodeFingerprint {
        gpu_name: "cpu".into(),
        compute_capability: "-".into(),
        driver_version: None,
        cuda_version: "-".into(),
        nvrtc_version: None,
        agent_version: env!("CARGO_PKG_VERSION").into(),
        kernel_sources_hash: "ab".repeat(32),
    }
}

pub fn settings(pvc_root: &std::path::Path) -> Settings {
    Settings {
        node: "n1".into(),
        lease_namespace: "brink".into(),
        lease_seconds: 40,
        api_url: URL.into(),
        pvc_root: pvc_root.to_path_buf(),
        reserved_memory_bytes: 4 << 30,
        // No progress ticks inside a test: the writes are the scenario's, deterministic.
        progress_every: Duration::from_secs(3600),
        replica_reports: None,
    }
}

pub fn memory() -> UnifiedMemory {
    UnifiedMemory { total: 128 << 30, available: 100 << 30 }
}

/// An agent on node `n1` with no GPU, a fixed clock and fixed memory, over a mocked API.
pub fn agent() -> (Arc<Agent>, ApiServer) {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = Client::new(service, "default");
    let probes = Probes { now: Arc::new(|| Timestamp::from_second(NOW).unwrap()), memory: Arc::new(|| Some(memory())) };
    let state = NodeState::new(DeviceReport::none("no CUDA driver (libcuda.so) on this machine"), node_fingerprint(), None);
    (Arc::new(Agent::new(client, settings(std::path::Path::new("/mnt/pvc")), probes, state)), ApiServer(handle))
}

/// Awaits the agent's side of a scenario.
pub async fn finish<T>(task: tokio::task::JoinHandle<T>) -> T {
    tokio::time::timeout(Duration::from_secs(30), task).await.expect("the agent did not finish").expect("the agent task panicked")
}

pub const APPLY: &str = "application/apply-patch+yaml";

/// The condition of `type_` in a status body.
pub fn condition<'a>(status: &'a Value, type_: &str) -> &'a Value {
    status["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == type_))
        .unwrap_or_else(|| panic!("no {type_} in {status}"))
}

pub fn spark_node(shape_classes: &[&str], status: Option<Value>) -> Value {
    let mut v = json!({
        "apiVersion": "brink.dev/v1alpha1",
        "kind": "SparkNode",
        "metadata": { "name": "n1", "uid": "sn-uid", "resourceVersion": "10" },
        "spec": { "shapeClasses": shape_classes },
    });
    if let Some(s) = status {
        v["status"] = s;
    }
    v
}

/// A clamped result for `class`, taken on a node whose fingerprint is ours except `driver`.
pub fn shape_result(class: &str, driver: Option<&str>) -> brink_api::crd::ShapeQualification {
    use brink_api::{Envelope, Fingerprint, QUALIFICATION_SCHEMA, Qualification, ReportSummary, ServingParams, Verdict};
    let n = node_fingerprint();
    let fp = Fingerprint {
        gpu_name: n.gpu_name,
        compute_capability: n.compute_capability,
        driver_version: driver.map(Into::into),
        cuda_version: n.cuda_version,
        nvrtc_version: n.nvrtc_version,
        agent_version: n.agent_version,
        kernel_sources_hash: n.kernel_sources_hash,
        shape_class: class.into(),
        serving: ServingParams { max_batch_tokens: 8192, prefill_chunk: 2048, context: 4096, full_window_kv: false },
    };
    brink_api::crd::ShapeQualification {
        shape_class: class.into(),
        qualification: Qualification {
            schema: QUALIFICATION_SCHEMA,
            digest: fp.digest(),
            fingerprint: fp,
            verdict: Verdict::Clamped { max_tokens: 4096, first_failure: 4097 },
            summary: ReportSummary { derived: 10, executed: 10, passed: 9, failed: 1, ..ReportSummary::default() },
            qualified_at: "2027-01-15T08:00:00Z".into(),
            model_summary: None,
            kernel_verdict: None,
            model_verdict: None,
        },
        envelope: Some(Envelope {
            validated: true,
            validated_tokens: Some(4096),
            first_failure: Some(4097),
            max_batch_tokens: 4096,
            prefill_chunk: 2048,
        }),
        failing_cases: Vec::new(),
    }
}
