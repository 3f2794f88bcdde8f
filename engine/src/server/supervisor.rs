//! The supervisor: owns the scheduler, the poison quarantine and the request bookkeeping, and
//! runs the engine in a child process (see [`super::child`]) one step at a time. A hung CUDA
//! kernel can only be ended with its process, so the engine is a child the supervisor can kill
//! without losing the queue: requests waiting for admission, and the KV block bookkeeping, live
//! here and outlast a restart.
//!
//! While a step is in flight the supervisor reads the child's progress board every
//! [`POLL`]; no change for the stall timeout is a stall: a report is written, the child is
//! killed, the batch shape goes to the quarantine, and a new child is started. Every running
//! sequence's KV died with the child: one whose client has seen no output yet runs again from
//! its prompt on the new child, once, under the quarantine's limits (see [`super::requeue`]);
//! the others fail with 503. A child that dies or breaks the pipe goes the same way with a crash
//! report. Restarts that keep failing back off.

use std::collections::{HashMap, HashSet, VecDeque};
use std::io::{BufReader, BufWriter};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::mpsc::UnboundedSender;

use super::jobs::{Event, Job, JobEnd, Loaded, WorkerConfig, quarantined, rejected};
use super::protocol::{ChildConfig, FromChild, ToChild, WireChunk, backend_name, read_frame, write_frame};
use super::requeue::{AfterRestart, InFlight, after_restart};
use super::scripted::Script;
use super::state::Heartbeat;
use super::telemetry::{ChunkTrace, GenAiLabels, RequestEnd, RequestTrace};
use super::watchdog::{FailureKind, FailureReport, RecentProgress, ReportChunk, StallClock, backoff};
use crate::chat_template::ChatTemplate;
use crate::gguf::GgufFile;
use crate::model::KernelLaunchFailure;
use crate::monitor::BoardFile;
use crate::sampler::SamplingParams;
use crate::sched::{Finish, KvBlocks, Quarantine, Request, SchedConfig, Scheduler, SeqId, SeqLimits, StepLimits, StepPlan, Verdict};
use crate::tokenizer::Tokenizer;
use crate::wire::{ApiError, ErrorKind};

/// How often the board is read while a step is in flight.
pub const POLL: Duration = Duration::from_millis(100);
/// Restart attempts in a row before the supervisor gives up: with the back-off, about 25 s of
/// retrying, time for a GPU's memory to come back after its process was killed.
const MAX_RESTART_ATTEMPTS: u32 = 8;
/// The first wait between failed restarts, doubled each time up to the cap.
const BACKOFF_BASE: Duration = Duration::from_millis(250);
const BACKOFF_CAP: Duration = Duration::from_secs(10);
/// How long a child may take to exit after `Shutdown` before it is killed.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(5);

/// The program (and leading arguments) that runs the engine child: `brink-agent engine-child`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineCommand {
    pub program: PathBuf,
    pub args: Vec<String>,
}

#[derive(Clone, Debug)]
pub struct SupervisorConfig {
    pub worker: WorkerConfig,
    pub engine: EngineCommand,
    pub stall_timeout: Duration,
    /// Where stall and crash reports go.
    pub stall_dir: PathBuf,
    /// Test-only fault for the child (`hang:layer=N[,min-rows=R]`, `fail:…`).
    pub fault: Option<String>,
    /// The smallest prefill chunk the quarantine serves a poison prompt in before refusing it.
    pub quarantine_min_chunk: usize,
    /// Stalls of one prompt length after which it is refused.
    pub quarantine_max_strikes: u32,
    /// Times a request whose client has seen no output may run again after the engine died or
    /// stalled under it; 0: such requests fail with 503 like the rest.
    pub requeue_limit: u32,
}

enum ChildMsg {
    Frame(FromChild),
    /// The pipe ended or broke: why.
    Gone(String),
}

/// The served geometry a child reported.
#[derive(Clone, Debug, PartialEq)]
struct Geometry {
    context: usize,
    slots: usize,
    prefill_chunk: usize,
    blocks: usize,
    block_size: usize,
    /// Blocks of a sequence's ring in the sliding-window layers; 0: none (prefix reuse on).
    ring_blocks: usize,
    backend: String,
}

/// A running engine child and its pipes.
struct EngineChild {
    process: Child,
    stdin: BufWriter<ChildStdin>,
    rx: Receiver<ChildMsg>,
    pid: u32,
}

impl EngineChild {
    fn spawn(cmd: &EngineCommand, cfg: &ChildConfig) -> Result<EngineChild, String> {
        let mut process = Command::new(&cmd.program)
            .args(&cmd.args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("starting the engine child {}: {e}", cmd.program.display()))?;
        let pid = process.id();
        let (Some(stdin), Some(stdout)) = (process.stdin.take(), process.stdout.take()) else {
            let _ = process.kill();
            let _ = process.wait();
            return Err("the engine child has no pipes".into());
        };
        let (tx, rx) = mpsc::channel();
        std::thread::Builder::new()
            .name(format!("brink-engine-{pid}"))
            .spawn(move || {
                let mut r = BufReader::new(stdout);
                loop {
                    match read_frame::<FromChild>(&mut r) {
                        Ok(m) => {
                            if tx.send(ChildMsg::Frame(m)).is_err() {
                                return;
                            }
                        }
                        Err(e) => {
                            let _ = tx.send(ChildMsg::Gone(e.to_string()));
                            return;
                        }
                    }
                }
            })
            .map_err(|e| format!("starting the engine pipe reader: {e}"))?;
        let mut child = EngineChild { process, stdin: BufWriter::new(stdin), rx, pid };
        child.send(&ToChild::Load(cfg.clone()))?;
        Ok(child)
    }

    fn send(&mut self, msg: &ToChild) -> Result<(), String> {
        write_frame(&mut self.stdin, msg).map_err(|e| format!("writing to the engine child: {e}"))
    }

    /// Waits for the loaded engine's geometry (loading a large model takes minutes: no timeout,
    /// but a child that dies while loading ends the wait).
    fn wait_ready(&mut self) -> Result<Geometry, String> {
        match self.rx.recv() {
            Ok(ChildMsg::Frame(FromChild::Ready { context, slots, prefill_chunk, blocks, block_size, ring_blocks, backend, .. })) => {
                Ok(Geometry { context, slots, prefill_chunk, blocks, block_size, ring_blocks, backend })
            }
            Ok(ChildMsg::Frame(FromChild::LoadFailed(e))) => Err(e),
            Ok(ChildMsg::Frame(other)) => Err(format!("the engine child answered {other:?} instead of Ready")),
            Ok(ChildMsg::Gone(why)) => Err(format!("the engine child exited while loading ({why}; {})", self.exit_status())),
            Err(_) => Err("the engine child's pipe reader ended".into()),
        }
    }

    /// The exit status once the process is gone (it is waited for briefly, then killed).
    fn exit_status(&mut self) -> String {
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(2) {
            match self.process.try_wait() {
                Ok(Some(status)) => return status.to_string(),
                Ok(None) => std::thread::sleep(Duration::from_millis(10)),
                Err(e) => return format!("unknown exit status ({e})"),
            }
        }
        self.kill()
    }

    /// SIGKILL (a hung kernel ends only with its process), then reaps it.
    fn kill(&mut self) -> String {
        let _ = self.process.kill();
        match self.process.wait() {
            Ok(status) => status.to_string(),
            Err(e) => format!("unknown exit status ({e})"),
        }
    }

    /// Asks the child to exit; kills it if it does not within `wait`.
    fn shutdown(mut self, wait: Duration) {
        let _ = self.send(&ToChild::Shutdown);
        let t0 = Instant::now();
        while t0.elapsed() < wait {
            if let Ok(Some(_)) = self.process.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        eprintln!("brink serve: the engine child did not exit within {wait:?}; killing it");
        self.kill();
    }
}

impl Drop for EngineChild {
    fn drop(&mut self) {
        // Never leave a child behind (a no-op once it was reaped).
        if let Ok(None) = self.process.try_wait() {
            self.kill();
        }
    }
}

/// The supervisor's view of one choice of a request.
struct Active {
    sampling: SamplingParams,
    stop_tokens: Vec<u32>,
    index: usize,
    events: UnboundedSender<(usize, Event)>,
    cancel: Arc<AtomicBool>,
    submitted: Instant,
    first_token: bool,
    prompt_len: usize,
    request_id: String,
    gen_ai: GenAiLabels,
    /// When the first token came (the time per output token counts from it).
    first_token_at: Option<Instant>,
    /// The time to first token is observed once per request, also when it runs again.
    ttft_recorded: bool,
    generated: u64,
    trace: RequestTrace,
    stream: bool,
    /// Times it ran again after a restart.
    requeued: u32,
    /// Test-only scripted tokens still to generate in place of sampled ones (`scripted`).
    scripted: VecDeque<u32>,
}

enum StepOutcome {
    Sampled(Vec<u32>),
    /// The step failed in the child, on a kernel launch when the second part says so.
    Failed(String, Option<KernelLaunchFailure>),
    Stalled(String),
    Gone(String),
}

/// Loads the tokenizer and template here, starts the engine child, and serves `jobs` until the
/// channel closes and nothing is left to run. `on_loaded` gets the first load's result (an error
/// ends the supervisor).
pub fn run(cfg: SupervisorConfig, jobs: Receiver<Job>, hb: Arc<Heartbeat>, on_loaded: impl FnOnce(Result<Loaded, String>)) {
    let mut sup = match Supervisor::start(cfg, hb.clone()) {
        Ok((sup, loaded)) => {
            on_loaded(Ok(loaded));
            // Ready only once the handlers can see the tokenizer and template.
            hb.ready.store(true, Ordering::Release);
            sup
        }
        Err(e) => return on_loaded(Err(e)),
    };
    // A panic must not leave a healthy-looking server behind: mark it dead, so `/ready` and
    // `/live` fail; the handlers' channels close with the supervisor and they answer 503.
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| sup.run(jobs)));
    if outcome.is_err() {
        hb.dead.store(true, Ordering::Release);
    }
    hb.ready.store(false, Ordering::Release);
    if let Some(child) = sup.child.take() {
        child.shutdown(SHUTDOWN_WAIT);
    }
    hb.engine_pid.store(0, Ordering::Relaxed);
    let _ = std::fs::remove_file(&sup.board_path);
}

struct Supervisor {
    cfg: SupervisorConfig,
    child_cfg: ChildConfig,
    board: BoardFile,
    board_path: PathBuf,
    child: Option<EngineChild>,
    geometry: Geometry,
    sched: Scheduler,
    quarantine: Quarantine,
    active: HashMap<SeqId, Active>,
    /// Sequences whose sampler the current child holds.
    known: HashSet<SeqId>,
    /// Sequences gone since the last step, for the child to drop their samplers.
    ended: Vec<SeqId>,
    next_id: SeqId,
    step_no: u64,
    hb: Arc<Heartbeat>,
    /// Engine failures since the last successful step (for the back-off).
    failures: u32,
    reports: u64,
    recent: RecentProgress,
    /// Test-only scripted replies (`BRINK_TEST_SCRIPT_REPLY`).
    script: Option<Script>,
}

fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// A board file name no other server (in this process or another) uses.
fn board_path() -> PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    std::env::temp_dir().join(format!("brink-board-{}-{}-{}", std::process::id(), unix_ms(), N.fetch_add(1, Ordering::Relaxed)))
}

fn read_front_end(model: &std::path::Path) -> Result<(Tokenizer, ChatTemplate), String> {
    let path = model.display();
    let file = GgufFile::open(model).map_err(|e| format!("{path}: {e}"))?;
    let tokenizer = Tokenizer::from_gguf(file.metadata()).map_err(|e| format!("{path}: tokenizer: {e}"))?;
    let template = match ChatTemplate::from_gguf(file.metadata()).map_err(|e| format!("{path}: chat template: {e}"))? {
        Some(t) => t,
        None => ChatTemplate::chatml().map_err(|e| format!("the built-in ChatML template: {e}"))?,
    };
    Ok((tokenizer, template))
}

impl Supervisor {
    fn start(cfg: SupervisorConfig, hb: Arc<Heartbeat>) -> Result<(Supervisor, Loaded), String> {
        let w = &cfg.worker;
        let (tokenizer, template) = read_front_end(&w.model)?;
        let board_path = board_path();
        let board = BoardFile::create(&board_path).map_err(|e| format!("progress board {}: {e}", board_path.display()))?;
        let child_cfg = ChildConfig {
            model: w.model.clone(),
            backend: backend_name(w.backend).into(),
            slots: w.slots.max(1),
            context: w.context,
            prefill_chunk: w.prefill_chunk.max(1),
            full_window_kv: w.full_window_kv,
            board: board_path.clone(),
            fault: cfg.fault.clone(),
        };
        // No supervisor, no board: it goes with any error from here on.
        let drop_board = |e: String| {
            let _ = std::fs::remove_file(&board_path);
            e
        };
        let t0 = Instant::now();
        let mut child = EngineChild::spawn(&cfg.engine, &child_cfg).map_err(drop_board)?;
        let geometry = child.wait_ready().map_err(drop_board)?;
        eprintln!(
            "brink serve: engine child {} ready in {:.2} s ({} backend, {} slots of {} positions)",
            child.pid,
            t0.elapsed().as_secs_f64(),
            geometry.backend,
            geometry.slots,
            geometry.context
        );
        let limits =
            StepLimits::new(w.max_batch_tokens, geometry.prefill_chunk, geometry.slots, None).map_err(|e| drop_board(e.to_string()))?;
        // The engine's paged cache, block for block: a sequence's table from the scheduler is
        // what the engine reads its KV through, so blocks of a shared prompt prefix are
        // computed once (and the bookkeeping outlives an engine restart). Not when the engine's
        // sliding-window layers keep a ring per sequence (the window-only layout): a ring is
        // not shared, so neither is a prefix. The scheduler's rings (below its max_seqs, the
        // engine's slots) go with each chunk.
        let prefix_reuse = geometry.ring_blocks == 0;
        let kv = KvBlocks::with_prefix_reuse(geometry.blocks, geometry.block_size, prefix_reuse).map_err(|e| drop_board(e.to_string()))?;
        let sched_cfg = SchedConfig { limits, context: geometry.context, max_queue: w.max_queue, retry_after_secs: 1 };
        let sched = Scheduler::new(sched_cfg, kv).map_err(|e| drop_board(e.to_string()))?;
        let loaded = Loaded { tokenizer: Arc::new(tokenizer), template, context: geometry.context, backend: geometry.backend.clone() };
        let script = Script::from_switch(&loaded.tokenizer).map_err(drop_board)?;
        let quarantine = Quarantine::new(cfg.quarantine_min_chunk, cfg.quarantine_max_strikes);
        hb.beat();
        hb.engine_pid.store(child.pid as u64, Ordering::Relaxed);
        let sup = Supervisor {
            cfg,
            child_cfg,
            board,
            board_path,
            child: Some(child),
            geometry,
            sched,
            quarantine,
            active: HashMap::new(),
            known: HashSet::new(),
            ended: Vec::new(),
            next_id: 0,
            step_no: 0,
            hb,
            failures: 0,
            reports: 0,
            recent: RecentProgress::new(16),
            script,
        };
        Ok((sup, loaded))
    }

    fn run(&mut self, jobs: Receiver<Job>) {
        let mut open = true;
        loop {
            if self.child.is_none() {
                // The engine could not be restarted: `dead` is set and the waiting requests failed.
                return;
            }
            self.watch_idle_child();
            if self.sched.is_idle() {
                if !open {
                    return;
                }
                self.hb.beat();
                match jobs.recv_timeout(Duration::from_millis(200)) {
                    Ok(job) => self.submit(job),
                    Err(RecvTimeoutError::Timeout) => continue,
                    Err(RecvTimeoutError::Disconnected) => return,
                }
            }
            loop {
                match jobs.try_recv() {
                    Ok(job) => self.submit(job),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        open = false;
                        break;
                    }
                }
            }
            self.drop_abandoned();
            let stepped = self.step();
            self.publish();
            if !stepped && !self.sched.is_idle() {
                // Work is queued but nothing could run: wait for a job or a moment, not spin.
                match jobs.recv_timeout(Duration::from_millis(10)) {
                    Ok(job) => self.submit(job),
                    Err(RecvTimeoutError::Timeout) => {}
                    Err(RecvTimeoutError::Disconnected) => open = false,
                }
            }
        }
    }

    /// A child that died between steps (no step in flight) is restarted before it is needed.
    fn watch_idle_child(&mut self) {
        let Some(child) = &self.child else { return };
        let why = match child.rx.try_recv() {
            Ok(ChildMsg::Gone(why)) => why,
            Ok(ChildMsg::Frame(m)) => format!("an unexpected message between steps: {m:?}"),
            Err(TryRecvError::Empty) => return,
            Err(TryRecvError::Disconnected) => "the pipe reader ended".into(),
        };
        self.engine_failed(FailureKind::Crash, why, None);
    }

    fn submit(&mut self, job: Job) {
        let id = self.next_id;
        self.next_id += 1;
        let prompt_len = job.prompt.len();
        let limits = match self.quarantine.check(prompt_len) {
            Verdict::Clear => SeqLimits::default(),
            Verdict::Limit(l) => {
                eprintln!("brink serve: a {prompt_len}-token prompt matches a stalled shape: serving it under {l:?}");
                l
            }
            Verdict::Refuse(msg) => {
                let _ = job.events.send((job.index, quarantined(msg)));
                return;
            }
        };
        let scripted = self.script.as_ref().map(|s| s.reply_for(&job.prompt)).unwrap_or_default();
        let req = Request { id, prompt: job.prompt, max_new_tokens: job.max_tokens, limits };
        match self.sched.submit(req) {
            Ok(_) => {
                self.hb.prompt_tokens.fetch_add(prompt_len as u64, Ordering::Relaxed);
                let _ = job.events.send((job.index, Event::Admitted));
                let trace = self.hb.telemetry.start_request(&job.gen_ai, &job.request_id, prompt_len, job.trace_parent.as_ref());
                let active = Active {
                    sampling: job.sampling,
                    stop_tokens: job.stop_tokens,
                    index: job.index,
                    events: job.events,
                    cancel: job.cancel,
                    submitted: Instant::now(),
                    first_token: false,
                    prompt_len,
                    request_id: job.request_id,
                    gen_ai: job.gen_ai,
                    first_token_at: None,
                    ttft_recorded: false,
                    generated: 0,
                    trace,
                    stream: job.stream,
                    requeued: 0,
                    scripted,
                };
                self.active.insert(id, active);
            }
            Err(rejection) => {
                let _ = job.events.send((job.index, rejected(&rejection)));
            }
        }
        self.publish();
    }

    /// Ends a sequence on both sides: the scheduler forgets it, the child drops its sampler.
    fn end(&mut self, id: SeqId) -> Option<Active> {
        self.sched.cancel(id);
        if self.known.remove(&id) {
            self.ended.push(id);
        }
        self.active.remove(&id)
    }

    /// Cancels the sequences whose client stopped listening or that the handler ended.
    fn drop_abandoned(&mut self) {
        let gone: Vec<SeqId> =
            self.active.iter().filter(|(_, a)| a.events.is_closed() || a.cancel.load(Ordering::Relaxed)).map(|(&id, _)| id).collect();
        for id in gone {
            let cached = self.sched.cached_tokens(id).unwrap_or(0);
            if let Some(a) = self.end(id) {
                // The handler ends a choice at a stop string; a closed channel is a client gone.
                let reason = if a.cancel.load(Ordering::Relaxed) { "stop" } else { "cancelled" };
                self.finish_telemetry(a, cached, reason);
            }
        }
    }

    /// A request's metrics and the end of its span.
    fn finish_telemetry(&self, a: Active, cached_tokens: usize, finish_reason: &'static str) {
        let now = Instant::now();
        let end = RequestEnd {
            input_tokens: a.prompt_len as u64,
            output_tokens: a.generated,
            cached_tokens: cached_tokens as u64,
            duration: now.duration_since(a.submitted),
            decode_time: a.first_token_at.map_or(Duration::ZERO, |t| now.duration_since(t)),
            finish_reason,
        };
        self.hb.telemetry.finish_request(&a.gen_ai, a.trace, &end);
    }

    /// The prefill chunks of a plan, each a child span of its request's span.
    fn chunk_spans(&self, plan: &StepPlan, step: u64) -> (Vec<ChunkTrace>, u64, u64) {
        let (mut spans, mut prefill, mut decode) = (Vec::new(), 0, 0);
        for c in &plan.chunks {
            match self.active.get(&c.seq) {
                Some(a) if c.start_pos < a.prompt_len => {
                    prefill += c.len as u64;
                    spans.push(self.hb.telemetry.start_chunk(&a.trace, step, c.start_pos, c.len));
                }
                _ => decode += c.len as u64,
            }
        }
        (spans, prefill, decode)
    }

    /// One engine step over the scheduler's plan; false when there was nothing to run.
    fn step(&mut self) -> bool {
        let plan = self.sched.schedule();
        if plan.is_empty() {
            return false;
        }
        let mut chunks = Vec::with_capacity(plan.chunks.len());
        for c in &plan.chunks {
            let tokens = self.sched.tokens(c.seq).and_then(|t| t.get(c.start_pos..c.start_pos + c.len));
            let blocks = self.sched.block_table(c.seq);
            let (Some(tokens), Some(blocks), Some(ring)) = (tokens, blocks, self.sched.ring(c.seq)) else {
                let msg = format!("the scheduler planned sequence {} but holds no tokens or blocks for it", c.seq);
                self.fail_plan(&plan, &msg);
                return true;
            };
            // The child learns a sequence's sampling with its first chunk.
            let sampling =
                self.known.insert(c.seq).then(|| self.active.get(&c.seq).map_or(SamplingParams::default(), |a| a.sampling).into());
            chunks.push(WireChunk {
                seq: c.seq,
                tokens: tokens.to_vec(),
                start_pos: c.start_pos,
                blocks: blocks.to_vec(),
                ring,
                logits: c.logits,
                sampling,
            });
        }
        self.step_no += 1;
        let step = self.step_no;
        let (spans, prefill_tokens, decode_tokens) = self.chunk_spans(&plan, step);
        let t0 = Instant::now();
        let beats = self.board.board().snapshot().beats;
        let ended = std::mem::take(&mut self.ended);
        let sent = match self.child.as_mut() {
            Some(child) => child.send(&ToChild::Step { step, chunks, ended }),
            None => Err("no engine child".into()),
        };
        let outcome = match sent {
            Ok(()) => self.await_step(step, beats),
            Err(e) => StepOutcome::Gone(e),
        };
        // The chunks' spans end with the step, before their requests' spans may.
        match &outcome {
            StepOutcome::Sampled(_) => {
                self.hb.telemetry.end_chunks(spans, None);
                self.hb.telemetry.record_step(prefill_tokens, decode_tokens, t0.elapsed());
            }
            StepOutcome::Failed(e, _) | StepOutcome::Stalled(e) | StepOutcome::Gone(e) => self.hb.telemetry.end_chunks(spans, Some(e)),
        }
        match outcome {
            StepOutcome::Sampled(tokens) => self.complete(&plan, &tokens),
            StepOutcome::Failed(msg, launch) => {
                if let Some(l) = &launch {
                    self.hb.telemetry.record_kernel_launch_error(l);
                }
                match launch {
                    // The child's CUDA context is unusable after a sticky error: treat it as a
                    // crash (kill, report, quarantine the shape, restart) rather than fail every
                    // later step on the same dead context.
                    Some(l) if l.sticky => {
                        self.engine_failed(FailureKind::Crash, format!("a sticky CUDA error in kernel {}: {msg}", l.kernel), Some(&plan))
                    }
                    _ => self.fail_plan(&plan, &msg),
                }
            }
            StepOutcome::Stalled(detail) => self.engine_failed(FailureKind::Stall, detail, Some(&plan)),
            StepOutcome::Gone(detail) => self.engine_failed(FailureKind::Crash, detail, Some(&plan)),
        }
        true
    }

    /// Waits for step `step`'s answer, watching the board.
    fn await_step(&mut self, step: u64, beats: u64) -> StepOutcome {
        let mut clock = StallClock::start(self.cfg.stall_timeout, beats, Instant::now());
        let mut last = beats;
        loop {
            let Some(child) = &self.child else { return StepOutcome::Gone("no engine child".into()) };
            match child.rx.recv_timeout(POLL) {
                Ok(ChildMsg::Frame(FromChild::Sampled { step: s, tokens })) if s == step => return StepOutcome::Sampled(tokens),
                Ok(ChildMsg::Frame(FromChild::StepFailed { step: s, message, launch })) if s == step => {
                    return StepOutcome::Failed(message, launch);
                }
                Ok(ChildMsg::Frame(other)) => return StepOutcome::Gone(format!("an unexpected answer to step {step}: {other:?}")),
                Ok(ChildMsg::Gone(why)) => return StepOutcome::Gone(why),
                Err(RecvTimeoutError::Disconnected) => return StepOutcome::Gone("the pipe reader ended".into()),
                Err(RecvTimeoutError::Timeout) => {
                    let snap = self.board.board().snapshot();
                    self.recent.push(snap);
                    if snap.beats != last {
                        // A long step that keeps marking layers is progress, for `/live` too.
                        last = snap.beats;
                        self.hb.beat();
                    }
                    let now = Instant::now();
                    if clock.observe(snap.beats, now) {
                        return StepOutcome::Stalled(format!("no progress for {:.1} s", clock.quiet_for(now).as_secs_f64()));
                    }
                }
            }
        }
    }

    /// Applies a step's sampled tokens and sends them to their requests.
    fn complete(&mut self, plan: &StepPlan, sampled: &[u32]) {
        let cached: HashMap<SeqId, usize> =
            plan.logit_chunks().filter_map(|c| self.sched.cached_tokens(c.seq).map(|n| (c.seq, n))).collect();
        let mut sampled = sampled.to_vec();
        for (token, c) in sampled.iter_mut().zip(plan.logit_chunks()) {
            if let Some(t) = self.active.get_mut(&c.seq).and_then(|a| a.scripted.pop_front()) {
                *token = t;
            }
        }
        let emitted = match self.sched.complete_step(plan, &sampled) {
            Ok(e) => e,
            Err(e) => return self.fail_plan(plan, &e.to_string()),
        };
        self.failures = 0;
        self.hb.steps.fetch_add(1, Ordering::Relaxed);
        self.hb.beat();
        for e in emitted {
            let Some(a) = self.active.get_mut(&e.seq) else { continue };
            if !a.first_token {
                a.first_token = true;
                let now = Instant::now();
                a.first_token_at = Some(now);
                if !a.ttft_recorded {
                    a.ttft_recorded = true;
                    let ttft = now.duration_since(a.submitted);
                    self.hb.ttft_micros_sum.fetch_add(ttft.as_micros() as u64, Ordering::Relaxed);
                    self.hb.ttft_count.fetch_add(1, Ordering::Relaxed);
                    self.hb.telemetry.first_token(&a.gen_ai, ttft);
                }
                let cached_tokens = cached.get(&e.seq).copied().unwrap_or(0);
                let _ = a.events.send((a.index, Event::Prefilled { cached_tokens }));
            }
            a.generated += 1;
            self.hb.completion_tokens.fetch_add(1, Ordering::Relaxed);
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
                if let Some(a) = self.end(e.seq) {
                    let reason = if end == JobEnd::StopToken { "stop" } else { "length" };
                    self.finish_telemetry(a, cached_tokens, reason);
                }
            }
        }
    }

    /// A step failed in the engine (which is still up): its sequences get a 500 and leave.
    fn fail_plan(&mut self, plan: &StepPlan, message: &str) {
        self.hb.failed_steps.fetch_add(1, Ordering::Relaxed);
        let error = ApiError::new(ErrorKind::Internal, format!("the engine failed: {message}"));
        for c in &plan.chunks {
            if let Some(a) = self.end(c.seq) {
                let _ = a.events.send((a.index, Event::Failed { error: error.clone(), retry_after: None }));
                self.hb.telemetry.fail_request(a.trace, &error.message);
            }
        }
        self.hb.beat();
    }

    /// The engine stalled or died: report, kill, fail what ran, quarantine the shape, restart.
    fn engine_failed(&mut self, kind: FailureKind, detail: String, plan: Option<&StepPlan>) {
        let t0 = Instant::now();
        self.hb.restarting.store(true, Ordering::Release);
        self.hb.ready.store(false, Ordering::Release);
        let snapshot = self.board.board().snapshot();
        // Kill first: a hung kernel holds the device until its process ends.
        let (pid, status) = match self.child.take() {
            Some(mut c) => (Some(c.pid), c.kill()),
            None => (None, "no child".into()),
        };
        self.hb.engine_pid.store(0, Ordering::Relaxed);
        let detail = match kind {
            FailureKind::Stall => detail,
            FailureKind::Crash => format!("{detail}; {status}"),
        };
        let batch = plan.map_or(Vec::new(), |p| {
            p.chunks
                .iter()
                .map(|c| ReportChunk {
                    request: self.active.get(&c.seq).map_or_else(|| format!("sequence {}", c.seq), |a| a.request_id.clone()),
                    prompt_tokens: self.active.get(&c.seq).map_or(0, |a| a.prompt_len),
                    start: c.start_pos,
                    len: c.len,
                    decode: self.active.get(&c.seq).is_some_and(|a| c.start_pos >= a.prompt_len),
                })
                .collect()
        });
        let stuck = snapshot.stuck();
        let report = FailureReport {
            kind,
            time_unix_ms: unix_ms(),
            stall_timeout_s: self.cfg.stall_timeout.as_secs_f64(),
            detail,
            engine_pid: pid,
            snapshot,
            stuck,
            kernels: if stuck.on_device { "any kernel of the layer" } else { snapshot.op.kernels() },
            batch,
            recent: self.recent.to_vec(),
        };
        eprintln!("{}", report.summary());
        match report.write(&self.cfg.stall_dir, self.reports) {
            Ok(path) => eprintln!("brink serve: report written to {}", path.display()),
            Err(e) => eprintln!("brink serve: writing the report to {}: {e}", self.cfg.stall_dir.display()),
        }
        self.reports += 1;
        if kind == FailureKind::Stall {
            let (layer, op) = report.labels();
            self.hb.record_stall(layer, op);
        }
        if let Some(plan) = plan {
            self.quarantine.record(&self.sched.stall_shape(plan));
            self.hb.quarantined.store(self.quarantine.len() as u64, Ordering::Relaxed);
        }
        // Every running sequence's KV died with the child: those whose client saw nothing run
        // again, the others fail; waiting ones stay queued behind the re-queued.
        let error = ApiError::new(ErrorKind::Overloaded, report.client_message());
        let lost = self.sched.reset_after_restart().unwrap_or_else(|e| {
            eprintln!("brink serve: resetting the scheduler: {e}");
            Vec::new()
        });
        let again = self.requeue_or_fail(lost, &error);
        if let Err(e) = self.sched.requeue(again.clone()) {
            eprintln!("brink serve: re-queueing after the restart: {e}");
            for r in again {
                if let Some(a) = self.active.remove(&r.id) {
                    let _ = a.events.send((a.index, Event::Failed { error: error.clone(), retry_after: Some(1) }));
                    self.hb.telemetry.fail_request(a.trace, &error.message);
                }
            }
        }
        self.known.clear();
        self.ended.clear();
        self.failures += 1;
        self.respawn(t0);
        self.publish();
    }

    /// Sorts the sequences that ran when the engine went: the requests to run again (under the
    /// quarantine's limits for their prompt, which now knows the failed shape) are returned, the
    /// others are answered here: the error, the quarantine's 422, or nothing for a client gone.
    fn requeue_or_fail(&mut self, lost: Vec<Request>, error: &ApiError) -> Vec<Request> {
        let mut again = Vec::new();
        for mut req in lost {
            let Some(mut a) = self.active.remove(&req.id) else { continue };
            if a.events.is_closed() || a.cancel.load(Ordering::Relaxed) {
                let reason = if a.cancel.load(Ordering::Relaxed) { "stop" } else { "cancelled" };
                self.finish_telemetry(a, 0, reason);
                continue;
            }
            let inflight = InFlight { stream: a.stream, generated: a.generated, requeued: a.requeued };
            match after_restart(inflight, self.cfg.requeue_limit) {
                AfterRestart::Requeue => {}
                AfterRestart::Streamed | AfterRestart::LimitReached => {
                    let _ = a.events.send((a.index, Event::Failed { error: error.clone(), retry_after: Some(1) }));
                    self.hb.telemetry.fail_request(a.trace, &error.message);
                    continue;
                }
            }
            req.limits = match self.quarantine.check(req.prompt.len()) {
                Verdict::Clear => SeqLimits::default(),
                Verdict::Limit(l) => l,
                Verdict::Refuse(msg) => {
                    self.hb.telemetry.fail_request(a.trace, &msg);
                    let _ = a.events.send((a.index, quarantined(msg)));
                    continue;
                }
            };
            eprintln!(
                "brink serve: {} ({} prompt tokens) had sent nothing to its client: it runs again on the restarted engine",
                a.request_id, a.prompt_len
            );
            a.requeued += 1;
            a.first_token = false;
            a.first_token_at = None;
            a.generated = 0;
            let _ = a.events.send((a.index, Event::Requeued));
            self.hb.requeued.fetch_add(1, Ordering::Relaxed);
            self.active.insert(req.id, a);
            again.push(req);
        }
        again
    }

    /// Starts a new child, backing off while restarts keep failing; gives up after a bound.
    fn respawn(&mut self, t0: Instant) {
        let mut attempt = 0;
        let mut waited = Duration::ZERO;
        let last_error = loop {
            attempt += 1;
            let wait = backoff(self.failures, BACKOFF_BASE, BACKOFF_CAP);
            if !wait.is_zero() {
                eprintln!("brink serve: {} engine failures in a row: waiting {wait:?} before restarting", self.failures);
                std::thread::sleep(wait);
                waited += wait;
            }
            let started = EngineChild::spawn(&self.cfg.engine, &self.child_cfg).and_then(|mut c| {
                let g = c.wait_ready()?;
                if g != self.geometry {
                    return Err(format!("the restarted engine serves {g:?}, not {:?} as before", self.geometry));
                }
                Ok(c)
            });
            match started {
                Ok(child) => {
                    // The restart's own cost (kill, spawn, load), without the back-off waits.
                    let took = t0.elapsed().saturating_sub(waited);
                    eprintln!(
                        "brink serve: engine restarted (child {}) in {:.2} s ({:.2} s back-off before it)",
                        child.pid,
                        took.as_secs_f64(),
                        waited.as_secs_f64()
                    );
                    self.hb.engine_pid.store(child.pid as u64, Ordering::Relaxed);
                    self.child = Some(child);
                    self.hb.restarts.fetch_add(1, Ordering::Relaxed);
                    self.hb.last_restart_micros.store(took.as_micros() as u64, Ordering::Relaxed);
                    self.hb.beat();
                    self.hb.ready.store(true, Ordering::Release);
                    self.hb.restarting.store(false, Ordering::Release);
                    return;
                }
                Err(e) => {
                    eprintln!("brink serve: restarting the engine failed (attempt {attempt}): {e}");
                    self.failures += 1;
                    if attempt >= MAX_RESTART_ATTEMPTS {
                        break e;
                    }
                }
            }
        };
        // Give up: nothing will run again. The waiting requests hear why; `/live` turns 503.
        let error = ApiError::new(ErrorKind::Overloaded, format!("the engine could not be restarted: {last_error}"));
        for (_, a) in self.active.drain() {
            let _ = a.events.send((a.index, Event::Failed { error: error.clone(), retry_after: None }));
            self.hb.telemetry.fail_request(a.trace, &error.message);
        }
        self.hb.dead.store(true, Ordering::Release);
    }

    fn publish(&self) {
        self.hb.running.store(self.sched.running() as u64, Ordering::Relaxed);
        self.hb.waiting.store(self.sched.waiting() as u64, Ordering::Relaxed);
        self.hb.telemetry.record_kv(&self.sched.kv_stats());
    }
}
