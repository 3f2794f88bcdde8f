//! Telemetry end to end: a server on the tiny synthetic model exports over OTLP (http/protobuf)
//! to a receiver in this test that decodes the real OTLP protobuf (the `opentelemetry-proto`
//! types), and its `/metrics` text parses strictly and carries the GenAI series.

mod common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use brink_engine::server::telemetry::otlp::OtlpConfig;
use brink_engine::server::telemetry::prometheus::parse_exposition;
use brink_engine::server::telemetry::{Kind, NodeMetrics, Scalar};
use common::*;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::metrics::v1::metric::Data;
use opentelemetry_proto::tonic::trace::v1::Span;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use prost::Message;
use serde_json::json;

#[derive(Default)]
struct Received {
    metrics: Vec<ExportMetricsServiceRequest>,
    traces: Vec<ExportTraceServiceRequest>,
    /// What the receiver could not take (wrong content type, undecodable body).
    problems: Vec<String>,
}

type Shared = Arc<Mutex<Received>>;

fn check_content_type(headers: &HeaderMap, got: &mut Received) {
    let ct = headers.get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("");
    if ct != "application/x-protobuf" {
        got.problems.push(format!("content-type {ct:?}"));
    }
}

async fn metrics(State(r): State<Shared>, headers: HeaderMap, body: Bytes) -> StatusCode {
    let mut got = r.lock().unwrap();
    check_content_type(&headers, &mut got);
    match ExportMetricsServiceRequest::decode(body) {
        Ok(m) => got.metrics.push(m),
        Err(e) => got.problems.push(format!("metrics: {e}")),
    }
    StatusCode::OK
}

async fn traces(State(r): State<Shared>, headers: HeaderMap, body: Bytes) -> StatusCode {
    let mut got = r.lock().unwrap();
    check_content_type(&headers, &mut got);
    match ExportTraceServiceRequest::decode(body) {
        Ok(t) => got.traces.push(t),
        Err(e) => got.problems.push(format!("traces: {e}")),
    }
    StatusCode::OK
}

/// An OTLP/HTTP receiver on its own runtime thread.
fn receiver() -> (SocketAddr, Shared) {
    let shared = Shared::default();
    let state = shared.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(listener.local_addr().unwrap()).unwrap();
            let app = axum::Router::new()
                .route("/v1/metrics", axum::routing::post(metrics))
                .route("/v1/traces", axum::routing::post(traces))
                .with_state(state);
            axum::serve(listener, app).await.unwrap();
        });
    });
    (rx.recv_timeout(Duration::from_secs(10)).expect("the receiver did not bind"), shared)
}

fn attr<'a>(attrs: &'a [KeyValue], key: &str) -> Option<&'a any_value::Value> {
    attrs.iter().find(|kv| kv.key == key).and_then(|kv| kv.value.as_ref()).and_then(|v: &AnyValue| v.value.as_ref())
}

fn int_attr(attrs: &[KeyValue], key: &str) -> i64 {
    match attr(attrs, key) {
        Some(any_value::Value::IntValue(v)) => *v,
        other => panic!("{key}: {other:?} in {attrs:?}"),
    }
}

fn str_attr<'a>(attrs: &'a [KeyValue], key: &str) -> &'a str {
    match attr(attrs, key) {
        Some(any_value::Value::StringValue(v)) => v,
        other => panic!("{key}: {other:?} in {attrs:?}"),
    }
}

#[test]
fn otlp_receives_genai_metrics_and_request_spans_with_chunk_children_and_metrics_text_parses() {
    let (at, received) = receiver();
    let otlp = OtlpConfig {
        traces: Some(format!("http://{at}/v1/traces")),
        metrics: Some(format!("http://{at}/v1/metrics")),
        service_name: "brink-test".into(),
        export_interval: Duration::from_millis(300),
    };
    let mut opts = options(2, 4, Vec::new());
    // Small chunks: the prompt goes in several, each a child span.
    opts.worker.prefill_chunk = 16;
    // Node gauges as the agent passes them (its real ones: node-agent/tests/serve_metrics.rs).
    opts.node_metrics = Some(NodeMetrics::new(|| {
        vec![Scalar {
            name: "brink_selftest_cases",
            kind: Kind::Gauge,
            help: "Self-test cases by result and suite.",
            samples: vec![
                (vec![("result", "passed".to_string()), ("suite", "kernel".to_string())], 11.0),
                (vec![("result", "hung".to_string()), ("suite", "kernel".to_string())], 2.0),
            ],
        }]
    }));
    let server = start_with(opts, Some(otlp));

    let messages = json!([{"role": "user", "content": "Tell me about paged attention and prefix caches in a few words, please."}]);
    let prompt_tokens = chat_prompt_tokens(&messages) as i64;
    assert!(prompt_tokens > 32, "{prompt_tokens} tokens: too short for several chunks");
    // As a gateway sends it: the request's span is the child of the gateway's attempt span.
    let body = json!({"model": "tiny", "messages": messages, "max_tokens": 6, "temperature": 0});
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let r = request(server.addr, "POST", "/v1/chat/completions", &[("traceparent", traceparent)], &body.to_string());
    assert_eq!(r.status, 200, "{}", r.body);
    let output_tokens = r.json()["usage"]["completion_tokens"].as_i64().unwrap();
    let r = post(server.addr, "/v1/completions", &json!({"model": "tiny", "prompt": "Once upon a time", "max_tokens": 3}));
    assert_eq!(r.status, 200, "{}", r.body);

    // The Prometheus text: strict parse, the GenAI series with their labels, the brink_* ones.
    let text = get(server.addr, "/metrics").body;
    let samples = parse_exposition(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let one = |name: &str, op: &str| {
        samples
            .iter()
            .find(|s| s.name == name && s.label("gen_ai_operation_name") == Some(op) && s.label("gen_ai_request_model") == Some("tiny"))
            .unwrap_or_else(|| panic!("no {name} for {op}\n{text}"))
            .value
    };
    assert_eq!(one("gen_ai_server_time_to_first_token_seconds_count", "chat"), 1.0);
    assert_eq!(one("gen_ai_server_time_to_first_token_seconds_count", "text_completion"), 1.0);
    assert_eq!(one("gen_ai_server_request_duration_seconds_count", "chat"), 1.0);
    let usage = |token_type: &str| {
        samples
            .iter()
            .find(|s| {
                s.name == "gen_ai_client_token_usage_sum"
                    && s.label("gen_ai_token_type") == Some(token_type)
                    && s.label("gen_ai_operation_name") == Some("chat")
            })
            .unwrap_or_else(|| panic!("no {token_type} usage\n{text}"))
            .value
    };
    assert_eq!((usage("input"), usage("output")), (prompt_tokens as f64, output_tokens as f64));
    let value = |name: &str| samples.iter().find(|s| s.name == name).unwrap_or_else(|| panic!("no {name}\n{text}")).value;
    assert_eq!(value("brink_requests_total"), 2.0);
    assert_eq!(samples.iter().find(|s| s.name == "brink_selftest_cases" && s.label("result") == Some("hung")).map(|s| s.value), Some(2.0));
    assert!(value("brink_prefill_tokens_total") >= prompt_tokens as f64);
    assert!(value("brink_prefill_seconds_total") > 0.0);
    assert!(value("brink_kv_blocks_total") > 0.0);
    for name in ["brink_decode_tokens_total", "brink_kv_blocks_used", "brink_prefix_cached_tokens_total", "brink_engine_restarts_total"] {
        value(name);
    }

    // The periodic reader exports while the server runs (every 300 ms here)...
    let t0 = std::time::Instant::now();
    while received.lock().unwrap().metrics.is_empty() {
        assert!(t0.elapsed() < Duration::from_secs(10), "no periodic metric export within 10 s");
        std::thread::sleep(Duration::from_millis(50));
    }
    eprintln!("the first periodic export after {:?}", t0.elapsed());
    // ... and stopping flushes the exporters.
    stop(server);
    let got = received.lock().unwrap();
    assert!(got.problems.is_empty(), "{:?}", got.problems);

    // Metrics: the resource names the service; the TTFT histogram counted both requests.
    let resource_metrics: Vec<_> = got.metrics.iter().flat_map(|m| &m.resource_metrics).collect();
    assert!(!resource_metrics.is_empty(), "no metrics arrived");
    let service = resource_metrics[0].resource.as_ref().map(|r| str_attr(&r.attributes, "service.name").to_string());
    assert_eq!(service.as_deref(), Some("brink-test"));
    let all: Vec<_> = resource_metrics.iter().flat_map(|r| &r.scope_metrics).flat_map(|s| &s.metrics).collect();
    let last = |name: &str| all.iter().rev().find(|m| m.name == name).unwrap_or_else(|| panic!("no {name} in the export"));
    let ttft = last("gen_ai.server.time_to_first_token");
    assert_eq!(ttft.unit, "s");
    let Some(Data::Histogram(h)) = &ttft.data else { panic!("{ttft:?}") };
    let ttft_total: u64 = h.data_points.iter().map(|p| p.count).sum();
    assert_eq!(ttft_total, 2, "{h:?}");
    assert!(h.data_points.iter().all(|p| p.explicit_bounds.len() == 16 && str_attr(&p.attributes, "gen_ai.request.model") == "tiny"));
    let Some(Data::Histogram(u)) = &last("gen_ai.client.token.usage").data else { panic!() };
    let input: f64 = u.data_points.iter().filter(|p| str_attr(&p.attributes, "gen_ai.token.type") == "input").filter_map(|p| p.sum).sum();
    assert!(input > prompt_tokens as f64, "both prompts' tokens: {u:?}");
    let Some(Data::Sum(req)) = &last("brink_requests").data else { panic!() };
    assert!(req.is_monotonic);
    assert!(
        req.data_points.iter().any(|p| p.value == Some(opentelemetry_proto::tonic::metrics::v1::number_data_point::Value::AsDouble(2.0)))
    );
    for name in ["gen_ai.server.request.duration", "gen_ai.server.time_per_output_token", "brink_kv_blocks_total", "brink_prefill_tokens"] {
        last(name);
    }
    // The agent's node gauges travel with the server's, attributes and all.
    let Some(Data::Gauge(cases)) = &last("brink_selftest_cases").data else { panic!() };
    let mut node_cases: Vec<(String, String, Option<f64>)> = cases
        .data_points
        .iter()
        .map(|p| {
            let v = match p.value {
                Some(opentelemetry_proto::tonic::metrics::v1::number_data_point::Value::AsDouble(v)) => Some(v),
                _ => None,
            };
            (str_attr(&p.attributes, "result").to_string(), str_attr(&p.attributes, "suite").to_string(), v)
        })
        .collect();
    node_cases.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(node_cases, [("hung".into(), "kernel".into(), Some(2.0)), ("passed".into(), "kernel".into(), Some(11.0))]);

    // Spans: the chat request's span, server kind, with its GenAI attributes, and its prefill
    // chunks as children that cover the prompt.
    let spans: Vec<&Span> = got.traces.iter().flat_map(|t| &t.resource_spans).flat_map(|r| &r.scope_spans).flat_map(|s| &s.spans).collect();
    let request = spans.iter().find(|s| s.name == "chat tiny").unwrap_or_else(|| panic!("no request span in {spans:?}"));
    assert_eq!(request.kind, SpanKind::Server as i32);
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    assert_eq!(
        (hex(&request.trace_id), hex(&request.parent_span_id)),
        ("4bf92f3577b34da6a3ce929d0e0e4736".to_string(), "00f067aa0ba902b7".to_string()),
        "the request's span continues the traceparent it came with"
    );
    assert_eq!(str_attr(&request.attributes, "gen_ai.operation.name"), "chat");
    assert_eq!(str_attr(&request.attributes, "gen_ai.request.model"), "tiny");
    assert!(str_attr(&request.attributes, "gen_ai.response.id").starts_with("chatcmpl-"));
    assert_eq!(int_attr(&request.attributes, "gen_ai.usage.input_tokens"), prompt_tokens);
    assert_eq!(int_attr(&request.attributes, "gen_ai.usage.output_tokens"), output_tokens);
    let Some(any_value::Value::ArrayValue(reasons)) = attr(&request.attributes, "gen_ai.response.finish_reasons") else { panic!() };
    assert_eq!(reasons.values.len(), 1);
    let mut chunks: Vec<&&Span> = spans.iter().filter(|s| s.parent_span_id == request.span_id).collect();
    assert!(chunks.len() >= 3, "{} chunk spans of a {prompt_tokens}-token prompt in chunks of 16", chunks.len());
    chunks.sort_by_key(|s| int_attr(&s.attributes, "brink.chunk.start"));
    let mut next = 0;
    for c in &chunks {
        assert_eq!((c.name.as_str(), c.trace_id.as_slice()), ("prefill_chunk", request.trace_id.as_slice()));
        assert_eq!(int_attr(&c.attributes, "brink.chunk.start"), next, "chunks tile the prompt");
        let len = int_attr(&c.attributes, "brink.chunk.len");
        assert!((1..=16).contains(&len));
        assert!(int_attr(&c.attributes, "brink.step") > 0);
        assert!(c.start_time_unix_nano >= request.start_time_unix_nano && c.end_time_unix_nano <= request.end_time_unix_nano);
        next += len;
    }
    assert_eq!(next, prompt_tokens);
    eprintln!("OTLP: {} metric exports, {} spans ({} chunks of the chat request)", got.metrics.len(), spans.len(), chunks.len());
    let completion = spans.iter().find(|s| s.name == "text_completion tiny").expect("the completion's span");
    assert!(completion.parent_span_id.is_empty(), "without a traceparent, a trace of its own");
}

/// A real Prometheus (`scripts/prom-check`) scrapes the server and finds the series with their
/// labels. Skipped without `prometheus` on PATH, unless `BRINK_REQUIRE_PROMETHEUS=1` (CI) makes
/// that a failure.
#[test]
fn a_real_prometheus_scrapes_the_genai_and_brink_series() {
    let have = std::process::Command::new("prometheus").arg("--version").output().is_ok_and(|o| o.status.success());
    if !have {
        assert!(
            std::env::var("BRINK_REQUIRE_PROMETHEUS").as_deref() != Ok("1"),
            "BRINK_REQUIRE_PROMETHEUS=1 but no `prometheus` on PATH (apt-get install -y --no-install-recommends prometheus)"
        );
        eprintln!("skipped: no `prometheus` on PATH");
        return;
    }
    let server = start(options(1, 4, Vec::new()));
    let r = post(
        server.addr,
        "/v1/chat/completions",
        &json!({"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/prom-check");
    let out = std::process::Command::new(&script).arg(server.addr.to_string()).arg("tiny").output().unwrap();
    let report = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{}: {report}", script.display());
    eprintln!("{report}");
    assert!(report.contains("gen_ai_server_time_to_first_token_seconds_count{gen_ai_request_model=\"tiny\"}: 1 series"), "{report}");
    stop(server);
}

/// A step that fails on a kernel launch reaches the supervisor typed, through the child's
/// protocol: `brink_kernel_launch_errors_total{kernel,phase}` counts it, the requests of that
/// step fail, and the engine serves on. The CPU backend launches no kernels, so the failure is
/// the test-only `launch-error` fault, shaped as the CUDA backend's rejected launch.
#[test]
fn a_kernel_launch_error_in_the_engine_child_is_counted_by_kernel() {
    let mut opts = options(1, 4, Vec::new());
    // Only steps of at least 40 rows: the long prompt below, not the short ones.
    opts.inject_fault = Some("launch-error:layer=1,min-rows=40".into());
    let server = start(opts);
    let launch_errors = |server: &Running| {
        let text = get(server.addr, "/metrics").body;
        let samples = parse_exposition(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        assert!(text.contains("# TYPE brink_kernel_launch_errors_total counter"), "{text}");
        let failed = samples.iter().find(|s| s.name == "brink_engine_failed_steps_total").unwrap().value;
        let series: Vec<(String, String, f64)> = samples
            .iter()
            .filter(|s| s.name == "brink_kernel_launch_errors_total")
            .map(|s| (s.label("kernel").unwrap_or("").to_string(), s.label("phase").unwrap_or("").to_string(), s.value))
            .collect();
        (series, failed)
    };
    let short = json!({"model": "tiny", "prompt": "Hi", "max_tokens": 2});
    assert_eq!(post(server.addr, "/v1/completions", &short).status, 200);
    // No launch has failed: the counter is there with no series.
    assert_eq!(launch_errors(&server), (vec![], 0.0));

    let long = json!({"model": "tiny", "prompt": "word ".repeat(60), "max_tokens": 2});
    let r = post(server.addr, "/v1/completions", &long);
    assert_eq!(r.status, 500, "{}", r.body);
    assert!(r.body.contains("injected launch error") && r.body.contains("injected_fault"), "{}", r.body);
    assert_eq!(launch_errors(&server), (vec![("injected_fault".to_string(), "launch".to_string(), 1.0)], 1.0));

    // Not sticky: the same engine child serves on.
    assert_eq!(post(server.addr, "/v1/completions", &short).status, 200);
    let r = post(server.addr, "/v1/completions", &long);
    assert_eq!(r.status, 500, "{}", r.body);
    assert_eq!(launch_errors(&server).0, [("injected_fault".to_string(), "launch".to_string(), 2.0)]);
    let text = get(server.addr, "/metrics").body;
    assert!(text.contains("brink_engine_restarts_total 0"), "{text}");
    stop(server);
}

/// A sticky launch error (the CUDA context is lost) is counted, then handled as a crash: the
/// child is killed and restarted with a report, the step's request gets a 503, and the next
/// request runs on the fresh child.
#[test]
fn a_sticky_kernel_launch_error_restarts_the_engine_child() {
    let mut opts = options(1, 4, Vec::new());
    opts.inject_fault = Some("sticky-launch-error:layer=1,min-rows=40".into());
    // The error path: the step's request fails rather than running again on the new child.
    opts.requeue_after_restart = 0;
    let dir = opts.stall_dir.clone();
    let server = start(opts);
    let metric = |name: &str, labels: &[(&str, &str)]| {
        let text = get(server.addr, "/metrics").body;
        let samples = parse_exposition(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        samples.iter().find(|s| s.name == name && labels.iter().all(|(k, v)| s.label(k) == Some(*v))).map(|s| s.value)
    };
    let first_pid = metric("brink_engine_pid", &[]).unwrap();
    let long = json!({"model": "tiny", "prompt": "word ".repeat(60), "max_tokens": 2});
    let r = post(server.addr, "/v1/completions", &long);
    assert_eq!(r.status, 503, "{}", r.body);
    assert!(r.body.contains("sticky CUDA error in kernel injected_fault"), "{}", r.body);
    assert_eq!(metric("brink_kernel_launch_errors_total", &[("kernel", "injected_fault"), ("phase", "execution")]), Some(1.0));
    // The request is answered before the new child is up; the restart is counted once it is.
    let t0 = std::time::Instant::now();
    while metric("brink_engine_restarts_total", &[]) != Some(1.0) {
        assert!(t0.elapsed() < Duration::from_secs(30), "no restart within 30 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    let short = json!({"model": "tiny", "prompt": "Hi", "max_tokens": 2});
    assert_eq!(post(server.addr, "/v1/completions", &short).status, 200);
    assert_ne!(metric("brink_engine_pid", &[]), Some(first_pid), "the child was replaced");
    let reports: Vec<String> =
        std::fs::read_dir(&dir).map(|d| d.flatten().filter_map(|e| std::fs::read_to_string(e.path()).ok()).collect()).unwrap_or_default();
    assert!(reports.iter().any(|r| r.contains("\"crash\"") && r.contains("sticky CUDA error")), "{reports:?}");
    stop(server);
}
