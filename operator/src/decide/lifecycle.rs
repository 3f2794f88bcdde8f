//! Which of a deployment's replicas must leave their node, and which go when it scales down.
//!
//! A replica is replaced when its node is gone, cordoned (`kubectl drain` cordons first),
//! carries an untolerated `NoSchedule` or `NoExecute` taint, has lost its heartbeat (expired
//! beyond the grace, or flapping: see `heartbeat`), or has since been disqualified for the
//! class. A heartbeat that expired within the grace, a stale or in-progress re-qualification
//! and a `PreferNoSchedule` taint keep the replica where it is. The controller places the
//! replacements first and removes a replaced replica once its replacement serves.
//!
//! A gang (a replica over several nodes) is replaced as a whole when any member's node must be
//! left, a member left the gang's fabric, or the deployment asks for another gang size
//! (`gang::gang_eviction_reasons`).
//!
//! Scale-down victims, one at a time: replicas due for replacement first (no point replacing
//! them), then unhealthy ones, then the one on the node with the most replicas of the
//! deployment (removing it harms spread least), then the more loaded node, then the name.

use std::cmp::Ordering;
use std::collections::BTreeMap;

use brink_api::Verdict;

use super::eligibility::schedulability;
use super::gang::{GangMembers, gang_eviction_reasons};
use super::heartbeat::{HeartbeatPolicy, HeartbeatState};
use super::inputs::{ClassQualification, DecideError, DeploymentView, NodeView, sorted_nodes};
use super::reason::Reason;

/// One existing replica of the deployment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaView {
    pub name: String,
    pub node: String,
    /// Serving and ready; false while starting, failed or stalled.
    pub healthy: bool,
    /// A gang's other members (`node` is its leader).
    pub gang: Option<GangMembers>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Replacement {
    pub replica: String,
    pub node: String,
    pub reasons: Vec<Reason>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lifecycle {
    /// Replicas to replace, by name.
    pub replace: Vec<Replacement>,
    /// Replicas to delete to scale down, in the order chosen.
    pub remove: Vec<String>,
    /// New replicas to place: the shortfall plus one per replacement.
    pub place: u64,
    /// Replicas kept on a node whose heartbeat expired within the grace: for a `Degraded`
    /// condition, not for action.
    pub held: Vec<Replacement>,
    /// Seconds until the first held replica's grace ends: requeue then to decide again.
    pub recheck_in_s: Option<u64>,
}

/// Decides for `replicas` of `dep` at `now_s`.
pub fn lifecycle(
    dep: &DeploymentView,
    replicas: &[ReplicaView],
    nodes: &[NodeView],
    now_s: u64,
    policy: &HeartbeatPolicy,
) -> Result<Lifecycle, DecideError> {
    let nodes: BTreeMap<&str, &NodeView> = sorted_nodes(nodes)?.into_iter().map(|n| (n.name.as_str(), n)).collect();
    let mut replicas: Vec<&ReplicaView> = replicas.iter().collect();
    replicas.sort_by(|a, b| a.name.cmp(&b.name));
    if let Some(w) = replicas.windows(2).find(|w| w[0].name == w[1].name) {
        return Err(DecideError::DuplicateReplica(w[0].name.clone()));
    }

    let due: BTreeMap<&str, Vec<Reason>> = replicas
        .iter()
        .map(|r| (r.name.as_str(), gang_eviction_reasons(&r.node, r.gang.as_ref(), &nodes, dep, now_s, policy)))
        .filter(|(_, reasons)| !reasons.is_empty())
        .collect();

    let excess = (replicas.len() as u64).saturating_sub(dep.replicas);
    let mut remaining = replicas.clone();
    let mut remove = Vec::new();
    for _ in 0..excess {
        let mut per_node: BTreeMap<&str, u64> = BTreeMap::new();
        for r in &remaining {
            *per_node.entry(r.node.as_str()).or_default() += 1;
        }
        let victim = remaining.iter().enumerate().min_by(|(_, a), (_, b)| {
            let key = |r: &ReplicaView| (!due.contains_key(r.name.as_str()), r.healthy);
            key(a)
                .cmp(&key(b))
                .then(per_node[b.node.as_str()].cmp(&per_node[a.node.as_str()]))
                .then_with(|| load_cmp(nodes.get(b.node.as_str()).copied(), nodes.get(a.node.as_str()).copied()))
                .then_with(|| a.name.cmp(&b.name))
        });
        let Some((i, _)) = victim else { break };
        remove.push(remaining.remove(i).name.clone());
    }

    let replace: Vec<Replacement> = remaining
        .iter()
        .filter_map(|r| {
            due.get(r.name.as_str()).map(|reasons| Replacement { replica: r.name.clone(), node: r.node.clone(), reasons: reasons.clone() })
        })
        .collect();
    let place = dep.replicas.saturating_sub(replicas.len() as u64) + replace.len() as u64;
    let mut held = Vec::new();
    let mut recheck_in_s: Option<u64> = None;
    for r in remaining.iter().filter(|r| !due.contains_key(r.name.as_str())) {
        let Some(node) = nodes.get(r.node.as_str()) else { continue };
        if let state @ HeartbeatState::Expired { for_s } = node.heartbeat.assess(now_s, policy) {
            held.push(Replacement { replica: r.name.clone(), node: r.node.clone(), reasons: vec![Reason::Heartbeat(state)] });
            let left = policy.grace_s.saturating_sub(for_s);
            recheck_in_s = Some(recheck_in_s.map_or(left, |s| s.min(left)));
        }
    }
    Ok(Lifecycle { replace, remove, place, held, recheck_in_s })
}

/// Replicas due to leave a node a sweep drains that go now, without a replacement: one for
/// each replacement that could not be placed (`unplaced`), by name. A replacement that fits
/// goes first and the replica leaves once it serves (surge); with no room anywhere, the sweep
/// would otherwise wait for room that may never come.
pub fn drain_without_room(replace: &[Replacement], unplaced: u64) -> Vec<String> {
    let mut sweeping: Vec<&str> = replace
        .iter()
        .filter(|r| r.reasons.iter().any(|why| matches!(why, Reason::SweepInProgress { .. })))
        .map(|r| r.replica.as_str())
        .collect();
    sweeping.sort();
    sweeping.into_iter().take(usize::try_from(unplaced).unwrap_or(usize::MAX)).map(String::from).collect()
}

/// Why a replica on `node` must leave it (empty: it stays).
pub(crate) fn eviction_reasons(node: Option<&NodeView>, dep: &DeploymentView, now_s: u64, policy: &HeartbeatPolicy) -> Vec<Reason> {
    let Some(node) = node else {
        return vec![Reason::NodeGone];
    };
    let mut reasons: Vec<Reason> = schedulability(node, dep, now_s, policy)
        .into_iter()
        // A heartbeat that is only settling or briefly expired keeps its replicas (hysteresis).
        .filter(|r| !matches!(r, Reason::Heartbeat(h) if !h.evicts()))
        .collect();
    if let Some(ClassQualification::Done(Verdict::Disqualified { reason })) = node.classes.get(&dep.shape_class) {
        reasons.push(Reason::NotQualified { class: dep.shape_class.clone(), state: format!("disqualified: {reason}") });
    }
    reasons
}

/// Committed share of memory, exactly; a gone node sorts as the most loaded.
fn load_cmp(a: Option<&NodeView>, b: Option<&NodeView>) -> Ordering {
    let load = |n: Option<&NodeView>| n.map(|n| (n.committed_bytes() as u128, n.allocatable_bytes.max(1) as u128));
    match (load(a), load(b)) {
        (Some((x, y)), Some((z, w))) => (x * w).cmp(&(z * y)),
        (None, None) => Ordering::Equal,
        (None, Some(_)) => Ordering::Greater,
        (Some(_), None) => Ordering::Less,
    }
}
