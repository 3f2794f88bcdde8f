//! The engine child process: loads the model, reports progress on the supervisor's board, and
//! runs the steps the supervisor sends, sampling in-process (see [`super::protocol`]). Its stdout
//! is the protocol pipe, so nothing else may print there; logs go to stderr.
//!
//! The child keeps no request state beyond the per-sequence samplers: the scheduler, the queue
//! and the KV bookkeeping live in the supervisor, so killing the child loses only the steps in
//! flight.

use std::collections::HashMap;
use std::io::{BufReader, BufWriter, Read, Write};
use std::sync::Arc;

use super::protocol::{ChildConfig, FrameError, FromChild, ToChild, WireChunk, parse_backend, read_frame, write_frame};
use crate::backend::Logits;
use crate::engine::{AnyEngine, EngineOptions, StepItem};
use crate::model::KernelLaunchFailure;
use crate::monitor::{BoardFile, Fault, Monitor, Op};
use crate::sampler::Sampler;
use crate::sched::SeqId;

/// The child's `main`: the protocol on stdin/stdout. Returns the process exit code.
pub fn main_stdio() -> i32 {
    let stdin = BufReader::new(std::io::stdin().lock());
    let stdout = BufWriter::new(std::io::stdout().lock());
    match run(stdin, stdout) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("brink engine child: {e}");
            1
        }
    }
}

/// Serves the protocol on `input`/`output` until `Shutdown` or the supervisor closes the pipe.
pub fn run(mut input: impl Read, mut output: impl Write) -> Result<(), String> {
    let cfg = match read_frame::<ToChild>(&mut input) {
        Ok(ToChild::Load(cfg)) => cfg,
        Ok(other) => return Err(format!("the first message must be Load, got {other:?}")),
        Err(e) => return Err(format!("reading the load message: {e}")),
    };
    let (mut engine, monitor) = match load(&cfg) {
        Ok(l) => l,
        Err(e) => {
            let _ = write_frame(&mut output, &FromChild::LoadFailed(e.clone()));
            return Err(e);
        }
    };
    let opts = engine.options();
    let ready = FromChild::Ready {
        context: opts.context,
        slots: opts.slots,
        prefill_chunk: opts.prefill_chunk,
        blocks: engine.total_blocks(),
        block_size: engine.block_size(),
        ring_blocks: engine.window_ring().map_or(0, |r| r.blocks),
        vocab: engine.config().vocab,
        backend: claimed_backend(engine.backend_name(), &cfg.backend),
        load_seconds: engine.load_report().seconds,
    };
    write_frame(&mut output, &ready).map_err(|e| format!("sending ready: {e}"))?;
    monitor.board().idle();
    let mut samplers: HashMap<SeqId, Sampler> = HashMap::new();
    loop {
        match read_frame::<ToChild>(&mut input) {
            Ok(ToChild::Step { step, chunks, ended }) => {
                for id in ended {
                    samplers.remove(&id);
                }
                let answer = match run_step(engine.as_mut(), &mut samplers, &chunks) {
                    Ok(tokens) => FromChild::Sampled { step, tokens },
                    Err(StepFailure { message, launch }) => FromChild::StepFailed { step, message, launch },
                };
                monitor.board().idle();
                write_frame(&mut output, &answer).map_err(|e| format!("sending step {step}: {e}"))?;
            }
            Ok(ToChild::Shutdown) | Err(FrameError::Closed) => return Ok(()),
            Ok(ToChild::Load(_)) => return Err("a second Load message".into()),
            Err(e) => return Err(format!("reading a step: {e}")),
        }
    }
}

/// The backend the child reports: its own, unless a test-only switch (compiled only into test
/// builds: [`crate::test_switches`]) makes it lie, so the node agent's backend truth check
/// (which looks from outside) can be shown to catch it: `BRINK_TEST_CLAIM_BACKEND=cuda` claims
/// that backend whatever it runs on; with `BRINK_TEST_SILENT_CPU=1` the engine runs on the CPU
/// and claims the backend it was asked for (a silent CPU fallback).
fn claimed_backend(actual: &str, asked: &str) -> String {
    let claim = match crate::test_switches::get(crate::test_switches::CLAIM_BACKEND) {
        Some(claim) => claim.trim().to_string(),
        None if silent_cpu() => asked.to_string(),
        None => return actual.to_string(),
    };
    eprintln!("brink engine child: TEST-ONLY: claiming backend {claim:?} while running on {actual}");
    claim
}

fn silent_cpu() -> bool {
    crate::test_switches::get(crate::test_switches::SILENT_CPU).is_some_and(|v| v == "1")
}

fn load(cfg: &ChildConfig) -> Result<(Box<dyn AnyEngine>, Arc<Monitor>), String> {
    let fault = cfg.fault.as_deref().map(str::parse::<Fault>).transpose().map_err(|e| format!("--inject-fault: {e}"))?;
    let board = BoardFile::open(&cfg.board).map_err(|e| format!("progress board {}: {e}", cfg.board.display()))?;
    let monitor = Arc::new(Monitor::shared(board).with_fault(fault));
    monitor.board().enter(None, Op::Loading);
    let backend = if silent_cpu() { crate::BackendKind::Cpu } else { parse_backend(&cfg.backend)? };
    let opts = EngineOptions {
        context: cfg.context,
        slots: cfg.slots.max(1),
        prefill_chunk: cfg.prefill_chunk.max(1),
        full_window_kv: cfg.full_window_kv,
        ..EngineOptions::default()
    };
    let mut engine = crate::engine::open(&cfg.model, backend, opts).map_err(|e| format!("{}: {e}", cfg.model.display()))?;
    if let Some(f) = fault {
        eprintln!("brink engine child: TEST-ONLY fault injection armed: {f}");
    }
    engine.set_monitor(monitor.clone());
    Ok((engine, monitor))
}

/// Why a step failed, with the kernel launch behind it when that is the cause.
#[derive(Debug)]
struct StepFailure {
    message: String,
    launch: Option<KernelLaunchFailure>,
}

impl From<String> for StepFailure {
    fn from(message: String) -> Self {
        StepFailure { message, launch: None }
    }
}

/// One engine step over `chunks`; one sampled token per chunk that asked for logits.
fn run_step(engine: &mut dyn AnyEngine, samplers: &mut HashMap<SeqId, Sampler>, chunks: &[WireChunk]) -> Result<Vec<u32>, StepFailure> {
    for c in chunks {
        if let Some(p) = c.sampling {
            samplers.insert(c.seq, Sampler::new(p.into()));
        }
        if c.logits && !samplers.contains_key(&c.seq) {
            return Err(format!("sequence {}: logits asked for but no sampling params were ever sent", c.seq).into());
        }
    }
    let mut items = Vec::with_capacity(chunks.len());
    let rings: Vec<u32> = chunks.iter().map(|c| c.ring).collect();
    for c in chunks {
        let start_pos = u32::try_from(c.start_pos)
            .map_err(|_| StepFailure::from(format!("sequence {}: position {} is past u32", c.seq, c.start_pos)))?;
        let logits = if c.logits { Logits::Last } else { Logits::None };
        // The sequence's block table and ring from the supervisor's scheduler: the engine reads
        // and writes its KV through them (the engine checks they cover the chunk).
        items.push(StepItem { blocks: &c.blocks, start_pos, tokens: &c.tokens, logits });
    }
    let logits =
        engine.step_in_rings(&items, &rings).map_err(|e| StepFailure { message: e.to_string(), launch: e.kernel_launch().cloned() })?;
    let vocab = engine.config().vocab;
    let rows = chunks.iter().filter(|c| c.logits).count();
    if logits.len() != rows * vocab {
        return Err(format!("the engine returned {} logits for {rows} rows of {vocab}", logits.len()).into());
    }
    let mut out = Vec::with_capacity(rows);
    for (row, c) in chunks.iter().filter(|c| c.logits).enumerate() {
        // Checked above: every chunk with logits has a sampler.
        let Some(s) = samplers.get_mut(&c.seq) else { return Err(format!("sequence {}: no sampler", c.seq).into()) };
        out.push(s.sample(&logits[row * vocab..(row + 1) * vocab]));
    }
    Ok(out)
}
