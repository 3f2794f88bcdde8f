//! The operator's HTTP endpoint: `/metrics` (Prometheus text format) and `/healthz`.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use super::metrics::Metrics;

async fn metrics(State(m): State<Arc<Metrics>>) -> Response {
    match m.render() {
        Ok(text) => ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("rendering metrics: {e}\n")).into_response(),
    }
}

async fn healthz() -> &'static str {
    "ok\n"
}

pub fn router(m: Arc<Metrics>) -> Router {
    Router::new().route("/metrics", get(metrics)).route("/healthz", get(healthz)).with_state(m)
}

/// Binds `addr` (an error names it) and serves until `shutdown` completes.
pub async fn bind(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr).await
}

pub async fn serve(
    listener: tokio::net::TcpListener,
    m: Arc<Metrics>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(m)).with_graceful_shutdown(shutdown).await
}
