//! What the HTTP handlers and the supervisor exchange: a [`Job`] per choice in, [`Event`]s
//! back (the counters both publish are [`super::state`]'s). The engine itself runs in a child
//! process (see [`super::supervisor`]).
//!
//! A job's end comes from the engine's side (stop token, token limit, context) or the client's:
//! a handler that found a stop string, or whose client disconnected, drops its event receiver,
//! and the supervisor cancels the sequence before its next step.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use tokio::sync::mpsc::UnboundedSender;

use super::telemetry::GenAiLabels;
use crate::chat_template::ChatTemplate;
use crate::engine::BackendKind;
use crate::sampler::SamplingParams;
use crate::sched::Rejection;
use crate::tokenizer::Tokenizer;
use crate::wire::{ApiError, ErrorKind};

/// One sequence to generate (one choice of a request).
pub struct Job {
    pub prompt: Vec<u32>,
    pub sampling: SamplingParams,
    pub max_tokens: usize,
    /// Generation ends after any of these (the token is sent, then `Finished`).
    pub stop_tokens: Vec<u32>,
    /// The choice index this job answers, echoed in every event.
    pub index: usize,
    /// The id of the answer (`chatcmpl-…`, `msg_…`), for the stall reports and the span.
    pub request_id: String,
    /// The operation and the model the request named, for its metrics and span.
    pub gen_ai: GenAiLabels,
    /// The W3C trace context the request came with (`traceparent`, from a gateway's attempt
    /// span, say): the request's span is its child.
    pub trace_parent: Option<opentelemetry::trace::SpanContext>,
    pub events: UnboundedSender<(usize, Event)>,
    /// Set by the handler when it ended the choice itself (a stop string): the supervisor cancels it.
    pub cancel: Arc<AtomicBool>,
    /// The client reads tokens as they come: once one was sent, a restart cannot hide.
    pub stream: bool,
}

/// Why a job ended on the engine's side.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JobEnd {
    StopToken,
    /// `max_tokens` or the context ran out.
    Length,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// The scheduler took the job (running or queued): a stream may start. Every job that is
    /// not refused sends this first.
    Admitted,
    /// Sent once, just before the first token: the prompt is computed, and this many of its
    /// tokens were read from the prefix cache. Streams open their usage with it.
    Prefilled {
        cached_tokens: usize,
    },
    Token(u32),
    Finished {
        end: JobEnd,
        cached_tokens: usize,
    },
    /// The engine died or stalled while this choice ran, and it runs again from its prompt on the
    /// restarted engine: whatever it produced so far is void (a non-streaming handler starts its
    /// text over; a stream only gets this before its first token).
    Requeued,
    /// The job was refused or failed; `retry_after` (seconds) for a full queue.
    Failed {
        error: ApiError,
        retry_after: Option<u32>,
    },
}

/// How the engine child loads and runs the model, and the scheduler's limits.
#[derive(Clone, Debug)]
pub struct WorkerConfig {
    pub model: PathBuf,
    pub backend: BackendKind,
    pub slots: usize,
    /// 0: the model's context.
    pub context: usize,
    pub max_batch_tokens: usize,
    pub prefill_chunk: usize,
    /// Keep whole sequences in the sliding-window layers instead of a ring per sequence
    /// (`EngineOptions::full_window_kv`).
    pub full_window_kv: bool,
    /// Requests that may wait for a slot before new ones get 503.
    pub max_queue: usize,
}

/// What the HTTP side needs once the model is loaded.
pub struct Loaded {
    pub tokenizer: Arc<Tokenizer>,
    pub template: ChatTemplate,
    /// The context as served (the engine's, after clamping to the model's).
    pub context: usize,
    pub backend: String,
}

/// The API error for a request the scheduler refused.
pub fn rejected(r: &Rejection) -> Event {
    let kind = match r.http_status() {
        503 => ErrorKind::Overloaded,
        _ => ErrorKind::InvalidRequest,
    };
    let mut error = ApiError::new(kind, r.to_string());
    error.status = r.http_status();
    Event::Failed { error, retry_after: r.retry_after_secs() }
}

/// The API error for a request the poison quarantine refused: 422, the request is well formed
/// but this server will not run it (a 503 would invite the retry that must not happen).
pub fn quarantined(message: String) -> Event {
    let mut error = ApiError::new(ErrorKind::InvalidRequest, message);
    error.status = 422;
    Event::Failed { error, retry_after: None }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejections_map_to_api_errors() {
        let Event::Failed { error, retry_after } = rejected(&Rejection::QueueFull { queued: 3, retry_after_secs: 2 }) else { panic!() };
        assert_eq!((error.status, retry_after), (503, Some(2)));
        assert!(error.message.contains("3 requests waiting"), "{}", error.message);
        let Event::Failed { error, retry_after } = rejected(&Rejection::PromptTooLong { prompt: 9, context: 8 }) else { panic!() };
        assert_eq!((error.status, retry_after), (400, None));
        assert!(error.message.contains("9 tokens") && error.message.contains("8 tokens"));
    }
}
