//! What the HTTP handlers and the supervisor exchange: a [`Job`] per choice in, [`Event`]s
//! back, and the [`Heartbeat`] counters the supervisor publishes for `/ready`, `/live` and
//! `/metrics`. The engine itself runs in a child process (see [`super::supervisor`]).
//!
//! A job's end comes from the engine's side (stop token, token limit, context) or the client's:
//! a handler that found a stop string, or whose client disconnected, drops its event receiver,
//! and the supervisor cancels the sequence before its next step.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::mpsc::UnboundedSender;

use super::telemetry::{GenAiLabels, Telemetry};
use crate::chat_template::ChatTemplate;
use crate::engine::BackendKind;
use crate::sampler::SamplingParams;
use crate::sched::Rejection;
use crate::serve::{ApiError, ErrorKind};
use crate::tokenizer::Tokenizer;

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
    pub events: UnboundedSender<(usize, Event)>,
    /// Set by the handler when it ended the choice itself (a stop string): the supervisor cancels it.
    pub cancel: Arc<AtomicBool>,
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
    Token(u32),
    Finished {
        end: JobEnd,
        cached_tokens: usize,
    },
    /// The job was refused or failed; `retry_after` (seconds) for a full queue.
    Failed {
        error: ApiError,
        retry_after: Option<u32>,
    },
}

/// Progress counters the supervisor publishes for `/ready`, `/live` and `/metrics`.
#[derive(Debug, Default)]
pub struct Heartbeat {
    /// An engine child is loaded and answering.
    pub ready: AtomicBool,
    /// The supervisor gave up (a panic, or the engine cannot be restarted): nothing will be
    /// served again.
    pub dead: AtomicBool,
    /// A stall or crash was caught and the engine is being restarted.
    pub restarting: AtomicBool,
    pub restarts: AtomicU64,
    /// The engine child's pid; 0 while none runs.
    pub engine_pid: AtomicU64,
    /// Kill (or death) to the new child's ready, of the last restart, without back-off waits.
    pub last_restart_micros: AtomicU64,
    /// Prompt lengths under quarantine.
    pub quarantined: AtomicU64,
    /// Stalls by (layer, op) as the board named them.
    pub stalls: Mutex<BTreeMap<(String, String), u64>>,
    pub steps: AtomicU64,
    pub prompt_tokens: AtomicU64,
    pub completion_tokens: AtomicU64,
    pub running: AtomicU64,
    pub waiting: AtomicU64,
    /// Milliseconds since `epoch` of the last finished step (or of going idle).
    pub last_progress_ms: AtomicU64,
    pub ttft_micros_sum: AtomicU64,
    pub ttft_count: AtomicU64,
    pub failed_steps: AtomicU64,
    /// The GenAI histograms, token rates and KV use, and the OTLP instruments when exporting.
    pub telemetry: Telemetry,
    epoch: Option<Instant>,
}

impl Heartbeat {
    pub fn new() -> Heartbeat {
        Heartbeat { epoch: Some(Instant::now()), ..Heartbeat::default() }
    }

    fn now_ms(&self) -> u64 {
        self.epoch.map_or(0, |e| e.elapsed().as_millis() as u64)
    }

    pub(crate) fn beat(&self) {
        self.last_progress_ms.store(self.now_ms(), Ordering::Relaxed);
    }

    /// Time since the last progress.
    pub fn since_progress(&self) -> Duration {
        Duration::from_millis(self.now_ms().saturating_sub(self.last_progress_ms.load(Ordering::Relaxed)))
    }

    /// Work is pending (running or waiting) and nothing moved for `stall_timeout`. Idle is
    /// never a stall.
    pub fn stalled(&self, stall_timeout: Duration) -> bool {
        let pending = self.running.load(Ordering::Relaxed) + self.waiting.load(Ordering::Relaxed) > 0;
        pending && self.since_progress() > stall_timeout
    }
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

impl Heartbeat {
    /// Counts a stall at `layer`/`op` (as the board named them).
    pub fn record_stall(&self, layer: String, op: String) {
        if let Ok(mut m) = self.stalls.lock() {
            *m.entry((layer, op)).or_default() += 1;
        }
    }

    pub fn stalls_total(&self) -> u64 {
        self.stalls.lock().map_or(0, |m| m.values().sum())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_is_never_a_stall_and_pending_work_without_progress_is() {
        let hb = Heartbeat::new();
        hb.beat();
        assert!(!hb.stalled(Duration::ZERO));
        hb.waiting.store(1, Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(5));
        assert!(hb.stalled(Duration::from_millis(1)));
        assert!(!hb.stalled(Duration::from_secs(60)));
        hb.beat();
        assert!(!hb.stalled(Duration::from_millis(1000)));
    }

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
