//! Backend truth, checked from outside the engine: an engine that says it runs on the GPU must
//! be among the processes the driver lists on that GPU, and its measured throughput must clear
//! a configured floor. A silent CPU fallback (the claim without the GPU) or a crawl fails
//! qualification with a reason; a claim the driver cannot confirm is "unverified", never a pass.

use std::fmt;

use brink_api::BackendCheck;

/// The backend the engine reports it runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClaimedBackend {
    Cuda { ordinal: u32 },
    Cpu,
}

impl fmt::Display for ClaimedBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClaimedBackend::Cuda { .. } => f.write_str("cuda"),
            ClaimedBackend::Cpu => f.write_str("cpu"),
        }
    }
}

/// A process the driver lists on the GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuProcess {
    pub pid: u32,
    /// Device memory it holds, where the driver says (not on GB10's unified memory).
    pub used_bytes: Option<u64>,
}

/// The driver's list of processes on the claimed GPU, or why it could not be had.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GpuHolders {
    Listed(Vec<GpuProcess>),
    Unavailable(String),
}

/// The lowest acceptable throughput, in tokens/s (finite, >= 0).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ThroughputFloor(f64);

/// A floor that is negative, infinite or not a number.
#[derive(Clone, Copy, Debug, PartialEq, thiserror::Error)]
#[error("throughput floor {tokens_per_s}: expected a finite number of tokens/s >= 0")]
pub struct BadFloor {
    pub tokens_per_s: f64,
}

impl ThroughputFloor {
    pub fn new(tokens_per_s: f64) -> Result<ThroughputFloor, BadFloor> {
        if tokens_per_s.is_finite() && tokens_per_s >= 0.0 { Ok(ThroughputFloor(tokens_per_s)) } else { Err(BadFloor { tokens_per_s }) }
    }

    pub fn tokens_per_s(self) -> f64 {
        self.0
    }
}

/// What the agent observed of one engine.
#[derive(Clone, Debug)]
pub struct Evidence {
    pub claimed: ClaimedBackend,
    pub engine_pid: u32,
    /// The driver's process list for the claimed GPU (ignored for a CPU claim).
    pub holders: GpuHolders,
    /// Measured tokens/s (NaN or infinite when the measurement failed).
    pub tokens_per_s: f64,
    pub floor: ThroughputFloor,
}

/// Judges the evidence (never [`BackendCheck::NotRun`]). Every failure is named (both, when both happen); a failure outranks
/// an unverifiable claim, since a crawl is a crawl whatever the driver says.
pub fn judge(e: &Evidence) -> BackendCheck {
    let mut reasons = Vec::new();
    let mut unverified = None;
    let mut held = String::new();
    if let ClaimedBackend::Cuda { ordinal } = e.claimed {
        match &e.holders {
            GpuHolders::Listed(list) => match list.iter().find(|p| p.pid == e.engine_pid) {
                Some(p) => {
                    held = match p.used_bytes {
                        Some(b) => format!("pid {} holds GPU {ordinal} ({:.2} GiB); ", p.pid, b as f64 / (1u64 << 30) as f64),
                        None => format!("pid {} holds GPU {ordinal}; ", p.pid),
                    }
                }
                None => {
                    let others = if list.is_empty() {
                        "no process holds it".to_string()
                    } else {
                        format!("it is held by pid {}", list.iter().map(|p| p.pid.to_string()).collect::<Vec<_>>().join(", "))
                    };
                    reasons.push(format!("claims {} but pid {} does not hold GPU {ordinal} ({others})", e.claimed, e.engine_pid));
                }
            },
            GpuHolders::Unavailable(why) => {
                unverified = Some(format!("cannot confirm that pid {} holds GPU {ordinal}: {why}", e.engine_pid))
            }
        }
    }
    let floor = e.floor.tokens_per_s();
    let speed = if !e.tokens_per_s.is_finite() || e.tokens_per_s < 0.0 {
        Err(format!("throughput not measured ({} tok/s); the floor is {floor}", e.tokens_per_s))
    } else if e.tokens_per_s < floor {
        Err(format!("{:.1} tok/s below the floor of {floor}", e.tokens_per_s))
    } else {
        Ok(format!("{:.1} tok/s at or above the floor of {floor}", e.tokens_per_s))
    };
    match speed {
        Ok(speed) if reasons.is_empty() => match unverified {
            Some(why) => BackendCheck::Unverified { reason: format!("{why} ({speed})") },
            None => BackendCheck::Pass { detail: format!("{held}{speed}") },
        },
        Ok(_) => BackendCheck::Fail { reasons },
        Err(slow) => {
            reasons.push(slow);
            BackendCheck::Fail { reasons }
        }
    }
}

/// Backend truth for a serving replica, which runs no benchmark: the engine must report the
/// backend it was asked for (`reported`, from its `/engine`), and a CUDA claim must be among
/// the driver's processes on that GPU. A claim the driver cannot confirm is unverified, which
/// a replica treats as not ready, as `up` does.
pub fn judge_serving(asked: ClaimedBackend, reported: Option<&str>, engine_pid: Option<u32>, holders: &GpuHolders) -> BackendCheck {
    let Some(pid) = engine_pid else {
        return BackendCheck::Fail { reasons: vec!["the server reports no running engine process".into()] };
    };
    if reported != Some(asked.to_string().as_str()) {
        return BackendCheck::Fail {
            reasons: vec![format!("asked for the {asked} backend, the engine reports {}", reported.unwrap_or("none"))],
        };
    }
    let ClaimedBackend::Cuda { ordinal } = asked else {
        return BackendCheck::Pass { detail: format!("pid {pid} runs on the cpu backend, as asked") };
    };
    match holders {
        GpuHolders::Listed(list) => match list.iter().find(|p| p.pid == pid) {
            Some(_) => BackendCheck::Pass { detail: format!("pid {pid} holds GPU {ordinal} (the driver lists it)") },
            None => BackendCheck::Fail {
                reasons: vec![format!(
                    "claims cuda but pid {pid} does not hold GPU {ordinal} ({})",
                    if list.is_empty() { "no process holds it".to_string() } else { format!("{} other process(es) hold it", list.len()) }
                )],
            },
        },
        GpuHolders::Unavailable(why) => {
            BackendCheck::Unverified { reason: format!("cannot confirm that pid {pid} holds GPU {ordinal}: {why}") }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_serving_engine_must_run_where_it_was_asked_to() {
        let on_gpu = GpuHolders::Listed(vec![GpuProcess { pid: ENGINE, used_bytes: None }]);
        let cuda = ClaimedBackend::Cuda { ordinal: 0 };
        assert!(judge_serving(cuda, Some("cuda"), Some(ENGINE), &on_gpu).passed());
        assert!(judge_serving(ClaimedBackend::Cpu, Some("cpu"), Some(ENGINE), &GpuHolders::Listed(vec![])).passed());
        let table: [(ClaimedBackend, Option<&str>, Option<u32>, GpuHolders, &str); 5] = [
            // A silent CPU fallback that claims the GPU: the driver does not list the engine.
            (cuda, Some("cuda"), Some(ENGINE), GpuHolders::Listed(vec![GpuProcess { pid: 7, used_bytes: None }]), "does not hold GPU 0"),
            (cuda, Some("cpu"), Some(ENGINE), on_gpu.clone(), "asked for the cuda backend, the engine reports cpu"),
            (ClaimedBackend::Cpu, Some("cuda"), Some(ENGINE), on_gpu.clone(), "asked for the cpu backend, the engine reports cuda"),
            (cuda, Some("cuda"), None, on_gpu.clone(), "no running engine process"),
            (cuda, Some("cuda"), Some(ENGINE), GpuHolders::Unavailable("NVML not found".into()), "cannot confirm"),
        ];
        for (asked, reported, pid, holders, why) in table {
            let check = judge_serving(asked, reported, pid, &holders);
            assert!(!check.passed() && format!("{check:?}").contains(why), "{why}: {check:?}");
        }
    }

    const ENGINE: u32 = 4242;

    fn evidence(claimed: ClaimedBackend, holders: GpuHolders, tokens_per_s: f64, floor: f64) -> Evidence {
        Evidence { claimed, engine_pid: ENGINE, holders, tokens_per_s, floor: ThroughputFloor::new(floor).unwrap() }
    }

    fn on_gpu(pids: &[u32]) -> GpuHolders {
        GpuHolders::Listed(pids.iter().map(|&pid| GpuProcess { pid, used_bytes: Some(3 << 30) }).collect())
    }

    const GPU0: ClaimedBackend = ClaimedBackend::Cuda { ordinal: 0 };

    #[test]
    fn a_good_engine_passes() {
        let t = judge(&evidence(GPU0, on_gpu(&[17, ENGINE]), 85.0, 20.0));
        assert_eq!(t, BackendCheck::Pass { detail: "pid 4242 holds GPU 0 (3.00 GiB); 85.0 tok/s at or above the floor of 20".into() });
        assert!(t.passed());
        // Exactly at the floor passes; memory the driver cannot report is no failure.
        let holders = GpuHolders::Listed(vec![GpuProcess { pid: ENGINE, used_bytes: None }]);
        assert!(judge(&evidence(GPU0, holders, 20.0, 20.0)).passed());
    }

    #[test]
    fn an_engine_forced_onto_the_cpu_while_claiming_the_gpu_fails() {
        // The engine says cuda; the driver lists only someone else (or nobody) on GPU 0.
        let t = judge(&evidence(GPU0, on_gpu(&[17]), 85.0, 20.0));
        assert_eq!(t, BackendCheck::Fail { reasons: vec!["claims cuda but pid 4242 does not hold GPU 0 (it is held by pid 17)".into()] });
        let t = judge(&evidence(ClaimedBackend::Cuda { ordinal: 1 }, on_gpu(&[]), 85.0, 20.0));
        assert_eq!(t, BackendCheck::Fail { reasons: vec!["claims cuda but pid 4242 does not hold GPU 1 (no process holds it)".into()] });
    }

    #[test]
    fn a_crawl_fails() {
        let t = judge(&evidence(GPU0, on_gpu(&[ENGINE]), 1.2, 20.0));
        assert_eq!(t, BackendCheck::Fail { reasons: vec!["1.2 tok/s below the floor of 20".into()] });
        // On the CPU the floor is the only check.
        let t = judge(&evidence(ClaimedBackend::Cpu, GpuHolders::Unavailable("no NVML".into()), 0.5, 2.0));
        assert_eq!(t, BackendCheck::Fail { reasons: vec!["0.5 tok/s below the floor of 2".into()] });
    }

    #[test]
    fn both_failures_are_named() {
        let t = judge(&evidence(GPU0, on_gpu(&[]), 1.2, 20.0));
        let BackendCheck::Fail { reasons } = t else { panic!("{t:?}") };
        assert_eq!(reasons.len(), 2, "{reasons:?}");
        assert!(reasons[0].starts_with("claims cuda but pid 4242") && reasons[1] == "1.2 tok/s below the floor of 20");
    }

    #[test]
    fn nvml_unavailable_is_unverified_not_a_pass() {
        let why = "NVML unavailable (libnvidia-ml): a libloading error occurred";
        let t = judge(&evidence(GPU0, GpuHolders::Unavailable(why.into()), 85.0, 20.0));
        let BackendCheck::Unverified { reason } = &t else { panic!("{t:?}") };
        assert!(
            reason.starts_with("cannot confirm that pid 4242 holds GPU 0: NVML unavailable") && reason.ends_with("floor of 20)"),
            "{reason}"
        );
        assert!(!t.passed());
        // ...unless it crawls as well: then it fails.
        let t = judge(&evidence(GPU0, GpuHolders::Unavailable(why.into()), 1.0, 20.0));
        assert!(matches!(t, BackendCheck::Fail { .. }), "{t:?}");
    }

    #[test]
    fn a_cpu_claim_above_the_floor_passes_without_nvml() {
        let t = judge(&evidence(ClaimedBackend::Cpu, GpuHolders::Unavailable("no NVML".into()), 9.0, 2.0));
        assert_eq!(t, BackendCheck::Pass { detail: "9.0 tok/s at or above the floor of 2".into() });
    }

    #[test]
    fn an_unmeasured_throughput_fails() {
        for bad in [f64::NAN, f64::INFINITY, -1.0] {
            let t = judge(&evidence(GPU0, on_gpu(&[ENGINE]), bad, 20.0));
            let BackendCheck::Fail { reasons } = &t else { panic!("{bad}: {t:?}") };
            assert!(reasons[0].starts_with("throughput not measured"), "{reasons:?}");
        }
    }

    #[test]
    fn a_bad_floor_is_refused() {
        for bad in [f64::NAN, -0.5, f64::INFINITY] {
            let e = ThroughputFloor::new(bad).unwrap_err();
            assert!(e.tokens_per_s.is_nan() == bad.is_nan() && (bad.is_nan() || e.tokens_per_s == bad), "{e:?}");
            assert!(e.to_string().starts_with(&format!("throughput floor {bad}: expected a finite number")), "{e}");
        }
        assert_eq!(ThroughputFloor::new(0.0).unwrap().tokens_per_s(), 0.0);
    }
}
