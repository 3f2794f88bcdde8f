//! The supervisor under faults and load, end to end on the CPU backend (the engine in its child
//! process): an injected hang is caught as a stall (with re-queueing off, its requests fail with
//! the API's error within the deadline, a report names the layer, queued requests run on the
//! restarted engine, and the same poison request does not stall it again); with re-queueing on,
//! requests that had sent nothing are answered after a stall or a `kill -9`; an injected failure
//! fails only its step; many concurrent streaming clients each get exactly one answer or a
//! clear refusal.

mod common;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;
use serde_json::{Value as Json, json};

const STALL_TIMEOUT: Duration = Duration::from_secs(2);
/// Steps of this many rows or more hit the injected fault; the small requests stay below.
const TRIGGER_ROWS: u64 = 48;

/// A server whose engine hits `fault`; requests in flight at a stall fail rather than run again
/// (the error paths under test; re-queueing has its own tests below).
fn faulty(fault: &str) -> (Running, PathBuf) {
    let mut opts = options(4, 16, Vec::new());
    opts.inject_fault = Some(fault.to_string());
    opts.stall_timeout = STALL_TIMEOUT;
    opts.requeue_after_restart = 0;
    let dir = opts.stall_dir.clone();
    (start(opts), dir)
}

/// A prompt of about `words` tokens (each " word" is at least one token): distinct word counts
/// give distinct prompt lengths, which is what the quarantine keys on.
fn poison_text(words: usize) -> String {
    "word ".repeat(words)
}

fn metric(addr: SocketAddr, name: &str) -> f64 {
    let m = get(addr, "/metrics").body;
    m.lines().find(|l| l.starts_with(&format!("{name} "))).and_then(|l| l.rsplit(' ').next()?.parse().ok()).unwrap_or(0.0)
}

/// The sum of `brink_stalls_total{…}` over its labels, and the label sets.
fn stalls(addr: SocketAddr) -> (f64, Vec<String>) {
    let m = get(addr, "/metrics").body;
    let lines: Vec<&str> = m.lines().filter(|l| l.starts_with("brink_stalls_total{")).collect();
    let total = lines.iter().filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok()).sum();
    (total, lines.iter().map(|l| l.split(' ').next().unwrap_or("").to_string()).collect())
}

fn reports(dir: &Path) -> Vec<Json> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut out: Vec<(PathBuf, Json)> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("stall-")))
        .map(|p| (p.clone(), serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap()))
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out.into_iter().map(|(_, j)| j).collect()
}

/// Posts and measures; asserts the answer came within the watchdog's deadline.
fn timed_post(addr: SocketAddr, path: &str, body: &Json) -> Resp {
    let t0 = Instant::now();
    let r = post(addr, path, body);
    let deadline = STALL_TIMEOUT + Duration::from_secs(8);
    assert!(t0.elapsed() < deadline, "{path} answered after {:?}, past the deadline of {deadline:?}", t0.elapsed());
    r
}

/// Waits until the scheduler runs a sequence (the poison request is in its step), then a moment
/// more for the step to reach the hung layer.
fn wait_running(addr: SocketAddr) {
    let t0 = Instant::now();
    while metric(addr, "brink_requests_running") < 1.0 {
        assert!(t0.elapsed() < Duration::from_secs(10), "the request never started running");
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(300));
}

fn wait_ready(addr: SocketAddr) {
    let t0 = Instant::now();
    while get(addr, "/ready").status != 200 {
        assert!(t0.elapsed() < Duration::from_secs(20), "the engine did not come back");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_stall_fails_its_requests_restarts_the_engine_and_quarantines_the_shape() {
    let (server, dir) = faulty(&format!("hang:layer=1,min-rows={TRIGGER_ROWS}"));
    let addr = server.addr;
    let small = json!({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0});
    assert_eq!(post(addr, "/v1/chat/completions", &small).status, 200, "a small request runs below the trigger");

    // OpenAI, not streaming; a small request is sent while the engine hangs.
    let poison = json!({"model": "tiny", "messages": [{"role": "user", "content": poison_text(90)}], "max_tokens": 4});
    let p = poison.clone();
    let inflight = std::thread::spawn(move || timed_post(addr, "/v1/chat/completions", &p));
    wait_running(addr);
    assert!(!inflight.is_finished(), "the poison request finished before the watchdog could catch it");
    let queued = std::thread::spawn(move || post(addr, "/v1/chat/completions", &small));
    let r = inflight.join().unwrap();
    assert_eq!(r.status, 503, "{}", r.body);
    let msg = r.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(msg.contains("stalled") && msg.contains("layer 1"), "{msg}");
    let q = queued.join().unwrap();
    assert_eq!(q.status, 200, "the request queued during the stall: {}", q.body);

    // The evidence: a report naming layer 1, with the poison's batch and recent progress.
    let rep = reports(&dir);
    assert_eq!(rep.len(), 1, "{rep:?}");
    assert_eq!(rep[0]["kind"], "stall");
    assert_eq!(rep[0]["snapshot"]["layer"], 1, "{}", rep[0]);
    assert_eq!(rep[0]["snapshot"]["op"], "attn_norm");
    assert!(rep[0]["snapshot"]["rows"].as_u64().unwrap() >= TRIGGER_ROWS);
    assert!(rep[0]["batch"][0]["prompt_tokens"].as_u64().unwrap() > TRIGGER_ROWS, "{}", rep[0]);
    assert!(rep[0]["batch"][0]["request"].as_str().unwrap().starts_with("chatcmpl-"), "{}", rep[0]);
    assert!(rep[0]["engine_pid"].as_u64().is_some() && !rep[0]["recent"].as_array().unwrap().is_empty());
    let (n, labels) = stalls(addr);
    assert_eq!(n, 1.0);
    assert_eq!(labels, ["brink_stalls_total{layer=\"1\",op=\"attn_norm\"}"]);
    assert_eq!(metric(addr, "brink_engine_restarts_total"), 1.0);
    assert!(metric(addr, "brink_engine_restart_seconds") > 0.0);
    assert!(metric(addr, "brink_quarantined_prompts") >= 1.0);
    wait_ready(addr);
    assert_eq!(get(addr, "/live").status, 200);

    // The same poison again: served in chunks below the trigger, no second stall.
    let r = timed_post(addr, "/v1/chat/completions", &poison);
    assert_eq!(r.status, 200, "the quarantined prompt: {}", r.body);
    assert_eq!(stalls(addr).0, 1.0, "the same poison request stalled the engine again");
    assert_eq!(metric(addr, "brink_engine_restarts_total"), 1.0);

    // OpenAI streaming: the stream started, then an `error` chunk, then it ends (no [DONE]).
    let mut req = json!({"model": "tiny", "messages": [{"role": "user", "content": poison_text(110)}], "max_tokens": 4, "stream": true});
    let r = timed_post(addr, "/v1/chat/completions", &req);
    assert_eq!(r.status, 200, "{}", r.body);
    let events = sse_events(&r.body);
    let last: Json = serde_json::from_str(&events.last().unwrap().1).unwrap_or_else(|e| panic!("{e}: {}", r.body));
    assert!(last["error"]["message"].as_str().unwrap().contains("layer 1"), "{}", r.body);
    assert!(!r.body.contains("[DONE]"), "{}", r.body);

    // Anthropic, not streaming: 503 in Anthropic's error shape.
    let areq = json!({"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": poison_text(130)}]});
    let r = timed_post(addr, "/v1/messages", &areq);
    assert_eq!(r.status, 503, "{}", r.body);
    let v = r.json();
    assert_eq!(v["type"], "error");
    assert!(v["error"]["message"].as_str().unwrap().contains("layer 1"), "{v}");

    // Anthropic streaming: `event: error`, and the stream ends there. `message_start` carries
    // the prompt's usage (cached tokens included), so it is sent once the prompt is prefilled:
    // a stall in the prefill leaves the error as the only event.
    req = json!({"model": "tiny", "max_tokens": 4, "stream": true, "messages": [{"role": "user", "content": poison_text(150)}]});
    let r = timed_post(addr, "/v1/messages", &req);
    assert_eq!(r.status, 200, "{}", r.body);
    let events = sse_events(&r.body);
    assert!(events.iter().all(|e| e.0 != "message_start"), "{}", r.body);
    let (name, data) = events.last().unwrap();
    assert_eq!(name, "error", "{}", r.body);
    assert!(data.contains("layer 1"), "{data}");
    assert!(!r.body.contains("message_stop"));

    assert_eq!(stalls(addr).0, 4.0);
    assert_eq!(reports(&dir).len(), 4);
    wait_ready(addr);
    let ok = json!({"model": "tiny", "messages": [{"role": "user", "content": "still there?"}], "max_tokens": 3});
    assert_eq!(post(addr, "/v1/chat/completions", &ok).status, 200);
    stop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_poison_prompt_that_cannot_be_chunked_small_enough_is_refused_with_422() {
    let mut opts = options(4, 16, Vec::new());
    opts.inject_fault = Some(format!("hang:layer=1,min-rows={TRIGGER_ROWS}"));
    opts.stall_timeout = STALL_TIMEOUT;
    // Half of the 64-token chunk that stalled is below this floor: no smaller retry is allowed.
    opts.quarantine_min_chunk = 40;
    opts.requeue_after_restart = 0;
    let dir = opts.stall_dir.clone();
    let server = start(opts);
    let addr = server.addr;
    let poison = json!({"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": poison_text(90)}]});
    assert_eq!(timed_post(addr, "/v1/messages", &poison).status, 503);
    wait_ready(addr);
    let r = post(addr, "/v1/messages", &poison);
    assert_eq!(r.status, 422, "{}", r.body);
    let v = r.json();
    assert_eq!(v["type"], "error");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains("stalled the engine 1 time(s)") && msg.contains("smallest chunk allowed: 40"), "{msg}");
    assert_eq!(stalls(addr).0, 1.0);
    // Other prompts are still served.
    let ok = json!({"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]});
    assert_eq!(post(addr, "/v1/messages", &ok).status, 200);
    stop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_injected_failure_fails_its_step_and_the_engine_stays_up() {
    let (server, dir) = faulty(&format!("fail:layer=1,min-rows={TRIGGER_ROWS}"));
    let addr = server.addr;
    let poison = json!({"model": "tiny", "messages": [{"role": "user", "content": poison_text(90)}], "max_tokens": 4});
    let r = post(addr, "/v1/chat/completions", &poison);
    assert_eq!(r.status, 500, "{}", r.body);
    let msg = r.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(msg.contains("injected fault at layer 1"), "{msg}");
    let ok = json!({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4});
    assert_eq!(post(addr, "/v1/chat/completions", &ok).status, 200);
    assert_eq!(metric(addr, "brink_engine_failed_steps_total"), 1.0);
    assert_eq!(metric(addr, "brink_engine_restarts_total"), 0.0, "a failed step is not a reason to restart");
    assert_eq!((get(addr, "/live").status, get(addr, "/ready").status), (200, 200));
    assert!(reports(&dir).is_empty());
    stop(server);
}

fn crash_reports(dir: &Path) -> Vec<Json> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("crash-")))
        .map(|p| serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap())
        .collect()
}

#[cfg(unix)]
/// Kills the engine child this server runs (its pid from `/metrics`), as a CUDA fatal error would.
fn kill_engine(addr: SocketAddr) -> i32 {
    let pid = metric(addr, "brink_engine_pid") as i32;
    assert!(pid > 0, "no engine pid in /metrics");
    // SAFETY: plain kill(2) of the child process this test's server started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0, "kill {pid}");
    pid
}

#[cfg(unix)]
#[test]
fn a_child_that_dies_is_restarted_with_a_crash_report() {
    // A hang the watchdog would only catch after 60 s: the child dies long before that.
    let mut opts = options(4, 16, Vec::new());
    opts.inject_fault = Some(format!("hang:layer=1,min-rows={TRIGGER_ROWS}"));
    opts.stall_timeout = Duration::from_secs(60);
    opts.requeue_after_restart = 0;
    let dir = opts.stall_dir.clone();
    let server = start(opts);
    let addr = server.addr;

    // Dies in a step: the step's request fails at once with 503, the crash report names the stage.
    let poison = json!({"model": "tiny", "messages": [{"role": "user", "content": poison_text(90)}], "max_tokens": 4});
    let inflight = std::thread::spawn(move || post(addr, "/v1/chat/completions", &poison));
    wait_running(addr);
    let t0 = Instant::now();
    let first = kill_engine(addr);
    let r = inflight.join().unwrap();
    assert!(t0.elapsed() < Duration::from_secs(5), "the crash was noticed after {:?}", t0.elapsed());
    assert_eq!(r.status, 503, "{}", r.body);
    assert!(r.json()["error"]["message"].as_str().unwrap().contains("the engine process died"), "{}", r.body);
    let rep = crash_reports(&dir);
    assert_eq!(rep.len(), 1);
    assert_eq!((rep[0]["kind"].as_str(), rep[0]["snapshot"]["layer"].as_u64()), (Some("crash"), Some(1)), "{}", rep[0]);
    assert!(rep[0]["detail"].as_str().unwrap().contains("signal"), "{}", rep[0]);
    wait_ready(addr);

    // Dies while idle: noticed and restarted before the next request needs it.
    let second = metric(addr, "brink_engine_pid") as i32;
    assert_ne!(second, first);
    kill_engine(addr);
    let t1 = Instant::now();
    while metric(addr, "brink_engine_restarts_total") < 2.0 {
        assert!(t1.elapsed() < Duration::from_secs(10), "the idle child's death went unnoticed");
        std::thread::sleep(Duration::from_millis(20));
    }
    wait_ready(addr);
    let ok = json!({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4});
    assert_eq!(post(addr, "/v1/chat/completions", &ok).status, 200);
    assert_eq!(crash_reports(&dir).len(), 2);
    assert_eq!(stalls(addr).0, 0.0, "a crash is not a stall");
    stop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

/// One streamed completion: `Ok(id)` for a complete answer (checked: one finish reason, one
/// [DONE], the usage of this request's own prompt), `Err(status)` for a clear refusal.
fn stream_once(addr: SocketAddr, words: usize, want_prompt_tokens: usize) -> Result<String, u16> {
    let req = json!({"model": "tiny", "prompt": poison_text(words), "max_tokens": 4, "temperature": 0, "stream": true,
        "stream_options": {"include_usage": true}});
    let r = post(addr, "/v1/completions", &req);
    if r.status != 200 {
        assert_eq!(r.status, 503, "{}", r.body);
        assert!(r.header("retry-after").is_some(), "a 503 without Retry-After: {:?}", r.headers);
        assert!(r.json()["error"]["message"].as_str().is_some_and(|m| !m.is_empty()));
        return Err(r.status);
    }
    let events = sse_events(&r.body);
    assert_eq!(events.iter().filter(|e| e.1 == "[DONE]").count(), 1, "{}", r.body);
    assert_eq!(events.last().unwrap().1, "[DONE]");
    let (mut finishes, mut ids, mut usage) = (0, HashSet::new(), None);
    for (_, data) in &events[..events.len() - 1] {
        let v: Json = serde_json::from_str(data).unwrap();
        assert!(v.get("error").is_none(), "{data}");
        ids.insert(v["id"].as_str().unwrap().to_string());
        for c in v["choices"].as_array().unwrap() {
            finishes += c["finish_reason"].is_string() as usize;
        }
        if v["usage"].is_object() {
            usage = Some(v["usage"].clone());
        }
    }
    assert_eq!(finishes, 1, "{}", r.body);
    assert_eq!(ids.len(), 1, "one stream, one id: {ids:?}");
    let usage = usage.expect("no usage chunk");
    assert_eq!(usage["prompt_tokens"], want_prompt_tokens as u64, "another request's answer? {}", r.body);
    Ok(ids.into_iter().next().unwrap())
}

#[test]
fn many_concurrent_streams_each_get_exactly_one_answer() {
    const CLIENTS: usize = 48;
    const ROUNDS: usize = 3;
    let server = start(options(4, 16, Vec::new()));
    let addr = server.addr;
    let tok = {
        let f = brink_engine::gguf::GgufFile::open(model()).unwrap();
        brink_engine::tokenizer::Tokenizer::from_gguf(f.metadata()).unwrap()
    };
    // The marker of request (c, r) is its prompt length; the answer's usage must match it.
    let words = |c: usize, r: usize| 1 + (c * ROUNDS + r) % 40;
    let want: Vec<usize> = (0..=40).map(|w| tok.encode(&poison_text(w), true, true).unwrap().len()).collect();
    let t0 = Instant::now();
    let handles: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let want = want.clone();
            std::thread::spawn(move || (0..ROUNDS).map(|r| stream_once(addr, words(c, r), want[words(c, r)])).collect::<Vec<_>>())
        })
        .collect();
    let results: Vec<Result<String, u16>> = handles.into_iter().flat_map(|h| h.join().expect("a client failed")).collect();
    assert!(t0.elapsed() < Duration::from_secs(90), "the load took {:?}", t0.elapsed());
    assert_eq!(results.len(), CLIENTS * ROUNDS, "requests lost");
    let ids: Vec<&String> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
    let unique: HashSet<&&String> = ids.iter().collect();
    assert_eq!(unique.len(), ids.len(), "a response was delivered twice");
    // The first 4 + 16 (slots + queue) to arrive are admitted whatever the timing.
    assert!(ids.len() >= 20, "only {} of {} requests completed", ids.len(), results.len());
    eprintln!("load: {} complete, {} refused with 503 in {:?}", ids.len(), results.len() - ids.len(), t0.elapsed());
    // Healthy afterwards: nothing left running or waiting, and a request is served.
    assert_eq!((get(addr, "/live").status, get(addr, "/ready").status), (200, 200));
    let t1 = Instant::now();
    while metric(addr, "brink_requests_running") + metric(addr, "brink_requests_waiting") > 0.0 {
        assert!(t1.elapsed() < Duration::from_secs(10), "sequences left behind after every client finished");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(stream_once(addr, 5, want[5]).map(|_| ()), Ok(()));
    stop(server);
}

#[test]
fn official_sdks_raise_their_errors_for_a_stalled_request() {
    if !have_sdks() {
        return;
    }
    let (server, dir) = faulty(&format!("hang:layer=1,min-rows={TRIGGER_ROWS}"));
    let addr = server.addr;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/sdk_client.py");
    let t0 = Instant::now();
    let out =
        std::process::Command::new("python3").arg(&script).arg(format!("http://{addr}")).arg("tiny").arg("watchdog").output().unwrap();
    assert!(out.status.success(), "{}: {}", script.display(), String::from_utf8_lossy(&out.stderr));
    let v: Json = serde_json::from_slice(&out.stdout).unwrap();
    for key in ["openai", "openai_stream", "anthropic", "anthropic_stream"] {
        let e = &v[key];
        assert_eq!(e["raised"], true, "{key}: the SDK did not raise: {v}");
        assert_eq!(e["is_api_error"], true, "{key}: not the SDK's error class: {v}");
        assert!(e["message"].as_str().unwrap().contains("layer 1"), "{key}: {v}");
        let secs = e["seconds"].as_f64().unwrap();
        assert!(secs < STALL_TIMEOUT.as_secs_f64() + 8.0, "{key}: the error came after {secs} s");
    }
    assert_eq!(v["openai"]["status"], 503);
    assert_eq!(v["anthropic"]["status"], 503);
    assert_eq!(v["retry_after_quarantine"]["ok"], true, "{v}");
    assert_eq!(reports(&dir).len(), 4);
    assert_eq!(stalls(addr).0, 4.0, "the retried poison stalled the engine again");
    eprintln!("SDK watchdog run: {:?}", t0.elapsed());
    stop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Stalls under requests whose clients had seen nothing yet (non-streaming; streams stalled in
/// their prefill): each runs again on the restarted engine, in the smaller chunks the quarantine
/// allows, and is answered as if nothing had happened; the re-runs are counted.
#[test]
fn a_request_that_sent_nothing_is_answered_after_the_stall() {
    let mut opts = options(4, 16, Vec::new());
    opts.inject_fault = Some(format!("hang:layer=1,min-rows={TRIGGER_ROWS}"));
    opts.stall_timeout = STALL_TIMEOUT;
    assert_eq!(opts.requeue_after_restart, 1, "re-queueing is the default");
    let dir = opts.stall_dir.clone();
    let server = start(opts);
    let addr = server.addr;

    // OpenAI, not streaming.
    let poison = json!({"model": "tiny", "messages": [{"role": "user", "content": poison_text(90)}], "max_tokens": 4});
    let r = timed_post(addr, "/v1/chat/completions", &poison);
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert!(v["usage"]["completion_tokens"].as_u64().unwrap() <= 4, "tokens of the stalled run counted too: {v}");
    assert!(v["choices"][0]["finish_reason"].is_string(), "{v}");
    assert_eq!(stalls(addr).0, 1.0, "it did stall");
    assert_eq!(metric(addr, "brink_requests_requeued_total"), 1.0);
    assert_eq!(metric(addr, "brink_engine_restarts_total"), 1.0);

    // OpenAI streaming, stalled in its prefill: no token was sent, so the stream completes.
    let req = json!({"model": "tiny", "messages": [{"role": "user", "content": poison_text(110)}], "max_tokens": 4, "stream": true});
    let r = timed_post(addr, "/v1/chat/completions", &req);
    let (_, finish) = openai_stream_text(&r);
    assert!(["stop", "length"].contains(&finish.as_str()), "{finish}");

    // Anthropic, not streaming and streaming.
    let areq = json!({"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": poison_text(130)}]});
    let r = timed_post(addr, "/v1/messages", &areq);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["type"], "message", "{}", r.body);
    let sreq = json!({"model": "tiny", "max_tokens": 4, "stream": true, "messages": [{"role": "user", "content": poison_text(150)}]});
    let r = timed_post(addr, "/v1/messages", &sreq);
    assert_eq!(r.status, 200, "{}", r.body);
    let events = sse_events(&r.body);
    assert!(events.iter().all(|e| e.0 != "error"), "{}", r.body);
    assert_eq!(events.iter().filter(|e| e.0 == "message_start").count(), 1, "{}", r.body);
    assert_eq!(events.last().unwrap().0, "message_stop", "{}", r.body);

    assert_eq!(stalls(addr).0, 4.0, "each poison stalled the engine once");
    assert_eq!(reports(&dir).len(), 4);
    assert_eq!(metric(addr, "brink_requests_requeued_total"), 4.0);
    assert_eq!(metric(addr, "brink_request_errors_total"), 0.0, "no client saw an error");
    stop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

/// What one client of the load below saw.
#[derive(Debug)]
enum Seen {
    /// A whole answer, with its id.
    Answered(String),
    /// A stream that failed after it had sent text (a restart cannot hide that).
    FailedAfterOutput,
    /// Refused by the quarantine because a kill hit its prompt in a prefill chunk of one token,
    /// which cannot be halved: the one refusal a quarantine floor of 1 leaves.
    RefusedAtOneToken,
    /// Anything else: a visible error for a request that had sent nothing, or a broken answer.
    Error(String),
}

/// A `/v1/completions` request of `words` words, 16 tokens at most; streamed or not.
fn completion_under_load(addr: SocketAddr, words: usize, stream: bool) -> Seen {
    let req = json!({"model": "tiny", "prompt": poison_text(words), "max_tokens": 16, "temperature": 0, "stream": stream});
    let r = post(addr, "/v1/completions", &req);
    if r.status == 422 && r.body.contains("in a prefill chunk of 1 tokens") {
        return Seen::RefusedAtOneToken;
    }
    if r.status != 200 {
        return Seen::Error(format!("{} {}", r.status, r.body));
    }
    if !stream {
        let v = r.json();
        let tokens = v["usage"]["completion_tokens"].as_u64().unwrap_or(u64::MAX);
        return match (v["id"].as_str(), v["choices"][0]["finish_reason"].as_str()) {
            (Some(id), Some(_)) if tokens <= 16 => Seen::Answered(id.to_string()),
            _ => Seen::Error(format!("a broken answer: {v}")),
        };
    }
    let events = sse_events(&r.body);
    // Completion streams send no opening chunk: a chunk with a choice follows a token.
    let (mut sent, mut id) = (false, None);
    for (_, data) in &events {
        if data == "[DONE]" {
            return match id {
                Some(id) => Seen::Answered(id),
                None => Seen::Error(format!("a stream without chunks: {}", r.body)),
            };
        }
        let Ok(v) = serde_json::from_str::<Json>(data) else { return Seen::Error(format!("not JSON: {data}")) };
        if v.get("error").is_some() {
            return if sent { Seen::FailedAfterOutput } else { Seen::Error(format!("failed before any output: {}", r.body)) };
        }
        id = v["id"].as_str().map(String::from);
        sent |= v["choices"].as_array().is_some_and(|c| !c.is_empty());
    }
    Seen::Error(format!("a stream that ended without [DONE]: {}", r.body))
}

/// `kill -9` of the engine child, twice, under 8 non-streaming and 2 streaming clients: every
/// request that had sent nothing to its client is answered (none fails, none is answered twice);
/// only a stream that had already sent text may fail. One re-queue (the default); the second
/// kill waits until every request in flight at the first has finished, and no prompt length
/// repeats within a client's next 20 requests, so each kill meets requests and lengths of its
/// own, as two unrelated crashes would. A kill is a crash to the quarantine, which strikes the
/// prompts in the step and halves their chunk; its floor is 1 here, so that a chunk it halves
/// (13 tokens after a tail or a step cut short) is not refused: the floor's refusal is the stall
/// tests' and `sched::quarantine`'s to check.
#[cfg(unix)]
#[test]
fn killing_the_engine_under_load_fails_no_request_that_had_sent_nothing() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    const KILLS: u64 = 2;
    const CLIENTS: usize = 10;
    let mut opts = options(4, 16, Vec::new());
    opts.quarantine_min_chunk = 1;
    let server = start(opts);
    let addr = server.addr;
    let done = Arc::new(AtomicBool::new(false));
    let finished: Arc<Vec<AtomicUsize>> = Arc::new((0..CLIENTS).map(|_| AtomicUsize::new(0)).collect());
    // Client c's n-th prompt has 40 + c + 10·(n mod 20) words: distinct across clients and
    // across a client's consecutive requests.
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let (done, finished) = (done.clone(), finished.clone());
            std::thread::spawn(move || {
                let mut seen = Vec::new();
                for n in 0.. {
                    if done.load(Ordering::Relaxed) {
                        break;
                    }
                    seen.push(completion_under_load(addr, 40 + c + 10 * (n % 20), c >= 8));
                    finished[c].fetch_add(1, Ordering::Relaxed);
                }
                seen
            })
        })
        .collect();
    for k in 1..=KILLS {
        let t0 = Instant::now();
        while metric(addr, "brink_requests_running") < 3.0 {
            assert!(t0.elapsed() < Duration::from_secs(20), "the load never filled 3 slots");
            std::thread::sleep(Duration::from_millis(5));
        }
        let at_kill: Vec<usize> = finished.iter().map(|f| f.load(Ordering::Relaxed)).collect();
        kill_engine(addr);
        while metric(addr, "brink_engine_restarts_total") < k as f64 {
            assert!(t0.elapsed() < Duration::from_secs(30), "the engine was not restarted");
            std::thread::sleep(Duration::from_millis(20));
        }
        wait_ready(addr);
        // Each client's requests are sequential: two more finished means the one in flight at
        // the kill (re-queued or not) is done.
        while finished.iter().zip(&at_kill).any(|(f, &n)| f.load(Ordering::Relaxed) < n + 2) {
            assert!(t0.elapsed() < Duration::from_secs(90), "the requests in flight at kill {k} did not finish");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    done.store(true, Ordering::Relaxed);
    let seen: Vec<Seen> = clients.into_iter().flat_map(|h| h.join().expect("a client panicked")).collect();
    let errors: Vec<&String> = seen.iter().filter_map(|s| if let Seen::Error(e) = s { Some(e) } else { None }).collect();
    assert!(errors.is_empty(), "{} visible errors of {} requests: {errors:#?}", errors.len(), seen.len());
    let ids: Vec<&String> = seen.iter().filter_map(|s| if let Seen::Answered(id) = s { Some(id) } else { None }).collect();
    assert_eq!(ids.iter().collect::<HashSet<_>>().len(), ids.len(), "an answer was delivered twice");
    let requeued = metric(addr, "brink_requests_requeued_total");
    assert!(requeued >= 1.0, "no request was in flight at either kill");
    assert_eq!(metric(addr, "brink_engine_restarts_total"), KILLS as f64);
    let after_output = seen.iter().filter(|s| matches!(s, Seen::FailedAfterOutput)).count();
    let refused = seen.iter().filter(|s| matches!(s, Seen::RefusedAtOneToken)).count();
    assert!(refused as f64 <= requeued, "{refused} refused by the quarantine, more than the {requeued} re-queued");
    eprintln!(
        "load with {KILLS} kills: {} answered, {after_output} streams failed after output, {requeued} re-queued, \
         {refused} refused at a one-token chunk",
        ids.len()
    );
    stop(server);
}
