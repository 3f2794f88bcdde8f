//! Test harness: stub upstreams (small axum servers that serve `/v1/models`, `/ready`,
//! `/metrics` and the generation routes, record who answered, refuse with a status on demand and
//! stream SSE chunks held on a gate the test opens), an in-process gateway, and an HTTP client.
#![allow(dead_code)] // each test crate uses its own part of the harness

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, Request, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post as route_post};
use brink_gateway::Config;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use serde_json::{Value as Json, json};
use tokio::sync::{Semaphore, oneshot};

/// How long any wait in these tests may take before it fails (a bound, never a synchroniser).
pub const DEADLINE: Duration = Duration::from_secs(30);

/// One request a stub answered: the path, the body's model, the `Authorization` it carried.
#[derive(Clone, Debug)]
pub struct Hit {
    pub path: String,
    pub model: String,
    pub authorization: Option<String>,
    pub x_api_key: Option<String>,
    /// The W3C trace context the gateway sent.
    pub traceparent: Option<String>,
}

pub struct StubState {
    pub name: String,
    pub models: Vec<String>,
    pub hits: Mutex<Vec<Hit>>,
    /// Answer every generation request with this status (and a JSON error naming the stub).
    pub refuse_with: Mutex<Option<u16>>,
    /// A streamed answer sends its first chunk, then waits for a permit here before the rest.
    pub gate: Semaphore,
    /// Streamed answers send their response head, then break the connection before any body
    /// byte (a replica process that dies right after it).
    pub cut_after_head: Mutex<bool>,
    /// Answers report this usage (input, output tokens) in their API's shape: a JSON answer's
    /// `usage`; a stream's usage chunk (OpenAI, split across two writes) or its `message_start`
    /// and `message_delta` (Anthropic).
    pub usage: Mutex<Option<(u64, u64)>>,
}

pub struct Stub {
    pub url: String,
    pub state: Arc<StubState>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Stub {
    pub async fn start(name: &str, models: &[&str]) -> Stub {
        let state = Arc::new(StubState {
            name: name.to_string(),
            models: models.iter().map(|m| m.to_string()).collect(),
            hits: Mutex::default(),
            refuse_with: Mutex::new(None),
            gate: Semaphore::new(0),
            cut_after_head: Mutex::new(false),
            usage: Mutex::new(None),
        });
        let app = Router::new()
            .route("/v1/chat/completions", route_post(stub_generate))
            .route("/v1/completions", route_post(stub_generate))
            .route("/v1/messages", route_post(stub_generate))
            .route("/v1/models", get(stub_models))
            .route("/ready", get(|| async { "ready\n" }))
            .route("/metrics", get(|| async { "# TYPE brink_requests_running gauge\nbrink_requests_running 0\n" }))
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = stopped.await;
                })
                .await
                .unwrap();
        });
        Stub { url, state, stop: Some(stop), task: Some(task) }
    }

    pub fn hits(&self) -> Vec<Hit> {
        self.state.hits.lock().unwrap().clone()
    }

    pub fn refuse_with(&self, status: Option<u16>) {
        *self.state.refuse_with.lock().unwrap() = status;
    }

    /// Stops the server and waits until its port is closed (connections refused from then on).
    pub async fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            tokio::time::timeout(DEADLINE, task).await.expect("the stub did not stop").unwrap();
        }
    }
}

async fn stub_models(State(s): State<Arc<StubState>>) -> Response {
    let data: Vec<Json> = s.models.iter().map(|m| json!({"id": m, "object": "model", "owned_by": "stub"})).collect();
    axum::Json(json!({"object": "list", "data": data})).into_response()
}

async fn stub_generate(State(s): State<Arc<StubState>>, uri: Uri, headers: HeaderMap, body: Bytes) -> Response {
    let body: Json = serde_json::from_slice(&body).unwrap_or(Json::Null);
    let model = body["model"].as_str().unwrap_or("").to_string();
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(String::from);
    s.hits.lock().unwrap().push(Hit {
        path: uri.path().to_string(),
        model: model.clone(),
        authorization: header("authorization"),
        x_api_key: header("x-api-key"),
        traceparent: header("traceparent"),
    });
    if let Some(status) = *s.refuse_with.lock().unwrap() {
        let body = json!({"error": {"message": format!("stub {} refused", s.name), "type": "overloaded"}});
        return (StatusCode::from_u16(status).unwrap(), [("retry-after", "7")], axum::Json(body)).into_response();
    }
    if body["stream"] == json!(true) && *s.cut_after_head.lock().unwrap() {
        // The head goes out while the body waits (hyper flushes it then); then the body fails.
        let broken = futures_util::stream::once(async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            Err::<Bytes, _>(std::io::Error::other("the replica died"))
        });
        return ([(header::CONTENT_TYPE, "text/event-stream")], Body::from_stream(broken)).into_response();
    }
    let usage = *s.usage.lock().unwrap();
    let anthropic = uri.path() == "/v1/messages";
    if body["stream"] == json!(true) {
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(4);
        let state = s.clone();
        tokio::spawn(async move {
            let first = match usage {
                Some((input, _)) if anthropic => format!(
                    "event: message_start\ndata: {}\n\n",
                    json!({"type": "message_start", "message": {"usage": {"input_tokens": input, "output_tokens": 1}}})
                ),
                _ => format!("data: {}\n\n", json!({"chunk": 1, "answered_by": state.name})),
            };
            let _ = tx.send(Ok(Bytes::from(first))).await;
            // The rest only once the test has read the first chunk through the gateway.
            state.gate.acquire().await.unwrap().forget();
            let _ = tx.send(Ok(Bytes::from(format!("data: {}\n\n", json!({"chunk": 2}))))).await;
            match usage {
                Some((_, output)) if anthropic => {
                    let delta = json!({"type": "message_delta", "usage": {"output_tokens": output}});
                    let _ = tx.send(Ok(Bytes::from(format!("event: message_delta\ndata: {delta}\n\n")))).await;
                    let _ = tx.send(Ok(Bytes::from("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"))).await;
                    return;
                }
                Some((input, output)) => {
                    let chunk =
                        format!("data: {}\n\n", json!({"choices": [], "usage": {"prompt_tokens": input, "completion_tokens": output}}));
                    let (a, b) = chunk.split_at(chunk.len() / 2);
                    let _ = tx.send(Ok(Bytes::from(a.to_string()))).await;
                    tokio::time::sleep(Duration::from_millis(20)).await; // two frames at the gateway
                    let _ = tx.send(Ok(Bytes::from(b.to_string()))).await;
                }
                None => {}
            }
            let _ = tx.send(Ok(Bytes::from("data: [DONE]\n\n"))).await;
        });
        let stream = futures_stream(rx);
        return ([(header::CONTENT_TYPE, "text/event-stream")], Body::from_stream(stream)).into_response();
    }
    let mut answer = json!({"answered_by": s.name, "model": model, "path": uri.path()});
    if let Some((input, output)) = usage {
        answer["usage"] = if anthropic {
            json!({"input_tokens": input, "output_tokens": output})
        } else {
            json!({"prompt_tokens": input, "completion_tokens": output})
        };
    }
    axum::Json(answer).into_response()
}

/// A receiver as a stream of body chunks.
fn futures_stream(
    rx: tokio::sync::mpsc::Receiver<Result<Bytes, std::io::Error>>,
) -> impl futures_util::Stream<Item = Result<Bytes, std::io::Error>> {
    futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|chunk| (chunk, rx)) })
}

/// A gateway on the test's runtime; dropped, it stops.
pub struct Gateway {
    pub url: String,
    _stop: oneshot::Sender<()>,
}

impl Gateway {
    /// A gateway the test started itself; dropped, `stop` fires.
    pub fn from_url(url: String, stop: oneshot::Sender<()>) -> Gateway {
        Gateway { url, _stop: stop }
    }
}

pub async fn gateway(config: Config) -> Gateway {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(brink_gateway::serve_on(listener, config, async move {
        let _ = stopped.await;
    }));
    Gateway { url, _stop: stop }
}

/// A config for these stubs: discovery polls once at start, then not again during a test
/// (an hour), so what the gateway knows changes only when the test says.
pub fn config(stubs: &[&Stub]) -> Config {
    let mut c = Config::new(stubs.iter().map(|s| s.url.clone()).collect());
    c.poll_interval = Duration::from_secs(3600);
    c
}

/// Waits (bounded) until the gateway's model list is exactly `models`.
pub async fn wait_models(gw: &Gateway, headers: &[(&str, &str)], models: &[&str]) {
    let t0 = Instant::now();
    loop {
        let r = call(&format!("{}/v1/models", gw.url), "GET", headers, "").await;
        if r.status == 200 && model_ids(&r.json()) == models {
            return;
        }
        assert!(t0.elapsed() < DEADLINE, "the gateway did not list {models:?} in {DEADLINE:?}: {} {}", r.status, r.body);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub fn model_ids(list: &Json) -> Vec<String> {
    list["data"].as_array().map(|d| d.iter().filter_map(|m| m["id"].as_str().map(String::from)).collect()).unwrap_or_default()
}

#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: String,
}

impl Resp {
    pub fn json(&self) -> Json {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

pub fn client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(hyper_util::rt::TokioExecutor::new()).build(HttpConnector::new())
}

pub fn request(url: &str, method: &str, headers: &[(&str, &str)], body: &str) -> Request<Full<Bytes>> {
    let mut req = Request::builder().method(method).uri(url);
    if !body.is_empty() {
        req = req.header(header::CONTENT_TYPE, "application/json");
    }
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.body(Full::new(Bytes::from(body.to_string()))).unwrap()
}

/// One request, the whole answer read.
pub async fn call(url: &str, method: &str, headers: &[(&str, &str)], body: &str) -> Resp {
    let work = async {
        let resp = client().request(request(url, method, headers, body)).await.unwrap_or_else(|e| panic!("{method} {url}: {e}"));
        let status = resp.status().as_u16();
        let (head, body) = resp.into_parts();
        let bytes = body.collect().await.unwrap().to_bytes();
        Resp { status, headers: head.headers, body: String::from_utf8(bytes.to_vec()).unwrap() }
    };
    tokio::time::timeout(DEADLINE, work).await.unwrap_or_else(|_| panic!("{method} {url}: no answer in {DEADLINE:?}"))
}

pub async fn post(url: &str, body: &Json) -> Resp {
    call(url, "POST", &[], &body.to_string()).await
}

pub fn chat(model: &str, prompt: &str) -> Json {
    json!({"model": model, "messages": [{"role": "user", "content": prompt}]})
}

/// The value of one series (with exactly these labels, in any order) in a Prometheus text body.
pub fn metric(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (series, value) = l.rsplit_once(' ')?;
        let (n, rest) = series.split_once('{').unwrap_or((series, "}"));
        if n != name {
            return None;
        }
        let rest = rest.strip_suffix('}')?;
        let mut have: Vec<(String, String)> = rest
            .split(',')
            .filter(|p| !p.is_empty())
            .filter_map(|p| p.split_once('=').map(|(k, v)| (k.to_string(), v.trim_matches('"').to_string())))
            .collect();
        let mut want: Vec<(String, String)> = labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        have.sort();
        want.sort();
        (have == want).then(|| value.parse().ok()).flatten()
    })
}

pub async fn metrics(gw: &Gateway) -> String {
    call(&format!("{}/metrics", gw.url), "GET", &[], "").await.body
}

/// Waits (bounded) until the gateway has nothing in flight to any upstream.
pub async fn wait_idle(gw: &Gateway) {
    let t0 = Instant::now();
    loop {
        let m = metrics(gw).await;
        let busy: Vec<&str> = m.lines().filter(|l| l.starts_with("brink_gateway_upstream_in_flight{") && !l.ends_with(" 0")).collect();
        if busy.is_empty() {
            return;
        }
        assert!(t0.elapsed() < DEADLINE, "requests stayed in flight: {busy:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
