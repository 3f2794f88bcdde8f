//! The gateway's HTTP front: the generation routes (through [`crate::proxy`]), the model list,
//! health, readiness and metrics; and the discovery tasks, which live as long as the server.

use std::future::Future;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, Request, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::json;

use crate::config::Config;
use crate::discovery::{self, Upstream};
use crate::errors::{Api, GatewayError, Kind};
use crate::keys::Keys;
use crate::metrics::{Metrics, Rejection};
use crate::proxy::{self, UpstreamClient};

pub struct Gateway {
    pub config: Config,
    pub upstreams: Vec<Arc<Upstream>>,
    pub keys: Keys,
    pub metrics: Arc<Metrics>,
    pub client: UpstreamClient,
}

impl Gateway {
    pub fn new(config: Config) -> Gateway {
        let upstreams: Vec<Arc<Upstream>> = config.upstreams.iter().map(|u| Arc::new(Upstream::new(u.clone()))).collect();
        let metrics = Arc::new(Metrics::new(&config.upstreams));
        let keys = Keys::new(config.api_keys.clone(), config.per_key_concurrency);
        Gateway { config, upstreams, keys, metrics, client: proxy::client() }
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
    let gw = Arc::new(Gateway::new(config));
    let mut polls = tokio::task::JoinSet::new();
    for u in &gw.upstreams {
        let key = gw.config.upstream_api_key.clone();
        polls.spawn(discovery::poll_forever(u.clone(), gw.client.clone(), key, gw.config.poll_interval, gw.metrics.clone()));
    }
    let result = axum::serve(listener, router(gw)).with_graceful_shutdown(shutdown).await;
    polls.abort_all();
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
    let seen: Vec<_> = gw.upstreams.iter().map(|u| u.seen()).collect();
    let created = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let data: Vec<_> =
        proxy::served_models(&seen).iter().map(|m| json!({"id": m, "object": "model", "created": created, "owned_by": "brink"})).collect();
    ([(header::CONTENT_TYPE, "application/json")], json!({"object": "list", "data": data}).to_string()).into_response()
}

async fn health() -> &'static str {
    "ok\n"
}

async fn ready(State(gw): State<Arc<Gateway>>) -> Response {
    let healthy = gw.upstreams.iter().filter(|u| u.seen().healthy).count();
    if healthy > 0 {
        (StatusCode::OK, format!("ready: {healthy} of {} upstreams healthy\n", gw.upstreams.len())).into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, format!("no healthy upstream (of {})\n", gw.upstreams.len())).into_response()
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
