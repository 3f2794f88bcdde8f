//! `brink-agent qualify --url`: the black-box threshold qualification against brink's own
//! `serve` (CPU, tiny synthetic model), against llama.cpp's server (llama-cpp-python's
//! OpenAI-compatible server on the same model; skipped when it is not installed, unless
//! BRINK_REQUIRE_PY=1), and against the stand-ins that break as engines do: each is flagged with
//! its verdict (clamp under a 500 threshold; refuse a residue hang; refuse a worker that dies).
//! Small contexts keep the derived lengths cheap on two cores; the derivation at full shape is
//! the plan module's table tests.

mod common;
mod support;

use std::net::TcpListener;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{agent, http, serve, tiny_model};
use serde_json::Value;
use support::standin::{self, Fault};

/// The engine limits of every CPU run: small, so each case is a short prefill.
const LIMITS: [&str; 6] = ["--context", "1024", "--max-batch-tokens", "512", "--prefill-chunk", "256"];

fn qualify(url: &str, extra: &[&str]) -> (Output, Option<Value>) {
    let dir = tempfile::tempdir().unwrap();
    let out_file = dir.path().join("report.json");
    let out = agent().args(["qualify", "--url", url, "--out", out_file.to_str().unwrap()]).args(extra).output().unwrap();
    // The table, as printed, for the log.
    eprintln!("{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let report = std::fs::read_to_string(&out_file).ok().map(|t| serde_json::from_str(&t).unwrap());
    (out, report)
}

fn cases<'a>(r: &'a Value, result: &str) -> Vec<&'a Value> {
    r["cases"].as_array().unwrap().iter().filter(|c| c["result"] == result).collect()
}

#[test]
fn stand_ins_are_flagged_with_their_verdicts() {
    let fail = standin::start(Fault::FailFrom(700), false);
    let hang = standin::start(Fault::HangResidue(17), true);
    let die = standin::start(Fault::DieAt(600), false);
    let args = [&LIMITS[..], &["--deadline-s", "1"]].concat();
    // The three run at once: each waits on its own deadlines.
    let runs: Vec<_> = [fail.url.clone(), hang.url.clone(), die.url.clone()]
        .into_iter()
        .map(|url| {
            let args = args.clone();
            std::thread::spawn(move || qualify(&url, &args))
        })
        .collect();
    let mut results = runs.into_iter().map(|h| h.join().unwrap());

    // A 500 from 700 tokens on: clamped to 699, bisected to the token.
    let (out, r) = results.next().unwrap();
    let r = r.expect("a report");
    assert_eq!(out.status.code(), Some(0), "{r}");
    assert_eq!(r["verdict"], serde_json::json!({"state": "clamped", "maxTokens": 699, "firstFailure": 700}));
    let failed = cases(&r, "failed");
    assert!(!failed.is_empty());
    for c in &failed {
        assert!(c["tokens"].as_u64().unwrap() >= 700, "{c}");
        assert!(c["detail"].as_str().unwrap().contains("HTTP 500"), "{c}");
    }
    assert!(cases(&r, "passed").iter().any(|c| c["tokens"] == 699), "the clamp is a length shown to pass");
    assert!(r["cases"].as_array().unwrap().iter().any(|c| c["kernel"] == "http/4-concurrent" && c["result"] == "passed"));
    assert_eq!(r["lengthMismatches"], 0);
    assert!(r["sizing"].as_str().unwrap().contains("usage"), "{}", r["sizing"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("CLAMP: admit prompts of at most 699 tokens"));

    // A hang at residue 17 mod 64 with passes above it: refused, each hang named.
    let (out, r) = results.next().unwrap();
    let r = r.expect("a report");
    assert_eq!(out.status.code(), Some(1), "{r}");
    assert_eq!(r["verdict"]["state"], "disqualified", "{}", r["verdict"]);
    let hung = cases(&r, "hung");
    assert!(hung.len() >= 2, "{hung:?}");
    for c in &hung {
        assert!(c["batch"].as_array().unwrap().iter().any(|n| n.as_u64().unwrap() % 64 == 17), "{c}");
        assert!(c["detail"].as_str().unwrap().contains("deadline"), "{c}");
    }
    assert!(cases(&r, "passed").iter().any(|c| c["tokens"].as_u64().unwrap() > 900));
    assert!(r["sizing"].as_str().unwrap().contains("/tokenize (usage adds 1)"), "{}", r["sizing"]);
    assert!(r["engineDied"].is_null());
    assert_eq!(r["lengthMismatches"], 0);

    // A worker that dies at 600 tokens and refuses everything after: refused, the engine named dead.
    let (out, r) = results.next().unwrap();
    let r = r.expect("a report");
    assert_eq!(out.status.code(), Some(1), "{r}");
    assert!(die.dead());
    let reason = r["verdict"]["reason"].as_str().unwrap();
    assert!(reason.contains("stopped answering") && reason.contains("503"), "{reason}");
    let died = r["engineDied"].as_str().unwrap();
    assert!(died.contains("connection dropped"), "{died}");
    let first_failure = cases(&r, "failed")[0];
    assert!(first_failure["tokens"].as_u64().unwrap() >= 600, "{first_failure}");
    assert!(cases(&r, "skipped").iter().any(|c| c["detail"].as_str().unwrap().starts_with("not run: after")));
    assert!(String::from_utf8_lossy(&out.stdout).contains("engine died:"));
    // Nothing passed at or past the length that killed it.
    assert!(cases(&r, "passed").iter().all(|c| c["tokens"].as_u64().unwrap() < 600));
}

/// `--replica-report FILE` (the qualification sidecar of an external engine's replica): the
/// verdict as the replica's `status.qualification`, which the node's agent publishes. A clamp
/// says the longest prompt admitted and the first failure, and does not hold the Pod.
#[test]
fn the_replica_report_carries_a_clamp_for_the_replicas_status() {
    let fail = standin::start(Fault::FailFrom(700), false);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("replicas/llm/qwen-0.json");
    let args = [&LIMITS[..], &["--deadline-s", "1", "--replica-report", file.to_str().unwrap()]].concat();
    let (out, r) = qualify(&fail.url, &args);
    assert_eq!(out.status.code(), Some(0), "{r:?}");
    let q: brink_api::crd::ReplicaQualification = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(
        (q.model_test_state.as_str(), q.admitted_prompt_tokens, q.first_failure_tokens, q.held.as_deref()),
        ("clamped", Some(699), Some(700), None)
    );
    assert_eq!(q.method, Some(brink_api::crd::QualificationMethod::BlackBox));
    assert!(q.failing_cases.first().is_some_and(|c| c.tokens >= 700 && c.detail.contains("HTTP 500")), "{q:?}");
    assert!(q.model_test_message.contains("CLAMPED to 699 tokens (first failure at 700)"), "{}", q.model_test_message);
}

#[test]
fn bad_engines_and_flags_are_named_with_exit_2() {
    let failed_with = |out: &Output, needles: &[&str]| {
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        for n in needles {
            assert!(err.contains(n), "no `{n}` in: {err}");
        }
    };
    // Nothing listens there.
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let url = format!("http://127.0.0.1:{port}");
    failed_with(&qualify(&url, &LIMITS).0, &["cannot reach", &url]);
    // A server that is not an OpenAI one.
    let fake = standin::start(Fault::NotOpenAi, false);
    failed_with(&qualify(&fake.url, &LIMITS).0, &["/v1/completions", "not an OpenAI-compatible completion", "not JSON"]);
    let lists_none = standin::start(Fault::NoModels, false);
    failed_with(&qualify(&lists_none.url, &LIMITS).0, &["/v1/models", "lists no models"]);
    let ok = standin::start(Fault::FailFrom(u64::MAX), false);
    failed_with(&qualify(&ok.url, &["--model", "other"]).0, &["--model other", "lists standin"]);
    failed_with(&qualify(&ok.url, &["--deadline-s", "0"]).0, &["--deadline-s 0"]);
    failed_with(&qualify(&ok.url, &["--shape", "/nonexistent/model.gguf"]).0, &["--shape /nonexistent/model.gguf"]);
    failed_with(&qualify("https://example.com", &[]).0, &["--url https://example.com", "https"]);
    let out = agent().args(["qualify", "--url", &ok.url, "--top-k", "0"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "clap's own refusal");
    assert_eq!(ok.completions(), 0, "bad flags are refused before anything is sent");
}

#[test]
fn qualifies_brink_serve() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let m = model.to_str().unwrap();
    // Half the other engines' limits: brink's CPU backend computes as llama.cpp's CPU backend
    // does, bit for bit, without its speed, and the cases' cost grows with the context.
    let (mut server, addr) =
        serve(&["--model", m, "--backend", "cpu", "--context", "512", "--max-batch-tokens", "256", "--prefill-chunk", "128"]);
    let t0 = Instant::now();
    let (out, r) = qualify(&format!("http://{addr}"), &["--shape", m, "--max-batch-tokens", "256", "--prefill-chunk", "128"]);
    eprintln!("qualify against serve: {:.1} s", t0.elapsed().as_secs_f64());
    let _ = server.kill();
    let _ = server.wait();
    let r = r.expect("a report");
    assert_eq!(out.status.code(), Some(0), "{r}");
    assert_eq!(r["verdict"], serde_json::json!({"state": "qualified", "maxTokens": 510}));
    assert_eq!(r["limits"]["context"], 512);
    assert_eq!(r["limits"]["contextSource"], "GET /engine");
    assert_eq!(r["lengthMismatches"], 0);
    assert_eq!(r["shapeClass"], brink_engine_class(&model));
    assert!(r["passed"].as_u64().unwrap() >= 100, "{}", r["passed"]);
    assert!(r["skipped"].as_u64().unwrap() > 0, "lengths past the context are listed");
}

fn brink_engine_class(model: &std::path::Path) -> String {
    let file = brink_engine::gguf::GgufFile::open(model).unwrap();
    brink_engine::arch::config(&file).unwrap().shape_class()
}

/// llama-cpp-python's server, or why not.
fn have_llama_server() -> bool {
    let ok = Command::new("python3").args(["-c", "import llama_cpp.server.app, uvicorn"]).output().is_ok_and(|o| o.status.success());
    if !ok {
        let msg = "python3 with llama-cpp-python's server (pip install 'llama-cpp-python[server]==0.3.36') is not available";
        assert!(std::env::var("BRINK_REQUIRE_PY").as_deref() != Ok("1"), "BRINK_REQUIRE_PY=1 but {msg}");
        eprintln!("skipping the llama.cpp server qualification: {msg}");
    }
    ok
}

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn qualifies_llama_cpp_server() {
    if !have_llama_server() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let m = model.to_str().unwrap();
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port().to_string();
    let server = Command::new("python3")
        .args(["-m", "llama_cpp.server", "--model", m, "--host", "127.0.0.1", "--port", &port])
        .args(["--n_ctx", "1024", "--n_batch", "512", "--n_ubatch", "256", "--n_threads", "2"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut server = Killed(server);
    let addr = format!("127.0.0.1:{port}");
    let t0 = Instant::now();
    while http(&addr, "GET", "/v1/models", "").0 != 200 {
        assert!(server.0.try_wait().unwrap().is_none(), "llama_cpp.server exited");
        assert!(t0.elapsed() < Duration::from_secs(120), "llama_cpp.server not up in 120 s");
        std::thread::sleep(Duration::from_millis(200));
    }
    let t0 = Instant::now();
    let (out, r) = qualify(&format!("http://{addr}"), &[&LIMITS[..], &["--shape", m]].concat());
    eprintln!("qualify against llama.cpp's server: {:.1} s", t0.elapsed().as_secs_f64());
    let r = r.expect("a report");
    assert_eq!(out.status.code(), Some(0), "{r}");
    assert_eq!(r["verdict"], serde_json::json!({"state": "qualified", "maxTokens": 1022}));
    assert_eq!(r["lengthMismatches"], 0);
    assert!(r["sizing"].as_str().unwrap().contains("/extras/tokenize"), "{}", r["sizing"]);
    assert!(r["passed"].as_u64().unwrap() >= 100, "{}", r["passed"]);
    drop(server);
}

/// llama.cpp's own `llama-server` and `ggml-rpc-server` (scripts/llama-cpp-bin builds them once
/// from the pinned source; scripts/test sets BRINK_LLAMA_CPP_BIN to their folder), or why not.
fn llama_cpp_bin() -> Option<std::path::PathBuf> {
    let Some(dir) = std::env::var_os("BRINK_LLAMA_CPP_BIN").map(std::path::PathBuf::from) else {
        let msg = "BRINK_LLAMA_CPP_BIN is not set (run scripts/llama-cpp-bin and set it to the folder it prints)";
        assert!(std::env::var("BRINK_REQUIRE_PY").as_deref() != Ok("1"), "BRINK_REQUIRE_PY=1 but {msg}");
        eprintln!("skipping the llama.cpp gang: {msg}");
        return None;
    };
    for bin in ["llama-server", "ggml-rpc-server"] {
        assert!(dir.join(bin).is_file(), "BRINK_LLAMA_CPP_BIN={} has no {bin}", dir.display());
    }
    Some(dir)
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Waits until `addr` accepts connections (and `process` is still running).
fn wait_listening(process: &mut Killed, addr: &str, what: &str, log: &std::path::Path) {
    let t0 = Instant::now();
    while std::net::TcpStream::connect(addr).is_err() {
        let exited = process.0.try_wait().unwrap();
        assert!(exited.is_none(), "{what} exited ({exited:?}): {}", std::fs::read_to_string(log).unwrap_or_default());
        assert!(t0.elapsed() < Duration::from_secs(60), "{what} not listening on {addr} in 60 s");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A real two-node llama.cpp gang on loopback, as the operator runs one over a fabric: two
/// `ggml-rpc-server` workers and a leader `llama-server --rpc` with every layer on the workers
/// (the flags of a gang leader's command, the serving limits of the CPU tests). The black-box
/// qualification, a chat request and a regression sweep pass through it; then one worker is
/// killed, and the leader fails and the qualification (the sidecar that owns a replica's
/// readiness) refuses the gang.
#[test]
fn a_llama_cpp_gang_on_loopback_qualifies_serves_and_fails_with_a_worker() {
    let Some(bin) = llama_cpp_bin() else { return };
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let m = model.to_str().unwrap();

    let mut workers = Vec::new();
    let mut rpc = Vec::new();
    for w in 1..=2 {
        let addr = format!("127.0.0.1:{}", free_port());
        let log = dir.path().join(format!("worker{w}.log"));
        let (host, port) = addr.split_once(':').unwrap();
        let child = Command::new(bin.join("ggml-rpc-server"))
            .args(["--host", host, "--port", port, "--threads", "1"])
            .stdout(Stdio::from(std::fs::File::create(&log).unwrap()))
            .stderr(Stdio::from(std::fs::File::create(dir.path().join(format!("worker{w}.err"))).unwrap()))
            .spawn()
            .unwrap();
        let mut child = Killed(child);
        wait_listening(&mut child, &addr, &format!("worker {w}"), &log);
        workers.push(child);
        rpc.push(addr);
    }

    let port = free_port().to_string();
    let addr = format!("127.0.0.1:{port}");
    let leader_log = dir.path().join("leader.log");
    let leader = Command::new(bin.join("llama-server"))
        .args(["-m", m, "--alias", "tiny", "--host", "127.0.0.1", "--port", &port])
        .args(["-c", "1024", "--batch-size", "512", "--ubatch-size", "256", "--parallel", "1"])
        .args(["--n-gpu-layers", "999", "--metrics", "--threads", "1", "--rpc", &rpc.join(",")])
        // Debug logging: the model's buffers on each RPC device are logged at this level only.
        .args(["-lv", "4"])
        .stdout(Stdio::null())
        .stderr(Stdio::from(std::fs::File::create(&leader_log).unwrap()))
        .spawn()
        .unwrap();
    let mut leader = Killed(leader);
    let log = || std::fs::read_to_string(&leader_log).unwrap_or_default();
    let t0 = Instant::now();
    while http(&addr, "GET", "/health", "").0 != 200 {
        assert!(leader.0.try_wait().unwrap().is_none(), "the leader exited: {}", log());
        assert!(t0.elapsed() < Duration::from_secs(120), "the leader not healthy in 120 s: {}", log());
        std::thread::sleep(Duration::from_millis(200));
    }
    // The weights are on the workers: each RPC device got a model buffer.
    for a in &rpc {
        assert!(
            log().lines().any(|l| l.contains("RPC") && l.contains(a.as_str()) && l.contains("model buffer")),
            "no model buffer on {a}: {}",
            log()
        );
    }

    let t0 = Instant::now();
    let (out, r) = qualify(&format!("http://{addr}"), &[&LIMITS[..], &["--shape", m, "--model", "tiny"]].concat());
    eprintln!("qualify against the llama.cpp gang: {:.1} s", t0.elapsed().as_secs_f64());
    let r = r.expect("a report");
    assert_eq!(out.status.code(), Some(0), "{r}");
    assert_eq!(r["verdict"]["state"], "qualified", "{}", r["verdict"]);
    assert_eq!(r["lengthMismatches"], 0);
    assert!(r["passed"].as_u64().unwrap() >= 100, "{}", r["passed"]);

    let chat =
        serde_json::json!({"model": "tiny", "messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 8, "temperature": 0});
    let (status, body) = http(&addr, "POST", "/v1/chat/completions", &chat.to_string());
    assert_eq!(status, 200, "{body}");
    let answer: Value = serde_json::from_str(&body).unwrap();
    assert!(answer["choices"][0]["message"]["content"].is_string(), "{answer}");
    assert!(answer["usage"]["completion_tokens"].as_u64().unwrap() > 0, "{answer}");
    // The counters a llama.cpp replica's liveness follows are the leader's.
    let (status, metrics) = http(&addr, "GET", "/metrics", "");
    assert_eq!(status, 200);
    for name in
        ["llamacpp:prompt_tokens_total", "llamacpp:tokens_predicted_total", "llamacpp:requests_processing", "llamacpp:requests_deferred"]
    {
        assert!(metrics.lines().any(|l| l.starts_with(name)), "no {name} in /metrics: {metrics}");
    }

    // A node's regression sweep of the gang through its API: the black-box qualification in the
    // self-test's place, then the grid, judged as any node's result (no baseline: a pass).
    // llama-server closes the connection after every streamed answer without saying so: the
    // sizing and measured requests that meet such a closed connection go on a new one.
    let out_file = dir.path().join("sweep.json");
    let out = agent()
        .args(["sweep", "--url", &format!("http://{addr}"), "--model", m, "--model-name", "tiny", "--context", "1024"])
        .args(["--max-batch-tokens", "512", "--prefill-chunk", "256", "--prompt-tokens", "32", "--concurrency", "1,2"])
        .args(["--generated-tokens", "4", "--requests-per-point", "2", "--run", "gang", "--node", "loopback"])
        .args(["--state-dir", dir.path().to_str().unwrap(), "--out", out_file.to_str().unwrap()])
        .output()
        .unwrap();
    eprintln!("{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(0));
    let sweep: Value = serde_json::from_str(&std::fs::read_to_string(&out_file).unwrap()).unwrap();
    let status = &sweep["status"];
    assert_eq!(status["state"], "Done", "{status}");
    assert_eq!(status["judgement"]["verdict"], "Pass", "{status}");
    assert!(status["selfTest"]["failingCases"].as_array().is_none_or(Vec::is_empty), "{status}");
    let points = status["points"].as_array().unwrap();
    assert_eq!(points.len(), 2, "{status}");
    for p in points {
        assert!(p["requests"].as_u64().unwrap() > 0 && p["failed"] == 0 && p["timedOut"] == 0, "{p}");
    }

    // One worker goes: the leader's next computation cannot reach it.
    drop(workers.remove(1));
    let (status, body) = http(&addr, "POST", "/v1/chat/completions", &chat.to_string());
    assert_ne!(status, 200, "the gang answered without a worker: {body}");
    let t0 = Instant::now();
    let exited = loop {
        if let Some(s) = leader.0.try_wait().unwrap() {
            break s;
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "the leader still runs 60 s after losing a worker: {}", log());
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(!exited.success(), "the leader exited cleanly: {}", log());
    assert!(log().contains("Remote RPC server crashed"), "the leader failed for another reason: {}", log());
    let (out, _) = qualify(&format!("http://{addr}"), &LIMITS);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("cannot reach"), "{err}");
}
