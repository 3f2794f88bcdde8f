//! The HTTP server end to end: a tiny synthetic model on the CPU backend (the engine in its
//! child process), served on 127.0.0.1:0 inside the test, driven by a plain HTTP/1.1 client over
//! `std::net::TcpStream` and by the official Python SDKs.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use brink_engine::chat_template::ChatTemplate;
use brink_engine::gguf::GgufFile;
use brink_engine::server::serve_on;
use brink_engine::tokenizer::Tokenizer;
use common::*;
use serde_json::{Value as Json, json};

/// The shared server: 4 slots, no keys.
fn shared() -> SocketAddr {
    static SERVER: OnceLock<SocketAddr> = OnceLock::new();
    *SERVER.get_or_init(|| {
        let r = start(options(4, 16, Vec::new()));
        // Kept running for the whole test process.
        std::mem::forget(r.stop);
        r.addr
    })
}

#[test]
fn chat_completion_streaming_and_not_agree_and_count_the_prompt() {
    let addr = shared();
    let messages = json!([{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hello there, how are you?"}]);
    let req = json!({"model": "tiny", "messages": messages, "max_tokens": 12, "temperature": 0});
    let r = post(addr, "/v1/chat/completions", &req);
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], "tiny");
    let prompt_tokens = chat_prompt_tokens(&messages);
    assert_eq!(v["usage"]["prompt_tokens"], prompt_tokens as u64);
    let text = v["choices"][0]["message"]["content"].as_str().unwrap().to_string();
    let finish = v["choices"][0]["finish_reason"].as_str().unwrap().to_string();
    let completion = v["usage"]["completion_tokens"].as_u64().unwrap();
    match finish.as_str() {
        "length" => assert_eq!(completion, 12),
        "stop" => assert!((1..=12).contains(&completion)),
        other => panic!("finish_reason {other}"),
    }
    assert_eq!(v["usage"]["total_tokens"].as_u64(), Some(prompt_tokens as u64 + completion));

    let mut sreq = req.clone();
    sreq["stream"] = json!(true);
    sreq["stream_options"] = json!({"include_usage": true});
    let r = post(addr, "/v1/chat/completions", &sreq);
    let (stext, sfinish) = openai_stream_text(&r);
    assert_eq!((stext.as_str(), sfinish.as_str()), (text.as_str(), finish.as_str()));
    let events = sse_events(&r.body);
    let usage: Json = serde_json::from_str(&events[events.len() - 2].1).unwrap();
    assert_eq!(usage["usage"]["prompt_tokens"], prompt_tokens as u64);
    assert_eq!(usage["usage"]["completion_tokens"], completion);

    // The same conversation through the Anthropic API renders the same prompt: same greedy text.
    let areq = json!({"model": "tiny", "system": "You are terse.", "messages": [{"role": "user", "content": "Hello there, how are you?"}],
        "max_tokens": 12, "temperature": 0});
    let r = post(addr, "/v1/messages", &areq);
    assert_eq!(r.status, 200, "{}", r.body);
    let m = r.json();
    assert_eq!((m["type"].as_str(), m["role"].as_str()), (Some("message"), Some("assistant")));
    let atext: String = m["content"].as_array().unwrap().iter().filter_map(|b| b["text"].as_str()).collect();
    assert_eq!(atext, text);
    // Anthropic counts prompt tokens read from the prefix cache apart from input_tokens.
    let input = |u: &Json| u["input_tokens"].as_u64().unwrap() + u["cache_read_input_tokens"].as_u64().unwrap();
    assert_eq!(input(&m["usage"]), prompt_tokens as u64);
    assert_eq!(m["usage"]["output_tokens"], completion);
    assert_eq!(m["stop_reason"], if finish == "length" { "max_tokens" } else { "end_turn" });

    let mut areq = areq;
    areq["stream"] = json!(true);
    let r = post(addr, "/v1/messages", &areq);
    assert_eq!(r.status, 200, "{}", r.body);
    let events = sse_events(&r.body);
    let names: Vec<&str> = events.iter().map(|e| e.0.as_str()).collect();
    assert_eq!(names.first(), Some(&"message_start"));
    assert_eq!(names.last(), Some(&"message_stop"));
    assert!(!names.contains(&"error"), "{}", r.body);
    let mut stext = String::new();
    for (name, data) in &events {
        let v: Json = serde_json::from_str(data).unwrap();
        assert_eq!(v["type"].as_str(), Some(name.as_str()));
        if name == "content_block_delta" {
            stext += v["delta"]["text"].as_str().unwrap_or("");
        }
        if name == "message_start" {
            assert_eq!(input(&v["message"]["usage"]), prompt_tokens as u64);
        }
        if name == "message_delta" {
            assert_eq!(v["usage"]["output_tokens"], completion);
        }
    }
    assert_eq!(stext, text);
}

#[test]
fn completions_cut_at_a_stop_string() {
    let addr = shared();
    let req = json!({"model": "tiny", "prompt": "Once upon a time", "max_tokens": 24, "temperature": 0});
    let r = post(addr, "/v1/completions", &req);
    assert_eq!(r.status, 200, "{}", r.body);
    let full = r.json()["choices"][0]["text"].as_str().unwrap().to_string();
    let chars: Vec<char> = full.chars().collect();
    // A stop string from the middle of the greedy text: the answer ends right before it.
    if chars.len() >= 6 {
        let stop: String = chars[3..6].iter().collect();
        let cut = full.find(&stop).unwrap();
        let mut sreq = req.clone();
        sreq["stop"] = json!([stop]);
        let r = post(addr, "/v1/completions", &sreq);
        let v = r.json();
        assert_eq!(v["choices"][0]["text"].as_str(), Some(&full[..cut]), "stop {stop:?} in {full:?}");
        assert_eq!(v["choices"][0]["finish_reason"], "stop");
        sreq["stream"] = json!(true);
        let r = post(addr, "/v1/completions", &sreq);
        let events = sse_events(&r.body);
        assert_eq!(events.last().unwrap().1, "[DONE]");
        let text: String = events[..events.len() - 1]
            .iter()
            .map(|(_, d)| serde_json::from_str::<Json>(d).unwrap()["choices"][0]["text"].as_str().unwrap_or("").to_string())
            .collect();
        assert_eq!(text, &full[..cut]);
    } else {
        panic!("the greedy continuation {full:?} is too short to cut");
    }
}

#[test]
fn models_health_ready_live_metrics() {
    let addr = shared();
    let m = get(addr, "/v1/models").json();
    let ids: Vec<&str> = m["data"].as_array().unwrap().iter().map(|d| d["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["tiny", "brink"]);
    assert_eq!(get(addr, "/health").status, 200);
    assert_eq!(get(addr, "/ready").status, 200);
    let live = get(addr, "/live");
    assert_eq!(live.status, 200, "{}", live.body);
    post(addr, "/v1/completions", &json!({"model": "brink", "prompt": "abc", "max_tokens": 3}));
    let metrics = get(addr, "/metrics");
    assert_eq!(metrics.status, 200);
    let value = |name: &str| -> f64 {
        let line = metrics.body.lines().find(|l| l.starts_with(&format!("{name} "))).unwrap_or_else(|| panic!("{name} missing"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    assert!(value("brink_requests_total") >= 1.0);
    assert!(value("brink_prompt_tokens_total") >= 1.0);
    assert!(value("brink_completion_tokens_total") >= 3.0);
    assert!(value("brink_time_to_first_token_seconds_count") >= 1.0);
    assert!(value("brink_time_to_first_token_seconds_sum") > 0.0);
    assert_eq!(value("brink_ready"), 1.0);
    assert_eq!(get(addr, "/v1/nope").status, 404);
}

#[test]
fn bad_inputs_are_4xx_with_a_message() {
    let addr = shared();
    let chat = |body: &str| request(addr, "POST", "/v1/chat/completions", &[], body);
    let check = |r: Resp, status: u16, needle: &str| {
        assert_eq!(r.status, status, "{}", r.body);
        let msg = r.json()["error"]["message"].as_str().unwrap().to_string();
        assert!(msg.contains(needle), "{msg:?} lacks {needle:?}");
    };
    check(chat("{\"model\": \"tiny\", \"messages\": ["), 400, "malformed JSON");
    check(chat(r#"{"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}"#), 404, "gpt-4o");
    check(chat(r#"{"model": "tiny", "messages": []}"#), 400, "messages");
    check(chat(r#"{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1000000000000}"#), 400, "max_tokens");
    check(chat(r#"{"model": "tiny", "messages": [{"role": "user", "content": 7}]}"#), 400, "messages[0].content");
    check(chat(r#"{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "temperature": -1}"#), 400, "temperature");
    // A prompt over the context: both numbers in the message.
    let long = "the quick brown fox jumps over the lazy dog ".repeat(200);
    let r = chat(&json!({"model": "tiny", "messages": [{"role": "user", "content": long}]}).to_string());
    assert_eq!(r.status, 400, "{}", r.body);
    let msg = r.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(msg.contains(&format!("context is {CONTEXT} tokens")) && msg.contains("the prompt is "), "{msg}");
    // Anthropic errors come in Anthropic's shape.
    let r = request(addr, "POST", "/v1/messages", &[], r#"{"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}"#);
    assert_eq!(r.status, 400, "{}", r.body);
    let v = r.json();
    assert_eq!(v["type"], "error");
    assert!(v["error"]["message"].as_str().unwrap().contains("max_tokens"), "{v}");
}

#[test]
fn concurrent_requests_each_get_one_complete_answer() {
    let addr = shared();
    let handles: Vec<_> = (0..8)
        .map(|i| {
            std::thread::spawn(move || {
                let stream = i % 2 == 0;
                let req = json!({"model": "tiny", "messages": [{"role": "user", "content": format!("request number {i}")}],
                    "max_tokens": 6 + i, "temperature": 0, "stream": stream});
                let r = post(addr, "/v1/chat/completions", &req);
                if stream {
                    let (_, finish) = openai_stream_text(&r);
                    assert!(finish == "length" || finish == "stop");
                } else {
                    assert_eq!(r.status, 200, "{}", r.body);
                    let v = r.json();
                    assert_eq!(v["choices"].as_array().unwrap().len(), 1);
                    let n = v["usage"]["completion_tokens"].as_u64().unwrap();
                    assert!(n >= 1 && n <= 6 + i as u64, "{n}");
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("a client failed");
    }
    // n > 1: each choice answered once.
    let r = post(
        addr,
        "/v1/chat/completions",
        &json!({"model": "tiny", "messages": [{"role": "user", "content": "pick"}], "max_tokens": 5, "n": 3, "seed": 7}),
    );
    let v = r.json();
    let idx: Vec<u64> = v["choices"].as_array().unwrap().iter().map(|c| c["index"].as_u64().unwrap()).collect();
    assert_eq!(idx, [0, 1, 2]);
}

#[test]
fn keys_queue_full_disconnect_and_graceful_shutdown() {
    // The model's whole context, so one stream can hold the only slot for thousands of steps.
    let mut opts = options(1, 0, vec!["sekret".into()]);
    opts.worker.context = 4096;
    let mut server = start(opts);
    let addr = server.addr;
    let body = json!({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}).to_string();
    let r = request(addr, "POST", "/v1/chat/completions", &[], &body);
    assert_eq!(r.status, 401);
    assert_eq!(r.json()["error"]["type"], "authentication_error");
    let r = request(
        addr,
        "POST",
        "/v1/messages",
        &[("x-api-key", "wrong")],
        &json!({"model": "tiny", "max_tokens": 4,
        "messages": [{"role": "user", "content": "hi"}]})
        .to_string(),
    );
    assert_eq!((r.status, r.json()["error"]["type"].as_str()), (401, Some("authentication_error")));
    assert_eq!(request(addr, "POST", "/v1/chat/completions", &[("Authorization", "Bearer sekret")], &body).status, 200);
    assert_eq!(request(addr, "POST", "/v1/chat/completions", &[("x-api-key", "sekret")], &body).status, 200);
    assert_eq!(request(addr, "GET", "/v1/models", &[], "").status, 401);

    // One slot, no queue: a long stream holds the slot, so a second request is refused with 503
    // and Retry-After. A sampled stream may draw an end-of-turn token early and free the slot
    // first; then its answer must show that, and another seed is tried.
    let mut holder = None;
    for seed in 1..=8 {
        let long = json!({"model": "tiny", "messages": [{"role": "user", "content": "go"}], "max_tokens": 4000, "stream": true,
            "temperature": 1.0, "seed": seed});
        let mut h = send(addr, "POST", "/v1/chat/completions", &[("x-api-key", "sekret")], &long.to_string());
        let mut first = [0u8; 64];
        let n = h.read(&mut first).unwrap();
        assert!(String::from_utf8_lossy(&first[..n]).starts_with("HTTP/1.1 200"));
        let r = request(addr, "POST", "/v1/chat/completions", &[("x-api-key", "sekret")], &body);
        if r.status == 503 {
            assert!(r.header("retry-after").is_some_and(|v| v.parse::<u32>().is_ok()), "{:?}", r.headers);
            assert!(r.json()["error"]["message"].as_str().unwrap().contains("retry after"), "{}", r.body);
            holder = Some(h);
            break;
        }
        assert_eq!(r.status, 200, "{}", r.body);
        let mut rest = Vec::new();
        h.read_to_end(&mut rest).unwrap();
        let rest = String::from_utf8_lossy(&rest);
        assert!(rest.contains("\"finish_reason\":\"stop\""), "the slot was free while the long stream ran: {rest}");
    }
    let holder = holder.expect("every seed drew an end-of-turn token at once");
    // The client goes away: its sequence is cancelled and the slot serves the next request.
    drop(holder);
    let t0 = Instant::now();
    loop {
        let r = request(addr, "POST", "/v1/chat/completions", &[("x-api-key", "sekret")], &body);
        if r.status == 200 {
            break;
        }
        assert_eq!(r.status, 503, "{}", r.body);
        assert!(t0.elapsed() < Duration::from_secs(10), "the disconnected stream kept its slot");
        std::thread::sleep(Duration::from_millis(20));
    }

    // Shutdown with a request in flight: it completes, then serve_on returns.
    let inflight = std::thread::spawn(move || {
        let req = json!({"model": "tiny", "messages": [{"role": "user", "content": "last"}], "max_tokens": 40}).to_string();
        request(addr, "POST", "/v1/chat/completions", &[("x-api-key", "sekret")], &req)
    });
    std::thread::sleep(Duration::from_millis(50));
    server.stop.take().unwrap().send(()).unwrap();
    let r = inflight.join().unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(server.done.recv_timeout(Duration::from_secs(15)).expect("serve_on did not return"), Ok(()));
    assert!(TcpStream::connect(addr).is_err() || get_fails(addr), "still accepting after shutdown");
}

/// After shutdown a connection may still be accepted by the OS backlog; a request must fail.
fn get_fails(addr: SocketAddr) -> bool {
    let Ok(mut s) = TcpStream::connect(addr) else { return true };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let _ = s.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).map(|_| buf.is_empty()).unwrap_or(true)
}

#[test]
fn a_model_that_does_not_load_ends_serve_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.gguf");
    std::fs::write(&bad, b"not a gguf").unwrap();
    let mut opts = options(1, 1, Vec::new());
    opts.worker.model = bad;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let err = rt
        .block_on(async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tokio::time::timeout(Duration::from_secs(20), serve_on(listener, opts, std::future::pending())).await
        })
        .expect("serve_on did not return after a failed load")
        .unwrap_err();
    assert!(err.to_string().contains("bad.gguf"), "{err}");
}

/// Prefix reuse through the paged KV cache: a second request that shares a long system prompt
/// reads its full blocks instead of recomputing them (usage says how many prompt tokens were
/// cached, in both APIs' fields), and answers exactly as a fresh server does (greedy).
#[test]
fn a_shared_long_prefix_is_reused_and_answers_as_on_a_fresh_server() {
    // The engine's default KV block: reuse is counted in whole blocks.
    const BLOCK: usize = 16;
    let fresh_server = || {
        let mut opts = options(2, 4, Vec::new());
        opts.worker.context = 4096;
        start(opts)
    };
    let system: String = (0..125).map(|i| format!("Rule {i}: answer in at most {} words. ", i % 7 + 3)).collect();
    let conversation = |question: &str| json!([{"role": "system", "content": system}, {"role": "user", "content": question}]);
    let (first, second) = (conversation("What is a block table?"), conversation("Why share prompt prefixes?"));
    let file = GgufFile::open(model()).unwrap();
    let tok = Tokenizer::from_gguf(file.metadata()).unwrap();
    let template = ChatTemplate::from_gguf(file.metadata()).unwrap().expect("the synthetic model has a template");
    let tokens = |m: &Json| tok.encode(&template.render(m.as_array().unwrap(), None, true).unwrap(), true, true).unwrap();
    let (t1, t2) = (tokens(&first), tokens(&second));
    let common = t1.iter().zip(&t2).take_while(|(a, b)| a == b).count();
    assert!((2000..3800).contains(&t2.len()) && common > 1000, "prompts of {} and {} tokens sharing {common}", t1.len(), t2.len());
    let chat = |addr, messages: &Json| {
        let r = post(addr, "/v1/chat/completions", &json!({"model": "tiny", "messages": messages, "max_tokens": 8, "temperature": 0}));
        assert_eq!(r.status, 200, "{}", r.body);
        let v = r.json();
        let cached = v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap() as usize;
        (v["choices"][0]["message"]["content"].as_str().unwrap().to_string(), v["usage"]["prompt_tokens"].as_u64().unwrap(), cached)
    };

    let server = fresh_server();
    let (_, p1, cached1) = chat(server.addr, &first);
    assert_eq!((p1, cached1), (t1.len() as u64, 0), "the first request has nothing to reuse");
    // The second reuses every full block of the shared prefix, and no more.
    let (text, p2, cached2) = chat(server.addr, &second);
    assert_eq!((p2, cached2), (t2.len() as u64, common / BLOCK * BLOCK), "{common} shared prompt tokens");
    // Repeated through the Anthropic API, the whole prompt is cached but for its last block's tail.
    let r = post(
        server.addr,
        "/v1/messages",
        &json!({"model": "tiny", "system": system, "messages": [{"role": "user", "content": "Why share prompt prefixes?"}],
            "max_tokens": 8, "temperature": 0}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let m = r.json();
    let (input, read) = (m["usage"]["input_tokens"].as_u64().unwrap(), m["usage"]["cache_read_input_tokens"].as_u64().unwrap());
    assert_eq!((read as usize, input + read), ((t2.len() - 1) / BLOCK * BLOCK, t2.len() as u64), "{}", r.body);
    let atext: String = m["content"].as_array().unwrap().iter().filter_map(|b| b["text"].as_str()).collect();
    assert_eq!(atext, text, "the fully cached prompt answers as the partly cached one");
    drop(server);

    // A fresh server computes the whole prompt and gives the same answer.
    let fresh = fresh_server();
    let (fresh_text, _, fresh_cached) = chat(fresh.addr, &second);
    assert_eq!((fresh_text.as_str(), fresh_cached), (text.as_str(), 0));
}

/// The prefix cache's reads, through the official SDKs: a repeated long prompt reports the same
/// cached count streamed as not, in both APIs (OpenAI's `include_usage` chunk; Anthropic's
/// `message_start`, `message_delta` and the final message the SDK assembles).
#[test]
fn official_sdks_report_prefix_cache_reads_streamed_as_not() {
    // The engine's default KV block: reuse is counted in whole blocks.
    const BLOCK: u64 = 16;
    if !have_sdks() {
        return;
    }
    // A server of its own: no other test's prompts in its cache.
    let server = start(options(2, 4, Vec::new()));
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/sdk_client.py");
    let out = std::process::Command::new("python3")
        .arg(&script)
        .arg(format!("http://{}", server.addr))
        .args(["tiny", "prefix-cache"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}: {}", script.display(), String::from_utf8_lossy(&out.stderr));
    let v: Json = serde_json::from_slice(&out.stdout).unwrap();
    let n = |key: &str, field: &str| v[key][field].as_u64().unwrap_or_else(|| panic!("{key}.{field} missing: {v}"));
    let prompt = n("openai_first", "prompt_tokens");
    assert!(prompt > 10 * BLOCK, "a prompt of {prompt} tokens: {v}");
    assert_eq!(n("openai_first", "cached_tokens"), 0, "the first request has nothing to reuse: {v}");
    // Every repeat reads every full block but the one holding the last prompt token.
    let cached = (prompt - 1) / BLOCK * BLOCK;
    assert_eq!(n("openai", "cached_tokens"), cached, "{v}");
    assert_eq!((n("openai_stream", "prompt_tokens"), n("openai_stream", "cached_tokens")), (prompt, cached), "{v}");
    let read = n("anthropic", "cache_read_input_tokens");
    assert_eq!((read, n("anthropic", "input_tokens") + read), (cached, prompt), "the same prompt through /v1/messages: {v}");
    for field in ["message_start", "message_delta", "cache_read_input_tokens"] {
        assert_eq!(n("anthropic_stream", field), read, "streamed {field}: {v}");
    }
    assert_eq!(n("anthropic_stream", "input_tokens"), n("anthropic", "input_tokens"), "{v}");
}

#[test]
fn official_python_sdks_round_trip() {
    if !have_sdks() {
        return;
    }
    let addr = shared();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/sdk_client.py");
    let out = std::process::Command::new("python3").arg(&script).arg(format!("http://{addr}")).arg("tiny").output().unwrap();
    assert!(out.status.success(), "{}: {}", script.display(), String::from_utf8_lossy(&out.stderr));
    let v: Json = serde_json::from_slice(&out.stdout).unwrap();
    let prompt = chat_prompt_tokens(&json!([{"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hello there, how are you?"}])) as u64;
    let text = v["openai"]["text"].as_str().unwrap();
    let completion = v["openai"]["completion_tokens"].as_u64().unwrap();
    assert_eq!(v["openai"]["prompt_tokens"], prompt, "{v}");
    assert!((1..=12).contains(&completion));
    for key in ["openai_stream", "anthropic", "anthropic_stream"] {
        assert_eq!(v[key]["text"].as_str(), Some(text), "{key}: {v}");
    }
    assert_eq!(v["openai_stream"]["prompt_tokens"], prompt);
    assert_eq!(v["openai_stream"]["completion_tokens"], completion);
    assert_eq!(v["openai_stream"]["finish"], v["openai"]["finish"]);
    for key in ["anthropic", "anthropic_stream"] {
        let input = v[key]["input_tokens"].as_u64().unwrap() + v[key]["cache_read_input_tokens"].as_u64().unwrap();
        assert_eq!(input, prompt, "{key} (prefix-cache reads apart): {v}");
        assert_eq!(v[key]["output_tokens"], completion, "{key}: {v}");
    }
    assert!(v["openai_tools"]["prompt_tokens"].as_u64().is_some_and(|n| n > 0), "{v}");
    assert!(v["anthropic_tools"]["input_tokens"].as_u64().is_some_and(|n| n > 0), "{v}");
    let errors = &v["errors"];
    for (name, class, status) in [
        ("openai_unknown_model", "NotFoundError", 404),
        ("openai_absurd_max_tokens", "BadRequestError", 400),
        ("openai_empty_messages", "BadRequestError", 400),
        ("anthropic_unknown_model", "NotFoundError", 404),
        ("anthropic_empty_messages", "BadRequestError", 400),
    ] {
        assert_eq!((errors[name]["class"].as_str(), errors[name]["status"].as_u64()), (Some(class), Some(status)), "{name}: {v}");
        assert!(!errors[name]["message"].as_str().unwrap_or("").is_empty());
    }
}
