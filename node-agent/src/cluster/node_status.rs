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
        }
    }
    let message = good.iter().chain(&bad).cloned().collect::<Vec<_>>().join("; ");
    match (good.is_empty(), bad.is_empty()) {
        (false, true) => (ConditionStatus::True, "Qualified", message),
        (false, false) => (ConditionStatus::True, "PartlyQualified", message),
        (true, _) => (ConditionStatus::False, "NotQualified", message),
    }
}
