//! The gateway's spans ([`crate::spans`] says what they carry): a request's, continuing the
//! client's W3C `traceparent` when it sent one, and one per attempt at a replica, whose context
//! goes to the replica in `traceparent` so the engine's request span can be its child. Without a
//! tracer (no OTLP export) nothing is made, and the client's `traceparent` goes to the replica
//! untouched.
//!
//! A span ends when its last handle is dropped: an answer's body holds its request's and its
//! attempt's handles, so both cover the stream to its end.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use axum::http::{HeaderMap, HeaderName, HeaderValue};
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{SpanKind, TraceContextExt, Tracer as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracer;

use crate::errors::Api;
use crate::spans::{self, AttemptEnd, AttemptStart};

/// A span in its context; ended when dropped.
struct Live(Context);

impl Drop for Live {
    fn drop(&mut self) {
        self.0.span().end();
    }
}

struct Request {
    live: Live,
    tracer: SdkTracer,
    attempts: AtomicU32,
}

/// A request's span; clones share it. Empty without a tracer.
#[derive(Clone, Default)]
pub struct RequestSpan(Option<Arc<Request>>);

impl RequestSpan {
    /// Starts the span of a request that came with `headers`: a child of the client's
    /// `traceparent` when it is a valid one, else a new trace's root.
    pub fn start(tracer: Option<&SdkTracer>, headers: &HeaderMap, method: &str, route: &str, api: Api) -> RequestSpan {
        let Some(tracer) = tracer else { return RequestSpan(None) };
        let parent = TraceContextPropagator::new().extract(&Headers(headers));
        let span = tracer
            .span_builder(spans::request_name(method, route))
            .with_kind(SpanKind::Server)
            .with_attributes(spans::request_start(method, route, api))
            .start_with_context(tracer, &parent);
        let live = Live(parent.with_span(span));
        RequestSpan(Some(Arc::new(Request { live, tracer: tracer.clone(), attempts: AtomicU32::new(0) })))
    }

    pub fn set(&self, attributes: Vec<KeyValue>) {
        if let Some(r) = &self.0 {
            r.live.0.span().set_attributes(attributes);
        }
    }

    /// The status the client got; the span itself ends with its last handle.
    pub fn answered(&self, status: u16) {
        if let Some(r) = &self.0 {
            let (attributes, status) = spans::request_end(status, r.attempts.load(Ordering::Relaxed));
            let span = r.live.0.span();
            span.set_attributes(attributes);
            span.set_status(status);
        }
    }

    /// The next attempt's span, a child of this one. `a.number` is ignored: attempts are
    /// numbered here, in the order they start.
    pub fn attempt(&self, a: AttemptStart<'_>) -> AttemptSpan {
        let Some(r) = &self.0 else { return AttemptSpan(None) };
        let number = r.attempts.fetch_add(1, Ordering::Relaxed) + 1;
        let span = r
            .tracer
            .span_builder(spans::ATTEMPT_SPAN)
            .with_kind(SpanKind::Client)
            .with_attributes(spans::attempt_start(&AttemptStart { number, ..a }))
            .start_with_context(&r.tracer, &r.live.0);
        AttemptSpan(Some(Live(r.live.0.with_span(span))))
    }
}

/// One attempt's span; ends when dropped. Empty without a tracer.
pub struct AttemptSpan(Option<Live>);

impl AttemptSpan {
    /// Sets `traceparent` (and `tracestate`, when there is one) of the request to the replica to
    /// this attempt's; the client's own are replaced. Without a span, `headers` stay as they are.
    pub fn inject(&self, headers: &mut HeaderMap) {
        let Some(live) = &self.0 else { return };
        headers.remove("traceparent");
        headers.remove("tracestate");
        TraceContextPropagator::new().inject_context(&live.0, &mut HeadersMut(headers));
    }

    pub fn end(&self, end: &AttemptEnd) {
        if let Some(live) = &self.0 {
            let (attributes, status) = spans::attempt_end(end);
            let span = live.0.span();
            span.set_attributes(attributes);
            span.set_status(status);
        }
    }
}

struct Headers<'a>(&'a HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(HeaderName::as_str).collect()
    }
}

struct HeadersMut<'a>(&'a mut HeaderMap);

impl Injector for HeadersMut<'_> {
    fn set(&mut self, key: &str, value: String) {
        // The propagator writes only `traceparent` and `tracestate`, valid names; a value that is
        // not a valid header (a tracestate the client sent) is left out rather than sent broken.
        if let (Ok(name), Ok(value)) = (HeaderName::try_from(key), HeaderValue::try_from(value)) {
            self.0.insert(name, value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_sdk::error::OTelSdkResult;
    use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanExporter};
    use std::sync::Mutex;

    /// Keeps what it is given (the SDK's in-memory exporter needs its `testing` feature).
    #[derive(Clone, Debug, Default)]
    struct Kept(Arc<Mutex<Vec<SpanData>>>);

    impl SpanExporter for Kept {
        async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
            self.0.lock().unwrap().extend(batch);
            Ok(())
        }
    }

    #[test]
    fn without_a_tracer_the_clients_traceparent_goes_through_untouched() {
        let mut headers = HeaderMap::new();
        headers.insert("traceparent", HeaderValue::from_static("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"));
        let request = RequestSpan::start(None, &headers, "POST", "/v1/chat/completions", Api::OpenAi);
        let attempt = request.attempt(AttemptStart { number: 0, replica: "http://a", model: "m", served_as: "m", affinity_hit: false });
        attempt.inject(&mut headers);
        assert_eq!(headers["traceparent"], "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
    }

    #[test]
    fn attempts_are_children_of_the_request_which_continues_the_clients_trace() {
        let exporter = Kept::default();
        let provider = SdkTracerProvider::builder().with_simple_exporter(exporter.clone()).build();
        let tracer = provider.tracer("test");
        let mut headers = HeaderMap::new();
        headers.insert("traceparent", HeaderValue::from_static("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"));
        let request = RequestSpan::start(Some(&tracer), &headers, "POST", "/v1/chat/completions", Api::OpenAi);
        let start = AttemptStart { number: 0, replica: "http://a", model: "m", served_as: "m", affinity_hit: false };
        let mut sent = Vec::new();
        for _ in 0..2 {
            let attempt = request.attempt(start.clone());
            let mut out = headers.clone();
            attempt.inject(&mut out);
            sent.push(out["traceparent"].to_str().unwrap().to_string());
        }
        request.answered(200);
        drop(request);
        let spans = exporter.0.lock().unwrap().clone();
        assert_eq!(spans.len(), 3, "{spans:?}");
        let req = spans.iter().find(|s| s.name == "POST /v1/chat/completions").unwrap();
        assert_eq!(format!("{:032x}", req.span_context.trace_id()), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(format!("{:016x}", req.parent_span_id), "00f067aa0ba902b7");
        let attempts: Vec<_> = spans.iter().filter(|s| s.name == "upstream").collect();
        for (a, traceparent) in attempts.iter().zip(&sent) {
            assert_eq!(a.parent_span_id, req.span_context.span_id());
            let want = format!("00-{:032x}-{:016x}-01", a.span_context.trace_id(), a.span_context.span_id());
            assert_eq!(traceparent, &want);
        }
        let numbers: Vec<_> = attempts
            .iter()
            .map(|a| a.attributes.iter().find(|kv| kv.key.as_str() == "brink.gateway.attempt").unwrap().value.clone())
            .collect();
        assert_eq!(numbers, [opentelemetry::Value::I64(1), opentelemetry::Value::I64(2)]);
    }
}
