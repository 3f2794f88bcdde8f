//! The parent side of the self-test: starts a worker process, hands it one case at a time and
//! waits for each result up to the case's deadline. A case that passes its deadline is a hang:
//! the worker is killed (the only way to end a hung kernel), the case is reported as hung,
//! naming kernel and case, and a fresh worker carries on with the next case.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use super::case::{Case, Outcome};
use super::worker::WorkerMsg;

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

enum Line {
    Msg(WorkerMsg),
    Garbage(String),
    Eof,
}

/// A running worker: its process, its stdin, and a channel of the lines it prints.
struct Worker {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<Line>,
}

impl Worker {
    fn spawn(cmd: &mut Command) -> std::io::Result<Worker> {
        let mut child = cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).spawn()?;
        let stdin = child.stdin.take().ok_or_else(|| std::io::Error::other("worker stdin"))?;
        let stdout = child.stdout.take().ok_or_else(|| std::io::Error::other("worker stdout"))?;
        let (tx, lines) = mpsc::channel();
        // A thread per worker reads its stdout, so waiting for a line can have a deadline.
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let msg = serde_json::from_str::<WorkerMsg>(&line).map(Line::Msg).unwrap_or(Line::Garbage(line));
                if tx.send(msg).is_err() {
                    return;
                }
            }
            let _ = tx.send(Line::Eof);
        });
        Ok(Worker { child, stdin, lines })
    }

    fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn exit_detail(&mut self) -> String {
        match self.child.wait() {
            Ok(s) => format!("worker exited ({s})"),
            Err(e) => format!("worker lost: {e}"),
        }
    }
}

/// Runs cases in worker processes made by `make_command`.
pub struct Runner {
    make_command: Box<dyn Fn() -> Command + Send>,
    /// Time a worker may take to open the GPU and compile every kernel.
    pub startup_timeout: Duration,
    worker: Option<Worker>,
}

impl Runner {
    pub fn new(make_command: impl Fn() -> Command + Send + 'static) -> Self {
        Runner { make_command: Box::new(make_command), startup_timeout: Duration::from_secs(300), worker: None }
    }

    /// Starts the first worker and reports what it found.
    pub fn start(&mut self) -> Start {
        match self.spawn_ready() {
            Ok((w, start)) => {
                self.worker = Some(w);
                start
            }
            Err(start) => start,
        }
    }

    #[allow(clippy::result_large_err)] // built once per worker start, never on a hot path
    fn spawn_ready(&mut self) -> Result<(Worker, Start), Start> {
        let mut w = Worker::spawn(&mut (self.make_command)())
            .map_err(|e| Start::Failed { error: format!("cannot start the self-test worker: {e}") })?;
        match w.lines.recv_timeout(self.startup_timeout) {
            Ok(Line::Msg(WorkerMsg::Ready { limits, info, compile_seconds })) => Ok((w, Start::Ready { limits, info, compile_seconds })),
            Ok(Line::Msg(WorkerMsg::NoGpu { reason })) => {
                w.kill();
                Err(Start::NoGpu { reason })
            }
            Ok(Line::Msg(WorkerMsg::Fatal { error })) => {
                w.kill();
                Err(Start::Failed { error })
            }
            Ok(Line::Garbage(l)) => {
                w.kill();
                Err(Start::Failed { error: format!("worker printed an unexpected line: {l}") })
            }
            Ok(Line::Msg(WorkerMsg::Result { .. })) | Ok(Line::Eof) | Err(RecvTimeoutError::Disconnected) => {
                let detail = w.exit_detail();
                Err(Start::Failed { error: format!("worker ended before it was ready: {detail}") })
            }
            Err(RecvTimeoutError::Timeout) => {
                w.kill();
                Err(Start::Failed {
                    error: format!("worker not ready after {:?} (opening the GPU and compiling kernels)", self.startup_timeout),
                })
            }
        }
    }

    /// Runs one case with its deadline. After a hang or a dead worker the next call starts a
    /// fresh worker first.
    pub fn run(&mut self, case: &Case) -> Returned {
        let t0 = Instant::now();
        let ms = |t0: Instant| t0.elapsed().as_secs_f64() * 1e3;
        let mut w = match self.worker.take() {
            Some(w) => w,
            None => match self.spawn_ready() {
                Ok((w, _)) => w,
                Err(s) => return Returned::WorkerDied { detail: format!("could not restart the worker: {s:?}"), wall_ms: ms(t0) },
            },
        };
        let line = match serde_json::to_string(case) {
            Ok(l) => l,
            Err(e) => return Returned::WorkerDied { detail: format!("case does not serialise: {e}"), wall_ms: ms(t0) },
        };
        if let Err(e) = writeln!(w.stdin, "{line}").and_then(|_| w.stdin.flush()) {
            let detail = format!("{}; writing the case failed: {e}", w.exit_detail());
            return Returned::WorkerDied { detail, wall_ms: ms(t0) };
        }
        let deadline = Duration::from_millis(case.deadline_ms);
        loop {
            let left = deadline.saturating_sub(t0.elapsed());
            match w.lines.recv_timeout(left) {
                Ok(Line::Msg(WorkerMsg::Result { id, outcome, wall_ms })) if id == case.id => {
                    self.worker = Some(w);
                    return Returned::Outcome { outcome, wall_ms };
                }
                Ok(Line::Msg(other)) => {
                    w.kill();
                    return Returned::WorkerDied { detail: format!("unexpected worker message: {other:?}"), wall_ms: ms(t0) };
                }
                // Stray output (a library printing to stdout): ignore it and keep waiting.
                Ok(Line::Garbage(_)) => continue,
                Ok(Line::Eof) | Err(RecvTimeoutError::Disconnected) => {
                    let detail = w.exit_detail();
                    return Returned::WorkerDied { detail, wall_ms: ms(t0) };
                }
                Err(RecvTimeoutError::Timeout) => {
                    w.kill();
                    return Returned::Hung { wall_ms: ms(t0) };
                }
            }
        }
    }
}

impl Drop for Runner {
    fn drop(&mut self) {
        if let Some(w) = self.worker.take() {
            // Closing stdin ends a healthy worker; kill covers one that is stuck.
            drop(w.stdin);
            let mut child = w.child;
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
