//! Gateway traces end to end: with `OTEL_EXPORTER_OTLP_ENDPOINT` set, a request that replica A
//! refuses (503) and replica B answers is exported by the real OTLP exporter to a receiver in
//! this test, which decodes it with the real protobuf types (`opentelemetry-proto`): the
//! request's span continues the client's `traceparent`, under it one `upstream` span per
//! attempt (A retried with its reason, B answered), and each replica got its attempt's span as
//! the parent in `traceparent`. One test per process: the exporter flushes on shutdown.

mod common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use brink_gateway::Gateway;
use brink_gateway::telemetry::Telemetry;
use common::*;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{KeyValue, any_value};
use opentelemetry_proto::tonic::trace::v1::Span;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use prost::Message;

/// The client's own trace context: the gateway's request span continues it.
const CLIENT_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";

#[derive(Default)]
struct Received {
    traces: Vec<ExportTraceServiceRequest>,
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

/// An OTLP/HTTP receiver on its own runtime thread (the collector double).
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

fn attr<'a>(attrs: &'a [KeyValue], key: &str) -> Option<&'a any_value::Value> {
    attrs.iter().find(|kv| kv.key == key)?.value.as_ref()?.value.as_ref()
}

fn str_attr<'a>(attrs: &'a [KeyValue], key: &str) -> Option<&'a str> {
    match attr(attrs, key)? {
        any_value::Value::StringValue(v) => Some(v),
        _ => None,
    }
}

fn int_attr(attrs: &[KeyValue], key: &str) -> Option<i64> {
    match attr(attrs, key)? {
        any_value::Value::IntValue(v) => Some(*v),
        _ => None,
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn a_retried_request_is_one_span_with_an_attempt_span_per_replica_and_each_replica_its_parent() {
    let (addr, inbox) = receiver();
    let endpoint = format!("http://{addr}");
    let env = move |k: &str| (k == "OTEL_EXPORTER_OTLP_ENDPOINT").then(|| endpoint.clone());
    // Before the runtime, as `main` does: the batch exporter has its own thread.
    let telemetry = Telemetry::from_lookup(&env).expect("telemetry");
    assert!(telemetry.exporting());
    let tracer = telemetry.tracer();

    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let (a_hits, b_hits, a_url, b_url) = runtime.block_on(async {
        let a = Stub::start("A", &["m"]).await;
        let b = Stub::start("B", &["m"]).await;
        a.refuse_with(Some(503));
        let mut config = config(&[&a, &b]);
        // No affinity: with equal loads A is tried first, and refuses.
        config.affinity_prefix_chars = 0;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let served = tokio::spawn(brink_gateway::serve(listener, Gateway::new(config).traced(tracer), async move {
            let _ = stopped.await;
        }));
        let gw = common::Gateway::from_url(url, stop);
        wait_models(&gw, &[], &["m"]).await;
        let traceparent = format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01");
        let r = call(
            &format!("{}/v1/chat/completions", gw.url),
            "POST",
            &[("traceparent", traceparent.as_str())],
            &chat("m", "hi").to_string(),
        )
        .await;
        assert_eq!((r.status, r.json()["answered_by"].as_str()), (200, Some("B")), "{}", r.body);
        drop(gw);
        tokio::time::timeout(DEADLINE, served).await.expect("the gateway stopped").unwrap().unwrap();
        (a.hits(), b.hits(), a.url.clone(), b.url.clone())
    });
    drop(runtime);
    // Shutdown flushes the batch (it would wait 5 s otherwise).
    telemetry.shutdown().expect("flush");

    let got = inbox.lock().unwrap();
    assert!(got.problems.is_empty(), "{:?}", got.problems);
    let mut spans: Vec<Span> = Vec::new();
    for req in &got.traces {
        for rs in &req.resource_spans {
            let service = rs.resource.as_ref().and_then(|r| str_attr(&r.attributes, "service.name"));
            assert_eq!(service, Some("brink-gateway"));
            spans.extend(rs.scope_spans.iter().flat_map(|ss| ss.spans.iter().cloned()));
        }
    }
    let names: Vec<&str> = spans.iter().map(|s| s.name.as_str()).collect();
    let request: Vec<&Span> = spans.iter().filter(|s| s.name == "POST /v1/chat/completions").collect();
    assert_eq!(request.len(), 1, "{names:?}");
    let request = request[0];
    // The client's trace goes on: the request span is its child.
    assert_eq!((hex(&request.trace_id), hex(&request.parent_span_id)), (CLIENT_TRACE.to_string(), CLIENT_SPAN.to_string()));
    assert_eq!(request.kind, SpanKind::Server as i32);
    assert_eq!(str_attr(&request.attributes, "gen_ai.request.model"), Some("m"));
    assert_eq!(str_attr(&request.attributes, "brink.gateway.affinity"), Some("none"));
    assert_eq!(int_attr(&request.attributes, "http.response.status_code"), Some(200));
    assert_eq!(int_attr(&request.attributes, "brink.gateway.attempts"), Some(2));
    assert!(request.end_time_unix_nano >= request.start_time_unix_nano && request.end_time_unix_nano > 0);

    let mut attempts: Vec<&Span> = spans.iter().filter(|s| s.name == "upstream").collect();
    attempts.sort_by_key(|s| int_attr(&s.attributes, "brink.gateway.attempt"));
    assert_eq!(attempts.len(), 2, "{names:?}");
    for s in &attempts {
        assert_eq!((s.trace_id.as_slice(), s.parent_span_id.as_slice()), (request.trace_id.as_slice(), request.span_id.as_slice()));
        assert_eq!(s.kind, SpanKind::Client as i32);
        assert_eq!(str_attr(&s.attributes, "gen_ai.request.model"), Some("m"));
        assert!(s.start_time_unix_nano >= request.start_time_unix_nano && s.end_time_unix_nano <= request.end_time_unix_nano);
    }
    let (first, second) = (attempts[0], attempts[1]);
    let a = |s: &Span, k: &str| str_attr(&s.attributes, k).map(String::from);
    assert_eq!(
        (a(first, "brink.gateway.replica"), a(first, "brink.gateway.outcome"), a(first, "brink.gateway.retry_reason")),
        (Some(a_url.clone()), Some("retried".into()), Some("http_503".into()))
    );
    assert_eq!(int_attr(&first.attributes, "http.response.status_code"), Some(503));
    assert_eq!(
        (a(second, "brink.gateway.replica"), a(second, "brink.gateway.outcome"), a(second, "brink.gateway.retry_reason")),
        (Some(b_url.clone()), Some("answered".into()), None)
    );
    assert_eq!(int_attr(&second.attributes, "http.response.status_code"), Some(200));
    assert!(first.end_time_unix_nano <= second.start_time_unix_nano, "the attempts are one after the other");

    // Each replica was told its attempt's span is the parent of whatever it traces.
    let sent = |hits: &[Hit]| hits.iter().map(|h| h.traceparent.clone()).collect::<Vec<_>>();
    let want = |s: &Span| Some(format!("00-{}-{}-01", hex(&s.trace_id), hex(&s.span_id)));
    assert_eq!(sent(&a_hits), vec![want(first)], "A's traceparent");
    assert_eq!(sent(&b_hits), vec![want(second)], "B's traceparent");
}
