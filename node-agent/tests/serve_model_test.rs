//! `brink-agent serve` as a replica Pod runs it (`--backend` explicit, `--model-test`, the
//! node's state directory as `--qualification-dir`): the model-level threshold test runs before
//! `/ready` and its time is logged; a Pod recreated on the node reuses the node's result; a
//! model-level case that fails below a passing count (test-only fault injection) keeps
//! `/ready` at 503 naming the case, and the report the node agent publishes carries it; an
//! engine that lies about its backend fails backend truth and is never ready; `--backend cuda`
//! without a GPU refuses to start.

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use brink_api::crd::ReplicaQualification;
use common::{agent, http, tiny_model};

/// A running `serve`, its address and its log so far.
struct Served {
    child: Child,
    addr: String,
    log: Arc<Mutex<String>>,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts a replica-style `serve` of `model` keeping results in `node_dir`; returns once it
/// listens (not once it is ready).
fn replica_serve(model: &Path, node_dir: &Path, env: &[(&str, &str)]) -> Served {
    let mut cmd = agent();
    cmd.env_remove("BRINK_INJECT_FAULT").env_remove("BRINK_TEST_CLAIM_BACKEND").env_remove("BRINK_TEST_SILENT_CPU");
    cmd.envs(env.iter().copied()).env("BRINK_REPLICA", "chat-0").env("POD_NAMESPACE", "ai");
    cmd.args(["serve", "--port", "0", "--backend", "cpu", "--context", "512", "--max-batch-tokens", "64", "--prefill-chunk", "32"])
        .arg("--model")
        .arg(model)
        .args(["--model-test", "--model-test-max-tokens", "12", "--qualification-dir"])
        .arg(node_dir);
    let mut child = cmd.stderr(Stdio::piped()).spawn().unwrap();
    let stderr = child.stderr.take().unwrap();
    let log = Arc::new(Mutex::new(String::new()));
    let (tx, rx) = std::sync::mpsc::channel();
    let kept = log.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            eprintln!("{line}");
            kept.lock().unwrap().push_str(&format!("{line}\n"));
            if let Some(rest) = line.split("listening on http://").nth(1) {
                let _ = tx.send(rest.split_whitespace().next().unwrap_or_default().to_string());
            }
        }
    });
    let addr = rx.recv_timeout(Duration::from_secs(180)).expect("serve printed no address");
    Served { child, addr, log }
}

/// Polls `/ready` until `done(status, body)` or 60 s pass; returns the last answer.
fn ready_until(addr: &str, done: impl Fn(u16, &str) -> bool) -> (u16, String) {
    let t0 = Instant::now();
    loop {
        let (status, body) = http(addr, "GET", "/ready", "");
        if done(status, &body) || t0.elapsed() > Duration::from_secs(60) {
            return (status, body);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn report(node_dir: &Path) -> ReplicaQualification {
    let p = node_dir.join("replicas/ai/chat-0.json");
    serde_json::from_str(&std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))).unwrap()
}

#[test]
fn the_model_test_runs_before_ready_and_a_recreated_pod_reuses_the_nodes_result() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let node = dir.path().join("node");

    let first = replica_serve(&model, &node, &[]);
    let (status, body) = ready_until(&first.addr, |s, _| s == 200);
    assert_eq!(status, 200, "{body}");
    let log = first.log.lock().unwrap().clone();
    assert!(log.contains("running it before /ready") && log.contains("model-level threshold test took"), "{log}");
    assert!(log.contains("READY") && log.contains("s after start"), "{log}");
    let r = report(&node);
    assert_eq!((r.model_test_state.as_str(), r.reused, r.held.as_deref()), ("qualified", false, None), "{r:?}");
    assert!(r.model_test_seconds.is_some_and(|s| s > 0.0) && r.seconds_to_ready.is_some(), "{r:?}");
    assert!(r.ready_check.as_deref().is_some_and(|c| c.starts_with("passed: backend truth: cpu")), "{r:?}");
    assert!(r.shape_class.starts_with("qwen3moe-h256-e16-top4-ffn256-"), "{r:?}");
    drop(first);

    // The Pod is recreated on the same node: the node's result for the same key and
    // fingerprint is reused, no test runs.
    let second = replica_serve(&model, &node, &[]);
    assert_eq!(ready_until(&second.addr, |s, _| s == 200).0, 200);
    let log = second.log.lock().unwrap().clone();
    assert!(log.contains("reusing the node's result") && !log.contains("model-level threshold test took"), "{log}");
    assert!(report(&node).reused);
}

#[test]
fn a_model_case_failing_below_a_passing_count_keeps_the_replica_not_ready_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let node = dir.path().join("node");
    // Steps of at most 2 rows fail: counts 1 and 2 fail while 12 passes.
    let s = replica_serve(&model, &node, &[("BRINK_INJECT_FAULT", "fail:layer=0,max-rows=2")]);
    let (status, body) = ready_until(&s.addr, |_, b| b.contains("not ready"));
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("model-level threshold test disqualified") && body.contains("first failing case model/"), "{body}");
    // It stays so: the engine is loaded, the hold does not lift.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(http(&s.addr, "GET", "/ready", "").0, 503);
    let r = report(&node);
    assert_eq!(r.model_test_state, "disqualified", "{r:?}");
    assert!(r.held.is_some() && !r.failing_cases.is_empty() && r.failing_cases[0].tokens <= 2, "{r:?}");
    assert!(r.seconds_to_ready.is_none(), "{r:?}");
}

#[test]
fn an_engine_claiming_a_backend_it_does_not_run_on_is_never_ready() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let node = dir.path().join("node");
    let s = replica_serve(&model, &node, &[("BRINK_TEST_CLAIM_BACKEND", "cuda")]);
    let (status, body) = ready_until(&s.addr, |_, b| b.contains("not ready"));
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("backend truth failed: asked for the cpu backend, the engine reports cuda"), "{body}");
    let (_, engine) = http(&s.addr, "GET", "/engine", "");
    assert!(engine.contains("\"readyCheck\":\"failed: backend truth failed"), "{engine}");
}

#[test]
fn backend_cuda_without_a_gpu_refuses_to_start() {
    if brink_kernels::cuda::Gpu::open(0).is_ok() {
        eprintln!("a CUDA GPU is present: nothing to refuse here");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let out = agent().args(["serve", "--port", "0", "--backend", "cuda", "--model"]).arg(&model).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--backend cuda: no usable CUDA GPU") && err.contains("refusing to start rather than fall back to the cpu"),
        "{err}"
    );
}
