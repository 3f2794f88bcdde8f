//! The engine worker: one OS thread owns the engine (it is not shared between threads and its
//! steps block) and the scheduler. HTTP handlers hand it [`Job`]s over a channel and read
//! [`Event`]s back; the worker loops `schedule → step → sample → complete_step → send`, and
//! idles on the channel when nothing runs.
//!
//! A job's end comes from the engine's side (stop token, token limit, context) or the client's:
//! a handler that found a stop string, or whose client disconnected, drops its event receiver,
//! and the worker cancels the sequence at its next step.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use tokio::sync::mpsc::UnboundedSender;

use crate::backend::Logits;
use crate::chat_template::ChatTemplate;
use crate::engine::{AnyEngine, BackendKind, EngineOptions, StepItem};
use crate::gguf::GgufFile;
use crate::sampler::{Sampler, SamplingParams};
use crate::sched::{Finish, KvBlocks, Rejection, Request, SchedConfig, Scheduler, SeqId, StepLimits};
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
    pub events: UnboundedSender<(usize, Event)>,
    /// Set by the handler when it ended the choice itself (a stop string): the worker cancels it.
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

/// Progress counters the worker publishes for `/live` and `/metrics`.
#[derive(Debug, Default)]
pub struct Heartbeat {
    pub ready: AtomicBool,
    /// The worker thread ended on a panic: nothing will be served again.
    pub dead: AtomicBool,
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
    epoch: Option<Instant>,
}

impl Heartbeat {
    pub fn new() -> Heartbeat {
        Heartbeat { epoch: Some(Instant::now()), ..Heartbeat::default() }
    }

    fn now_ms(&self) -> u64 {
        self.epoch.map_or(0, |e| e.elapsed().as_millis() as u64)
    }

    fn beat(&self) {
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

/// How the worker loads and runs the model.
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
    pub backend: &'static str,
}

/// Loads the model and runs the worker loop until `jobs` closes and nothing is left to run.
/// `on_loaded` gets the result of loading (an error ends the worker).
pub fn run(cfg: WorkerConfig, jobs: Receiver<Job>, heartbeat: Arc<Heartbeat>, on_loaded: impl FnOnce(Result<Loaded, String>)) {
    let (engine, sched, tokenizer) = match load(&cfg) {
        Ok((engine, sched, loaded)) => {
            let tok = loaded.tokenizer.clone();
            heartbeat.beat();
            heartbeat.ready.store(true, Ordering::Release);
            on_loaded(Ok(loaded));
            (engine, sched, tok)
        }
        Err(e) => return on_loaded(Err(e)),
    };
    let hb = heartbeat.clone();
    let worker = Worker { engine, sched, active: HashMap::new(), next_id: 0, heartbeat, vocab: tokenizer.vocab_size() };
    // A panic in the engine must not leave a healthy-looking server behind: mark it dead, so
    // `/ready` and `/live` fail. The handlers' channels close with the worker and they answer 503.
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| worker.run(jobs))).is_err() {
        hb.ready.store(false, Ordering::Release);
        hb.dead.store(true, Ordering::Release);
    }
}

fn load(cfg: &WorkerConfig) -> Result<(Box<dyn AnyEngine>, Scheduler, Loaded), String> {
    let path = cfg.model.display();
    let file = GgufFile::open(&cfg.model).map_err(|e| format!("{path}: {e}"))?;
    let tokenizer = Tokenizer::from_gguf(file.metadata()).map_err(|e| format!("{path}: tokenizer: {e}"))?;
    let template = match ChatTemplate::from_gguf(file.metadata()).map_err(|e| format!("{path}: chat template: {e}"))? {
        Some(t) => t,
        None => ChatTemplate::chatml().map_err(|e| format!("the built-in ChatML template: {e}"))?,
    };
    drop(file);
    let opts = EngineOptions {
        context: cfg.context,
        slots: cfg.slots.max(1),
        prefill_chunk: cfg.prefill_chunk.max(1),
        ..EngineOptions::default()
    };
    let engine = crate::engine::open(&cfg.model, cfg.backend, opts).map_err(|e| format!("{path}: {e}"))?;
    let served = engine.options();
    if tokenizer.vocab_size() > engine.config().vocab {
        return Err(format!(
            "{path}: the tokenizer has {} tokens but the model's vocabulary is {}",
            tokenizer.vocab_size(),
            engine.config().vocab
        ));
    }
    let limits = StepLimits::new(cfg.max_batch_tokens, served.prefill_chunk, served.slots, None).map_err(|e| e.to_string())?;
    // The engine's paged cache, block for block: a sequence's table from the scheduler is what
    // the engine reads its KV through, so blocks of a shared prompt prefix are computed once.
    let kv = KvBlocks::new(engine.total_blocks(), engine.block_size()).map_err(|e| e.to_string())?;
    let sched_cfg = SchedConfig { limits, context: served.context, max_queue: cfg.max_queue, retry_after_secs: 1 };
    let sched = Scheduler::new(sched_cfg, kv).map_err(|e| e.to_string())?;
    let loaded = Loaded { tokenizer: Arc::new(tokenizer), template, context: served.context, backend: engine.backend_name() };
    Ok((engine, sched, loaded))
}

struct Active {
    sampler: Sampler,
    stop_tokens: Vec<u32>,
    index: usize,
    events: UnboundedSender<(usize, Event)>,
    cancel: Arc<AtomicBool>,
    submitted: Instant,
    first_token: bool,
}

struct Worker {
    engine: Box<dyn AnyEngine>,
    sched: Scheduler,
    active: HashMap<SeqId, Active>,
    next_id: SeqId,
    heartbeat: Arc<Heartbeat>,
    vocab: usize,
}

impl Worker {
    fn run(mut self, jobs: Receiver<Job>) {
        let mut open = true;
        loop {
            // Idle: wait for work (waking now and then to keep the heartbeat honest). Busy:
            // take what arrived without waiting.
            if self.sched.is_idle() {
                if !open {
                    return;
                }
                self.heartbeat.beat();
                match jobs.recv_timeout(Duration::from_millis(500)) {
                    Ok(job) => self.submit(job),
                    Err(RecvTimeoutError::Timeout) => continue,
                    Err(RecvTimeoutError::Disconnected) => return,
                }
            }
            loop {
                match jobs.try_recv() {
                    Ok(job) => self.submit(job),
                    Err(std::sync::mpsc::TryRecvError::Empty) => break,
                    Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                        open = false;
                        break;
                    }
                }
            }
            self.drop_abandoned();
            let stepped = self.step();
            self.publish();
            if !stepped && !self.sched.is_idle() {
                // Work is queued but nothing could run (every KV block held by running
                // sequences): wait for a job or a moment instead of spinning.
                match jobs.recv_timeout(Duration::from_millis(10)) {
                    Ok(job) => self.submit(job),
                    Err(RecvTimeoutError::Timeout) => {}
                    Err(RecvTimeoutError::Disconnected) => open = false,
                }
            }
        }
    }

    fn submit(&mut self, job: Job) {
        let id = self.next_id;
        self.next_id += 1;
        let prompt_len = job.prompt.len() as u64;
        let req = Request { id, prompt: job.prompt, max_new_tokens: job.max_tokens, limits: Default::default() };
        match self.sched.submit(req) {
            Ok(_) => {
                self.heartbeat.prompt_tokens.fetch_add(prompt_len, Ordering::Relaxed);
                let active = Active {
                    sampler: Sampler::new(job.sampling),
                    stop_tokens: job.stop_tokens,
                    index: job.index,
                    events: job.events,
                    cancel: job.cancel,
                    submitted: Instant::now(),
                    first_token: false,
                };
                self.active.insert(id, active);
            }
            Err(rejection) => {
                let _ = job.events.send((job.index, rejected(&rejection)));
            }
        }
        self.publish();
    }

    /// Cancels the sequences whose client stopped listening or that the handler ended.
    fn drop_abandoned(&mut self) {
        let gone: Vec<SeqId> =
            self.active.iter().filter(|(_, a)| a.events.is_closed() || a.cancel.load(Ordering::Relaxed)).map(|(&id, _)| id).collect();
        for id in gone {
            self.sched.cancel(id);
            self.active.remove(&id);
        }
    }

    /// One engine step over the scheduler's plan; false when there was nothing to run.
    fn step(&mut self) -> bool {
        let plan = self.sched.schedule();
        if plan.is_empty() {
            return false;
        }
        let result = {
            let mut items = Vec::with_capacity(plan.chunks.len());
            let mut missing = None;
            for c in &plan.chunks {
                let blocks = self.sched.block_table(c.seq);
                let tokens = self.sched.tokens(c.seq).and_then(|t| t.get(c.start_pos..c.start_pos + c.len));
                match (blocks, tokens) {
                    (Some(blocks), Some(tokens)) => items.push(StepItem {
                        blocks,
                        start_pos: c.start_pos as u32,
                        tokens,
                        logits: if c.logits { Logits::Last } else { Logits::None },
                    }),
                    _ => missing = Some(c.seq),
                }
            }
            match missing {
                Some(seq) => Err(format!("the scheduler planned sequence {seq} but holds no tokens or block for it")),
                None => self.engine.step(&items).map_err(|e| e.to_string()),
            }
        };
        let logits = match result {
            Ok(l) => l,
            Err(e) => {
                self.fail_plan(&plan.chunks.iter().map(|c| c.seq).collect::<Vec<_>>(), &e);
                return true;
            }
        };
        let rows = plan.logit_chunks().count();
        if logits.len() != rows * self.vocab {
            let msg = format!("the engine returned {} logits for {rows} rows of {}", logits.len(), self.vocab);
            self.fail_plan(&plan.chunks.iter().map(|c| c.seq).collect::<Vec<_>>(), &msg);
            return true;
        }
        let mut sampled = Vec::with_capacity(rows);
        for (row, c) in plan.logit_chunks().enumerate() {
            let logits = &logits[row * self.vocab..(row + 1) * self.vocab];
            // A sequence cancelled since `schedule` still needs a placeholder row.
            sampled.push(self.active.get_mut(&c.seq).map_or(0, |a| a.sampler.sample(logits)));
        }
        let cached: HashMap<SeqId, usize> =
            plan.logit_chunks().filter_map(|c| self.sched.cached_tokens(c.seq).map(|n| (c.seq, n))).collect();
        let emitted = match self.sched.complete_step(&plan, &sampled) {
            Ok(e) => e,
            Err(e) => {
                self.fail_plan(&plan.chunks.iter().map(|c| c.seq).collect::<Vec<_>>(), &e.to_string());
                return true;
            }
        };
        self.heartbeat.steps.fetch_add(1, Ordering::Relaxed);
        self.heartbeat.beat();
        for e in emitted {
            let Some(a) = self.active.get_mut(&e.seq) else { continue };
            if !a.first_token {
                a.first_token = true;
                self.heartbeat.ttft_micros_sum.fetch_add(a.submitted.elapsed().as_micros() as u64, Ordering::Relaxed);
                self.heartbeat.ttft_count.fetch_add(1, Ordering::Relaxed);
            }
            self.heartbeat.completion_tokens.fetch_add(1, Ordering::Relaxed);
            let _ = a.events.send((a.index, Event::Token(e.token)));
            let end = if a.stop_tokens.contains(&e.token) {
                Some(JobEnd::StopToken)
            } else if matches!(e.finish, Some(Finish::Length | Finish::Context)) {
                Some(JobEnd::Length)
            } else {
                None
            };
            if let Some(end) = end {
                let cached_tokens = cached.get(&e.seq).copied().unwrap_or(0);
                let _ = a.events.send((a.index, Event::Finished { end, cached_tokens }));
                self.sched.cancel(e.seq);
                self.active.remove(&e.seq);
            }
        }
        true
    }

    /// A step failed: its sequences get a 500 and leave; the others go on.
    fn fail_plan(&mut self, seqs: &[SeqId], message: &str) {
        self.heartbeat.failed_steps.fetch_add(1, Ordering::Relaxed);
        let error = ApiError::new(ErrorKind::Internal, format!("the engine failed: {message}"));
        for &id in seqs {
            self.sched.cancel(id);
            if let Some(a) = self.active.remove(&id) {
                let _ = a.events.send((a.index, Event::Failed { error: error.clone(), retry_after: None }));
            }
        }
        self.heartbeat.beat();
    }

    fn publish(&self) {
        self.heartbeat.running.store(self.sched.running() as u64, Ordering::Relaxed);
        self.heartbeat.waiting.store(self.sched.waiting() as u64, Ordering::Relaxed);
    }
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
