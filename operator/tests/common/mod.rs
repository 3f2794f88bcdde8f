//! Fixtures for the controller tests, after kube-rs's controller-rs: objects built in code, a
//! `Context` whose caches are filled directly, and a mocked API server that expects an exact,
//! ordered list of requests (method, path, query, body essentials) and answers each one. A
//! request that is not expected, or an expected one that never comes, fails within seconds.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use brink_api::crd::{
    Capacity, EngineBuild, GridPoint, HttpsSource, Model, ModelDeployment, ModelDeploymentSpec, ModelFormat, ModelRef, ModelReplica,
    ModelReplicaSpec, ModelReplicaStatus, ModelSource, ModelSpec, ModelStatus, NodeFingerprint, OnSelfTestFailure, Placement, PointFigures,
    ReplicaPhase, Rollout, Serving, ShapeQualification, SparkNode, SparkNodeSpec, SparkNodeStatus, Spread, SweepRun,
};
use brink_api::{Fingerprint, QUALIFICATION_SCHEMA, Qualification, ReportSummary, ServingParams, UnifiedMemory, Verdict};
use brink_operator::controllers::{Caches, Config, Context, FixedClock, Metrics, Shared};
use http::{Request, Response};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{Node, NodeSpec, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::client::Body;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher;
use kube::{Client, Resource};
use serde_json::{Value, json};

pub const NS: &str = "llm";
pub const GIB: u64 = 1 << 30;
pub const CLASS: &str = "qwen3moe-h2048-e128-top8-ffn768";
/// The tests' "now": 2026-12-01T00:00:00Z.
pub const NOW_S: i64 = 1_796_083_200;
pub const LEASE_NS: &str = "brink-system";

pub fn now() -> Timestamp {
    Timestamp::from_second(NOW_S).expect("valid time")
}

fn meta(name: &str, ns: Option<&str>, uid: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: ns.map(Into::into),
        uid: Some(uid.into()),
        generation: Some(1),
        resource_version: Some("1".into()),
        ..ObjectMeta::default()
    }
}

pub fn model() -> Model {
    let mut m = Model::new(
        "qwen",
        ModelSpec {
            source: ModelSource {
                https: Some(HttpsSource { url: "https://models.example/qwen.gguf".into(), credentials_secret_ref: None }),
                node_path: None,
                pvc: None,
            },
            sha256: Some("ab".repeat(32)),
            format: ModelFormat::Gguf,
            parts: None,
        },
    );
    m.metadata = meta("qwen", Some(NS), "uid-model");
    m.status = Some(ModelStatus {
        shape_class: Some(CLASS.into()),
        size_bytes: Some(20 * GIB),
        kv_bytes_per_token: Some(96 * 1024),
        ..ModelStatus::default()
    });
    m
}

pub fn serving() -> Serving {
    Serving { context: 32_768, max_batch_tokens: 8192, prefill_chunk: 2048, concurrency: 4, kv_fraction: 0.9 }
}

/// Memory of one replica of [`deployment`]: 20 GiB + 96 KiB x 32768 x 4 = 32 GiB.
pub const REPLICA_BYTES: u64 = 32 * GIB;

pub fn deployment(replicas: i32) -> ModelDeployment {
    let mut d = ModelDeployment::new(
        "qwen",
        ModelDeploymentSpec {
            model_ref: ModelRef { name: "qwen".into() },
            served_model_names: Vec::new(),
            replicas,
            engine: EngineBuild { image: "ghcr.io/brink/agent:0.2.0".into(), version: "0.2.0".into(), ..Default::default() },
            serving: serving(),
            nodes_per_replica: 1,
            gang: None,
            placement: Placement {
                node_selector: BTreeMap::new(),
                spread: Spread::PerNode,
                require_qualified: true,
                ..Placement::default()
            },
            on_self_test_failure: OnSelfTestFailure::Clamp,
            rollout: Rollout::default(),
        },
    );
    d.metadata = meta("qwen", Some(NS), "uid-dep");
    d
}

pub fn revision() -> String {
    brink_operator::decide::revision(&model().spec, &deployment(1).spec.engine)
}

pub fn node(name: &str) -> Node {
    Node { metadata: meta(name, None, &format!("uid-{name}")), spec: Some(NodeSpec::default()), status: None }
}

pub fn cordoned(name: &str) -> Node {
    let mut n = node(name);
    n.spec = Some(NodeSpec { unschedulable: Some(true), ..NodeSpec::default() });
    n
}

pub fn tainted(name: &str, key: &str, effect: &str) -> Node {
    let mut n = node(name);
    n.spec =
        Some(NodeSpec { taints: Some(vec![Taint { key: key.into(), effect: effect.into(), ..Taint::default() }]), ..NodeSpec::default() });
    n
}

/// The qualification result for [`CLASS`] a GB10 agent reports.
pub fn qualification(verdict: Verdict) -> ShapeQualification {
    let fingerprint = Fingerprint {
        gpu_name: "NVIDIA GB10".into(),
        compute_capability: "12.1".into(),
        driver_version: Some("580.95.05".into()),
        cuda_version: "13.0".into(),
        nvrtc_version: Some("13.0".into()),
        agent_version: "0.2.0".into(),
        kernel_sources_hash: "cafe".into(),
        shape_class: CLASS.into(),
        serving: ServingParams { max_batch_tokens: 8192, prefill_chunk: 2048, context: 32_768, full_window_kv: false },
    };
    ShapeQualification {
        shape_class: CLASS.into(),
        qualification: Qualification {
            schema: QUALIFICATION_SCHEMA,
            digest: fingerprint.digest(),
            fingerprint,
            verdict,
            summary: ReportSummary::default(),
            qualified_at: "2026-11-30T23:00:00Z".into(),
            model_summary: None,
            kernel_verdict: None,
            model_verdict: None,
        },
        envelope: None,
        failing_cases: Vec::new(),
    }
}

/// A SparkNode with 120 GiB of unified memory available; qualified for [`CLASS`] when `verdict` is given.
pub fn spark(name: &str, verdict: Option<Verdict>) -> SparkNode {
    let mut s = SparkNode::new(name, SparkNodeSpec::default());
    s.metadata = meta(name, None, &format!("uid-spark-{name}"));
    s.status = Some(SparkNodeStatus {
        capacity: Some(Capacity {
            unified_memory: UnifiedMemory { total: 128 * GIB, available: 120 * GIB },
            resident_replica_bytes: 0,
            reserved_bytes: 0,
        }),
        qualifications: verdict.map(qualification).into_iter().collect(),
        ..SparkNodeStatus::default()
    });
    s
}

pub fn qualified(name: &str) -> SparkNode {
    spark(name, Some(Verdict::Qualified { max_tokens: 16_384 }))
}

/// The node's heartbeat Lease, renewed `age_s` seconds before now, lasting 40 s.
pub fn lease(node: &str, age_s: i64) -> Lease {
    Lease {
        metadata: meta(&format!("brink-node-{node}"), Some(LEASE_NS), &format!("uid-lease-{node}")),
        spec: Some(LeaseSpec {
            holder_identity: Some(node.into()),
            lease_duration_seconds: Some(40),
            renew_time: Some(MicroTime(Timestamp::from_second(NOW_S - age_s).expect("valid time"))),
            ..LeaseSpec::default()
        }),
    }
}

pub fn replica(name: &str, node: &str, phase: Option<ReplicaPhase>) -> ModelReplica {
    let mut r = ModelReplica::new(
        name,
        ModelReplicaSpec {
            deployment: "qwen".into(),
            node: node.into(),
            model: "qwen".into(),
            revision: revision(),
            engine: deployment(1).spec.engine,
            serving: serving(),
            gang: None,
        },
    );
    r.metadata = meta(name, Some(NS), &format!("uid-{name}"));
    r.metadata.annotations = Some(BTreeMap::from([("brink.dev/memory-bytes".to_string(), REPLICA_BYTES.to_string())]));
    r.metadata.owner_references = deployment(1).controller_owner_ref(&()).map(|o| vec![o]);
    r.status = phase.map(|phase| ModelReplicaStatus { phase, ..ModelReplicaStatus::default() });
    r
}

pub fn store_of<K>(objs: Vec<K>) -> Store<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    let (store, mut writer) = reflector::store();
    writer.apply_watcher_event(&watcher::Event::Init);
    for o in objs {
        writer.apply_watcher_event(&watcher::Event::InitApply(o));
    }
    writer.apply_watcher_event(&watcher::Event::InitDone);
    // The store reads from the writer's shared state; keeping the writer alive is not needed.
    std::mem::forget(writer);
    store
}

/// What the caches hold in a scenario.
#[derive(Default, Clone)]
pub struct World {
    pub nodes: Vec<Node>,
    pub spark_nodes: Vec<SparkNode>,
    pub leases: Vec<Lease>,
    pub models: Vec<Model>,
    pub replicas: Vec<ModelReplica>,
    pub sweep_runs: Vec<SweepRun>,
}

impl World {
    /// `n` nodes `spark-1..n`, qualified, with fresh heartbeats, and the model.
    pub fn qualified_fleet(n: usize) -> World {
        let names: Vec<String> = (1..=n).map(|i| format!("spark-{i}")).collect();
        World {
            nodes: names.iter().map(|n| node(n)).collect(),
            spark_nodes: names.iter().map(|n| qualified(n)).collect(),
            leases: names.iter().map(|n| lease(n, 5)).collect(),
            models: vec![model()],
            replicas: Vec::new(),
            sweep_runs: Vec::new(),
        }
    }

    pub fn caches(&self) -> Caches {
        Caches {
            nodes: store_of(self.nodes.clone()),
            spark_nodes: store_of(self.spark_nodes.clone()),
            leases: store_of(self.leases.clone()),
            models: store_of(self.models.clone()),
            replicas: store_of(self.replicas.clone()),
            sweep_runs: store_of(self.sweep_runs.clone()),
        }
    }
}

pub type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

/// A `Context` over `world` whose client talks to the returned mock server.
pub fn context(world: &World) -> (Arc<Context>, Handle) {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = Client::new(service, "default");
    let shared = Shared {
        client,
        metrics: Arc::new(Metrics::new().expect("metrics")),
        clock: Arc::new(FixedClock::new(now())),
        config: Config { lease_namespace: LEASE_NS.into(), ..Config::default() },
    };
    (Arc::new(Context::new(&shared, world.caches())), handle)
}

/// One request as the server saw it.
#[derive(Debug)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub query: BTreeMap<String, String>,
    pub body: Value,
}

/// How the server answers an expected request.
pub enum Reply {
    /// 200 (201 for a POST) with the request's body, given a uid and resourceVersion (what a
    /// create or apply returns).
    Echo,
    /// 200 with this object, the request body's top-level fields laid over it (a status apply
    /// returns the whole object).
    EchoOnto(Value),
    /// A status code and a `Status` with this message.
    Fail(u16, &'static str),
    /// 200 with this body.
    Json(Value),
    /// 404 Not Found.
    NotFound,
}

/// One expected request: method, path, the query parameters that must be present, a check of
/// the body, and the reply.
pub struct Expect {
    pub method: &'static str,
    pub path: String,
    pub query: Vec<(&'static str, &'static str)>,
    pub check: Box<dyn Fn(&Value) + Send>,
    pub reply: Reply,
}

impl Expect {
    pub fn new(method: &'static str, path: impl Into<String>) -> Expect {
        Expect { method, path: path.into(), query: Vec::new(), check: Box::new(|_| {}), reply: Reply::Echo }
    }

    pub fn query(mut self, k: &'static str, v: &'static str) -> Expect {
        self.query.push((k, v));
        self
    }

    pub fn check(mut self, f: impl Fn(&Value) + Send + 'static) -> Expect {
        self.check = Box::new(f);
        self
    }

    pub fn reply(mut self, r: Reply) -> Expect {
        self.reply = r;
        self
    }

    /// An Event written through the events.k8s.io API with `reason`, about the deployment or replica `regarding`.
    pub fn event(reason: &'static str, regarding: &'static str) -> Expect {
        Expect::new("POST", format!("/apis/events.k8s.io/v1/namespaces/{NS}/events")).check(move |b| {
            assert_eq!(b["reason"], reason, "event: {b}");
            assert_eq!(b["regarding"]["name"], regarding, "event: {b}");
        })
    }
}

async fn body_json(req: Request<Body>) -> (String, String, BTreeMap<String, String>, Value) {
    let method = req.method().to_string();
    let path = req.uri().path().to_string();
    let query: BTreeMap<String, String> = req
        .uri()
        .query()
        .unwrap_or_default()
        .split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (k.to_string(), v.to_string())
        })
        .collect();
    let bytes = req.into_body().collect_bytes().await.expect("request body");
    let body = if bytes.is_empty() { Value::Null } else { serde_json::from_slice(&bytes).expect("request body is JSON") };
    (method, path, query, body)
}

fn status(code: u16, message: &str) -> Value {
    let reason = match code {
        404 => "NotFound",
        409 => "Conflict",
        _ => "InternalError",
    };
    json!({ "apiVersion": "v1", "kind": "Status", "status": "Failure", "message": message, "reason": reason, "code": code })
}

/// Serves `script` in order, then returns every request it saw. Panics (failing the test) on a
/// request that differs from the next expected one.
pub fn serve(mut handle: Handle, script: Vec<Expect>) -> tokio::task::JoinHandle<Vec<Seen>> {
    tokio::spawn(async move {
        let mut seen = Vec::new();
        for (i, exp) in script.into_iter().enumerate() {
            let (req, send) = handle.next_request().await.unwrap_or_else(|| panic!("request {i} ({} {}) never came", exp.method, exp.path));
            let (method, path, query, body) = body_json(req).await;
            assert_eq!((method.as_str(), path.as_str()), (exp.method, exp.path.as_str()), "request {i}: query {query:?}, body {body}");
            for (k, v) in &exp.query {
                assert_eq!(query.get(*k).map(String::as_str), Some(*v), "request {i} {method} {path}: query {k} in {query:?}");
            }
            (exp.check)(&body);
            let (code, reply) = match exp.reply {
                Reply::Echo => {
                    let mut b = body.clone();
                    b["metadata"]["uid"] = json!(format!("uid-new-{i}"));
                    b["metadata"]["resourceVersion"] = json!("2");
                    (if method == "POST" { 201 } else { 200 }, b)
                }
                Reply::EchoOnto(mut base) => {
                    if let (Some(obj), Some(fields)) = (base.as_object_mut(), body.as_object()) {
                        for (k, v) in fields {
                            if k != "metadata" {
                                obj.insert(k.clone(), v.clone());
                            }
                        }
                    }
                    (200, base)
                }
                Reply::Fail(code, msg) => (code, status(code, msg)),
                Reply::Json(v) => (200, v),
                Reply::NotFound => (404, status(404, "not found")),
            };
            let response = Response::builder().status(code).body(Body::from(serde_json::to_vec(&reply).expect("JSON"))).expect("response");
            send.send_response(response);
            seen.push(Seen { method, path, query, body });
        }
        seen
    })
}

/// Runs `reconcile` against `script`: both must finish within 5 s (a missing or extra request
/// hangs one of them), and every expected request must have come.
pub async fn scenario<F, T>(handle: Handle, script: Vec<Expect>, reconcile: F) -> (T, Vec<Seen>)
where
    F: std::future::Future<Output = T>,
{
    let server = serve(handle, script);
    let out = tokio::time::timeout(Duration::from_secs(5), reconcile)
        .await
        .expect("the reconcile hung: it sent a request the script does not expect");
    let seen = tokio::time::timeout(Duration::from_secs(5), server)
        .await
        .expect("an expected request never came")
        .expect("the script's assertions failed");
    (out, seen)
}

pub const REPLICAS: &str = "/apis/brink.dev/v1alpha1/namespaces/llm/modelreplicas";
pub const STATUS: &str = "/apis/brink.dev/v1alpha1/namespaces/llm/modeldeployments/qwen/status";
pub const SERVICE: &str = "/api/v1/namespaces/llm/services/qwen";

/// The Service apply every deployment reconcile starts with.
pub fn service_apply() -> Expect {
    Expect::new("PATCH", SERVICE).query("fieldManager", "brink-operator").query("force", "true").check(|b| {
        assert_eq!(b["kind"], "Service");
        assert_eq!(b["spec"]["selector"], json!({ "brink.dev/deployment": "qwen" }));
        assert_eq!(b["spec"]["ports"][0]["targetPort"], "http");
        assert_eq!(b["metadata"]["ownerReferences"][0]["uid"], "uid-dep");
        assert_eq!(b["metadata"]["ownerReferences"][0]["controller"], true);
    })
}

/// The condition of `type_` in a status apply body.
pub fn cond<'a>(body: &'a Value, type_: &str) -> &'a Value {
    body["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == type_))
        .unwrap_or_else(|| panic!("no {type_} condition in {body}"))
}

/// A `SweepRun` of sweep `nightly` in `NS` with `drainReplicas`, `Running`, with each node in
/// the state given (`Waiting`, `Draining`, `Running`, `Done`...), as the run controller writes it.
pub fn draining_run(name: &str, nodes: &[(&str, &str)]) -> SweepRun {
    let progress: Vec<Value> = nodes.iter().map(|(node, state)| json!({ "node": node, "state": state })).collect();
    let mut run: SweepRun = serde_json::from_value(json!({
        "apiVersion": "brink.dev/v1alpha1", "kind": "SweepRun",
        "metadata": { "name": name, "namespace": NS },
        "spec": {
            "sweep": "nightly", "scheduledTime": now().to_string(), "model": "qwen",
            "nodes": nodes.iter().map(|(n, _)| *n).collect::<Vec<_>>(),
            "workload": { "promptTokens": [512], "concurrency": [1], "generatedTokens": [64] },
            "selfTest": {}, "baseline": {}, "maxConcurrentNodes": 1, "drainReplicas": true, "nodeTimeoutSeconds": 3600
        },
        "status": { "phase": "Running", "nodes": progress }
    }))
    .expect("a SweepRun");
    run.metadata.uid = Some(format!("uid-{name}"));
    run
}

/// The one grid point the sweep tests measure.
pub const SWEEP_POINT: GridPoint = GridPoint { prompt_tokens: 128, concurrency: 1, generated_tokens: 32 };

/// The node part of a sweep result's fingerprint: identical GB10 nodes.
pub fn sweep_fingerprint() -> NodeFingerprint {
    NodeFingerprint {
        gpu_name: "NVIDIA GB10".into(),
        compute_capability: "12.1".into(),
        driver_version: Some("580.95.05".into()),
        cuda_version: "13.0".into(),
        nvrtc_version: None,
        agent_version: "0.2.0".into(),
        kernel_sources_hash: "cafe".into(),
    }
}

/// [`SWEEP_POINT`] measured at `tokens_per_s`, every request answered.
pub fn point_figures(tokens_per_s: f64) -> PointFigures {
    PointFigures {
        point: SWEEP_POINT,
        requests: 8,
        failed: 0,
        timed_out: 0,
        output_tokens_per_s: Some(tokens_per_s),
        ttft_p50_s: Some(0.1),
        ttft_p99_s: Some(0.2),
        itl_p50_s: Some(0.02),
        itl_p99_s: Some(0.03),
        error: None,
    }
}
