//! The watchdog's pure parts: when a step in flight counts as stalled, the recent progress kept
//! for the report, the report itself, and the restart back-off. The supervisor feeds them board
//! snapshots and writes the reports.
//!
//! A stall is no change of the board's `beats` for the timeout while a step is in flight. Idle is
//! never a stall (no step in flight, nothing is watched), and a long prefill that keeps marking
//! layers is progress.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::monitor::{Snapshot, Stuck};

/// Watches one step: stalled once `beats` has not moved for `timeout`.
#[derive(Clone, Debug)]
pub struct StallClock {
    timeout: Duration,
    beats: u64,
    since: Instant,
}

impl StallClock {
    pub fn start(timeout: Duration, beats: u64, now: Instant) -> StallClock {
        StallClock { timeout, beats, since: now }
    }

    /// Feeds a look at the board; true when the step is stalled. Progress restarts the clock.
    pub fn observe(&mut self, beats: u64, now: Instant) -> bool {
        if beats != self.beats {
            self.beats = beats;
            self.since = now;
            return false;
        }
        now.saturating_duration_since(self.since) >= self.timeout
    }

    /// Time since the board last moved.
    pub fn quiet_for(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.since)
    }
}

/// The last `cap` distinct stages seen (by step, layer, op and device layer), oldest first.
#[derive(Clone, Debug)]
pub struct RecentProgress {
    cap: usize,
    seen: VecDeque<Snapshot>,
}

impl RecentProgress {
    pub fn new(cap: usize) -> RecentProgress {
        RecentProgress { cap: cap.max(1), seen: VecDeque::new() }
    }

    pub fn push(&mut self, s: Snapshot) {
        let key = |s: &Snapshot| (s.step, s.layer, s.op, s.device_layer);
        if self.seen.back().is_some_and(|last| key(last) == key(&s)) {
            return;
        }
        if self.seen.len() == self.cap {
            self.seen.pop_front();
        }
        self.seen.push_back(s);
    }

    pub fn to_vec(&self) -> Vec<Snapshot> {
        self.seen.iter().copied().collect()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureKind {
    /// No progress for the stall timeout.
    Stall,
    /// The child exited or broke the pipe.
    Crash,
}

/// One chunk of the batch that was running.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ReportChunk {
    /// The answer's id (`chatcmpl-…`, `msg_…`); `n` > 1 lists it once per choice.
    pub request: String,
    pub prompt_tokens: usize,
    pub start: usize,
    pub len: usize,
    pub decode: bool,
}

/// The evidence of one stall or crash, as written to its JSON file.
#[derive(Clone, Debug, Serialize)]
pub struct FailureReport {
    pub kind: FailureKind,
    pub time_unix_ms: u64,
    pub stall_timeout_s: f64,
    /// How long the board had not moved (stall), or the child's exit status (crash).
    pub detail: String,
    pub engine_pid: Option<u32>,
    pub snapshot: Snapshot,
    /// Where the step is stuck: the device's layer when its progress is tracked (the host runs
    /// ahead of it), else the host's layer and op ([`Snapshot::stuck`]).
    pub stuck: Stuck,
    /// The CUDA kernels of the op the board names (every kernel of the layer, when the device
    /// is the one stuck).
    pub kernels: &'static str,
    pub batch: Vec<ReportChunk>,
    pub recent: Vec<Snapshot>,
}

impl FailureReport {
    /// "layer 1, op attn_norm", "layer 5 on the device" (or the stage without a layer).
    pub fn stage(&self) -> String {
        match (self.stuck.layer, self.stuck.op) {
            (Some(l), Some(op)) => format!("layer {l}, op {}", op_name(op)),
            (Some(l), None) => format!("layer {l} on the device"),
            (None, Some(op)) => format!("op {}", op_name(op)),
            (None, None) => "the device".into(),
        }
    }

    /// The `{layer, op}` labels of `brink_stalls_total`.
    pub fn labels(&self) -> (String, String) {
        (self.stuck.layer.map_or("none".to_string(), |l| l.to_string()), self.stuck.op.map_or("device".to_string(), op_name))
    }

    /// The message the failed requests get.
    pub fn client_message(&self) -> String {
        match self.kind {
            FailureKind::Stall => format!(
                "the engine stalled ({}: no progress for {:.1} s); it is being restarted, retry the request",
                self.stage(),
                self.stall_timeout_s
            ),
            FailureKind::Crash => format!("the engine process died ({}; at {}); it is being restarted", self.detail, self.stage()),
        }
    }

    /// One log line.
    pub fn summary(&self) -> String {
        let rows: usize = self.batch.iter().map(|c| c.len).sum();
        format!(
            "brink serve: engine {:?} at step {} {} (device finished layer {:?}), {} chunk(s) of {rows} rows; {}",
            self.kind,
            self.snapshot.step,
            self.stage(),
            self.snapshot.device_layer,
            self.batch.len(),
            self.detail
        )
    }

    /// Writes the report as `DIR/<kind>-<time>-<n>.json`; returns the path.
    pub fn write(&self, dir: &Path, n: u64) -> std::io::Result<PathBuf> {
        std::fs::create_dir_all(dir)?;
        let kind = match self.kind {
            FailureKind::Stall => "stall",
            FailureKind::Crash => "crash",
        };
        let path = dir.join(format!("{kind}-{}-{}-{n}.json", self.time_unix_ms, std::process::id()));
        let json = serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?;
        std::fs::write(&path, json)?;
        Ok(path)
    }
}

/// The op's name as the board and the reports spell it (`attn_norm`).
pub fn op_name(op: crate::monitor::Op) -> String {
    serde_json::to_value(op).ok().and_then(|v| v.as_str().map(String::from)).unwrap_or_else(|| format!("{op:?}"))
}

/// The wait before restarting after `failures` engine failures with no successful step in
/// between: none for the first, then doubling from `base`, capped at `cap`.
pub fn backoff(failures: u32, base: Duration, cap: Duration) -> Duration {
    if failures <= 1 {
        return Duration::ZERO;
    }
    let factor = 1u32.checked_shl(failures - 2).unwrap_or(u32::MAX);
    base.checked_mul(factor).map_or(cap, |d| d.min(cap))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::monitor::Op;

    fn snap(step: u64, layer: Option<u32>, op: Op, beats: u64) -> Snapshot {
        Snapshot {
            pid: 7,
            beats,
            updated_ms: 0,
            step,
            op,
            layer,
            rows: 100,
            chunks: 1,
            device_layer: None,
            device_ms: None,
            device_tracked: false,
        }
    }

    #[test]
    fn only_an_unmoving_board_is_a_stall() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut c = StallClock::start(Duration::from_secs(2), 10, t0);
        assert!(!c.observe(10, t0 + s));
        // Progress (a long prefill marking layers) restarts the clock.
        assert!(!c.observe(11, t0 + 3 * s));
        assert!(!c.observe(11, t0 + 4 * s));
        assert_eq!(c.quiet_for(t0 + 4 * s), s);
        assert!(c.observe(11, t0 + 5 * s));
        assert!(c.observe(11, t0 + 9 * s));
    }

    #[test]
    fn recent_progress_keeps_the_last_distinct_stages() {
        let mut r = RecentProgress::new(3);
        r.push(snap(1, Some(0), Op::Moe, 1));
        r.push(snap(1, Some(0), Op::Moe, 2));
        r.push(snap(1, Some(1), Op::AttnNorm, 3));
        r.push(snap(2, None, Op::Step, 4));
        r.push(snap(2, Some(0), Op::Embed, 5));
        let v = r.to_vec();
        assert_eq!(v.iter().map(|s| s.beats).collect::<Vec<_>>(), [3, 4, 5]);
    }

    #[test]
    fn reports_name_the_stage_and_serialize() {
        let r = FailureReport {
            kind: FailureKind::Stall,
            time_unix_ms: 1,
            stall_timeout_s: 2.0,
            detail: "no progress for 2.1 s".into(),
            engine_pid: Some(42),
            snapshot: snap(3, Some(1), Op::AttnNorm, 9),
            stuck: snap(3, Some(1), Op::AttnNorm, 9).stuck(),
            kernels: Op::AttnNorm.kernels(),
            batch: vec![ReportChunk { request: "chatcmpl-4".into(), prompt_tokens: 100, start: 0, len: 64, decode: false }],
            recent: vec![snap(3, Some(0), Op::Moe, 8)],
        };
        assert!(r.client_message().contains("layer 1, op attn_norm"), "{}", r.client_message());
        assert!(r.summary().contains("1 chunk(s) of 64 rows"), "{}", r.summary());
        let dir = tempfile::tempdir().unwrap();
        let path = r.write(&dir.path().join("stalls"), 0).unwrap();
        let j: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(j["kind"], "stall");
        assert_eq!(j["snapshot"]["layer"], 1);
        assert_eq!(j["snapshot"]["op"], "attn_norm");
        assert_eq!(j["kernels"], "rmsnorm");
        assert_eq!(j["batch"][0]["len"], 64);
        assert_eq!(j["engine_pid"], 42);
        assert_eq!(j["recent"].as_array().unwrap().len(), 1);
        assert_eq!((j["stuck"]["layer"].as_u64(), j["stuck"]["on_device"].as_bool()), (Some(1), Some(false)));
        assert_eq!(r.labels(), ("1".to_string(), "attn_norm".to_string()));

        // A GPU hang: the host queued ahead to layer 36; the device finished layer 4.
        let mut gpu = snap(3, Some(36), Op::Moe, 9);
        (gpu.device_tracked, gpu.device_layer) = (true, Some(4));
        let r = FailureReport { snapshot: gpu, stuck: gpu.stuck(), ..r };
        assert!(r.client_message().contains("layer 5 on the device"), "{}", r.client_message());
        assert_eq!(r.labels(), ("5".to_string(), "device".to_string()));
    }

    #[test]
    fn restarts_back_off_boundedly() {
        let (b, cap) = (Duration::from_millis(250), Duration::from_secs(10));
        let waits: Vec<Duration> = (0..8).map(|n| backoff(n, b, cap)).collect();
        assert_eq!(waits[..4], [Duration::ZERO, Duration::ZERO, b, 2 * b]);
        assert_eq!(waits[7], Duration::from_secs(8));
        assert_eq!(backoff(8, b, cap), cap);
        assert_eq!(backoff(u32::MAX, b, cap), cap);
    }
}
