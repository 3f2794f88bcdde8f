//! The model-level test's child process: loads the model on its backend with a KV pool sized
//! for the largest case and the reference streams, in the KV layout the node serves with (by
//! default the sliding-window layers keep a ring of blocks per sequence: every step goes through
//! [`crate::engine::Engine::step_in_rings`] with rings from a [`RingPool`]), calibrates its
//! throughput, says it is ready, then runs cases read as JSON lines from stdin (each with its
//! reference work) and answers each with a JSON line on stdout (logs go to stderr). The streams and kept rows live as long as the
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

use super::cases::{REFERENCE_CHUNK, WORKER_RINGS, worker_prefill_chunk};
use super::exec::{self, BlockPool, CaseError, CaseRequest, ModelOutcome, RingPool};
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
    /// The node's KV layout: whole sequences in the sliding-window layers too, not rings
    /// (`EngineOptions::full_window_kv`). Absent from an older parent's JSON: rings.
    #[serde(default)]
    pub full_window_kv: bool,
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
        /// The longest chunk of one sequence the sliding-window layers' rings serve; `None`
        /// without rings (full layout, or no windowed layer).
        #[serde(default)]
        ring_max_chunk: Option<u64>,
        /// Rings the engine holds (sequences in a step plus streams held).
        #[serde(default)]
        rings: u64,
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
        prefill_chunk: worker_prefill_chunk(cfg.prefill_chunk.max(1)) as usize,
        block_size: block_size as usize,
        // As the node serves, so a fault of the rings fails here, not in served outputs.
        full_window_kv: cfg.full_window_kv,
        // The cases' tables come from the pool, not from slots: the rings are counted apart.
        rings: WORKER_RINGS as usize,
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
fn calibrate(engine: &mut dyn AnyEngine, pool: &mut BlockPool, rings: &mut RingPool) -> Result<Calibration, WorkerError> {
    let n = (2 * REFERENCE_CHUNK).min(engine.options().context as u64);
    let blocks = pool.take(n.div_ceil(engine.block_size() as u64)).map_err(WorkerError::Calibration)?;
    let ring = match rings.take(1) {
        Ok(r) => r,
        Err(e) => {
            pool.give_back(blocks);
            return Err(WorkerError::Calibration(e));
        }
    };
    let tokens = exec::prompt_tokens(0, n, engine.config().vocab);
    let r = exec::reference(engine, &blocks, ring[0], &tokens[..1], REFERENCE_CHUNK as usize).and_then(|_| {
        let t0 = Instant::now();
        exec::reference(engine, &blocks, ring[0], &tokens, REFERENCE_CHUNK as usize)?;
        Ok(Calibration { tokens: n, seconds: t0.elapsed().as_secs_f64() })
    });
    pool.give_back(blocks);
    rings.give_back(ring);
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
    let mut rings = RingPool::new(u32::try_from(engine.options().rings).unwrap_or(u32::MAX));
    let mut streams = exec::Streams::default();
    let calibration = match calibrate(engine.as_mut(), &mut pool, &mut rings) {
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
        ring_max_chunk: engine.window_ring().map(|r| r.max_chunk as u64),
        rings: engine.options().rings as u64,
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
        let outcome = exec::run_case(engine.as_mut(), &mut pool, &mut rings, &mut streams, &req);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::qualify::cases::{Composition, ModelCase, TOLERANCE, pool_blocks};
    use crate::qualify::plan::Planner;
    use crate::synth::gpt_oss::{self, GptOssSpec};

    /// The tiny gpt-oss model: layer 0 keeps a window of 128 keys, layer 1 the whole sequence.
    fn gpt_oss_tiny(dir: &std::path::Path) -> PathBuf {
        let path = dir.join("gpt-oss-tiny.gguf");
        gpt_oss::generate(&GptOssSpec::from_preset(crate::synth::GptOssPreset::Tiny), &path, |_, _| {}).unwrap();
        path
    }

    fn case(tokens: u64, composition: Composition) -> ModelCase {
        let seqs = match composition {
            Composition::Single => 1,
            Composition::FourSeqs => 4,
            Composition::MixedDecode => 9,
        };
        let batch = brink_kernels::thresholds::compositions(tokens).into_iter().find(|b| b.len() == seqs).unwrap();
        ModelCase { id: format!("{}/t{tokens}", composition.kernel()), composition, tokens, batch, reasons: vec![] }
    }

    /// Runs `cases` in order through the worker loop (load, calibration, each case with its
    /// planned references) at the serving prefill chunk `prefill_chunk`: its ready message and
    /// each case's outcome.
    fn run_worker(
        model: &std::path::Path,
        prefill_chunk: u64,
        full_window_kv: bool,
        cases: &[ModelCase],
    ) -> (ModelWorkerMsg, Vec<ModelOutcome>) {
        let largest = cases.iter().map(|c| c.tokens).max().unwrap_or(0);
        let cfg = WorkerConfig {
            model: model.to_path_buf(),
            backend: "cpu".into(),
            context: 512,
            prefill_chunk,
            pool_blocks: pool_blocks(largest.max(2 * REFERENCE_CHUNK), 16),
            full_window_kv,
        };
        let mut planner = Planner::new(cases, usize::MAX);
        let input: String = cases
            .iter()
            .enumerate()
            .map(|(i, c)| serde_json::to_string(&CaseRequest { case: c.clone(), reference: planner.work(i) }).unwrap() + "\n")
            .collect();
        let mut out = Vec::new();
        assert_eq!(serve(&cfg, input.as_bytes(), &mut out), 0, "{}", String::from_utf8_lossy(&out));
        let mut msgs = std::str::from_utf8(&out).unwrap().lines().map(|l| serde_json::from_str::<ModelWorkerMsg>(l).unwrap());
        let ready = msgs.next().unwrap();
        let outcomes = msgs
            .zip(cases)
            .map(|(m, c)| match m {
                ModelWorkerMsg::Result { id, outcome, .. } if id == c.id => outcome,
                other => panic!("{}: {other:?}", c.id),
            })
            .collect::<Vec<_>>();
        assert_eq!(outcomes.len(), cases.len());
        (ready, outcomes)
    }

    /// The worker serves in the window-only layout unless told otherwise: cases up to and past
    /// the window of 128 (single prompts, four sequences, a prefill beside decode rows) pass on
    /// the rings, with the full layout's outcomes (the CPU's rows are bit-identical between the
    /// layouts, so the errors are equal); an older parent's configuration (no `full_window_kv`)
    /// means rings.
    #[test]
    fn the_worker_runs_cases_past_the_window_on_rings_as_on_whole_sequences() {
        let dir = tempfile::tempdir().unwrap();
        let model = gpt_oss_tiny(dir.path());
        let mut cases = Vec::new();
        for t in [9u64, 127, 128, 129, 137, 255, 257, 265] {
            for c in [Composition::Single, Composition::FourSeqs, Composition::MixedDecode] {
                let case = case(t, c);
                if case.batch.iter().all(|&r| r <= 257) {
                    cases.push(case);
                }
            }
        }
        assert!(cases.iter().any(|c| c.id == "model/single/t257") && cases.iter().any(|c| c.id == "model/mixed-decode/t265"));
        let (ready, rings) = run_worker(&model, 256, false, &cases);
        // Prefill chunk 256, window 128, blocks of 16: rings of 24 blocks, for chunks of 257.
        assert!(matches!(ready, ModelWorkerMsg::Ready { ring_max_chunk: Some(257), rings: WORKER_RINGS, .. }), "{ready:?}");
        let (ready, full) = run_worker(&model, 256, true, &cases);
        assert!(matches!(ready, ModelWorkerMsg::Ready { ring_max_chunk: None, .. }), "{ready:?}");
        for ((c, r), f) in cases.iter().zip(&rings).zip(&full) {
            let ModelOutcome::Compared { max_err, non_finite_rows, .. } = r else { panic!("{}: on rings {r:?}", c.id) };
            assert!(*max_err <= TOLERANCE && *non_finite_rows == 0, "{}: on rings {r:?}", c.id);
            let same = |o: &ModelOutcome| match o {
                ModelOutcome::Compared { max_err, worst_seq, non_finite_rows, argmax_mismatches, compared, .. } => {
                    Some((max_err.to_bits(), *worst_seq, *non_finite_rows, *argmax_mismatches, *compared))
                }
                ModelOutcome::Error { .. } => None,
            };
            assert_eq!(same(r), same(f), "{}: rings {r:?}, whole sequences {f:?}", c.id);
        }
        let old = r#"{"model":"m.gguf","backend":"cpu","context":512,"prefill_chunk":256,"pool_blocks":64}"#;
        assert!(!serde_json::from_str::<WorkerConfig>(old).unwrap().full_window_kv);
    }

    /// Negative control: a ring too small for a case's chunk is refused with the reason, not
    /// run over a ring that would overwrite keys its queries still read; the full layout runs it.
    #[test]
    fn a_chunk_longer_than_the_ring_serves_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let model = gpt_oss_tiny(dir.path());
        let cases = [case(129, Composition::Single), case(255, Composition::Single)];
        // Prefill chunk 128: rings of 16 blocks, for chunks of 129.
        let (ready, out) = run_worker(&model, 128, false, &cases);
        assert!(matches!(ready, ModelWorkerMsg::Ready { ring_max_chunk: Some(129), .. }), "{ready:?}");
        assert!(matches!(out[0], ModelOutcome::Compared { .. }), "{:?}", out[0]);
        let ModelOutcome::Error { error } = &out[1] else { panic!("{:?}", out[1]) };
        assert!(error.contains("a chunk of 255 tokens") && error.contains("at most 129"), "{error}");
        let (_, out) = run_worker(&model, 128, true, &cases);
        assert!(out.iter().all(|o| matches!(o, ModelOutcome::Compared { .. })), "{out:?}");
    }
}
