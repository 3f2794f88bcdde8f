//! A child process that answers JSON-line requests, each awaited up to its deadline: the
//! machinery the kernel self-test ([`super::runner`]) and the engine's model-level threshold
//! test share. A request that passes its deadline is a hang: the child is killed (the only way
//! to end a hung kernel) and the next request starts a fresh one, which must announce itself
//! ready again (reopening the GPU, reloading the model).

use std::fmt::Debug;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde::de::DeserializeOwned;

/// The child's side: writes `msg` as one JSON line and flushes it, so the parent, which waits
/// on lines, sees it at once.
pub fn send_line(out: &mut impl Write, msg: &impl Serialize) -> std::io::Result<()> {
    let line = serde_json::to_string(msg).map_err(std::io::Error::other)?;
    writeln!(out, "{line}")?;
    out.flush()
}

/// What came back for one request (with the parent's wall time from sending it).
#[derive(Clone, Debug)]
pub enum Answer<M> {
    Reply {
        msg: M,
        wall_ms: f64,
    },
    /// Killed at the deadline.
    Hung {
        wall_ms: f64,
    },
    /// The child died (crash, exit without an answer, or a protocol error).
    Died {
        detail: String,
        wall_ms: f64,
    },
    /// No child to send the request to: a fresh one did not get ready (the request was not sent).
    RestartFailed {
        detail: String,
    },
}

/// How a start went: the first message was the ready one (the child is kept), another one
/// (the child is stopped; the caller reads it: no GPU, a fatal error), or none.
#[derive(Clone, Debug)]
pub enum Started<M> {
    Ready(M),
    NotReady(M),
    Failed(String),
}

enum Line<M> {
    Msg(M),
    Garbage(String),
    Eof,
}

/// A running child: its process, its stdin, and a channel of the lines it prints.
struct Worker<M> {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<Line<M>>,
}

impl<M: DeserializeOwned + Send + 'static> Worker<M> {
    fn spawn(cmd: &mut Command) -> std::io::Result<Worker<M>> {
        let mut child = cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).spawn()?;
        let stdin = child.stdin.take().ok_or_else(|| std::io::Error::other("worker stdin"))?;
        let stdout = child.stdout.take().ok_or_else(|| std::io::Error::other("worker stdout"))?;
        let (tx, lines) = mpsc::channel();
        // A thread per child reads its stdout, so waiting for a line can have a deadline.
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let msg = serde_json::from_str::<M>(&line).map(Line::Msg).unwrap_or(Line::Garbage(line));
                if tx.send(msg).is_err() {
                    return;
                }
            }
            let _ = tx.send(Line::Eof);
        });
        Ok(Worker { child, stdin, lines })
    }
}

impl<M> Worker<M> {
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

type IsReady<M> = Box<dyn Fn(&M) -> bool + Send>;

/// Requests to children made by `make_command`, one at a time, each with a deadline.
pub struct DeadlineChild<M> {
    make_command: Box<dyn Fn() -> Command + Send>,
    is_ready: IsReady<M>,
    /// What a starting child does before it is ready (for the timeout's message).
    startup_work: String,
    /// Time a child may take to announce itself ready.
    pub startup_timeout: Duration,
    worker: Option<Worker<M>>,
}

impl<M: DeserializeOwned + Debug + Send + 'static> DeadlineChild<M> {
    /// `is_ready` tells the first message of a child that is ready to take requests;
    /// `startup_work` says what it does until then (e.g. "loading the model").
    pub fn new(
        make_command: impl Fn() -> Command + Send + 'static,
        is_ready: impl Fn(&M) -> bool + Send + 'static,
        startup_work: &str,
    ) -> Self {
        DeadlineChild {
            make_command: Box::new(make_command),
            is_ready: Box::new(is_ready),
            startup_work: startup_work.into(),
            startup_timeout: Duration::from_secs(300),
            worker: None,
        }
    }

    /// Starts a child (stopping any running one) and returns its first message.
    pub fn start(&mut self) -> Started<M> {
        self.stop();
        match self.spawn_ready() {
            Ok((w, msg)) => {
                self.worker = Some(w);
                Started::Ready(msg)
            }
            Err(s) => s,
        }
    }

    fn spawn_ready(&mut self) -> Result<(Worker<M>, M), Started<M>> {
        let mut w = Worker::spawn(&mut (self.make_command)()).map_err(|e| Started::Failed(format!("cannot start the worker: {e}")))?;
        match w.lines.recv_timeout(self.startup_timeout) {
            Ok(Line::Msg(m)) if (self.is_ready)(&m) => Ok((w, m)),
            Ok(Line::Msg(m)) => {
                w.kill();
                Err(Started::NotReady(m))
            }
            Ok(Line::Garbage(l)) => {
                w.kill();
                Err(Started::Failed(format!("worker printed an unexpected line: {l}")))
            }
            Ok(Line::Eof) | Err(RecvTimeoutError::Disconnected) => {
                let detail = w.exit_detail();
                Err(Started::Failed(format!("worker ended before it was ready: {detail}")))
            }
            Err(RecvTimeoutError::Timeout) => {
                w.kill();
                Err(Started::Failed(format!("worker not ready after {:?} ({})", self.startup_timeout, self.startup_work)))
            }
        }
    }

    /// Sends `request` and waits up to `deadline` for the message `is_answer` accepts. After a
    /// hang or a dead child, the next call starts a fresh child first (its startup is not part
    /// of the deadline).
    pub fn request(&mut self, request: &impl Serialize, deadline: Duration, is_answer: impl Fn(&M) -> bool) -> Answer<M> {
        let mut w = match self.worker.take() {
            Some(w) => w,
            None => match self.spawn_ready() {
                Ok((w, _)) => w,
                Err(s) => return Answer::RestartFailed { detail: format!("could not restart the worker: {s:?}") },
            },
        };
        let t0 = Instant::now();
        let ms = |t0: Instant| t0.elapsed().as_secs_f64() * 1e3;
        let line = match serde_json::to_string(request) {
            Ok(l) => l,
            Err(e) => {
                self.worker = Some(w);
                return Answer::Died { detail: format!("request does not serialise: {e}"), wall_ms: ms(t0) };
            }
        };
        if let Err(e) = writeln!(w.stdin, "{line}").and_then(|_| w.stdin.flush()) {
            let detail = format!("{}; writing the request failed: {e}", w.exit_detail());
            return Answer::Died { detail, wall_ms: ms(t0) };
        }
        loop {
            let left = deadline.saturating_sub(t0.elapsed());
            match w.lines.recv_timeout(left) {
                Ok(Line::Msg(msg)) if is_answer(&msg) => {
                    self.worker = Some(w);
                    return Answer::Reply { msg, wall_ms: ms(t0) };
                }
                Ok(Line::Msg(other)) => {
                    w.kill();
                    return Answer::Died { detail: format!("unexpected worker message: {other:?}"), wall_ms: ms(t0) };
                }
                // Stray output (a library printing to stdout): ignore it and keep waiting.
                Ok(Line::Garbage(_)) => continue,
                Ok(Line::Eof) | Err(RecvTimeoutError::Disconnected) => {
                    let detail = w.exit_detail();
                    return Answer::Died { detail, wall_ms: ms(t0) };
                }
                Err(RecvTimeoutError::Timeout) => {
                    w.kill();
                    return Answer::Hung { wall_ms: ms(t0) };
                }
            }
        }
    }
}

impl<M> DeadlineChild<M> {
    /// Ends the running child, if any: closing stdin ends a healthy one, kill one that is stuck.
    pub fn stop(&mut self) {
        if let Some(w) = self.worker.take() {
            drop(w.stdin);
            let mut child = w.child;
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl<M> Drop for DeadlineChild<M> {
    fn drop(&mut self) {
        self.stop();
    }
}
