//! `brink-agent run` as the DaemonSet runs it, against the in-memory API double served over HTTP
//! (a kubeconfig points at it): the agent finds the SweepRun whose progress for its node is
//! Running and runs the real executor on the CPU backend with the demo model — the self-test,
//! an extra case from serving replayed at its shape, and a tiny grid — then writes its final
//! `SweepResult`; `/ready` and `/metrics` answer on `--listen`; SIGTERM ends the process
//! promptly with the SparkNode marked stopping.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use brink_api::crd::{ResultState, SparkNode, SweepResult};
use brink_kube_double::KubeDouble;
use http_body_util::BodyExt;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tower_service::Service;

/// Serves `double` over plain HTTP/1.1 on a local port (watches stream as chunked responses).
async fn serve(double: &KubeDouble) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let svc = double.service();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let svc = svc.clone();
            tokio::spawn(async move {
                let handler = hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    let mut svc = svc.clone();
                    async move {
                        let (parts, body) = req.into_parts();
                        let bytes = body.collect().await.map(|c| c.to_bytes()).unwrap_or_default();
                        svc.call(http::Request::from_parts(parts, kube::client::Body::from(bytes))).await
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new().serve_connection(hyper_util::rt::TokioIo::new(stream), handler).await;
            });
        }
    });
    addr
}

fn kubeconfig(dir: &Path, server: &str) -> std::path::PathBuf {
    let path = dir.join("kubeconfig");
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {server}\nusers:\n- name: u\n  user:\n    token: t\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\n"
    );
    std::fs::write(&path, text).unwrap();
    path
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n\r\n").as_bytes()).await.unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).await.unwrap();
    let code = text.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (code, text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default())
}

/// Ends the agent if the test fails before it does.
struct Agent(Child);

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_runs_its_sweep_for_real_on_the_cpu_and_stops_at_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("demo.gguf");
    brink_engine::synth::generate(&brink_engine::synth::SynthSpec::from_preset(brink_engine::synth::Preset::Demo), &model, |_, _| {})
        .unwrap();
    let sha: String = <sha2::Sha256 as sha2::Digest>::digest(std::fs::read(&model).unwrap()).iter().map(|b| format!("{b:02x}")).collect();
    let double = KubeDouble::new();
    double.seed_value(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}})).unwrap();
    double
        .seed_value(json!({
            "apiVersion": "brink.dev/v1alpha1", "kind": "Model",
            "metadata": { "name": "demo", "namespace": "ops" },
            "spec": { "source": { "nodePath": { "path": model.to_str().unwrap() } }, "sha256": sha, "format": "gguf" }
        }))
        .unwrap();
    double
        .seed_value(json!({
            "apiVersion": "brink.dev/v1alpha1", "kind": "SweepRun",
            "metadata": { "name": "nightly-1", "namespace": "ops" },
            "spec": {
                "sweep": "nightly", "scheduledTime": "2027-01-15T08:00:00Z", "model": "demo", "nodes": ["n1"],
                "workload": { "promptTokens": [64], "concurrency": [1, 2], "generatedTokens": [8], "requestsPerPoint": 2 },
                "selfTest": { "enabled": true, "negativeControls": true },
                "baseline": {}, "maxConcurrentNodes": 1, "drainReplicas": false, "nodeTimeoutSeconds": 900,
                "extraCases": [{ "tokens": 12, "sequences": 2, "source": "ops/demo-0 decode" }]
            },
            "status": { "phase": "Running", "nodes": [{ "node": "n1", "state": "Running" }] }
        }))
        .unwrap();
    let api = serve(&double).await;
    let listen: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let log_path = dir.path().join("agent.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let t0 = Instant::now();
    let mut agent = Agent(
        Command::new(env!("CARGO_BIN_EXE_brink-agent"))
            .args(["run", "--node-name", "n1", "--lease-namespace", "brink", "--resync-seconds", "1", "--lease-duration-seconds", "8"])
            .arg("--state-dir")
            .arg(dir.path().join("state"))
            .arg("--listen")
            .arg(listen.to_string())
            .env("KUBECONFIG", kubeconfig(dir.path(), &format!("http://{api}")))
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env("CUDA_VISIBLE_DEVICES", "")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    let logged = || std::fs::read_to_string(&log_path).unwrap_or_default();

    let result = loop {
        let r: Option<SweepResult> = double.get(Some("ops"), "nightly-1-n1");
        if let Some(r) = r.filter(|r| r.status.as_ref().is_some_and(|s| s.state != ResultState::Running)) {
            break r;
        }
        if let Ok(Some(code)) = agent.0.try_wait() {
            panic!("the agent ended ({code}) before its result:\n{}", logged());
        }
        assert!(t0.elapsed() < Duration::from_secs(600), "no final result after 600 s:\n{}", logged());
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let took = t0.elapsed();
    eprintln!("the real CPU sweep through the agent and the double took {:.1} s", took.as_secs_f64());
    let s = result.status.clone().unwrap();
    assert_eq!(s.state, ResultState::Done, "{:?}\n{}", s.error, logged());
    assert!(s.started_at.is_some() && s.finished_at.is_some() && s.fingerprint.is_some());
    assert_eq!(s.points.len(), 2);
    for p in &s.points {
        assert_eq!((p.requests, p.failed, p.timed_out), (2, 0, 0), "{p:?}");
        assert!(p.output_tokens_per_s.is_some_and(|v| v > 0.0), "{p:?}");
    }
    let st = s.self_test.clone().expect("the self-test ran");
    assert!(st.summary.derived > 0 && !st.negative_controls_ran, "{st:?}");
    // The stalled shape was replayed on the demo model: counted, passed, and in the log.
    let log = logged();
    assert!(log.contains("extra case model/extra/t12x2 (stalled in serving: ops/demo-0 decode): Passed"), "{log}");
    assert!(st.summary.passed >= 1, "{st:?}");
    assert!(!st.failing_cases.iter().any(|f| f.id.starts_with("model/extra")), "{st:?}");
    assert_eq!(result.metadata.owner_references.as_ref().map(|o| o[0].name.as_str()), Some("nightly-1"));
    assert!(s.judgement.is_none(), "no operator here to judge");

    let (code, _) = get(listen, "/ready").await;
    assert_eq!(code, 200);
    let (code, metrics) = get(listen, "/metrics").await;
    assert_eq!(code, 200);
    for needle in ["brink_agent_sweeps_total{result=\"Done\"} 1", "brink_node_memory_total_bytes", "brink_model_cache_budget_bytes"] {
        assert!(metrics.contains(needle), "{needle} not in:\n{metrics}");
    }

    // SIGTERM: the process ends promptly, and says it stopped in its SparkNode.
    let pid = agent.0.id().to_string();
    let t1 = Instant::now();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let code = loop {
        if let Some(code) = agent.0.try_wait().unwrap() {
            break code;
        }
        assert!(t1.elapsed() < Duration::from_secs(5), "still running 5 s after SIGTERM:\n{}", logged());
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(code.success(), "{code}:\n{}", logged());
    let node: SparkNode = double.get(None, "n1").unwrap();
    let ready = node.status.unwrap().conditions.into_iter().find(|c| c.type_ == "Ready").unwrap();
    assert_eq!((ready.status.as_str(), ready.reason.as_str()), ("False", "AgentStopping"));
    assert!(tokio::net::TcpStream::connect(listen).await.is_err(), "the endpoint closed with the process");
}

#[test]
fn a_bad_extra_case_is_named() {
    let dir = tempfile::tempdir().unwrap();
    for (arg, needle) in
        [("3x4", "--extra-case: 3x4: model/extra/t3x4: 4 sequences cannot share 3 tokens"), ("12y", "--extra-case: 12y: expected TOKENS")]
    {
        let o = Command::new(env!("CARGO_BIN_EXE_brink-agent"))
            .args(["sweep", "--backend", "cpu", "--extra-case", arg, "--state-dir"])
            .arg(dir.path())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{err}");
        assert!(err.contains(needle), "{err}");
    }
}
