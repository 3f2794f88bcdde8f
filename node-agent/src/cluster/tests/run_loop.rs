//! The agent's whole loop ([`run_loop`]) against the in-memory API double, with a fake sweep
//! executor (the real one on the CPU runs in `tests/run_sweep_cli.rs`, through the binary): the
//! SparkNode created with its status, the Lease renewed, `/health`, `/ready` and `/metrics`
//! served, a SweepRun whose progress for this node is Running leads to a `Running` then a final
//! `SweepResult` owned by the run; a sweep waits while the GPU is taken (a qualification); the
//! stop future ends the loop promptly, abandoning a sweep in flight with a result that says so.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use brink_api::DeviceReport;
use brink_api::crd::{PointFigures, ResultState, ShapeQualification, SparkNode, SweepResult, SweepResultStatus};
use brink_kube_double::KubeDouble;
use k8s_openapi::api::coordination::v1::Lease;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;
use crate::cluster::qualifier::{Qualifier, QualifyError, QualifyJob};
use crate::cluster::sweeper::{STOPPED, SweepExecutor, SweepSettings};
use crate::cluster::{Parts, run_loop};
use crate::model_cache::{CacheConfig, ModelCache};
use crate::sweep::Plan;

/// Qualifies nothing: the SparkNode asks for no class.
struct NoQualifier;

impl Qualifier for NoQualifier {
    fn check(&self, _: &QualifyJob) -> Result<(), QualifyError> {
        Ok(())
    }
    fn qualify(&self, job: &QualifyJob) -> Result<ShapeQualification, QualifyError> {
        Err(QualifyError::Failed(format!("not asked for: {}", job.shape_class)))
    }
}

/// Records its plans; finishes at once, or (held) only once released.
#[derive(Default)]
struct FakeExecutor {
    plans: Mutex<Vec<Plan>>,
    hold: AtomicBool,
    released: AtomicBool,
}

impl SweepExecutor for FakeExecutor {
    fn execute(&self, plan: &Plan) -> SweepResultStatus {
        self.plans.lock().unwrap().push(plan.clone());
        let t0 = Instant::now();
        // Bounded, so a failing test cannot leave the runtime waiting for this thread forever.
        while self.hold.load(Ordering::SeqCst) && !self.released.load(Ordering::SeqCst) && t0.elapsed() < Duration::from_secs(20) {
            std::thread::sleep(Duration::from_millis(10));
        }
        let point = plan.grid.points()[0];
        SweepResultStatus {
            state: ResultState::Done,
            started_at: None,
            points: vec![PointFigures {
                point,
                requests: 2,
                failed: 0,
                timed_out: 0,
                output_tokens_per_s: Some(42.0),
                ttft_p50_s: Some(0.1),
                ttft_p99_s: Some(0.2),
                itl_p50_s: Some(0.01),
                itl_p99_s: Some(0.02),
                error: None,
            }],
            ..SweepResultStatus::default()
        }
    }
}

struct World {
    double: KubeDouble,
    dir: tempfile::TempDir,
    model_path: std::path::PathBuf,
}

fn world() -> World {
    let dir = tempfile::tempdir().unwrap();
    let model_path = dir.path().join("tiny.gguf");
    brink_engine::synth::generate(&brink_engine::synth::SynthSpec::from_preset(brink_engine::synth::Preset::Tiny), &model_path, |_, _| {})
        .unwrap();
    let sha: String =
        <sha2::Sha256 as sha2::Digest>::digest(std::fs::read(&model_path).unwrap()).iter().map(|b| format!("{b:02x}")).collect();
    let double = KubeDouble::new();
    double.seed_value(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}})).unwrap();
    double
        .seed_value(json!({
            "apiVersion": "brink.dev/v1alpha1", "kind": "Model",
            "metadata": { "name": "m", "namespace": "ops" },
            "spec": { "source": { "nodePath": { "path": model_path.to_str().unwrap() } }, "sha256": sha, "format": "gguf" }
        }))
        .unwrap();
    double
        .seed_value(json!({
            "apiVersion": "brink.dev/v1alpha1", "kind": "SweepRun",
            "metadata": { "name": "r1", "namespace": "ops" },
            "spec": {
                "sweep": "nightly", "scheduledTime": "2027-01-15T08:00:00Z", "model": "m", "nodes": ["n1", "n2"],
                "workload": { "promptTokens": [64], "concurrency": [1, 2], "generatedTokens": [8], "requestsPerPoint": 2 },
                "selfTest": { "enabled": true, "negativeControls": true },
                "baseline": {}, "maxConcurrentNodes": 2, "drainReplicas": false, "nodeTimeoutSeconds": 600,
                "extraCases": [{ "tokens": 40, "sequences": 4, "source": "ai/r-0 prefill" }]
            },
            "status": { "phase": "Running", "nodes": [{ "node": "n1", "state": "Running" }, { "node": "n2", "state": "Running" }] }
        }))
        .unwrap();
    World { double, dir, model_path }
}

fn parts(w: &World, executor: Arc<FakeExecutor>, listener: Option<tokio::net::TcpListener>) -> Parts {
    let probes = Probes { now: Arc::new(Timestamp::now), memory: Arc::new(|| Some(memory())) };
    let state = NodeState::new(DeviceReport::none("no CUDA driver (libcuda.so) on this machine"), node_fingerprint(), None);
    let mut settings = settings(std::path::Path::new("/mnt/pvc"));
    settings.lease_seconds = 8;
    let cache = Arc::new(ModelCache::open(CacheConfig::new(w.dir.path().join("cache"), 1 << 30)).unwrap());
    Parts {
        agent: Arc::new(Agent::new(w.double.client(), settings, probes, state)),
        qualifier: Arc::new(NoQualifier),
        kernel_cases: Default::default(),
        cache,
        cache_budget_bytes: 1 << 30,
        executor,
        sweep: SweepSettings {
            backend: brink_engine::BackendKind::Cpu,
            state_dir: w.dir.path().join("state"),
            max_batch_tokens: 8192,
            prefill_chunk: 2048,
            point_timeout: Duration::from_secs(60),
            load_timeout: Duration::from_secs(60),
            stall_timeout: 30.0,
        },
        beat: Duration::from_millis(500),
        resync: Duration::from_millis(300),
        listen: listener.map(crate::cluster::Listen::Bound),
        sensors: crate::node_metrics::provider(None),
    }
}

fn result(double: &KubeDouble) -> Option<SweepResult> {
    double.get(Some("ops"), "r1-n1")
}

async fn until<T>(what: &str, secs: u64, mut f: impl FnMut() -> Option<T>) -> T {
    let t0 = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(t0.elapsed() < Duration::from_secs(secs), "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// GET `path` from the endpoint: the status code and body.
async fn get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n\r\n").as_bytes()).await.unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).await.unwrap();
    let code = text.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    (code, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_loop_keeps_the_node_runs_its_sweep_serves_its_endpoint_and_stops_promptly() {
    let w = world();
    let executor = Arc::new(FakeExecutor::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let p = parts(&w, executor.clone(), Some(listener));
    let agent = p.agent.clone();
    let running = tokio::spawn(run_loop(p, async move {
        let _ = stop_rx.await;
    }));

    // The SparkNode with its status, owned by its Node; the Lease held by this node.
    let node: Option<SparkNode> = tokio::time::timeout(
        Duration::from_secs(10),
        until("the SparkNode's status", 10, || w.double.get::<SparkNode>(None, "n1").filter(|n| n.status.is_some())),
    )
    .await
    .ok();
    if running.is_finished() {
        panic!("the loop ended: {:?}", running.await);
    }
    let node = node.unwrap();
    assert_eq!(node.metadata.owner_references.as_ref().unwrap()[0].kind, "Node");
    assert!(node.status.as_ref().unwrap().last_heartbeat_time.is_some());
    let lease: Lease = until("the Lease", 10, || w.double.get::<Lease>(Some("brink"), "brink-node-n1")).await;
    assert_eq!(lease.spec.as_ref().unwrap().holder_identity.as_deref(), Some("n1"));
    let first_renew = lease.spec.unwrap().renew_time.unwrap();
    assert_eq!(get(addr, "/health").await.0, 200);
    assert_eq!(get(addr, "/ready").await.0, 200, "ready once the SparkNode is written");

    // The sweep: a final result, owned by the run, written by brink-agent.
    let done = until("the final SweepResult", 20, || {
        result(&w.double).filter(|r| r.status.as_ref().is_some_and(|s| s.state == ResultState::Done))
    })
    .await;
    assert_eq!((done.spec.run.as_str(), done.spec.node.as_str()), ("r1", "n1"));
    let owner = &done.metadata.owner_references.as_ref().expect("owned")[0];
    let run_uid = w.double.get_value("brink.dev", "sweepruns", Some("ops"), "r1").unwrap()["metadata"]["uid"].clone();
    assert_eq!((owner.kind.as_str(), owner.name.as_str(), Some(owner.uid.as_str())), ("SweepRun", "r1", run_uid.as_str()));
    assert_eq!(owner.controller, Some(true));
    let managers: Vec<String> = done.metadata.managed_fields.iter().flatten().filter_map(|m| m.manager.clone()).collect();
    assert!(managers.iter().all(|m| m == "brink-agent") && !managers.is_empty(), "{managers:?}");
    let status = done.status.clone().unwrap();
    assert_eq!(status.points.len(), 1);
    assert!(status.judgement.is_none(), "the judgement is the operator's");
    assert!(w.double.get::<SweepResult>(Some("ops"), "r1-n2").is_none(), "n2's part is n2's agent's");
    // The executor got the run's spec: the model file, the grid, the extra case, and the
    // negative controls (no replica here).
    let plans = executor.plans.lock().unwrap().clone();
    assert_eq!(plans.len(), 1, "one sweep per run and node");
    let plan = &plans[0];
    assert_eq!(plan.model, w.model_path);
    assert_eq!((plan.grid.concurrency.clone(), plan.slots, plan.context), (vec![1, 2], 2, 256));
    assert!(plan.self_test.enabled && plan.negative_controls_allowed);
    assert_eq!(plan.extra_cases.len(), 1);
    assert_eq!((plan.extra_cases[0].tokens, plan.extra_cases[0].sequences), (40, 4));
    // The Running write came first (seen in the request log as two status applies).
    let applies = w.double.request_lines().iter().filter(|l| l.starts_with("PATCH") && l.contains("sweepresults/r1-n1/status")).count();
    assert_eq!(applies, 2, "Running, then the final result: {:?}", w.double.request_lines());

    // The Lease is renewed by the heartbeat.
    until("a renewed Lease", 10, || {
        let l: Lease = w.double.get(Some("brink"), "brink-node-n1")?;
        (l.spec?.renew_time? != first_renew).then_some(())
    })
    .await;
    let (code, text) = get(addr, "/metrics").await;
    assert_eq!(code, 200);
    for needle in [
        "brink_agent_sweeps_total{result=\"Done\"} 1",
        "brink_agent_sweeps_total{result=\"Failed\"} 0",
        "brink_model_cache_budget_bytes 1073741824",
    ] {
        assert!(text.contains(needle), "{needle} not in:\n{text}");
    }
    assert!(text.contains("# TYPE brink_model_cache_bytes gauge"), "{text}");
    // A resync later: still one sweep (the result exists).
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(executor.plans.lock().unwrap().len(), 1);

    let t0 = Instant::now();
    stop_tx.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(3), running).await.expect("the loop ends promptly").unwrap().unwrap();
    assert!(t0.elapsed() < Duration::from_secs(3));
    let node: SparkNode = w.double.get(None, "n1").unwrap();
    let ready = node.status.unwrap().conditions.into_iter().find(|c| c.type_ == "Ready").unwrap();
    assert_eq!((ready.status.as_str(), ready.reason.as_str()), ("False", "AgentStopping"));
    // Nothing left running: the watches are closed, the endpoint is gone.
    until("the watches to close", 5, || (w.double.open_watches() == 0).then_some(())).await;
    assert!(tokio::net::TcpStream::connect(addr).await.is_err(), "the endpoint is closed");
    assert_eq!(agent.sweeps_finished(), [("Done", 1), ("Failed", 0)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sweep_waits_for_the_gpu_and_is_abandoned_at_stop() {
    let w = world();
    let executor = Arc::new(FakeExecutor::default());
    executor.hold.store(true, Ordering::SeqCst);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let p = parts(&w, executor.clone(), None);
    let agent = p.agent.clone();
    // A qualification holds the GPU: the run is due but waits.
    let qualification = agent.gpu.clone().lock_owned().await;
    let running = tokio::spawn(run_loop(p, async move {
        let _ = stop_rx.await;
    }));
    until("the SparkNode", 10, || w.double.get::<SparkNode>(None, "n1")).await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(result(&w.double).is_none(), "no sweep while the GPU is qualifying");
    assert!(executor.plans.lock().unwrap().is_empty());
    drop(qualification);
    // It starts as soon as the GPU is free (queued, not lost) and writes Running first.
    let r = until("the Running result", 10, || result(&w.double)).await;
    assert_eq!(r.status.as_ref().unwrap().state, ResultState::Running);
    assert!(r.status.as_ref().unwrap().started_at.is_some());
    until("the executor to start", 10, || (!executor.plans.lock().unwrap().is_empty()).then_some(())).await;

    // Stopped mid-sweep: the loop ends promptly and the result says the agent stopped.
    let t0 = Instant::now();
    stop_tx.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(3), running).await.expect("the loop ends promptly").unwrap().unwrap();
    assert!(t0.elapsed() < Duration::from_secs(3));
    let s = result(&w.double).unwrap().status.unwrap();
    assert_eq!((s.state, s.error.as_deref()), (ResultState::Failed, Some(STOPPED)));
    assert!(s.started_at.is_some() && s.finished_at.is_some(), "{s:?}");
    assert_eq!(agent.sweeps_finished(), [("Done", 0), ("Failed", 1)]);
    executor.released.store(true, Ordering::SeqCst);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_model_fails_the_result_and_resident_replicas_skip_the_negative_controls() {
    let w = world();
    // The run's Model does not exist.
    let mut run: serde_json::Value = w.double.get_value("brink.dev", "sweepruns", Some("ops"), "r1").unwrap();
    run["metadata"] = json!({ "name": "r2", "namespace": "ops" });
    run["spec"]["model"] = json!("gone");
    run["spec"]["scheduledTime"] = json!("2027-01-15T09:00:00Z");
    w.double.seed_value(run).unwrap();
    // A replica on this node (of a Model not here: its download-progress writes would leave an
    // empty `status.download` in the double that the typed list cannot read; see the report).
    w.double
        .seed_value(json!({
            "apiVersion": "brink.dev/v1alpha1", "kind": "ModelReplica",
            "metadata": { "name": "d-0", "namespace": "ops" },
            "spec": {
                "deployment": "d", "node": "n1", "model": "elsewhere", "revision": "r1",
                "engine": { "image": "brink:1", "version": "0.1.0" },
                "serving": { "context": 4096, "maxBatchTokens": 8192, "prefillChunk": 2048, "concurrency": 4, "kvFraction": 0.5 }
            }
        }))
        .unwrap();
    let executor = Arc::new(FakeExecutor::default());
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let p = parts(&w, executor.clone(), None);
    let running = tokio::spawn(run_loop(p, async move {
        let _ = stop_rx.await;
    }));
    let failed = until("r2's failed result", 20, || {
        let r: SweepResult = w.double.get(Some("ops"), "r2-n1")?;
        r.status.filter(|s| s.state == ResultState::Failed)
    })
    .await;
    assert!(failed.error.as_deref().is_some_and(|e| e.contains("Model ops/gone: does not exist")), "{failed:?}");
    let done =
        until("r1's result", 20, || result(&w.double).filter(|r| r.status.as_ref().is_some_and(|s| s.state == ResultState::Done))).await;
    assert!(done.status.is_some());
    let plans = executor.plans.lock().unwrap().clone();
    assert_eq!(plans.len(), 1, "only r1 reached the executor");
    assert!(!plans[0].negative_controls_allowed, "a replica is resident: no deliberate hangs");
    stop_tx.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(3), running).await.unwrap().unwrap().unwrap();
}

/// A run over a deployment on another engine measures this node's replica of it through the
/// engine's API (its `status.endpoint`), at the replica's serving limits, without negative
/// controls or brink's extra cases; a run over a deployment with no replica here fails saying so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_over_a_deployment_measures_its_replica_through_the_engine_api() {
    let w = world();
    let r1: serde_json::Value = w.double.get_value("brink.dev", "sweepruns", Some("ops"), "r1").unwrap();
    for (name, deployment, at) in [("r3", "lc", "2027-01-15T09:00:00Z"), ("r4", "absent", "2027-01-15T10:00:00Z")] {
        let mut run = r1.clone();
        run["metadata"] = json!({ "name": name, "namespace": "ops" });
        run["spec"]["deployment"] = json!(deployment);
        run["spec"]["scheduledTime"] = json!(at);
        w.double.seed_value(run).unwrap();
    }
    // llama.cpp replicas of `lc`: one on this node (the one measured), one elsewhere. Their
    // Model is not here (see the test above for why the cache must not write their status).
    for (name, node, endpoint) in [("lc-0", "n1", "10.0.0.7:8080"), ("lc-1", "n2", "10.0.0.8:8080")] {
        w.double
            .seed_value(json!({
                "apiVersion": "brink.dev/v1alpha1", "kind": "ModelReplica",
                "metadata": { "name": name, "namespace": "ops" },
                "spec": {
                    "deployment": "lc", "node": node, "model": "elsewhere", "revision": "r1",
                    "engine": { "image": "llama.cpp:server", "version": "b1", "kind": "llamacpp" },
                    "serving": { "context": 1024, "maxBatchTokens": 512, "prefillChunk": 256, "concurrency": 2, "kvFraction": 0.5 }
                },
                "status": { "phase": "Serving", "endpoint": endpoint }
            }))
            .unwrap();
    }
    let executor = Arc::new(FakeExecutor::default());
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(run_loop(parts(&w, executor.clone(), None), async move {
        let _ = stop_rx.await;
    }));
    let double = &w.double;
    let state = |name: &'static str, want: ResultState| {
        move || {
            let r: SweepResult = double.get(Some("ops"), name)?;
            r.status.filter(|s| s.state == want)
        }
    };
    until("r1's result", 20, state("r1-n1", ResultState::Done)).await;
    let measured = until("r3's result", 20, state("r3-n1", ResultState::Done)).await;
    assert_eq!(measured.points.len(), 1, "{measured:?}");
    let failed = until("r4's result", 20, state("r4-n1", ResultState::Failed)).await;
    assert_eq!(
        failed.error.as_deref(),
        Some("ModelDeployment ops/absent has no replica on node n1 (a gang's leader node serves its API)"),
        "{failed:?}"
    );
    stop_tx.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(3), running).await.unwrap().unwrap().unwrap();

    let plans = executor.plans.lock().unwrap().clone();
    assert_eq!(plans.len(), 2, "r1 and r3 reached the executor, r4 did not");
    assert!(plans[0].external.is_none(), "r1: brink's engine on the node");
    let p = &plans[1];
    let ext = p.external.as_ref().expect("r3 measures the replica's engine");
    assert_eq!(ext.url, "http://10.0.0.7:8080");
    assert_eq!((ext.context, ext.model_name.as_deref(), ext.case_deadline), (Some(1024), None, Duration::from_secs(30)));
    assert_eq!(ext.shape, crate::cmd::flags::model_shape("m", &w.model_path).unwrap(), "the shape of the run's Model");
    assert_eq!((p.max_batch_tokens, p.prefill_chunk, p.slots), (512, 256, 2), "the replica's serving limits");
    assert!(!p.negative_controls_allowed && p.extra_cases.is_empty(), "brink's own cases do not apply to another engine");
    assert_eq!(p.grid, plans[0].grid);
}
