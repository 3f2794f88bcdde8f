//! The model-level test's child process: loads the model on its backend with a KV pool sized
//! for the largest case and the reference streams, calibrates its throughput, says it is ready,
//! then runs cases read as JSON lines from stdin (each with its reference work) and answers each
//! with a JSON line on stdout (logs go to stderr). The streams and kept rows live as long as the
//! worker: a fresh one after a kill starts them again, as the parent's plan expects.
//!
//! It runs in its own process because a hung kernel can only be ended with its process: the
//! parent ([`super::session`]) kills it at the case's deadline and starts a fresh one, which
//! reloads the model.

use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use brink_kernels::limits::DeviceLimits;
use brink_kernels::selftest::deadline::send_line;
use serde::{Deserialize, Serialize};

use super::cases::REFERENCE_CHUNK;
use super::exec::{self, BlockPool, CaseError, CaseRequest, ModelOutcome};
use crate::engine::{AnyEngine, BackendKind, Engine, EngineOptions};
use crate::model::{BackendError, ModelError};
use crate::monitor::{Fault, Monitor};

/// Why a worker could not get ready: the model (its errors name the file), the backend, or the
/// calibration prefill. Sent to the parent as the worker's fatal error.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("{}: {source}", model.display())]
    Load {
        model: PathBuf,
        #[source]
        source: ModelError,
    },
    #[error("CUDA backend: {0}")]
    Cuda(#[source] BackendError),
    #[error("unknown backend {0:?} (expected cpu or cuda)")]
    UnknownBackend(String),
    #[error("calibration prefill failed: {0}")]
    Calibration(#[source] CaseError),
}

/// Environment variable of the test-only fault injection (`hang:layer=N[,min-rows=R]`, ...):
/// the watchdog's and the model test's tests make chosen steps hang or fail. Never in production.
pub const FAULT_ENV: &str = crate::test_switches::INJECT_FAULT;

/// Exit code after an engine error on the GPU: the context may be unusable, the parent starts
/// a fresh worker for the next case.
pub const EXIT_AFTER_GPU_ERROR: i32 = 3;

/// What the parent tells a worker to load (one JSON argument on its command line).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WorkerConfig {
    pub model: PathBuf,
    /// `cpu` or `cuda`.
    pub backend: String,
    /// KV positions per sequence (capped at the model's context).
    pub context: u64,
    pub prefill_chunk: u64,
    /// KV blocks the cases' tables and the reference streams are drawn from.
    pub pool_blocks: u64,
}

/// Throughput of the calibration prefill: reference-chunked, the slowest path a case takes.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Calibration {
    pub tokens: u64,
    pub seconds: f64,
}

impl Calibration {
    pub fn tokens_per_s(&self) -> f64 {
        self.tokens as f64 / self.seconds.max(1e-9)
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "msg", rename_all = "snake_case")]
pub enum ModelWorkerMsg {
    Ready {
        backend: String,
        shape_class: String,
        /// The context the engine runs with.
        context: u64,
        /// The device's own limits (CUDA); `None` on the CPU backend.
        limits: Option<DeviceLimits>,
        load_seconds: f64,
        calibration: Calibration,
        /// The armed test-only fault, if any (the report says so).
        fault: Option<String>,
    },
    /// The model cannot be loaded or calibrated.
    Fatal {
        error: String,
    },
    Result {
        id: String,
        outcome: ModelOutcome,
        wall_ms: f64,
    },
}

fn fatal(out: &mut impl Write, error: String) -> i32 {
    let _ = send_line(out, &ModelWorkerMsg::Fatal { error });
    1
}

/// Loads the engine of `cfg`; the device's limits on CUDA.
fn load(cfg: &WorkerConfig) -> Result<(Box<dyn AnyEngine>, Option<DeviceLimits>), WorkerError> {
    let block_size = brink_kernels::ops::attention::DEFAULT_BLOCK_SIZE as u64;
    let context = cfg.context.max(1);
    // The engine's cache is `slots` sequences of `context` positions: enough of them to hold the pool.
    let slots = cfg.pool_blocks.div_ceil(context.div_ceil(block_size)).max(1);
    let opts = EngineOptions {
        context: context as usize,
        slots: slots as usize,
        prefill_chunk: cfg.prefill_chunk.max(1) as usize,
        block_size: block_size as usize,
        // The cases run on block tables of their own pool, not slot tables, and prefill
        // whole prompts: the sliding-window layers keep whole sequences (no rings).
        full_window_kv: true,
    };
    let named = |source| WorkerError::Load { model: cfg.model.clone(), source };
    let (engine, limits): (Box<dyn AnyEngine>, _) = match cfg.backend.as_str() {
        "cpu" => (Box::new(Engine::load(&cfg.model, crate::backend::cpu::CpuBackend::new(), opts).map_err(named)?), None),
        "cuda" => {
            let backend = crate::backend::cuda::CudaBackend::new().map_err(WorkerError::Cuda)?;
            let limits = backend.gpu().limits().clone();
            (Box::new(Engine::load(&cfg.model, backend, opts).map_err(named)?), Some(limits))
        }
        other => return Err(WorkerError::UnknownBackend(other.into())),
    };
    Ok((engine, limits))
}

/// Prefills `2 x REFERENCE_CHUNK` tokens (after a one-token warm-up) in reference chunks.
fn calibrate(engine: &mut dyn AnyEngine, pool: &mut BlockPool) -> Result<Calibration, WorkerError> {
    let n = (2 * REFERENCE_CHUNK).min(engine.options().context as u64);
    let blocks = pool.take(n.div_ceil(engine.block_size() as u64)).map_err(WorkerError::Calibration)?;
    let tokens = exec::prompt_tokens(0, n, engine.config().vocab);
    let r = exec::reference(engine, &blocks, &tokens[..1], REFERENCE_CHUNK as usize).and_then(|_| {
        let t0 = Instant::now();
        exec::reference(engine, &blocks, &tokens, REFERENCE_CHUNK as usize)?;
        Ok(Calibration { tokens: n, seconds: t0.elapsed().as_secs_f64() })
    });
    pool.give_back(blocks);
    r.map_err(WorkerError::Calibration)
}

/// Runs the worker loop for `cfg`; returns the process exit code.
pub fn serve(cfg: &WorkerConfig, input: impl BufRead, mut out: impl Write) -> i32 {
    let fault = match crate::test_switches::get(FAULT_ENV).map(|s| s.parse::<Fault>()).transpose() {
        Ok(f) => f,
        Err(e) => return fatal(&mut out, format!("{FAULT_ENV}: {e}")),
    };
    if let Some(f) = fault {
        eprintln!("brink model-test worker: TEST-ONLY fault injection armed: {f}");
    }
    let (mut engine, limits) = match load(cfg) {
        Ok(l) => l,
        Err(e) => return fatal(&mut out, e.to_string()),
    };
    let gpu = cfg.backend == BackendKind::Cuda.name();
    let pool_blocks = u32::try_from(cfg.pool_blocks.min(engine.total_blocks() as u64)).unwrap_or(u32::MAX);
    let mut pool = BlockPool::new(pool_blocks);
    let mut streams = exec::Streams::default();
    let calibration = match calibrate(engine.as_mut(), &mut pool) {
        Ok(c) => c,
        Err(e) => return fatal(&mut out, e.to_string()),
    };
    // Armed after the calibration: a fault that hangs its steps must hang cases, not the start.
    engine.set_monitor(Arc::new(Monitor::local().with_fault(fault)));
    let ready = ModelWorkerMsg::Ready {
        backend: engine.backend_name().to_string(),
        shape_class: engine.config().shape_class(),
        context: engine.options().context as u64,
        limits,
        load_seconds: engine.load_report().seconds,
        calibration,
        fault: fault.map(|f| f.to_string()),
    };
    if send_line(&mut out, &ready).is_err() {
        return 1;
    }
    for line in input.lines() {
        let Ok(line) = line else { return 1 };
        if line.trim().is_empty() {
            continue;
        }
        let req: CaseRequest = match serde_json::from_str(&line) {
            Ok(c) => c,
            Err(e) => return fatal(&mut out, format!("bad case line: {e}")),
        };
        let t = Instant::now();
        let outcome = exec::run_case(engine.as_mut(), &mut pool, &mut streams, &req);
        let failed = matches!(outcome, ModelOutcome::Error { .. });
        let msg = ModelWorkerMsg::Result { id: req.case.id, outcome, wall_ms: t.elapsed().as_secs_f64() * 1e3 };
        if send_line(&mut out, &msg).is_err() {
            return 1;
        }
        if failed && gpu {
            return EXIT_AFTER_GPU_ERROR;
        }
    }
    0
}

/// The worker's `main`: `cfg_json` is its one argument; the protocol on stdin/stdout.
pub fn main_stdio(cfg_json: &str) -> i32 {
    let mut out = std::io::stdout().lock();
    match serde_json::from_str::<WorkerConfig>(cfg_json) {
        Ok(cfg) => serve(&cfg, std::io::stdin().lock(), out),
        Err(e) => fatal(&mut out, format!("bad worker configuration {cfg_json:?}: {e}")),
    }
}
