//! Which nodes get a deployment's new replicas, the limits each serves under, and why every
//! other node was not chosen.
//!
//! Greedy, one replica at a time, over the nodes that pass the static checks (`eligibility`)
//! and still have the memory: the node with the fewest replicas of this deployment (spread),
//! then the fewest untolerated `PreferNoSchedule` taints, then the smallest share of its memory
//! committed (least loaded), then the name. Memory committed by a replica placed in this call
//! counts for the next one, so two replicas never share memory that fits one.

use std::cmp::Ordering;

use brink_api::Envelope;

use super::eligibility::{self, Static};
use super::heartbeat::HeartbeatPolicy;
use super::inputs::{DecideError, DeploymentView, MAX_REPLICAS, NodeView, Spread, sorted_nodes};
use super::reason::{Reason, unplaced_summary};

/// One new replica and where it goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Assignment {
    pub node: String,
    /// Batch and chunk clamped to the node's envelope (`validated: false`: nothing to clamp to).
    pub limits: Envelope,
    /// The memory request of the replica Pod (of each member's Pod, for a gang).
    pub memory_bytes: u64,
    /// For a replica over several nodes: `node` is its leader, these its other members.
    pub gang: Option<AssignedGang>,
}

/// A gang's members beyond the leader, and what they share.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AssignedGang {
    /// Rank 1 first.
    pub workers: Vec<String>,
    pub fabric: String,
    /// Every member's node has RDMA devices.
    pub rdma: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    /// In placement order.
    pub assignments: Vec<Assignment>,
    /// Every node that got no new replica, by name, with all its reasons.
    pub not_chosen: Vec<(String, Vec<Reason>)>,
    /// Replicas that fit nowhere.
    pub unplaced: u64,
    /// For the replicas' condition when `unplaced > 0`.
    pub message: Option<String>,
    /// Under `requireQualified`, nodes that never qualified the class and pass every other
    /// static check: ask their agents to qualify it.
    pub qualify: Vec<String>,
}

/// A node while replicas are being placed.
struct Candidate<'a> {
    node: &'a NodeView,
    checks: Static,
    committed: u64,
    own: u64,
    placed: u64,
}

impl Candidate<'_> {
    /// Memory left for a replica after residents, replicas placed here in this call, and the
    /// deployment's reserve.
    fn free(&self, reserve: u64) -> u64 {
        self.node.allocatable_bytes.saturating_sub(self.committed).saturating_sub(reserve)
    }

    /// The static reasons, then memory and spread as they stand now.
    fn all_reasons(&self, dep: &DeploymentView, need: u64) -> Vec<Reason> {
        let mut reasons = self.checks.reasons.clone();
        reasons.extend(self.dynamic_reasons(dep, need));
        reasons
    }

    fn dynamic_reasons(&self, dep: &DeploymentView, need: u64) -> Vec<Reason> {
        let mut reasons = Vec::new();
        if dep.spread == Spread::OnePerNode && self.own > 0 {
            reasons.push(Reason::AlreadyHosts);
        }
        let has = self.free(dep.reserve_bytes);
        if need > has {
            reasons.push(Reason::Memory { needs: need, has, reserve: dep.reserve_bytes });
        }
        reasons
    }

    /// committed / allocatable against the other's, exactly (no floats): a node with no
    /// allocatable memory counts as full.
    fn load_cmp(&self, other: &Candidate) -> Ordering {
        let load = |c: &Candidate| (c.committed as u128, c.node.allocatable_bytes.max(1) as u128);
        let (a, b) = load(self);
        let (c, d) = load(other);
        (a * d).cmp(&(c * b))
    }
}

/// Places `count` new replicas of `dep` on `nodes` at `now_s`. The deployment's existing
/// replicas are the nodes' residents whose deployment is `dep.key`.
pub fn place(dep: &DeploymentView, nodes: &[NodeView], count: u64, now_s: u64, policy: &HeartbeatPolicy) -> Result<Placement, DecideError> {
    if dep.gang.is_some() {
        return super::gang::place_gangs(dep, nodes, count, now_s, policy);
    }
    dep.validate()?;
    if count > MAX_REPLICAS {
        return Err(DecideError::TooManyReplicas { deployment: dep.key.clone(), count });
    }
    let need = dep.memory_bytes()?;
    let mut candidates: Vec<Candidate> = sorted_nodes(nodes)?
        .into_iter()
        .map(|node| Candidate {
            node,
            checks: eligibility::check(node, dep, now_s, policy),
            committed: node.committed_bytes(),
            own: node.replicas_of(&dep.key),
            placed: 0,
        })
        .collect();

    let mut assignments = Vec::new();
    for _ in 0..count {
        let best = candidates
            .iter()
            .enumerate()
            .filter(|(_, c)| c.checks.reasons.is_empty() && c.dynamic_reasons(dep, need).is_empty())
            .min_by(|(_, a), (_, b)| {
                a.own
                    .cmp(&b.own)
                    .then(a.checks.preferred_against.cmp(&b.checks.preferred_against))
                    .then_with(|| a.load_cmp(b))
                    .then_with(|| a.node.name.cmp(&b.node.name))
            })
            .map(|(i, _)| i);
        let Some(i) = best else { break };
        let c = &mut candidates[i];
        // Static checks passed, so the limits exist.
        let Some(limits) = c.checks.limits else { break };
        c.committed = c.committed.saturating_add(need);
        c.own += 1;
        c.placed += 1;
        assignments.push(Assignment { node: c.node.name.clone(), limits, memory_bytes: need, gang: None });
    }

    let unplaced = count - assignments.len() as u64;
    let not_chosen: Vec<(String, Vec<Reason>)> = candidates
        .iter()
        .filter(|c| c.placed == 0)
        .map(|c| {
            let mut reasons = c.all_reasons(dep, need);
            if reasons.is_empty() {
                reasons.push(Reason::NotNeeded);
            }
            (c.node.name.clone(), reasons)
        })
        .collect();
    let qualify = candidates
        .iter()
        .filter(|c| c.checks.needs_qualification && dep.require_qualified)
        .filter(|c| c.checks.reasons.iter().all(|r| matches!(r, Reason::NotQualified { .. })))
        .map(|c| c.node.name.clone())
        .collect();
    let message = (unplaced > 0).then(|| {
        // Nodes that took replicas in this call are full now; say why for them too.
        let all: Vec<(String, Vec<Reason>)> = candidates.iter().map(|c| (c.node.name.clone(), c.all_reasons(dep, need))).collect();
        unplaced_summary(unplaced, count, &all)
    });
    Ok(Placement { assignments, not_chosen, unplaced, message, qualify })
}
