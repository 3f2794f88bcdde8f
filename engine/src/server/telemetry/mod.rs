//! The server's telemetry: one store of every value (the [`Heartbeat`]'s counters, the request
//! counters, and the histograms and counters here), read by both the Prometheus text on
//! `/metrics` ([`prometheus`]) and the OTLP export ([`otlp`], when `OTEL_EXPORTER_OTLP_*` is set).
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

use opentelemetry::trace::{SpanKind, Status, TraceContextExt, Tracer as _};
use opentelemetry::{Array, Context, KeyValue, StringValue, Value};

use super::http::HttpCounters;
use super::jobs::Heartbeat;
use crate::model::KernelLaunchFailure;
use crate::sched::KvStats;
use histogram::{Histogram, Labels};

/// The semantic conventions' advisory bucket boundaries (seconds, or tokens).
pub const TTFT_BOUNDS: [f64; 16] = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0];
pub const TPOT_BOUNDS: [f64; 13] = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5];
pub const DURATION_BOUNDS: [f64; 14] = [0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92];
pub const TOKEN_BOUNDS: [f64; 14] =
    [1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0, 4194304.0, 16777216.0, 67108864.0];

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

/// Values only telemetry keeps (the rest are the [`Heartbeat`]'s and the handlers' counters).
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

    /// A request (one choice) was admitted: its span starts.
    pub fn start_request(&self, labels: &GenAiLabels, request_id: &str, prompt_tokens: usize) -> RequestTrace {
        let Some(tracer) = self.tracer() else { return RequestTrace(None) };
        let span = tracer
            .span_builder(format!("{} {}", labels.operation, labels.model))
            .with_kind(SpanKind::Server)
            .with_attributes([
                KeyValue::new("gen_ai.operation.name", labels.operation),
                KeyValue::new("gen_ai.request.model", labels.model.clone()),
                KeyValue::new("gen_ai.response.id", request_id.to_string()),
                KeyValue::new("gen_ai.usage.input_tokens", prompt_tokens as i64),
            ])
            .start(tracer);
        RequestTrace(Some(Context::new().with_span(span)))
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

/// Every `brink_*` counter and gauge, read from the stores, then the agent's node gauges.
pub fn scalars(hb: &Heartbeat, http: &HttpCounters) -> Vec<Scalar> {
    let mut table = server_scalars(hb, http);
    if let Some(node) = hb.telemetry.node.get() {
        for s in node.read() {
            if !table.iter().any(|t| t.name == s.name) {
                table.push(s);
            }
        }
    }
    table
}

fn server_scalars(hb: &Heartbeat, http: &HttpCounters) -> Vec<Scalar> {
    let n = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64;
    let secs = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64 / 1e6;
    let one = |name, kind, help, value: f64| Scalar { name, kind, help, samples: vec![(Vec::new(), value)] };
    let t = &hb.telemetry;
    use Kind::{Counter, Gauge};
    let stalls = hb
        .stalls
        .lock()
        .map(|m| m.iter().map(|((layer, op), &c)| (vec![("layer", layer.clone()), ("op", op.clone())], c as f64)).collect())
        .unwrap_or_default();
    let launch_errors = t
        .kernel_launch_errors
        .lock()
        .map(|m| m.iter().map(|((kernel, phase), &c)| (vec![("kernel", kernel.clone()), ("phase", phase.clone())], c as f64)).collect())
        .unwrap_or_default();
    vec![
        one("brink_requests_total", Counter, "Generation requests received.", n(&http.requests)),
        one("brink_request_errors_total", Counter, "Generation requests answered with an error.", n(&http.errors)),
        one("brink_prompt_tokens_total", Counter, "Prompt tokens admitted.", n(&hb.prompt_tokens)),
        one("brink_completion_tokens_total", Counter, "Tokens generated.", n(&hb.completion_tokens)),
        one("brink_engine_steps_total", Counter, "Engine forward passes.", n(&hb.steps)),
        one("brink_engine_failed_steps_total", Counter, "Engine forward passes that failed.", n(&hb.failed_steps)),
        one("brink_requests_running", Gauge, "Sequences in the running batch.", n(&hb.running)),
        one("brink_requests_waiting", Gauge, "Sequences waiting for admission (the queue depth).", n(&hb.waiting)),
        one("brink_ready", Gauge, "1 once the model is loaded.", f64::from(u8::from(hb.ready.load(Ordering::Acquire)))),
        one("brink_seconds_since_progress", Gauge, "Seconds since the engine last made progress.", hb.since_progress().as_secs_f64()),
        one("brink_engine_restarts_total", Counter, "Engine child restarts after a stall or crash.", n(&hb.restarts)),
        one(
            "brink_engine_restart_seconds",
            Gauge,
            "Kill (or death) to ready of the last engine restart, without back-off waits.",
            secs(&hb.last_restart_micros),
        ),
        one("brink_engine_pid", Gauge, "The engine child's process id (0 while none runs).", n(&hb.engine_pid)),
        one("brink_quarantined_prompts", Gauge, "Prompt lengths under the poison quarantine.", n(&hb.quarantined)),
        Scalar {
            name: "brink_stalls_total",
            kind: Counter,
            help: "Engine stalls caught by the watchdog, by the layer and op the board named.",
            samples: stalls,
        },
        Scalar {
            name: "brink_kernel_launch_errors_total",
            kind: Counter,
            help: "Engine steps failed by a kernel launch, by kernel and phase (plan: refused against the device's limits; launch: \
                   rejected by the driver; execution: a fault found by the diagnostic synchronise). None on the CPU backend.",
            samples: launch_errors,
        },
        one("brink_prefill_tokens_total", Counter, "Prompt tokens computed by prefill chunks.", n(&t.prefill_tokens)),
        one(
            "brink_prefill_seconds_total",
            Counter,
            "Engine step time spent on prefill tokens (a mixed step is split by token count); rate(tokens)/rate(seconds) is tokens/s.",
            secs(&t.prefill_micros),
        ),
        one("brink_decode_tokens_total", Counter, "Tokens computed by decode steps.", n(&t.decode_tokens)),
        one(
            "brink_decode_seconds_total",
            Counter,
            "Engine step time spent on decode tokens (a mixed step is split by token count).",
            secs(&t.decode_micros),
        ),
        one(
            "brink_prefix_cached_tokens_total",
            Counter,
            "Prompt tokens read from the prefix cache instead of computed.",
            n(&t.cached_prompt_tokens),
        ),
        one("brink_kv_blocks_total", Gauge, "KV cache blocks of the engine's paged cache.", n(&t.kv_blocks_total)),
        one("brink_kv_blocks_used", Gauge, "KV cache blocks held by sequences.", n(&t.kv_blocks_used)),
        one("brink_kv_blocks_cached", Gauge, "KV cache blocks kept for prefix reuse that no sequence holds.", n(&t.kv_blocks_cached)),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn launch_failure(kernel: &str, phase: &str) -> KernelLaunchFailure {
        KernelLaunchFailure { kernel: kernel.into(), phase: phase.into(), error: "CUDA_ERROR_INVALID_VALUE".into(), sticky: false }
    }

    #[test]
    fn kernel_launch_errors_are_counted_by_kernel_and_phase() {
        let hb = Heartbeat::new();
        let table = |hb: &Heartbeat| {
            scalars(hb, &HttpCounters::default()).into_iter().find(|s| s.name == "brink_kernel_launch_errors_total").unwrap()
        };
        // The CPU backend never fails a launch: the counter is there, with no series.
        let none = table(&hb);
        assert_eq!((none.kind, none.samples.len()), (Kind::Counter, 0));
        for (k, p) in [("moe_gemv_q4_0", "launch"), ("moe_gemv_q4_0", "launch"), ("router", "plan")] {
            hb.telemetry.record_kernel_launch_error(&launch_failure(k, p));
        }
        let got: Vec<(String, String, f64)> = table(&hb).samples.into_iter().map(|(l, v)| (l[0].1.clone(), l[1].1.clone(), v)).collect();
        assert_eq!(got, [("moe_gemv_q4_0".into(), "launch".into(), 2.0), ("router".into(), "plan".into(), 1.0)]);
    }

    #[test]
    fn node_metrics_are_appended_and_may_not_shadow_the_servers() {
        let hb = Heartbeat::new();
        let server = scalars(&hb, &HttpCounters::default()).len();
        let gauge = |name, v| Scalar { name, kind: Kind::Gauge, help: "h", samples: vec![(vec![("gpu_uuid", "GPU-1".to_string())], v)] };
        let calls = Arc::new(AtomicU64::new(0));
        let c = calls.clone();
        hb.telemetry
            .node
            .set(NodeMetrics::new(move || {
                c.fetch_add(1, Ordering::Relaxed);
                vec![gauge("brink_gpu_temperature_celsius", 61.0), gauge("brink_requests_total", 99.0)]
            }))
            .unwrap();
        let table = scalars(&hb, &HttpCounters::default());
        assert_eq!(table.len(), server + 1, "the repeated name is dropped");
        assert_eq!(table.last().unwrap().samples[0].1, 61.0);
        assert_ne!(table.iter().find(|s| s.name == "brink_requests_total").unwrap().samples[0].1, 99.0);
        scalars(&hb, &HttpCounters::default());
        assert_eq!(calls.load(Ordering::Relaxed), 2, "read at every call, not cached here");
    }

    /// docs/metrics.md names every series the server exposes.
    #[test]
    fn every_series_is_documented() {
        let doc = include_str!("../../../../docs/metrics.md");
        let hb = Heartbeat::new();
        let mut names: Vec<String> = scalars(&hb, &HttpCounters::default()).iter().map(|s| s.name.to_string()).collect();
        names.extend([TTFT, TPOT, REQUEST_DURATION, TOKEN_USAGE].iter().map(|m| m.prom.to_string()));
        names.push("brink_time_to_first_token_seconds".into());
        for n in names {
            // Pairs share a row: `brink_prefill_tokens_total`, `brink_prefill_seconds_total`.
            assert!(doc.contains(&format!("`{n}`")), "{n} is not in docs/metrics.md");
        }
    }

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
        t.finish_request(&labels, t.start_request(&labels, "cmpl-1", 100), &end);
        assert_eq!(t.ttft.snapshot()[0].1.count, 1);
        assert_eq!(t.duration.snapshot()[0].1.count, 1);
        let tpot = t.tpot.snapshot();
        assert!((tpot[0].1.sum - 0.03).abs() < 1e-9);
        let tokens = t.tokens.snapshot();
        assert_eq!(tokens.len(), 2);
        assert_eq!(tokens.iter().map(|(l, s)| (l[2].1.as_str(), s.sum)).collect::<Vec<_>>(), [("input", 100.0), ("output", 3.0)]);
        assert_eq!(t.cached_prompt_tokens.load(Ordering::Relaxed), 64);
    }
}
