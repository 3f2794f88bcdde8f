//! One generation request through the gateway: check the key, read the model and prompt, pick
//! the replicas in order ([`crate::pick`]), send to the first, and go on to the next while a
//! replica refuses before answering (connection refused, reset or closed before a response
//! head; HTTP 503 or 429), within the retry budget. Once a replica answers with anything else,
//! its status, headers and body go to the client as they arrive (SSE frame by frame): nothing
//! is buffered, and nothing that reached the client is ever sent again.
//!
//! Each request has a span, and each attempt at a replica a child span whose context the replica
//! gets in `traceparent` ([`crate::trace`]).

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Request, StatusCode, header};
use axum::response::Response;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use serde_json::Value as Json;

use crate::errors::{Api, GatewayError, Kind};
use crate::keys::KeyRefusal;
use crate::metrics::{GenAi, GenAiLabels, Rejection};
use crate::pick::{self, Candidate};
use crate::server::Gateway;
use crate::spans::{self, AttemptEnd, AttemptStart};
use crate::trace::RequestSpan;
use crate::usage::{Scanner, Usage};

pub type UpstreamClient = Client<HttpConnector, Full<Bytes>>;

/// Largest request body taken (the engine's limit: a 24k-token prompt is ~100 KB of text).
pub const MAX_BODY_BYTES: usize = 32 << 20;

/// How long a connection to a replica may sit idle in the pool and still be reused: under the
/// 5 s after which common servers close an idle keep-alive connection (llama.cpp's `llama-server`
/// through cpp-httplib, uvicorn under vLLM). Reusing one the server is closing fails the request
/// with "connection closed before message completed": a poll that marks a healthy replica down,
/// or a 502 where no other replica serves the model (seen with llama-server behind the gateway).
pub const POOL_IDLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);

pub fn client() -> UpstreamClient {
    let mut http = HttpConnector::new();
    http.set_connect_timeout(Some(std::time::Duration::from_secs(5)));
    http.set_nodelay(true);
    Client::builder(hyper_util::rt::TokioExecutor::new())
        .pool_idle_timeout(POOL_IDLE_TIMEOUT)
        .pool_timer(hyper_util::rt::TokioTimer::new())
        .build(http)
}

/// The retry reason of a refusing status: 503 (restarting, overloaded) or 429 (queue full).
fn retry_reason(status: StatusCode) -> &'static str {
    if status == StatusCode::TOO_MANY_REQUESTS { "http_429" } else { "http_503" }
}

pub async fn generate(gw: Arc<Gateway>, api: Api, req: Request<Body>) -> Response {
    let arrived = std::time::Instant::now();
    let span = RequestSpan::start(gw.tracer.as_ref(), req.headers(), req.method().as_str(), req.uri().path(), api);
    // The semantic conventions' `gen_ai.operation.name` of the route.
    let operation = if req.uri().path() == "/v1/completions" { "text_completion" } else { "chat" };
    let resp = match admit_and_send(&gw, api, operation, req, &span, arrived).await {
        Ok(resp) => resp,
        Err((why, e)) => {
            gw.metrics.reject(why);
            span.set(vec![spans::rejected(why)]);
            e.response(api)
        }
    };
    span.answered(resp.status().as_u16());
    resp
}

async fn admit_and_send(
    gw: &Arc<Gateway>,
    api: Api,
    operation: &'static str,
    req: Request<Body>,
    span: &RequestSpan,
    arrived: std::time::Instant,
) -> Result<Response, (Rejection, GatewayError)> {
    let slot = match gw.keys.admit(req.headers()) {
        Ok(slot) => slot,
        Err(r @ KeyRefusal::Busy { .. }) => {
            let e = GatewayError { retry_after: Some(1), ..GatewayError::new(Kind::RateLimited, r.message()) };
            return Err((Rejection::KeyLimit, e));
        }
        Err(r) => return Err((Rejection::Unauthorized, GatewayError::new(Kind::Unauthorized, r.message()))),
    };
    let (parts, body) = req.into_parts();
    let bytes = axum::body::to_bytes(body, MAX_BODY_BYTES).await.map_err(|e| {
        let too_large = std::error::Error::source(&e).is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
        if too_large {
            (Rejection::BadRequest, GatewayError::new(Kind::TooLarge, format!("the request body is over {MAX_BODY_BYTES} bytes")))
        } else {
            (Rejection::BadRequest, GatewayError::new(Kind::BadRequest, format!("could not read the request body: {e}")))
        }
    })?;
    let json: Json = serde_json::from_slice(&bytes)
        .map_err(|e| (Rejection::BadRequest, GatewayError::new(Kind::BadRequest, format!("the request body is not valid JSON: {e}"))))?;
    let model = crate::prompt::model(&json).map_err(|m| (Rejection::BadRequest, GatewayError::new(Kind::BadRequest, m)))?.to_string();
    let key = pick::prompt_key(&crate::prompt::prefix(&json, gw.config.affinity_prefix_chars), gw.config.affinity_prefix_chars);
    let asked = crate::prompt::requested_tokens(&json);
    let stream = if json.get("stream") == Some(&Json::Bool(true)) { "true" } else { "false" };

    let upstreams = gw.upstreams();
    let seen: Vec<_> = upstreams.iter().map(|u| u.seen()).collect();
    let slots: Vec<Option<u64>> = upstreams.iter().map(|u| u.declared().and_then(|d| d.slots).or(gw.config.upstream_slots)).collect();
    let candidates: Vec<Candidate> = upstreams
        .iter()
        .zip(&seen)
        .zip(&slots)
        .map(|((u, s), &slots)| Candidate {
            name: &u.base,
            healthy: s.healthy,
            models: &s.models,
            running: s.load.running,
            waiting: s.load.waiting,
            ours_at_poll: s.ours_at_poll,
            in_flight: u.in_flight(),
            slots,
            kv_use: s.load.kv_use,
            context: s.context,
        })
        .collect();
    let home = key.and_then(|k| gw.affinity.home(&model, k));
    let ask = pick::Ask { model: &model, key, home: home.as_deref(), need_tokens: asked.map(|(_, n)| n) };
    let decision = pick::pick(&candidates, &ask, gw.config.load_bound);
    span.set(spans::routed(&model, &decision.affinity));
    if decision.order.is_empty() {
        if let Some((field, n)) = asked {
            // Replicas serve the model, but none of a context that holds what the request asks.
            let without = pick::pick(&candidates, &pick::Ask { need_tokens: None, ..ask }, gw.config.load_bound);
            if let Some(largest) = largest_context(&candidates, &without.order) {
                let message = format!(
                    "{field}: {n} is more than the model's context of {largest} tokens (the largest of the replicas serving '{model}')"
                );
                return Err((Rejection::OverContext, GatewayError { param: Some(field), ..GatewayError::new(Kind::BadRequest, message) }));
            }
        }
        return Err(no_replica(&model, &seen));
    }
    let model_in_flight = ModelInFlight::start(&gw.metrics, &model);
    match decision.affinity {
        pick::Affinity::Hit => gw.metrics.affinity_hits.with_label_values(&[&model]).inc(),
        pick::Affinity::Moved { why, .. } => {
            gw.metrics.affinity_moves.with_label_values(&[&model, why.label()]).inc();
            if let Some(k) = key {
                gw.affinity.set_home(&model, k, &upstreams[decision.order[0]].base);
            }
        }
        pick::Affinity::None => {}
    }
    // The contexts, for a prompt a replica refuses as longer than its own.
    let contexts: Vec<Option<u64>> = candidates.iter().map(|c| c.context).collect();
    drop(candidates);
    // Only the first replica tried is the prompt's home.
    let mut affinity_hit = matches!(decision.affinity, pick::Affinity::Hit);
    let mut queue: std::collections::VecDeque<usize> = decision.order.into();
    let mut retries_left = gw.config.retry_budget;

    while let Some(i) = queue.pop_front() {
        let upstream = &upstreams[i];
        let in_flight = upstream.start_request(&gw.metrics);
        // The GenAI series of a request that ends here (answered, or failed as the last try).
        let gen_ai = GenAiLabels { operation, model: model.clone(), upstream: upstream.base.clone() };
        let failed =
            |error_type: &str| gw.metrics.gen_ai.record(&gen_ai, arrived.elapsed().as_secs_f64(), Some(error_type), Usage::default());
        let declared = upstream.declared();
        // The deployment answers to the client's name; the replica may serve it under its own.
        let served_as = declared.as_ref().map_or(model.as_str(), |d| d.served_as.as_str());
        let body = if served_as != model { renamed(&json, served_as) } else { bytes.clone() };
        let attempt = span.attempt(AttemptStart { number: 0, replica: &upstream.base, model: &model, served_as, affinity_hit });
        affinity_hit = false;
        let mut upstream_req = build_request(gw, &upstream.base, &parts.uri, &parts.headers, body)
            .map_err(|m| (Rejection::BadRequest, GatewayError::new(Kind::BadRequest, m)))?;
        attempt.inject(upstream_req.headers_mut());
        let is_last = queue.is_empty() || retries_left == 0;
        let refusal = match gw.client.request(upstream_req).await {
            Ok(resp) => {
                let status = resp.status();
                // Counted once per attempt: by its status, or as `error` when the body broke
                // before its first byte (below).
                let count = |label: &str| gw.metrics.requests.with_label_values(&[&model, &upstream.base, label]).inc();
                let refused = status == StatusCode::SERVICE_UNAVAILABLE || status == StatusCode::TOO_MANY_REQUESTS;
                // A prompt longer than this replica's context may fit another's: only then is
                // the refusal read (it is small, and complete before anything reached the
                // client).
                let larger_elsewhere = |ctx: Option<u64>| {
                    queue.iter().any(|&j| match (contexts[j], ctx) {
                        (Some(other), Some(own)) => other > own,
                        _ => true,
                    })
                };
                if status == StatusCode::BAD_REQUEST && larger_elsewhere(contexts[i]) {
                    count(status.as_str());
                    let (head, incoming) = resp.into_parts();
                    let answer = http_body_util::Limited::new(incoming, MAX_REFUSAL_BYTES).collect().await.map(|b| b.to_bytes());
                    let Ok(answer) = answer else {
                        let message = format!("{} answered 400 and its body broke", upstream.base);
                        failed("body_error");
                        attempt.end(&AttemptEnd::Failed { status: Some(400), reason: "body_error", message: message.clone() });
                        return Ok(GatewayError::new(Kind::BadGateway, message).response(api));
                    };
                    let Some(refusal) = context_refusal(&answer) else {
                        attempt.end(&AttemptEnd::Answered { status: 400 });
                        failed("400");
                        return Ok(pass_on(head, answer, (slot, in_flight, model_in_flight, attempt)));
                    };
                    queue.retain(|&j| contexts[j].is_none_or(|c| c > refusal.prompt_tokens));
                    if queue.is_empty() {
                        let largest = contexts.iter().flatten().max().copied().unwrap_or(refusal.context).max(refusal.context);
                        // The engine's words, with the largest context of the model's replicas.
                        let message = format!(
                            "the prompt is {} tokens; the model's context is {largest} tokens (the largest of the replicas serving '{model}'), and at least one must be left to generate",
                            refusal.prompt_tokens
                        );
                        gw.metrics.reject(Rejection::OverContext);
                        failed("400");
                        span.set(vec![spans::rejected(Rejection::OverContext)]);
                        attempt.end(&AttemptEnd::Failed { status: Some(400), reason: "context", message: message.clone() });
                        return Ok(GatewayError { param: refusal.param, ..GatewayError::new(Kind::BadRequest, message) }.response(api));
                    }
                    // Not a retry of a refusal to serve: the budget stays for those.
                    gw.metrics.retries.with_label_values(&[&model, "context"]).inc();
                    attempt.end(&AttemptEnd::Retried { status: Some(400), reason: "context" });
                    drop(in_flight);
                    continue;
                }
                if !refused || is_last {
                    let (mut head, mut incoming) = resp.into_parts();
                    // Nothing goes to the client before the body's first frame: a replica that
                    // dies after its response head (a stream's head comes before its first
                    // token) but before any body byte has sent the client nothing, so the
                    // request may still go to another replica.
                    let first = incoming.frame().await;
                    if let Some(Err(e)) = &first {
                        let message = format!("the connection closed after the response head, before any body: {e}");
                        count("error");
                        upstream.mark_down(&message, &gw.metrics);
                        drop(in_flight);
                        let (status, reason) = (Some(status.as_u16()), "closed_before_body");
                        if is_last {
                            failed(reason);
                            attempt.end(&AttemptEnd::Failed { status, reason, message: message.clone() });
                            let msg = format!("no replica answered: the last one tried, {}, failed: {message}", upstream.base);
                            return Ok(GatewayError::new(Kind::BadGateway, msg).response(api));
                        }
                        attempt.end(&AttemptEnd::Retried { status, reason });
                        retries_left -= 1;
                        gw.metrics.retries.with_label_values(&[&model, "closed_before_body"]).inc();
                        continue;
                    }
                    count(status.as_str());
                    attempt.end(&AttemptEnd::Answered { status: status.as_u16() });
                    if status.is_success() {
                        gw.metrics.first_byte.with_label_values(&[&model, stream]).observe(arrived.elapsed().as_secs_f64());
                    }
                    // The answer: streamed through, its usage read on the way (a success's only);
                    // the key's slot, the in-flight counts and the spans are held by the body
                    // until it ends or the client goes.
                    let sse = head.headers.get(header::CONTENT_TYPE).is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
                    strip_hop_by_hop(&mut head.headers);
                    let outcome = Outcome {
                        series: gw.metrics.gen_ai.clone(),
                        labels: gen_ai,
                        arrived,
                        scanner: status.is_success().then(|| Scanner::new(sse)),
                        error_type: (!status.is_success()).then(|| status.as_str().to_string()),
                        recorded: false,
                    };
                    let first = first.and_then(Result::ok);
                    let guards = (slot, in_flight, model_in_flight, attempt, span.clone());
                    let answer = Answer { first, incoming, outcome, _guards: guards };
                    return Ok(Response::from_parts(head, Body::new(answer)));
                }
                count(status.as_str());
                attempt.end(&AttemptEnd::Retried { status: Some(status.as_u16()), reason: retry_reason(status) });
                retry_reason(status)
            }
            Err(e) => {
                gw.metrics.requests.with_label_values(&[&model, &upstream.base, "error"]).inc();
                let (reason, message) = classify(&e);
                upstream.mark_down(&message, &gw.metrics);
                drop(in_flight);
                if is_last {
                    failed(reason);
                    attempt.end(&AttemptEnd::Failed { status: None, reason, message: message.clone() });
                    let msg = format!("no replica answered: the last one tried, {}, failed: {message}", upstream.base);
                    return Ok(GatewayError::new(Kind::BadGateway, msg).response(api));
                }
                attempt.end(&AttemptEnd::Retried { status: None, reason });
                reason
            }
        };
        retries_left -= 1;
        gw.metrics.retries.with_label_values(&[&model, refusal]).inc();
    }
    // The order is never empty, and its last attempt always returns; a context refusal with
    // nowhere left to go returns too.
    unreachable!("the last attempt returns")
}

/// A replica's answer on its way to the client, frame by frame as they come, each shown to the
/// usage scanner; its GenAI series are recorded once, when it ends (or the client goes).
struct Answer<G> {
    /// The frame read before the answer was committed to (none: the body was empty).
    first: Option<hyper::body::Frame<Bytes>>,
    incoming: hyper::body::Incoming,
    outcome: Outcome,
    _guards: G,
}

impl<G: Unpin> hyper::body::Body for Answer<G> {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        let next = match this.first.take() {
            Some(frame) => Some(Ok(frame)),
            None => std::task::ready!(std::pin::Pin::new(&mut this.incoming).poll_frame(cx)),
        };
        match &next {
            Some(Ok(frame)) => {
                if let (Some(s), Some(data)) = (&mut this.outcome.scanner, frame.data_ref()) {
                    s.feed(data);
                }
            }
            Some(Err(_)) => this.outcome.record(Some("body_error")),
            None => this.outcome.record(None),
        }
        // A body of known length is done with its last byte: the server may not ask again.
        if hyper::body::Body::is_end_stream(this) {
            this.outcome.record(None);
        }
        std::task::Poll::Ready(next)
    }

    fn is_end_stream(&self) -> bool {
        self.first.is_none() && self.incoming.is_end_stream()
    }
}

/// What an answer's GenAI series need, recorded once.
struct Outcome {
    series: GenAi,
    labels: GenAiLabels,
    arrived: std::time::Instant,
    /// Only a success's body is read for its usage.
    scanner: Option<Scanner>,
    /// The status of an answer that is not a success.
    error_type: Option<String>,
    recorded: bool,
}

impl Outcome {
    fn record(&mut self, error_type: Option<&str>) {
        if std::mem::replace(&mut self.recorded, true) {
            return;
        }
        let usage = self.scanner.take().map(Scanner::finish).unwrap_or_default();
        let error_type = self.error_type.as_deref().or(error_type);
        self.series.record(&self.labels, self.arrived.elapsed().as_secs_f64(), error_type, usage);
    }
}

impl Drop for Outcome {
    /// The client went before the answer's end.
    fn drop(&mut self) {
        self.record(Some("cancelled"));
    }
}

/// Largest refusal body read to learn whether a replica refused a prompt as over its context.
const MAX_REFUSAL_BYTES: usize = 64 << 10;

/// A replica's answer read whole (a refusal that is the answer after all), to the client as it
/// came.
fn pass_on(mut head: axum::http::response::Parts, body: Bytes, guards: impl Send + 'static) -> Response {
    strip_hop_by_hop(&mut head.headers);
    head.headers.remove(header::CONTENT_LENGTH);
    drop(guards);
    Response::from_parts(head, Body::from(body))
}

/// The largest known context among `order`'s candidates, when every one of them has one.
fn largest_context(candidates: &[Candidate], order: &[usize]) -> Option<u64> {
    let contexts: Option<Vec<u64>> = order.iter().map(|&i| candidates[i].context).collect();
    contexts?.into_iter().max()
}

/// The engine's refusal of a prompt longer than its context (`check_prompt_fits` in
/// engine/src/wire/request.rs: "the prompt is N tokens; the model's context is M tokens, ..."),
/// in either API's error shape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContextRefusal {
    pub prompt_tokens: u64,
    pub context: u64,
    /// The request field the replica named (`messages` or `prompt`).
    pub param: Option<&'static str>,
}

pub fn context_refusal(body: &[u8]) -> Option<ContextRefusal> {
    let v: Json = serde_json::from_slice(body).ok()?;
    let error = v.get("error")?;
    let message = error.get("message")?.as_str()?;
    // The number right after `what` and what follows it.
    let number_after = |s: &'_ str, what: &str| -> Option<(u64, usize)> {
        let rest = s.strip_prefix(what)?;
        let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        Some((rest[..digits].parse().ok()?, what.len() + digits))
    };
    let (prompt_tokens, end) = number_after(message, "the prompt is ")?;
    let (context, _) = number_after(&message[end..], " tokens; the model's context is ")?;
    let param = match error.get("param").and_then(Json::as_str) {
        Some("messages") => Some("messages"),
        Some("prompt") => Some("prompt"),
        _ => None,
    };
    Some(ContextRefusal { prompt_tokens, context, param })
}

/// One request of a model in flight through the gateway, until dropped (with the answer's body).
struct ModelInFlight(prometheus::IntGauge);

impl ModelInFlight {
    fn start(metrics: &crate::metrics::Metrics, model: &str) -> ModelInFlight {
        let g = metrics.model_in_flight.with_label_values(&[model]);
        g.inc();
        ModelInFlight(g)
    }
}

impl Drop for ModelInFlight {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// The answer when no replica may take the request: 404 when no replica (healthy or not) has
/// listed the model, 503 when some have but none is healthy now.
fn no_replica(model: &str, seen: &[crate::discovery::Seen]) -> (Rejection, GatewayError) {
    let known_anywhere = seen.iter().any(|s| s.models.iter().any(|m| m == model));
    if known_anywhere {
        let e = GatewayError {
            retry_after: Some(1),
            ..GatewayError::new(Kind::Unavailable, format!("no healthy replica serves model '{model}' now; retry later"))
        };
        return (Rejection::NoHealthyReplica, e);
    }
    let served = served_models(seen);
    if served.is_empty() && !seen.iter().any(|s| s.healthy) {
        let e = GatewayError { retry_after: Some(1), ..GatewayError::new(Kind::Unavailable, "no replica is healthy now; retry later") };
        return (Rejection::NoHealthyReplica, e);
    }
    let message = format!("model '{model}' is not served by any replica; served: {}", served.join(", "));
    (Rejection::UnknownModel, GatewayError { param: Some("model"), ..GatewayError::new(Kind::NotFound, message) })
}

/// Every healthy replica's model names, each once, in `--upstream` order.
pub fn served_models(seen: &[crate::discovery::Seen]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for s in seen.iter().filter(|s| s.healthy) {
        for m in &s.models {
            if !out.contains(m) {
                out.push(m.clone());
            }
        }
    }
    out
}

/// The request body with `model` replaced.
fn renamed(json: &Json, model: &str) -> Bytes {
    let mut json = json.clone();
    json["model"] = Json::String(model.to_string());
    Bytes::from(json.to_string())
}

fn build_request(
    gw: &Gateway,
    base: &str,
    uri: &axum::http::Uri,
    headers: &HeaderMap,
    body: Bytes,
) -> Result<Request<Full<Bytes>>, String> {
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    let mut req = Request::post(format!("{base}{path}")).body(Full::new(body)).map_err(|e| format!("bad request target: {e}"))?;
    let out = req.headers_mut();
    for (name, value) in headers {
        if is_hop_by_hop(name) || *name == header::HOST || *name == header::CONTENT_LENGTH {
            continue;
        }
        // The client's key stays here when the gateway checks keys itself.
        if gw.keys.checks_keys() && (*name == header::AUTHORIZATION || name.as_str() == "x-api-key") {
            continue;
        }
        out.append(name.clone(), value.clone());
    }
    if let Some(k) = &gw.config.upstream_api_key {
        out.remove("x-api-key");
        let v =
            HeaderValue::from_str(&format!("Bearer {k}")).map_err(|_| "the upstream API key is not a valid header value".to_string())?;
        out.insert(header::AUTHORIZATION, v);
    }
    Ok(req)
}

fn is_hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "proxy-connection"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
    )
}

fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let names: Vec<HeaderName> = headers.keys().filter(|n| is_hop_by_hop(n)).cloned().collect();
    for n in names {
        headers.remove(n);
    }
}

/// A client error's reason label and message.
fn classify(e: &hyper_util::client::legacy::Error) -> (&'static str, String) {
    let message = describe_client_error(e);
    if e.is_connect() {
        return ("connect_failed", message);
    }
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(s) = source {
        if let Some(h) = s.downcast_ref::<hyper::Error>()
            && h.is_incomplete_message()
        {
            return ("connection_closed", message);
        }
        if let Some(io) = s.downcast_ref::<std::io::Error>()
            && io.kind() == std::io::ErrorKind::ConnectionReset
        {
            return ("connection_reset", message);
        }
        source = s.source();
    }
    ("connection_error", message)
}

/// Whether the connection closed or was reset before any response came (on a pooled connection,
/// a request that may be sent again when it is idempotent).
pub fn closed_before_response(e: &hyper_util::client::legacy::Error) -> bool {
    matches!(classify(e).0, "connection_closed" | "connection_reset")
}

/// The error and its causes on one line (hyper's top-level message alone says little).
pub fn describe_client_error(e: &hyper_util::client::legacy::Error) -> String {
    let mut out = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        out += &format!(": {s}");
        source = s.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_engines_context_refusal_is_recognised_in_either_shape() {
        let openai = br#"{"error":{"message":"the prompt is 700 tokens; the model's context is 512 tokens, and at least one must be left to generate","type":"invalid_request_error","param":"prompt","code":null}}"#;
        assert_eq!(context_refusal(openai), Some(ContextRefusal { prompt_tokens: 700, context: 512, param: Some("prompt") }));
        let anthropic = br#"{"type":"error","error":{"type":"invalid_request_error","message":"the prompt is 9000 tokens; the model's context is 8192 tokens, and at least one must be left to generate"}}"#;
        assert_eq!(context_refusal(anthropic), Some(ContextRefusal { prompt_tokens: 9000, context: 8192, param: None }));
        for other in [
            &br#"{"error":{"message":"max_tokens: 0 is not allowed","param":"max_tokens"}}"#[..],
            br#"{"error":{"message":"see: the prompt is 7 tokens; the model's context is 5 tokens"}}"#,
            br#"{"error":{"message":"the prompt is many tokens; the model's context is 5 tokens"}}"#,
            br#"{"error":{"message":"the prompt is 7 tokens; the model's context is tokens"}}"#,
            b"not json",
        ] {
            assert_eq!(context_refusal(other), None, "{}", String::from_utf8_lossy(other));
        }
    }
}
