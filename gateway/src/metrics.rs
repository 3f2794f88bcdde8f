//! The gateway's own series (`brink_gateway_*`), rendered as Prometheus text on `/metrics`.

use prometheus::{Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry, TextEncoder};

/// Why a request was answered by the gateway itself, without reaching a replica.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rejection {
    UnknownModel,
    BadRequest,
    Unauthorized,
    KeyLimit,
    NoHealthyReplica,
    /// The request asks for more tokens than any replica's context holds.
    OverContext,
}

impl Rejection {
    pub fn label(self) -> &'static str {
        match self {
            Rejection::UnknownModel => "unknown_model",
            Rejection::BadRequest => "bad_request",
            Rejection::Unauthorized => "unauthorized",
            Rejection::KeyLimit => "key_limit",
            Rejection::NoHealthyReplica => "no_healthy_replica",
            Rejection::OverContext => "over_context",
        }
    }
}

/// The GenAI conventions' advisory buckets (one copy, the engine's too): the time to first byte
/// in the time to first token's, so the two read side by side.
pub use brink_api::gen_ai::{DURATION_BOUNDS, TOKEN_BOUNDS, TTFT_BOUNDS as FIRST_BYTE_BOUNDS};

/// The GenAI client series (OpenTelemetry semantic conventions, named as the Prometheus
/// exporter writes them), per model and replica. Their label names are the engine's on its
/// `gen_ai_server_*` series (`gen_ai_operation_name`, `gen_ai_request_model`,
/// `gen_ai_token_type`), so a dashboard joins the two; `upstream` as on the `brink_gateway_*`
/// series.
#[derive(Clone)]
pub struct GenAi {
    /// From the request's arrival to the end of its answer, for every request sent to a replica
    /// (`error_type` empty when it succeeded).
    pub duration: HistogramVec,
    pub tokens: HistogramVec,
}

/// One request's GenAI labels: `chat` or `text_completion`, the model it named, the replica
/// that answered (or was tried last).
#[derive(Clone, Debug)]
pub struct GenAiLabels {
    pub operation: &'static str,
    pub model: String,
    pub upstream: String,
}

impl GenAi {
    /// One finished request: its duration, and the tokens its answer reported (none where it
    /// reported none).
    pub fn record(&self, l: &GenAiLabels, seconds: f64, error_type: Option<&str>, usage: crate::usage::Usage) {
        self.duration.with_label_values(&[l.operation, &l.model, &l.upstream, error_type.unwrap_or("")]).observe(seconds);
        for (kind, n) in [("input", usage.input), ("output", usage.output)] {
            if let Some(n) = n {
                self.tokens.with_label_values(&[l.operation, &l.model, kind, &l.upstream]).observe(n as f64);
            }
        }
    }
}

pub struct Metrics {
    registry: Registry,
    /// One per attempt at a replica: the HTTP status it answered, or `error` for a connection
    /// that failed before a response head.
    pub requests: IntCounterVec,
    pub retries: IntCounterVec,
    pub affinity_hits: IntCounterVec,
    /// Prompt keys moved to another replica because their home had no room, by why.
    pub affinity_moves: IntCounterVec,
    pub rejections: IntCounterVec,
    pub upstream_healthy: IntGaugeVec,
    pub upstream_in_flight: IntGaugeVec,
    /// Requests of a model the gateway holds (waiting at or answered by a replica): the queue an
    /// autoscaler of the model's deployment reads. Only models some replica serves get a series.
    pub model_in_flight: IntGaugeVec,
    /// A successful answer's first body byte, from the request's arrival (retries included):
    /// for a stream, its first event, which a brink replica sends with the first token.
    pub first_byte: HistogramVec,
    pub gen_ai: GenAi,
}

impl Metrics {
    pub fn new(upstreams: &[String]) -> Metrics {
        let registry = Registry::new();
        let counter = |name: &str, help: &str, labels: &[&str]| {
            let c = IntCounterVec::new(Opts::new(name, help), labels).expect("a valid metric definition");
            registry.register(Box::new(c.clone())).expect("registered once");
            c
        };
        let gauge = |name: &str, help: &str, labels: &[&str]| {
            let g = IntGaugeVec::new(Opts::new(name, help), labels).expect("a valid metric definition");
            registry.register(Box::new(g.clone())).expect("registered once");
            g
        };
        let histogram = |name: &str, help: &str, labels: &[&str], bounds: &[f64]| {
            let h = HistogramVec::new(HistogramOpts::new(name, help).buckets(bounds.to_vec()), labels).expect("a valid metric definition");
            registry.register(Box::new(h.clone())).expect("registered once");
            h
        };
        let m = Metrics {
            requests: counter(
                "brink_gateway_requests_total",
                "Attempts at a replica, by the status it answered (error: the connection failed before a response).",
                &["model", "upstream", "status"],
            ),
            retries: counter(
                "brink_gateway_retries_total",
                "Requests tried again on another replica, by why the previous one refused.",
                &["model", "reason"],
            ),
            affinity_hits: counter(
                "brink_gateway_affinity_hits_total",
                "Requests sent first to their prompt prefix's replica.",
                &["model"],
            ),
            affinity_moves: counter(
                "brink_gateway_affinity_moves_total",
                "Prompt prefixes moved to another replica because theirs had no room (no free slot, a queue, over the load bound, a full KV cache).",
                &["model", "reason"],
            ),
            rejections: counter("brink_gateway_rejections_total", "Requests the gateway answered itself, by reason.", &["reason"]),
            upstream_healthy: gauge(
                "brink_gateway_upstream_healthy",
                "1 while the replica's /ready (or, where it has none, /health) answers 200.",
                &["upstream"],
            ),
            upstream_in_flight: gauge(
                "brink_gateway_upstream_in_flight",
                "Requests the gateway has in flight to the replica.",
                &["upstream"],
            ),
            model_in_flight: gauge(
                "brink_gateway_model_in_flight",
                "Requests of the model the gateway has in flight, from routing to the end of the answer.",
                &["model"],
            ),
            first_byte: histogram(
                "brink_gateway_time_to_first_byte_seconds",
                "From the request's arrival to its successful answer's first body byte (retries included), by whether it streams.",
                &["model", "stream"],
                &FIRST_BYTE_BOUNDS,
            ),
            gen_ai: GenAi {
                duration: histogram(
                    "gen_ai_client_operation_duration_seconds",
                    "GenAI operation duration: from the request's arrival at the gateway to the end of its answer (retries included), by the replica that answered or was tried last.",
                    &["gen_ai_operation_name", "gen_ai_request_model", "upstream", "error_type"],
                    &DURATION_BOUNDS,
                ),
                tokens: histogram(
                    "gen_ai_client_token_usage",
                    "Number of input and output tokens used, as the replica's answer reported them.",
                    &["gen_ai_operation_name", "gen_ai_request_model", "gen_ai_token_type", "upstream"],
                    &TOKEN_BOUNDS,
                ),
            },
            registry,
        };
        // Every upstream has its gauges from the start (0 until discovery says otherwise).
        for u in upstreams {
            m.upstream_healthy.with_label_values(&[u]).set(0);
            m.upstream_in_flight.with_label_values(&[u]).set(0);
        }
        for r in [
            Rejection::UnknownModel,
            Rejection::BadRequest,
            Rejection::Unauthorized,
            Rejection::KeyLimit,
            Rejection::NoHealthyReplica,
            Rejection::OverContext,
        ] {
            m.rejections.with_label_values(&[r.label()]).inc_by(0);
        }
        m
    }

    /// A replica that is gone (found in a cluster, now deleted): its health series goes too. Its
    /// in-flight gauge stays, as requests to it may still be finishing.
    pub fn forget_upstream(&self, upstream: &str) {
        let _ = self.upstream_healthy.remove_label_values(&[upstream]);
    }

    pub fn reject(&self, why: Rejection) {
        self.rejections.with_label_values(&[why.label()]).inc();
    }

    pub fn render(&self) -> String {
        let mut out = Vec::new();
        // Encoding our own well-formed families into a Vec cannot fail.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        String::from_utf8_lossy(&out).into_owned()
    }
}
