//! Gangs: replicas over several nodes. A gang goes only to nodes of one fabric (the value of
//! the deployment's fabric label) that each pass every check a single replica's node passes
//! and have the memory one member needs, all members at once or none. A gang is replaced as a
//! whole when any member's node must be left.
//!
//! Placing one gang: of the fabrics with enough eligible nodes, the smallest (so that larger
//! fabrics stay whole for larger gangs), then the name; within it the members are the nodes
//! with the fewest untolerated `PreferNoSchedule` taints, then the least loaded, then the name;
//! the first is the leader. A node that hosts a gang member (of any deployment) takes no other:
//! members use host networking, so their ports are the node's.

use std::collections::BTreeMap;

use brink_api::Envelope;
use brink_api::crd::RDMA_LABEL;

use super::eligibility::{self, Static};
use super::heartbeat::HeartbeatPolicy;
use super::inputs::{DecideError, DeploymentView, MAX_REPLICAS, NodeView, sorted_nodes};
use super::lifecycle::eviction_reasons;
use super::placement::{AssignedGang, Assignment, Placement};
use super::reason::{Reason, nodes_detail};

/// A node while gangs are being placed.
struct Member<'a> {
    node: &'a NodeView,
    checks: Static,
    committed: u64,
    /// Hosts a gang member: from its residents, or chosen in this call.
    hosts_member: bool,
    placed: bool,
}

impl<'a> Member<'a> {
    fn fabric(&self, label: &str) -> Option<&'a str> {
        self.node.labels.get(label).map(String::as_str).filter(|v| !v.is_empty())
    }

    /// Reasons that keep the node out of any gang now: the static checks, memory, a member
    /// already there.
    fn reasons(&self, dep: &DeploymentView, need: u64) -> Vec<Reason> {
        let mut reasons = self.checks.reasons.clone();
        let has = self.node.allocatable_bytes.saturating_sub(self.committed).saturating_sub(dep.reserve_bytes);
        if need > has {
            reasons.push(Reason::Memory { needs: need, has, reserve: dep.reserve_bytes });
        }
        if self.hosts_member {
            reasons.push(Reason::HostsGangMember);
        }
        reasons
    }

    fn load_key(&self) -> (usize, u128, u128) {
        (self.checks.preferred_against, self.committed as u128, self.node.allocatable_bytes.max(1) as u128)
    }
}

/// The tightest limits of the members: a gang serves under what every member validated.
fn gang_limits(members: &[Envelope]) -> Option<Envelope> {
    let mut it = members.iter();
    let first = *it.next()?;
    Some(it.fold(first, |a, b| Envelope {
        validated: a.validated && b.validated,
        validated_tokens: match (a.validated_tokens, b.validated_tokens) {
            (Some(x), Some(y)) => Some(x.min(y)),
            (x, y) => x.or(y),
        },
        first_failure: match (a.first_failure, b.first_failure) {
            (Some(x), Some(y)) => Some(x.min(y)),
            (x, y) => x.or(y),
        },
        max_batch_tokens: a.max_batch_tokens.min(b.max_batch_tokens),
        prefill_chunk: a.prefill_chunk.min(b.prefill_chunk),
    }))
}

/// Places `count` new gangs of `dep` (whose `gang` is set) on `nodes` at `now_s`.
pub fn place_gangs(
    dep: &DeploymentView,
    nodes: &[NodeView],
    count: u64,
    now_s: u64,
    policy: &HeartbeatPolicy,
) -> Result<Placement, DecideError> {
    dep.validate()?;
    if count > MAX_REPLICAS {
        return Err(DecideError::TooManyReplicas { deployment: dep.key.clone(), count });
    }
    let Some(gang) = &dep.gang else {
        return Err(DecideError::InvalidServing { deployment: dep.key.clone(), field: "nodesPerReplica", why: "not a gang".into() });
    };
    let size = gang.nodes;
    let label = gang.fabric_label.as_str();
    let need = dep.member_memory_bytes()?;
    let mut members: Vec<Member> = sorted_nodes(nodes)?
        .into_iter()
        .map(|node| Member {
            node,
            checks: eligibility::check(node, dep, now_s, policy),
            committed: node.committed_bytes(),
            hosts_member: node.residents.iter().any(|r| r.gang_member),
            placed: false,
        })
        .collect();

    let mut assignments = Vec::new();
    for _ in 0..count {
        let mut fabrics: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
        for (i, m) in members.iter().enumerate() {
            if let Some(f) = m.fabric(label)
                && m.reasons(dep, need).is_empty()
            {
                fabrics.entry(f).or_default().push(i);
            }
        }
        let Some((fabric, mut chosen)) =
            fabrics.into_iter().filter(|(_, ix)| ix.len() as u64 >= size).min_by(|a, b| a.1.len().cmp(&b.1.len()).then(a.0.cmp(b.0)))
        else {
            break;
        };
        let fabric = fabric.to_string();
        chosen.sort_by(|&a, &b| {
            let (ka, kb) = (members[a].load_key(), members[b].load_key());
            ka.0.cmp(&kb.0).then((ka.1 * kb.2).cmp(&(kb.1 * ka.2))).then_with(|| members[a].node.name.cmp(&members[b].node.name))
        });
        chosen.truncate(usize::try_from(size).unwrap_or(usize::MAX));
        // Static checks passed, so every member has limits.
        let envelopes: Vec<Envelope> = chosen.iter().filter_map(|&i| members[i].checks.limits).collect();
        let Some(limits) = gang_limits(&envelopes).filter(|_| envelopes.len() == chosen.len()) else { break };
        let rdma = chosen.iter().all(|&i| members[i].node.labels.get(RDMA_LABEL).is_some_and(|v| v == "true"));
        for &i in &chosen {
            let m = &mut members[i];
            m.committed = m.committed.saturating_add(need);
            m.hosts_member = true;
            m.placed = true;
        }
        let names: Vec<String> = chosen.iter().map(|&i| members[i].node.name.clone()).collect();
        assignments.push(Assignment {
            node: names[0].clone(),
            limits,
            memory_bytes: need,
            gang: Some(AssignedGang { workers: names[1..].to_vec(), fabric, rdma }),
        });
    }

    // Why each node has no member now; the fabric reasons for nodes that pass everything else.
    // Per fabric: (nodes eligible now, nodes).
    let mut per_fabric: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for m in &members {
        if let Some(f) = m.fabric(label) {
            let e = per_fabric.entry(f.to_string()).or_default();
            e.1 += 1;
            if m.reasons(dep, need).is_empty() {
                e.0 += 1;
            }
        }
    }
    let reasons_of = |m: &Member| {
        let mut reasons = m.reasons(dep, need);
        if reasons.is_empty() {
            match m.fabric(label) {
                None => reasons.push(Reason::NoFabric { label: label.to_string() }),
                Some(f) => {
                    let eligible = per_fabric.get(f).map_or(0, |e| e.0);
                    if eligible < size {
                        reasons.push(Reason::FabricTooSmall { fabric: f.to_string(), eligible, needs: size });
                    }
                }
            }
        }
        reasons
    };
    let unplaced = count - assignments.len() as u64;
    let not_chosen: Vec<(String, Vec<Reason>)> = members
        .iter()
        .filter(|m| !m.placed)
        .map(|m| {
            let mut reasons = reasons_of(m);
            if reasons.is_empty() {
                reasons.push(Reason::NotNeeded);
            }
            (m.node.name.clone(), reasons)
        })
        .collect();
    let qualify = members
        .iter()
        .filter(|m| m.checks.needs_qualification && dep.require_qualified)
        .filter(|m| m.checks.reasons.iter().all(|r| matches!(r, Reason::NotQualified { .. })))
        .map(|m| m.node.name.clone())
        .collect();
    let message = (unplaced > 0).then(|| {
        let all: Vec<(String, Vec<Reason>)> = members.iter().map(|m| (m.node.name.clone(), reasons_of(m))).collect();
        let fabrics = if per_fabric.is_empty() {
            format!("no node carries the fabric label {label}")
        } else {
            let largest = per_fabric.values().map(|e| e.1).max().unwrap_or(0);
            let list: Vec<String> = per_fabric.iter().map(|(f, (e, t))| format!("{f}: {e} of {t} eligible")).collect();
            let too_big = if largest < size { format!("no fabric has {size} nodes (the largest has {largest}); ") } else { String::new() };
            format!("{too_big}fabrics by label {label}: {}", list.join(", "))
        };
        format!(
            "{unplaced} of {count} gangs of {size} nodes cannot be placed: a gang needs {size} eligible nodes of one fabric; {fabrics}; {}",
            nodes_detail(&all)
        )
    });
    Ok(Placement { assignments, not_chosen, unplaced, message, qualify })
}

/// A gang's members as the replacement decision reads them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GangMembers {
    /// Rank 1 first (the leader is the replica's node).
    pub workers: Vec<String>,
    pub fabric: String,
}

/// Why a gang led from `leader` must be replaced as a whole (empty: it stays): the leader's
/// node's own reasons, each worker's as [`Reason::GangMember`], a member that left the fabric,
/// and a gang of another size than the deployment asks for. A single-node replica of a gang
/// deployment (or a gang of a single-node one) is replaced by its size.
pub fn gang_eviction_reasons(
    leader: &str,
    gang: Option<&GangMembers>,
    nodes: &BTreeMap<&str, &NodeView>,
    dep: &DeploymentView,
    now_s: u64,
    policy: &HeartbeatPolicy,
) -> Vec<Reason> {
    let mut reasons = eviction_reasons(nodes.get(leader).copied(), dep, now_s, policy);
    let has = 1 + gang.map_or(0, |g| g.workers.len() as u64);
    let wants = dep.nodes_per_replica();
    if has != wants {
        reasons.push(Reason::GangSize { has, wants });
    }
    let Some(g) = gang else { return reasons };
    for worker in &g.workers {
        let why = eviction_reasons(nodes.get(worker.as_str()).copied(), dep, now_s, policy);
        if !why.is_empty() {
            reasons.push(Reason::GangMember { node: worker.clone(), reasons: why });
        }
    }
    if let Some(label) = dep.gang.as_ref().map(|n| n.fabric_label.as_str()) {
        for member in std::iter::once(leader).chain(g.workers.iter().map(String::as_str)) {
            let Some(node) = nodes.get(member) else { continue };
            let now = node.labels.get(label).cloned();
            if now.as_deref() != Some(g.fabric.as_str()) {
                reasons.push(Reason::FabricChanged { node: member.to_string(), fabric: g.fabric.clone(), now });
            }
        }
    }
    reasons
}

/// A gang's Pods as one for `pod_recovery`: the first failed member (leader first) fails the
/// gang, whose recovery replaces every member's Pod; otherwise the gang is as its leader is
/// (the leader is ready only once the engine over every member passed its qualification). A
/// missing leader is an absent gang; a missing worker is created again with no failure counted.
pub fn gang_pod_state(members: &[super::PodState]) -> super::PodState {
    use super::PodState;
    if let Some(failed) = members.iter().find(|m| matches!(m, PodState::Failed { .. })) {
        return failed.clone();
    }
    members.first().cloned().unwrap_or(PodState::Absent)
}
