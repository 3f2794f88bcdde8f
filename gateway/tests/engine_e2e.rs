//! End to end against REAL brink servers (the engine's in-process server on the synthetic tiny
//! model, CPU backend, each engine in a `brink-engine-child` process) with different model names
//! behind the gateway: each model's requests, plain and streamed, are answered by a server that
//! serves it, and the model list has both. Model `alpha` has two servers of different contexts:
//! a request that only the larger admits is served there, one that neither admits gets a 400
//! naming both numbers. With llama.cpp's own `llama-server` (BRINK_LLAMA_CPP_BIN), a third
//! model served by it sits behind the same gateway next to two brink servers: a non-brink
//! engine, healthy through its `/health`, which both official SDKs reach through the gateway
//! (chat completions and messages, plain and streamed, tool calls, the model list).

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use brink_engine::BackendKind;
use brink_engine::server::jobs::WorkerConfig;
use brink_engine::server::supervisor::EngineCommand;
use brink_engine::server::{ServeOptions, serve_on_with};
use brink_engine::synth::{self, Preset, SynthSpec};
use common::*;
use http_body_util::BodyExt;
use serde_json::json;

/// Loading a model on a loaded 2-core CI machine is slow; this bounds it.
const LOAD_DEADLINE: Duration = Duration::from_secs(180);

/// The engine child binary: next to this test's executable's folder (`target/<profile>/`). Cargo
/// builds a dependency's binaries only when asked, so CI's `cargo build --workspace
/// --all-targets` (or the command in the message) must have run first.
fn engine_child() -> EngineCommand {
    let exe = std::env::current_exe().expect("the test's own path");
    let profile_dir = exe.parent().and_then(|deps| deps.parent()).expect("target/<profile>/deps/<test>");
    let program = profile_dir.join(format!("brink-engine-child{}", std::env::consts::EXE_SUFFIX));
    assert!(
        program.is_file(),
        "{} is missing: build it first with `cargo build -p brink-engine --bin brink-engine-child` (the same profile as the tests: \
         add `--profile test` when they run under `cargo test`, or `--release` for `cargo test --release`)",
        program.display()
    );
    EngineCommand { program, args: Vec::new() }
}

fn options(model: PathBuf, name: &str, context: usize, scratch: &std::path::Path) -> ServeOptions {
    ServeOptions {
        worker: WorkerConfig {
            model,
            backend: BackendKind::Cpu,
            slots: 2,
            context,
            max_batch_tokens: 256,
            prefill_chunk: 64,
            full_window_kv: false,
            max_queue: 16,
        },
        engine: engine_child(),
        model_name: Some(name.into()),
        api_keys: Vec::new(),
        stall_timeout: Duration::from_secs(60),
        stall_dir: scratch.join(format!("stalls-{name}-{context}")),
        inject_fault: None,
        quarantine_min_chunk: 8,
        requeue_after_restart: 1,
        grace: Duration::from_secs(5),
        max_n: 4,
        node_metrics: None,
        ready_check: None,
    }
}

/// A real server on its own runtime thread; its URL, and the sender that stops it.
fn start_server(opts: ServeOptions) -> (String, tokio::sync::oneshot::Sender<()>, std::sync::mpsc::Receiver<Result<(), String>>) {
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let result = rt.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            addr_tx.send(listener.local_addr().unwrap()).unwrap();
            serve_on_with(listener, opts, None, async move {
                let _ = stop_rx.await;
            })
            .await
        });
        let _ = done_tx.send(result.map_err(|e| e.to_string()));
    });
    let addr = addr_rx.recv_timeout(Duration::from_secs(30)).expect("the server did not bind");
    (format!("http://{addr}"), stop_tx, done_rx)
}

#[test]
fn two_real_servers_behind_the_gateway() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny.gguf");
    synth::generate(&SynthSpec::from_preset(Preset::Tiny), &model, |_, _| {}).unwrap_or_else(|e| panic!("{e}"));
    let (alpha_url, alpha_stop, alpha_done) = start_server(options(model.clone(), "alpha", 512, dir.path()));
    let (big_url, big_stop, big_done) = start_server(options(model.clone(), "alpha", 2048, dir.path()));
    let (beta_url, beta_stop, beta_done) = start_server(options(model, "beta", 512, dir.path()));

    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let mut config = brink_gateway::Config::new(vec![alpha_url.clone(), beta_url.clone(), big_url.clone()]);
        // Discovery must see each server turn ready after its model loads.
        config.poll_interval = Duration::from_millis(100);
        let gw = gateway(config).await;
        // Each server also answers to `brink`; it is listed once.
        wait_until_serving(&gw, &["alpha", "brink", "beta"], 3, String::new).await;

        for (name, urls) in [("alpha", vec![&alpha_url, &big_url]), ("beta", vec![&beta_url])] {
            let before = requests_total_of(&urls).await;
            let plain = json!({"model": name, "messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 4, "temperature": 0});
            let r = post(&format!("{}/v1/chat/completions", gw.url), &plain).await;
            assert_eq!(r.status, 200, "{name}: {}", r.body);
            assert_eq!(r.json()["model"], name);
            assert_eq!(r.json()["object"], "chat.completion");

            let mut streamed = plain.clone();
            streamed["stream"] = json!(true);
            let r = post(&format!("{}/v1/chat/completions", gw.url), &streamed).await;
            assert_eq!(r.status, 200, "{name}: {}", r.body);
            assert!(r.header("content-type").unwrap().starts_with("text/event-stream"));
            assert!(r.body.trim_end().ends_with("data: [DONE]"), "{name}: {}", r.body);
            let first: serde_json::Value = serde_json::from_str(r.body.lines().next().unwrap().strip_prefix("data: ").unwrap()).unwrap();
            assert_eq!(first["model"], name);
            assert_eq!(first["object"], "chat.completion.chunk");

            // Both went to this model's servers, none to the other.
            assert_eq!(requests_total_of(&urls).await - before, 2.0, "{name}'s servers answered both");
        }
        let other_before = requests_total(&beta_url).await;
        let r = post(&format!("{}/v1/completions", gw.url), &json!({"model": "alpha", "prompt": "Once", "max_tokens": 2})).await;
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(requests_total(&beta_url).await, other_before, "alpha's request never reached beta's server");
        // A prompt over the only replica's context gets the engine's 400, naming both numbers, as
        // it gave it; so does any other bad field: the gateway adds no 5xx of its own.
        let long = vec!["word"; 700].join(" ");
        let r = post(&format!("{}/v1/completions", gw.url), &json!({"model": "beta", "prompt": long, "max_tokens": 2})).await;
        assert_eq!(r.status, 400, "{}", r.body);
        let message = r.json()["error"]["message"].as_str().unwrap_or_default().to_string();
        assert!(message.contains("the prompt is") && message.contains("context is 512 tokens"), "{message}");

        // The same prompt for alpha: the 512-token replica refuses it (when tried first), the
        // 2048-token one serves it.
        let (small_before, big_before) = (requests_total(&alpha_url).await, requests_total(&big_url).await);
        let r = post(&format!("{}/v1/completions", gw.url), &json!({"model": "alpha", "prompt": long, "max_tokens": 2})).await;
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(requests_total(&big_url).await - big_before, 1.0, "the larger context served it");
        assert!(requests_total(&alpha_url).await - small_before <= 1.0);
        // max_tokens that only the larger context holds: never sent to the smaller. Streamed and
        // dropped after the first chunk (a thousand tokens of a debug build would take minutes).
        let small_before = requests_total(&alpha_url).await;
        for _ in 0..3 {
            let body = json!({"model": "alpha", "prompt": "Once", "max_tokens": 1000, "stream": true});
            let req = request(&format!("{}/v1/completions", gw.url), "POST", &[], &body.to_string());
            let resp = tokio::time::timeout(DEADLINE, client().request(req)).await.expect("no response head").unwrap();
            assert_eq!(resp.status(), 200);
            let mut stream = resp.into_body();
            tokio::time::timeout(DEADLINE, stream.frame()).await.expect("no first chunk").expect("an empty stream").unwrap();
        }
        assert_eq!(requests_total(&alpha_url).await, small_before, "max_tokens over 512 never went to the 512-token replica");
        // Over every replica's context: 400 naming both numbers (the prompt's tokens, the
        // largest context).
        let longer = vec!["word"; 3000].join(" ");
        let r = post(&format!("{}/v1/completions", gw.url), &json!({"model": "alpha", "prompt": longer, "max_tokens": 2})).await;
        assert_eq!(r.status, 400, "{}", r.body);
        let message = r.json()["error"]["message"].as_str().unwrap_or_default().to_string();
        assert!(message.contains("the prompt is") && message.contains("context is 2048 tokens"), "{message}");
        let r = post(&format!("{}/v1/completions", gw.url), &json!({"model": "alpha", "prompt": "Once", "max_tokens": 5000})).await;
        assert_eq!(r.status, 400, "{}", r.body);
        assert_eq!(r.json()["error"]["param"], "max_tokens");
        let message = r.json()["error"]["message"].as_str().unwrap_or_default().to_string();
        assert!(message.contains("5000") && message.contains("context of 2048 tokens"), "{message}");
        let m = metrics(&gw).await;
        // The max_tokens refusal, and the prompt's when the smaller replica was tried first.
        assert!(metric(&m, "brink_gateway_rejections_total", &[("reason", "over_context")]).is_some_and(|n| n >= 1.0), "{m}");

        for bad in [
            json!({"model": "alpha", "prompt": "x", "temperature": "hot"}),
            json!({"model": "beta", "messages": "not a list"}),
            json!({"model": "alpha", "prompt": "x", "max_tokens": -1}),
        ] {
            let path = if bad.get("messages").is_some() { "chat/completions" } else { "completions" };
            let r = post(&format!("{}/v1/{path}", gw.url), &bad).await;
            assert!((400..500).contains(&r.status), "{bad}: {} {}", r.status, r.body);
        }
        let r = post(&format!("{}/v1/chat/completions", gw.url), &json!({"model": "gamma", "messages": []})).await;
        assert_eq!(r.status, 404, "{}", r.body);
        assert_eq!(r.json()["error"]["message"], "model 'gamma' is not served by any replica; served: alpha, brink, beta");
    });

    for (stop, done) in [(alpha_stop, alpha_done), (big_stop, big_done), (beta_stop, beta_done)] {
        stop.send(()).expect("the server is gone");
        assert_eq!(done.recv_timeout(Duration::from_secs(60)).expect("serve_on did not return"), Ok(()));
    }
}

/// llama.cpp's own `llama-server` (scripts/llama-cpp-bin builds it once from the pinned
/// source; scripts/test sets BRINK_LLAMA_CPP_BIN to its folder), or why not.
fn llama_server_bin() -> Option<PathBuf> {
    let Some(dir) = std::env::var_os("BRINK_LLAMA_CPP_BIN").map(PathBuf::from) else {
        let msg = "BRINK_LLAMA_CPP_BIN is not set (run scripts/llama-cpp-bin and set it to the folder it prints)";
        assert!(std::env::var("BRINK_REQUIRE_PY").as_deref() != Ok("1"), "BRINK_REQUIRE_PY=1 but {msg}");
        eprintln!("skipping llama.cpp's server behind the gateway: {msg}");
        return None;
    };
    let bin = dir.join("llama-server");
    assert!(bin.is_file(), "BRINK_LLAMA_CPP_BIN={} has no llama-server", dir.display());
    Some(bin)
}

/// A child process killed when dropped (a failed assertion leaves no server behind).
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Brink's servers for `alpha` and `beta` and llama.cpp's `llama-server` for `gamma` (the same
/// synthetic model, which llama.cpp loads as the parity tests show) behind one gateway: the
/// gateway reads llama.cpp's health from its `/health` (it has no `/ready`) and lists all three
/// models, and each model's chat completions, plain and streamed, come back from its own engine
/// in the shape the OpenAI SDK parses. Then both official SDKs drive `gamma` through the gateway
/// ([`sdks_to_llama_server`]): llama-server with the real Qwen3 template, which can render tools.
#[test]
fn llama_cpp_server_behind_the_gateway_next_to_brink() {
    let Some(llama_server) = llama_server_bin() else { return };
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny.gguf");
    synth::generate(&SynthSpec::from_preset(Preset::Tiny), &model, |_, _| {}).unwrap_or_else(|e| panic!("{e}"));
    let (alpha_url, alpha_stop, alpha_done) = start_server(options(model.clone(), "alpha", 512, dir.path()));
    let (beta_url, beta_stop, beta_done) = start_server(options(model.clone(), "beta", 512, dir.path()));
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port().to_string();
    let llama_url = format!("http://127.0.0.1:{port}");
    let log_path = dir.path().join("llama-server.log");
    let mut llama = Killed(
        std::process::Command::new(&llama_server)
            .args(["-m", model.to_str().unwrap(), "--alias", "gamma", "--host", "127.0.0.1", "--port", &port])
            .args(["-c", "1024", "--parallel", "1", "--threads", "1", "--metrics", "--jinja", "--chat-template-file"])
            .arg(qwen3_template())
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log_path).unwrap())
            .spawn()
            .unwrap(),
    );
    let log = || std::fs::read_to_string(&log_path).unwrap_or_default();

    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let mut config = brink_gateway::Config::new(vec![alpha_url.clone(), beta_url.clone(), llama_url.clone()]);
        config.poll_interval = Duration::from_millis(100);
        let gw = gateway(config).await;
        let m = wait_until_serving(&gw, &["alpha", "brink", "beta", "gamma"], 3, || {
            assert!(llama.0.try_wait().unwrap().is_none(), "llama-server exited: {}", log());
            log()
        })
        .await;
        assert_eq!(metric(&m, "brink_gateway_upstream_healthy", &[("upstream", &llama_url)]), Some(1.0), "{m}");

        for name in ["alpha", "beta", "gamma"] {
            let brink_before = [requests_total(&alpha_url).await, requests_total(&beta_url).await];
            let llama_before = llama_tokens(&llama_url).await;
            let plain = json!({"model": name, "messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 3, "temperature": 0});
            let r = post(&format!("{}/v1/chat/completions", gw.url), &plain).await;
            assert_eq!(r.status, 200, "{name}: {}", r.body);
            let c = r.json();
            assert_eq!(c["model"], name, "{c}");
            assert_eq!(c["object"], "chat.completion", "{c}");
            assert!(c["id"].is_string() && c["created"].is_u64(), "{c}");
            assert_eq!(c["choices"][0]["index"], 0, "{c}");
            assert_eq!(c["choices"][0]["message"]["role"], "assistant", "{c}");
            assert!(c["choices"][0]["message"]["content"].is_string(), "{c}");
            assert!(c["choices"][0]["finish_reason"].is_string(), "{c}");
            assert!(c["usage"]["completion_tokens"].as_u64().is_some_and(|n| (1..=3).contains(&n)), "{c}");

            let mut streamed = plain.clone();
            streamed["stream"] = json!(true);
            let r = post(&format!("{}/v1/chat/completions", gw.url), &streamed).await;
            assert_eq!(r.status, 200, "{name}: {}", r.body);
            assert!(r.header("content-type").unwrap().starts_with("text/event-stream"));
            assert!(r.body.trim_end().ends_with("data: [DONE]"), "{name}: {}", r.body);
            let chunks: Vec<serde_json::Value> = r
                .body
                .lines()
                .filter_map(|l| l.strip_prefix("data: "))
                .filter(|d| *d != "[DONE]")
                .map(|d| serde_json::from_str(d).unwrap_or_else(|e| panic!("{name}: {e}: {d}")))
                .collect();
            assert!(!chunks.is_empty(), "{name}: {}", r.body);
            for chunk in &chunks {
                assert_eq!(chunk["model"], name, "{chunk}");
                assert_eq!(chunk["object"], "chat.completion.chunk", "{chunk}");
                assert!(chunk["choices"].is_array(), "{chunk}");
            }
            assert!(chunks.iter().any(|c| c["choices"][0]["finish_reason"].is_string()), "{name}: {}", r.body);

            // Both went to this model's engine and no other: brink's servers count requests,
            // llama.cpp's the tokens it generated.
            let brink_after = [requests_total(&alpha_url).await, requests_total(&beta_url).await];
            let served = brink_after.iter().zip(brink_before).map(|(a, b)| a - b).collect::<Vec<_>>();
            let llama_generated = llama_tokens(&llama_url).await > llama_before;
            let expected = match name {
                "alpha" => (vec![2.0, 0.0], false),
                "beta" => (vec![0.0, 2.0], false),
                _ => (vec![0.0, 0.0], true),
            };
            assert_eq!(
                (served, llama_generated),
                expected,
                "{name}: requests of alpha's and beta's servers, whether llama.cpp's generated"
            );
        }

        sdks_to_llama_server(&gw, &llama_url, [&alpha_url, &beta_url]).await;
    });
    drop(llama);

    for (stop, done) in [(alpha_stop, alpha_done), (beta_stop, beta_done)] {
        stop.send(()).expect("the server is gone");
        assert_eq!(done.recv_timeout(Duration::from_secs(60)).expect("serve_on did not return"), Ok(()));
    }
}

/// The real Qwen3 chat template (the engine's template tests' copy): the synthetic model's own
/// minimal template has no tools, and llama-server ignores the tools of a request whose template
/// cannot render them (`chat_template_caps.supports_tools` false), as it would for such a model.
fn qwen3_template() -> PathBuf {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../engine/tests/chat_template_qwen3.jinja");
    assert!(path.is_file(), "{} is missing", path.display());
    path
}

/// Which calls of `sdk_llama_server.py` reach the engine, and how many requests each makes.
const SDK_CALLS: [(&str, f64); 8] = [
    ("openai", 1.0),
    ("openai_stream", 1.0),
    ("anthropic", 1.0),
    ("anthropic_stream", 1.0),
    ("openai_tools", 2.0),
    ("openai_tools_stream", 1.0),
    ("anthropic_tools", 2.0),
    ("anthropic_tools_stream", 1.0),
];

/// Both official SDKs (gateway/tests/sdk_llama_server.py) through the gateway to llama-server's
/// model `gamma`: chat completions and messages, plain and streamed, forced tool calls plain and
/// streamed and each call's result sent back, and the model list. Every answer came from
/// llama-server: its build in the OpenAI answers' `system_fingerprint` (brink's servers send
/// none), the gateway's count of 200s from it, and none of brink's servers counting a request.
/// Skipped without python3's `openai` and `anthropic` packages unless BRINK_REQUIRE_PY=1.
async fn sdks_to_llama_server(gw: &Gateway, llama_url: &str, brink_urls: [&String; 2]) {
    let have = std::process::Command::new("python3").args(["-c", "import openai, anthropic"]).output().is_ok_and(|o| o.status.success());
    if !have {
        let msg = "python3 with the `openai` and `anthropic` packages (see scripts/test) is not available";
        assert!(std::env::var("BRINK_REQUIRE_PY").as_deref() != Ok("1"), "BRINK_REQUIRE_PY=1 but {msg}");
        eprintln!("skipping the SDKs against llama.cpp's server: {msg}");
        return;
    }
    let build = call(&format!("{llama_url}/props"), "GET", &[], "").await.json()["build_info"].as_str().map(String::from);
    let build = build.expect("llama-server's /props names its build");
    let served_200 = || async {
        let m = metrics(gw).await;
        metric(&m, "brink_gateway_requests_total", &[("model", "gamma"), ("upstream", llama_url), ("status", "200")]).unwrap_or(0.0)
    };
    let (gw_before, brink_before, llama_before) = (served_200().await, requests_total_of(&brink_urls).await, llama_tokens(llama_url).await);

    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sdk_llama_server.py");
    let gw_url = gw.url.clone();
    let t0 = Instant::now();
    let run = tokio::task::spawn_blocking(move || std::process::Command::new("python3").arg(&script).arg(&gw_url).arg("gamma").output());
    let out = tokio::time::timeout(LOAD_DEADLINE, run).await.expect("sdk_llama_server.py did not end").unwrap().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "sdk_llama_server.py: {stderr}");
    let v: serde_json::Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
    eprintln!("both SDKs to llama-server through the gateway: {:.1} s", t0.elapsed().as_secs_f64());
    for (name, _) in SDK_CALLS {
        assert!(v[name].get("error").is_none(), "{name}: {}", v[name]);
    }

    // Chat completions, plain and streamed, from llama-server's build.
    let c = &v["openai"];
    assert_eq!(
        (c["model"].as_str(), c["fingerprint"].as_str(), c["finish"].as_str()),
        (Some("gamma"), Some(&*build), Some("length")),
        "{v}"
    );
    assert!(c["text"].as_str().is_some_and(|t| !t.is_empty()) && c["completion_tokens"] == 8, "{v}");
    let c = &v["openai_stream"];
    assert_eq!((&c["models"], &c["fingerprints"]), (&json!(["gamma"]), &json!([&build])), "{v}");
    assert!(c["text_chunks"].as_u64().is_some_and(|n| n >= 2) && c["chunks"].as_u64() > c["text_chunks"].as_u64(), "{v}");
    assert!(c["text"].as_str().is_some_and(|t| !t.is_empty()) && c["finish"] == "length" && c["usage"] == 8, "{v}");
    // Messages, plain and streamed: every event of Anthropic's stream, text in several deltas.
    let m = &v["anthropic"];
    assert_eq!(
        (m["model"].as_str(), m["stop_reason"].as_str(), m["output_tokens"].as_u64()),
        (Some("gamma"), Some("max_tokens"), Some(8)),
        "{v}"
    );
    assert!(m["text"].as_str().is_some_and(|t| !t.is_empty()), "{v}");
    let m = &v["anthropic_stream"];
    for event in ["message_start", "content_block_start", "content_block_delta", "content_block_stop", "message_delta", "message_stop"] {
        assert!(m["events"].as_array().is_some_and(|e| e.contains(&json!(event))), "no {event}: {v}");
    }
    assert!(m["text_deltas"].as_u64().is_some_and(|n| n >= 2) && m["text"].as_str().is_some_and(|t| !t.is_empty()), "{v}");
    assert_eq!(
        (m["model"].as_str(), m["stop_reason"].as_str(), m["output_tokens"].as_u64()),
        (Some("gamma"), Some("max_tokens"), Some(8)),
        "{v}"
    );

    // Tool calls: the engine's call parsed by each SDK, whole when streamed in pieces, and the
    // answer to its result.
    let weather = json!([{"name": "get_weather", "arguments": {"city": "Paris"}}]);
    let t = &v["openai_tools"];
    assert_eq!((&t["calls"], t["finish"].as_str(), t["fingerprint"].as_str()), (&weather, Some("tool_calls"), Some(&*build)), "{v}");
    assert!(t["answer"]["text"].is_string() && t["answer"]["calls"] == json!([]), "{v}");
    let (asked, answered) = (t["prompt_tokens"].as_u64().unwrap_or(0), t["answer"]["prompt_tokens"].as_u64().unwrap_or(0));
    assert!(asked > 0 && answered > asked, "the call and its result went back: {v}");
    let t = &v["openai_tools_stream"];
    assert_eq!((&t["calls"], t["finish"].as_str(), &t["fingerprints"]), (&weather, Some("tool_calls"), &json!([&build])), "{v}");
    assert!(t["tool_deltas"].as_u64().is_some_and(|n| n >= 2), "{v}");
    let uses = json!([{"name": "get_weather", "input": {"city": "Paris"}}]);
    let t = &v["anthropic_tools"];
    assert_eq!((&t["uses"], t["stop_reason"].as_str()), (&uses, Some("tool_use")), "{v}");
    assert!(t["answer"]["text"].is_string() && t["answer"]["uses"] == json!([]), "{v}");
    let t = &v["anthropic_tools_stream"];
    assert_eq!((&t["uses"], t["stop_reason"].as_str()), (&uses, Some("tool_use")), "{v}");
    assert!(t["json_deltas"].as_u64().is_some_and(|n| n >= 2), "{v}");

    // The whole cluster's models, through either SDK; a bad field gets the engine's own 400.
    let all = json!(["alpha", "beta", "brink", "gamma"]);
    assert_eq!((&v["models"], &v["anthropic_models"]), (&all, &all), "{v}");
    let e = &v["openai_absurd_max_tokens"]["error"];
    assert_eq!((e["class"].as_str(), e["status"].as_u64()), (Some("BadRequestError"), Some(400)), "{v}");

    // Routed: every request to llama-server, none to brink's servers.
    let requests: f64 = SDK_CALLS.iter().map(|(_, n)| n).sum();
    assert_eq!(served_200().await - gw_before, requests, "the gateway's 200s from llama-server");
    assert_eq!(requests_total_of(&brink_urls).await, brink_before, "brink's servers answered none");
    assert!(llama_tokens(llama_url).await > llama_before, "llama-server generated");
}

/// The tokens llama.cpp's server has generated (its `--metrics`).
async fn llama_tokens(url: &str) -> f64 {
    let m = call(&format!("{url}/metrics"), "GET", &[], "").await.body;
    metric(&m, "llamacpp:tokens_predicted_total", &[]).unwrap_or_else(|| panic!("no llamacpp:tokens_predicted_total: {m}"))
}

/// Polls the gateway until `/v1/models` lists `models` and `healthy` upstreams are healthy;
/// returns the metrics of that moment. `check` runs at every poll that is not there yet (it may
/// assert a child is alive) and gives text for the deadline's message.
async fn wait_until_serving(gw: &Gateway, models: &[&str], healthy: usize, mut check: impl FnMut() -> String) -> String {
    let t0 = Instant::now();
    loop {
        let r = call(&format!("{}/v1/models", gw.url), "GET", &[], "").await;
        let m = metrics(gw).await;
        let up = m.lines().filter(|l| l.starts_with("brink_gateway_upstream_healthy{") && l.ends_with(" 1")).count();
        if model_ids(&r.json()) == models && up == healthy {
            return m;
        }
        let context = check();
        assert!(t0.elapsed() < LOAD_DEADLINE, "the servers did not all become ready: {}\n{context}", r.body);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn requests_total_of(urls: &[&String]) -> f64 {
    let mut sum = 0.0;
    for url in urls {
        sum += requests_total(url).await;
    }
    sum
}

async fn requests_total(url: &str) -> f64 {
    let m = call(&format!("{url}/metrics"), "GET", &[], "").await.body;
    metric(&m, "brink_requests_total", &[]).unwrap_or_else(|| panic!("no brink_requests_total: {m}"))
}
