//! `run`'s HTTP endpoint (`--listen`): `/health` (200 while the process runs), `/ready` (200 once
//! the SparkNode was written once; never waits for a qualification: one bad node must not block
//! a DaemonSet rollout) and `/metrics` (Prometheus text, the engine's renderer). The loop opens
//! it once the SparkNode is written, so `/ready` answers 200 whenever it answers; the flag keeps
//! that so if the order ever changes.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use brink_engine::server::telemetry::Scalar;
use brink_engine::server::telemetry::prometheus::render_scalars;

/// What the endpoint reads.
#[derive(Clone)]
pub struct Endpoint {
    pub ready: Arc<AtomicBool>,
    /// Every series at a scrape.
    pub scalars: Arc<dyn Fn() -> Vec<Scalar> + Send + Sync>,
}

async fn health() -> &'static str {
    "ok\n"
}

async fn ready(State(e): State<Endpoint>) -> Response {
    if e.ready.load(Ordering::Acquire) {
        "ready\n".into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "the SparkNode has not been written yet\n").into_response()
    }
}

async fn metrics(State(e): State<Endpoint>) -> Response {
    // The sensors read files and NVML: off the async threads.
    let read = e.scalars.clone();
    match tokio::task::spawn_blocking(move || read()).await {
        Ok(table) => {
            let mut text = String::new();
            render_scalars(&mut text, &table);
            ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text).into_response()
        }
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("reading the metrics failed: {e}\n")).into_response(),
    }
}

pub fn router(e: Endpoint) -> Router {
    Router::new().route("/health", get(health)).route("/ready", get(ready)).route("/metrics", get(metrics)).with_state(e)
}
