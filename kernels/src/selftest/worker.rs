//! The child process of the self-test: opens the GPU, compiles every kernel, then executes
//! cases read as JSON lines from stdin and answers each with a JSON line on stdout.
//!
//! It runs in its own process because a hung kernel can only be ended with its process: the
//! parent ([`super::runner`]) kills it at the case's deadline and starts a fresh one.

use std::io::{BufRead, Write};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::case::Case;
use super::deadline::send_line;
use crate::check::Outcome;
use crate::cuda::{DeviceInfo, Gpu, GpuError};
use crate::limits::DeviceLimits;
use crate::sources;

/// Exit code after a sticky CUDA error: the context is unusable, the parent starts a new worker.
pub const EXIT_STICKY: i32 = 3;

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "msg", rename_all = "snake_case")]
pub enum WorkerMsg {
    /// The GPU is open and every kernel compiled (or was taken from the cache).
    Ready {
        limits: DeviceLimits,
        info: DeviceInfo,
        compile_seconds: f64,
    },
    /// No CUDA driver or no device: the parent checks plans on the CPU instead.
    NoGpu {
        reason: String,
    },
    /// The GPU is there but unusable (a kernel does not compile, a driver call fails).
    Fatal {
        error: String,
    },
    Result {
        id: String,
        outcome: Outcome,
        wall_ms: f64,
    },
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
    for src in sources::ALL {
        if let Err(e) = gpu.module(src) {
            return exit_after(&mut out, &WorkerMsg::Fatal { error: e.to_string() }, 1);
        }
    }
    let ready = WorkerMsg::Ready { limits: gpu.limits().clone(), info: gpu.info().clone(), compile_seconds: start.elapsed().as_secs_f64() };
    if send_line(&mut out, &ready).is_err() {
        return 1;
    }
    for line in input.lines() {
        let Ok(line) = line else { return 1 };
        if line.trim().is_empty() {
            continue;
        }
        let case: Case = match serde_json::from_str(&line) {
            Ok(c) => c,
            Err(e) => return exit_after(&mut out, &WorkerMsg::Fatal { error: format!("bad case line: {e}") }, 1),
        };
        let t = Instant::now();
        let outcome = super::execute(&gpu, &case);
        let sticky = matches!(&outcome, Outcome::LaunchError(e) if e.sticky);
        let msg = WorkerMsg::Result { id: case.id, outcome, wall_ms: t.elapsed().as_secs_f64() * 1e3 };
        if send_line(&mut out, &msg).is_err() {
            return 1;
        }
        if sticky {
            return EXIT_STICKY;
        }
    }
    0
}

fn exit_after(out: &mut impl Write, msg: &WorkerMsg, code: i32) -> i32 {
    let _ = send_line(out, msg);
    code
}
