//! A check the server runs on each engine child before `/ready` says ready: whoever starts
//! the server (the node agent's `serve`) decides what it proves (backend truth from outside the
//! engine, the replica's own threshold test). The result is kept per engine pid, so a restarted
//! engine is checked again and a probe does not re-run it.

use std::fmt;
use std::sync::{Arc, Mutex};

use super::state::EngineStatus;

/// `Ok(detail)` lets `/ready` answer 200; `Err(why)` keeps it 503 with `why`.
pub type CheckFn = dyn Fn(&EngineStatus) -> Result<String, String> + Send + Sync;

#[derive(Clone)]
pub struct ReadyCheck(Arc<CheckFn>);

impl ReadyCheck {
    pub fn new(f: impl Fn(&EngineStatus) -> Result<String, String> + Send + Sync + 'static) -> ReadyCheck {
        ReadyCheck(Arc::new(f))
    }

    /// Runs the check (a caller composing checks; the server goes through [`ReadyGate`]).
    pub fn call(&self, status: &EngineStatus) -> Result<String, String> {
        (self.0)(status)
    }
}

impl fmt::Debug for ReadyCheck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ReadyCheck")
    }
}

/// The check and its last result, by engine pid.
#[derive(Default)]
pub struct ReadyGate {
    check: Option<ReadyCheck>,
    last: Mutex<Option<(u32, Result<String, String>)>>,
}

impl ReadyGate {
    pub fn new(check: Option<ReadyCheck>) -> ReadyGate {
        ReadyGate { check, last: Mutex::new(None) }
    }

    /// The check's result for the engine `status` describes (run once per pid); `None` when
    /// there is no check or no engine runs.
    pub fn judge(&self, status: &EngineStatus) -> Option<Result<String, String>> {
        let check = self.check.as_ref()?;
        let pid = status.engine_pid?;
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((p, r)) = last.as_ref()
            && *p == pid
        {
            return Some(r.clone());
        }
        let r = (check.0)(status);
        match &r {
            Ok(detail) => eprintln!("brink serve: ready check passed for engine pid {pid}: {detail}"),
            Err(why) => eprintln!("brink serve: ready check FAILED for engine pid {pid}: {why}"),
        }
        *last = Some((pid, r.clone()));
        Some(r)
    }

    /// The last result, without running the check.
    pub fn last(&self) -> Option<Result<String, String>> {
        self.last.lock().unwrap_or_else(|p| p.into_inner()).as_ref().map(|(_, r)| r.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    fn status(pid: Option<u32>) -> EngineStatus {
        EngineStatus {
            ready: true,
            backend: Some("cpu".into()),
            engine_pid: pid,
            context: Some(64),
            restarts: 0,
            served_models: vec![],
            ready_check: None,
        }
    }

    #[test]
    fn runs_once_per_engine_pid_and_again_for_a_new_one() {
        let runs = Arc::new(AtomicU32::new(0));
        let counted = runs.clone();
        let gate = ReadyGate::new(Some(ReadyCheck::new(move |s| {
            counted.fetch_add(1, Ordering::Relaxed);
            if s.engine_pid == Some(1) { Err("pid 1 is not on the GPU".into()) } else { Ok("fine".into()) }
        })));
        assert_eq!(gate.judge(&status(None)), None, "no engine: nothing to check");
        assert_eq!(gate.judge(&status(Some(1))), Some(Err("pid 1 is not on the GPU".into())));
        assert_eq!(gate.judge(&status(Some(1))), Some(Err("pid 1 is not on the GPU".into())));
        assert_eq!(runs.load(Ordering::Relaxed), 1);
        assert_eq!(gate.judge(&status(Some(2))), Some(Ok("fine".into())));
        assert_eq!((runs.load(Ordering::Relaxed), gate.last()), (2, Some(Ok("fine".into()))));
        assert_eq!(ReadyGate::new(None).judge(&status(Some(1))), None);
    }
}
