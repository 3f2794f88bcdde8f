//! The HTTP test harness shared by the server's end-to-end tests: a tiny synthetic model, a
//! server on its own runtime thread whose engine runs in the `brink-engine-child` binary, and a
//! plain HTTP/1.1 client over `std::net::TcpStream`.
#![allow(dead_code)] // each test crate uses its own part of the harness

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use brink_engine::BackendKind;
use brink_engine::chat_template::ChatTemplate;
use brink_engine::gguf::GgufFile;
use brink_engine::server::jobs::WorkerConfig;
use brink_engine::server::supervisor::EngineCommand;
use brink_engine::server::telemetry::otlp::OtlpConfig;
use brink_engine::server::{ServeOptions, serve_on_with};
use brink_engine::synth::{self, Preset, SynthSpec};
use brink_engine::tokenizer::Tokenizer;
use serde_json::Value as Json;

pub const CONTEXT: usize = 512;

/// The engine child the cargo build made for these tests.
pub fn engine_child() -> EngineCommand {
    EngineCommand { program: PathBuf::from(env!("CARGO_BIN_EXE_brink-engine-child")), args: Vec::new() }
}

/// A fresh folder for reports, under the system's temp dir (kept: the reports are evidence).
pub fn scratch_dir(what: &str) -> PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    let d = std::env::temp_dir().join(format!("brink-test-{what}-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed)));
    let _ = std::fs::remove_dir_all(&d);
    d
}

pub fn options(slots: usize, max_queue: usize, api_keys: Vec<String>) -> ServeOptions {
    ServeOptions {
        worker: WorkerConfig {
            model: model().to_path_buf(),
            backend: BackendKind::Cpu,
            slots,
            context: CONTEXT,
            max_batch_tokens: 256,
            prefill_chunk: 64,
            full_window_kv: false,
            max_queue,
        },
        engine: engine_child(),
        model_name: Some("tiny".into()),
        api_keys,
        stall_timeout: Duration::from_secs(30),
        stall_dir: scratch_dir("stalls"),
        inject_fault: None,
        quarantine_min_chunk: 8,
        requeue_after_restart: 1,
        grace: Duration::from_secs(5),
        max_n: 4,
        node_metrics: None,
        ready_check: None,
    }
}

pub fn model() -> &'static Path {
    static MODEL: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    let (_, path) = MODEL.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tiny.gguf");
        synth::generate(&SynthSpec::from_preset(Preset::Tiny), &path, |_, _| {}).unwrap_or_else(|e| panic!("{e}"));
        (dir, path)
    });
    path
}

/// A server on its own runtime thread; `stop` ends it, `done` says how `serve_on` returned.
pub struct Running {
    pub addr: SocketAddr,
    pub stop: Option<tokio::sync::oneshot::Sender<()>>,
    pub done: std::sync::mpsc::Receiver<Result<(), String>>,
}

pub fn start(opts: ServeOptions) -> Running {
    start_with(opts, None)
}

/// [`start`] with an OTLP export.
pub fn start_with(opts: ServeOptions, otlp: Option<OtlpConfig>) -> Running {
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let result = rt.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            addr_tx.send(listener.local_addr().unwrap()).unwrap();
            serve_on_with(listener, opts, otlp, async move {
                let _ = stop_rx.await;
            })
            .await
        });
        let _ = done_tx.send(result.map_err(|e| e.to_string()));
    });
    let addr = addr_rx.recv_timeout(Duration::from_secs(10)).expect("the server did not bind");
    let r = Running { addr, stop: Some(stop_tx), done: done_rx };
    let t0 = Instant::now();
    while get(r.addr, "/ready").status != 200 {
        assert!(t0.elapsed() < Duration::from_secs(30), "the model did not load in 30 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    r
}

/// Stops a server as SIGTERM would and checks `serve_on` returned cleanly (the engine child
/// exits and its progress board file goes).
pub fn stop(mut server: Running) {
    server.stop.take().expect("already stopped").send(()).expect("the server is gone");
    let done = server.done.recv_timeout(Duration::from_secs(30)).expect("serve_on did not return");
    assert_eq!(done, Ok(()));
}

#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Resp {
    pub fn json(&self) -> Json {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

pub fn send(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n", body.len());
    if !body.is_empty() {
        req += "Content-Type: application/json\r\n";
    }
    for (k, v) in headers {
        req += &format!("{k}: {v}\r\n");
    }
    req += "\r\n";
    req += body;
    s.write_all(req.as_bytes()).unwrap();
    s
}

pub fn parse(raw: &[u8]) -> Resp {
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").expect("no end of headers");
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut lines = head.split("\r\n");
    let status = lines.next().unwrap().split(' ').nth(1).unwrap().parse().unwrap();
    let headers: Vec<(String, String)> =
        lines.filter_map(|l| l.split_once(':')).map(|(k, v)| (k.trim().to_string(), v.trim().to_string())).collect();
    let mut body = raw[split + 4..].to_vec();
    if headers.iter().any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked")) {
        body = dechunk(&body);
    }
    Resp { status, headers, body: String::from_utf8(body).expect("body is not UTF-8") }
}

pub fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let eol = b.windows(2).position(|w| w == b"\r\n").expect("chunk size line");
        let size = usize::from_str_radix(std::str::from_utf8(&b[..eol]).unwrap().split(';').next().unwrap().trim(), 16).unwrap();
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&b[eol + 2..eol + 2 + size]);
        b = &b[eol + 2 + size + 2..];
    }
}

pub fn request(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> Resp {
    let mut s = send(addr, method, path, headers, body);
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    parse(&raw)
}

pub fn get(addr: SocketAddr, path: &str) -> Resp {
    request(addr, "GET", path, &[], "")
}

pub fn post(addr: SocketAddr, path: &str, body: &Json) -> Resp {
    request(addr, "POST", path, &[], &body.to_string())
}

/// The `data:` payloads of an SSE body, with their `event:` names (empty when none).
pub fn sse_events(body: &str) -> Vec<(String, String)> {
    body.split("\n\n")
        .filter(|f| !f.trim().is_empty())
        .map(|frame| {
            let mut event = String::new();
            let mut data = String::new();
            for line in frame.lines() {
                if let Some(e) = line.strip_prefix("event: ") {
                    event = e.to_string();
                } else if let Some(d) = line.strip_prefix("data: ") {
                    data = d.to_string();
                }
            }
            (event, data)
        })
        .collect()
}

/// The prompt's token count as the tokenizer gives it for the model's own template.
pub fn chat_prompt_tokens(messages: &Json) -> usize {
    let file = GgufFile::open(model()).unwrap();
    let tok = Tokenizer::from_gguf(file.metadata()).unwrap();
    let template = ChatTemplate::from_gguf(file.metadata()).unwrap().expect("the synthetic model has a template");
    let text = template.render(messages.as_array().unwrap(), None, true).unwrap();
    tok.encode(&text, true, true).unwrap().len()
}

/// OpenAI chat streamed: the concatenated content, the finish reason; checks the framing.
pub fn openai_stream_text(resp: &Resp) -> (String, String) {
    assert_eq!(resp.status, 200, "{}", resp.body);
    assert!(resp.header("content-type").unwrap().starts_with("text/event-stream"));
    let events = sse_events(&resp.body);
    assert_eq!(events.last().map(|e| e.1.as_str()), Some("[DONE]"), "{}", resp.body);
    assert_eq!(events.iter().filter(|e| e.1 == "[DONE]").count(), 1);
    let mut text = String::new();
    let mut finish = None;
    for (_, data) in &events[..events.len() - 1] {
        let chunk: Json = serde_json::from_str(data).unwrap();
        assert!(chunk.get("error").is_none(), "{data}");
        for c in chunk["choices"].as_array().unwrap() {
            text += c["delta"]["content"].as_str().unwrap_or("");
            if let Some(f) = c["finish_reason"].as_str() {
                assert!(finish.is_none(), "two finish reasons");
                finish = Some(f.to_string());
            }
        }
    }
    (text, finish.expect("no finish reason"))
}

/// Whether python3 has the official SDKs; with BRINK_REQUIRE_PY=1 their absence fails the test.
pub fn have_sdks() -> bool {
    let ok = std::process::Command::new("python3").args(["-c", "import openai, anthropic"]).output().is_ok_and(|o| o.status.success());
    if !ok {
        let msg = "python3 with the `openai` and `anthropic` packages (see scripts/test for the pinned versions) is not available";
        assert!(std::env::var("BRINK_REQUIRE_PY").as_deref() != Ok("1"), "BRINK_REQUIRE_PY=1 but {msg}");
        eprintln!("skipping the SDK test: {msg}");
    }
    ok
}
