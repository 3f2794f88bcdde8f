//! Why a node does not get (or may not keep) a replica, worded for conditions and Events.

use std::collections::BTreeMap;
use std::fmt;

use super::heartbeat::HeartbeatState;
use super::inputs::Taint;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reason {
    /// The replica's node no longer exists.
    NodeGone,
    /// `Node.spec.unschedulable`.
    Cordoned,
    /// An untolerated blocking taint.
    Taint(Taint),
    /// Any heartbeat state but fresh.
    Heartbeat(HeartbeatState),
    /// A `SweepRun` with `drainReplicas` is draining or sweeping the node.
    SweepInProgress {
        run: String,
    },
    SelectorMismatch {
        key: String,
        want: String,
        have: Option<String>,
    },
    /// No usable qualification for the class; `state` says which.
    NotQualified {
        class: String,
        state: String,
    },
    /// Under `Refuse`: the validated envelope is below the requested batch.
    EnvelopeBelowRequest {
        class: String,
        envelope: u64,
        requested: u64,
    },
    /// `has` is what is left after resident replicas and the reserve.
    Memory {
        needs: u64,
        has: u64,
        reserve: u64,
    },
    /// Spread `OnePerNode` and the node already hosts one.
    AlreadyHosts,
    /// The node fits, but the wanted replicas went to less loaded nodes.
    NotNeeded,
    /// A gang member of some deployment is there already (host networking: one per node).
    HostsGangMember,
    /// A gang needs nodes of one fabric, and the node carries no fabric label.
    NoFabric {
        label: String,
    },
    /// The node's fabric has fewer eligible nodes than a gang needs.
    FabricTooSmall {
        fabric: String,
        eligible: u64,
        needs: u64,
    },
    /// One of the gang's other members must go: the whole gang is replaced.
    GangMember {
        node: String,
        reasons: Vec<Reason>,
    },
    /// A gang member no longer carries the fabric the gang was placed on.
    FabricChanged {
        node: String,
        fabric: String,
        now: Option<String>,
    },
    /// The replica spans another number of nodes than the deployment asks for.
    GangSize {
        has: u64,
        wants: u64,
    },
}

impl Reason {
    /// The reason without its per-node numbers, to count like reasons across nodes.
    fn kind(&self) -> String {
        match self {
            Reason::NodeGone => "node gone".into(),
            Reason::Cordoned => "cordoned".into(),
            Reason::Taint(t) => format!("taint {t}"),
            Reason::Heartbeat(HeartbeatState::Settling { .. }) => "heartbeat settling after an outage".into(),
            Reason::Heartbeat(HeartbeatState::Flapping { .. }) => "heartbeat flapping".into(),
            Reason::Heartbeat(HeartbeatState::NoLease) => "no heartbeat lease".into(),
            Reason::Heartbeat(_) => "heartbeat expired".into(),
            Reason::SweepInProgress { .. } => "sweep in progress".into(),
            Reason::SelectorMismatch { .. } => "node selector mismatch".into(),
            Reason::NotQualified { class, .. } => format!("not qualified for {class}"),
            Reason::EnvelopeBelowRequest { requested, .. } => format!("envelope below requested {requested} tokens (Refuse)"),
            Reason::Memory { needs, .. } => format!("insufficient memory (needs {})", gib(*needs)),
            Reason::AlreadyHosts => "already hosts a replica (one per node)".into(),
            Reason::NotNeeded => "not needed".into(),
            Reason::HostsGangMember => "hosts a gang member already".into(),
            Reason::NoFabric { label } => format!("no fabric label {label}"),
            Reason::FabricTooSmall { needs, .. } => format!("fabric with fewer than {needs} eligible nodes"),
            Reason::GangMember { .. } => "a gang member must go".into(),
            Reason::FabricChanged { .. } => "fabric changed".into(),
            Reason::GangSize { wants, .. } => format!("gang size is not {wants}"),
        }
    }
}

/// Bytes as GiB with two decimals, for people (decisions compare bytes).
pub fn gib(bytes: u64) -> String {
    format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::NodeGone => write!(f, "node gone"),
            Reason::Cordoned => write!(f, "cordoned"),
            Reason::Taint(t) => write!(f, "taint {t}"),
            Reason::Heartbeat(h) => write!(f, "{h}"),
            Reason::SweepInProgress { run } => write!(f, "sweep in progress: SweepRun {run} drains the node"),
            Reason::SelectorMismatch { key, want, have: Some(have) } => write!(f, "node selector mismatch: {key}={have}, wanted {want}"),
            Reason::SelectorMismatch { key, want, have: None } => write!(f, "node selector mismatch: no label {key} (wanted {want})"),
            Reason::NotQualified { class, state } => write!(f, "not qualified for class {class} ({state})"),
            Reason::EnvelopeBelowRequest { class, envelope, requested } => {
                write!(f, "envelope {envelope} tokens for class {class} below requested {requested} under onSelfTestFailure Refuse")
            }
            Reason::Memory { needs, has, reserve } => {
                write!(f, "memory: needs {}, has {} (after residents and a {} reserve)", gib(*needs), gib(*has), gib(*reserve))?;
                if needs > has && needs - has < 1 << 24 {
                    // Two decimals hide a small shortfall: say it in bytes.
                    write!(f, ", {} B short", needs - has)?;
                }
                Ok(())
            }
            Reason::AlreadyHosts => write!(f, "already hosts a replica of this deployment (spread: one per node)"),
            Reason::NotNeeded => write!(f, "fits, but the replicas went to less loaded nodes"),
            Reason::HostsGangMember => write!(f, "hosts a gang member already (host networking: one per node)"),
            Reason::NoFabric { label } => write!(f, "no fabric: the node has no label {label}"),
            Reason::FabricTooSmall { fabric, eligible, needs } => {
                write!(f, "fabric {fabric} has {eligible} eligible nodes, a gang needs {needs}")
            }
            Reason::GangMember { node, reasons } => {
                let why: Vec<String> = reasons.iter().map(ToString::to_string).collect();
                write!(f, "gang member on node {node}: {}", why.join("; "))
            }
            Reason::FabricChanged { node, fabric, now: Some(now) } => {
                write!(f, "gang member on node {node} is on fabric {now}, the gang on {fabric}")
            }
            Reason::FabricChanged { node, fabric, now: None } => write!(f, "gang member on node {node} left fabric {fabric}"),
            Reason::GangSize { has, wants } => write!(f, "the replica spans {has} nodes, the deployment asks for {wants}"),
        }
    }
}

/// A condition message for replicas that could not be placed, in the style of the scheduler's
/// `0/5 nodes are available: ...`: how many nodes could still take one, then each reason kind
/// with how many nodes gave it, most first. `reasons` has every node, with no reasons for one
/// that could take a replica.
pub fn unplaced_summary(unplaced: u64, wanted: u64, reasons: &[(String, Vec<Reason>)]) -> String {
    format!("{unplaced} of {wanted} replicas cannot be placed; {}", nodes_detail(reasons))
}

/// `a/b nodes available: n reason, ...` over every node's reasons.
pub fn nodes_detail(reasons: &[(String, Vec<Reason>)]) -> String {
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for (_, rs) in reasons {
        // A node with two memory reasons counts once per kind.
        let mut kinds: Vec<String> = rs.iter().map(Reason::kind).collect();
        kinds.sort();
        kinds.dedup();
        for k in kinds {
            *counts.entry(k).or_default() += 1;
        }
    }
    let mut by_count: Vec<(String, usize)> = counts.into_iter().collect();
    by_count.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let detail = if reasons.is_empty() {
        "no nodes".to_string()
    } else {
        let available = reasons.iter().filter(|(_, rs)| rs.is_empty()).count();
        let list: Vec<String> = by_count.iter().map(|(k, n)| format!("{n} {k}")).collect();
        format!("{available}/{} nodes available: {}", reasons.len(), list.join(", "))
    };
    detail
}
