//! The SparkNode status the agent writes, assembled from what it knows (pure). Every write is a
//! server-side apply of the whole status under the field manager `brink-agent`: a field left out
//! of an apply is a field the manager gives up (and the API server deletes), so the status is
//! always built whole from [`NodeState`], never patched piecemeal.

use std::collections::BTreeMap;

use brink_api::crd::{
    Capacity, Condition, ConditionStatus, ConditionType, HostedReplica, NodeFingerprint, ShapeQualification, SparkNodeStatus, condition,
    set_condition,
};
use brink_api::{DeviceReport, Verdict};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// Why the agent is or is not running, for the Ready condition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Liveness {
    Running,
    Stopping,
}

/// Everything the status is made of.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeState {
    pub device: DeviceReport,
    pub agent_version: String,
    pub kernel_sources_hash: String,
    pub fingerprint: NodeFingerprint,
    pub capacity: Option<Capacity>,
    /// One result per shape class, by class.
    pub qualifications: BTreeMap<String, ShapeQualification>,
    pub replicas: Vec<HostedReplica>,
    /// The class being qualified now, with how many more wait after it.
    pub qualifying: Option<(String, usize)>,
    /// Requested classes that cannot be qualified yet, and why (e.g. no model file of the class
    /// on this node to take the full kernel shape from).
    pub blocked: BTreeMap<String, String>,
    /// Model files on the node outside the cache (node paths, PVCs) verified here, by shape
    /// class: the self-test takes a class's full shape from one of them.
    pub local_models: BTreeMap<String, std::path::PathBuf>,
    pub liveness: Liveness,
    pub heartbeat: Option<Time>,
    pub conditions: Vec<Condition>,
}

impl NodeState {
    pub fn new(device: DeviceReport, fingerprint: NodeFingerprint, capacity: Option<Capacity>) -> NodeState {
        NodeState {
            device,
            agent_version: fingerprint.agent_version.clone(),
            kernel_sources_hash: fingerprint.kernel_sources_hash.clone(),
            fingerprint,
            capacity,
            qualifications: BTreeMap::new(),
            replicas: Vec::new(),
            qualifying: None,
            blocked: BTreeMap::new(),
            local_models: BTreeMap::new(),
            liveness: Liveness::Running,
            heartbeat: None,
            conditions: Vec::new(),
        }
    }

    /// Keeps the results of an earlier run of this agent that still hold (their fingerprint
    /// matches this node and build); a stale one is dropped, and qualified again if asked.
    pub fn adopt(&mut self, previous: &[ShapeQualification]) {
        for q in previous {
            if self.fingerprint.covers(&q.qualification.fingerprint) {
                self.qualifications.insert(q.shape_class.clone(), q.clone());
            }
        }
    }

    /// The status at `now` (which also moves the conditions' transition times where a status
    /// changed).
    pub fn status(&mut self, now: Time) -> SparkNodeStatus {
        for c in conditions(self, &now) {
            set_condition(&mut self.conditions, c);
        }
        SparkNodeStatus {
            device: self.device.device.clone(),
            no_gpu_reason: self.device.no_gpu_reason.clone(),
            agent_version: self.agent_version.clone(),
            kernel_sources_hash: self.kernel_sources_hash.clone(),
            fingerprint: Some(self.fingerprint.clone()),
            qualifications: self.qualifications.values().cloned().collect(),
            capacity: self.capacity,
            replicas: self.replicas.clone(),
            last_heartbeat_time: self.heartbeat.clone(),
            conditions: self.conditions.clone(),
        }
    }
}

/// Ready (the agent runs: never "qualified", so one bad node cannot block a rollout),
/// Qualified (per the results) and Progressing (a qualification running).
fn conditions(s: &NodeState, now: &Time) -> Vec<Condition> {
    let ready = match s.liveness {
        Liveness::Running => (ConditionStatus::True, "AgentRunning", "the node agent is running".to_string()),
        Liveness::Stopping => (ConditionStatus::False, "AgentStopping", "the node agent is shutting down".to_string()),
    };
    let (q_status, q_reason, q_message) = qualified(s);
    let progressing = match &s.qualifying {
        Some((class, more)) => {
            (ConditionStatus::True, "Qualifying", format!("running the kernel self-test for {class} ({more} more waiting)"))
        }
        None if !s.blocked.is_empty() => (
            ConditionStatus::False,
            "WaitingForModel",
            s.blocked.iter().map(|(c, why)| format!("{c}: {why}")).collect::<Vec<_>>().join("; "),
        ),
        None => (ConditionStatus::False, "Idle", "no qualification pending".to_string()),
    };
    [(ConditionType::Ready, ready), (ConditionType::Qualified, (q_status, q_reason, q_message)), (ConditionType::Progressing, progressing)]
        .into_iter()
        // The reasons above are constants that follow the convention.
        .filter_map(|(t, (st, reason, message))| condition(t, st, reason, message, None, now.clone()).ok())
        .collect()
}

fn qualified(s: &NodeState) -> (ConditionStatus, &'static str, String) {
    if s.qualifications.is_empty() {
        return (ConditionStatus::Unknown, "NoResults", "no shape class has been qualified on this node".into());
    }
    let mut good = Vec::new();
    let mut bad = Vec::new();
    for (class, q) in &s.qualifications {
        match &q.qualification.verdict {
            Verdict::Qualified { max_tokens } => good.push(format!("{class} qualified to {max_tokens} tokens")),
            Verdict::Clamped { max_tokens, first_failure } => {
                good.push(format!("{class} clamped to {max_tokens} tokens (first failure at {first_failure})"))
            }
            Verdict::Disqualified { reason } => bad.push(format!("{class} disqualified: {reason}")),
            Verdict::NotQualified { reason } => bad.push(format!("{class} not qualified: {reason}")),
            Verdict::ProofIncomplete { reason } => bad.push(format!("{class} not qualified: {reason}")),
        }
    }
    let message = good.iter().chain(&bad).cloned().collect::<Vec<_>>().join("; ");
    match (good.is_empty(), bad.is_empty()) {
        (false, true) => (ConditionStatus::True, "Qualified", message),
        (false, false) => (ConditionStatus::True, "PartlyQualified", message),
        (true, _) => (ConditionStatus::False, "NotQualified", message),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use brink_api::{DeviceInfo, Fingerprint, QUALIFICATION_SCHEMA, Qualification, ReportSummary, ServingParams, UnifiedMemory};

    fn at(s: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(1_800_000_000 + s).unwrap())
    }

    fn fp() -> NodeFingerprint {
        NodeFingerprint {
            gpu_name: "NVIDIA GB10".into(),
            compute_capability: "12.1".into(),
            driver_version: Some("580.95.05".into()),
            cuda_version: "13.0".into(),
            nvrtc_version: Some("13.0".into()),
            agent_version: "0.1.0".into(),
            kernel_sources_hash: "ab".repeat(32),
        }
    }

    fn gb10() -> DeviceInfo {
        DeviceInfo {
            ordinal: 0,
            name: "NVIDIA GB10".into(),
            uuid: "GPU-1".into(),
            compute_capability: "12.1".into(),
            sm_count: 48,
            total_mem_bytes: 128 << 30,
            free_mem_bytes: 100 << 30,
            max_grid_dim: [2_147_483_647, 65_535, 65_535],
            driver_version: Some("580.95.05".into()),
            cuda_version: "13.0".into(),
            nvrtc_version: Some("13.0".into()),
            integrated: true,
            unified_memory: Some(UnifiedMemory { total: 128 << 30, available: 100 << 30 }),
        }
    }

    fn result(class: &str, verdict: Verdict, driver: &str) -> ShapeQualification {
        let n = NodeFingerprint { driver_version: Some(driver.into()), ..fp() };
        let f = Fingerprint {
            gpu_name: n.gpu_name,
            compute_capability: n.compute_capability,
            driver_version: n.driver_version,
            cuda_version: n.cuda_version,
            nvrtc_version: n.nvrtc_version,
            agent_version: n.agent_version,
            kernel_sources_hash: n.kernel_sources_hash,
            shape_class: class.into(),
            serving: ServingParams { max_batch_tokens: 8192, prefill_chunk: 2048, context: 4096, full_window_kv: false },
        };
        ShapeQualification {
            shape_class: class.into(),
            qualification: Qualification {
                schema: QUALIFICATION_SCHEMA,
                digest: f.digest(),
                fingerprint: f,
                verdict,
                summary: ReportSummary::default(),
                qualified_at: "2027-01-15T08:00:00Z".into(),
                model_summary: None,
                kernel_verdict: None,
                model_verdict: None,
            },
            envelope: None,
            failing_cases: Vec::new(),
        }
    }

    fn cond(s: &SparkNodeStatus, t: &str) -> (String, String, String) {
        let c = s.conditions.iter().find(|c| c.type_ == t).unwrap();
        (c.status.clone(), c.reason.clone(), c.message.clone())
    }

    #[test]
    fn device_and_results_become_the_status() {
        let q = |max| Verdict::Qualified { max_tokens: max };
        let c = |max, f| Verdict::Clamped { max_tokens: max, first_failure: f };
        let d = |r: &str| Verdict::Disqualified { reason: r.into() };
        // (name, results, want Qualified (status, reason, message))
        type Case = (&'static str, Vec<ShapeQualification>, (&'static str, &'static str, &'static str));
        let cases: Vec<Case> = vec![
            ("none yet", vec![], ("Unknown", "NoResults", "no shape class has been qualified on this node")),
            ("one qualified", vec![result("a", q(8192), "580.95.05")], ("True", "Qualified", "a qualified to 8192 tokens")),
            (
                "clamped counts as qualified",
                vec![result("a", c(4096, 4097), "580.95.05")],
                ("True", "Qualified", "a clamped to 4096 tokens (first failure at 4097)"),
            ),
            (
                "one good, one bad",
                vec![result("a", q(8192), "580.95.05"), result("b", d("tail bug at 37"), "580.95.05")],
                ("True", "PartlyQualified", "a qualified to 8192 tokens; b disqualified: tail bug at 37"),
            ),
            ("only bad", vec![result("b", d("tail bug at 37"), "580.95.05")], ("False", "NotQualified", "b disqualified: tail bug at 37")),
            // A result from before a driver upgrade is not adopted: nothing current.
            (
                "stale results are dropped",
                vec![result("a", q(8192), "575.1")],
                ("Unknown", "NoResults", "no shape class has been qualified on this node"),
            ),
        ];
        for (name, results, want) in cases {
            let mut st = NodeState::new(DeviceReport::found(gb10()), fp(), None);
            st.adopt(&results);
            let s = st.status(at(0));
            assert_eq!(cond(&s, "Qualified"), (want.0.into(), want.1.into(), want.2.into()), "{name}");
            assert_eq!(s.device.as_ref().map(|d| d.name.as_str()), Some("NVIDIA GB10"), "{name}");
            assert!(s.no_gpu_reason.is_none(), "{name}");
            assert_eq!(s.fingerprint, Some(fp()), "{name}");
            assert_eq!((s.agent_version.as_str(), s.kernel_sources_hash.len()), ("0.1.0", 64), "{name}");
        }
    }

    #[test]
    fn no_gpu_is_said_plainly_and_conditions_keep_their_transition_times() {
        let mut st = NodeState::new(DeviceReport::none("no CUDA driver (libcuda.so) on this machine"), fp(), None);
        let s = st.status(at(0));
        assert!(s.device.is_none());
        assert_eq!(s.no_gpu_reason.as_deref(), Some("no CUDA driver (libcuda.so) on this machine"));
        assert_eq!(cond(&s, "Ready"), ("True".into(), "AgentRunning".into(), "the node agent is running".into()));
        assert_eq!(cond(&s, "Progressing").1, "Idle");
        st.qualifying = Some(("a".into(), 2));
        let s = st.status(at(10));
        assert_eq!(
            cond(&s, "Progressing"),
            ("True".into(), "Qualifying".into(), "running the kernel self-test for a (2 more waiting)".into())
        );
        let ready_since = |s: &SparkNodeStatus| s.conditions.iter().find(|c| c.type_ == "Ready").unwrap().last_transition_time.clone();
        assert_eq!(ready_since(&s), at(0), "Ready did not change: its transition time stays");
        st.qualifying = None;
        st.blocked.insert("b".into(), "no model of this class is in the node's cache yet".into());
        assert_eq!(cond(&st.status(at(15)), "Progressing").1, "WaitingForModel");
        st.liveness = Liveness::Stopping;
        let s = st.status(at(20));
        assert_eq!(cond(&s, "Ready").0, "False");
        assert_eq!(cond(&s, "Ready").1, "AgentStopping");
        assert_eq!(ready_since(&s), at(20));
    }
}
