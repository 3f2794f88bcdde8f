//! The parent side of the self-test: starts a worker process, hands it one case at a time and
//! waits for each result up to the case's deadline. A case that passes its deadline is a hang:
//! the worker is killed (the only way to end a hung kernel), the case is reported as hung,
//! naming kernel and case, and a fresh worker carries on with the next case. The process and
//! deadline machinery is [`super::deadline`]'s, shared with the model-level test.

use std::process::Command;
use std::time::Duration;

use super::case::Case;
use super::deadline::{Answer, DeadlineChild, Started};
use super::worker::WorkerMsg;
use crate::check::Outcome;

/// What came back for one case.
#[derive(Clone, Debug)]
pub enum Returned {
    Outcome {
        outcome: Outcome,
        wall_ms: f64,
    },
    /// Killed at the deadline.
    Hung {
        wall_ms: f64,
    },
    /// The worker died (crash, sticky error exit without a result, or a protocol error).
    WorkerDied {
        detail: String,
        wall_ms: f64,
    },
}

/// How the run started.
#[derive(Clone, Debug)]
pub enum Start {
    Ready { limits: crate::limits::DeviceLimits, info: crate::cuda::DeviceInfo, compile_seconds: f64 },
    NoGpu { reason: String },
    Failed { error: String },
}

/// Runs cases in worker processes made by `make_command`.
pub struct Runner {
    child: DeadlineChild<WorkerMsg>,
    /// Time a worker may take to open the GPU and compile every kernel.
    pub startup_timeout: Duration,
}

impl Runner {
    pub fn new(make_command: impl Fn() -> Command + Send + 'static) -> Self {
        let child = DeadlineChild::new(make_command, |m| matches!(m, WorkerMsg::Ready { .. }), "opening the GPU and compiling kernels");
        let startup_timeout = child.startup_timeout;
        Runner { child, startup_timeout }
    }

    /// Starts the first worker and reports what it found.
    pub fn start(&mut self) -> Start {
        self.child.startup_timeout = self.startup_timeout;
        match self.child.start() {
            Started::Ready(WorkerMsg::Ready { limits, info, compile_seconds }) => Start::Ready { limits, info, compile_seconds },
            Started::NotReady(WorkerMsg::NoGpu { reason }) => Start::NoGpu { reason },
            Started::NotReady(WorkerMsg::Fatal { error }) => Start::Failed { error },
            Started::Ready(other) | Started::NotReady(other) => {
                Start::Failed { error: format!("worker ended before it was ready: it sent {other:?}") }
            }
            Started::Failed(error) => Start::Failed { error },
        }
    }

    /// Runs one case with its deadline. After a hang or a dead worker the next call starts a
    /// fresh worker first.
    pub fn run(&mut self, case: &Case) -> Returned {
        self.child.startup_timeout = self.startup_timeout;
        let answer = self.child.request(
            case,
            Duration::from_millis(case.deadline_ms),
            |m| matches!(m, WorkerMsg::Result { id, .. } if *id == case.id),
        );
        match answer {
            // The worker's own time: the case's work without the pipe.
            Answer::Reply { msg: WorkerMsg::Result { outcome, wall_ms, .. }, .. } => Returned::Outcome { outcome, wall_ms },
            Answer::Reply { msg, wall_ms } => Returned::WorkerDied { detail: format!("unexpected worker message: {msg:?}"), wall_ms },
            Answer::Hung { wall_ms } => Returned::Hung { wall_ms },
            Answer::Died { detail, wall_ms } => Returned::WorkerDied { detail, wall_ms },
            Answer::RestartFailed { detail } => Returned::WorkerDied { detail, wall_ms: 0.0 },
        }
    }
}
