//! The server's telemetry: one store of every value (the heartbeat's counters, the request
//! counters, and the histograms and counters here), read by both the Prometheus text on
//! `/metrics` ([`prometheus`], the table in `server::metrics`) and the OTLP export ([`otlp`], when `OTEL_EXPORTER_OTLP_*` is set).
//!
//! Names follow the OpenTelemetry GenAI semantic conventions where they exist
//! (`gen_ai.server.time_to_first_token`, `gen_ai.server.time_per_output_token`,
//! `gen_ai.server.request.duration`, `gen_ai.client.token.usage`, with the `gen_ai.operation.name`,
//! `gen_ai.request.model` and `gen_ai.token.type` attributes); `brink_*` otherwise.
//!
//! The supervisor records here as steps run; a request's span and its prefill chunks' child spans
//! are made only while an OTLP exporter is installed.
//!
//! Node gauges (memory, GPU sensors, the qualification) are not the server's to know: the agent
//! passes a [`NodeMetrics`] provider, read at every scrape and every OTLP collection, so this
//! crate stays free of NVML.

pub mod histogram;
pub mod otlp;
pub mod prometheus;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use opentelemetry::trace::{SpanContext, SpanKind, Status, TraceContextExt, Tracer as _};
use opentelemetry::{Array, Context, KeyValue, StringValue, Value};

use crate::model::KernelLaunchFailure;
use crate::sched::KvStats;
use histogram::{Histogram, Labels};

pub use brink_api::gen_ai::{DURATION_BOUNDS, TOKEN_BOUNDS, TPOT_BOUNDS, TTFT_BOUNDS};

/// A GenAI histogram: its OpenTelemetry name and unit, and its Prometheus name (the OTel name
/// with dots as underscores and the unit's suffix, as Prometheus' OTLP translation writes it).
#[derive(Clone, Copy, Debug)]
pub struct GenAiMetric {
    pub otel: &'static str,
    pub prom: &'static str,
    pub unit: &'static str,
    pub help: &'static str,
}

pub const TTFT: GenAiMetric = GenAiMetric {
    otel: "gen_ai.server.time_to_first_token",
    prom: "gen_ai_server_time_to_first_token_seconds",
    unit: "s",
    help: "Time to generate the first token for successful responses.",
};
pub const TPOT: GenAiMetric = GenAiMetric {
    otel: "gen_ai.server.time_per_output_token",
    prom: "gen_ai_server_time_per_output_token_seconds",
    unit: "s",
    help: "Time per output token generated after the first token for successful responses.",
};
pub const REQUEST_DURATION: GenAiMetric = GenAiMetric {
    otel: "gen_ai.server.request.duration",
    prom: "gen_ai_server_request_duration_seconds",
    unit: "s",
    help: "Generative AI server request duration such as time-to-last byte or last output token.",
};
pub const TOKEN_USAGE: GenAiMetric = GenAiMetric {
    otel: "gen_ai.client.token.usage",
    prom: "gen_ai_client_token_usage",
    unit: "{token}",
    help: "Number of input and output tokens used.",
};

/// What a request's series are labelled with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GenAiLabels {
    /// `chat` or `text_completion` (the semantic conventions' `gen_ai.operation.name` values).
    pub operation: &'static str,
    /// The model the request named (`gen_ai.request.model`).
    pub model: String,
}

impl GenAiLabels {
    /// Prometheus label names (attribute names with dots as underscores).
    fn labels(&self) -> Labels {
        vec![("gen_ai_operation_name", self.operation.to_string()), ("gen_ai_request_model", self.model.clone())]
    }

    fn with_token_type(&self, token_type: &'static str) -> Labels {
        let mut l = self.labels();
        l.push(("gen_ai_token_type", token_type.to_string()));
        l
    }
}

/// The OTel attribute form of a Prometheus label set (`gen_ai_request_model` → `gen_ai.request.model`).
pub fn attributes(labels: &Labels) -> Vec<KeyValue> {
    labels.iter().map(|(k, v)| KeyValue::new(k.replace('_', ".").replace("gen.ai.", "gen_ai."), v.clone())).collect()
}

/// The W3C trace context a request came with (`traceparent`, and `tracestate`), when valid: its
/// span's parent. A gateway sends its attempt's span here.
pub fn trace_parent(headers: &axum::http::HeaderMap) -> Option<SpanContext> {
    use opentelemetry::propagation::{Extractor, TextMapPropagator};
    struct Headers<'a>(&'a axum::http::HeaderMap);
    impl Extractor for Headers<'_> {
        fn get(&self, key: &str) -> Option<&str> {
            self.0.get(key).and_then(|v| v.to_str().ok())
        }
        fn keys(&self) -> Vec<&str> {
            self.0.keys().map(|k| k.as_str()).collect()
        }
    }
    let cx = opentelemetry_sdk::propagation::TraceContextPropagator::new().extract(&Headers(headers));
    let parent = cx.span().span_context().clone();
    parent.is_valid().then_some(parent)
}

/// How a request ended, for its metrics and span.
#[derive(Clone, Debug, PartialEq)]
pub struct RequestEnd {
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cached_tokens: u64,
    /// Submission to the last token.
    pub duration: Duration,
    /// First to last token (the time the output tokens after the first took).
    pub decode_time: Duration,
    /// `stop`, `length` or `cancelled`.
    pub finish_reason: &'static str,
}

impl RequestEnd {
    /// Time per output token after the first; none with fewer than two tokens.
    pub fn time_per_output_token(&self) -> Option<f64> {
        (self.output_tokens > 1).then(|| self.decode_time.as_secs_f64() / (self.output_tokens - 1) as f64)
    }
}

/// The exporter's instruments, installed once OTLP export starts (each signal may be off).
pub struct Otel {
    pub tracer: Option<opentelemetry_sdk::trace::SdkTracer>,
    pub histograms: Option<OtelHistograms>,
}

pub struct OtelHistograms {
    pub ttft: opentelemetry::metrics::Histogram<f64>,
    pub tpot: opentelemetry::metrics::Histogram<f64>,
    pub duration: opentelemetry::metrics::Histogram<f64>,
    pub tokens: opentelemetry::metrics::Histogram<u64>,
}

impl std::fmt::Debug for Otel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Otel { .. }")
    }
}

/// A request's span (with the context its chunks' spans are children of); empty without OTLP.
#[derive(Debug, Default)]
pub struct RequestTrace(Option<Context>);

/// A prefill chunk's span; empty without OTLP. Ends when dropped.
pub struct ChunkTrace(Option<opentelemetry_sdk::trace::Span>);

/// Values only telemetry keeps (the rest are the heartbeat's and the handlers' counters).
#[derive(Debug)]
pub struct Telemetry {
    pub ttft: Histogram,
    pub tpot: Histogram,
    pub duration: Histogram,
    pub tokens: Histogram,
    pub prefill_tokens: AtomicU64,
    pub prefill_micros: AtomicU64,
    pub decode_tokens: AtomicU64,
    pub decode_micros: AtomicU64,
    /// Prompt tokens read from the prefix cache instead of computed.
    pub cached_prompt_tokens: AtomicU64,
    pub kv_blocks_total: AtomicU64,
    pub kv_blocks_used: AtomicU64,
    /// Full blocks kept for prefix reuse that no sequence holds.
    pub kv_blocks_cached: AtomicU64,
    /// Failed kernel launches by (kernel, phase), as the engine child reported them.
    pub kernel_launch_errors: Mutex<BTreeMap<(String, String), u64>>,
    /// The agent's node gauges, appended to the table at every read.
    pub node: OnceLock<NodeMetrics>,
    pub otel: OnceLock<Otel>,
}

/// The agent's node gauges (memory, GPU sensors, qualification): called at every `/metrics`
/// scrape and OTLP collection, so it must be cheap (cache slow sources). Names must not repeat
/// the server's own (a repeated one is dropped, keeping the exposition valid).
#[derive(Clone)]
pub struct NodeMetrics(pub Arc<dyn Fn() -> Vec<Scalar> + Send + Sync>);

impl NodeMetrics {
    pub fn new(read: impl Fn() -> Vec<Scalar> + Send + Sync + 'static) -> NodeMetrics {
        NodeMetrics(Arc::new(read))
    }

    pub fn read(&self) -> Vec<Scalar> {
        (self.0)()
    }
}

impl std::fmt::Debug for NodeMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NodeMetrics(..)")
    }
}

impl Default for Telemetry {
    fn default() -> Self {
        Telemetry {
            ttft: Histogram::new(&TTFT_BOUNDS),
            tpot: Histogram::new(&TPOT_BOUNDS),
            duration: Histogram::new(&DURATION_BOUNDS),
            tokens: Histogram::new(&TOKEN_BOUNDS),
            prefill_tokens: AtomicU64::new(0),
            prefill_micros: AtomicU64::new(0),
            decode_tokens: AtomicU64::new(0),
            decode_micros: AtomicU64::new(0),
            cached_prompt_tokens: AtomicU64::new(0),
            kv_blocks_total: AtomicU64::new(0),
            kv_blocks_used: AtomicU64::new(0),
            kv_blocks_cached: AtomicU64::new(0),
            kernel_launch_errors: Mutex::new(BTreeMap::new()),
            node: OnceLock::new(),
            otel: OnceLock::new(),
        }
    }
}

/// Splits a step's time between its prefill and decode tokens in proportion to their counts
/// (a step mixes both under chunked prefill; one pass computes them together).
pub fn split_step_time(prefill_tokens: u64, decode_tokens: u64, took: Duration) -> (Duration, Duration) {
    let total = prefill_tokens + decode_tokens;
    if total == 0 {
        return (Duration::ZERO, Duration::ZERO);
    }
    let prefill = took.mul_f64(prefill_tokens as f64 / total as f64);
    (prefill, took.saturating_sub(prefill))
}

impl Telemetry {
    fn tracer(&self) -> Option<&opentelemetry_sdk::trace::SdkTracer> {
        self.otel.get()?.tracer.as_ref()
    }

    fn histograms(&self) -> Option<&OtelHistograms> {
        self.otel.get()?.histograms.as_ref()
    }

    /// A request (one choice) was admitted: its span starts, a child of `parent` (the trace
    /// context the request came with) when there is one.
    pub fn start_request(
        &self,
        labels: &GenAiLabels,
        request_id: &str,
        prompt_tokens: usize,
        parent: Option<&SpanContext>,
    ) -> RequestTrace {
        let Some(tracer) = self.tracer() else { return RequestTrace(None) };
        let parent = parent.map_or_else(Context::new, |p| Context::new().with_remote_span_context(p.clone()));
        let span = tracer
            .span_builder(format!("{} {}", labels.operation, labels.model))
            .with_kind(SpanKind::Server)
            .with_attributes([
                KeyValue::new("gen_ai.operation.name", labels.operation),
                KeyValue::new("gen_ai.request.model", labels.model.clone()),
                KeyValue::new("gen_ai.response.id", request_id.to_string()),
                KeyValue::new("gen_ai.usage.input_tokens", prompt_tokens as i64),
            ])
            .start_with_context(tracer, &parent);
        RequestTrace(Some(parent.with_span(span)))
    }

    /// A prefill chunk of `trace`'s request goes into step `step`.
    pub fn start_chunk(&self, trace: &RequestTrace, step: u64, start: usize, len: usize) -> ChunkTrace {
        let (Some(tracer), Some(cx)) = (self.tracer(), &trace.0) else { return ChunkTrace(None) };
        let span = tracer
            .span_builder("prefill_chunk")
            .with_kind(SpanKind::Internal)
            .with_attributes([
                KeyValue::new("brink.chunk.start", start as i64),
                KeyValue::new("brink.chunk.len", len as i64),
                KeyValue::new("brink.step", step as i64),
            ])
            .start_with_context(tracer, cx);
        ChunkTrace(Some(span))
    }

    /// Ends a step's chunk spans, marking them failed when the step was.
    pub fn end_chunks(&self, chunks: Vec<ChunkTrace>, error: Option<&str>) {
        use opentelemetry::trace::Span as _;
        for ChunkTrace(span) in chunks {
            if let Some(mut span) = span {
                if let Some(e) = error {
                    span.set_status(Status::error(e.to_string()));
                }
                span.end();
            }
        }
    }

    /// A step's tokens and time, for the prefill and decode rates.
    pub fn record_step(&self, prefill_tokens: u64, decode_tokens: u64, took: Duration) {
        let (p, d) = split_step_time(prefill_tokens, decode_tokens, took);
        self.prefill_tokens.fetch_add(prefill_tokens, Ordering::Relaxed);
        self.decode_tokens.fetch_add(decode_tokens, Ordering::Relaxed);
        self.prefill_micros.fetch_add(p.as_micros() as u64, Ordering::Relaxed);
        self.decode_micros.fetch_add(d.as_micros() as u64, Ordering::Relaxed);
    }

    /// A step failed on a kernel launch (the engine child said which).
    pub fn record_kernel_launch_error(&self, failure: &KernelLaunchFailure) {
        if let Ok(mut m) = self.kernel_launch_errors.lock() {
            *m.entry((failure.kernel.clone(), failure.phase.clone())).or_default() += 1;
        }
    }

    pub fn record_kv(&self, kv: &KvStats) {
        self.kv_blocks_total.store(kv.total as u64, Ordering::Relaxed);
        self.kv_blocks_used.store(kv.used as u64, Ordering::Relaxed);
        self.kv_blocks_cached.store(kv.cached as u64, Ordering::Relaxed);
    }

    pub fn first_token(&self, labels: &GenAiLabels, ttft: Duration) {
        let l = labels.labels();
        if let Some(otel) = self.histograms() {
            otel.ttft.record(ttft.as_secs_f64(), &attributes(&l));
        }
        self.ttft.observe(l, ttft.as_secs_f64());
    }

    /// A request ended on the engine's side (or its handler ended it): its metrics, and its span ends.
    pub fn finish_request(&self, labels: &GenAiLabels, trace: RequestTrace, end: &RequestEnd) {
        self.cached_prompt_tokens.fetch_add(end.cached_tokens, Ordering::Relaxed);
        let l = labels.labels();
        let (input, output) = (labels.with_token_type("input"), labels.with_token_type("output"));
        let tpot = end.time_per_output_token();
        if let Some(otel) = self.histograms() {
            otel.duration.record(end.duration.as_secs_f64(), &attributes(&l));
            otel.tokens.record(end.input_tokens, &attributes(&input));
            otel.tokens.record(end.output_tokens, &attributes(&output));
            if let Some(t) = tpot {
                otel.tpot.record(t, &attributes(&l));
            }
        }
        self.duration.observe(l.clone(), end.duration.as_secs_f64());
        self.tokens.observe(input, end.input_tokens as f64);
        self.tokens.observe(output, end.output_tokens as f64);
        if let Some(t) = tpot {
            self.tpot.observe(l, t);
        }
        if let Some(cx) = trace.0 {
            let span = cx.span();
            span.set_attribute(KeyValue::new("gen_ai.usage.output_tokens", end.output_tokens as i64));
            span.set_attribute(KeyValue::new("brink.cached_prompt_tokens", end.cached_tokens as i64));
            let reasons = Value::Array(Array::String(vec![StringValue::from(end.finish_reason)]));
            span.set_attribute(KeyValue::new("gen_ai.response.finish_reasons", reasons));
            span.end();
        }
    }

    /// A request failed (a failed step, a stall, a crash): its span ends with the error.
    pub fn fail_request(&self, trace: RequestTrace, error: &str) {
        if let Some(cx) = trace.0 {
            let span = cx.span();
            span.set_attribute(KeyValue::new("error.type", "engine"));
            span.set_status(Status::error(error.to_string()));
            span.end();
        }
    }
}

/// The kind of a scalar series.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
}

/// One counter or gauge with its samples: the table both exports render.
#[derive(Clone, Debug, PartialEq)]
pub struct Scalar {
    /// The Prometheus name (`brink_…`, counters end in `_total`).
    pub name: &'static str,
    pub kind: Kind,
    pub help: &'static str,
    pub samples: Vec<(Labels, f64)>,
}

impl Scalar {
    /// The OTLP name: the Prometheus one without the `_total` a counter gets on the way back.
    pub fn otel_name(&self) -> &'static str {
        match self.kind {
            Kind::Counter => self.name.strip_suffix("_total").unwrap_or(self.name),
            Kind::Gauge => self.name,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_time_splits_by_token_count() {
        let s = Duration::from_secs;
        assert_eq!(split_step_time(0, 0, s(3)), (Duration::ZERO, Duration::ZERO));
        assert_eq!(split_step_time(3, 1, s(4)), (s(3), s(1)));
        assert_eq!(split_step_time(0, 2, s(1)), (Duration::ZERO, s(1)));
        let (p, d) = split_step_time(1, 2, Duration::from_nanos(1000));
        assert_eq!(p + d, Duration::from_nanos(1000));
    }

    #[test]
    fn time_per_output_token_needs_two_tokens() {
        let end = |n| RequestEnd {
            input_tokens: 5,
            output_tokens: n,
            cached_tokens: 0,
            duration: Duration::from_secs(2),
            decode_time: Duration::from_secs(1),
            finish_reason: "stop",
        };
        assert_eq!(end(0).time_per_output_token(), None);
        assert_eq!(end(1).time_per_output_token(), None);
        assert_eq!(end(5).time_per_output_token(), Some(0.25));
    }

    #[test]
    fn label_names_map_to_semconv_attributes() {
        let l = GenAiLabels { operation: "chat", model: "tiny".into() }.with_token_type("input");
        let keys: Vec<String> = attributes(&l).iter().map(|kv| kv.key.to_string()).collect();
        assert_eq!(keys, ["gen_ai.operation.name", "gen_ai.request.model", "gen_ai.token.type"]);
    }

    #[test]
    fn a_finished_request_fills_every_genai_series_without_an_exporter() {
        let t = Telemetry::default();
        let labels = GenAiLabels { operation: "text_completion", model: "m".into() };
        t.first_token(&labels, Duration::from_millis(30));
        let end = RequestEnd {
            input_tokens: 100,
            output_tokens: 3,
            cached_tokens: 64,
            duration: Duration::from_millis(90),
            decode_time: Duration::from_millis(60),
            finish_reason: "length",
        };
        t.finish_request(&labels, t.start_request(&labels, "cmpl-1", 100, None), &end);
        assert_eq!(t.ttft.snapshot()[0].1.count, 1);
        assert_eq!(t.duration.snapshot()[0].1.count, 1);
        let tpot = t.tpot.snapshot();
        assert!((tpot[0].1.sum - 0.03).abs() < 1e-9);
        let tokens = t.tokens.snapshot();
        assert_eq!(tokens.len(), 2);
        assert_eq!(tokens.iter().map(|(l, s)| (l[2].1.as_str(), s.sum)).collect::<Vec<_>>(), [("input", 100.0), ("output", 3.0)]);
        assert_eq!(t.cached_prompt_tokens.load(Ordering::Relaxed), 64);
    }

    #[test]
    fn a_valid_traceparent_is_the_parent() {
        let mut headers = axum::http::HeaderMap::new();
        assert_eq!(trace_parent(&headers), None);
        headers.insert("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".parse().unwrap());
        let p = trace_parent(&headers).expect("a parent");
        assert_eq!(
            (format!("{:032x}", p.trace_id()), format!("{:016x}", p.span_id())),
            ("4bf92f3577b34da6a3ce929d0e0e4736".into(), "00f067aa0ba902b7".into())
        );
        assert!(p.is_remote() && p.is_sampled());
        for bad in [
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "garbage",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
        ] {
            headers.insert("traceparent", bad.parse().unwrap());
            assert_eq!(trace_parent(&headers), None, "{bad}");
        }
    }
}
