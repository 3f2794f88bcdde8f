//! The parent side of the self-test: starts a worker process, hands it one case at a time and
//! waits for each result up to the case's deadline. A case that passes its deadline is a hang:
//! the worker is killed (the only way to end a hung kernel), the case is reported as hung,
//! naming kernel and case, and a fresh worker carries on with the next case. The process and
//! deadline machinery is [`super::deadline`]'s, shared with the model-level test.
//!
//! [`Runner::run_all`] overlaps the device and the host: a case whose family leaves a host check
//! (its CPU twin) is answered "staged" as soon as its GPU half is done, and the next case goes
//! to the worker while up to [`Runner::depth`] checks run on the worker's other cores; their
//! results are collected oldest first, each within its case's deadline, and handed on in the
//! catalogue's order. Negative controls (and any case not expected to pass) run with no check
//! in flight, so the kill that flags a hang loses nothing; when a worker is lost anyway (an
//! unexpected hang, a crash, a sticky error), the cases whose checks it held run again, one at
//! a time, in a fresh worker.

use std::collections::VecDeque;
use std::process::Command;
use std::time::Duration;

use super::case::{Case, Expect};
use super::deadline::{Answer, DeadlineChild, Started};
use super::worker::{Request, WorkerMsg};
use crate::check::Outcome;

/// What came back for one case.
#[derive(Clone, Debug)]
pub enum Returned {
    Outcome {
        outcome: Outcome,
        wall_ms: f64,
        /// Where the worker's time on the case went.
        times: CaseTimes,
    },
    /// Killed at the deadline.
    Hung { wall_ms: f64 },
    /// The worker died (crash, sticky error exit without a result, or a protocol error).
    WorkerDied { detail: String, wall_ms: f64 },
}

/// Where the worker's time on one case went (see [`WorkerMsg::Result`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CaseTimes {
    /// The GPU half (the whole case when its family leaves no host check).
    pub gpu_ms: Option<f64>,
    /// The host check, when it ran apart from the GPU half.
    pub host_ms: Option<f64>,
    /// The GPU half's parts its family marked (`(what, ms)`).
    pub parts: Vec<(String, f64)>,
}

/// How the run started.
#[derive(Clone, Debug)]
pub enum Start {
    Ready { limits: crate::limits::DeviceLimits, info: crate::cuda::DeviceInfo, compile_seconds: f64 },
    NoGpu { reason: String },
    Failed { error: String },
}

/// Host checks a worker runs beside the device by default. Each holds only its sampled rows,
/// so the depth costs little memory; it must cover a run of cases whose checks outlast their
/// GPU halves (attention's twins, the fused MoE GEMVs' twins at 16k-41k tokens), or the device
/// waits for the oldest check before it gets the next case. At 8, the H100's run of 2026-12-07
/// had the device without a case for ~15 s of its 55.5 s (GPU halves 40.1 s); replaying that
/// run's per-case times with every family's check staged gives 44 s at 8 and 38 s at 16 (the
/// worker's check pool has a thread per core but one: 15 there, 19 on a GB10).
pub const DEFAULT_DEPTH: usize = 16;

/// Where the worker's time went, summed over the cases that came back.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Timing {
    /// GPU halves of the cases (launches, data, downloads; the whole case when its family
    /// leaves no host check).
    pub gpu_ms: f64,
    /// Host checks run apart from the GPU half (the CPU twins and comparisons).
    pub host_ms: f64,
}

/// Runs cases in worker processes made by `make_command`.
pub struct Runner {
    child: DeadlineChild<WorkerMsg>,
    /// Time a worker may take to open the GPU and compile every kernel.
    pub startup_timeout: Duration,
    /// Host checks in flight at most in [`Runner::run_all`] (0: each case's check is collected
    /// before the next case is sent).
    pub depth: usize,
    /// Where the worker's time went so far.
    pub timing: Timing,
}

/// What sending a case gave: its result, or a host check in flight.
enum Sent {
    Final(Returned),
    Staged,
}

impl Runner {
    pub fn new(make_command: impl Fn() -> Command + Send + 'static) -> Self {
        let child = DeadlineChild::new(make_command, |m| matches!(m, WorkerMsg::Ready { .. }), "opening the GPU and compiling kernels");
        let startup_timeout = child.startup_timeout;
        Runner { child, startup_timeout, depth: DEFAULT_DEPTH, timing: Timing::default() }
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

    /// Runs one case with its deadline (its host check collected before it returns). After a
    /// hang or a dead worker the next call starts a fresh worker first.
    pub fn run(&mut self, case: &Case) -> Returned {
        match self.send(case) {
            Sent::Final(r) => r,
            Sent::Staged => self.collect(case),
        }
    }

    /// Runs every case, overlapping each case's host check with the next cases' GPU halves (at
    /// most [`Runner::depth`] in flight), and hands each result to `done` in the order of
    /// `cases`. Returns the results in that order.
    pub fn run_all(&mut self, cases: &[Case], done: &mut dyn FnMut(usize, &Returned)) -> Vec<Returned> {
        let mut results: Vec<Option<Returned>> = vec![None; cases.len()];
        let mut in_flight: VecDeque<usize> = VecDeque::new();
        let mut emitted = 0;
        for (i, case) in cases.iter().enumerate() {
            // A case that may hang or kill its worker runs with no check in flight.
            if case.expect != Expect::Pass || case.params.is_negative_control() {
                self.drain(cases, &mut in_flight, &mut results, 0);
            }
            self.drain(cases, &mut in_flight, &mut results, self.depth.saturating_sub(1));
            match self.send(case) {
                Sent::Staged if self.depth == 0 => results[i] = Some(self.collect(case)),
                Sent::Staged => in_flight.push_back(i),
                Sent::Final(r) => {
                    let lost = lost_worker(&r);
                    let sticky = sticky(&r);
                    results[i] = Some(r);
                    if sticky {
                        // The worker exits after a sticky error, its checks in flight with it.
                        self.child.stop();
                    }
                    if lost || sticky {
                        self.run_again(cases, &mut in_flight, &mut results);
                    }
                }
            }
            while let Some(Some(r)) = results.get(emitted) {
                done(emitted, r);
                emitted += 1;
            }
        }
        self.drain(cases, &mut in_flight, &mut results, 0);
        while let Some(Some(r)) = results.get(emitted) {
            done(emitted, r);
            emitted += 1;
        }
        results
            .into_iter()
            .map(|r| r.unwrap_or(Returned::WorkerDied { detail: "the case's result was never collected".into(), wall_ms: 0.0 }))
            .collect()
    }

    /// Collects the checks in flight, oldest first, until at most `keep` are left.
    fn drain(&mut self, cases: &[Case], in_flight: &mut VecDeque<usize>, results: &mut [Option<Returned>], keep: usize) {
        while in_flight.len() > keep {
            let Some(j) = in_flight.pop_front() else { break };
            let r = self.collect(&cases[j]);
            let lost = lost_worker(&r);
            results[j] = Some(r);
            if lost {
                self.run_again(cases, in_flight, results);
            }
        }
    }

    /// The worker was lost with checks in flight: their cases run again, one at a time.
    fn run_again(&mut self, cases: &[Case], in_flight: &mut VecDeque<usize>, results: &mut [Option<Returned>]) {
        while let Some(j) = in_flight.pop_front() {
            results[j] = Some(self.run(&cases[j]));
        }
    }

    /// Sends a case and waits up to its deadline for its result or for its GPU half to be done.
    fn send(&mut self, case: &Case) -> Sent {
        self.child.startup_timeout = self.startup_timeout;
        let answer = self.child.request(
            case,
            Duration::from_millis(case.deadline_ms),
            |m| matches!(m, WorkerMsg::Result { id, .. } | WorkerMsg::Staged { id, .. } if *id == case.id),
        );
        match answer {
            Answer::Reply { msg: WorkerMsg::Staged { gpu_ms, .. }, .. } => {
                self.timing.gpu_ms += gpu_ms;
                Sent::Staged
            }
            other => Sent::Final(self.returned(other)),
        }
    }

    /// Waits up to the case's deadline for the result of its host check.
    fn collect(&mut self, case: &Case) -> Returned {
        let answer = self.child.request(
            &Request::Collect { collect: case.id.clone() },
            Duration::from_millis(case.deadline_ms),
            |m| matches!(m, WorkerMsg::Result { id, .. } if *id == case.id),
        );
        self.returned(answer)
    }

    fn returned(&mut self, answer: Answer<WorkerMsg>) -> Returned {
        match answer {
            // The worker's own time: the case's work without the pipe.
            Answer::Reply { msg: WorkerMsg::Result { outcome, wall_ms, gpu_ms, host_ms, parts, .. }, .. } => {
                // A staged case's GPU half was counted when it was staged.
                match host_ms {
                    Some(h) => self.timing.host_ms += h,
                    None => self.timing.gpu_ms += gpu_ms.unwrap_or(wall_ms),
                }
                Returned::Outcome { outcome, wall_ms, times: CaseTimes { gpu_ms: gpu_ms.or(Some(wall_ms)), host_ms, parts } }
            }
            Answer::Reply { msg, wall_ms } => Returned::WorkerDied { detail: format!("unexpected worker message: {msg:?}"), wall_ms },
            Answer::Hung { wall_ms } => Returned::Hung { wall_ms },
            Answer::Died { detail, wall_ms } => Returned::WorkerDied { detail, wall_ms },
            Answer::RestartFailed { detail } => Returned::WorkerDied { detail, wall_ms: 0.0 },
        }
    }
}

/// Whether this result is a sticky CUDA error, after which the worker exits ([`super::worker::EXIT_STICKY`]).
fn sticky(r: &Returned) -> bool {
    matches!(r, Returned::Outcome { outcome: Outcome::LaunchError(e), .. } if e.sticky)
}

/// Whether the worker is gone after this result (killed at a deadline, or dead).
fn lost_worker(r: &Returned) -> bool {
    matches!(r, Returned::Hung { .. } | Returned::WorkerDied { .. })
}
