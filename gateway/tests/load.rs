//! Under load on loopback, through the gateway, to three REAL `brink-agent serve` processes
//! (the synthetic tiny model on the CPU; alpha on two of them, beta on the third): a `kill -9`
//! of one replica's engine, and then of a whole replica process, while clients send requests
//! (32 at once, some streamed). No request that had sent nothing to its client fails: the
//! replica re-queues its own requests after an engine restart, and the gateway sends a request
//! refused or cut off before any body byte to the other replica. None is lost (every request
//! has exactly one outcome) and none is answered twice (every answer's id is distinct). Only a
//! stream that had already sent text may fail.
//!
//! It also prints the figures of each phase (requests, outcomes by kind, p50/p99 latency),
//! including the same replica measured straight and through the gateway.
#![cfg(unix)]

mod common;

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use brink_engine::synth::{self, Preset, SynthSpec};
use brink_gateway::pick::{prompt_key, rendezvous_choice};
use common::*;
use http_body_util::BodyExt;
use serde_json::{Value as Json, json};

/// Requests of each phase, and at once (the bound of the test: seconds on a CI machine).
const REQUESTS: usize = 300;
const CONCURRENCY: usize = 32;
/// Prompt characters of the affinity key: less than the prefix the affinity check resends.
const AFFINITY_CHARS: usize = 400;
/// Loading the tiny model on a loaded 2-core CI machine is slow; this bounds it.
const LOAD_DEADLINE: Duration = Duration::from_secs(180);
/// One phase, kills and all.
const PHASE_DEADLINE: Duration = Duration::from_secs(240);

/// `brink-agent`, next to this test's executable's folder (`target/<profile>/`): CI's
/// `cargo build --workspace --all-targets` builds it before the tests run.
fn agent_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("the test's own path");
    let dir = exe.parent().and_then(|deps| deps.parent()).expect("target/<profile>/deps/<test>");
    let program = dir.join(format!("brink-agent{}", std::env::consts::EXE_SUFFIX));
    assert!(
        program.is_file(),
        "{} is missing: build it first with `cargo build -p brink-agent --bin brink-agent` in the tests' profile \
         (`--profile test` under `cargo test`)",
        program.display()
    );
    program
}

struct Replica {
    url: String,
    child: Child,
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn start_replica(model: &Path, name: &str, scratch: &Path, n: usize) -> Replica {
    let port = free_port();
    let log = std::fs::File::create(scratch.join(format!("replica-{n}.log"))).unwrap();
    let child = Command::new(agent_binary())
        .args(["serve", "--backend", "cpu", "--host", "127.0.0.1", "--slots", "2", "--context", "512"])
        .args(["--max-batch-tokens", "256", "--prefill-chunk", "64", "--max-queue", "256", "--quarantine-min-chunk", "1"])
        .arg("--model")
        .arg(model)
        .args(["--port", &port.to_string(), "--served-model-name", name])
        .arg("--stall-dir")
        .arg(scratch.join(format!("stalls-{n}")))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("brink-agent serve starts");
    Replica { url: format!("http://127.0.0.1:{port}"), child }
}

async fn metric_of(url: &str, name: &str) -> f64 {
    let m = call(&format!("{url}/metrics"), "GET", &[], "").await.body;
    metric(&m, name, &[]).unwrap_or(0.0)
}

async fn wait_ready(url: &str) {
    let t0 = Instant::now();
    // Connection refused until the server listens: not ready yet, not a failure.
    let ready = || async { client().request(request(&format!("{url}/ready"), "GET", &[], "")).await.is_ok_and(|r| r.status() == 200) };
    while !ready().await {
        assert!(t0.elapsed() < LOAD_DEADLINE, "{url} did not become ready");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `scripts/sdk_client.py` (the openai and anthropic packages) against `base`, for `model`;
/// skipped without the packages unless BRINK_REQUIRE_PY=1.
async fn sdk_round_trip(base: &str, model: &str) {
    let have = Command::new("python3").args(["-c", "import openai, anthropic"]).output().is_ok_and(|o| o.status.success());
    if !have {
        let msg = "python3 with the `openai` and `anthropic` packages (see scripts/test) is not available";
        assert!(std::env::var("BRINK_REQUIRE_PY").as_deref() != Ok("1"), "BRINK_REQUIRE_PY=1 but {msg}");
        eprintln!("skipping the SDK round trip: {msg}");
        return;
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/sdk_client.py");
    let (base_url, name) = (base.to_string(), model.to_string());
    let out = tokio::task::spawn_blocking(move || Command::new("python3").arg(&script).arg(&base_url).arg(&name).output().unwrap())
        .await
        .unwrap();
    assert!(out.status.success(), "sdk_client.py {model}: {}", String::from_utf8_lossy(&out.stderr));
    let v: Json = serde_json::from_slice(&out.stdout).unwrap();
    let text = v["openai"]["text"].as_str().unwrap_or_else(|| panic!("{model}: {v}"));
    for key in ["openai_stream", "anthropic", "anthropic_stream"] {
        assert_eq!(v[key]["text"].as_str(), Some(text), "{model} {key}: {v}");
    }
    assert_eq!(v["openai_stream"]["prompt_tokens"], v["openai"]["prompt_tokens"], "{model}: {v}");
    assert!(v["openai_tools"]["prompt_tokens"].as_u64().is_some_and(|n| n > 0), "{model}: {v}");
    assert!(v["anthropic_tools"]["input_tokens"].as_u64().is_some_and(|n| n > 0), "{model}: {v}");
    for (name, class, status) in [
        ("openai_unknown_model", "NotFoundError", 404),
        ("openai_absurd_max_tokens", "BadRequestError", 400),
        ("openai_empty_messages", "BadRequestError", 400),
        ("anthropic_unknown_model", "NotFoundError", 404),
        ("anthropic_empty_messages", "BadRequestError", 400),
    ] {
        let e = &v["errors"][name];
        assert_eq!((e["class"].as_str(), e["status"].as_u64()), (Some(class), Some(status)), "{model} {name}: {v}");
    }
}

fn kill9(pid: u32) {
    let ok = Command::new("kill").args(["-9", &pid.to_string()]).status().map(|s| s.success()).unwrap_or(false);
    assert!(ok, "kill -9 {pid}");
}

/// What a client saw of one request.
#[derive(Clone, Debug)]
enum Seen {
    Answered(String),
    /// A stream that broke after it had sent text: a restart cannot hide that.
    FailedAfterOutput,
    /// Refused by a replica's quarantine because a kill hit its prompt in a prefill chunk of one
    /// token, which cannot be halved (the one refusal the engine's own load test allows too).
    RefusedAtOneToken,
    /// Anything else that is not an answer, by kind (`http_503`, `reset`, ...).
    Error(String, String),
}

/// One request, non-streaming or streamed, read frame by frame.
async fn one(base: &str, model: &str, i: usize, stream: bool) -> Seen {
    // Distinct prompts, 20 to 59 words: prefills of several lengths meet each kill.
    let words: Vec<&str> = (0..20 + i % 40).map(|w| ["the", "quick", "brown", "fox", "jumps"][(w + i) % 5]).collect();
    let body = json!({"model": model, "prompt": words.join(" "), "max_tokens": 4, "temperature": 0, "stream": stream});
    let req = request(&format!("{base}/v1/completions"), "POST", &[("content-type", "application/json")], &body.to_string());
    let resp = match client().request(req).await {
        Ok(r) => r,
        Err(e) => return Seen::Error("connection".into(), describe(&e)),
    };
    let status = resp.status().as_u16();
    let mut body = resp.into_body();
    let mut text = String::new();
    let mut sent = false;
    loop {
        match body.frame().await {
            None => break,
            Some(Ok(f)) => {
                if let Ok(data) = f.into_data() {
                    text.push_str(&String::from_utf8_lossy(&data));
                    sent |= stream && text.contains("\"text\":\"") && text.contains("\"choices\":[{");
                }
            }
            Some(Err(e)) => {
                return if sent { Seen::FailedAfterOutput } else { Seen::Error("body_cut".into(), e.to_string()) };
            }
        }
    }
    if status == 422 && text.contains("in a prefill chunk of 1 tokens") {
        return Seen::RefusedAtOneToken;
    }
    if status != 200 {
        return Seen::Error(format!("http_{status}"), text);
    }
    if !stream {
        return match serde_json::from_str::<Json>(&text).ok().and_then(|v| v["id"].as_str().map(String::from)) {
            Some(id) => Seen::Answered(id),
            None => Seen::Error("bad_body".into(), text),
        };
    }
    let mut id = None;
    let mut had_output = false;
    for line in text.lines().filter_map(|l| l.strip_prefix("data: ")) {
        if line == "[DONE]" {
            return match id {
                Some(id) => Seen::Answered(id),
                None => Seen::Error("bad_stream".into(), text),
            };
        }
        let Ok(v) = serde_json::from_str::<Json>(line) else { return Seen::Error("bad_stream".into(), text) };
        if v.get("error").is_some() {
            return if had_output { Seen::FailedAfterOutput } else { Seen::Error("stream_error".into(), text) };
        }
        id = v["id"].as_str().map(String::from).or(id);
        had_output |= v["choices"].as_array().is_some_and(|c| c.iter().any(|c| c["text"].as_str().is_some_and(|t| !t.is_empty())));
    }
    if had_output { Seen::FailedAfterOutput } else { Seen::Error("stream_cut".into(), text) }
}

fn describe(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut s = e.source();
    while let Some(c) = s {
        out += &format!(": {c}");
        s = c.source();
    }
    out
}

struct Phase {
    name: &'static str,
    seen: Vec<(Seen, Duration)>,
    wall: Duration,
}

impl Phase {
    fn report(&self) -> String {
        let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
        for (s, _) in &self.seen {
            let k = match s {
                Seen::Answered(_) => "answered".to_string(),
                Seen::FailedAfterOutput => "stream_failed_after_output".to_string(),
                Seen::RefusedAtOneToken => "refused_at_one_token".to_string(),
                Seen::Error(kind, _) => format!("error_{kind}"),
            };
            *kinds.entry(k).or_default() += 1;
        }
        let mut lat: Vec<f64> = self.seen.iter().map(|(_, d)| d.as_secs_f64() * 1000.0).collect();
        lat.sort_by(f64::total_cmp);
        let q = |p: f64| lat[((lat.len() as f64 * p).ceil() as usize).clamp(1, lat.len()) - 1];
        format!(
            "load figures: {}: {} requests in {:.1} s, {kinds:?}, latency p50 {:.0} ms, p99 {:.0} ms",
            self.name,
            self.seen.len(),
            self.wall.as_secs_f64(),
            q(0.50),
            q(0.99)
        )
    }

    fn errors(&self) -> Vec<String> {
        self.seen.iter().filter_map(|(s, _)| if let Seen::Error(k, m) = s { Some(format!("{k}: {m}")) } else { None }).collect()
    }

    fn answer_ids(&self) -> Vec<String> {
        self.seen.iter().filter_map(|(s, _)| if let Seen::Answered(id) = s { Some(id.clone()) } else { None }).collect()
    }
}

/// `REQUESTS` requests, `CONCURRENCY` at once, `model_of(i)` each (every 5th streamed); `at_third`
/// runs once a third of them have started.
async fn run_phase(
    name: &'static str,
    base: &str,
    model_of: fn(usize) -> &'static str,
    at_third: impl std::future::Future<Output = ()> + Send + 'static,
) -> Phase {
    let next = Arc::new(AtomicUsize::new(0));
    let t0 = Instant::now();
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..CONCURRENCY {
        let (next, base) = (next.clone(), base.to_string());
        workers.spawn(async move {
            let mut out = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= REQUESTS {
                    return out;
                }
                let t = Instant::now();
                let seen = one(&base, model_of(i), i, i % 5 == 4).await;
                out.push((seen, t.elapsed()));
            }
        });
    }
    let trigger = {
        let next = next.clone();
        tokio::spawn(async move {
            while next.load(Ordering::Relaxed) < REQUESTS / 3 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            at_third.await;
        })
    };
    let mut seen = Vec::new();
    let collect = async {
        while let Some(r) = workers.join_next().await {
            seen.extend(r.expect("a client panicked"));
        }
    };
    tokio::time::timeout(PHASE_DEADLINE, collect).await.unwrap_or_else(|_| panic!("{name}: not done in {PHASE_DEADLINE:?}"));
    trigger.await.expect("the kill ran");
    Phase { name, seen, wall: t0.elapsed() }
}

fn check(phase: &Phase) {
    eprintln!("{}", phase.report());
    assert_eq!(phase.seen.len(), REQUESTS, "{}: a request has no outcome", phase.name);
    let errors = phase.errors();
    assert!(errors.is_empty(), "{}: {} client-visible errors: {errors:#?}", phase.name, errors.len());
    let ids = phase.answer_ids();
    assert_eq!(ids.iter().collect::<HashSet<_>>().len(), ids.len(), "{}: an answer was delivered twice", phase.name);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_an_engine_or_a_replica_under_load_fails_no_request_that_had_sent_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny.gguf");
    synth::generate(&SynthSpec::from_preset(Preset::Tiny), &model, |_, _| {}).unwrap_or_else(|e| panic!("{e}"));
    let r0 = start_replica(&model, "alpha", dir.path(), 0);
    let mut r1 = start_replica(&model, "alpha", dir.path(), 1);
    let r2 = start_replica(&model, "beta", dir.path(), 2);
    for r in [&r0, &r1, &r2] {
        wait_ready(&r.url).await;
    }
    let mut config = brink_gateway::Config::new(vec![r0.url.clone(), r1.url.clone(), r2.url.clone()]);
    config.poll_interval = Duration::from_millis(100);
    config.affinity_prefix_chars = AFFINITY_CHARS;
    let gw = gateway(config).await;
    wait_models(&gw, &[], &["alpha", "brink", "beta"]).await;

    // Both official SDKs through the gateway, to each model: plain and streamed, both APIs,
    // tool calls, and the errors' classes (the gateway's 404 for an unknown model included).
    for model in ["alpha", "beta"] {
        sdk_round_trip(&gw.url, model).await;
    }

    // Prefix affinity with real engines: a long prompt resent with new questions goes to the
    // replica rendezvous hashing gives its prefix, which then reads the prefix from its cache.
    // The prefix is picked to hash to r1: without affinity, equal loads would send every
    // request to r0 (the first --upstream).
    let hits = |m: &str| metric(m, "brink_gateway_affinity_hits_total", &[("model", "alpha")]).unwrap_or(0.0);
    let hits_before = hits(&metrics(&gw).await);
    for (want, other) in [(&r1, &r0), (&r0, &r1)] {
        let names = [r0.url.as_str(), r1.url.as_str()];
        let want_index = usize::from(std::ptr::eq(want, &r1));
        // The salt leads: the affinity key reads only the prompt's first AFFINITY_CHARS, so a
        // salt at the end left five distinct keys, and with 1 chance in 32 (the ports enter the
        // hash) none chose `want` and this search never ended.
        let prefix = (0..)
            .map(|salt: usize| {
                format!("{salt} ")
                    + &(0..120).map(|w| ["alpha", "beta", "gamma", "delta", "eps"][(w * 3 + salt) % 5]).collect::<Vec<_>>().join(" ")
            })
            .find(|p| rendezvous_choice(prompt_key(p, AFFINITY_CHARS).unwrap(), &names) == Some(want_index))
            .unwrap();
        let (before_want, before_other) =
            (metric_of(&want.url, "brink_requests_total").await, metric_of(&other.url, "brink_requests_total").await);
        let mut cached = Vec::new();
        for turn in 0..3 {
            let body = json!({"model": "alpha", "prompt": format!("{prefix} question {turn}"), "max_tokens": 2, "temperature": 0});
            let r = post(&format!("{}/v1/completions", gw.url), &body).await;
            assert_eq!(r.status, 200, "{}", r.body);
            cached.push(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap_or(0));
        }
        assert_eq!(metric_of(&want.url, "brink_requests_total").await - before_want, 3.0, "the prefix's replica answered every turn");
        assert_eq!(metric_of(&other.url, "brink_requests_total").await - before_other, 0.0, "the other replica answered none");
        assert!(cached[1] > 0 && cached[2] > 0, "later turns read the prefix from the cache: cached tokens {cached:?}");
    }
    let m = metrics(&gw).await;
    assert_eq!(hits(&m) - hits_before, 6.0, "every turn went to its prefix's replica by affinity: {m}");

    // The same replica (beta's only one) straight and through the gateway, no kills: what the
    // gateway adds to latency.
    let direct = run_phase("straight to a replica", &r2.url.clone(), |_| "beta", async {}).await;
    check(&direct);
    let through = run_phase("through the gateway, same replica", &gw.url, |_| "beta", async {}).await;
    check(&through);

    // kill -9 of r0's engine a third of the way in: r0 restarts it and re-queues its requests.
    let alpha_mostly = |i: usize| if i % 4 == 3 { "beta" } else { "alpha" };
    let engine_pid = metric_of(&r0.url, "brink_engine_pid").await as u32;
    assert!(engine_pid > 0, "no engine pid in r0's /metrics");
    let kill_engine = async move { kill9(engine_pid) };
    let phase = run_phase("engine kill -9 (through the gateway)", &gw.url, alpha_mostly, kill_engine).await;
    check(&phase);
    assert_eq!(metric_of(&r0.url, "brink_engine_restarts_total").await, 1.0, "r0's engine was not restarted");
    wait_ready(&r0.url).await;

    // kill -9 of the whole r1 process (its engine child goes with its stdin): the gateway sends
    // what r1 refused or cut off before any body byte to r0.
    let r1_engine = metric_of(&r1.url, "brink_engine_pid").await as u32;
    let r1_pid = r1.child.id();
    let phase = run_phase("replica process kill -9 (through the gateway)", &gw.url, alpha_mostly, async move { kill9(r1_pid) }).await;
    let _ = r1.child.wait();
    // The orphaned engine reads its parent's closed pipe and exits; make sure of it.
    let _ = Command::new("kill").args(["-9", &r1_engine.to_string()]).stderr(Stdio::null()).status();
    check(&phase);
    let m = metrics(&gw).await;
    eprintln!("load figures: gateway retries {:?}", m.lines().filter(|l| l.starts_with("brink_gateway_retries_total")).collect::<Vec<_>>());
    drop(r0);
    drop(r2);
}
