//! The counters the server's parts share: the [`Heartbeat`] the supervisor publishes (with the
//! telemetry store) and the handlers' [`HttpCounters`]. Plain state, read by `/ready`, `/live`
//! and `/metrics` ([`super::metrics`]); it imports no other server module but the telemetry
//! store, so every server module can use it without a cycle.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::telemetry::Telemetry;

/// Progress counters the supervisor publishes for `/ready`, `/live` and `/metrics`.
#[derive(Debug, Default)]
pub struct Heartbeat {
    /// An engine child is loaded and answering.
    pub ready: AtomicBool,
    /// The supervisor gave up (a panic, or the engine cannot be restarted): nothing will be
    /// served again.
    pub dead: AtomicBool,
    /// A stall or crash was caught and the engine is being restarted.
    pub restarting: AtomicBool,
    pub restarts: AtomicU64,
    /// Requests in flight at a stall or crash that ran again on the restarted engine.
    pub requeued: AtomicU64,
    /// The engine child's pid; 0 while none runs.
    pub engine_pid: AtomicU64,
    /// Kill (or death) to the new child's ready, of the last restart, without back-off waits.
    pub last_restart_micros: AtomicU64,
    /// Prompt lengths under quarantine.
    pub quarantined: AtomicU64,
    /// Stalls by (layer, op) as the board named them.
    pub stalls: Mutex<BTreeMap<(String, String), u64>>,
    pub steps: AtomicU64,
    pub prompt_tokens: AtomicU64,
    pub completion_tokens: AtomicU64,
    pub running: AtomicU64,
    pub waiting: AtomicU64,
    /// Milliseconds since `epoch` of the last finished step (or of going idle).
    pub last_progress_ms: AtomicU64,
    pub ttft_micros_sum: AtomicU64,
    pub ttft_count: AtomicU64,
    pub failed_steps: AtomicU64,
    /// The GenAI histograms, token rates and KV use, and the OTLP instruments when exporting.
    pub telemetry: Telemetry,
    epoch: Option<Instant>,
}

impl Heartbeat {
    pub fn new() -> Heartbeat {
        Heartbeat { epoch: Some(Instant::now()), ..Heartbeat::default() }
    }

    fn now_ms(&self) -> u64 {
        self.epoch.map_or(0, |e| e.elapsed().as_millis() as u64)
    }

    pub(crate) fn beat(&self) {
        self.last_progress_ms.store(self.now_ms(), Ordering::Relaxed);
    }

    /// Time since the last progress.
    pub fn since_progress(&self) -> Duration {
        Duration::from_millis(self.now_ms().saturating_sub(self.last_progress_ms.load(Ordering::Relaxed)))
    }

    /// Work is pending (running or waiting) and nothing moved for `stall_timeout`. Idle is
    /// never a stall.
    pub fn stalled(&self, stall_timeout: Duration) -> bool {
        let pending = self.running.load(Ordering::Relaxed) + self.waiting.load(Ordering::Relaxed) > 0;
        pending && self.since_progress() > stall_timeout
    }

    /// Counts a stall at `layer`/`op` (as the board named them).
    pub fn record_stall(&self, layer: String, op: String) {
        if let Ok(mut m) = self.stalls.lock() {
            *m.entry((layer, op)).or_default() += 1;
        }
    }

    pub fn stalls_total(&self) -> u64 {
        self.stalls.lock().map_or(0, |m| m.values().sum())
    }
}

/// Counters the handlers keep (the worker keeps its own in [`Heartbeat`]).
#[derive(Debug, Default)]
pub struct HttpCounters {
    pub requests: AtomicU64,
    pub errors: AtomicU64,
}

/// What the server says about its engine, as JSON: the node agent checks the claim from
/// outside (is `engine_pid` among the processes the driver lists on the GPU?).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EngineStatus {
    pub ready: bool,
    /// `cpu` or `cuda`, as the engine child reported it; `None` before the first load.
    pub backend: Option<String>,
    /// The engine child's pid; `None` while none runs (loading, restarting).
    pub engine_pid: Option<u32>,
    pub context: Option<usize>,
    pub restarts: u64,
    pub served_models: Vec<String>,
    /// The last ready check's result (`passed: ...` or `failed: ...`), when the server has one
    /// and it ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_check: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_is_never_a_stall_and_pending_work_without_progress_is() {
        let hb = Heartbeat::new();
        hb.beat();
        assert!(!hb.stalled(Duration::ZERO));
        hb.waiting.store(1, Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(5));
        assert!(hb.stalled(Duration::from_millis(1)));
        assert!(!hb.stalled(Duration::from_secs(60)));
        hb.beat();
        assert!(!hb.stalled(Duration::from_millis(1000)));
    }
}
