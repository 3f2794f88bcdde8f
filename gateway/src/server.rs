//! The gateway's HTTP front: the generation routes (through [`crate::proxy`]), the model list,
//! health, readiness and metrics; and the discovery tasks, which live as long as the server.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, RwLock};

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, Request, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::json;

use crate::config::Config;
use crate::discovery::{self, Declared, Upstream};
use crate::errors::{Api, GatewayError, Kind};
use crate::keys::Keys;
use crate::metrics::{Metrics, Rejection};
use crate::proxy::{self, UpstreamClient};

pub struct Gateway {
    pub config: Config,
    /// The replicas known now, in order (`--upstream` order, or the cluster's replicas sorted by
    /// namespace and name): replaced whole when discovery in a cluster sees a change.
    upstreams: RwLock<Vec<Arc<Upstream>>>,
    /// Each known replica's polling task, to end when the replica goes.
    polls: Mutex<HashMap<String, tokio::task::AbortHandle>>,
    pub keys: Keys,
    /// Prompt keys that moved off their rendezvous replica.
    pub affinity: crate::affinity::Homes,
    pub metrics: Arc<Metrics>,
    pub client: UpstreamClient,
    /// Spans are made only with a tracer (an OTLP exporter: [`crate::telemetry`]).
    pub tracer: Option<opentelemetry_sdk::trace::SdkTracer>,
}

impl Gateway {
    pub fn new(config: Config) -> Gateway {
        let metrics = Arc::new(Metrics::new(&config.upstreams));
        let keys = Keys::new(config.api_keys.clone(), config.per_key_concurrency);
        Gateway {
            config,
            upstreams: RwLock::default(),
            polls: Mutex::default(),
            keys,
            affinity: crate::affinity::Homes::default(),
            metrics,
            client: proxy::client(),
            tracer: None,
        }
    }

    /// The gateway with its requests' spans made by `tracer`.
    pub fn traced(self, tracer: Option<opentelemetry_sdk::trace::SdkTracer>) -> Gateway {
        Gateway { tracer, ..self }
    }

    /// The replicas known now (a snapshot: a request keeps the set it started with).
    pub fn upstreams(&self) -> Vec<Arc<Upstream>> {
        self.upstreams.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Makes `desired` (base URL, what the cluster declared of it) the known replicas, in its
    /// order: a new one is polled at once, one that is gone stops being polled and drops out of
    /// routing (requests in flight to it finish), one that stays keeps what its polls saw.
    /// Must run on the runtime (it starts the polling tasks).
    pub fn set_upstreams(self: &Arc<Self>, desired: Vec<(String, Option<Declared>)>) {
        let mut polls = self.polls.lock().unwrap_or_else(|p| p.into_inner());
        let current = self.upstreams();
        let mut next: Vec<Arc<Upstream>> = Vec::with_capacity(desired.len());
        for (base, declared) in desired {
            if next.iter().any(|u| u.base == base) {
                continue;
            }
            let upstream = match current.iter().find(|u| u.base == base) {
                Some(u) => u.clone(),
                None => {
                    let u = Arc::new(Upstream::new(base.clone()));
                    let key = self.config.upstream_api_key.clone();
                    let task = tokio::spawn(discovery::poll_forever(
                        u.clone(),
                        self.client.clone(),
                        key,
                        self.config.poll_interval,
                        self.metrics.clone(),
                    ));
                    polls.insert(base.clone(), task.abort_handle());
                    u
                }
            };
            upstream.set_declared(declared);
            next.push(upstream);
        }
        for gone in current.iter().filter(|u| !next.iter().any(|n| n.base == u.base)) {
            if let Some(task) = polls.remove(&gone.base) {
                task.abort();
            }
            self.metrics.forget_upstream(&gone.base);
            eprintln!("brink-gateway: {} is no longer a replica", gone.base);
        }
        *self.upstreams.write().unwrap_or_else(|p| p.into_inner()) = next;
    }

    fn stop_polls(&self) {
        for (_, task) in self.polls.lock().unwrap_or_else(|p| p.into_inner()).drain() {
            task.abort();
        }
    }
}

pub fn router(gw: Arc<Gateway>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/messages", post(messages))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/ready", get(ready))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .with_state(gw)
}

/// Serves on `listener` until `shutdown` resolves (then finishes the requests in flight); the
/// discovery tasks start at once and stop with the server.
pub async fn serve_on(
    listener: tokio::net::TcpListener,
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve(listener, Gateway::new(config), shutdown).await
}

/// As [`serve_on`], with a gateway already made (a traced one: [`Gateway::traced`]).
pub async fn serve(
    listener: tokio::net::TcpListener,
    gw: Gateway,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let gw = Arc::new(gw);
    gw.set_upstreams(gw.config.upstreams.iter().map(|u| (u.clone(), None)).collect());
    let result = axum::serve(listener, router(gw.clone())).with_graceful_shutdown(shutdown).await;
    gw.stop_polls();
    result
}

/// As [`serve_on`], with the replicas found in a cluster through `client` (those of
/// `config.namespaces`, or of all namespaces) instead of `--upstream` URLs, for as long as the
/// server runs.
pub async fn serve_on_kubernetes(
    listener: tokio::net::TcpListener,
    config: Config,
    client: kube::Client,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_kubernetes(listener, Gateway::new(config), client, shutdown).await
}

/// As [`serve_on_kubernetes`], with a gateway already made.
pub async fn serve_kubernetes(
    listener: tokio::net::TcpListener,
    gw: Gateway,
    client: kube::Client,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let gw = Arc::new(gw);
    let watch = tokio::spawn(crate::kubernetes::watch(gw.clone(), client, gw.config.namespaces.clone()));
    let result = axum::serve(listener, router(gw.clone())).with_graceful_shutdown(shutdown).await;
    watch.abort();
    gw.stop_polls();
    result
}

async fn chat(State(gw): State<Arc<Gateway>>, req: Request<Body>) -> Response {
    proxy::generate(gw, Api::OpenAi, req).await
}

async fn completions(State(gw): State<Arc<Gateway>>, req: Request<Body>) -> Response {
    proxy::generate(gw, Api::OpenAi, req).await
}

async fn messages(State(gw): State<Arc<Gateway>>, req: Request<Body>) -> Response {
    proxy::generate(gw, Api::Anthropic, req).await
}

/// The union of every healthy replica's models, each once.
async fn models(State(gw): State<Arc<Gateway>>, headers: HeaderMap) -> Response {
    let api = api_of(&headers);
    if let Err(r) = gw.keys.admit_without_slot(&headers) {
        gw.metrics.reject(Rejection::Unauthorized);
        return GatewayError::new(Kind::Unauthorized, r.message()).response(api);
    }
    let seen: Vec<_> = gw.upstreams().iter().map(|u| u.seen()).collect();
    let created = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let data: Vec<_> =
        proxy::served_models(&seen).iter().map(|m| json!({"id": m, "object": "model", "created": created, "owned_by": "brink"})).collect();
    ([(header::CONTENT_TYPE, "application/json")], json!({"object": "list", "data": data}).to_string()).into_response()
}

async fn health() -> &'static str {
    "ok\n"
}

async fn ready(State(gw): State<Arc<Gateway>>) -> Response {
    let upstreams = gw.upstreams();
    let healthy = upstreams.iter().filter(|u| u.seen().healthy).count();
    if healthy > 0 {
        (StatusCode::OK, format!("ready: {healthy} of {} upstreams healthy\n", upstreams.len())).into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, format!("no healthy upstream (of {})\n", upstreams.len())).into_response()
    }
}

async fn metrics(State(gw): State<Arc<Gateway>>) -> Response {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], gw.metrics.render()).into_response()
}

async fn not_found(headers: HeaderMap, uri: Uri) -> Response {
    GatewayError::new(Kind::NotFound, format!("no route for {}", uri.path())).response(api_of(&headers))
}

/// Anthropic's clients send `anthropic-version`; everyone else gets OpenAI's shape.
fn api_of(headers: &HeaderMap) -> Api {
    if headers.contains_key("anthropic-version") { Api::Anthropic } else { Api::OpenAi }
}
