//! The HTTP routes (axum): the OpenAI and Anthropic endpoints over the engine worker, and the
//! health, readiness, liveness and metrics endpoints. Every failure a client can cause is an
//! [`ApiError`] in the shape of the API it spoke; nothing a request carries can panic a handler.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};

use super::jobs::{Event, Job, JobEnd, Loaded};
use super::metrics;
use super::state::{EngineStatus, Heartbeat, HttpCounters};
use super::telemetry::GenAiLabels;
use crate::wire::error::parse_body;
use crate::wire::reply::ReplyFormat;
use crate::wire::request::check_prompt_fits;
use crate::wire::sse::{self, AnthropicStream, ChoiceStream, OpenAiChatStream, OpenAiCompletionStream};
use crate::wire::stop::{StopMatcher, StopStep};
use crate::wire::tool_calls::Piece;
use crate::wire::{ApiError, ErrorKind, FinishReason, GenerateRequest, Limits, Output, Prompt, Usage, anthropic, new_id, openai, unix_now};

/// Largest request body taken (a 24k-token prompt is ~100 KB of text).
pub const MAX_BODY_BYTES: usize = 32 << 20;

/// Which API a request spoke: it picks the body type, the answer and the error shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    Chat,
    Completion,
    Messages,
}

pub struct AppState {
    /// To the worker; behind a mutex so the shutdown can close it while handlers hold the state.
    pub jobs: Mutex<Option<Sender<Job>>>,
    pub heartbeat: Arc<Heartbeat>,
    pub loaded: OnceLock<Loaded>,
    pub served_models: Vec<String>,
    pub api_keys: Vec<String>,
    pub stall_timeout: Duration,
    pub max_n: usize,
    pub counters: HttpCounters,
    /// What `/ready` also requires of each engine child (see [`super::ready_check`]).
    pub ready_gate: super::ready_check::ReadyGate,
}

pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/messages", post(messages))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/ready", get(ready))
        .route("/engine", get(engine_status))
        .route("/live", get(live))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .with_state(state)
}

/// An error response in `api`'s shape, with `Retry-After` when given.
pub fn error_response(api: Api, e: &ApiError, retry_after: Option<u32>) -> Response {
    let body = match api {
        Api::Messages => e.anthropic_json(),
        Api::Chat | Api::Completion => e.openai_json(),
    };
    let status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut resp = (status, axum::Json(body)).into_response();
    if let Some(secs) = retry_after {
        resp.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs));
    }
    resp
}

/// The key a request carries: `Authorization: Bearer K` or `x-api-key: K`.
fn presented_key(headers: &HeaderMap) -> Option<&str> {
    if let Some(v) = headers.get("x-api-key").and_then(|v| v.to_str().ok()) {
        return Some(v.trim());
    }
    let auth = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, key) = auth.trim().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| key.trim())
}

/// Ok when no keys are configured or the request carries one of them.
pub fn check_key(keys: &[String], headers: &HeaderMap) -> Result<(), ApiError> {
    if keys.is_empty() {
        return Ok(());
    }
    match presented_key(headers) {
        Some(k) if keys.iter().any(|known| constant_time_eq(known.as_bytes(), k.as_bytes())) => Ok(()),
        Some(_) => Err(ApiError::new(ErrorKind::Authentication, "invalid API key")),
        None => Err(ApiError::new(ErrorKind::Authentication, "missing API key: send `Authorization: Bearer KEY` or `x-api-key: KEY`")),
    }
}

/// Compares keys without stopping at the first differing byte (no timing hint of a prefix).
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn not_found(headers: HeaderMap, uri: axum::http::Uri) -> Response {
    let api = if headers.contains_key("anthropic-version") { Api::Messages } else { Api::Chat };
    error_response(api, &ApiError::new(ErrorKind::NotFound, format!("no route for {}", uri.path())), None)
}

async fn health() -> &'static str {
    "ok\n"
}

async fn ready(State(s): State<Arc<AppState>>) -> Response {
    let hb = &s.heartbeat;
    if hb.dead.load(Ordering::Acquire) {
        (StatusCode::SERVICE_UNAVAILABLE, "the engine has stopped\n").into_response()
    } else if hb.restarting.load(Ordering::Acquire) {
        (StatusCode::SERVICE_UNAVAILABLE, "the engine is restarting\n").into_response()
    } else if hb.ready.load(Ordering::Acquire) {
        // The check may ask the driver (NVML): off the runtime's threads.
        let gate = s.clone();
        let judged = tokio::task::spawn_blocking(move || gate.ready_gate.judge(&status_of(&gate))).await.ok().flatten();
        match judged {
            Some(Err(why)) => (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {why}\n")).into_response(),
            _ => (StatusCode::OK, "ready\n").into_response(),
        }
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "loading the model\n").into_response()
    }
}

fn status_of(s: &AppState) -> EngineStatus {
    let hb = &s.heartbeat;
    let loaded = s.loaded.get();
    let pid = hb.engine_pid.load(Ordering::Relaxed);
    EngineStatus {
        ready: hb.ready.load(Ordering::Acquire) && !hb.restarting.load(Ordering::Acquire) && !hb.dead.load(Ordering::Acquire),
        backend: loaded.map(|l| l.backend.clone()),
        engine_pid: u32::try_from(pid).ok().filter(|&p| p != 0),
        context: loaded.map(|l| l.context),
        restarts: hb.restarts.load(Ordering::Relaxed),
        served_models: s.served_models.clone(),
        ready_check: s.ready_gate.last().map(|r| match r {
            Ok(detail) => format!("passed: {detail}"),
            Err(why) => format!("failed: {why}"),
        }),
    }
}

async fn engine_status(State(s): State<Arc<AppState>>) -> Response {
    axum::Json(status_of(&s)).into_response()
}

async fn live(State(s): State<Arc<AppState>>) -> Response {
    let hb = &s.heartbeat;
    let since = hb.since_progress().as_secs_f64();
    let (running, waiting) = (hb.running.load(Ordering::Relaxed), hb.waiting.load(Ordering::Relaxed));
    let body = format!("last progress {since:.1} s ago; {running} running, {waiting} waiting\n");
    if hb.dead.load(Ordering::Acquire) {
        (StatusCode::SERVICE_UNAVAILABLE, "the engine has stopped\n").into_response()
    } else if hb.restarting.load(Ordering::Acquire) {
        (StatusCode::SERVICE_UNAVAILABLE, format!("the engine is restarting after a stall or crash; {body}")).into_response()
    } else if hb.stalled(s.stall_timeout) {
        (StatusCode::SERVICE_UNAVAILABLE, format!("stalled: {body}")).into_response()
    } else {
        (StatusCode::OK, body).into_response()
    }
}

async fn metrics(State(s): State<Arc<AppState>>) -> Response {
    let out = metrics::render(&s.heartbeat, &metrics::scalars(&s.heartbeat, &s.counters));
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], out).into_response()
}

async fn models(State(s): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    if let Err(e) = check_key(&s.api_keys, &headers) {
        return error_response(Api::Chat, &e, None);
    }
    axum::Json(openai::models_list(&s.served_models, unix_now())).into_response()
}

async fn chat(State(s): State<Arc<AppState>>, headers: HeaderMap, body: Body) -> Response {
    generate(s, Api::Chat, headers, body).await
}

async fn completions(State(s): State<Arc<AppState>>, headers: HeaderMap, body: Body) -> Response {
    generate(s, Api::Completion, headers, body).await
}

async fn messages(State(s): State<Arc<AppState>>, headers: HeaderMap, body: Body) -> Response {
    generate(s, Api::Messages, headers, body).await
}

async fn generate(s: Arc<AppState>, api: Api, headers: HeaderMap, body: Body) -> Response {
    s.counters.requests.fetch_add(1, Ordering::Relaxed);
    let resp = match run_request(&s, api, &headers, body).await {
        Ok(resp) => resp,
        Err((e, retry_after)) => error_response(api, &e, retry_after),
    };
    if !resp.status().is_success() {
        s.counters.errors.fetch_add(1, Ordering::Relaxed);
    }
    resp
}

type Failure = (ApiError, Option<u32>);

fn fail(e: ApiError) -> Failure {
    (e, None)
}

/// The request as the engine runs it: its tokens and the per-choice jobs' channel.
struct Submitted {
    prompt_tokens: usize,
    /// How the reply marks reasoning and tool calls (see [`prompt_tokens`]).
    format: ReplyFormat,
    events: UnboundedReceiver<(usize, Event)>,
    cancels: Vec<Arc<AtomicBool>>,
    tokenizer: Arc<crate::tokenizer::Tokenizer>,
}

async fn run_request(s: &Arc<AppState>, api: Api, headers: &HeaderMap, body: Body) -> Result<Response, Failure> {
    check_key(&s.api_keys, headers).map_err(fail)?;
    let body = axum::body::to_bytes(body, MAX_BODY_BYTES).await.map_err(|e| {
        let e = e.into_inner();
        if e.is::<http_body_util::LengthLimitError>() {
            fail(ApiError::new(ErrorKind::RequestTooLarge, format!("the request body is larger than {MAX_BODY_BYTES} bytes")))
        } else {
            fail(ApiError::new(ErrorKind::InvalidRequest, format!("reading the request body: {e}")))
        }
    })?;
    let Some(loaded) = s.loaded.get() else {
        return Err((ApiError::new(ErrorKind::Overloaded, "the model is still loading"), Some(5)));
    };
    let limits = Limits { served_models: s.served_models.clone(), context_tokens: loaded.context, max_n: s.max_n };
    let req = parse_request(api, &body, &limits).map_err(fail)?;
    // One id per request: in the answer, and in the supervisor's stall reports.
    let id = new_id(match api {
        Api::Chat => "chatcmpl-",
        Api::Completion => "cmpl-",
        Api::Messages => "msg_",
    });
    let gen_ai = GenAiLabels {
        operation: match api {
            Api::Completion => "text_completion",
            Api::Chat | Api::Messages => "chat",
        },
        model: req.model.clone(),
    };
    let trace_parent = super::telemetry::trace_parent(headers);
    let mut sub = submit(s, loaded, &req, &id, &gen_ai, trace_parent)?;
    let format = sub.format;
    // The first event decides the status: a refusal (full queue, quarantine) is an HTTP error,
    // not a stream that fails; once admitted, a stream starts and a later failure (a stall) is
    // the API's error event.
    let first = sub.events.recv().await.ok_or_else(|| fail(worker_gone()))?;
    if let Event::Failed { error, retry_after } = &first.1 {
        return Err((error.clone(), *retry_after));
    }
    if req.stream {
        Ok(stream_response(api, id, req, format, sub, first))
    } else {
        let (outputs, usage) = collect(&req, &mut sub, first).await?;
        let id_created = unix_now();
        Ok(match api {
            Api::Chat => axum::Json(openai::chat_completion(&id, id_created, &req, format, &outputs, usage)).into_response(),
            Api::Completion => axum::Json(openai::completion(&id, id_created, &req.model, &outputs, usage)).into_response(),
            Api::Messages => axum::Json(anthropic::message(&id, &req, format, &outputs[0], usage)).into_response(),
        })
    }
}

fn parse_request(api: Api, body: &[u8], limits: &Limits) -> Result<GenerateRequest, ApiError> {
    match api {
        Api::Chat => parse_body::<openai::ChatCompletionRequest>(body)?.validate(limits),
        Api::Completion => parse_body::<openai::CompletionRequest>(body)?.validate(limits),
        Api::Messages => parse_body::<anthropic::MessagesRequest>(body)?.validate(limits),
    }
}

fn worker_gone() -> ApiError {
    ApiError::new(
        ErrorKind::Overloaded,
        "the engine supervisor is not running (the server is shutting down or the engine could not be restarted)",
    )
}

/// The prompt's tokens: chat messages rendered through the model's template (with the
/// request's template variables, such as `reasoning_effort`), or the raw text; and the format
/// of the reply, told by the template and how the rendered prompt ends.
pub fn prompt_tokens(loaded: &Loaded, req: &GenerateRequest) -> Result<(Vec<u32>, ReplyFormat), ApiError> {
    let internal = |what: &str, e: &dyn std::fmt::Display| ApiError::new(ErrorKind::Internal, format!("{what}: {e}"));
    match &req.prompt {
        Prompt::Chat { messages, tools } => {
            let text = loaded
                .template
                .render_with(messages, tools.as_ref(), true, &req.template_vars())
                .map_err(|e| ApiError::invalid("messages", e))?;
            // A template that writes the BOS itself must not get a second one.
            let has_bos = !loaded.template.bos_token().is_empty() && text.starts_with(loaded.template.bos_token());
            let tokens = loaded.tokenizer.encode(&text, !has_bos, true).map_err(|e| internal("tokenizing the rendered prompt", &e))?;
            Ok((tokens, ReplyFormat::of_prompt(loaded.template.source(), &text)))
        }
        // Raw completions are not parsed; the format is not used.
        Prompt::Text(text) => {
            let tokens = loaded.tokenizer.encode(text, true, true).map_err(|e| internal("tokenizing the prompt", &e))?;
            Ok((tokens, ReplyFormat::Hermes))
        }
    }
}

fn submit(
    s: &AppState,
    loaded: &Loaded,
    req: &GenerateRequest,
    request_id: &str,
    gen_ai: &GenAiLabels,
    trace_parent: Option<opentelemetry::trace::SpanContext>,
) -> Result<Submitted, Failure> {
    let (prompt, format) = prompt_tokens(loaded, req).map_err(fail)?;
    if prompt.is_empty() {
        return Err(fail(ApiError::invalid("prompt", "the prompt has no tokens")));
    }
    // Named as the request named it: `messages` for chat, `prompt` for completions.
    let param = match req.prompt {
        Prompt::Chat { .. } => "messages",
        Prompt::Text(_) => "prompt",
    };
    let max_tokens = check_prompt_fits(param, prompt.len(), req.max_tokens, loaded.context).map_err(fail)?;
    let (tx, rx) = unbounded_channel();
    let jobs = s.jobs.lock().map_err(|_| fail(worker_gone()))?.clone().ok_or_else(|| fail(worker_gone()))?;
    let base = req.sampling.params(rand::random());
    let mut cancels = Vec::with_capacity(req.n);
    for index in 0..req.n {
        let cancel = Arc::new(AtomicBool::new(false));
        cancels.push(cancel.clone());
        // Choice i draws with seed + i: different choices, each reproducible.
        let sampling = crate::sampler::SamplingParams { seed: base.seed.wrapping_add(index as u64), ..base };
        let job = Job {
            prompt: prompt.clone(),
            sampling,
            max_tokens,
            stop_tokens: loaded.tokenizer.stop_tokens().to_vec(),
            index,
            request_id: request_id.to_string(),
            gen_ai: gen_ai.clone(),
            trace_parent: trace_parent.clone(),
            events: tx.clone(),
            cancel,
            stream: req.stream,
        };
        jobs.send(job).map_err(|_| fail(worker_gone()))?;
    }
    Ok(Submitted { prompt_tokens: prompt.len(), format, events: rx, cancels, tokenizer: loaded.tokenizer.clone() })
}

fn finish_reason(end: JobEnd) -> FinishReason {
    match end {
        JobEnd::StopToken => FinishReason::EndOfTurn,
        JobEnd::Length => FinishReason::MaxTokens,
    }
}

/// A token's bytes as the client sees them (control tokens hidden).
fn token_bytes(tok: &crate::tokenizer::Tokenizer, id: u32) -> Result<&[u8], ApiError> {
    tok.piece(id, false).map_err(|e| ApiError::new(ErrorKind::Internal, format!("decoding generated token: {e}")))
}

/// Runs every choice to its end and returns the outputs (text cut at stop strings).
async fn collect(req: &GenerateRequest, sub: &mut Submitted, first: (usize, Event)) -> Result<(Vec<Output>, Usage), Failure> {
    let n = req.n;
    let mut matchers: Vec<StopMatcher> = (0..n).map(|_| StopMatcher::new(req.stop.clone())).collect();
    let mut texts = vec![String::new(); n];
    let mut outs: Vec<Option<Output>> = vec![None; n];
    let mut tokens = vec![0u64; n];
    let mut usage = Usage { prompt_tokens: sub.prompt_tokens as u64, ..Usage::default() };
    let mut next = Some(first);
    while outs.iter().any(Option::is_none) {
        let (i, event) = match next.take() {
            Some(e) => e,
            None => sub.events.recv().await.ok_or_else(|| fail(worker_gone()))?,
        };
        if i >= n || outs[i].is_some() {
            continue;
        }
        match event {
            Event::Token(id) => {
                usage.completion_tokens += 1;
                tokens[i] += 1;
                match matchers[i].push(token_bytes(&sub.tokenizer, id).map_err(fail)?) {
                    StopStep::Text(t) => texts[i] += &t,
                    StopStep::Stopped { text, stop } => {
                        texts[i] += &text;
                        let finish = FinishReason::StopSequence(matchers[i].stops()[stop].clone());
                        outs[i] = Some(Output { text: std::mem::take(&mut texts[i]), finish });
                        sub.cancels[i].store(true, Ordering::Relaxed);
                    }
                }
            }
            Event::Prefilled { cached_tokens } => usage.cached_tokens = usage.cached_tokens.max(cached_tokens as u64),
            Event::Finished { end, cached_tokens } => {
                usage.cached_tokens = usage.cached_tokens.max(cached_tokens as u64);
                texts[i] += &matchers[i].finish();
                outs[i] = Some(Output { text: std::mem::take(&mut texts[i]), finish: finish_reason(end) });
            }
            Event::Failed { error, retry_after } => return Err((error, retry_after)),
            // The engine restarted under this choice: it is generated again from the prompt.
            Event::Requeued => {
                usage.completion_tokens -= tokens[i];
                tokens[i] = 0;
                texts[i].clear();
                matchers[i] = StopMatcher::new(req.stop.clone());
            }
            Event::Admitted => {}
        }
    }
    Ok((outs.into_iter().flatten().collect(), usage))
}

/// One API's stream encoder.
enum Encoder {
    Chat(OpenAiChatStream),
    Completion(OpenAiCompletionStream),
    Messages(AnthropicStream),
}

impl Encoder {
    fn pieces(&mut self, index: usize, pieces: &[Piece]) -> String {
        match self {
            Encoder::Chat(e) => e.pieces(index, pieces),
            Encoder::Completion(e) => pieces
                .iter()
                .map(|p| match p {
                    // Raw completions are not parsed (see `ChoiceStream`): all of it is text.
                    Piece::Text(t) | Piece::Reasoning(t) => e.text(index, t),
                    // `/v1/completions` requests have no tools, so their text is never parsed for
                    // calls; should one appear, it goes out as the block the model wrote.
                    Piece::Call(c) => {
                        let call = serde_json::json!({"name": c.name, "arguments": c.arguments});
                        e.text(index, &format!("<tool_call>\n{call}\n</tool_call>"))
                    }
                })
                .collect(),
            Encoder::Messages(e) => e.pieces(pieces),
        }
    }

    /// A choice's end; `usage` so far (its completion count is the choice's own).
    fn finish(&mut self, index: usize, finish: &FinishReason, usage: Usage) -> String {
        match self {
            Encoder::Chat(e) => e.finish(index, finish),
            Encoder::Completion(e) => e.finish(index, finish),
            Encoder::Messages(e) => e.finish(finish, usage),
        }
    }

    fn end(&self, usage: Usage) -> String {
        match self {
            Encoder::Chat(e) => e.end(usage),
            Encoder::Completion(e) => e.end(usage),
            // `message_stop` was the end.
            Encoder::Messages(_) => String::new(),
        }
    }

    fn error(&self, e: &ApiError) -> String {
        match self {
            Encoder::Messages(_) => sse::anthropic_error(e),
            _ => sse::openai_error(e),
        }
    }
}

/// An SSE response fed by a task that turns the worker's events into the API's frames. When the
/// client goes away the body is dropped, the task's sends fail, it returns, and dropping its
/// event receiver tells the worker to cancel.
fn stream_response(api: Api, id: String, req: GenerateRequest, format: ReplyFormat, mut sub: Submitted, first: (usize, Event)) -> Response {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<String>(64);
    tokio::spawn(async move {
        let mut enc = match api {
            Api::Chat => Encoder::Chat(OpenAiChatStream::new(&id, unix_now(), &req)),
            Api::Completion => Encoder::Completion(OpenAiCompletionStream::new(&id, unix_now(), &req)),
            Api::Messages => Encoder::Messages(AnthropicStream::new(&id, &req)),
        };
        let start = match &enc {
            Encoder::Chat(e) => e.start(),
            _ => String::new(),
        };
        if !start.is_empty() && tx.send(start).await.is_err() {
            return;
        }
        // Anthropic's `message_start` carries the usage, prefix-cache reads included: it waits
        // for the count, which comes just before the first token (or for any output at all).
        let mut opened = !matches!(enc, Encoder::Messages(_));
        let n = req.n;
        let mut choices: Vec<ChoiceStream> = (0..n).map(|_| ChoiceStream::new(&req, format)).collect();
        let mut tokens = vec![0u64; n];
        let mut done = vec![false; n];
        let mut usage = Usage { prompt_tokens: sub.prompt_tokens as u64, ..Usage::default() };
        let mut next = Some(first);
        while done.iter().any(|d| !d) {
            let (i, event) = match next.take() {
                Some(e) => e,
                None => match sub.events.recv().await {
                    Some(e) => e,
                    None => {
                        let _ = tx.send(enc.error(&worker_gone())).await;
                        return;
                    }
                },
            };
            if i >= n || done[i] {
                continue;
            }
            let opens = !opened && matches!(event, Event::Prefilled { .. } | Event::Token(_) | Event::Finished { .. });
            if let Event::Prefilled { cached_tokens } | Event::Finished { cached_tokens, .. } = event {
                usage.cached_tokens = usage.cached_tokens.max(cached_tokens as u64);
            }
            let head = match &enc {
                Encoder::Messages(e) if opens => {
                    opened = true;
                    e.start(usage) + &AnthropicStream::ping()
                }
                _ => String::new(),
            };
            let choice_usage = move |tokens: u64| Usage { completion_tokens: tokens, ..usage };
            let frames = head
                + &match event {
                    Event::Token(id) => {
                        tokens[i] += 1;
                        usage.completion_tokens += 1;
                        let bytes = match token_bytes(&sub.tokenizer, id) {
                            Ok(b) => b,
                            Err(e) => {
                                let _ = tx.send(enc.error(&e)).await;
                                return;
                            }
                        };
                        let step = choices[i].push(bytes);
                        let mut out = enc.pieces(i, &step.pieces);
                        if let Some(finish) = step.stopped {
                            done[i] = true;
                            sub.cancels[i].store(true, Ordering::Relaxed);
                            out += &enc.finish(i, &finish, choice_usage(tokens[i]));
                        }
                        out
                    }
                    Event::Finished { end, .. } => {
                        done[i] = true;
                        let rest = choices[i].finish();
                        enc.pieces(i, &rest) + &enc.finish(i, &finish_reason(end), choice_usage(tokens[i]))
                    }
                    Event::Failed { error, .. } => {
                        let _ = tx.send(enc.error(&error)).await;
                        return;
                    }
                    // A stream is re-queued only before its first token: nothing to take back.
                    Event::Admitted | Event::Prefilled { .. } | Event::Requeued => String::new(),
                };
            if !frames.is_empty() && tx.send(frames).await.is_err() {
                return;
            }
        }
        let _ = tx.send(enc.end(usage)).await;
    });
    let body = futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx).map(|o| o.map(|s| Ok::<_, Infallible>(Bytes::from(s)))));
    let mut resp = Response::new(Body::from_stream(body));
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_keys_bearer_or_x_api_key() {
        let keys = vec!["k1".to_string(), "secret-2".to_string()];
        let mut h = HeaderMap::new();
        assert_eq!(check_key(&[], &h), Ok(()));
        let e = check_key(&keys, &h).unwrap_err();
        assert_eq!(e.status, 401);
        assert!(e.message.contains("missing API key"));
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer secret-2"));
        assert_eq!(check_key(&keys, &h), Ok(()));
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("bearer k1"));
        assert_eq!(check_key(&keys, &h), Ok(()));
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer k2"));
        assert_eq!(check_key(&keys, &h).unwrap_err().message, "invalid API key");
        let mut h = HeaderMap::new();
        h.insert("x-api-key", HeaderValue::from_static("k1"));
        assert_eq!(check_key(&keys, &h), Ok(()));
        h.insert("x-api-key", HeaderValue::from_static("k"));
        assert!(check_key(&keys, &h).is_err());
    }

    #[test]
    fn errors_carry_their_api_shape_and_retry_after() {
        let e = ApiError::new(ErrorKind::Overloaded, "full");
        let r = error_response(Api::Messages, &e, Some(3));
        assert_eq!(r.status(), 503);
        assert_eq!(r.headers()[header::RETRY_AFTER], "3");
        let r = error_response(Api::Chat, &ApiError::invalid("n", "bad"), None);
        assert_eq!(r.status(), 400);
        assert!(r.headers().get(header::RETRY_AFTER).is_none());
    }
}
