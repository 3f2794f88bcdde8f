//! Test-only stand-ins for engines that break the ways the design's seed failures broke, seen
//! from outside: an OpenAI-compatible `/v1/completions` (with `/v1/models`, `/health`, and
//! optionally llama.cpp's `/tokenize`) that counts a prompt as one BOS plus one token per word,
//! and fails by prompt length. The black-box qualification must flag each one. Never shipped.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};

/// How the stand-in breaks.
#[derive(Clone, Copy, Debug)]
pub enum Fault {
    /// Answers 500 to every prompt of `from` tokens or more (as an engine whose kernel fails
    /// past a grid limit).
    FailFrom(u64),
    /// Never answers a prompt whose length is `residue` mod 64 (as a kernel that hangs on one
    /// tail residue); other lengths pass.
    HangResidue(u64),
    /// The worker dies at the first prompt of `at` tokens or more (that request's connection is
    /// dropped); from then on every request, health checks too, gets 503.
    DieAt(u64),
    /// Answers completions with a 200 that is not JSON (a web page where an engine was expected).
    NotOpenAi,
    /// Lists no models.
    NoModels,
}

struct State {
    fault: Fault,
    tokenizer: bool,
    dead: AtomicBool,
    /// Completions asked, of each outcome (for the tests' own checks).
    completions: AtomicU64,
}

/// A running stand-in; it stops when dropped.
pub struct StandIn {
    pub url: String,
    state: Arc<State>,
    _rt: tokio::runtime::Runtime,
}

impl StandIn {
    pub fn dead(&self) -> bool {
        self.state.dead.load(Ordering::SeqCst)
    }

    pub fn completions(&self) -> u64 {
        self.state.completions.load(Ordering::SeqCst)
    }
}

/// Starts a stand-in on a free loopback port; `tokenizer`: it also serves llama.cpp-style
/// `POST /tokenize` (counting without the BOS, as llama.cpp's server does by default).
pub fn start(fault: Fault, tokenizer: bool) -> StandIn {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let state = Arc::new(State { fault, tokenizer, dead: AtomicBool::new(false), completions: AtomicU64::new(0) });
    let shared = state.clone();
    rt.spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let state = shared.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req| handle(state.clone(), req));
                // A handler's error closes the connection without an answer: a dying worker.
                let _ = http1::Builder::new().serve_connection(TokioIo::new(tcp), svc).await;
            });
        }
    });
    StandIn { url, state, _rt: rt }
}

fn respond(status: u16, body: Value) -> Response<Full<Bytes>> {
    Response::builder()
        .status(StatusCode::from_u16(status).unwrap())
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap()
}

/// One BOS, then one token per word.
fn tokens(text: &str) -> u64 {
    1 + text.split_whitespace().count() as u64
}

async fn handle(state: Arc<State>, req: Request<Incoming>) -> Result<Response<Full<Bytes>>, String> {
    let path = req.uri().path().to_string();
    let body = req.into_body().collect().await.map_err(|e| e.to_string())?.to_bytes();
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    if state.dead.load(Ordering::SeqCst) {
        return Ok(respond(503, json!({"error": {"message": "the engine's worker process has exited"}})));
    }
    Ok(match path.as_str() {
        "/health" => respond(200, json!({"status": "ok"})),
        "/v1/models" if matches!(state.fault, Fault::NoModels) => respond(200, json!({"object": "list", "data": []})),
        "/v1/models" => respond(200, json!({"object": "list", "data": [{"id": "standin", "object": "model"}]})),
        "/tokenize" if state.tokenizer => {
            let text = body["content"].as_str().unwrap_or("");
            respond(200, json!({"tokens": vec![7; (tokens(text) - 1) as usize]}))
        }
        "/v1/completions" => {
            state.completions.fetch_add(1, Ordering::SeqCst);
            let Some(prompt) = body["prompt"].as_str() else { return Ok(respond(400, json!({"error": {"message": "prompt"}}))) };
            let n = tokens(prompt);
            let max_tokens = body["max_tokens"].as_u64().unwrap_or(16).max(1);
            match state.fault {
                Fault::FailFrom(t) if n >= t => {
                    return Ok(respond(500, json!({"error": {"message": format!("CUDA error: an illegal memory access at {n} tokens")}})));
                }
                Fault::HangResidue(r) if n % 64 == r => {
                    std::future::pending::<Infallible>().await;
                }
                Fault::DieAt(t) if n >= t => {
                    state.dead.store(true, Ordering::SeqCst);
                    return Err(format!("worker died at {n} tokens"));
                }
                Fault::NotOpenAi => {
                    let page = Bytes::from_static(b"<html><body>It works!</body></html>");
                    return Ok(Response::builder().header("content-type", "text/html").body(Full::new(page)).unwrap());
                }
                _ => {}
            }
            let logprobs = body["logprobs"].is_number().then(|| json!({"token_logprobs": vec![-0.25; max_tokens as usize]}));
            respond(
                200,
                json!({
                    "id": "cmpl-standin", "object": "text_completion", "model": "standin",
                    "choices": [{"index": 0, "text": " ok".repeat(max_tokens as usize), "logprobs": logprobs, "finish_reason": "length"}],
                    "usage": {"prompt_tokens": n, "completion_tokens": max_tokens, "total_tokens": n + max_tokens},
                }),
            )
        }
        _ => respond(404, json!({"error": {"message": format!("no route {path}")}})),
    })
}
