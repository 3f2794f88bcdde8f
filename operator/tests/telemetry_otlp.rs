//! Operator traces end to end: with `OTEL_EXPORTER_OTLP_ENDPOINT` set, the real controllers
//! (against the in-memory API server) reconcile a sweep, and a receiver in this test decodes
//! what the exporter posts with the real OTLP protobuf types (`opentelemetry-proto`): a
//! `reconcile` span with the controller, the object and the outcome, from `brink-operator`.
//! One test per process: the tracing subscriber is global.

mod common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use brink_api::crd::RegressionSweep;
use brink_kube_double::KubeDouble;
use brink_operator::controllers::{self, Config, FixedClock, Metrics, Shared};
use brink_operator::telemetry;
use common::{LEASE_NS, NOW_S, NS};
use k8s_openapi::jiff::Timestamp;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{KeyValue, any_value};
use prost::Message;
use serde_json::json;

#[derive(Default)]
struct Received {
    traces: Vec<ExportTraceServiceRequest>,
    /// What the receiver could not take (wrong content type, undecodable body).
    problems: Vec<String>,
}

type Inbox = Arc<Mutex<Received>>;

async fn traces(State(r): State<Inbox>, headers: HeaderMap, body: Bytes) -> StatusCode {
    let mut got = r.lock().unwrap();
    let ct = headers.get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    if ct != "application/x-protobuf" {
        got.problems.push(format!("content-type {ct:?}"));
    }
    match ExportTraceServiceRequest::decode(body) {
        Ok(t) => got.traces.push(t),
        Err(e) => got.problems.push(format!("traces: {e}")),
    }
    StatusCode::OK
}

/// An OTLP/HTTP receiver on its own runtime thread.
fn receiver() -> (SocketAddr, Inbox) {
    let inbox = Inbox::default();
    let state = inbox.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(listener.local_addr().unwrap()).unwrap();
            let app = axum::Router::new().route("/v1/traces", axum::routing::post(traces)).with_state(state);
            axum::serve(listener, app).await.unwrap();
        });
    });
    (rx.recv_timeout(Duration::from_secs(10)).expect("the receiver did not bind"), inbox)
}

fn str_attr<'a>(attrs: &'a [KeyValue], key: &str) -> Option<&'a str> {
    match attrs.iter().find(|kv| kv.key == key)?.value.as_ref()?.value.as_ref()? {
        any_value::Value::StringValue(v) => Some(v),
        _ => None,
    }
}

#[test]
fn reconcile_spans_go_out_over_otlp_with_the_controller_and_object() {
    let (addr, inbox) = receiver();
    let endpoint = format!("http://{addr}");
    let env = move |k: &str| (k == "OTEL_EXPORTER_OTLP_ENDPOINT").then(|| endpoint.clone());
    // Before the runtime, as `main` does: the batch exporter has its own thread.
    let telemetry = telemetry::init_with(&env).expect("telemetry");
    assert!(telemetry.exporting());

    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    runtime.block_on(async {
        let double = KubeDouble::new();
        double.set_wall_clock(NOW_S);
        let sweep: RegressionSweep = serde_json::from_value(json!({
            "apiVersion": "brink.dev/v1alpha1", "kind": "RegressionSweep",
            "metadata": { "name": "nightly", "namespace": NS },
            "spec": { "schedule": "0 * * * *", "suspend": true, "modelRef": { "name": "qwen" },
                      "workload": { "promptTokens": [128], "concurrency": [1], "generatedTokens": [32] } },
        }))
        .expect("a sweep");
        double.seed(&sweep).expect("seed the sweep");
        let shared = Arc::new(Shared {
            client: double.client(),
            metrics: Arc::new(Metrics::new().expect("metrics")),
            clock: Arc::new(FixedClock::new(Timestamp::from_second(NOW_S).expect("time"))),
            config: Config { lease_namespace: LEASE_NS.into(), ..Config::default() },
        });
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(controllers::run(shared, async move {
            let _ = stopped.await;
        }));
        // The sweep's reconcile writes its status (suspended): the reconcile has run.
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while double.get::<RegressionSweep>(Some(NS), "nightly").and_then(|s| s.status).is_none() {
            assert!(std::time::Instant::now() < deadline, "the sweep was never reconciled");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let _ = stop.send(());
        tokio::time::timeout(Duration::from_secs(60), task).await.expect("controllers drain").expect("controllers task");
    });
    drop(runtime);
    // Shutdown flushes the batch: nothing was exported before it (the batch waits 5 s).
    telemetry.shutdown().expect("flush");

    let got = inbox.lock().unwrap();
    assert!(got.problems.is_empty(), "{:?}", got.problems);
    let mut reconciles = Vec::new();
    for req in &got.traces {
        for rs in &req.resource_spans {
            let service = rs.resource.as_ref().and_then(|r| str_attr(&r.attributes, "service.name"));
            for ss in &rs.scope_spans {
                for span in ss.spans.iter().filter(|s| s.name == "reconcile") {
                    let a = |k: &str| str_attr(&span.attributes, k).map(String::from);
                    reconciles.push((service.map(String::from), a("controller"), a("object"), a("outcome"), span.end_time_unix_nano > 0));
                }
            }
        }
    }
    let sweep_span = (
        Some("brink-operator".to_string()),
        Some("regressionsweep".to_string()),
        Some(format!("{NS}/nightly")),
        Some("ok".to_string()),
        true,
    );
    assert!(reconciles.contains(&sweep_span), "no reconcile span of the sweep among {reconciles:?}");
}
