//! The child process of the self-test: opens the GPU, compiles every kernel, then executes
//! cases read as JSON lines from stdin and answers each with a JSON line on stdout.
//!
//! It runs in its own process because a hung kernel can only be ended with its process: the
//! parent ([`super::runner`]) kills it at the case's deadline and starts a fresh one.
//!
//! A case's GPU half runs on the worker's main thread; when the family leaves a host check
//! (its CPU twin, see [`crate::check::Staged`]), the worker answers [`WorkerMsg::Staged`] at
//! once and runs the check on a pool of host threads while the parent sends the next case; the
//! parent asks for the check's result with a [`Request::Collect`] line, and the worker answers
//! [`WorkerMsg::Result`] when the check is done. The deadline of a case covers its GPU half
//! (where a kernel can hang) and, separately, the collection of its check.

use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::mpsc::{Receiver, sync_channel};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::case::Case;
use super::deadline::send_line;
use crate::check::{Outcome, Staged, timing};
use crate::cuda::{DeviceInfo, Gpu, GpuError};
use crate::limits::DeviceLimits;
use crate::sources;

/// Exit code after a sticky CUDA error: the context is unusable, the parent starts a new worker.
pub const EXIT_STICKY: i32 = 3;

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "msg", rename_all = "snake_case")]
pub enum WorkerMsg {
    /// The GPU is open and every kernel compiled (or was taken from the cache).
    Ready { limits: DeviceLimits, info: DeviceInfo, compile_seconds: f64 },
    /// No CUDA driver or no device: the parent checks plans on the CPU instead.
    NoGpu { reason: String },
    /// The GPU is there but unusable (a kernel does not compile, a driver call fails).
    Fatal { error: String },
    /// The case's GPU half is done; its host check runs in the background (collect it with
    /// [`Request::Collect`]).
    Staged { id: String, gpu_ms: f64 },
    Result {
        id: String,
        outcome: Outcome,
        /// The worker's time on the case: its GPU half plus its host check.
        wall_ms: f64,
        /// Of which the GPU half (launches, data, downloads; the whole case when it left no
        /// host check).
        #[serde(default)]
        gpu_ms: Option<f64>,
        /// Of which the host check (the CPU twin and the comparison), when it ran apart.
        #[serde(default)]
        host_ms: Option<f64>,
        /// The GPU half's parts, as its family marked them ([`crate::check::timing`]): `(what,
        /// ms)`, e.g. inputs, kernel, outputs; empty when the family marks none.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        parts: Vec<(String, f64)>,
    },
}

/// A line the parent sends the worker.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Request {
    /// Answer the result of a staged case once its host check is done.
    Collect { collect: String },
    /// Run this case.
    Run(Box<Case>),
}

/// Host checks in flight, by case id: the channel their outcome comes on, the GPU half's time
/// and its parts.
type InFlight = HashMap<String, (Receiver<(Outcome, f64)>, f64, Vec<(String, f64)>)>;

/// Threads of the host-check pool: every core but one. The GPU half is the self-test's critical
/// path: its thread (driver calls, synchronisation, the host data it makes) keeps a core of its
/// own instead of queueing behind busy check threads; the GPU half's own parallel work (rayon's
/// global pool) shares the cores with the checks.
fn check_pool() -> Result<rayon::ThreadPool, String> {
    let threads = std::thread::available_parallelism().map_or(4, |n| n.get()).saturating_sub(1).max(1);
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|i| format!("host-check-{i}"))
        .build()
        .map_err(|e| format!("cannot start the host-check threads: {e}"))
}

/// Runs a host check on `pool`; its outcome (a panic becomes an error outcome) and time come on
/// the returned channel.
fn spawn_check(pool: &rayon::ThreadPool, check: crate::check::HostCheck) -> Receiver<(Outcome, f64)> {
    let (tx, rx) = sync_channel(1);
    pool.spawn(move || {
        let t = Instant::now();
        let outcome = catch_unwind(AssertUnwindSafe(check)).unwrap_or_else(|p| {
            let what = p.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| p.downcast_ref::<String>().cloned());
            Outcome::Error { error: format!("the host check panicked: {}", what.unwrap_or_default()) }
        });
        let _ = tx.send((outcome, t.elapsed().as_secs_f64() * 1e3));
    });
    rx
}

/// Runs the worker loop; returns the process exit code.
pub fn serve(input: impl BufRead, mut out: impl Write) -> i32 {
    let gpu = match Gpu::open(0) {
        Ok(g) => g,
        Err(e @ (GpuError::NoDriver | GpuError::NoDevice(_))) => {
            return exit_after(&mut out, &WorkerMsg::NoGpu { reason: e.to_string() }, 0);
        }
        Err(e) => return exit_after(&mut out, &WorkerMsg::Fatal { error: e.to_string() }, 1),
    };
    let start = Instant::now();
    if let Err(e) = gpu.load_modules(sources::ALL) {
        return exit_after(&mut out, &WorkerMsg::Fatal { error: e.to_string() }, 1);
    }
    let pool = match check_pool() {
        Ok(p) => p,
        Err(error) => return exit_after(&mut out, &WorkerMsg::Fatal { error }, 1),
    };
    let mut in_flight: InFlight = HashMap::new();
    let ready = WorkerMsg::Ready { limits: gpu.limits().clone(), info: gpu.info().clone(), compile_seconds: start.elapsed().as_secs_f64() };
    if send_line(&mut out, &ready).is_err() {
        return 1;
    }
    for line in input.lines() {
        let Ok(line) = line else { return 1 };
        if line.trim().is_empty() {
            continue;
        }
        let case = match serde_json::from_str::<Request>(&line) {
            Ok(Request::Run(c)) => *c,
            Ok(Request::Collect { collect }) => {
                let msg = match in_flight.remove(&collect) {
                    Some((rx, gpu_ms, parts)) => {
                        let (outcome, host_ms) =
                            rx.recv().unwrap_or_else(|_| (Outcome::Error { error: "the host check ended without an outcome".into() }, 0.0));
                        WorkerMsg::Result {
                            id: collect,
                            outcome,
                            wall_ms: gpu_ms + host_ms,
                            gpu_ms: Some(gpu_ms),
                            host_ms: Some(host_ms),
                            parts,
                        }
                    }
                    None => WorkerMsg::Fatal { error: format!("no host check in flight for case {collect}") },
                };
                if send_line(&mut out, &msg).is_err() {
                    return 1;
                }
                continue;
            }
            Err(e) => return exit_after(&mut out, &WorkerMsg::Fatal { error: format!("bad case line: {e}") }, 1),
        };
        let t = Instant::now();
        timing::begin();
        let staged = super::stage(&gpu, &case);
        let parts = timing::take();
        let gpu_ms = t.elapsed().as_secs_f64() * 1e3;
        let (msg, sticky) = match staged {
            Staged::Check(check) => {
                in_flight.insert(case.id.clone(), (spawn_check(&pool, check), gpu_ms, parts));
                (WorkerMsg::Staged { id: case.id, gpu_ms }, false)
            }
            Staged::Done(outcome) => {
                let sticky = matches!(&outcome, Outcome::LaunchError(e) if e.sticky);
                (WorkerMsg::Result { id: case.id, outcome, wall_ms: gpu_ms, gpu_ms: Some(gpu_ms), host_ms: None, parts }, sticky)
            }
        };
        if send_line(&mut out, &msg).is_err() {
            return 1;
        }
        if sticky {
            // Checks still in flight are lost with the process: the parent runs their cases again.
            return EXIT_STICKY;
        }
    }
    0
}

fn exit_after(out: &mut impl Write, msg: &WorkerMsg, code: i32) -> i32 {
    let _ = send_line(out, msg);
    code
}
